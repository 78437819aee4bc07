//! What became of the requests other replicas relayed here, by their envelope's nonce, so
//! that a relaying replica that lost the engine with a relay in flight can ask once the
//! engine is back ([`super::relay::Envelope::Outcome`]) instead of answering its client
//! `outcome: "unknown"` (issue 31).
//!
//! The owner records a relay when it takes it (`running`), and its handoff once answered
//! (`done`). Asked about a nonce it has no record of, it answers `unseen` only when it is sure
//! the request can no longer be taken, and records that, so that the envelope arriving late
//! (a NATS client resends what it buffered during an outage) is refused: the relaying replica
//! may then send the call again, and it runs at most once. It is sure when:
//!
//! - the request was sealed after this run of the replica began (a request sealed before may
//!   have been taken by the previous run, whose records died with it: `lost`), and
//! - it was sealed less than [`UNSEEN_WITHIN`] ago: an envelope is taken only within
//!   `gateway_core::keys::MESSAGE_LIFETIME` of its sealing, and a record is kept [`KEEP`] past
//!   its last change, so within that window no record has expired (past it: `lost`).
//!
//! Answers are kept whole up to [`BODY_BUDGET`] bytes in all; past it the oldest answers'
//! bodies are dropped, and they are recovered as `lost` (the call ran; its answer is gone).
//! Everything here is decided on the wall-clock milliseconds it is given.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::relay::Handoff;

/// How long a record is kept past its last change.
pub const KEEP_MS: u64 = 90_000;

/// How long after its sealing a request with no record is known never to have been taken.
pub const UNSEEN_WITHIN: u64 = KEEP_MS - gateway_core::keys::MESSAGE_LIFETIME.as_millis() as u64;

/// The bytes of answer bodies kept in all.
pub const BODY_BUDGET: usize = 32 << 20;

/// The owner's answer to an [`super::relay::Envelope::Outcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum Recovered {
    /// Taken and answered: the handoff it was answered with.
    Done { handoff: Handoff },
    /// Taken, and not answered yet.
    Running,
    /// Never taken, and it never will be here.
    Unseen,
    /// No record, and it may have been taken (by this run, long ago, or by an earlier one).
    Lost,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Running,
    Done(Handoff),
    Unseen,
}

/// The records, by envelope nonce.
#[derive(Debug)]
pub struct Outcomes {
    started_ms: u64,
    records: HashMap<[u8; 16], (u64, State)>,
    /// Every change, oldest first (a record's older entries are skipped when they come up).
    order: VecDeque<(u64, [u8; 16])>,
    /// Bodies kept, with the instant of their record's change, oldest first.
    bodies: VecDeque<(u64, [u8; 16])>,
    body_bytes: usize,
}

fn body_len(h: &Handoff) -> usize {
    match h {
        Handoff::Answered { body, .. } => body.as_ref().map_or(0, String::len),
        _ => 0,
    }
}

impl Outcomes {
    /// The records of a run that began at `started_ms`.
    pub fn new(started_ms: u64) -> Outcomes {
        Outcomes {
            started_ms,
            records: HashMap::new(),
            order: VecDeque::new(),
            bodies: VecDeque::new(),
            body_bytes: 0,
        }
    }

    /// A relayed request is taken: `false` when its nonce was asked about before it came
    /// (recorded `unseen`): it must be refused.
    pub fn handle_taken(&mut self, now_ms: u64, nonce: [u8; 16]) -> bool {
        self.expire(now_ms);
        if self.records.contains_key(&nonce) {
            return false;
        }
        self.set(now_ms, nonce, State::Running);
        true
    }

    /// A relayed request was answered with `handoff` (a refusal included).
    pub fn handle_answered(&mut self, now_ms: u64, nonce: [u8; 16], handoff: Handoff) {
        self.expire(now_ms);
        let len = body_len(&handoff);
        if len > 0 {
            self.body_bytes += len;
            self.bodies.push_back((now_ms, nonce));
        }
        self.set(now_ms, nonce, State::Done(handoff));
        while self.body_bytes > BODY_BUDGET {
            let Some((_, oldest)) = self.bodies.pop_front() else {
                break;
            };
            if let Some((_, State::Done(h))) = self.records.get_mut(&oldest) {
                self.body_bytes -= body_len(h);
                tracing::warn!("relayed answers past the outcome budget: the oldest is forgotten");
                *h = Handoff::Lost;
            }
        }
    }

    /// What became of the request with `nonce`, sealed at `sealed_ms` (the relaying replica's
    /// clock).
    pub fn handle_query(&mut self, now_ms: u64, nonce: [u8; 16], sealed_ms: u64) -> Recovered {
        self.expire(now_ms);
        match self.records.get(&nonce).map(|(_, s)| s) {
            Some(State::Running) => Recovered::Running,
            Some(State::Done(h)) => Recovered::Done { handoff: h.clone() },
            Some(State::Unseen) => Recovered::Unseen,
            None if sealed_ms < self.started_ms
                || now_ms.saturating_sub(sealed_ms) >= UNSEEN_WITHIN =>
            {
                Recovered::Lost
            }
            None => {
                self.set(now_ms, nonce, State::Unseen);
                Recovered::Unseen
            }
        }
    }

    /// How many records are kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn set(&mut self, now_ms: u64, nonce: [u8; 16], state: State) {
        self.records.insert(nonce, (now_ms, state));
        self.order.push_back((now_ms, nonce));
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some(&(at, nonce)) = self.order.front() {
            if now_ms.saturating_sub(at) < KEEP_MS {
                break;
            }
            self.order.pop_front();
            if self
                .records
                .get(&nonce)
                .is_some_and(|(last, _)| *last == at)
            {
                if let Some((_, State::Done(h))) = self.records.remove(&nonce) {
                    self.body_bytes -= body_len(&h);
                }
            }
        }
        while let Some(&(at, nonce)) = self.bodies.front() {
            let kept = self.records.get(&nonce).is_some_and(|(last, s)| {
                *last == at && matches!(s, State::Done(h) if body_len(h) > 0)
            });
            if kept {
                break;
            }
            self.bodies.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_000_000;

    fn answered(body: &str) -> Handoff {
        Handoff::Answered {
            status: 200,
            headers: Vec::new(),
            body: Some(body.into()),
        }
    }

    #[test]
    fn a_taken_request_is_running_then_done() {
        let mut o = Outcomes::new(T0);
        let n = [1; 16];
        assert!(o.handle_taken(T0 + 10, n));
        assert_eq!(o.handle_query(T0 + 20, n, T0 + 5), Recovered::Running);
        o.handle_answered(T0 + 30, n, answered("{}"));
        assert_eq!(
            o.handle_query(T0 + 40, n, T0 + 5),
            Recovered::Done {
                handoff: answered("{}")
            }
        );
        // Kept KEEP_MS past its answer, then forgotten: lost, not unseen.
        assert!(matches!(
            o.handle_query(T0 + 30 + KEEP_MS - 1, n, T0 + 5),
            Recovered::Done { .. }
        ));
        assert_eq!(
            o.handle_query(T0 + 30 + KEEP_MS, n, T0 + 5),
            Recovered::Lost
        );
        assert!(o.is_empty());
    }

    #[test]
    fn asked_first_it_is_unseen_and_refused_when_it_comes() {
        let mut o = Outcomes::new(T0);
        let n = [2; 16];
        assert_eq!(o.handle_query(T0 + 100, n, T0 + 50), Recovered::Unseen);
        assert!(!o.handle_taken(T0 + 200, n), "a late arrival is refused");
        assert_eq!(o.handle_query(T0 + 300, n, T0 + 50), Recovered::Unseen);
    }

    #[test]
    fn no_record_is_lost_when_it_may_have_been_taken() {
        let mut o = Outcomes::new(T0);
        // Sealed before this run began: the previous run may have taken it.
        assert_eq!(o.handle_query(T0 + 10, [3; 16], T0 - 1), Recovered::Lost);
        // Sealed so long ago that its record may have expired.
        let now = T0 + 10 * KEEP_MS;
        assert_eq!(
            o.handle_query(now, [4; 16], now - UNSEEN_WITHIN),
            Recovered::Lost
        );
        assert_eq!(
            o.handle_query(now, [5; 16], now - UNSEEN_WITHIN + 1),
            Recovered::Unseen
        );
    }

    #[test]
    fn answers_past_the_budget_are_recovered_as_lost() {
        let mut o = Outcomes::new(T0);
        let big = "x".repeat(BODY_BUDGET / 3 + 1);
        for i in 0..3u8 {
            assert!(o.handle_taken(T0 + u64::from(i), [i; 16]));
            o.handle_answered(T0 + u64::from(i), [i; 16], answered(&big));
        }
        let q = |o: &mut Outcomes, i: u8| o.handle_query(T0 + 10, [i; 16], T0);
        assert_eq!(
            q(&mut o, 0),
            Recovered::Done {
                handoff: Handoff::Lost
            }
        );
        assert!(matches!(
            q(&mut o, 1),
            Recovered::Done {
                handoff: Handoff::Answered { .. }
            }
        ));
        assert!(matches!(
            q(&mut o, 2),
            Recovered::Done {
                handoff: Handoff::Answered { .. }
            }
        ));
        assert!(o.body_bytes <= BODY_BUDGET);
        // Expired whole, the budget is given back.
        o.handle_query(T0 + 10 + KEEP_MS, [9; 16], T0 + 10 + KEEP_MS);
        assert_eq!(o.body_bytes, 0);
    }
}
