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
//! answer it with [`sampling_answer`]. It also has about a third of the sessions speak the
//! stateless era ([`Era::Stateless`]: `server/discover`, the `_meta` envelope and the routing
//! headers on every request, no switches), and calls of [`Tool::RunChecks`], a sled tool that
//! reports progress after each step: most ask for progress under the tokens 1, 2, 3 in turn
//! (the same in every session), and some are cancelled in flight, by `notifications/cancelled`
//! on a connection of its own (session era) or by closing the response stream (stateless era).
//! With the surface, sessions also read resources and get prompts of stories of projects they
//! did not write to (`Target::Project`: a story that does not exist, in a drawn project), and
//! session-era sessions use coordination ([`Op::Coord`]: `checkin`, `roster`, `claims` and
//! `claim` of a resource that names its project), drawn from an RNG of their own so the rest
//! of the plan stays as it was; some sessions also put a forged caller in every request's
//! `_meta["io.mcp-gateway/principal"]`, which the gateway must never pass on.
//!
//! # Rights
//!
//! A session may carry a bearer token ([`RunOptions::bearer`]) that the gateway's `[[access]]`
//! rules give rights by project; [`Rights`] says what they are: the projects it may see (read
//! at least) and those it may write. The workload does not avoid the others: calls, reads,
//! switches and claims aim at every project, writes included.
//!
//! # The per-session oracle
//!
//! [`check_session`] replays a [`SessionHistory`] and reports every [`Violation`]: a response
//! that answers another request (id or nonce), a call served by a project the session's own
//! history does not allow (the explicit `project`; else the session's last acknowledged switch,
//! or after an ambiguous switch either candidate until a response settles it), an error shape
//! the gateway does not document, a story that reads back wrong (as a tool result, a resource
//! or a prompt), a sampling request on a call that did not make it, a sampled result without
//! this session's answer, a session without `sampling` that did not get -32601, a
//! notification on a call's answer that is not that very call's progress (its token, its
//! nonce in the message, increasing values), a completed `run_checks` that did not carry every
//! step's progress, a -32800 `cancelled` answer to a call this session did not cancel, a
//! stateless result without `resultType`, a failed liveness probe.
//! And the session's [`Rights`] ([`check_session_with`]): a request naming a project it may not
//! see is answered `unknown_project` naming that project and listing exactly the projects it
//! sees (as for an unregistered one); one relying on a default it does not have is answered
//! `no_project_selected`; a visible project is never answered as unknown; a write (a tool not
//! annotated read-only, a claim) where it may only read is refused `forbidden` naming the
//! project and the `write` right (or `sled_not_connected`: the route is checked first), and
//! nothing else; a caller that may write is never refused; reads, prompts, switches and the
//! reading coordination tools are never `forbidden`; `list_projects` lists exactly the visible
//! projects; and no answer (result, error, progress, a sled's request on the answer stream)
//! names a registered project the session may not see, unless the request itself named it. A
//! read-only tool refused `forbidden` where it may read is reported in
//! [`SessionReport::refused_reads`] (the gateway treats a tool as a write until the sled's tool
//! list arrives after a (re)connection) for the caller to judge with what it knows of the
//! sleds' connections.
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

/// The caller a session that forges one claims to be ([`SessionPlan::forge_principal`]).
pub const FORGED_CALLER: &str = "forged-caller";

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
    /// The simulation sled's tool that runs `steps` steps of `step_ms` each, with progress after
    /// each ([`crate::sim_sled::RUN_CHECKS_TOOL`]). `progress`: the call asks for progress with
    /// this token (a number; sessions draw the same few, so tokens of different sessions meet).
    /// `cancel_after`: the session cancels the call this long after sending it, if it has not
    /// been answered by then (2025-11-25: `notifications/cancelled`; 2026-07-28: the client
    /// closes the response stream).
    RunChecks {
        steps: u32,
        step_ms: u32,
        progress: Option<u32>,
        cancel_after: Option<Duration>,
    },
}

impl Tool {
    /// The tool's name.
    pub fn name(&self) -> &'static str {
        match self {
            Tool::CreateStory => "create_story",
            Tool::Show { .. } => "show",
            Tool::Whoami => "whoami",
            Tool::Summarize => crate::sim_sled::SUMMARIZE_TOOL,
            Tool::RunChecks { .. } => crate::sim_sled::RUN_CHECKS_TOOL,
        }
    }

    /// Whether the sled annotates the tool read-only (so the `read` right suffices).
    pub fn read_only(&self) -> bool {
        crate::sim_sled::read_only(self.name()) == Some(true)
    }
}

/// A coordination tool the workload calls (session era: the session is the agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordTool {
    /// `checkin`, with a task naming the project it aims at (needs `read`).
    Checkin,
    /// `roster` (needs `read`).
    Roster,
    /// `claims` (needs `read`).
    Claims,
    /// `claim` of a resource of its own, [`claim_resource`] (needs `write`).
    Claim,
}

impl CoordTool {
    pub fn name(self) -> &'static str {
        match self {
            CoordTool::Checkin => "checkin",
            CoordTool::Roster => "roster",
            CoordTool::Claims => "claims",
            CoordTool::Claim => "claim",
        }
    }

    /// Whether it only reads.
    pub fn read_only(self) -> bool {
        self != CoordTool::Claim
    }
}

/// The resource the claim with `nonce` claims: it names the project the claim names (`default`
/// when it names none), so that a coordination answer showing it elsewhere is seen.
pub fn claim_resource(project: Option<&str>, nonce: &str) -> String {
    format!("story:{}.{nonce}", project.unwrap_or("default"))
}

/// The task a `checkin` with `nonce` declares, naming its project like [`claim_resource`].
pub fn checkin_task(project: Option<&str>, nonce: &str) -> String {
    format!("work in {} for {nonce}", project.unwrap_or("default"))
}

/// Where the gateway names a project's caller in a forwarded request's `_meta`; a client's own
/// entry must never reach a sled.
pub const PRINCIPAL_META: &str = crate::sim_sled::PRINCIPAL_META_KEY;

/// What a session's caller may do, as the run's `[[access]]` rules say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    /// The projects it may see (it has at least `read` there), in the registry's order: what
    /// `list_projects` and every `unknown_project`'s `registered` must list.
    pub visible: Vec<String>,
    /// The projects where it may write (tools not annotated read-only, claims).
    pub write: BTreeSet<String>,
}

impl Rights {
    /// Every right on every project (a gateway without `[[access]]`).
    pub fn all(registered: &[String]) -> Rights {
        Rights {
            visible: registered.to_vec(),
            write: registered.iter().cloned().collect(),
        }
    }

    pub fn sees(&self, project: &str) -> bool {
        self.visible.iter().any(|p| p == project)
    }

    /// Whether it may do what needs `write` (else `read`) on `project`.
    pub fn may(&self, project: &str, write: bool) -> bool {
        if write {
            self.write.contains(project)
        } else {
            self.sees(project)
        }
    }
}

/// The protocol version of the stateless era.
pub const STATELESS_VERSION: &str = "2026-07-28";

/// Which era of MCP a session speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2025-11-25: `initialize`, a session id on every request, a default project per session
    /// (`switch_project`), `notifications/cancelled` to cancel.
    Session,
    /// 2026-07-28: no session. `server/discover` instead of `initialize`; every request carries
    /// `_meta` `io.modelcontextprotocol/protocolVersion` and `…/clientCapabilities` and the
    /// headers `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and `Mcp-Param-Project`
    /// (mirroring the project the body names); calls without a project go to the gateway's
    /// default; closing the response stream cancels.
    Stateless,
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
    /// A coordination tool, in the project named ([`Target::Project`]) or the default.
    Coord {
        tool: CoordTool,
        target: Target,
    },
}

impl Op {
    /// Whether the request needs `write` on its project (`None`: it acts on no project, or
    /// needs only to see it, as `switch_project` does).
    pub fn needs_write(&self) -> Option<bool> {
        match self {
            Op::Call { tool, .. } => Some(!tool.read_only()),
            Op::Coord { tool, .. } => Some(!tool.read_only()),
            Op::ReadResource { .. } | Op::GetPrompt { .. } => Some(false),
            Op::Switch { .. } | Op::ToolsList | Op::ListProjects => None,
        }
    }
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
    pub era: Era,
    pub ids: IdMode,
    /// Whether the session declares the `sampling` capability.
    pub sampling: bool,
    /// Whether every request claims, in `_meta`, to come from another caller
    /// ([`PRINCIPAL_META`]).
    pub forge_principal: bool,
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
/// `prompts/get` of its stories, and calls of [`Tool::Summarize`] and [`Tool::RunChecks`]
/// (which need the simulation's sled, [`crate::sim_sled::SimSled`]); about half the sessions
/// declare `sampling`. About a third of the sessions speak the stateless era ([`Era`]); those
/// neither switch nor declare `sampling`, and call `run_checks` where the others would call
/// `summarize_story`.
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
    let era = if surface && rng.random_range(0..100) < 35 {
        Era::Stateless
    } else {
        Era::Session
    };
    let sampling = sampling && era == Era::Session;
    // The stateless era has no session default to switch.
    let switch_weight = if era == Era::Stateless {
        0
    } else {
        switch_weight
    };
    let extra: u32 = if surface { 24 } else { 0 };
    // Progress tokens 1, 2, 3, 1, …: every session uses the same few, so a gateway that mixed
    // up two sessions' calls with equal tokens would show it.
    let mut progress_calls: u32 = 0;
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
                        100..=111 if era == Era::Session => Tool::Summarize,
                        100.. => {
                            let steps = rng.random_range(1..=5);
                            let step_ms = rng.random_range(10..=250);
                            let progress = rng.random_bool(0.8).then(|| {
                                progress_calls += 1;
                                (progress_calls - 1) % 3 + 1
                            });
                            let cancel_after = rng.random_bool(0.4).then(|| {
                                Duration::from_millis(
                                    rng.random_range(0..=u64::from(steps * step_ms) + 100),
                                )
                            });
                            Tool::RunChecks {
                                steps,
                                step_ms,
                                progress,
                                cancel_after,
                            }
                        }
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
    let (steps, forge_principal) = if surface {
        add_extras(steps, w, index, era, think_max)
    } else {
        (steps, false)
    };
    SessionPlan {
        index,
        era,
        ids,
        sampling,
        forge_principal,
        steps,
    }
}

/// The surface's additions to a drawn plan, from an RNG of their own (so that what was drawn
/// before stays as it was): about one step in seven more, a `resources/read` or `prompts/get`
/// of a story that does not exist in a drawn project, or (session era) a coordination tool in
/// a drawn project or the default; and whether the session forges a caller in `_meta`.
fn add_extras(
    steps: Vec<Step>,
    w: &Workload,
    index: usize,
    era: Era,
    think_max: u64,
) -> (Vec<Step>, bool) {
    let mut rng = session_rng(w.seed ^ 0x0acc_e55e_d000_0017, index);
    let forge = rng.random_bool(0.2);
    let mut out = Vec::with_capacity(steps.len() + steps.len() / 4);
    for step in steps {
        if rng.random_range(0..100) < 15 {
            let think = Duration::from_millis(rng.random_range(0..=think_max));
            let roll = if era == Era::Session {
                rng.random_range(0..10)
            } else {
                rng.random_range(0..4)
            };
            let project = Target::Project(pick_project(w, &mut rng));
            let op = match roll {
                0 | 1 => Op::ReadResource {
                    pick: 0,
                    target: project,
                },
                2 | 3 => Op::GetPrompt {
                    pick: 0,
                    target: project,
                },
                r => {
                    let tool = match r {
                        4 => CoordTool::Checkin,
                        5 => CoordTool::Roster,
                        6 => CoordTool::Claims,
                        _ => CoordTool::Claim,
                    };
                    let target = if rng.random_bool(0.7) {
                        project
                    } else {
                        Target::Default
                    };
                    Op::Coord { tool, target }
                }
            };
            out.push(Step { think, op });
        }
        out.push(step);
    }
    (out, forge)
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
    /// Sent as `Authorization: Bearer <token>` on every request, when set.
    pub bearer: Option<String>,
    /// The project the liveness probe's `whoami` names (`None`: the session's default). A
    /// session whose caller may not see the file's default probes a project it may see.
    pub probe_project: Option<String>,
}

/// What came back for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A JSON-RPC response (result or error).
    Response(Value),
    /// No JSON-RPC response: the client's deadline passed, or the connection failed, or the
    /// HTTP status was not a success. The request may or may not have had its effect.
    Failed(String),
    /// No response wanted: the client cancelled the call by closing its response stream
    /// (2026-07-28). The call may or may not have had its effect.
    Abandoned,
}

/// How a session cancelled a call in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Cancel {
    /// When, since [`RunOptions::epoch`].
    pub at: Duration,
    pub how: CancelHow,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CancelHow {
    /// 2025-11-25: `notifications/cancelled` naming the request's id, POSTed on a connection of
    /// its own; the HTTP status it got, or why none.
    Notified(Result<u16, String>),
    /// 2026-07-28: the client closed the response stream (its connection).
    Dropped,
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
    /// The progress token the request carried in `params._meta.progressToken`.
    pub progress_token: Option<Value>,
    /// Notifications that came on this request's answer stream (progress), in order.
    pub notifications: Vec<Value>,
    /// Whether, when and how the session cancelled the request in flight.
    pub cancel: Option<Cancel>,
}

/// What one session did and saw.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionHistory {
    pub index: usize,
    pub era: Era,
    pub ids: IdMode,
    /// Whether the session declared the `sampling` capability.
    pub sampling: bool,
    /// The session's first default project, as `list_projects` or the gateway's registry says.
    pub initial_default: Option<String>,
    /// When `initialize` (2026-07-28: `server/discover`) succeeded, or `None` if it never did.
    pub initialized: Option<Duration>,
    /// Failed `initialize` (`server/discover`) attempts (each with when it ended and why).
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
        era: plan.era,
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
            c.set_bearer_token(opts.bearer.clone());
            if plan.era == Era::Stateless {
                let mut params = json!({});
                let headers = stateless_envelope("server/discover", &mut params);
                let headers: Vec<(&str, &str)> =
                    headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let discovered = c
                    .request_streaming(
                        json!(0),
                        "server/discover",
                        params,
                        &headers,
                        &mut refuse_request,
                        &mut |_| {},
                    )
                    .await;
                return match discovered {
                    Ok((v, _)) if v.get("result").is_some() => Ok(c),
                    Ok((v, _)) => Err(format!("server/discover answered {v}")),
                    Err(e) => Err(format!("server/discover: {e}")),
                };
            }
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
                    target: opts
                        .probe_project
                        .clone()
                        .map_or(Target::Default, Target::Project),
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
        let mut meta = json!({ NONCE_KEY: nonce });
        if plan.forge_principal {
            meta[PRINCIPAL_META] = json!({"token": FORGED_CALLER, "subject": FORGED_CALLER});
        }
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
                let story =
                    picked(&created, *pick).filter(|_| !matches!(target, Target::Project(_)));
                let uri = match (story, target) {
                    (Some(s), _) => story_uri(&s.project, &s.id),
                    (None, Target::Project(p)) => story_uri(p, "none-0"),
                    (None, _) => {
                        story_uri(history.initial_default.as_deref().unwrap_or(""), "none-0")
                    }
                };
                let mut meta = meta;
                match (target, story) {
                    (Target::StoryProject, Some(s)) => meta[PROJECT_META] = json!(s.project),
                    (Target::Project(p), _) => meta[PROJECT_META] = json!(p),
                    _ => {}
                }
                ("resources/read", json!({"uri": uri, "_meta": meta}))
            }
            Op::GetPrompt { pick, target } => {
                let story =
                    picked(&created, *pick).filter(|_| !matches!(target, Target::Project(_)));
                let mut arguments =
                    json!({ "story_id": story.map_or("none-0".to_owned(), |s| s.id.clone()) });
                match (target, story) {
                    (Target::StoryProject, Some(s)) => arguments["project"] = json!(s.project),
                    (Target::Project(p), _) => arguments["project"] = json!(p),
                    _ => {}
                }
                (
                    "prompts/get",
                    json!({"name": "story_brief", "arguments": arguments, "_meta": meta}),
                )
            }
            Op::Coord { tool, target } => {
                let project = match target {
                    Target::Project(p) => Some(p.as_str()),
                    _ => None,
                };
                let mut arguments = match tool {
                    CoordTool::Checkin => json!({ "task": checkin_task(project, &nonce) }),
                    CoordTool::Roster | CoordTool::Claims => json!({}),
                    CoordTool::Claim => json!({ "resource": claim_resource(project, &nonce) }),
                };
                if let Some(p) = project {
                    arguments["project"] = json!(p);
                }
                (
                    "tools/call",
                    json!({"name": tool.name(), "arguments": arguments, "_meta": meta}),
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
                    Tool::RunChecks { steps, step_ms, .. } => {
                        json!({ "steps": steps, "step_ms": step_ms })
                    }
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
        let mut params = params;
        let (progress_token, cancel_after) = match &step.op {
            Op::Call {
                tool:
                    Tool::RunChecks {
                        progress,
                        cancel_after,
                        ..
                    },
                ..
            } => (progress.map(|t| json!(t)), *cancel_after),
            _ => (None, None),
        };
        if let Some(token) = &progress_token {
            params["_meta"]["progressToken"] = token.clone();
        }
        let headers = match plan.era {
            Era::Stateless => stateless_envelope(method, &mut params),
            Era::Session => Vec::new(),
        };
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        // A cancel goes on a connection of its own, as the session it belongs to.
        let session_id = client.session_id().map(str::to_owned);
        let version = client.protocol_version().map(str::to_owned);
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
        let mut notifications = Vec::new();
        let mut notified = |m: &Value| notifications.push(m.clone());
        let mut cancel = None;
        let answered = {
            let call = client.request_streaming(
                json!(id),
                method,
                params.clone(),
                &headers,
                &mut answer,
                &mut notified,
            );
            let mut call = std::pin::pin!(call);
            match cancel_after {
                None => Some(call.await),
                Some(after) => tokio::select! {
                    biased;
                    r = &mut call => Some(r),
                    () = sleep(after) => match plan.era {
                        // Closing the response stream is the era's cancellation.
                        Era::Stateless => None,
                        Era::Session => {
                            let at = since(opts.epoch);
                            let how = CancelHow::Notified(
                                notify_cancelled(&connector, &opts, session_id, version, id).await,
                            );
                            cancel = Some(Cancel { at, how });
                            // The gateway answers the cancelled request (or the answer won the
                            // race): read it.
                            Some(call.await)
                        }
                    },
                },
            }
        };
        let outcome = match answered {
            None => {
                client.disconnect();
                cancel = Some(Cancel {
                    at: since(opts.epoch),
                    how: CancelHow::Dropped,
                });
                Outcome::Abandoned
            }
            Some(Ok((v, seen))) => {
                requests = seen;
                Outcome::Response(v)
            }
            // The stateless era answers some errors with HTTP 400 or 404 and the JSON-RPC error.
            Some(Err(ClientError::Http { status, body }))
                if plan.era == Era::Stateless && matches!(status, 400 | 404) =>
            {
                match serde_json::from_str::<Value>(&body) {
                    Ok(v) if v.get("error").is_some() => Outcome::Response(v),
                    _ => Outcome::Failed(format!("HTTP {status}: {body}")),
                }
            }
            Some(Err(
                e @ (ClientError::Timeout(_) | ClientError::Io(_) | ClientError::Http { .. }),
            )) => Outcome::Failed(e.to_string()),
            Some(Err(e)) => Outcome::Failed(format!("unreadable response: {e}")),
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
            progress_token,
            notifications,
            cancel,
        });
    }
    history
}

/// The answer to a request the session does not expect on an answer stream: -32601.
fn refuse_request(request: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": request["id"],
        "error": {"code": -32601, "message": "Method not found"}})
}

/// Makes `params` (an object) a request of the stateless era: its `_meta` gets the protocol
/// version and the client's capabilities (none). Returns the headers that mirror the body:
/// `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` (a tool's or prompt's name, a resource's
/// URI) and `Mcp-Param-Project` (the project the request names).
fn stateless_envelope(method: &str, params: &mut Value) -> Vec<(&'static str, String)> {
    let meta = &mut params["_meta"];
    meta["io.modelcontextprotocol/protocolVersion"] = json!(STATELESS_VERSION);
    meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
    let mut headers = vec![
        ("mcp-protocol-version", STATELESS_VERSION.to_owned()),
        ("mcp-method", method.to_owned()),
    ];
    let name = match method {
        "tools/call" | "prompts/get" => params["name"].as_str(),
        "resources/read" => params["uri"].as_str(),
        _ => None,
    };
    if let Some(name) = name {
        headers.push(("mcp-name", name.to_owned()));
    }
    let in_meta = params["_meta"][PROJECT_META].as_str();
    let project = match method {
        "tools/call" => params["arguments"]["project"].as_str(),
        "prompts/get" => in_meta.or(params["arguments"]["project"].as_str()),
        "resources/read" => in_meta,
        _ => None,
    };
    if let Some(project) = project {
        headers.push(("mcp-param-project", project.to_owned()));
    }
    headers
}

/// Sends `notifications/cancelled` for request `id` of the session `session` on a connection
/// of its own (the request's own connection is busy with its answer). The HTTP status, or why
/// there is none.
async fn notify_cancelled<C: Connect>(
    connector: &C,
    opts: &RunOptions,
    session: Option<String>,
    version: Option<String>,
    id: u64,
) -> Result<u16, String> {
    let attempt = async {
        let mut c = McpClient::connect(connector.clone(), &opts.url)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        c.set_timeout(Some(opts.client_timeout));
        c.set_bearer_token(opts.bearer.clone());
        c.set_session_id(session);
        c.set_protocol_version(version);
        c.notify(
            "notifications/cancelled",
            json!({"requestId": id, "reason": "the script cancels it"}),
        )
        .await
        .map_err(|e| e.to_string())
    };
    // Connecting has no deadline of its own (a lost SYN-ACK hangs it): give it the client's.
    match tokio::time::timeout(opts.client_timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {:?}", opts.client_timeout)),
    }
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
    /// Calls of read-only tools refused `forbidden` (as writes) on a project where the caller
    /// may read, by position: right only while the gateway has not yet got the sled's tool
    /// list since it (re)connected, which the caller judges.
    pub refused_reads: Vec<usize>,
}

/// The error kinds a forwarded `tools/call` may come back with, and their codes
/// (`gateway_core::RpcError`).
const CALL_ERRORS: [(&str, i64); 5] = [
    ("sled_not_connected", -32603),
    // A sled just (re)connected to a gateway that has never seen its tools, while leases
    // exist in its project: not sent.
    ("tools_pending", -32000),
    ("uplink_lost", -32603),
    ("timeout", -32001),
    ("bad_sled_response", -32603),
];

/// Judges every response of one session by what the session alone has seen; see the module
/// docs. `registered` lists the gateway's projects in registry order. The session's caller may
/// do everything everywhere (no `[[access]]`).
pub fn check_session(h: &SessionHistory, registered: &[String]) -> SessionReport {
    check_session_with(h, registered, &Rights::all(registered))
}

/// [`check_session`] for a session whose caller has `rights`. Its `initial_default` must be
/// the file's default only when the caller may see it (else `None`: the gateway gives it no
/// default).
pub fn check_session_with(
    h: &SessionHistory,
    registered: &[String],
    rights: &Rights,
) -> SessionReport {
    let mut report = SessionReport::default();
    let mut refused_reads = Vec::new();
    let mut bad = |n: Option<usize>, what: String| {
        report_push(&mut report.violations, h.index, n, what);
    };
    if h.initialized.is_none() {
        bad(None, format!("never initialized: {:?}", h.init_failures));
    }
    // The projects this session's default may be now, and whether it may have none.
    let mut allowed: BTreeSet<String> = h.initial_default.iter().cloned().collect();
    let mut no_default = h.initial_default.is_none();
    let mut created: Vec<Created> = Vec::new();
    let mut stories = Vec::new();
    let mut failed = Vec::new();
    for (n, x) in h.exchanges.iter().enumerate() {
        for what in progress_problems(x) {
            bad(Some(n), what);
        }
        let leaks = leaked(x, registered, rights);
        if !leaks.is_empty() {
            bad(
                Some(n),
                format!(
                    "the answer names {leaks:?}, which its caller may not see (it sees {:?}) and the request did not name: {:?}",
                    rights.visible, x.outcome
                ),
            );
        }
        let explicit: Option<String> = match &x.op {
            Op::ReadResource { .. } => x.params["_meta"][PROJECT_META].as_str(),
            Op::ToolsList | Op::ListProjects => None,
            _ => x.params["arguments"]["project"].as_str(),
        }
        .map(str::to_owned);
        // Where the request may act: the project it names, or its default.
        let aimed: BTreeSet<String> = match &explicit {
            Some(p) => BTreeSet::from([p.clone()]),
            None => allowed.clone(),
        };
        // A write aimed only where its caller may not write (or see) must never be applied.
        let unwritable = match x.op.needs_write() {
            Some(true) => aimed.iter().all(|p| !rights.may(p, true)),
            _ => false,
        };
        let v = match &x.outcome {
            Outcome::Failed(_) | Outcome::Abandoned => {
                match &x.outcome {
                    Outcome::Failed(why) => {
                        failed.push(n);
                        if x.probe {
                            bad(Some(n), format!("liveness probe failed: {why}"));
                        }
                    }
                    _ if !matches!(
                        x.cancel,
                        Some(Cancel {
                            how: CancelHow::Dropped,
                            ..
                        })
                    ) =>
                    {
                        bad(
                            Some(n),
                            "abandoned, but not cancelled by closing its stream".into(),
                        );
                    }
                    _ => {}
                }
                if let Op::Switch { project } = &x.op {
                    if rights.sees(project) {
                        allowed.insert(project.clone());
                    }
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
                        never_sent: unwritable,
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
        let kind = error.and_then(|e| e["data"]["kind"].as_str()).unwrap_or("");
        let code = error.and_then(|e| e["code"].as_i64()).unwrap_or(0);
        // A read-only tool refused as a write: judged below, and by the caller.
        let read_refused = kind == "forbidden" && x.op.needs_write() == Some(false);
        if x.probe
            && !read_refused
            && (error.is_some() || result.is_some_and(|r| r["isError"] == json!(true)))
        {
            bad(Some(n), format!("liveness probe did not succeed: {v}"));
        }
        // Rights: what the request named, or relied on, against what its caller may do.
        let needs = match &x.op {
            Op::Switch { .. } => Some(false),
            op => op.needs_write(),
        };
        if let Some(write) = needs {
            let create = matches!(
                x.op,
                Op::Call {
                    tool: Tool::CreateStory,
                    ..
                }
            );
            let lists_visible = |e: &Value| e["data"]["registered"] == json!(rights.visible);
            let refused = match &explicit {
                Some(p) if !rights.sees(p) => {
                    let e = error.unwrap_or(&Value::Null);
                    if (kind, code) != ("unknown_project", -32602)
                        || e["data"]["project"] != json!(p)
                        || !lists_visible(e)
                    {
                        bad(
                            Some(n),
                            format!(
                                "{p} is not a project its caller may see, so it must be answered unknown_project listing exactly {:?}: {v}",
                                rights.visible
                            ),
                        );
                    }
                    true
                }
                None if allowed.is_empty() => {
                    let e = error.unwrap_or(&Value::Null);
                    if (kind, code) != ("no_project_selected", -32602) || !lists_visible(e) {
                        bad(
                            Some(n),
                            format!(
                                "the session has no default project (its caller may not see the file's), so it must be answered no_project_selected listing exactly {:?}: {v}",
                                rights.visible
                            ),
                        );
                    }
                    true
                }
                _ => match kind {
                    "unknown_project" => {
                        bad(
                            Some(n),
                            format!("aimed at {aimed:?}, which its caller may see, and answered as an unknown project: {v}"),
                        );
                        true
                    }
                    "no_project_selected" => {
                        if explicit.is_some() || !no_default {
                            bad(
                                Some(n),
                                format!("answered no_project_selected, but its default may only be {aimed:?}: {v}"),
                            );
                        } else {
                            allowed.clear();
                        }
                        true
                    }
                    "forbidden" => {
                        let e = error.unwrap_or(&Value::Null);
                        let q = e["data"]["project"].as_str().unwrap_or("");
                        if !aimed.contains(q) {
                            bad(
                                Some(n),
                                format!("refused naming project {q:?}; the request was aimed at {aimed:?}: {v}"),
                            );
                        } else if code != -32000 || e["data"]["right"] != json!("write") {
                            bad(
                                Some(n),
                                format!("a refusal must be -32000 forbidden naming the right missing (write): {v}"),
                            );
                        } else if rights.may(q, true) {
                            bad(
                                Some(n),
                                format!("refused on {q}, where its caller may write: {v}"),
                            );
                        } else if !write && matches!(x.op, Op::Call { .. }) {
                            refused_reads.push(n);
                        } else if !write {
                            bad(
                                Some(n),
                                format!("refused, though it needs only to see or read {q}, which its caller may: {v}"),
                            );
                        }
                        if explicit.is_none() && aimed.contains(q) {
                            allowed = BTreeSet::from([q.to_owned()]);
                            no_default = false;
                        }
                        true
                    }
                    _ => {
                        if unwritable && write && kind != "sled_not_connected" {
                            bad(
                                Some(n),
                                format!("a write aimed at {aimed:?}, where its caller may not write, was not refused: {v}"),
                            );
                        }
                        false
                    }
                },
            };
            if refused {
                if create {
                    stories.push(StoryClaim {
                        session: h.index,
                        exchange: n,
                        name: story_name(&x.nonce),
                        created: None,
                        candidates: aimed.clone(),
                        never_sent: true,
                    });
                }
                continue;
            }
        }
        if h.era == Era::Stateless && result.is_some_and(|r| r["resultType"] != json!("complete")) {
            bad(
                Some(n),
                format!("a 2026-07-28 result without resultType \"complete\": {v}"),
            );
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
        let answer = (v, result);
        let settle = match &x.op {
            Op::ReadResource { .. } | Op::GetPrompt { .. } => {
                judge_read(x, n, (result, error), &allowed, &created, &mut bad)
            }
            Op::Coord { tool, .. } => {
                let defaults = (&allowed, no_default);
                judge_coord(x, n, tool, answer, &explicit, defaults, &mut bad);
                Settle::Keep
            }
            Op::Switch { project } => {
                judge_switch(n, project, answer, (&allowed, no_default), &mut bad)
            }
            Op::ListProjects => {
                judge_list_projects(n, answer, rights, (&allowed, no_default), &mut bad)
            }
            Op::ToolsList => {
                judge_tools_list(h, n, answer, &mut bad);
                Settle::Keep
            }
            Op::Call { tool, target } => {
                let (settle, story) = judge_call(
                    h,
                    x,
                    n,
                    (tool, target),
                    (v, result, error),
                    registered,
                    &allowed,
                    &mut created,
                    &mut bad,
                );
                stories.extend(story);
                settle
            }
        };
        match settle {
            Settle::Keep => {}
            Settle::To(p) => {
                allowed = BTreeSet::from([p]);
                no_default = false;
            }
            Settle::None => allowed.clear(),
        }
    }
    report.stories = stories;
    report.failed = failed;
    report.refused_reads = refused_reads;
    report
}

/// What an answer settles about the session's default project.
enum Settle {
    /// Nothing new.
    Keep,
    /// It is this project now.
    To(String),
    /// It has none.
    None,
}

/// `resources/read` and `prompts/get`: answered by a project this session may have aimed at,
/// with the story asked for, from the project it was created in.
fn judge_read(
    x: &Exchange,
    n: usize,
    (result, error): (Option<&Value>, Option<&Value>),
    allowed: &BTreeSet<String>,
    created: &[Created],
    bad: &mut dyn FnMut(Option<usize>, String),
) -> Settle {
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
                    format!("{what} of {asked}, created in {p}, says {p} lacks it: {e}"),
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
    match (explicit, served) {
        (None, Some(p)) => Settle::To(p),
        _ => Settle::Keep,
    }
}

/// The coordination tools: each answers what it was asked, in the project it was aimed at.
#[allow(clippy::too_many_arguments)]
fn judge_coord(
    x: &Exchange,
    n: usize,
    tool: &CoordTool,
    (v, result): (&Value, Option<&Value>),
    explicit: &Option<String>,
    (allowed, no_default): (&BTreeSet<String>, bool),
    bad: &mut dyn FnMut(Option<usize>, String),
) {
    let Some(r) = result else {
        bad(
            Some(n),
            format!("undocumented error for {}: {v}", tool.name()),
        );
        return;
    };
    // Its project, when known: what it named, or a settled default.
    let here = match (&explicit, allowed.len()) {
        (Some(p), _) => Some(p.clone()),
        (None, 1) if !no_default => allowed.first().cloned(),
        _ => None,
    };
    let sc = &r["structuredContent"];
    // Resources and tasks name the project their request named (or `default`):
    // another project's showing here crossed projects.
    let elsewhere = |text: &str| {
        let named = text
            .strip_prefix("story:")
            .and_then(|r| r.split_once('.'))
            .map(|(p, _)| p)
            .or_else(|| between(text, "work in ", " for "));
        match (&here, named) {
            (Some(h), Some(p)) => p != h && p != "default",
            _ => false,
        }
    };
    match tool {
        CoordTool::Claim => {
            let want = x.params["arguments"]["resource"].clone();
            if sc["acquired"] != json!(true) || sc["resource"] != want {
                bad(
                    Some(n),
                    format!("claim of {want} (nobody else claims it) answered {sc}"),
                );
            }
        }
        CoordTool::Claims => {
            for l in sc["leases"].as_array().into_iter().flatten() {
                if elsewhere(l["resource"].as_str().unwrap_or("")) {
                    bad(
                        Some(n),
                        format!("claims in {here:?} lists another project's lease: {l}"),
                    );
                }
            }
        }
        CoordTool::Roster => {
            for a in sc["agents"].as_array().into_iter().flatten() {
                let holds = a["holds"].as_array().into_iter().flatten();
                let mut texts = holds.filter_map(Value::as_str).chain(a["task"].as_str());
                if texts.any(elsewhere) {
                    bad(
                        Some(n),
                        format!(
                            "roster of {here:?} shows another project's presence or lease: {a}"
                        ),
                    );
                }
            }
        }
        CoordTool::Checkin => {
            if sc["agent"].as_str().is_none() {
                bad(Some(n), format!("checkin answered {sc}"));
            }
        }
    }
}

/// `switch_project`: it says the default it replaced, one this session's history allows, and
/// settles the default.
fn judge_switch(
    n: usize,
    project: &str,
    (v, result): (&Value, Option<&Value>),
    (allowed, no_default): (&BTreeSet<String>, bool),
    bad: &mut dyn FnMut(Option<usize>, String),
) -> Settle {
    match result {
        Some(r) => {
            let sc = &r["structuredContent"];
            if sc["project"] != json!(project) || sc["scope"] != json!("session") {
                bad(Some(n), format!("switch to {project} answered {sc}"));
            }
            let previous = sc["previous"].as_str().map(str::to_owned);
            if previous
                .as_ref()
                .map_or(!no_default, |p| !allowed.contains(p))
            {
                bad(
                    Some(n),
                    format!(
                        "switch says the previous default was {previous:?}; this session's history allows {allowed:?} (or none: {no_default})"
                    ),
                );
            }
            Settle::To(project.to_owned())
        }
        None => {
            bad(
                Some(n),
                format!("switch to a registered project failed: {v}"),
            );
            Settle::Keep
        }
    }
}

/// `list_projects`: exactly the projects its caller sees, and an active project this
/// session's history allows (which settles the default).
fn judge_list_projects(
    n: usize,
    (v, result): (&Value, Option<&Value>),
    rights: &Rights,
    (allowed, no_default): (&BTreeSet<String>, bool),
    bad: &mut dyn FnMut(Option<usize>, String),
) -> Settle {
    match result {
        Some(r) => {
            let sc = &r["structuredContent"];
            let names: Vec<&str> = sc["projects"]
                .as_array()
                .map(|ps| ps.iter().filter_map(|p| p["name"].as_str()).collect())
                .unwrap_or_default();
            if names
                != rights
                    .visible
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
            {
                bad(
                    Some(n),
                    format!(
                        "list_projects names {names:?}; its caller sees {:?}",
                        rights.visible
                    ),
                );
            }
            match sc["active"].as_str() {
                Some(a) if allowed.contains(a) => Settle::To(a.to_owned()),
                None if no_default && sc["active"].is_null() => Settle::None,
                a => {
                    bad(
                        Some(n),
                        format!(
                            "list_projects says the active project is {a:?}; this session's history allows {allowed:?}"
                        ),
                    );
                    Settle::Keep
                }
            }
        }
        None => {
            bad(Some(n), format!("list_projects failed: {v}"));
            Settle::Keep
        }
    }
}

/// `tools/list`: the gateway's tools, with `switch_project` only in the session era.
fn judge_tools_list(
    h: &SessionHistory,
    n: usize,
    (v, result): (&Value, Option<&Value>),
    bad: &mut dyn FnMut(Option<usize>, String),
) {
    match result.and_then(|r| r["tools"].as_array()) {
        Some(tools) => {
            let names: BTreeSet<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
            if !names.contains("list_projects") {
                bad(Some(n), "tools/list lacks list_projects".into());
            }
            // 2026-07-28 has no session default to switch.
            if names.contains("switch_project") != (h.era == Era::Session) {
                bad(
                    Some(n),
                    format!("tools/list of a {:?}-era session: {names:?}", h.era),
                );
            }
        }
        None => bad(Some(n), format!("tools/list failed: {v}")),
    };
}

/// A project tool call: served by a project this session may have aimed at, with the sled's
/// own answer (its nonce, its project), and what each tool promises; the `create_story` it
/// made, for the cross-session checks.
#[allow(clippy::too_many_arguments)]
fn judge_call(
    h: &SessionHistory,
    x: &Exchange,
    n: usize,
    (tool, target): (&Tool, &Target),
    (v, result, error): (&Value, Option<&Value>, Option<&Value>),
    registered: &[String],
    allowed: &BTreeSet<String>,
    created: &mut Vec<Created>,
    bad: &mut dyn FnMut(Option<usize>, String),
) -> (Settle, Option<StoryClaim>) {
    let explicit: Option<String> = x.params["arguments"]["project"].as_str().map(str::to_owned);
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
        if (kind, code) == ("cancelled", -32800) {
            // Only the call this session cancelled is answered so.
            if !matches!(
                x.cancel,
                Some(Cancel {
                    how: CancelHow::Notified(_),
                    ..
                })
            ) {
                bad(
                    Some(n),
                    format!("answered as cancelled, but this session never cancelled it: {e}"),
                );
            }
            match project {
                Some(p) if may.contains(p) => served = Some(p.to_owned()),
                p => bad(
                    Some(n),
                    format!(
                        "error names project {p:?}; this session's history allows {may:?}: {e}"
                    ),
                ),
            }
        } else if unknown {
            if (kind, code) != ("unknown_project", -32602)
                || project != Some(UNKNOWN_PROJECT)
                || e["data"]["registered"].as_array().map(Vec::len) != Some(registered.len())
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
                "sled_not_connected" | "tools_pending" => never_sent = true,
                "uplink_lost"
                    if !unknown_outcome
                        || !["closed", "replaced", "heartbeat_timeout"].contains(&reason) =>
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
                                format!("show of {asked} (created in {}) answered {sc}", c.project),
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
                        format!("summarize_story should hold {want:?}; it answered {sc}"),
                    );
                }
                let round_trips: Vec<&Result<u16, String>> =
                    x.requests.iter().map(|r| &r.answered).collect();
                if round_trips != [&Ok(202)] {
                    bad(
                        Some(n),
                        format!(
                            "summarize_story succeeded after sampling round trips {round_trips:?}"
                        ),
                    );
                }
            }
            Tool::RunChecks {
                steps, progress, ..
            } => {
                if is_error
                    || sc["steps"] != json!(steps)
                    || sc["progress"] != json!(progress.is_some())
                {
                    bad(Some(n), format!("run_checks answered {sc}"));
                }
                // Every step's progress reached the call that asked for it, on
                // its answer, before the result.
                let want: Vec<f64> = match progress {
                    Some(_) => (1..=*steps).map(f64::from).collect(),
                    None => Vec::new(),
                };
                let seen: Vec<f64> = x
                    .notifications
                    .iter()
                    .filter(|m| is_own_progress(x, m))
                    .filter_map(|m| m["params"]["progress"].as_f64())
                    .collect();
                if !is_error && seen != want {
                    bad(
                        Some(n),
                        format!(
                            "run_checks of {steps} steps (progress token {:?}) ended with progress {seen:?} on its answer",
                            x.progress_token
                        ),
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
    // The gateway resolved the default to `served`: that settles any ambiguity.
    let settle = match (&explicit, &served) {
        (None, Some(p)) => Settle::To(p.clone()),
        _ => Settle::Keep,
    };
    let story = (matches!(tool, Tool::CreateStory) && !unknown).then(|| {
        let confirmed = result
            .filter(|r| r["isError"] != json!(true))
            .and_then(|r| {
                let sc = &r["structuredContent"];
                Some((
                    sc["project"].as_str()?.to_owned(),
                    sc["story"]["id"].as_str()?.to_owned(),
                ))
            });
        StoryClaim {
            session: h.index,
            exchange: n,
            name: story_name(&x.nonce),
            created: confirmed,
            candidates: match &served {
                Some(p) => BTreeSet::from([p.clone()]),
                None => candidates(target, &may),
            },
            never_sent,
        }
    });
    (settle, story)
}

/// The registered projects that what came back for `x` names (a word of any string or key of
/// its answer, of a notification or of a request on its answer stream) that its caller may not
/// see, unless the request named them itself.
fn leaked(x: &Exchange, registered: &[String], rights: &Rights) -> BTreeSet<String> {
    let hidden: BTreeSet<&str> = registered
        .iter()
        .map(String::as_str)
        .filter(|p| !rights.sees(p))
        .collect();
    let mut out = BTreeSet::new();
    if hidden.is_empty() {
        return out;
    }
    let mut sent = BTreeSet::new();
    words(&x.params, &mut |w| {
        sent.insert(w.to_owned());
    });
    let mut look = |v: &Value, fixed: &BTreeSet<String>| {
        words_except(v, fixed, &mut |w| {
            if hidden.contains(w) && !sent.contains(w) {
                out.insert(w.to_owned());
            }
        });
    };
    let none = BTreeSet::new();
    match (&x.outcome, &x.op) {
        // Tool definitions hold text that is the same for every caller (examples that name
        // projects): a string found as it is in the gateway's or the sled's own definitions is
        // not looked at.
        (Outcome::Response(v), Op::ToolsList) => look(v, fixed_text()),
        (Outcome::Response(v), _) => look(v, &none),
        _ => {}
    }
    let mut look = |v: &Value| look(v, &none);
    x.notifications.iter().for_each(&mut look);
    for r in &x.requests {
        look(&r.request);
    }
    out
}

/// Every string of the gateway's own tool definitions and of the simulation sled's: text that
/// every caller's `tools/list` may hold.
fn fixed_text() -> &'static BTreeSet<String> {
    static TEXT: std::sync::OnceLock<BTreeSet<String>> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        fn strings(v: &Value, out: &mut BTreeSet<String>) {
            match v {
                Value::String(s) => {
                    out.insert(s.clone());
                }
                Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
                Value::Object(m) => m.values().for_each(|v| strings(v, out)),
                _ => {}
            }
        }
        let mut out = BTreeSet::new();
        for d in gateway_core::gateway_tool_definitions()
            .iter()
            .chain(&crate::sim_sled::tool_definitions())
        {
            strings(d, &mut out);
        }
        out
    })
}

/// Calls `f` with every word (a run of ASCII letters and digits) of every string and key in `v`.
fn words(v: &Value, f: &mut dyn FnMut(&str)) {
    words_except(v, &BTreeSet::new(), f);
}

/// [`words`], skipping the strings in `fixed`.
fn words_except(v: &Value, fixed: &BTreeSet<String>, f: &mut dyn FnMut(&str)) {
    let split = |s: &str, f: &mut dyn FnMut(&str)| {
        s.split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .for_each(f);
    };
    match v {
        Value::String(s) if !fixed.contains(s) => split(s, f),
        Value::Array(a) => a.iter().for_each(|v| words_except(v, fixed, f)),
        Value::Object(m) => {
            for (k, v) in m {
                split(k, f);
                words_except(v, fixed, f);
            }
        }
        _ => {}
    }
}

/// What is wrong with the notifications on an exchange's answer stream. Each must be progress of
/// this very request: the request asked for progress, the token is the one this session chose
/// for it, the message is the one the sled writes for this request's nonce
/// ([`crate::sim_sled::check_progress_message`]), and the values increase.
fn progress_problems(x: &Exchange) -> Vec<String> {
    let mut out = Vec::new();
    let mut last: Option<f64> = None;
    for note in &x.notifications {
        let p = &note["params"];
        let progress = p["progress"].as_f64();
        let own_message = names_call(note, &x.nonce);
        if note["method"] != json!("notifications/progress") {
            out.push(format!(
                "a notification other than progress came on this request's answer: {note}"
            ));
        } else if x.progress_token.is_none() {
            out.push(format!(
                "progress reached a request that asked for none: {note}"
            ));
        } else if p.get("progressToken") != x.progress_token.as_ref() {
            out.push(format!(
                "progress under token {}; this request's token is {:?}: {note}",
                p["progressToken"], x.progress_token
            ));
        } else if !own_message {
            out.push(format!(
                "progress of another call reached this request (nonce {}): {note}",
                x.nonce
            ));
        } else if progress.is_none_or(|v| last.is_some_and(|l| v <= l)) {
            out.push(format!("progress does not increase: {note} after {last:?}"));
        }
        last = progress.or(last);
    }
    out
}

/// Whether `note`'s message is the one the sled writes for the call with `nonce`.
fn names_call(note: &Value, nonce: &str) -> bool {
    let p = &note["params"];
    match (p["progress"].as_f64(), p["total"].as_f64()) {
        (Some(step), Some(total)) => {
            p["message"]
                == json!(crate::sim_sled::check_progress_message(
                    step as u64,
                    total as u64,
                    nonce
                ))
        }
        _ => false,
    }
}

/// Whether `note` is progress of the exchange's own call, under its own token.
fn is_own_progress(x: &Exchange, note: &Value) -> bool {
    note["method"] == json!("notifications/progress")
        && x.progress_token.is_some()
        && note["params"].get("progressToken") == x.progress_token.as_ref()
        && names_call(note, &x.nonce)
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

    #[test]
    fn the_oracle_checks_progress_and_cancellation() {
        let registered = ["alpha".to_owned()];
        let op = Op::Call {
            tool: Tool::RunChecks {
                steps: 2,
                step_ms: 10,
                progress: Some(1),
                cancel_after: None,
            },
            target: Target::Default,
        };
        let done = json!({"jsonrpc":"2.0","id":1,"result":{
            "structuredContent":{"project":"alpha","sled":"alpha","steps":2,"progress":true},
            "_meta":{NONCE_KEY:"s0.0",PROJECT_META_KEY:"alpha"}}});
        let note = |step: u64, nonce: &str, token: Value| {
            json!({"jsonrpc":"2.0","method":"notifications/progress","params":{
                "progressToken": token, "progress": step as f64, "total": 2.0,
                "message": crate::sim_sled::check_progress_message(step, 2, nonce)}})
        };
        let run = |notes: Vec<Value>, response: Value, cancel: Option<Cancel>| {
            let mut x = exchange(
                op.clone(),
                json!({"name":"run_checks","arguments":{}}),
                response,
            );
            x.progress_token = Some(json!(1));
            x.notifications = notes;
            x.cancel = cancel;
            check_session(&history(vec![x]), &registered).violations
        };
        let own = vec![note(1, "s0.0", json!(1)), note(2, "s0.0", json!(1))];
        assert_eq!(run(own.clone(), done.clone(), None), vec![]);
        // Another call's progress under the same token; a step missing; a token not its own;
        // progress going back.
        let crossed = vec![note(1, "s1.4", json!(1)), note(2, "s0.0", json!(1))];
        assert_eq!(run(crossed, done.clone(), None).len(), 2);
        assert_eq!(run(own[1..].to_vec(), done.clone(), None).len(), 1);
        let foreign = vec![note(1, "s0.0", json!(2)), note(2, "s0.0", json!(1))];
        assert_eq!(run(foreign, done.clone(), None).len(), 2);
        let back = vec![note(2, "s0.0", json!(1)), note(1, "s0.0", json!(1))];
        assert!(!run(back, done.clone(), None).is_empty());
        // -32800 only for a call this session cancelled.
        let cancelled = json!({"jsonrpc":"2.0","id":1,"error":{"code":-32800,"message":"m",
            "data":{"kind":"cancelled","project":"alpha","outcome":"unknown"}}});
        assert_eq!(run(Vec::new(), cancelled.clone(), None).len(), 1);
        let notified = Cancel {
            at: Duration::ZERO,
            how: CancelHow::Notified(Ok(202)),
        };
        assert_eq!(run(Vec::new(), cancelled, Some(notified)), vec![]);
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
            progress_token: None,
            notifications: Vec::new(),
            cancel: None,
        }
    }

    fn history(exchanges: Vec<Exchange>) -> SessionHistory {
        SessionHistory {
            index: 0,
            era: Era::Session,
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
    fn the_oracle_checks_rights() {
        let registered = ["alpha".to_owned(), "beta".to_owned(), "gamma".to_owned()];
        // May read alpha, write beta, not see gamma; alpha is its default.
        let rights = Rights {
            visible: vec!["alpha".into(), "beta".into()],
            write: BTreeSet::from(["beta".to_owned()]),
        };
        let check = |x: Exchange| check_session_with(&history(vec![x]), &registered, &rights);
        let call = |tool: Tool, project: &str, response: Value| {
            exchange(
                Op::Call {
                    tool: tool.clone(),
                    target: Target::Project(project.into()),
                },
                json!({"name": tool.name(), "arguments": {"project": project}}),
                response,
            )
        };
        let err = |code: i64, data: Value| json!({"jsonrpc":"2.0","id":1,"error":{"code":code,"message":"m","data":data}});
        let unknown = |p: &str, listed: Value| {
            err(
                -32602,
                json!({"kind":"unknown_project","project":p,"registered":listed}),
            )
        };
        let forbidden = |p: &str| {
            err(
                -32000,
                json!({"kind":"forbidden","project":p,"right":"write","what":"tools/call create_story"}),
            )
        };
        // gamma is answered as unknown, listing what it sees; listing gamma leaks it.
        assert_eq!(
            check(call(
                Tool::Whoami,
                "gamma",
                unknown("gamma", json!(["alpha", "beta"]))
            ))
            .violations,
            vec![]
        );
        assert_eq!(
            check(call(
                Tool::Whoami,
                "zeta",
                unknown("zeta", json!(registered))
            ))
            .violations
            .len(),
            2,
            "a leak (gamma) and a wrong listing"
        );
        // A write where it may only read is refused; where it may write, never.
        assert_eq!(
            check(call(Tool::CreateStory, "alpha", forbidden("alpha"))).violations,
            vec![]
        );
        assert_eq!(
            check(call(Tool::CreateStory, "beta", forbidden("beta")))
                .violations
                .len(),
            1
        );
        let created = json!({"jsonrpc":"2.0","id":1,"result":{
            "structuredContent":{"project":"alpha","story":{"id":"alpha-1","name":"story s0.0"}},
            "_meta":{NONCE_KEY:"s0.0",PROJECT_META_KEY:"alpha"}}});
        let went_through = check(call(Tool::CreateStory, "alpha", created));
        assert!(went_through.violations[0].what.contains("was not refused"));
        // A read-only tool refused as a write is left to the caller to judge.
        let r = check(call(Tool::Whoami, "alpha", forbidden("alpha")));
        assert_eq!((r.violations, r.refused_reads), (vec![], vec![0]));
        // A visible project is never answered as unknown.
        assert_eq!(
            check(call(
                Tool::Whoami,
                "beta",
                unknown("beta", json!(["alpha", "beta"]))
            ))
            .violations
            .len(),
            1
        );
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
