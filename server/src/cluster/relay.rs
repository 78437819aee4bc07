//! What replicas send each other when one relays a request to the replica holding its
//! project's uplink (the decision is the core's: `gateway_core::cluster`).
//!
//! A relay is one engine *request* to the owner's relay subject, carrying an [`Envelope`]
//! (the HTTP request, and an inbox for a streamed answer); the owner's reply is a
//! [`Handoff`]:
//!
//! - `answered`: the whole answer (the common case: one round trip);
//! - `streaming`: the answer is an SSE stream, whose events and close follow on the inbox as
//!   [`Answer`]s;
//! - `refused`: the owner did not take it (it could not read it, or it is shutting down): it
//!   was not served;
//! - `lost`: the owner took it and dropped it without an answer (its driver stopped).
//!
//! While the answer is not over the owner sends an `alive` on the inbox every [`ALIVE_EVERY`]
//! (none for a call answered sooner), so that the relaying replica learns within
//! [`SILENT_AFTER`] that the owner died or was cut off. No responder at the owner's subject
//! means nobody took it. The request waits for the
//! project's call timeout plus [`RELAY_MARGIN`]: the owner answers by its call deadline (with
//! the sled's answer or its own timeout error); past that the owner is taken for lost. The
//! relaying core also fails a relay at once when the directory shows that the owner lost the
//! project. A client that goes away sends `abort` for its inbox.
//!
//! When the relaying replica loses the engine with a relay in flight (its owner falls silent,
//! or the request fails once it may have gone out), it does not answer `unknown` at once: it
//! asks the owner, every [`RECOVER_EVERY`] until the relay's deadline, with an `outcome`
//! envelope naming the request's nonce, what became of it ([`super::outcomes`]): the answer
//! it gave (passed on as if just heard), `running` (ask again), or `unseen` (never taken, and
//! refused if it comes late: the core sends it again once the engine is back). Only an owner
//! that is gone for good, or that cannot say, leaves the outcome unknown.

use std::collections::BTreeSet;
use std::time::Duration;

use gateway_core::auth::Caller;
use gateway_core::{AccessToken, HttpMethod, HttpReply, HttpRequest, Principal};
use serde::{Deserialize, Serialize};

/// How often the owner says a streamed answer is still open.
pub const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// How long the relaying replica waits for any message of a streamed answer before it takes
/// the owner for dead (`outcome: "unknown"`).
pub const SILENT_AFTER: Duration = Duration::from_secs(4);

/// How long past the project's call timeout the relaying replica waits for the owner's reply.
pub const RELAY_MARGIN: Duration = Duration::from_secs(5);

/// How often a relaying replica asks the owner of a relay it lost what became of it.
pub const RECOVER_EVERY: Duration = Duration::from_millis(250);

/// How long it waits for each answer to that question.
pub const RECOVER_ASK: Duration = Duration::from_secs(2);

/// How many times in a row nobody may take that question before the owner is taken for gone.
pub const RECOVER_NO_RESPONDERS: u32 = 8;

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
    /// What became of the request whose envelope had this nonce (hex), sealed at `sealed_ms`?
    /// Answered with a [`super::outcomes::Recovered`] by the replica asked.
    Outcome { nonce: String, sealed_ms: u64 },
}

/// A nonce as an [`Envelope::Outcome`] names it.
pub fn nonce_hex(nonce: &[u8; 16]) -> String {
    hex::encode(nonce)
}

/// The nonce an [`Envelope::Outcome`] names; `None` for anything but 32 hex digits.
pub fn nonce_of_hex(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut nonce = [0u8; 16];
    for (i, b) in nonce.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(nonce)
}

/// The owner's reply to a relayed request (the engine request's reply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "handoff", rename_all = "snake_case", deny_unknown_fields)]
pub enum Handoff {
    /// The whole answer.
    Answered {
        status: u16,
        headers: Vec<(String, String)>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    /// An SSE stream is open; its messages follow on the inbox.
    Streaming,
    /// Not taken: not served.
    Refused { reason: String },
    /// Taken, and dropped without an answer.
    Lost,
}

impl Handoff {
    pub fn answered(reply: HttpReply) -> Handoff {
        Handoff::Answered {
            status: reply.status,
            headers: reply
                .headers
                .into_iter()
                .map(|(n, v)| (n.to_owned(), v))
                .collect(),
            body: reply.body,
        }
    }
}

/// One message of a streamed answer, on the relay's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Answer {
    Event {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        data: String,
    },
    Close,
    Alive,
}

/// An [`HttpRequest`] on the wire. It holds no credential; its `Debug` shows neither the
/// session id nor the body (security review finding 16).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Who the relaying replica let the request in as. No credential crosses the cluster.
    pub caller: WireCaller,
    /// The body, as UTF-8 when it is (a JSON body always is), else lossily.
    pub body: String,
}

impl std::fmt::Debug for WireRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireRequest")
            .field("method", &self.method)
            .field("session", &self.session.as_ref().map(|_| ".."))
            .field("mcp_method", &self.mcp_method)
            .field("caller", &self.caller)
            .field("body_bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// Who a relayed request comes from, as the relaying replica verified it
/// ([`gateway_core::auth::Caller`]); the owner applies its own rules to it. It is believed
/// because the envelope is sealed under the cluster secret (`gateway_core::keys`), never
/// because NATS delivered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WireCaller {
    Anonymous,
    ClientToken {
        owner: String,
    },
    OAuth {
        issuer: String,
        subject: String,
        client_id: Option<String>,
        scopes: BTreeSet<String>,
        groups: Vec<String>,
    },
}

impl WireRequest {
    /// The request as it crosses the wire (taken whole: nothing is copied).
    pub fn from_request(r: HttpRequest) -> WireRequest {
        WireRequest {
            method: match r.method {
                HttpMethod::Post => "POST",
                HttpMethod::Get => "GET",
                HttpMethod::Delete => "DELETE",
            }
            .into(),
            session: r.session,
            content_type: r.content_type,
            accept: r.accept,
            protocol_version: r.protocol_version,
            origin: r.origin,
            last_event_id: r.last_event_id,
            mcp_method: r.mcp_method,
            mcp_name: r.mcp_name,
            mcp_param_project: r.mcp_param_project,
            caller: match r.access_token {
                AccessToken::Relayed(Caller::ClientToken { owner }) => {
                    WireCaller::ClientToken { owner }
                }
                AccessToken::Relayed(Caller::Token(p)) => {
                    let p = *p;
                    WireCaller::OAuth {
                        issuer: p.issuer,
                        subject: p.subject,
                        client_id: p.client_id,
                        scopes: p.scopes,
                        groups: p.groups,
                    }
                }
                // The core relays only requests it let in, as their caller; anything else
                // goes as nobody, which a replica with authentication on refuses.
                AccessToken::Relayed(Caller::Anonymous)
                | AccessToken::Unchecked
                | AccessToken::Valid(_)
                | AccessToken::Invalid => WireCaller::Anonymous,
            },
            body: String::from_utf8(r.body)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
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
            authorization: None,
            access_token: AccessToken::Relayed(match self.caller {
                WireCaller::Anonymous => Caller::Anonymous,
                WireCaller::ClientToken { owner } => Caller::ClientToken { owner },
                WireCaller::OAuth {
                    issuer,
                    subject,
                    client_id,
                    scopes,
                    groups,
                } => Caller::Token(Box::new(Principal {
                    issuer,
                    subject,
                    client_id,
                    scopes,
                    groups,
                })),
            }),
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

/// The reply a [`Handoff::Answered`] carries.
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
            access_token: AccessToken::Relayed(Caller::Token(Box::new(Principal {
                issuer: "https://issuer".into(),
                subject: "alice".into(),
                client_id: Some("cli".into()),
                scopes: ["mcp".to_owned()].into(),
                groups: vec!["ops".into()],
            }))),
            body: br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
            ..HttpRequest::default()
        };
        let wire = serde_json::to_string(&Envelope::Request {
            inbox: "i".into(),
            request: Box::new(WireRequest::from_request(request.clone())),
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
    fn no_credential_crosses_the_wire() {
        let request = HttpRequest {
            authorization: Some("Bearer secret-token".into()),
            access_token: AccessToken::Relayed(Caller::ClientToken {
                owner: "ops".into(),
            }),
            ..HttpRequest::default()
        };
        let wire = serde_json::to_string(&WireRequest::from_request(request.clone())).unwrap();
        assert!(!wire.contains("secret-token"), "{wire}");
        assert!(wire.contains("\"owner\":\"ops\""), "{wire}");
        // A request the core did not let in as a caller goes as nobody.
        let unchecked = HttpRequest {
            access_token: AccessToken::Valid(Box::new(Principal {
                issuer: "i".into(),
                subject: "s".into(),
                client_id: None,
                scopes: Default::default(),
                groups: Vec::new(),
            })),
            ..HttpRequest::default()
        };
        let back = WireRequest::from_request(unchecked.clone())
            .into_request()
            .unwrap();
        assert_eq!(back.access_token, AccessToken::Relayed(Caller::Anonymous));
    }

    #[test]
    fn replies_keep_the_headers_the_gateway_sends() {
        let reply = HttpReply {
            status: 503,
            headers: vec![("Retry-After", "1".into())],
            body: Some("{}".into()),
        };
        let wire = serde_json::to_string(&Handoff::answered(reply.clone())).unwrap();
        let Handoff::Answered {
            status,
            headers,
            body,
        } = serde_json::from_str(&wire).unwrap()
        else {
            panic!("not an answer");
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
            ..WireRequest::from_request(HttpRequest::default())
        };
        assert!(bad.into_request().is_err());
    }

    #[test]
    fn nonces_name_themselves_in_hex() {
        let nonce: [u8; 16] = std::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(nonce_of_hex(&nonce_hex(&nonce)), Some(nonce));
        for bad in ["", "zz", &"0".repeat(31), &"g".repeat(32), &"é".repeat(16)] {
            assert_eq!(nonce_of_hex(bad), None, "{bad:?}");
        }
    }
}
