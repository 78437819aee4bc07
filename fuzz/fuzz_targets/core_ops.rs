//! An arbitrary sequence of events applied to the core state machine: HTTP bodies from clients,
//! frames from sleds, uplinks opening and closing, time passing. Nothing may panic, every HTTP
//! request gets exactly one reply, and every reply body is JSON.
#![no_main]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use gateway_core::{
    Config, Gateway, HttpMethod, HttpRequest, HttpToken, Input, Output, ProjectSpec, Registry,
    UplinkId,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Post { session: Option<u8>, body: Vec<u8> },
    /// A well-formed tools/call with fuzzed arguments text.
    Call { session: Option<u8>, id: u16, tool: u8, arguments: String },
    Initialize,
    /// A tools/call asking for progress, answered on a stream when `sse`.
    CallWithProgress { session: Option<u8>, id: u16, token: u8, sse: bool },
    Cancel { session: u8, id: u16 },
    Get { session: Option<u8>, last_event_id: Option<u16> },
    /// A progress notification for the latest request sent on an uplink.
    Progress { uplink: u8, progress: u16 },
    Delete { session: u8 },
    Abort { token: u8 },
    Open,
    Hello { uplink: u8, project: u8 },
    Text { uplink: u8, text: String },
    /// A response to the n-th frame the gateway sent on an uplink.
    Respond { uplink: u8, result: String },
    Close { uplink: u8 },
    Advance { ms: u16 },
    Shutdown,
}

const PROJECTS: [&str; 3] = ["alpha", "beta", "gamma"];
const TOOLS: [&str; 7] = [
    "show",
    "switch_project",
    "list_projects",
    "create_story",
    "aggregate_pipeline_status",
    "gateway_health",
    "fleet_identity",
];

fuzz_target!(|ops: Vec<Op>| {
    let specs = PROJECTS
        .iter()
        .map(|p| ProjectSpec::new(*p, "http://127.0.0.1:1"))
        .collect();
    let registry = Registry::from_projects(specs, Some("alpha")).unwrap()
        // The fuzzed sleds present no token: their projects take them (uplinks are
        // closed by default).
        .allowing_unauthenticated_uplinks();
    // Small limits, so that sequences reach them: eviction, 503, too_many_calls.
    let config = Config {
        max_sessions: 4,
        max_calls_per_session: 2,
        max_calls_per_sled: 3,
        ..Config::default()
    };
    let mut gw = Gateway::new(registry, config, [0; 32]);
    #[allow(clippy::disallowed_methods)]
    let mut now = Instant::now();
    let mut sessions: Vec<String> = Vec::new();
    let mut waiting: HashSet<HttpToken> = HashSet::new();
    let mut streams: HashSet<HttpToken> = HashSet::new();
    let mut next = 0u64;
    let mut uplinks = 0u64;
    let mut last_ids: Vec<Option<u64>> = Vec::new();
    for op in ops {
        let session = |s: Option<u8>, sessions: &Vec<String>| {
            s.and_then(|i| sessions.get(i as usize % sessions.len().max(1)).cloned())
        };
        let mut post = |gw: &mut Gateway, session: Option<String>, body: Vec<u8>| {
            let token = HttpToken(next);
            next += 1;
            waiting.insert(token);
            let request = HttpRequest {
                method: HttpMethod::Post,
                session,
                content_type: Some("application/json".into()),
                body,
                ..HttpRequest::default()
            };
            gw.handle(now, Input::Http { token, request });
        };
        match op {
            Op::Post { session: s, body } => post(&mut gw, session(s, &sessions), body),
            Op::Call { session: s, id, tool, arguments } => {
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{}","arguments":{arguments}}}}}"#,
                    TOOLS[tool as usize % TOOLS.len()]
                );
                post(&mut gw, session(s, &sessions), body.into_bytes())
            }
            Op::CallWithProgress { session: s, id, token, sse } => {
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"show","arguments":{{"project":"beta"}},"_meta":{{"progressToken":{token}}}}}}}"#
                );
                let token = HttpToken(next);
                next += 1;
                waiting.insert(token);
                let accept = if sse { "application/json, text/event-stream" } else { "application/json" };
                let request = HttpRequest {
                    session: session(s, &sessions),
                    content_type: Some("application/json".into()),
                    accept: Some(accept.into()),
                    body: body.into_bytes(),
                    ..HttpRequest::default()
                };
                gw.handle(now, Input::Http { token, request });
            }
            Op::Cancel { session: s, id } => {
                let body = format!(r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#);
                post(&mut gw, session(Some(s), &sessions), body.into_bytes())
            }
            Op::Get { session: s, last_event_id } => {
                let token = HttpToken(next);
                next += 1;
                waiting.insert(token);
                let request = HttpRequest {
                    method: HttpMethod::Get,
                    session: session(s, &sessions),
                    accept: Some("text/event-stream".into()),
                    last_event_id: last_event_id.map(|l| l.to_string()),
                    ..HttpRequest::default()
                };
                gw.handle(now, Input::Http { token, request });
            }
            Op::Progress { uplink, progress } => {
                let u = u64::from(uplink) % uplinks.max(1);
                if let Some(Some(id)) = last_ids.get(u as usize) {
                    let text = format!(
                        r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"gw-{u}-{id}","progress":{progress}}}}}"#
                    );
                    gw.handle(now, Input::UplinkText { uplink: UplinkId(u), text });
                }
            }
            Op::Initialize => post(
                &mut gw,
                None,
                br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#.to_vec(),
            ),
            Op::Delete { session: s } => {
                if let Some(s) = session(Some(s), &sessions) {
                    let token = HttpToken(next);
                    next += 1;
                    waiting.insert(token);
                    let request = HttpRequest { method: HttpMethod::Delete, session: Some(s), ..HttpRequest::default() };
                    gw.handle(now, Input::Http { token, request });
                }
            }
            Op::Abort { token } => {
                let token = HttpToken(u64::from(token));
                streams.remove(&token);
                if waiting.remove(&token) {
                    gw.handle(now, Input::HttpAborted { token });
                }
            }
            Op::Open => {
                gw.handle(now, Input::UplinkOpened { uplink: UplinkId(uplinks) });
                uplinks += 1;
                last_ids.push(None);
            }
            Op::Hello { uplink, project } => {
                let text = format!(
                    r#"{{"uplink":"hello","protocol":1,"project":"{}","sled":"s"}}"#,
                    PROJECTS[project as usize % PROJECTS.len()]
                );
                gw.handle(now, Input::UplinkText { uplink: UplinkId(u64::from(uplink) % uplinks.max(1)), text });
            }
            Op::Text { uplink, text } => {
                gw.handle(now, Input::UplinkText { uplink: UplinkId(u64::from(uplink) % uplinks.max(1)), text });
            }
            Op::Respond { uplink, result } => {
                let u = u64::from(uplink) % uplinks.max(1);
                if let Some(Some(id)) = last_ids.get(u as usize) {
                    let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
                    gw.handle(now, Input::UplinkText { uplink: UplinkId(u), text });
                }
            }
            Op::Close { uplink } => {
                gw.handle(now, Input::UplinkClosed { uplink: UplinkId(u64::from(uplink) % uplinks.max(1)) });
            }
            Op::Advance { ms } => {
                now += Duration::from_millis(u64::from(ms) * 10);
                gw.handle_timeout(now);
            }
            Op::Shutdown => gw.handle(now, Input::Shutdown),
        }
        while let Some(o) = gw.poll_output() {
            match o {
                Output::Http { token, reply } => {
                    assert!(waiting.remove(&token), "one reply per request");
                    if let Some(body) = reply.body {
                        let v: serde_json::Value = serde_json::from_str(&body).expect("reply bodies are JSON");
                        if let Some(s) = v["result"]["protocolVersion"].as_str() {
                            let _ = s;
                            if let Some((_, id)) = reply.headers.iter().find(|(h, _)| *h == "Mcp-Session-Id") {
                                sessions.push(id.clone());
                            }
                        }
                    }
                }
                Output::UplinkSend { uplink, text } => {
                    let v: serde_json::Value = serde_json::from_str(&text).expect("uplink frames are JSON");
                    if let Some(id) = v["id"].as_u64() {
                        if v["method"].is_string() {
                            last_ids[uplink.0 as usize] = Some(id);
                        }
                    }
                }
                Output::UplinkClose { .. } | Output::Probe { .. } => {}
                Output::Span(_) => panic!("a span with span export off"),
                Output::Cluster(_) => panic!("a cluster action outside any cluster"),
                Output::SavePins { text } => {
                    gateway_core::Pins::parse(&text).expect("the gateway writes pin files it can read");
                }
                Output::StreamOpen { token } => {
                    assert!(waiting.contains(&token), "a stream answers a waiting request");
                    streams.insert(token);
                }
                Output::StreamEvent { token, data, .. } => {
                    assert!(streams.contains(&token), "events only on open streams");
                    let _: serde_json::Value = serde_json::from_str(&data).expect("events are JSON");
                }
                Output::StreamClose { token } => {
                    assert!(streams.remove(&token), "close only open streams");
                    waiting.remove(&token);
                }
            }
        }
    }
    // Whatever is still waiting is a forwarded call: shutdown answers all of them.
    gw.handle(now, Input::Shutdown);
    while let Some(o) = gw.poll_output() {
        match o {
            Output::Http { token, .. } => assert!(waiting.remove(&token)),
            Output::StreamClose { token } => assert!(waiting.remove(&token)),
            _ => {}
        }
    }
    assert!(waiting.is_empty(), "every request got a reply");
    // Every forwarded call ended exactly once, and every refusal was counted.
    let m = gw.metrics();
    assert_eq!(m.stats.pending_calls, 0);
    let count = |refused: bool| -> u64 {
        m.calls
            .iter()
            .filter(|c| (c.outcome == gateway_core::Outcome::Refused) == refused)
            .map(|c| c.count)
            .sum()
    };
    assert_eq!(count(false), m.stats.calls_forwarded, "one outcome per forwarded call");
    assert_eq!(count(true), m.stats.calls_refused);
});
