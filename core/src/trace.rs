//! W3C trace context (`traceparent`, `tracestate`) carried from a client's request to the sled.
//!
//! A client puts `traceparent` (and optionally `tracestate`) in a request's `params._meta`, in
//! either era. The gateway takes part in the trace as one span: the forwarded request's
//! `_meta.traceparent` keeps the client's trace id and flags and names the gateway's own span
//! (a fresh span id from its seeded generator) as the parent; `tracestate` passes through as
//! written. A `traceparent` that does not parse (version `00` only; lowercase hex; neither id
//! all zeros) is dropped with its `tracestate`, as the W3C recommendation says: nothing invalid
//! is forwarded. The trace id goes on the gateway's log lines for the call.
//!
//! With span export on ([`crate::Config::export_spans`]), a forwarded request that carried a
//! valid `traceparent` ends in a [`SpanRecord`] ([`crate::Output::Span`]): the gateway's span,
//! with the ids it put in the forwarded `traceparent`, named and attributed after
//! OpenTelemetry's MCP semantic conventions. The core decides the span; the driver exports it.

use std::time::Instant;

use crate::metrics::Outcome;

/// The `_meta` keys, as W3C names the headers.
pub(crate) const TRACEPARENT: &str = "traceparent";
pub(crate) const TRACESTATE: &str = "tracestate";

/// A parsed `traceparent`: `00-<trace id>-<parent id>-<flags>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceParent {
    /// 32 lowercase hex digits.
    pub(crate) trace_id: String,
    /// The client's span: 16 lowercase hex digits.
    pub(crate) parent_id: String,
    /// 2 hex digits.
    pub(crate) flags: String,
}

fn lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Parses a `traceparent` value; `None` when it is not a valid version-00 one.
pub(crate) fn parse(value: &str) -> Option<TraceParent> {
    let mut parts = value.split('-');
    let (version, trace_id, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let valid = parts.next().is_none()
        && version == "00"
        && lower_hex(trace_id, 32)
        && lower_hex(parent, 16)
        && lower_hex(flags, 2)
        && trace_id.bytes().any(|b| b != b'0')
        && parent.bytes().any(|b| b != b'0');
    valid.then(|| TraceParent {
        trace_id: trace_id.to_owned(),
        parent_id: parent.to_owned(),
        flags: flags.to_owned(),
    })
}

/// The gateway's span id from 8 random bytes: never all zeros.
pub(crate) fn span_id(mut span: [u8; 8]) -> [u8; 8] {
    if span == [0; 8] {
        span[7] = 1;
    }
    span
}

/// The `traceparent` of the gateway's span `span` (see [`span_id`]) in `trace`.
pub(crate) fn child(trace: &TraceParent, span: [u8; 8]) -> String {
    format!(
        "00-{}-{}-{}",
        trace.trace_id,
        hex(&span_id(span)),
        trace.flags
    )
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// The bytes of lowercase hex text of exactly `N` bytes (checked by [`parse`]).
fn bytes<const N: usize>(hex: &str) -> [u8; N] {
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = hex
            .get(2 * i..2 * i + 2)
            .and_then(|d| u8::from_str_radix(d, 16).ok())
            .unwrap_or(0);
    }
    out
}

/// A value of a span attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeValue {
    String(String),
    Int(i64),
}

/// One span of the gateway's, finished: a forwarded request of a client's trace, from the
/// moment it was sent up the uplink to the moment the call ended (answered, failed, timed out,
/// cancelled, or its uplink lost). A SERVER span in OpenTelemetry's terms (the gateway serves
/// the client's request; the sled's work is its child), named `{mcp.method.name} {target}`
/// after the MCP semantic conventions, where the target is the tool (when the sled lists it)
/// or the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanRecord {
    /// The client's trace.
    pub trace_id: [u8; 16],
    /// The gateway's span: the parent named in the forwarded `traceparent`.
    pub span_id: [u8; 8],
    /// The client's span, from its `traceparent`.
    pub parent_span_id: [u8; 8],
    /// The trace flags, as the client sent them (bit 0: sampled).
    pub flags: u8,
    /// The client's `tracestate`, as written.
    pub tracestate: Option<String>,
    pub name: String,
    /// When the request went up the uplink.
    pub start: Instant,
    /// When the call ended.
    pub end: Instant,
    /// Keys of OpenTelemetry's semantic conventions where they exist (`mcp.method.name`,
    /// `gen_ai.tool.name`, `gen_ai.prompt.name`, `mcp.resource.uri`, `jsonrpc.request.id`,
    /// `error.type`, …), and the gateway's own under `mcp_gateway.` (`project`, `sled`,
    /// `outcome`).
    pub attributes: Vec<(&'static str, AttributeValue)>,
    /// `Some(description)` when the call failed: the span's status is then an error.
    pub error: Option<String>,
}

impl SpanRecord {
    /// The value of attribute `key`, if set.
    pub fn attribute(&self, key: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    /// Whether the client's trace is sampled (flags bit 0): exporters drop spans that are not.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// The span of a forwarded request while it is pending, kept in its call (only with span
/// export on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallSpan {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent_span_id: [u8; 8],
    flags: u8,
    tracestate: Option<String>,
    method: String,
    /// The tool's name when the sled lists it, or the prompt's: the span name's target.
    target: Option<String>,
    /// Attributes known when the request is sent.
    attributes: Vec<(&'static str, AttributeValue)>,
    /// The JSON-RPC error code the call was answered with, once known.
    pub(crate) error_code: Option<i64>,
}

/// What a forwarded request is about, for its span.
pub(crate) struct SpanTarget<'a> {
    pub(crate) method: &'a str,
    /// The forwarded params (a JSON object's text): `name` and `uri` are read from it.
    pub(crate) params: &'a str,
    /// Whether the sled lists the tool of a `tools/call`.
    pub(crate) listed_tool: bool,
    /// The client's request id, as it wrote it (JSON text).
    pub(crate) request_id: &'a str,
    /// The project and its sled.
    pub(crate) project: &'a str,
    pub(crate) sled: String,
    /// The MCP protocol version of the request, when known.
    pub(crate) protocol_version: Option<&'a str>,
}

impl CallSpan {
    /// The gateway's span `span` (see [`span_id`]) of a request in the client's `trace`.
    pub(crate) fn new(
        trace: &TraceParent,
        span: [u8; 8],
        tracestate: Option<&str>,
        target: SpanTarget<'_>,
    ) -> CallSpan {
        #[derive(serde::Deserialize)]
        struct Named {
            name: Option<String>,
            uri: Option<String>,
        }
        let named = serde_json::from_str::<Named>(target.params).ok();
        let (name, uri) = named.map_or((None, None), |n| (n.name, n.uri));
        let s = |v: &str| AttributeValue::String(v.to_owned());
        let mut attributes = vec![("mcp.method.name", s(target.method))];
        let mut span_target = None;
        match (target.method, name) {
            ("tools/call", Some(tool)) => {
                attributes.push(("gen_ai.operation.name", s("execute_tool")));
                if target.listed_tool {
                    span_target = Some(tool.clone());
                }
                attributes.push(("gen_ai.tool.name", AttributeValue::String(tool)));
            }
            ("prompts/get", Some(prompt)) => {
                span_target = Some(prompt.clone());
                attributes.push(("gen_ai.prompt.name", AttributeValue::String(prompt)));
            }
            _ => {}
        }
        if let Some(uri) = uri.filter(|_| target.method.starts_with("resources/")) {
            attributes.push(("mcp.resource.uri", AttributeValue::String(uri)));
        }
        // A string id without its quotes; a number as written.
        let id = serde_json::from_str::<String>(target.request_id)
            .unwrap_or_else(|_| target.request_id.to_owned());
        attributes.push(("jsonrpc.request.id", AttributeValue::String(id)));
        if let Some(v) = target.protocol_version {
            attributes.push(("mcp.protocol.version", s(v)));
        }
        attributes.push(("mcp_gateway.project", s(target.project)));
        attributes.push(("mcp_gateway.sled", AttributeValue::String(target.sled)));
        CallSpan {
            trace_id: bytes(&trace.trace_id),
            span_id: span_id(span),
            parent_span_id: bytes(&trace.parent_id),
            flags: bytes::<1>(&trace.flags)[0],
            tracestate: tracestate.map(str::to_owned),
            method: target.method.to_owned(),
            target: span_target,
            attributes,
            error_code: None,
        }
    }

    /// The finished span of a call sent at `start` that ended at `end` with `outcome`.
    pub(crate) fn finish(&self, outcome: Outcome, start: Instant, end: Instant) -> SpanRecord {
        let mut attributes = self.attributes.clone();
        attributes.push((
            "mcp_gateway.outcome",
            AttributeValue::String(outcome.name().to_owned()),
        ));
        if let Some(code) = self.error_code {
            attributes.push((
                "rpc.response.status_code",
                AttributeValue::String(code.to_string()),
            ));
        }
        let error = match outcome {
            Outcome::Ok => None,
            Outcome::Error => Some(match self.error_code {
                Some(code) => format!("the sled answered with JSON-RPC error {code}"),
                None => "the sled answered with a JSON-RPC error".to_owned(),
            }),
            Outcome::BadResponse => Some("the sled's answer was not a JSON-RPC response".into()),
            Outcome::Timeout => Some("no answer within the project's deadline".into()),
            Outcome::UplinkLost => Some("the sled's uplink was lost".into()),
            Outcome::Cancelled => Some("cancelled by the client".into()),
            Outcome::Aborted => Some("the client went away".into()),
            Outcome::Refused => Some("refused by a limit on calls in flight".into()),
        };
        if error.is_some() {
            // The JSON-RPC error code when there is one, else the kind of failure.
            let kind = match (outcome, self.error_code) {
                (Outcome::Timeout, _) => "timeout".to_owned(),
                (_, Some(code)) => code.to_string(),
                _ => outcome.name().to_owned(),
            };
            attributes.push(("error.type", AttributeValue::String(kind)));
        }
        SpanRecord {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            flags: self.flags,
            tracestate: self.tracestate.clone(),
            name: match &self.target {
                Some(t) => format!("{} {t}", self.method),
                None => self.method.clone(),
            },
            start,
            end: end.max(start),
            attributes,
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_and_invalid_traceparents() {
        let t = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.flags, "01");
        assert_eq!(
            child(&t, [0xab; 8]),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-abababababababab-01"
        );
        assert_eq!(
            child(&t, [0; 8]),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-01"
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
