//! The scenario of one seed: how many sessions and sleds, how fast everything is, and which
//! faults strike when. Everything is drawn from the seed, so a seed names a whole run.

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
