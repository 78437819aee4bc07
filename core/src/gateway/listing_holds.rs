//! Writes held until their project's tools are listed.
//!
//! A sled that connects to a gateway which has never seen its tool list (a restart of the
//! gateway, say) cannot have its writes checked against its tools' lease annotations until that
//! list arrives. While the project has live leases, a `tools/call` of a tool not yet listed is
//! therefore held here instead of being sent unchecked, and served again (the whole HTTP request,
//! from the top) as soon as one of these happens:
//!
//! - the project's tools are listed ([`ListingHolds::release`]);
//! - its sled goes away (served again, the request is answered `sled_not_connected`);
//! - the gateway shuts down (every uplink goes, so the same).
//!
//! A held request ends without being served again when its deadline passes (the hold's bound,
//! or the call's own deadline if sooner: it is answered with the reply built when it was held,
//! a `tools_pending` refusal), when its client goes away ([`ListingHolds::abort`]), or when its
//! session cancels it ([`ListingHolds::cancel`]).
//!
//! Rules: a token is held at most once; every held request leaves exactly once, by one of the
//! doors above; [`ListingHolds::poll_timeout`] is the earliest deadline of those still held.

use std::collections::BTreeMap;
// The gateway's side: holding a request, and serving held requests again.
impl Gateway {
    /// Holds a write until `project`'s tools are listed, for at most [`crate::Config::listing_hold`]
    /// or the call's own timeout; at that deadline it is refused `tools_pending`, with the
    /// HTTP status of the request's era (`modern`) (`listing_holds.rs`).
    pub(super) fn hold_for_listing(
        &mut self,
        now: Instant,
        token: HttpToken,
        request: HttpRequest,
        id: &RawId,
        project: String,
        modern: bool,
    ) {
        let refusal = RpcError::ToolsPending {
            sled: self.sled_of(&project),
            project: project.clone(),
            retry_after: self.config.retry_after,
        };
        let status = if modern {
            headers::modern_status(refusal.code())
        } else {
            200
        };
        let bound = self
            .registry
            .get(&project)
            .map_or(self.config.listing_hold, |(_, spec)| {
                spec.call_timeout.min(self.config.listing_hold)
            });
        tracing::debug!(
            token = token.0,
            project,
            "held until the project's tools are listed"
        );
        let held = Held {
            token,
            session: request.session.clone(),
            id: id.as_str().to_owned(),
            until: now + bound,
            expired: HttpReply {
                status,
                headers: Vec::new(),
                body: Some(refusal.response(Some(id.as_str()))),
            },
            request,
        };
        self.listing_holds.hold(&project, held);
    }

    /// Serves again the requests held for `project`'s tools: they are listed, or its sled went
    /// away (then they are answered as for any call without a sled). They are handled again
    /// from the top once the event that released them is over ([`Gateway::settle`]).
    pub(super) fn release_listing_holds(&mut self, project: &str) {
        self.again.extend(self.listing_holds.release(project));
    }

    /// Held requests whose project's tools did not come in time are refused `tools_pending`.
    pub(super) fn listing_holds_timeout(&mut self, now: Instant) {
        for (token, reply) in self.listing_holds.expired(now) {
            tracing::debug!(
                token = token.0,
                "held past the listing's deadline: tools_pending"
            );
            self.outputs.push_back(Output::Http { token, reply });
        }
    }
}

#[cfg(test)]
use std::collections::BTreeSet;
use std::time::Instant;

use super::{Gateway, HttpReply, HttpRequest, HttpToken, Output, RawId, RpcError};
use crate::http as headers;

/// One held request.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) token: HttpToken,
    pub(super) request: HttpRequest,
    /// Its session, if any, and its JSON-RPC id (raw text): what a cancellation names.
    pub(super) session: Option<String>,
    pub(super) id: String,
    /// When it is answered with `expired` if its project's tools are still not listed.
    pub(super) until: Instant,
    /// The answer at the deadline.
    pub(super) expired: HttpReply,
}

/// The requests held per project, with their deadlines.
#[derive(Debug, Default)]
pub(super) struct ListingHolds {
    by_project: BTreeMap<String, Vec<Held>>,
    /// (deadline, token) → project.
    deadlines: BTreeMap<(Instant, HttpToken), String>,
}

impl ListingHolds {
    /// Holds `held` for `project` (a token already held is replaced: it is one request).
    pub(super) fn hold(&mut self, project: &str, held: Held) {
        self.abort(held.token);
        self.deadlines
            .insert((held.until, held.token), project.to_owned());
        self.by_project
            .entry(project.to_owned())
            .or_default()
            .push(held);
    }

    /// The requests held for `project`, in the order they came, to be served again.
    pub(super) fn release(&mut self, project: &str) -> Vec<(HttpToken, HttpRequest)> {
        let held = self.by_project.remove(project).unwrap_or_default();
        held.into_iter()
            .map(|h| {
                self.deadlines.remove(&(h.until, h.token));
                (h.token, h.request)
            })
            .collect()
    }

    /// The client of `token` went away; `true` when it was held.
    pub(super) fn abort(&mut self, token: HttpToken) -> bool {
        self.take(|h| h.token == token).is_some()
    }

    /// `session` cancelled its request `id`: the held request, if it is one, leaves with its
    /// project (for the answer).
    pub(super) fn cancel(&mut self, session: &str, id: &str) -> Option<(String, Held)> {
        self.take(|h| h.session.as_deref() == Some(session) && h.id == id)
    }

    /// The held requests whose deadline is at or before `now`, with their answers.
    pub(super) fn expired(&mut self, now: Instant) -> Vec<(HttpToken, HttpReply)> {
        let mut out = Vec::new();
        while let Some((&(at, token), _)) = self.deadlines.first_key_value() {
            if at > now {
                break;
            }
            if let Some((_, held)) = self.take(|h| h.token == token) {
                out.push((held.token, held.expired));
            }
        }
        out
    }

    /// The earliest deadline of a held request.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first_key_value().map(|(&(at, _), _)| at)
    }

    /// How many requests are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.deadlines.len()
    }

    /// The projects with held requests.
    #[cfg(test)]
    fn projects(&self) -> BTreeSet<&str> {
        self.by_project.keys().map(String::as_str).collect()
    }

    fn take(&mut self, found: impl Fn(&Held) -> bool) -> Option<(String, Held)> {
        let (project, i) = self
            .by_project
            .iter()
            .find_map(|(p, hs)| hs.iter().position(&found).map(|i| (p.clone(), i)))?;
        let list = self.by_project.get_mut(&project)?;
        let held = list.remove(i);
        if list.is_empty() {
            self.by_project.remove(&project);
        }
        self.deadlines.remove(&(held.until, held.token));
        Some((project, held))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The fake clock's origin: only differences of instants matter.
    #[allow(clippy::disallowed_methods)]
    fn t0() -> Instant {
        Instant::now()
    }

    fn request() -> HttpRequest {
        HttpRequest {
            body: b"{}".to_vec(),
            ..HttpRequest::default()
        }
    }

    fn held(token: u64, session: Option<&str>, id: &str, until: Instant) -> Held {
        Held {
            token: HttpToken(token),
            request: request(),
            session: session.map(str::to_owned),
            id: id.to_owned(),
            until,
            expired: HttpReply {
                status: 200,
                headers: Vec::new(),
                body: Some(format!("expired {token}")),
            },
        }
    }

    #[test]
    fn a_listing_releases_its_project_in_order_and_nothing_else() {
        let t0 = t0();
        let mut h = ListingHolds::default();
        let until = t0 + Duration::from_secs(1);
        h.hold("alpha", held(1, Some("s"), "1", until));
        h.hold("beta", held(2, Some("s"), "2", until));
        h.hold("alpha", held(3, None, "3", until));
        let released: Vec<u64> = h.release("alpha").iter().map(|(t, _)| t.0).collect();
        assert_eq!(released, [1, 3]);
        assert_eq!(h.projects(), BTreeSet::from(["beta"]));
        assert_eq!(h.len(), 1);
        assert_eq!(h.poll_timeout(), Some(until));
        assert!(h.release("alpha").is_empty(), "released once");
    }

    #[test]
    fn deadlines_answer_with_the_reply_built_when_held() {
        let t0 = t0();
        let mut h = ListingHolds::default();
        h.hold("alpha", held(1, None, "1", t0 + Duration::from_millis(300)));
        h.hold(
            "alpha",
            held(2, None, "2", t0 + Duration::from_millis(1000)),
        );
        assert_eq!(h.poll_timeout(), Some(t0 + Duration::from_millis(300)));
        assert!(h.expired(t0 + Duration::from_millis(299)).is_empty());
        let first = h.expired(t0 + Duration::from_millis(300));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].0, HttpToken(1));
        assert_eq!(first[0].1.body.as_deref(), Some("expired 1"));
        assert_eq!(h.poll_timeout(), Some(t0 + Duration::from_millis(1000)));
        let second = h.expired(t0 + Duration::from_secs(5));
        assert_eq!(second.len(), 1);
        assert_eq!(h.poll_timeout(), None);
        assert!(
            h.release("alpha").is_empty(),
            "an expired request is not served again"
        );
    }

    #[test]
    fn an_aborted_or_cancelled_request_leaves_once() {
        let t0 = t0();
        let until = t0 + Duration::from_secs(1);
        let mut h = ListingHolds::default();
        h.hold("alpha", held(1, Some("s1"), "7", until));
        h.hold("alpha", held(2, Some("s2"), "7", until));
        h.hold("alpha", held(3, None, "7", until));
        assert!(h.cancel("s3", "7").is_none(), "another session's id");
        let (project, c) = h.cancel("s2", "7").expect("s2's request 7");
        assert_eq!((project.as_str(), c.token), ("alpha", HttpToken(2)));
        assert!(h.cancel("s2", "7").is_none());
        assert!(h.abort(HttpToken(1)));
        assert!(!h.abort(HttpToken(1)));
        assert_eq!(h.len(), 1);
        assert_eq!(h.expired(until).len(), 1);
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn a_token_held_again_is_one_request() {
        let t0 = t0();
        let mut h = ListingHolds::default();
        h.hold("alpha", held(1, None, "1", t0 + Duration::from_secs(1)));
        h.hold("alpha", held(1, None, "1", t0 + Duration::from_secs(2)));
        assert_eq!(h.len(), 1);
        assert_eq!(h.poll_timeout(), Some(t0 + Duration::from_secs(2)));
    }
}
