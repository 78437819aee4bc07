use std::time::Duration;

use serde_json::{json, Value};

use super::Harness;
use crate::{HttpMethod, Input};

fn error_kind(v: &Value) -> &str {
    v["error"]["data"]["kind"].as_str().unwrap_or("<none>")
}

#[test]
fn initialize_then_tools_list_merges_default_project_tools() {
    let mut h = Harness::new();
    let s = h.initialize();
    assert_eq!(s.len(), 32);
    let before = h.rpc(Some(&s), json!(1), "tools/list", json!({}));
    let names: Vec<&str> = before["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, crate::GATEWAY_TOOLS);
    h.connect_sled("alpha");
    let after = h.rpc(Some(&s), json!(2), "tools/list", json!({}));
    insta::assert_json_snapshot!("merged_tools_list", after);
}

#[test]
fn per_call_project_routes_there_and_is_stripped() {
    let mut h = Harness::new();
    let s = h.initialize();
    let alpha = h.connect_sled("alpha");
    let beta = h.connect_sled("beta");
    let t = h.call(
        Some(&s),
        json!("req-\"1\""),
        "create_story",
        json!({"name":"Fix login","project":"beta"}),
    );
    assert!(
        h.take_frames(alpha).is_empty(),
        "nothing goes to the default project"
    );
    let frames = h.take_frames(beta);
    assert_eq!(frames.len(), 1);
    assert_eq!(
        frames[0]["params"],
        json!({"name":"create_story","arguments":{"name":"Fix login"}})
    );
    assert!(
        frames[0]["id"].is_u64(),
        "the gateway's own id goes up the uplink"
    );
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":frames[0]["id"],"result":{"content":[],"structuredContent":{"project":"beta"}}}));
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["id"], json!("req-\"1\""));
    assert_eq!(r["result"]["structuredContent"]["project"], "beta");
    // Without `project`, the session's default.
    let t = h.send(HttpMethod::Post, Some(&s), r#"{"jsonrpc":"2.0","id":"1\u002e50","method":"tools/call","params":{"name":"show","arguments":{"story_id":"alpha-1"}}}"#);
    assert_eq!(h.sled_answers_all(alpha, "alpha"), 1);
    let raw = h.replies.remove(&t).unwrap().body.unwrap();
    assert!(
        raw.starts_with(r#"{"jsonrpc":"2.0","id":"1\u002e50","#),
        "the client's id text comes back exactly: {raw}"
    );
}

#[test]
fn resolution_errors() {
    let mut h = Harness::new();
    let s = h.initialize();
    h.connect_sled("alpha");
    let r = h.rpc(
        Some(&s),
        json!(1),
        "tools/call",
        json!({"name":"show","arguments":{"project":"zeta"}}),
    );
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(
        r["error"]["data"]["registered"],
        json!(["alpha", "beta", "gamma"])
    );
    assert!(r["error"]["message"].as_str().unwrap().contains("'zeta'"));
    let r = h.rpc(
        Some(&s),
        json!(2),
        "tools/call",
        json!({"name":"show","arguments":{"project":"gamma"}}),
    );
    assert_eq!(r["error"]["code"], -32603);
    assert_eq!(
        r["error"]["data"],
        json!({"kind":"sled_not_connected","project":"gamma","sled":"gamma"})
    );
    let r = h.rpc(
        Some(&s),
        json!(3),
        "tools/call",
        json!({"name":"show","arguments":{"project":7}}),
    );
    assert_eq!(
        (r["error"]["code"].as_i64(), error_kind(&r)),
        (Some(-32602), "project_not_string")
    );
    let r = h.rpc(
        Some(&s),
        json!(4),
        "tools/call",
        json!({"name":"show","arguments":{"project":""}}),
    );
    assert_eq!(
        (r["error"]["code"].as_i64(), error_kind(&r)),
        (Some(-32602), "project_empty")
    );
    let r = h.rpc(Some(&s), json!(5), "tools/call", json!({"name":5}));
    assert_eq!(error_kind(&r), "invalid_params");
    let r = h.rpc(
        Some(&s),
        json!(6),
        "tools/call",
        json!({"name":"show","arguments":[1]}),
    );
    assert_eq!(error_kind(&r), "invalid_params");
    let r = h.rpc(Some(&s), json!(7), "tasks/update", json!({}));
    assert_eq!(
        (r["error"]["code"].as_i64(), error_kind(&r)),
        (Some(-32601), "method_not_found")
    );
}

#[test]
fn no_default_says_how_to_choose() {
    let mut h = Harness::with(&["alpha", "beta"], None);
    let s = h.initialize();
    let r = h.rpc(
        Some(&s),
        json!(1),
        "tools/call",
        json!({"name":"show","arguments":{}}),
    );
    assert_eq!(error_kind(&r), "no_project_selected");
    let m = r["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("\"project\"") && m.contains("switch_project"),
        "{m}"
    );
    // Sessionless, too.
    let r = h.rpc(
        None,
        json!(1),
        "tools/call",
        json!({"name":"show","arguments":{}}),
    );
    assert_eq!(error_kind(&r), "no_project_selected");
}

#[test]
fn switch_project_is_per_session() {
    let mut h = Harness::new();
    let (a, b) = (h.initialize(), h.initialize());
    assert_ne!(a, b);
    let alpha = h.connect_sled("alpha");
    let beta = h.connect_sled("beta");
    let r = h.rpc(
        Some(&a),
        json!(1),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta"}}),
    );
    assert_eq!(
        r["result"]["structuredContent"],
        json!({"project":"beta","previous":"alpha","live":true,"scope":"session"})
    );
    // b still goes to alpha; a goes to beta.
    let tb = h.call(Some(&b), json!(1), "show", json!({"story_id":"x"}));
    let ta = h.call(Some(&a), json!(1), "show", json!({"story_id":"x"}));
    assert_eq!(h.sled_answers_all(alpha, "alpha"), 1);
    assert_eq!(h.sled_answers_all(beta, "beta"), 1);
    assert_eq!(
        h.reply_json(ta).unwrap()["result"]["structuredContent"]["project"],
        "beta"
    );
    assert_eq!(
        h.reply_json(tb).unwrap()["result"]["structuredContent"]["project"],
        "alpha"
    );
    // list_projects marks each caller's own default.
    let active = |h: &mut Harness, s: Option<&str>| -> Vec<String> {
        let r = h.rpc(s, json!(9), "tools/call", json!({"name":"list_projects"}));
        r["result"]["structuredContent"]["projects"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["active"] == true)
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(active(&mut h, Some(&a)), ["beta"]);
    assert_eq!(active(&mut h, Some(&b)), ["alpha"]);
    assert_eq!(
        active(&mut h, None),
        ["alpha"],
        "sessionless requests use the file's default"
    );
    let r = h.rpc(
        Some(&a),
        json!(2),
        "tools/call",
        json!({"name":"list_projects"}),
    );
    insta::assert_json_snapshot!("list_projects", r);
    // Bad switches.
    let r = h.rpc(
        Some(&a),
        json!(3),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"zeta"}}),
    );
    assert_eq!(error_kind(&r), "unknown_project");
    let r = h.rpc(
        Some(&a),
        json!(4),
        "tools/call",
        json!({"name":"switch_project","arguments":{}}),
    );
    assert_eq!(error_kind(&r), "invalid_params");
    let r = h.rpc(
        Some(&a),
        json!(5),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta","x":1}}),
    );
    assert_eq!(error_kind(&r), "invalid_params");
    let r = h.rpc(
        None,
        json!(6),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta"}}),
    );
    assert_eq!(
        (r["error"]["code"].as_i64(), error_kind(&r)),
        (Some(-32602), "switch_without_session")
    );
    assert_eq!(h.gw.session_default(&a), Some("beta"));
}

#[test]
fn sessions_end_and_unknown_ones_are_404() {
    let mut h = Harness::new();
    let s = h.initialize();
    let r = h.post(
        Some("nope"),
        json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
    );
    assert_eq!(r.status, 404);
    let t = h.send(HttpMethod::Delete, Some(&s), "");
    assert_eq!(h.replies.remove(&t).unwrap().status, 204);
    let r = h.post(Some(&s), json!({"jsonrpc":"2.0","id":1,"method":"ping"}));
    assert_eq!(r.status, 404);
    let t = h.send(HttpMethod::Delete, None, "");
    assert_eq!(h.replies.remove(&t).unwrap().status, 400);
    let t = h.send(HttpMethod::Get, None, "");
    assert_eq!(
        h.replies.remove(&t).unwrap().status,
        400,
        "GET needs a session"
    );
    let r = h.post(
        None,
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    );
    assert_eq!((r.status, r.body), (202, None));
    let r = h.post(None, json!({"jsonrpc":"2.0","id":1,"method":"ping"}));
    assert_eq!(
        r.body.as_deref(),
        Some(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#)
    );
}

#[test]
fn malformed_http_input() {
    let mut h = Harness::new();
    let t = h.send(HttpMethod::Post, None, "{not json");
    let r = h.replies.remove(&t).unwrap();
    assert_eq!(r.status, 400);
    assert!(r.body.unwrap().contains("-32700"));
    let t = h.send(
        HttpMethod::Post,
        None,
        r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
    );
    assert_eq!(h.replies.remove(&t).unwrap().status, 400);
    let token = crate::HttpToken(999);
    h.handle(Input::Http {
        token,
        request: crate::HttpRequest {
            method: HttpMethod::Post,
            session: None,
            content_type: Some("text/plain".into()),
            body: b"{}".to_vec(),
            ..crate::HttpRequest::default()
        },
    });
    assert_eq!(h.replies.remove(&token).unwrap().status, 415);
}

#[test]
fn deadline_expiry_names_project_and_time_and_drops_late_response() {
    let mut h = Harness::new();
    let s = h.initialize();
    let beta = h.connect_sled("beta");
    let t = h.call(
        Some(&s),
        json!(1),
        "show",
        json!({"project":"beta","story_id":"x"}),
    );
    let call = h.take_frames(beta).remove(0);
    // The sled answers pings but not the call.
    for _ in 0..29 {
        h.advance(Duration::from_secs(1));
        h.sled_says(beta, json!({"uplink":"pong","seq":0}));
    }
    assert!(!h.replies.contains_key(&t));
    h.advance(Duration::from_secs(1));
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["code"], -32001);
    assert_eq!(r["error"]["data"]["project"], "beta");
    assert_eq!(r["error"]["data"]["waited_ms"], 30_000);
    assert_eq!(r["error"]["data"]["outcome"], "unknown");
    let frames = h.take_frames(beta);
    assert!(h.gw.is_live("beta"));
    assert!(
        frames
            .iter()
            .any(|f| f["method"] == "notifications/cancelled"
                && f["params"]["requestId"] == call["id"]),
        "{frames:?}"
    );
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":call["id"],"result":{}}));
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":12345,"result":{}}));
    let st = h.gw.stats();
    assert_eq!(
        (
            st.calls_timed_out,
            st.responses_dropped_late,
            st.responses_dropped_unknown
        ),
        (1, 1, 1)
    );
    assert!(h.replies.is_empty());
}

#[test]
fn uplink_close_fails_pending_calls_at_once() {
    let mut h = Harness::new();
    let s = h.initialize();
    let beta = h.connect_sled("beta");
    let t1 = h.call(
        Some(&s),
        json!(1),
        "show",
        json!({"project":"beta","story_id":"x"}),
    );
    let t2 = h.call(
        None,
        json!(1),
        "show",
        json!({"project":"beta","story_id":"y"}),
    );
    h.handle(Input::UplinkClosed { uplink: beta });
    for t in [t1, t2] {
        let r = h.reply_json(t).unwrap();
        assert_eq!(r["error"]["code"], -32603);
        assert_eq!(r["error"]["data"]["reason"], "closed");
        assert!(r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sled 'beta'"));
    }
    assert_eq!(h.gw.stats().pending_calls, 0);
    let r = h.rpc(
        Some(&s),
        json!(3),
        "tools/call",
        json!({"name":"show","arguments":{"project":"beta"}}),
    );
    assert_eq!(error_kind(&r), "sled_not_connected");
}

#[test]
fn a_second_uplink_replaces_the_first() {
    let mut h = Harness::new();
    let old = h.connect_sled("beta");
    let t = h.call(None, json!(1), "show", json!({"project":"beta"}));
    let new = h.connect_sled("beta");
    assert_eq!(h.closed[&old].0, 4001);
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["data"]["reason"], "replaced");
    let t = h.call(None, json!(2), "show", json!({"project":"beta"}));
    assert_eq!(h.sled_answers_all(new, "beta"), 1);
    assert!(h.reply_json(t).unwrap()["result"].is_object());
    // Frames still arriving on the old connection are ignored.
    h.sled_says(old, json!({"jsonrpc":"2.0","id":0,"result":{}}));
    assert!(h.replies.is_empty());
}

#[test]
fn heartbeats_find_a_silent_sled() {
    let mut h = Harness::new();
    let beta = h.connect_sled("beta");
    let t = h.call(None, json!(1), "show", json!({"project":"beta"}));
    h.take_frames(beta);
    h.advance(Duration::from_secs(5));
    let pings = h.take_frames(beta);
    assert_eq!(pings, [json!({"uplink":"ping","seq":1})]);
    h.sled_says(beta, json!({"uplink":"pong","seq":1}));
    h.advance(Duration::from_secs(14));
    assert!(!h.closed.contains_key(&beta), "a pong keeps it alive");
    h.advance(Duration::from_secs(1));
    assert_eq!(
        h.closed[&beta].0, 4002,
        "15 s of silence, found at the next heartbeat"
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["data"]["reason"], "heartbeat_timeout");
    assert!(!h.gw.is_live("beta"));
}

#[test]
fn hello_problems_close_the_uplink() {
    let mut h = Harness::new();
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"zeta","sled":"z"}),
    );
    assert_eq!(h.closed[&u].0, 4003);
    assert!(h.closed[&u].1.contains("'zeta' is not registered"));
    assert!(
        !h.closed[&u].1.contains("alpha"),
        "an uplink that proved nothing learns no registered name"
    );
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":9,"project":"alpha","sled":"a"}),
    );
    assert_eq!(h.closed[&u].0, 4004);
    let u = h.open_uplink();
    h.sled_says(u, json!({"jsonrpc":"2.0","method":"x"}));
    assert_eq!(h.closed[&u].0, 4004);
    let u = h.open_uplink();
    h.handle(Input::UplinkText {
        uplink: u,
        text: "garbage".into(),
    });
    assert_eq!(h.closed[&u].0, 4004);
    let u = h.open_uplink();
    h.advance(Duration::from_secs(10));
    assert_eq!(h.closed[&u].0, 4005);
    assert_eq!(h.gw.stats().live_uplinks, 0);
}

#[test]
fn live_uplink_survives_garbage() {
    let mut h = Harness::new();
    let beta = h.connect_sled("beta");
    h.handle(Input::UplinkText {
        uplink: beta,
        text: "garbage".into(),
    });
    h.handle(Input::UplinkBinary {
        uplink: beta,
        len: 3,
    });
    h.sled_says(
        beta,
        json!({"uplink":"welcome","protocol":1,"heartbeat_ms":1}),
    );
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":"abc","result":{}}));
    assert!(h.gw.is_live("beta"));
    // A request from the sled gets method-not-found back.
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":4,"method":"sampling/createMessage"}),
    );
    let f = h.take_frames(beta);
    assert_eq!(f.last().unwrap()["error"]["code"], -32601);
    assert_eq!(f.last().unwrap()["id"], 4);
    // A malformed response to a real call fails that call clearly.
    let t = h.call(None, json!(1), "show", json!({"project":"beta"}));
    let id = h.take_frames(beta)[0]["id"].clone();
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":id}));
    assert_eq!(error_kind(&h.reply_json(t).unwrap()), "bad_sled_response");
}

#[test]
fn sled_tool_pages_and_list_changed() {
    let mut h = Harness::new();
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"alpha","sled":"alpha"}),
    );
    let f = h.take_frames(u);
    h.sled_says(u, json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":[{"name":"a","inputSchema":{"type":"object"}}],"nextCursor":"p2"}}));
    let f = h.take_frames(u);
    assert_eq!(f[0]["params"], json!({"cursor":"p2"}));
    h.sled_says(u, json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"tools":[{"name":"b","inputSchema":{"type":"object"}}]}}));
    let names = |h: &mut Harness| -> Vec<String> {
        let r = h.rpc(None, json!(1), "tools/list", json!({}));
        r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let with = |extra: &[&str]| -> Vec<String> {
        crate::GATEWAY_TOOLS
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect()
    };
    assert_eq!(names(&mut h), with(&["a", "b"]));
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
    );
    let f = h.take_frames(u);
    h.sled_says(u, json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"tools":[{"name":"c","inputSchema":{"type":"object"}}]}}));
    assert_eq!(names(&mut h), with(&["c"]));
    h.handle(Input::UplinkClosed { uplink: u });
    assert_eq!(
        names(&mut h),
        with(&[]),
        "a gone sled's tools are not listed"
    );
}

#[test]
fn a_tool_that_declares_project_gets_it_forwarded() {
    let mut h = Harness::new();
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"alpha","sled":"alpha"}),
    );
    let f = h.take_frames(u);
    let own = json!({"name":"own","inputSchema":{"type":"object","properties":{"project":{"type":"string","description":"mine"}}}});
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":[own.clone()]}}),
    );
    let r = h.rpc(None, json!(1), "tools/list", json!({}));
    assert_eq!(
        r["result"]["tools"][crate::GATEWAY_TOOLS.len()],
        own,
        "schema untouched"
    );
    h.call(None, json!(2), "own", json!({"project":"alpha","x":1}));
    h.call(None, json!(3), "other", json!({"project":"alpha","x":1}));
    let f = h.take_frames(u);
    assert_eq!(
        f[0]["params"]["arguments"],
        json!({"project":"alpha","x":1})
    );
    assert_eq!(f[1]["params"]["arguments"], json!({"x":1}));
}

#[test]
fn a_project_tools_arguments_reach_the_sled_as_written() {
    let mut h = Harness::new();
    let u = h.connect_sled("beta");
    // Numbers a JSON value would round, escapes it would rewrite, spacing it would drop.
    let arguments = r#"{"project":"beta","big":123456789012345678901234567890,"x":1.50,"s":"caf\u00e9 \"q\"","nested":{"a":[1, 2 ,{}]}}"#;
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"show","arguments":{arguments}}}}}"#
    );
    h.send(HttpMethod::Post, None, &body);
    let text = h.frame_texts[&u].last().unwrap().clone();
    h.take_frames(u);
    for member in [
        r#""big":123456789012345678901234567890"#,
        r#""x":1.50"#,
        r#""s":"caf\u00e9 \"q\"""#,
        r#""nested":{"a":[1, 2 ,{}]}"#,
    ] {
        assert!(text.contains(member), "{member} not in {text}");
    }
    let frame: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(frame["method"], "tools/call");
    assert_eq!(frame["params"]["name"], "show");
    assert_eq!(frame["params"]["arguments"]["s"], "café \"q\"");
    assert!(
        frame["params"]["arguments"].get("project").is_none(),
        "{text}"
    );
    assert!(frame["params"].get("_meta").is_none(), "{text}");

    // No arguments (or null) is `{}`; arguments that are not an object are invalid params.
    let session = h.initialize();
    let r = h.rpc(
        Some(&session),
        json!(0),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta"}}),
    );
    assert!(r["result"].is_object(), "{r}");
    for (arguments, forwarded) in [
        ("null", true),
        ("{}", true),
        ("[1]", false),
        ("\"x\"", false),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{{"name":"show","arguments":{arguments}}}}}"#
        );
        let t = h.send(HttpMethod::Post, Some(&session), &body);
        if forwarded {
            let f = h.take_frames(u);
            assert_eq!(
                f.last().unwrap()["params"]["arguments"],
                json!({}),
                "{arguments}"
            );
            assert!(!h.replies.contains_key(&t), "{arguments} answered at once");
        } else {
            let r = h.reply_json(t).unwrap();
            assert_eq!(r["error"]["code"], -32602, "{arguments}: {r}");
            let message = r["error"]["message"].as_str().unwrap_or_default();
            assert!(message.ends_with("expected a map"), "{r}");
        }
    }
    // A gateway tool reads its arguments the same way.
    let r = h.rpc(
        None,
        json!(9),
        "tools/call",
        json!({"name":"list_projects","arguments":[1]}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[test]
fn the_same_id_from_two_sessions_comes_back_to_each() {
    let mut h = Harness::new();
    let (a, b) = (h.initialize(), h.initialize());
    let beta = h.connect_sled("beta");
    let ta = h.call(
        Some(&a),
        json!(1),
        "show",
        json!({"project":"beta","story_id":"from-a"}),
    );
    let tb = h.call(
        Some(&b),
        json!(1),
        "show",
        json!({"project":"beta","story_id":"from-b"}),
    );
    let mut frames = h.take_frames(beta);
    assert_ne!(frames[0]["id"], frames[1]["id"]);
    // Answer in reverse order.
    frames.reverse();
    for f in frames {
        let r = json!({"structuredContent":{"story_id":f["params"]["arguments"]["story_id"]}});
        h.sled_says(beta, json!({"jsonrpc":"2.0","id":f["id"],"result":r}));
    }
    let ra = h.reply_json(ta).unwrap();
    let rb = h.reply_json(tb).unwrap();
    assert_eq!(
        (
            ra["id"].clone(),
            ra["result"]["structuredContent"]["story_id"].clone()
        ),
        (json!(1), json!("from-a"))
    );
    assert_eq!(
        (
            rb["id"].clone(),
            rb["result"]["structuredContent"]["story_id"].clone()
        ),
        (json!(1), json!("from-b"))
    );
}

#[test]
fn aborted_request_cancels_at_the_sled_and_shutdown_fails_the_rest() {
    let mut h = Harness::new();
    let beta = h.connect_sled("beta");
    let t1 = h.call(None, json!(1), "show", json!({"project":"beta"}));
    let t2 = h.call(None, json!(2), "show", json!({"project":"beta"}));
    let f = h.take_frames(beta);
    h.handle(Input::HttpAborted { token: t1 });
    let c = h.take_frames(beta);
    assert_eq!(c[0]["method"], "notifications/cancelled");
    assert_eq!(c[0]["params"]["requestId"], f[0]["id"]);
    assert_eq!(h.gw.stats().pending_calls, 1);
    h.handle(Input::Shutdown);
    assert_eq!(
        h.reply_json(t2).unwrap()["error"]["data"]["reason"],
        "shutdown"
    );
    assert_eq!(h.closed[&beta].0, 1001);
    assert!(!h.replies.contains_key(&t1));
    let r = h.post(None, json!({"jsonrpc":"2.0","id":3,"method":"ping"}));
    assert_eq!(r.status, 503);
    assert_eq!(h.gw.poll_timeout(), None, "no timers left behind");
}

#[test]
fn what_a_strict_reader_rejects_is_refused_at_once_and_nothing_is_sent() {
    let mut h = Harness::new();
    let s = h.initialize();
    let alpha = h.connect_sled("alpha");
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    for (args, kind) in [
        (r#"{"a":"\ud800"}"#.to_owned(), "unreadable_value"),
        (r#"{"a":"x\udc00"}"#.to_owned(), "unreadable_value"),
        (format!(r#"{{"a":{deep}}}"#), "too_deep"),
        (r#"{"n":1e400}"#.to_owned(), "unreadable_value"),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"show","arguments":{args}}}}}"#
        );
        let t = h.send(HttpMethod::Post, Some(&s), &body);
        let r = h.replies.remove(&t).expect("answered at once");
        assert_eq!(r.status, 400, "{args}");
        let v: Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
        assert_eq!(error_kind(&v), kind, "{args}");
        assert_eq!(v["id"], 9);
        assert!(h.take_frames(alpha).is_empty(), "nothing went up: {args}");
    }
    // A client's answer to a sled's request is held to the same rule.
    let t = h.send(
        HttpMethod::Post,
        Some(&s),
        r#"{"jsonrpc":"2.0","id":"gw-req-1","result":{"text":"\ud800"}}"#,
    );
    assert_eq!(h.replies.remove(&t).unwrap().status, 400);
    // The gateway keeps serving.
    let t = h.call(Some(&s), json!(10), "show", json!({"story_id":"alpha-1"}));
    assert_eq!(h.sled_answers_all(alpha, "alpha"), 1);
    assert!(h.reply_json(t).unwrap()["result"].is_object());
}

#[test]
fn a_call_the_sled_could_not_read_fails_at_once_not_at_its_deadline() {
    let mut h = Harness::new();
    let s = h.initialize();
    let alpha = h.connect_sled("alpha");
    let t = h.call(Some(&s), json!("c"), "show", json!({"story_id":"alpha-1"}));
    let id = h.take_frames(alpha)[0]["id"].clone();
    h.sled_says(
        alpha,
        json!({"uplink":"unreadable","id":id,"reason":"recursion limit exceeded"}),
    );
    let r = h.reply_json(t).expect("failed at once");
    assert_eq!(error_kind(&r), "sled_could_not_read");
    assert_eq!(r["error"]["code"], -32603);
    assert_eq!(r["error"]["data"]["outcome"], "not_sent");
    assert_eq!(r["error"]["data"]["reason"], "recursion limit exceeded");
    assert_eq!(r["id"], "c");
    // Without an id it is counted; the uplink and the session go on.
    h.sled_says(alpha, json!({"uplink":"unreadable","reason":"not JSON"}));
    assert_eq!(h.gw.stats().frames_unreadable_at_sled, 2);
    let t = h.call(Some(&s), json!(2), "show", json!({"story_id":"alpha-1"}));
    assert_eq!(h.sled_answers_all(alpha, "alpha"), 1);
    assert!(h.reply_json(t).unwrap()["result"].is_object());
}

#[test]
fn a_clients_trace_reaches_the_sled_with_the_gateways_span_between() {
    let mut h = Harness::new();
    let s = h.initialize();
    let alpha = h.connect_sled("alpha");
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
        "name":"show","arguments":{"story_id":"alpha-1"},
        "_meta":{"traceparent":parent,"tracestate":"vendor=x"}}});
    let t = h.send(HttpMethod::Post, Some(&s), &body.to_string());
    let f = h.take_frames(alpha);
    let meta = &f[0]["params"]["_meta"];
    let forwarded = meta["traceparent"].as_str().unwrap().to_owned();
    let parts: Vec<&str> = forwarded.split('-').collect();
    assert_eq!(
        parts[1], "4bf92f3577b34da6a3ce929d0e0e4736",
        "the client's trace"
    );
    assert_ne!(
        parts[2], "00f067aa0ba902b7",
        "the gateway's own span is the sled's parent"
    );
    assert_eq!((parts[0], parts[3], parts[2].len()), ("00", "01", 16));
    assert_eq!(meta["tracestate"], "vendor=x");
    h.sled_answers_all_frames(alpha, f);
    h.reply_json(t).unwrap();
    // Another call of the same trace gets another span of the gateway's.
    let t = h.send(HttpMethod::Post, Some(&s), &body.to_string());
    let f = h.take_frames(alpha);
    assert_ne!(f[0]["params"]["_meta"]["traceparent"], forwarded);
    h.sled_answers_all_frames(alpha, f);
    h.reply_json(t).unwrap();
    // An invalid traceparent is not forwarded, nor its tracestate.
    let body = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"show","arguments":{"story_id":"alpha-1"},
        "_meta":{"traceparent":"00-zz-bad-01","tracestate":"vendor=x","progressToken":"p"}}});
    h.send(HttpMethod::Post, Some(&s), &body.to_string());
    let f = h.take_frames(alpha);
    let meta = &f[0]["params"]["_meta"];
    assert!(
        meta.get("traceparent").is_none() && meta.get("tracestate").is_none(),
        "{meta}"
    );
}
