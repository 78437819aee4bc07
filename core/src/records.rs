//! What the gateway keeps outside the process: session records and first-use pins in the
//! engine of a cluster (issue 15), and session records in the store of a single gateway with
//! a state directory (issue 25, `Config::store_sessions`), through the same actions.
//!
//! It is sans-IO and separate from the replica machine ([`crate::replica::Replica`]), which
//! decides only where projects are served: persistence is not a cluster feature. The gateway
//! tells it of writes and reads, and takes what the engine must do from
//! [`Records::poll_action`].
//!
//! # Invariants
//! - A session is read from the engine once however many requests wait for it; each waiting
//!   request is handled again (or refused) when the read is done.
//! - An answer that gives out a new session id waits for the session's write to be done, so
//!   that any replica can read it by the time the client names it.
//! - While a write of a session is in flight, the engine's older news of it is ignored.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::cluster::{ClusterAction, SessionRecord};
use crate::io::{HttpReply, HttpRequest, HttpToken, UplinkId};
use crate::replica::Waiting;

/// The records machine; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Records {
    /// Requests that name a session being read from the engine.
    parked: BTreeMap<String, Vec<(HttpToken, HttpRequest)>>,
    /// When each session served here was last written to (or read from) the engine.
    written: BTreeMap<String, Instant>,
    /// Writes of each session's record not done yet.
    in_flight: BTreeMap<String, u32>,
    /// Answers that wait for their session's write to be done, each with what to answer
    /// instead if a write failed (a new session's `initialize`).
    after_store: BTreeMap<String, Vec<(HttpToken, HttpReply, Option<HttpReply>)>>,
    /// Sessions a write of which failed while answers waited.
    unwritten: BTreeSet<String>,
    /// Uplinks whose first-use pin is being created in the engine, by project.
    pinning: BTreeMap<String, Waiting>,
    /// Sessions read from the engine because this gateway did not know them.
    sessions_loaded: u64,
    actions: VecDeque<ClusterAction>,
}

impl Records {
    pub(crate) fn sessions_loaded(&self) -> u64 {
        self.sessions_loaded
    }

    // ---- sessions ----

    /// A request names `session`, which this gateway does not know: it waits while the
    /// session is read from the engine.
    pub(crate) fn park(&mut self, session: &str, token: HttpToken, request: HttpRequest) {
        let first = !self.parked.contains_key(session);
        self.parked
            .entry(session.to_owned())
            .or_default()
            .push((token, request));
        if first {
            self.sessions_loaded += 1;
            self.actions.push_back(ClusterAction::LoadSession {
                session: session.to_owned(),
            });
        }
    }

    /// The read of `session` is done: the requests that waited for it; `found` when the
    /// engine had it (it counts as written now).
    pub(crate) fn handle_loaded(
        &mut self,
        now: Instant,
        session: &str,
        found: bool,
    ) -> Vec<(HttpToken, HttpRequest)> {
        if found {
            self.written.insert(session.to_owned(), now);
        }
        self.parked.remove(session).unwrap_or_default()
    }

    /// Whether this gateway's own writes of `session` are in flight: then its copy is newer
    /// than the engine's news.
    pub(crate) fn writing(&self, session: &str) -> bool {
        self.in_flight.get(session).is_some_and(|n| *n > 0)
    }

    /// Another gateway deleted `session`.
    pub(crate) fn forget(&mut self, session: &str) {
        self.written.remove(session);
    }

    /// A session was created, changed (`Some`) or deleted (`None`) here: it is written.
    pub(crate) fn store(&mut self, now: Instant, session: &str, record: Option<SessionRecord>) {
        match record {
            Some(_) => self.written.insert(session.to_owned(), now),
            None => self.written.remove(session),
        };
        *self.in_flight.entry(session.to_owned()).or_insert(0) += 1;
        self.actions.push_back(ClusterAction::StoreSession {
            session: session.to_owned(),
            record,
        });
    }

    /// Whether a session in use is due to be written again: its record is `every` old (or
    /// was never written, or its last write failed).
    pub(crate) fn due(&self, now: Instant, session: &str, every: Duration) -> bool {
        self.written
            .get(session)
            .is_none_or(|at| now.saturating_duration_since(*at) >= every)
    }

    /// A write of `session` is done, `written` or not: the answers that waited for the last
    /// one in flight go out; where one of the writes failed, each answer that has one is
    /// replaced by its `if_unwritten` (then the second value is true).
    pub(crate) fn handle_stored(
        &mut self,
        session: &str,
        written: bool,
    ) -> (Vec<(HttpToken, HttpReply)>, bool) {
        // Not written (the engine out of reach): written again at the session's next use.
        if !written {
            self.written.remove(session);
            self.unwritten.insert(session.to_owned());
        }
        if let Some(n) = self.in_flight.get_mut(session) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.in_flight.remove(session);
            }
        }
        if self.in_flight.contains_key(session) {
            return (Vec::new(), false);
        }
        let failed = self.unwritten.remove(session);
        let mut replaced = false;
        let answers = self
            .after_store
            .remove(session)
            .unwrap_or_default()
            .into_iter()
            .map(|(token, reply, if_unwritten)| match if_unwritten {
                Some(instead) if failed => {
                    replaced = true;
                    (token, instead)
                }
                _ => (token, reply),
            })
            .collect();
        (answers, replaced)
    }

    /// Keeps an answer until the write of `session` in flight is done; gives it back when
    /// none is.
    pub(crate) fn after_store(
        &mut self,
        token: HttpToken,
        session: &str,
        reply: HttpReply,
        if_unwritten: Option<HttpReply>,
    ) -> Option<(HttpToken, HttpReply)> {
        if !self.in_flight.contains_key(session) {
            return Some((token, reply));
        }
        self.after_store
            .entry(session.to_owned())
            .or_default()
            .push((token, reply, if_unwritten));
        None
    }

    // ---- pins ----

    /// An uplink proved a key for a project with no pin: the pin is created in the engine (the
    /// first gateway to do so wins) while it waits. A newer uplink replaces the one waiting,
    /// whose id is answered.
    pub(crate) fn create_pin(&mut self, project: &str, waiting: Waiting) -> Option<UplinkId> {
        let pin = crate::Pin {
            key: waiting.key.clone().unwrap_or_default(),
            sled: waiting.sled.clone(),
        };
        let older = self.pinning.insert(project.to_owned(), waiting);
        self.actions.push_back(ClusterAction::CreatePin {
            project: project.to_owned(),
            pin,
        });
        older.map(|w| w.uplink)
    }

    /// The engine answered the pin's creation: the uplink that waited for it.
    pub(crate) fn handle_pin_created(&mut self, project: &str) -> Option<Waiting> {
        self.pinning.remove(project)
    }

    /// An uplink is gone; `true` when it was waiting for a pin (it is forgotten).
    pub(crate) fn handle_uplink_gone(&mut self, id: UplinkId, project: &str) -> bool {
        if self.pinning.get(project).is_some_and(|w| w.uplink == id) {
            self.pinning.remove(project);
            return true;
        }
        false
    }

    /// An operator re-pinned a project here: the engine's pin is replaced.
    pub(crate) fn store_pin(&mut self, project: &str, pin: crate::Pin) {
        self.actions.push_back(ClusterAction::StorePin {
            project: project.to_owned(),
            pin,
        });
    }

    /// Shutdown: the requests still waiting for a session (to refuse) and the answers still
    /// waiting for a write (to send; a new session's refusal where it has one, since its
    /// write may never be done).
    pub(crate) fn handle_shutdown(&mut self) -> (Vec<HttpToken>, Vec<(HttpToken, HttpReply)>) {
        let parked = std::mem::take(&mut self.parked)
            .into_values()
            .flatten()
            .map(|(t, _)| t)
            .collect();
        let stored = std::mem::take(&mut self.after_store)
            .into_values()
            .flatten()
            .map(|(token, reply, if_unwritten)| (token, if_unwritten.unwrap_or(reply)))
            .collect();
        (parked, stored)
    }

    /// The next thing the engine must do.
    pub(crate) fn poll_action(&mut self) -> Option<ClusterAction> {
        self.actions.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)]
    fn t0() -> Instant {
        Instant::now()
    }

    fn actions(r: &mut Records) -> Vec<ClusterAction> {
        std::iter::from_fn(|| r.poll_action()).collect()
    }

    fn reply(status: u16) -> HttpReply {
        HttpReply {
            status,
            headers: Vec::new(),
            body: None,
        }
    }

    fn record() -> SessionRecord {
        SessionRecord {
            default_project: Some("alpha".into()),
            protocol_version: "2025-11-25".into(),
            log_level: None,
            client_capabilities: serde_json::Value::Null,
            owner: None,
        }
    }

    #[test]
    fn a_session_is_read_once_however_many_requests_wait_for_it() {
        let t0 = t0();
        let mut r = Records::default();
        r.park("s1", HttpToken(1), HttpRequest::default());
        r.park("s1", HttpToken(2), HttpRequest::default());
        assert_eq!(
            actions(&mut r),
            [ClusterAction::LoadSession {
                session: "s1".into()
            }]
        );
        let waited: Vec<HttpToken> = r
            .handle_loaded(t0, "s1", true)
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(waited, [HttpToken(1), HttpToken(2)]);
        assert_eq!(r.sessions_loaded(), 1);
        assert!(
            !r.due(t0, "s1", Duration::from_secs(10)),
            "read counts as written"
        );
        assert!(r.due(t0 + Duration::from_secs(10), "s1", Duration::from_secs(10)));
    }

    #[test]
    fn an_answer_waits_for_the_last_write_in_flight_and_the_engines_news_is_older_meanwhile() {
        let t0 = t0();
        let mut r = Records::default();
        assert_eq!(
            r.after_store(HttpToken(1), "s1", reply(200), None),
            Some((HttpToken(1), reply(200))),
            "nothing in flight: at once"
        );
        r.store(t0, "s1", Some(record()));
        r.store(t0, "s1", Some(record()));
        assert_eq!(actions(&mut r).len(), 2);
        assert!(r.writing("s1"));
        assert_eq!(r.after_store(HttpToken(2), "s1", reply(200), None), None);
        assert_eq!(r.handle_stored("s1", true), (vec![], false));
        assert_eq!(
            r.handle_stored("s1", false),
            (vec![(HttpToken(2), reply(200))], false)
        );
        assert!(!r.writing("s1"));
        assert!(
            r.due(t0, "s1", Duration::from_secs(10)),
            "a failed write is written again at the next use"
        );
    }

    #[test]
    fn an_answer_with_an_alternative_gets_it_when_any_write_in_flight_failed() {
        let t0 = t0();
        let mut r = Records::default();
        r.store(t0, "s1", Some(record()));
        r.store(t0, "s1", Some(record()));
        assert_eq!(
            r.after_store(HttpToken(1), "s1", reply(200), Some(reply(503))),
            None
        );
        assert_eq!(r.after_store(HttpToken(2), "s1", reply(200), None), None);
        // The first write failed, the last did not: the answer that has one is refused.
        assert_eq!(r.handle_stored("s1", false), (vec![], false));
        assert_eq!(
            r.handle_stored("s1", true),
            (
                vec![(HttpToken(1), reply(503)), (HttpToken(2), reply(200))],
                true
            )
        );
        // And forgotten: the next writes start clean.
        r.store(t0, "s1", Some(record()));
        assert_eq!(
            r.after_store(HttpToken(3), "s1", reply(200), Some(reply(503))),
            None
        );
        assert_eq!(
            r.handle_stored("s1", true),
            (vec![(HttpToken(3), reply(200))], false)
        );
    }

    #[test]
    fn a_pin_is_created_once_per_project_and_a_newer_uplink_replaces_the_one_waiting() {
        let mut r = Records::default();
        let w = |n| Waiting {
            uplink: UplinkId(n),
            sled: "s".into(),
            key: Some("k".into()),
        };
        assert_eq!(r.create_pin("alpha", w(1)), None);
        assert_eq!(r.create_pin("alpha", w(2)), Some(UplinkId(1)));
        assert!(!r.handle_uplink_gone(UplinkId(1), "alpha"));
        assert_eq!(r.handle_pin_created("alpha"), Some(w(2)));
        assert_eq!(r.handle_pin_created("alpha"), None);
        assert_eq!(actions(&mut r).len(), 2);
    }

    #[test]
    fn shutdown_gives_back_every_waiting_request_and_answer() {
        let t0 = t0();
        let mut r = Records::default();
        r.park("s1", HttpToken(1), HttpRequest::default());
        r.store(t0, "s2", None);
        assert_eq!(r.after_store(HttpToken(2), "s2", reply(202), None), None);
        let (refused, answered) = r.handle_shutdown();
        assert_eq!(refused, [HttpToken(1)]);
        assert_eq!(answered, [(HttpToken(2), reply(202))]);
    }
}
