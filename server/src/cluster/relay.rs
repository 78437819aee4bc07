//! What replicas send each other when one relays a request to the replica holding its
//! project's uplink (the decision is the core's: `gateway_core::cluster`).
//!
//! - To the owner, on its relay subject: an [`Envelope`]: a request with the inbox its answer
//!   goes to, or the abort of one. A request is an engine *request*: the owner's `accepted`
//!   (or [`Handoff::Refused`]) tells the relaying replica that somebody took it, and no
//!   responder tells it that nobody did (the call was not sent).
//! - Back, on the inbox: [`Answer`]s, in order: one `reply`, or `open`, `event`s and `close`;
//!   and an `alive` every [`ALIVE_EVERY`] while the answer is not over, so that the relaying
//!   replica learns within [`SILENT_AFTER`] that the owner died.

use std::collections::BTreeSet;
use std::time::Duration;

use gateway_core::{AccessToken, HttpMethod, HttpReply, HttpRequest, Principal};
use serde::{Deserialize, Serialize};

/// How often the owner says a relayed request is still being served.
pub const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// How long the relaying replica waits for any message of an answer before it takes the owner
/// for dead (`outcome: "unknown"`).
pub const SILENT_AFTER: Duration = Duration::from_secs(4);

/// How long the relaying replica waits for the owner to take a request.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(3);

/// A message on a replica's relay subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Envelope {
    /// Serve this request and send its answer to `inbox`.
    Request {
        inbox: String,
        request: Box<WireRequest>,
    },
    /// The client of the request answered at `inbox` went away.
    Abort { inbox: String },
}

/// The owner's answer to a [`Envelope::Request`] (the engine request's reply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Handoff {
    Accepted,
    /// The owner could not read it: it was not served.
    Refused {
        reason: String,
    },
}

/// One message on a relay's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Answer {
    Reply {
        status: u16,
        headers: Vec<(String, String)>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    Open,
    Event {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        data: String,
    },
    Close,
    Alive,
}

/// An [`HttpRequest`] on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireRequest {
    pub method: String,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub content_type: Option<String>,
    #[serde(default)]
    pub accept: Option<String>,
    #[serde(default)]
    pub protocol_version: Option<String>,
    #[serde(default)]
    pub origin: Option<String>,
    #[serde(default)]
    pub last_event_id: Option<String>,
    #[serde(default)]
    pub mcp_method: Option<String>,
    #[serde(default)]
    pub mcp_name: Option<String>,
    #[serde(default)]
    pub mcp_param_project: Option<String>,
    #[serde(default)]
    pub authorization: Option<String>,
    pub access_token: WireAccessToken,
    /// The body, as UTF-8 when it is (a JSON body always is), else lossily.
    pub body: String,
}

/// What the relaying replica's server made of the bearer token; the replicas of a cluster
/// trust each other as the threads of one gateway do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WireAccessToken {
    Unchecked,
    Valid {
        issuer: String,
        subject: String,
        client_id: Option<String>,
        scopes: BTreeSet<String>,
        groups: Vec<String>,
    },
    Invalid,
}

impl WireRequest {
    pub fn from_request(r: &HttpRequest) -> WireRequest {
        WireRequest {
            method: match r.method {
                HttpMethod::Post => "POST",
                HttpMethod::Get => "GET",
                HttpMethod::Delete => "DELETE",
            }
            .into(),
            session: r.session.clone(),
            content_type: r.content_type.clone(),
            accept: r.accept.clone(),
            protocol_version: r.protocol_version.clone(),
            origin: r.origin.clone(),
            last_event_id: r.last_event_id.clone(),
            mcp_method: r.mcp_method.clone(),
            mcp_name: r.mcp_name.clone(),
            mcp_param_project: r.mcp_param_project.clone(),
            authorization: r.authorization.clone(),
            access_token: match &r.access_token {
                AccessToken::Unchecked => WireAccessToken::Unchecked,
                AccessToken::Invalid => WireAccessToken::Invalid,
                AccessToken::Valid(p) => WireAccessToken::Valid {
                    issuer: p.issuer.clone(),
                    subject: p.subject.clone(),
                    client_id: p.client_id.clone(),
                    scopes: p.scopes.clone(),
                    groups: p.groups.clone(),
                },
            },
            body: String::from_utf8_lossy(&r.body).into_owned(),
        }
    }

    /// The request to serve, marked relayed; `Err` for a method that is not one.
    pub fn into_request(self) -> Result<HttpRequest, String> {
        let method = match self.method.as_str() {
            "POST" => HttpMethod::Post,
            "GET" => HttpMethod::Get,
            "DELETE" => HttpMethod::Delete,
            other => return Err(format!("unknown HTTP method {other:?}")),
        };
        Ok(HttpRequest {
            method,
            session: self.session,
            content_type: self.content_type,
            accept: self.accept,
            protocol_version: self.protocol_version,
            origin: self.origin,
            last_event_id: self.last_event_id,
            mcp_method: self.mcp_method,
            mcp_name: self.mcp_name,
            mcp_param_project: self.mcp_param_project,
            relayed: true,
            authorization: self.authorization,
            access_token: match self.access_token {
                WireAccessToken::Unchecked => AccessToken::Unchecked,
                WireAccessToken::Invalid => AccessToken::Invalid,
                WireAccessToken::Valid {
                    issuer,
                    subject,
                    client_id,
                    scopes,
                    groups,
                } => AccessToken::Valid(Box::new(Principal {
                    issuer,
                    subject,
                    client_id,
                    scopes,
                    groups,
                })),
            },
            body: self.body.into_bytes(),
        })
    }
}

/// The header names the core answers with, as the `'static` names [`HttpReply`] holds; a name
/// not among them is dropped.
const HEADER_NAMES: [&str; 5] = [
    "Mcp-Session-Id",
    "WWW-Authenticate",
    "Retry-After",
    "Allow",
    "Mcp-Protocol-Version",
];

impl Answer {
    pub fn from_reply(reply: &HttpReply) -> Answer {
        Answer::Reply {
            status: reply.status,
            headers: reply
                .headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.clone()))
                .collect(),
            body: reply.body.clone(),
        }
    }
}

/// The reply an [`Answer::Reply`] carries.
pub fn reply_of(status: u16, headers: Vec<(String, String)>, body: Option<String>) -> HttpReply {
    HttpReply {
        status,
        headers: headers
            .into_iter()
            .filter_map(|(n, v)| {
                let known = HEADER_NAMES.iter().find(|k| k.eq_ignore_ascii_case(&n));
                if known.is_none() {
                    tracing::debug!(
                        header = n,
                        "a relayed header the gateway never sends; dropped"
                    );
                }
                known.map(|k| (*k, v))
            })
            .collect(),
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_cross_the_wire_whole_and_arrive_relayed() {
        let request = HttpRequest {
            method: HttpMethod::Post,
            session: Some("abc".into()),
            content_type: Some("application/json".into()),
            accept: Some("application/json, text/event-stream".into()),
            protocol_version: Some("2025-06-18".into()),
            authorization: Some("Bearer t".into()),
            access_token: AccessToken::Valid(Box::new(Principal {
                issuer: "https://issuer".into(),
                subject: "alice".into(),
                client_id: Some("cli".into()),
                scopes: ["mcp".to_owned()].into(),
                groups: vec!["ops".into()],
            })),
            body: br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
            ..HttpRequest::default()
        };
        let wire = serde_json::to_string(&Envelope::Request {
            inbox: "i".into(),
            request: Box::new(WireRequest::from_request(&request)),
        })
        .unwrap();
        let Envelope::Request { request: back, .. } = serde_json::from_str(&wire).unwrap() else {
            panic!("not a request");
        };
        let back = back.into_request().unwrap();
        assert!(back.relayed);
        assert_eq!(
            HttpRequest {
                relayed: false,
                ..back
            },
            request
        );
    }

    #[test]
    fn replies_keep_the_headers_the_gateway_sends() {
        let reply = HttpReply {
            status: 503,
            headers: vec![("Retry-After", "1".into())],
            body: Some("{}".into()),
        };
        let Answer::Reply {
            status,
            headers,
            body,
        } = Answer::from_reply(&reply)
        else {
            panic!("not a reply");
        };
        assert_eq!(reply_of(status, headers, body), reply);
        let odd = reply_of(200, vec![("X-Odd".into(), "1".into())], None);
        assert!(odd.headers.is_empty());
    }

    #[test]
    fn garbage_is_refused_not_guessed() {
        assert!(serde_json::from_str::<Envelope>(r#"{"request":{}}"#).is_err());
        assert!(serde_json::from_str::<Answer>(r#"{"kind":"teleport"}"#).is_err());
        let bad = WireRequest {
            method: "PATCH".into(),
            ..WireRequest::from_request(&HttpRequest::default())
        };
        assert!(bad.into_request().is_err());
    }
}
