//! One trace from the client to the sled, with the gateway's span exported over OTLP/HTTP: the
//! real gateway (`--otlp-endpoint` pointed at a collector in this test, on loopback) and a
//! real sled-sim fleet. The collector decodes what the gateway POSTs to `/v1/traces` with
//! `opentelemetry-proto`; the sled reports the trace context it received.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use gateway_server::otlp::OtlpConfig;
use gateway_server::ServerOptions;
use gateway_tests::{registry, Stack};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode as SpanStatus};
use prost::Message;
use serde_json::{json, Value};
use sled_sim::{McpClient, SledOptions, TokioConnect};

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

/// A span as the collector got it, with its resource's `service.name`.
#[derive(Debug, Clone)]
struct Received {
    service: Option<String>,
    span: opentelemetry_proto::tonic::trace::v1::Span,
}

/// An OTLP/HTTP collector on a loopback port: every request to `/v1/traces`, decoded.
#[derive(Clone, Default)]
struct Collector {
    requests: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    /// Requests refused, and why.
    refused: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    async fn start() -> (Collector, String) {
        let collector = Collector::default();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(collector.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        (collector, url)
    }

    fn spans(&self) -> Vec<Received> {
        let requests = self.requests.lock().unwrap();
        let mut out = Vec::new();
        for r in requests.iter() {
            for rs in &r.resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .and_then(|res| string_attribute(&res.attributes, "service.name"));
                for ss in &rs.scope_spans {
                    for span in &ss.spans {
                        out.push(Received {
                            service: service.clone(),
                            span: span.clone(),
                        });
                    }
                }
            }
        }
        out
    }
}

async fn receive(State(c): State<Collector>, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type != "application/x-protobuf" {
        c.refused
            .lock()
            .unwrap()
            .push(format!("content type {content_type:?}"));
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new());
    }
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            c.requests.lock().unwrap().push(request);
            (
                StatusCode::OK,
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
        }
        Err(e) => {
            c.refused.lock().unwrap().push(format!("undecodable: {e}"));
            (StatusCode::BAD_REQUEST, Vec::new())
        }
    }
}

fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            any_value::Value::IntValue(i) => Some(i.to_string()),
            other => Some(format!("{other:?}")),
        }
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `tools/call` of `whoami` on alpha, with `meta` as its `_meta`.
async fn call(c: &mut McpClient<TokioConnect>, id: u64, meta: Value) -> Value {
    let r = c
        .request(
            json!(id),
            "tools/call",
            json!({"name": "whoami", "arguments": {}, "_meta": meta}),
        )
        .await
        .expect("the call is answered");
    assert!(r["result"].is_object(), "{r}");
    r
}

fn unix_nanos(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos()).unwrap()
}

#[tokio::test]
async fn one_client_trace_reaches_the_exported_span_and_the_sled() {
    let (collector, collector_url) = Collector::start().await;
    let mut server = ServerOptions::new(registry(&["alpha", "beta"], Some("alpha")), [7; 32]);
    server.otlp = OtlpConfig::resolve(Some(&collector_url), |_| None).unwrap();
    assert_eq!(
        server.otlp.as_ref().map(|o| o.traces_url.clone()),
        Some(format!("{collector_url}/v1/traces"))
    );
    let stack = Stack::start_with(server, &["alpha", "beta"], SledOptions::default()).await;
    let alpha = stack.fleet.sled("alpha").expect("a story sled");

    let before = SystemTime::now();
    let mut c = McpClient::connect(TokioConnect, &stack.url())
        .await
        .unwrap();
    c.initialize().await.unwrap();
    // A sampled trace, a trace the client did not sample, and a call in no trace.
    call(
        &mut c,
        1,
        json!({"traceparent": format!("00-{TRACE}-{CLIENT_SPAN}-01"), "tracestate": "congo=t61rcWkgMzE"}),
    )
    .await;
    let unsampled = "11111111111111111111111111111111";
    call(
        &mut c,
        2,
        json!({"traceparent": format!("00-{unsampled}-{CLIENT_SPAN}-00")}),
    )
    .await;
    call(&mut c, 3, json!({"progressToken": "p"})).await;
    let after = SystemTime::now();

    // The sled got the client's trace, with a span of the gateway's as the parent.
    let seen: Vec<_> = alpha
        .traces_received()
        .into_iter()
        .filter(|t| t.method == "tools/call")
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].trace_id(), Some(TRACE));
    assert_eq!(seen[0].tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
    let gateway_span = seen[0].parent_span_id().unwrap().to_owned();
    assert_ne!(gateway_span, CLIENT_SPAN, "the gateway's span is between");
    assert_eq!(seen[1].trace_id(), Some(unsampled));

    // Graceful shutdown flushes what is queued.
    stack.stop().await;
    let refused = collector.refused.lock().unwrap().clone();
    assert!(refused.is_empty(), "{refused:?}");
    let spans = collector.spans();
    assert_eq!(
        spans.len(),
        1,
        "one span, of the sampled trace only: {spans:#?}"
    );
    let Received { service, span } = &spans[0];
    assert_eq!(service.as_deref(), Some("mcp-gateway"));
    assert_eq!(hex(&span.trace_id), TRACE, "the client's trace");
    assert_eq!(hex(&span.span_id), gateway_span, "the sled's parent");
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN, "the client's span");
    assert_eq!(span.trace_state, "congo=t61rcWkgMzE");
    assert_eq!(span.kind, SpanKind::Server as i32);
    assert_eq!(span.name, "tools/call whoami");
    for (key, value) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "whoami"),
        ("jsonrpc.request.id", "1"),
        ("mcp_gateway.project", "alpha"),
        ("mcp_gateway.outcome", "ok"),
    ] {
        assert_eq!(
            string_attribute(&span.attributes, key).as_deref(),
            Some(value),
            "{key}: {span:#?}"
        );
    }
    let status = span.status.clone().unwrap_or_default();
    assert_eq!(status.code, SpanStatus::Unset as i32);
    // Wall-clock times, within the calls.
    let (start, end) = (span.start_time_unix_nano, span.end_time_unix_nano);
    assert!(
        unix_nanos(before) <= start && start <= end && end <= unix_nanos(after),
        "{before:?} <= {start} <= {end} <= {after:?}"
    );
}

#[tokio::test]
async fn a_collector_that_never_answers_slows_no_call_and_not_the_shutdown_much() {
    // Accepts connections and never answers them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let mut server = ServerOptions::new(registry(&["alpha"], Some("alpha")), [7; 32]);
    server.otlp = OtlpConfig::resolve(Some(&url), |_| None).unwrap();
    let stack = Stack::start_with(server, &["alpha"], SledOptions::default()).await;
    let mut c = McpClient::connect(TokioConnect, &stack.url())
        .await
        .unwrap();
    c.initialize().await.unwrap();
    for i in 0..20u64 {
        let started = tokio::time::Instant::now();
        let parent = format!("00-{TRACE}-{:016x}-01", i + 1);
        call(&mut c, i, json!({ "traceparent": parent })).await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "call {i} took {:?}",
            started.elapsed()
        );
    }
    // The flush at shutdown gives up after its timeout.
    let stopping = tokio::time::Instant::now();
    stack.stop().await;
    let took = stopping.elapsed();
    assert!(
        took < gateway_server::otlp::FLUSH_TIMEOUT + Duration::from_secs(5),
        "shutdown took {took:?}"
    );
    held.abort();
}
