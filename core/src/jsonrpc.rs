//! JSON-RPC 2.0 at the edge: bytes from a client or a sled become typed messages or a typed
//! error, and responses are assembled around raw JSON the gateway does not need to re-read.

use serde::de::Deserializer;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::RpcError;
use crate::strict;

/// A request id exactly as the client wrote it (a JSON string or number), so the response
/// carries back the very same text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawId(pub(crate) Box<str>);

impl RawId {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// One message from a client, parsed.
#[derive(Debug)]
pub(crate) enum ClientMessage<'a> {
    Request {
        id: RawId,
        method: String,
        params: Option<&'a RawValue>,
    },
    Notification {
        method: String,
        params: Option<&'a RawValue>,
    },
    /// A response to a request the gateway relayed to the client.
    Response {
        id: RawId,
        result: Option<&'a RawValue>,
        error: Option<&'a RawValue>,
    },
}

/// A message that could not be read; `id` is set when the request's id could be.
#[derive(Debug)]
pub(crate) struct BadMessage {
    pub(crate) id: Option<RawId>,
    pub(crate) error: Box<RpcError>,
}

/// The members of a JSON-RPC object, each kept raw. `null` stays `Some("null")`: an explicit
/// `"id": null` is not the same as no id.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct RawMessage<'a> {
    #[serde(borrow, deserialize_with = "raw")]
    pub(crate) jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, deserialize_with = "raw")]
    pub(crate) id: Option<&'a RawValue>,
    #[serde(borrow, deserialize_with = "raw")]
    pub(crate) method: Option<&'a RawValue>,
    #[serde(borrow, deserialize_with = "raw")]
    pub(crate) params: Option<&'a RawValue>,
    #[serde(borrow, deserialize_with = "raw")]
    pub(crate) result: Option<&'a RawValue>,
    #[serde(borrow, deserialize_with = "raw")]
    pub(crate) error: Option<&'a RawValue>,
    /// Present on uplink control frames only.
    #[serde(borrow, deserialize_with = "raw")]
    pub(crate) uplink: Option<&'a RawValue>,
}

fn raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Whether the body's first significant byte opens an array.
fn is_array(body: &[u8]) -> bool {
    body.iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'[')
}

/// Reads the object members of one JSON document, in one pass over the bytes.
pub(crate) fn parse_object(body: &[u8]) -> Result<RawMessage<'_>, RpcError> {
    if is_array(body) {
        // Rare: check the syntax first, so that a broken array is a parse error.
        serde_json::from_slice::<&RawValue>(body).map_err(|e| RpcError::Parse {
            detail: e.to_string(),
        })?;
        return Err(RpcError::Batch);
    }
    serde_json::from_slice::<RawMessage>(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => RpcError::Parse {
            detail: e.to_string(),
        },
        serde_json::error::Category::Io | serde_json::error::Category::Data => {
            let detail = if e.to_string().starts_with("invalid type") {
                "a JSON-RPC message must be a JSON object".to_owned()
            } else {
                e.to_string()
            };
            RpcError::InvalidRequest { detail }
        }
    })
}

/// MCP ids are strings or integers. A number with a fraction or an exponent (`1.5`, `1e400`)
/// is refused, and so is a string a strict reader cannot decode (a lone surrogate escape).
fn id_of(raw: &RawValue) -> Result<RawId, RpcError> {
    let text = raw.get();
    let bytes = text.as_bytes();
    let ok = match bytes.first() {
        Some(b'"') => !text.contains('\\') || serde_json::from_str::<String>(text).is_ok(),
        Some(b'-' | b'0'..=b'9') => bytes.iter().skip(1).all(u8::is_ascii_digit),
        _ => false,
    };
    if ok {
        Ok(RawId(text.into()))
    } else {
        Err(RpcError::InvalidRequest {
            detail: format!("`id` must be a string or an integer, not {}", clip(text)),
        })
    }
}

/// At most 64 bytes of a client's text, for an error message.
fn clip(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

fn string_of(raw: &RawValue, what: &str) -> Result<String, RpcError> {
    serde_json::from_str::<String>(raw.get()).map_err(|_| RpcError::InvalidRequest {
        detail: format!("`{what}` must be a string"),
    })
}

/// Parses one message from an MCP client.
pub(crate) fn parse_client(body: &[u8]) -> Result<ClientMessage<'_>, BadMessage> {
    // JSON text is UTF-8, and the edge parser does not check the strings it skips.
    if let Err(e) = std::str::from_utf8(body) {
        return Err(BadMessage {
            id: None,
            error: Box::new(RpcError::Parse {
                detail: format!(
                    "the body is not UTF-8: invalid byte at offset {}",
                    e.valid_up_to()
                ),
            }),
        });
    }
    let m = parse_object(body).map_err(|error| BadMessage {
        id: None,
        error: Box::new(error),
    })?;
    // The id is read first so that every later error can carry it.
    let id = match m.id.map(id_of).transpose() {
        Ok(id) => id,
        Err(error) => {
            return Err(BadMessage {
                id: None,
                error: Box::new(error),
            })
        }
    };
    let bad = |error| BadMessage {
        id: id.clone(),
        error: Box::new(error),
    };
    match m.jsonrpc.map(|j| j.get()) {
        Some(r#""2.0""#) => {}
        Some(other) => {
            return Err(bad(RpcError::InvalidRequest {
                detail: format!("`jsonrpc` must be \"2.0\", not {other}"),
            }))
        }
        None => {
            return Err(bad(RpcError::InvalidRequest {
                detail: "`jsonrpc` is missing; it must be \"2.0\"".into(),
            }))
        }
    }
    // Whatever may be forwarded must be what a strict reader reads (see `strict`).
    for (member, raw) in [
        ("params", m.params),
        ("result", m.result),
        ("error", m.error),
    ] {
        if let Some(raw) = raw {
            strict::check(raw.get(), strict::MAX_CLIENT_DEPTH)
                .map_err(|problem| bad(RpcError::Unreadable { member, problem }))?;
        }
    }
    if let Some(method) = m.method {
        let method = string_of(method, "method").map_err(bad)?;
        if let Some(p) = m.params {
            if !matches!(p.get().as_bytes().first(), Some(b'{' | b'[')) {
                return Err(bad(RpcError::InvalidRequest {
                    detail: "`params` must be an object".into(),
                }));
            }
        }
        return Ok(match id {
            Some(id) => ClientMessage::Request {
                id,
                method,
                params: m.params,
            },
            None => ClientMessage::Notification {
                method,
                params: m.params,
            },
        });
    }
    if let Some(id) = id.clone() {
        if m.result.is_some() || m.error.is_some() {
            return Ok(ClientMessage::Response {
                id,
                result: m.result,
                error: m.error,
            });
        }
    }
    Err(bad(RpcError::InvalidRequest {
        detail: "a JSON-RPC message needs a `method` (request or notification) or a `result`/`error` (response)".into(),
    }))
}

/// A success response around a raw result.
pub(crate) fn ok_response(id: &str, result: &str) -> String {
    response(id, "result", result)
}

/// An error response around a raw error object (a sled's, passed through).
pub(crate) fn raw_error_response(id: &str, error: &str) -> String {
    response(id, "error", error)
}

/// `{"jsonrpc":"2.0","id":<id>,"<member>":<raw>}`, built around the raw texts.
fn response(id: &str, member: &str, raw: &str) -> String {
    let mut s = String::with_capacity(id.len() + raw.len() + 32);
    s.push_str(r#"{"jsonrpc":"2.0","id":"#);
    s.push_str(id);
    s.push_str(",\"");
    s.push_str(member);
    s.push_str("\":");
    s.push_str(raw);
    s.push('}');
    s
}

/// A JSON-RPC request for a sled, with the gateway's own numeric id.
pub(crate) fn request(id: u64, method: &str, params: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#)
}

/// A JSON-RPC notification for a sled.
pub(crate) fn notification(method: &str, params: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{params}}}"#)
}

/// Deserialises a raw value, mapping failure to invalid params of `method`.
pub(crate) fn params_of<'a, T: Deserialize<'a>>(
    method: &str,
    params: Option<&'a RawValue>,
) -> Result<T, RpcError> {
    let text = params.map_or("{}", |p| p.get());
    serde_json::from_str(text).map_err(|e| RpcError::InvalidParams {
        method: method.to_owned(),
        detail: clean_serde_message(&e),
    })
}

/// serde_json's message without its " at line 1 column 9" tail.
pub(crate) fn clean_serde_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> (Option<String>, String) {
        match parse_client(body.as_bytes()) {
            Err(b) => (b.id.map(|i| i.0.into()), b.error.kind().to_owned()),
            Ok(m) => panic!("{body} parsed as {m:?}"),
        }
    }

    #[test]
    fn requests_notifications_and_responses() {
        match parse_client(br#"{"jsonrpc":"2.0","id":"a\"b","method":"ping"}"#).unwrap() {
            ClientMessage::Request { id, method, params } => {
                assert_eq!(id.as_str(), r#""a\"b""#);
                assert_eq!(method, "ping");
                assert!(params.is_none());
            }
            m => panic!("{m:?}"),
        }
        match parse_client(br#"{"jsonrpc":"2.0","id":-150,"method":"x","params":{"a":1}}"#).unwrap()
        {
            ClientMessage::Request { id, params, .. } => {
                assert_eq!(id.as_str(), "-150");
                assert_eq!(params.unwrap().get(), r#"{"a":1}"#);
            }
            m => panic!("{m:?}"),
        }
        assert!(matches!(
            parse_client(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap(),
            ClientMessage::Notification { .. }
        ));
        assert!(matches!(
            parse_client(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#).unwrap(),
            ClientMessage::Response { .. }
        ));
    }

    #[test]
    fn bad_messages() {
        assert_eq!(err("{"), (None, "parse_error".into()));
        assert_eq!(err(""), (None, "parse_error".into()));
        assert_eq!(err("[]"), (None, "batch_not_supported".into()));
        assert_eq!(
            err(" [{\"jsonrpc\":\"2.0\"}]"),
            (None, "batch_not_supported".into())
        );
        assert_eq!(err("42"), (None, "invalid_request".into()));
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#),
            (None, "invalid_request".into())
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#),
            (None, "invalid_request".into())
        );
        // MCP ids are strings or integers, and JSON text is UTF-8.
        for id in ["1.5", "1e400", "1E2", "-0.0", r#""\ud800""#] {
            assert_eq!(
                err(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"x"}}"#)),
                (None, "invalid_request".into()),
                "{id}"
            );
        }
        let mut body = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"#.to_vec();
        body.extend_from_slice(b"\"\xff\"}}");
        match parse_client(&body) {
            Err(b) => assert_eq!(b.error.kind(), "parse_error"),
            Ok(m) => panic!("{m:?}"),
        }
        // What a strict reader rejects is refused, naming the member, before anything is sent.
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(
            err(&format!(
                r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"arguments":{{"a":{deep}}}}}}}"#
            )),
            (Some("2".into()), "too_deep".into())
        );
        assert_eq!(
            err(
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{"a":"\ud800"}}}"#
            ),
            (Some("3".into()), "unreadable_value".into())
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":4,"result":{"n":1e999}}"#),
            (Some("4".into()), "unreadable_value".into())
        );
        assert_eq!(
            err(r#"{"jsonrpc":"1.0","id":5,"method":"x"}"#),
            (Some("5".into()), "invalid_request".into())
        );
        assert_eq!(
            err(r#"{"id":5,"method":"x"}"#),
            (Some("5".into()), "invalid_request".into())
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":5,"method":7}"#),
            (Some("5".into()), "invalid_request".into())
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":5,"method":"x","params":3}"#),
            (Some("5".into()), "invalid_request".into())
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":5}"#),
            (Some("5".into()), "invalid_request".into())
        );
        assert_eq!(
            err(r#"{"jsonrpc":"2.0","id":5,"id":6,"method":"x"}"#),
            (None, "invalid_request".into())
        );
    }

    #[test]
    fn responses_keep_raw_text() {
        assert_eq!(
            ok_response(r#""x""#, "{}"),
            r#"{"jsonrpc":"2.0","id":"x","result":{}}"#
        );
        assert_eq!(
            raw_error_response("1", r#"{"code":1,"message":"m"}"#),
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"}}"#
        );
    }
}
