//! The call table (issue 23, step 4): every request the gateway sent up an uplink and has not
//! seen answered, with the indexes kept beside it. Nothing else inserts into or removes from
//! them, so they cannot drift apart:
//! - by the uplink and the gateway's id for the request (the key);
//! - by the HTTP request waiting for a client's call (`by_token`);
//! - by the gateway's progress token of a call that asked for progress, valid only for
//!   progress coming up the call's own uplink (security review, finding 5);
//! - the calls in flight per session and per uplink (the limits);
//! - the deadlines, in order (`poll_timeout`, `take_expired`).
//!
//! A call's deadline and its HTTP request change only through [`Calls::set_deadline`],
//! [`Calls::attach`] and [`Calls::detach`]; everything else about an entry may be changed in
//! place ([`Calls::call_mut`]).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::{Call, HttpToken, Pending, UplinkId};

/// An uplink, and the gateway's id for a request sent up it.
pub(super) type Key = (UplinkId, u64);

#[derive(Debug, Default)]
pub(super) struct Calls {
    pending: HashMap<Key, Pending>,
    by_token: HashMap<HttpToken, Key>,
    by_progress: HashMap<String, Key>,
    per_session: HashMap<String, usize>,
    per_uplink: HashMap<UplinkId, BTreeSet<u64>>,
    deadlines: BTreeSet<(Instant, Key)>,
}

impl Calls {
    /// Books a request sent up `key.0` under id `key.1`. An entry already under that key (only
    /// a planted bug reuses ids) is displaced from the deadlines and returned.
    pub(super) fn start(&mut self, key: Key, pending: Pending) -> Option<Pending> {
        let displaced = self.pending.remove(&key);
        if let Some(old) = &displaced {
            self.deadlines.remove(&(old.deadline(), key));
        }
        self.deadlines.insert((pending.deadline(), key));
        self.per_uplink.entry(key.0).or_default().insert(key.1);
        if let Pending::Call(call) = &pending {
            self.by_token.insert(call.token, key);
            if let Some((gateway_token, _)) = &call.progress {
                self.by_progress.insert(gateway_token.clone(), key);
            }
            if let Some(s) = &call.session {
                *self.per_session.entry(s.clone()).or_insert(0) += 1;
            }
        }
        self.pending.insert(key, pending);
        displaced
    }

    /// Takes a request out of the table and every index: it was answered, expired, cancelled,
    /// or its client went away.
    pub(super) fn take(&mut self, key: Key) -> Option<Pending> {
        let pending = self.pending.remove(&key)?;
        self.deadlines.remove(&(pending.deadline(), key));
        if let Some(ids) = self.per_uplink.get_mut(&key.0) {
            ids.remove(&key.1);
            if ids.is_empty() {
                self.per_uplink.remove(&key.0);
            }
        }
        if let Pending::Call(call) = &pending {
            if self.by_token.get(&call.token) == Some(&key) {
                self.by_token.remove(&call.token);
            }
            if let Some((gateway_token, _)) = &call.progress {
                self.by_progress.remove(gateway_token);
            }
            if let Some(s) = &call.session {
                if let Some(n) = self.per_session.get_mut(s) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_session.remove(s);
                    }
                }
            }
        }
        Some(pending)
    }

    /// Takes the call the HTTP request `token` waits for.
    pub(super) fn take_by_token(&mut self, token: HttpToken) -> Option<(Key, Pending)> {
        let key = *self.by_token.get(&token)?;
        self.take(key).map(|p| (key, p))
    }

    /// Takes the first request whose deadline is at or before `now`.
    pub(super) fn take_expired(&mut self, now: Instant) -> Option<(Key, Pending)> {
        let &(at, key) = self.deadlines.first()?;
        if at > now {
            return None;
        }
        self.take(key).map(|p| (key, p))
    }

    /// Takes every request of an uplink that went away, in the order they were sent.
    pub(super) fn uplink_gone(&mut self, uplink: UplinkId) -> Vec<(u64, Pending)> {
        let ids = self.per_uplink.get(&uplink).cloned().unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| self.take((uplink, id)).map(|p| (id, p)))
            .collect()
    }

    /// The earliest deadline.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// The client's call under `key`, if that is what it is.
    pub(super) fn call(&self, key: Key) -> Option<&Call> {
        match self.pending.get(&key) {
            Some(Pending::Call(call)) => Some(call),
            _ => None,
        }
    }

    /// The client's call under `key`, to change in place (not its deadline or token).
    pub(super) fn call_mut(&mut self, key: Key) -> Option<&mut Call> {
        match self.pending.get_mut(&key) {
            Some(Pending::Call(call)) => Some(call),
            _ => None,
        }
    }

    /// The call the HTTP request `token` waits for.
    pub(super) fn key_of(&self, token: HttpToken) -> Option<Key> {
        self.by_token.get(&token).copied()
    }

    /// The call that gave `gateway_token` to the sled on `uplink`: progress from another
    /// uplink names nothing.
    pub(super) fn by_progress(&self, uplink: UplinkId, gateway_token: &str) -> Option<Key> {
        self.by_progress
            .get(gateway_token)
            .copied()
            .filter(|key| key.0 == uplink)
    }

    /// Moves a request's deadline.
    pub(super) fn set_deadline(&mut self, key: Key, deadline: Instant) {
        let Some(Pending::Call(call)) = self.pending.get_mut(&key) else {
            return;
        };
        self.deadlines.remove(&(call.deadline, key));
        call.deadline = deadline;
        self.deadlines.insert((deadline, key));
    }

    /// A call's HTTP request was answered while the call goes on (a parked stateless call):
    /// no request waits for it until [`Calls::attach`].
    pub(super) fn detach(&mut self, key: Key) {
        if let Some(call) = self.call(key) {
            let token = call.token;
            if self.by_token.get(&token) == Some(&key) {
                self.by_token.remove(&token);
            }
        }
    }

    /// The HTTP request `token` now waits for the call under `key` (a stateless retry).
    pub(super) fn attach(&mut self, key: Key, token: HttpToken) {
        self.detach(key);
        if let Some(call) = self.call_mut(key) {
            call.token = token;
            self.by_token.insert(token, key);
        }
    }

    /// The latest client's call with the id `client_id` in `session` (in any session: `None`).
    pub(super) fn latest_with_client_id(
        &self,
        session: Option<&str>,
        client_id: &str,
    ) -> Option<Key> {
        self.pending
            .iter()
            .filter_map(|(key, p)| match p {
                Pending::Call(c)
                    if session.is_none_or(|s| c.session.as_deref() == Some(s))
                        && c.client_id.as_str() == client_id =>
                {
                    Some((c.sent_at, *key))
                }
                _ => None,
            })
            .max()
            .map(|(_, key)| key)
    }

    /// Requests in flight on `uplink`.
    pub(super) fn on_uplink(&self, uplink: UplinkId) -> usize {
        self.per_uplink.get(&uplink).map_or(0, BTreeSet::len)
    }

    /// Calls in flight for `session`.
    pub(super) fn in_session(&self, session: &str) -> usize {
        self.per_session.get(session).copied().unwrap_or(0)
    }

    /// Calls with an HTTP request waiting for them.
    pub(super) fn waiting(&self) -> usize {
        self.by_token.len()
    }

    /// Every entry, for the planted bugs that look across calls.
    #[cfg(feature = "planted-bugs")]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&Key, &Pending)> {
        self.pending.iter()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::gateway::proxy::Rewrite;
    use crate::jsonrpc::RawId;

    fn call(
        token: u64,
        session: Option<&str>,
        progress: Option<&str>,
        deadline: Instant,
    ) -> Pending {
        Pending::Call(Call {
            token: HttpToken(token),
            client_id: RawId("1".into()),
            project: "alpha".into(),
            tool: "t".into(),
            sent_at: deadline - Duration::from_secs(30),
            deadline,
            session: session.map(str::to_owned),
            progress: progress.map(|p| {
                (
                    p.to_owned(),
                    serde_json::value::to_raw_value(&1).expect("a number"),
                )
            }),
            stream_ok: true,
            modern: false,
            rewrite: Rewrite::None,
            trace_id: None,
            span: None,
            log_level: None,
            streamed: false,
            mrtr: None,
            principal: None,
        })
    }

    /// The fake clock's origin: only differences of instants matter.
    #[allow(clippy::disallowed_methods)]
    fn t0() -> Instant {
        Instant::now()
    }

    const U1: UplinkId = UplinkId(1);
    const U2: UplinkId = UplinkId(2);

    #[test]
    fn a_call_leaves_every_index_at_once() {
        let t0 = t0();
        let mut c = Calls::default();
        c.start(
            (U1, 0),
            call(7, Some("s"), Some("gw-1-0"), t0 + Duration::from_secs(30)),
        );
        assert_eq!((c.on_uplink(U1), c.in_session("s"), c.waiting()), (1, 1, 1));
        assert_eq!(c.key_of(HttpToken(7)), Some((U1, 0)));
        assert_eq!(c.by_progress(U1, "gw-1-0"), Some((U1, 0)));
        let (key, _) = c.take_by_token(HttpToken(7)).expect("booked");
        assert_eq!(key, (U1, 0));
        assert_eq!((c.on_uplink(U1), c.in_session("s"), c.waiting()), (0, 0, 0));
        assert_eq!(c.by_progress(U1, "gw-1-0"), None);
        assert_eq!(c.poll_timeout(), None);
        assert!(c.take((U1, 0)).is_none(), "taken once");
    }

    /// Security review finding 5: a sled could name another sled's call in its progress.
    #[test]
    fn progress_counts_only_from_the_calls_own_uplink() {
        let t0 = t0();
        let mut c = Calls::default();
        c.start(
            (U1, 4),
            call(1, None, Some("gw-1-4"), t0 + Duration::from_secs(5)),
        );
        assert_eq!(c.by_progress(U2, "gw-1-4"), None);
        assert_eq!(c.by_progress(U1, "gw-1-4"), Some((U1, 4)));
    }

    #[test]
    fn deadlines_come_in_order_on_the_fake_clock_and_move_with_the_call() {
        let t0 = t0();
        let s = Duration::from_secs(1);
        let mut c = Calls::default();
        c.start((U1, 0), call(1, None, None, t0 + 10 * s));
        c.start(
            (U2, 0),
            Pending::Subscription {
                project: "beta".into(),
                deadline: t0 + 5 * s,
            },
        );
        assert_eq!(c.poll_timeout(), Some(t0 + 5 * s));
        assert!(c.take_expired(t0 + 4 * s).is_none());
        let (key, p) = c.take_expired(t0 + 5 * s).expect("due");
        assert_eq!(key, (U2, 0));
        assert!(matches!(p, Pending::Subscription { .. }));
        c.set_deadline((U1, 0), t0 + 20 * s);
        assert_eq!(c.poll_timeout(), Some(t0 + 20 * s));
        assert!(c.take_expired(t0 + 15 * s).is_none(), "moved past 10 s");
        assert!(c.take_expired(t0 + 20 * s).is_some());
        assert_eq!(c.poll_timeout(), None);
    }

    #[test]
    fn a_parked_call_waits_for_no_request_until_a_retry_attaches() {
        let t0 = t0();
        let mut c = Calls::default();
        c.start((U1, 2), call(3, None, None, t0 + Duration::from_secs(9)));
        c.detach((U1, 2));
        assert_eq!(c.waiting(), 0);
        assert!(c.take_by_token(HttpToken(3)).is_none());
        c.attach((U1, 2), HttpToken(8));
        assert_eq!(c.key_of(HttpToken(8)), Some((U1, 2)));
        assert_eq!(c.call((U1, 2)).map(|c| c.token), Some(HttpToken(8)));
        assert!(c.take_by_token(HttpToken(8)).is_some());
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn an_uplink_gone_takes_its_requests_in_the_order_sent_and_no_others() {
        let t0 = t0();
        let d = t0 + Duration::from_secs(30);
        let mut c = Calls::default();
        for id in [2, 0, 1] {
            c.start((U1, id), call(10 + id, Some("s"), None, d));
        }
        c.start((U2, 0), call(20, Some("s"), None, d));
        let gone: Vec<u64> = c.uplink_gone(U1).into_iter().map(|(id, _)| id).collect();
        assert_eq!(gone, [0, 1, 2]);
        assert_eq!((c.on_uplink(U1), c.on_uplink(U2)), (0, 1));
        assert_eq!(c.in_session("s"), 1);
        assert_eq!(c.key_of(HttpToken(20)), Some((U2, 0)));
    }
}
