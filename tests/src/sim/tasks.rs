//! Tasks (issue 27) under turmoil: sessions of two principals make, poll, list, wait on and
//! cancel `run_tests` tasks across projects whose sleds name their tasks `t1, t2, …` (so the
//! ids collide across projects), in both eras, under sled power losses, partitions and latency
//! spikes (the tests are in `tests/tests/tasks_sim.rs`).
//!
//! One seed is one run: the real gateway (`gateway_server::serve`) on host `gateway`, one real
//! sled uplink per project (2–4 projects) on hosts `sled-<project>`, serving the story sled
//! through [`TaskSled`] (which records which `run_tests` suite made which of its task ids: the
//! ground truth), and 3–6 agents on one or two client hosts. The registry has two client tokens,
//! `alice` and `bob`, each with write rights everywhere; each agent uses one of them and speaks
//! one era:
//!
//! - **2025-11-25** (a session; a GET stream open for its status notifications and late
//!   progress): `tools/call run_tests` with `params.task` (some asking for progress under the
//!   tokens 1, 2, 3, the same in every session), `tasks/get`, `tasks/result`, `tasks/cancel`,
//!   and `tasks/list` following `nextCursor` to the end (the sleds' pages hold 2 tasks, and the
//!   gateway walks one project a page);
//! - **2026-07-28** (stateless; every request declares `io.modelcontextprotocol/tasks` in
//!   `_meta["io.modelcontextprotocol/clientCapabilities"].extensions`, and `tasks/*` send
//!   `Mcp-Name` = the task id): the call becomes a task, `tasks/get` (the result inlined once
//!   terminal), `tasks/cancel`, and `subscriptions/listen` for 2.5 s with `taskIds` (a few of
//!   its own, another owner's, a raw guess), on a connection of its own. A stateless caller's tasks are its identity's: two stateless
//!   agents of one principal share them (the gateway seals a task to the identity and the
//!   session, and stateless requests have none).
//!
//! Every `run_tests` names a suite unique in the run (`a<agent>n<n>`), which the sled puts in
//! its result with its own name (the project's). Every agent also uses ids that are not its
//! owner's: ids other owners received (a "leak", as a log line would), the raw ids a sled
//! gives (`t1`…`t8`, guessed), and the sled's own id inside an id it received (which the id
//! carries in clear). After its steps each agent looks at each of its tasks once more.
//!
//! The oracle, over what the agents saw and the sleds' ground truth:
//!
//! - (a) no owner sees, gets or cancels another's task: every id in a `tasks/list` page, in a
//!   status notification, in a `subscriptions/listen` acknowledgement and in a
//!   `notifications/tasks`, names (decoded: project and sled id) a task its owner made; every
//!   progress notification names a suite of the session's own; every request with an id that
//!   is not its owner's is answered -32602 with `data.kind` `unknown_task` (or, under faults,
//!   not at all), never with a task, a result or another error; a task nobody of its owner
//!   cancelled is never seen `cancelled`;
//! - (b) a result (`tasks/result`, a terminal 2026-07-28 `tasks/get` or `notifications/tasks`,
//!   a call the sled ran plain) is the one its own sled made: `structuredContent` names the project the task was
//!   made on, its suite, and the counts that sled gives that suite
//!   (`sled_sim::mcp::test_outcome`); `tasks/get`, `tasks/cancel` answer with the id asked
//!   about, and `tasks/result`'s related-task `_meta` names it, not the sled's;
//! - (c) a task whose `tasks/cancel` was acknowledged (`cancelled`; 2026-07-28: acknowledged at
//!   all) is never seen `completed` afterwards, nor its result given;
//! - and the owner's own ids are never refused as `unknown_task`; a completed listing (no
//!   fault in the seed) shows every task the session made before it began; without faults,
//!   every request is answered.
//!
//! Faults drawn from the seed (FaultMode as the main simulation's): a sled's power loss and
//! restart (its task table survives, like a container's volume, but the work it was doing
//! stops: those tasks fail), partitions (one-way too) between the gateway and a sled or a
//! client host, a latency spike, and the gateway's power loss and restart: its sessions and
//! task records are gone, its task key is not (as a single gateway's from `gateway.secret`),
//! and its RNG seed is another (a real one seeds from the OS: with the same seed it gave a new
//! session an old session's id, and two sessions shared their tasks). A session-era agent
//! answered 404 begins another session, a new owner: its old session's ids are now another's
//! and must be refused; a stateless agent's ids go on opening. Under faults a request may go unanswered, and an own task's
//! request may meet a sled error; never a wrong or foreign answer.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use futures_util::future::BoxFuture;
use gateway_core::{Config, PlantedBug, Registry};
use gateway_server::ServerOptions;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use sled_sim::mcp::{test_outcome, SharedSled, Sled, SledConfig, TaskIds, RUN_TESTS_TOOL};
use sled_sim::model::Project;
use sled_sim::uplink::{Backend, CallContext, Handler, UplinkOptions};
use sled_sim::{ClientError, McpClient};

use super::scenario::{Dir, FaultMode};
use super::{TurmoilConnect, TurmoilListener, GATEWAY_PORT};

pub type TasksReport = super::runner::SweepReport;

const MCP_URL: &str = "http://gateway:80/mcp";
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(1500);
/// When the agents begin: every sled has connected and listed its tools by then.
const START: Duration = Duration::from_millis(1500);
/// The TTL the agents ask for: longer than any run, so no task expires in one.
const TASK_TTL_MS: u64 = 600_000;
const STATELESS_VERSION: &str = "2026-07-28";
const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
const PRINCIPALS: [&str; 2] = ["alice", "bob"];

fn token_of(principal: usize) -> String {
    format!("sim-client-token-{}", PRINCIPALS[principal])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    Session,
    Stateless,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    pub principal: usize,
    pub era: Era,
    pub steps: usize,
    pub think_max: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskFault {
    /// Partition, crash; at the end, repair and restart.
    SledPowerLoss {
        sled: usize,
    },
    SledPartition {
        sled: usize,
        dir: Dir,
    },
    ClientPartition {
        client: usize,
        dir: Dir,
    },
    LatencySpike {
        max: Duration,
    },
    /// The gateway loses power (every link cut first, so nobody hears its sockets close) and
    /// restarts: sessions and task records are gone; the ids it gave out still open (its task
    /// key comes from the same seed, as a single gateway's from its `gateway.secret`).
    GatewayPowerLoss,
}

#[derive(Clone, PartialEq, Eq)]
pub struct TaskScenario {
    pub seed: u64,
    pub projects: Vec<String>,
    pub agents: Vec<AgentSpec>,
    pub client_hosts: usize,
    pub net_latency_max: Duration,
    /// How long a `run_tests` takes at the sleds, in milliseconds (drawn per call within).
    pub run_tests_ms: (u64, u64),
    pub faults: Vec<(Duration, Duration, TaskFault)>,
    pub planted: Option<PlantedBug>,
}

impl fmt::Debug for TaskScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "tasks seed {}: projects {:?}, {} client host(s), net ≤ {:?}, run_tests {:?} ms, planted {:?}",
            self.seed,
            self.projects,
            self.client_hosts,
            self.net_latency_max,
            self.run_tests_ms,
            self.planted
        )?;
        for (i, a) in self.agents.iter().enumerate() {
            writeln!(
                f,
                "  agent {i}: {} {:?} ({}), {} steps, think ≤ {:?}, on client-{}",
                PRINCIPALS[a.principal],
                a.era,
                owner_key(self, i, 0),
                a.steps,
                a.think_max,
                i % self.client_hosts
            )?;
        }
        for (at, until, fault) in &self.faults {
            writeln!(f, "  {at:?}..{until:?}: {fault:?}")?;
        }
        Ok(())
    }
}

/// Who owns agent `i`'s tasks: its `k`th session (2025-11-25; a gateway that lost its
/// sessions makes the agent begin another), else its principal (2026-07-28).
fn owner_key(s: &TaskScenario, i: usize, k: usize) -> String {
    let a = &s.agents[i];
    match a.era {
        Era::Session => format!("session {k} of agent {i}"),
        Era::Stateless => format!("{} stateless", PRINCIPALS[a.principal]),
    }
}

impl TaskScenario {
    pub fn draw(seed: u64, faults: FaultMode, planted: Option<PlantedBug>) -> TaskScenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7a5c_5eed_0000_0027);
        let projects = sled_sim::demo_project_names(rng.random_range(2..=4));
        let n = rng.random_range(3..=6);
        let mut agents: Vec<AgentSpec> = (0..n)
            .map(|i| AgentSpec {
                principal: i % 2,
                era: if rng.random_bool(0.4) {
                    Era::Stateless
                } else {
                    Era::Session
                },
                steps: rng.random_range(6..=18),
                think_max: Duration::from_millis(rng.random_range(0..=400)),
            })
            .collect();
        // Each era at least once in most seeds: the first agent speaks the session era.
        agents[0].era = Era::Session;
        let client_hosts = if n > 3 && rng.random_bool(0.5) { 2 } else { 1 };
        let net_latency_max = Duration::from_millis(rng.random_range(1..=40));
        let lo = rng.random_range(100..=800);
        let run_tests_ms = (lo, lo + rng.random_range(0..=2500));
        let count = match faults {
            FaultMode::Never => 0,
            FaultMode::Drawn if rng.random_bool(0.35) => 0,
            FaultMode::Drawn | FaultMode::Always => rng.random_range(1..=3),
        };
        let mut free_sleds: Vec<usize> = (0..projects.len()).collect();
        let mut free_clients: Vec<usize> = (0..client_hosts).collect();
        let mut spiked = false;
        let mut gateway_lost = false;
        let mut list = Vec::new();
        while list.len() < count {
            let at = START + Duration::from_millis(rng.random_range(0..=6_000));
            let until = at + Duration::from_millis(rng.random_range(300..=3_000));
            let dir = match rng.random_range(0..3) {
                0 => Dir::Both,
                1 => Dir::ToGateway,
                _ => Dir::FromGateway,
            };
            let fault = match rng.random_range(0..6) {
                5 if !gateway_lost => {
                    gateway_lost = true;
                    TaskFault::GatewayPowerLoss
                }
                0 if !free_clients.is_empty() => {
                    let client = free_clients.swap_remove(rng.random_range(0..free_clients.len()));
                    TaskFault::ClientPartition { client, dir }
                }
                1 if !spiked => {
                    spiked = true;
                    TaskFault::LatencySpike {
                        max: Duration::from_millis(rng.random_range(100..=1_000)),
                    }
                }
                k if !free_sleds.is_empty() => {
                    let sled = free_sleds.swap_remove(rng.random_range(0..free_sleds.len()));
                    if k % 2 == 0 {
                        TaskFault::SledPowerLoss { sled }
                    } else {
                        TaskFault::SledPartition { sled, dir }
                    }
                }
                _ if free_sleds.is_empty() && free_clients.is_empty() && spiked && gateway_lost => {
                    break
                }
                _ => continue,
            };
            list.push((at, until, fault));
        }
        list.sort_by_key(|(at, until, _)| (*at, *until));
        TaskScenario {
            seed,
            projects,
            agents,
            client_hosts,
            net_latency_max,
            run_tests_ms,
            faults: list,
            planted,
        }
    }

    fn sled_host(&self, i: usize) -> String {
        format!("sled-{}", self.projects[i])
    }
}

// ---------------------------------------------------------------------------------------------
// The sleds.

/// What the run recorded.
#[derive(Debug, Default)]
struct Log {
    /// Every request an agent made, in the order they were answered.
    events: Mutex<Vec<Ev>>,
    /// Notifications the agents got: on their GET streams and on answer streams.
    notes: Mutex<Vec<Note>>,
    /// The ground truth: (project, sled's task id) → the suite of the call that made it.
    made: Mutex<BTreeMap<(String, String), String>>,
    /// The ids agents received, with their owners: what the others "leak".
    board: Mutex<Vec<(String, String)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The story sled (with `run_tests`), recording which suite made which task.
pub struct TaskSled {
    sled: SharedSled,
    project: String,
    log: Arc<Log>,
}

impl fmt::Debug for TaskSled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskSled({})", self.project)
    }
}

impl Handler for TaskSled {
    fn project_name(&self) -> &str {
        &self.project
    }

    fn handle(self: Arc<Self>, msg: Value, ctx: CallContext) -> BoxFuture<'static, Option<Value>> {
        let suite = (msg["method"] == "tools/call"
            && msg.pointer("/params/name") == Some(&json!(RUN_TESTS_TOOL))
            && msg.pointer("/params/task").is_some())
        .then(|| {
            msg.pointer("/params/arguments/suite")
                .and_then(Value::as_str)
                .unwrap_or("all")
                .to_owned()
        });
        if let Some(answer) = self.sled.handle_async(&msg, Some(&ctx)) {
            return Box::pin(async move {
                let r = answer.await;
                if let (Some(suite), Some(id)) = (
                    suite,
                    r.as_ref()
                        .and_then(|r| r.pointer("/result/task/taskId"))
                        .and_then(Value::as_str),
                ) {
                    lock(&self.log.made).insert((self.project.clone(), id.to_owned()), suite);
                }
                r
            });
        }
        let r = self.sled.handle(&msg);
        Box::pin(async move { r })
    }

    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(self.sled.subscribe_notices())
    }
}

// ---------------------------------------------------------------------------------------------
// The agents.

/// Whose id a request names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Whose {
    /// No id (a create, a listing).
    None,
    /// One of its owner's (its own, or a stateless sibling's).
    Own,
    /// An id another owner received.
    Foreign(String),
    /// A raw sled id: guessed, or read out of an id it received.
    Raw,
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Response(Value),
    Failed(String),
}

#[derive(Debug, Clone)]
struct Ev {
    agent: usize,
    /// Its owner when it was sent.
    owner: String,
    method: String,
    /// The task id the request names, if any.
    task: Option<String>,
    whose: Whose,
    /// For a create: the project and suite.
    made: Option<(String, String)>,
    params: Value,
    sent: Duration,
    received: Duration,
    outcome: Outcome,
}

impl Ev {
    fn line(&self) -> String {
        format!(
            "{:>6}..{:<6} ms agent {} {} {} {:?} -> {}",
            self.sent.as_millis(),
            self.received.as_millis(),
            self.agent,
            self.method,
            self.params,
            self.whose,
            match &self.outcome {
                Outcome::Response(v) => v.to_string(),
                Outcome::Failed(e) => format!("failed: {e}"),
            }
        )
    }
}

#[derive(Debug, Clone)]
struct Note {
    agent: usize,
    owner: String,
    at: Duration,
    /// Whether it came on the GET stream (else on a request's answer stream).
    stream: bool,
    msg: Value,
}

struct Agent {
    index: usize,
    spec: AgentSpec,
    owner: String,
    /// How many sessions it began before its current one.
    incarnation: usize,
    /// Its session is gone (a 404): it begins another before its next step.
    lost: bool,
    projects: Vec<String>,
    rng: ChaCha8Rng,
    mcp: Option<McpClient<TurmoilConnect>>,
    next_id: u64,
    made: usize,
    mine: Vec<String>,
    log: Arc<Log>,
    listener: Option<tokio::task::JoinHandle<()>>,
}

impl Agent {
    async fn connect(&mut self) -> bool {
        for _ in 0..40 {
            let attempt = async {
                let mut c = McpClient::connect(TurmoilConnect, MCP_URL)
                    .await
                    .map_err(|e| e.to_string())?;
                c.set_timeout(Some(CLIENT_TIMEOUT));
                c.set_bearer_token(Some(token_of(self.spec.principal)));
                if self.spec.era == Era::Session {
                    c.initialize_with(json!({}))
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(c)
            };
            match tokio::time::timeout(CLIENT_TIMEOUT, attempt).await {
                Ok(Ok(c)) => {
                    if self.spec.era == Era::Session {
                        self.listen(&c);
                    }
                    self.mcp = Some(c);
                    return true;
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        false
    }

    /// A session-era agent whose session the gateway lost begins another: a new owner, whose
    /// tasks are not its old session's (those ids stay on the board, now another's).
    async fn begin_again(&mut self) {
        self.lost = false;
        self.incarnation += 1;
        self.owner = format!("session {} of agent {}", self.incarnation, self.index);
        self.mine.clear();
        self.mcp = None;
        self.connect().await;
    }

    /// The session's GET stream, reopened whenever it ends, until the agent is done.
    fn listen(&mut self, c: &McpClient<TurmoilConnect>) {
        let session = c.session_id().map(str::to_owned);
        let version = c.protocol_version().map(str::to_owned);
        let token = token_of(self.spec.principal);
        let log = self.log.clone();
        let agent = self.index;
        let owner = self.owner.clone();
        if let Some(old) = self.listener.take() {
            old.abort();
        }
        self.listener = Some(tokio::spawn(async move {
            loop {
                let Ok(mut l) = McpClient::connect(TurmoilConnect, MCP_URL).await else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                l.set_session_id(session.clone());
                l.set_protocol_version(version.clone());
                l.set_bearer_token(Some(token.clone()));
                let mut on = |m: Value| {
                    lock(&log.notes).push(Note {
                        agent,
                        owner: owner.clone(),
                        at: now(),
                        stream: true,
                        msg: m,
                    });
                };
                let _ = l.listen(1 << 20, &mut on).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }

    async fn run(&mut self) {
        tokio::time::sleep(START + Duration::from_millis(30 * self.index as u64)).await;
        if !self.connect().await {
            return;
        }
        for _ in 0..self.spec.steps {
            let think = self
                .rng
                .random_range(0..=self.spec.think_max.as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(think)).await;
            if self.lost {
                self.begin_again().await;
            }
            self.step().await;
        }
        // Every task had time to end (or was cancelled): one more look at each.
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        let mine = self.mine.clone();
        for id in mine {
            match self.spec.era {
                Era::Session => self.on_task("tasks/result", &id, Whose::Own).await,
                Era::Stateless => self.on_task("tasks/get", &id, Whose::Own).await,
            }
        }
        if self.spec.era == Era::Session {
            self.list().await;
            // Late notifications come in before the stream closes.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if let Some(l) = self.listener.take() {
            l.abort();
        }
    }

    async fn step(&mut self) {
        let session = self.spec.era == Era::Session;
        let roll = self.rng.random_range(0..100);
        let own = self.pick_own();
        match roll {
            0..=29 => self.create().await,
            30..=44 if own.is_some() => {
                self.on_task("tasks/get", &own.expect("some"), Whose::Own)
                    .await
            }
            45..=54 if own.is_some() && session => {
                self.on_task("tasks/result", &own.expect("some"), Whose::Own)
                    .await
            }
            55..=64 if own.is_some() => {
                self.on_task("tasks/cancel", &own.expect("some"), Whose::Own)
                    .await
            }
            65..=74 if session => self.list().await,
            65..=74 => self.subscribe(),
            75..=87 => {
                // An id someone else received: another owner's, or (stateless) a sibling's.
                let board = lock(&self.log.board).clone();
                if board.is_empty() {
                    return self.create().await;
                }
                let (owner, id) = board[self.rng.random_range(0..board.len())].clone();
                let method = self.any_method();
                if owner == self.owner {
                    self.on_task(method, &id, Whose::Own).await;
                } else {
                    self.on_task(method, &id, Whose::Foreign(owner)).await;
                }
            }
            88..=99 => {
                // A sled's raw id: guessed, or read out of one of its own.
                let id = match own {
                    Some(id) if self.rng.random_bool(0.3) => match decode(&id) {
                        Some((_, sled_id)) => sled_id,
                        None => id,
                    },
                    _ => format!("t{}", self.rng.random_range(1..=8)),
                };
                let method = self.any_method();
                self.on_task(method, &id, Whose::Raw).await;
            }
            _ => self.create().await,
        }
    }

    fn any_method(&mut self) -> &'static str {
        match (self.spec.era, self.rng.random_range(0..3)) {
            (Era::Session, 0) => "tasks/result",
            (_, 1) => "tasks/cancel",
            _ => "tasks/get",
        }
    }

    fn pick_own(&mut self) -> Option<String> {
        if self.mine.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..self.mine.len());
        Some(self.mine[i].clone())
    }

    async fn create(&mut self) {
        let n = self.projects.len();
        let project = if self.rng.random_bool(0.4) {
            self.projects[0].clone()
        } else {
            self.projects[self.rng.random_range(0..n)].clone()
        };
        let suite = format!("a{}s{}n{}", self.index, self.incarnation, self.made);
        self.made += 1;
        let mut params = json!({
            "name": RUN_TESTS_TOOL,
            "arguments": {"project": project, "suite": suite},
        });
        if self.spec.era == Era::Session {
            params["task"] = json!({ "ttl": TASK_TTL_MS });
            if self.rng.random_bool(0.6) {
                params["_meta"] = json!({ "progressToken": 1 + self.made % 3 });
            }
        }
        let outcome = self
            .send(
                "tools/call",
                params.clone(),
                Some((project, suite)),
                None,
                Whose::None,
            )
            .await;
        if let Outcome::Response(v) = &outcome {
            let id = match self.spec.era {
                Era::Session => v.pointer("/result/task/taskId"),
                Era::Stateless => v.pointer("/result/taskId"),
            };
            if let Some(id) = id.and_then(Value::as_str) {
                self.mine.push(id.to_owned());
                lock(&self.log.board).push((self.owner.clone(), id.to_owned()));
            }
        }
    }

    /// 2026-07-28 `subscriptions/listen` for a few of its tasks' ids and another owner's, on a
    /// connection of its own, for 2.5 s while the agent goes on.
    fn subscribe(&mut self) {
        let mut ids: Vec<String> = self.mine.iter().rev().take(3).cloned().collect();
        let board = lock(&self.log.board).clone();
        let others: Vec<&(String, String)> =
            board.iter().filter(|(o, _)| *o != self.owner).collect();
        if !others.is_empty() {
            ids.push(others[self.rng.random_range(0..others.len())].1.clone());
        }
        ids.push(format!("t{}", self.rng.random_range(1..=8)));
        let id = self.next_id;
        self.next_id += 1;
        let (log, agent, token) = (self.log.clone(), self.index, token_of(self.spec.principal));
        let owner = self.owner.clone();
        tokio::spawn(async move {
            let Ok(mut c) = McpClient::connect(TurmoilConnect, MCP_URL).await else {
                return;
            };
            c.set_timeout(Some(Duration::from_millis(2_500)));
            c.set_bearer_token(Some(token));
            let params = json!({
                "notifications": { "taskIds": ids },
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": STATELESS_VERSION,
                    "io.modelcontextprotocol/clientCapabilities":
                        { "extensions": { TASKS_EXTENSION: {} } },
                },
            });
            let headers = [
                ("mcp-protocol-version", STATELESS_VERSION),
                ("mcp-method", "subscriptions/listen"),
            ];
            let mut notified = |m: &Value| {
                lock(&log.notes).push(Note {
                    agent,
                    owner: owner.clone(),
                    at: now(),
                    stream: true,
                    msg: m.clone(),
                });
            };
            let mut refuse = |r: &Value| {
                json!({"jsonrpc": "2.0", "id": r["id"],
                    "error": {"code": -32601, "message": "Method not found"}})
            };
            // The stream stays open: it ends at the client's deadline.
            let _ = c
                .request_streaming(
                    json!(id),
                    "subscriptions/listen",
                    params,
                    &headers,
                    &mut refuse,
                    &mut notified,
                )
                .await;
        });
    }

    async fn on_task(&mut self, method: &str, id: &str, whose: Whose) {
        let params = json!({ "taskId": id });
        self.send(method, params, None, Some(id.to_owned()), whose)
            .await;
    }

    /// `tasks/list`, following `nextCursor` to the end (at most 60 pages).
    async fn list(&mut self) {
        let mut cursor: Option<String> = None;
        for _ in 0..60 {
            let params = match &cursor {
                Some(c) => json!({ "cursor": c }),
                None => json!({}),
            };
            let outcome = self
                .send("tasks/list", params, None, None, Whose::None)
                .await;
            let Outcome::Response(v) = outcome else {
                return;
            };
            match v.pointer("/result/nextCursor").and_then(Value::as_str) {
                Some(c) => cursor = Some(c.to_owned()),
                None => return,
            }
        }
    }

    async fn send(
        &mut self,
        method: &str,
        mut params: Value,
        made: Option<(String, String)>,
        task: Option<String>,
        whose: Whose,
    ) -> Outcome {
        let id = self.next_id;
        self.next_id += 1;
        let mut headers: Vec<(&str, String)> = Vec::new();
        if self.spec.era == Era::Stateless {
            let meta = &mut params["_meta"];
            meta["io.modelcontextprotocol/protocolVersion"] = json!(STATELESS_VERSION);
            meta["io.modelcontextprotocol/clientCapabilities"] =
                json!({ "extensions": { TASKS_EXTENSION: {} } });
            headers.push(("mcp-protocol-version", STATELESS_VERSION.to_owned()));
            headers.push(("mcp-method", method.to_owned()));
            let name = match method {
                "tools/call" => params["name"].as_str(),
                _ => params["taskId"].as_str(),
            };
            if let Some(name) = name {
                headers.push(("mcp-name", name.to_owned()));
            }
            if let Some(p) = params["arguments"]["project"].as_str() {
                headers.push(("mcp-param-project", p.to_owned()));
            }
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let sent = now();
        let agent = self.index;
        let log = self.log.clone();
        let owner = self.owner.clone();
        let mut notified = |m: &Value| {
            lock(&log.notes).push(Note {
                agent,
                owner: owner.clone(),
                at: now(),
                stream: false,
                msg: m.clone(),
            });
        };
        let mut refuse = |r: &Value| {
            json!({"jsonrpc": "2.0", "id": r["id"],
                "error": {"code": -32601, "message": "Method not found"}})
        };
        let stateless = self.spec.era == Era::Stateless;
        let outcome = match self.mcp.as_mut() {
            None => Outcome::Failed("no client".to_owned()),
            Some(c) => match c
                .request_streaming(
                    json!(id),
                    method,
                    params.clone(),
                    &headers,
                    &mut refuse,
                    &mut notified,
                )
                .await
            {
                Ok((v, _)) => Outcome::Response(v),
                Err(ClientError::Http { status, body }) if stateless => {
                    match serde_json::from_str::<Value>(&body) {
                        Ok(v) if v.get("error").is_some() => Outcome::Response(v),
                        _ => Outcome::Failed(format!("HTTP {status}: {body}")),
                    }
                }
                Err(ClientError::Http { status: 404, body }) => {
                    // The gateway lost the session (it lost power): begin another.
                    self.lost = true;
                    Outcome::Failed(format!("HTTP 404: {body}"))
                }
                Err(e) => Outcome::Failed(e.to_string()),
            },
        };
        lock(&self.log.events).push(Ev {
            agent: self.index,
            owner: self.owner.clone(),
            method: method.to_owned(),
            task,
            whose,
            made,
            params,
            sent,
            received: now(),
            outcome: outcome.clone(),
        });
        outcome
    }
}

/// The project and the sled's id an id the gateway hands out carries in clear.
fn decode(id: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = id.split('.').collect();
    if parts.len() != 6 || parts[0] != "mt1" {
        return None;
    }
    let field = |s: &str| {
        URL_SAFE_NO_PAD
            .decode(s)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
    };
    Some((field(parts[3])?, field(parts[4])?))
}

// ---------------------------------------------------------------------------------------------
// The run.

fn projects_toml(s: &TaskScenario) -> String {
    let mut text = format!(
        "default = \"{}\"\ncall_timeout_ms = {}\nclient_tokens = [\n",
        s.projects[0],
        CALL_TIMEOUT.as_millis()
    );
    for (i, p) in PRINCIPALS.iter().enumerate() {
        text.push_str(&format!(
            "  {{ name = \"{p}\", token = \"{}\" }},\n",
            token_of(i)
        ));
    }
    text.push_str("]\n");
    for p in &s.projects {
        text.push_str(&format!(
            "\n[[project]]\nname = \"{p}\"\nurl = \"http://sled-{p}:9000\"\ntoken = \"{}\"\ntrust_read_only_hints = true\n",
            super::uplink_token(p).expose()
        ));
    }
    for p in PRINCIPALS {
        text.push_str(&format!(
            "\n[[access]]\ntoken = \"{p}\"\nprojects = [\"*\"]\nright = \"write\"\n"
        ));
    }
    text
}

/// The gateway's options in its `incarnation`th life: its RNG seed differs in each (a real
/// gateway seeds from the OS, so a restarted one gives out other session ids), its task key
/// does not (a single gateway's comes from its `gateway.secret`, which outlives it).
fn server_options(s: &TaskScenario, incarnation: u64) -> ServerOptions {
    let text = projects_toml(s);
    let registry = Registry::parse("projects.toml", &text)
        .unwrap_or_else(|e| panic!("a valid sim registry: {e}\n{text}"));
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&s.seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&incarnation.to_le_bytes());
    bytes[16] = 0x27;
    let mut opts = ServerOptions::new(registry, bytes);
    opts.prober = Arc::new(gateway_server::HttpProber(TurmoilConnect));
    opts.pin_file = None;
    opts.core = Config {
        heartbeat_interval: HEARTBEAT_INTERVAL,
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        hello_timeout: Duration::from_secs(2),
        refresh_timeout: CALL_TIMEOUT,
        planted: s.planted,
        task_key: Some(gateway_core::tasks::TaskKey::new(
            [0x27; 4],
            [s.seed.to_le_bytes(), [0x27; 8], [0x5e; 8], [0xc7; 8]]
                .concat()
                .try_into()
                .expect("32 bytes"),
        )),
        ..Config::default()
    };
    opts
}

fn task_sled(s: &TaskScenario, project: &str) -> SharedSled {
    let config = SledConfig {
        run_tests_ms: s.run_tests_ms,
        task_ids: TaskIds::Counter,
        task_page_size: 2,
        ..SledConfig::default()
    };
    let sled = Sled::new(Project::new(project), project, s.seed).with_config(config);
    SharedSled::with_task_clock(sled, super::sim_task_clock)
}

pub fn run_tasks(s: &TaskScenario) -> TasksReport {
    super::init_logging();
    let started = std::time::Instant::now();
    let log = Arc::new(Log::default());
    let sleds: Vec<SharedSled> = s.projects.iter().map(|p| task_sled(s, p)).collect();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| simulate(s, &sleds, &log)));
    let mut violations = Vec::new();
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
    let events = std::mem::take(&mut *lock(&log.events));
    let notes = std::mem::take(&mut *lock(&log.notes));
    let made = std::mem::take(&mut *lock(&log.made));
    let mut coverage = BTreeMap::new();
    violations.extend(judge(s, &events, &notes, &made, &mut coverage));
    let mut trace: Vec<String> = events.iter().map(Ev::line).collect();
    for n in &notes {
        trace.push(format!(
            "{:>6} ms agent {} {} {}",
            n.at.as_millis(),
            n.agent,
            if n.stream { "stream" } else { "answer" },
            n.msg
        ));
    }
    for ((p, id), suite) in &made {
        trace.push(format!("made {p} {id} {suite}"));
    }
    let hash = super::trace_hash(&trace, sim_time);
    TasksReport {
        seed: s.seed,
        scenario: format!("{s:?}"),
        violations,
        trace_hash: hash,
        trace,
        sim_time,
        wall: started.elapsed(),
        coverage,
    }
}

type SimResult = Result<Duration, (Duration, String)>;
type FaultAction = Box<dyn FnOnce(&mut turmoil::Sim<'_>)>;

fn simulate(s: &TaskScenario, sleds: &[SharedSled], log: &Arc<Log>) -> SimResult {
    let mut sim = turmoil::Builder::new()
        .rng_seed(s.seed)
        .simulation_duration(Duration::from_secs(300))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(s.net_latency_max)
        .build();

    let scenario = s.clone();
    let incarnation = Arc::new(std::sync::atomic::AtomicU64::new(0));
    sim.host("gateway", move || {
        let n = incarnation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let opts = server_options(&scenario, n);
        async move {
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?;
            gateway_server::serve(TurmoilListener(listener), opts, std::future::pending()).await?;
            Ok(())
        }
    });

    for (i, sled) in sleds.iter().enumerate() {
        let handler = Arc::new(TaskSled {
            sled: sled.clone(),
            project: s.projects[i].clone(),
            log: log.clone(),
        });
        let opts = UplinkOptions {
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            seed: s.seed ^ (i as u64 + 1),
            sled_name: s.projects[i].clone(),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
            token: Some(super::uplink_token(&s.projects[i])),
            identity: None,
            relay_interval: Duration::ZERO,
            stall_relay: false,
            tls: Default::default(),
            drain: None,
        };
        sim.host(s.sled_host(i), move || {
            let backend = Backend::Handler(handler.clone());
            let opts = opts.clone();
            Box::pin(super::sled_host(backend, opts))
                as std::pin::Pin<Box<dyn std::future::Future<Output = turmoil::Result>>>
        });
    }

    for c in 0..s.client_hosts {
        let mine: Vec<usize> = (c..s.agents.len()).step_by(s.client_hosts).collect();
        let agents: Vec<Agent> = mine
            .iter()
            .map(|&i| Agent {
                index: i,
                spec: s.agents[i].clone(),
                owner: owner_key(s, i, 0),
                incarnation: 0,
                lost: false,
                projects: s.projects.clone(),
                rng: ChaCha8Rng::seed_from_u64(s.seed ^ (0x7a57_0000 + i as u64)),
                mcp: None,
                next_id: 1,
                made: 0,
                mine: Vec::new(),
                log: log.clone(),
                listener: None,
            })
            .collect();
        sim.client(format!("client-{c}"), async move {
            let mut running = Vec::new();
            for mut a in agents {
                running.push(tokio::spawn(async move { a.run().await }));
            }
            for r in running {
                r.await?;
            }
            Ok(())
        });
    }

    let mut actions: Vec<(Duration, u8, FaultAction)> = Vec::new();
    let partition = |a: String, b: String, dir: Dir, on: bool| -> FaultAction {
        Box::new(move |sim: &mut turmoil::Sim<'_>| match (dir, on) {
            (Dir::Both, true) => sim.partition(a.as_str(), b.as_str()),
            (Dir::Both, false) => sim.repair(a.as_str(), b.as_str()),
            (Dir::ToGateway, true) => sim.partition_oneway(b.as_str(), a.as_str()),
            (Dir::ToGateway, false) => sim.repair_oneway(b.as_str(), a.as_str()),
            (Dir::FromGateway, true) => sim.partition_oneway(a.as_str(), b.as_str()),
            (Dir::FromGateway, false) => sim.repair_oneway(a.as_str(), b.as_str()),
        })
    };
    let base = s.net_latency_max;
    for (at, until, fault) in &s.faults {
        match fault.clone() {
            TaskFault::SledPowerLoss { sled } => {
                let host = s.sled_host(sled);
                let h2 = host.clone();
                actions.push((
                    *at,
                    1,
                    Box::new(move |sim| {
                        sim.partition("gateway", host.as_str());
                        sim.crash(host);
                    }),
                ));
                actions.push((
                    *until,
                    0,
                    Box::new(move |sim| {
                        sim.repair("gateway", h2.as_str());
                        sim.bounce(h2);
                    }),
                ));
            }
            TaskFault::SledPartition { sled, dir } => {
                let host = s.sled_host(sled);
                actions.push((*at, 1, partition("gateway".into(), host.clone(), dir, true)));
                actions.push((*until, 0, partition("gateway".into(), host, dir, false)));
            }
            TaskFault::ClientPartition { client, dir } => {
                let host = format!("client-{client}");
                actions.push((*at, 1, partition("gateway".into(), host.clone(), dir, true)));
                actions.push((*until, 0, partition("gateway".into(), host, dir, false)));
            }
            TaskFault::GatewayPowerLoss => {
                let mut peers: Vec<String> =
                    (0..s.projects.len()).map(|i| s.sled_host(i)).collect();
                peers.extend((0..s.client_hosts).map(|c| format!("client-{c}")));
                let p2 = peers.clone();
                actions.push((
                    *at,
                    1,
                    Box::new(move |sim| {
                        for p in &peers {
                            sim.partition("gateway", p.as_str());
                        }
                        sim.crash("gateway");
                    }),
                ));
                actions.push((
                    *until,
                    0,
                    Box::new(move |sim| {
                        for p in &p2 {
                            sim.repair("gateway", p.as_str());
                        }
                        sim.bounce("gateway");
                    }),
                ));
            }
            TaskFault::LatencySpike { max } => {
                actions.push((
                    *at,
                    1,
                    Box::new(move |sim| sim.set_max_message_latency(max)),
                ));
                actions.push((
                    *until,
                    0,
                    Box::new(move |sim| sim.set_max_message_latency(base)),
                ));
            }
        }
    }
    actions.sort_by_key(|(at, order, _)| (*at, *order));
    let mut actions = actions.into_iter().peekable();
    loop {
        let t = sim.elapsed();
        while let Some((_, _, action)) = actions.next_if(|(at, _, _)| *at <= t) {
            action(&mut sim);
        }
        match sim.step() {
            Ok(true) => return Ok(sim.elapsed()),
            Ok(false) => {}
            Err(e) => return Err((sim.elapsed(), e.to_string())),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle.

/// The agent and its session a suite names (`a<agent>s<session>n<n>`).
fn agent_of_suite(suite: &str) -> Option<(usize, usize)> {
    let (agent, rest) = suite.strip_prefix('a')?.split_once('s')?;
    let (k, _) = rest.split_once('n')?;
    Some((agent.parse().ok()?, k.parse().ok()?))
}

fn judge(
    s: &TaskScenario,
    events: &[Ev],
    notes: &[Note],
    made: &BTreeMap<(String, String), String>,
    coverage: &mut BTreeMap<String, usize>,
) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    let mut count = |k: &str| *coverage.entry(k.to_owned()).or_default() += 1;
    let faulty = !s.faults.is_empty();
    // The owner of the task an id names, by the sleds' ground truth.
    let owner_of_id = |id: &str| -> Option<(String, String, String)> {
        let (project, sled_id) = decode(id)?;
        let suite = made.get(&(project.clone(), sled_id))?;
        let (agent, k) = agent_of_suite(suite)?;
        (agent < s.agents.len()).then(|| (owner_key(s, agent, k), project, suite.clone()))
    };
    // Acknowledged cancellations, by task (the ground truth's (project, sled id)): when.
    let mut cancelled_at: BTreeMap<(String, String), Duration> = BTreeMap::new();
    // Tasks whose owner sent a tasks/cancel.
    let mut cancel_sent: BTreeSet<(String, String)> = BTreeSet::new();
    for e in events {
        if e.method == "tasks/cancel" && e.whose == Whose::Own {
            if let Some(k) = e.task.as_deref().and_then(decode) {
                cancel_sent.insert(k);
            }
            let acked = match (&e.outcome, s.agents[e.agent].era) {
                (Outcome::Response(r), Era::Session) => r["result"]["status"] == "cancelled",
                (Outcome::Response(r), Era::Stateless) => r.get("result").is_some(),
                _ => false,
            };
            if let (true, Some(k)) = (acked, e.task.as_deref().and_then(decode)) {
                count("cancels acknowledged");
                let at = cancelled_at.entry(k).or_insert(e.received);
                *at = (*at).min(e.received);
            }
        }
    }
    // A task seen `status` by a request sent at `sent` (or a notification at `sent`).
    let seen = |v: &mut Vec<String>, what: &str, id: &str, status: &str, sent: Duration| {
        let Some(k) = decode(id) else { return };
        if status == "completed" {
            if let Some(at) = cancelled_at.get(&k) {
                if *at <= sent {
                    v.push(format!(
                        "(c) {what}: task {}/{} was seen completed at {sent:?} though its cancel was acknowledged at {at:?}",
                        k.0, k.1
                    ));
                }
            }
        }
        if status == "cancelled" && !cancel_sent.contains(&k) && made.contains_key(&k) {
            v.push(format!(
                "(a) {what}: task {}/{} was seen cancelled, but nobody of its owner cancelled it",
                k.0, k.1
            ));
        }
    };
    // The result of the task made on `project` with `suite`, as its own sled gives it.
    let check_result = |v: &mut Vec<String>, what: &str, r: &Value, project: &str, suite: &str| {
        if r["isError"] == true {
            return;
        }
        let sc = &r["structuredContent"];
        let (passed, failed) = test_outcome(s.seed, project, suite);
        let want = json!({"sled": project, "suite": suite, "passed": passed, "failed": failed});
        let got = json!({"sled": sc["sled"], "suite": sc["suite"], "passed": sc["passed"], "failed": sc["failed"]});
        if got != want {
            v.push(format!(
                "(b) {what}: the result is not its own sled's: want {want}, got {got}"
            ));
        }
    };
    // Listings completed: the agent, when it began, the ids it showed.
    let mut listed_ok: Vec<(usize, Duration, BTreeSet<String>)> = Vec::new();
    // Listings under way, by agent: when they began, the ids shown so far.
    let mut listing: BTreeMap<usize, (Duration, BTreeSet<String>)> = BTreeMap::new();
    for e in events {
        let era = s.agents[e.agent].era;
        let me = e.owner.clone();
        if era == Era::Session && !me.starts_with("session 0 ") {
            count("requests of a session begun again (gateway power loss)");
        }
        let what = format!(
            "agent {} ({me}) {} {} at {:?}",
            e.agent, e.method, e.params, e.sent
        );
        let r = match &e.outcome {
            Outcome::Failed(why) => {
                count("requests unanswered");
                if !faulty {
                    v.push(format!("{what}: no answer without any fault: {why}"));
                }
                if e.method == "tasks/list" {
                    listing.remove(&e.agent);
                }
                continue;
            }
            Outcome::Response(r) => r,
        };
        let error = r.get("error");
        let kind = error.and_then(|x| x["data"]["kind"].as_str()).unwrap_or("");
        match (&e.whose, e.method.as_str()) {
            (Whose::None, "tools/call") => {
                let (project, suite) = e.made.clone().unwrap_or_default();
                let task = match era {
                    Era::Session => r.pointer("/result/task"),
                    Era::Stateless => r.get("result").filter(|x| x["resultType"] == "task"),
                };
                match (task, error) {
                    (Some(t), _) => {
                        count(match era {
                            Era::Session => "tasks made, 2025-11-25",
                            Era::Stateless => "tasks made, 2026-07-28",
                        });
                        let id = t["taskId"].as_str().unwrap_or("");
                        match owner_of_id(id) {
                            Some((owner, p, sfx)) if owner == me && p == project && sfx == suite => {}
                            other => v.push(format!(
                                "(a) {what}: the id it got, {id}, names {other:?}, not the task it made"
                            )),
                        }
                    }
                    (None, None) => {
                        count("calls run plain");
                        check_result(&mut v, &what, &r["result"], &project, &suite);
                    }
                    (None, Some(_)) => {
                        count(&format!(
                            "creates refused: {} {kind}",
                            error.map_or(Value::Null, |x| x["code"].clone())
                        ));
                    }
                }
            }
            (Whose::None, "tasks/list") => {
                let (start, mut ids) = match listing.remove(&e.agent) {
                    Some(under_way) if e.params.get("cursor").is_some() => under_way,
                    _ => (e.sent, BTreeSet::new()),
                };
                if let Some(x) = error {
                    // A sled away mid-walk fails its page (faults only); a page is never refused
                    // otherwise.
                    count(&format!("list pages failed: {} {kind}", x["code"]));
                    if !faulty {
                        v.push(format!("{what}: tasks/list refused without any fault: {x}"));
                    }
                    continue;
                }
                count("list pages");
                for t in r["result"]["tasks"].as_array().into_iter().flatten() {
                    let id = t["taskId"].as_str().unwrap_or("");
                    count("tasks listed");
                    match owner_of_id(id) {
                        Some((owner, _, _)) if owner == me => {}
                        other => v.push(format!(
                            "(a) {what}: tasks/list showed {id}, a task of {other:?}, not one its owner made"
                        )),
                    }
                    if let Some(status) = t["status"].as_str() {
                        seen(&mut v, &what, id, status, e.sent);
                    }
                    ids.insert(id.to_owned());
                }
                if r["result"]["nextCursor"].is_string() {
                    listing.insert(e.agent, (start, ids));
                } else {
                    count("listings completed");
                    listed_ok.push((e.agent, start, ids));
                }
            }
            (Whose::Foreign(_) | Whose::Raw, _) => {
                let id = e.task.clone().unwrap_or_default();
                if error.is_some_and(|x| x["code"] == -32602) && kind == "unknown_task" {
                    count(match e.whose {
                        Whose::Raw => "raw ids refused unknown_task",
                        _ => "others' ids refused unknown_task",
                    });
                    continue;
                }
                match error {
                    Some(x) => v.push(format!(
                        "(a) {what}: an id it never received ({:?}) was answered {x}, not -32602 unknown_task",
                        e.whose
                    )),
                    None => {
                        let whose = owner_of_id(&id)
                            .map(|(o, p, _)| format!("{o}'s task on {p}"))
                            .unwrap_or_else(|| "a task it never received".to_owned());
                        v.push(format!(
                            "(a) {what}: an id it never received ({:?}) was answered with {whose}: {}",
                            e.whose, r["result"]
                        ));
                    }
                }
            }
            (Whose::Own, m) => {
                let id = e.task.clone().unwrap_or_default();
                let Some((owner, project, suite)) = owner_of_id(&id) else {
                    v.push(format!("{what}: its own id {id} names no task a sled made"));
                    continue;
                };
                if owner != me {
                    v.push(format!("{what}: its own id {id} is {owner}'s task"));
                    continue;
                }
                if let Some(x) = error {
                    if kind == "unknown_task" {
                        v.push(format!("{what}: its own id was refused as unknown: {x}"));
                    }
                    count(&format!("own-task errors: {m} {} {kind}", x["code"]));
                    continue;
                }
                let result = &r["result"];
                match (era, m) {
                    (Era::Session, "tasks/result") => {
                        count("results, 2025-11-25");
                        check_result(&mut v, &what, result, &project, &suite);
                        let related = &result["_meta"][RELATED_TASK]["taskId"];
                        if related != &json!(id) {
                            v.push(format!(
                                "(b) {what}: the related task in _meta is {related}, not the id asked about"
                            ));
                        }
                        if result["isError"] != true {
                            seen(&mut v, &what, &id, "completed", e.sent);
                        }
                    }
                    (_, "tasks/get") | (Era::Session, "tasks/cancel") => {
                        if result["taskId"] != json!(id) {
                            v.push(format!(
                                "(b) {what}: answered about {}, not the id asked about",
                                result["taskId"]
                            ));
                        }
                        let status = result["status"].as_str().unwrap_or("");
                        count(&format!("{m} seen {status}"));
                        seen(&mut v, &what, &id, status, e.sent);
                        if era == Era::Stateless && status == "completed" {
                            count("results inlined, 2026-07-28");
                            check_result(&mut v, &what, &result["result"], &project, &suite);
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    // Completeness: a listing of a seed without faults shows every task its session made
    // before it began.
    if !faulty {
        for (agent, start, ids) in &listed_ok {
            for e in events
                .iter()
                .filter(|e| e.agent == *agent && e.method == "tools/call" && e.received < *start)
            {
                if let Outcome::Response(r) = &e.outcome {
                    if let Some(id) = r.pointer("/result/task/taskId").and_then(Value::as_str) {
                        if !ids.contains(id) {
                            v.push(format!(
                                "agent {agent}: the listing begun at {start:?} left out its task {id} (made at {:?})",
                                e.received
                            ));
                        }
                    }
                }
            }
        }
    }
    // Notifications: status of its own tasks only; progress of its own calls only.
    for n in notes {
        let me = n.owner.clone();
        let what = format!(
            "agent {} ({me}) {} notification at {:?}",
            n.agent,
            if n.stream { "stream" } else { "answer-stream" },
            n.at
        );
        match n.msg["method"].as_str() {
            Some("notifications/tasks/status") => {
                count("status notifications");
                let id = n.msg["params"]["taskId"].as_str().unwrap_or("");
                match owner_of_id(id) {
                    Some((owner, _, _)) if owner == me => {}
                    other => v.push(format!(
                        "(a) {what}: a status notification of {id}, a task of {other:?}"
                    )),
                }
                if let Some(status) = n.msg["params"]["status"].as_str() {
                    seen(&mut v, &what, id, status, n.at);
                }
            }
            Some("notifications/subscriptions/acknowledged") => {
                count("subscriptions acknowledged");
                for id in n.msg["params"]["notifications"]["taskIds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let id = id.as_str().unwrap_or("");
                    match owner_of_id(id) {
                        Some((owner, _, _)) if owner == me => {}
                        other => v.push(format!(
                            "(a) {what}: subscriptions/listen acknowledged {id}, a task of {other:?}"
                        )),
                    }
                }
            }
            Some("notifications/tasks") => {
                count("task notifications, 2026-07-28");
                let id = n.msg["params"]["taskId"].as_str().unwrap_or("");
                match owner_of_id(id) {
                    Some((owner, project, suite)) if owner == me => {
                        if n.msg["params"]["result"].is_object() {
                            count("results notified, 2026-07-28");
                            check_result(
                                &mut v,
                                &what,
                                &n.msg["params"]["result"],
                                &project,
                                &suite,
                            );
                        }
                    }
                    other => v.push(format!(
                        "(a) {what}: notifications/tasks of {id}, a task of {other:?}"
                    )),
                }
                if let Some(status) = n.msg["params"]["status"].as_str() {
                    seen(&mut v, &what, id, status, n.at);
                }
            }
            Some("notifications/progress") => {
                count("progress notifications");
                let message = n.msg["params"]["message"].as_str().unwrap_or("");
                let suite = message
                    .split(": suite ")
                    .nth(1)
                    .and_then(|x| x.split(',').next())
                    .unwrap_or("");
                if agent_of_suite(suite).map(|(a, _)| a) != Some(n.agent) {
                    v.push(format!("(a) {what}: progress of another's call: {}", n.msg));
                }
            }
            _ => {}
        }
    }
    v
}
