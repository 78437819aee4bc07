//! The scenario of one seed: how many sessions and sleds, how fast everything is, and which
//! faults strike when. Everything is drawn from the seed, so a seed names a whole run.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use gateway_core::PlantedBug;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The gateway's deadline for a proxied call (every project's `call_timeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The clients' deadline for one request: above the gateway's call deadline plus the slowest
/// network the scenarios draw (a latency spike on each of the handful of messages of a call).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// The liveness bound: after the final heal, every session's next call succeeds within this.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Gateway heartbeats (core `Config`), short so that lost uplinks are noticed quickly.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(1500);
/// A sled's longest reconnect backoff.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long after the final heal the probes run: a sled whose connect hung on a lost SYN-ACK
/// gives up after `sled_sim::uplink::HANDSHAKE_TIMEOUT` (10 s), backs off, and reconnects.
pub const SETTLE: Duration = Duration::from_secs(13);
/// By when every sled has connected after the simulation starts (a few round trips each).
pub const STARTUP: Duration = Duration::from_secs(2);
/// How much slower than the call deadline a slowed sled is.
pub const SLOW_BY: Duration = Duration::from_secs(1);

/// Which faults a scenario may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// Drawn from the seed: about a third of the seeds have none.
    Drawn,
    /// None at all.
    Never,
    /// At least one.
    Always,
}

/// A direction of a partition, relative to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Both,
    /// Only messages towards the gateway are dropped.
    ToGateway,
    /// Only messages from the gateway are dropped.
    FromGateway,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// The link between the gateway and a sled.
    PartitionSled { sled: usize, dir: Dir },
    /// The link between the gateway and a client host.
    PartitionClient { client: usize, dir: Dir },
    /// Every message may take up to `max`.
    LatencySpike { max: Duration },
    /// Power loss: partition, crash; at the end, repair and restart. The sled's model survives
    /// (it lives outside the host, like a container's volume).
    CrashRestart { sled: usize },
    /// A second sled host for the same project (same model) connects: uplinks replace each
    /// other until the second one crashes at the end.
    Twin { sled: usize },
    /// The sled answers every request `CALL_TIMEOUT + SLOW_BY` late (restarted to slow down,
    /// and restarted again at the end to speed up).
    Slow { sled: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub at: Duration,
    pub until: Duration,
    pub kind: FaultKind,
}

/// One run.
#[derive(Clone, PartialEq, Eq)]
pub struct Scenario {
    pub seed: u64,
    pub projects: Vec<String>,
    pub sessions: usize,
    /// Sessions run on this many client hosts (session `i` on host `i % client_hosts`).
    pub client_hosts: usize,
    pub ops: std::ops::RangeInclusive<usize>,
    pub think_max: Duration,
    pub hot_percent: u32,
    pub fixed_id_percent: u32,
    /// The network's longest message latency outside spikes.
    pub net_latency_max: Duration,
    /// Per sled: latency and jitter of each request.
    pub sled_latency: Vec<(Duration, Duration)>,
    pub faults: Vec<Fault>,
    /// When the last fault ends (zero without faults).
    pub heal_at: Duration,
    /// When the sessions make their liveness probe (after their own operations at the latest).
    pub probe_at: Duration,
    pub planted: Option<PlantedBug>,
    /// Who the sessions are and what they may do.
    pub access: Access,
}

/// A right a rule gives (`[[access]]`'s `right`): each includes the ones before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Read,
    Write,
    Admin,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Read => "read",
            Level::Write => "write",
            Level::Admin => "admin",
        }
    }
}

/// One `[[access]]` rule for a principal: `projects` (`None`: `["*"]`) and the right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub projects: Option<Vec<String>>,
    pub level: Level,
}

/// A named client token and the rules naming it (`token = "<name>"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub token: String,
    pub grants: Vec<Grant>,
}

/// The run's client tokens and `[[access]]` rules, and which token each session uses. Three
/// shapes, drawn from the seed: no tokens at all (everyone anonymous, may do everything); named
/// tokens without rules (everyone let in may do everything); and, mostly, tokens with rules:
/// `ops` (admin on `*`), `dev` (write on some projects, read on some others, possibly the same
/// ones: the highest right wins) and `viewer` (read on some), perhaps with an `anyone = true`
/// rule letting everyone read one project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Empty: `client_tokens` is not set and every session is anonymous.
    pub principals: Vec<Principal>,
    /// Whether the file has `[[access]]` rules (without, every caller may do everything).
    pub rules: bool,
    /// Projects an `anyone = true` rule lets every caller read (none: no such rule).
    pub anyone: Vec<String>,
    /// Each session's principal (an index into `principals`), `None` when anonymous.
    pub sessions: Vec<Option<usize>>,
    /// Projects whose sled learns who calls (`forward_principal = true`).
    pub forward_principal: BTreeSet<String>,
}

impl Access {
    fn draw(seed: u64, projects: &[String], sessions: usize) -> Access {
        // An RNG of its own, so the rest of the scenario is drawn as before.
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xacce_55ac_ce55_0017);
        let forward_principal = projects
            .iter()
            .filter(|_| rng.random_bool(0.5))
            .cloned()
            .collect();
        let shape = rng.random_range(0..10);
        if shape == 0 {
            return Access {
                principals: Vec::new(),
                rules: false,
                anyone: Vec::new(),
                sessions: vec![None; sessions],
                forward_principal,
            };
        }
        // A few projects, mostly with the default among them (a caller that may not see the
        // default has none, and its calls without `project` are refused).
        let some = |rng: &mut ChaCha8Rng| -> Vec<String> {
            let k = rng.random_range(1..=projects.len().div_ceil(2));
            let mut picked: BTreeSet<usize> = BTreeSet::new();
            if rng.random_bool(0.75) {
                picked.insert(0);
            }
            while picked.len() < k {
                picked.insert(rng.random_range(0..projects.len()));
            }
            picked.into_iter().map(|i| projects[i].clone()).collect()
        };
        let principal = |name: &str, grants: Vec<Grant>| Principal {
            name: name.to_owned(),
            token: format!("{name}-token-{seed:016x}"),
            grants,
        };
        let principals = vec![
            principal(
                "ops",
                vec![Grant {
                    projects: None,
                    level: Level::Admin,
                }],
            ),
            principal(
                "dev",
                vec![
                    Grant {
                        projects: Some(some(&mut rng)),
                        level: Level::Write,
                    },
                    Grant {
                        projects: Some(some(&mut rng)),
                        level: Level::Read,
                    },
                ],
            ),
            principal(
                "viewer",
                vec![Grant {
                    projects: Some(some(&mut rng)),
                    level: Level::Read,
                }],
            ),
        ];
        let anyone = if rng.random_bool(0.3) {
            vec![projects[rng.random_range(0..projects.len())].clone()]
        } else {
            Vec::new()
        };
        let sessions = (0..sessions)
            .map(|_| {
                Some(match rng.random_range(0..20) {
                    0..=7 => 0,
                    8..=14 => 1,
                    _ => 2,
                })
            })
            .collect();
        Access {
            principals,
            rules: shape != 1,
            anyone: if shape == 1 { Vec::new() } else { anyone },
            sessions,
            forward_principal,
        }
    }

    /// Session `i`'s principal, if it has one.
    pub fn principal(&self, i: usize) -> Option<&Principal> {
        self.sessions
            .get(i)
            .copied()
            .flatten()
            .map(|p| &self.principals[p])
    }

    /// Session `i`'s right on `project`, by the rules as the documentation states them: the
    /// highest of every rule naming its token (or anyone) and the project; none when no rule
    /// does; everything when the file has no rules.
    pub fn level(&self, i: usize, project: &str) -> Option<Level> {
        if !self.rules {
            return Some(Level::Admin);
        }
        let grants = self.principal(i).map_or(&[][..], |p| &p.grants);
        grants
            .iter()
            .filter(|g| {
                g.projects
                    .as_ref()
                    .is_none_or(|ps| ps.iter().any(|p| p == project))
            })
            .map(|g| g.level)
            .chain(
                self.anyone
                    .iter()
                    .any(|p| p == project)
                    .then_some(Level::Read),
            )
            .max()
    }

    /// What session `i` may do, for the per-session oracle.
    pub fn rights(&self, i: usize, projects: &[String]) -> sled_sim::script::Rights {
        sled_sim::script::Rights {
            visible: projects
                .iter()
                .filter(|p| self.level(i, p).is_some())
                .cloned()
                .collect(),
            write: projects
                .iter()
                .filter(|p| self.level(i, p) >= Some(Level::Write))
                .cloned()
                .collect(),
        }
    }

    /// The projects.toml line for the client tokens (a top-level key).
    pub fn tokens_toml(&self) -> String {
        let mut out = String::new();
        if !self.principals.is_empty() {
            out.push_str("client_tokens = [\n");
            for p in &self.principals {
                out.push_str(&format!(
                    "  {{ name = \"{}\", token = \"{}\" }},\n",
                    p.name, p.token
                ));
            }
            out.push_str("]\n");
        }
        out
    }

    /// The projects.toml `[[access]]` tables.
    pub fn rules_toml(&self) -> String {
        let mut out = String::new();
        if !self.rules {
            return out;
        }
        let list = |ps: &[String]| {
            ps.iter()
                .map(|p| format!("\"{p}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for p in &self.principals {
            for g in &p.grants {
                let projects = g.projects.as_deref().map_or("\"*\"".to_owned(), list);
                out.push_str(&format!(
                    "\n[[access]]\ntoken = \"{}\"\nprojects = [{projects}]\nright = \"{}\"\n",
                    p.name,
                    g.level.name()
                ));
            }
        }
        if !self.anyone.is_empty() {
            out.push_str(&format!(
                "\n[[access]]\nanyone = true\nprojects = [{}]\nright = \"read\"\n",
                list(&self.anyone)
            ));
        }
        out
    }
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} sessions on {} client host(s), {} sleds, {:?} ops/session, think ≤ {:?}, hot {}%, fixed ids {}%, net ≤ {:?}, planted {:?}",
            self.seed,
            self.sessions,
            self.client_hosts,
            self.projects.len(),
            self.ops,
            self.think_max,
            self.hot_percent,
            self.fixed_id_percent,
            self.net_latency_max,
            self.planted,
        )?;
        let a = &self.access;
        match (a.principals.is_empty(), a.rules) {
            (true, _) => writeln!(f, "  access: no client tokens")?,
            (false, false) => writeln!(f, "  access: client tokens, no rules")?,
            (false, true) => {
                for p in &a.principals {
                    let grants: Vec<String> = p
                        .grants
                        .iter()
                        .map(|g| {
                            format!(
                                "{} on {}",
                                g.level.name(),
                                g.projects
                                    .as_ref()
                                    .map_or("*".to_owned(), |ps| ps.join(","))
                            )
                        })
                        .collect();
                    writeln!(f, "  access: {}: {}", p.name, grants.join("; "))?;
                }
                if !a.anyone.is_empty() {
                    writeln!(f, "  access: anyone: read on {}", a.anyone.join(","))?;
                }
            }
        }
        let who: Vec<&str> = (0..self.sessions)
            .map(|i| a.principal(i).map_or("anonymous", |p| p.name.as_str()))
            .collect();
        writeln!(
            f,
            "  sessions: {who:?}; forward_principal: {:?}",
            a.forward_principal
        )?;
        for (p, (l, j)) in self.projects.iter().zip(&self.sled_latency) {
            write!(f, "  {p}: {l:?}+{j:?}")?;
        }
        writeln!(f)?;
        for fault in &self.faults {
            writeln!(f, "  {:?}..{:?}: {:?}", fault.at, fault.until, fault.kind)?;
        }
        write!(
            f,
            "  heal at {:?}, probe at {:?}",
            self.heal_at, self.probe_at
        )
    }
}

impl Scenario {
    /// The scenario of `seed`.
    pub fn draw(seed: u64, faults: FaultMode, planted: Option<PlantedBug>) -> Scenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5ce7_a210_0000_0001);
        let sessions = rng.random_range(2..=16);
        let sleds = rng.random_range(2..=16);
        let projects = sled_sim::demo_project_names(sleds);
        let projects_for_access = projects.clone();
        let client_hosts = if sessions > 2 && rng.random_bool(0.5) {
            2
        } else {
            1
        };
        let max_ops = rng.random_range(4..=30);
        let ops = 2.min(max_ops)..=max_ops;
        let think_max = Duration::from_millis(rng.random_range(0..=300));
        let hot_percent = rng.random_range(0..=80);
        let fixed_id_percent = rng.random_range(0..=60);
        let net_latency_max = Duration::from_millis(rng.random_range(1..=50));
        let sled_latency = (0..sleds)
            .map(|_| {
                (
                    Duration::from_millis(rng.random_range(0..=30)),
                    Duration::from_millis(rng.random_range(0..=50)),
                )
            })
            .collect();
        let count = match faults {
            FaultMode::Never => 0,
            FaultMode::Drawn if rng.random_bool(0.35) => 0,
            FaultMode::Drawn => rng.random_range(1..=4),
            FaultMode::Always => rng.random_range(1..=4),
        };
        // Each sled and each client host takes at most one fault, so faults never undo each
        // other's partitions; one latency spike at most.
        let mut free_sleds: Vec<usize> = (0..sleds).collect();
        let mut free_clients: Vec<usize> = (0..client_hosts).collect();
        let mut spiked = false;
        let mut list = Vec::new();
        // Faults strike while the sessions are busy: within the workload's expected length.
        let busy = u64::try_from((think_max / 2 + Duration::from_millis(40)).as_millis())
            .unwrap_or(u64::MAX)
            .saturating_mul(max_ops as u64)
            .max(500);
        for _ in 0..count {
            let at = Duration::from_millis(rng.random_range(100..=busy));
            let until = at + Duration::from_millis(rng.random_range(300..=3_000));
            let dir = match rng.random_range(0..3) {
                0 => Dir::Both,
                1 => Dir::ToGateway,
                _ => Dir::FromGateway,
            };
            let kind = match rng.random_range(0..6) {
                0 if !free_clients.is_empty() => {
                    let client = free_clients.swap_remove(rng.random_range(0..free_clients.len()));
                    FaultKind::PartitionClient { client, dir }
                }
                1 if !spiked => {
                    spiked = true;
                    FaultKind::LatencySpike {
                        max: Duration::from_millis(rng.random_range(100..=1_000)),
                    }
                }
                k if !free_sleds.is_empty() => {
                    // Mostly a project the sessions use a lot: the default or the other hot one.
                    let hot = free_sleds.iter().position(|&i| i < 2);
                    let pick = match hot {
                        Some(h) if rng.random_bool(0.7) => h,
                        _ => rng.random_range(0..free_sleds.len()),
                    };
                    let sled = free_sleds.swap_remove(pick);
                    match k {
                        2 => FaultKind::CrashRestart { sled },
                        3 => FaultKind::Twin { sled },
                        4 => FaultKind::Slow { sled },
                        _ => FaultKind::PartitionSled { sled, dir },
                    }
                }
                _ => continue,
            };
            // A slow sled must stay slow past a call's deadline, or no call ever times out.
            let until = match kind {
                FaultKind::Slow { .. } => until
                    .max(at + CALL_TIMEOUT + Duration::from_millis(rng.random_range(500..=3_000))),
                _ => until,
            };
            list.push(Fault { at, until, kind });
        }
        list.sort_by_key(|f| (f.at, f.until));
        let heal_at = list.iter().map(|f| f.until).max().unwrap_or_default();
        // Without faults, startup is the only "heal": every sled must be connected by then.
        let probe_at = if list.is_empty() {
            STARTUP
        } else {
            heal_at + SETTLE
        };
        Scenario {
            seed,
            projects,
            sessions,
            client_hosts,
            ops,
            think_max,
            hot_percent,
            fixed_id_percent,
            net_latency_max,
            sled_latency,
            faults: list,
            heal_at,
            probe_at,
            planted,
            access: Access::draw(seed, &projects_for_access, sessions),
        }
    }

    /// The host name of sled `i`.
    pub fn sled_host(&self, i: usize) -> String {
        format!("sled-{}", self.projects[i])
    }

    /// The host name of sled `i`'s twin.
    pub fn twin_host(&self, i: usize) -> String {
        format!("twin-{}", self.projects[i])
    }

    /// The name of client host `c`.
    pub fn client_host(c: usize) -> String {
        format!("client-{c}")
    }

    pub fn workload(&self) -> sled_sim::Workload {
        sled_sim::Workload {
            seed: self.seed,
            projects: self.projects.clone(),
            ops: self.ops.clone(),
            think_max: self.think_max,
            hot_percent: self.hot_percent,
            fixed_id_percent: self.fixed_id_percent,
        }
    }
}
