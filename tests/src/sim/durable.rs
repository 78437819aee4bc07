//! A single gateway that keeps its coordination state in a store, losing power under load
//! (issue 25; the tests are in `tests/tests/coord_sim.rs`).
//!
//! One seed is one run: host `engine` serves the model of the store
//! ([`crate::engine_model::Model`], made outside the host so its data survive everything) over
//! turmoil's network; host `gateway` runs the real gateway (`gateway_server::serve`) with that
//! store, reached through a [`NetEngine`] behind a [`HookedStore`] that holds each write for a
//! few milliseconds before sending it (the time a disk takes to sync: a power loss inside it
//! loses the write, as a file system loses what it had not synced); host `client` runs 3
//! sessions, each a seeded loop of `claim` (TTL 20 s) and `release` of `r0`/`r1` and
//! `board_set`/`board_get` of `k0`–`k2` on project `alpha`, every value unique. No sleds: a
//! single gateway's coordination needs none. Each session checks in first (its agent name is
//! shared with the others), and also sends the others direct messages and reads its inbox. The gateway loses power 2–3 times (every link cut,
//! then a crash) and comes back 0.5–2 s later; the sessions carry on with the same session
//! ids (they are kept in the store too), reconnecting as needed.
//!
//! # The oracle
//!
//! Every request is recorded with its send and receive instants; judged afterwards:
//!
//! - **(D1) an acknowledged board write is never lost.** A `board_get` of a key sent after a
//!   `board_set` of it was answered finds the key at that revision or a later one.
//! - **(D2) revisions are never reused.** No two answered `board_set`s have the same revision.
//! - **(D3) fences never go back.** A fresh grant (not re-entrant) answered after another was
//!   answered, and claimed after it, has the greater fence.
//! - **(D4) one holder, across restarts.** A claim by another agent, sent after a grant was
//!   answered and answered before the grant's TTL could have run out (counted from the
//!   grant's sending), with no release of it sent meanwhile, is not granted.
//! - **(D5) sessions stay.** No request is answered 404 (unknown session).
//! - **(D6) mail is delivered once.** No message is read twice, and every message whose `send`
//!   was answered is read by its recipient by the end (each session reads its inbox until it
//!   is empty once the run is over), unless a read of the recipient's got no answer after the
//!   message was sent: a read commits the inbox's cursor, so one whose answer a power loss cut
//!   off may have taken it (a client that cannot lose mail reads with `peek` first).
//!
//! `PlantedBug::CoordAckBeforeDurable` (answers go out before their writes are durable) is
//! caught by (D1)–(D4) (`coord_planted_ack_before_durable_is_caught`).

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_core::{Config, PlantedBug, ProjectSpec, Registry};
use gateway_server::ServerOptions;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use sled_sim::{ClientError, McpClient};

use super::runner::SweepReport;
use super::{TurmoilConnect, TurmoilListener, GATEWAY_PORT};
use crate::engine_model::Model;
use crate::engine_net::{serve_engine_switched, EngineSwitch, NetEngine, ENGINE_PORT};
use crate::hooked_store::HookedStore;

const ENGINE_HOST: &str = "engine";
const GATEWAY_HOST: &str = "gateway";
const CLIENT_HOST: &str = "client";
const PROJECT: &str = "alpha";
const LEASE_TTL_S: u64 = 20;
const SESSIONS: usize = 3;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(6);

/// One seed's scenario.
#[derive(Debug, Clone)]
pub struct DurableScenario {
    pub seed: u64,
    pub bug: Option<PlantedBug>,
    pub run_for: Duration,
    /// How long the store holds each write before sending it (a sync).
    pub sync_delay: Duration,
    /// Power losses of the gateway: (down at, up at).
    pub power_losses: Vec<(Duration, Duration)>,
}

impl DurableScenario {
    pub fn draw(seed: u64, bug: Option<PlantedBug>) -> DurableScenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0d05_ab1e_0025);
        let run_for = Duration::from_secs(30);
        let sync_delay = Duration::from_millis(rng.random_range(5..=40));
        let n = rng.random_range(2..=3);
        let mut power_losses = Vec::new();
        let mut at = Duration::from_secs(3);
        for _ in 0..n {
            at += Duration::from_millis(rng.random_range(2_000..=7_000));
            let up = at + Duration::from_millis(rng.random_range(500..=2_000));
            power_losses.push((at, up));
            at = up;
        }
        DurableScenario {
            seed,
            bug,
            run_for,
            sync_delay,
            power_losses,
        }
    }

    fn down_between(&self, a: Duration, b: Duration) -> bool {
        self.power_losses.iter().any(|(d, u)| *d <= b && a <= *u)
    }
}

/// What a request was.
#[derive(Debug, Clone, PartialEq)]
enum Op {
    Claim(String),
    Release(String),
    Set(String, u64),
    Get(String),
    Claims,
    /// A direct message to session `to`, with a body unique in the run.
    Send {
        to: usize,
        body: String,
    },
    Inbox,
    Checkin,
}

/// One request and its answer.
#[derive(Debug, Clone)]
struct Call {
    who: usize,
    op: Op,
    sent: Duration,
    done: Duration,
    /// The structured result, or the error's `data.kind` (`http <status>`, `transport`).
    outcome: Result<Value, String>,
}

impl Call {
    fn line(&self) -> String {
        let outcome = match &self.outcome {
            Ok(v) => v.to_string(),
            Err(e) => format!("error {e}"),
        };
        format!(
            "{:>6}..{:>6} ms s{} {:?} -> {outcome}",
            self.sent.as_millis(),
            self.done.as_millis(),
            self.who,
            self.op
        )
    }
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

fn server_options(s: &DurableScenario, incarnation: u64) -> ServerOptions {
    let mut spec = ProjectSpec::new(PROJECT, "http://127.0.0.1:9");
    spec.token = Some(super::uplink_token(PROJECT));
    let registry = Registry::from_projects(vec![spec], Some(PROJECT)).expect("a valid registry");
    let mut bytes = [0u8; 32];
    bytes[0] = 0xd5;
    bytes[1..9].copy_from_slice(&s.seed.to_le_bytes());
    bytes[9..17].copy_from_slice(&incarnation.to_le_bytes());
    let mut opts = ServerOptions::new(registry, bytes);
    opts.prober = Arc::new(gateway_server::HttpProber(TurmoilConnect));
    opts.pin_file = None;
    opts.shutdown_grace = Duration::from_secs(1);
    opts.store_clock = super::sim_wall_clock();
    opts.core = Config {
        probe_interval: Duration::ZERO,
        planted: s.bug,
        ..Config::default()
    };
    opts
}

type Client = McpClient<TurmoilConnect>;

async fn connect(session: Option<&str>) -> Option<Client> {
    let url = format!("http://{GATEWAY_HOST}:{GATEWAY_PORT}/mcp");
    let mut c = tokio::time::timeout(CLIENT_TIMEOUT, Client::connect(TurmoilConnect, &url))
        .await
        .ok()?
        .ok()?;
    c.set_session_id(session.map(str::to_owned));
    Some(c)
}

/// The sessions' agent names, as their `checkin`s said.
type Names = Arc<Mutex<Vec<Option<String>>>>;

/// One session's loop.
async fn session(who: usize, s: DurableScenario, calls: Arc<Mutex<Vec<Call>>>, names: Names) {
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed ^ ((who as u64 + 1) * 0x9e37));
    // Initialize, until the gateway answers.
    let (mut client, id) = loop {
        if let Some(mut c) = connect(None).await {
            if let Ok(Ok(_)) = tokio::time::timeout(CLIENT_TIMEOUT, c.initialize()).await {
                if let Some(id) = c.session_id().map(str::to_owned) {
                    break (Some(c), id);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut n = 0u64;
    let mut draining = false;
    loop {
        let known = names.lock().expect("not poisoned").iter().flatten().count();
        if now() >= s.run_for && !draining {
            // The end: what is left in the inbox is read, once every session has a name.
            draining = true;
        }
        n += 1;
        let r = format!("r{}", rng.random_range(0..2));
        let k = format!("k{}", rng.random_range(0..3));
        let to = (who + rng.random_range(1..SESSIONS)) % SESSIONS;
        let named = names.lock().expect("not poisoned")[who].is_some();
        let op = if !named {
            Op::Checkin
        } else if draining {
            Op::Inbox
        } else {
            match rng.random_range(0..100) {
                0..=24 => Op::Set(k, who as u64 * 1_000_000 + n),
                25..=39 => Op::Get(k),
                40..=59 => Op::Claim(r),
                60..=74 => Op::Release(r),
                75..=84 if known == SESSIONS => Op::Send {
                    to,
                    body: format!("m{who}.{n}"),
                },
                75..=94 => Op::Inbox,
                _ => Op::Claims,
            }
        };
        let (tool, args) = match &op {
            Op::Claim(r) => ("claim", json!({"resource": r, "ttl_s": LEASE_TTL_S})),
            Op::Release(r) => ("release", json!({"resource": r})),
            Op::Set(k, v) => ("board_set", json!({"key": k, "value": v})),
            Op::Get(k) => ("board_get", json!({"key": k})),
            Op::Claims => ("claims", json!({})),
            Op::Checkin => ("checkin", json!({})),
            Op::Inbox => ("inbox", json!({"limit": 50})),
            Op::Send { to, body } => {
                let to = names.lock().expect("not poisoned")[*to].clone();
                ("send", json!({"to": to, "body": body}))
            }
        };
        let mut args = args;
        args["project"] = json!(PROJECT);
        if client.is_none() {
            client = connect(Some(&id)).await;
        }
        let sent = now();
        let outcome = match client.as_mut() {
            None => Err("transport".to_owned()),
            Some(c) => {
                match tokio::time::timeout(CLIENT_TIMEOUT, c.tools_call(json!(n), tool, args)).await
                {
                    Ok(Ok(v)) => match (
                        &v["result"]["structuredContent"],
                        &v["error"]["data"]["kind"],
                    ) {
                        (Value::Object(_), _) => Ok(v["result"]["structuredContent"].clone()),
                        (_, Value::String(kind)) => Err(kind.clone()),
                        _ => Err(format!("odd answer {v}")),
                    },
                    Ok(Err(ClientError::Http { status, .. })) => Err(format!("http {status}")),
                    Ok(Err(_)) | Err(_) => Err("transport".to_owned()),
                }
            }
        };
        if outcome.as_ref().is_err_and(|e| e == "transport") {
            client = None;
        }
        let transport = outcome.is_err();
        if let (Op::Checkin, Ok(v)) = (&op, &outcome) {
            names.lock().expect("not poisoned")[who] = v["agent"].as_str().map(str::to_owned);
        }
        let empty = matches!((&op, &outcome), (Op::Inbox, Ok(v)) if v["messages"] == json!([]));
        calls.lock().expect("not poisoned").push(Call {
            who,
            op,
            sent,
            done: now(),
            outcome,
        });
        if draining && empty {
            return;
        }
        let pause = if transport {
            200
        } else {
            rng.random_range(5..=60)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// Runs one seed.
pub fn run_durable(seed: u64, bug: Option<PlantedBug>) -> SweepReport {
    super::init_logging();
    let s = DurableScenario::draw(seed, bug);
    let started = std::time::Instant::now();
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let notes: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| simulate(&s, &calls, &notes)));
    let mut violations = Vec::new();
    let sim_time = match outcome {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            violations.push(format!("the simulation failed: {e}"));
            now()
        }
        Err(panic) => {
            violations.push(format!(
                "the simulation panicked: {}",
                super::runner::panic_message(&*panic)
            ));
            Duration::ZERO
        }
    };
    let calls = std::mem::take(&mut *calls.lock().expect("not poisoned"));
    let mut coverage = BTreeMap::new();
    violations.extend(judge(&s, &calls, &mut coverage));
    let mut timed: Vec<(Duration, String)> = calls.iter().map(|c| (c.done, c.line())).collect();
    timed.extend(std::mem::take(&mut *notes.lock().expect("not poisoned")));
    timed.sort_by_key(|(at, _)| *at);
    let trace: Vec<String> = timed.into_iter().map(|(_, l)| l).collect();
    let hash = super::trace_hash(&trace, sim_time);
    SweepReport {
        seed,
        scenario: format!("{s:?}"),
        violations,
        trace,
        trace_hash: hash,
        sim_time,
        wall: started.elapsed(),
        coverage,
    }
}

fn simulate(
    s: &DurableScenario,
    calls: &Arc<Mutex<Vec<Call>>>,
    notes: &Arc<Mutex<Vec<(Duration, String)>>>,
) -> Result<Duration, String> {
    let mut sim = turmoil::Builder::new()
        .rng_seed(s.seed)
        .simulation_duration(s.run_for + Duration::from_secs(30))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(10))
        .build();
    let model = Model::new();
    let switch = EngineSwitch::default();
    sim.host(ENGINE_HOST, move || {
        let (model, switch) = (model.clone(), switch.clone());
        async move {
            serve_engine_switched(model, ENGINE_PORT, switch).await?;
            Ok(())
        }
    });
    let incarnation = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let (s, notes) = (s.clone(), notes.clone());
        sim.host(GATEWAY_HOST, move || {
            let n = incarnation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut opts = server_options(&s, n);
            let (delay, notes) = (s.sync_delay, notes.clone());
            async move {
                let engine = Arc::new(NetEngine::new(
                    format!("{ENGINE_HOST}:{ENGINE_PORT}"),
                    GATEWAY_HOST,
                ));
                engine.wait_connected(Duration::from_secs(3600)).await;
                // Each write held for `delay` before it is sent: a sync.
                opts.store = Some(Arc::new(HookedStore {
                    inner: engine,
                    hook: Arc::new(move || Box::pin(tokio::time::sleep(delay))),
                }));
                let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?;
                notes
                    .lock()
                    .expect("not poisoned")
                    .push((now(), format!("gateway run {n} starts")));
                gateway_server::serve(TurmoilListener(listener), opts, std::future::pending())
                    .await?;
                Ok(())
            }
        });
    }
    {
        let (s, calls) = (s.clone(), calls.clone());
        sim.client(CLIENT_HOST, async move {
            let names: Names = Arc::new(Mutex::new(vec![None; SESSIONS]));
            let tasks: Vec<_> = (0..SESSIONS)
                .map(|who| tokio::spawn(session(who, s.clone(), calls.clone(), names.clone())))
                .collect();
            for t in tasks {
                let _ = t.await;
            }
            Ok(())
        });
    }
    let hosts = [ENGINE_HOST, CLIENT_HOST];
    let mut pending: Vec<(Duration, bool)> = s
        .power_losses
        .iter()
        .flat_map(|(d, u)| [(*d, true), (*u, false)])
        .collect();
    pending.reverse();
    loop {
        let t = sim.elapsed();
        while pending.last().is_some_and(|(at, _)| *at <= t) {
            let (_, down) = pending.pop().expect("checked");
            if down {
                for h in hosts {
                    sim.partition(GATEWAY_HOST, h);
                }
                sim.crash(GATEWAY_HOST);
                notes
                    .lock()
                    .expect("not poisoned")
                    .push((t, "gateway power lost".into()));
            } else {
                for h in hosts {
                    sim.repair(GATEWAY_HOST, h);
                }
                sim.bounce(GATEWAY_HOST);
            }
        }
        match sim.step() {
            Ok(true) => return Ok(sim.elapsed()),
            Ok(false) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn judge(
    s: &DurableScenario,
    calls: &[Call],
    coverage: &mut BTreeMap<String, usize>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut cover = |k: &str, n: usize| *coverage.entry(k.to_owned()).or_default() += n;
    let ok = |c: &&Call| c.outcome.is_ok();
    cover("calls", calls.len());
    cover("answered", calls.iter().filter(ok).count());
    let judged_after_restart = calls
        .iter()
        .filter(|c| c.outcome.is_ok() && s.power_losses.first().is_some_and(|(d, _)| c.sent > *d))
        .count();
    cover("answered after a power loss", judged_after_restart);
    // (D1) and (D2).
    let sets: Vec<(&Call, u64)> = calls
        .iter()
        .filter_map(|c| match (&c.op, &c.outcome) {
            (Op::Set(..), Ok(v)) => v["revision"].as_u64().map(|r| (c, r)),
            _ => None,
        })
        .collect();
    let mut revisions: BTreeMap<u64, &Call> = BTreeMap::new();
    for (c, r) in &sets {
        if let Some(other) = revisions.insert(*r, c) {
            out.push(format!(
                "(D2) revision {r} given twice: {} / {}",
                other.line(),
                c.line()
            ));
        }
    }
    for g in calls {
        let (Op::Get(k), Ok(v)) = (&g.op, &g.outcome) else {
            continue;
        };
        let seen = if v["found"] == false {
            0
        } else {
            v["revision"].as_u64().unwrap_or(0)
        };
        for (w, r) in &sets {
            if matches!(&w.op, Op::Set(wk, _) if wk == k) && w.done < g.sent {
                cover("(D1) judged", 1);
                if seen < *r {
                    out.push(format!(
                        "(D1) an acknowledged board write lost: {} then {}",
                        w.line(),
                        g.line()
                    ));
                }
            }
        }
    }
    // (D3) and (D4).
    let grants: Vec<(&Call, u64)> = calls
        .iter()
        .filter_map(|c| match (&c.op, &c.outcome) {
            (Op::Claim(_), Ok(v)) if v["acquired"] == true && v["reentrant"] != true => {
                v["fence"].as_u64().map(|f| (c, f))
            }
            _ => None,
        })
        .collect();
    for (a, fa) in &grants {
        for (b, fb) in &grants {
            if b.sent > a.done && fb <= fa {
                out.push(format!(
                    "(D3) a fence went back: {} then {}",
                    a.line(),
                    b.line()
                ));
            }
        }
        let Op::Claim(r) = &a.op else { continue };
        let released = |until: Duration| {
            calls.iter().any(|x| {
                x.who == a.who
                    && x.op == Op::Release(r.clone())
                    && x.sent > a.sent
                    && x.sent < until
            })
        };
        for c in calls {
            if c.who == a.who || c.op != a.op || c.sent <= a.done {
                continue;
            }
            if c.done >= a.sent + Duration::from_secs(LEASE_TTL_S) || released(c.done) {
                continue;
            }
            cover("(D4) judged", 1);
            if s.down_between(a.sent, c.done) {
                cover("(D4) judged across a power loss", 1);
            }
            if let Ok(v) = &c.outcome {
                if v["acquired"] == true {
                    out.push(format!("(D4) two holders: {} then {}", a.line(), c.line()));
                }
            }
        }
    }
    // (D6) mail: each message read at most once, and every acknowledged one read by the end.
    let mut read: BTreeMap<String, usize> = BTreeMap::new();
    for c in calls {
        if let (Op::Inbox, Ok(v)) = (&c.op, &c.outcome) {
            for m in v["messages"].as_array().into_iter().flatten() {
                if let Some(body) = m["body"].as_str() {
                    let times = read.entry(body.to_owned()).or_default();
                    *times += 1;
                    if *times == 2 {
                        out.push(format!("(D6) a message read twice: {body} in {}", c.line()));
                    }
                }
            }
        }
    }
    for c in calls {
        if let (Op::Send { to, body }, Ok(_)) = (&c.op, &c.outcome) {
            // A read whose answer was lost may have taken it (a read is a write: it commits
            // the cursor), and nobody can tell what it returned.
            let maybe_taken = calls.iter().any(|r| {
                r.who == *to && r.op == Op::Inbox && r.outcome.is_err() && r.done > c.sent
            });
            if maybe_taken {
                cover("(D6) excused: a read of it may have been lost", 1);
                continue;
            }
            cover("(D6) judged", 1);
            if !read.contains_key(body) {
                out.push(format!(
                    "(D6) an acknowledged message never read: {}",
                    c.line()
                ));
            }
        }
    }
    // (D5).
    for c in calls {
        if c.outcome.as_ref().is_err_and(|e| e == "http 404") {
            out.push(format!("(D5) the session was forgotten: {}", c.line()));
        }
    }
    out
}
