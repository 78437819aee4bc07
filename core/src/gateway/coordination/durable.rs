//! Coordination answers wait for the store (issue 25): the durable-writes machine of a single
//! gateway with a state directory.
//!
//! Each coordination call's changes (`Coord::take_changes`) go out as one numbered batch
//! ([`crate::cluster::ClusterAction::StoreCoord`]), and its answer is held until that batch is
//! durable; an answer whose call changed nothing waits for the batches already in flight,
//! since what it saw may be in them. Batches are written in order, so the answers go out in
//! order too.
//!
//! # Invariants
//! - No answer of a coordination call goes out before every batch handed out before it (its
//!   own included) is durable, or has failed.
//! - A call whose own batch failed is answered `state_not_durable` (retryable) instead of its
//!   result; the failed keys are written again with their project's next change.
//! - Every held answer goes out exactly once: when its batch is done, when the batch (or an
//!   older one) is past [`WRITE_DEADLINE`], or at shutdown.
//! - No answer waits for ever on the store: a batch not done within [`WRITE_DEADLINE`] is
//!   taken as failed (its calls are answered `state_not_durable`, its keys written again with
//!   the next change); its report, if it ever comes, changes nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cluster::ClusterAction;
use crate::coord::{RecordChange, Restored, StoredRecord};
use crate::error::RpcError;
use crate::gateway::{Gateway, Output};
use crate::{HttpReply, HttpToken};

/// How soon a client may retry a coordination write the store could not keep.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a batch may take to be written before its answers stop waiting for it: far above
/// a sync (milliseconds), far below a client's patience.
pub(crate) const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// A batch handed out and not done.
#[derive(Debug)]
struct InFlight {
    keys: Vec<String>,
    since: Instant,
}

/// One held answer: its result, and what to answer instead if its own batch fails.
#[derive(Debug)]
struct Held {
    token: HttpToken,
    reply: HttpReply,
    if_failed: Option<HttpReply>,
}

/// What waits for the coordination writes in flight ([`Durable::defer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterWrites {
    /// An engine action: a claim's release (the next holder reads what this one kept).
    Engine(ClusterAction),
    /// A handover's move frame for `project`'s sled on `uplink` (issue 30).
    Move {
        project: String,
        uplink: crate::UplinkId,
    },
}

/// The machine; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Durable {
    next: u64,
    /// Batches handed out and not done.
    in_flight: BTreeMap<u64, InFlight>,
    held: BTreeMap<u64, Vec<Held>>,
    /// Engine actions that wait for the batches in flight when they were made (a claim's
    /// release: the next holder must read what this one wrote), under the newest of them.
    deferred: BTreeMap<u64, Vec<AfterWrites>>,
    /// Batches written, and writes that failed (for `/metrics`).
    pub(crate) batches: u64,
    pub(crate) failed_writes: u64,
    /// Batches given up on at [`WRITE_DEADLINE`] (for `/metrics` and the log).
    pub(crate) timed_out: u64,
    /// The planted bug `CoordAckBeforeDurable`: nothing is held.
    #[cfg(feature = "planted-bugs")]
    pub(crate) ack_early: bool,
}

impl Durable {
    /// Numbers a batch of changes; `None` when there are none.
    pub(crate) fn handle_changes(
        &mut self,
        now: Instant,
        changes: Vec<RecordChange>,
    ) -> Option<(u64, Vec<RecordChange>)> {
        if changes.is_empty() {
            return None;
        }
        self.next += 1;
        let keys = changes.iter().map(|c| c.key.clone()).collect();
        self.in_flight
            .insert(self.next, InFlight { keys, since: now });
        Some((self.next, changes))
    }

    /// An answer that may go once the batches in flight are done: given back when none is.
    /// `if_failed` is answered instead when the newest of them (the call's own) fails.
    pub(crate) fn hold(
        &mut self,
        token: HttpToken,
        reply: HttpReply,
        if_failed: Option<HttpReply>,
    ) -> Option<(HttpToken, HttpReply)> {
        #[cfg(feature = "planted-bugs")]
        if self.ack_early {
            return Some((token, reply));
        }
        let Some((&newest, _)) = self.in_flight.last_key_value() else {
            return Some((token, reply));
        };
        self.held.entry(newest).or_default().push(Held {
            token,
            reply,
            if_failed,
        });
        None
    }

    /// `action`, now if no batch is in flight, else (`None`) once every batch in flight now is
    /// done ([`Durable::take_deferred`]).
    pub(crate) fn defer(&mut self, action: AfterWrites) -> Option<AfterWrites> {
        let Some((&newest, _)) = self.in_flight.last_key_value() else {
            return Some(action);
        };
        self.deferred.entry(newest).or_default().push(action);
        None
    }

    /// The deferred actions whose batches are all done, in the order they were deferred.
    pub(crate) fn take_deferred(&mut self) -> Vec<AfterWrites> {
        let oldest_left = self.in_flight.keys().next().copied().unwrap_or(u64::MAX);
        let done: Vec<u64> = self
            .deferred
            .range(..oldest_left)
            .map(|(b, _)| *b)
            .collect();
        done.into_iter()
            .flat_map(|b| self.deferred.remove(&b).unwrap_or_default())
            .collect()
    }

    /// A batch is done, `failed` naming the keys not written: the answers that waited for it
    /// (and for any older batch) go out.
    pub(crate) fn handle_stored(
        &mut self,
        batch: u64,
        failed: &[String],
    ) -> Vec<(HttpToken, HttpReply)> {
        if self.in_flight.remove(&batch).is_none() {
            return Vec::new();
        }
        self.batches += 1;
        self.failed_writes += failed.len() as u64;
        self.release(batch, !failed.is_empty())
    }

    /// When the oldest batch in flight is past its deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.in_flight
            .values()
            .next()
            .map(|b| b.since + WRITE_DEADLINE)
    }

    /// Batches past [`WRITE_DEADLINE`] are taken as failed, oldest first: their answers go
    /// out (a call's own as `state_not_durable`), and their keys are given back to be written
    /// again.
    pub(crate) fn handle_timeout(
        &mut self,
        now: Instant,
    ) -> (Vec<(HttpToken, HttpReply)>, Vec<String>) {
        let mut out = Vec::new();
        let mut keys = Vec::new();
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.get().since + WRITE_DEADLINE > now {
                break;
            }
            let (batch, b) = entry.remove_entry();
            self.timed_out += 1;
            self.failed_writes += b.keys.len() as u64;
            out.extend(self.release(batch, true));
            keys.extend(b.keys);
        }
        (out, keys)
    }

    /// The answers held under `batch` or older, once `batch` is no longer in flight (answered
    /// as failed for the calls whose own batch it is, when `failed`).
    fn release(&mut self, batch: u64, failed: bool) -> Vec<(HttpToken, HttpReply)> {
        // Batches are done in order; anything held under an older one goes too.
        let oldest_left = self.in_flight.keys().next().copied().unwrap_or(u64::MAX);
        let done: Vec<u64> = self.held.range(..oldest_left).map(|(b, _)| *b).collect();
        let mut out = Vec::new();
        for b in done {
            for h in self.held.remove(&b).unwrap_or_default() {
                let reply = match (b == batch && failed, h.if_failed) {
                    (true, Some(instead)) => instead,
                    _ => h.reply,
                };
                out.push((h.token, reply));
            }
        }
        out
    }

    /// Shutdown: every held answer goes now (the writes in flight are finished by the server
    /// before it exits).
    pub(crate) fn handle_shutdown(&mut self) -> (Vec<(HttpToken, HttpReply)>, Vec<AfterWrites>) {
        let answers = std::mem::take(&mut self.held)
            .into_values()
            .flatten()
            .map(|h| (h.token, h.reply))
            .collect();
        let deferred = std::mem::take(&mut self.deferred)
            .into_values()
            .flatten()
            .collect();
        (answers, deferred)
    }
}

// ---- the gateway's side ----

impl Gateway {
    /// The changes made since the last batch (names given or forgotten, and the projects'
    /// records), handed out as a batch; its number, or `None` when nothing changed (or nothing
    /// is kept).
    fn coordination_batch(&mut self, now: Instant) -> Option<u64> {
        // Task records go with the coordination state (`crate::tasks`); nothing is kept of
        // either without a store.
        let tasks = self.tasks.take_changes(now);
        let c = &mut self.coordination;
        let durable = c.durable.as_mut()?;
        let mut changes = std::mem::take(&mut c.name_changes);
        changes.extend(c.coord.take_changes(now));
        changes.extend(tasks);
        if changes.is_empty() {
            return None;
        }
        // Names whose write failed go with the next batch there is anyway.
        let retries = std::mem::take(&mut c.name_retries);
        changes.splice(0..0, retries);
        let (batch, changes) = durable.handle_changes(now, changes)?;
        self.outputs
            .push_back(Output::Cluster(ClusterAction::StoreCoord {
                batch,
                changes,
            }));
        Some(batch)
    }

    /// Whether coordination state (and task records) are kept in a store.
    pub(in crate::gateway) fn keeps_records(&self) -> bool {
        self.coordination.durable.is_some()
    }

    /// Changes that came with no call go out for writing.
    pub(in crate::gateway) fn flush_coordination(&mut self, now: Instant) {
        if self.coordination.durable.is_some()
            && (self.coordination.coord.has_changes()
                || !self.coordination.name_changes.is_empty()
                || self.tasks.has_changes())
        {
            self.coordination_batch(now);
        }
    }

    /// A coordination call's answer: now, or once what it changed (and every write before it)
    /// is durable. If its own write fails, the caller is told `state_not_durable` instead.
    pub(in crate::gateway) fn answer_coordinated(
        &mut self,
        now: Instant,
        token: HttpToken,
        (reply, id, status_of): (HttpReply, &str, fn(i64) -> u16),
        (tool, project): (&'static str, String),
    ) {
        let own = self.coordination_batch(now).is_some();
        let Some(durable) = self.coordination.durable.as_mut() else {
            self.outputs.push_back(Output::Http { token, reply });
            return;
        };
        let if_failed = own.then(|| {
            let e = RpcError::NotDurable {
                tool: tool.to_owned(),
                project,
                retry_after: RETRY_AFTER,
            };
            HttpReply {
                status: status_of(e.code()),
                headers: Vec::new(),
                body: Some(e.response(Some(id))),
            }
        });
        if let Some((token, reply)) = durable.hold(token, reply, if_failed) {
            self.outputs.push_back(Output::Http { token, reply });
        }
    }

    /// A batch of coordination records is written (but for `failed`): the answers that waited
    /// for it go out, and the failed keys are written again with the next batch of their
    /// project (of any project, for a name).
    pub(in crate::gateway) fn coordination_stored(&mut self, batch: u64, failed: Vec<String>) {
        let Some(durable) = self.coordination.durable.as_mut() else {
            return;
        };
        if !failed.is_empty() {
            tracing::error!(
                batch,
                keys = failed.len(),
                "coordination state could not be written to the store; the writes were answered state_not_durable"
            );
        }
        let out = durable.handle_stored(batch, &failed);
        self.coordination_released(out, failed);
    }

    /// Batches the store did not report within `WRITE_DEADLINE` are taken as failed.
    pub(in crate::gateway) fn coordination_write_timeout(&mut self, now: Instant) {
        let Some(durable) = self.coordination.durable.as_mut() else {
            return;
        };
        if durable.poll_timeout().is_none_or(|at| at > now) {
            return;
        }
        let (out, keys) = durable.handle_timeout(now);
        tracing::error!(
            keys = keys.len(),
            "the store did not report coordination writes within {}s; they were answered state_not_durable and are written again",
            WRITE_DEADLINE.as_secs()
        );
        self.coordination_released(out, keys);
    }

    /// `item` now, or once the coordination writes in flight now are done (a single gateway
    /// without a store: now).
    pub(in crate::gateway) fn after_coordination_writes(&mut self, item: AfterWrites) {
        if let Some(item) = self.coordination.after_writes(item) {
            self.after_writes_done(vec![item]);
        }
    }

    /// What waited for coordination writes, carried out.
    fn after_writes_done(&mut self, items: Vec<AfterWrites>) {
        for item in items {
            match item {
                AfterWrites::Engine(action) => self.outputs.push_back(Output::Cluster(action)),
                AfterWrites::Move { project, uplink } => self.send_move(uplink, &project),
            }
        }
    }

    /// Asks the sled on `uplink` to move (`Control::Move`), if it still serves `project`.
    fn send_move(&mut self, uplink: crate::UplinkId, project: &str) {
        let live = self
            .uplinks
            .get(&uplink)
            .is_some_and(|u| matches!(&u.state, crate::gateway::UplinkState::Live { project: p } if p == project));
        if !live {
            return;
        }
        tracing::info!(uplink = uplink.0, project, "asking the sled to move");
        let frame = crate::uplink::Control::Move {
            reason: "this gateway replica is stopping; connect again to be served by another"
                .into(),
        };
        self.outputs.push_back(Output::UplinkSend {
            uplink,
            text: frame.to_text(),
        });
    }

    /// Answers whose batches are over go out; `failed` keys are written again with the next
    /// batch of their project (of any project, for a name).
    fn coordination_released(&mut self, out: Vec<(HttpToken, HttpReply)>, failed: Vec<String>) {
        for key in &failed {
            if key.starts_with(super::NAME_PREFIX) {
                // A name's write failed: written again with the next batch.
                if let Some(secret) =
                    self.coordination.names.iter().find_map(|(s, n)| {
                        (super::name_key(s) == *key).then(|| (s.clone(), n.clone()))
                    })
                {
                    self.coordination.name_retries.push(RecordChange {
                        key: key.clone(),
                        value: Some(secret.1.into_bytes()),
                    });
                }
            } else if crate::tasks::is_record_key(key) {
                self.tasks.write_failed(key);
            } else {
                self.coordination.coord.write_failed(key);
            }
        }
        for (token, reply) in out {
            self.outputs.push_back(Output::Http { token, reply });
        }
        if let Some(durable) = self.coordination.durable.as_mut() {
            let done = durable.take_deferred();
            self.after_writes_done(done);
        }
    }

    /// Shutdown: the answers waiting for writes go (the server finishes the writes), and so
    /// do the releases that waited for them (a graceful stop drains its calls first, so only
    /// writes no call waits for, an expiry's, can still be in flight).
    pub(in crate::gateway) fn coordination_shutdown(&mut self) {
        let Some(durable) = self.coordination.durable.as_mut() else {
            return;
        };
        let (answers, deferred) = durable.handle_shutdown();
        for (token, reply) in answers {
            self.outputs.push_back(Output::Http { token, reply });
        }
        self.after_writes_done(deferred);
    }

    /// Takes back the coordination records of an earlier run (agents' names, leases, the
    /// board, counters), before any input: see `Coord::restore`.
    pub fn restore_coordination(&mut self, now: Instant, records: Vec<StoredRecord>) -> Restored {
        let (tasks, records): (Vec<StoredRecord>, Vec<StoredRecord>) = records
            .into_iter()
            .partition(|r| crate::tasks::is_record_key(&r.key));
        let kept = self.tasks.restore(now, tasks);
        if kept > 0 {
            tracing::info!(tasks = kept, "task records read back");
        }
        let (names, rest): (Vec<StoredRecord>, Vec<StoredRecord>) = records
            .into_iter()
            .partition(|r| r.key.starts_with(super::NAME_PREFIX));
        let c = &mut self.coordination;
        let mut skipped = 0;
        for r in names {
            match String::from_utf8(r.value) {
                Ok(name) => {
                    if let Some(n) = name
                        .strip_prefix("agent-")
                        .and_then(|n| n.parse::<u64>().ok())
                    {
                        c.next_agent = c.next_agent.max(n);
                    }
                    c.earlier_names.insert(r.key, name);
                }
                Err(_) => skipped += 1,
            }
        }
        let mut restored = c.coord.restore(now, rest);
        restored.skipped += skipped;
        restored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fake clock's origin: the one real reading, made once per test.
    #[allow(clippy::disallowed_methods)]
    fn t0() -> Instant {
        Instant::now()
    }

    fn reply(body: &str) -> HttpReply {
        HttpReply {
            status: 200,
            headers: Vec::new(),
            body: Some(body.into()),
        }
    }

    fn change() -> Vec<RecordChange> {
        vec![RecordChange {
            key: "61.c".into(),
            value: Some(b"{}".to_vec()),
        }]
    }

    #[test]
    fn answers_wait_for_their_batch_and_the_ones_before() {
        let t0 = t0();
        let mut d = Durable::default();
        assert!(d.handle_changes(t0, Vec::new()).is_none());
        // Nothing in flight: at once.
        assert!(d.hold(HttpToken(1), reply("a"), None).is_some());
        let (b1, _) = d.handle_changes(t0, change()).unwrap();
        assert!(d
            .hold(HttpToken(2), reply("w1"), Some(reply("x1")))
            .is_none());
        let (b2, _) = d.handle_changes(t0, change()).unwrap();
        assert!(d
            .hold(HttpToken(3), reply("w2"), Some(reply("x2")))
            .is_none());
        // A read waits for the newest.
        assert!(d.hold(HttpToken(4), reply("r"), None).is_none());
        let out = d.handle_stored(b1, &[]);
        assert_eq!(out, vec![(HttpToken(2), reply("w1"))]);
        // Its own batch failed: the call's answer is the failure; the read's is its own.
        let out = d.handle_stored(b2, &["61.c".into()]);
        assert_eq!(
            out,
            vec![(HttpToken(3), reply("x2")), (HttpToken(4), reply("r"))]
        );
        assert_eq!((d.batches, d.failed_writes), (2, 1));
        // An unknown batch changes nothing.
        assert!(d.handle_stored(99, &[]).is_empty());
    }

    #[test]
    fn shutdown_lets_everything_go() {
        let t0 = t0();
        let mut d = Durable::default();
        d.handle_changes(t0, change()).unwrap();
        assert!(d.hold(HttpToken(1), reply("w"), None).is_none());
        let release = AfterWrites::Engine(ClusterAction::Release {
            project: "alpha".into(),
            revision: 3,
        });
        assert!(d.defer(release.clone()).is_none());
        assert_eq!(
            d.handle_shutdown(),
            (vec![(HttpToken(1), reply("w"))], vec![release])
        );
    }

    #[test]
    fn a_batch_past_its_deadline_fails_its_calls_and_gives_back_its_keys() {
        let t0 = t0();
        let mut d = Durable::default();
        assert_eq!(d.poll_timeout(), None);
        let (b1, _) = d.handle_changes(t0, change()).unwrap();
        assert!(d
            .hold(HttpToken(1), reply("w1"), Some(reply("x1")))
            .is_none());
        let t1 = t0 + Duration::from_secs(3);
        let (b2, _) = d.handle_changes(t1, change()).unwrap();
        assert!(d
            .hold(HttpToken(2), reply("w2"), Some(reply("x2")))
            .is_none());
        assert_eq!(d.poll_timeout(), Some(t0 + WRITE_DEADLINE));
        // Not yet.
        let (out, keys) = d.handle_timeout(t0 + WRITE_DEADLINE - Duration::from_millis(1));
        assert!(out.is_empty() && keys.is_empty());
        // The first batch is given up: its call is told, its keys come back; the second
        // still waits for its own.
        let (out, keys) = d.handle_timeout(t0 + WRITE_DEADLINE);
        assert_eq!(out, vec![(HttpToken(1), reply("x1"))]);
        assert_eq!(keys, vec!["61.c".to_owned()]);
        assert_eq!(d.poll_timeout(), Some(t1 + WRITE_DEADLINE));
        // Its late report changes nothing; the second is reported in time.
        assert!(d.handle_stored(b1, &[]).is_empty());
        assert_eq!(d.handle_stored(b2, &[]), vec![(HttpToken(2), reply("w2"))]);
        assert_eq!(
            (d.timed_out, d.failed_writes, d.poll_timeout()),
            (1, 1, None)
        );
    }

    #[test]
    fn a_deferred_action_waits_for_the_batches_in_flight_when_it_was_made() {
        let t0 = t0();
        let mut d = Durable::default();
        let release = |revision| {
            AfterWrites::Engine(ClusterAction::Release {
                project: "alpha".into(),
                revision,
            })
        };
        // Nothing in flight: at once.
        assert_eq!(d.defer(release(1)), Some(release(1)));
        let (b1, _) = d.handle_changes(t0, change()).unwrap();
        assert!(d.defer(release(2)).is_none());
        let (b2, _) = d.handle_changes(t0, change()).unwrap();
        assert!(d.take_deferred().is_empty());
        d.handle_stored(b1, &[]);
        assert_eq!(d.take_deferred(), vec![release(2)]);
        // A batch given up at its deadline lets what waited for it go too.
        assert!(d.defer(release(3)).is_none());
        let _ = d.handle_timeout(t0 + WRITE_DEADLINE);
        assert_eq!(d.take_deferred(), vec![release(3)]);
        assert!(d.handle_stored(b2, &[]).is_empty());
    }
}
