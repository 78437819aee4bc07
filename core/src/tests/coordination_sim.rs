//! The coordination promises under a seeded, replayable simulation of the real [`Gateway`]
//! (through the [`Harness`]: HTTP-shaped requests, uplink frames, a fake clock), checked after
//! every step by an oracle of full knowledge.
//!
//! **The world** (drawn from the seed, ChaCha8): 2–3 projects, each with an emulated sled whose
//! `move_story` names its story as a leasable resource and which applies the sled's fence rule
//! itself (per resource the highest fence accepted; a lower fence is refused `stale_fence`;
//! unfenced writes are accepted) and logs every write it applies; 2–4 stories per project;
//! 2–6 sessions and sometimes an agent handle (a caller without a session). Each step picks an
//! op: `checkin`, `claim` (TTL 1–20 s, sometimes none, sometimes over the maximum), `renew`,
//! `release`, `claims`, a write (`move_story`, holding or not; its frame sometimes reaches the
//! sled a few steps later), `send` (direct or channel), `inbox` (peek or not, small limits),
//! `board_set`/`board_get`/`board_delete` (with and without `if_revision`), `wait` (parked,
//! answered later), a sled event, the end of a session (DELETE, then a new one), a sled
//! reconnecting (its hello carries its fence high-water mark), a gateway restart (a new
//! `Gateway`; the sleds, with their fence tables, reconnect; sessions start again), and time:
//! 1 ms, exactly to the next lease expiry (then the holder and others race at that instant),
//! to 1 ms before one, past a TTL (a holder paused while its write is in flight), or a few
//! seconds.
//!
//! **The oracle** is a model of the coordination rules (`core/src/coord` module docs) fed with
//! every answer and the fake clock's instants; time advances timer by timer, and the checks run
//! at each instant. Every answer is compared with the model: holdings never overlap, fences
//! only grow per project (also across releases, expiries, reconnects and restarts: above the
//! sled's high-water mark), writes are refused (`lease_held`) or fenced or unfenced exactly as
//! the live lease says, the sled never applies a lower fence after a higher one, renew and
//! release of what is not held are typed errors, leases live exactly `[t, t+ttl)` (the
//! gateway's own lease count too), each lost lease is reported once (in `lost` or in a wait's
//! `reasons`), inbox pages neither skip nor repeat, board revisions are never reused, answers
//! name only their own project, and no wakeup is lost: a parked wait with something pending is
//! a violation at the instant it happens, and a wait that times out must have had nothing.
//!
//! `COORD_SIM_SEEDS=N` (else `DST_SEEDS=N`) sets the sweep (default 300), `COORD_SIM_SEED=S`
//! replays one seed and prints its step log; `DST_FRESH_FROM` swaps its last quarter for fresh
//! seeds from there, as CI does. With `--features planted-bugs`, one test per planted coordination bug
//! ([`crate::coord::CoordBug`]) shows the sweep catches it and that the seed replays.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use super::Harness;
use crate::coord::Limits;
use crate::{Config, HttpMethod, HttpToken, UplinkId};

#[cfg(feature = "planted-bugs")]
use crate::coord::CoordBug;

#[cfg(feature = "planted-bugs")]
type Bug = Option<CoordBug>;
/// Without the feature there is nothing to plant.
#[cfg(not(feature = "planted-bugs"))]
#[derive(Debug, Clone, Copy)]
struct Bug;

const ALL_PROJECTS: [&str; 3] = ["alpha", "beta", "gamma"];
const STEPS: usize = 150;
const LEASE_TTL: Duration = Duration::from_secs(10);
const LEASE_TTL_MAX: Duration = Duration::from_secs(30);
const MAX_WAIT: Duration = Duration::from_secs(25);
const MAX_MESSAGE_REASONS: usize = 32;
const FENCE_META: &str = "io.mcp-gateway/fence";
const AGENT_META: &str = "io.mcp-gateway/agent";

fn config(bug: Bug) -> Config {
    #[allow(unused_mut)]
    let mut coordination = Limits {
        lease_ttl: LEASE_TTL,
        lease_ttl_max: LEASE_TTL_MAX,
        max_wait: MAX_WAIT,
        ..Limits::default()
    };
    #[cfg(feature = "planted-bugs")]
    {
        coordination.planted = bug;
    }
    #[cfg(not(feature = "planted-bugs"))]
    let Bug = bug;
    Config {
        probe_interval: Duration::ZERO,
        coordination,
        ..Config::default()
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn kind(r: &Value) -> String {
    r["error"]["data"]["kind"]
        .as_str()
        .unwrap_or("<none>")
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// The model.

#[derive(Debug, Clone)]
struct MLease {
    holder: String,
    fence: u64,
    ttl: Duration,
    granted: Instant,
    expires_at: Instant,
}

#[derive(Debug, Clone)]
struct MMsg {
    from: String,
    to: Option<String>,
    at: Instant,
    expires_at: Instant,
    body: String,
}

#[derive(Debug, Clone)]
struct MEntry {
    value: Value,
    revision: u64,
    set_by: String,
    expires_at: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Lost {
    project: String,
    resource: String,
    fence: u64,
    at: Instant,
}

#[derive(Debug, Default)]
struct Member {
    joined: u64,
    cursor: u64,
    event_cursor: u64,
    lost: Vec<Lost>,
    /// Resources it was refused on, since released: when.
    released: BTreeMap<String, Instant>,
}

#[derive(Debug, Default)]
struct PModel {
    /// The highest fence granted in this gateway's life, or the sled's high-water mark.
    last_fence: u64,
    /// The sled reported its high-water mark in this gateway's life.
    floor_known: bool,
    leases: BTreeMap<String, MLease>,
    refused: BTreeMap<String, BTreeSet<String>>,
    msg_seq: u64,
    msgs: BTreeMap<u64, MMsg>,
    board_rev: u64,
    board: BTreeMap<String, MEntry>,
    event_seq: u64,
    events: Vec<(u64, Instant)>,
    members: BTreeMap<String, Member>,
}

/// What is pending for an agent in a project, each with the instant it was committed.
#[derive(Debug, Default)]
struct Pending {
    messages: Vec<(u64, Instant)>,
    lost: Vec<Lost>,
    released: Vec<(String, Instant)>,
    events: Vec<(u64, Instant)>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.lost.is_empty()
            && self.released.is_empty()
            && self.events.is_empty()
    }

    /// What is pending, with commit instants in ms from `origin`.
    fn show(&self, origin: Instant) -> String {
        let t = |i: &Instant| ms(i.duration_since(origin));
        format!(
            "messages {:?}, lost {:?}, released {:?}, events {:?}",
            self.messages
                .iter()
                .map(|(id, at)| (id, t(at)))
                .collect::<Vec<_>>(),
            self.lost
                .iter()
                .map(|l| (&l.resource, l.fence, t(&l.at)))
                .collect::<Vec<_>>(),
            self.released
                .iter()
                .map(|(r, at)| (r, t(at)))
                .collect::<Vec<_>>(),
            self.events
                .iter()
                .map(|(s, at)| (s, t(at)))
                .collect::<Vec<_>>(),
        )
    }

    /// The earliest commit instant among them.
    fn since(&self) -> Option<Instant> {
        let a = self.messages.iter().map(|m| m.1);
        let b = self.lost.iter().map(|l| l.at);
        let c = self.released.iter().map(|r| r.1);
        let d = self.events.iter().map(|e| e.1);
        a.chain(b).chain(c).chain(d).min()
    }
}

#[derive(Debug, Default)]
struct Model {
    p: BTreeMap<String, PModel>,
    /// The last instant a lease expired.
    last_expiry: Option<Instant>,
}

impl Model {
    fn pm(&mut self, p: &str) -> &mut PModel {
        self.p.entry(p.to_owned()).or_default()
    }

    fn touch(&mut self, p: &str, agent: &str) {
        let pm = self.pm(p);
        let (joined, event_cursor) = (pm.msg_seq, pm.event_seq);
        pm.members.entry(agent.to_owned()).or_insert(Member {
            joined,
            event_cursor,
            ..Member::default()
        });
    }

    fn live_lease(&self, p: &str, r: &str) -> Option<&MLease> {
        self.p.get(p)?.leases.get(r)
    }

    fn end_lease(&mut self, p: &str, r: &str, lost: bool, now: Instant) -> Option<MLease> {
        let pm = self.pm(p);
        let lease = pm.leases.remove(r)?;
        if lost {
            if let Some(m) = pm.members.get_mut(&lease.holder) {
                m.lost.push(Lost {
                    project: p.to_owned(),
                    resource: r.to_owned(),
                    fence: lease.fence,
                    at: now,
                });
            }
        }
        for a in pm.refused.remove(r).unwrap_or_default() {
            if let Some(m) = pm.members.get_mut(&a) {
                m.released.insert(r.to_owned(), now);
            }
        }
        Some(lease)
    }

    /// Everything due at `now` expires.
    fn tick(&mut self, now: Instant) {
        let names: Vec<String> = self.p.keys().cloned().collect();
        for p in names {
            let due: Vec<String> = self.p[&p]
                .leases
                .iter()
                .filter(|(_, l)| l.expires_at <= now)
                .map(|(r, _)| r.clone())
                .collect();
            for r in due {
                self.end_lease(&p, &r, true, now);
                self.last_expiry = Some(now);
            }
            let pm = self.pm(&p);
            pm.msgs.retain(|_, m| now < m.expires_at);
            pm.board.retain(|_, e| e.expires_at.is_none_or(|t| now < t));
        }
    }

    /// The next instant something in the model expires, after `now`.
    fn next_expiry(&self, now: Instant) -> Option<Instant> {
        let mut at: Option<Instant> = None;
        let mut see = |t: Instant| {
            if t > now && at.is_none_or(|a| t < a) {
                at = Some(t);
            }
        };
        for pm in self.p.values() {
            pm.leases.values().for_each(|l| see(l.expires_at));
            pm.msgs.values().for_each(|m| see(m.expires_at));
            pm.board
                .values()
                .filter_map(|e| e.expires_at)
                .for_each(&mut see);
        }
        at
    }

    fn unread_ids(&self, p: &str, agent: &str) -> Vec<u64> {
        let Some(pm) = self.p.get(p) else {
            return Vec::new();
        };
        let Some(m) = pm.members.get(agent) else {
            return Vec::new();
        };
        pm.msgs
            .iter()
            .filter(|(id, msg)| match &msg.to {
                Some(to) => to == agent && **id > m.cursor,
                None => **id > m.cursor.max(m.joined) && msg.from != agent,
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// A read of `agent`'s inbox: the page, `more`, and what is unread after.
    fn read(&mut self, p: &str, agent: &str, peek: bool, limit: usize) -> (Vec<u64>, bool, usize) {
        let all = self.unread_ids(p, agent);
        let more = all.len() > limit;
        let page: Vec<u64> = all.iter().copied().take(limit).collect();
        if let (false, Some(&last)) = (peek, page.last()) {
            let pm = self.pm(p);
            if let Some(m) = pm.members.get_mut(agent) {
                m.cursor = last;
            }
            pm.msgs
                .retain(|id, msg| !(msg.to.as_deref() == Some(agent) && *id <= last));
        }
        let unread = self.unread_ids(p, agent).len();
        (page, more, unread)
    }

    fn take_lost(&mut self, agent: &str) -> Vec<Lost> {
        let mut all = Vec::new();
        for pm in self.p.values_mut() {
            if let Some(m) = pm.members.get_mut(agent) {
                all.append(&mut m.lost);
            }
        }
        all.sort();
        all
    }

    fn pending(&self, p: &str, agent: &str) -> Pending {
        let Some(pm) = self.p.get(p) else {
            return Pending::default();
        };
        let Some(m) = pm.members.get(agent) else {
            return Pending::default();
        };
        Pending {
            messages: self
                .unread_ids(p, agent)
                .into_iter()
                .map(|id| (id, pm.msgs[&id].at))
                .collect(),
            lost: m.lost.clone(),
            released: m.released.iter().map(|(r, t)| (r.clone(), *t)).collect(),
            events: pm
                .events
                .iter()
                .filter(|(seq, _)| *seq > m.event_cursor)
                .copied()
                .collect(),
        }
    }

    /// A wait reported what was pending in `p`: reports are taken, messages stay unread.
    fn consume_wait(&mut self, p: &str, agent: &str) {
        let pm = self.pm(p);
        let seq = pm.event_seq;
        if let Some(m) = pm.members.get_mut(agent) {
            m.lost.clear();
            m.released.clear();
            m.event_cursor = seq;
        }
    }

    /// A session ended: its leases are released (not lost), it leaves every project.
    fn end_agent(&mut self, agent: &str, now: Instant) {
        let names: Vec<String> = self.p.keys().cloned().collect();
        for p in names {
            let held: Vec<String> = self.p[&p]
                .leases
                .iter()
                .filter(|(_, l)| l.holder == agent)
                .map(|(r, _)| r.clone())
                .collect();
            for r in held {
                self.end_lease(&p, &r, false, now);
            }
            let pm = self.pm(&p);
            pm.members.remove(agent);
            for set in pm.refused.values_mut() {
                set.remove(agent);
            }
            pm.refused.retain(|_, s| !s.is_empty());
        }
    }

    fn live_leases(&self) -> usize {
        self.p.values().map(|p| p.leases.len()).sum()
    }
}

// ---------------------------------------------------------------------------------------------
// The world.

#[derive(Debug, Clone)]
enum Who {
    Session(String),
    Handle(String),
}

#[derive(Debug, Clone)]
struct Agent {
    who: Who,
    name: String,
    home: usize,
}

#[derive(Debug, Clone)]
struct Applied {
    resource: String,
    fence: Option<u64>,
    by: String,
}

#[derive(Debug)]
struct Sled {
    project: String,
    uplink: UplinkId,
    /// Per resource, the highest fence accepted. Kept across reconnects and gateway restarts.
    table: BTreeMap<String, u64>,
    applied: Vec<Applied>,
    /// Frames received, applied at their step (a write in flight).
    queue: Vec<(usize, Value)>,
    event_seq: u64,
}

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Fenced(u64),
    Unfenced,
    Refused { holder: String, expires_in_ms: u64 },
}

#[derive(Debug)]
struct WriteExp {
    project: String,
    story: String,
    by: String,
    expect: Expect,
    delay: usize,
    sent: bool,
    epoch: u64,
}

#[derive(Debug)]
struct WaitExp {
    agent: String,
    projects: Vec<String>,
    at: Instant,
    deadline: Instant,
    /// Its session ended: the answer is `ended`.
    ending: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct SimStats {
    steps: u64,
    acquired: u64,
    conflicts: u64,
    fenced_sent: u64,
    refused_at_gateway: u64,
    stale_refused_at_sled: u64,
    applied: u64,
    woke: u64,
    timed_out: u64,
    expiry_races: u64,
    restarts: u64,
    reconnects: u64,
}

impl SimStats {
    fn add(&mut self, o: &SimStats) {
        self.steps += o.steps;
        self.acquired += o.acquired;
        self.conflicts += o.conflicts;
        self.fenced_sent += o.fenced_sent;
        self.refused_at_gateway += o.refused_at_gateway;
        self.stale_refused_at_sled += o.stale_refused_at_sled;
        self.applied += o.applied;
        self.woke += o.woke;
        self.timed_out += o.timed_out;
        self.expiry_races += o.expiry_races;
        self.restarts += o.restarts;
        self.reconnects += o.reconnects;
    }
}

struct Sim {
    seed: u64,
    rng: ChaCha8Rng,
    bug: Bug,
    projects: Vec<&'static str>,
    stories: Vec<Vec<String>>,
    h: Harness,
    origin: Instant,
    epoch: u64,
    sleds: Vec<Sled>,
    agents: Vec<Agent>,
    /// Names of agents whose session ended (still valid message recipients).
    gone: Vec<String>,
    m: Model,
    writes: BTreeMap<u64, WriteExp>,
    /// Per (project, resource), the newest lease granted on it, across restarts: (epoch,
    /// fence). A write under it is its live holder's, and the sled must not refuse it as stale.
    latest_grant: BTreeMap<(String, String), (u64, u64)>,
    write_tokens: BTreeSet<HttpToken>,
    waits: BTreeMap<HttpToken, WaitExp>,
    step: usize,
    nonce: u64,
    log: Vec<String>,
    violations: Vec<String>,
    stats: SimStats,
}

/// What one seed did.
struct Outcome {
    seed: u64,
    violations: Vec<String>,
    log: Vec<String>,
    stats: SimStats,
}

fn run(seed: u64, bug: Bug) -> Outcome {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc00d_0000_5eed_0001);
    let n = rng.random_range(2..=3);
    let projects: Vec<&'static str> = ALL_PROJECTS[..n].to_vec();
    let stories = projects
        .iter()
        .map(|p| {
            (1..=rng.random_range(2..=4))
                .map(|j| format!("{p}-{j}"))
                .collect()
        })
        .collect();
    let h = Harness::with_config(&projects, Some(projects[0]), config(bug), [1; 32]);
    let origin = h.now;
    let mut sim = Sim {
        seed,
        rng,
        bug,
        projects,
        stories,
        h,
        origin,
        epoch: 0,
        sleds: Vec::new(),
        agents: Vec::new(),
        gone: Vec::new(),
        m: Model::default(),
        writes: BTreeMap::new(),
        latest_grant: BTreeMap::new(),
        write_tokens: BTreeSet::new(),
        waits: BTreeMap::new(),
        step: 0,
        nonce: 0,
        log: Vec::new(),
        violations: Vec::new(),
        stats: SimStats::default(),
    };
    sim.setup();
    while sim.step < STEPS && sim.violations.is_empty() {
        sim.step += 1;
        sim.stats.steps += 1;
        sim.one_step();
        sim.process_sleds(false);
    }
    if sim.violations.is_empty() {
        sim.finish();
    }
    Outcome {
        seed,
        violations: sim.violations,
        log: sim.log,
        stats: sim.stats,
    }
}

impl Sim {
    fn t(&self) -> u64 {
        ms(self.h.now.duration_since(self.origin))
    }

    fn note(&mut self, what: String) {
        let line = format!("step {:3} t={:7}ms {what}", self.step, self.t());
        self.log.push(line);
    }

    fn bad(&mut self, what: String) {
        let v = format!(
            "seed {} step {} t={}ms: {what}",
            self.seed,
            self.step,
            self.t()
        );
        if self
            .violations
            .iter()
            .any(|seen| seen.ends_with(&format!(": {what}")))
        {
            return;
        }
        self.log.push(format!("VIOLATION {v}"));
        self.violations.push(v);
    }

    fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.rng.random_range(0..xs.len())].clone()
    }

    fn pick_project(&mut self) -> usize {
        self.rng.random_range(0..self.projects.len())
    }

    fn resource(&mut self, p: usize) -> String {
        let s = self.pick(&self.stories[p].clone());
        format!("story:{s}")
    }

    fn next_nonce(&mut self) -> u64 {
        self.nonce += 1;
        self.nonce
    }

    fn names_live(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.name.clone()).collect()
    }

    fn slot_of(&self, name: &str) -> Option<usize> {
        self.agents.iter().position(|a| a.name == name)
    }

    // ---- setup, sleds, restart -------------------------------------------------------------

    fn setup(&mut self) {
        for i in 0..self.projects.len() {
            let mut table = BTreeMap::new();
            if self.rng.random_bool(0.3) {
                let s = self.stories[i][0].clone();
                table.insert(format!("story:{s}"), self.rng.random_range(1..=40));
            }
            self.sleds.push(Sled {
                project: self.projects[i].to_owned(),
                uplink: UplinkId(u64::MAX),
                table,
                applied: Vec::new(),
                queue: Vec::new(),
                event_seq: 0,
            });
            self.connect_sled(i);
        }
        let sessions = self.rng.random_range(2..=6);
        for _ in 0..sessions {
            let home = self.pick_project();
            self.agents.push(Agent {
                who: Who::Session(String::new()),
                name: String::new(),
                home,
            });
        }
        if self.rng.random_bool(0.5) {
            let home = self.pick_project();
            self.agents.push(Agent {
                who: Who::Handle(String::new()),
                name: String::new(),
                home,
            });
        }
        for a in 0..self.agents.len() {
            self.start_agent(a);
        }
        let names = self.names_live();
        self.note(format!(
            "world: projects {:?}, stories {:?}, agents {names:?}, sled tables {:?}",
            self.projects,
            self.stories,
            self.sleds.iter().map(|s| &s.table).collect::<Vec<_>>()
        ));
    }

    /// The sled's uplink: hello (with its fence high-water mark), welcome, its tools.
    fn connect_sled(&mut self, i: usize) {
        let u = self.h.open_uplink();
        self.sleds[i].uplink = u;
        let project = self.sleds[i].project.clone();
        let floor = self.sleds[i].table.values().copied().max();
        let mut hello = json!({"uplink":"hello","protocol":1,"project":project,"sled":project});
        if let Some(f) = floor {
            hello["fence"] = json!(f);
        }
        self.h.sled_says(u, hello);
        self.pump();
        if !self.h.gw.is_live(&project) {
            self.bad(format!("the sled of {project} is not live after its hello"));
        }
        let Some(floor) = floor else {
            return;
        };
        let epoch = self.epoch;
        let pm = self.m.pm(&project);
        pm.last_fence = pm.last_fence.max(floor);
        // At the first report in a gateway's life, leases granted before it and not above it
        // get fresh fences (in resource order).
        if !std::mem::replace(&mut pm.floor_known, true) {
            let mut refenced = Vec::new();
            for (r, l) in pm.leases.iter_mut().filter(|(_, l)| l.fence <= floor) {
                pm.last_fence += 1;
                l.fence = pm.last_fence;
                refenced.push((r.clone(), l.fence));
            }
            for (r, f) in refenced {
                self.note(format!(
                    "{project}/{r} re-fenced to {f} above the sled's {floor}"
                ));
                self.latest_grant.insert((project.clone(), r), (epoch, f));
            }
        }
    }

    fn sled_tools() -> Value {
        let story_id = json!({"type":"string","x-mcp-gateway-lease":"story"});
        json!([
            {"name":"show","inputSchema":{"type":"object","properties":{"story_id":{"type":"string"}}}},
            {"name":"move_story","inputSchema":{"type":"object","properties":{
                "story_id":story_id,"stage":{"type":"string"},"by":{"type":"string"},"nonce":{"type":"integer"}}}},
        ])
    }

    /// Moves frames from the gateway to the sleds: pongs, tool lists, and writes queued.
    fn pump(&mut self) {
        loop {
            let mut any = false;
            for i in 0..self.sleds.len() {
                let u = self.sleds[i].uplink;
                for f in self.h.take_frames(u) {
                    any = true;
                    if f["uplink"] == "ping" {
                        self.h.sled_says(u, json!({"uplink":"pong","seq":f["seq"]}));
                    } else if f["method"] == "tools/list" {
                        let tools = Self::sled_tools();
                        self.h.sled_says(
                            u,
                            json!({"jsonrpc":"2.0","id":f["id"],"result":{"tools":tools}}),
                        );
                    } else if f["method"] == "tools/call" {
                        self.frame_sent(i, f);
                    }
                }
            }
            if !any {
                break;
            }
        }
    }

    /// A write reached sled `i`: was it sent as the live lease says?
    fn frame_sent(&mut self, i: usize, f: Value) {
        let args = &f["params"]["arguments"];
        let nonce = args["nonce"].as_u64().unwrap_or(0);
        let project = self.sleds[i].project.clone();
        let meta = &f["params"]["_meta"];
        if meta.get(AGENT_META).is_some() {
            self.bad(format!(
                "write {nonce}: an agent handle reached the sled: {meta}"
            ));
        }
        let fence = meta.get(FENCE_META).cloned();
        let Some(w) = self.writes.get_mut(&nonce) else {
            self.bad(format!("sled {project} got a write nobody made: {f}"));
            return;
        };
        w.sent = true;
        let (wp, story, by, expect, delay) = (
            w.project.clone(),
            w.story.clone(),
            w.by.clone(),
            w.expect.clone(),
            w.delay,
        );
        if wp != project || !story.starts_with(&format!("{project}-")) {
            self.bad(format!(
                "write {nonce} for {wp}/{story} reached the sled of {project}"
            ));
        }
        let resource = format!("story:{story}");
        match (&expect, fence) {
            (Expect::Fenced(want), Some(got))
                if got == json!({"resource":resource,"fence":want}) =>
            {
                self.stats.fenced_sent += 1;
            }
            (Expect::Unfenced, None) => {}
            (Expect::Refused { holder, .. }, got) => self.bad(format!(
                "write {nonce} by {by} to {resource} was sent (fence {got:?}) while {holder} holds a live lease: it must be refused with lease_held"
            )),
            (want, got) => self.bad(format!(
                "write {nonce} by {by} to {resource}: expected {want:?}, the sled got fence {got:?}"
            )),
        }
        let due = self.step + delay;
        self.sleds[i].queue.push((due, f));
    }

    /// Sled `i` applies (or refuses) a write by its fence rule.
    fn sled_apply(&mut self, i: usize, f: &Value, answer: bool) {
        let args = &f["params"]["arguments"];
        let story = args["story_id"].as_str().unwrap_or("").to_owned();
        let by = args["by"].as_str().unwrap_or("").to_owned();
        let nonce = args["nonce"].as_u64().unwrap_or(0);
        let resource = format!("story:{story}");
        let fence = &f["params"]["_meta"][FENCE_META];
        let sled = &mut self.sleds[i];
        let verdict = if fence.is_null() {
            Ok(None)
        } else if fence["resource"] != json!(resource) {
            Err("fence_mismatch")
        } else {
            let n = fence["fence"].as_u64().unwrap_or(0);
            match sled.table.get(&resource) {
                Some(&high) if n < high => Err("stale_fence"),
                _ => {
                    sled.table.insert(resource.clone(), n);
                    Ok(Some(n))
                }
            }
        };
        let project = sled.project.clone();
        let line = match verdict {
            Ok(fence) => {
                // The sled's own promise, checked on its log: never a lower fence after a
                // higher one on the same resource.
                let higher = sled
                    .applied
                    .iter()
                    .filter(|a| a.resource == resource)
                    .filter_map(|a| Some((a.fence?, a.by.clone())))
                    .max();
                let bad = match (fence, higher) {
                    (Some(n), Some(h)) if n < h.0 => Some(h),
                    _ => None,
                };
                sled.applied.push(Applied {
                    resource: resource.clone(),
                    fence,
                    by: by.clone(),
                });
                self.stats.applied += 1;
                if let Some((h, hby)) = bad {
                    self.bad(format!(
                        "sled {project} applied {resource} fence {fence:?} by {by} after fence {h} by {hby}"
                    ));
                }
                format!(
                    "sled {project} applies write {nonce} by {by} on {resource} fence {fence:?}"
                )
            }
            Err(why) => {
                if why == "stale_fence" {
                    self.stats.stale_refused_at_sled += 1;
                    // Stale only if a newer lease was granted on the resource since.
                    let f = fence["fence"].as_u64().unwrap_or(0);
                    let epoch = self.writes.get(&nonce).map(|w| w.epoch);
                    let key = (project.clone(), resource.clone());
                    if epoch.is_some()
                        && self.latest_grant.get(&key) == epoch.map(|e| (e, f)).as_ref()
                    {
                        let high = self.sleds[i].table.get(&resource).copied();
                        self.bad(format!(
                            "sled {project} refused write {nonce} by {by} on {resource} as stale, though fence {f} is the newest lease granted on it (the sled accepted {high:?} before: a fence reissued)"
                        ));
                    }
                }
                format!("sled {project} refuses write {nonce} by {by} on {resource} ({why}, fence {fence}, table {:?})", self.sleds[i].table.get(&resource))
            }
        };
        self.note(line);
        if answer {
            let applied = verdict.is_ok();
            let mut result = json!({"content":[{"type":"text","text":if applied {"moved"} else {"refused"}}],
                "structuredContent":{"applied":applied,"nonce":nonce}});
            if let Err(why) = verdict {
                result["isError"] = json!(true);
                result["structuredContent"]["kind"] = json!(why);
            }
            let u = self.sleds[i].uplink;
            self.h
                .sled_says(u, json!({"jsonrpc":"2.0","id":f["id"],"result":result}));
            self.pump();
            if applied && self.rng.random_bool(0.25) {
                self.sled_event_kind(i, "story_moved", Some(story));
            }
        }
    }

    /// Each sled handles the writes due (all of them with `all`).
    fn process_sleds(&mut self, all: bool) {
        for i in 0..self.sleds.len() {
            let step = self.step;
            let queue = std::mem::take(&mut self.sleds[i].queue);
            let (due, later): (Vec<_>, Vec<_>) =
                queue.into_iter().partition(|(at, _)| all || *at <= step);
            self.sleds[i].queue = later;
            for (_, f) in due {
                self.sled_apply(i, &f, true);
            }
        }
        self.check();
    }

    /// A sled whose connection broke: each write in flight was either received (applied,
    /// answered on the old uplink) or lost; then it dials again.
    fn resolve_in_flight(&mut self, i: usize, answer: bool) {
        let queue = std::mem::take(&mut self.sleds[i].queue);
        for (_, f) in queue {
            if self.rng.random_bool(0.5) {
                self.sled_apply(i, &f, answer);
            } else {
                let nonce = f["params"]["arguments"]["nonce"].clone();
                self.note(format!("write {nonce} lost with the connection"));
            }
        }
    }

    fn reconnect(&mut self, i: usize) {
        self.stats.reconnects += 1;
        self.resolve_in_flight(i, true);
        let table = self.sleds[i].table.clone();
        self.note(format!(
            "sled {} reconnects, table {table:?}",
            self.sleds[i].project
        ));
        self.connect_sled(i);
        self.check();
    }

    /// A new gateway: all but the sleds' fences is lost; sleds reconnect, agents start again.
    fn restart(&mut self) {
        self.stats.restarts += 1;
        for i in 0..self.sleds.len() {
            self.resolve_in_flight(i, false);
        }
        self.epoch += 1;
        let now = self.h.now;
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&self.seed.to_le_bytes());
        seed[8..16].copy_from_slice(&self.epoch.to_le_bytes());
        let projects = self.projects.clone();
        self.h = Harness::with_config(&projects, Some(projects[0]), config(self.bug), seed);
        self.h.now = now;
        self.m = Model::default();
        self.waits.clear();
        self.write_tokens.clear();
        self.writes.clear();
        self.gone.clear();
        let agents_first = self.rng.random_bool(0.5);
        self.note(format!(
            "gateway restart (epoch {}), {} first",
            self.epoch,
            if agents_first { "agents" } else { "sleds" }
        ));
        if agents_first {
            // Agents come back before the sleds redial, and claim at once.
            for a in 0..self.agents.len() {
                self.start_agent(a);
                if self.rng.random_bool(0.5) {
                    let p = self.agents[a].home;
                    let r = self.resource(p);
                    let project = self.projects[p];
                    self.claim(a, project, &r, Some(20));
                }
            }
        }
        for i in 0..self.sleds.len() {
            self.connect_sled(i);
        }
        if !agents_first {
            for a in 0..self.agents.len() {
                self.start_agent(a);
            }
        }
        self.check();
    }

    // ---- agents ----------------------------------------------------------------------------

    /// A new session (or handle) checks in to its home project.
    fn start_agent(&mut self, a: usize) {
        let home = self.projects[self.agents[a].home].to_owned();
        match self.agents[a].who {
            Who::Session(_) => {
                let s = self.h.initialize();
                self.agents[a].who = Who::Session(s);
            }
            Who::Handle(_) => self.agents[a].who = Who::Handle(String::new()),
        }
        self.agents[a].name = String::new();
        self.checkin(a, &home);
    }

    /// Calls a coordination tool as agent `a`; the answer must come at once.
    fn call(&mut self, a: usize, tool: &str, mut args: Value) -> Result<Value, String> {
        let session = match &self.agents[a].who {
            Who::Session(s) => Some(s.clone()),
            Who::Handle(h) => {
                if !h.is_empty() {
                    args["agent"] = json!(h);
                }
                None
            }
        };
        let id = self.next_nonce();
        let t = self.h.call(session.as_deref(), json!(id), tool, args);
        self.pump();
        let Some(r) = self.h.reply_json(t) else {
            self.bad(format!("{tool} by agent slot {a}: no answer at once"));
            return Err("<no answer>".into());
        };
        if r.get("error").is_some() {
            return Err(kind(&r));
        }
        Ok(r["result"]["structuredContent"].clone())
    }

    /// What every coordination result carries: its project, `lost` (every lost lease not yet
    /// reported, now reported) and `unread`.
    fn check_common(&mut self, a: usize, project: &str, tool: &str, sc: &Value) {
        let name = self.agents[a].name.clone();
        if sc["project"] != json!(project) {
            self.bad(format!(
                "{tool} by {name} in {project} answered for project {}",
                sc["project"]
            ));
        }
        let want = self.m.take_lost(&name);
        self.check_lost(&name, tool, &sc["lost"], &want);
        let unread = self.m.unread_ids(project, &name).len();
        if sc["unread"] != json!(unread) {
            self.bad(format!(
                "{tool} by {name} in {project}: unread {} but {unread} are unread",
                sc["unread"]
            ));
        }
    }

    fn check_lost(&mut self, name: &str, what: &str, got: &Value, want: &[Lost]) {
        let mut got: Vec<(String, String, u64)> = got
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|l| {
                        (
                            l["project"].as_str().unwrap_or("").to_owned(),
                            l["resource"].as_str().unwrap_or("").to_owned(),
                            l["fence"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        got.sort();
        let mut want: Vec<(String, String, u64)> = want
            .iter()
            .map(|l| (l.project.clone(), l.resource.clone(), l.fence))
            .collect();
        want.sort();
        if got != want {
            self.bad(format!(
                "{what} by {name}: lost {got:?}, but the leases lost and not yet reported are {want:?} (each must be reported exactly once)"
            ));
        }
    }

    fn checkin(&mut self, a: usize, project: &str) {
        let mut args = json!({"project": project});
        if self.rng.random_bool(0.3) {
            args["name"] = json!(format!("n{a}"));
        }
        let sc = match self.call(a, "checkin", args) {
            Ok(sc) => sc,
            Err(k) => return self.bad(format!("checkin by slot {a} in {project}: error {k}")),
        };
        if self.agents[a].name.is_empty() {
            let name = sc["agent"].as_str().unwrap_or("").to_owned();
            if name.is_empty() || self.names_live().contains(&name) || self.gone.contains(&name) {
                self.bad(format!(
                    "checkin gave agent name {name:?} (in use, or none)"
                ));
            }
            self.agents[a].name = name;
            if let Who::Handle(_) = self.agents[a].who {
                let h = sc["handle"].as_str().unwrap_or("").to_owned();
                if h.is_empty() {
                    self.bad("a checkin without a session issued no handle".into());
                }
                self.agents[a].who = Who::Handle(h);
            }
        }
        let name = self.agents[a].name.clone();
        self.note(format!("{name} checkin {project}"));
        let now = self.h.now;
        self.m.touch(project, &name);
        // Every lease it holds there is renewed for its own TTL.
        let mut want: Vec<(String, u64, u64)> = Vec::new();
        for (r, l) in self.m.pm(project).leases.iter_mut() {
            if l.holder == name {
                l.expires_at = now + l.ttl;
                want.push((r.clone(), l.fence, ms(l.ttl)));
            }
        }
        let got: Vec<(String, u64, u64)> = sc["renewed"]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|l| {
                        (
                            l["resource"].as_str().unwrap_or("").to_owned(),
                            l["fence"].as_u64().unwrap_or(0),
                            l["expires_in_ms"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        if got != want {
            self.bad(format!(
                "checkin by {name} in {project} renewed {got:?}, want {want:?}"
            ));
        }
        let inbox = sc["inbox"].clone();
        self.check_inbox(&name, project, false, 100, &inbox, "checkin");
        self.check_common(a, project, "checkin", &sc);
    }

    fn check_inbox(
        &mut self,
        name: &str,
        project: &str,
        peek: bool,
        limit: usize,
        got: &Value,
        what: &str,
    ) {
        let bodies: BTreeMap<u64, (String, String)> = self
            .m
            .p
            .get(project)
            .map(|pm| {
                pm.msgs
                    .iter()
                    .map(|(id, m)| (*id, (m.body.clone(), m.from.clone())))
                    .collect()
            })
            .unwrap_or_default();
        let (ids, more, unread) = self.m.read(project, name, peek, limit);
        let got_ids: Vec<u64> = got["messages"]
            .as_array()
            .map(|v| v.iter().filter_map(|m| m["id"].as_u64()).collect())
            .unwrap_or_default();
        if got_ids != ids || got["more"] != json!(more) || got["unread"] != json!(unread) {
            self.bad(format!(
                "{what} by {name} in {project} (peek {peek}, limit {limit}): messages {got_ids:?} more {} unread {}, want {ids:?} more {more} unread {unread} (no gaps, no repeats)",
                got["more"], got["unread"]
            ));
            return;
        }
        for m in got["messages"].as_array().into_iter().flatten() {
            let id = m["id"].as_u64().unwrap_or(0);
            if let Some((body, from)) = bodies.get(&id) {
                if m["body"] != json!(body) || m["from"] != json!(from) {
                    self.bad(format!(
                        "{what} by {name} in {project}: message {id} is {m}, want body {body:?} from {from}"
                    ));
                }
            }
        }
    }

    // ---- ops -------------------------------------------------------------------------------

    fn one_step(&mut self) {
        let a = self.rng.random_range(0..self.agents.len());
        let p = self.pick_project();
        let project = self.projects[p];
        match self.rng.random_range(0..100) {
            0..6 => self.checkin(a, project),
            6..20 => {
                let r = self.resource(p);
                let ttl = self.pick_ttl();
                self.claim(a, project, &r, ttl);
            }
            20..25 => {
                let r = self.held_or_any(a, p);
                let ttl = if self.rng.random_bool(0.5) {
                    None
                } else {
                    self.pick_ttl()
                };
                self.renew(a, project, &r, ttl);
            }
            25..30 => {
                let r = self.held_or_any(a, p);
                self.release(a, project, &r);
            }
            30..32 => self.claims(a, project),
            32..44 => {
                let story = self.pick(&self.stories[p].clone());
                let delay = self.pick_delay();
                let anonymous = self.rng.random_bool(0.1);
                self.write(
                    if anonymous { None } else { Some(a) },
                    project,
                    &story,
                    delay,
                );
            }
            44..51 => self.send(a, project),
            51..56 => {
                let peek = self.rng.random_bool(0.3);
                let limit = if self.rng.random_bool(0.2) {
                    None
                } else {
                    Some(self.rng.random_range(1..=4))
                };
                self.inbox(a, project, peek, limit);
            }
            56..60 => self.board_set(a, project),
            60..62 => self.board_get(a, project),
            62..64 => self.board_delete(a, project),
            64..71 => self.wait(a),
            71..74 => self.sled_event(p),
            74..76 => self.end_session(a),
            76 => self.reconnect(p),
            77 => {
                if self.rng.random_bool(0.5) {
                    self.restart();
                } else {
                    self.reconnect(p);
                }
            }
            78..82 => self.advance(Duration::from_millis(1)),
            82..89 => self.expiry_race(),
            89..92 => self.just_before_expiry(),
            92..95 => self.past_ttl(),
            95..98 => {
                let by = Duration::from_millis(self.rng.random_range(100..=6000));
                self.advance(by);
            }
            _ => self.stale_race(),
        }
    }

    fn pick_ttl(&mut self) -> Option<u64> {
        match self.rng.random_range(0..20) {
            0..3 => None,
            3..5 => Some(self.rng.random_range(31..=200)),
            _ => Some(self.rng.random_range(1..=20)),
        }
    }

    fn pick_delay(&mut self) -> usize {
        if self.rng.random_bool(0.5) {
            0
        } else {
            self.rng.random_range(1..=4)
        }
    }

    /// A resource `a` holds in project `p` (most of the time), else any.
    fn held_or_any(&mut self, a: usize, p: usize) -> String {
        let name = self.agents[a].name.clone();
        let held: Vec<String> = self
            .m
            .p
            .get(self.projects[p])
            .map(|pm| {
                pm.leases
                    .iter()
                    .filter(|(_, l)| l.holder == name)
                    .map(|(r, _)| r.clone())
                    .collect()
            })
            .unwrap_or_default();
        if !held.is_empty() && self.rng.random_bool(0.8) {
            self.pick(&held)
        } else {
            self.resource(p)
        }
    }

    fn claim(&mut self, a: usize, project: &str, r: &str, ttl: Option<u64>) {
        let name = self.agents[a].name.clone();
        let mut args = json!({"project":project,"resource":r});
        if let Some(t) = ttl {
            args["ttl_s"] = json!(t);
        }
        let res = self.call(a, "claim", args);
        let now = self.h.now;
        let granted = ttl
            .map_or(LEASE_TTL, Duration::from_secs)
            .min(LEASE_TTL_MAX);
        let clamped = ttl.is_some_and(|t| Duration::from_secs(t) > LEASE_TTL_MAX);
        self.m.touch(project, &name);
        let sc = match res {
            Ok(sc) => sc,
            Err(k) => return self.bad(format!("claim of {r} by {name}: error {k}")),
        };
        self.note(format!(
            "{name} claim {project}/{r} ttl {ttl:?}: acquired {} fence {} expires_in_ms {}",
            sc["acquired"], sc["fence"], sc["expires_in_ms"]
        ));
        let current = self.m.live_lease(project, r).cloned();
        let acquired = sc["acquired"] == json!(true);
        match (&current, acquired) {
            (Some(l), true) if l.holder == name => {
                let ok = sc["reentrant"] == json!(true)
                    && sc["fence"] == json!(l.fence)
                    && sc["expires_in_ms"] == json!(ms(granted));
                if !ok {
                    self.bad(format!(
                        "re-entrant claim of {r} by {name}: {sc}, want fence {} for {}ms",
                        l.fence,
                        ms(granted)
                    ));
                }
                let l = self.m.pm(project).leases.get_mut(r).expect("live");
                l.ttl = granted;
                l.expires_at = now + granted;
                self.stats.acquired += 1;
            }
            (Some(l), true) => {
                let l = l.clone();
                self.bad(format!(
                    "two holders: {name} acquired {project}/{r} (fence {}) while {} holds it with fence {} over [{}ms, {}ms)",
                    sc["fence"],
                    l.holder,
                    l.fence,
                    ms(l.granted.duration_since(self.origin)),
                    ms(l.expires_at.duration_since(self.origin))
                ));
            }
            (None, true) => {
                self.stats.acquired += 1;
                let fence = sc["fence"].as_u64().unwrap_or(0);
                let last = self.m.pm(project).last_fence;
                if fence <= last {
                    self.bad(format!(
                        "fence {fence} granted to {name} on {project}/{r} is not above {last}, the highest granted or accepted before in {project} (fences are never reused)"
                    ));
                }
                if sc["reentrant"] != json!(false) || sc["expires_in_ms"] != json!(ms(granted)) {
                    self.bad(format!(
                        "fresh claim of {r} by {name}: {sc}, want {}ms",
                        ms(granted)
                    ));
                }
                self.latest_grant
                    .insert((project.to_owned(), r.to_owned()), (self.epoch, fence));
                let pm = self.m.pm(project);
                pm.last_fence = pm.last_fence.max(fence);
                pm.leases.insert(
                    r.to_owned(),
                    MLease {
                        holder: name.clone(),
                        fence,
                        ttl: granted,
                        granted: now,
                        expires_at: now + granted,
                    },
                );
                if let Some(m) = pm.members.get_mut(&name) {
                    m.released.remove(r);
                }
            }
            (Some(l), false) => {
                self.stats.conflicts += 1;
                let want_ms = ms(l.expires_at.duration_since(now));
                if l.holder == name
                    || sc["holder"] != json!(l.holder)
                    || sc["expires_in_ms"] != json!(want_ms)
                {
                    self.bad(format!(
                        "claim of {r} by {name} refused with {sc}; {} holds it for {want_ms}ms",
                        l.holder
                    ));
                }
                let pm = self.m.pm(project);
                pm.refused
                    .entry(r.to_owned())
                    .or_default()
                    .insert(name.clone());
                if let Some(m) = pm.members.get_mut(&name) {
                    m.released.remove(r);
                }
            }
            (None, false) => self.bad(format!(
                "claim of free {project}/{r} by {name} refused: {sc}"
            )),
        }
        if acquired && clamped && sc["ttl_clamped_s"] != json!(LEASE_TTL_MAX.as_secs()) {
            self.bad(format!("claim with ttl {ttl:?} not reported clamped: {sc}"));
        }
        self.check_common(a, project, "claim", &sc);
        self.check();
    }

    fn renew(&mut self, a: usize, project: &str, r: &str, ttl: Option<u64>) {
        let name = self.agents[a].name.clone();
        let mut args = json!({"project":project,"resource":r});
        if let Some(t) = ttl {
            args["ttl_s"] = json!(t);
        }
        let res = self.call(a, "renew", args);
        let now = self.h.now;
        self.m.touch(project, &name);
        let current = self.m.live_lease(project, r).cloned();
        self.note(format!(
            "{name} renew {project}/{r} ttl {ttl:?}: {}",
            match &res {
                Ok(sc) => sc.to_string(),
                Err(k) => k.clone(),
            }
        ));
        match (current, res) {
            (Some(l), Ok(sc)) if l.holder == name => {
                let ttl = ttl.map_or(l.ttl, |t| Duration::from_secs(t).min(LEASE_TTL_MAX));
                if sc["fence"] != json!(l.fence) || sc["expires_in_ms"] != json!(ms(ttl)) {
                    self.bad(format!(
                        "renew of {r} by {name}: {sc}, want fence {} for {}ms",
                        l.fence,
                        ms(ttl)
                    ));
                }
                let l = self.m.pm(project).leases.get_mut(r).expect("live");
                l.ttl = ttl;
                l.expires_at = now + ttl;
                self.check_common(a, project, "renew", &sc);
            }
            (current, Ok(sc)) => self.bad(format!(
                "renew of {project}/{r} by {name} succeeded ({sc}) though it does not hold it (live lease: {:?}): a success-shaped no-op",
                current.map(|l| (l.holder, l.fence, ms(l.expires_at.duration_since(self.origin))))
            )),
            (Some(l), Err(k)) if l.holder == name => self.bad(format!(
                "renew of {project}/{r} by its holder {name} (live until {}ms) failed: {k}",
                ms(l.expires_at.duration_since(self.origin))
            )),
            (current, Err(k)) => {
                let want = if current.is_some() { "not_holder" } else { "no_lease" };
                if k != want {
                    self.bad(format!("renew of {r} not held by {name}: {k}, want {want}"));
                }
            }
        }
        self.check();
    }

    fn release(&mut self, a: usize, project: &str, r: &str) {
        let name = self.agents[a].name.clone();
        let res = self.call(a, "release", json!({"project":project,"resource":r}));
        let now = self.h.now;
        self.m.touch(project, &name);
        let current = self.m.live_lease(project, r).cloned();
        self.note(format!(
            "{name} release {project}/{r}: {}",
            match &res {
                Ok(sc) => sc.to_string(),
                Err(k) => k.clone(),
            }
        ));
        match (current, res) {
            (Some(l), Ok(sc)) if l.holder == name => {
                if sc["fence"] != json!(l.fence) || sc["released"] != json!(true) {
                    self.bad(format!("release of {r} by {name}: {sc}, want fence {}", l.fence));
                }
                self.m.end_lease(project, r, false, now);
                self.check_common(a, project, "release", &sc);
            }
            (current, Ok(sc)) => self.bad(format!(
                "release of {project}/{r} by {name} succeeded ({sc}) though it does not hold it (live lease: {:?}): a success-shaped no-op",
                current.map(|l| (l.holder, l.fence))
            )),
            (Some(l), Err(k)) if l.holder == name => {
                self.bad(format!("release of {r} by its holder {name} failed: {k}"))
            }
            (current, Err(k)) => {
                let want = if current.is_some() { "not_holder" } else { "no_lease" };
                if k != want {
                    self.bad(format!("release of {r} not held by {name}: {k}, want {want}"));
                }
            }
        }
        self.check();
    }

    fn claims(&mut self, a: usize, project: &str) {
        let name = self.agents[a].name.clone();
        let sc = match self.call(a, "claims", json!({"project":project})) {
            Ok(sc) => sc,
            Err(k) => return self.bad(format!("claims by {name}: error {k}")),
        };
        let now = self.h.now;
        let want: Vec<Value> = self
            .m
            .p
            .get(project)
            .map(|pm| {
                pm.leases
                    .iter()
                    .map(|(r, l)| {
                        json!([r, l.holder, l.fence, ms(l.expires_at.duration_since(now))])
                    })
                    .collect()
            })
            .unwrap_or_default();
        let got: Vec<Value> = sc["leases"]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|l| json!([l["resource"], l["holder"], l["fence"], l["expires_in_ms"]]))
                    .collect()
            })
            .unwrap_or_default();
        self.note(format!("{name} claims {project}: {got:?}"));
        if got != want {
            self.bad(format!("claims of {project}: {got:?}, want {want:?}"));
        }
        self.check_common(a, project, "claims", &sc);
        self.check();
    }

    /// `move_story` on `story` by agent `a` (or by nobody: no session, no handle).
    fn write(&mut self, a: Option<usize>, project: &str, story: &str, delay: usize) {
        let nonce = self.next_nonce();
        let (session, handle, by) = match a.map(|a| &self.agents[a]) {
            Some(Agent {
                who: Who::Session(s),
                name,
                ..
            }) => (Some(s.clone()), None, name.clone()),
            Some(Agent {
                who: Who::Handle(h),
                name,
                ..
            }) => (None, Some(h.clone()), name.clone()),
            None => (None, None, "-".to_owned()),
        };
        let resource = format!("story:{story}");
        let now = self.h.now;
        let expect = match self.m.live_lease(project, &resource) {
            Some(l) if l.holder == by => Expect::Fenced(l.fence),
            Some(l) => Expect::Refused {
                holder: l.holder.clone(),
                expires_in_ms: ms(l.expires_at.duration_since(now)),
            },
            None => Expect::Unfenced,
        };
        // A refused write, like a refused claim, makes the writer wait for the release.
        if let (Some(_), Expect::Refused { .. }) = (a, &expect) {
            self.m.touch(project, &by);
            let pm = self.m.pm(project);
            pm.refused
                .entry(resource.clone())
                .or_default()
                .insert(by.clone());
            if let Some(m) = pm.members.get_mut(&by) {
                m.released.remove(&resource);
            }
        }
        self.note(format!(
            "{by} writes {project}/{resource} (write {nonce}, delay {delay}): expect {expect:?}"
        ));
        self.writes.insert(
            nonce,
            WriteExp {
                project: project.to_owned(),
                story: story.to_owned(),
                by: by.clone(),
                expect: expect.clone(),
                delay,
                sent: false,
                epoch: self.epoch,
            },
        );
        let mut params = json!({"name":"move_story","arguments":{
            "project":project,"story_id":story,"stage":"doing","by":by,"nonce":nonce}});
        if let Some(h) = handle {
            params["_meta"] = json!({ AGENT_META: h });
        }
        let body = json!({"jsonrpc":"2.0","id":nonce,"method":"tools/call","params":params});
        let t = self
            .h
            .send(HttpMethod::Post, session.as_deref(), &body.to_string());
        self.pump();
        match (self.h.reply_json(t), &expect) {
            (Some(r), Expect::Refused {
                holder,
                expires_in_ms,
            }) => {
                self.stats.refused_at_gateway += 1;
                let d = &r["error"]["data"];
                if kind(&r) != "lease_held"
                    || d["holder"] != json!(holder)
                    || d["expires_in_ms"] != json!(expires_in_ms)
                    || d["outcome"] != "not_sent"
                {
                    self.bad(format!(
                        "write {nonce} by {by} to {resource} held by {holder}: answer {r}, want lease_held"
                    ));
                }
            }
            (Some(r), _) => self.bad(format!(
                "write {nonce} by {by} to {resource} answered at once ({r}), want it sent ({expect:?})"
            )),
            (None, Expect::Refused { holder, .. }) => {
                let holder = holder.clone();
                if !self.writes.get(&nonce).is_some_and(|w| w.sent) {
                    self.bad(format!(
                        "write {nonce} by {by} to {resource} held by {holder}: neither refused nor sent"
                    ));
                }
                self.write_tokens.insert(t);
            }
            (None, _) => {
                if !self.writes.get(&nonce).is_some_and(|w| w.sent) {
                    self.bad(format!("write {nonce} by {by} to {resource} was not sent"));
                }
                self.write_tokens.insert(t);
            }
        }
        self.check();
    }

    fn send(&mut self, a: usize, project: &str) {
        let name = self.agents[a].name.clone();
        let nonce = self.next_nonce();
        let body = format!("{project}:m{nonce}");
        let mut args = json!({"project":project,"body":body});
        let to = if self.rng.random_bool(0.6) {
            let mut names = self.names_live();
            names.extend(self.gone.iter().cloned());
            let to = self.pick(&names);
            args["to"] = json!(to);
            Some(to)
        } else {
            None
        };
        let ttl = if self.rng.random_bool(0.2) {
            Duration::from_secs(self.rng.random_range(2..=30))
        } else {
            Duration::from_secs(3600)
        };
        if ttl.as_secs() < 3600 {
            args["ttl_s"] = json!(ttl.as_secs());
        }
        let res = self.call(a, "send", args);
        let now = self.h.now;
        self.m.touch(project, &name);
        let sc = match res {
            Ok(sc) => sc,
            Err(k) => return self.bad(format!("send by {name} in {project}: error {k}")),
        };
        let pm = self.m.pm(project);
        let id = pm.msg_seq + 1;
        pm.msg_seq = id;
        pm.msgs.insert(
            id,
            MMsg {
                from: name.clone(),
                to: to.clone(),
                at: now,
                expires_at: now + ttl,
                body,
            },
        );
        self.note(format!(
            "{name} send {project} to {to:?} ttl {}s: id {}",
            ttl.as_secs(),
            sc["id"]
        ));
        if sc["id"] != json!(id) || sc["sent"] != json!(true) {
            self.bad(format!(
                "send by {name} in {project}: {sc}, want id {id} (ids per project, never reused)"
            ));
        }
        self.check_common(a, project, "send", &sc);
        self.check();
    }

    fn inbox(&mut self, a: usize, project: &str, peek: bool, limit: Option<usize>) {
        let name = self.agents[a].name.clone();
        let mut args = json!({"project":project,"peek":peek});
        if let Some(l) = limit {
            args["limit"] = json!(l);
        }
        let res = self.call(a, "inbox", args);
        self.m.touch(project, &name);
        let sc = match res {
            Ok(sc) => sc,
            Err(k) => return self.bad(format!("inbox by {name} in {project}: error {k}")),
        };
        self.note(format!(
            "{name} inbox {project} peek {peek} limit {limit:?}: {:?} more {}",
            sc["messages"]
                .as_array()
                .map(|v| v.iter().map(|m| m["id"].clone()).collect::<Vec<_>>()),
            sc["more"]
        ));
        self.check_inbox(&name, project, peek, limit.unwrap_or(100), &sc, "inbox");
        self.check_common(a, project, "inbox", &sc);
        self.check();
    }

    fn board_key(&mut self) -> String {
        format!("k{}", self.rng.random_range(1..=3))
    }

    fn board_current(&self, project: &str, key: &str) -> Option<MEntry> {
        self.m.p.get(project)?.board.get(key).cloned()
    }

    fn if_revision(&mut self, current: Option<u64>, absent: bool) -> Option<u64> {
        match self.rng.random_range(0..20) {
            0..8 => None,
            8..12 if absent => Some(0),
            8..17 => Some(current.unwrap_or(0)),
            _ => Some(current.unwrap_or(0) + self.rng.random_range(1..=3)),
        }
    }

    fn board_set(&mut self, a: usize, project: &str) {
        let name = self.agents[a].name.clone();
        let key = self.board_key();
        let current = self.board_current(project, &key);
        let if_rev = self.if_revision(current.as_ref().map(|e| e.revision), true);
        let nonce = self.next_nonce();
        let value = json!({"project":project,"n":nonce});
        let mut args = json!({"project":project,"key":key,"value":value});
        if let Some(r) = if_rev {
            args["if_revision"] = json!(r);
        }
        let ttl = self
            .rng
            .random_bool(0.3)
            .then(|| Duration::from_secs(self.rng.random_range(1..=20)));
        if let Some(t) = ttl {
            args["ttl_s"] = json!(t.as_secs());
        }
        let res = self.call(a, "board_set", args);
        let now = self.h.now;
        self.m.touch(project, &name);
        let cur = current.as_ref().map(|e| e.revision);
        let ok = match if_rev {
            None => true,
            Some(0) => cur.is_none(),
            Some(r) => cur == Some(r),
        };
        self.note(format!(
            "{name} board_set {project}/{key} if {if_rev:?} (at {cur:?}): {}",
            match &res {
                Ok(sc) => sc.to_string(),
                Err(k) => k.clone(),
            }
        ));
        match (ok, res) {
            (true, Ok(sc)) => {
                let pm = self.m.pm(project);
                let rev = pm.board_rev + 1;
                pm.board_rev = rev;
                pm.board.insert(
                    key.clone(),
                    MEntry {
                        value,
                        revision: rev,
                        set_by: name.clone(),
                        expires_at: ttl.map(|t| now + t),
                    },
                );
                if sc["revision"] != json!(rev) {
                    self.bad(format!(
                        "board_set {project}/{key}: revision {}, want {rev} (revisions never reused, also after deletes and expiry)",
                        sc["revision"]
                    ));
                }
                self.check_common(a, project, "board_set", &sc);
            }
            (false, Err(k)) if k == "revision_mismatch" => {}
            (ok, res) => self.bad(format!(
                "board_set {project}/{key} if {if_rev:?} at {cur:?}: {res:?}, want {}",
                if ok { "success" } else { "revision_mismatch" }
            )),
        }
        self.check();
    }

    fn board_get(&mut self, a: usize, project: &str) {
        let key = self.board_key();
        let name = self.agents[a].name.clone();
        let sc = match self.call(a, "board_get", json!({"project":project,"key":key})) {
            Ok(sc) => sc,
            Err(k) => return self.bad(format!("board_get by {name}: error {k}")),
        };
        let now = self.h.now;
        let got = json!([
            sc["found"],
            sc["value"],
            sc["revision"],
            sc["set_by"],
            sc["expires_in_ms"]
        ]);
        let want = match self.board_current(project, &key) {
            Some(e) => json!([
                true,
                e.value,
                e.revision,
                e.set_by,
                e.expires_at.map(|t| ms(t.duration_since(now)))
            ]),
            None => json!([false, null, null, null, null]),
        };
        self.note(format!("{name} board_get {project}/{key}: {got}"));
        if got != want {
            self.bad(format!("board_get {project}/{key}: {got}, want {want}"));
        }
        self.check_common(a, project, "board_get", &sc);
        self.check();
    }

    fn board_delete(&mut self, a: usize, project: &str) {
        let name = self.agents[a].name.clone();
        let key = self.board_key();
        let current = self.board_current(project, &key).map(|e| e.revision);
        let if_rev = self.if_revision(current, false).filter(|r| *r > 0);
        let mut args = json!({"project":project,"key":key});
        if let Some(r) = if_rev {
            args["if_revision"] = json!(r);
        }
        let res = self.call(a, "board_delete", args);
        self.m.touch(project, &name);
        self.note(format!(
            "{name} board_delete {project}/{key} if {if_rev:?} (at {current:?}): {res:?}"
        ));
        let want: Result<u64, &str> = match (current, if_rev) {
            (None, _) => Err("no_key"),
            (Some(c), Some(r)) if r != c => Err("revision_mismatch"),
            (Some(c), _) => Ok(c),
        };
        match (want, res) {
            (Ok(rev), Ok(sc)) if sc["revision"] == json!(rev) => {
                self.m.pm(project).board.remove(&key);
                self.check_common(a, project, "board_delete", &sc);
            }
            (Err(w), Err(k)) if w == k => {}
            (want, got) => self.bad(format!(
                "board_delete {project}/{key}: {got:?}, want {want:?}"
            )),
        }
        self.check();
    }

    fn wait(&mut self, a: usize) {
        let name = self.agents[a].name.clone();
        let parked = self.waits.values().filter(|w| w.agent == name).count();
        if parked >= 2 {
            return self.advance(Duration::from_millis(1));
        }
        let mut projects: Vec<String> = Vec::new();
        for _ in 0..self.rng.random_range(1..=2) {
            let p = self.pick_project();
            let p = self.projects[p].to_owned();
            if !projects.contains(&p) {
                projects.push(p);
            }
        }
        let timeout = if self.rng.random_bool(0.2) {
            None
        } else {
            Some(self.rng.random_range(1..=25u64))
        };
        let mut args = json!({"projects":projects});
        if let Some(t) = timeout {
            args["timeout_s"] = json!(t);
        }
        let session = match &self.agents[a].who {
            Who::Session(s) => Some(s.clone()),
            Who::Handle(h) => {
                args["agent"] = json!(h);
                None
            }
        };
        let now = self.h.now;
        let deadline = now + timeout.map_or(MAX_WAIT, Duration::from_secs).min(MAX_WAIT);
        for p in &projects {
            self.m.touch(p, &name);
        }
        let pending: Vec<(String, Pending)> = projects
            .iter()
            .map(|p| (p.clone(), self.m.pending(p, &name)))
            .filter(|(_, pd)| !pd.is_empty())
            .collect();
        let id = self.next_nonce();
        let t = self.h.call(session.as_deref(), json!(id), "wait", args);
        self.pump();
        self.note(format!(
            "{name} wait {projects:?} timeout {timeout:?} (pending now: {:?})",
            pending.iter().map(|(p, _)| p).collect::<Vec<_>>()
        ));
        self.waits.insert(
            t,
            WaitExp {
                agent: name.clone(),
                projects,
                at: now,
                deadline,
                ending: false,
            },
        );
        if !self.h.replies.contains_key(&t) && !pending.is_empty() {
            let (p, pd) = &pending[0];
            self.bad(format!(
                "lost wakeup: {name}'s wait parked although {} was pending in {p}: it must answer at once",
                pd.show(self.origin)
            ));
        }
        self.check();
    }

    fn sled_event(&mut self, i: usize) {
        if self.rng.random_bool(0.2) {
            return self.sled_event_kind(i, "sync", None);
        }
        let kind = self.pick(&["story_moved", "story_blocked", "test_failed"]);
        let story = self.pick(&self.stories[i].clone());
        self.sled_event_kind(i, kind, Some(story));
    }

    fn sled_event_kind(&mut self, i: usize, kind: &str, story: Option<String>) {
        let sled = &mut self.sleds[i];
        sled.event_seq += 1;
        let (u, seq, project) = (sled.uplink, sled.event_seq, sled.project.clone());
        self.h.sled_says(
            u,
            json!({"uplink":"event","seq":seq,"kind":kind,"story":story}),
        );
        self.pump();
        if kind != "sync" {
            let now = self.h.now;
            let pm = self.m.pm(&project);
            pm.event_seq += 1;
            let s = pm.event_seq;
            pm.events.push((s, now));
        }
        self.note(format!("sled {project} event {kind} {story:?}"));
        self.check();
    }

    fn end_session(&mut self, a: usize) {
        let Who::Session(s) = self.agents[a].who.clone() else {
            return self.advance(Duration::from_millis(1));
        };
        let name = self.agents[a].name.clone();
        for w in self.waits.values_mut().filter(|w| w.agent == name) {
            w.ending = true;
        }
        let t = self.h.send(HttpMethod::Delete, Some(&s), "");
        self.pump();
        let status = self.h.replies.remove(&t).map(|r| r.status);
        if status != Some(204) {
            self.bad(format!("DELETE of {name}'s session: {status:?}"));
        }
        let now = self.h.now;
        self.m.end_agent(&name, now);
        self.gone.push(name.clone());
        self.note(format!("{name}'s session ends"));
        self.check();
        if self.waits.values().any(|w| w.agent == name) {
            self.bad(format!(
                "{name}'s session ended but its parked waits were not answered"
            ));
        }
        self.start_agent(a);
        self.check();
    }

    // ---- time ------------------------------------------------------------------------------

    fn advance(&mut self, by: Duration) {
        let target = self.h.now + by;
        self.advance_to(target);
    }

    /// Moves the clock to `target`, stopping at every instant the gateway or the model has a
    /// timer, checking at each.
    fn advance_to(&mut self, target: Instant) {
        self.note(format!(
            "advance {}ms",
            ms(target.saturating_duration_since(self.h.now))
        ));
        let mut guard = 0;
        loop {
            let now = self.h.now;
            let model = self.m.next_expiry(now);
            let waits = self
                .waits
                .values()
                .map(|w| w.deadline)
                .filter(|d| *d > now)
                .min();
            let next = [self.h.gw.poll_timeout(), model, waits]
                .into_iter()
                .flatten()
                .min();
            let Some(at) = next.filter(|at| *at <= target) else {
                break;
            };
            guard += 1;
            if guard > 100_000 {
                return self.bad("the gateway's timers never settle".into());
            }
            self.h.now = at.max(now);
            self.h.gw.handle_timeout(self.h.now);
            self.h.drain();
            self.pump();
            self.m.tick(self.h.now);
            self.check();
            if !self.violations.is_empty() {
                return;
            }
        }
        self.h.now = target;
        self.m.tick(target);
        self.check();
    }

    /// Time goes exactly to the next lease expiry; at that instant the holder and others race.
    fn expiry_race(&mut self) {
        let next = self
            .m
            .p
            .iter()
            .flat_map(|(p, pm)| {
                pm.leases
                    .iter()
                    .map(move |(r, l)| (l.expires_at, p.clone(), r.clone(), l.holder.clone()))
            })
            .min();
        let Some((at, project, r, holder)) = next else {
            return self.advance(Duration::from_millis(1));
        };
        self.stats.expiry_races += 1;
        self.advance_to(at);
        if !self.violations.is_empty() {
            return;
        }
        self.note(format!("expiry instant of {project}/{r} held by {holder}"));
        let story = r.trim_start_matches("story:").to_owned();
        let holder_slot = self.slot_of(&holder);
        for _ in 0..self.rng.random_range(1..=3) {
            let other = self.rng.random_range(0..self.agents.len());
            match (self.rng.random_range(0..5), holder_slot) {
                (0, Some(h)) => self.renew(h, &project, &r, None),
                (1, Some(h)) => {
                    let d = self.pick_delay();
                    self.write(Some(h), &project, &story, d)
                }
                (2, _) => self.claim(other, &project, &r, Some(5)),
                (3, _) => {
                    let d = self.pick_delay();
                    self.write(Some(other), &project, &story, d)
                }
                (_, Some(h)) => self.release(h, &project, &r),
                _ => {}
            }
            if !self.violations.is_empty() {
                return;
            }
        }
    }

    /// 1 ms before a lease expires, its holder still holds it.
    fn just_before_expiry(&mut self) {
        let leases: Vec<(Instant, String, String, String)> = self
            .m
            .p
            .iter()
            .flat_map(|(p, pm)| {
                pm.leases
                    .iter()
                    .map(move |(r, l)| (l.expires_at, p.clone(), r.clone(), l.holder.clone()))
            })
            .collect();
        if leases.is_empty() {
            return self.advance(Duration::from_millis(1));
        }
        let (at, project, r, holder) = self.pick(&leases);
        let before = at - Duration::from_millis(1);
        if before > self.h.now {
            self.advance_to(before);
        }
        let Some(h) = self.slot_of(&holder) else {
            return;
        };
        if self.rng.random_bool(0.5) {
            self.renew(h, &project, &r, None);
        } else {
            let story = r.trim_start_matches("story:").to_owned();
            self.write(Some(h), &project, &story, 0);
        }
    }

    /// A holder paused past its TTL.
    fn past_ttl(&mut self) {
        let leases: Vec<Instant> = self
            .m
            .p
            .values()
            .flat_map(|pm| pm.leases.values().map(|l| l.expires_at))
            .collect();
        let target = if leases.is_empty() {
            self.h.now + Duration::from_secs(self.rng.random_range(1..=21))
        } else {
            self.pick(&leases) + Duration::from_millis(self.rng.random_range(1..=3000))
        };
        self.advance_to(target);
    }

    /// A holder's write is in flight while its lease expires; another claims and writes.
    fn stale_race(&mut self) {
        let leases: Vec<(Instant, String, String, String)> = self
            .m
            .p
            .iter()
            .flat_map(|(p, pm)| {
                pm.leases
                    .iter()
                    .map(move |(r, l)| (l.expires_at, p.clone(), r.clone(), l.holder.clone()))
            })
            .collect();
        if leases.is_empty() {
            return self.advance(Duration::from_millis(1));
        }
        let (at, project, r, holder) = self.pick(&leases);
        let Some(h) = self.slot_of(&holder) else {
            return;
        };
        let story = r.trim_start_matches("story:").to_owned();
        self.write(Some(h), &project, &story, 3);
        let pause = Duration::from_millis(self.rng.random_range(0..=1000));
        self.advance_to(at + pause);
        if !self.violations.is_empty() {
            return;
        }
        let other = self.rng.random_range(0..self.agents.len());
        self.claim(other, &project, &r, Some(10));
        self.write(Some(other), &project, &story, 0);
    }

    // ---- the oracle at each instant --------------------------------------------------------

    fn check(&mut self) {
        let now = self.h.now;
        // Writes answered: only their shape.
        let done: Vec<HttpToken> = self
            .write_tokens
            .iter()
            .copied()
            .filter(|t| self.h.replies.contains_key(t))
            .collect();
        for t in done {
            self.write_tokens.remove(&t);
            if let Some(r) = self.h.reply_json(t) {
                if r.get("result").is_none() && r.get("error").is_none() {
                    self.bad(format!("a write's answer is neither result nor error: {r}"));
                }
            }
        }
        // Waits answered, in the order they were made.
        let answered: Vec<HttpToken> = self
            .waits
            .keys()
            .copied()
            .filter(|t| self.h.replies.contains_key(t))
            .collect();
        let mut answered: Vec<(WaitExp, Value)> = answered
            .into_iter()
            .map(|t| {
                let w = self.waits.remove(&t).expect("listed");
                (w, self.h.reply_json(t).unwrap_or(Value::Null))
            })
            .collect();
        // The gateway's wake pass takes every woken wait's reasons before any answer is
        // written; then the answers of waits that timed out at this instant come first, each
        // taking the agent's other lost leases for its `lost`.
        let woke = |r: &Value| r["result"]["structuredContent"]["woke"] == json!(true);
        for (w, r) in &answered {
            self.note(format!(
                "{}'s wait on {:?} answers {}",
                w.agent, w.projects, r["result"]["structuredContent"]
            ));
            if woke(r) && !w.ending {
                self.wait_reasons(w, r);
            }
        }
        answered.sort_by_key(|(_, r)| woke(r));
        // An agent's waits answered at one instant report its lost leases between them, each
        // once, in whichever of them the gateway wrote first (a wait that timed out and one
        // woken by an expiry at the same instant may come in either order).
        let mut lost: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
        for (w, r) in answered {
            self.wait_answered(w, &r, &mut lost);
        }
        for (name, got) in lost {
            let want = self.m.take_lost(&name);
            self.check_lost(&name, "wait", &Value::Array(got), &want);
        }
        // No lost wakeup; every wait answered by its deadline.
        let mut late = Vec::new();
        for w in self.waits.values() {
            if w.ending {
                continue;
            }
            if now >= w.deadline {
                late.push(format!(
                    "{}'s wait on {:?} (from {}ms) was not answered by its deadline {}ms",
                    w.agent,
                    w.projects,
                    ms(w.at.duration_since(self.origin)),
                    ms(w.deadline.duration_since(self.origin))
                ));
                continue;
            }
            for p in &w.projects {
                let pd = self.m.pending(p, &w.agent);
                if !pd.is_empty() {
                    late.push(format!(
                        "lost wakeup: {}'s wait on {:?} (from {}ms, deadline {}ms) is still parked with {} pending in {p}",
                        w.agent,
                        w.projects,
                        ms(w.at.duration_since(self.origin)),
                        ms(w.deadline.duration_since(self.origin)),
                        pd.show(self.origin)
                    ));
                    break;
                }
            }
        }
        for v in late {
            self.bad(v);
        }
        // Inside the gateway too, nothing expires before its TTL, and everything is gone by
        // the next instant after it.
        let stats = self.h.gw.coordination_stats();
        let live = self.m.live_leases();
        let settling = self.m.last_expiry == Some(now);
        if stats.live_leases < live || (stats.live_leases != live && !settling) {
            self.bad(format!(
                "the gateway keeps {} leases, {live} are live",
                stats.live_leases
            ));
        }
        let parked = self.waits.values().filter(|w| !w.ending).count();
        if stats.parked_waiters != parked {
            self.bad(format!(
                "the gateway has {} parked waits, want {parked}",
                stats.parked_waiters
            ));
        }
    }

    /// A woken wait's reasons: exactly what was pending for its agent in the project it
    /// names (the oldest unread messages, every unreported lost lease, released notice and
    /// sled event there), which it takes.
    fn wait_reasons(&mut self, w: &WaitExp, r: &Value) {
        let now = self.h.now;
        let sc = &r["result"]["structuredContent"];
        let name = w.agent.clone();
        self.stats.woke += 1;
        let Some(p) = sc["project"].as_str().map(str::to_owned) else {
            return self.bad(format!("{name}'s wait woke without a project: {sc}"));
        };
        if !w.projects.contains(&p) {
            return self.bad(format!(
                "{name}'s wait on {:?} woke for project {p}",
                w.projects
            ));
        }
        if now > w.deadline {
            self.bad(format!("{name}'s wait woke after its deadline"));
        }
        let pd = self.m.pending(&p, &name);
        let reasons = sc["reasons"].as_array().cloned().unwrap_or_default();
        let of = |k: &str| -> Vec<&Value> { reasons.iter().filter(|r| r["kind"] == k).collect() };
        let msgs: Vec<u64> = of("message")
            .iter()
            .filter_map(|r| r["id"].as_u64())
            .collect();
        let want_msgs: Vec<u64> = pd
            .messages
            .iter()
            .map(|m| m.0)
            .take(MAX_MESSAGE_REASONS)
            .collect();
        let mut lost: Vec<(String, u64)> = of("lease_lost")
            .iter()
            .map(|r| {
                let resource = r["resource"].as_str().unwrap_or("").to_owned();
                (resource, r["fence"].as_u64().unwrap_or(0))
            })
            .collect();
        lost.sort();
        let mut want_lost: Vec<(String, u64)> = pd
            .lost
            .iter()
            .map(|l| (l.resource.clone(), l.fence))
            .collect();
        want_lost.sort();
        let released: Vec<String> = of("released")
            .iter()
            .map(|r| r["resource"].as_str().unwrap_or("").to_owned())
            .collect();
        let want_released: Vec<String> = pd.released.iter().map(|r| r.0.clone()).collect();
        let events: Vec<u64> = of("sled_event")
            .iter()
            .filter_map(|r| r["seq"].as_u64())
            .collect();
        let want_events: Vec<u64> = pd.events.iter().map(|e| e.0).collect();
        if (&msgs, &lost, &released, &events)
            != (&want_msgs, &want_lost, &want_released, &want_events)
        {
            self.bad(format!(
                "{name}'s wait woke in {p} with messages {msgs:?} lost {lost:?} released {released:?} events {events:?}; pending: messages {want_msgs:?} lost {want_lost:?} released {want_released:?} events {want_events:?}"
            ));
        }
        self.m.consume_wait(&p, &name);
    }

    /// The rest of a wait's answer: `lost` (the agent's other lost leases), `unread`, and for a
    /// timeout, that nothing was pending before its deadline.
    /// Checks one answered wait; its `lost` goes into `lost`, under its agent, to be checked
    /// with the agent's other waits answered at the same instant.
    fn wait_answered(
        &mut self,
        w: WaitExp,
        r: &Value,
        lost: &mut std::collections::BTreeMap<String, Vec<Value>>,
    ) {
        let now = self.h.now;
        let sc = r["result"]["structuredContent"].clone();
        let name = w.agent.clone();
        if w.ending {
            if sc["woke"] != json!(false) || sc.get("ended").is_none() {
                self.bad(format!("{name}'s session ended; its wait answered {r}"));
            }
            return;
        }
        if sc.is_null() {
            return self.bad(format!("{name}'s wait answered {r}"));
        }
        if sc["woke"] == json!(true) {
            let p = sc["project"].as_str().unwrap_or("").to_owned();
            let unread = self.m.unread_ids(&p, &name).len();
            if sc["unread"] != json!(unread) {
                self.bad(format!(
                    "{name}'s wait: unread {}, want {unread}",
                    sc["unread"]
                ));
            }
        } else {
            self.stats.timed_out += 1;
            if now < w.deadline {
                self.bad(format!(
                    "{name}'s wait answered woke: false {}ms before its deadline",
                    ms(w.deadline.duration_since(now))
                ));
            }
            for p in &w.projects {
                let pd = self.m.pending(p, &name);
                if pd.since().is_some_and(|t| t < w.deadline) {
                    self.bad(format!(
                        "lost wakeup: {name}'s wait on {:?} timed out though {} was pending in {p} before its deadline",
                        w.projects,
                        pd.show(self.origin)
                    ));
                }
            }
        }
        lost.entry(name)
            .or_default()
            .extend(sc["lost"].as_array().into_iter().flatten().cloned());
    }

    /// The end: writes in flight land, everything expires, every agent reads every inbox to
    /// the end and hears of every lease it lost.
    fn finish(&mut self) {
        self.step += 1;
        self.note("finish".into());
        self.process_sleds(true);
        self.advance(LEASE_TTL_MAX + MAX_WAIT + Duration::from_secs(1));
        for a in 0..self.agents.len() {
            for p in self.projects.clone() {
                if self
                    .m
                    .unread_ids(p, &self.agents[a].name.clone())
                    .is_empty()
                {
                    continue;
                }
                for _ in 0..20 {
                    self.inbox(a, p, false, Some(100));
                    if self
                        .m
                        .unread_ids(p, &self.agents[a].name.clone())
                        .is_empty()
                    {
                        break;
                    }
                }
            }
            let home = self.projects[self.agents[a].home];
            self.claims(a, home);
        }
        if !self.waits.is_empty() {
            self.bad(format!("{} waits never answered", self.waits.len()));
        }
        if self.m.live_leases() != 0 {
            self.bad("leases outlived every TTL".into());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The sweeps.

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The seeds of a sweep: `COORD_SIM_SEEDS` (else `DST_SEEDS`, the workspace-wide size, when
/// `deep`) or `default_seeds`; with `DST_FRESH_FROM` set and `deep`, the last quarter are fresh
/// seeds from there, as in the network simulations' sweeps (`tests/src/sim/runner.rs`).
fn sweep_seeds(default_seeds: u64, deep: bool) -> Vec<u64> {
    let sized = env_u64("COORD_SIM_SEEDS").or_else(|| env_u64("DST_SEEDS").filter(|_| deep));
    let n = sized.unwrap_or(default_seeds);
    match env_u64("DST_FRESH_FROM").filter(|_| deep) {
        Some(start) => {
            let fresh = n / 4;
            (0..n - fresh)
                .chain(start..start.saturating_add(fresh))
                .collect()
        }
        None => (0..n).collect(),
    }
}

fn sweep(bug: Bug, seeds: Vec<u64>) -> (Vec<Outcome>, SimStats) {
    let mut total = SimStats::default();
    let outcomes: Vec<Outcome> = seeds
        .into_iter()
        .map(|seed| {
            let o = run(seed, bug);
            total.add(&o.stats);
            o
        })
        .collect();
    (outcomes, total)
}

fn print_log(o: &Outcome, tail: usize) {
    let skip = o.log.len().saturating_sub(tail);
    let mut s = String::new();
    for line in &o.log[skip..] {
        let _ = writeln!(s, "  {line}");
    }
    println!(
        "seed {} step log ({} lines, last {}):\n{s}",
        o.seed,
        o.log.len(),
        o.log.len() - skip
    );
}

#[cfg(feature = "planted-bugs")]
fn no_bug() -> Bug {
    None
}
#[cfg(not(feature = "planted-bugs"))]
fn no_bug() -> Bug {
    Bug
}

#[test]
fn coordination_promises_hold_over_the_seed_sweep() {
    if let Some(seed) = env_u64("COORD_SIM_SEED") {
        let o = run(seed, no_bug());
        print_log(&o, usize::MAX);
        println!("{:?}", o.stats);
        assert!(
            o.violations.is_empty(),
            "seed {seed}:\n{}",
            o.violations.join("\n")
        );
        return;
    }
    let (outcomes, total) = sweep(no_bug(), sweep_seeds(300, true));
    println!("{} seeds: {total:?}", outcomes.len());
    if let Some(o) = outcomes.iter().find(|o| !o.violations.is_empty()) {
        print_log(o, 60);
        panic!(
            "seed {} violates the coordination promises (replay: COORD_SIM_SEED={} cargo test -p gateway-core --lib coordination_sim):\n{}",
            o.seed,
            o.seed,
            o.violations.join("\n")
        );
    }
    // The sweep exercises what it claims to.
    if outcomes.len() < 100 {
        return;
    }
    assert!(total.stale_refused_at_sled > 0, "{total:?}");
    assert!(
        total.refused_at_gateway > 0 && total.fenced_sent > 0,
        "{total:?}"
    );
    assert!(
        total.woke > 0 && total.timed_out > 0 && total.expiry_races > 0,
        "{total:?}"
    );
    assert!(total.restarts > 0 && total.reconnects > 0, "{total:?}");
}

#[test]
fn a_seed_replays_to_the_same_run() {
    let a = run(7, no_bug());
    let b = run(7, no_bug());
    assert_eq!(a.log, b.log);
}

/// The sweep with `bug` planted must fail some seed; the first failing seed must replay to the
/// same violations.
#[cfg(feature = "planted-bugs")]
fn planted(bug: CoordBug) {
    let (outcomes, _) = sweep(Some(bug), sweep_seeds(300, false));
    let caught: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| !o.violations.is_empty())
        .collect();
    let first = caught.first().map(|o| o.seed);
    println!(
        "{bug:?}: caught by {}/{} seeds, first caught at seed {first:?}",
        caught.len(),
        outcomes.len()
    );
    let Some(o) = caught.first() else {
        panic!("{bug:?} was not caught by any of {} seeds", outcomes.len());
    };
    print_log(o, 25);
    println!("violations:\n{}", o.violations.join("\n"));
    let again = run(o.seed, Some(bug));
    assert_eq!(
        again.violations, o.violations,
        "seed {} does not replay to the same violations",
        o.seed
    );
}

#[cfg(feature = "planted-bugs")]
#[test]
fn planted_lease_expiry_inclusive_is_caught() {
    planted(CoordBug::LeaseExpiryInclusive);
}

#[cfg(feature = "planted-bugs")]
#[test]
fn planted_fence_reused_after_release_is_caught() {
    planted(CoordBug::FenceReusedAfterRelease);
}

#[cfg(feature = "planted-bugs")]
#[test]
fn planted_wait_looks_then_registers_is_caught() {
    planted(CoordBug::WaitLooksThenRegisters);
}

/// Regression (found by this simulation): a restarted gateway whose agents claim before the
/// sled redials granted fences from 1, below what the sled had accepted from the old gateway's
/// leases, so the sled refused every write of the new holder as stale (and a fence it had
/// accepted could be granted again). The sled's first hello now re-fences such leases.
#[test]
fn a_claim_before_the_sled_redials_gets_a_fence_above_its_high_water_mark() {
    let mut h = Harness::with_config(&["beta"], Some("beta"), config(no_bug()), [3; 32]);
    let a = h.initialize();
    let claim = |h: &mut Harness, tool: &str| {
        let r = h.rpc(
            Some(&a),
            json!(1),
            "tools/call",
            json!({"name":tool,"arguments":{"resource":"story:beta-1"}}),
        );
        r["result"]["structuredContent"]["fence"].as_u64().unwrap()
    };
    assert_eq!(claim(&mut h, "claim"), 1, "no sled has spoken yet");
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta","fence":19}),
    );
    let frames = h.take_frames(u);
    let tools = Sim::sled_tools();
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":frames[1]["id"],"result":{"tools":tools}}),
    );
    assert_eq!(claim(&mut h, "renew"), 20, "re-fenced above the sled's 19");
    let t = h.call(
        Some(&a),
        json!(2),
        "move_story",
        json!({"story_id":"beta-1","by":"a","nonce":1}),
    );
    let f = h.take_frames(u);
    assert_eq!(
        f[0]["params"]["_meta"][FENCE_META],
        json!({"resource":"story:beta-1","fence":20})
    );
    h.sled_answers_all_frames(u, f);
    assert!(h.reply_json(t).is_some());
    // A second hello (a reconnect) re-fences nothing: the fence stays.
    let u2 = h.open_uplink();
    h.sled_says(
        u2,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta","fence":20}),
    );
    assert_eq!(claim(&mut h, "renew"), 20);
    let r = h.rpc(
        Some(&a),
        json!(3),
        "tools/call",
        json!({"name":"claim","arguments":{"resource":"story:beta-2"}}),
    );
    assert_eq!(r["result"]["structuredContent"]["fence"], 21);
}
