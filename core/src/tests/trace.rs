//! Spans of a client's trace: what the core asks the driver to export when a forwarded call of
//! a trace ends, and that nothing is kept or made with span export off.

use std::time::Duration;

use serde_json::{json, Value};

use super::Harness;
use crate::{AttributeValue, Config, HttpMethod, Input, SpanRecord, UplinkId};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent(flags: &str) -> String {
    format!("00-{TRACE}-{CLIENT_SPAN}-{flags}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A harness with span export on, heartbeats out of the way, a session and alpha's sled.
fn exporting() -> (Harness, String, UplinkId) {
    let config = Config {
        export_spans: true,
        heartbeat_interval: Duration::from_secs(3600),
        heartbeat_timeout: Duration::from_secs(7200),
        ..Config::default()
    };
    let mut h = Harness::with_config(&["alpha", "beta"], Some("alpha"), config, [7; 32]);
    let s = h.initialize();
    let alpha = h.connect_sled("alpha");
    (h, s, alpha)
}

/// Sends a `tools/call` of `tool` with `_meta`; returns its token and the forwarded frame.
fn call_with_meta(
    h: &mut Harness,
    s: &str,
    uplink: UplinkId,
    id: Value,
    tool: &str,
    meta: Value,
) -> (crate::HttpToken, Value) {
    let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name":tool,"arguments":{"story_id":"alpha-1"},"_meta":meta}});
    let t = h.send(HttpMethod::Post, Some(s), &body.to_string());
    // Earlier calls' cancellations may be there too.
    let frames: Vec<Value> = h
        .take_frames(uplink)
        .into_iter()
        .filter(|f| f["method"] == "tools/call")
        .collect();
    assert_eq!(frames.len(), 1, "{frames:?}");
    (t, frames.into_iter().next().unwrap())
}

fn string(span: &SpanRecord, key: &str) -> Option<String> {
    match span.attribute(key)? {
        AttributeValue::String(s) => Some(s.clone()),
        AttributeValue::Int(i) => Some(i.to_string()),
    }
}

#[test]
fn an_answered_call_of_a_trace_is_one_span_with_the_ids_the_sled_saw() {
    let (mut h, s, alpha) = exporting();
    let sent_at = h.now;
    let (t, frame) = call_with_meta(
        &mut h,
        &s,
        alpha,
        json!("c-1"),
        "show",
        json!({"traceparent": traceparent("01"), "tracestate": "vendor=x"}),
    );
    let forwarded = frame["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    let gateway_span = forwarded.split('-').nth(2).unwrap().to_owned();
    assert!(h.spans.is_empty(), "no span before the call ends");
    h.advance(Duration::from_millis(250));
    h.sled_answers_all_frames(alpha, vec![frame]);
    assert!(h.reply_json(t).unwrap()["result"].is_object());

    assert_eq!(h.spans.len(), 1, "{:?}", h.spans);
    let span = &h.spans[0];
    assert_eq!(hex(&span.trace_id), TRACE);
    assert_eq!(hex(&span.span_id), gateway_span, "the sled's parent");
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN, "the client's span");
    assert_eq!(span.flags, 1);
    assert!(span.sampled());
    assert_eq!(span.tracestate.as_deref(), Some("vendor=x"));
    assert_eq!(span.name, "tools/call show");
    assert_eq!(
        (span.start, span.end),
        (sent_at, sent_at + Duration::from_millis(250))
    );
    assert_eq!(span.error, None);
    for (key, value) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "show"),
        ("jsonrpc.request.id", "c-1"),
        ("mcp.protocol.version", "2025-11-25"),
        ("mcp_gateway.project", "alpha"),
        ("mcp_gateway.sled", "alpha"),
        ("mcp_gateway.outcome", "ok"),
    ] {
        assert_eq!(string(span, key).as_deref(), Some(value), "{key}: {span:?}");
    }
    assert_eq!(span.attribute("error.type"), None);
    assert_eq!(span.attribute("rpc.response.status_code"), None);
}

#[test]
fn a_failed_call_of_a_trace_is_a_span_with_an_error_status() {
    let (mut h, s, alpha) = exporting();
    let meta = || json!({"traceparent": traceparent("00")});

    // The sled answers with a JSON-RPC error.
    let (t, frame) = call_with_meta(&mut h, &s, alpha, json!(1), "show", meta());
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","id":frame["id"],"error":{"code":-32602,"message":"bad"}}),
    );
    assert_eq!(h.reply_json(t).unwrap()["error"]["code"], -32602);
    let span = h.spans.pop().expect("a span");
    assert!(!span.sampled(), "flags as the client sent them");
    assert!(
        span.error.as_deref().unwrap().contains("-32602"),
        "{span:?}"
    );
    assert_eq!(string(&span, "error.type").as_deref(), Some("-32602"));
    assert_eq!(
        string(&span, "rpc.response.status_code").as_deref(),
        Some("-32602")
    );
    assert_eq!(
        string(&span, "mcp_gateway.outcome").as_deref(),
        Some("error")
    );

    // No answer by the project's deadline (30 s).
    let sent_at = h.now;
    let (t, _) = call_with_meta(&mut h, &s, alpha, json!(2), "show", meta());
    h.advance(Duration::from_secs(31));
    assert_eq!(h.reply_json(t).unwrap()["error"]["code"], -32001);
    let span = h.spans.pop().expect("a span");
    assert_eq!(span.end - span.start, Duration::from_secs(30));
    assert_eq!(span.start, sent_at);
    assert!(span.error.is_some());
    assert_eq!(string(&span, "error.type").as_deref(), Some("timeout"));
    assert_eq!(
        string(&span, "mcp_gateway.outcome").as_deref(),
        Some("timeout")
    );

    // Cancelled by the client.
    let (t, _) = call_with_meta(&mut h, &s, alpha, json!(3), "show", meta());
    h.advance(Duration::from_millis(40));
    h.post(
        Some(&s),
        json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}),
    );
    h.replies.remove(&t);
    let span = h.spans.pop().expect("a span");
    assert_eq!(span.end - span.start, Duration::from_millis(40));
    assert!(span.error.is_some());
    assert_eq!(
        string(&span, "mcp_gateway.outcome").as_deref(),
        Some("cancelled")
    );

    // The client went away.
    let (t, _) = call_with_meta(&mut h, &s, alpha, json!(4), "show", meta());
    h.advance(Duration::from_millis(70));
    h.handle(Input::HttpAborted { token: t });
    let span = h.spans.pop().expect("a span");
    assert_eq!(span.end - span.start, Duration::from_millis(70));
    assert_eq!(string(&span, "error.type").as_deref(), Some("aborted"));

    // The uplink is lost.
    let (t, _) = call_with_meta(&mut h, &s, alpha, json!(5), "show", meta());
    h.advance(Duration::from_millis(90));
    h.handle(Input::UplinkClosed { uplink: alpha });
    assert!(h.reply_json(t).unwrap()["error"].is_object());
    let span = h.spans.pop().expect("a span");
    assert_eq!(span.end - span.start, Duration::from_millis(90));
    assert!(span.error.is_some());
    assert_eq!(
        string(&span, "mcp_gateway.outcome").as_deref(),
        Some("uplink_lost")
    );
    assert!(h.spans.is_empty(), "one span per call: {:?}", h.spans);
}

#[test]
fn an_unlisted_tool_is_named_by_its_method_and_a_resource_by_its_uri() {
    let (mut h, s, alpha) = exporting();
    let (t, frame) = call_with_meta(
        &mut h,
        &s,
        alpha,
        json!(9),
        "not_listed",
        json!({"traceparent": traceparent("01")}),
    );
    h.sled_says(alpha, json!({"jsonrpc":"2.0","id":frame["id"],"result":{}}));
    h.reply_json(t).unwrap();
    let span = h.spans.pop().expect("a span");
    assert_eq!(span.name, "tools/call", "no client-made name in span names");
    assert_eq!(
        string(&span, "gen_ai.tool.name").as_deref(),
        Some("not_listed")
    );
    assert_eq!(string(&span, "jsonrpc.request.id").as_deref(), Some("9"));

    let body = json!({"jsonrpc":"2.0","id":10,"method":"resources/read","params":{
        "uri":"file:///a.txt","_meta":{"traceparent": traceparent("01")}}});
    let t = h.send(HttpMethod::Post, Some(&s), &body.to_string());
    let frame = h.take_frames(alpha).remove(0);
    assert_eq!(frame["method"], "resources/read");
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","id":frame["id"],"result":{"contents":[]}}),
    );
    h.reply_json(t).unwrap();
    let span = h.spans.pop().expect("a span");
    assert_eq!(span.name, "resources/read");
    assert_eq!(
        string(&span, "mcp.resource.uri").as_deref(),
        Some("file:///a.txt")
    );
    assert_eq!(span.attribute("gen_ai.tool.name"), None);
}

#[test]
fn no_span_without_export_or_without_a_valid_trace() {
    // Export off (the default): a call of a trace makes no span.
    let mut h = Harness::new();
    let s = h.initialize();
    let alpha = h.connect_sled("alpha");
    let (t, frame) = call_with_meta(
        &mut h,
        &s,
        alpha,
        json!(1),
        "show",
        json!({"traceparent": traceparent("01")}),
    );
    assert!(frame["params"]["_meta"]["traceparent"].is_string());
    h.sled_answers_all_frames(alpha, vec![frame]);
    h.reply_json(t).unwrap();
    assert!(h.spans.is_empty(), "{:?}", h.spans);

    // Export on: a call without a traceparent, or with an invalid one, makes none either.
    let (mut h, s, alpha) = exporting();
    let t = h.call(Some(&s), json!(2), "show", json!({"story_id":"alpha-1"}));
    h.sled_answers_all(alpha, "alpha");
    h.reply_json(t).unwrap();
    for meta in [
        json!({"tracestate": "vendor=x"}),
        json!({"traceparent": "00-zz-bad-01"}),
        json!({"traceparent": format!("00-{TRACE}-0000000000000000-01")}),
    ] {
        let (t, frame) = call_with_meta(&mut h, &s, alpha, json!(3), "show", meta);
        h.sled_answers_all_frames(alpha, vec![frame]);
        h.reply_json(t).unwrap();
    }
    assert!(h.spans.is_empty(), "{:?}", h.spans);
}
