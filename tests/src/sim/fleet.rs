//! The fleet tools under turmoil (the tests are in `tests/tests/fleet_sim.rs`).
//!
//! Each scenario is one seed: the real gateway (`gateway_server::serve`, health probes over
//! turmoil's network through `gateway_server::HttpProber`, pins in memory) on host `gateway`,
//! real sled uplinks (`sled_sim::run_uplink_with` serving the story sled, each proving its
//! `sled_sim::sled_key`) on hosts `sled-<project>`, and one client host that calls the fleet
//! tools over MCP (`sled_sim::McpClient`) and checks every answer against what the scenario
//! says must be true. What the seed draws, and what is checked:
//!
//! - [`FanoutScenario`] (`aggregate_pipeline_status`): 6–12 sleds, each normal, slow (latency
//!   past the per-project deadline), never started, crashed before the call, crashed during it
//!   (turmoil's crash closes its sockets), or powered off during it (partition, then crash: the
//!   gateway hears nothing). The answer must come by the per-project deadline (plus network
//!   slack), list every registered project exactly once, name in `not_answered` exactly the
//!   faulty ones with the reason each fault implies (`no_uplink`, `timed_out`, `error`,
//!   `timed_out`), and give each answered project the stage counts its sled's model holds.
//! - [`ImpostorScenario`] (`fleet_identity`): the real sled of one project is pinned; an impostor
//!   with `sled_sim::impostor_key` connects later from another host and is refused with 4007 at
//!   every retry, while calls still reach the real sled; an explicit re-pin closes the real sled
//!   and the impostor is accepted at its next retry, and the real sled is then the refused one.
//! - [`RelayScenario`] (`gateway_health`): sleds relay a `sync` event every interval; some
//!   stall their relay, one may crash, one may never start (its url names no host, so its probe
//!   fails). Before the staleness threshold every running sled is up; after it, `summary.stale`
//!   names exactly the stalled ones, `up` the others running, `down` the crashed and the never
//!   started.
//!
//! Every answer the client gets goes into a trace (with its simulated time); its FNV hash checks
//! determinism.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_core::identity::encode_key;
use gateway_core::{Config, ProjectSpec, Registry};
use gateway_server::ServerOptions;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use sled_sim::mcp::{SharedSled, Sled};
use sled_sim::model::Project;
use sled_sim::uplink::{UplinkOptions, UNKNOWN_PROJECT_BACKOFF_FACTOR};
use sled_sim::{impostor_key, sled_key, McpClient};

use super::{TurmoilConnect, TurmoilListener, GATEWAY_PORT};

const MCP_URL: &str = "http://gateway:80/mcp";
/// The gateway's heartbeats in these scenarios: a partitioned sled is found out only after
/// `HEARTBEAT_TIMEOUT`, longer than any fan-out deadline drawn here.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// What one run found.
pub type FleetReport = super::runner::SweepReport;

// ---------------------------------------------------------------------------------------------
// Shared pieces: the gateway host, sled hosts, the client, the run loop.

/// The gateway for `projects` (each with its url), with `core` settings and the seed's RNG.
fn server_options(seed: u64, projects: &[(String, String)], core: Config) -> ServerOptions {
    let specs = projects
        .iter()
        .map(|(name, url)| {
            let mut spec = ProjectSpec::new(name.clone(), url.clone());
            spec.call_timeout = Duration::from_secs(5);
            spec
        })
        .collect();
    // The fleet sweep is about identity pinned on first use: its sleds present keys and no
    // token, so its projects take unauthenticated uplinks (which never replace a live one).
    let registry = Registry::from_projects(specs, Some(&projects[0].0))
        .expect("a valid sim registry")
        .allowing_unauthenticated_uplinks();
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8] = 0xf1;
    let mut opts = ServerOptions::new(registry, bytes);
    opts.prober = Arc::new(gateway_server::HttpProber(TurmoilConnect));
    opts.pin_file = None;
    opts.core = Config {
        heartbeat_interval: HEARTBEAT_INTERVAL,
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        hello_timeout: Duration::from_secs(2),
        ..core
    };
    opts
}

fn add_gateway(sim: &mut turmoil::Sim<'_>, opts: ServerOptions) {
    sim.host("gateway", move || {
        let opts = opts.clone();
        async move {
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?;
            gateway_server::serve(TurmoilListener(listener), opts, std::future::pending()).await?;
            Ok(())
        }
    });
}

type HostFuture = Pin<Box<dyn Future<Output = turmoil::Result>>>;

/// A sled host: the story sled `sled` behind a real uplink with `opts`. The model lives outside
/// the host, so it outlives a crash.
fn sled_software(sled: SharedSled, opts: UplinkOptions) -> impl Fn() -> HostFuture + 'static {
    move || {
        let backend = sled_sim::uplink::story(sled.clone());
        let opts = opts.clone();
        Box::pin(super::sled_host(backend, opts))
    }
}

/// Uplink options of a sled in these scenarios.
fn uplink_options(seed: u64, sled_name: &str, latency: Duration) -> UplinkOptions {
    UplinkOptions {
        latency,
        jitter: Duration::ZERO,
        seed,
        sled_name: sled_name.to_owned(),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        token: None,
        identity: None,
        relay_interval: Duration::ZERO,
        stall_relay: false,
        tls: Default::default(),
        // Shutdown in the simulation is a crash or a stop at once; a drain is tested on its own.
        drain: None,
    }
}

/// A story sled for `project` with a few stories in various stages, blocked and failing,
/// drawn from `seed`.
fn story_sled(project: &str, sled_name: &str, seed: u64) -> SharedSled {
    SharedSled::new(Sled::new(
        Project::seeded(project, seed),
        sled_name.to_owned(),
        seed,
    ))
}

/// The scenario's client: an MCP session that records every answer in the trace.
struct Client {
    mcp: McpClient<TurmoilConnect>,
    next_id: u64,
    epoch: tokio::time::Instant,
    trace: Arc<Mutex<Vec<String>>>,
}

impl Client {
    /// Connects and initializes, retrying while the gateway is not listening yet.
    async fn start(trace: Arc<Mutex<Vec<String>>>) -> Result<Client, String> {
        let epoch = tokio::time::Instant::now();
        let mut last = String::new();
        for _ in 0..50 {
            match McpClient::connect(TurmoilConnect, MCP_URL).await {
                Ok(mut mcp) => {
                    mcp.set_timeout(Some(Duration::from_secs(20)));
                    match mcp.initialize().await {
                        Ok(_) => {
                            return Ok(Client {
                                mcp,
                                next_id: 0,
                                epoch,
                                trace,
                            })
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("the client could not initialize a session: {last}"))
    }

    /// Simulated time since the client started.
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// `tools/call`; the whole JSON-RPC response, recorded in the trace.
    async fn call(&mut self, tool: &str, arguments: Value) -> Result<Value, String> {
        self.next_id += 1;
        let sent = self.now();
        let answer = self
            .mcp
            .tools_call(json!(self.next_id), tool, arguments.clone())
            .await
            .map_err(|e| format!("{tool} {arguments}: no answer: {e}"));
        let line = format!(
            "{:>6} ms..{:>6} ms {tool} {arguments} -> {}",
            sent.as_millis(),
            self.now().as_millis(),
            match &answer {
                // The structured content says it all (the text content repeats it).
                Ok(v) => match v.pointer("/result/structuredContent") {
                    Some(s) => format!(
                        "{}{s}",
                        if v["result"]["isError"] == true {
                            "isError "
                        } else {
                            ""
                        }
                    ),
                    None => v.to_string(),
                },
                Err(e) => e.clone(),
            }
        );
        self.trace.lock().expect("no poisoned lock").push(line);
        answer
    }

    /// A tool's structured content, or why there is none.
    async fn structured(&mut self, tool: &str, arguments: Value) -> Result<Value, String> {
        let answer = self.call(tool, arguments.clone()).await?;
        structured(&answer).map_err(|e| format!("{tool} {arguments}: {e}"))
    }

    /// The projects `list_projects` shows live.
    async fn live(&mut self) -> Result<BTreeSet<String>, String> {
        let s = self.structured("list_projects", json!({})).await?;
        Ok(s["projects"]
            .as_array()
            .ok_or("list_projects has no `projects`")?
            .iter()
            .filter(|p| p["live"] == true)
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect())
    }

    /// Polls `list_projects` (every 100 ms, for at most `within`) until exactly `want` is live.
    async fn await_live(
        &mut self,
        want: &BTreeSet<String>,
        within: Duration,
    ) -> Result<(), String> {
        let until = self.now() + within;
        loop {
            let live = self.live().await?;
            if &live == want {
                return Ok(());
            }
            if self.now() >= until {
                return Err(format!(
                    "by {:?} the live projects were {live:?}, not {want:?}",
                    self.now()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A `tools/call` response's structured content, if it is a successful result.
fn structured(answer: &Value) -> Result<Value, String> {
    if let Some(e) = answer.get("error") {
        return Err(format!("a JSON-RPC error: {e}"));
    }
    let result = &answer["result"];
    if result["isError"] == true {
        return Err(format!("an isError result: {result}"));
    }
    match result.get("structuredContent") {
        Some(s @ Value::Object(_)) => Ok(s.clone()),
        _ => Err(format!("a result without structured content: {result}")),
    }
}

/// Whether a fan-out row or `not_answered` entry says why, in a non-empty `detail`.
fn has_detail(v: &Value) -> bool {
    v["detail"].as_str().is_some_and(|d| !d.is_empty())
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Things the fault driver does, at an instant or relative to a moment the client announces.
enum Action {
    /// Crash the host (its sockets close: peers see the connection end).
    Crash(String),
    /// Power loss: partition it from the gateway, then crash it (peers hear nothing).
    PowerOff(String),
    /// Start a host that was not there.
    Start(String, Box<dyn Fn() -> HostFuture>),
}

fn apply(sim: &mut turmoil::Sim<'_>, action: Action) {
    match action {
        Action::Crash(host) => sim.crash(host),
        Action::PowerOff(host) => {
            sim.partition("gateway", host.as_str());
            sim.crash(host);
        }
        Action::Start(host, software) => sim.host(host, software),
    }
}

/// When an action happens: at a simulated time, or an offset after the client's mark.
enum When {
    At(Duration),
    AfterMark(Duration),
}

type SimResult = Result<Duration, (Duration, String)>;

/// Steps the simulation until the client is done, applying `actions` when due.
fn drive(
    mut sim: turmoil::Sim<'_>,
    mut actions: Vec<(When, Action)>,
    mark: &Arc<Mutex<Option<Duration>>>,
) -> SimResult {
    loop {
        let now = sim.elapsed();
        let marked = *mark.lock().expect("no poisoned lock");
        let due = |w: &When| match w {
            When::At(t) => *t <= now,
            When::AfterMark(d) => marked.is_some_and(|m| m + *d <= now),
        };
        let mut i = 0;
        while i < actions.len() {
            if due(&actions[i].0) {
                let (_, action) = actions.remove(i);
                apply(&mut sim, action);
            } else {
                i += 1;
            }
        }
        match sim.step() {
            Ok(true) => return Ok(sim.elapsed()),
            Ok(false) => {}
            Err(e) => return Err((sim.elapsed(), e.to_string())),
        }
    }
}

fn builder(seed: u64, net_latency_max: Duration, duration: Duration) -> turmoil::Sim<'static> {
    turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(duration)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(net_latency_max)
        .build()
}

/// The report of a run: its outcome (a failed or panicked simulation is a violation), the
/// client's violations and its trace.
fn finish(
    seed: u64,
    scenario: String,
    started: std::time::Instant,
    outcome: std::thread::Result<SimResult>,
    violations: &Arc<Mutex<Vec<String>>>,
    trace: &Arc<Mutex<Vec<String>>>,
    coverage: BTreeMap<String, usize>,
) -> FleetReport {
    let mut violations = std::mem::take(&mut *violations.lock().expect("no poisoned lock"));
    let sim_time = match outcome {
        Ok(Ok(t)) => t,
        Ok(Err((t, e))) => {
            violations.push(format!("the simulation failed at {t:?}: {e}"));
            t
        }
        Err(panic) => {
            let msg = super::runner::panic_message(&*panic);
            violations.push(format!("the simulation panicked: {msg}"));
            Duration::ZERO
        }
    };
    let trace = std::mem::take(&mut *trace.lock().expect("no poisoned lock"));
    let hash = super::trace_hash(&trace, sim_time);
    FleetReport {
        seed,
        scenario,
        violations,
        trace_hash: hash,
        trace,
        sim_time,
        wall: started.elapsed(),
        coverage,
    }
}

/// The shared state of one run's client host.
#[derive(Clone, Default)]
struct Shared {
    violations: Arc<Mutex<Vec<String>>>,
    trace: Arc<Mutex<Vec<String>>>,
    mark: Arc<Mutex<Option<Duration>>>,
}

impl Shared {
    fn violation(&self, v: String) {
        self.violations.lock().expect("no poisoned lock").push(v);
    }

    /// Records the moment the faults relative to the client's action count from.
    fn set_mark(&self) {
        *self.mark.lock().expect("no poisoned lock") = turmoil::sim_elapsed();
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------
// 1. aggregate_pipeline_status with slow and dead sleds.

/// What one sled of a fan-out scenario does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanoutRole {
    /// Answers within its latency (below the per-project deadline).
    Normal { latency: Duration },
    /// Answers `latency` late, past the per-project deadline: `timed_out`.
    Slow { latency: Duration },
    /// Its host never starts: `no_uplink`.
    NeverStarted,
    /// Crashes at `at`, before the call; the gateway sees the connection end: `no_uplink`.
    CrashedBefore { at: Duration },
    /// Crashes `after` the call was sent, before it answers (its latency is longer); the gateway
    /// sees the connection end while the call is pending: `error`.
    CrashedDuring { latency: Duration, after: Duration },
    /// Powered off (partitioned, then crashed) `after` the call was sent, before it answers; the
    /// gateway hears nothing until the per-project deadline: `timed_out`.
    PowerOffDuring { latency: Duration, after: Duration },
}

impl FanoutRole {
    /// The `not_answered` reason this role implies (None: answered).
    pub fn expected_reason(self) -> Option<&'static str> {
        match self {
            FanoutRole::Normal { .. } => None,
            FanoutRole::Slow { .. } | FanoutRole::PowerOffDuring { .. } => Some("timed_out"),
            FanoutRole::NeverStarted | FanoutRole::CrashedBefore { .. } => Some("no_uplink"),
            FanoutRole::CrashedDuring { .. } => Some("error"),
        }
    }

    fn latency(self) -> Duration {
        match self {
            FanoutRole::Normal { latency }
            | FanoutRole::Slow { latency }
            | FanoutRole::CrashedDuring { latency, .. }
            | FanoutRole::PowerOffDuring { latency, .. } => latency,
            FanoutRole::NeverStarted | FanoutRole::CrashedBefore { .. } => Duration::ZERO,
        }
    }

    /// Whether the sled is live when the call is made.
    fn live_at_call(self) -> bool {
        !matches!(
            self,
            FanoutRole::NeverStarted | FanoutRole::CrashedBefore { .. }
        )
    }
}

#[derive(Clone)]
pub struct FanoutScenario {
    pub seed: u64,
    pub projects: Vec<String>,
    pub roles: Vec<FanoutRole>,
    pub net_latency_max: Duration,
    /// The call's overall deadline (`timeout_ms`).
    pub overall: Duration,
    /// The per-project deadline: passed as `per_project_timeout_ms`, or (when `per_project_arg`
    /// is false) the gateway's `fanout_sled_timeout`.
    pub per_project: Duration,
    pub per_project_arg: bool,
}

impl fmt::Debug for FanoutScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fan-out seed {}: {} sleds, net ≤ {:?}, overall {:?}, per project {:?} ({})",
            self.seed,
            self.projects.len(),
            self.net_latency_max,
            self.overall,
            self.per_project,
            if self.per_project_arg {
                "argument"
            } else {
                "the gateway's fanout_sled_timeout"
            }
        )?;
        for (p, r) in self.projects.iter().zip(&self.roles) {
            writeln!(f, "  {p}: {r:?}")?;
        }
        Ok(())
    }
}

/// The crash-during and power-off-during faults strike this long after the call is sent: the
/// gateway has forwarded it by then (the network takes at most `net_latency_max` ≤ 30 ms).
const DURING: Duration = Duration::from_millis(300);

impl FanoutScenario {
    pub fn draw(seed: u64) -> FanoutScenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfa40_0a7e_0000_0001);
        let n = rng.random_range(6..=12);
        let projects = sled_sim::demo_project_names(n);
        let net_latency_max = Duration::from_millis(rng.random_range(1..=30));
        let per_project = Duration::from_millis(rng.random_range(800..=1_500));
        // A quarter of the seeds: both deadlines the same instant (the overall one also fires).
        let overall = if rng.random_bool(0.25) {
            per_project
        } else {
            per_project + Duration::from_millis(rng.random_range(200..=1_500))
        };
        let per_project_arg = rng.random_bool(0.5);
        let pp = millis(per_project);
        let roles = (0..n)
            .map(|_| match rng.random_range(0..100) {
                0..=44 => FanoutRole::Normal {
                    latency: Duration::from_millis(rng.random_range(0..=pp / 3)),
                },
                45..=56 => FanoutRole::Slow {
                    latency: Duration::from_millis(pp + rng.random_range(200..=2_000)),
                },
                57..=66 => FanoutRole::NeverStarted,
                67..=77 => FanoutRole::CrashedBefore {
                    at: Duration::from_millis(rng.random_range(500..=1_200)),
                },
                78..=88 => FanoutRole::CrashedDuring {
                    latency: Duration::from_millis(
                        rng.random_range(millis(DURING) + 200..=pp - 150),
                    ),
                    after: DURING,
                },
                _ => FanoutRole::PowerOffDuring {
                    latency: Duration::from_millis(
                        rng.random_range(millis(DURING) + 200..=pp - 150),
                    ),
                    after: DURING,
                },
            })
            .collect();
        FanoutScenario {
            seed,
            projects,
            roles,
            net_latency_max,
            overall,
            per_project,
            per_project_arg,
        }
    }

    fn host(&self, i: usize) -> String {
        format!("sled-{}", self.projects[i])
    }

    fn sled_name(&self, i: usize) -> String {
        format!("{}-sled", self.projects[i])
    }
}

/// The part of a `pipeline_status` answer the aggregate keeps, straight from the sled's model.
fn model_status(sled: &SharedSled) -> Value {
    let v = sled.with(|s| s.call_tool("pipeline_status", None));
    let s = v.expect("pipeline_status is a tool")["structuredContent"].clone();
    json!({
        "total": s["total"],
        "stages": s["stages"],
        "blocked": s["blocked"],
        "failing": s["failing"],
    })
}

pub fn run_fanout(s: &FanoutScenario) -> FleetReport {
    super::init_logging();
    let started = std::time::Instant::now();
    let sleds: Vec<SharedSled> = s
        .projects
        .iter()
        .enumerate()
        .map(|(i, p)| story_sled(p, &s.sled_name(i), s.seed ^ (i as u64 + 1)))
        .collect();
    let expected: BTreeMap<String, Value> = s
        .projects
        .iter()
        .zip(&sleds)
        .map(|(p, sled)| (p.clone(), model_status(sled)))
        .collect();
    let shared = Shared::default();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        simulate_fanout(s, &sleds, &expected, &shared)
    }));
    let mut coverage = BTreeMap::new();
    for r in &s.roles {
        let key = match r.expected_reason() {
            None => "answered".to_owned(),
            Some(reason) => format!(
                "{reason} ({})",
                format!("{r:?}").split(' ').next().unwrap_or("")
            ),
        };
        *coverage.entry(key).or_default() += 1;
    }
    finish(
        s.seed,
        format!("{s:?}"),
        started,
        outcome,
        &shared.violations,
        &shared.trace,
        coverage,
    )
}

fn simulate_fanout(
    s: &FanoutScenario,
    sleds: &[SharedSled],
    expected: &BTreeMap<String, Value>,
    shared: &Shared,
) -> SimResult {
    let mut sim = builder(s.seed, s.net_latency_max, Duration::from_secs(30));
    let projects: Vec<(String, String)> = s
        .projects
        .iter()
        .map(|p| (p.clone(), format!("http://sled-{p}:9000")))
        .collect();
    let core = Config {
        fanout_timeout: Duration::from_secs(30),
        fanout_sled_timeout: s.per_project,
        ..Config::default()
    };
    add_gateway(&mut sim, server_options(s.seed, &projects, core));
    let mut actions = Vec::new();
    for (i, role) in s.roles.iter().enumerate() {
        if *role == FanoutRole::NeverStarted {
            continue;
        }
        let mut opts = uplink_options(s.seed ^ (i as u64 + 1), &s.sled_name(i), role.latency());
        opts.identity = Some(sled_key(s.seed, &s.projects[i]));
        opts.relay_interval = Duration::from_secs(1);
        sim.host(s.host(i), sled_software(sleds[i].clone(), opts));
        match *role {
            FanoutRole::CrashedBefore { at } => {
                actions.push((When::At(at), Action::Crash(s.host(i))))
            }
            FanoutRole::CrashedDuring { after, .. } => {
                actions.push((When::AfterMark(after), Action::Crash(s.host(i))));
            }
            FanoutRole::PowerOffDuring { after, .. } => {
                actions.push((When::AfterMark(after), Action::PowerOff(s.host(i))));
            }
            _ => {}
        }
    }
    let scenario = s.clone();
    let expected = expected.clone();
    let client_shared = shared.clone();
    sim.client("client", async move {
        if let Err(v) = fanout_client(&scenario, &expected, &client_shared).await {
            client_shared.violation(v);
        }
        Ok(())
    });
    drive(sim, actions, &shared.mark)
}

async fn fanout_client(
    s: &FanoutScenario,
    expected: &BTreeMap<String, Value>,
    shared: &Shared,
) -> Result<(), String> {
    let mut c = Client::start(shared.trace.clone()).await?;
    // Every crash-before has happened by 1.2 s; then exactly the others are live.
    tokio::time::sleep(Duration::from_millis(1_300).saturating_sub(c.now())).await;
    let live: BTreeSet<String> = s
        .projects
        .iter()
        .zip(&s.roles)
        .filter(|(_, r)| r.live_at_call())
        .map(|(p, _)| p.clone())
        .collect();
    c.await_live(&live, Duration::from_secs(8)).await?;

    let mut args = json!({ "timeout_ms": millis(s.overall) });
    if s.per_project_arg {
        args["per_project_timeout_ms"] = json!(millis(s.per_project));
    }
    shared.set_mark();
    let sent = c.now();
    let answer = c.call("aggregate_pipeline_status", args).await?;
    let took = c.now() - sent;
    let a = structured(&answer).map_err(|e| format!("aggregate_pipeline_status: {e}"))?;
    let mut out = Vec::new();

    // When: nothing waits past the per-project deadline (which is at most the overall one).
    let deadline = s.per_project.min(s.overall);
    let slack = s.net_latency_max * 2 + Duration::from_millis(50);
    if took > deadline + slack {
        out.push(format!(
            "the answer took {took:?}, past the per-project deadline {deadline:?} (+{slack:?} for the network); the overall deadline is {:?}",
            s.overall
        ));
    }
    let waits_for_deadline = s.roles.iter().any(|r| {
        matches!(
            r,
            FanoutRole::Slow { .. } | FanoutRole::PowerOffDuring { .. }
        )
    });
    let took_ms = a["took_ms"].as_u64().unwrap_or(u64::MAX);
    if waits_for_deadline && !(millis(deadline)..=millis(deadline) + 50).contains(&took_ms) {
        out.push(format!(
            "a sled could only be given up on at the deadline {deadline:?}, yet took_ms is {took_ms}"
        ));
    }
    if !waits_for_deadline && took_ms >= millis(deadline) {
        out.push(format!(
            "every sled answered or failed before the deadline {deadline:?}, yet took_ms is {took_ms}"
        ));
    }

    // Who: every registered project once; the right status for each.
    let rows = a["projects"].as_array().cloned().unwrap_or_default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for row in &rows {
        *seen
            .entry(row["project"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    let registered: BTreeMap<String, usize> = s.projects.iter().map(|p| (p.clone(), 1)).collect();
    if seen != registered {
        out.push(format!(
            "`projects` must list each registered project once: it lists {seen:?}"
        ));
    }
    let mut want_not_answered = BTreeMap::new();
    for (p, role) in s.projects.iter().zip(&s.roles) {
        let Some(row) = rows.iter().find(|r| r["project"] == p.as_str()) else {
            continue;
        };
        match role.expected_reason() {
            None => {
                let want = &expected[p];
                let got = json!({
                    "total": row["total"],
                    "stages": row["stages"],
                    "blocked": row["blocked"],
                    "failing": row["failing"],
                });
                if row["status"] != "ok" || &got != want {
                    out.push(format!(
                        "{p} ({role:?}) should be answered with its model's {want}; its row is {row}"
                    ));
                }
            }
            Some(reason) => {
                want_not_answered.insert(p.clone(), reason);
                if row["status"] != reason || !has_detail(row) {
                    out.push(format!(
                        "{p} ({role:?}) should have status {reason} and a detail; its row is {row}"
                    ));
                }
            }
        }
    }
    let mut got_not_answered = BTreeMap::new();
    for x in a["not_answered"].as_array().cloned().unwrap_or_default() {
        let p = x["project"].as_str().unwrap_or("?").to_owned();
        if !has_detail(&x) {
            out.push(format!("not_answered entry without a detail: {x}"));
        }
        if got_not_answered
            .insert(p.clone(), x["reason"].as_str().unwrap_or("?").to_owned())
            .is_some()
        {
            out.push(format!("{p} is named twice in not_answered"));
        }
    }
    let want_na: BTreeMap<String, String> = want_not_answered
        .iter()
        .map(|(p, r)| (p.clone(), (*r).to_owned()))
        .collect();
    if got_not_answered != want_na {
        out.push(format!(
            "not_answered should be exactly {want_na:?}; it is {got_not_answered:?}"
        ));
    }

    // Totals: the sums over the answered projects' models.
    let answered: Vec<&Value> = s
        .projects
        .iter()
        .zip(&s.roles)
        .filter(|(_, r)| r.expected_reason().is_none())
        .map(|(p, _)| &expected[p])
        .collect();
    let mut stages: BTreeMap<String, u64> = BTreeMap::new();
    for m in &answered {
        for (stage, n) in m["stages"].as_object().into_iter().flatten() {
            *stages.entry(stage.clone()).or_default() += n.as_u64().unwrap_or(0);
        }
    }
    let count = |k: &str| -> usize {
        answered
            .iter()
            .map(|m| m[k].as_array().map_or(0, Vec::len))
            .sum()
    };
    let want_totals = json!({
        "registered": s.projects.len(),
        "answered": answered.len(),
        "not_answered": s.projects.len() - answered.len(),
        "stories": answered.iter().map(|m| m["total"].as_u64().unwrap_or(0)).sum::<u64>(),
        "stages": stages,
        "blocked": count("blocked"),
        "failing": count("failing"),
    });
    if a["totals"] != want_totals {
        out.push(format!(
            "totals should be {want_totals}; they are {}",
            a["totals"]
        ));
    }

    // The same through an ordinary routed call: the first answered project's own
    // pipeline_status matches its row.
    if let Some((p, _)) = s
        .projects
        .iter()
        .zip(&s.roles)
        .find(|(_, r)| r.expected_reason().is_none())
    {
        let direct = c
            .structured("pipeline_status", json!({ "project": p }))
            .await?;
        let row = rows.iter().find(|r| r["project"] == p.as_str());
        let same = row.is_some_and(|row| {
            ["total", "stages", "blocked", "failing"]
                .iter()
                .all(|k| row[*k] == direct[*k])
        });
        if !same || direct["project"] != p.as_str() {
            out.push(format!(
                "{p}'s own pipeline_status {direct} differs from its aggregate row {row:?}"
            ));
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(out.join("\n    "))
    }
}

// ---------------------------------------------------------------------------------------------
// 2. An impostor sled, then a re-pin.

#[derive(Clone)]
pub struct ImpostorScenario {
    pub seed: u64,
    pub projects: Vec<String>,
    /// The project the impostor claims.
    pub target: usize,
    /// When the impostor's host starts.
    pub impostor_at: Duration,
    /// Both sleds' `backoff_max`: after a 4007 they retry in `UNKNOWN_PROJECT_BACKOFF_FACTOR` ×.
    pub backoff_max: Duration,
    pub net_latency_max: Duration,
}

impl fmt::Debug for ImpostorScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "impostor seed {}: projects {:?}, impostor for {} at {:?}, backoff_max {:?} (retry after a 4007 in {:?}), net ≤ {:?}",
            self.seed,
            self.projects,
            self.projects[self.target],
            self.impostor_at,
            self.backoff_max,
            self.refused_retry(),
            self.net_latency_max
        )
    }
}

impl ImpostorScenario {
    pub fn draw(seed: u64) -> ImpostorScenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1395_7e50_0000_0002);
        let n = rng.random_range(2..=5);
        ImpostorScenario {
            seed,
            projects: sled_sim::demo_project_names(n),
            target: rng.random_range(0..n),
            impostor_at: Duration::from_millis(rng.random_range(1_000..=2_500)),
            backoff_max: Duration::from_millis(rng.random_range(80..=300)),
            net_latency_max: Duration::from_millis(rng.random_range(1..=30)),
        }
    }

    /// How long a sled waits after a 4007 before it tries again.
    pub fn refused_retry(&self) -> Duration {
        self.backoff_max * UNKNOWN_PROJECT_BACKOFF_FACTOR
    }

    fn real_name(&self, i: usize) -> String {
        format!("{}-sled", self.projects[i])
    }

    fn impostor_name(&self) -> String {
        format!("{}-impostor", self.projects[self.target])
    }

    fn real_key(&self, i: usize) -> String {
        encode_key(&sled_key(self.seed, &self.projects[i]).verifying_key())
    }

    fn impostor_key(&self) -> String {
        encode_key(&impostor_key(self.seed, &self.projects[self.target]).verifying_key())
    }
}

pub fn run_impostor(s: &ImpostorScenario) -> FleetReport {
    super::init_logging();
    let started = std::time::Instant::now();
    let shared = Shared::default();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| simulate_impostor(s, &shared)));
    finish(
        s.seed,
        format!("{s:?}"),
        started,
        outcome,
        &shared.violations,
        &shared.trace,
        BTreeMap::new(),
    )
}

fn simulate_impostor(s: &ImpostorScenario, shared: &Shared) -> SimResult {
    let mut sim = builder(s.seed, s.net_latency_max, Duration::from_secs(60));
    let projects: Vec<(String, String)> = s
        .projects
        .iter()
        .map(|p| (p.clone(), format!("http://sled-{p}:9000")))
        .collect();
    add_gateway(
        &mut sim,
        server_options(s.seed, &projects, Config::default()),
    );
    for (i, p) in s.projects.iter().enumerate() {
        let mut opts = uplink_options(s.seed ^ (i as u64 + 1), &s.real_name(i), Duration::ZERO);
        opts.identity = Some(sled_key(s.seed, p));
        opts.backoff_max = s.backoff_max;
        let sled = story_sled(p, &s.real_name(i), s.seed ^ (i as u64 + 1));
        sim.host(format!("sled-{p}"), sled_software(sled, opts));
    }
    let p = &s.projects[s.target];
    let mut opts = uplink_options(s.seed ^ 0x1395, &s.impostor_name(), Duration::ZERO);
    opts.identity = Some(impostor_key(s.seed, p));
    opts.backoff_max = s.backoff_max;
    let impostor = story_sled(p, &s.impostor_name(), s.seed ^ 0x1395);
    let actions = vec![(
        When::At(s.impostor_at),
        Action::Start(
            format!("impostor-{p}"),
            Box::new(sled_software(impostor, opts)),
        ),
    )];
    let scenario = s.clone();
    let client_shared = shared.clone();
    sim.client("client", async move {
        if let Err(v) = impostor_client(&scenario, &client_shared).await {
            client_shared.violation(v);
        }
        Ok(())
    });
    drive(sim, actions, &shared.mark)
}

/// The sled a `whoami` routed to `project` reached.
async fn whoami(c: &mut Client, project: &str) -> Result<String, String> {
    let s = c
        .structured("whoami", json!({ "project": project }))
        .await?;
    Ok(s["sled"].as_str().unwrap_or("?").to_owned())
}

/// `fleet_identity`'s row of `project`, and its summary.
async fn identity_of(c: &mut Client, project: &str) -> Result<(Value, Value), String> {
    let s = c.structured("fleet_identity", json!({})).await?;
    let row = s["projects"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["project"] == project).cloned())
        .ok_or_else(|| format!("fleet_identity has no row for {project}: {s}"))?;
    Ok((row, s["summary"].clone()))
}

async fn impostor_client(s: &ImpostorScenario, shared: &Shared) -> Result<(), String> {
    let p = s.projects[s.target].as_str();
    let all: BTreeSet<String> = s.projects.iter().cloned().collect();
    let mut c = Client::start(shared.trace.clone()).await?;
    c.await_live(&all, Duration::from_secs(5)).await?;
    let mut out = Vec::new();

    // Every sled pinned to its own key on first use.
    let check_others = |out: &mut Vec<String>, rows: &Value, when: &str| {
        for (i, q) in s.projects.iter().enumerate() {
            if i == s.target {
                continue;
            }
            let row = rows["projects"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["project"] == q.as_str()));
            let key = s.real_key(i);
            let ok = row.is_some_and(|r| {
                r["status"] == "verified"
                    && r["pinned"] == key.as_str()
                    && r["live"] == key.as_str()
                    && r["refused"].is_null()
            });
            if !ok {
                out.push(format!(
                    "{when}: {q} should be verified with its own key {key} and nothing refused: {row:?}"
                ));
            }
        }
    };
    let first = c.structured("fleet_identity", json!({})).await?;
    check_others(&mut out, &first, "before the impostor");
    let (row, summary) = identity_of(&mut c, p).await?;
    let real = s.real_key(s.target);
    if row["status"] != "verified" || row["pinned"] != real.as_str() || !row["refused"].is_null() {
        out.push(format!(
            "before the impostor, {p} should be verified and pinned to {real}: {row}"
        ));
    }
    if names(&summary["verified"]).len() != s.projects.len() {
        out.push(format!(
            "before the impostor, every project should be verified: {summary}"
        ));
    }

    // The impostor is refused, and keeps being refused; the real sled stays live and serves.
    tokio::time::sleep(s.impostor_at.saturating_sub(c.now())).await;
    let bound = s.impostor_at + Duration::from_secs(2);
    let refused_row = loop {
        let (row, _) = identity_of(&mut c, p).await?;
        if !row["refused"].is_null() {
            break row;
        }
        if c.now() > bound {
            out.push(format!(
                "the impostor (started at {:?}) was not shown refused by {bound:?}: {row}",
                s.impostor_at
            ));
            return Err(out.join("\n    "));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let impostor = s.impostor_key();
    let check_refused = |out: &mut Vec<String>, row: &Value, min_attempts: u64, when: &str| {
        let r = &row["refused"];
        if row["status"] != "verified"
            || row["pinned"] != real.as_str()
            || row["live"] != real.as_str()
            || r["key"] != impostor.as_str()
            || r["sled"] != s.impostor_name().as_str()
            || r["attempts"].as_u64().unwrap_or(0) < min_attempts
        {
            out.push(format!(
                "{when}: {p} should stay verified on {real} with the impostor's key {impostor} refused at least {min_attempts} time(s): {row}"
            ));
        }
    };
    check_refused(
        &mut out,
        &refused_row,
        1,
        "after the impostor's first attempt",
    );
    let sled = whoami(&mut c, p).await?;
    if sled != s.real_name(s.target) {
        out.push(format!(
            "a call to {p} reached {sled}, not the real sled {}",
            s.real_name(s.target)
        ));
    }
    tokio::time::sleep(s.refused_retry() * 2 + Duration::from_millis(300)).await;
    let (row, summary) = identity_of(&mut c, p).await?;
    check_refused(&mut out, &row, 2, "after the impostor's retries");
    if names(&summary["refused"]) != [p.to_owned()] {
        out.push(format!("summary.refused should be [{p}]: {summary}"));
    }
    let sled = whoami(&mut c, p).await?;
    if sled != s.real_name(s.target) {
        out.push(format!(
            "after the impostor's retries, a call to {p} reached {sled}, not the real sled"
        ));
    }
    if c.live().await? != all {
        out.push("a live project went away while the impostor was refused".to_owned());
    }

    // The operator re-pins: the real sled is closed, the impostor accepted at its next retry.
    let repin = c
        .structured(
            "fleet_identity",
            json!({ "action": "repin", "project": p, "key": impostor.as_str() }),
        )
        .await?;
    if repin["pinned"] != impostor.as_str()
        || repin["previous"] != real.as_str()
        || repin["closed_live_uplink"] != true
        || repin["sled"] != s.impostor_name().as_str()
    {
        out.push(format!(
            "the re-pin should pin {impostor} (was {real}) and close the live uplink: {repin}"
        ));
    }
    let repinned_at = c.now();
    let bound = repinned_at + s.refused_retry() + Duration::from_secs(1);
    loop {
        let sled = c
            .call("whoami", json!({ "project": p }))
            .await
            .ok()
            .and_then(|a| structured(&a).ok())
            .and_then(|s| s["sled"].as_str().map(str::to_owned));
        if sled.as_deref() == Some(s.impostor_name().as_str()) {
            break;
        }
        if sled.as_deref() == Some(s.real_name(s.target).as_str())
            && c.now() > repinned_at + s.net_latency_max * 4 + Duration::from_millis(50)
        {
            out.push(format!(
                "at {:?}, after the re-pin at {repinned_at:?}, a call to {p} still reached the sled of the old key",
                c.now()
            ));
        }
        if c.now() > bound {
            out.push(format!(
                "the re-pinned sled was not serving {p} by {bound:?} (re-pinned at {repinned_at:?}; it retries every {:?})",
                s.refused_retry()
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The real sled retries in turn and is now the refused one.
    tokio::time::sleep(s.refused_retry() + Duration::from_millis(500)).await;
    let after = c.structured("fleet_identity", json!({})).await?;
    let row = after["projects"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["project"] == p).cloned())
        .unwrap_or(Value::Null);
    if row["status"] != "verified"
        || row["pinned"] != impostor.as_str()
        || row["live"] != impostor.as_str()
        || row["refused"]["key"] != real.as_str()
        || row["refused"]["sled"] != s.real_name(s.target).as_str()
    {
        out.push(format!(
            "after the re-pin, {p} should be verified on {impostor} with the old key {real} refused: {row}"
        ));
    }
    check_others(&mut out, &after, "after the re-pin");
    if c.live().await? != all {
        out.push("after the re-pin, every project should be live".to_owned());
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(out.join("\n    "))
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Stalled relays in gateway_health.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayRole {
    /// Relays a `sync` every interval.
    Normal,
    /// Serves calls and pongs, relays nothing.
    Stalled,
    /// Relays normally, then crashes at the scenario's `crash_at`.
    Crashed,
    /// Never starts; its url names a host that does not exist, so its probe fails.
    NeverStarted,
}

#[derive(Clone)]
pub struct RelayScenario {
    pub seed: u64,
    pub projects: Vec<String>,
    pub roles: Vec<RelayRole>,
    pub relay_interval: Duration,
    pub stale_after: Duration,
    pub crash_at: Duration,
    pub net_latency_max: Duration,
}

impl fmt::Debug for RelayScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "relay seed {}: relay every {:?}, stale after {:?}, crash at {:?}, net ≤ {:?}:",
            self.seed, self.relay_interval, self.stale_after, self.crash_at, self.net_latency_max
        )?;
        for (p, r) in self.projects.iter().zip(&self.roles) {
            write!(f, " {p}={r:?}")?;
        }
        Ok(())
    }
}

/// When the first `gateway_health` is read: every sled connected, none stale yet.
const FIRST_LOOK: Duration = Duration::from_secs(2);

impl RelayScenario {
    pub fn draw(seed: u64) -> RelayScenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x2e1a_7000_0000_0003);
        let n = rng.random_range(3..=8);
        let mut roles: Vec<RelayRole> = (0..n)
            .map(|_| match rng.random_range(0..10) {
                0..=4 => RelayRole::Normal,
                _ => RelayRole::Stalled,
            })
            .collect();
        // At least one stalled relay and one normal one; at most one crash and one never
        // started.
        let stalled = rng.random_range(0..n);
        roles[stalled] = RelayRole::Stalled;
        let normal = (stalled + 1 + rng.random_range(0..n - 1)) % n;
        roles[normal] = RelayRole::Normal;
        let free: Vec<usize> = (0..n).filter(|i| *i != stalled && *i != normal).collect();
        let mut free = free.into_iter();
        if rng.random_bool(0.6) {
            if let Some(i) = free.next() {
                roles[i] = RelayRole::Crashed;
            }
        }
        if rng.random_bool(0.4) {
            if let Some(i) = free.next() {
                roles[i] = RelayRole::NeverStarted;
            }
        }
        let stale_after = Duration::from_millis(rng.random_range(3_000..=5_000));
        RelayScenario {
            seed,
            projects: sled_sim::demo_project_names(n),
            roles,
            relay_interval: Duration::from_millis(rng.random_range(500..=1_000)),
            stale_after,
            crash_at: stale_after + Duration::from_millis(rng.random_range(500..=2_000)),
            net_latency_max: Duration::from_millis(rng.random_range(1..=30)),
        }
    }

    /// When the second `gateway_health` is read: past the threshold and the crash.
    pub fn second_look(&self) -> Duration {
        self.crash_at + Duration::from_secs(2)
    }

    fn with(&self, role: RelayRole) -> Vec<String> {
        self.projects
            .iter()
            .zip(&self.roles)
            .filter(|(_, r)| **r == role)
            .map(|(p, _)| p.clone())
            .collect()
    }
}

pub fn run_relay(s: &RelayScenario) -> FleetReport {
    super::init_logging();
    let started = std::time::Instant::now();
    let shared = Shared::default();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| simulate_relay(s, &shared)));
    let mut coverage = BTreeMap::new();
    for r in &s.roles {
        *coverage.entry(format!("{r:?}")).or_default() += 1;
    }
    finish(
        s.seed,
        format!("{s:?}"),
        started,
        outcome,
        &shared.violations,
        &shared.trace,
        coverage,
    )
}

fn simulate_relay(s: &RelayScenario, shared: &Shared) -> SimResult {
    let mut sim = builder(s.seed, s.net_latency_max, Duration::from_secs(40));
    let projects: Vec<(String, String)> = s
        .projects
        .iter()
        .zip(&s.roles)
        .map(|(p, r)| {
            let host = match r {
                RelayRole::NeverStarted => format!("nowhere-{p}"),
                _ => format!("sled-{p}"),
            };
            (p.clone(), format!("http://{host}:9000"))
        })
        .collect();
    let core = Config {
        relay_stale_after: s.stale_after,
        probe_interval: Duration::from_millis(500),
        probe_timeout: Duration::from_millis(500),
        ..Config::default()
    };
    add_gateway(&mut sim, server_options(s.seed, &projects, core));
    let mut actions = Vec::new();
    for (i, (p, role)) in s.projects.iter().zip(&s.roles).enumerate() {
        if *role == RelayRole::NeverStarted {
            continue;
        }
        let name = format!("{p}-sled");
        let mut opts = uplink_options(s.seed ^ (i as u64 + 1), &name, Duration::ZERO);
        opts.identity = Some(sled_key(s.seed, p));
        opts.relay_interval = s.relay_interval;
        opts.stall_relay = *role == RelayRole::Stalled;
        let sled = story_sled(p, &name, s.seed ^ (i as u64 + 1));
        sim.host(format!("sled-{p}"), sled_software(sled, opts));
        if *role == RelayRole::Crashed {
            actions.push((When::At(s.crash_at), Action::Crash(format!("sled-{p}"))));
        }
    }
    let scenario = s.clone();
    let client_shared = shared.clone();
    sim.client("client", async move {
        if let Err(v) = relay_client(&scenario, &client_shared).await {
            client_shared.violation(v);
        }
        Ok(())
    });
    drive(sim, actions, &shared.mark)
}

async fn relay_client(s: &RelayScenario, shared: &Shared) -> Result<(), String> {
    let mut c = Client::start(shared.trace.clone()).await?;
    let mut out = Vec::new();
    let running: BTreeSet<String> = s
        .projects
        .iter()
        .zip(&s.roles)
        .filter(|(_, r)| **r != RelayRole::NeverStarted)
        .map(|(p, _)| p.clone())
        .collect();
    c.await_live(&running, Duration::from_millis(1_500)).await?;

    // Before the threshold: every running sled is up, stalled or not; a stalled sled serves.
    tokio::time::sleep(FIRST_LOOK.saturating_sub(c.now())).await;
    let h = c.structured("gateway_health", json!({})).await?;
    let never = s.with(RelayRole::NeverStarted);
    let want = json!({
        "up": s.projects.iter().filter(|p| running.contains(*p)).collect::<Vec<_>>(),
        "down": never,
        "stale": [],
        "unknown": [],
    });
    if h["summary"] != want {
        out.push(format!(
            "at {:?} (threshold {:?}), the summary should be {want}; it is {}",
            FIRST_LOOK, s.stale_after, h["summary"]
        ));
    }
    for p in s.with(RelayRole::Stalled) {
        let sled = whoami(&mut c, &p).await?;
        if sled != format!("{p}-sled") {
            out.push(format!(
                "a call to {p}, whose relay is stalled, reached {sled}"
            ));
        }
    }

    // Past the threshold and the crash: stale names exactly the stalled relays.
    tokio::time::sleep(s.second_look().saturating_sub(c.now())).await;
    let h = c.structured("gateway_health", json!({})).await?;
    let mut down = s.with(RelayRole::Crashed);
    down.extend(never.iter().cloned());
    down.sort_by_key(|p| s.projects.iter().position(|q| q == p));
    let want = json!({
        "up": s.with(RelayRole::Normal),
        "down": down,
        "stale": s.with(RelayRole::Stalled),
        "unknown": [],
    });
    if h["summary"] != want {
        out.push(format!(
            "at {:?} (threshold {:?}, crash at {:?}), the summary should be {want}; it is {}",
            s.second_look(),
            s.stale_after,
            s.crash_at,
            h["summary"]
        ));
    }
    let rows = h["projects"].as_array().cloned().unwrap_or_default();
    for (p, role) in s.projects.iter().zip(&s.roles) {
        let Some(row) = rows.iter().find(|r| r["project"] == p.as_str()) else {
            out.push(format!("gateway_health has no row for {p}"));
            continue;
        };
        let reasons = names(&row["reasons"]);
        let relay = &row["relay"];
        let ok = match role {
            RelayRole::Normal => {
                row["via"] == "uplink"
                    && reasons.is_empty()
                    && relay["status"] == "fresh"
                    && relay["last_kind"] == "sync"
                    && relay["events"].as_u64().unwrap_or(0) >= 1
                    && relay["last_event_ms_ago"]
                        .as_u64()
                        .is_some_and(|ms| ms <= millis(s.relay_interval + s.net_latency_max) + 20)
            }
            RelayRole::Stalled => {
                // Stale for its relay alone: its heartbeats are fine.
                row["via"] == "uplink"
                    && row["uplink"] == true
                    && relay["status"] == "stale"
                    && relay["events"] == 0
                    && reasons.len() == 1
                    && reasons[0].starts_with("relay:")
            }
            RelayRole::Crashed => row["uplink"] == false,
            RelayRole::NeverStarted => {
                row["via"] == "http" && row["probe"]["ok"] == false && relay["status"] == "none"
            }
        };
        if !ok {
            out.push(format!("{p} ({role:?}): unexpected row {row}"));
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(out.join("\n    "))
    }
}
