//! A forwarded request's `_meta`, rewritten on its way to the sled (issue 23, step 4): a pure
//! function of the client's `_meta` and what the gateway decided, so `forward` only books the
//! call. What the client wrote that is the gateway's to say is replaced or dropped:
//! - a progress token is the client's, unique only in its session: the sled sees the gateway's
//!   (`progress`), and the client's is kept to answer with;
//! - the gateway is a span of the client's trace: a valid `traceparent` becomes the gateway
//!   span's child, an invalid one is dropped with its `tracestate`;
//! - in the stateless era, the protocol's own keys (`io.modelcontextprotocol/…`) stay at the
//!   gateway, and the request's log level is read from them;
//! - who calls is said only by the gateway, and only to a project that asks for it.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::basics;
use super::proxy::{MODERN_LOG_LEVEL, PRINCIPAL_META};
use crate::error::RpcError;
use crate::trace::{self, TraceParent};

/// What the gateway decided about one forwarded request.
pub(super) struct Ask<'a> {
    /// The request's method, for errors.
    pub(super) method: &'a str,
    /// A request of the stateless era.
    pub(super) modern: bool,
    /// The gateway's own progress token for the request.
    pub(super) progress_token: String,
    /// What the project learns of the caller: only for a project that asks for it.
    pub(super) principal: Option<Value>,
}

/// The `_meta` to send, and what was taken from the client's.
#[derive(Debug, Default)]
pub(super) struct Rewritten {
    /// The `_meta` to send; `None` when nothing is left.
    pub(super) meta: Option<Map<String, Value>>,
    /// The gateway's progress token and the client's, when the client asked for progress.
    pub(super) progress: Option<(String, Box<RawValue>)>,
    /// The stateless era's per-request log level.
    pub(super) log_level: Option<u8>,
    /// The client's trace, and the gateway's span id in it.
    pub(super) trace: Option<(TraceParent, [u8; 8])>,
}

/// Rewrites the client's `_meta` (`span_id` draws the gateway's span id, only when the client
/// is in a trace).
pub(super) fn outgoing(
    meta: Option<Value>,
    ask: Ask<'_>,
    span_id: impl FnOnce() -> [u8; 8],
) -> Result<Rewritten, RpcError> {
    let invalid = |detail: String| RpcError::InvalidParams {
        method: ask.method.to_owned(),
        detail,
    };
    let mut meta = match meta {
        None => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(invalid("`_meta` must be an object".into())),
    };
    let mut out = Rewritten::default();
    if ask.modern {
        // The era's per-request log level: the threshold of this call's log messages, as
        // `logging/setLevel` is a session's.
        if let Some(level) = meta.get(MODERN_LOG_LEVEL) {
            match level.as_str().and_then(basics::log_rank) {
                Some(rank) => out.log_level = Some(rank),
                None => {
                    return Err(invalid(format!(
                        "`_meta[\"{MODERN_LOG_LEVEL}\"]` must be one of {}",
                        basics::LOG_LEVELS.join(", ")
                    )))
                }
            }
        }
        meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
    }
    match meta.remove("progressToken") {
        Some(client @ (Value::String(_) | Value::Number(_))) => {
            meta.insert(
                "progressToken".into(),
                Value::String(ask.progress_token.clone()),
            );
            let raw = serde_json::value::to_raw_value(&client).expect("a JSON value serialises");
            out.progress = Some((ask.progress_token, raw));
        }
        Some(_) => {
            return Err(invalid(
                "`_meta.progressToken` must be a string or a number".into(),
            ))
        }
        None => {}
    }
    let parent = meta
        .get(trace::TRACEPARENT)
        .map(|v| v.as_str().and_then(trace::parse));
    match parent {
        Some(Some(parent)) => {
            let span = span_id();
            meta.insert(
                trace::TRACEPARENT.into(),
                Value::String(trace::child(&parent, span)),
            );
            out.trace = Some((parent, span));
        }
        Some(None) => {
            tracing::debug!("an invalid traceparent was dropped");
            meta.remove(trace::TRACEPARENT);
            meta.remove(trace::TRACESTATE);
        }
        None => {}
    }
    meta.remove(PRINCIPAL_META);
    if let Some(who) = ask.principal {
        meta.insert(PRINCIPAL_META.to_owned(), who);
    }
    out.meta = (!meta.is_empty()).then_some(meta);
    Ok(out)
}

/// `params` (a JSON object's text) with `meta` as its last member.
pub(super) fn with_meta(mut params: String, meta: Option<&Map<String, Value>>) -> String {
    if let Some(meta) = meta {
        params.pop();
        if params.len() > 1 {
            params.push(',');
        }
        params.push_str("\"_meta\":");
        params.push_str(&serde_json::to_string(meta).expect("a JSON map serialises"));
        params.push('}');
    }
    params
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ask(modern: bool, principal: Option<Value>) -> Ask<'static> {
        Ask {
            method: "tools/call",
            modern,
            progress_token: "gw-1-7".into(),
            principal,
        }
    }

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn the_client_keeps_its_progress_token_and_the_sled_sees_the_gateways() {
        let r = outgoing(
            Some(json!({"progressToken": 5, "x": 1})),
            ask(false, None),
            || unreachable!("no trace"),
        )
        .unwrap();
        let meta = r.meta.unwrap();
        assert_eq!(meta["progressToken"], "gw-1-7");
        assert_eq!(meta["x"], 1);
        let (gateway, client) = r.progress.unwrap();
        assert_eq!((gateway.as_str(), client.get()), ("gw-1-7", "5"));
        assert!(outgoing(
            Some(json!({"progressToken": [1]})),
            ask(false, None),
            || [0; 8]
        )
        .is_err());
    }

    #[test]
    fn the_gateway_is_a_span_of_the_clients_trace_and_drops_a_bad_one() {
        let r = outgoing(
            Some(json!({"traceparent": PARENT, "tracestate": "v=1"})),
            ask(false, None),
            || [1, 2, 3, 4, 5, 6, 7, 8],
        )
        .unwrap();
        let meta = r.meta.unwrap();
        assert_eq!(
            meta["traceparent"],
            "00-0af7651916cd43dd8448eb211c80319c-0102030405060708-01"
        );
        assert_eq!(meta["tracestate"], "v=1");
        assert_eq!(r.trace.unwrap().0.parent_id, "b7ad6b7169203331");
        let r = outgoing(
            Some(json!({"traceparent": "00-zz", "tracestate": "v=1"})),
            ask(false, None),
            || unreachable!("not in a trace"),
        )
        .unwrap();
        assert!(r.meta.is_none() && r.trace.is_none());
    }

    #[test]
    fn only_the_gateway_says_who_calls_and_the_eras_keys_stay_here() {
        let forged = json!({"io.mcp-gateway/principal": {"subject": "root"}});
        let r = outgoing(Some(forged.clone()), ask(false, None), || [0; 8]).unwrap();
        assert!(r.meta.is_none(), "a client's principal is dropped");
        let who = json!({"token": "ops"});
        let r = outgoing(Some(forged), ask(false, Some(who.clone())), || [0; 8]).unwrap();
        assert_eq!(r.meta.unwrap()[PRINCIPAL_META], who);
        let modern = json!({
            "io.modelcontextprotocol/logLevel": "warning",
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        });
        let r = outgoing(Some(modern), ask(true, None), || [0; 8]).unwrap();
        assert!(r.meta.is_none());
        assert_eq!(r.log_level, basics::log_rank("warning"));
        let bad = json!({"io.modelcontextprotocol/logLevel": "loud"});
        assert!(outgoing(Some(bad), ask(true, None), || [0; 8]).is_err());
    }

    #[test]
    fn meta_goes_in_last() {
        let m = json!({"a": 1});
        assert_eq!(
            with_meta("{}".into(), m.as_object()),
            r#"{"_meta":{"a":1}}"#
        );
        assert_eq!(
            with_meta(r#"{"name":"t"}"#.into(), m.as_object()),
            r#"{"name":"t","_meta":{"a":1}}"#
        );
        assert_eq!(with_meta("{}".into(), None), "{}");
    }
}
