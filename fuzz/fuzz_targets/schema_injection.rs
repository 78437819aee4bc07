//! Whatever tool list a sled reports, the gateway's merged `tools/list` is valid JSON, lists
//! only tools with valid names, and gives every listed project tool a `project` property
//! (its own, untouched, when it declared one); nothing panics.
#![no_main]

use std::time::Instant;

use gateway_core::{
    Config, Gateway, HttpMethod, HttpRequest, HttpToken, Input, Output, ProjectSpec, Registry,
    UplinkId,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|tools: &str| {
    let registry = Registry::from_projects(
        vec![ProjectSpec::new("alpha", "http://127.0.0.1:1")],
        Some("alpha"),
    )
    .unwrap()
    // The fuzzed sleds present no token: their projects take them (uplinks are
    // closed by default).
    .allowing_unauthenticated_uplinks();
    let mut gw = Gateway::new(registry, Config::default(), [0; 32]);
    #[allow(clippy::disallowed_methods)]
    let now = Instant::now();
    let u = UplinkId(0);
    gw.handle(now, Input::UplinkOpened { uplink: u });
    let hello = r#"{"uplink":"hello","protocol":1,"project":"alpha","sled":"alpha"}"#;
    gw.handle(now, Input::UplinkText { uplink: u, text: hello.into() });
    // The gateway's tools/list request: answer it with the fuzzed tools.
    let mut list_id = None;
    while let Some(o) = gw.poll_output() {
        if let Output::UplinkSend { text, .. } = o {
            let v: Value = serde_json::from_str(&text).expect("the gateway sends JSON");
            if v["method"] == "tools/list" {
                list_id = v["id"].as_u64();
            }
        }
    }
    let id = list_id.expect("a tools/list after hello");
    let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":{tools}}}}}"#);
    gw.handle(now, Input::UplinkText { uplink: u, text });
    while gw.poll_output().is_some() {}
    let request = HttpRequest {
        method: HttpMethod::Post,
        content_type: Some("application/json".into()),
        body: br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.to_vec(),
        ..HttpRequest::default()
    };
    gw.handle(now, Input::Http { token: HttpToken(0), request });
    let mut answered = false;
    while let Some(o) = gw.poll_output() {
        if let Output::Http { reply, .. } = o {
            answered = true;
            let v: Value = serde_json::from_str(reply.body.as_deref().unwrap()).expect("JSON");
            for t in v["result"]["tools"].as_array().expect("a tools array") {
                let name = t["name"].as_str().expect("every listed tool has a name");
                assert!((1..=128).contains(&name.len()));
                assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)));
                // The gateway's own tools are answered by the gateway, not routed.
                if !gateway_core::GATEWAY_TOOLS.contains(&name) {
                    let project = &t["inputSchema"]["properties"]["project"];
                    assert!(!project.is_null(), "{name} has no project property: {t}");
                }
            }
        }
    }
    assert!(answered);
});
