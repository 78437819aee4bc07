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
//! - Every held answer goes out exactly once: when its batch is done, or at shutdown.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cluster::ClusterAction;
use crate::coord::{RecordChange, Restored, StoredRecord};
use crate::error::RpcError;
use crate::gateway::{Gateway, Output};
use crate::{HttpReply, HttpToken};

/// How soon a client may retry a coordination write the store could not keep.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// One held answer: its result, and what to answer instead if its own batch fails.
#[derive(Debug)]
struct Held {
    token: HttpToken,
    reply: HttpReply,
    if_failed: Option<HttpReply>,
}

/// The machine; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Durable {
    next: u64,
    /// Batches handed out and not done, with their keys.
    in_flight: BTreeMap<u64, usize>,
    held: BTreeMap<u64, Vec<Held>>,
    /// Batches written, and writes that failed (for `/metrics`).
    pub(crate) batches: u64,
    pub(crate) failed_writes: u64,
    /// The planted bug `CoordAckBeforeDurable`: nothing is held.
    #[cfg(feature = "planted-bugs")]
    pub(crate) ack_early: bool,
}

impl Durable {
    /// Numbers a batch of changes; `None` when there are none.
    pub(crate) fn handle_changes(
        &mut self,
        changes: Vec<RecordChange>,
    ) -> Option<(u64, Vec<RecordChange>)> {
        if changes.is_empty() {
            return None;
        }
        self.next += 1;
        self.in_flight.insert(self.next, changes.len());
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
        // Batches are done in order; anything held under an older one goes too.
        let oldest_left = self.in_flight.keys().next().copied().unwrap_or(u64::MAX);
        let done: Vec<u64> = self.held.range(..oldest_left).map(|(b, _)| *b).collect();
        let mut out = Vec::new();
        for b in done {
            for h in self.held.remove(&b).unwrap_or_default() {
                let reply = match (b == batch && !failed.is_empty(), h.if_failed) {
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
    pub(crate) fn handle_shutdown(&mut self) -> Vec<(HttpToken, HttpReply)> {
        std::mem::take(&mut self.held)
            .into_values()
            .flatten()
            .map(|h| (h.token, h.reply))
            .collect()
    }
}

// ---- the gateway's side ----

impl Gateway {
    /// The changes made since the last batch (names given or forgotten, and the projects'
    /// records), handed out as a batch; its number, or `None` when nothing changed (or nothing
    /// is kept).
    fn coordination_batch(&mut self, now: Instant) -> Option<u64> {
        let c = &mut self.coordination;
        let durable = c.durable.as_mut()?;
        let mut changes = std::mem::take(&mut c.name_changes);
        changes.extend(c.coord.take_changes(now));
        if changes.is_empty() {
            return None;
        }
        // Names whose write failed go with the next batch there is anyway.
        let retries = std::mem::take(&mut c.name_retries);
        changes.splice(0..0, retries);
        let (batch, changes) = durable.handle_changes(changes)?;
        self.outputs
            .push_back(Output::Cluster(ClusterAction::StoreCoord {
                batch,
                changes,
            }));
        Some(batch)
    }

    /// Changes that came with no call go out for writing.
    pub(in crate::gateway) fn flush_coordination(&mut self, now: Instant) {
        if self.coordination.durable.is_some()
            && (self.coordination.coord.has_changes() || !self.coordination.name_changes.is_empty())
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
            } else {
                self.coordination.coord.write_failed(key);
            }
        }
        for (token, reply) in out {
            self.outputs.push_back(Output::Http { token, reply });
        }
    }

    /// Shutdown: the answers waiting for writes go (the server finishes the writes).
    pub(in crate::gateway) fn coordination_shutdown(&mut self) {
        let Some(durable) = self.coordination.durable.as_mut() else {
            return;
        };
        for (token, reply) in durable.handle_shutdown() {
            self.outputs.push_back(Output::Http { token, reply });
        }
    }

    /// Takes back the coordination records of an earlier run (agents' names, leases, the
    /// board, counters), before any input: see `Coord::restore`.
    pub fn restore_coordination(&mut self, now: Instant, records: Vec<StoredRecord>) -> Restored {
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
        let mut d = Durable::default();
        assert!(d.handle_changes(Vec::new()).is_none());
        // Nothing in flight: at once.
        assert!(d.hold(HttpToken(1), reply("a"), None).is_some());
        let (b1, _) = d.handle_changes(change()).unwrap();
        assert!(d
            .hold(HttpToken(2), reply("w1"), Some(reply("x1")))
            .is_none());
        let (b2, _) = d.handle_changes(change()).unwrap();
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
        let mut d = Durable::default();
        d.handle_changes(change()).unwrap();
        assert!(d.hold(HttpToken(1), reply("w"), None).is_none());
        assert_eq!(d.handle_shutdown(), vec![(HttpToken(1), reply("w"))]);
    }
}
