//! The uplink frame path: arbitrary text (and binary) frames from sleds, on uplinks in every
//! state (awaiting hello, live, replaced, closed), with calls pending on them. Nothing may
//! panic, every frame the gateway sends is JSON, each HTTP request is answered at most once,
//! and at the end every request has its answer.
#![no_main]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use gateway_core::{
    Config, Gateway, HttpRequest, HttpToken, Input, Output, ProjectSpec, Registry, UplinkId,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Frame {
    /// Raw text, as it came.
    Text(String),
    /// A response to the latest request the gateway sent on this uplink, with this JSON
    /// text in place of the result (or of the error, when `error`).
    Respond { body: String, error: bool },
    /// A response to an id the fuzzer picks.
    RespondTo { id: u64, body: String },
    /// A notification naming the latest request in `_meta`.
    Related { method: String, params: String },
    Binary(u16),
    /// A connector sled's word on its server: a state (one the protocol names, or not), a
    /// reason and a restart count.
    Upstream { state: u8, reason: String, restarts: u64 },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Open,
    Hello { uplink: u8, project: u8, protocol: u8 },
    Frame { uplink: u8, frame: Frame },
    Call { project: u8, progress: bool },
    Close { uplink: u8 },
    Advance { ms: u16 },
}

const PROJECTS: [&str; 2] = ["alpha", "beta"];

fuzz_target!(|ops: Vec<Op>| {
    let specs = PROJECTS
        .iter()
        .enumerate()
        .map(|(i, p)| ProjectSpec::new(*p, format!("http://127.0.0.1:{}", 9101 + i)))
        .collect();
    let registry = Registry::from_projects(specs, Some("alpha")).expect("valid")
        // The fuzzed sleds present no token: their projects take them (uplinks are
        // closed by default).
        .allowing_unauthenticated_uplinks();
    let config = Config {
        max_calls_per_sled: 4,
        ..Config::default()
    };
    let mut gw = Gateway::new(registry, config, [1; 32]);
    #[allow(clippy::disallowed_methods)]
    let mut now = Instant::now();
    let mut waiting: HashSet<HttpToken> = HashSet::new();
    let mut next_token = 0u64;
    let mut uplinks = 0u64;
    let mut last_ids: Vec<Option<u64>> = Vec::new();
    let pick = |n: u8, of: u64| UplinkId(u64::from(n) % of.max(1));
    for op in ops.into_iter().take(256) {
        match op {
            Op::Open => {
                gw.handle(now, Input::UplinkOpened { uplink: UplinkId(uplinks) });
                uplinks += 1;
                last_ids.push(None);
            }
            Op::Hello { uplink, project, protocol } => {
                let uplink = pick(uplink, uplinks);
                let project = PROJECTS.get(usize::from(project % 3)).copied().unwrap_or("zeta");
                let text = format!(
                    r#"{{"uplink":"hello","protocol":{},"project":"{project}","sled":"s"}}"#,
                    u32::from(protocol % 3)
                );
                gw.handle(now, Input::UplinkText { uplink, text });
            }
            Op::Frame { uplink, frame } => {
                let uplink = pick(uplink, uplinks);
                let latest = last_ids
                    .get(uplink.0 as usize)
                    .copied()
                    .flatten()
                    .unwrap_or(0);
                let text = match frame {
                    Frame::Text(t) => t,
                    Frame::Respond { body, error } => format!(
                        r#"{{"jsonrpc":"2.0","id":{latest},"{}":{body}}}"#,
                        if error { "error" } else { "result" }
                    ),
                    Frame::RespondTo { id, body } => {
                        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{body}}}"#)
                    }
                    Frame::Related { method, params } => format!(
                        r#"{{"jsonrpc":"2.0","method":{},"params":{{"_meta":{{"io.mcp-gateway/relatedRequest":{latest}}},"x":{params}}}}}"#,
                        serde_json::Value::String(method)
                    ),
                    Frame::Upstream { state, reason, restarts } => format!(
                        r#"{{"uplink":"upstream","state":{},"reason":{},"restarts":{restarts}}}"#,
                        serde_json::Value::String(
                            ["starting", "running", "down", "melting"][usize::from(state % 4)].into()
                        ),
                        serde_json::Value::String(reason)
                    ),
                    Frame::Binary(len) => {
                        gw.handle(now, Input::UplinkBinary { uplink, len: usize::from(len) });
                        String::new()
                    }
                };
                if !text.is_empty() {
                    gw.handle(now, Input::UplinkText { uplink, text });
                }
            }
            Op::Call { project, progress } => {
                let token = HttpToken(next_token);
                next_token += 1;
                waiting.insert(token);
                let project = PROJECTS[usize::from(project) % PROJECTS.len()];
                let meta = if progress { r#","_meta":{"progressToken":"p"}"# } else { "" };
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"show","arguments":{{"project":"{project}"}}{meta}}}}}"#,
                    token.0
                );
                let request = HttpRequest {
                    content_type: Some("application/json".into()),
                    accept: Some("application/json, text/event-stream".into()),
                    body: body.into_bytes(),
                    ..HttpRequest::default()
                };
                gw.handle(now, Input::Http { token, request });
            }
            Op::Close { uplink } => {
                let uplink = pick(uplink, uplinks);
                gw.handle(now, Input::UplinkClosed { uplink });
            }
            Op::Advance { ms } => {
                now += Duration::from_millis(u64::from(ms) * 10);
                gw.handle_timeout(now);
            }
        }
        drain(&mut gw, &mut waiting, &mut last_ids);
    }
    gw.handle(now, Input::Shutdown);
    drain(&mut gw, &mut waiting, &mut last_ids);
    assert!(waiting.is_empty(), "every request got its answer");
    assert_eq!(gw.stats().pending_calls, 0);
});

fn drain(gw: &mut Gateway, waiting: &mut HashSet<HttpToken>, last_ids: &mut [Option<u64>]) {
    while let Some(o) = gw.poll_output() {
        match o {
            Output::Http { token, reply } => {
                assert!(waiting.remove(&token), "one answer per request");
                if let Some(body) = reply.body {
                    let _: serde_json::Value =
                        serde_json::from_str(&body).expect("answers are JSON");
                }
            }
            Output::StreamClose { token } => {
                assert!(waiting.remove(&token), "one answer per request");
            }
            Output::StreamEvent { data, .. } => {
                let _: serde_json::Value = serde_json::from_str(&data).expect("events are JSON");
            }
            Output::UplinkSend { uplink, text } => {
                let v: serde_json::Value =
                    serde_json::from_str(&text).expect("uplink frames are JSON");
                if v["method"].is_string() {
                    if let Some(id) = v["id"].as_u64() {
                        last_ids[uplink.0 as usize] = Some(id);
                    }
                }
            }
            Output::StreamOpen { .. } | Output::UplinkClose { .. } | Output::Probe { .. } => {}
            Output::Span(_) => panic!("a span with span export off"),
            Output::Cluster(_) => panic!("a cluster action outside any cluster"),
            Output::SavePins { text } => {
                gateway_core::Pins::parse(&text).expect("the gateway writes pin files it can read");
            }
        }
    }
}
