//! Answers for the whole cluster (issue 15): the requests a replica makes of the others on its
//! own account, to answer `aggregate_pipeline_status` and `gateway_health` for every project
//! wherever its sled is, and a `wait` in projects held by several replicas.
//!
//! A part asked of another replica is an ordinary relayed request ([`ClusterAction::Relay`]),
//! made here rather than by a client: a `tools/call` with the caller's credentials, marked
//! relayed (so the other replica answers for its own sleds only and never relays it on), under
//! a token of the range no driver gives out ([`INTERNAL`]). Its answer comes back as
//! [`ClusterEvent::Relayed`] or [`ClusterEvent::RelayFailed`] like any relay's, and goes to the
//! tool call that asked for it instead of to a client.
//!
//! [`Gathers`] is the state: which internal relay is for what, and by when each must have
//! answered. It decides nothing about the tools' results; `gateway/gather.rs` does.
//!
//! [`ClusterAction::Relay`]: crate::cluster::ClusterAction::Relay
//! [`ClusterEvent::Relayed`]: crate::cluster::ClusterEvent::Relayed
//! [`ClusterEvent::RelayFailed`]: crate::cluster::ClusterEvent::RelayFailed

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::auth::AccessToken;
use crate::cluster::RelayMessage;
use crate::io::{HttpMethod, HttpRequest, HttpToken};

/// Tokens of internal relays have this bit set; drivers count theirs up from zero.
pub(crate) const INTERNAL: u64 = 1 << 63;

/// What an internal relay asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// One project's `pipeline_status`, a part of the `aggregate_pipeline_status` `fanout`.
    Pipeline {
        fanout: u64,
        project: String,
        replica: String,
        sent_at: Instant,
    },
    /// The `gateway_health` rows of the projects `replica` holds, for gather `gather`.
    Health { gather: u64, replica: String },
    /// A `wait` in the projects another replica holds, for the client's wait `wait` (a
    /// coordination `WaitToken`'s number) parked here.
    Wait { wait: u64 },
}

/// A client's `wait` whose projects are held by several replicas: parked here (with a
/// waiter of its own for the projects held here, if any), with a part at each other holder.
/// The first part to wake answers it; when every part ends without waking and there is no
/// waiter here, the first part's error, or a timeout, does.
#[derive(Debug, Default)]
pub(crate) struct WaitGather {
    /// How many parts are still open.
    pub(crate) parts: usize,
    /// A waiter here for the projects this replica holds.
    pub(crate) local: bool,
    /// The first error a part answered (a JSON-RPC error object), for when nothing else
    /// answers.
    pub(crate) error: Option<Box<RawValue>>,
}

/// Who the request being served comes from, which the parts it needs are made with: the
/// other replica answers what the caller may see, no more. They travel in the request
/// context, never in the gateway's state. They hold no credential.
#[derive(Debug, Clone, Default)]
pub(crate) struct Credentials {
    access_token: AccessToken,
    origin: Option<String>,
}

impl Credentials {
    /// Who `request` comes from, as the replicas asked for parts are told: the caller it was
    /// let in as ([`AccessToken::Relayed`]), never its `Authorization` header.
    pub(crate) fn of(request: &HttpRequest) -> Credentials {
        Credentials {
            access_token: request.access_token.clone(),
            origin: request.origin.clone(),
        }
    }
}

/// A relayed part's answer, as far as the caller of the part cares.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The JSON-RPC response's `result` or `error` (exactly one is `Some`).
    Response {
        result: Option<Box<RawValue>>,
        error: Option<Box<RawValue>>,
    },
    /// No response came: why, for the caller's answer.
    Failed(String),
}

/// A `gateway_health` or `fleet_identity` call waiting for the rows of the projects other
/// replicas hold.
#[derive(Debug)]
pub(crate) struct HealthGather {
    /// Which of the two tools.
    pub(crate) tool: &'static str,
    /// The client's request, and its JSON-RPC id as written.
    pub(crate) token: HttpToken,
    pub(crate) client_id: String,
    pub(crate) modern: bool,
    /// The answer so far: this replica's own, whose rows the other replicas' replace.
    pub(crate) result: serde_json::Value,
    /// The replicas not heard from yet, each with the projects it holds (as this replica's
    /// directory says).
    pub(crate) waiting: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Default)]
pub(crate) struct Gathers {
    next_token: u64,
    next_gather: u64,
    parts: HashMap<HttpToken, (Purpose, Instant)>,
    deadlines: BTreeSet<(Instant, HttpToken)>,
    /// `gateway_health` calls waiting for other replicas, by gather number.
    pub(crate) health: BTreeMap<u64, HealthGather>,
    /// `wait`s spread over replicas, by their wait token's number.
    pub(crate) waits: BTreeMap<u64, WaitGather>,
}

impl Gathers {
    /// Whether `token` is an internal relay's (whether or not it is still open).
    pub(crate) fn is_internal(token: HttpToken) -> bool {
        token.0 & INTERNAL != 0
    }

    /// A number for a new gather (a call waiting for several parts).
    pub(crate) fn new_gather(&mut self) -> u64 {
        self.next_gather += 1;
        self.next_gather
    }

    /// A new part: the token to relay it under and the request to relay, a sessionless
    /// `tools/call` of `tool` with `arguments` (a JSON object) and the caller's credentials
    /// `c`. The part must be answered by `deadline`; [`Gathers::expired`] gives it up after.
    pub(crate) fn start(
        &mut self,
        purpose: Purpose,
        deadline: Instant,
        tool: &str,
        arguments: serde_json::Value,
        c: &Credentials,
    ) -> (HttpToken, HttpRequest) {
        self.next_token += 1;
        let token = HttpToken(INTERNAL | self.next_token);
        self.parts.insert(token, (purpose, deadline));
        self.deadlines.insert((deadline, token));
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": { "name": tool, "arguments": arguments },
        });
        let request = HttpRequest {
            method: HttpMethod::Post,
            session: None,
            content_type: Some("application/json".into()),
            // One JSON answer: no stream is asked for.
            accept: Some("application/json".into()),
            protocol_version: None,
            origin: c.origin.clone(),
            last_event_id: None,
            mcp_method: None,
            mcp_name: None,
            mcp_param_project: None,
            relayed: true,
            authorization: None,
            access_token: c.access_token.clone(),
            body: body.to_string().into_bytes(),
        };
        (token, request)
    }

    /// The part's purpose, if it is still open, and what a message of its relay says: `None`
    /// while there is no answer yet (a stream opened, an event that is no response).
    pub(crate) fn on_message(
        &mut self,
        token: HttpToken,
        message: RelayMessage,
    ) -> Option<(Purpose, Answer)> {
        let answer = match message {
            RelayMessage::Reply(reply) => match reply.body.as_deref().and_then(response_of) {
                Some(a) => a,
                None => Answer::Failed(format!(
                    "the replica's answer was HTTP {} without a JSON-RPC response",
                    reply.status
                )),
            },
            RelayMessage::Open => return None,
            RelayMessage::Event { data, .. } => response_of(&data)?,
            RelayMessage::Close => {
                Answer::Failed("the replica's stream ended without a response".into())
            }
        };
        Some((self.take(token)?, answer))
    }

    /// Forgets an open part, returning what it was for.
    pub(crate) fn take(&mut self, token: HttpToken) -> Option<Purpose> {
        let (purpose, deadline) = self.parts.remove(&token)?;
        self.deadlines.remove(&(deadline, token));
        Some(purpose)
    }

    /// The parts for `gather` or `fanout` still open (to give up with it).
    pub(crate) fn open_parts(&self, of: impl Fn(&Purpose) -> bool) -> Vec<HttpToken> {
        let mut tokens: Vec<HttpToken> = self
            .parts
            .iter()
            .filter(|(_, (p, _))| of(p))
            .map(|(t, _)| *t)
            .collect();
        tokens.sort_by_key(|t| t.0);
        tokens
    }

    /// The earliest deadline of an open part.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// The parts whose deadline is `now` or earlier, forgotten, earliest first.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<(HttpToken, Purpose)> {
        let mut out = Vec::new();
        while let Some(&(at, token)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some((purpose, _)) = self.parts.remove(&token) {
                out.push((token, purpose));
            }
        }
        out
    }
}

/// A JSON-RPC response in `text`, as an [`Answer`]; `None` when `text` is none.
fn response_of(text: &str) -> Option<Answer> {
    #[derive(Deserialize)]
    struct Response {
        #[serde(default)]
        result: Option<Box<RawValue>>,
        #[serde(default)]
        error: Option<Box<RawValue>>,
    }
    let r: Response = serde_json::from_str(text).ok()?;
    match (r.result, r.error) {
        (Some(result), None) => Some(Answer::Response {
            result: Some(result),
            error: None,
        }),
        (None, Some(error)) => Some(Answer::Response {
            result: None,
            error: Some(error),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::io::HttpReply;

    /// The fake clock's origin: the one real reading, made once per test.
    #[allow(clippy::disallowed_methods)]
    fn t0() -> Instant {
        Instant::now()
    }

    fn health(gather: u64) -> Purpose {
        Purpose::Health {
            gather,
            replica: "r2".into(),
        }
    }

    #[test]
    fn parts_are_relayed_under_internal_tokens_with_the_callers_credentials() {
        let mut g = Gathers::default();
        let now = t0();
        let req = HttpRequest {
            method: HttpMethod::Post,
            session: Some("s".into()),
            content_type: None,
            accept: None,
            protocol_version: None,
            origin: None,
            last_event_id: None,
            mcp_method: None,
            mcp_name: None,
            mcp_param_project: None,
            relayed: false,
            authorization: None,
            access_token: AccessToken::Relayed(crate::auth::Caller::ClientToken {
                owner: "ops".into(),
            }),
            body: Vec::new(),
        };
        let c = Credentials::of(&req);
        let (t1, r1) = g.start(health(1), now, "gateway_health", serde_json::json!({}), &c);
        let (t2, _) = g.start(health(1), now, "gateway_health", serde_json::json!({}), &c);
        assert!(Gathers::is_internal(t1) && Gathers::is_internal(t2) && t1 != t2);
        assert!(!Gathers::is_internal(HttpToken(7)));
        assert!(r1.relayed);
        assert_eq!(r1.session, None, "a part needs no session");
        assert_eq!(r1.authorization, None, "no credential crosses the cluster");
        assert_eq!(r1.access_token, req.access_token);
        let body: serde_json::Value = serde_json::from_slice(&r1.body).unwrap();
        assert_eq!(body["params"]["name"], "gateway_health");
    }

    #[test]
    fn a_part_ends_once_by_its_answer_or_its_deadline() {
        let mut g = Gathers::default();
        let start = t0();
        let (a, _) = g.start(
            health(1),
            start + Duration::from_secs(2),
            "t",
            serde_json::json!({}),
            &Credentials::default(),
        );
        let (b, _) = g.start(
            health(1),
            start + Duration::from_secs(1),
            "t",
            serde_json::json!({}),
            &Credentials::default(),
        );
        assert_eq!(g.poll_timeout(), Some(start + Duration::from_secs(1)));
        let reply = HttpReply {
            status: 200,
            headers: Vec::new(),
            body: Some(r#"{"jsonrpc":"2.0","id":1,"result":{"x":1}}"#.into()),
        };
        let (purpose, answer) = g.on_message(a, RelayMessage::Reply(reply.clone())).unwrap();
        assert_eq!(purpose, health(1));
        assert!(
            matches!(answer, Answer::Response { result: Some(r), .. } if r.get() == r#"{"x":1}"#)
        );
        assert!(
            g.on_message(a, RelayMessage::Reply(reply)).is_none(),
            "once"
        );
        assert!(g.expired(start).is_empty());
        assert_eq!(
            g.expired(start + Duration::from_secs(5)),
            vec![(b, health(1))]
        );
        assert_eq!(g.poll_timeout(), None);
        assert!(g.on_message(b, RelayMessage::Close).is_none(), "over");
    }

    #[test]
    fn a_streamed_answer_is_the_event_that_is_a_response() {
        let mut g = Gathers::default();
        let (t, _) = g.start(
            health(1),
            t0(),
            "t",
            serde_json::json!({}),
            &Credentials::default(),
        );
        assert!(g.on_message(t, RelayMessage::Open).is_none());
        let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#;
        let event = |data: &str| RelayMessage::Event {
            id: None,
            data: data.into(),
        };
        assert!(g.on_message(t, event(progress)).is_none());
        let (_, answer) = g
            .on_message(t, event(r#"{"jsonrpc":"2.0","id":1,"error":{"code":-1}}"#))
            .unwrap();
        assert!(matches!(answer, Answer::Response { error: Some(_), .. }));
        let (t, _) = g.start(
            health(2),
            t0(),
            "t",
            serde_json::json!({}),
            &Credentials::default(),
        );
        assert!(g.on_message(t, RelayMessage::Open).is_none());
        let (_, answer) = g.on_message(t, RelayMessage::Close).unwrap();
        assert!(matches!(answer, Answer::Failed(why) if why.contains("without a response")));
        let (t, _) = g.start(
            health(3),
            t0(),
            "t",
            serde_json::json!({}),
            &Credentials::default(),
        );
        let bad = HttpReply {
            status: 503,
            headers: Vec::new(),
            body: None,
        };
        let (_, answer) = g.on_message(t, RelayMessage::Reply(bad)).unwrap();
        assert!(matches!(answer, Answer::Failed(why) if why.contains("HTTP 503")));
    }
}
