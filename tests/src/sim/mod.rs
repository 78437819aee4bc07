//! The deterministic simulation harness (the tests are in `tests/tests/simulation.rs`; the fleet
//! tools' scenarios are in [`fleet`], their tests in `tests/tests/fleet_sim.rs`; coordination
//! under faults is in [`coord`], its tests in `tests/tests/coord_sim.rs`).
//!
//! One seed is one run under turmoil: the real gateway server (`gateway_server::serve` on a
//! turmoil listener) on host `gateway`, one real sled uplink (`sled_sim::run_uplink`) per project
//! on hosts `sled-<project>`, and the scripted MCP sessions of `sled_sim::script` on one or two
//! client hosts, all on turmoil's network and clock. The [`Scenario`] drawn from the seed says
//! how many of each, how fast, and which faults strike when; [`run`] applies the faults between
//! simulation steps, then hands the histories, the sleds' final models and what each sled
//! received (its [`SledLog`]: requests with their progress tokens, the caller the gateway
//! named, when; cancellations) to the [`oracle`].
//!
//! The gateway's registry is a projects.toml ([`projects_toml`]) with the scenario's client
//! tokens and `[[access]]` rules ([`scenario::Access`]); each session sends its principal's
//! token, starts with the file's default only if its caller may see it, and the oracle judges
//! it by the rights the rules give it.
//!
//! Determinism: the simulation's RNG is seeded from the seed; the gateway's session ids and every
//! sled's and session's RNG too; time is turmoil's. Nothing that feeds the trace reads the wall
//! clock, spawns threads or iterates a hash map; HTTP headers (hyper's `Date` reads the wall
//! clock) are not part of the trace. The trace hash covers every request, response and its
//! simulated timing, every sled's final stories, and what every sled received.

pub mod cluster;
pub mod coord;
pub mod durable;
pub mod fleet;
pub mod net;
pub mod oracle;
pub mod runner;
pub mod scenario;
pub mod tasks;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_core::{Config, Registry};
use gateway_server::ServerOptions;
use sled_sim::mcp::{SharedSled, Sled, SledConfig, TaskIds};
use sled_sim::model::Project;
use sled_sim::net::GatewayAddr;
use sled_sim::script::{self, RunOptions, SessionHistory};
use sled_sim::sim_sled::{Received, SimSled, SledLog};
use sled_sim::uplink::{run_uplink_with, Backend, UplinkOptions};

pub use net::{TurmoilConnect, TurmoilListener};
pub use scenario::{Dir, Fault, FaultKind, FaultMode, Scenario};

use scenario::{
    BACKOFF_MAX, CALL_TIMEOUT, CLIENT_TIMEOUT, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT,
    PROBE_TIMEOUT, SLOW_BY,
};

/// What one run found.
#[derive(Debug, Clone)]
pub struct Report {
    pub seed: u64,
    /// Everything the oracle objects to; empty for a passing run.
    pub violations: Vec<String>,
    /// FNV-1a over the histories (requests, responses, simulated timings) and final models.
    pub trace_hash: u64,
    /// Simulated time the run took.
    pub sim_time: Duration,
    /// How often another session's switch landed between a session's switch and its call.
    pub interleavings: usize,
    /// Requests sent, probes included.
    pub exchanges: usize,
    /// Wall-clock time the run took (not part of the trace).
    pub wall: Duration,
    pub histories: Vec<SessionHistory>,
    /// What each project's sleds received, by project.
    pub received: BTreeMap<String, Vec<Received>>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The gateway's uplink port on host `gateway`.
const GATEWAY_PORT: u16 = 80;

/// The run's projects.toml: every project (the first is the default), the client tokens and
/// the `[[access]]` rules of [`Scenario::access`], parsed as the gateway parses a file.
/// A wall clock for the simulated hosts: a fixed instant plus the simulation's elapsed time, so
/// that the expiries of sealed messages replay with the seed.
pub fn sim_wall_clock() -> gateway_server::cluster::seal::WallClock {
    const BASE_MS: u64 = 1_800_000_000_000;
    Arc::new(|| BASE_MS + turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64)
}

pub fn projects_toml(s: &Scenario) -> String {
    let mut text = format!(
        "default = \"{}\"\ncall_timeout_ms = {}\n",
        s.projects[0],
        CALL_TIMEOUT.as_millis()
    );
    text.push_str(&s.access.tokens_toml());
    for p in &s.projects {
        text.push_str(&format!(
            "\n[[project]]\nname = \"{p}\"\nurl = \"http://sled-{p}:9000\"\ntoken = \"{}\"\n",
            uplink_token(p).expose()
        ));
        // The sim's sleds are ours: their `readOnlyHint`s say which tools `read` covers.
        text.push_str("trust_read_only_hints = true\n");
        if s.access.forward_principal.contains(p) {
            text.push_str("forward_principal = true\n");
        }
    }
    text.push_str(&s.access.rules_toml());
    text
}

/// The uplink token of a simulated project: its sleds present it, as real ones must (uplinks
/// are closed by default).
pub(crate) fn uplink_token(project: &str) -> gateway_core::Secret {
    gateway_core::Secret::new(format!("sim-uplink-token-{project}"))
}

fn gateway_options(s: &Scenario) -> ServerOptions {
    let text = projects_toml(s);
    let registry = Registry::parse("projects.toml", &text)
        .unwrap_or_else(|e| panic!("a valid sim registry: {e}\n{text}"));
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&s.seed.to_le_bytes());
    let mut opts = ServerOptions::new(registry, seed);
    // Health probes go over turmoil's network (the default prober would dial real TCP); pins
    // live in memory.
    opts.prober = Arc::new(gateway_server::HttpProber(TurmoilConnect));
    opts.pin_file = None;
    opts.core = Config {
        heartbeat_interval: HEARTBEAT_INTERVAL,
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        hello_timeout: Duration::from_secs(2),
        refresh_timeout: CALL_TIMEOUT,
        planted: s.planted,
        ..Config::default()
    };
    opts
}

/// One sled host's software: the uplink serving the story sled as a [`SimSled`] (which adds
/// the tools that ask for sampling and report progress), reading its latency when it starts,
/// recording what it receives in `log` under the host's name.
fn sled_software(
    sled: SharedSled,
    latency_ms: Arc<AtomicU64>,
    jitter: Duration,
    seed: u64,
    name: String,
    log: SledLog,
    host: String,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = turmoil::Result>>> {
    move || {
        let latency = Duration::from_millis(latency_ms.load(Ordering::Relaxed));
        let backend = Backend::Handler(Arc::new(
            SimSled::new(sled.clone(), latency, jitter, seed ^ 0x1a7e_9c11)
                .with_log(log.clone(), host.clone()),
        ));
        let opts = UplinkOptions {
            latency,
            jitter,
            seed,
            sled_name: name.clone(),
            backoff_min: Duration::from_millis(50),
            backoff_max: BACKOFF_MAX,
            token: Some(uplink_token(&name)),
            // The sweep's sleds present no identity and relay no events, as before the fleet
            // tools; `fleet.rs` runs those.
            identity: None,
            relay_interval: Duration::ZERO,
            stall_relay: false,
            tls: Default::default(),
            // Shutdown in the simulation is a crash or a stop at once; a drain is tested on its own.
            drain: None,
        };
        Box::pin(sled_host(backend, opts))
    }
}

/// A sled host's life: `backend` behind a real uplink to the simulated gateway, reconnecting
/// as `opts` say, until the host is crashed.
pub(crate) async fn sled_host(backend: Backend, opts: UplinkOptions) -> turmoil::Result {
    let gateway = GatewayAddr::parse(&format!("http://gateway:{GATEWAY_PORT}"))
        .expect("a valid gateway address");
    run_uplink_with(
        TurmoilConnect,
        gateway,
        backend,
        opts,
        std::future::pending(),
    )
    .await;
    Ok(())
}

/// turmoil's clock (the same on every host), zero outside a simulation.
fn sim_now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The wall clock of the sleds' tasks (`createdAt`): the instant of [`sim_wall_clock`] plus
/// the simulation's elapsed time.
fn sim_task_clock() -> Duration {
    Duration::from_millis(1_800_000_000_000) + sim_now()
}

/// Turns on tracing output when `DST_LOG` is set (e.g. `DST_LOG=debug`), for replays.
fn init_logging() {
    if let Ok(filter) = std::env::var("DST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_timer(SimTime)
            .with_ansi(false)
            .with_test_writer()
            .try_init();
    }
}

/// Log lines carry the simulated time, not the wall clock.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(t) => write!(w, "{:>9.3}s", t.as_secs_f64()),
            None => write!(w, "{:>10}", "-"),
        }
    }
}

/// Runs one scenario and judges it.
pub fn run(s: &Scenario) -> Report {
    init_logging();
    let started = std::time::Instant::now();
    let sleds: Vec<SharedSled> = s
        .projects
        .iter()
        .map(|p| {
            // Task ids `t1, t2, …` per sled, so that they collide across projects: the gateway
            // must never take a sled's task id for a global one. Timestamps by the run's clock.
            let config = SledConfig {
                task_ids: TaskIds::Counter,
                ..SledConfig::default()
            };
            let sled = Sled::new(Project::new(p.clone()), p.clone(), s.seed).with_config(config);
            SharedSled::with_task_clock(sled, sim_task_clock)
        })
        .collect();
    let logs: Vec<SledLog> = s
        .projects
        .iter()
        .map(|_| SledLog::with_clock(sim_now))
        .collect();
    let histories: Arc<Mutex<Vec<Option<SessionHistory>>>> =
        Arc::new(Mutex::new(vec![None; s.sessions]));
    let outcome =
        std::panic::catch_unwind(AssertUnwindSafe(|| simulate(s, &sleds, &logs, &histories)));
    let mut violations = Vec::new();
    let sim_time = match outcome {
        Ok(Ok(t)) => t,
        Ok(Err((t, e))) => {
            violations.push(format!(
                "the simulation failed at {t:?}: {e} (a request went unanswered, a session hung, or a host failed)"
            ));
            t
        }
        Err(panic) => {
            let msg = runner::panic_message(&*panic);
            violations.push(format!("the simulation panicked: {msg}"));
            Duration::ZERO
        }
    };
    let histories: Vec<SessionHistory> = histories
        .lock()
        .expect("no poisoned lock")
        .iter()
        .enumerate()
        .filter_map(|(i, h)| {
            if h.is_none() {
                violations.push(format!("session {i} never finished"));
            }
            h.clone()
        })
        .collect();
    // Every story in every sled, by name: (project, id).
    let mut stories: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for sled in &sleds {
        sled.with(|sled| {
            for story in sled.project().iter() {
                stories
                    .entry(story.name.clone())
                    .or_default()
                    .push((story.project_name(), story.id.clone()));
            }
        });
    }
    let received: BTreeMap<String, Vec<Received>> = s
        .projects
        .iter()
        .zip(&logs)
        .map(|(p, log)| (p.clone(), log.entries()))
        .collect();
    violations.extend(oracle::judge(s, &histories, &stories, &received));
    let mut hash = Fnv::default();
    for h in &histories {
        hash.write(format!("{h:?}").as_bytes());
    }
    hash.write(format!("{stories:?}").as_bytes());
    hash.write(format!("{received:?}").as_bytes());
    Report {
        seed: s.seed,
        violations,
        trace_hash: hash.0,
        sim_time,
        interleavings: script::interleavings(&histories),
        exchanges: histories.iter().map(|h| h.exchanges.len()).sum(),
        histories,
        received,
        wall: started.elapsed(),
    }
}

trait StoryProject {
    fn project_name(&self) -> String;
}

impl StoryProject for sled_sim::model::Story {
    /// Story ids are `<project>-<number>`.
    fn project_name(&self) -> String {
        self.id
            .rsplit_once('-')
            .map_or_else(String::new, |(p, _)| p.to_owned())
    }
}

/// What the fault driver does at one instant.
#[derive(Debug, Clone)]
enum Action {
    Start(FaultKind),
    End(FaultKind),
}

type SimResult = Result<Duration, (Duration, String)>;

fn simulate(
    s: &Scenario,
    sleds: &[SharedSled],
    logs: &[SledLog],
    histories: &Arc<Mutex<Vec<Option<SessionHistory>>>>,
) -> SimResult {
    let base_latency = s.net_latency_max;
    let mut sim = turmoil::Builder::new()
        .rng_seed(s.seed)
        .simulation_duration(s.probe_at + Duration::from_secs(120))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(base_latency)
        .build();

    let opts = gateway_options(s);
    sim.host("gateway", move || {
        let opts = opts.clone();
        async move {
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?;
            gateway_server::serve(TurmoilListener(listener), opts, std::future::pending()).await?;
            Ok(())
        }
    });

    let knobs: Vec<Arc<AtomicU64>> = s
        .sled_latency
        .iter()
        .map(|(l, _)| Arc::new(AtomicU64::new(millis(*l))))
        .collect();
    for (i, sled) in sleds.iter().enumerate() {
        sim.host(
            s.sled_host(i),
            sled_software(
                sled.clone(),
                knobs[i].clone(),
                s.sled_latency[i].1,
                s.seed ^ (i as u64 + 1),
                s.projects[i].clone(),
                logs[i].clone(),
                s.sled_host(i),
            ),
        );
    }

    let workload = s.workload();
    for c in 0..s.client_hosts {
        let mine: Vec<usize> = (c..s.sessions).step_by(s.client_hosts).collect();
        let workload = workload.clone();
        let histories = histories.clone();
        let probe_at = s.probe_at;
        let who: BTreeMap<usize, SessionCaller> =
            mine.iter().map(|&i| (i, SessionCaller::of(s, i))).collect();
        sim.client(Scenario::client_host(c), async move {
            let epoch = tokio::time::Instant::now();
            let mut tasks = Vec::new();
            for i in mine {
                let plan = script::session_plan_with_surface(&workload, i);
                let SessionCaller {
                    bearer,
                    default,
                    probe_project,
                } = who[&i].clone();
                let opts = RunOptions {
                    url: format!("http://gateway:{GATEWAY_PORT}/mcp"),
                    epoch,
                    client_timeout: CLIENT_TIMEOUT,
                    probe_at: Some(probe_at),
                    probe_timeout: PROBE_TIMEOUT,
                    init_attempts: 40,
                    bearer,
                    probe_project,
                };
                tasks.push((
                    i,
                    tokio::spawn(script::run_session(TurmoilConnect, plan, default, opts)),
                ));
            }
            for (i, task) in tasks {
                let h = task.await?;
                histories.lock().expect("no poisoned lock")[i] = Some(h);
            }
            Ok(())
        });
    }

    // The fault schedule, in time order (ends before starts at the same instant).
    let mut events: Vec<(Duration, u8, Action)> = Vec::new();
    for f in &s.faults {
        events.push((f.at, 1, Action::Start(f.kind.clone())));
        events.push((f.until, 0, Action::End(f.kind.clone())));
    }
    events.sort_by_key(|(at, order, _)| (*at, *order));
    let mut events = events.into_iter().peekable();
    let mut twins_started = Vec::new();
    loop {
        let now = sim.elapsed();
        while let Some((_, _, action)) = events.next_if(|(at, _, _)| *at <= now) {
            apply(
                &mut sim,
                s,
                (sleds, logs),
                &knobs,
                &mut twins_started,
                action,
                base_latency,
            );
        }
        match sim.step() {
            Ok(true) => return Ok(sim.elapsed()),
            Ok(false) => {}
            Err(e) => return Err((sim.elapsed(), e.to_string())),
        }
    }
}

/// Who a session is, for its client: its token, its default project (the file's, if its caller
/// may see it), and the project its liveness probe names (none: its default; else the first it
/// may see).
#[derive(Debug, Clone)]
struct SessionCaller {
    bearer: Option<String>,
    default: Option<String>,
    probe_project: Option<String>,
}

impl SessionCaller {
    fn of(s: &Scenario, i: usize) -> SessionCaller {
        let rights = s.access.rights(i, &s.projects);
        let default = rights.sees(&s.projects[0]).then(|| s.projects[0].clone());
        let probe_project = match default {
            Some(_) => None,
            None => rights.visible.first().cloned(),
        };
        SessionCaller {
            bearer: s.access.principal(i).map(|p| p.token.clone()),
            default,
            probe_project,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn apply(
    sim: &mut turmoil::Sim<'_>,
    s: &Scenario,
    (sleds, logs): (&[SharedSled], &[SledLog]),
    knobs: &[Arc<AtomicU64>],
    twins: &mut Vec<usize>,
    action: Action,
    base_latency: Duration,
) {
    let partition = |sim: &mut turmoil::Sim<'_>, other: &str, dir: Dir, on: bool| match (dir, on) {
        (Dir::Both, true) => sim.partition("gateway", other),
        (Dir::Both, false) => sim.repair("gateway", other),
        (Dir::ToGateway, true) => sim.partition_oneway(other, "gateway"),
        (Dir::ToGateway, false) => sim.repair_oneway(other, "gateway"),
        (Dir::FromGateway, true) => sim.partition_oneway("gateway", other),
        (Dir::FromGateway, false) => sim.repair_oneway("gateway", other),
    };
    match action {
        Action::Start(FaultKind::PartitionSled { sled, dir }) => {
            partition(sim, &s.sled_host(sled), dir, true);
        }
        Action::End(FaultKind::PartitionSled { sled, dir }) => {
            partition(sim, &s.sled_host(sled), dir, false);
        }
        Action::Start(FaultKind::PartitionClient { client, dir }) => {
            partition(sim, &Scenario::client_host(client), dir, true);
        }
        Action::End(FaultKind::PartitionClient { client, dir }) => {
            partition(sim, &Scenario::client_host(client), dir, false);
        }
        Action::Start(FaultKind::LatencySpike { max }) => sim.set_max_message_latency(max),
        Action::End(FaultKind::LatencySpike { .. }) => sim.set_max_message_latency(base_latency),
        Action::Start(FaultKind::CrashRestart { sled }) => {
            // Partition first: turmoil's crash alone closes the sockets cleanly.
            sim.partition("gateway", s.sled_host(sled));
            sim.crash(s.sled_host(sled));
        }
        Action::End(FaultKind::CrashRestart { sled }) => {
            sim.repair("gateway", s.sled_host(sled));
            sim.bounce(s.sled_host(sled));
        }
        Action::Start(FaultKind::Twin { sled }) => {
            if !twins.contains(&sled) {
                twins.push(sled);
                sim.host(
                    s.twin_host(sled),
                    sled_software(
                        sleds[sled].clone(),
                        knobs[sled].clone(),
                        s.sled_latency[sled].1,
                        s.seed ^ 0x7717,
                        format!("{}-twin", s.projects[sled]),
                        logs[sled].clone(),
                        s.twin_host(sled),
                    ),
                );
            }
        }
        Action::End(FaultKind::Twin { sled }) => sim.crash(s.twin_host(sled)),
        Action::Start(FaultKind::Slow { sled }) => {
            knobs[sled].store(millis(CALL_TIMEOUT + SLOW_BY), Ordering::Relaxed);
            sim.bounce(s.sled_host(sled));
        }
        Action::End(FaultKind::Slow { sled }) => {
            knobs[sled].store(millis(s.sled_latency[sled].0), Ordering::Relaxed);
            sim.bounce(s.sled_host(sled));
        }
    }
}

/// A run's trace hash: FNV-1a over its lines (each ended by a newline) and its simulated time.
fn trace_hash(trace: &[String], sim_time: Duration) -> u64 {
    let mut hash = Fnv::default();
    for line in trace {
        hash.write(line.as_bytes());
        hash.write(b"\n");
    }
    hash.write(format!("{sim_time:?}").as_bytes());
    hash.0
}

/// FNV-1a, 64 bits: stable across runs, platforms and Rust versions.
#[derive(Debug)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
