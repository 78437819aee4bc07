//! Two or three replicas' [`Directory`]s over one model bucket, in every order proptest
//! finds: hellos and closes, writes carried out late (or applied and answered `Unavailable`),
//! answers and watch changes delivered late (skipping superseded ones), replicas cut off from
//! the engine and paused (no timeouts), time passing past `max_age`. After every step the
//! invariant of the module docs holds; after the faults heal and every queue drains, each
//! project has at most one open uplink, and it serves.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

const MAX_AGE: Duration = Duration::from_secs(30);
const PROJECTS: [&str; 2] = ["p0", "p1"];

/// The bucket: one revision sequence, the latest write per key, expiry by `max_age`, and the
/// log of every write (what watches deliver).
#[derive(Default)]
struct Kv {
    last_revision: Revision,
    keys: BTreeMap<String, Slot>,
    log: Vec<(Revision, String, EntryState)>,
    /// Who wrote each revision, and whether it was a claim (not a refresh).
    writers: BTreeMap<Revision, (usize, bool)>,
}

struct Slot {
    revision: Revision,
    value: Option<ClaimValue>,
    written_at: Instant,
}

impl Kv {
    fn current(&self, key: &str) -> (Revision, bool) {
        self.keys
            .get(key)
            .map_or((0, false), |s| (s.revision, s.value.is_some()))
    }

    fn write(&mut self, now: Instant, key: &str, state: EntryState) -> Revision {
        self.last_revision += 1;
        let value = match &state {
            EntryState::Claimed(v) => Some(v.clone()),
            _ => None,
        };
        self.keys.insert(
            key.to_owned(),
            Slot {
                revision: self.last_revision,
                value,
                written_at: now,
            },
        );
        self.log.push((self.last_revision, key.to_owned(), state));
        self.last_revision
    }

    fn claim(
        &mut self,
        now: Instant,
        node: usize,
        key: &str,
        expected: Option<Revision>,
        value: ClaimValue,
    ) -> ClaimOutcome {
        let (current, has_value) = self.current(key);
        let ok = match expected {
            None => !has_value,
            Some(e) => e == current,
        };
        if !ok {
            return ClaimOutcome::Conflict {
                current_revision: current,
            };
        }
        let fresh = value.epoch.is_none();
        let revision = self.write(now, key, EntryState::Claimed(value));
        self.writers.insert(revision, (node, fresh));
        ClaimOutcome::Won(revision)
    }

    fn release(&mut self, now: Instant, key: &str, revision: Revision) {
        if self.current(key).0 == revision {
            self.write(now, key, EntryState::Deleted);
        }
    }

    fn expire(&mut self, now: Instant) {
        let due: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, s)| s.value.is_some() && now >= s.written_at + MAX_AGE)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.write(now, &key, EntryState::Expired);
        }
    }
}

/// One replica: its directory, the server around it, and what the test knows of it.
struct Node {
    dir: Directory,
    connected: bool,
    /// Writes decided, not carried out yet.
    outbox: VecDeque<Action>,
    /// Answers not delivered yet.
    inbox: VecDeque<(String, ClaimOutcome)>,
    /// How far its watch has got in the log.
    watch: usize,
    open: BTreeSet<String>,
    /// The `epoch_seen` of each open uplink's hello.
    hello_seen: BTreeMap<String, Option<Epoch>>,
    /// The highest revision it has heard of, per project (watch, or a claim's answer).
    heard: BTreeMap<String, Revision>,
    /// The highest claim (not refresh) it was told it won, per project.
    won: BTreeMap<String, Revision>,
}

#[derive(Debug, Clone)]
enum Op {
    Hello {
        node: usize,
        project: usize,
        ahead: u64,
        report: bool,
    },
    Close {
        node: usize,
        project: usize,
    },
    Execute {
        node: usize,
        ghost: bool,
    },
    Answer {
        node: usize,
    },
    Watch {
        node: usize,
        skip: bool,
    },
    Advance {
        ms: u64,
    },
    Timeout {
        node: usize,
    },
    CutOff {
        node: usize,
    },
    Heal {
        node: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let node = 0usize..3;
    let project = 0usize..PROJECTS.len();
    prop_oneof![
        3 => (node.clone(), project.clone(), 0u64..3, any::<bool>())
            .prop_map(|(node, project, ahead, report)| Op::Hello { node, project, ahead, report }),
        1 => (node.clone(), project).prop_map(|(node, project)| Op::Close { node, project }),
        6 => (node.clone(), prop::bool::weighted(0.1)).prop_map(|(node, ghost)| Op::Execute { node, ghost }),
        6 => node.clone().prop_map(|node| Op::Answer { node }),
        6 => (node.clone(), prop::bool::weighted(0.2)).prop_map(|(node, skip)| Op::Watch { node, skip }),
        3 => (0u64..20_000).prop_map(|ms| Op::Advance { ms }),
        3 => node.clone().prop_map(|node| Op::Timeout { node }),
        1 => node.clone().prop_map(|node| Op::CutOff { node }),
        2 => node.prop_map(|node| Op::Heal { node }),
    ]
}

struct World {
    now: Instant,
    kv: Kv,
    nodes: Vec<Node>,
    /// Each project's sled: the highest epoch it was welcomed with.
    sled_seen: BTreeMap<String, Epoch>,
}

impl World {
    fn new(replicas: usize) -> World {
        World {
            now: super::tests::t0(),
            kv: Kv::default(),
            nodes: (0..replicas)
                .map(|i| Node {
                    dir: Directory::new(format!("r{i}"), DirectoryConfig::new(MAX_AGE)),
                    connected: true,
                    outbox: VecDeque::new(),
                    inbox: VecDeque::new(),
                    watch: 0,
                    open: BTreeSet::new(),
                    hello_seen: BTreeMap::new(),
                    heard: BTreeMap::new(),
                    won: BTreeMap::new(),
                })
                .collect(),
            sled_seen: BTreeMap::new(),
        }
    }

    /// Carries out what the directory decided: `Serve` and `StopServing` at once (the local
    /// uplink), writes later ([`Op::Execute`]).
    fn drain(&mut self, n: usize) {
        while let Some(action) = self.nodes[n].dir.poll_action() {
            match action {
                Action::Serve { project, epoch } => {
                    assert!(
                        self.nodes[n].open.contains(&project),
                        "served a closed uplink"
                    );
                    let seen = self.sled_seen.entry(project).or_default();
                    *seen = (*seen).max(epoch);
                }
                Action::StopServing { project, .. } => {
                    if self.nodes[n].open.remove(&project) {
                        self.nodes[n].dir.handle_uplink_closed(&project);
                    }
                }
                write @ (Action::Claim { .. } | Action::Release { .. }) => {
                    self.nodes[n].outbox.push_back(write)
                }
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        let now = self.now;
        let count = self.nodes.len();
        match *op {
            Op::Hello {
                node,
                project,
                ahead,
                report,
            } => {
                let n = node % count;
                let project = PROJECTS[project].to_owned();
                let seen = self.sled_seen.get(&project).copied();
                let epoch_seen = if report {
                    seen.map(|s| s + ahead)
                } else {
                    None
                };
                let node = &mut self.nodes[n];
                node.open.insert(project.clone());
                node.hello_seen.insert(project.clone(), epoch_seen);
                node.dir.handle_hello(now, &project, epoch_seen, false);
                self.drain(n);
            }
            Op::Close { node, project } => {
                let n = node % count;
                let project = PROJECTS[project];
                if self.nodes[n].open.remove(project) {
                    self.nodes[n].dir.handle_uplink_closed(project);
                    self.drain(n);
                }
            }
            Op::Execute { node, ghost } => {
                let n = node % count;
                let Some(write) = self.nodes[n].outbox.pop_front() else {
                    return;
                };
                let reaches = self.nodes[n].connected || ghost;
                match write {
                    Action::Claim {
                        project,
                        expected_revision,
                        value,
                    } => {
                        let mut outcome = ClaimOutcome::Unavailable;
                        if reaches {
                            outcome = self.kv.claim(now, n, &project, expected_revision, value);
                        }
                        if ghost || !self.nodes[n].connected {
                            outcome = ClaimOutcome::Unavailable;
                        }
                        self.nodes[n].inbox.push_back((project, outcome));
                    }
                    Action::Release { project, revision } => {
                        if reaches {
                            self.kv.release(now, &project, revision);
                        }
                    }
                    Action::Serve { .. } | Action::StopServing { .. } => {
                        unreachable!("carried out by drain")
                    }
                }
            }
            Op::Answer { node } => {
                let n = node % count;
                let Some((project, outcome)) = self.nodes[n].inbox.pop_front() else {
                    return;
                };
                let heard = match outcome {
                    ClaimOutcome::Won(r) => {
                        if self.kv.writers.get(&r) == Some(&(n, true)) {
                            let won = self.nodes[n].won.entry(project.clone()).or_default();
                            *won = (*won).max(r);
                        }
                        r
                    }
                    ClaimOutcome::Conflict { current_revision } => current_revision,
                    ClaimOutcome::Unavailable => 0,
                };
                let h = self.nodes[n].heard.entry(project.clone()).or_default();
                *h = (*h).max(heard);
                self.nodes[n]
                    .dir
                    .handle_claim_outcome(now, &project, outcome);
                self.drain(n);
            }
            Op::Watch { node, skip } => {
                let n = node % count;
                if !self.nodes[n].connected {
                    return;
                }
                let Some((revision, key, state)) = self.kv.log.get(self.nodes[n].watch).cloned()
                else {
                    return;
                };
                self.nodes[n].watch += 1;
                let superseded = self.kv.log[self.nodes[n].watch..]
                    .iter()
                    .any(|(_, k, _)| *k == key);
                if skip && superseded {
                    return;
                }
                let h = self.nodes[n].heard.entry(key.clone()).or_default();
                *h = (*h).max(revision);
                self.nodes[n].dir.handle_entry(&key, revision, state);
                self.drain(n);
            }
            Op::Advance { ms } => {
                self.now += Duration::from_millis(ms);
                self.kv.expire(self.now);
            }
            Op::Timeout { node } => {
                let n = node % count;
                self.nodes[n].dir.handle_timeout(now);
                self.drain(n);
            }
            Op::CutOff { node } => {
                let n = node % count;
                self.nodes[n].connected = false;
                self.nodes[n].dir.handle_engine(now, false);
                self.drain(n);
            }
            Op::Heal { node } => {
                let n = node % count;
                self.nodes[n].connected = true;
                self.nodes[n].dir.handle_engine(now, true);
                self.drain(n);
            }
        }
    }

    /// The invariant of the module docs.
    fn check(&self) -> Result<(), TestCaseError> {
        for project in PROJECTS {
            let serving: Vec<(usize, Epoch)> = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| n.dir.may_serve(project).map(|e| (i, e)))
                .collect();
            for &(i, e) in &serving {
                let node = &self.nodes[i];
                prop_assert!(
                    node.open.contains(project),
                    "r{i} serves {project} with no uplink"
                );
                prop_assert_eq!(
                    self.kv.writers.get(&e),
                    Some(&(i, true)),
                    "r{} serves {} at {}, not a claim it won",
                    i,
                    project,
                    e
                );
                if let Some(Some(seen)) = node.hello_seen.get(project) {
                    prop_assert!(
                        e > *seen,
                        "r{i} serves {project} at {e}, the sled saw {seen}"
                    );
                }
                let won = node.won.get(project).copied().unwrap_or(0);
                prop_assert!(e >= won, "r{i} serves {project} at {e} but won {won}");
                for &(j, f) in &serving {
                    if i == j {
                        continue;
                    }
                    prop_assert_ne!(e, f, "two replicas serve {} at one epoch", project);
                    if e < f {
                        let heard = node.heard.get(project).copied().unwrap_or(0);
                        prop_assert!(
                            heard < f,
                            "r{i} serves {project} at {e} though it heard of {heard} >= r{j}'s {f}"
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Heals every fault and delivers everything, in order, until nothing moves.
    fn settle(&mut self) {
        for n in 0..self.nodes.len() {
            self.apply(&Op::Heal { node: n });
        }
        // Retries after `Unavailable` come due; no refresh does (less than a third of max_age
        // has passed since the heal's refreshes were sent).
        self.now += DirectoryConfig::new(MAX_AGE).retry_after;
        for n in 0..self.nodes.len() {
            self.apply(&Op::Timeout { node: n });
        }
        for _ in 0..10_000 {
            let busy = self.nodes.iter().any(|n| {
                !n.outbox.is_empty() || !n.inbox.is_empty() || n.watch < self.kv.log.len()
            });
            if !busy {
                // Retries after `Unavailable` answers wait `retry_after`: let it pass.
                let retry_after = DirectoryConfig::new(MAX_AGE).retry_after;
                let soon = self
                    .nodes
                    .iter()
                    .filter_map(|n| n.dir.poll_timeout())
                    .filter(|&t| t <= self.now + retry_after)
                    .min();
                let Some(at) = soon else { return };
                self.now = self.now.max(at);
                for n in 0..self.nodes.len() {
                    self.apply(&Op::Timeout { node: n });
                }
                continue;
            }
            for n in 0..self.nodes.len() {
                self.apply(&Op::Execute {
                    node: n,
                    ghost: false,
                });
                self.apply(&Op::Answer { node: n });
                self.apply(&Op::Watch {
                    node: n,
                    skip: false,
                });
            }
        }
        panic!("the directories never settled");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn one_replica_serves_each_project_at_each_epoch(
        replicas in 2usize..=3,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut world = World::new(replicas);
        for op in &ops {
            world.apply(op);
            world.check()?;
        }
        world.settle();
        world.check()?;
        for project in PROJECTS {
            let open: Vec<usize> = (0..replicas)
                .filter(|&n| world.nodes[n].open.contains(project))
                .collect();
            prop_assert!(open.len() <= 1, "{} has uplinks open on {:?}", project, open);
            for n in open {
                prop_assert!(
                    world.nodes[n].dir.may_serve(project).is_some(),
                    "r{}'s uplink of {} is open and not serving", n, project
                );
                prop_assert_eq!(
                    world.nodes.iter().filter(|m| m.dir.owner(project) == Owner::Replica(format!("r{n}"))).count(),
                    replicas - 1,
                    "every other replica routes {} to r{}", project, n
                );
            }
        }
    }
}
