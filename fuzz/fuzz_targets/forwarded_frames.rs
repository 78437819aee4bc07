//! Whatever clients send, every frame the gateway sends up an uplink is JSON that a strict
//! reader (serde_json with its defaults: UTF-8, escapes that decode to Unicode scalar values,
//! numbers within a double's range, nesting within 128 levels) reads. A frame that does not
//! parse is a crash: a sled would fail to read it and the call would hang.
//!
//! The input is lines; each line's first byte picks what the client sends and the rest is put
//! in as written: `c` a tools/call's `arguments`, `r` resources/read's params, `p` prompts/get's
//! params, `m` a 2026-07-28 tools/call's `arguments`, `a` an answer (`result`) to the sled's
//! pending sampling request, `i` the answer in a 2026-07-28 retry's `inputResponses` to the
//! sled's sampling request of a stateless call (the multi round-trip pattern), anything else a
//! whole body.
#![no_main]

use std::time::Instant;

use gateway_core::{
    Config, Gateway, HttpMethod, HttpRequest, HttpToken, Input, Output, ProjectSpec, Registry,
    UplinkId,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const ENVELOPE: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}"#;

struct World {
    gw: Gateway,
    now: Instant,
    token: u64,
    session: Option<String>,
    /// The gateway's ids of the calls on the uplink, oldest first.
    calls: Vec<u64>,
    /// The id the gateway gave the sled's sampling request on the client's stream.
    sampling: Option<String>,
    /// The `requestState` and input key of a stateless call's `input_required` answer.
    input: Option<(String, String)>,
}

impl World {
    fn drain(&mut self) {
        while let Some(o) = self.gw.poll_output() {
            match o {
                Output::UplinkSend { text, .. } => {
                    let v: Value = match serde_json::from_str(&text) {
                        Ok(v) => v,
                        Err(e) => panic!("a strict reader rejects a frame ({e}): {text}"),
                    };
                    if v["method"] == "tools/call" {
                        if let Some(id) = v["id"].as_u64() {
                            self.calls.push(id);
                        }
                    }
                }
                Output::Http { reply, .. } => {
                    let result = reply
                        .body
                        .as_deref()
                        .and_then(|b| serde_json::from_str::<Value>(b).ok())
                        .map(|v| v["result"].clone())
                        .unwrap_or_default();
                    if result["resultType"] == "input_required" {
                        let state = result["requestState"].as_str().map(str::to_owned);
                        let key = result["inputRequests"]
                            .as_object()
                            .and_then(|m| m.keys().next().cloned());
                        if let (Some(s), Some(k)) = (state, key) {
                            self.input = Some((s, k));
                        }
                    }
                    if self.session.is_none() {
                        self.session = reply
                            .headers
                            .iter()
                            .find(|(h, _)| *h == "Mcp-Session-Id")
                            .map(|(_, v)| v.clone());
                    }
                }
                Output::StreamEvent { data, .. } => {
                    let v: Value = serde_json::from_str(&data).expect("events are JSON");
                    if v["method"] == "sampling/createMessage" {
                        self.sampling = v["id"].as_str().map(str::to_owned);
                    }
                }
                _ => {}
            }
        }
    }

    fn post(&mut self, body: Vec<u8>, modern: Option<&str>) {
        self.token += 1;
        let mut request = HttpRequest {
            method: HttpMethod::Post,
            session: self.session.clone(),
            content_type: Some("application/json".into()),
            accept: Some("application/json, text/event-stream".into()),
            body,
            ..HttpRequest::default()
        };
        if let Some(name) = modern {
            request.session = None;
            request.protocol_version = Some("2026-07-28".into());
            request.mcp_method = Some("tools/call".into());
            request.mcp_name = Some(name.into());
        }
        let token = HttpToken(self.token);
        self.gw.handle(self.now, Input::Http { token, request });
        self.drain();
    }

    fn sled(&mut self, text: String) {
        self.gw.handle(self.now, Input::UplinkText { uplink: UplinkId(0), text });
        self.drain();
    }
}

fuzz_target!(|data: &[u8]| {
    let registry = Registry::from_projects(
        vec![ProjectSpec::new("alpha", "http://127.0.0.1:1")],
        Some("alpha"),
    )
    .unwrap()
    // The fuzzed sleds present no token: their projects take them (uplinks are
    // closed by default).
    .allowing_unauthenticated_uplinks();
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let mut w = World {
        gw: Gateway::new(registry, Config::default(), [0; 32]),
        now,
        token: 0,
        session: None,
        calls: Vec::new(),
        sampling: None,
        input: None,
    };
    w.post(
        br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"f","version":"0"}}}"#.to_vec(),
        None,
    );
    w.gw.handle(now, Input::UplinkOpened { uplink: UplinkId(0) });
    w.sled(r#"{"uplink":"hello","protocol":1,"project":"alpha","sled":"alpha"}"#.into());
    let tools = r#"[{"name":"show","inputSchema":{"type":"object"}}]"#;
    w.sled(format!(r#"{{"jsonrpc":"2.0","id":0,"result":{{"tools":{tools}}}}}"#));
    // One call the sled asks a sampling of, so a client's answer has somewhere to go.
    w.post(
        br#"{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"show","arguments":{}}}"#.to_vec(),
        None,
    );
    if let Some(&call) = w.calls.last() {
        w.sled(format!(
            r#"{{"jsonrpc":"2.0","id":"q","method":"sampling/createMessage","params":{{"messages":[],"maxTokens":1,"_meta":{{"io.mcp-gateway/relatedRequest":{call}}}}}}}"#
        ));
    }
    // And a stateless one, answered input_required, whose retry carries the client's answer.
    w.post(
        format!(r#"{{"jsonrpc":"2.0","id":"m","method":"tools/call","params":{{"_meta":{ENVELOPE},"name":"show","arguments":{{}}}}}}"#).into_bytes(),
        Some("show"),
    );
    if let Some(&call) = w.calls.last() {
        w.sled(format!(
            r#"{{"jsonrpc":"2.0","id":"q2","method":"sampling/createMessage","params":{{"messages":[],"maxTokens":1,"_meta":{{"io.mcp-gateway/relatedRequest":{call}}}}}}}"#
        ));
    }
    for (i, line) in data.split(|&b| b == b'\n').take(16).enumerate() {
        let Some((&what, rest)) = line.split_first() else { continue };
        let wrap = |head: &str, tail: &str| [head.as_bytes(), rest, tail.as_bytes()].concat();
        match what {
            b'c' => w.post(
                wrap(
                    &format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"show","arguments":"#),
                    "}}",
                ),
                None,
            ),
            b'r' => w.post(
                wrap(&format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"resources/read","params":"#), "}"),
                None,
            ),
            b'p' => w.post(
                wrap(&format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"prompts/get","params":"#), "}"),
                None,
            ),
            b'm' => w.post(
                wrap(
                    &format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"_meta":{ENVELOPE},"name":"show","arguments":"#),
                    "}}",
                ),
                Some("show"),
            ),
            b'i' => {
                let (state, key) = w.input.clone().unwrap_or_else(|| ("rs-0".into(), "sampling-1".into()));
                let (state, key) = (Value::String(state), Value::String(key));
                w.post(
                    wrap(
                        &format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"_meta":{ENVELOPE},"name":"show","arguments":{{}},"requestState":{state},"inputResponses":{{{key}:"#),
                        "}}}",
                    ),
                    Some("show"),
                );
            }
            b'a' => {
                let id = w.sampling.clone().unwrap_or_else(|| "gw-req-1".into());
                let id = serde_json::to_string(&id).expect("a string serialises");
                w.post(wrap(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#), "}"), None);
            }
            _ => w.post(line.to_vec(), None),
        }
    }
});
