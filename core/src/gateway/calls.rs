//! The call table (issue 23, step 4): every request the gateway sent up an uplink and has not
//! seen answered, with the indexes kept beside it. Nothing else inserts into or removes from
//! them, so they cannot drift apart:
//! - by the gateway's id for the request (the key, unique over the gateway's life, and the id
//!   the sled sees), with the uplink now serving it: a sled's frame names a request only on
//!   that uplink;
//! - by the HTTP request waiting for a client's call (`by_token`);
//! - by the gateway's progress token of a call that asked for progress, valid only for
//!   progress coming up the call's own uplink (security review, finding 5);
//! - the calls in flight per session, per identity and per uplink (the limits);
//! - a sled's requests to the client of a call (sampling, elicitation, roots), by the
//!   gateway's id for them: each lives as long as its call, at most [`MAX_ASKS_PER_CALL`] of
//!   them at once (security review finding 16);
//! - the deadlines, in order (`poll_timeout`, `take_expired`).
//!
//! A call's deadline and its HTTP request change only through [`Calls::set_deadline`],
//! [`Calls::attach`] and [`Calls::detach`]; everything else about an entry may be changed in
//! place ([`Calls::call_mut`]).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::{Call, HttpToken, Pending, UplinkId};

/// The most requests a sled may have waiting for the client of one call; past it the sled's
/// next request is refused at once. So the table of them is bounded by the calls in flight.
pub(super) const MAX_ASKS_PER_CALL: usize = 16;

/// A sled's request to the client of one of its calls, waiting for the client's answer.
#[derive(Debug)]
pub(super) struct ServerRequest {
    pub(super) uplink: UplinkId,
    /// The sled's id for it, as the sled wrote it.
    pub(super) sled_id: Box<str>,
    /// The session it was sent to (the answer must come from there).
    pub(super) session: Option<String>,
}

/// The gateway's id for a request it sent up an uplink: unique over the gateway's life, and
/// the JSON-RPC id the sled sees. A frame from a sled names a request only together with the
/// uplink it came up: an entry answers to the uplink now serving it, and no other.
pub(super) type CallId = u64;

#[derive(Debug, Default)]
pub(super) struct Calls {
    next_id: CallId,
    pending: HashMap<CallId, (UplinkId, Pending)>,
    by_token: HashMap<HttpToken, CallId>,
    by_progress: HashMap<String, CallId>,
    per_session: HashMap<String, usize>,
    per_owner: HashMap<Box<str>, usize>,
    per_uplink: HashMap<UplinkId, BTreeSet<CallId>>,
    deadlines: BTreeSet<(Instant, CallId)>,
    /// Sleds' requests relayed to clients, by the gateway's id for them (raw JSON text), with
    /// the call they belong to; and those ids by call.
    asked: HashMap<String, (CallId, ServerRequest)>,
    asked_by_call: HashMap<CallId, Vec<String>>,
}

impl Calls {
    /// The id for the next request.
    pub(super) fn next_id(&mut self) -> CallId {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Whether `id` was ever given out (an answer to it is late, not made up).
    pub(super) fn was_sent(&self, id: CallId) -> bool {
        id < self.next_id
    }

    /// Books a request sent up `uplink` under `id`. An entry already under that id (only a
    /// planted bug reuses ids) is displaced and returned.
    pub(super) fn start(
        &mut self,
        uplink: UplinkId,
        id: CallId,
        pending: Pending,
    ) -> Option<Pending> {
        let displaced = self.take(id).map(|(_, p)| p);
        self.next_id = self.next_id.max(id.saturating_add(1));
        self.deadlines.insert((pending.deadline(), id));
        self.per_uplink.entry(uplink).or_default().insert(id);
        if let Pending::Call(call) = &pending {
            self.by_token.insert(call.token, id);
            if let Some((gateway_token, _)) = &call.progress {
                self.by_progress.insert(gateway_token.clone(), id);
            }
            if let Some(s) = &call.session {
                *self.per_session.entry(s.clone()).or_insert(0) += 1;
            }
            if let Some(o) = &call.owner {
                *self.per_owner.entry(o.clone()).or_insert(0) += 1;
            }
        }
        self.pending.insert(id, (uplink, pending));
        displaced
    }

    /// Takes a request out of the table and every index: it was answered, expired, cancelled,
    /// or its client went away. Returns the uplink that served it, with it.
    pub(super) fn take(&mut self, id: CallId) -> Option<(UplinkId, Pending)> {
        let (uplink, pending) = self.pending.remove(&id)?;
        self.deadlines.remove(&(pending.deadline(), id));
        if let Some(ids) = self.per_uplink.get_mut(&uplink) {
            ids.remove(&id);
            if ids.is_empty() {
                self.per_uplink.remove(&uplink);
            }
        }
        for asked in self.asked_by_call.remove(&id).unwrap_or_default() {
            self.asked.remove(&asked);
        }
        if let Pending::Call(call) = &pending {
            if self.by_token.get(&call.token) == Some(&id) {
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
            if let Some(o) = &call.owner {
                if let Some(n) = self.per_owner.get_mut(o) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_owner.remove(o);
                    }
                }
            }
        }
        Some((uplink, pending))
    }

    /// Takes the request `id` answered by a frame up `uplink`: only if that uplink serves it.
    pub(super) fn take_on(&mut self, uplink: UplinkId, id: CallId) -> Option<Pending> {
        if self.uplink_of(id) != Some(uplink) {
            return None;
        }
        self.take(id).map(|(_, p)| p)
    }

    /// Takes the call the HTTP request `token` waits for.
    pub(super) fn take_by_token(
        &mut self,
        token: HttpToken,
    ) -> Option<(CallId, UplinkId, Pending)> {
        let id = *self.by_token.get(&token)?;
        self.take(id).map(|(uplink, p)| (id, uplink, p))
    }

    /// Takes the first request whose deadline is at or before `now`.
    pub(super) fn take_expired(&mut self, now: Instant) -> Option<(CallId, UplinkId, Pending)> {
        let &(at, id) = self.deadlines.first()?;
        if at > now {
            return None;
        }
        self.take(id).map(|(uplink, p)| (id, uplink, p))
    }

    /// Takes every request of an uplink that went away, in the order they were sent.
    pub(super) fn uplink_gone(&mut self, uplink: UplinkId) -> Vec<(CallId, Pending)> {
        let ids = self.per_uplink.get(&uplink).cloned().unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| self.take(id).map(|(_, p)| (id, p)))
            .collect()
    }

    /// The earliest deadline.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// The uplink serving request `id`.
    pub(super) fn uplink_of(&self, id: CallId) -> Option<UplinkId> {
        self.pending.get(&id).map(|(u, _)| *u)
    }

    /// The client's call `id`, if that is what it is.
    pub(super) fn call(&self, id: CallId) -> Option<&Call> {
        match self.pending.get(&id) {
            Some((_, Pending::Call(call))) => Some(call),
            _ => None,
        }
    }

    /// The client's call `id` as a frame up `uplink` names it: only if that uplink serves it.
    pub(super) fn call_on(&self, uplink: UplinkId, id: CallId) -> Option<&Call> {
        self.call(id).filter(|_| self.uplink_of(id) == Some(uplink))
    }

    /// The client's call `id`, to change in place (not its deadline or token).
    pub(super) fn call_mut(&mut self, id: CallId) -> Option<&mut Call> {
        match self.pending.get_mut(&id) {
            Some((_, Pending::Call(call))) => Some(call),
            _ => None,
        }
    }

    /// The call the HTTP request `token` waits for.
    pub(super) fn key_of(&self, token: HttpToken) -> Option<CallId> {
        self.by_token.get(&token).copied()
    }

    /// The call that gave `gateway_token` to the sled on `uplink`: progress from another
    /// uplink names nothing.
    pub(super) fn by_progress(&self, uplink: UplinkId, gateway_token: &str) -> Option<CallId> {
        self.by_progress
            .get(gateway_token)
            .copied()
            .filter(|id| self.uplink_of(*id) == Some(uplink))
    }

    /// Moves a request's deadline.
    pub(super) fn set_deadline(&mut self, id: CallId, deadline: Instant) {
        let Some((_, Pending::Call(call))) = self.pending.get_mut(&id) else {
            return;
        };
        self.deadlines.remove(&(call.deadline, id));
        call.deadline = deadline;
        self.deadlines.insert((deadline, id));
    }

    /// A call's HTTP request was answered while the call goes on (a parked stateless call):
    /// no request waits for it until [`Calls::attach`].
    pub(super) fn detach(&mut self, id: CallId) {
        if let Some(call) = self.call(id) {
            let token = call.token;
            if self.by_token.get(&token) == Some(&id) {
                self.by_token.remove(&token);
            }
        }
    }

    /// The HTTP request `token` now waits for the call `id` (a stateless retry).
    pub(super) fn attach(&mut self, id: CallId, token: HttpToken) {
        self.detach(id);
        if let Some(call) = self.call_mut(id) {
            call.token = token;
            self.by_token.insert(token, id);
        }
    }

    /// The latest client's call with the id `client_id` in `session` (in any session: `None`).
    pub(super) fn latest_with_client_id(
        &self,
        session: Option<&str>,
        client_id: &str,
    ) -> Option<CallId> {
        self.pending
            .iter()
            .filter_map(|(id, (_, p))| match p {
                Pending::Call(c)
                    if session.is_none_or(|s| c.session.as_deref() == Some(s))
                        && c.client_id.as_str() == client_id =>
                {
                    Some((c.sent_at, *id))
                }
                _ => None,
            })
            .max()
            .map(|(_, id)| id)
    }

    /// Requests in flight on `uplink`.
    pub(super) fn on_uplink(&self, uplink: UplinkId) -> usize {
        self.per_uplink.get(&uplink).map_or(0, BTreeSet::len)
    }

    /// Calls in flight for `session`.
    pub(super) fn in_session(&self, session: &str) -> usize {
        self.per_session.get(session).copied().unwrap_or(0)
    }

    /// Books a sled's request `gateway_id` to the client of call `id`: `false` (nothing
    /// booked) when the call is not a pending client's call, or already has
    /// [`MAX_ASKS_PER_CALL`] requests waiting.
    pub(super) fn ask(&mut self, id: CallId, gateway_id: String, request: ServerRequest) -> bool {
        if self.call(id).is_none() {
            return false;
        }
        let of_call = self.asked_by_call.entry(id).or_default();
        if of_call.len() >= MAX_ASKS_PER_CALL {
            return false;
        }
        of_call.push(gateway_id.clone());
        self.asked.insert(gateway_id, (id, request));
        true
    }

    /// The sled's request the gateway relayed under `gateway_id`, while its call lasts.
    pub(super) fn asked(&self, gateway_id: &str) -> Option<&ServerRequest> {
        self.asked.get(gateway_id).map(|(_, r)| r)
    }

    /// Takes the sled's request `gateway_id` (its client answered).
    pub(super) fn take_asked(&mut self, gateway_id: &str) -> Option<ServerRequest> {
        let (id, request) = self.asked.remove(gateway_id)?;
        if let Some(of_call) = self.asked_by_call.get_mut(&id) {
            of_call.retain(|g| g != gateway_id);
            if of_call.is_empty() {
                self.asked_by_call.remove(&id);
            }
        }
        Some(request)
    }

    /// Sleds' requests waiting for a client's answer.
    #[cfg(test)]
    pub(super) fn asked_len(&self) -> usize {
        self.asked.len()
    }

    /// Calls in flight for the identity `owner` ([`crate::Identity::session_owner`]).
    pub(super) fn of_owner(&self, owner: &str) -> usize {
        self.per_owner.get(owner).copied().unwrap_or(0)
    }

    /// Calls with an HTTP request waiting for them.
    pub(super) fn waiting(&self) -> usize {
        self.by_token.len()
    }

    /// Every client's call, for the planted bugs that look across calls.
    #[cfg(feature = "planted-bugs")]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&CallId, &Pending)> {
        self.pending.iter().map(|(id, (_, p))| (id, p))
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
            owner: Some("client alice".into()),
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
        let id = c.next_id();
        c.start(
            U1,
            id,
            call(7, Some("s"), Some("gw-1-0"), t0 + Duration::from_secs(30)),
        );
        assert_eq!((c.on_uplink(U1), c.in_session("s"), c.waiting()), (1, 1, 1));
        assert_eq!(c.of_owner("client alice"), 1);
        assert_eq!(c.key_of(HttpToken(7)), Some(id));
        assert_eq!(c.by_progress(U1, "gw-1-0"), Some(id));
        let (taken, uplink, _) = c.take_by_token(HttpToken(7)).expect("booked");
        assert_eq!((taken, uplink), (id, U1));
        assert_eq!((c.on_uplink(U1), c.in_session("s"), c.waiting()), (0, 0, 0));
        assert_eq!(c.of_owner("client alice"), 0);
        assert_eq!(c.by_progress(U1, "gw-1-0"), None);
        assert_eq!(c.poll_timeout(), None);
        assert!(c.take(id).is_none(), "taken once");
        assert!(c.was_sent(id) && !c.was_sent(id + 1));
    }

    /// Security review finding 5: a sled could name another sled's call in its progress; the
    /// same holds for an answer, or a notification about a call.
    #[test]
    fn a_sled_names_only_the_calls_on_its_own_uplink() {
        let t0 = t0();
        let mut c = Calls::default();
        let id = c.next_id();
        c.start(
            U1,
            id,
            call(1, None, Some("gw-1-4"), t0 + Duration::from_secs(5)),
        );
        assert_eq!(c.by_progress(U2, "gw-1-4"), None);
        assert_eq!(c.by_progress(U1, "gw-1-4"), Some(id));
        assert!(c.call_on(U2, id).is_none());
        assert!(
            c.take_on(U2, id).is_none(),
            "another sled's answer takes nothing"
        );
        assert!(c.call_on(U1, id).is_some());
        assert!(c.take_on(U1, id).is_some());
    }

    /// Security review finding 16: a sled's requests to a call's client die with the call,
    /// and one call holds at most [`MAX_ASKS_PER_CALL`] of them.
    #[test]
    fn a_sleds_requests_to_a_client_live_as_long_as_their_call() {
        let t0 = t0();
        let mut c = Calls::default();
        let id = c.next_id();
        c.start(
            U1,
            id,
            call(1, Some("s"), None, t0 + Duration::from_secs(5)),
        );
        let ask = |n: usize| ServerRequest {
            uplink: U1,
            sled_id: format!("{n}").into(),
            session: Some("s".into()),
        };
        for n in 0..MAX_ASKS_PER_CALL + 5 {
            let booked = c.ask(id, format!("\"gw-req-{n}\""), ask(n));
            assert_eq!(booked, n < MAX_ASKS_PER_CALL, "{n}");
        }
        assert_eq!(c.asked_len(), MAX_ASKS_PER_CALL);
        assert!(
            !c.ask(id + 1, "\"gw-req-x\"".into(), ask(99)),
            "no such call"
        );
        assert_eq!(
            c.take_asked("\"gw-req-0\"").map(|r| r.sled_id),
            Some("0".into())
        );
        assert!(c.asked("\"gw-req-0\"").is_none());
        assert!(c.asked("\"gw-req-1\"").is_some());
        c.take(id);
        assert_eq!(c.asked_len(), 0, "gone with the call");
        assert!(c.asked_by_call.is_empty());
    }

    #[test]
    fn deadlines_come_in_order_on_the_fake_clock_and_move_with_the_call() {
        let t0 = t0();
        let s = Duration::from_secs(1);
        let mut c = Calls::default();
        let (a, b) = (c.next_id(), c.next_id());
        c.start(U1, a, call(1, None, None, t0 + 10 * s));
        c.start(
            U2,
            b,
            Pending::Subscription {
                project: "beta".into(),
                deadline: t0 + 5 * s,
            },
        );
        assert_eq!(c.poll_timeout(), Some(t0 + 5 * s));
        assert!(c.take_expired(t0 + 4 * s).is_none());
        let (id, uplink, p) = c.take_expired(t0 + 5 * s).expect("due");
        assert_eq!((id, uplink), (b, U2));
        assert!(matches!(p, Pending::Subscription { .. }));
        c.set_deadline(a, t0 + 20 * s);
        assert_eq!(c.poll_timeout(), Some(t0 + 20 * s));
        assert!(c.take_expired(t0 + 15 * s).is_none(), "moved past 10 s");
        assert!(c.take_expired(t0 + 20 * s).is_some());
        assert_eq!(c.poll_timeout(), None);
    }

    #[test]
    fn a_parked_call_waits_for_no_request_until_a_retry_attaches() {
        let t0 = t0();
        let mut c = Calls::default();
        let id = c.next_id();
        c.start(U1, id, call(3, None, None, t0 + Duration::from_secs(9)));
        c.detach(id);
        assert_eq!(c.waiting(), 0);
        assert!(c.take_by_token(HttpToken(3)).is_none());
        c.attach(id, HttpToken(8));
        assert_eq!(c.key_of(HttpToken(8)), Some(id));
        assert_eq!(c.call(id).map(|c| c.token), Some(HttpToken(8)));
        assert!(c.take_by_token(HttpToken(8)).is_some());
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn an_uplink_gone_takes_its_requests_in_the_order_sent_and_no_others() {
        let t0 = t0();
        let d = t0 + Duration::from_secs(30);
        let mut c = Calls::default();
        let ids: Vec<CallId> = (0..4).map(|_| c.next_id()).collect();
        for (i, id) in ids.iter().take(3).enumerate() {
            c.start(U1, *id, call(10 + i as u64, Some("s"), None, d));
        }
        c.start(U2, ids[3], call(20, Some("s"), None, d));
        let gone: Vec<CallId> = c.uplink_gone(U1).into_iter().map(|(id, _)| id).collect();
        assert_eq!(gone, ids[..3]);
        assert_eq!((c.on_uplink(U1), c.on_uplink(U2)), (0, 1));
        assert_eq!(c.in_session("s"), 1);
        assert_eq!(c.key_of(HttpToken(20)), Some(ids[3]));
    }
}
