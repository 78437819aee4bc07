//! Scripted MCP client sessions: a seeded workload per session, a runner that plays it against a
//! gateway over any [`Connect`] (real TCP, or a simulation's network), and the per-session
//! oracle that judges every response by what that session alone has seen.
//!
//! The same scripts drive the deterministic simulation (`tests/src/sim`) and a real gateway
//! (`sled-sim script --gateway URL`).
//!
//! # The workload
//!
//! [`session_plan`] draws one session's operations from its own RNG, seeded from the run seed
//! and the session index: `switch_project`, `tools/call` of `create_story`, `show` and `whoami`
//! with and without a per-call `project`, `tools/list` and `list_projects`, with think time in
//! between. JSON-RPC ids restart at 0 in every session ([`IdMode::Counting`]), and some sessions
//! send the same id on every request ([`IdMode::Fixed`]), as one widely used connector does.
//! Projects are drawn with a skew towards two "hot" projects so that sessions collide. Every
//! request carries a nonce unique in the run in `params._meta["sled-sim/nonce"]`, which the
//! sled echoes. [`session_plan_with_surface`] (the simulation's) adds `resources/read` and
//! `prompts/get story_brief` of the session's own stories (the project named in `_meta` or the
//! `project` argument, or left to the default) and calls of [`Tool::Summarize`], whose sled asks
//! the calling client for a sampling mid-call; about half those sessions declare `sampling` and
//! answer it with [`sampling_answer`].
//!
//! # The per-session oracle
//!
//! [`check_session`] replays a [`SessionHistory`] and reports every [`Violation`]: a response
//! that answers another request (id or nonce), a call served by a project the session's own
//! history does not allow (the explicit `project`; else the session's last acknowledged switch,
//! or after an ambiguous switch either candidate until a response settles it), an error shape
//! the gateway does not document, a story that reads back wrong (as a tool result, a resource
//! or a prompt), a sampling request on a call that did not make it, a sampled result without
//! this session's answer, a session without `sampling` that did not get -32601, a failed
//! liveness probe.
//! Client-side failures (no answer, connection lost) are *reported* as [`Outcome::Failed`] and
//! left to the caller to judge, since only the caller knows which faults it injected.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use tokio::time::{sleep, sleep_until, Instant};

use crate::client::{AnsweredRequest, ClientError, McpClient};
use crate::mcp::{NONCE_KEY, PROJECT_META_KEY};

/// Where a `resources/read` names its project (the gateway's `_meta` key).
pub const PROJECT_META: &str = "io.mcp-gateway/project";
use crate::net::Connect;

/// The project name the workload uses to check the unknown-project error.
pub const UNKNOWN_PROJECT: &str = "no-such-project";

/// How a session numbers its JSON-RPC requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdMode {
    /// 0, 1, 2, … (the `initialize` the client sends first is id 0 too).
    Counting,
    /// The same id on every request.
    Fixed(u64),
}

/// A project tool the workload calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tool {
    /// A write: a story named after the request's nonce.
    CreateStory,
    /// A read of a story this session created earlier (`pick` chooses which, modulo the count);
    /// of a story id that does not exist when it has created none.
    Show { pick: u32 },
    /// Which project and sled answered.
    Whoami,
    /// The simulation sled's tool that asks the client for a sampling mid-call
    /// ([`crate::sim_sled`]); its result holds the client's answer.
    Summarize,
}

impl Tool {
    /// The tool's name.
    pub fn name(&self) -> &'static str {
        match self {
            Tool::CreateStory => "create_story",
            Tool::Show { .. } => "show",
            Tool::Whoami => "whoami",
            Tool::Summarize => crate::sim_sled::SUMMARIZE_TOOL,
        }
    }
}

/// Where a call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// No `project` argument: the session's default.
    Default,
    /// `project` names this project.
    Project(String),
    /// For `show`, `resources/read` and `prompts/get`: the project the picked story was
    /// created in.
    StoryProject,
}

/// One operation of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Switch {
        project: String,
    },
    Call {
        tool: Tool,
        target: Target,
    },
    ToolsList,
    ListProjects,
    /// `resources/read` of a story this session created (`pick` as for `show`), naming the
    /// project in `_meta` ([`Target::StoryProject`]) or not ([`Target::Default`]).
    ReadResource {
        pick: u32,
        target: Target,
    },
    /// `prompts/get story_brief` of a story this session created, with a `project` argument
    /// ([`Target::StoryProject`]) or without ([`Target::Default`]).
    GetPrompt {
        pick: u32,
        target: Target,
    },
}

/// An operation and the think time before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub think: Duration,
    pub op: Op,
}

/// Everything one session will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPlan {
    /// The session's index in the run (part of every nonce).
    pub index: usize,
    pub ids: IdMode,
    /// Whether the session declares the `sampling` capability.
    pub sampling: bool,
    pub steps: Vec<Step>,
}

/// The shape of a workload; [`session_plan`] draws the details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// The run seed; each session's RNG derives from it and the session index.
    pub seed: u64,
    /// The registered projects the sessions use.
    pub projects: Vec<String>,
    /// How many operations each session performs (drawn per session in this range).
    pub ops: std::ops::RangeInclusive<usize>,
    /// The longest think time between two operations.
    pub think_max: Duration,
    /// Out of 100: how often a project is drawn from the two hot ones.
    pub hot_percent: u32,
    /// Out of 100: how many sessions send the same id on every request.
    pub fixed_id_percent: u32,
}

/// The RNG of session `index` in a run with `seed` (SplitMix64 of both, then ChaCha8).
pub fn session_rng(seed: u64, index: usize) -> ChaCha8Rng {
    let mut z = seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5c71_5e55_1057_u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ChaCha8Rng::seed_from_u64(z ^ (z >> 31))
}

/// Draws the plan of session `index`: tools only (what any story sled serves).
pub fn session_plan(w: &Workload, index: usize) -> SessionPlan {
    plan(w, index, false)
}

/// Draws the plan of session `index` with the rest of the surface too: `resources/read` and
/// `prompts/get` of its stories, and calls of [`Tool::Summarize`] (which needs the simulation's
/// sled, [`crate::sim_sled::SimSled`]); about half the sessions declare `sampling`.
pub fn session_plan_with_surface(w: &Workload, index: usize) -> SessionPlan {
    plan(w, index, true)
}

fn plan(w: &Workload, index: usize, surface: bool) -> SessionPlan {
    let mut rng = session_rng(w.seed, index);
    let ids = if rng.random_range(0..100) < w.fixed_id_percent {
        IdMode::Fixed(rng.random_range(0..3))
    } else {
        IdMode::Counting
    };
    let n = rng.random_range(w.ops.clone());
    // Each session has its own taste: some switch a lot, some never pass `project`.
    let switch_weight: u32 = rng.random_range(5..40);
    let explicit_percent: u32 = rng.random_range(0..80);
    let think_max = u64::try_from(w.think_max.as_millis()).unwrap_or(u64::MAX);
    let sampling = surface && rng.random_bool(0.5);
    let extra: u32 = if surface { 12 } else { 0 };
    let mut steps = Vec::with_capacity(n);
    for _ in 0..n {
        let think = Duration::from_millis(rng.random_range(0..=think_max));
        let roll = rng.random_range(0..100 + switch_weight + extra);
        let op = if roll < switch_weight {
            Op::Switch {
                project: pick_project(w, &mut rng),
            }
        } else {
            match roll - switch_weight {
                0..=4 => Op::ToolsList,
                5..=11 => Op::ListProjects,
                r @ 100..=108 => {
                    let pick = rng.random();
                    let target = if rng.random_range(0..100) < explicit_percent.max(60) {
                        Target::StoryProject
                    } else {
                        Target::Default
                    };
                    if r < 104 {
                        Op::ReadResource { pick, target }
                    } else {
                        Op::GetPrompt { pick, target }
                    }
                }
                r => {
                    let tool = match r {
                        12..=51 => Tool::CreateStory,
                        52..=84 => Tool::Show { pick: rng.random() },
                        100.. => Tool::Summarize,
                        _ => Tool::Whoami,
                    };
                    let explicit = rng.random_range(0..100) < explicit_percent;
                    let target = if rng.random_range(0..100) < 2 {
                        Target::Project(UNKNOWN_PROJECT.to_owned())
                    } else if !explicit {
                        Target::Default
                    } else if matches!(tool, Tool::Show { .. }) && rng.random_bool(0.7) {
                        Target::StoryProject
                    } else {
                        Target::Project(pick_project(w, &mut rng))
                    };
                    Op::Call { tool, target }
                }
            }
        };
        steps.push(Step { think, op });
    }
    SessionPlan {
        index,
        ids,
        sampling,
        steps,
    }
}

fn pick_project(w: &Workload, rng: &mut ChaCha8Rng) -> String {
    let n = w.projects.len();
    let i = if n > 2 && rng.random_range(0..100) < w.hot_percent {
        rng.random_range(0..2)
    } else {
        rng.random_range(0..n)
    };
    w.projects[i].clone()
}

/// How [`run_session`] runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The gateway's MCP endpoint, `http://host:port/mcp`.
    pub url: String,
    /// Times in the history are measured from here.
    pub epoch: Instant,
    /// The client's deadline for one request; above the gateway's call deadline.
    pub client_timeout: Duration,
    /// After its plan, the session waits until `epoch + probe_at` and makes one more call (a
    /// `whoami` to its default project) that must succeed: the liveness probe.
    pub probe_at: Option<Duration>,
    /// The client's deadline for the probe.
    pub probe_timeout: Duration,
    /// How many times `initialize` is tried before the session gives up.
    pub init_attempts: u32,
}

/// What came back for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A JSON-RPC response (result or error).
    Response(Value),
    /// No JSON-RPC response: the client's deadline passed, or the connection failed, or the
    /// HTTP status was not a success. The request may or may not have had its effect.
    Failed(String),
}

/// One request and what came back.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    pub op: Op,
    /// Whether this is the liveness probe.
    pub probe: bool,
    pub id: Value,
    pub nonce: String,
    /// The `params` sent.
    pub params: Value,
    /// Since [`RunOptions::epoch`].
    pub sent: Duration,
    pub received: Duration,
    pub outcome: Outcome,
    /// Requests the gateway sent the session on this request's answer stream (a sled's
    /// `sampling/createMessage`), each with how the session's answer fared.
    pub requests: Vec<AnsweredRequest>,
}

/// What one session did and saw.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionHistory {
    pub index: usize,
    pub ids: IdMode,
    /// Whether the session declared the `sampling` capability.
    pub sampling: bool,
    /// The session's first default project, as `list_projects` or the gateway's registry says.
    pub initial_default: Option<String>,
    /// When `initialize` succeeded, or `None` if it never did.
    pub initialized: Option<Duration>,
    /// Failed `initialize` attempts (each with when it ended and why).
    pub init_failures: Vec<(Duration, String)>,
    pub exchanges: Vec<Exchange>,
}

/// A story created by a response the session saw.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Created {
    project: String,
    id: String,
    name: String,
}

/// The name `create_story` gives the story of the request with this nonce.
pub fn story_name(nonce: &str) -> String {
    format!("story {nonce}")
}

/// The text a session answers a sampling request with, on the exchange with `nonce`.
pub fn sampling_answer(session: usize, nonce: &str) -> String {
    format!("session {session} samples for {nonce}")
}

/// The story URI of `id` in `project`.
pub fn story_uri(project: &str, id: &str) -> String {
    format!("story://{project}/{id}")
}

/// Runs one session: connect, `initialize` (retried), then every step of the plan, then the
/// probe. Never fails: whatever happens is in the history.
pub async fn run_session<C: Connect>(
    connector: C,
    plan: SessionPlan,
    initial_default: Option<String>,
    opts: RunOptions,
) -> SessionHistory {
    let since = |epoch: Instant| Instant::now().saturating_duration_since(epoch);
    let mut history = SessionHistory {
        index: plan.index,
        ids: plan.ids,
        sampling: plan.sampling,
        initial_default,
        initialized: None,
        init_failures: Vec::new(),
        exchanges: Vec::new(),
    };
    let mut client: Option<McpClient<C>> = None;
    for _ in 0..opts.init_attempts.max(1) {
        let attempt = async {
            let mut c = McpClient::connect(connector.clone(), &opts.url)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            c.set_timeout(Some(opts.client_timeout));
            let capabilities = if plan.sampling {
                json!({"sampling": {}})
            } else {
                json!({})
            };
            match c.initialize_with(capabilities).await {
                Ok(_) => Ok(c),
                Err(e) => Err(format!("initialize: {e}")),
            }
        };
        // Connecting has no deadline of its own (a lost SYN-ACK hangs it): give it the client's.
        let outcome = match tokio::time::timeout(opts.client_timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(format!("no session within {:?}", opts.client_timeout)),
        };
        match outcome {
            Ok(c) => {
                client = Some(c);
                history.initialized = Some(since(opts.epoch));
                break;
            }
            Err(e) => {
                history.init_failures.push((since(opts.epoch), e));
                sleep(Duration::from_millis(250)).await;
            }
        }
    }
    let Some(mut client) = client else {
        return history;
    };
    let mut created: Vec<Created> = Vec::new();
    let mut next_id = 1u64;
    let steps = plan.steps.into_iter().map(|s| (s, false));
    let probe = opts.probe_at.map(|_| {
        (
            Step {
                think: Duration::ZERO,
                op: Op::Call {
                    tool: Tool::Whoami,
                    target: Target::Default,
                },
            },
            true,
        )
    });
    for (n, (step, is_probe)) in steps.chain(probe).enumerate() {
        if is_probe {
            if let Some(at) = opts.probe_at {
                sleep_until(opts.epoch + at).await;
            }
            client.set_timeout(Some(opts.probe_timeout));
        } else {
            sleep(step.think).await;
        }
        let id = match plan.ids {
            IdMode::Counting => {
                next_id += 1;
                next_id - 1
            }
            IdMode::Fixed(id) => id,
        };
        let nonce = format!("s{}.{n}", plan.index);
        let meta = json!({ NONCE_KEY: nonce });
        let (method, params) = match &step.op {
            Op::Switch { project } => (
                "tools/call",
                json!({"name": "switch_project", "arguments": {"project": project}, "_meta": meta}),
            ),
            Op::ListProjects => (
                "tools/call",
                json!({"name": "list_projects", "arguments": {}, "_meta": meta}),
            ),
            Op::ToolsList => ("tools/list", json!({ "_meta": meta })),
            Op::ReadResource { pick, target } => {
                let story = picked(&created, *pick);
                let uri = match story {
                    Some(s) => story_uri(&s.project, &s.id),
                    None => story_uri(history.initial_default.as_deref().unwrap_or(""), "none-0"),
                };
                let mut meta = meta;
                if let (Target::StoryProject, Some(s)) = (target, story) {
                    meta[PROJECT_META] = json!(s.project);
                }
                ("resources/read", json!({"uri": uri, "_meta": meta}))
            }
            Op::GetPrompt { pick, target } => {
                let story = picked(&created, *pick);
                let mut arguments =
                    json!({ "story_id": story.map_or("none-0".to_owned(), |s| s.id.clone()) });
                if let (Target::StoryProject, Some(s)) = (target, story) {
                    arguments["project"] = json!(s.project);
                }
                (
                    "prompts/get",
                    json!({"name": "story_brief", "arguments": arguments, "_meta": meta}),
                )
            }
            Op::Call { tool, target } => {
                let mut arguments = match tool {
                    Tool::CreateStory => json!({
                        "name": story_name(&nonce),
                        "acceptance_criteria": ["the oracle finds it exactly once"],
                    }),
                    Tool::Show { pick } => {
                        let story = picked(&created, *pick);
                        json!({ "story_id": story.map_or("none-0".to_owned(), |s| s.id.clone()) })
                    }
                    Tool::Whoami | Tool::Summarize => json!({}),
                };
                let project = match target {
                    Target::Default => None,
                    Target::Project(p) => Some(p.clone()),
                    Target::StoryProject => match tool {
                        Tool::Show { pick } => picked(&created, *pick).map(|s| s.project.clone()),
                        _ => None,
                    },
                };
                if let Some(p) = project {
                    arguments["project"] = Value::String(p);
                }
                (
                    "tools/call",
                    json!({"name": tool.name(), "arguments": arguments, "_meta": meta}),
                )
            }
        };
        let sent = since(opts.epoch);
        let session = plan.index;
        let mut answer = |request: &Value| {
            let text = sampling_answer(session, &nonce);
            match request.get("method").and_then(Value::as_str) {
                Some("sampling/createMessage") => json!({"jsonrpc": "2.0", "id": request["id"],
                    "result": {"role": "assistant", "content": {"type": "text", "text": text},
                        "model": "sled-sim-client", "stopReason": "endTurn"}}),
                _ => json!({"jsonrpc": "2.0", "id": request["id"],
                    "error": {"code": -32601, "message": "Method not found"}}),
            }
        };
        let mut requests = Vec::new();
        let answered = client
            .request_answering(json!(id), method, params.clone(), &mut answer)
            .await;
        let outcome = match answered {
            Ok((v, seen)) => {
                requests = seen;
                Outcome::Response(v)
            }
            Err(e @ (ClientError::Timeout(_) | ClientError::Io(_) | ClientError::Http { .. })) => {
                Outcome::Failed(e.to_string())
            }
            Err(e) => Outcome::Failed(format!("unreadable response: {e}")),
        };
        let received = since(opts.epoch);
        if let (
            Op::Call {
                tool: Tool::CreateStory,
                ..
            },
            Outcome::Response(v),
        ) = (&step.op, &outcome)
        {
            let sc = &v["result"]["structuredContent"];
            if v["result"]["isError"] != json!(true) {
                if let (Some(project), Some(id)) =
                    (sc["project"].as_str(), sc["story"]["id"].as_str())
                {
                    created.push(Created {
                        project: project.to_owned(),
                        id: id.to_owned(),
                        name: story_name(&nonce),
                    });
                }
            }
        }
        history.exchanges.push(Exchange {
            op: step.op,
            probe: is_probe,
            id: json!(id),
            nonce,
            params,
            sent,
            received,
            outcome,
            requests,
        });
    }
    history
}

fn picked(created: &[Created], pick: u32) -> Option<&Created> {
    if created.is_empty() {
        None
    } else {
        created.get(pick as usize % created.len())
    }
}

/// Something a response should not have been.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub session: usize,
    /// The exchange's position in the session (`None`: about the session as a whole).
    pub exchange: Option<usize>,
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.exchange {
            Some(n) => write!(f, "session {} exchange {n}: {}", self.session, self.what),
            None => write!(f, "session {}: {}", self.session, self.what),
        }
    }
}

/// A story that a session's success response says was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoryClaim {
    pub session: usize,
    pub exchange: usize,
    /// The story's name (unique in the run).
    pub name: String,
    /// `Some((project, id))`: a success response said it was created there. `None`: the
    /// outcome is unknown (the story exists at most once, in one of `candidates`).
    pub created: Option<(String, String)>,
    /// The projects the call may have gone to.
    pub candidates: BTreeSet<String>,
    /// Whether the gateway said it never forwarded the call (`sled_not_connected`), so the story
    /// must not exist.
    pub never_sent: bool,
}

/// What [`check_session`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionReport {
    pub violations: Vec<Violation>,
    /// Every `create_story` this session sent, with what is known of its outcome.
    pub stories: Vec<StoryClaim>,
    /// Exchanges that ended with [`Outcome::Failed`], by position; the caller decides whether
    /// its faults explain them.
    pub failed: Vec<usize>,
}

/// The error kinds a forwarded `tools/call` may come back with, and their codes
/// (`gateway_core::RpcError`).
const CALL_ERRORS: [(&str, i64); 4] = [
    ("sled_not_connected", -32603),
    ("uplink_lost", -32603),
    ("timeout", -32001),
    ("bad_sled_response", -32603),
];

/// Judges every response of one session by what the session alone has seen; see the module
/// docs. `registered` lists the gateway's projects in registry order.
pub fn check_session(h: &SessionHistory, registered: &[String]) -> SessionReport {
    let mut report = SessionReport::default();
    let mut bad = |n: Option<usize>, what: String| {
        report_push(&mut report.violations, h.index, n, what);
    };
    if h.initialized.is_none() {
        bad(None, format!("never initialized: {:?}", h.init_failures));
    }
    // The projects this session's default may be now.
    let mut allowed: BTreeSet<String> = h.initial_default.iter().cloned().collect();
    let mut created: Vec<Created> = Vec::new();
    let mut stories = Vec::new();
    let mut failed = Vec::new();
    for (n, x) in h.exchanges.iter().enumerate() {
        let v = match &x.outcome {
            Outcome::Failed(why) => {
                failed.push(n);
                if x.probe {
                    bad(Some(n), format!("liveness probe failed: {why}"));
                }
                if let Op::Switch { project } = &x.op {
                    allowed.insert(project.clone());
                }
                if let Op::Call {
                    tool: Tool::CreateStory,
                    target,
                } = &x.op
                {
                    stories.push(StoryClaim {
                        session: h.index,
                        exchange: n,
                        name: story_name(&x.nonce),
                        created: None,
                        candidates: candidates(target, &allowed),
                        never_sent: false,
                    });
                }
                continue;
            }
            Outcome::Response(v) => v,
        };
        if v.get("jsonrpc") != Some(&json!("2.0")) {
            bad(Some(n), format!("not a JSON-RPC 2.0 response: {v}"));
        }
        if v.get("id") != Some(&x.id) {
            bad(
                Some(n),
                format!("answers id {:?}, the request had {}", v.get("id"), x.id),
            );
        }
        let result = v.get("result");
        let error = v.get("error");
        if result.is_some() == error.is_some() {
            bad(Some(n), format!("needs exactly one of result, error: {v}"));
            continue;
        }
        if x.probe && (error.is_some() || result.is_some_and(|r| r["isError"] == json!(true))) {
            bad(Some(n), format!("liveness probe did not succeed: {v}"));
        }
        // Requests from a sled reach only the session whose call made them, on that call.
        let summarize = matches!(
            x.op,
            Op::Call {
                tool: Tool::Summarize,
                ..
            }
        );
        let prompt_prefix = crate::sim_sled::sampling_prompt("", &x.nonce);
        let prompt_prefix = prompt_prefix.trim_end();
        for r in &x.requests {
            let text = r.request["params"]["messages"][0]["content"]["text"]
                .as_str()
                .unwrap_or("");
            if !summarize || !h.sampling {
                bad(
                    Some(n),
                    format!(
                        "a request reached an exchange that should get none (sampling declared: {}): {}",
                        h.sampling, r.request
                    ),
                );
            } else if r.request["method"] != json!("sampling/createMessage")
                || !text.starts_with(prompt_prefix)
            {
                bad(
                    Some(n),
                    format!(
                        "a sampling request of another call reached this one: {}",
                        r.request
                    ),
                );
            }
        }
        match &x.op {
            Op::ReadResource { .. } | Op::GetPrompt { .. } => {
                let read = matches!(x.op, Op::ReadResource { .. });
                let explicit: Option<String> = if read {
                    x.params["_meta"][PROJECT_META].as_str()
                } else {
                    x.params["arguments"]["project"].as_str()
                }
                .map(str::to_owned);
                let may: BTreeSet<String> = match &explicit {
                    Some(p) => BTreeSet::from([p.clone()]),
                    None => allowed.clone(),
                };
                let asked = if read {
                    x.params["uri"]
                        .as_str()
                        .and_then(|u| u.rsplit_once('/'))
                        .map_or("", |(_, id)| id)
                } else {
                    x.params["arguments"]["story_id"].as_str().unwrap_or("")
                };
                let story = created.iter().find(|c| c.id == asked);
                let what = if read {
                    "resources/read"
                } else {
                    "prompts/get"
                };
                let mut served: Option<String> = None;
                if let Some(e) = error {
                    let kind = e["data"]["kind"].as_str().unwrap_or("");
                    let code = e["code"].as_i64().unwrap_or(0);
                    let message = e["message"].as_str().unwrap_or("");
                    // The sled's own "no such story" names the project that looked.
                    let looked = if read && code == -32002 {
                        between(message, "(project ", " lists")
                    } else if !read && code == -32602 && kind.is_empty() {
                        between(message, " in project ", " (")
                    } else {
                        None
                    };
                    if CALL_ERRORS.contains(&(kind, code)) {
                        match e["data"]["project"].as_str() {
                            Some(p) if may.contains(p) => served = Some(p.to_owned()),
                            p => bad(
                                Some(n),
                                format!(
                                    "{what} error names project {p:?}; this session's history allows {may:?}: {e}"
                                ),
                            ),
                        }
                    } else if let Some(p) = looked {
                        if !may.contains(p) {
                            bad(
                                Some(n),
                                format!(
                                    "{what} of {asked} was answered by project {p}; this session's history allows {may:?}: {e}"
                                ),
                            );
                        } else if story.is_some_and(|c| c.project == p) {
                            bad(
                                Some(n),
                                format!(
                                    "{what} of {asked}, created in {p}, says {p} lacks it: {e}"
                                ),
                            );
                        }
                        served = Some(p.to_owned());
                    } else {
                        bad(Some(n), format!("undocumented error for {what}: {e}"));
                    }
                } else if let Some(r) = result {
                    let (project, id) = if read {
                        let body: Value = r["contents"][0]["text"]
                            .as_str()
                            .and_then(|t| serde_json::from_str(t).ok())
                            .unwrap_or(Value::Null);
                        (
                            body["project"].as_str().map(str::to_owned),
                            body["story"]["id"].as_str().map(str::to_owned),
                        )
                    } else {
                        let text = r["messages"][0]["content"]["text"].as_str().unwrap_or("");
                        (
                            between(text, "Project ", ": story ").map(str::to_owned),
                            text.split_once(": story ")
                                .and_then(|(_, rest)| rest.split(' ').next())
                                .map(str::to_owned),
                        )
                    };
                    match project.as_deref() {
                        Some(p) if may.contains(p) => served = Some(p.to_owned()),
                        p => bad(
                            Some(n),
                            format!(
                                "{what} served by project {p:?}; this session's history allows {may:?} (explicit {explicit:?})"
                            ),
                        ),
                    }
                    if id.as_deref() != Some(asked)
                        || story.is_none_or(|c| Some(c.project.as_str()) != project.as_deref())
                    {
                        bad(
                            Some(n),
                            format!(
                                "{what} of {asked} (created in {:?}) answered story {id:?} of {project:?}",
                                story.map(|c| &c.project)
                            ),
                        );
                    }
                    let meta = &r["_meta"];
                    if meta[NONCE_KEY] != json!(x.nonce)
                        || meta[PROJECT_META_KEY].as_str() != project.as_deref()
                    {
                        bad(
                            Some(n),
                            format!(
                                "{what} answered with _meta {meta}, the request carried nonce {:?}",
                                x.nonce
                            ),
                        );
                    }
                }
                if explicit.is_none() {
                    if let Some(p) = served {
                        allowed = BTreeSet::from([p]);
                    }
                }
            }
            Op::Switch { project } => match result {
                Some(r) => {
                    let sc = &r["structuredContent"];
                    if sc["project"] != json!(project) || sc["scope"] != json!("session") {
                        bad(Some(n), format!("switch to {project} answered {sc}"));
                    }
                    let previous = sc["previous"].as_str().map(str::to_owned);
                    if previous.as_ref().is_some_and(|p| !allowed.contains(p)) {
                        bad(
                            Some(n),
                            format!(
                                "switch says the previous default was {previous:?}; this session's history allows {allowed:?}"
                            ),
                        );
                    }
                    allowed = BTreeSet::from([project.clone()]);
                }
                None => bad(
                    Some(n),
                    format!("switch to a registered project failed: {v}"),
                ),
            },
            Op::ListProjects => match result {
                Some(r) => {
                    let sc = &r["structuredContent"];
                    let names: Vec<&str> = sc["projects"]
                        .as_array()
                        .map(|ps| ps.iter().filter_map(|p| p["name"].as_str()).collect())
                        .unwrap_or_default();
                    if names != registered.iter().map(String::as_str).collect::<Vec<_>>() {
                        bad(Some(n), format!("list_projects names {names:?}"));
                    }
                    match sc["active"].as_str() {
                        Some(a) if allowed.contains(a) => allowed = BTreeSet::from([a.to_owned()]),
                        a => bad(
                            Some(n),
                            format!(
                                "list_projects says the active project is {a:?}; this session's history allows {allowed:?}"
                            ),
                        ),
                    }
                }
                None => bad(Some(n), format!("list_projects failed: {v}")),
            },
            Op::ToolsList => match result.and_then(|r| r["tools"].as_array()) {
                Some(tools) => {
                    let names: BTreeSet<&str> =
                        tools.iter().filter_map(|t| t["name"].as_str()).collect();
                    for want in ["switch_project", "list_projects"] {
                        if !names.contains(want) {
                            bad(Some(n), format!("tools/list lacks {want}"));
                        }
                    }
                }
                None => bad(Some(n), format!("tools/list failed: {v}")),
            },
            Op::Call { tool, target } => {
                let explicit: Option<String> =
                    x.params["arguments"]["project"].as_str().map(str::to_owned);
                let may: BTreeSet<String> = match &explicit {
                    Some(p) => BTreeSet::from([p.clone()]),
                    None => allowed.clone(),
                };
                let unknown = explicit.as_deref() == Some(UNKNOWN_PROJECT);
                let mut never_sent = false;
                let mut served: Option<String> = None;
                if let Some(e) = error {
                    let kind = e["data"]["kind"].as_str().unwrap_or("");
                    let code = e["code"].as_i64().unwrap_or(0);
                    let project = e["data"]["project"].as_str();
                    if unknown {
                        if (kind, code) != ("unknown_project", -32602)
                            || project != Some(UNKNOWN_PROJECT)
                            || e["data"]["registered"].as_array().map(Vec::len)
                                != Some(registered.len())
                        {
                            bad(Some(n), format!("an unknown project gave {e}"));
                        }
                    } else if !CALL_ERRORS.contains(&(kind, code)) {
                        bad(Some(n), format!("undocumented error for a call: {e}"));
                    } else {
                        match project {
                            Some(p) if may.contains(p) => served = Some(p.to_owned()),
                            p => bad(
                                Some(n),
                                format!(
                                    "error names project {p:?}; this session's history allows {may:?}: {e}"
                                ),
                            ),
                        }
                        if e["data"]["sled"].as_str().is_none() {
                            bad(Some(n), format!("error without data.sled: {e}"));
                        }
                        let reason = e["data"]["reason"].as_str().unwrap_or("");
                        let unknown_outcome = e["data"]["outcome"] == json!("unknown");
                        match kind {
                            "sled_not_connected" => never_sent = true,
                            "uplink_lost"
                                if !unknown_outcome
                                    || !["closed", "replaced", "heartbeat_timeout"]
                                        .contains(&reason) =>
                            {
                                bad(Some(n), format!("uplink_lost with {e}"));
                            }
                            "timeout" if !unknown_outcome || !e["data"]["waited_ms"].is_u64() => {
                                bad(Some(n), format!("timeout with {e}"));
                            }
                            _ => {}
                        }
                    }
                } else if let Some(r) = result {
                    let sc = &r["structuredContent"];
                    let project = sc["project"].as_str();
                    if unknown {
                        bad(
                            Some(n),
                            format!("a call to an unknown project succeeded: {v}"),
                        );
                    }
                    match project {
                        Some(p) if may.contains(p) => served = Some(p.to_owned()),
                        p => bad(
                            Some(n),
                            format!(
                                "served by project {p:?}; this session's history allows {may:?} (explicit {explicit:?})"
                            ),
                        ),
                    }
                    let meta = &r["_meta"];
                    if meta[NONCE_KEY] != json!(x.nonce) {
                        bad(
                            Some(n),
                            format!(
                                "the sled echoed nonce {}, the request carried {:?}",
                                meta[NONCE_KEY], x.nonce
                            ),
                        );
                    }
                    if meta[PROJECT_META_KEY].as_str() != project {
                        bad(Some(n), format!("_meta names another project: {meta}"));
                    }
                    let is_error = r["isError"] == json!(true);
                    match tool {
                        Tool::CreateStory if !is_error => {
                            let story = &sc["story"];
                            let name = story_name(&x.nonce);
                            let id = story["id"].as_str().unwrap_or("");
                            if story["name"] != json!(name)
                                || !project.is_some_and(|p| id.starts_with(&format!("{p}-")))
                            {
                                bad(Some(n), format!("create_story answered {sc}"));
                            }
                            if let Some(p) = project {
                                created.push(Created {
                                    project: p.to_owned(),
                                    id: id.to_owned(),
                                    name: name.clone(),
                                });
                            }
                        }
                        Tool::CreateStory => bad(Some(n), format!("create_story refused: {sc}")),
                        Tool::Show { .. } => {
                            let asked = x.params["arguments"]["story_id"].as_str().unwrap_or("");
                            if let Some(c) = created.iter().find(|c| c.id == asked) {
                                if project == Some(c.project.as_str()) {
                                    if is_error || sc["story"]["name"] != json!(c.name) {
                                        bad(
                                            Some(n),
                                            format!(
                                                "show of {asked} (created in {}) answered {sc}",
                                                c.project
                                            ),
                                        );
                                    }
                                } else if !is_error {
                                    bad(
                                        Some(n),
                                        format!("show of {asked} found it in {project:?}: {sc}"),
                                    );
                                }
                            }
                        }
                        Tool::Whoami => {
                            if is_error || sc["sled"].as_str().is_none() {
                                bad(Some(n), format!("whoami answered {sc}"));
                            }
                        }
                        Tool::Summarize if h.sampling => {
                            let want = sampling_answer(h.index, &x.nonce);
                            if is_error || sc["summary"] != json!(want) {
                                bad(
                                    Some(n),
                                    format!(
                                        "summarize_story should hold {want:?}; it answered {sc}"
                                    ),
                                );
                            }
                            let round_trips: Vec<&Result<u16, String>> =
                                x.requests.iter().map(|r| &r.answered).collect();
                            if round_trips != [&Ok(202)] {
                                bad(
                                    Some(n),
                                    format!("summarize_story succeeded after sampling round trips {round_trips:?}"),
                                );
                            }
                        }
                        Tool::Summarize => {
                            if !is_error || sc["sampling_error"]["code"] != json!(-32601) {
                                bad(
                                    Some(n),
                                    format!("summarize_story without the sampling capability answered {sc}"),
                                );
                            }
                        }
                    }
                }
                if explicit.is_none() {
                    if let Some(p) = &served {
                        // The gateway resolved the default to `p`: that settles any ambiguity.
                        allowed = BTreeSet::from([p.clone()]);
                    }
                }
                if matches!(tool, Tool::CreateStory) && !unknown {
                    let confirmed = result
                        .filter(|r| r["isError"] != json!(true))
                        .and_then(|r| {
                            let sc = &r["structuredContent"];
                            Some((
                                sc["project"].as_str()?.to_owned(),
                                sc["story"]["id"].as_str()?.to_owned(),
                            ))
                        });
                    stories.push(StoryClaim {
                        session: h.index,
                        exchange: n,
                        name: story_name(&x.nonce),
                        created: confirmed,
                        candidates: match &served {
                            Some(p) => BTreeSet::from([p.clone()]),
                            None => candidates(target, &may),
                        },
                        never_sent,
                    });
                }
            }
        }
    }
    report.stories = stories;
    report.failed = failed;
    report
}

/// The text of `s` between the first `start` and the next `end`.
fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let (_, rest) = s.split_once(start)?;
    rest.split_once(end).map(|(mid, _)| mid)
}

fn candidates(target: &Target, allowed: &BTreeSet<String>) -> BTreeSet<String> {
    match target {
        Target::Project(p) => BTreeSet::from([p.clone()]),
        Target::Default | Target::StoryProject => allowed.clone(),
    }
}

fn report_push(v: &mut Vec<Violation>, session: usize, exchange: Option<usize>, what: String) {
    v.push(Violation {
        session,
        exchange,
        what,
    });
}

/// When `b`'s switch happened between `a`'s acknowledged switch and `a`'s next call that relied
/// on it (a tool call, resource read or prompt get without a project): the race story 1208 is
/// about. Returns how many such interleavings the histories hold
/// (another session's successful switch to a *different* project, sent after `a`'s switch was
/// answered and answered before `a`'s call was sent).
pub fn interleavings(histories: &[SessionHistory]) -> usize {
    let switches: Vec<(usize, &str, Duration, Duration)> = histories
        .iter()
        .flat_map(|h| {
            h.exchanges
                .iter()
                .filter_map(move |x| match (&x.op, &x.outcome) {
                    (Op::Switch { project }, Outcome::Response(v)) if v.get("result").is_some() => {
                        Some((h.index, project.as_str(), x.sent, x.received))
                    }
                    _ => None,
                })
        })
        .collect();
    let mut count = 0;
    for h in histories {
        let mut last_switch: Option<(&str, Duration)> = None;
        for x in &h.exchanges {
            match (&x.op, &x.outcome) {
                (Op::Switch { project }, Outcome::Response(v)) if v.get("result").is_some() => {
                    last_switch = Some((project, x.received));
                }
                (Op::Switch { .. }, _) => last_switch = None,
                (
                    Op::Call {
                        target: Target::Default,
                        ..
                    }
                    | Op::ReadResource {
                        target: Target::Default,
                        ..
                    }
                    | Op::GetPrompt {
                        target: Target::Default,
                        ..
                    }
                    | Op::ListProjects,
                    _,
                ) => {
                    if let Some((mine, acked)) = last_switch {
                        let raced = switches.iter().any(|&(s, p, sent, received)| {
                            s != h.index && p != mine && sent >= acked && received <= x.sent
                        });
                        if raced {
                            count += 1;
                        }
                    }
                }
                _ => {}
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(seed: u64) -> Workload {
        Workload {
            seed,
            projects: vec!["alpha".into(), "beta".into(), "gamma".into()],
            ops: 5..=30,
            think_max: Duration::from_millis(100),
            hot_percent: 50,
            fixed_id_percent: 30,
        }
    }

    #[test]
    fn plans_are_seeded_per_session() {
        let w = workload(7);
        assert_eq!(session_plan(&w, 0), session_plan(&w, 0));
        assert_ne!(session_plan(&w, 0), session_plan(&w, 1));
        assert_ne!(session_plan(&w, 0), session_plan(&workload(8), 0));
        let plans: Vec<SessionPlan> = (0..200).map(|i| session_plan(&w, i)).collect();
        assert!(plans.iter().any(|p| matches!(p.ids, IdMode::Fixed(_))));
        assert!(plans.iter().any(|p| p.ids == IdMode::Counting));
        let ops: Vec<&Op> = plans.iter().flat_map(|p| &p.steps).map(|s| &s.op).collect();
        let has = |f: &dyn Fn(&Op) -> bool| ops.iter().any(|o| f(o));
        assert!(has(&|o| matches!(o, Op::Switch { .. })));
        assert!(has(&|o| matches!(o, Op::ToolsList)));
        assert!(has(&|o| matches!(o, Op::ListProjects)));
        for tool in [Tool::CreateStory, Tool::Whoami] {
            assert!(has(
                &|o| matches!(o, Op::Call { tool: t, target: Target::Default } if *t == tool)
            ));
            assert!(has(
                &|o| matches!(o, Op::Call { tool: t, target: Target::Project(_) } if *t == tool)
            ));
        }
        assert!(has(&|o| matches!(
            o,
            Op::Call {
                tool: Tool::Show { .. },
                target: Target::StoryProject
            }
        )));
    }

    #[test]
    fn the_surface_is_drawn_only_when_asked() {
        let w = workload(11);
        let plain: Vec<SessionPlan> = (0..100).map(|i| session_plan(&w, i)).collect();
        let full: Vec<SessionPlan> = (0..100).map(|i| session_plan_with_surface(&w, i)).collect();
        let surface = |o: &Op| {
            matches!(
                o,
                Op::ReadResource { .. }
                    | Op::GetPrompt { .. }
                    | Op::Call {
                        tool: Tool::Summarize,
                        ..
                    }
            )
        };
        assert!(plain
            .iter()
            .all(|p| !p.sampling && !p.steps.iter().any(|s| surface(&s.op))));
        let ops: Vec<&Op> = full.iter().flat_map(|p| &p.steps).map(|s| &s.op).collect();
        assert!(ops.iter().any(|o| matches!(
            o,
            Op::ReadResource {
                target: Target::StoryProject,
                ..
            }
        )));
        assert!(ops.iter().any(|o| matches!(
            o,
            Op::GetPrompt {
                target: Target::Default,
                ..
            }
        )));
        assert!(ops.iter().any(|o| matches!(
            o,
            Op::Call {
                tool: Tool::Summarize,
                ..
            }
        )));
        assert!(full.iter().any(|p| p.sampling) && full.iter().any(|p| !p.sampling));
    }

    #[test]
    fn the_oracle_checks_reads_and_sampling() {
        let registered = ["alpha".to_owned(), "beta".to_owned()];
        let create = exchange(
            Op::Call {
                tool: Tool::CreateStory,
                target: Target::Default,
            },
            json!({"name":"create_story","arguments":{}}),
            json!({"jsonrpc":"2.0","id":1,"result":{
                "structuredContent":{"project":"alpha","story":{"id":"alpha-1","name":"story s0.0"}},
                "_meta":{NONCE_KEY:"s0.0",PROJECT_META_KEY:"alpha"}}}),
        );
        let read = |project: &str| {
            let body = json!({"project": project, "story": {"id": "alpha-1"}}).to_string();
            exchange(
                Op::ReadResource {
                    pick: 0,
                    target: Target::Default,
                },
                json!({"uri":"story://alpha/alpha-1","_meta":{NONCE_KEY:"s0.0"}}),
                json!({"jsonrpc":"2.0","id":1,"result":{"contents":[{"text": body}],
                    "_meta":{NONCE_KEY:"s0.0",PROJECT_META_KEY:project}}}),
            )
        };
        let ok = history(vec![create.clone(), read("alpha")]);
        assert_eq!(check_session(&ok, &registered).violations, vec![]);
        let wrong = history(vec![create.clone(), read("beta")]);
        assert!(!check_session(&wrong, &registered).violations.is_empty());
        // A session without `sampling` must see the -32601 refusal, and no request.
        let summarize = |sc: Value| {
            exchange(
                Op::Call {
                    tool: Tool::Summarize,
                    target: Target::Default,
                },
                json!({"name":"summarize_story","arguments":{}}),
                json!({"jsonrpc":"2.0","id":1,"result":{"structuredContent":sc,"isError":true,
                    "_meta":{NONCE_KEY:"s0.0",PROJECT_META_KEY:"alpha"}}}),
            )
        };
        let refused = summarize(
            json!({"project":"alpha","sled":"alpha","sampling_error":{"code":-32601,"message":"m"}}),
        );
        assert_eq!(
            check_session(&history(vec![refused.clone()]), &registered).violations,
            vec![]
        );
        let mut sampled = history(vec![refused]);
        sampled.sampling = true;
        // Refused, and no round trip: two violations.
        assert_eq!(check_session(&sampled, &registered).violations.len(), 2);
    }

    fn exchange(op: Op, params: Value, response: Value) -> Exchange {
        Exchange {
            op,
            probe: false,
            id: json!(1),
            nonce: "s0.0".into(),
            params,
            sent: Duration::ZERO,
            received: Duration::ZERO,
            outcome: Outcome::Response(response),
            requests: Vec::new(),
        }
    }

    fn history(exchanges: Vec<Exchange>) -> SessionHistory {
        SessionHistory {
            index: 0,
            ids: IdMode::Fixed(1),
            sampling: false,
            initial_default: Some("alpha".into()),
            initialized: Some(Duration::ZERO),
            init_failures: Vec::new(),
            exchanges,
        }
    }

    fn whoami(project: &str, nonce: &str) -> Value {
        json!({"jsonrpc":"2.0","id":1,"result":{
            "structuredContent":{"project":project,"sled":project},
            "_meta":{NONCE_KEY: nonce, PROJECT_META_KEY: project}}})
    }

    fn call_default() -> Op {
        Op::Call {
            tool: Tool::Whoami,
            target: Target::Default,
        }
    }

    #[test]
    fn the_oracle_catches_misrouting_and_crossed_answers() {
        let registered = ["alpha".to_owned(), "beta".to_owned()];
        let params = json!({"name":"whoami","arguments":{}});
        let ok = history(vec![exchange(
            call_default(),
            params.clone(),
            whoami("alpha", "s0.0"),
        )]);
        assert_eq!(check_session(&ok, &registered).violations, vec![]);
        let misrouted = history(vec![exchange(
            call_default(),
            params.clone(),
            whoami("beta", "s0.0"),
        )]);
        assert_eq!(check_session(&misrouted, &registered).violations.len(), 1);
        let crossed = history(vec![exchange(
            call_default(),
            params.clone(),
            whoami("alpha", "s1.0"),
        )]);
        assert_eq!(check_session(&crossed, &registered).violations.len(), 1);
        // After an ambiguous switch, either project; the next success settles it.
        let mut switch = exchange(
            Op::Switch {
                project: "beta".into(),
            },
            json!({}),
            Value::Null,
        );
        switch.outcome = Outcome::Failed("timeout".into());
        let ambiguous = history(vec![
            switch.clone(),
            exchange(call_default(), params.clone(), whoami("beta", "s0.0")),
            exchange(call_default(), params.clone(), whoami("alpha", "s0.0")),
        ]);
        let v = check_session(&ambiguous, &registered).violations;
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].exchange, Some(2));
    }

    #[test]
    fn error_shapes_are_checked() {
        let registered = ["alpha".to_owned()];
        let params = json!({"name":"whoami","arguments":{}});
        let err = |data: Value, code: i64| json!({"jsonrpc":"2.0","id":1,"error":{"code":code,"message":"m","data":data}});
        let good = err(
            json!({"kind":"timeout","project":"alpha","sled":"alpha","waited_ms":3000,"outcome":"unknown"}),
            -32001,
        );
        let h = history(vec![exchange(call_default(), params.clone(), good)]);
        assert_eq!(check_session(&h, &registered).violations, vec![]);
        let wrong_code = err(
            json!({"kind":"timeout","project":"alpha","sled":"alpha","waited_ms":3000,"outcome":"unknown"}),
            -32603,
        );
        let h = history(vec![exchange(call_default(), params, wrong_code)]);
        assert_eq!(check_session(&h, &registered).violations.len(), 1);
    }
}
