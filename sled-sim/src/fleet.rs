//! A fleet of emulated sleds: one uplink per project, for the gateway's demo and for tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, warn};

use crate::fixture::Fixture;
use crate::identity::{impostor_key, sled_key};
use crate::mcp::{SharedSled, Sled};
use crate::net::{Connect, GatewayAddr, TokioConnect};
use crate::uplink::{run_uplink_with, Backend, UplinkOptions};

const GREEK: [&str; 24] = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi",
    "psi", "omega",
];

/// `n` project names: the 24 Greek letters (`alpha`, `beta`, …, `omega`), then `project-25`,
/// `project-26`, ….
pub fn demo_project_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match GREEK.get(i) {
            Some(name) => (*name).to_owned(),
            None => format!("project-{}", i + 1),
        })
        .collect()
}

/// The seed of one project's sled: FNV-1a over the name, mixed with the fleet seed by
/// SplitMix64. Stable across runs, platforms and versions.
pub fn sled_seed(fleet_seed: u64, project: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in project.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = (fleet_seed ^ hash).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How the sleds of a fleet behave.
#[derive(Clone, Debug)]
pub struct SledOptions {
    /// The fleet seed; each sled's seed is [`sled_seed`]`(seed, project)`.
    pub seed: u64,
    /// How long each request waits before the sled answers it.
    pub latency: Duration,
    /// Up to this much extra per-request delay, drawn from the sled's seeded RNG.
    pub jitter: Duration,
    /// Projects served by the conformance [`Fixture`] instead of the story model (the
    /// latency knob does not apply to them).
    pub fixture_projects: Vec<String>,
    /// The uplink token every sled of the fleet presents, if the gateway requires one.
    pub uplink_token: Option<gateway_core::Secret>,
    /// Whether each sled proves an identity on connect: it signs with
    /// [`sled_key`]`(seed, project)` (the fleet seed). False: hellos name no key.
    pub identity: bool,
    /// Projects whose sleds present [`impostor_key`]`(seed, project)` instead of their own key
    /// (even when `identity` is false): the gateway refuses them once the real key is pinned.
    pub wrong_key: BTreeSet<String>,
    /// Per-project latency, instead of `latency`.
    pub latency_overrides: BTreeMap<String, Duration>,
    /// Projects whose sleds stall their event relay: they serve calls and pongs but send no
    /// `event` frame.
    pub stalled_relay: BTreeSet<String>,
    /// How often each sled sends a `sync` event.
    pub relay_interval: Duration,
    /// The certificate authorities a `wss://` gateway is verified against (default: the
    /// system's).
    pub tls: gateway_client::TlsTrust,
}

impl SledOptions {
    /// The uplink options of `project`'s sled.
    pub fn uplink_options(&self, project: &str) -> UplinkOptions {
        let identity = if self.wrong_key.contains(project) {
            Some(impostor_key(self.seed, project))
        } else if self.identity {
            Some(sled_key(self.seed, project))
        } else {
            None
        };
        UplinkOptions {
            latency: self
                .latency_overrides
                .get(project)
                .copied()
                .unwrap_or(self.latency),
            jitter: self.jitter,
            seed: sled_seed(self.seed, project),
            sled_name: project.to_owned(),
            token: self.uplink_token.clone(),
            identity,
            relay_interval: self.relay_interval,
            stall_relay: self.stalled_relay.contains(project),
            tls: self.tls.clone(),
            ..UplinkOptions::default()
        }
    }
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            seed: 0,
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            fixture_projects: Vec::new(),
            uplink_token: None,
            identity: true,
            wrong_key: BTreeSet::new(),
            latency_overrides: BTreeMap::new(),
            stalled_relay: BTreeSet::new(),
            relay_interval: Duration::from_secs(5),
            tls: gateway_client::TlsTrust::system(),
        }
    }
}

type Starter = Arc<dyn Fn(&Backend) -> JoinHandle<()> + Send + Sync>;

struct Member {
    backend: Backend,
    /// The story-model sled behind `backend` (none for a fixture project).
    sled: Option<SharedSled>,
    task: Option<JoinHandle<()>>,
}

/// One running uplink per project. Dropping the fleet asks every uplink to shut down.
pub struct Fleet {
    members: BTreeMap<String, Member>,
    shutdown: watch::Sender<bool>,
    starter: Option<Starter>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let running: BTreeMap<&str, bool> = self
            .members
            .iter()
            .map(|(name, m)| (name.as_str(), m.task.is_some()))
            .collect();
        f.debug_struct("Fleet").field("running", &running).finish()
    }
}

impl Fleet {
    /// Connects one emulated sled per project to the gateway at `gateway`
    /// (`"http://127.0.0.1:PORT"`), over tokio TCP. Must be called inside a tokio runtime.
    /// A `gateway` that does not parse is logged as an error and no uplink starts. A project
    /// also named in `opts.fixture_projects` is served by the conformance [`Fixture`].
    pub fn spawn(gateway: &str, projects: &[String], opts: SledOptions) -> Fleet {
        Fleet::spawn_with(TokioConnect, gateway, projects, opts)
    }

    /// Same, generic over the connector (a simulation's network). Must be called inside a
    /// tokio runtime.
    pub fn spawn_with<C: Connect>(
        connector: C,
        gateway: &str,
        projects: &[String],
        opts: SledOptions,
    ) -> Fleet {
        let shutdown = watch::Sender::new(false);
        let starter: Option<Starter> = match GatewayAddr::parse(gateway) {
            Ok(addr) => {
                let signal = shutdown.clone();
                let opts = opts.clone();
                Some(Arc::new(move |sled: &Backend| {
                    let uplink_opts = opts.uplink_options(sled.project_name());
                    let mut rx = signal.subscribe();
                    let stop = async move {
                        // Also ends when the fleet is dropped (the sender goes away).
                        let _ = rx.wait_for(|stop| *stop).await;
                    };
                    tokio::spawn(run_uplink_with(
                        connector.clone(),
                        addr.clone(),
                        sled.clone(),
                        uplink_opts,
                        stop,
                    ))
                }))
            }
            Err(e) => {
                error!(error = %e, "fleet: bad gateway address; no sled will connect");
                None
            }
        };
        let mut members = BTreeMap::new();
        for project in projects {
            if members.contains_key(project) {
                warn!(project = %project, "fleet: project listed twice; one sled only");
                continue;
            }
            let (backend, sled) = if opts.fixture_projects.contains(project) {
                (Backend::Handler(Arc::new(Fixture::new(project))), None)
            } else {
                let sled = SharedSled::new(Sled::seeded(project, sled_seed(opts.seed, project)));
                (crate::uplink::story(sled.clone()), Some(sled))
            };
            let task = starter.as_ref().map(|start| start(&backend));
            members.insert(
                project.clone(),
                Member {
                    backend,
                    sled,
                    task,
                },
            );
        }
        Fleet {
            members,
            shutdown,
            starter,
        }
    }

    /// The sled of `project`, to inspect or change its model (`None` for a fixture project).
    pub fn sled(&self, project: &str) -> Option<SharedSled> {
        self.members.get(project).and_then(|m| m.sled.clone())
    }

    /// The fleet's projects, sorted.
    pub fn projects(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    /// Whether `project`'s uplink is running (not stopped).
    pub fn is_running(&self, project: &str) -> bool {
        self.members
            .get(project)
            .is_some_and(|m| m.task.as_ref().is_some_and(|t| !t.is_finished()))
    }

    /// Kills `project`'s uplink now: its tasks are aborted and the socket closes without a
    /// WebSocket close. Returns whether it was running.
    pub fn stop(&mut self, project: &str) -> bool {
        let Some(task) = self.members.get_mut(project).and_then(|m| m.task.take()) else {
            return false;
        };
        let was_running = !task.is_finished();
        task.abort();
        was_running
    }

    /// Starts `project`'s uplink again after [`Fleet::stop`], with the same model. Returns
    /// false if the project is unknown, already running, or the gateway address was bad.
    pub fn start(&mut self, project: &str) -> bool {
        let Some(starter) = self.starter.clone() else {
            return false;
        };
        let Some(member) = self.members.get_mut(project) else {
            return false;
        };
        if member.task.as_ref().is_some_and(|t| !t.is_finished()) {
            return false;
        }
        member.task = Some(starter(&member.backend));
        true
    }

    /// Closes every uplink gracefully (a WebSocket close), aborting any that take longer than
    /// two seconds.
    pub async fn shutdown(mut self) {
        self.shutdown.send_replace(true);
        for member in self.members.values_mut() {
            if let Some(mut task) = member.task.take() {
                if tokio::time::timeout(Duration::from_secs(2), &mut task)
                    .await
                    .is_err()
                {
                    task.abort();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(demo_project_names(0), Vec::<String>::new());
        assert_eq!(demo_project_names(3), vec!["alpha", "beta", "gamma"]);
        let names = demo_project_names(27);
        assert_eq!(names[23], "omega");
        assert_eq!(names[24], "project-25");
        assert_eq!(names[26], "project-27");
    }

    #[test]
    fn uplink_options_follow_the_fleet_options() {
        let mut opts = SledOptions {
            seed: 9,
            latency: Duration::from_millis(10),
            relay_interval: Duration::from_millis(250),
            ..SledOptions::default()
        };
        opts.wrong_key.insert("beta".into());
        opts.stalled_relay.insert("gamma".into());
        opts.latency_overrides
            .insert("gamma".into(), Duration::from_millis(700));
        let alpha = opts.uplink_options("alpha");
        assert_eq!(alpha.identity, Some(sled_key(9, "alpha")));
        assert_eq!(alpha.seed, sled_seed(9, "alpha"));
        assert_eq!(alpha.sled_name, "alpha");
        assert_eq!(alpha.latency, Duration::from_millis(10));
        assert_eq!(alpha.relay_interval, Duration::from_millis(250));
        assert!(!alpha.stall_relay);
        assert_eq!(
            opts.uplink_options("beta").identity,
            Some(impostor_key(9, "beta"))
        );
        let gamma = opts.uplink_options("gamma");
        assert_eq!(gamma.latency, Duration::from_millis(700));
        assert!(gamma.stall_relay);
        opts.identity = false;
        assert_eq!(opts.uplink_options("alpha").identity, None);
        assert_eq!(
            opts.uplink_options("beta").identity,
            Some(impostor_key(9, "beta"))
        );
        // Debug never shows the private key.
        let shown = format!("{:?}", SledOptions::default().uplink_options("alpha"));
        let secret = sled_key(0, "alpha").to_bytes();
        assert!(shown.contains("SigningKey"), "{shown}");
        assert!(!shown.contains(&format!("{secret:?}")), "{shown}");
        assert!(
            !shown.contains(format!("{:?}", &secret[..8]).trim_end_matches(']')),
            "{shown}"
        );
    }

    #[test]
    fn seeds_are_stable_and_distinct() {
        assert_eq!(sled_seed(0, "alpha"), sled_seed(0, "alpha"));
        assert_ne!(sled_seed(0, "alpha"), sled_seed(0, "beta"));
        assert_ne!(sled_seed(0, "alpha"), sled_seed(1, "alpha"));
        // Pinned: must not change between versions or platforms.
        assert_eq!(sled_seed(0, "alpha"), 0x1253_c85b_0c81_7711);
        assert_eq!(sled_seed(42, "project-25"), 0xb1b3_ecff_6101_82e4);
        let names = demo_project_names(100);
        let seeds: std::collections::BTreeSet<u64> =
            names.iter().map(|n| sled_seed(42, n)).collect();
        assert_eq!(seeds.len(), 100);
    }
}
