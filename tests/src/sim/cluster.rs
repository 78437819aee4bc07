//! A cluster of gateway replicas under turmoil (issue 15; the tests are in
//! `tests/tests/cluster_sim.rs`).
//!
//! One seed is one run, every host on turmoil's network and clock:
//!
//! - host `engine`: the model of the NATS engine ([`crate::engine_model::Model`]) served over
//!   the network by [`crate::engine_net`]. The `Model` is made outside the host, so its data
//!   survive everything; the host is never crashed (a new runtime would bring a new clock), an
//!   engine restart is its [`EngineSwitch`] turned off (down, every connection closed) and on.
//! - hosts `r1`, `r2`, `r3`: the real gateway (`gateway_server::serve`) in a cluster, each
//!   reaching the engine through a [`NetEngine`] of its own, claim TTL [`CLAIM_TTL`].
//!   Projects `alpha` and `beta`; `alpha` is the default.
//! - hosts `sled-alpha`, `sled-beta`: each project's sled (sled-sim's story model behind a real
//!   uplink, `run_uplink_fenced`), dialing one replica drawn from the seed. In most seeds a
//!   *twin* joins for a while: a second sled process of one project (its own model, its own
//!   [`EpochFence`]), host `twin-<project>`, dialing another replica; the two fight over the
//!   project, each hello claiming it anew.
//! - host `client`: 2–3 MCP sessions (`sled_sim::McpClient`), each sending every request to a
//!   replica drawn at random (sessions live in the engine, so any replica serves any session):
//!   `create_story` naming a project or not, `switch_project`, `list_projects`; each session
//!   lives 6–10 s, then the client starts another. Every story name is unique, so each call
//!   can be followed to the sled that executed it.
//! - host `mallory`, in the adversary's runs only ([`run_adversary`]: the sweep's scenario of
//!   the seed without its faults; the code is `cluster/adversary.rs`): it holds NATS
//!   credentials but not the cluster secret. It reaches the engine with a [`NetEngine`] of its
//!   own, listens on every replica's relay subject and on the news, sends again the genuine
//!   relay envelopes of clients' `create_story` calls it hears (to the same subject, within
//!   their lifetime, and some to another replica's) and the announcements it hears, and
//!   forges relay envelopes asking for stories named [`FORGED_PREFIX`]`…` (on the model of one
//!   it heard), announcements, tool listings (listing a tool of its own) and directory claims
//!   (naming itself the holder): unsealed, sealed under a secret of its own, and under the
//!   cluster's key id with a tag of its own; and it writes genuine claims it read back once
//!   newer ones are there.
//!
//! Faults, drawn from the seed in disjoint windows: a replica loses power mid-traffic (every
//! link cut, then crashed; repaired and restarted later), a replica is cut off from the engine
//! for longer than the claim TTL (but not twice it: see below), a replica pauses (every link
//! held, then released), the engine restarts.
//!
//! The planted bug `PlantedBug::ServeAfterLosingClaim` (a replica that loses a claim keeps its
//! uplink and its calls) is caught by (a2) in seeds with a twin and by (e) in most others.
//!
//! # The oracle
//!
//! Everything is judged from what the sleds and the clients observed: each sled records every
//! `tools/call` it executes (simulated time, project, sled instance, the replica it dialed, and
//! the epoch of the uplink the call came on: the sled's fence at that instant, which the
//! uplink checked just before), each client every request with its send and receive instants
//! and outcome. An *impairment* of a replica is a window in which it may not hear the engine:
//! it is paused, crashed or cut off from the engine, or the engine is down; each window is
//! taken to last [`RECOVERY`] past its end (time to notice, reconnect and catch up). The run
//! fails when:
//!
//! - **(a) one executing sled per project.** (a1) A sled instance executes calls at epochs
//!   that never go down, and never at no epoch (every welcome of a replica carries one). (a2)
//!   Across instances: when instance B executed a call of the project at epoch `e2` at time
//!   `t2`, no other instance A executes one at an epoch `e1 < e2` at a time `t1 > t2 +`
//!   [`STALE_GRACE`], unless the replica A dialed was impaired at some moment of `[t2, t1]`.
//!   The sleds' fences are their own, so they do not protect each other: the gateway must. A
//!   correct replica learns of the newer claim through the engine's watch within a few message
//!   latencies of it (`e2` was won before `t2`), stops its uplink at once, and the calls it had
//!   already sent arrive within another latency; while it cannot hear the engine it keeps
//!   serving by design (the directory's rules), which is why impaired windows are not judged.
//! - **(b) at most once.** No story name is executed twice. A call answered with a result was
//!   executed, once, by a sled of the project it named. A call answered "not sent"
//!   (`outcome: "not_sent"`, `sled_not_connected`, `sled_elsewhere`) was not executed.
//! - **(c) no hang.** Every request is answered before the client's deadline
//!   ([`CLIENT_TIMEOUT`]) with a result or a proper JSON-RPC error (`uplink_lost`, `timeout`,
//!   `sled_not_connected`, `sled_elsewhere`, `too_many_calls`, `cancelled`), unless the replica
//!   it was sent to was crashed or paused meanwhile (then the transport may fail or time out).
//!   HTTP 503 is allowed only during an impairment (HTTP 404 is judged by (l)).
//! - **(d) one default per session on every replica.** A `create_story` without `project`,
//!   sent at least [`PROPAGATION`] after the session's last `switch_project` (or
//!   `initialize`) was answered, with no impairment of any replica from that switch's sending
//!   to the call's answer, lands on the session's default: the sled that executed it is that
//!   project's, and an error naming a project names that one.
//! - **(e) routable after healing.** Once the faults are over, through every replica,
//!   `list_projects` shows every project live and a `create_story` naming each project
//!   succeeds, within [`CLAIM_TTL`] + the sleds' reconnect backoff + [`ROUTABLE_SLACK`] of the
//!   last fault's end (or of the end of the workload, whichever is later).
//! - **(g) "unknown" only of a call that may have reached a sled.** A call answered
//!   `uplink_lost` with `reason: "owner_lost"` (`outcome: "unknown"`: its relay was taken by
//!   the replica holding the sled, then lost) was never relayed if the replica it was sent to
//!   could not reach the engine at any moment of its life (from [`NOTICE`] before its sending
//!   to its answer, the time a replica takes to notice a cut): it must say `not_sent`.
//!   `PlantedBug::UnknownWhenNotSent` (the old answer) is caught by (g)
//!   ([`run_relays_while_cut`]).
//! - **(f) every replica lists every project's tools.** By the same deadline, each replica's
//!   stateless `tools/list` lists the tool only alpha's sled lists and the one only beta's
//!   lists, wherever their sleds are (the tools bucket). `PlantedBug::IgnoreRemoteTools`
//!   (replicas do not follow it) is caught by (f).
//! - **(i) a graceful stop fails no call.** In the graceful-stop runs ([`run_graceful_stop`]:
//!   the sleds dial host `lb`, a balancer that passes each connection to the next replica
//!   that takes it; a script asks the replica holding a project to stop, as an operator's
//!   SIGTERM, and to start again), every `create_story` succeeds: the stopping replica asks
//!   each sled it holds to move (make-before-break: the sled opens a new uplink through the
//!   balancer while the old one stays), the calls that arrive meanwhile wait for the next
//!   holder, and the old uplink closes only once the calls running on it are answered.
//!   `PlantedBug::StopWithoutDrain` (the uplinks closed at once) is caught by (i)
//!   (`cluster_planted_stop_without_drain_is_caught`), and so is
//!   `PlantedBug::HandoverCutsCalls` (the old uplink closed as soon as the project is claimed
//!   elsewhere; `cluster_planted_handover_cuts_calls_is_caught`).
//! - **(l) a session handed out is known everywhere.** No request naming a session id that
//!   a client got from `initialize` is answered HTTP 404 (`unknown_session`), through any
//!   replica, at any moment, faults or not: a replica gives a new session's id out only once
//!   the engine has its record (one the engine did not take is answered
//!   `503 session_not_stored`, and the client initializes again), and a replica that does not
//!   know a session reads it from the engine (503 while it cannot). In
//!   [`run_session_begun_through_a_cut_replica`] sessions begin through a replica cut off
//!   from the engine and are used through the others at once.
//!   `PlantedBug::HandOutUnwrittenSession` (the id given out though its write failed) is
//!   caught by (l) (`cluster_planted_hand_out_unwritten_session_is_caught`).
//! - **(k) coordination moves with its project.** In the graceful-stop runs the session
//!   also writes beta's board (`board_set` of key `k` to 1, 2, 3, …) and reads it back
//!   (`board_get`) through the replicas not holding beta, while beta's holder is stopped and
//!   its sled moves: every read answered returns at least the value of the last write
//!   answered before it was sent. The holder writes the project's records to the engine
//!   before it answers and releases its claim only after; the next holder reads them before
//!   it serves. `PlantedBug::ServeBeforeCoordLoaded` (a new holder serving at once) is caught
//!   by (k) (`cluster_planted_serve_before_coord_loaded_is_caught`).
//! - **(j) no `unknown` while every owner lives.** In the runs that cut a replica off from the
//!   engine while its relays are in flight ([`run_relay_cut_in_flight`]; no replica dies, and
//!   the engine comes back well within each call's deadline), no call is answered
//!   `outcome: "unknown"`: the relaying replica asks the owner what became of each relay it
//!   lost once the engine is back, and answers with that. `PlantedBug::NoOutcomeRecovery`
//!   (the old answer, `unknown` at once) is caught by (j), and `PlantedBug::ForgetOutcomes`
//!   (an owner that says "never seen" of a relay it served, so the call is sent again) by (b)
//!   (`cluster_planted_no_outcome_recovery_is_caught`,
//!   `cluster_planted_forget_outcomes_is_caught`).
//! - **(h1) nothing executed that no client asked for.** Every story a sled executed was
//!   named by a client's `create_story` (a session's or a probe's): mallory's forged stories
//!   never are. With (b), a genuine relay mallory sent again is never executed a second time.
//! - **(h2) every forgery and replay refused and counted.** In the adversary's runs, once
//!   mallory is done, each replica's `/metrics` counts in
//!   `gateway_cluster_unverified_total{source,reason}` at least as many refusals of each
//!   source (`relay`, `news`, `tools`, `directory`) and reason (`malformed`, `unknown_key`,
//!   `bad_tag`, `replayed`, `rolled_back`) as mallory sent it items to refuse so: a forgery or a replay
//!   silently accepted fails the run.
//! - **(h3) nothing mallory sent is answered.** A replica answers the relays it takes; it must
//!   answer none of mallory's.
//! - **(h4) no forged tool is listed.** No replica's stateless `tools/list` (read by (f)'s
//!   probes) lists the tool of mallory's forged listings.
//!
//! `PlantedBug::TrustTheEngine` (a replica verifies nothing) is caught by (h1), (h2) and (h4),
//! `PlantedBug::ForgetNonces` (a message heard again is taken again) by (b) and (h2)
//! (`cluster_planted_trust_the_engine_is_caught`, `cluster_planted_forget_nonces_is_caught`).
//!
//! # Bugs this simulation found (fixed), and the runs that guard them
//!
//! - A replica cut off from the engine past twice the claim TTL found its key with no trace
//!   left, and retried its claim at its stale revision for ever; now a conflict at revision 0
//!   makes the next claim a create ([`ClusterScenario::draw_long_cut`]; the sweep's cuts also
//!   reach past twice the TTL).
//! - A `switch_project` through a replica whose copy of the session looked unchanged wrote
//!   nothing, and a switch was answered before its write was in the engine, so two quick
//!   switches through two replicas could land in the wrong order; now a switch is always
//!   written and confirmed once written ([`run_switch_race`]).
//! - A session write that failed was never repaired; now it is written again at the
//!   session's next use ([`run_failed_session_write`]).
//! - The relays a new claim orphans were failed in a `HashMap`'s order, so runs with twins
//!   differed; now in token order (`cluster_twins_same_seed_same_trace`).
//!
//! The sweep judges sessions strictly ([`ClusterScenario::strict_sessions`]), except a
//! default set within [`PROPAGATION`] of the call (the watch's delay, by design).
//!
//! Determinism: turmoil's RNG, the gateways' seeds and every client's RNG come from the seed;
//! everything recorded is hashed into the trace hash.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use gateway_core::{Config, PlantedBug, ProjectSpec, Registry};
use gateway_server::cluster::replica::ClusterOptions;
use gateway_server::ServerOptions;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use sled_sim::mcp::{SharedSled, Sled};
use sled_sim::model::Project;
use sled_sim::net::GatewayAddr;
use sled_sim::uplink::{run_uplink_fenced, Backend, CallContext, Handler, UplinkOptions};
use sled_sim::{ClientError, EpochFence, McpClient};

use super::{TurmoilConnect, TurmoilListener};
use crate::engine_model::Model;
use crate::engine_net::{serve_engine_switched, EngineSwitch, NetEngine, ENGINE_PORT};

mod adversary;
mod wait;
pub use adversary::{run_adversary, FORGED_PREFIX};
pub use wait::run_spread_waits;

pub const PROJECTS: [&str; 2] = ["alpha", "beta"];
/// The tool only each project's sled lists.
const ONLY_TOOLS: [&str; 2] = ["block_story", "unblock_story"];
pub const REPLICAS: [&str; 3] = ["r1", "r2", "r3"];
const ENGINE_HOST: &str = "engine";
const CLIENT_HOST: &str = "client";
/// The balancer's host, in the graceful-stop runs ([`run_graceful_stop`]).
const LB_HOST: &str = "lb";
const NAMESPACE: &str = "sim";
const GATEWAY_PORT: u16 = 80;
/// The directory's claim TTL (the bucket's `max_age`).
pub const CLAIM_TTL: Duration = Duration::from_secs(3);
/// The gateway's deadline for a call to a sled.
const CALL_TIMEOUT: Duration = Duration::from_secs(4);
/// How long a client waits for any answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);
/// The sleds' longest reconnect backoff.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long after a newer epoch executed a call an older one may still execute one (the news
/// of the newer claim in flight to the old owner, and its last calls in flight to its sled).
pub const STALE_GRACE: Duration = Duration::from_secs(1);
/// How long an impairment is taken to last past its end.
pub const RECOVERY: Duration = Duration::from_secs(5);
/// How long a session's change takes to reach every replica.
pub const PROPAGATION: Duration = Duration::from_secs(1);
/// Slack on (e)'s deadline, past claim TTL and backoff: noticing a dead link, a hello.
pub const ROUTABLE_SLACK: Duration = Duration::from_secs(5);
/// How long a client's TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// When the clients start.
const WARMUP: Duration = Duration::from_secs(2);
/// How long past a crash or pause a client's transport may still fail (a stale connection is
/// reset when first used).
const TRANSPORT_SLACK: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// The scenario.

/// A second sled process of `project`, dialing `replica`, from `at` to `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Twin {
    pub project: usize,
    pub replica: usize,
    pub at: Duration,
    pub until: Duration,
}

/// A fault, with its window on the simulated clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Every link of the replica cut, then the host crashed; repaired and restarted at
    /// `until`.
    CrashReplica {
        replica: usize,
        at: Duration,
        until: Duration,
    },
    /// The replica and the engine cannot reach each other.
    CutFromEngine {
        replica: usize,
        at: Duration,
        until: Duration,
    },
    /// Every link of the replica held: it hears and says nothing, then everything at once.
    PauseReplica {
        replica: usize,
        at: Duration,
        until: Duration,
    },
    /// The engine goes down (every connection closed) and comes back with its data.
    RestartEngine { at: Duration, until: Duration },
}

impl Fault {
    pub fn window(&self) -> (Duration, Duration) {
        match self {
            Fault::CrashReplica { at, until, .. }
            | Fault::CutFromEngine { at, until, .. }
            | Fault::PauseReplica { at, until, .. }
            | Fault::RestartEngine { at, until } => (*at, *until),
        }
    }

    /// Whether the replica may not hear the engine during the window.
    fn impairs(&self, replica: usize) -> bool {
        match self {
            Fault::CrashReplica { replica: r, .. }
            | Fault::CutFromEngine { replica: r, .. }
            | Fault::PauseReplica { replica: r, .. } => *r == replica,
            Fault::RestartEngine { .. } => true,
        }
    }

    /// Whether the replica itself is gone or silent during the window.
    fn silences(&self, replica: usize) -> bool {
        match self {
            Fault::CrashReplica { replica: r, .. } | Fault::PauseReplica { replica: r, .. } => {
                *r == replica
            }
            Fault::CutFromEngine { .. } | Fault::RestartEngine { .. } => false,
        }
    }
}

/// One seed's run.
#[derive(Debug, Clone)]
pub struct ClusterScenario {
    pub seed: u64,
    pub planted: bool,
    /// Another planted bug, for the scripted runs that look for it.
    pub bug: Option<PlantedBug>,
    /// The sessions send requests until then; then (e) is checked.
    pub run_for: Duration,
    pub net_latency_max: Duration,
    pub sessions: usize,
    /// The replica each project's sled dials.
    pub homes: Vec<usize>,
    /// Each project's sled's answer latency.
    pub sled_latency: Vec<Duration>,
    pub twins: Vec<Twin>,
    pub faults: Vec<Fault>,
    /// Whether a cut from the engine lasts past twice the claim TTL (see
    /// [`ClusterScenario::draw_long_cut`]).
    pub long_cut: bool,
    /// Whether (d) judges every session, even one whose default may have diverged between
    /// replicas for a reason the sweep does not judge (see the module docs); only the tests of
    /// those reasons set it.
    pub strict_sessions: bool,
    /// Whether mallory, the adversary, runs beside the workload ([`run_adversary`]).
    pub adversary: bool,
    /// Whether the sleds dial the balancer, a script stops replicas gracefully, and (i) holds
    /// every call to succeed ([`run_graceful_stop`]).
    pub graceful_stops: bool,
    /// Whether a script cuts a replica off from the engine while its relays are in flight,
    /// and (j) holds no call to be answered `unknown` ([`run_relay_cut_in_flight`]).
    pub cut_in_flight: bool,
}

fn ms(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

impl ClusterScenario {
    /// The sweep's scenario: a cut from the engine lasts past the claim TTL, but not past
    /// twice it.
    pub fn draw(seed: u64, planted: bool) -> ClusterScenario {
        ClusterScenario::draw_with(seed, planted, false)
    }

    /// A scenario whose cut from the engine (always one) lasts past twice the claim TTL, so
    /// that the claim's expiry marker has aged out of the bucket when the replica is back: it
    /// finds its key at revision 0, with no trace, and its watch reports nothing.
    pub fn draw_long_cut(seed: u64) -> ClusterScenario {
        ClusterScenario::draw_with(seed, false, true)
    }

    fn draw_with(seed: u64, planted: bool, long_cut: bool) -> ClusterScenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc1a5_7e70_0000_0015);
        let run_for = Duration::from_secs(rng.random_range(28..=36));
        let net_latency_max = ms(&mut rng, 2, 30);
        let sessions = rng.random_range(2..=3);
        let homes: Vec<usize> = PROJECTS
            .iter()
            .map(|_| rng.random_range(0..REPLICAS.len()))
            .collect();
        let sled_latency = PROJECTS.iter().map(|_| ms(&mut rng, 0, 40)).collect();
        let mut twins = Vec::new();
        if rng.random_bool(0.65) {
            let project = rng.random_range(0..PROJECTS.len());
            let replica = (homes[project] + rng.random_range(1..REPLICAS.len())) % REPLICAS.len();
            let last = run_for.as_millis() as u64 - 14_000;
            let at = ms(&mut rng, 5_000, last);
            twins.push(Twin {
                project,
                replica,
                at,
                until: at + ms(&mut rng, 4_000, 9_000),
            });
        }
        let mut kinds = [0u8, 1, 2, 3];
        kinds.shuffle(&mut rng);
        let last = run_for - Duration::from_secs(8);
        let mut t = Duration::from_secs(4);
        let mut faults = Vec::new();
        for kind in kinds {
            // A long-cut scenario always has its cut.
            let drawn = rng.random_bool(0.7) || (long_cut && kind == 1);
            if !drawn {
                continue;
            }
            let at = t + ms(&mut rng, 0, 2_000);
            let replica = rng.random_range(0..REPLICAS.len());
            let ttl = CLAIM_TTL.as_millis() as u64;
            let fault = match kind {
                0 => Fault::CrashReplica {
                    replica,
                    at,
                    until: at + ms(&mut rng, 1_000, 4_000),
                },
                1 if long_cut => Fault::CutFromEngine {
                    replica,
                    at,
                    until: at + ms(&mut rng, 2 * ttl + 500, 2 * ttl + 2_500),
                },
                1 => Fault::CutFromEngine {
                    replica,
                    at,
                    until: at + ms(&mut rng, ttl + 500, 2 * ttl + 2_500),
                },
                2 => Fault::PauseReplica {
                    replica,
                    at,
                    until: at + ms(&mut rng, 1_000, 4_000),
                },
                _ => Fault::RestartEngine {
                    at,
                    until: at + ms(&mut rng, 500, 3_000),
                },
            };
            let until = fault.window().1;
            if until > last {
                break;
            }
            faults.push(fault);
            t = until + ms(&mut rng, 2_000, 4_000);
        }
        ClusterScenario {
            seed,
            planted,
            bug: None,
            run_for,
            net_latency_max,
            sessions,
            homes,
            sled_latency,
            twins,
            faults,
            long_cut,
            strict_sessions: true,
            adversary: false,
            graceful_stops: false,
            cut_in_flight: false,
        }
    }

    /// When the last fault or twin ended.
    fn last_heal(&self) -> Duration {
        self.faults
            .iter()
            .map(|f| f.window().1)
            .chain(self.twins.iter().map(|t| t.until))
            .max()
            .unwrap_or_default()
    }

    /// By when (e) must hold.
    pub fn routable_by(&self) -> Duration {
        self.run_for.max(self.last_heal()) + CLAIM_TTL + BACKOFF_MAX + ROUTABLE_SLACK
    }

    /// Whether `f` picks a fault whose window, extended by `extra`, meets `[a, b]`.
    fn any_fault(
        &self,
        a: Duration,
        b: Duration,
        extra: Duration,
        f: impl Fn(&Fault) -> bool,
    ) -> bool {
        self.faults.iter().filter(|x| f(x)).any(|x| {
            let (at, until) = x.window();
            at <= b && until + extra >= a
        })
    }

    /// Whether `replica` may not have heard the engine at some moment of `[a, b]`.
    fn impaired(&self, replica: usize, a: Duration, b: Duration) -> bool {
        self.any_fault(a, b, RECOVERY, |f| f.impairs(replica))
    }

    /// Whether any replica may not have heard the engine at some moment of `[a, b]`.
    fn any_impaired(&self, a: Duration, b: Duration) -> bool {
        self.any_fault(a, b, RECOVERY, |_| true)
    }

    /// Whether `replica` could not reach the engine at any moment of `[a, b]`, and had known so
    /// for [`NOTICE`] before `a`: cut off from it, or the engine down, throughout.
    fn cut_throughout(&self, replica: usize, a: Duration, b: Duration) -> bool {
        self.faults.iter().any(|f| {
            let cuts = match f {
                Fault::CutFromEngine { replica: r, .. } => *r == replica,
                Fault::RestartEngine { .. } => true,
                Fault::CrashReplica { .. } | Fault::PauseReplica { .. } => false,
            };
            let (at, until) = f.window();
            cuts && at + NOTICE <= a && b <= until
        })
    }

    /// Whether `replica` was crashed or paused at some moment of `[a, b]`, or just before.
    fn silenced(&self, replica: usize, a: Duration, b: Duration) -> bool {
        self.any_fault(a, b, TRANSPORT_SLACK, |f| f.silences(replica))
    }
}

impl fmt::Display for ClusterScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let homes: Vec<String> = self
            .homes
            .iter()
            .zip(PROJECTS)
            .map(|(h, p)| format!("{p}@{}", REPLICAS[*h]))
            .collect();
        write!(
            f,
            "cluster seed {}: {} sessions for {:?}, net ≤ {:?}, sleds {homes:?} (latency {:?}), planted {}, twins {:?}, faults {:?}",
            self.seed,
            self.sessions,
            self.run_for,
            self.net_latency_max,
            self.sled_latency,
            self.planted,
            self.twins,
            self.faults
        )?;
        if self.adversary {
            write!(f, ", adversary mallory, bug {:?}", self.bug)?;
        }
        Ok(())
    }
}

/// What one run found.
pub type ClusterReport = super::runner::SweepReport;

// ---------------------------------------------------------------------------------------------
// What is recorded.

/// A `tools/call` a sled executed.
#[derive(Debug, Clone)]
struct Exec {
    at: Duration,
    project: String,
    /// The sled process: its host and incarnation.
    instance: String,
    /// The replica it dials.
    replica: usize,
    /// The epoch of the uplink the call came on.
    epoch: Option<u64>,
    connection: u64,
    /// The story name (unique per client call).
    name: String,
}

impl Exec {
    fn line(&self) -> String {
        format!(
            "{:>6} ms exec {} {} via {} epoch {:?} conn {} {}",
            self.at.as_millis(),
            self.instance,
            self.project,
            REPLICAS[self.replica],
            self.epoch,
            self.connection,
            self.name
        )
    }
}

#[derive(Debug, Clone)]
enum Op {
    Init,
    Create {
        name: String,
        /// The project named, if any.
        project: Option<String>,
        /// Without one: the session's default as the client knows it, with when the switch
        /// (or initialize) that set it was sent and answered.
        default: Option<(String, Duration, Duration)>,
    },
    Switch {
        project: String,
    },
    List,
    /// `board_set` of beta's key `k` to `value`.
    BoardSet {
        value: u64,
    },
    /// `board_get` of beta's key `k`.
    BoardGet,
}

#[derive(Debug, Clone)]
enum Outcome {
    /// A result's structured content.
    Ok(Value),
    /// An `isError` result's structured content.
    ToolError(Value),
    /// A JSON-RPC error: its `data.kind` and `data`.
    Rpc(String, Value),
    /// A non-2xx status.
    Http(u16, String),
    /// No answer within the client's timeout.
    TimedOut,
    /// The transport failed.
    Transport(String),
}

impl Outcome {
    fn brief(&self) -> String {
        match self {
            Outcome::Ok(v) => {
                let story = v.pointer("/story/id").and_then(Value::as_str);
                match (story, v.get("project")) {
                    (Some(id), _) => format!("ok {id}"),
                    (None, Some(p)) if v.get("key").is_some() => {
                        format!(
                            "ok project {p} value {} revision {}",
                            v["value"], v["revision"]
                        )
                    }
                    (None, Some(p)) => format!("ok project {p}"),
                    (None, None) => "ok".to_owned(),
                }
            }
            Outcome::ToolError(v) => format!("isError {v}"),
            Outcome::Rpc(kind, data) => format!("error {kind} {data}"),
            Outcome::Http(status, body) => format!("HTTP {status} {}", short(body)),
            Outcome::TimedOut => "timed out".to_owned(),
            Outcome::Transport(why) => format!("transport {}", short(why)),
        }
    }
}

fn short(s: &str) -> String {
    s.chars().take(100).collect()
}

/// A request a client sent.
#[derive(Debug, Clone)]
struct Call {
    /// `s<session>.<incarnation>`, or `probe-<replica>`.
    who: String,
    replica: usize,
    op: Op,
    sent: Duration,
    done: Duration,
    outcome: Outcome,
    /// When the client's connection to the replica was opened (a connection opened before a
    /// crash fails when first used after it).
    conn_since: Duration,
}

impl Call {
    fn line(&self) -> String {
        format!(
            "{:>6}..{:>6} ms {} via {} {:?} -> {}",
            self.sent.as_millis(),
            self.done.as_millis(),
            self.who,
            REPLICAS[self.replica],
            self.op,
            self.outcome.brief()
        )
    }
}

/// Everything a run records, outside the hosts (it outlives crashes).
#[derive(Default)]
struct Log {
    execs: Mutex<Vec<Exec>>,
    calls: Mutex<Vec<Call>>,
    notes: Mutex<Vec<(Duration, String)>>,
    violations: Mutex<Vec<String>>,
    /// What a host counted, for the report's coverage.
    coverage: Mutex<BTreeMap<String, usize>>,
    /// Per replica, how many graceful stops and how many starts after one a script asked for.
    stops: Mutex<BTreeMap<usize, (u32, u32)>>,
}

impl Log {
    /// Asks `replica` to stop gracefully (its shutdown signal), as an operator's SIGTERM.
    fn ask_stop(&self, replica: usize) {
        lock(&self.stops).entry(replica).or_default().0 += 1;
    }

    /// Asks `replica`, stopped, to start again.
    fn ask_start(&self, replica: usize) {
        lock(&self.stops).entry(replica).or_default().1 += 1;
    }

    fn stops_asked(&self, replica: usize) -> (u32, u32) {
        lock(&self.stops).get(&replica).copied().unwrap_or_default()
    }

    fn note(&self, line: String) {
        let at = now();
        lock(&self.notes).push((at, format!("{:>6} ms {line}", at.as_millis())));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// The sleds.

/// One sled process: the story model of its project, recording each `tools/call` it executes
/// with the epoch its fence holds at that instant (the uplink has just checked that the call's
/// connection is the newest), executing it at once and answering after its latency.
struct ClusterSled {
    instance: String,
    project: String,
    replica: usize,
    sled: SharedSled,
    fence: EpochFence,
    latency: Duration,
    log: Arc<Log>,
}

impl Handler for ClusterSled {
    fn project_name(&self) -> &str {
        &self.project
    }

    fn handle(self: Arc<Self>, msg: Value, ctx: CallContext) -> BoxFuture<'static, Option<Value>> {
        let is_call = msg.get("method").and_then(Value::as_str) == Some("tools/call");
        if is_call {
            let name = msg
                .pointer("/params/arguments/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            lock(&self.log.execs).push(Exec {
                at: now(),
                project: self.project.clone(),
                instance: self.instance.clone(),
                replica: self.replica,
                epoch: self.fence.seen(),
                connection: ctx.connection(),
                name,
            });
        }
        let answer = self.sled.handle(&msg);
        let delay = if is_call {
            self.latency
        } else {
            Duration::ZERO
        };
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            answer
        })
    }
}

type Software =
    Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = turmoil::Result>>>>;

/// A sled host's software: a fresh process (model, fence) at each start.
fn sled_software(
    host: String,
    project: usize,
    replica: usize,
    latency: Duration,
    seed: u64,
    log: Arc<Log>,
    via_lb: bool,
) -> Software {
    let incarnation = AtomicU64::new(0);
    Box::new(move || {
        let n = incarnation.fetch_add(1, Ordering::Relaxed);
        let name = PROJECTS[project];
        let fence = EpochFence::default();
        // Each project lists a tool the other does not (its `ONLY_TOOLS` entry), so that a
        // replica's stateless tools/list shows whether it lists that project.
        let mut model = Sled::new(Project::new(name), format!("{name}-sled"), seed);
        for (other, tool) in ONLY_TOOLS.iter().enumerate() {
            if other != project {
                model.set_tool_enabled(tool, false);
            }
        }
        let handler = Arc::new(ClusterSled {
            instance: format!("{host}#{n}"),
            project: name.to_owned(),
            replica,
            sled: SharedSled::new(model),
            fence: fence.clone(),
            latency,
            log: log.clone(),
        });
        let opts = UplinkOptions {
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            seed: seed ^ n,
            sled_name: format!("{name}-sled"),
            backoff_min: Duration::from_millis(50),
            backoff_max: BACKOFF_MAX,
            token: Some(super::uplink_token(name)),
            identity: None,
            relay_interval: Duration::ZERO,
            stall_relay: false,
            tls: Default::default(),
            // Shutdown in the simulation is a crash or a stop at once; a drain is tested on its own.
            drain: None,
        };
        let host = if via_lb { LB_HOST } else { REPLICAS[replica] };
        let gateway = GatewayAddr::parse(&format!("http://{host}:{GATEWAY_PORT}"))
            .expect("a valid replica address");
        Box::pin(async move {
            run_uplink_fenced(
                TurmoilConnect,
                gateway,
                Backend::Handler(handler),
                opts,
                fence,
                std::future::pending(),
            )
            .await;
            Ok(())
        })
    })
}

/// The balancer of the graceful-stop runs: each connection goes to the next replica in turn,
/// or to the one after when that one refuses it (it is stopping: nothing was sent), and its
/// bytes are copied both ways until either side closes. The sleds dial it, as a project's
/// container dials nginx.
async fn balancer() -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?;
    let mut next = 0;
    loop {
        let (mut inbound, _) = listener.accept().await?;
        let first = next;
        next = (next + 1) % REPLICAS.len();
        tokio::spawn(async move {
            for i in 0..REPLICAS.len() {
                let replica = REPLICAS[(first + i) % REPLICAS.len()];
                if let Ok(mut outbound) =
                    turmoil::net::TcpStream::connect((replica, GATEWAY_PORT)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    return;
                }
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------
// The replicas.

fn server_options(s: &ClusterScenario, replica: usize, incarnation: u64) -> ServerOptions {
    let specs = PROJECTS
        .iter()
        .map(|p| {
            let mut spec = ProjectSpec::new(*p, format!("http://sled-{p}:9000"));
            spec.sled = format!("{p}-sled");
            spec.call_timeout = CALL_TIMEOUT;
            spec.token = Some(super::uplink_token(p));
            spec
        })
        .collect();
    let registry = Registry::from_projects(specs, Some(PROJECTS[0])).expect("a valid sim registry");
    // The first bytes name the run in the replica's relay inboxes: different per incarnation.
    let mut bytes = [0u8; 32];
    bytes[0] = incarnation as u8;
    bytes[1] = replica as u8;
    bytes[2..10].copy_from_slice(&s.seed.to_le_bytes());
    bytes[10] = 0xc1;
    let mut opts = ServerOptions::new(registry, bytes);
    opts.prober = Arc::new(gateway_server::HttpProber(TurmoilConnect));
    opts.pin_file = None;
    opts.shutdown_grace = Duration::from_secs(1);
    opts.core = Config {
        heartbeat_interval: HEARTBEAT_INTERVAL,
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        hello_timeout: Duration::from_secs(2),
        refresh_timeout: CALL_TIMEOUT,
        probe_interval: Duration::ZERO,
        planted: s
            .bug
            .or(s.planted.then_some(PlantedBug::ServeAfterLosingClaim)),
        ..Config::default()
    };
    opts
}

/// A replica host's software: a gateway in the cluster, started again whenever joining the
/// cluster fails (the engine unreachable at start).
fn replica_software(s: &ClusterScenario, replica: usize, log: Arc<Log>) -> Software {
    let scenario = s.clone();
    let incarnation = AtomicU64::new(0);
    let incarnation = Arc::new(incarnation);
    Box::new(move || {
        let incarnation = incarnation.clone();
        let mut opts = server_options(
            &scenario,
            replica,
            incarnation.fetch_add(1, Ordering::Relaxed),
        );
        let (scenario, log) = (scenario.clone(), log.clone());
        Box::pin(async move {
            let name = REPLICAS[replica];
            let engine = Arc::new(NetEngine::new(format!("{ENGINE_HOST}:{ENGINE_PORT}"), name));
            loop {
                engine.wait_connected(Duration::from_secs(3600)).await;
                let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?;
                let mut cluster =
                    ClusterOptions::new(engine.clone(), name, crate::test_cluster_keys());
                cluster.clock = super::sim_wall_clock();
                cluster.namespace = NAMESPACE.to_owned();
                cluster.claim_ttl = CLAIM_TTL;
                let mut run = opts.clone();
                run.cluster = Some(cluster);
                // A graceful stop is the shutdown signal, when a script asks for one.
                let (stops, _) = log.stops_asked(replica);
                let asked = {
                    let log = log.clone();
                    let watched = scenario.graceful_stops;
                    async move {
                        if !watched {
                            return std::future::pending().await;
                        }
                        while log.stops_asked(replica).0 == stops {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                };
                match gateway_server::serve(TurmoilListener(listener), run, asked).await {
                    Ok(()) if log.stops_asked(replica).0 > stops => {
                        log.note(format!("{name} stopped gracefully"));
                        while log.stops_asked(replica).1 <= stops {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        log.note(format!("{name} starts again"));
                        opts = server_options(
                            &scenario,
                            replica,
                            incarnation.fetch_add(1, Ordering::Relaxed),
                        );
                    }
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        log.note(format!("{name} did not start: {e}"));
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                }
            }
        })
    })
}

// ---------------------------------------------------------------------------------------------
// The clients.

type Client = McpClient<TurmoilConnect>;

fn mcp_url(replica: usize) -> String {
    format!("http://{}:{GATEWAY_PORT}/mcp", REPLICAS[replica])
}

async fn connect(replica: usize) -> Result<Client, String> {
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        Client::connect(TurmoilConnect, &mcp_url(replica)),
    )
    .await
    {
        Ok(Ok(mut c)) => {
            c.set_timeout(Some(CLIENT_TIMEOUT));
            Ok(c)
        }
        Ok(Err(e)) => Err(format!("connecting: {e}")),
        Err(_) => Err("connecting: no answer".to_owned()),
    }
}

fn classify(result: Result<Value, ClientError>) -> Outcome {
    match result {
        Ok(v) => {
            if let Some(e) = v.get("error") {
                let kind = e["data"]["kind"].as_str().unwrap_or_default().to_owned();
                Outcome::Rpc(kind, e["data"].clone())
            } else if v["result"]["isError"] == true {
                Outcome::ToolError(v["result"]["structuredContent"].clone())
            } else {
                Outcome::Ok(v["result"]["structuredContent"].clone())
            }
        }
        Err(ClientError::Timeout(_)) => Outcome::TimedOut,
        Err(ClientError::Http { status, body }) => Outcome::Http(status, body),
        Err(e) => Outcome::Transport(e.to_string()),
    }
}

/// One scripted MCP session; a new session (incarnation) after each 404.
struct Session {
    idx: usize,
    incarnation: u32,
    sid: Option<String>,
    protocol: Option<String>,
    since: Duration,
    clients: Vec<Option<(Client, Duration)>>,
    rng: ChaCha8Rng,
    log: Arc<Log>,
    calls: u64,
    /// The default as the client knows it: the project, and when the switch (or initialize)
    /// that set it was sent and answered; `None` after a switch whose outcome is unknown.
    default: Option<(String, Duration, Duration)>,
    /// When the last `switch_project` was answered.
    last_switch: Option<Duration>,
    /// Whether a switch sent within [`PROPAGATION`] of the previous one's answer still sets a
    /// default the oracle judges by ([`ClusterScenario::strict_sessions`]).
    strict_switches: bool,
    end: Duration,
}

impl Session {
    fn new(idx: usize, seed: u64, log: Arc<Log>, end: Duration) -> Session {
        Session {
            idx,
            incarnation: 0,
            sid: None,
            protocol: None,
            since: Duration::ZERO,
            clients: (0..REPLICAS.len()).map(|_| None).collect(),
            rng: ChaCha8Rng::seed_from_u64(seed ^ (0x5e55_0000 + idx as u64)),
            log,
            calls: 0,
            default: None,
            last_switch: None,
            strict_switches: false,
            end,
        }
    }

    fn who(&self) -> String {
        format!("s{}.{}", self.idx, self.incarnation)
    }

    async fn client(&mut self, replica: usize) -> Result<&mut Client, String> {
        if self.clients[replica].is_none() {
            let since = now();
            self.clients[replica] = Some((connect(replica).await?, since));
        }
        let (c, _) = self.clients[replica].as_mut().expect("just made");
        c.set_session_id(self.sid.clone());
        c.set_protocol_version(self.protocol.clone());
        Ok(c)
    }

    fn record(&self, replica: usize, op: Op, sent: Duration, outcome: &Outcome) {
        let conn_since = self.clients[replica]
            .as_ref()
            .map_or(sent, |(_, since)| *since);
        lock(&self.log.calls).push(Call {
            conn_since,
            who: self.who(),
            replica,
            op,
            sent,
            done: now(),
            outcome: outcome.clone(),
        });
    }

    async fn request(&mut self, replica: usize, op: Op, method: &str, params: Value) -> Outcome {
        self.calls += 1;
        let id = json!(self.calls);
        let sent = now();
        let outcome = match self.client(replica).await {
            Ok(c) => classify(c.request(id, method, params).await),
            Err(e) => Outcome::Transport(e),
        };
        self.record(replica, op, sent, &outcome);
        match &outcome {
            Outcome::TimedOut | Outcome::Transport(_) => self.clients[replica] = None,
            Outcome::Http(404, _) => self.sid = None,
            _ => {}
        }
        outcome
    }

    async fn run(mut self) {
        tokio::time::sleep(WARMUP + Duration::from_millis(37 * self.idx as u64)).await;
        // A session lives 6–10 s, then the client starts another (so a session whose copies
        // diverged for a reason (d) does not judge does not blind it for the rest of the run).
        let mut lifetime = ms(&mut self.rng, 6_000, 10_000);
        while now() < self.end {
            if self.sid.is_some() && now() > self.since + lifetime {
                self.sid = None;
                lifetime = ms(&mut self.rng, 6_000, 10_000);
            }
            if self.sid.is_none() {
                self.init().await;
                continue;
            }
            self.step().await;
            let pause = ms(&mut self.rng, 0, 200);
            tokio::time::sleep(pause).await;
        }
    }

    async fn init(&mut self) {
        let replica = self.rng.random_range(0..REPLICAS.len());
        self.init_at(replica).await;
    }

    async fn init_at(&mut self, replica: usize) {
        let sent = now();
        let result = match self.client(replica).await {
            Ok(c) => match c.initialize().await {
                Ok(_) => Ok((
                    c.session_id().map(str::to_owned),
                    c.protocol_version().map(str::to_owned),
                )),
                Err(e) => Err(classify(Err(e))),
            },
            Err(e) => Err(Outcome::Transport(e)),
        };
        match result {
            Ok((sid, protocol)) => {
                self.incarnation += 1;
                self.sid = sid;
                self.protocol = protocol;
                self.since = now();
                self.default = Some((PROJECTS[0].to_owned(), sent, now()));
                self.record(replica, Op::Init, sent, &Outcome::Ok(json!({})));
            }
            Err(outcome) => {
                self.record(replica, Op::Init, sent, &outcome);
                if matches!(outcome, Outcome::TimedOut | Outcome::Transport(_)) {
                    self.clients[replica] = None;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }

    async fn step(&mut self) {
        let replica = self.rng.random_range(0..REPLICAS.len());
        let roll = self.rng.random_range(0..100);
        let project = PROJECTS[self.rng.random_range(0..PROJECTS.len())].to_owned();
        match roll {
            0..=44 => self.create(replica, Some(project)).await,
            45..=79 => self.create(replica, None).await,
            80..=94 => self.switch(replica, project).await,
            _ => {
                let args = json!({"name": "list_projects", "arguments": {}});
                self.request(replica, Op::List, "tools/call", args).await;
            }
        }
    }

    async fn switch(&mut self, replica: usize, project: String) {
        let sent = now();
        // A switch right after another may race it to the engine: see `ClusterScenario::draw`.
        let racing = self.last_switch.is_some_and(|at| sent < at + PROPAGATION);
        let args = json!({"name": "switch_project", "arguments": {"project": project}});
        let op = Op::Switch {
            project: project.clone(),
        };
        let outcome = self.request(replica, op, "tools/call", args).await;
        self.last_switch = Some(now());
        self.default = match outcome {
            Outcome::Ok(v) if v["project"] == json!(project) => {
                (self.strict_switches || !racing).then(|| (project, sent, now()))
            }
            _ => None,
        };
    }

    async fn create(&mut self, replica: usize, project: Option<String>) {
        let name = format!("{}.n{}", self.who(), self.calls + 1);
        let mut arguments = json!({"name": name, "acceptance_criteria": ["done"]});
        if let Some(p) = &project {
            arguments["project"] = json!(p);
        }
        let default = if project.is_none() {
            self.default.clone()
        } else {
            None
        };
        let op = Op::Create {
            name,
            project,
            default,
        };
        let params = json!({"name": "create_story", "arguments": arguments});
        self.request(replica, op, "tools/call", params).await;
    }
}

/// (e): through `replica`, every project live in `list_projects` and a `create_story` naming
/// each one succeeding, by `deadline`; then (f): its stateless `tools/list` listing both
/// projects' own tools.
async fn probe_routable(replica: usize, deadline: Duration, log: Arc<Log>) {
    let mut client: Option<Client> = None;
    let mut routed = false;
    let mut conn_since = Duration::ZERO;
    let mut attempt = 0u32;
    let mut last = String::from("no attempt");
    while now() < deadline {
        attempt += 1;
        if client.is_none() {
            conn_since = now();
            match connect(replica).await {
                Ok(c) => client = Some(c),
                Err(e) => {
                    last = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let c = client.as_mut().expect("just made");
        if !routed {
            let listed = classify(
                c.tools_call(json!(attempt), "list_projects", json!({}))
                    .await,
            );
            let live: Vec<bool> = match &listed {
                Outcome::Ok(v) => PROJECTS
                    .iter()
                    .map(|p| {
                        v["projects"]
                            .as_array()
                            .and_then(|ps| ps.iter().find(|x| x["name"] == *p))
                            .is_some_and(|x| x["live"] == true)
                    })
                    .collect(),
                other => {
                    client = None;
                    last = format!("list_projects: {}", other.brief());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if live.iter().any(|l| !l) {
                last = format!("list_projects: live {live:?} for {PROJECTS:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let mut all = true;
            for p in PROJECTS {
                let name = format!("probe-{}.{attempt}.{p}", REPLICAS[replica]);
                let sent = now();
                let arguments =
                    json!({"name": name, "acceptance_criteria": ["done"], "project": p});
                let outcome = classify(
                    c.tools_call(json!(attempt), "create_story", arguments)
                        .await,
                );
                lock(&log.calls).push(Call {
                    who: format!("probe-{}", REPLICAS[replica]),
                    replica,
                    op: Op::Create {
                        name,
                        project: Some(p.to_owned()),
                        default: None,
                    },
                    sent,
                    done: now(),
                    outcome: outcome.clone(),
                    conn_since,
                });
                if !matches!(outcome, Outcome::Ok(_)) {
                    last = format!("create_story in {p}: {}", outcome.brief());
                    all = false;
                    break;
                }
            }
            if !all {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        if !routed {
            routed = true;
            log.note(format!("(e) {} routes every project", REPLICAS[replica]));
        }
        // (f) Its stateless tools/list lists every project's tools, wherever its sled is.
        let listed = stateless_tools(c, attempt).await;
        // (h4) and never a tool of mallory's forged listings.
        if let Some(forged) = listed
            .as_ref()
            .ok()
            .and_then(|tools| tools.iter().find(|t| *t == adversary::FORGED_TOOL))
        {
            lock(&log.violations).push(format!(
                "(h4) {}'s stateless tools/list lists {forged}, from a tool listing mallory forged",
                REPLICAS[replica]
            ));
            return;
        }
        match listed {
            Ok(tools) if ONLY_TOOLS.iter().all(|t| tools.iter().any(|n| n == t)) => {
                log.note(format!(
                    "(f) {} lists every project's tools",
                    REPLICAS[replica]
                ));
                return;
            }
            Ok(tools) => last = format!("(f) the stateless tools/list lists {tools:?}"),
            Err(e) => {
                client = None;
                last = format!("(f) the stateless tools/list: {e}");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let what = if routed {
        "(f) not every project's tools were listed"
    } else {
        "(e) not every sled was routable"
    };
    lock(&log.violations).push(format!(
        "{what} through {} by {} ms (claim TTL + backoff + slack after the faults); last: {last}",
        REPLICAS[replica],
        deadline.as_millis()
    ));
}

/// The tool names of a replica's stateless (2026-07-28) `tools/list`.
async fn stateless_tools(c: &mut Client, id: u32) -> Result<Vec<String>, String> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }}});
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
        ("mcp-session-id", ""),
    ];
    let (status, _, body) = c
        .post_raw(body.to_string().into_bytes(), &headers)
        .await
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("HTTP {status}: {e}"))?;
    Ok(v["result"]["tools"]
        .as_array()
        .ok_or_else(|| format!("HTTP {status}: {v}"))?
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect())
}

// ---------------------------------------------------------------------------------------------
// The run.

pub fn run_cluster(s: &ClusterScenario) -> ClusterReport {
    run_with(s, simulate)
}

/// A scenario for one scripted session: no twins, the given faults, judged strictly.
fn scripted(seed: u64, run_for: Duration, faults: Vec<Fault>) -> ClusterScenario {
    ClusterScenario {
        seed,
        planted: false,
        bug: None,
        run_for,
        net_latency_max: Duration::from_millis(20),
        sessions: 1,
        homes: vec![0, 1],
        sled_latency: vec![Duration::ZERO; PROJECTS.len()],
        twins: Vec::new(),
        faults,
        long_cut: false,
        strict_sessions: true,
        adversary: false,
        graceful_stops: false,
        cut_in_flight: false,
    }
}

/// A scripted run of `run_for` in which `r1` is cut off from the engine from 4 s to `until`,
/// with `bug` planted.
fn r1_cut(
    seed: u64,
    until: Duration,
    run_for: Duration,
    bug: Option<PlantedBug>,
) -> ClusterScenario {
    let cut = Fault::CutFromEngine {
        replica: 0,
        at: Duration::from_secs(4),
        until,
    };
    let mut s = scripted(seed, run_for, vec![cut]);
    s.bug = bug;
    s
}

/// Runs `s` with one session on the client host, driven by `script`.
fn run_script<F, Fut>(s: &ClusterScenario, script: F) -> ClusterReport
where
    F: FnOnce(Session) -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    run_with(s, move |s, log| {
        let (mut sim, switch, hosts) = build(s, log);
        let mut session = Session::new(0, s.seed, log.clone(), s.run_for);
        session.strict_switches = true;
        sim.client(CLIENT_HOST, async move {
            script(session).await;
            Ok(())
        });
        drive(sim, s, log, switch, hosts)
    })
}

/// Sleeps until `at` on the simulated clock.
async fn until(at: Duration) {
    tokio::time::sleep(at.saturating_sub(now())).await;
}

impl Session {
    /// Starts the session through `replica`, then has every replica read it (each keeps it
    /// current from the engine's watch from then on).
    async fn start(&mut self, replica: usize) {
        while self.sid.is_none() && now() < self.end {
            self.init_at(replica).await;
        }
        for r in 0..REPLICAS.len() {
            let args = json!({"name": "list_projects", "arguments": {}});
            self.request(r, Op::List, "tools/call", args).await;
        }
        tokio::time::sleep(PROPAGATION).await;
    }
}

/// Rolling graceful stops under calls (issue 30): the sleds dial the balancer ([`balancer`]);
/// one session calls `create_story` on beta without a pause through the replicas that do not
/// hold it (their calls are relayed to the holder, sled latency 60 ms, so one is nearly always
/// running on its uplink), while the replica holding beta is asked to stop gracefully, as an
/// operator's SIGTERM, and to start again 3 s later; `rounds` times, each round stopping
/// whichever replica holds beta then. (i): every call succeeds.
/// `PlantedBug::StopWithoutDrain` (a stopping replica closes its uplinks at once) is caught by
/// (i).
pub fn run_graceful_stop(seed: u64, rounds: u32, bug: Option<PlantedBug>) -> ClusterReport {
    let round = Duration::from_secs(6);
    let mut s = scripted(
        seed,
        WARMUP + Duration::from_secs(4) + round * rounds,
        Vec::new(),
    );
    s.graceful_stops = true;
    s.sled_latency = vec![Duration::from_millis(60); PROJECTS.len()];
    s.bug = bug;
    run_script(&s, move |mut session| async move {
        until(WARMUP).await;
        session.start(0).await;
        let mut written = 0;
        for _ in 0..rounds {
            let holder = session.holder_of(PROJECTS[1]).await;
            let others: Vec<usize> = (0..REPLICAS.len()).filter(|r| *r != holder).collect();
            let log = session.log.clone();
            let t0 = now();
            session
                .log
                .note(format!("stopping {}, beta's holder", REPLICAS[holder]));
            tokio::spawn(async move {
                until(t0 + Duration::from_millis(700)).await;
                log.ask_stop(holder);
                until(t0 + Duration::from_millis(3_700)).await;
                log.ask_start(holder);
            });
            let mut i = 0;
            while now() < t0 + round {
                let through = others[i % others.len()];
                match i % 3 {
                    0 => session.create(through, Some(PROJECTS[1].to_owned())).await,
                    1 => {
                        written += 1;
                        session.board(through, Some(written)).await;
                    }
                    _ => session.board(through, None).await,
                }
                i += 1;
            }
        }
    })
}

impl Session {
    /// `board_set` of beta's key `k` to `value` through `replica`, or (`None`) `board_get`.
    async fn board(&mut self, replica: usize, value: Option<u64>) {
        let (op, params) = match value {
            Some(value) => (
                Op::BoardSet { value },
                json!({"name": "board_set", "arguments": {"project": PROJECTS[1], "key": "k", "value": value}}),
            ),
            None => (
                Op::BoardGet,
                json!({"name": "board_get", "arguments": {"project": PROJECTS[1], "key": "k"}}),
            ),
        };
        self.request(replica, op, "tools/call", params).await;
    }

    /// The replica holding `project`, as `list_projects` says (through the first replica that
    /// answers), once it is live somewhere.
    async fn holder_of(&mut self, project: &str) -> usize {
        loop {
            for r in 0..REPLICAS.len() {
                let args = json!({"name": "list_projects", "arguments": {}});
                if let Outcome::Ok(v) = self.request(r, Op::List, "tools/call", args).await {
                    let held = v["projects"].as_array().and_then(|ps| {
                        ps.iter()
                            .find(|p| p["name"] == project && p["live"] == true)
                            .and_then(|p| p["replica"].as_str())
                            .and_then(|name| REPLICAS.iter().position(|n| *n == name))
                    });
                    if let Some(h) = held {
                        return h;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// One session switching twice in quick succession through two replicas (its second switch
/// sent as soon as the first is answered, away from its default and back), then, once
/// [`PROPAGATION`] has passed, calling `create_story` without `project` through the third:
/// the call must land on the second switch's project ((d), judged strictly). `rounds` times,
/// rotating the replicas; no faults, no twins.
pub fn run_switch_race(seed: u64, rounds: usize) -> ClusterReport {
    let round = PROPAGATION + Duration::from_millis(500);
    let s = scripted(seed, WARMUP + round * (rounds as u32 + 3), Vec::new());
    run_script(&s, move |mut session| async move {
        until(WARMUP).await;
        session.start(0).await;
        for i in 0..rounds {
            let (a, b, c) = (i % 3, (i + 1) % 3, (i + 2) % 3);
            let back = session
                .default
                .as_ref()
                .map_or(PROJECTS[0].to_owned(), |d| d.0.clone());
            let away = PROJECTS.iter().find(|p| **p != back).expect("two projects");
            session.switch(a, (*away).to_owned()).await;
            session.switch(b, back).await;
            tokio::time::sleep(PROPAGATION + Duration::from_millis(200)).await;
            session.create(c, None).await;
        }
    })
}

/// A session on `r1`, which holds alpha's sled, calls beta (whose sled `r2` holds) through `r1`
/// while `r1` is cut off from the engine: the relays cannot be sent, so each call waits for
/// the engine and then succeeds, or is answered `not_sent`; never `unknown` ((g)). With
/// `bug`, the replicas run with that planted bug.
pub fn run_relays_while_cut(seed: u64, bug: Option<PlantedBug>) -> ClusterReport {
    let secs = Duration::from_secs;
    let s = r1_cut(seed, secs(12), secs(20), bug);
    run_script(&s, move |mut session| async move {
        until(WARMUP).await;
        session.start(0).await;
        until(secs(4) + NOTICE).await;
        for _ in 0..6 {
            session.create(0, Some(PROJECTS[1].to_owned())).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// A session on `r1`, which holds alpha's sled, calls beta (whose sled `r2` holds, answering
/// in 1.5 s) through `r1`, one call after another, while `r1` is cut off from the engine for
/// 3 s, 300 ms into each of `rounds` rounds of 8 s: each cut catches a relay in flight, whose
/// owner answers it meanwhile. (j): no call is answered `unknown`; each relay lost in flight
/// is recovered from its owner once the engine is back (its answer, or "never taken" and sent
/// again). With `bug`, the replicas run with that planted bug:
/// `PlantedBug::NoOutcomeRecovery` is caught by (j), `PlantedBug::ForgetOutcomes` by (b).
pub fn run_relay_cut_in_flight(seed: u64, rounds: u32, bug: Option<PlantedBug>) -> ClusterReport {
    let round = Duration::from_secs(8);
    let start = WARMUP + Duration::from_secs(2);
    let faults = (0..rounds)
        .map(|k| Fault::CutFromEngine {
            replica: 0,
            at: start + round * k + Duration::from_millis(300),
            until: start + round * k + Duration::from_millis(3_300),
        })
        .collect();
    let end = start + round * rounds;
    let mut s = scripted(seed, end + Duration::from_secs(2), faults);
    s.cut_in_flight = true;
    s.sled_latency = vec![Duration::ZERO, Duration::from_millis(1_500)];
    s.bug = bug;
    run_script(&s, move |mut session| async move {
        until(WARMUP).await;
        session.start(0).await;
        until(start).await;
        while now() < end {
            session.create(0, Some(PROJECTS[1].to_owned())).await;
        }
    })
}

/// One session switches through `r1` while `r1` is cut off from the engine (the write of its
/// record fails; the switch is answered), then, long after the cut has healed, switches
/// through `r1` to the same project again, and calls `create_story` without `project`
/// through every replica: each call must land on that project ((d), judged strictly).
pub fn run_failed_session_write(seed: u64) -> ClusterReport {
    let secs = Duration::from_secs;
    let s = r1_cut(seed, secs(6), secs(16), None);
    run_script(&s, move |mut session| async move {
        until(WARMUP).await;
        session.start(1).await;
        until(Duration::from_millis(5_500)).await;
        session.switch(0, PROJECTS[1].to_owned()).await;
        until(secs(6) + RECOVERY + secs(1)).await;
        session.switch(0, PROJECTS[1].to_owned()).await;
        tokio::time::sleep(PROPAGATION + Duration::from_millis(200)).await;
        for r in [1, 2, 0] {
            session.create(r, None).await;
        }
    })
}

/// (l): one session begins through `r1` while `r1` is cut off from the engine (at a moment
/// of the cut drawn from the seed), initializing again after each `503` until an id is given
/// out, and uses it at once through every replica, then calls `create_story` through each.
/// Every id given out must be known everywhere. `PlantedBug::HandOutUnwrittenSession` (the id
/// given out though the engine did not take the record) is caught by (l).
pub fn run_session_begun_through_a_cut_replica(
    seed: u64,
    bug: Option<PlantedBug>,
) -> ClusterReport {
    let secs = Duration::from_secs;
    let s = r1_cut(seed, secs(9), secs(20), bug);
    let begin = secs(4) + Duration::from_millis(350 * (seed % 10));
    run_script(&s, move |mut session| async move {
        until(begin).await;
        session.start(0).await;
        for r in [1, 2, 0] {
            session.create(r, Some(PROJECTS[r % 2].to_owned())).await;
        }
    })
}

fn run_with(
    s: &ClusterScenario,
    simulate: impl FnOnce(&ClusterScenario, &Arc<Log>) -> SimResult,
) -> ClusterReport {
    super::init_logging();
    let started = std::time::Instant::now();
    let log = Arc::new(Log::default());
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| simulate(s, &log)));
    let mut violations = std::mem::take(&mut *lock(&log.violations));
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
    let execs = std::mem::take(&mut *lock(&log.execs));
    let calls = std::mem::take(&mut *lock(&log.calls));
    let notes = std::mem::take(&mut *lock(&log.notes));
    let mut coverage = std::mem::take(&mut *lock(&log.coverage));
    violations.extend(judge(s, &execs, &calls, &mut coverage));
    // Everything in time order (a call at its answer), so that the first difference between
    // two runs is the first thing that went otherwise.
    let mut timed: Vec<(Duration, String)> = calls.iter().map(|c| (c.done, c.line())).collect();
    timed.extend(execs.iter().map(|e| (e.at, e.line())));
    timed.extend(notes);
    timed.sort_by_key(|(at, _)| *at);
    let trace: Vec<String> = timed.into_iter().map(|(_, line)| line).collect();
    let hash = super::trace_hash(&trace, sim_time);
    ClusterReport {
        seed: s.seed,
        scenario: s.to_string(),
        violations,
        trace,
        trace_hash: hash,
        sim_time,
        wall: started.elapsed(),
        coverage,
    }
}

type SimResult = Result<Duration, (Duration, String)>;

/// What the fault driver does to the simulation at one instant.
type FaultAction = Box<dyn FnOnce(&mut turmoil::Sim<'_>, &mut Vec<String>)>;

fn simulate(s: &ClusterScenario, log: &Arc<Log>) -> SimResult {
    let (mut sim, switch, mut hosts) = build(s, log);
    if s.adversary {
        adversary::add(&mut sim, s, log);
        hosts.push(adversary::MALLORY_HOST.to_owned());
    }
    let client_log = log.clone();
    let (seed, sessions, end) = (s.seed, s.sessions, s.run_for);
    let (routable_by, strict) = (s.routable_by(), s.strict_sessions);
    sim.client(CLIENT_HOST, async move {
        let log = client_log;
        let mut tasks = Vec::new();
        for idx in 0..sessions {
            let mut session = Session::new(idx, seed, log.clone(), end);
            session.strict_switches = strict;
            tasks.push(tokio::spawn(session.run()));
        }
        tokio::time::sleep(end.saturating_sub(now())).await;
        let probes: Vec<_> = (0..REPLICAS.len())
            .map(|r| tokio::spawn(probe_routable(r, routable_by, log.clone())))
            .collect();
        for t in tasks.into_iter().chain(probes) {
            t.await?;
        }
        Ok(())
    });
    drive(sim, s, log, switch, hosts)
}

/// The engine, the replicas and the sleds; the engine's switch; every host's name (the client
/// host's included, to be added by the caller).
fn build<'a>(s: &ClusterScenario, log: &Arc<Log>) -> (turmoil::Sim<'a>, EngineSwitch, Vec<String>) {
    let mut sim = turmoil::Builder::new()
        .rng_seed(s.seed)
        .simulation_duration(s.routable_by() + Duration::from_secs(60))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(s.net_latency_max)
        .build();

    let model = Model::new();
    let switch = EngineSwitch::default();
    {
        let (model, switch) = (model.clone(), switch.clone());
        sim.host(ENGINE_HOST, move || {
            let (model, switch) = (model.clone(), switch.clone());
            async move {
                serve_engine_switched(model, ENGINE_PORT, switch).await?;
                Ok(())
            }
        });
    }
    // Every host, for cutting and holding a replica's links.
    let mut hosts: Vec<String> = vec![ENGINE_HOST.to_owned()];
    for (i, name) in REPLICAS.iter().enumerate() {
        sim.host(*name, replica_software(s, i, log.clone()));
        hosts.push((*name).to_owned());
    }
    for (i, p) in PROJECTS.iter().enumerate() {
        let host = format!("sled-{p}");
        sim.host(
            host.as_str(),
            sled_software(
                host.clone(),
                i,
                s.homes[i],
                s.sled_latency[i],
                s.seed ^ (i as u64 + 1),
                log.clone(),
                s.graceful_stops,
            ),
        );
        hosts.push(host);
    }
    if s.graceful_stops {
        sim.host(LB_HOST, balancer);
        hosts.push(LB_HOST.to_owned());
    }
    hosts.push(CLIENT_HOST.to_owned());
    (sim, switch, hosts)
}

/// Adds the twins and applies the faults on schedule while the simulation runs to its end.
fn drive(
    mut sim: turmoil::Sim<'_>,
    s: &ClusterScenario,
    log: &Arc<Log>,
    switch: EngineSwitch,
    mut hosts: Vec<String>,
) -> SimResult {
    let mut actions: Vec<(Duration, u8, FaultAction)> = Vec::new();
    for t in &s.twins {
        let host = format!("twin-{}", PROJECTS[t.project]);
        let software = sled_software(
            host.clone(),
            t.project,
            t.replica,
            s.sled_latency[t.project],
            s.seed ^ 0x7717,
            log.clone(),
            false,
        );
        let h2 = host.clone();
        let replica = REPLICAS[t.replica];
        actions.push((
            t.at,
            1,
            Box::new(move |sim, hosts| {
                sim.host(host.as_str(), software);
                hosts.push(host);
            }),
        ));
        // Power loss: nobody hears its sockets close (a plain crash's FINs go out in an order
        // that is not the same from run to run).
        actions.push((
            t.until,
            0,
            Box::new(move |sim, _| {
                sim.partition(h2.as_str(), replica);
                sim.crash(h2.as_str());
            }),
        ));
    }
    for f in &s.faults {
        let (at, until) = f.window();
        match f.clone() {
            Fault::CrashReplica { replica, .. } => {
                let name = REPLICAS[replica];
                actions.push((
                    at,
                    1,
                    Box::new(move |sim, hosts| {
                        for h in hosts.iter().filter(|h| *h != name) {
                            sim.partition(name, h.as_str());
                        }
                        sim.crash(name);
                    }),
                ));
                actions.push((
                    until,
                    0,
                    Box::new(move |sim, hosts| {
                        for h in hosts.iter().filter(|h| *h != name) {
                            sim.repair(name, h.as_str());
                        }
                        sim.bounce(name);
                    }),
                ));
            }
            Fault::CutFromEngine { replica, .. } => {
                let name = REPLICAS[replica];
                actions.push((
                    at,
                    1,
                    Box::new(move |sim, _| sim.partition(name, ENGINE_HOST)),
                ));
                actions.push((
                    until,
                    0,
                    Box::new(move |sim, _| sim.repair(name, ENGINE_HOST)),
                ));
            }
            Fault::PauseReplica { replica, .. } => {
                let name = REPLICAS[replica];
                actions.push((
                    at,
                    1,
                    Box::new(move |sim, hosts| {
                        for h in hosts.iter().filter(|h| *h != name) {
                            sim.hold(name, h.as_str());
                        }
                    }),
                ));
                actions.push((
                    until,
                    0,
                    Box::new(move |sim, hosts| {
                        for h in hosts.iter().filter(|h| *h != name) {
                            sim.release(name, h.as_str());
                        }
                    }),
                ));
            }
            Fault::RestartEngine { .. } => {
                let (down, up) = (switch.clone(), switch.clone());
                actions.push((at, 1, Box::new(move |_, _| down.set(false))));
                actions.push((until, 0, Box::new(move |_, _| up.set(true))));
            }
        }
    }
    actions.sort_by_key(|(at, order, _)| (*at, *order));
    let mut actions = actions.into_iter().peekable();
    loop {
        let t = sim.elapsed();
        while let Some((_, _, action)) = actions.next_if(|(at, _, _)| *at <= t) {
            action(&mut sim, &mut hosts);
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

/// The JSON-RPC error kinds a `create_story` may end with.
const CALL_ERRORS: [&str; 6] = [
    "uplink_lost",
    "timeout",
    "sled_not_connected",
    "sled_elsewhere",
    "too_many_calls",
    "cancelled",
];

/// How long a replica may take to notice it cannot reach the engine (the engine client's
/// silence limit, a heartbeat, and the network's latency).
const NOTICE: Duration = Duration::from_secs(3);

/// Whether an error says the call never reached a sled.
fn not_sent(kind: &str, data: &Value) -> bool {
    matches!(kind, "sled_not_connected" | "sled_elsewhere") || data["outcome"] == "not_sent"
}

/// Adds `line` to `out`, at most `cap` of each `class`; counts the rest.
struct Findings {
    out: Vec<String>,
    counts: BTreeMap<&'static str, usize>,
}

impl Findings {
    const CAP: usize = 6;

    fn push(&mut self, class: &'static str, line: String) {
        let n = self.counts.entry(class).or_default();
        *n += 1;
        if *n <= Self::CAP {
            self.out.push(line);
        }
    }

    fn finish(mut self) -> Vec<String> {
        for (class, n) in &self.counts {
            if *n > Self::CAP {
                self.out
                    .push(format!("{class}: {} more like these", n - Self::CAP));
            }
        }
        self.out
    }
}

fn judge(
    s: &ClusterScenario,
    execs: &[Exec],
    calls: &[Call],
    coverage: &mut BTreeMap<String, usize>,
) -> Vec<String> {
    let mut f = Findings {
        out: Vec::new(),
        counts: BTreeMap::new(),
    };
    let mut cover = |k: &str, n: usize| *coverage.entry(k.to_owned()).or_default() += n;
    cover("execs", execs.len());
    cover("calls", calls.len());
    cover("twins", s.twins.len());
    cover("faults", s.faults.len());

    // (b) at most once, and the execs by name.
    let mut by_name: BTreeMap<&str, Vec<&Exec>> = BTreeMap::new();
    for e in execs {
        by_name.entry(e.name.as_str()).or_default().push(e);
    }
    for (name, es) in &by_name {
        if es.len() > 1 {
            let lines: Vec<String> = es.iter().map(|e| e.line()).collect();
            f.push(
                "(b) executed twice",
                format!("(b) call {name} was executed {} times: {lines:?}", es.len()),
            );
        }
    }

    // (h1) every story executed was asked for by a client.
    let asked: BTreeSet<&str> = calls
        .iter()
        .filter_map(|c| match &c.op {
            Op::Create { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    for e in execs {
        if !asked.contains(e.name.as_str()) {
            f.push(
                "(h1) never asked for",
                format!(
                    "(h1) a sled executed a story no client asked for: {}",
                    e.line()
                ),
            );
        }
    }

    // (a1) per instance.
    let mut newest: BTreeMap<&str, &Exec> = BTreeMap::new();
    for e in execs {
        match e.epoch {
            None => f.push(
                "(a1) no epoch",
                format!(
                    "(a1) a call executed on an uplink welcomed without an epoch: {}",
                    e.line()
                ),
            ),
            Some(epoch) => {
                if let Some(prev) = newest.get(e.instance.as_str()) {
                    if prev.epoch.is_some_and(|p| p > epoch) {
                        f.push(
                            "(a1) epoch went down",
                            format!(
                                "(a1) {} executed at epoch {epoch} after epoch {:?}: {} then {}",
                                e.instance,
                                prev.epoch,
                                prev.line(),
                                e.line()
                            ),
                        );
                    }
                }
                newest.insert(e.instance.as_str(), e);
            }
        }
    }

    // (a2) across instances.
    let epochs: BTreeSet<u64> = execs.iter().filter_map(|e| e.epoch).collect();
    cover("epochs", epochs.len());
    let (mut judged, mut excused) = (0, 0);
    for (i, x) in execs.iter().enumerate() {
        let Some(e1) = x.epoch else { continue };
        let newer = execs[..i].iter().find(|y| {
            y.project == x.project
                && y.instance != x.instance
                && y.epoch.is_some_and(|e2| e2 > e1)
                && y.at + STALE_GRACE < x.at
        });
        let Some(y) = newer else { continue };
        if s.impaired(x.replica, y.at, x.at) {
            excused += 1;
            continue;
        }
        judged += 1;
        f.push(
            "(a2) stale epoch executed",
            format!(
                "(a2) {} executed a call at epoch {e1} {} ms after {} executed one at epoch {:?}, its replica {} hearing the engine all along: {} after {}",
                x.instance,
                (x.at - y.at).as_millis(),
                y.instance,
                y.epoch,
                REPLICAS[x.replica],
                x.line(),
                y.line()
            ),
        );
    }
    cover("(a2) stale", judged);
    cover("(a2) excused: replica impaired", excused);

    // Per call: (b), (c), (d).
    let mut defaults_checked = 0;
    let mut unreachable_checked = 0;
    for c in calls {
        // (k) beta's board loses nothing answered: a read sees the last write answered before
        // it was sent, and revisions never go back (a write's is above every one seen before).
        if let (Op::BoardSet { .. } | Op::BoardGet, Outcome::Ok(v)) = (&c.op, &c.outcome) {
            let before: Vec<&Call> = calls
                .iter()
                .filter(|w| w.done < c.sent && matches!(w.outcome, Outcome::Ok(_)))
                .collect();
            let acked = before
                .iter()
                .filter_map(|w| match w.op {
                    Op::BoardSet { value } => Some(value),
                    _ => None,
                })
                .max();
            let seen = before
                .iter()
                .filter(|w| matches!(w.op, Op::BoardSet { .. } | Op::BoardGet))
                .filter_map(|w| match &w.outcome {
                    Outcome::Ok(v) => v["revision"].as_u64(),
                    _ => None,
                })
                .max();
            let revision = v["revision"].as_u64();
            let mut lost = None;
            if let (Some(seen), true) = (seen, acked.is_some()) {
                cover("(k) judged", 1);
                let gone_back = match c.op {
                    Op::BoardSet { .. } => revision.is_none_or(|r| r <= seen),
                    _ => revision.is_none_or(|r| r < seen),
                };
                if gone_back {
                    lost = Some(format!("revision {revision:?} after {seen} was seen"));
                }
            }
            if let (Op::BoardGet, Some(acked)) = (&c.op, acked) {
                let read = v["value"].as_u64();
                if read.is_none_or(|r| r < acked) {
                    lost = Some(format!(
                        "read {read:?} after the write of {acked} was answered"
                    ));
                }
            }
            if let Some(why) = lost {
                f.push(
                    "(k) an acknowledged board write lost",
                    format!("(k) {why}: {}", c.line()),
                );
            }
        }
        // (i) a graceful stop fails no call.
        if s.graceful_stops
            && matches!(c.op, Op::Create { .. } | Op::BoardSet { .. } | Op::BoardGet)
        {
            cover("(i) judged", 1);
            if !matches!(c.outcome, Outcome::Ok(_)) {
                f.push(
                    "(i) failed in a graceful stop",
                    format!(
                        "(i) a call failed while replicas only stopped gracefully: {}",
                        c.line()
                    ),
                );
            }
        }
        // (j) no call answered unknown while every owner lived.
        if s.cut_in_flight && matches!(c.op, Op::Create { .. }) {
            if s.impaired(c.replica, c.sent, c.done) {
                cover("(j) judged across a cut", 1);
            }
            if let Outcome::Rpc(_, data) = &c.outcome {
                if data["outcome"] == "unknown" {
                    f.push(
                        "(j) unknown though every owner lived",
                        format!(
                            "(j) answered `unknown`, though no replica died and the engine came back: {}",
                            c.line()
                        ),
                    );
                }
            }
        }
        let global = s.any_impaired(c.sent, c.done);
        // (c) answered in time, properly.
        match &c.outcome {
            Outcome::Ok(v) => {
                cover("answers ok", 1);
                if let Op::Switch { project } = &c.op {
                    if v["project"] != json!(project) {
                        f.push(
                            "(c) switch misanswered",
                            format!("(c) switch_project answered another project: {}", c.line()),
                        );
                    }
                }
            }
            Outcome::Rpc(kind, _) => {
                cover(&format!("error {kind}"), 1);
                let allowed =
                    matches!(c.op, Op::Create { .. }) && CALL_ERRORS.contains(&kind.as_str());
                if !allowed {
                    f.push(
                        "(c) unexpected error",
                        format!("(c) an error the call may not end with: {}", c.line()),
                    );
                }
            }
            Outcome::ToolError(_) => {
                f.push("(c) tool error", format!("(c) a tool error: {}", c.line()))
            }
            Outcome::Http(status, _) => {
                cover(&format!("HTTP {status}"), 1);
                // (l) a session handed out is known on every replica, always.
                if *status == 404 {
                    f.push(
                        "(l) session handed out unknown",
                        format!(
                            "(l) a session id given out by initialize was unknown: {}",
                            c.line()
                        ),
                    );
                } else if !(*status == 503 && global) {
                    f.push(
                        "(c) bad status",
                        format!("(c) HTTP {status} outside any fault: {}", c.line()),
                    );
                }
            }
            Outcome::TimedOut | Outcome::Transport(_) => {
                cover("no answer", 1);
                if !s.silenced(c.replica, c.conn_since.min(c.sent), c.done) {
                    f.push(
                        "(c) no answer",
                        format!(
                            "(c) no answer though {} was neither crashed nor paused: {}",
                            REPLICAS[c.replica],
                            c.line()
                        ),
                    );
                }
            }
        }
        let Op::Create {
            name,
            project,
            default,
        } = &c.op
        else {
            continue;
        };
        let executed = by_name
            .get(name.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        // (b) an answer means executed; not sent means not executed.
        match &c.outcome {
            Outcome::Ok(_) => {
                if executed.is_empty() {
                    f.push(
                        "(b) answered, not executed",
                        format!("(b) a result for a call no sled executed: {}", c.line()),
                    );
                }
                if let (Some(p), Some(e)) = (project, executed.first()) {
                    if e.project != *p {
                        f.push(
                            "(b) wrong project",
                            format!(
                                "(b) executed in {} though it named {p}: {}",
                                e.project,
                                c.line()
                            ),
                        );
                    }
                }
            }
            Outcome::Rpc(kind, data) if not_sent(kind, data) && !executed.is_empty() => f.push(
                "(b) not sent, executed",
                format!(
                    "(b) answered as not sent, yet executed: {} / {}",
                    c.line(),
                    executed[0].line()
                ),
            ),
            _ => {}
        }
        // (g) "unknown" only of a call that may have reached a sled.
        if s.cut_throughout(c.replica, c.sent, c.done) {
            unreachable_checked += 1;
            if let Outcome::Rpc(kind, data) = &c.outcome {
                if kind == "uplink_lost" && data["reason"] == "owner_lost" {
                    f.push(
                        "(g) unknown though not sent",
                        format!(
                            "(g) answered as taken by the sled's replica and lost (unknown), though its replica could not reach the engine all along: {}",
                            c.line()
                        ),
                    );
                }
            }
        }
        // (d) the default, once propagated.
        let Some((want, switch_sent, switch_done)) = default else {
            continue;
        };
        if c.sent < *switch_done + PROPAGATION || s.any_impaired(*switch_sent, c.done) {
            continue;
        }
        // A session write that failed (its replica could not reach the engine) leaves that
        // replica's copy of the session apart from the engine's for good: not judged here
        // (fixed: a failed write is written again at the next use; judged with
        // `strict_sessions`, which the sweep sets).
        let tainted = calls.iter().any(|x| {
            x.who == c.who
                && matches!(x.op, Op::Switch { .. } | Op::Init)
                && x.done <= c.sent
                && s.impaired(x.replica, x.sent, x.done)
        });
        if tainted && !s.strict_sessions {
            continue;
        }
        defaults_checked += 1;
        // The session's last switches before the call, for the report.
        let switches = || {
            let mut last: Vec<String> = calls
                .iter()
                .filter(|x| x.who == c.who && matches!(x.op, Op::Switch { .. }) && x.done <= c.sent)
                .map(Call::line)
                .collect();
            last.drain(..last.len().saturating_sub(2));
            last
        };
        if let Some(e) = executed.first() {
            if e.project != *want {
                f.push(
                    "(d) wrong default",
                    format!(
                        "(d) a call without project landed in {} though the session's default is {want} (set {}..{} ms): {}; last switches: {:?}",
                        e.project,
                        switch_sent.as_millis(),
                        switch_done.as_millis(),
                        c.line(),
                        switches()
                    ),
                );
            }
        }
        if let Outcome::Rpc(_, data) = &c.outcome {
            if let Some(p) = data["project"].as_str().filter(|p| p != want) {
                f.push(
                    "(d) wrong default",
                    format!(
                        "(d) a call without project failed naming {p} though the session's default is {want}: {}",
                        c.line()
                    ),
                );
            }
        }
    }
    cover("(d) checked", defaults_checked);
    cover("(g) checked", unreachable_checked);
    f.finish()
}
