//! Coordination under turmoil: leases, fences, messages and waits between agents that meet
//! partitions, crashes and restarts (the tests are in `tests/tests/coord_sim.rs`).
//!
//! One seed is one run: the real gateway (`gateway_server::serve`) on host `gateway`, two real
//! sled uplinks (projects `alpha` and `beta`, each serving the story sled through
//! [`CoordSled`], which records every write it applies or refuses) on hosts `sled-<project>`,
//! and 3–5 client hosts, each running one scripted agent session over MCP
//! (`sled_sim::McpClient`): initialize, checkin, then a seeded loop for a bounded simulated time
//! of `claim` (TTL 2–10 s) on `story:<id>`, `move_story` writes while holding, without holding,
//! after sleeping past the TTL ("pause") and just before it runs out with a slow sled ("late":
//! the write passes the gateway fenced and lands after the next holder's), `renew`, `release`,
//! channel `send`s, `wait`s and `inbox` reads. Faults drawn from the seed: a partition between
//! one client and the gateway, a sled crash and restart (its stories and fence table survive,
//! like a container's volume), a gateway power loss and restart (sessions and leases are lost;
//! clients re-initialize on 404 and check in again; the sleds report their fence high-water
//! mark in the hello). In 40 % of the seeds every message takes the same time, and agents aim
//! a renew or a write at the very instant their lease expires (the gateway must find it gone).
//!
//! Every request is recorded with its send and receive instants on turmoil's clock, the sleds
//! record what they applied; the [`judge`]ment afterwards flags only what is certainly wrong
//! given that timing (a request was processed somewhere between its send and its receipt):
//!
//! - per resource, the sled's applied fences never go back, and no fence is applied for two
//!   agents;
//! - at most one holder: a grant answered while another agent certainly held the lease (granted
//!   before the claim was sent, not released, renewed until after the answer; a renew whose
//!   answer never came may have shortened it), no gateway restart in between;
//! - fences grow: a fresh grant's fence is above every fence whose grant was answered before
//!   the claim was sent (same gateway incarnation), and, after a restart, above every fence the
//!   sled accepted before it (unwritten fences may be reissued: the gateway only learns the
//!   sled's high-water mark; a grant before the sled's hello is re-fenced then);
//! - a write the gateway checked while its agent certainly held the lease is fenced (not
//!   refused as `lease_held`, not refused as `stale_fence` unless another grant was answered
//!   meanwhile); a write checked while another agent certainly held it is not applied;
//! - a write applied with a fence comes from an agent that may hold the lease then; a renew or
//!   release that succeeds comes from an agent that may hold it (no success-shaped no-op);
//! - every request is answered within the client's timeout unless its link was partitioned
//!   or the gateway crashed; a `wait` returns within its timeout (plus slack);
//! - no lost wakeup: a `wait` sent after another agent's channel message was acknowledged, by
//!   an agent that has not read its inbox since, returns `woke: true`.
//!
//! **The adversary** (seeds from [`CoordScenario::draw_adversary`] only, so the sweeps' seeds
//! replay as before): the registry has two client tokens, both with write rights, one for the
//! honest agents and one for an [`Adversary`] on its own client host. The even-numbered honest
//! agents act without a session: `checkin` issues them an agent handle, which they name as the
//! `agent` argument of every coordination call and in `_meta["io.mcp-gateway/agent"]` on their
//! writes; the simulation "leaks" each handle to the adversary (as a log line would). At random
//! moments the adversary releases, renews and writes resources honest agents were granted,
//! puts a fence of its own choosing in `_meta["io.mcp-gateway/fence"]` on its writes, and
//! replays the leaked handles (claim, renew, release, write; with or without a session of its
//! own). It never claims under its own identity. (The coordination tools make no
//! multi-round-trip calls, so there is no `requestState` for it to guess or replay.) The
//! oracle then also checks that:
//!
//! - every adversary request is refused with its typed error: a replayed handle is
//!   `unknown_agent`, a renew or release of what it does not hold `not_holder` or `no_lease`, a
//!   write to what another holds `lease_held` (a write to what nobody holds may pass,
//!   unfenced; one with a replayed handle never does: the gateway checks the handle of every
//!   write, leased or not); the answers' kinds are counted in the coverage as
//!   `adversary [replayed ]<op> <kind>`;
//! - no adversary write reaches a sled with a fence (the one it chose, or anyone's), and none
//!   is applied while an honest agent certainly holds the lease;
//! - an honest agent's renew or release while it certainly holds its lease is never refused
//!   `not_holder` or `no_lease` (its leases stay its own until it releases them or they expire).
//!
//! The trace (every request and answer with its instants, every sled write) is hashed to check
//! determinism.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use gateway_core::coord::{CoordBug, Limits};
use gateway_core::{Config, PlantedBug, ProjectSpec, Registry};
use gateway_server::ServerOptions;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use sled_sim::mcp::{SharedSled, Sled, NONCE_KEY};
use sled_sim::model::Project;
use sled_sim::uplink::{Backend, CallContext, Handler, UplinkOptions};
use sled_sim::{ClientError, McpClient};

use super::{TurmoilConnect, TurmoilListener, GATEWAY_PORT};

const MCP_URL: &str = "http://gateway:80/mcp";
const PROJECTS: [&str; 2] = ["alpha", "beta"];
/// Stories per project: `<project>-1`, `<project>-2` (few, so that agents contend).
const STORIES: usize = 2;
/// How long a client waits for any answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(8);
/// The gateway's deadline for a call to a sled.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);
/// Slack around a fault's scheduled instant (the driver applies it at the next step).
const FAULT_SLACK: Duration = Duration::from_millis(10);
/// Slack on a wait's answer past its timeout.
const WAIT_SLACK: Duration = Duration::from_secs(1);
/// How long the gateway holds a write for its project's first tool listing.
pub const LISTING_HOLD: Duration = Duration::from_secs(1);

/// A fault, with its start and end on the simulated clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordFault {
    /// Client `client` and the gateway cannot reach each other.
    Partition {
        client: usize,
        at: Duration,
        until: Duration,
    },
    /// Sled `sled` crashes (after a partition when `power_off`: the gateway hears nothing) and
    /// restarts with its stories and fences.
    SledBounce {
        sled: usize,
        at: Duration,
        until: Duration,
        power_off: bool,
    },
    /// The gateway loses power (every link cut, then a crash) and restarts: sessions and
    /// leases are gone.
    GatewayBounce { at: Duration, until: Duration },
}

/// One seed's run.
#[derive(Clone)]
pub struct CoordScenario {
    pub seed: u64,
    pub clients: usize,
    /// The agents start new operations until this instant.
    pub run_for: Duration,
    /// Every message takes between these (equal in "exact" seeds, where agents aim a renew
    /// or a write at the very instant their lease expires).
    pub net_latency_min: Duration,
    pub net_latency_max: Duration,
    pub faults: Vec<CoordFault>,
    /// How long each sled takes to answer a `tools/list`: a gateway that restarted cannot
    /// check writes against lease annotations until then, so writes that come in meanwhile
    /// (while leases live) wait for the listing, up to [`LISTING_HOLD`].
    pub listing_delay: Duration,
    pub planted: Option<CoordBug>,
    /// A gateway bug planted beside (or instead of) a coordination one.
    pub gateway_bug: Option<PlantedBug>,
    /// An adversarial agent runs beside the honest ones ([`CoordScenario::draw_adversary`]):
    /// honest agents and the adversary then use two client tokens, and the even-numbered
    /// honest agents act without a session, by agent handle.
    pub adversary: bool,
    /// Agents also write both stories of a project in one call (`move_stories`, whose sled
    /// marks `story_ids[]` leasable: issue 26's leases inside arrays), so every resource a
    /// call names must be checked ([`CoordScenario::draw_array_writes`]).
    pub array_writes: bool,
}

impl fmt::Debug for CoordScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "coord seed {}: {} agents{}{} for {:?}, net {:?}..={:?}, listing {:?}, planted {:?} {:?}, faults {:?}",
            self.seed,
            self.clients,
            if self.adversary { " and an adversary" } else { "" },
            if self.array_writes { " writing arrays" } else { "" },
            self.run_for,
            self.net_latency_min,
            self.net_latency_max,
            self.listing_delay,
            self.planted,
            self.gateway_bug,
            self.faults
        )
    }
}

impl CoordScenario {
    pub fn draw(seed: u64, planted: Option<CoordBug>) -> CoordScenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc00d_51a0_0000_0001);
        let clients = rng.random_range(3..=5);
        let run_for = Duration::from_secs(rng.random_range(20..=30));
        let net_latency_max = Duration::from_millis(rng.random_range(1..=25));
        let net_latency_min = if rng.random_bool(0.4) {
            net_latency_max.min(Duration::from_millis(10))
        } else {
            Duration::from_millis(1)
        };
        let net_latency_max = net_latency_max.max(net_latency_min);
        let secs = |rng: &mut ChaCha8Rng, lo: u64, hi: u64| {
            Duration::from_millis(rng.random_range(lo * 1000..=hi * 1000))
        };
        let last = run_for.as_secs().saturating_sub(6);
        let mut faults = Vec::new();
        if rng.random_bool(0.6) {
            let at = secs(&mut rng, 3, last);
            faults.push(CoordFault::Partition {
                client: rng.random_range(0..clients),
                at,
                until: at + secs(&mut rng, 2, 6),
            });
        }
        if rng.random_bool(0.5) {
            let at = secs(&mut rng, 3, last);
            faults.push(CoordFault::SledBounce {
                sled: rng.random_range(0..PROJECTS.len()),
                at,
                until: at + Duration::from_millis(rng.random_range(300..=3_000)),
                power_off: rng.random_bool(0.5),
            });
        }
        if rng.random_bool(0.5) {
            let at = secs(&mut rng, 4, last);
            faults.push(CoordFault::GatewayBounce {
                at,
                until: at + Duration::from_millis(rng.random_range(300..=2_000)),
            });
        }
        // Drawn last, so that the seeds drawn before it keep their faults.
        let listing_delay = if rng.random_bool(0.3) {
            Duration::from_millis(rng.random_range(0..=2_500))
        } else {
            Duration::ZERO
        };
        CoordScenario {
            seed,
            clients,
            run_for,
            net_latency_min,
            net_latency_max,
            faults,
            listing_delay,
            planted,
            gateway_bug: None,
            adversary: false,
            array_writes: false,
        }
    }

    /// A seed whose agents also write both stories of a project in one call
    /// (`move_stories`), with `planted` (a coordination bug) planted.
    pub fn draw_array_writes(seed: u64, planted: Option<CoordBug>) -> CoordScenario {
        let mut s = CoordScenario::draw(seed, planted);
        s.array_writes = true;
        s
    }

    /// A seed with an adversarial agent among the honest ones (the same faults as
    /// [`CoordScenario::draw`]), with `planted` (a coordination bug) or `gateway_bug` planted.
    pub fn draw_adversary(
        seed: u64,
        planted: Option<CoordBug>,
        gateway_bug: Option<PlantedBug>,
    ) -> CoordScenario {
        let mut s = CoordScenario::draw(seed, planted);
        s.adversary = true;
        s.gateway_bug = gateway_bug;
        s
    }

    /// A seed that meets the listing window: the gateway restarts, and the sleds take
    /// 300–900 ms (less than the hold) to list their tools to it, so writes sent meanwhile by
    /// agents that claimed again are held and then served; with `bug` planted in the gateway.
    pub fn draw_listing_window(seed: u64, bug: Option<PlantedBug>) -> CoordScenario {
        let mut s = CoordScenario::draw(seed, None);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x115e_0000_0000_0002);
        if s.gateway_bounces().is_empty() {
            let last = s.run_for.as_secs().saturating_sub(6);
            let at = Duration::from_millis(rng.random_range(4_000..=last * 1000));
            s.faults.push(CoordFault::GatewayBounce {
                at,
                until: at + Duration::from_millis(rng.random_range(300..=2_000)),
            });
        }
        s.listing_delay = Duration::from_millis(rng.random_range(300..=900));
        s.gateway_bug = bug;
        s
    }

    /// The one-way latency when every message takes the same time.
    pub fn exact_latency(&self) -> Option<Duration> {
        (self.net_latency_min == self.net_latency_max).then_some(self.net_latency_min)
    }

    /// When the gateway crashed, and when it came back.
    fn gateway_bounces(&self) -> Vec<(Duration, Duration)> {
        self.faults
            .iter()
            .filter_map(|f| match f {
                CoordFault::GatewayBounce { at, until } => Some((*at, *until)),
                _ => None,
            })
            .collect()
    }

    /// Whether the gateway crashed between `a` and `b` (with slack).
    fn restart_between(&self, a: Duration, b: Duration) -> bool {
        self.gateway_bounces()
            .iter()
            .any(|(at, _)| *at + FAULT_SLACK >= a && *at <= b + FAULT_SLACK)
    }
}

/// What one run found.
pub type CoordReport = super::runner::SweepReport;

// ---------------------------------------------------------------------------------------------
// What is recorded.

/// An agent: a client's session (a new one after each re-initialize).
type AgentKey = (usize, u32);

fn agent_name(a: AgentKey) -> String {
    format!("c{}s{}", a.0, a.1)
}

/// Why an agent writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// While it holds the lease (by its own clock, with margin).
    Held,
    /// Without a lease of its own.
    Unheld,
    /// After sleeping past its lease's TTL.
    AfterPause,
    /// Just before its lease runs out, with a slow sled: it lands after the expiry.
    Late,
    /// Aimed at the instant its lease expires (exact-latency seeds).
    AtExpiry,
}

#[derive(Debug, Clone)]
enum Op {
    Init,
    Checkin {
        project: String,
    },
    Claim {
        project: String,
        resource: String,
        ttl: Duration,
    },
    Renew {
        project: String,
        resource: String,
        ttl: Duration,
    },
    Release {
        project: String,
        resource: String,
    },
    Write {
        project: String,
        resource: String,
        nonce: String,
        kind: WriteKind,
    },
    Send {
        project: String,
    },
    Wait {
        project: String,
        timeout: Duration,
    },
    Inbox {
        project: String,
    },
}

impl Op {
    fn resource(&self) -> Option<(&str, &str)> {
        match self {
            Op::Claim {
                project, resource, ..
            }
            | Op::Renew {
                project, resource, ..
            }
            | Op::Release { project, resource }
            | Op::Write {
                project, resource, ..
            } => Some((project, resource)),
            _ => None,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone)]
enum Answer {
    /// A successful tool result's structured content.
    Ok(Value),
    /// An `isError` tool result's structured content.
    IsError(Value),
    /// A JSON-RPC error: its `data.kind` and the whole error.
    Rpc(String, Value),
    /// No answer: the client's timeout.
    TimedOut,
    /// The transport failed or the HTTP status was not 2xx.
    Failed { status: Option<u16>, why: String },
}

#[derive(Debug, Clone)]
struct Ev {
    agent: AgentKey,
    op: Op,
    sent: Duration,
    /// When the answer (or failure) came.
    done: Duration,
    answer: Answer,
    /// The adversary's requests only: what it tried.
    adv: Option<Adv>,
}

/// What one of the adversary's requests tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Adv {
    /// The honest agent whose leaked handle it presented (as the `agent` argument, or in
    /// `_meta` on a write).
    as_agent: Option<AgentKey>,
    /// The fence it put in `_meta` itself (a write).
    fence: Option<u64>,
}

impl Ev {
    fn answered(&self) -> bool {
        matches!(
            self.answer,
            Answer::Ok(_) | Answer::IsError(_) | Answer::Rpc(..)
        )
    }

    fn ok(&self) -> Option<&Value> {
        match &self.answer {
            Answer::Ok(v) => Some(v),
            _ => None,
        }
    }

    fn rpc_kind(&self) -> Option<&str> {
        match &self.answer {
            Answer::Rpc(k, _) => Some(k),
            _ => None,
        }
    }

    fn is_error_kind(&self) -> Option<&str> {
        match &self.answer {
            Answer::IsError(v) => Some(v["kind"].as_str().unwrap_or("")),
            _ => None,
        }
    }

    /// A fresh grant: `(fence, expires_in)`.
    fn fresh_grant(&self) -> Option<(u64, Duration)> {
        let v = self.ok()?;
        (matches!(self.op, Op::Claim { .. }) && v["acquired"] == true && v["reentrant"] == false)
            .then(|| (v["fence"].as_u64().unwrap_or(0), expires_in(v)))
    }

    /// A successful extension of a held lease (renew, re-entrant claim): `expires_in`.
    fn extension(&self) -> Option<Duration> {
        let v = self.ok()?;
        match self.op {
            Op::Renew { .. } if v["renewed"] == true => Some(expires_in(v)),
            Op::Claim { .. } if v["acquired"] == true && v["reentrant"] == true => {
                Some(expires_in(v))
            }
            _ => None,
        }
    }

    fn line(&self) -> String {
        let answer = match &self.answer {
            Answer::Ok(v) => {
                let mut v = v.clone();
                if let Some(m) = v.as_object_mut() {
                    m.remove("unread");
                }
                format!("ok {v}")
            }
            Answer::IsError(v) => format!("isError {v}"),
            Answer::Rpc(k, _) => format!("error {k}"),
            Answer::TimedOut => "timed out".to_owned(),
            Answer::Failed { status, why } => format!("failed {status:?} {why}"),
        };
        let adv = match self.adv {
            None => String::new(),
            Some(a) => format!(
                " adversary{}{}",
                a.as_agent
                    .map(|k| format!(" as {}", agent_name(k)))
                    .unwrap_or_default(),
                a.fence.map(|f| format!(" fence {f}")).unwrap_or_default()
            ),
        };
        format!(
            "{:>6}..{:>6} ms {}{adv} {:?} -> {answer}",
            self.sent.as_millis(),
            self.done.as_millis(),
            agent_name(self.agent),
            self.op
        )
    }
}

fn expires_in(v: &Value) -> Duration {
    Duration::from_millis(v["expires_in_ms"].as_u64().unwrap_or(0))
}

/// A `move_story` as the sled handled it.
#[derive(Debug, Clone)]
struct Applied {
    project: String,
    resource: String,
    fence: Option<u64>,
    nonce: String,
    at: Duration,
    /// `applied`, or the `isError` kind (`stale_fence`, `fence_mismatch`, ...).
    outcome: String,
}

impl Applied {
    fn agent(&self) -> Option<AgentKey> {
        parse_nonce(&self.nonce).map(|(a, _)| a)
    }
}

/// Everything a run records, outside the hosts (it outlives crashes).
#[derive(Default)]
struct Log {
    events: Mutex<Vec<Ev>>,
    applied: Mutex<Vec<Applied>>,
    /// Requests that reached each project's sled, by arrival time.
    sled_requests: Mutex<Vec<(String, Duration)>>,
    /// When each project's sled sent a `tools/list` answer.
    listings: Mutex<Vec<(String, Duration)>>,
    /// Agent handles honest agents were issued, "leaked" to the adversary as a log line would.
    leaked: Mutex<Vec<(AgentKey, String)>>,
    violations: Mutex<Vec<String>>,
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// `c<client>.s<session>.n<seq>.d<delay ms>`: who wrote, and how long the sled takes.
fn nonce(agent: AgentKey, seq: u64, delay_ms: u64) -> String {
    format!("c{}.s{}.n{seq}.d{delay_ms}", agent.0, agent.1)
}

fn parse_nonce(n: &str) -> Option<(AgentKey, u64)> {
    let mut parts = n.split('.');
    let c = parts.next()?.strip_prefix('c')?.parse().ok()?;
    let s = parts.next()?.strip_prefix('s')?.parse().ok()?;
    let _seq = parts.next()?;
    let d = parts.next()?.strip_prefix('d')?.parse().ok()?;
    Some(((c, s), d))
}

// ---------------------------------------------------------------------------------------------
// The sled.

/// The story sled of one project as a [`Handler`]: each `tools/call` waits the delay its nonce
/// asks for, then runs; every `move_story` is recorded with its fence and outcome.
pub struct CoordSled {
    sled: SharedSled,
    project: String,
    log: Arc<Log>,
    listing_delay: Duration,
}

impl fmt::Debug for CoordSled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoordSled")
            .field("project", &self.project)
            .finish()
    }
}

impl Handler for CoordSled {
    fn project_name(&self) -> &str {
        &self.project
    }

    fn handle(self: Arc<Self>, msg: Value, _ctx: CallContext) -> BoxFuture<'static, Option<Value>> {
        self.log
            .sled_requests
            .lock()
            .expect("no poisoned lock")
            .push((self.project.clone(), now()));
        let nonce = msg
            .pointer("/params/_meta")
            .and_then(|m| m.get(NONCE_KEY))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let listing = msg["method"] == "tools/list";
        let delay = match nonce.as_deref().and_then(parse_nonce) {
            Some((_, d)) => Duration::from_millis(d),
            None if listing => self.listing_delay,
            None => Duration::ZERO,
        };
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if msg.pointer("/params/name") == Some(&json!("move_stories")) {
                return Some(self.move_stories(&msg, nonce.unwrap_or_default()));
            }
            let mut resp = self.sled.handle(&msg)?;
            if listing {
                if let Some(tools) = resp
                    .pointer_mut("/result/tools")
                    .and_then(Value::as_array_mut)
                {
                    tools.push(move_stories_tool());
                }
                self.log
                    .listings
                    .lock()
                    .expect("no poisoned lock")
                    .push((self.project.clone(), now()));
            }
            if msg.pointer("/params/name") == Some(&json!("move_story")) {
                let outcome = write_outcome(&resp);
                let fence_meta = msg
                    .pointer("/params/_meta")
                    .and_then(|m| m.get("io.mcp-gateway/fence"));
                let story = msg
                    .pointer("/params/arguments/story_id")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                self.log
                    .applied
                    .lock()
                    .expect("no poisoned lock")
                    .push(Applied {
                        project: self.project.clone(),
                        resource: format!("story:{story}"),
                        fence: fence_meta.and_then(|f| f["fence"].as_u64()),
                        nonce: nonce.unwrap_or_default(),
                        at: now(),
                        outcome,
                    });
            }
            Some(resp)
        })
    }

    fn fence_high_water(&self) -> Option<u64> {
        self.sled.fence_high_water()
    }
}

/// What became of a `move_story` at the sled: `applied`, the `isError` kind (`stale_fence`,
/// `fence_mismatch`, ...), or `rpc_error`.
fn write_outcome(resp: &Value) -> String {
    let result = &resp["result"];
    if result["isError"] == true {
        result["structuredContent"]["kind"]
            .as_str()
            .unwrap_or("error")
            .to_owned()
    } else if result.is_object() {
        "applied".to_owned()
    } else {
        "rpc_error".to_owned()
    }
}

/// `move_stories`: moves several stories of the project to one stage, naming them in an
/// array the gateway leases item by item (`story_ids[]`).
fn move_stories_tool() -> Value {
    json!({
        "name": "move_stories",
        "description": "Move several stories to one stage.",
        "inputSchema": {"type": "object", "properties": {
            "story_ids": {"type": "array", "items": {"type": "string", "x-mcp-gateway-lease": "story"}},
            "stage": {"type": "string"},
        }, "required": ["story_ids", "stage"]},
    })
}

impl CoordSled {
    /// A `move_stories` call: refused whole if a fence names a story it does not move; else a
    /// `move_story` per story (in order, with that story's fence), each recorded, stopping at
    /// the first the sled refuses.
    fn move_stories(&self, msg: &Value, nonce: String) -> Value {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let stories: Vec<String> = msg
            .pointer("/params/arguments/story_ids")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect();
        let stage = msg
            .pointer("/params/arguments/stage")
            .cloned()
            .unwrap_or(Value::Null);
        let meta = msg.pointer("/params/_meta").and_then(Value::as_object);
        let fences = gateway_core::lease_spot::fences_from_meta(meta).unwrap_or_default();
        let record = |resource: String, fence: Option<u64>, outcome: &str| {
            self.log
                .applied
                .lock()
                .expect("no poisoned lock")
                .push(Applied {
                    project: self.project.clone(),
                    resource,
                    fence,
                    nonce: nonce.clone(),
                    at: now(),
                    outcome: outcome.to_owned(),
                });
        };
        let refused = |kind: &str, resource: &str| {
            json!({"jsonrpc": "2.0", "id": id, "result": {"isError": true,
                "content": [{"type": "text", "text": format!("{kind}: {resource}")}],
                "structuredContent": {"kind": kind, "resource": resource}}})
        };
        let named: Vec<String> = stories.iter().map(|s| format!("story:{s}")).collect();
        if let Some((other, fence)) = fences.iter().find(|(r, _)| !named.contains(r)) {
            record(
                named.first().cloned().unwrap_or_default(),
                Some(*fence),
                "fence_mismatch",
            );
            return refused("fence_mismatch", other);
        }
        for (story, resource) in stories.iter().zip(&named) {
            let fence = fences.iter().find(|(r, _)| r == resource).map(|(_, f)| *f);
            let mut one = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "move_story", "arguments": {"story_id": story, "stage": stage}}});
            if let Some(f) = fence {
                one["params"]["_meta"] =
                    json!({"io.mcp-gateway/fence": {"resource": resource, "fence": f}});
            }
            let resp = self.sled.handle(&one).unwrap_or(Value::Null);
            let outcome = write_outcome(&resp);
            record(resource.clone(), fence, &outcome);
            if outcome != "applied" {
                return refused(&outcome, resource);
            }
        }
        json!({"jsonrpc": "2.0", "id": id, "result": {
            "content": [{"type": "text", "text": format!("moved {}", stories.join(", "))}],
            "structuredContent": {"moved": stories}}})
    }
}

// ---------------------------------------------------------------------------------------------
// The agents.

/// A lease the agent believes it holds.
#[derive(Debug, Clone)]
struct Held {
    project: String,
    /// When it certainly runs out: the request's send instant plus `expires_in`.
    until: Duration,
    /// When it runs out if the gateway answered at once over an exact-latency network: the
    /// answer's arrival, less the latency, plus `expires_in`.
    exact_until: Duration,
}

struct Agent {
    client: usize,
    session: u32,
    mcp: Option<McpClient<TurmoilConnect>>,
    rng: ChaCha8Rng,
    next_id: u64,
    writes: u64,
    log: Arc<Log>,
    held: BTreeMap<String, Held>,
    needs_init: bool,
    end: Duration,
    /// The network's one-way latency, when it is always the same.
    exact: Option<Duration>,
    /// The client token it presents (adversary seeds only).
    token: Option<String>,
    /// It acts without a session, by the agent handle `checkin` issued it.
    sessionless: bool,
    handle: Option<String>,
    /// It also writes both stories of a project in one call.
    array_writes: bool,
}

/// The honest agents' client token in adversary seeds, and the adversary's.
const HONEST_TOKEN: &str = "sim-client-token-honest";
const ADVERSARY_TOKEN: &str = "sim-client-token-adversary";
/// The `_meta` keys of a client's fence (the gateway's to give) and agent handle.
const FENCE_META: &str = "io.mcp-gateway/fence";
const AGENT_META: &str = "io.mcp-gateway/agent";

fn resource_of(project: &str, n: usize) -> String {
    format!("story:{project}-{n}")
}

fn story_of(resource: &str) -> &str {
    resource.strip_prefix("story:").unwrap_or(resource)
}

impl Agent {
    fn key(&self) -> AgentKey {
        (self.client, self.session)
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.rng.random_range(lo..=hi))
    }

    fn project(&mut self) -> String {
        PROJECTS[self.rng.random_range(0..PROJECTS.len())].to_owned()
    }

    fn resource(&mut self) -> (String, String) {
        let p = self.project();
        let r = resource_of(&p, self.rng.random_range(1..=STORIES));
        (p, r)
    }

    fn record(&self, ev: Ev) {
        self.log.events.lock().expect("no poisoned lock").push(ev);
    }

    /// One request; recorded with its instants.
    async fn request(&mut self, op: Op, method: &str, params: Value) -> Answer {
        self.next_id += 1;
        let id = json!(self.next_id);
        let sent = now();
        let result = match self.mcp.as_mut() {
            Some(mcp) => mcp.request(id, method, params).await,
            None => Err(ClientError::Protocol("not connected".into())),
        };
        if matches!(result, Err(ClientError::Http { status: 404, .. })) {
            self.needs_init = true;
            self.held.clear();
        }
        let answer = Answer::of(result);
        if let Answer::Ok(v) = &answer {
            for lost in v["lost"].as_array().into_iter().flatten() {
                if let Some(r) = lost["resource"].as_str() {
                    self.held.remove(r);
                }
            }
        }
        if self.sessionless && answer.rpc_kind() == Some("unknown_agent") {
            // Its handle is gone (a gateway restart): check in again for a new one.
            self.needs_init = true;
            self.held.clear();
            self.handle = None;
        }
        self.record(Ev {
            agent: self.key(),
            op,
            sent,
            done: now(),
            answer: answer.clone(),
            adv: None,
        });
        answer
    }

    /// A sessionless agent's start: `checkin` without a handle issues one (a new agent); it
    /// names it in every call from then on. The handle leaks to the adversary.
    async fn init_sessionless(&mut self) {
        let session = self.session + 1;
        self.record(Ev {
            agent: (self.client, session),
            op: Op::Init,
            sent: now(),
            done: now(),
            answer: Answer::Ok(json!({ "session": session, "sessionless": true })),
            adv: None,
        });
        self.session = session;
        self.held.clear();
        self.handle = None;
        let name = agent_name(self.key());
        let p = PROJECTS[0];
        let answer = self
            .tool(
                Op::Checkin { project: p.into() },
                "checkin",
                json!({ "project": p, "name": name }),
            )
            .await;
        let Some(handle) = answer
            .ok_value()
            .and_then(|v| v["handle"].as_str())
            .map(str::to_owned)
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            return;
        };
        self.log
            .leaked
            .lock()
            .expect("no poisoned lock")
            .push((self.key(), handle.clone()));
        self.handle = Some(handle);
        self.needs_init = false;
        for p in &PROJECTS[1..] {
            self.tool(
                Op::Checkin {
                    project: (*p).into(),
                },
                "checkin",
                json!({ "project": p, "name": name }),
            )
            .await;
        }
    }

    async fn tool(&mut self, op: Op, name: &str, mut arguments: Value) -> Answer {
        if let Some(h) = &self.handle {
            arguments["agent"] = json!(h);
        }
        let params = json!({ "name": name, "arguments": arguments });
        self.request(op, "tools/call", params).await
    }

    async fn run(&mut self) {
        while now() < self.end {
            if self.mcp.is_none() {
                match McpClient::connect(TurmoilConnect, MCP_URL).await {
                    Ok(mut mcp) => {
                        mcp.set_timeout(Some(CLIENT_TIMEOUT));
                        mcp.set_bearer_token(self.token.clone());
                        self.mcp = Some(mcp);
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
            if self.needs_init {
                self.init().await;
                continue;
            }
            self.step().await;
            let pause = self.ms(0, 150);
            tokio::time::sleep(pause).await;
        }
    }

    async fn init(&mut self) {
        if self.sessionless {
            return self.init_sessionless().await;
        }
        let sent = now();
        let Some(mcp) = self.mcp.as_mut() else { return };
        let result = mcp.initialize().await;
        let session = self.session + 1;
        let answer = match &result {
            Ok(_) => Answer::Ok(json!({"session": session})),
            Err(ClientError::Timeout(_)) => Answer::TimedOut,
            Err(e) => Answer::Failed {
                status: None,
                why: e.to_string().chars().take(80).collect(),
            },
        };
        if result.is_ok() {
            self.session = session;
        }
        self.record(Ev {
            agent: (self.client, session),
            op: Op::Init,
            sent,
            done: now(),
            answer,
            adv: None,
        });
        if result.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            return;
        }
        self.needs_init = false;
        self.held.clear();
        for p in PROJECTS {
            let name = agent_name(self.key());
            self.tool(
                Op::Checkin { project: p.into() },
                "checkin",
                json!({ "project": p, "name": name }),
            )
            .await;
        }
    }

    async fn claim(&mut self, project: &str, resource: &str) -> Answer {
        let ttl = Duration::from_secs(self.rng.random_range(2..=10));
        let op = Op::Claim {
            project: project.into(),
            resource: resource.into(),
            ttl,
        };
        let sent = now();
        let answer = self
            .tool(
                op,
                "claim",
                json!({ "project": project, "resource": resource, "ttl_s": ttl.as_secs() }),
            )
            .await;
        if let Answer::Ok(v) = &answer {
            if v["acquired"] == true {
                self.held.insert(
                    resource.to_owned(),
                    Held {
                        project: project.to_owned(),
                        until: sent + expires_in(v),
                        exact_until: (now() + expires_in(v))
                            .saturating_sub(self.exact.unwrap_or_default()),
                    },
                );
            }
        }
        answer
    }

    async fn write(&mut self, project: &str, resource: &str, kind: WriteKind, delay_ms: u64) {
        self.writes += 1;
        let n = nonce(self.key(), self.writes, delay_ms);
        let stage = ["backlog", "in_progress", "review", "done"][self.rng.random_range(0..4)];
        let op = Op::Write {
            project: project.into(),
            resource: resource.into(),
            nonce: n.clone(),
            kind,
        };
        let mut params = json!({
            "name": "move_story",
            "arguments": { "project": project, "story_id": story_of(resource), "stage": stage },
            "_meta": { NONCE_KEY: n },
        });
        if let Some(h) = &self.handle {
            params["_meta"][AGENT_META] = json!(h);
        }
        self.request(op, "tools/call", params).await;
    }

    /// Moves both stories of a project in one call (`move_stories`): a project where it holds
    /// a lease when it can, the stories in a random order. Recorded as one write per story,
    /// with the call's one answer: each is judged as its own write.
    async fn array_write(&mut self) {
        let margin = Duration::from_millis(600);
        let project = match self.pick_held(margin) {
            Some((_, h)) => h.project,
            None => self.project(),
        };
        let mut resources: Vec<String> = (1..=STORIES).map(|n| resource_of(&project, n)).collect();
        if self.rng.random_bool(0.5) {
            resources.reverse();
        }
        self.writes += 1;
        let n = nonce(self.key(), self.writes, 0);
        let stage = ["backlog", "in_progress", "review", "done"][self.rng.random_range(0..4)];
        let t = now();
        let ops: Vec<Op> = resources
            .iter()
            .map(|r| {
                let held = self.held.get(r).is_some_and(|h| t + margin < h.until);
                Op::Write {
                    project: project.clone(),
                    resource: r.clone(),
                    nonce: n.clone(),
                    kind: if held {
                        WriteKind::Held
                    } else {
                        WriteKind::Unheld
                    },
                }
            })
            .collect();
        let stories: Vec<&str> = resources.iter().map(|r| story_of(r)).collect();
        let mut params = json!({
            "name": "move_stories",
            "arguments": { "project": project, "story_ids": stories, "stage": stage },
            "_meta": { NONCE_KEY: n },
        });
        if let Some(h) = &self.handle {
            params["_meta"][AGENT_META] = json!(h);
        }
        let mut ops = ops.into_iter();
        let first = ops.next().expect("a project has stories");
        self.request(first, "tools/call", params).await;
        // The same request and answer, for each other story it names.
        let mut events = self.log.events.lock().expect("no poisoned lock");
        let Some(recorded) = events.iter().rev().find(|e| e.agent == self.key()).cloned() else {
            return;
        };
        for op in ops {
            events.push(Ev {
                op,
                ..recorded.clone()
            });
        }
    }

    /// A held lease, if any, with time left by the agent's own clock.
    fn pick_held(&mut self, margin: Duration) -> Option<(String, Held)> {
        let t = now();
        let live: Vec<(String, Held)> = self
            .held
            .iter()
            .filter(|(_, h)| t + margin < h.until)
            .map(|(r, h)| (r.clone(), h.clone()))
            .collect();
        if live.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..live.len());
        Some(live[i].clone())
    }

    async fn step(&mut self) {
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=21 => {
                let (p, r) = self.resource();
                let answer = self.claim(&p, &r).await;
                if let Answer::Ok(v) = &answer {
                    if v["acquired"] == false && self.rng.random_bool(0.6) {
                        // Wait for it to be released or expire, then try again at once.
                        let timeout = Duration::from_secs(self.rng.random_range(1..=3));
                        self.wait(&p, timeout).await;
                        if self.claim(&p, &r).await.is_acquired() {
                            self.write(&p, &r, WriteKind::Held, 0).await;
                        }
                    }
                }
            }
            22..=41 if self.array_writes && self.rng.random_bool(0.4) => {
                self.array_write().await;
            }
            22..=41 => {
                let margin = Duration::from_millis(600);
                if let Some((r, h)) = self
                    .pick_held(margin)
                    .filter(|_| self.rng.random_bool(0.75))
                {
                    let delay = self.rng.random_range(0..=100);
                    self.write(&h.project, &r, WriteKind::Held, delay).await;
                } else {
                    let (p, r) = self.resource();
                    if !self.held.contains_key(&r) {
                        self.write(&p, &r, WriteKind::Unheld, 0).await;
                    }
                }
            }
            42..=49 => {
                if let Some((r, h)) = self.pick_held(Duration::from_millis(300)) {
                    let ttl = Duration::from_secs(self.rng.random_range(2..=10));
                    let op = Op::Renew {
                        project: h.project.clone(),
                        resource: r.clone(),
                        ttl,
                    };
                    let sent = now();
                    let answer = self
                        .tool(
                            op,
                            "renew",
                            json!({ "project": h.project, "resource": r, "ttl_s": ttl.as_secs() }),
                        )
                        .await;
                    match &answer {
                        Answer::Ok(v) if v["renewed"] == true => {
                            let exact = self.exact.unwrap_or_default();
                            if let Some(held) = self.held.get_mut(&r) {
                                held.until = sent + expires_in(v);
                                held.exact_until = (now() + expires_in(v)).saturating_sub(exact);
                            }
                        }
                        _ => {
                            self.held.remove(&r);
                        }
                    }
                }
            }
            50..=57 => {
                if let Some((r, h)) = self.pick_held(Duration::from_millis(300)) {
                    let op = Op::Release {
                        project: h.project.clone(),
                        resource: r.clone(),
                    };
                    self.held.remove(&r);
                    self.tool(
                        op,
                        "release",
                        json!({ "project": h.project, "resource": r }),
                    )
                    .await;
                }
            }
            58..=65 => {
                if let Some((r, h)) = self.pick_held(Duration::from_millis(300)) {
                    self.held.remove(&r);
                    if let Some(l) = self.exact.filter(|_| self.rng.random_bool(0.7)) {
                        // Aim at the very instant the lease expires: the gateway must find it
                        // gone (`<`, not `<=`).
                        let at = h.exact_until.saturating_sub(l);
                        tokio::time::sleep(at.saturating_sub(now())).await;
                        if self.rng.random_bool(0.5) {
                            let op = Op::Renew {
                                project: h.project.clone(),
                                resource: r.clone(),
                                ttl: Duration::from_secs(2),
                            };
                            self.tool(
                                op,
                                "renew",
                                json!({ "project": h.project, "resource": r, "ttl_s": 2 }),
                            )
                            .await;
                        } else {
                            self.write(&h.project, &r, WriteKind::AtExpiry, 0).await;
                        }
                    } else if self.rng.random_bool(0.5) {
                        // Sleep past the TTL while "holding", then write.
                        let past = self.ms(0, 1_500);
                        let wake = h.until + past;
                        tokio::time::sleep(wake.saturating_sub(now())).await;
                        self.write(&h.project, &r, WriteKind::AfterPause, 0).await;
                    } else {
                        // Write just before the lease runs out, through a slow sled.
                        let before = self.ms(20, 150);
                        let at = h.until.saturating_sub(before);
                        tokio::time::sleep(at.saturating_sub(now())).await;
                        let delay = self.rng.random_range(200..=1_200);
                        self.write(&h.project, &r, WriteKind::Late, delay).await;
                    }
                }
            }
            66..=75 => {
                let p = self.project();
                let body = format!(
                    "hello from {} at {}",
                    agent_name(self.key()),
                    now().as_millis()
                );
                self.tool(
                    Op::Send { project: p.clone() },
                    "send",
                    json!({ "project": p, "body": body }),
                )
                .await;
            }
            76..=87 => {
                let p = self.project();
                let timeout = Duration::from_secs(self.rng.random_range(1..=3));
                self.wait(&p, timeout).await;
            }
            88..=93 => {
                let p = self.project();
                self.inbox(&p).await;
            }
            _ => {
                let d = self.ms(50, 800);
                tokio::time::sleep(d).await;
            }
        }
    }

    async fn wait(&mut self, project: &str, timeout: Duration) {
        let op = Op::Wait {
            project: project.into(),
            timeout,
        };
        let answer = self
            .tool(
                op,
                "wait",
                json!({ "projects": [project], "timeout_s": timeout.as_secs() }),
            )
            .await;
        if let Answer::Ok(v) = &answer {
            let messages = v["reasons"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["kind"] == "message"));
            if v["woke"] == true && messages && self.rng.random_bool(0.7) {
                self.inbox(project).await;
            }
        }
    }

    async fn inbox(&mut self, project: &str) {
        self.tool(
            Op::Inbox {
                project: project.into(),
            },
            "inbox",
            json!({ "project": project }),
        )
        .await;
    }
}

impl Answer {
    /// What a request's result says, as the oracle judges it.
    fn of(result: Result<Value, ClientError>) -> Answer {
        match result {
            Ok(v) => {
                if let Some(e) = v.get("error") {
                    let kind = e["data"]["kind"].as_str().unwrap_or("").to_owned();
                    Answer::Rpc(kind, e.clone())
                } else if v["result"]["isError"] == true {
                    Answer::IsError(v["result"]["structuredContent"].clone())
                } else {
                    Answer::Ok(v["result"]["structuredContent"].clone())
                }
            }
            Err(ClientError::Timeout(_)) => Answer::TimedOut,
            Err(ClientError::Http { status, body }) => Answer::Failed {
                status: Some(status),
                why: body.chars().take(80).collect(),
            },
            Err(e) => Answer::Failed {
                status: None,
                why: e.to_string().chars().take(80).collect(),
            },
        }
    }

    fn is_acquired(&self) -> bool {
        matches!(self, Answer::Ok(v) if v["acquired"] == true)
    }

    fn ok_value(&self) -> Option<&Value> {
        match self {
            Answer::Ok(v) => Some(v),
            _ => None,
        }
    }

    fn rpc_kind(&self) -> Option<&str> {
        match self {
            Answer::Rpc(k, _) => Some(k),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The adversary.

/// The adversarial agent (adversary seeds): another client identity (its own token), on host
/// `client-<n>` after the `n` honest agents. It never claims under its own identity; at random
/// moments it releases, renews and writes resources honest agents hold (picked from what they
/// were granted lately), puts a fence of its own choosing in `_meta` on its writes (one far
/// above any granted, a small one, or the highest granted so far), and replays the handles
/// honest agents leaked (claim, renew, release, write; as the `agent` argument or in `_meta`,
/// with or without a session of its own). Every request is recorded with what it tried.
struct Adversary {
    client: usize,
    session: u32,
    /// Its session: its own identity's agent.
    mcp: Option<McpClient<TurmoilConnect>>,
    /// Calls without a session (handle replays).
    bare: Option<McpClient<TurmoilConnect>>,
    needs_init: bool,
    rng: ChaCha8Rng,
    next_id: u64,
    writes: u64,
    log: Arc<Log>,
    end: Duration,
}

/// The fences far above any the gateway grants, from which the adversary picks.
const FORGED_FENCE: u64 = 1 << 40;

impl Adversary {
    fn key(&self) -> AgentKey {
        (self.client, self.session)
    }

    async fn connect() -> Option<McpClient<TurmoilConnect>> {
        let mut mcp = McpClient::connect(TurmoilConnect, MCP_URL).await.ok()?;
        mcp.set_timeout(Some(CLIENT_TIMEOUT));
        mcp.set_bearer_token(Some(ADVERSARY_TOKEN.to_owned()));
        Some(mcp)
    }

    async fn run(&mut self) {
        while now() < self.end {
            if self.mcp.is_none() {
                self.mcp = Adversary::connect().await;
            }
            if self.bare.is_none() {
                self.bare = Adversary::connect().await;
            }
            if self.mcp.is_none() || self.bare.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            if self.needs_init {
                self.init().await;
                continue;
            }
            self.step().await;
            let pause = Duration::from_millis(self.rng.random_range(50..=400));
            tokio::time::sleep(pause).await;
        }
    }

    async fn init(&mut self) {
        let sent = now();
        let Some(mcp) = self.mcp.as_mut() else { return };
        let result = mcp.initialize().await;
        let session = self.session + 1;
        let answer = match &result {
            Ok(_) => Answer::Ok(json!({"session": session})),
            Err(ClientError::Timeout(_)) => Answer::TimedOut,
            Err(e) => Answer::Failed {
                status: None,
                why: e.to_string().chars().take(80).collect(),
            },
        };
        self.log.events.lock().expect("no poisoned lock").push(Ev {
            agent: (self.client, session),
            op: Op::Init,
            sent,
            done: now(),
            answer,
            adv: Some(Adv {
                as_agent: None,
                fence: None,
            }),
        });
        if result.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            return;
        }
        self.session = session;
        self.needs_init = false;
        for p in PROJECTS {
            let name = format!("adversary{}", self.session);
            let adv = Adv {
                as_agent: None,
                fence: None,
            };
            let params = json!({ "name": "checkin", "arguments": { "project": p, "name": name } });
            self.call(Op::Checkin { project: p.into() }, params, adv, false)
                .await;
        }
    }

    /// One request, on its session or without one; recorded with what it tried.
    async fn call(&mut self, op: Op, params: Value, adv: Adv, bare: bool) -> Answer {
        self.next_id += 1;
        let id = json!(self.next_id);
        let sent = now();
        let client = if bare {
            self.bare.as_mut()
        } else {
            self.mcp.as_mut()
        };
        let result = match client {
            Some(mcp) => mcp.request(id, "tools/call", params).await,
            None => Err(ClientError::Protocol("not connected".into())),
        };
        if !bare && matches!(result, Err(ClientError::Http { status: 404, .. })) {
            self.needs_init = true;
        }
        let answer = Answer::of(result);
        self.log.events.lock().expect("no poisoned lock").push(Ev {
            agent: self.key(),
            op,
            sent,
            done: now(),
            answer: answer.clone(),
            adv: Some(adv),
        });
        answer
    }

    /// A resource an honest agent (`of`, or any) was granted lately, else any.
    fn target(&mut self, of: Option<AgentKey>) -> (String, String) {
        let t = now();
        let recent: Vec<(String, String)> = {
            let events = self.log.events.lock().expect("no poisoned lock");
            events
                .iter()
                .filter(|e| e.adv.is_none() && of.is_none_or(|k| e.agent == k))
                .filter(|e| e.fresh_grant().is_some_and(|(_, exp)| e.done + exp > t))
                .filter_map(|e| e.op.resource())
                .map(|(p, r)| (p.to_owned(), r.to_owned()))
                .collect()
        };
        if !recent.is_empty() && self.rng.random_bool(0.85) {
            return recent[self.rng.random_range(0..recent.len())].clone();
        }
        let p = PROJECTS[self.rng.random_range(0..PROJECTS.len())].to_owned();
        let r = resource_of(&p, self.rng.random_range(1..=STORIES));
        (p, r)
    }

    /// A fence of its own choosing.
    fn forged_fence(&mut self) -> u64 {
        match self.rng.random_range(0..3) {
            0 => FORGED_FENCE + self.rng.random_range(0..1_000),
            1 => self.rng.random_range(1..=30),
            _ => {
                let events = self.log.events.lock().expect("no poisoned lock");
                let top = events
                    .iter()
                    .filter_map(|e| e.fresh_grant().map(|(f, _)| f))
                    .max()
                    .unwrap_or(1);
                top + u64::from(self.rng.random_bool(0.5))
            }
        }
    }

    async fn write(&mut self, project: &str, resource: &str, handle: Option<(AgentKey, String)>) {
        self.writes += 1;
        let n = nonce(self.key(), self.writes, 0);
        let fence = self.rng.random_bool(0.7).then(|| self.forged_fence());
        let mut meta = json!({ NONCE_KEY: n });
        if let Some(f) = fence {
            meta[FENCE_META] = json!({ "resource": resource, "fence": f });
        }
        if let Some((_, h)) = &handle {
            meta[AGENT_META] = json!(h);
        }
        let params = json!({
            "name": "move_story",
            "arguments": { "project": project, "story_id": story_of(resource), "stage": "done" },
            "_meta": meta,
        });
        let op = Op::Write {
            project: project.into(),
            resource: resource.into(),
            nonce: n,
            kind: WriteKind::Unheld,
        };
        let adv = Adv {
            as_agent: handle.as_ref().map(|(k, _)| *k),
            fence,
        };
        let bare = handle.is_some() && self.rng.random_bool(0.6);
        self.call(op, params, adv, bare).await;
    }

    async fn step(&mut self) {
        let leaked = {
            let leaked = self.log.leaked.lock().expect("no poisoned lock");
            // The handles leaked lately (the older ones are likely gone with a restart).
            let recent = &leaked[leaked.len().saturating_sub(4)..];
            (!recent.is_empty()).then(|| recent[self.rng.random_range(0..recent.len())].clone())
        };
        let roll = self.rng.random_range(0..100);
        let handle = leaked.filter(|_| roll >= 55);
        let (p, r) = self.target(handle.as_ref().map(|(k, _)| *k));
        let adv = Adv {
            as_agent: handle.as_ref().map(|(k, _)| *k),
            fence: None,
        };
        let mut arguments = json!({ "project": p, "resource": r });
        if let Some((_, h)) = &handle {
            arguments["agent"] = json!(h);
        }
        let bare = handle.is_some() && self.rng.random_bool(0.6);
        // 0 release, 1 renew, 2 claim (only as another agent), 3 write.
        let what = match (&handle, roll) {
            (Some(_), _) => self.rng.random_range(0..4),
            (None, 0..=14) => 0,
            (None, 15..=29) => 1,
            (None, _) => 3,
        };
        match what {
            0 => {
                let op = Op::Release {
                    project: p.clone(),
                    resource: r.clone(),
                };
                let params = json!({ "name": "release", "arguments": arguments });
                self.call(op, params, adv, bare).await;
            }
            1 => {
                let ttl = Duration::from_secs(self.rng.random_range(2..=10));
                arguments["ttl_s"] = json!(ttl.as_secs());
                let op = Op::Renew {
                    project: p.clone(),
                    resource: r.clone(),
                    ttl,
                };
                let params = json!({ "name": "renew", "arguments": arguments });
                self.call(op, params, adv, bare).await;
            }
            2 => {
                let ttl = Duration::from_secs(self.rng.random_range(2..=10));
                arguments["ttl_s"] = json!(ttl.as_secs());
                let op = Op::Claim {
                    project: p.clone(),
                    resource: r.clone(),
                    ttl,
                };
                let params = json!({ "name": "claim", "arguments": arguments });
                self.call(op, params, adv, bare).await;
            }
            _ => self.write(&p, &r, handle).await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

fn server_options(s: &CoordScenario, incarnation: u64) -> ServerOptions {
    let specs = PROJECTS
        .iter()
        .map(|p| {
            let mut spec = ProjectSpec::new(*p, format!("http://sled-{p}:9000"));
            spec.call_timeout = CALL_TIMEOUT;
            spec.token = Some(super::uplink_token(p));
            spec
        })
        .collect();
    let registry = if s.adversary {
        let text = adversary_projects_toml();
        Registry::parse("projects.toml", &text)
            .unwrap_or_else(|e| panic!("a valid sim registry: {e}\n{text}"))
    } else {
        Registry::from_projects(specs, Some(PROJECTS[0])).expect("a valid sim registry")
    };
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&s.seed.to_le_bytes());
    // A restarted gateway draws other session ids, as a real one (seeded from the OS) would.
    bytes[8..16].copy_from_slice(&incarnation.to_le_bytes());
    bytes[16] = 0xc0;
    let mut opts = ServerOptions::new(registry, bytes);
    opts.prober = Arc::new(gateway_server::HttpProber(TurmoilConnect));
    opts.pin_file = None;
    opts.core = Config {
        heartbeat_interval: HEARTBEAT_INTERVAL,
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        hello_timeout: Duration::from_secs(2),
        refresh_timeout: CALL_TIMEOUT,
        probe_interval: Duration::ZERO,
        coordination: Limits {
            planted: s.planted,
            ..Limits::default()
        },
        listing_hold: LISTING_HOLD,
        planted: s.gateway_bug,
        ..Config::default()
    };
    opts
}

/// The registry of an adversary seed: the same projects, and two client tokens (the honest
/// agents' and the adversary's, two identities), both with write rights everywhere.
fn adversary_projects_toml() -> String {
    let mut text = format!(
        "default = \"{}\"\ncall_timeout_ms = {}\nclient_tokens = [\n  {{ name = \"honest\", token = \"{HONEST_TOKEN}\" }},\n  {{ name = \"adversary\", token = \"{ADVERSARY_TOKEN}\" }},\n]\n",
        PROJECTS[0],
        CALL_TIMEOUT.as_millis()
    );
    for p in PROJECTS {
        text.push_str(&format!(
            "\n[[project]]\nname = \"{p}\"\nurl = \"http://sled-{p}:9000\"\ntoken = \"{}\"\n",
            super::uplink_token(p).expose()
        ));
    }
    for who in ["honest", "adversary"] {
        text.push_str(&format!(
            "\n[[access]]\ntoken = \"{who}\"\nprojects = [\"*\"]\nright = \"write\"\n"
        ));
    }
    text
}

/// A story sled for `project` with [`STORIES`] stories in the backlog.
fn story_sled(project: &str, seed: u64) -> SharedSled {
    let sled = SharedSled::new(Sled::new(
        Project::new(project),
        format!("{project}-sled"),
        seed,
    ));
    for i in 1..=STORIES {
        let made = sled.with(|s| {
            s.call_tool(
                "create_story",
                Some(&json!({"name": format!("story {i}"), "acceptance_criteria": ["done"]})),
            )
        });
        let id = made.expect("create_story is a tool")["structuredContent"]["story"]["id"].clone();
        assert_eq!(
            id,
            json!(format!("{project}-{i}")),
            "story ids are numbered"
        );
    }
    sled
}

pub fn run_coord(s: &CoordScenario) -> CoordReport {
    super::init_logging();
    let started = std::time::Instant::now();
    let log = Arc::new(Log::default());
    let sleds: Vec<SharedSled> = PROJECTS
        .iter()
        .enumerate()
        .map(|(i, p)| story_sled(p, s.seed ^ (i as u64 + 1)))
        .collect();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| simulate(s, &sleds, &log)));
    let mut violations = std::mem::take(&mut *log.violations.lock().expect("no poisoned lock"));
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
    let events = std::mem::take(&mut *log.events.lock().expect("no poisoned lock"));
    let applied = std::mem::take(&mut *log.applied.lock().expect("no poisoned lock"));
    let sled_requests = std::mem::take(&mut *log.sled_requests.lock().expect("no poisoned lock"));
    let listings = std::mem::take(&mut *log.listings.lock().expect("no poisoned lock"));
    let mut coverage = BTreeMap::new();
    violations.extend(judge(
        s,
        &events,
        &applied,
        &sled_requests,
        &listings,
        &mut coverage,
    ));
    let mut trace: Vec<String> = events.iter().map(Ev::line).collect();
    for a in &applied {
        trace.push(format!(
            "{:>6} ms sled {} {} fence {:?} {} -> {}",
            a.at.as_millis(),
            a.project,
            a.resource,
            a.fence,
            a.nonce,
            a.outcome
        ));
    }
    for sled in &sleds {
        trace.push(format!(
            "final {}: high water {:?}, {:?}",
            sled.project_name(),
            sled.fence_high_water(),
            sled.with(|s| s
                .project()
                .iter()
                .map(|st| (st.id.clone(), st.stage))
                .collect::<Vec<_>>())
        ));
    }
    let hash = super::trace_hash(&trace, sim_time);
    CoordReport {
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

/// What the fault driver does to the simulation at one instant.
type FaultAction = Box<dyn FnOnce(&mut turmoil::Sim<'_>)>;

fn simulate(s: &CoordScenario, sleds: &[SharedSled], log: &Arc<Log>) -> SimResult {
    let mut sim = turmoil::Builder::new()
        .rng_seed(s.seed)
        .simulation_duration(s.run_for + Duration::from_secs(40))
        .min_message_latency(s.net_latency_min)
        .max_message_latency(s.net_latency_max)
        .build();

    let scenario = s.clone();
    let incarnation = Arc::new(AtomicU64::new(0));
    sim.host("gateway", move || {
        let n = incarnation.fetch_add(1, Ordering::Relaxed);
        let opts = server_options(&scenario, n);
        async move {
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?;
            gateway_server::serve(TurmoilListener(listener), opts, std::future::pending()).await?;
            Ok(())
        }
    });

    for (i, sled) in sleds.iter().enumerate() {
        let handler = Arc::new(CoordSled {
            sled: sled.clone(),
            project: PROJECTS[i].to_owned(),
            log: log.clone(),
            listing_delay: s.listing_delay,
        });
        let opts = UplinkOptions {
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            seed: s.seed ^ (i as u64 + 1),
            sled_name: format!("{}-sled", PROJECTS[i]),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
            token: Some(super::uplink_token(PROJECTS[i])),
            identity: None,
            relay_interval: Duration::ZERO,
            stall_relay: false,
            tls: Default::default(),
            // Shutdown in the simulation is a crash or a stop at once; a drain is tested on its own.
            drain: None,
        };
        sim.host(format!("sled-{}", PROJECTS[i]), move || {
            let backend = Backend::Handler(handler.clone());
            let opts = opts.clone();
            Box::pin(super::sled_host(backend, opts))
                as std::pin::Pin<Box<dyn std::future::Future<Output = turmoil::Result>>>
        });
    }

    for c in 0..s.clients {
        let log = log.clone();
        let seed = s.seed;
        let end = s.run_for;
        let exact = s.exact_latency();
        let adversary = s.adversary;
        let array_writes = s.array_writes;
        sim.client(format!("client-{c}"), async move {
            // Each agent starts a little apart.
            tokio::time::sleep(Duration::from_millis(20 * c as u64)).await;
            let mut agent = Agent {
                client: c,
                session: 0,
                mcp: None,
                rng: ChaCha8Rng::seed_from_u64(seed ^ (0xa9e7_0000 + c as u64)),
                next_id: 0,
                writes: 0,
                log,
                held: BTreeMap::new(),
                needs_init: true,
                end,
                exact,
                token: adversary.then(|| HONEST_TOKEN.to_owned()),
                sessionless: adversary && c % 2 == 0,
                handle: None,
                array_writes,
            };
            agent.run().await;
            Ok(())
        });
    }

    if s.adversary {
        let log = log.clone();
        let (seed, end, client) = (s.seed, s.run_for, s.clients);
        sim.client(format!("client-{client}"), async move {
            // It starts once the honest agents have checked in.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut adversary = Adversary {
                client,
                session: 0,
                mcp: None,
                bare: None,
                needs_init: true,
                rng: ChaCha8Rng::seed_from_u64(seed ^ 0xad5e_0000_0000_0003),
                next_id: 0,
                writes: 0,
                log,
                end,
            };
            adversary.run().await;
            Ok(())
        });
    }

    // The fault schedule: (instant, order, action); ends before starts at one instant.
    let mut actions: Vec<(Duration, u8, FaultAction)> = Vec::new();
    for f in &s.faults {
        match f.clone() {
            CoordFault::Partition { client, at, until } => {
                let host = format!("client-{client}");
                let h2 = host.clone();
                actions.push((at, 1, Box::new(move |sim| sim.partition("gateway", host))));
                actions.push((until, 0, Box::new(move |sim| sim.repair("gateway", h2))));
            }
            CoordFault::SledBounce {
                sled,
                at,
                until,
                power_off,
            } => {
                let host = format!("sled-{}", PROJECTS[sled]);
                let h2 = host.clone();
                actions.push((
                    at,
                    1,
                    Box::new(move |sim| {
                        if power_off {
                            sim.partition("gateway", host.as_str());
                        }
                        sim.crash(host);
                    }),
                ));
                actions.push((
                    until,
                    0,
                    Box::new(move |sim| {
                        if power_off {
                            sim.repair("gateway", h2.as_str());
                        }
                        sim.bounce(h2);
                    }),
                ));
            }
            CoordFault::GatewayBounce { at, until } => {
                // Power loss: cut every link first, so that nobody hears the sockets close.
                // (A plain crash makes the peers' FINs depend on the order the runtime drops
                // its sockets, which is not the same from run to run in one process.)
                let mut peers: Vec<String> = PROJECTS.iter().map(|p| format!("sled-{p}")).collect();
                let clients = s.clients + usize::from(s.adversary);
                peers.extend((0..clients).map(|c| format!("client-{c}")));
                let p2 = peers.clone();
                actions.push((
                    at,
                    1,
                    Box::new(move |sim| {
                        for p in &peers {
                            sim.partition("gateway", p.as_str());
                        }
                        sim.crash("gateway");
                    }),
                ));
                actions.push((
                    until,
                    0,
                    Box::new(move |sim| {
                        for p in &p2 {
                            sim.repair("gateway", p.as_str());
                        }
                        sim.bounce("gateway");
                    }),
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

/// Whether a request sent at `sent` certainly reached the gateway before `project`'s sled
/// listed its tools to it, in a gateway incarnation that had not seen that listing yet.
fn sent_before_listing(
    s: &CoordScenario,
    project: &str,
    sent: Duration,
    listings: &[(String, Duration)],
) -> bool {
    let up = s
        .gateway_bounces()
        .iter()
        .filter(|(at, _)| *at < sent)
        .map(|(_, until)| *until)
        .max()
        .unwrap_or_default();
    let arrived = sent + s.net_latency_max + FAULT_SLACK;
    let mine = || listings.iter().filter(|(p, at)| p == project && *at > up);
    mine().all(|(_, at)| *at > arrived) && mine().any(|_| true)
}

/// Why a `tools_pending` answer to `e` is wrong, if it is. It is right only for a write that
/// waited the whole [`LISTING_HOLD`] in the gateway for a listing of its project's tools that
/// did not come: so not for any other request, not for one answered sooner, and not when the
/// project's sled certainly delivered a listing to the same gateway incarnation before the
/// hold ended.
fn tools_pending_wrong(
    s: &CoordScenario,
    e: &Ev,
    listings: &[(String, Duration)],
) -> Option<String> {
    let Op::Write { project, .. } = &e.op else {
        return Some("only writes wait for a listing".into());
    };
    if e.done < e.sent + LISTING_HOLD {
        return Some(format!(
            "it was answered after {:?}, before the {LISTING_HOLD:?} hold ended",
            e.done - e.sent
        ));
    }
    let sled = PROJECTS.iter().position(|p| p == project)?;
    let (lat_min, lat_max) = (s.net_latency_min, s.net_latency_max);
    // The hold ended no sooner than this; a listing that surely reached the gateway before it
    // released the write.
    let hold_end = e.sent + lat_min + LISTING_HOLD;
    // The gateway incarnation that held the write came up here: a listing answered before
    // it (to a gateway then down, or an older one) was not delivered to it.
    let up = s
        .gateway_bounces()
        .iter()
        .filter(|(crash, _)| *crash <= e.sent + FAULT_SLACK)
        .map(|(_, until)| *until)
        .max()
        .unwrap_or_default();
    let delivered = |at: Duration| {
        if at <= up + FAULT_SLACK {
            return false;
        }
        let reached = at + lat_max + FAULT_SLACK;
        let sled_down = s.faults.iter().any(|f| match f {
            CoordFault::SledBounce {
                sled: b,
                at: down,
                until,
                ..
            } => *b == sled && *down <= reached && *until + FAULT_SLACK >= at,
            _ => false,
        });
        !sled_down && !s.restart_between(at.saturating_sub(lat_max), e.done)
    };
    listings
        .iter()
        .find(|(p, at)| p == project && *at + lat_max + FAULT_SLACK < hold_end && delivered(*at))
        .map(|(_, at)| format!("the {project} sled listed its tools to this gateway at {at:?}"))
}

/// A fresh grant and how long its holder certainly held it.
#[derive(Debug, Clone)]
struct Holding {
    agent: AgentKey,
    project: String,
    resource: String,
    fence: u64,
    sent: Duration,
    got: Duration,
    /// Until when the holder certainly held it (renewals included, a release's send and a
    /// gateway restart excluded).
    certain_until: Duration,
}

/// Until when an agent may have held a resource, after a request that may have granted or
/// extended its lease.
#[derive(Debug, Clone, Copy)]
struct Maybe {
    until: Duration,
}

fn judge(
    s: &CoordScenario,
    events: &[Ev],
    applied: &[Applied],
    sled_requests: &[(String, Duration)],
    listings: &[(String, Duration)],
    coverage: &mut BTreeMap<String, usize>,
) -> Vec<String> {
    let mut out = Vec::new();
    // The honest agents' requests, and the adversary's (judged apart, in 8).
    let all = events;
    let (adv_events, events): (Vec<&Ev>, Vec<&Ev>) = all.iter().partition(|e| e.adv.is_some());
    // No message arrives sooner: a request is processed in [sent + lat, done - lat].
    let lat = s.net_latency_min;
    let mut cover = |k: &str| *coverage.entry(k.to_owned()).or_insert(0) += 1;
    for f in &s.faults {
        cover(match f {
            CoordFault::Partition { .. } => "fault partition",
            CoordFault::SledBounce { .. } => "fault sled bounce",
            CoordFault::GatewayBounce { .. } => "fault gateway bounce",
        });
    }
    // One call may write several resources (`move_stories`): its nonce names each.
    let by_nonce: BTreeMap<(&str, &str), &Applied> = applied
        .iter()
        .map(|a| ((a.nonce.as_str(), a.resource.as_str()), a))
        .collect();

    // A write whose nonce names more than one resource named them in one call.
    let mut per_nonce: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &events {
        if let Op::Write { nonce, .. } = &e.op {
            *per_nonce.entry(nonce.as_str()).or_default() += 1;
        }
    }
    for e in &events {
        if let Op::Write { nonce, .. } = &e.op {
            if per_nonce.get(nonce.as_str()) > Some(&1) {
                match &e.answer {
                    Answer::Ok(_) => cover("array write ok"),
                    Answer::Rpc(k, _) => cover(&format!("array write {k}")),
                    Answer::IsError(v) => cover(&format!(
                        "array write {}",
                        v["kind"].as_str().unwrap_or("isError")
                    )),
                    _ => {}
                }
            }
        }
    }

    // Each agent's events, in order.
    let mut by_agent: BTreeMap<AgentKey, Vec<&Ev>> = BTreeMap::new();
    for &e in &events {
        by_agent.entry(e.agent).or_default().push(e);
        match (&e.op, &e.answer) {
            (Op::Init, Answer::Ok(_)) if e.agent.1 > 1 => cover("re-initialized"),
            (Op::Claim { .. }, Answer::Ok(v)) if v["acquired"] == false => cover("claim refused"),
            (Op::Claim { .. }, Answer::Ok(v)) if v["reentrant"] == true => {
                cover("claim re-entrant")
            }
            (Op::Claim { .. }, Answer::Ok(_)) => cover("claim granted"),
            (Op::Write { .. }, Answer::Rpc(k, _)) => cover(&format!("write {k}")),
            (Op::Write { .. }, Answer::IsError(v)) => cover(&format!(
                "write {}",
                v["kind"].as_str().unwrap_or("isError")
            )),
            (Op::Write { project, .. }, Answer::Ok(_))
                if sent_before_listing(s, project, e.sent, listings) =>
            {
                cover("write before its listing ok")
            }
            (Op::Write { kind, .. }, Answer::Ok(_)) => cover(&format!("write {kind:?} ok")),
            (Op::Wait { .. }, Answer::Ok(v)) if v["woke"] == true => cover("wait woke"),
            (Op::Wait { .. }, Answer::Ok(_)) => cover("wait timed out"),
            (Op::Renew { .. }, Answer::Ok(_)) => cover("renew ok"),
            (Op::Release { .. }, Answer::Ok(_)) => cover("release ok"),
            (Op::Renew { .. } | Op::Release { .. }, Answer::Rpc(k, _)) => {
                cover(&format!("renew/release {k}"))
            }
            (_, Answer::TimedOut) => cover("timed out"),
            (_, Answer::Failed { .. }) => cover("failed"),
            _ => {}
        }
    }

    // Holdings (certain) and when each agent may have held each resource.
    let mut holdings: Vec<Holding> = Vec::new();
    let mut maybes: BTreeMap<(AgentKey, String, String), Vec<(usize, Maybe)>> = BTreeMap::new();
    for (agent, evs) in &by_agent {
        for (i, e) in evs.iter().enumerate() {
            let Some((project, resource)) = e.op.resource() else {
                continue;
            };
            // A request that may have granted or extended a lease.
            let ttl = match &e.op {
                Op::Claim { ttl, .. } | Op::Renew { ttl, .. } => Some(*ttl),
                _ => None,
            };
            if let Some(ttl) = ttl {
                // Processed at least one latency before its answer came back.
                let until = match (&e.answer, e.fresh_grant(), e.extension()) {
                    (_, Some((_, exp)), _) | (_, _, Some(exp)) => {
                        Some(e.done.saturating_sub(lat) + exp)
                    }
                    (Answer::TimedOut | Answer::Failed { .. }, _, _) => {
                        Some(e.sent + CLIENT_TIMEOUT + ttl)
                    }
                    _ => None,
                };
                if let Some(mut until) = until {
                    // A gateway restart ends every lease.
                    for (at, _) in s.gateway_bounces() {
                        if at + FAULT_SLACK >= e.sent {
                            until = until.min(at + FAULT_SLACK);
                        }
                    }
                    maybes
                        .entry((*agent, project.to_owned(), resource.to_owned()))
                        .or_default()
                        .push((i, Maybe { until }));
                }
            }
            // A successful release ends what came before it.
            if matches!(e.op, Op::Release { .. }) && e.ok().is_some() {
                if let Some(ms) = maybes.get_mut(&(*agent, project.to_owned(), resource.to_owned()))
                {
                    for (_, m) in ms.iter_mut() {
                        m.until = m.until.min(e.done);
                    }
                }
            }
            let Some((fence, exp)) = e.fresh_grant() else {
                continue;
            };
            let mut certain = e.sent + exp;
            for later in &evs[i + 1..] {
                if later.op.resource() != Some((project, resource)) {
                    continue;
                }
                if later.fresh_grant().is_some() || matches!(later.op, Op::Release { .. }) {
                    if matches!(later.op, Op::Release { .. }) {
                        certain = certain.min(later.sent);
                    }
                    break;
                }
                if let Some(exp) = later.extension() {
                    // A renewal sets the expiry afresh (it may shorten it); it proves the
                    // lease was held until it was processed.
                    certain = later.sent + exp;
                } else if let (
                    Op::Renew { ttl, .. } | Op::Claim { ttl, .. },
                    Answer::TimedOut | Answer::Failed { .. },
                ) = (&later.op, &later.answer)
                {
                    // One whose outcome is unknown may have been processed: then it set the
                    // expiry afresh too, to `ttl` after some instant from its sending on, which
                    // may be sooner than the last known expiry (DST_SEED=4251410335 of
                    // coord_listing_window_sweep: a 5 s renew lost in a partition shortened a
                    // 9 s lease, and another agent was rightly granted it after).
                    certain = certain.min(later.sent + *ttl);
                }
                if matches!(later.rpc_kind(), Some("not_holder" | "no_lease")) {
                    // With an adversary about: what an agent certainly holds stays its own,
                    // its renewals and releases succeed.
                    if s.adversary
                        && later.done.saturating_sub(lat) < certain
                        && !s.restart_between(e.sent, later.done)
                    {
                        out.push(format!(
                            "{}'s {:?} sent at {:?} was refused {:?} though it certainly held {resource} (fence {fence}, granted at {:?}) until at least {certain:?}",
                            agent_name(*agent), later.op, later.sent, later.rpc_kind(), e.done
                        ));
                    }
                    break;
                }
            }
            for (at, _) in s.gateway_bounces() {
                if at + FAULT_SLACK >= e.sent {
                    certain = certain.min(at.saturating_sub(FAULT_SLACK));
                }
            }
            holdings.push(Holding {
                agent: *agent,
                project: project.to_owned(),
                resource: resource.to_owned(),
                fence,
                sent: e.sent,
                got: e.done,
                certain_until: certain,
            });
        }
    }
    let may_hold = |agent: AgentKey, project: &str, resource: &str, before: usize, t: Duration| {
        maybes
            .get(&(agent, project.to_owned(), resource.to_owned()))
            .is_some_and(|ms| ms.iter().any(|(i, m)| *i < before && m.until > t))
    };

    // 1. The sled: fences per resource never go back; one fence, one agent.
    let mut last: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut fence_agents: BTreeMap<(&str, &str, u64), BTreeSet<AgentKey>> = BTreeMap::new();
    for a in applied.iter().filter(|a| a.outcome == "applied") {
        cover(if a.fence.is_some() {
            "sled applied fenced"
        } else {
            "sled applied unfenced"
        });
        let Some(f) = a.fence else { continue };
        let key = (a.project.as_str(), a.resource.as_str());
        if let Some(prev) = last.get(&key).filter(|p| f < **p) {
            out.push(format!(
                "the {} sled applied {} under fence {f} at {:?} after fence {prev}",
                a.project, a.resource, a.at
            ));
        }
        last.insert(key, f.max(last.get(&key).copied().unwrap_or(0)));
        if let Some(agent) = a.agent() {
            let set = fence_agents.entry((key.0, key.1, f)).or_default();
            set.insert(agent);
            if set.len() == 2 {
                out.push(format!(
                    "the {} sled applied writes to {} of two agents under one fence {f}: {:?} (the second at {:?})",
                    a.project,
                    a.resource,
                    set.iter().map(|a| agent_name(*a)).collect::<Vec<_>>(),
                    a.at
                ));
            }
        }
    }
    for a in applied.iter().filter(|a| a.outcome == "stale_fence") {
        let _ = a;
        cover("sled refused stale");
    }

    // 2. Fences grow.
    let mut grants: Vec<&Holding> = holdings.iter().collect();
    grants.sort_by_key(|h| (h.got, h.sent));
    for y in &grants {
        // The highest fence granted before this claim was sent, by the same gateway.
        let before = grants
            .iter()
            .filter(|x| {
                x.project == y.project
                    && x.got < y.sent
                    && !std::ptr::eq(**x, *y)
                    && !s.restart_between(x.sent, y.got)
            })
            .max_by_key(|x| (x.fence, x.got));
        if let Some(x) = before.filter(|x| y.fence <= x.fence) {
            out.push(format!(
                "fence {} granted to {} for {} (claim sent at {:?}) is not above fence {} granted to {} for {} (answered at {:?}) by the same gateway",
                y.fence, agent_name(y.agent), y.resource, y.sent,
                x.fence, agent_name(x.agent), x.resource, x.got
            ));
        }
        // After a restart, above every fence the sled accepted before it, once the sled has
        // certainly said hello to the new gateway (a request from it reached the sled).
        let restarts: Vec<(Duration, Duration)> = s
            .gateway_bounces()
            .into_iter()
            .filter(|(at, _)| *at < y.sent)
            .collect();
        if let Some(&(crash, up)) = restarts.last() {
            let hello_done = sled_requests
                .iter()
                .find(|(p, t)| *p == y.project && *t > up)
                .map(|(_, t)| *t);
            if hello_done.is_some_and(|h| h < y.sent) && !s.restart_between(y.sent, y.got) {
                let floor = applied
                    .iter()
                    .filter(|a| a.project == y.project && a.at < crash && a.outcome == "applied")
                    .filter_map(|a| a.fence)
                    .max();
                if let Some(floor) = floor.filter(|f| y.fence <= *f) {
                    out.push(format!(
                        "fence {} granted to {} for {} at {:?}, after the gateway restart at {crash:?}, is not above fence {floor} that the {} sled accepted before it",
                        y.fence, agent_name(y.agent), y.resource, y.got, y.project
                    ));
                }
            }
        }
    }

    // 3. At most one holder.
    for h in &holdings {
        for y in &holdings {
            if y.agent == h.agent || y.project != h.project || y.resource != h.resource {
                continue;
            }
            if y.sent >= h.got && y.got < h.certain_until && !s.restart_between(h.sent, y.got) {
                out.push(format!(
                    "{} was granted {} (fence {}, answered at {:?}) while {} certainly held it (fence {}, granted by {:?}, held until at least {:?})",
                    agent_name(y.agent), y.resource, y.fence, y.got,
                    agent_name(h.agent), h.fence, h.got, h.certain_until
                ));
            }
        }
    }

    // 4. Writes: checked while a holder certainly held the lease; applied with a fence by an
    // agent that could not hold it.
    for (agent, evs) in &by_agent {
        for (i, e) in evs.iter().enumerate() {
            let Op::Write {
                project,
                resource,
                nonce,
                kind,
            } = &e.op
            else {
                continue;
            };
            let at_sled = by_nonce.get(&(nonce.as_str(), resource.as_str())).copied();
            // The gateway checked the write at some instant in [sent, checked_by].
            let checked_by = at_sled.map_or(e.done, |a| a.at.min(e.done));
            for h in holdings
                .iter()
                .filter(|h| &h.project == project && &h.resource == resource)
            {
                if !(e.sent >= h.got
                    && checked_by < h.certain_until
                    && !s.restart_between(h.sent, checked_by))
                {
                    continue;
                }
                if h.agent == *agent {
                    // The refusal names the resource it is about (a call may name several).
                    let about_this = |v: &Value| v["resource"] == json!(resource);
                    if e.rpc_kind() == Some("lease_held")
                        && matches!(&e.answer, Answer::Rpc(_, err) if about_this(&err["data"]))
                    {
                        out.push(format!(
                            "{}'s write to {resource} at {:?} was refused as lease_held while it certainly held the lease (fence {})",
                            agent_name(*agent), e.sent, h.fence
                        ));
                    }
                    let others_granted = holdings.iter().any(|o| {
                        o.agent != h.agent
                            && o.project == h.project
                            && o.resource == h.resource
                            && o.got >= h.sent
                            && o.got <= e.done
                    });
                    if e.is_error_kind() == Some("stale_fence")
                        && matches!(&e.answer, Answer::IsError(v) if about_this(v))
                        && !others_granted
                    {
                        out.push(format!(
                            "{}'s write to {resource} at {:?}, while it certainly held the lease (fence {}), was refused as stale by the sled though nobody else was granted it: {:?}",
                            agent_name(*agent), e.sent, h.fence, e.answer
                        ));
                    }
                    if let Some(a) = at_sled.filter(|a| a.outcome == "applied") {
                        if a.fence.is_none_or(|f| f < h.fence) {
                            out.push(format!(
                                "{}'s write to {resource} at {:?}, while it certainly held the lease (fence {}), reached the sled with fence {:?}",
                                agent_name(*agent), e.sent, h.fence, a.fence
                            ));
                        }
                    }
                } else if let Some(a) = at_sled.filter(|a| a.outcome == "applied") {
                    out.push(format!(
                        "{}'s write to {resource} (sent at {:?}, fence {:?}) was applied at {:?} while {} certainly held the lease (fence {}, until at least {:?})",
                        agent_name(*agent), e.sent, a.fence, a.at, agent_name(h.agent), h.fence, h.certain_until
                    ));
                }
            }
            if let Some(a) = at_sled {
                if a.outcome == "fence_mismatch" {
                    out.push(format!(
                        "{}'s write to {resource} reached the sled with a fence for another resource",
                        agent_name(*agent)
                    ));
                }
                if a.fence.is_some() && !may_hold(*agent, project, resource, i, e.sent + lat) {
                    out.push(format!(
                        "{}'s {kind:?} write to {resource} (sent at {:?}) reached the sled with fence {:?} though the agent could not hold the lease then",
                        agent_name(*agent), e.sent, a.fence
                    ));
                }
            }
        }
    }

    // 5. No success-shaped no-op: a renew or release that succeeds comes from a possible
    // holder.
    for (agent, evs) in &by_agent {
        for (i, e) in evs.iter().enumerate() {
            let (Op::Renew {
                project, resource, ..
            }
            | Op::Release { project, resource }) = &e.op
            else {
                continue;
            };
            if e.ok().is_some() && !may_hold(*agent, project, resource, i, e.sent + lat) {
                out.push(format!(
                    "{}'s {:?} at {:?} succeeded though the agent could not hold {resource} then: {:?}",
                    agent_name(*agent),
                    e.op,
                    e.sent,
                    e.answer
                ));
            }
        }
    }

    // 6. Answers: within the timeouts, errors only of the kinds faults explain.
    let partitioned = |client: usize, a: Duration, b: Duration| {
        s.faults.iter().any(|f| match f {
            CoordFault::Partition {
                client: c,
                at,
                until,
            } => *c == client && *at <= b + FAULT_SLACK && *until + FAULT_SLACK >= a,
            _ => false,
        })
    };
    let gateway_down = |a: Duration, b: Duration| {
        s.gateway_bounces()
            .iter()
            .any(|(at, until)| *at <= b + FAULT_SLACK && *until + FAULT_SLACK >= a)
    };
    for e in all {
        let client = e.agent.0;
        match &e.answer {
            Answer::TimedOut => {
                if !partitioned(client, e.sent, e.done) && !gateway_down(e.sent, e.done) {
                    out.push(format!(
                        "{}'s {:?} sent at {:?} got no answer within {CLIENT_TIMEOUT:?}, with no partition or gateway crash",
                        agent_name(e.agent), e.op, e.sent
                    ));
                }
            }
            Answer::Failed { status, why } => {
                let explained = match status {
                    Some(404) => s.gateway_bounces().iter().any(|(at, _)| *at <= e.sent),
                    Some(_) => false,
                    // A connection to a gateway that crashed while the client could not hear
                    // it (partitioned, or idle) fails at its next use.
                    None => {
                        partitioned(client, e.sent, e.done)
                            || s.gateway_bounces().iter().any(|(at, _)| *at <= e.done)
                    }
                };
                if !explained {
                    out.push(format!(
                        "{}'s {:?} sent at {:?} failed ({status:?} {why}) with no fault to explain it",
                        agent_name(e.agent),
                        e.op,
                        e.sent
                    ));
                }
            }
            // The adversary's refusals are judged in 8.
            _ if e.adv.is_some() => {}
            // A sessionless agent's handle is gone with a gateway restart.
            Answer::Rpc(kind, _)
                if kind == "unknown_agent"
                    && s.adversary
                    && client % 2 == 0
                    && s.gateway_bounces().iter().any(|(at, _)| *at <= e.done) => {}
            Answer::Rpc(kind, err) if kind == "tools_pending" => {
                if let Some(why) = tools_pending_wrong(s, e, listings) {
                    out.push(format!(
                        "{}'s {:?} sent at {:?} was refused tools_pending at {:?}, though {why}: {err}",
                        agent_name(e.agent),
                        e.op,
                        e.sent,
                        e.done
                    ));
                }
            }
            Answer::Rpc(kind, err) => {
                let fine = match &e.op {
                    Op::Write { .. } => matches!(
                        kind.as_str(),
                        "lease_held" | "sled_not_connected" | "uplink_lost" | "timeout"
                    ),
                    Op::Renew { .. } | Op::Release { .. } => {
                        matches!(kind.as_str(), "not_holder" | "no_lease")
                    }
                    _ => false,
                };
                if !fine {
                    out.push(format!(
                        "{}'s {:?} sent at {:?} got an unexpected error: {err}",
                        agent_name(e.agent),
                        e.op,
                        e.sent
                    ));
                }
            }
            Answer::IsError(v) => {
                if !matches!(e.op, Op::Write { .. }) || v["kind"] != "stale_fence" {
                    out.push(format!(
                        "{}'s {:?} sent at {:?} got an unexpected isError result: {v}",
                        agent_name(e.agent),
                        e.op,
                        e.sent
                    ));
                }
            }
            Answer::Ok(_) => {}
        }
        if let (Op::Wait { timeout, .. }, true) = (&e.op, e.answered()) {
            if e.done > e.sent + *timeout + WAIT_SLACK {
                out.push(format!(
                    "{}'s wait sent at {:?} with a {timeout:?} timeout was answered only at {:?}",
                    agent_name(e.agent),
                    e.sent,
                    e.done
                ));
            }
        }
    }

    // 7. No lost wakeup: a channel message acknowledged before a wait was sent, by an agent
    // that has not read since, wakes it at once.
    for (agent, evs) in &by_agent {
        for (i, w) in evs.iter().enumerate() {
            let (Op::Wait { project, .. }, Some(v)) = (&w.op, w.ok()) else {
                continue;
            };
            if v["woke"] == true {
                continue;
            }
            let missed = events.iter().find(|m| {
                let Op::Send { project: p } = &m.op else {
                    return false;
                };
                p == project
                    && m.agent != *agent
                    && m.ok().is_some()
                    && m.done < w.sent
                    && !s.restart_between(m.sent, w.done)
                    // Not read since: no read of this agent could have come after the send.
                    && !evs[..i].iter().any(|r| {
                        matches!(&r.op, Op::Inbox { project: q } | Op::Checkin { project: q } if q == project)
                            && (!r.answered() || r.done > m.sent)
                    })
            });
            if let Some(m) = missed {
                out.push(format!(
                    "{}'s wait in {project} sent at {:?} answered woke: false at {:?}, though {}'s channel message was acknowledged at {:?} and not read since: {v}",
                    agent_name(*agent), w.sent, w.done, agent_name(m.agent), m.done
                ));
            }
        }
    }

    // 8. The adversary changes nothing: every request of its is refused with a typed error
    // (a handle it replays is `unknown_agent`, a renew or release of what it does not hold
    // `not_holder`/`no_lease`, a write to what another holds `lease_held`); a write of its
    // that passes reaches the sled unfenced (no fence it chose, none of another's), and not
    // while an honest agent certainly held the lease.
    for e in &adv_events {
        let a = e.adv.expect("the adversary's request");
        let what = match a.as_agent {
            Some(k) => format!(
                "the adversary's {:?} (sent at {:?}) with {}'s leaked handle",
                e.op,
                e.sent,
                agent_name(k)
            ),
            None => format!("the adversary's {:?} (sent at {:?})", e.op, e.sent),
        };
        let at_sled = match &e.op {
            Op::Write {
                nonce, resource, ..
            } => by_nonce.get(&(nonce.as_str(), resource.as_str())).copied(),
            _ => None,
        };
        if let Some(x) = at_sled {
            if let Some(f) = x.fence {
                out.push(format!(
                    "{what} reached the {} sled with fence {f}{} ({})",
                    x.project,
                    if a.fence == Some(f) {
                        ", the one it chose"
                    } else {
                        ""
                    },
                    x.outcome
                ));
            }
            if x.outcome == "applied" {
                let checked_by = x.at.min(e.done);
                if let Some(h) = holdings.iter().find(|h| {
                    h.project == x.project
                        && h.resource == x.resource
                        && e.sent >= h.got
                        && checked_by < h.certain_until
                        && !s.restart_between(h.sent, checked_by)
                }) {
                    out.push(format!(
                        "{what} was applied by the sled at {:?} while {} certainly held {} (fence {}, until at least {:?})",
                        x.at, agent_name(h.agent), h.resource, h.fence, h.certain_until
                    ));
                }
            }
        }
        let op_name = match &e.op {
            Op::Init => "init",
            Op::Checkin { .. } => "checkin",
            Op::Claim { .. } => "claim",
            Op::Renew { .. } => "renew",
            Op::Release { .. } => "release",
            Op::Write { .. } => "write",
            _ => "other",
        };
        let kind = match &e.answer {
            Answer::Ok(_) => "ok".to_owned(),
            Answer::IsError(v) => v["kind"].as_str().unwrap_or("isError").to_owned(),
            Answer::Rpc(k, _) => k.clone(),
            Answer::TimedOut => "timed out".to_owned(),
            Answer::Failed { .. } => "failed".to_owned(),
        };
        let replay = a.as_agent.is_some();
        cover(&format!(
            "adversary {}{op_name} {kind}",
            if replay { "replayed " } else { "" }
        ));
        let write = matches!(e.op, Op::Write { .. });
        let fine = match &e.answer {
            Answer::Ok(_) => match &e.op {
                Op::Init | Op::Checkin { .. } => !replay,
                // Not leased by anyone: it passes, unfenced (checked above). One with a
                // replayed handle never does: the handle is checked on every write, leased or
                // not.
                Op::Write { .. } => !replay && at_sled.is_some_and(|x| x.fence.is_none()),
                _ => false,
            },
            Answer::Rpc(k, _) => match k.as_str() {
                "unknown_agent" => replay,
                "not_holder" | "no_lease" => {
                    !replay && matches!(e.op, Op::Renew { .. } | Op::Release { .. })
                }
                "lease_held" => !replay && write,
                // Refused before the handle is looked at, or the sled's answer lost.
                "tools_pending" | "sled_not_connected" => write,
                "uplink_lost" | "timeout" => write && !replay,
                _ => false,
            },
            // Timing is judged in 6.
            Answer::TimedOut | Answer::Failed { .. } => true,
            Answer::IsError(_) => false,
        };
        if !fine {
            out.push(format!(
                "{what} was not refused as it must be: {:?}",
                e.answer
            ));
        }
    }
    cover("seeds");
    out
}
