//! What of the coordination state is kept across a restart (issue 25: the board, the leases
//! with their fences, messages, each member's inbox cursor, and each project's counters), as
//! records the caller writes to a store and gives back at the next start. So is presence: a
//! member's name, task and presence TTL, and whether it is present and for how long (a lease's
//! holder with no presence kept comes back present, as before presence was kept).
//!
//! Every call that may change a project marks it, and marks each entry it changes (a board
//! key, a lease, a message, a member: [`Project::mark`]); [`Coord::take_changes`] then
//! compares only the marked entries, and the project's counters, with what was last handed
//! out for writing (by revision, id, or a fingerprint) and returns only what differs: a
//! record to put, or a key to delete. A write on a project with 10,000 board keys, 100,000
//! messages or 20,000 members costs what it costs on an empty one. [`Coord::restore`] takes
//! the records back at start.
//!
//! A record holds its deadline as the time left at `now` (`expires_in_ms`); the caller stamps
//! each write with the wall-clock time it was made and gives each record back with its age,
//! so that a restart neither shortens nor lengthens a TTL. Counters are restored to at least
//! the highest number any record holds, so a fence or a board revision is never given out
//! twice even when the counters' record was not written with the entry that moved them.
//!
//! # Keys
//!
//! `<project in hex>.c` (counters), `<project in hex>.b.<key in hex>` (a board entry),
//! `<project in hex>.l.<resource in hex>` (a lease), `<project in hex>.m.<id>` (a message),
//! `<project in hex>.u.<agent in hex>` (a member's cursor): tokens of `[0-9a-f]`, which every
//! store accepts as a key whatever the names hold.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{retime, Coord, Lease, Member, Recipient, StoredEntry, StoredMessage, Timer};

/// One change for the store: `value` `None` deletes the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordChange {
    pub key: String,
    pub value: Option<Vec<u8>>,
}

/// A record given back at start: its bytes, and how long ago it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub key: String,
    pub value: Vec<u8>,
    pub age: Duration,
}

/// What [`Coord::restore`] took back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    pub projects: usize,
    pub leases: usize,
    pub board_keys: usize,
    pub messages: usize,
    /// Records past their deadline (left out), unreadable ones, and ones over a limit.
    pub skipped: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum Record {
    Counters {
        fence: u64,
        board_rev: u64,
        msg_seq: u64,
    },
    Board {
        key: String,
        value: String,
        revision: u64,
        set_by: String,
        expires_in_ms: Option<u64>,
    },
    Lease {
        resource: String,
        holder: String,
        fence: u64,
        ttl_ms: u64,
        expires_in_ms: u64,
    },
    Message {
        id: u64,
        from: String,
        from_name: Option<String>,
        /// The recipient; `None`: the channel.
        to: Option<String>,
        body: String,
        sent_ago_ms: u64,
        expires_in_ms: u64,
    },
    Member {
        agent: String,
        joined: u64,
        cursor: u64,
        /// Absent from records written before presence was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        presence: Option<PresenceRecord>,
    },
}

/// A member's presence, as [`Record::Member`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PresenceRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task: Option<String>,
    ttl_ms: u64,
    seen_ago_ms: u64,
    /// How long it is still present; `None`: absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    present_for_ms: Option<u64>,
}

/// What every record key of `project` starts with (`<project in hex>.`): a store reads one
/// project's records by it.
pub fn project_prefix(project: &str) -> String {
    format!("{}.", hex(project))
}

fn hex(s: &str) -> String {
    hex::encode(s)
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn fingerprint(v: impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

fn json(r: &Record) -> Vec<u8> {
    serde_json::to_vec(r).expect("a coordination record serialises")
}

/// What was last handed out for writing of one project, by kind and name (not by key, so
/// that comparing an entry with it costs a lookup and no allocation), with each record's
/// number or fingerprint; `u64::MAX`: written again at the next change (a failed write, a
/// record read back at start).
#[derive(Debug, Default)]
pub(super) struct Written {
    counters: Option<u64>,
    board: BTreeMap<String, u64>,
    leases: BTreeMap<String, u64>,
    messages: BTreeMap<u64, u64>,
    members: BTreeMap<String, u64>,
}

impl Written {
    pub(super) fn len(&self) -> usize {
        usize::from(self.counters.is_some())
            + self.board.len()
            + self.leases.len()
            + self.messages.len()
            + self.members.len()
    }

    fn mark(&mut self, which: Which, print: u64) {
        match which {
            Which::Counters => self.counters = Some(print),
            Which::Board(k) => {
                self.board.insert(k, print);
            }
            Which::Lease(r) => {
                self.leases.insert(r, print);
            }
            Which::Message(id) => {
                self.messages.insert(id, print);
            }
            Which::Member(a) => {
                self.members.insert(a, print);
            }
        }
    }

    /// What was written of `which`.
    fn get(&self, which: &Which) -> Option<u64> {
        match which {
            Which::Counters => self.counters,
            Which::Board(k) => self.board.get(k).copied(),
            Which::Lease(r) => self.leases.get(r).copied(),
            Which::Message(id) => self.messages.get(id).copied(),
            Which::Member(a) => self.members.get(a).copied(),
        }
    }

    /// Forgets `which`; whether it was written.
    fn forget(&mut self, which: &Which) -> bool {
        match which {
            Which::Counters => self.counters.take().is_some(),
            Which::Board(k) => self.board.remove(k).is_some(),
            Which::Lease(r) => self.leases.remove(r).is_some(),
            Which::Message(id) => self.messages.remove(id).is_some(),
            Which::Member(a) => self.members.remove(a).is_some(),
        }
    }

    /// Every key written, for a project that is gone.
    fn keys(&self, base: &str) -> Vec<String> {
        let counters = self.counters.map(|_| Which::Counters);
        counters
            .into_iter()
            .chain(self.board.keys().cloned().map(Which::Board))
            .chain(self.leases.keys().cloned().map(Which::Lease))
            .chain(self.messages.keys().copied().map(Which::Message))
            .chain(self.members.keys().cloned().map(Which::Member))
            .map(|which| which.key(base))
            .collect()
    }
}

/// Which record a key names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Which {
    Counters,
    Board(String),
    Lease(String),
    Message(u64),
    Member(String),
}

impl Which {
    /// Its record key in the project whose hex name is `base`.
    fn key(&self, base: &str) -> String {
        match self {
            Which::Counters => format!("{base}.c"),
            Which::Board(k) => format!("{base}.b.{}", hex(k)),
            Which::Lease(r) => format!("{base}.l.{}", hex(r)),
            Which::Message(id) => format!("{base}.m.{id}"),
            Which::Member(a) => format!("{base}.u.{}", hex(a)),
        }
    }
}

impl super::Project {
    /// Marks one of its entries as changed, for [`Coord::take_changes`] (nothing when its
    /// coordination state is not kept).
    pub(super) fn mark(&mut self, which: Which) {
        if let Some(marked) = &mut self.dirty {
            marked.insert(which);
        }
    }
}

/// A record key's project and what it names; `None` for a key this module does not make.
fn parse_key(key: &str) -> Option<(String, Which)> {
    let mut parts = key.splitn(3, '.');
    let project = unhex(parts.next()?)?;
    let which = match (parts.next()?, parts.next()) {
        ("c", None) => Which::Counters,
        ("b", Some(k)) => Which::Board(unhex(k)?),
        ("l", Some(r)) => Which::Lease(unhex(r)?),
        ("m", Some(id)) => Which::Message(id.parse().ok()?),
        ("u", Some(a)) => Which::Member(unhex(a)?),
        _ => return None,
    };
    Some((project, which))
}

impl Coord {
    /// Marks `project` as possibly changed: [`Coord::take_changes`] looks at it.
    pub(super) fn changed(&mut self, project: &str) {
        if self.persisting && !self.changed.contains(project) {
            self.changed.insert(project.to_owned());
        }
    }

    /// Marks one entry of `project` as changed (set, deleted, expired), and so the project.
    pub(super) fn entry_changed(&mut self, project: &str, which: Which) {
        if self.persisting {
            self.changed(project);
            if let Some(p) = self.projects.get_mut(project) {
                p.mark(which);
            }
        }
    }

    /// Marks every entry of every project, and every one written: the next
    /// [`Coord::take_changes`] compares them all, as if no change had been marked.
    #[cfg(test)]
    pub(super) fn mark_all(&mut self) {
        let names: BTreeSet<String> = self
            .projects
            .keys()
            .chain(self.persisted.keys())
            .cloned()
            .collect();
        for name in names {
            self.changed(&name);
            let Some(p) = self.projects.get_mut(&name) else {
                continue;
            };
            let written = self.persisted.get(&name);
            let mut all: Vec<Which> = p.board.keys().cloned().map(Which::Board).collect();
            all.extend(p.leases.keys().cloned().map(Which::Lease));
            all.extend(p.messages.keys().copied().map(Which::Message));
            all.extend(p.members.keys().cloned().map(Which::Member));
            if let Some(w) = written {
                all.extend(w.board.keys().cloned().map(Which::Board));
                all.extend(w.leases.keys().cloned().map(Which::Lease));
                all.extend(w.messages.keys().copied().map(Which::Message));
                all.extend(w.members.keys().cloned().map(Which::Member));
            }
            for which in all {
                p.mark(which);
            }
        }
    }

    /// Whether a project was marked since the last [`Coord::take_changes`].
    pub fn has_changes(&self) -> bool {
        !self.changed.is_empty()
    }

    /// Keeps track of what to write from now on (off by default: nothing is marked).
    pub fn persist(&mut self) {
        self.persisting = true;
    }

    /// What changed in the entries marked since the last call, against what was last handed
    /// out: the records to put and the keys to delete. Each marked entry is compared with
    /// what was written by its number or fingerprint, and only a record that differs is made:
    /// a call pays for the entries it changed, not for the size of its project.
    pub fn take_changes(&mut self, now: Instant) -> Vec<RecordChange> {
        self.handle_timeout(now);
        let mut out = Vec::new();
        let put = |key: String, record: &Record| RecordChange {
            key,
            value: Some(json(record)),
        };
        let delete = |key: String| RecordChange { key, value: None };
        for project in std::mem::take(&mut self.changed) {
            let base = hex(&project);
            let written = self.persisted.entry(project.clone()).or_default();
            let Some(p) = self.projects.get_mut(&project) else {
                // Gone whole: every record it had is deleted.
                for key in written.keys(&base) {
                    out.push(delete(key));
                }
                self.persisted.remove(&project);
                continue;
            };
            let counters = (p.fence, p.board_rev, p.msg_seq);
            let print = fingerprint(counters);
            // Counters still at zero say nothing a restart would miss.
            let news = written.counters.is_some() || counters != (0, 0, 0);
            if news && written.counters != Some(print) {
                let record = Record::Counters {
                    fence: p.fence,
                    board_rev: p.board_rev,
                    msg_seq: p.msg_seq,
                };
                out.push(put(format!("{base}.c"), &record));
                written.counters = Some(print);
            }
            // Only the entries marked since: each by its number or fingerprint.
            let marked = p.dirty.as_mut().map(std::mem::take).unwrap_or_default();
            for which in marked {
                let key = which.key(&base);
                let record = match &which {
                    Which::Counters => continue,
                    Which::Board(name) => {
                        let live = p
                            .board
                            .get(name)
                            .filter(|e| e.expires_at.is_none_or(|t| t > now));
                        live.map(|e| {
                            let record = Record::Board {
                                key: name.clone(),
                                value: e.value.clone(),
                                revision: e.revision,
                                set_by: e.set_by.clone(),
                                expires_in_ms: e
                                    .expires_at
                                    .map(|t| ms(t.saturating_duration_since(now))),
                            };
                            (e.revision, record)
                        })
                    }
                    Which::Lease(resource) => {
                        let live = p.leases.get(resource).filter(|l| l.expires_at > now);
                        live.map(|l| {
                            let print = fingerprint((&l.holder, l.fence, l.expires_at, l.ttl));
                            let record = Record::Lease {
                                resource: resource.clone(),
                                holder: l.holder.clone(),
                                fence: l.fence,
                                ttl_ms: ms(l.ttl),
                                expires_in_ms: ms(l.expires_at.saturating_duration_since(now)),
                            };
                            (print, record)
                        })
                    }
                    // A message never changes: only its coming and going are written.
                    Which::Message(id) => {
                        let live = p.messages.get(id).filter(|m| m.expires_at > now);
                        live.map(|m| {
                            let record = Record::Message {
                                id: *id,
                                from: m.from.clone(),
                                from_name: m.from_name.clone(),
                                to: match &m.to {
                                    Recipient::Agent(a) => Some(a.clone()),
                                    Recipient::Channel => None,
                                },
                                body: m.body.clone(),
                                sent_ago_ms: ms(now.saturating_duration_since(m.sent_at)),
                                expires_in_ms: ms(m.expires_at.saturating_duration_since(now)),
                            };
                            (*id, record)
                        })
                    }
                    // Written again when its cursor or presence moves (a call refreshes
                    // presence), not as time passes.
                    Which::Member(agent) => p.members.get(agent).map(|m| {
                        let print = fingerprint((
                            m.joined,
                            m.cursor,
                            &m.name,
                            &m.task,
                            m.presence_ttl,
                            m.present_until,
                        ));
                        let record = Record::Member {
                            agent: agent.clone(),
                            joined: m.joined,
                            cursor: m.cursor,
                            presence: Some(PresenceRecord {
                                name: m.name.clone(),
                                task: m.task.clone(),
                                ttl_ms: ms(m.presence_ttl),
                                seen_ago_ms: ms(now.saturating_duration_since(m.last_seen)),
                                present_for_ms: m
                                    .present_until
                                    .filter(|t| *t > now)
                                    .map(|t| ms(t.saturating_duration_since(now))),
                            }),
                        };
                        (print, record)
                    }),
                };
                match record {
                    Some((print, _)) if written.get(&which) == Some(print) => {}
                    Some((print, record)) => {
                        out.push(put(key, &record));
                        written.mark(which, print);
                    }
                    None => {
                        if written.forget(&which) {
                            out.push(delete(key));
                        }
                    }
                }
            }
        }
        out
    }

    /// A write handed out by [`Coord::take_changes`] failed: its key is written again with
    /// the next changes of its project (not at once: a store that cannot write would be
    /// asked again and again).
    pub fn write_failed(&mut self, key: &str) {
        let Some((project, which)) = parse_key(key) else {
            return;
        };
        // Remembered as written with no content: a put is written again, a deletion made
        // again.
        if let Some(p) = self.projects.get_mut(&project) {
            p.mark(which.clone());
        }
        self.persisted
            .entry(project)
            .or_default()
            .mark(which, u64::MAX);
        // Looked at again at the next change of the project.
    }

    /// Takes back the records of an earlier run, before anything else happens: the board
    /// entries and leases whose deadline has not passed (a lease's holder is a member of its
    /// project again, present for the default presence TTL), and the counters, at least as
    /// high as any record's number. A record that does not read, or would pass a limit, is
    /// skipped and counted.
    pub fn restore(&mut self, now: Instant, records: Vec<StoredRecord>) -> Restored {
        let mut restored = Restored::default();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        // Counters first, so that a project's numbers are in place before its entries.
        let mut parsed: Vec<(String, String, Duration, Record)> = Vec::new();
        for r in records {
            let project = r.key.split('.').next().and_then(unhex);
            match (project, serde_json::from_slice::<Record>(&r.value)) {
                (Some(project), Ok(record)) => parsed.push((r.key, project, r.age, record)),
                _ => {
                    tracing::warn!(key = r.key, "an unreadable coordination record; skipped");
                    restored.skipped += 1;
                }
            }
        }
        parsed.sort_by_key(|(_, _, _, r)| match r {
            Record::Counters { .. } => 0,
            Record::Member { .. } => 1,
            _ => 2,
        });
        let left = |expires_in_ms: u64, age: Duration| {
            Duration::from_millis(expires_in_ms).checked_sub(age)
        };
        for (key, project, age, record) in parsed {
            let fits = match &record {
                Record::Counters {
                    fence,
                    board_rev,
                    msg_seq,
                } => self.project_mut(&project).map(|p| {
                    p.fence = p.fence.max(*fence);
                    p.board_rev = p.board_rev.max(*board_rev);
                    p.msg_seq = p.msg_seq.max(*msg_seq);
                    // The store's counter is at least any fence a sled accepted from us:
                    // the sled's report raises it, never re-fences a restored lease.
                    p.floor_known = true;
                }),
                Record::Board {
                    key: name,
                    value,
                    revision,
                    set_by,
                    expires_in_ms,
                } => {
                    let expires_at = match expires_in_ms.map(|e| left(e, age)) {
                        None => Some(None),
                        Some(Some(l)) if !l.is_zero() => now.checked_add(l).map(Some),
                        Some(_) => None,
                    };
                    let Some(expires_at) = expires_at else {
                        restored.skipped += 1;
                        continue;
                    };
                    self.project_mut(&project)
                        .map(|p| {
                            p.board_rev = p.board_rev.max(*revision);
                            p.board.insert(
                                name.clone(),
                                StoredEntry {
                                    value: value.clone(),
                                    revision: *revision,
                                    set_by: set_by.clone(),
                                    expires_at,
                                },
                            );
                            restored.board_keys += 1;
                        })
                        .map(|()| {
                            let timer = Timer::Board {
                                project: project.clone(),
                                key: name.clone(),
                            };
                            retime(&mut self.timers, None, expires_at, timer);
                        })
                }
                Record::Lease {
                    resource,
                    holder,
                    fence,
                    ttl_ms,
                    expires_in_ms,
                } => {
                    let Some(expires_at) = left(*expires_in_ms, age)
                        .filter(|l| !l.is_zero())
                        .and_then(|l| now.checked_add(l))
                    else {
                        restored.skipped += 1;
                        continue;
                    };
                    self.restore_lease(
                        now,
                        &project,
                        resource,
                        holder,
                        *fence,
                        (*ttl_ms, expires_at),
                    )
                    .map(|()| restored.leases += 1)
                }
                Record::Member {
                    agent,
                    joined,
                    cursor,
                    presence,
                } => self.restore_member(
                    now,
                    &project,
                    agent,
                    (*joined, *cursor),
                    presence.as_ref().map(|p| (p, age)),
                ),
                Record::Message {
                    id,
                    from,
                    from_name,
                    to,
                    body,
                    sent_ago_ms,
                    expires_in_ms,
                } => {
                    let Some(expires_at) = left(*expires_in_ms, age)
                        .filter(|l| !l.is_zero())
                        .and_then(|l| now.checked_add(l))
                    else {
                        restored.skipped += 1;
                        continue;
                    };
                    let ago = Duration::from_millis(*sent_ago_ms).saturating_add(age);
                    let message = StoredMessage {
                        from: from.clone(),
                        from_name: from_name.clone(),
                        to: match to {
                            Some(a) => Recipient::Agent(a.clone()),
                            None => Recipient::Channel,
                        },
                        body: body.clone(),
                        sent_at: now.checked_sub(ago).unwrap_or(now),
                        expires_at,
                    };
                    self.restore_message(&project, *id, message)
                        .map(|()| restored.messages += 1)
                }
            };
            match fits {
                Ok(()) => {
                    seen.insert(project.clone());
                    if let Some((_, which)) = parse_key(&key) {
                        // A board entry and a message are kept as they were read (their
                        // number is what they are compared by); the rest is written again.
                        // A board record under another key than its own is written again
                        // under its own, and its key deleted.
                        // A record under another key than its own is written again under
                        // its own, and the key it was under deleted.
                        let own = match &record {
                            Record::Counters { .. } => Which::Counters,
                            Record::Board { key, .. } => Which::Board(key.clone()),
                            Record::Lease { resource, .. } => Which::Lease(resource.clone()),
                            Record::Message { id, .. } => Which::Message(*id),
                            Record::Member { agent, .. } => Which::Member(agent.clone()),
                        };
                        let print = match &record {
                            _ if own != which => {
                                if let Some(p) = self.projects.get_mut(&project) {
                                    p.mark(which.clone());
                                    p.mark(own);
                                }
                                u64::MAX
                            }
                            Record::Board { revision, .. } => *revision,
                            Record::Message { id, .. } => *id,
                            _ => u64::MAX,
                        };
                        self.persisted
                            .entry(project)
                            .or_default()
                            .mark(which, print);
                    }
                }
                Err(e) => {
                    tracing::warn!(key, error = %e, "a coordination record over a limit; skipped");
                    restored.skipped += 1;
                }
            }
        }
        restored.projects = seen.len();
        // What was taken back is in the store already: written again only when it changes
        // (a lease's or member's fingerprint is unknown here, so its first change writes it).
        self.changed.extend(seen);
        restored
    }

    /// Replaces what this instance knows of `project` with `records` (all of them the
    /// project's, as its last holder kept them): a replica that wins a project's claim drops
    /// whatever it held of it before (stale since it last lost it) and takes the kept state
    /// back, as [`Coord::restore`] does at start.
    pub fn replace_project(
        &mut self,
        now: Instant,
        project: &str,
        records: Vec<StoredRecord>,
    ) -> Restored {
        if let Some(p) = self.projects.remove(project) {
            for agent in p.members.keys() {
                if let Some(projects) = self.agents.get_mut(agent) {
                    projects.remove(project);
                    if projects.is_empty() {
                        self.agents.remove(agent);
                    }
                }
            }
        }
        self.timers.retain(|(_, t)| match t {
            Timer::Presence { project: p, .. }
            | Timer::Lease { project: p, .. }
            | Timer::Message { project: p, .. }
            | Timer::Board { project: p, .. }
            | Timer::Forget { project: p, .. } => p != project,
            Timer::Wait(_) => true,
        });
        self.persisted.remove(project);
        self.changed.remove(project);
        let prefix = project_prefix(project);
        let (mine, other): (Vec<StoredRecord>, Vec<StoredRecord>) = records
            .into_iter()
            .partition(|r| r.key.starts_with(&prefix));
        let mut restored = self.restore(now, mine);
        if !other.is_empty() {
            tracing::warn!(
                project,
                records = other.len(),
                "coordination records of another project in a project's read; skipped"
            );
            restored.skipped += other.len();
        }
        restored
    }

    /// A member of `project` again, with its inbox cursor, and its presence where it was kept
    /// (absent where not).
    fn restore_member(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        (joined, cursor): (u64, u64),
        presence: Option<(&PresenceRecord, Duration)>,
    ) -> Result<(), super::CoordError> {
        super::check_name("agent", agent, self.limits.max_name_len)?;
        let (max_agents, forget_after, presence_ttl) = (
            self.limits.max_agents_per_project,
            self.limits.forget_after,
            self.limits.presence_ttl,
        );
        let p = self.project_mut(project)?;
        if p.members.len() >= max_agents && !p.members.contains_key(agent) {
            return Err(self.limit(super::CoordLimit::AgentsPerProject, max_agents));
        }
        let p = self.projects.get_mut(project).expect("project_mut made it");
        let forget_at = now.checked_add(forget_after).unwrap_or(now);
        let event_cursor = p.event_seq;
        let new = !p.members.contains_key(agent);
        let m = p.members.entry(agent.to_owned()).or_insert_with(|| Member {
            name: None,
            task: None,
            presence_ttl,
            last_seen: now,
            present_until: None,
            forget_at: Some(forget_at),
            joined,
            cursor,
            event_cursor,
            held: Default::default(),
            lost: Default::default(),
            refused_on: Default::default(),
            released: Default::default(),
            expired: Default::default(),
        });
        m.joined = joined;
        m.cursor = m.cursor.max(cursor);
        // Its presence as it was, aged by the time since the record was written: present for
        // what was left, and its last call as long ago as it was then and since.
        let mut present_until = None;
        if let Some((r, age)) = presence {
            m.name = r.name.clone();
            m.task = r.task.clone();
            m.presence_ttl = Duration::from_millis(r.ttl_ms);
            m.last_seen = now
                .checked_sub(Duration::from_millis(r.seen_ago_ms).saturating_add(age))
                .unwrap_or(m.last_seen);
            present_until = r
                .present_for_ms
                .and_then(|f| Duration::from_millis(f).checked_sub(age))
                .filter(|left| !left.is_zero())
                .and_then(|left| now.checked_add(left));
        }
        self.agents
            .entry(agent.to_owned())
            .or_default()
            .insert(project.to_owned());
        let forget = Timer::Forget {
            project: project.to_owned(),
            agent: agent.to_owned(),
        };
        match present_until {
            // Present: its presence ends when it would have, and it is not forgotten meanwhile.
            Some(until) => {
                m.present_until = Some(until);
                let old = m.forget_at.take();
                retime(&mut self.timers, old, None, forget);
                let presence = Timer::Presence {
                    project: project.to_owned(),
                    agent: agent.to_owned(),
                };
                retime(&mut self.timers, None, Some(until), presence);
            }
            // Absent: forgotten after a while, as any absent member.
            None if new => retime(&mut self.timers, None, Some(forget_at), forget),
            None => {}
        }
        Ok(())
    }

    /// A message of `project` again, in its recipient's inbox or the channel.
    fn restore_message(
        &mut self,
        project: &str,
        id: u64,
        message: StoredMessage,
    ) -> Result<(), super::CoordError> {
        let max = self.limits.max_messages_per_project;
        let p = self.project_mut(project)?;
        if p.messages.len() >= max {
            return Err(self.limit(super::CoordLimit::MessagesPerProject, max));
        }
        let p = self.projects.get_mut(project).expect("project_mut made it");
        p.msg_seq = p.msg_seq.max(id);
        match &message.to {
            Recipient::Channel => {
                p.channel.insert(id);
            }
            Recipient::Agent(a) => {
                p.direct.entry(a.clone()).or_default().insert(id);
            }
        }
        let expires_at = message.expires_at;
        p.messages.insert(id, message);
        let timer = Timer::Message {
            project: project.to_owned(),
            id,
        };
        retime(&mut self.timers, None, Some(expires_at), timer);
        Ok(())
    }

    fn restore_lease(
        &mut self,
        now: Instant,
        project: &str,
        resource: &str,
        holder: &str,
        fence: u64,
        (ttl_ms, expires_at): (u64, Instant),
    ) -> Result<(), super::CoordError> {
        super::check_name("resource", resource, self.limits.max_name_len)?;
        // A holder whose presence was kept keeps it; one with none kept is present.
        let kept = self
            .projects
            .get(project)
            .and_then(|p| p.members.get(holder))
            .is_some_and(|m| m.present_until.is_some());
        if kept {
            self.project_mut(project)?;
        } else {
            self.touch(now, project, holder, None)?;
        }
        let p = self
            .projects
            .get_mut(project)
            .expect("touch made the project");
        p.fence = p.fence.max(fence);
        p.leases.insert(
            resource.to_owned(),
            Lease {
                holder: holder.to_owned(),
                fence,
                ttl: Duration::from_millis(ttl_ms),
                expires_at,
            },
        );
        if let Some(m) = p.members.get_mut(holder) {
            m.held.insert(resource.to_owned());
        }
        let timer = Timer::Lease {
            project: project.to_owned(),
            resource: resource.to_owned(),
        };
        retime(&mut self.timers, None, Some(expires_at), timer);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{Claim, Limits};

    /// The fake clock's origin: the one real reading, made once per test.
    #[allow(clippy::disallowed_methods)]
    fn now() -> Instant {
        Instant::now()
    }

    fn stored(changes: &[RecordChange], age: Duration) -> Vec<StoredRecord> {
        changes
            .iter()
            .filter_map(|c| {
                Some(StoredRecord {
                    key: c.key.clone(),
                    value: c.value.clone()?,
                    age,
                })
            })
            .collect()
    }

    /// Applies `changes` to a map standing for the store.
    fn apply(store: &mut BTreeMap<String, Vec<u8>>, changes: Vec<RecordChange>) {
        for c in changes {
            match c.value {
                Some(v) => store.insert(c.key, v),
                None => store.remove(&c.key),
            };
        }
    }

    fn from(store: &BTreeMap<String, Vec<u8>>, age: Duration) -> Vec<StoredRecord> {
        let changes: Vec<RecordChange> = store
            .iter()
            .map(|(k, v)| RecordChange {
                key: k.clone(),
                value: Some(v.clone()),
            })
            .collect();
        stored(&changes, age)
    }

    #[test]
    fn the_board_and_leases_come_back_with_their_numbers_and_time_left() {
        let t0 = now();
        let mut c = Coord::new(Limits::default());
        c.persist();
        let mut store = BTreeMap::new();
        let Claim::Acquired { fence, .. } = c
            .claim(
                t0,
                "beta",
                "s1",
                "story:beta-1",
                Some(Duration::from_secs(60)),
            )
            .unwrap()
        else {
            panic!("not acquired");
        };
        c.board_set(t0, "beta", "s1", "plan", "\"ship\"".into(), None, None)
            .unwrap();
        c.send(
            t0,
            "beta",
            "s1",
            Recipient::Agent("s2".into()),
            "for you".into(),
            None,
        )
        .unwrap();
        let changes = c.take_changes(t0);
        assert_eq!(
            changes.len(),
            5,
            "counters, a lease, a board key, a message, a member: {changes:?}"
        );
        apply(&mut store, changes);
        assert!(c.take_changes(t0).is_empty(), "nothing changed since");
        // Reads change nothing.
        c.board_get(t0, "beta", "plan");
        assert!(c.take_changes(t0).is_empty());

        // A restart 20 s later (the records are 20 s old), on a new clock.
        let t1 = t0 + Duration::from_secs(1000);
        let mut back = Coord::new(Limits::default());
        back.persist();
        let r = back.restore(t1, from(&store, Duration::from_secs(20)));
        assert_eq!(
            (r.projects, r.leases, r.board_keys, r.messages, r.skipped),
            (1, 1, 1, 1, 0)
        );
        let leases = back.claims(t1, "beta");
        assert_eq!(leases.len(), 1);
        assert_eq!((leases[0].holder.as_str(), leases[0].fence), ("s1", fence));
        assert_eq!(leases[0].expires_in, Duration::from_secs(40));
        // Another agent is refused; the holder renews under the same fence.
        assert!(matches!(
            back.claim(t1, "beta", "s2", "story:beta-1", None).unwrap(),
            Claim::Held { .. }
        ));
        assert_eq!(back.board_get(t1, "beta", "plan").unwrap().revision, 1);
        // s2's mail waits for it, sent 20 s before the restart; read once, it is gone.
        let inbox = back.inbox(t1, "beta", "s2", false, 10).unwrap();
        assert_eq!(inbox.messages.len(), 1);
        assert_eq!(inbox.messages[0].body, "for you");
        assert_eq!(inbox.messages[0].sent_ago, Duration::from_secs(20));
        assert_eq!(
            back.inbox(t1, "beta", "s2", false, 10)
                .unwrap()
                .messages
                .len(),
            0
        );
        // The numbers go on from where they were.
        let set = back
            .board_set(t1, "beta", "s2", "other", "1".into(), None, None)
            .unwrap();
        assert_eq!(set.revision, 2);
        let Claim::Acquired { fence: f2, .. } =
            back.claim(t1, "beta", "s2", "story:beta-2", None).unwrap()
        else {
            panic!("not acquired");
        };
        assert_eq!(f2, fence + 1);
        // And the lease expires when it would have.
        let t2 = t1 + Duration::from_secs(40);
        assert!(matches!(
            back.claim(t2, "beta", "s2", "story:beta-1", None).unwrap(),
            Claim::Acquired { .. }
        ));
    }

    #[test]
    fn presence_comes_back_with_its_name_task_and_time_left() {
        let t0 = now();
        let mut c = Coord::new(Limits::default());
        c.persist();
        let mut store = BTreeMap::new();
        c.checkin(
            t0,
            "beta",
            "s1",
            Some("builder".into()),
            Some("story 7".into()),
            Some(Duration::from_secs(60)),
        )
        .unwrap();
        c.checkin(t0, "beta", "s2", None, None, Some(Duration::from_secs(10)))
            .unwrap();
        apply(&mut store, c.take_changes(t0));
        // A call 5 s later moves s1's presence: its record is written again.
        let t05 = t0 + Duration::from_secs(5);
        c.checkin(t05, "beta", "s1", None, None, Some(Duration::from_secs(60)))
            .unwrap();
        let changes = c.take_changes(t05);
        assert_eq!(changes.len(), 1, "{changes:?}");
        apply(&mut store, changes);
        // A restart; the records are 15 s old: s1 has 45 s left of its presence, s2 none.
        let t1 = t0 + Duration::from_secs(1000);
        let mut back = Coord::new(Limits::default());
        back.persist();
        back.restore(t1, from(&store, Duration::from_secs(15)));
        let roster = back.roster(t1, "beta");
        assert_eq!(roster.len(), 1, "{roster:?}");
        assert_eq!(roster[0].agent, "s1");
        assert_eq!(roster[0].name.as_deref(), Some("builder"));
        assert_eq!(roster[0].task.as_deref(), Some("story 7"));
        assert_eq!(roster[0].last_seen_ago, Duration::from_secs(15));
        // Its presence ends when it would have.
        assert_eq!(back.roster(t1 + Duration::from_secs(44), "beta").len(), 1);
        assert!(back.roster(t1 + Duration::from_secs(45), "beta").is_empty());
    }

    #[test]
    fn what_ended_is_deleted_and_what_expired_is_not_restored() {
        let t0 = now();
        let mut c = Coord::new(Limits::default());
        c.persist();
        let mut store = BTreeMap::new();
        c.claim(t0, "a", "s1", "r1", Some(Duration::from_secs(10)))
            .unwrap();
        c.claim(t0, "a", "s1", "r2", Some(Duration::from_secs(100)))
            .unwrap();
        c.board_set(t0, "a", "s1", "k", "1".into(), None, None)
            .unwrap();
        apply(&mut store, c.take_changes(t0));
        c.release(t0, "a", "s1", "r2").unwrap();
        c.board_delete(t0, "a", "s1", "k", None).unwrap();
        let changes = c.take_changes(t0);
        assert_eq!(
            changes.iter().filter(|c| c.value.is_none()).count(),
            2,
            "{changes:?}"
        );
        apply(&mut store, changes);
        // r1 is 11 s old at the restart: gone. Its fence is not given out again.
        let t1 = t0 + Duration::from_secs(500);
        let mut back = Coord::new(Limits::default());
        let r = back.restore(t1, from(&store, Duration::from_secs(11)));
        assert_eq!((r.leases, r.skipped), (0, 1));
        let Claim::Acquired { fence, .. } = back.claim(t1, "a", "s2", "r1", None).unwrap() else {
            panic!("not acquired");
        };
        assert_eq!(fence, 3, "fences 1 and 2 were given out before the restart");
    }

    #[test]
    fn a_write_on_a_large_board_hands_out_its_key_only_and_an_expired_key_is_deleted() {
        let t0 = now();
        let mut c = Coord::new(Limits::default());
        c.persist();
        let mut store = BTreeMap::new();
        let board = |changes: &[RecordChange]| {
            changes
                .iter()
                .filter(|c| c.key.contains(".b."))
                .map(|c| (c.key.clone(), c.value.is_some()))
                .collect::<Vec<_>>()
        };
        for i in 0..1000 {
            c.board_set(t0, "a", "s1", &format!("k{i}"), "1".into(), None, None)
                .unwrap();
        }
        let brief = Some(Duration::from_secs(5));
        c.board_set(t0, "a", "s1", "brief", "1".into(), None, brief)
            .unwrap();
        apply(&mut store, c.take_changes(t0));
        assert_eq!(store.keys().filter(|k| k.contains(".b.")).count(), 1001);

        c.board_set(t0, "a", "s1", "k7", "2".into(), None, None)
            .unwrap();
        let changes = c.take_changes(t0);
        assert_eq!(
            board(&changes),
            [(format!("{}.b.{}", hex("a"), hex("k7")), true)]
        );
        apply(&mut store, changes);
        c.board_delete(t0, "a", "s1", "k8", None).unwrap();
        let changes = c.take_changes(t0);
        assert_eq!(
            board(&changes),
            [(format!("{}.b.{}", hex("a"), hex("k8")), false)]
        );
        apply(&mut store, changes);

        // Its expiry alone marks the project, and deletes the key.
        let t5 = t0 + Duration::from_secs(5);
        c.handle_timeout(t5);
        assert!(c.has_changes());
        let changes = c.take_changes(t5);
        assert_eq!(
            board(&changes),
            [(format!("{}.b.{}", hex("a"), hex("brief")), false)]
        );
        apply(&mut store, changes);
        assert_eq!(store.keys().filter(|k| k.contains(".b.")).count(), 999);

        // Taken back at a restart, the board is not written again; a write after it is one key.
        let mut back = Coord::new(Limits::default());
        back.persist();
        assert_eq!(
            back.restore(t5, from(&store, Duration::ZERO)).board_keys,
            999
        );
        assert!(board(&back.take_changes(t5)).is_empty());
        back.board_set(t5, "a", "s2", "k9", "3".into(), Some(10), None)
            .unwrap();
        assert_eq!(board(&back.take_changes(t5)).len(), 1);
    }

    #[test]
    fn a_failed_write_is_written_again() {
        let t0 = now();
        let mut c = Coord::new(Limits::default());
        c.persist();
        c.board_set(t0, "a", "s1", "k", "1".into(), None, None)
            .unwrap();
        let first = c.take_changes(t0);
        let key = first
            .iter()
            .find(|c| c.key.contains(".b."))
            .unwrap()
            .key
            .clone();
        c.write_failed(&key);
        assert!(c.take_changes(t0).is_empty(), "not at once");
        c.board_set(t0, "a", "s1", "k2", "2".into(), None, None)
            .unwrap();
        let again = c.take_changes(t0);
        assert!(
            again.iter().any(|c| c.key == key && c.value.is_some()),
            "with the project's next change: {again:?}"
        );
    }

    #[test]
    fn garbage_is_skipped() {
        let t0 = now();
        let mut c = Coord::new(Limits::default());
        let r = c.restore(
            t0,
            vec![
                StoredRecord {
                    key: "zz.c".into(),
                    value: b"{}".to_vec(),
                    age: Duration::ZERO,
                },
                StoredRecord {
                    key: format!("{}.c", hex("a")),
                    value: b"{\"kind\":\"teleport\"}".to_vec(),
                    age: Duration::ZERO,
                },
            ],
        );
        assert_eq!(r.skipped, 2);
        assert_eq!(unhex(&hex("é.x")).as_deref(), Some("é.x"));
    }
}
