//! The directory of project owners, as one replica sees it (issue 15, "One owner per project").
//!
//! Replicas of a cluster keep one key per project in a bucket of the engine (NATS key/value;
//! see `gateway_server::cluster`). A key's value names the replica that owns the project, and
//! the revision of the write that claimed it is the claim's **epoch**: the replica sends it to
//! the sled in its welcome ([`crate::uplink::Control::Welcome`]), and the sled serves calls only
//! on the uplink welcomed with its highest epoch. A [`Directory`] is the part of one replica
//! that decides when to claim, refresh and release, and whether the local uplink of a project
//! may serve calls. It is sans-IO: the server carries out its [`Action`]s on the engine and
//! feeds back what happened; time is the caller's `now`.
//!
//! # The run loop
//!
//! 1. Feed events in: [`Directory::handle_hello`] (a sled of the project said hello here, with
//!    the highest epoch it reports having seen), [`Directory::handle_uplink_closed`],
//!    [`Directory::handle_entry`] (the engine's watch of the bucket reported a write of the
//!    project's key), [`Directory::handle_claim_outcome`] (the answer to a [`Action::Claim`]),
//!    [`Directory::handle_engine`] (the engine client lost or regained its connection),
//!    [`Directory::handle_timeout`], [`Directory::handle_shutdown`].
//! 2. Drain [`Directory::poll_action`] and carry out each action: `Claim` is a `create` (when
//!    `expected_revision` is `None`) or an `update` at that revision, writing
//!    [`ClaimValue::to_json`]; its result goes back as a [`ClaimOutcome`]. `Release` is a
//!    `delete` at that revision (its result needs no answer: the watch reports it). `Serve`
//!    sends the welcome with the epoch; `StopServing` closes the project's local uplink.
//! 3. Sleep until [`Directory::poll_timeout`] and call [`Directory::handle_timeout`] with the
//!    current time.
//!
//! # The rules
//!
//! - **Ownership only by compare-and-set.** The watch tells the directory the latest write it
//!   knows of, which is used as the `expected_revision` of the next claim and to route calls
//!   ([`Directory::owner`]), never to serve: only a [`ClaimOutcome::Won`] makes the local
//!   uplink serve, at the won revision.
//! - **A hello always claims** (the newer sled wins, as on one gateway): by compare-and-set at
//!   the latest revision known, so it takes over a live owner, a dead one (no need to wait for
//!   its claim to expire) or an expired or released key. A conflict names the current
//!   revision, and the claim is tried again at it: the write that beat it may be the owner's
//!   refresh. A claim is won for the local uplink that is there when the answer comes; a hello
//!   on a replica that already serves the project replaces its uplink (the gateway closes the
//!   old one with 4001) and the replica claims again, so the new uplink gets a new epoch.
//! - **Epochs never go back.** A won revision at or below the `epoch_seen` of the hello is
//!   written again (a compare-and-set on itself) until it is above; that happens only when the
//!   engine lost its data, and a sled more than [`DirectoryConfig::max_epoch_bumps`] writes
//!   ahead is closed instead.
//! - **Refresh.** The bucket's `max_age` expires a key not written for that long, so a
//!   serving replica re-writes its claim (compare-and-set at its last revision, the value
//!   naming the claim's epoch) [`DirectoryConfig::refresh_after`] (a third of `max_age`) after
//!   it *sent* the last write that succeeded; the engine's clock starts when the write lands,
//!   later, so the replica's deadline is the earlier one. A refresh that fails with
//!   `Unavailable` is tried again every [`DirectoryConfig::retry_after`]: two can be missed
//!   before the claim is in danger. The refresh's revision is not a new epoch.
//! - **Losing a claim stops serving at once.** A refresh that conflicts, or a write to the
//!   key that the watch reports above the claim's last revision and that is not the claim's
//!   own refresh (another replica's claim, a delete, an expiry, a value it cannot read) gives
//!   [`Action::StopServing`], and [`Directory::may_serve`] says `None` from that moment.
//! - **An engine outage is not a sled outage.** While the engine is lost the replica keeps
//!   serving its live uplinks, refreshes nothing and claims nothing (a hello waits, and the
//!   sled's own handshake timeout sends it elsewhere); when the engine is back it refreshes
//!   every claim at once and claims for the hellos still waiting. If its claim expired or was
//!   taken over meanwhile, the watch (catching up) or the refresh's conflict stops it.
//!
//! # The invariant
//!
//! Checked by a property test over interleavings of replicas sharing one model bucket
//! (`directory/interleavings.rs`):
//!
//! - at most one replica serves a project at a given epoch, and that epoch is a revision the
//!   replica won by a claim (not a refresh), above the `epoch_seen` of the hello it serves;
//! - a replica serves a project only at the newest epoch it has won for it;
//! - when two replicas serve one project (at epochs `e1 < e2`), the one at `e1` has learned of
//!   no write of the project's key at or after `e2` (from the watch, or a claim's answer): it
//!   is cut off from the engine, or the news is still in flight, and the sled's epoch fence
//!   refuses its calls.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

#[cfg(test)]
mod interleavings;

/// A bucket's write sequence number (see `gateway_server::cluster::Revision`).
pub type Revision = u64;

/// The revision of the write that won a claim: the fencing token a sled is welcomed with.
pub type Epoch = u64;

/// The value of a project's key in the directory bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimValue {
    /// The replica that claimed the project.
    pub owner: String,
    /// `None` in the write that claims (its own revision is the epoch); the claim's epoch in
    /// the refreshes that follow it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    /// The claiming write of a handover (issue 30): the sled opened this uplink because the
    /// replica that held the project asked it to move ([`crate::uplink::Control::Move`]). That
    /// replica is alive and answers the calls still running on its old uplink, so the others
    /// do not fail their relays to it when they see this claim. Absent otherwise (and from
    /// refreshes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handover: bool,
}

impl ClaimValue {
    /// The bytes to write.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a ClaimValue always serialises")
    }

    /// Reads a value from the bucket.
    pub fn parse(bytes: &[u8]) -> Result<ClaimValue, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The epoch of the claim this value belongs to, given the revision it was written at.
    pub fn claim_epoch(&self, revision: Revision) -> Epoch {
        self.epoch.unwrap_or(revision)
    }
}

/// A write of a project's key, as the engine's watch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryState {
    /// Created or updated with this value.
    Claimed(ClaimValue),
    /// Created or updated with a value that [`ClaimValue::parse`] refuses: someone's claim,
    /// nobody's we can route to.
    Unreadable,
    /// Deleted (a release).
    Deleted,
    /// Not written for the bucket's `max_age`.
    Expired,
}

/// The answer to an [`Action::Claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The write happened at this revision.
    Won(Revision),
    /// The key was not at the expected revision (or, for a create, held a value): it is at
    /// `current_revision` (0: no trace).
    Conflict { current_revision: Revision },
    /// The engine could not be reached; the write may still have happened.
    Unavailable,
}

/// What the server must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write `value` to the project's key: `create` when `expected_revision` is `None`, else
    /// `update` at that revision. Answer with [`Directory::handle_claim_outcome`].
    Claim {
        project: String,
        expected_revision: Option<Revision>,
        value: ClaimValue,
    },
    /// Delete the project's key at `revision` (a compare-and-set; a conflict means someone
    /// else wrote since, and is ignored).
    Release { project: String, revision: Revision },
    /// The project's local uplink may serve calls: welcome it with this epoch.
    Serve { project: String, epoch: Epoch },
    /// The project's local uplink must not serve calls any more: close it.
    StopServing { project: String, reason: Loss },
}

/// Why a replica stopped serving a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// The watch reported a later claim: by this replica, or `None` when its value was
    /// unreadable or it was a claim of this replica's own that it never won knowingly.
    TakenOver {
        by: Option<String>,
        revision: Revision,
    },
    /// The watch reported the key deleted.
    Deleted { revision: Revision },
    /// The watch reported the key expired: the claim was not refreshed within `max_age`.
    Expired { revision: Revision },
    /// A refresh found the key at another revision.
    Conflict { current_revision: Revision },
    /// The sled reports an epoch further ahead of the engine's revisions than
    /// [`DirectoryConfig::max_epoch_bumps`] writes.
    EpochOutOfReach {
        epoch_seen: Epoch,
        revision: Revision,
    },
    /// The replica is shutting down.
    ShuttingDown,
}

/// Who owns a project, as far as this replica knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This replica, whose local uplink serves at this epoch.
    Local { epoch: Epoch },
    /// Another replica, by name (from the watch: it may be a moment out of date).
    Replica(String),
    /// Nobody that calls can go to now.
    Nobody,
}

/// The directory's timing and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryConfig {
    /// The directory bucket's `max_age`: a claim not written for this long expires.
    pub max_age: Duration,
    /// How long after a successful write's sending a claim is refreshed: a third of `max_age`.
    pub refresh_after: Duration,
    /// How long after an `Unavailable` answer a write is tried again.
    pub retry_after: Duration,
    /// The most writes a claim makes to get its epoch above the sled's `epoch_seen`.
    pub max_epoch_bumps: u32,
}

impl DirectoryConfig {
    /// `refresh_after` a third of `max_age`, `retry_after` a tenth of it (at most one second).
    pub fn new(max_age: Duration) -> DirectoryConfig {
        DirectoryConfig {
            max_age,
            refresh_after: max_age / 3,
            retry_after: (max_age / 10).min(Duration::from_secs(1)),
            max_epoch_bumps: 1000,
        }
    }
}

/// One replica's view and decisions; see the module docs.
///
/// Methods come in three groups: queries ([`Directory::owner`], [`Directory::may_serve`]),
/// `handle_*` inputs, and the outputs [`Directory::poll_action`] (drain it after every input)
/// and [`Directory::poll_timeout`].
#[derive(Debug)]
pub struct Directory {
    replica: String,
    config: DirectoryConfig,
    engine_up: bool,
    shutting_down: bool,
    projects: BTreeMap<String, Project>,
    actions: VecDeque<Action>,
}

/// What one replica knows and does about one project.
#[derive(Debug, Default)]
struct Project {
    /// The latest write of the key this replica knows of (0: none).
    known_revision: Revision,
    /// What that write was.
    known: Known,
    local: Local,
    /// The one write in flight.
    attempt: Option<Attempt>,
    /// When to try again after an `Unavailable` answer (or at once, after the engine is back).
    retry_at: Option<Instant>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Known {
    /// Never written, deleted or expired.
    #[default]
    NoValue,
    Value(ClaimValue),
    /// A value that could not be read, or a write learned of only by its revision (a conflict).
    Unknown,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Local {
    /// No local uplink of the project.
    #[default]
    None,
    /// A hello is waiting for its claim.
    Pending {
        epoch_seen: Option<Epoch>,
        bumps: u32,
        /// The hello answers a move (a handover): the claim says so.
        moving: bool,
    },
    /// The local uplink serves at `epoch`; `revision` is the claim's latest write, sent at
    /// `written_at` (or earlier).
    Serving {
        epoch: Epoch,
        revision: Revision,
        written_at: Instant,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttemptKind {
    Claim,
    Refresh,
}

#[derive(Debug, Clone, Copy)]
struct Attempt {
    kind: AttemptKind,
    sent_at: Instant,
}

impl Directory {
    /// The directory of replica `replica`, with the engine reachable.
    pub fn new(replica: impl Into<String>, config: DirectoryConfig) -> Directory {
        Directory {
            replica: replica.into(),
            config,
            engine_up: true,
            shutting_down: false,
            projects: BTreeMap::new(),
            actions: VecDeque::new(),
        }
    }

    // Queries.

    /// This replica's name, as its claims write it.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Whether the engine is reachable, as [`Directory::handle_engine`] last said.
    pub fn engine_up(&self) -> bool {
        self.engine_up
    }

    /// The epoch at which the project's local uplink may serve calls at this instant, `None`
    /// when it may not (no claim won, or the claim lost).
    pub fn may_serve(&self, project: &str) -> Option<Epoch> {
        match self.projects.get(project)?.local {
            Local::Serving { epoch, .. } => Some(epoch),
            Local::None | Local::Pending { .. } => None,
        }
    }

    /// Who owns the project now: this replica when it serves it; else the replica the latest
    /// write this replica knows of names.
    pub fn owner(&self, project: &str) -> Owner {
        let Some(p) = self.projects.get(project) else {
            return Owner::Nobody;
        };
        match (&p.local, &p.known) {
            (Local::Serving { epoch, .. }, _) => Owner::Local { epoch: *epoch },
            (_, Known::Value(v)) if v.owner != self.replica => Owner::Replica(v.owner.clone()),
            _ => Owner::Nobody,
        }
    }

    // Inputs.

    /// A sled of `project` said hello on this replica, reporting the highest epoch it has been
    /// welcomed with. Its uplink replaces any local one (the gateway closes that), and the
    /// replica claims the project for it.
    pub fn handle_hello(
        &mut self,
        now: Instant,
        project: &str,
        epoch_seen: Option<Epoch>,
        moving: bool,
    ) {
        if self.shutting_down {
            self.actions.push_back(Action::StopServing {
                project: project.to_owned(),
                reason: Loss::ShuttingDown,
            });
            return;
        }
        let p = self.projects.entry(project.to_owned()).or_default();
        p.local = Local::Pending {
            epoch_seen,
            bumps: 0,
            moving,
        };
        p.retry_at = None;
        self.drive(now, project);
    }

    /// The project's local uplink closed: its claim, if won, is released.
    pub fn handle_uplink_closed(&mut self, project: &str) {
        let Some(p) = self.projects.get_mut(project) else {
            return;
        };
        let local = std::mem::take(&mut p.local);
        p.retry_at = None;
        if let Local::Serving { revision, .. } = local {
            // With a write in flight the release waits for its answer (a won write is
            // released then); with the engine lost the claim expires on its own.
            if p.attempt.is_none() && self.engine_up {
                self.actions.push_back(Action::Release {
                    project: project.to_owned(),
                    revision,
                });
            }
        }
    }

    /// The engine's watch reported a write of the project's key at `revision`.
    pub fn handle_entry(&mut self, project: &str, revision: Revision, state: EntryState) {
        let replica = &self.replica;
        let p = self.projects.entry(project.to_owned()).or_default();
        let news = revision > p.known_revision
            || (revision == p.known_revision && p.known == Known::Unknown);
        if !news {
            return;
        }
        p.known_revision = revision;
        p.known = match &state {
            EntryState::Claimed(v) => Known::Value(v.clone()),
            EntryState::Unreadable => Known::Unknown,
            EntryState::Deleted | EntryState::Expired => Known::NoValue,
        };
        match p.local {
            Local::Serving {
                epoch,
                revision: ours,
                written_at,
            } if revision > ours => {
                let own_refresh = matches!(&state, EntryState::Claimed(v)
                    if v.owner == *replica && v.epoch == Some(epoch));
                if own_refresh {
                    // Our refresh, seen before its answer (or answered `Unavailable`). Its
                    // sending time is not known here: keep the older one.
                    p.local = Local::Serving {
                        epoch,
                        revision,
                        written_at,
                    };
                } else {
                    let reason = match state {
                        EntryState::Claimed(v) if v.owner != *replica => Loss::TakenOver {
                            by: Some(v.owner),
                            revision,
                        },
                        EntryState::Claimed(_) | EntryState::Unreadable => {
                            Loss::TakenOver { by: None, revision }
                        }
                        EntryState::Deleted => Loss::Deleted { revision },
                        EntryState::Expired => Loss::Expired { revision },
                    };
                    self.stop(project, reason);
                }
            }
            Local::None => {
                // A claim of ours that no uplink here serves (a write answered `Unavailable`
                // that happened after all): free the key rather than wait for its expiry.
                let ours = matches!(&state, EntryState::Claimed(v) if v.owner == *replica);
                if ours && p.attempt.is_none() && self.engine_up {
                    self.actions.push_back(Action::Release {
                        project: project.to_owned(),
                        revision,
                    });
                }
            }
            Local::Serving { .. } | Local::Pending { .. } => {}
        }
    }

    /// The answer to the project's [`Action::Claim`].
    pub fn handle_claim_outcome(&mut self, now: Instant, project: &str, outcome: ClaimOutcome) {
        let replica = self.replica.clone();
        let engine_up = self.engine_up;
        let max_bumps = self.config.max_epoch_bumps;
        let retry_after = self.config.retry_after;
        let Some(p) = self.projects.get_mut(project) else {
            return;
        };
        let Some(attempt) = p.attempt.take() else {
            return;
        };
        match outcome {
            ClaimOutcome::Won(revision) => {
                // Someone wrote after us already (the watch said so): our write is superseded.
                let superseded = p.known_revision > revision;
                if !superseded {
                    p.known_revision = revision;
                    p.known = Known::Value(ClaimValue {
                        owner: replica,
                        epoch: match (attempt.kind, p.local) {
                            (AttemptKind::Refresh, Local::Serving { epoch, .. }) => Some(epoch),
                            _ => None,
                        },
                        handover: false,
                    });
                }
                match (attempt.kind, p.local) {
                    (_, Local::None) => {
                        if !superseded && engine_up {
                            self.actions.push_back(Action::Release {
                                project: project.to_owned(),
                                revision,
                            });
                        }
                    }
                    (AttemptKind::Refresh, Local::Serving { epoch, .. }) => {
                        if superseded {
                            // The watch already stopped us unless the later write was ours.
                        } else {
                            p.local = Local::Serving {
                                epoch,
                                revision,
                                written_at: attempt.sent_at,
                            };
                        }
                    }
                    // A refresh for the uplink a hello just replaced: now claim for the new one.
                    (AttemptKind::Refresh, Local::Pending { .. }) => {}
                    // (A claim goes out only for a waiting hello, so `Serving` cannot be met
                    // here; were it, the won claim is the newer epoch.)
                    (
                        AttemptKind::Claim,
                        local @ (Local::Pending { .. } | Local::Serving { .. }),
                    ) => {
                        let (epoch_seen, bumps, moving) = match local {
                            Local::Pending {
                                epoch_seen,
                                bumps,
                                moving,
                            } => (epoch_seen, bumps, moving),
                            Local::Serving { .. } | Local::None => (None, 0, false),
                        };
                        if superseded {
                            self.stop(
                                project,
                                Loss::TakenOver {
                                    by: None,
                                    revision: self.projects[project].known_revision,
                                },
                            );
                        } else if epoch_seen.is_some_and(|seen| revision <= seen) {
                            if bumps >= max_bumps {
                                let seen = epoch_seen.unwrap_or_default();
                                self.stop(
                                    project,
                                    Loss::EpochOutOfReach {
                                        epoch_seen: seen,
                                        revision,
                                    },
                                );
                                self.actions.push_back(Action::Release {
                                    project: project.to_owned(),
                                    revision,
                                });
                            } else {
                                p.local = Local::Pending {
                                    epoch_seen,
                                    bumps: bumps + 1,
                                    moving,
                                };
                            }
                        } else {
                            p.local = Local::Serving {
                                epoch: revision,
                                revision,
                                written_at: attempt.sent_at,
                            };
                            self.actions.push_back(Action::Serve {
                                project: project.to_owned(),
                                epoch: revision,
                            });
                        }
                    }
                }
            }
            ClaimOutcome::Conflict { current_revision } => {
                // 0 below what we know: the key's last trace aged out while this replica was
                // cut off (its watch cannot report that), so the next claim creates it. An
                // answer that is older news than the watch's corrects itself: the create
                // conflicts at the current revision.
                if current_revision > p.known_revision || current_revision == 0 {
                    p.known_revision = current_revision;
                    p.known = if current_revision == 0 {
                        Known::NoValue
                    } else {
                        Known::Unknown
                    };
                }
                if let Local::Serving { .. } = p.local {
                    self.stop(project, Loss::Conflict { current_revision });
                }
                // A waiting hello tries again at once, at the current revision.
            }
            ClaimOutcome::Unavailable => {
                if p.local != Local::None {
                    p.retry_at = Some(now + retry_after);
                }
            }
        }
        self.drive(now, project);
    }

    /// The engine client lost (`false`) or regained (`true`) its connection. While it is lost
    /// nothing is claimed or refreshed, and live uplinks keep serving.
    pub fn handle_engine(&mut self, now: Instant, up: bool) {
        let regained = up && !self.engine_up;
        self.engine_up = up;
        if !regained {
            return;
        }
        let names: Vec<String> = self.projects.keys().cloned().collect();
        for name in names {
            let p = self
                .projects
                .get_mut(&name)
                .expect("the name was just listed");
            p.retry_at = match p.local {
                // The outage may have lasted past the refresh: refresh at once.
                Local::Serving { .. } => Some(now),
                Local::Pending { .. } | Local::None => None,
            };
            self.drive(now, &name);
        }
    }

    /// Time passed: refreshes and retries that are due go out.
    pub fn handle_timeout(&mut self, now: Instant) {
        let names: Vec<String> = self.projects.keys().cloned().collect();
        for name in names {
            self.drive(now, &name);
        }
    }

    /// The replica drains: every local uplink stops serving and every claim is released; a
    /// later hello is closed at once.
    pub fn handle_shutdown(&mut self) {
        self.shutting_down = true;
        let names: Vec<String> = self.projects.keys().cloned().collect();
        for name in names {
            let p = &self.projects[&name];
            let release = match p.local {
                Local::None => continue,
                Local::Serving { revision, .. } => {
                    (p.attempt.is_none() && self.engine_up).then_some(revision)
                }
                Local::Pending { .. } => None,
            };
            self.stop(&name, Loss::ShuttingDown);
            if let Some(revision) = release {
                self.actions.push_back(Action::Release {
                    project: name,
                    revision,
                });
            }
        }
    }

    // Outputs.

    /// The next action for the server, in the order they were decided.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Directory::handle_timeout`] has something to do; `None` while the engine is lost
    /// (nothing is written until [`Directory::handle_engine`] says it is back).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.engine_up || self.shutting_down {
            return None;
        }
        self.projects.values().filter_map(|p| self.due(p)).min()
    }

    // Internals.

    /// When the project's next write is due, if one is.
    fn due(&self, p: &Project) -> Option<Instant> {
        if p.attempt.is_some() {
            return None;
        }
        match p.local {
            Local::None => None,
            // Without a retry time a waiting hello's claim goes out with the input that made
            // it due ([`Directory::drive`]), so there is nothing to wake up for.
            Local::Pending { .. } => p.retry_at,
            Local::Serving { written_at, .. } => {
                Some(p.retry_at.unwrap_or(written_at + self.config.refresh_after))
            }
        }
    }

    /// Sends the project's next write if it is due and may be sent now.
    fn drive(&mut self, now: Instant, project: &str) {
        if !self.engine_up || self.shutting_down {
            return;
        }
        let Some(p) = self.projects.get(project) else {
            return;
        };
        if p.attempt.is_some() {
            return;
        }
        let due = match (p.local, p.retry_at) {
            (Local::Pending { .. }, None) => true,
            _ => self.due(p).is_some_and(|at| at <= now),
        };
        if !due {
            return;
        }
        let p = self
            .projects
            .get_mut(project)
            .expect("the project was just read");
        let (kind, expected_revision, epoch, handover) = match p.local {
            Local::None => return,
            Local::Pending { moving, .. } => {
                let expected = match p.known {
                    Known::NoValue => None,
                    Known::Value(_) | Known::Unknown => Some(p.known_revision),
                };
                (AttemptKind::Claim, expected, None, moving)
            }
            Local::Serving {
                epoch, revision, ..
            } => (AttemptKind::Refresh, Some(revision), Some(epoch), false),
        };
        p.attempt = Some(Attempt { kind, sent_at: now });
        p.retry_at = None;
        self.actions.push_back(Action::Claim {
            project: project.to_owned(),
            expected_revision,
            value: ClaimValue {
                owner: self.replica.clone(),
                epoch,
                handover,
            },
        });
    }

    /// The local uplink must not serve any more.
    fn stop(&mut self, project: &str, reason: Loss) {
        if let Some(p) = self.projects.get_mut(project) {
            p.local = Local::None;
            p.retry_at = None;
        }
        self.actions.push_back(Action::StopServing {
            project: project.to_owned(),
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_AGE: Duration = Duration::from_secs(30);

    /// The fake clock's origin: the one real reading, made once per test.
    #[allow(clippy::disallowed_methods)]
    pub(super) fn t0() -> Instant {
        Instant::now()
    }

    fn config() -> DirectoryConfig {
        DirectoryConfig::new(MAX_AGE)
    }

    fn drain(d: &mut Directory) -> Vec<Action> {
        std::iter::from_fn(|| d.poll_action()).collect()
    }

    fn claim(
        project: &str,
        expected: Option<Revision>,
        owner: &str,
        epoch: Option<Epoch>,
    ) -> Action {
        Action::Claim {
            project: project.into(),
            expected_revision: expected,
            value: ClaimValue {
                owner: owner.into(),
                epoch,
                handover: false,
            },
        }
    }

    fn serve(project: &str, epoch: Epoch) -> Action {
        Action::Serve {
            project: project.into(),
            epoch,
        }
    }

    fn stop(project: &str, reason: Loss) -> Action {
        Action::StopServing {
            project: project.into(),
            reason,
        }
    }

    fn put(owner: &str, epoch: Option<Epoch>) -> EntryState {
        EntryState::Claimed(ClaimValue {
            owner: owner.into(),
            epoch,
            handover: false,
        })
    }

    /// Replica `r1` serving `alpha` at epoch 3 (won at `t0`), and `t0`.
    fn serving() -> (Directory, Instant) {
        let t0 = t0();
        let mut d = Directory::new("r1", config());
        d.handle_hello(t0, "alpha", None, false);
        assert_eq!(drain(&mut d), [claim("alpha", None, "r1", None)]);
        assert_eq!(d.may_serve("alpha"), None, "not before the claim is won");
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(3));
        assert_eq!(drain(&mut d), [serve("alpha", 3)]);
        (d, t0)
    }

    #[test]
    fn a_hello_claims_and_serves_at_the_won_revision() {
        let (d, t0) = serving();
        assert_eq!(d.may_serve("alpha"), Some(3));
        assert_eq!(d.owner("alpha"), Owner::Local { epoch: 3 });
        assert_eq!(d.owner("beta"), Owner::Nobody);
        assert_eq!(d.poll_timeout(), Some(t0 + MAX_AGE / 3));
    }

    #[test]
    fn a_claim_is_refreshed_a_third_of_max_age_after_its_last_write_was_sent() {
        let (mut d, t0) = serving();
        d.handle_timeout(t0 + MAX_AGE / 3 - Duration::from_millis(1));
        assert_eq!(drain(&mut d), []);
        let t1 = t0 + MAX_AGE / 3;
        d.handle_timeout(t1);
        assert_eq!(drain(&mut d), [claim("alpha", Some(3), "r1", Some(3))]);
        assert_eq!(d.poll_timeout(), None, "one write in flight at a time");
        // The answer comes late; the next refresh counts from the sending.
        d.handle_claim_outcome(t1 + Duration::from_secs(2), "alpha", ClaimOutcome::Won(9));
        assert_eq!(drain(&mut d), []);
        assert_eq!(
            d.may_serve("alpha"),
            Some(3),
            "a refresh is not a new epoch"
        );
        assert_eq!(d.poll_timeout(), Some(t1 + MAX_AGE / 3));
        d.handle_timeout(t1 + MAX_AGE / 3);
        assert_eq!(drain(&mut d), [claim("alpha", Some(9), "r1", Some(3))]);
    }

    #[test]
    fn a_failed_refresh_is_retried_and_the_uplink_keeps_serving() {
        let (mut d, t0) = serving();
        let t1 = t0 + MAX_AGE / 3;
        d.handle_timeout(t1);
        drain(&mut d);
        d.handle_claim_outcome(t1, "alpha", ClaimOutcome::Unavailable);
        assert_eq!(d.may_serve("alpha"), Some(3));
        assert_eq!(d.poll_timeout(), Some(t1 + config().retry_after));
        d.handle_timeout(t1 + config().retry_after);
        assert_eq!(drain(&mut d), [claim("alpha", Some(3), "r1", Some(3))]);
    }

    #[test]
    fn a_takeover_seen_by_the_watch_stops_serving_at_once() {
        let (mut d, _) = serving();
        d.handle_entry("alpha", 3, put("r1", None));
        assert_eq!(drain(&mut d), [], "our own claim");
        d.handle_entry("alpha", 5, put("r2", None));
        assert_eq!(
            drain(&mut d),
            [stop(
                "alpha",
                Loss::TakenOver {
                    by: Some("r2".into()),
                    revision: 5
                }
            )]
        );
        assert_eq!(d.may_serve("alpha"), None);
        assert_eq!(d.owner("alpha"), Owner::Replica("r2".into()));
        assert_eq!(d.poll_timeout(), None, "nothing to refresh");
    }

    #[test]
    fn expiry_and_deletion_stop_serving() {
        let (mut d, _) = serving();
        d.handle_entry("alpha", 4, EntryState::Expired);
        assert_eq!(
            drain(&mut d),
            [stop("alpha", Loss::Expired { revision: 4 })]
        );
        assert_eq!(d.owner("alpha"), Owner::Nobody);
        let (mut d, _) = serving();
        d.handle_entry("alpha", 4, EntryState::Deleted);
        assert_eq!(
            drain(&mut d),
            [stop("alpha", Loss::Deleted { revision: 4 })]
        );
        let (mut d, _) = serving();
        d.handle_entry("alpha", 4, EntryState::Unreadable);
        assert_eq!(
            drain(&mut d),
            [stop(
                "alpha",
                Loss::TakenOver {
                    by: None,
                    revision: 4
                }
            )]
        );
        assert_eq!(d.owner("alpha"), Owner::Nobody);
    }

    #[test]
    fn our_own_refresh_seen_first_by_the_watch_is_not_a_loss() {
        let (mut d, t0) = serving();
        let t1 = t0 + MAX_AGE / 3;
        d.handle_timeout(t1);
        drain(&mut d);
        d.handle_entry("alpha", 4, put("r1", Some(3)));
        assert_eq!(drain(&mut d), []);
        assert_eq!(d.may_serve("alpha"), Some(3));
        d.handle_claim_outcome(t1, "alpha", ClaimOutcome::Won(4));
        assert_eq!(drain(&mut d), []);
        // A refresh answered `Unavailable` that happened after all is adopted too, so the
        // retry writes at its revision.
        let t2 = t1 + MAX_AGE / 3;
        d.handle_timeout(t2);
        drain(&mut d);
        d.handle_claim_outcome(t2, "alpha", ClaimOutcome::Unavailable);
        d.handle_entry("alpha", 6, put("r1", Some(3)));
        d.handle_timeout(t2 + config().retry_after);
        assert_eq!(drain(&mut d), [claim("alpha", Some(6), "r1", Some(3))]);
        // But a claim of ours for another epoch is not the claim we serve.
        d.handle_entry("alpha", 8, put("r1", None));
        assert_eq!(
            drain(&mut d),
            [stop(
                "alpha",
                Loss::TakenOver {
                    by: None,
                    revision: 8
                }
            )]
        );
    }

    #[test]
    fn a_refresh_that_conflicts_stops_serving() {
        let (mut d, t0) = serving();
        d.handle_timeout(t0 + MAX_AGE / 3);
        drain(&mut d);
        d.handle_claim_outcome(
            t0 + MAX_AGE / 3,
            "alpha",
            ClaimOutcome::Conflict {
                current_revision: 7,
            },
        );
        assert_eq!(
            drain(&mut d),
            [stop(
                "alpha",
                Loss::Conflict {
                    current_revision: 7
                }
            )]
        );
        assert_eq!(d.may_serve("alpha"), None);
    }

    #[test]
    fn a_claim_that_conflicts_is_tried_again_at_the_current_revision() {
        let t0 = t0();
        let mut d = Directory::new("r2", config());
        d.handle_entry("alpha", 3, put("r1", None));
        assert_eq!(d.owner("alpha"), Owner::Replica("r1".into()));
        d.handle_hello(t0, "alpha", None, false);
        // Takes over from r1 (live or dead): the newer sled wins.
        assert_eq!(drain(&mut d), [claim("alpha", Some(3), "r2", None)]);
        // r1's refresh got in first.
        d.handle_claim_outcome(
            t0,
            "alpha",
            ClaimOutcome::Conflict {
                current_revision: 4,
            },
        );
        assert_eq!(drain(&mut d), [claim("alpha", Some(4), "r2", None)]);
        // An expired key with no trace any more is created (a cut-off replica's watch cannot
        // tell it so; the conflict's revision 0 does).
        d.handle_claim_outcome(
            t0,
            "alpha",
            ClaimOutcome::Conflict {
                current_revision: 0,
            },
        );
        assert_eq!(drain(&mut d), [claim("alpha", None, "r2", None)]);
        d.handle_entry("alpha", 6, EntryState::Expired);
        d.handle_claim_outcome(
            t0,
            "alpha",
            ClaimOutcome::Conflict {
                current_revision: 6,
            },
        );
        assert_eq!(drain(&mut d), [claim("alpha", None, "r2", None)]);
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(7));
        assert_eq!(drain(&mut d), [serve("alpha", 7)]);
    }

    #[test]
    fn a_won_claim_already_superseded_is_not_served() {
        let t0 = t0();
        let mut d = Directory::new("r2", config());
        d.handle_hello(t0, "alpha", None, false);
        drain(&mut d);
        d.handle_entry("alpha", 5, put("r1", None));
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(4));
        assert_eq!(
            drain(&mut d),
            [stop(
                "alpha",
                Loss::TakenOver {
                    by: None,
                    revision: 5
                }
            )]
        );
        assert_eq!(d.may_serve("alpha"), None);
    }

    #[test]
    fn epochs_never_go_back() {
        let t0 = t0();
        let mut d = Directory::new("r1", config());
        d.handle_hello(t0, "alpha", Some(5), false);
        drain(&mut d);
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(4));
        assert_eq!(drain(&mut d), [claim("alpha", Some(4), "r1", None)]);
        assert_eq!(d.may_serve("alpha"), None);
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(5));
        assert_eq!(drain(&mut d), [claim("alpha", Some(5), "r1", None)]);
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(6));
        assert_eq!(drain(&mut d), [serve("alpha", 6)]);

        // A sled too far ahead is closed, and the claim released.
        let mut d = Directory::new(
            "r1",
            DirectoryConfig {
                max_epoch_bumps: 1,
                ..config()
            },
        );
        d.handle_hello(t0, "alpha", Some(100), false);
        drain(&mut d);
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(1));
        assert_eq!(drain(&mut d), [claim("alpha", Some(1), "r1", None)]);
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(2));
        assert_eq!(
            drain(&mut d),
            [
                stop(
                    "alpha",
                    Loss::EpochOutOfReach {
                        epoch_seen: 100,
                        revision: 2
                    }
                ),
                Action::Release {
                    project: "alpha".into(),
                    revision: 2
                }
            ]
        );
    }

    #[test]
    fn an_engine_outage_keeps_serving_and_claims_nothing_until_it_is_back() {
        let (mut d, t0) = serving();
        let t1 = t0 + Duration::from_secs(1);
        d.handle_engine(t1, false);
        d.handle_hello(t1, "beta", None, false);
        assert_eq!(drain(&mut d), [], "no claim while the engine is lost");
        assert_eq!(d.poll_timeout(), None);
        // Past the refresh and past max_age: still serving (an engine outage is not a sled
        // outage), and nothing written.
        let t2 = t0 + MAX_AGE * 2;
        d.handle_timeout(t2);
        assert_eq!(drain(&mut d), []);
        assert_eq!(d.may_serve("alpha"), Some(3));
        assert_eq!(d.may_serve("beta"), None);
        d.handle_engine(t2, true);
        assert_eq!(
            drain(&mut d),
            [
                claim("alpha", Some(3), "r1", Some(3)),
                claim("beta", None, "r1", None)
            ]
        );
        // The watch catches up: the claim expired meanwhile.
        d.handle_entry("alpha", 4, EntryState::Expired);
        assert_eq!(
            drain(&mut d),
            [stop("alpha", Loss::Expired { revision: 4 })]
        );
    }

    #[test]
    fn a_claim_answered_unavailable_is_tried_again_later() {
        let t0 = t0();
        let mut d = Directory::new("r1", config());
        d.handle_hello(t0, "alpha", None, false);
        drain(&mut d);
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Unavailable);
        assert_eq!(drain(&mut d), []);
        assert_eq!(d.poll_timeout(), Some(t0 + config().retry_after));
        // It happened after all: the retry writes over it.
        d.handle_entry("alpha", 2, put("r1", None));
        assert_eq!(drain(&mut d), []);
        d.handle_timeout(t0 + config().retry_after);
        assert_eq!(drain(&mut d), [claim("alpha", Some(2), "r1", None)]);
    }

    #[test]
    fn a_closed_uplink_releases_its_claim() {
        let (mut d, _) = serving();
        d.handle_uplink_closed("alpha");
        assert_eq!(
            drain(&mut d),
            [Action::Release {
                project: "alpha".into(),
                revision: 3
            }]
        );
        assert_eq!(d.may_serve("alpha"), None);
        assert_eq!(d.poll_timeout(), None);

        // Closed while its claim was in flight: released when won.
        let t0 = t0();
        let mut d = Directory::new("r1", config());
        d.handle_hello(t0, "alpha", None, false);
        drain(&mut d);
        d.handle_uplink_closed("alpha");
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(2));
        assert_eq!(
            drain(&mut d),
            [Action::Release {
                project: "alpha".into(),
                revision: 2
            }]
        );
        // A claim of ours the watch reports, with no uplink here, is released too.
        d.handle_entry("alpha", 4, put("r1", None));
        assert_eq!(
            drain(&mut d),
            [Action::Release {
                project: "alpha".into(),
                revision: 4
            }]
        );
    }

    #[test]
    fn a_second_hello_here_claims_a_newer_epoch() {
        let (mut d, t0) = serving();
        d.handle_hello(t0, "alpha", Some(3), false);
        assert_eq!(
            d.may_serve("alpha"),
            None,
            "the old uplink is replaced at once"
        );
        assert_eq!(drain(&mut d), [claim("alpha", Some(3), "r1", None)]);
        d.handle_claim_outcome(t0, "alpha", ClaimOutcome::Won(4));
        assert_eq!(drain(&mut d), [serve("alpha", 4)]);

        // With a refresh in flight, the claim follows its answer.
        let t1 = t0 + MAX_AGE / 3;
        d.handle_timeout(t1);
        assert_eq!(drain(&mut d), [claim("alpha", Some(4), "r1", Some(4))]);
        d.handle_hello(t1, "alpha", Some(4), false);
        assert_eq!(drain(&mut d), []);
        d.handle_claim_outcome(t1, "alpha", ClaimOutcome::Won(5));
        assert_eq!(drain(&mut d), [claim("alpha", Some(5), "r1", None)]);
        d.handle_claim_outcome(t1, "alpha", ClaimOutcome::Won(6));
        assert_eq!(drain(&mut d), [serve("alpha", 6)]);
    }

    #[test]
    fn shutdown_releases_every_claim_and_refuses_hellos() {
        let (mut d, t0) = serving();
        d.handle_hello(t0, "beta", None, false);
        drain(&mut d);
        d.handle_shutdown();
        assert_eq!(
            drain(&mut d),
            [
                stop("alpha", Loss::ShuttingDown),
                Action::Release {
                    project: "alpha".into(),
                    revision: 3
                },
                stop("beta", Loss::ShuttingDown),
            ]
        );
        d.handle_claim_outcome(t0, "beta", ClaimOutcome::Won(4));
        assert_eq!(
            drain(&mut d),
            [Action::Release {
                project: "beta".into(),
                revision: 4
            }]
        );
        d.handle_hello(t0, "gamma", None, false);
        assert_eq!(drain(&mut d), [stop("gamma", Loss::ShuttingDown)]);
        assert_eq!(d.poll_timeout(), None);
    }

    #[test]
    fn claim_values_are_json() {
        let fresh = ClaimValue {
            owner: "r1".into(),
            epoch: None,
            handover: false,
        };
        assert_eq!(fresh.to_json(), r#"{"owner":"r1"}"#);
        assert_eq!(fresh.claim_epoch(7), 7);
        let refresh = ClaimValue {
            owner: "r1".into(),
            epoch: Some(7),
            handover: false,
        };
        assert_eq!(refresh.to_json(), r#"{"owner":"r1","epoch":7}"#);
        assert_eq!(refresh.claim_epoch(9), 7);
        assert_eq!(
            ClaimValue::parse(refresh.to_json().as_bytes()).unwrap(),
            refresh
        );
        assert!(ClaimValue::parse(b"r1").is_err());
        assert!(ClaimValue::parse(br#"{"owner":"r1","x":1}"#).is_err());
    }
}
