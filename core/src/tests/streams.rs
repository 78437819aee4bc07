//! Streams, header checks, cancellation, pagination and session expiry.

use std::time::Duration;

use serde_json::{json, Value};

use super::Harness;
use crate::{HttpMethod, HttpRequest, HttpToken, Input};

pub(super) fn get(
    h: &mut Harness,
    session: Option<&str>,
    last_event_id: Option<&str>,
) -> HttpToken {
    h.request(HttpRequest {
        method: HttpMethod::Get,
        session: session.map(str::to_owned),
        accept: Some("text/event-stream".into()),
        last_event_id: last_event_id.map(str::to_owned),
        ..HttpRequest::default()
    })
}

pub(super) fn methods(h: &Harness, t: HttpToken) -> Vec<String> {
    h.streams[&t]
        .iter()
        .map(|(_, v)| v["method"].as_str().unwrap_or("<response>").to_owned())
        .collect()
}

#[test]
fn the_get_stream_carries_list_changed_for_this_session_only() {
    let mut h = Harness::new();
    let (a, b) = (h.initialize(), h.initialize());
    let ta = get(&mut h, Some(&a), None);
    let tb = get(&mut h, Some(&b), None);
    assert!(h.streams.contains_key(&ta) && h.streams.contains_key(&tb));
    // alpha (both sessions' default) connects: both hear of it.
    let alpha = h.connect_sled("alpha");
    assert_eq!(methods(&h, ta), ["notifications/tools/list_changed"]);
    assert_eq!(methods(&h, tb), ["notifications/tools/list_changed"]);
    // a switches to beta: only a hears of it.
    h.rpc(
        Some(&a),
        json!(1),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta"}}),
    );
    assert_eq!(methods(&h, ta).len(), 2);
    assert_eq!(methods(&h, tb).len(), 1);
    // alpha goes away: only b (still on alpha) hears of it.
    h.handle(Input::UplinkClosed { uplink: alpha });
    assert_eq!(methods(&h, ta).len(), 2);
    assert_eq!(methods(&h, tb).len(), 2);
    // A sled's list_changed that changes nothing sends nothing.
    let beta = h.connect_sled("beta");
    assert_eq!(methods(&h, ta).len(), 3);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
    );
    let f = h.take_frames(beta);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"tools":super::sled_tools()}}),
    );
    assert_eq!(methods(&h, ta).len(), 3);
    // Event ids increase.
    let ids: Vec<u64> = h.streams[&ta].iter().map(|(id, _)| id.unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[test]
fn a_stream_resumes_after_last_event_id() {
    let mut h = Harness::new();
    let s = h.initialize();
    let t = get(&mut h, Some(&s), None);
    h.connect_sled("alpha");
    h.rpc(
        Some(&s),
        json!(1),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta"}}),
    );
    let first = h.streams[&t][0].0.unwrap();
    // The client loses the stream; a third event happens meanwhile.
    h.handle(Input::HttpAborted { token: t });
    h.rpc(
        Some(&s),
        json!(2),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"alpha"}}),
    );
    let t2 = get(&mut h, Some(&s), Some(&first.to_string()));
    let replayed: Vec<u64> = h.streams[&t2].iter().map(|(id, _)| id.unwrap()).collect();
    assert_eq!(
        replayed.len(),
        2,
        "the two events after {first}: {replayed:?}"
    );
    assert!(replayed.iter().all(|id| *id > first));
    // One stream per session.
    let t3 = get(&mut h, Some(&s), None);
    assert_eq!(h.replies.remove(&t3).unwrap().status, 409);
    // DELETE ends the session and its stream.
    let d = h.send(HttpMethod::Delete, Some(&s), "");
    assert_eq!(h.replies.remove(&d).unwrap().status, 204);
    assert!(h.streams_closed.contains(&t2));
}

#[test]
fn get_stream_refusals() {
    let mut h = Harness::new();
    let s = h.initialize();
    let t = h.request(HttpRequest {
        method: HttpMethod::Get,
        session: Some(s.clone()),
        accept: Some("application/json".into()),
        ..HttpRequest::default()
    });
    assert_eq!(h.replies.remove(&t).unwrap().status, 406);
    let t = get(&mut h, Some("nope"), None);
    assert_eq!(h.replies.remove(&t).unwrap().status, 404);
    let t = get(&mut h, None, None);
    assert_eq!(h.replies.remove(&t).unwrap().status, 400);
}

fn call_with_progress(
    h: &mut Harness,
    session: &str,
    id: Value,
    token: Value,
    accept: &str,
) -> HttpToken {
    let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"show","arguments":{"project":"beta","story_id":"x"},"_meta":{"progressToken":token}}});
    h.request(HttpRequest {
        session: Some(session.to_owned()),
        content_type: Some("application/json".into()),
        accept: Some(accept.into()),
        body: body.to_string().into_bytes(),
        ..HttpRequest::default()
    })
}

#[test]
fn progress_is_relayed_in_order_on_the_calls_own_stream() {
    let mut h = Harness::new();
    let (a, b) = (h.initialize(), h.initialize());
    let beta = h.connect_sled("beta");
    // Both sessions use the same progress token: each gets only its own progress.
    let ta = call_with_progress(
        &mut h,
        &a,
        json!(1),
        json!("tok"),
        "application/json, text/event-stream",
    );
    let tb = call_with_progress(
        &mut h,
        &b,
        json!(1),
        json!("tok"),
        "application/json, text/event-stream",
    );
    let f = h.take_frames(beta);
    let (ga, gb) = (
        f[0]["params"]["_meta"]["progressToken"].clone(),
        f[1]["params"]["_meta"]["progressToken"].clone(),
    );
    assert_ne!(ga, gb, "the sled sees the gateway's own tokens");
    assert_ne!(ga, json!("tok"));
    for (g, n) in [(&gb, 1), (&ga, 1), (&ga, 2)] {
        h.sled_says(beta, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":g,"progress":n,"total":2}}));
    }
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"content":[]}}),
    );
    let events = &h.streams[&ta];
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[0].1["params"],
        json!({"progressToken":"tok","progress":1,"total":2})
    );
    assert_eq!(events[1].1["params"]["progress"], 2);
    assert_eq!(events[2].1["id"], 1);
    assert!(h.streams_closed.contains(&ta));
    assert_eq!(h.streams[&tb].len(), 1, "b's progress only");
    assert!(!h.streams_closed.contains(&tb));
    // A late progress for a finished call goes nowhere.
    h.sled_says(beta, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":ga,"progress":3}}));
    assert_eq!(h.streams[&ta].len(), 3);
    // b's call fails with its uplink: the error is the last event of its stream.
    h.handle(Input::UplinkClosed { uplink: beta });
    assert_eq!(
        h.streams[&tb].last().unwrap().1["error"]["data"]["kind"],
        "uplink_lost"
    );
    assert!(h.streams_closed.contains(&tb));
    assert_eq!(h.gw.stats().open_streams, 0);
}

/// Security review finding 5: progress was looked up by the gateway's token alone, so a
/// sled could write into another project's call by naming its token (`gw-<uplink>-<id>`).
#[test]
fn a_sled_cannot_report_progress_for_another_sleds_call() {
    let mut h = Harness::new();
    let a = h.initialize();
    let beta = h.connect_sled("beta");
    let gamma = h.connect_sled("gamma");
    let t = call_with_progress(
        &mut h,
        &a,
        json!(1),
        json!("tok"),
        "application/json, text/event-stream",
    );
    let f = h.take_frames(beta);
    let g = f[0]["params"]["_meta"]["progressToken"].clone();
    h.sled_says(gamma, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":g,"progress":1,"message":"forged"}}));
    assert!(
        !h.streams.contains_key(&t),
        "gamma's progress reached beta's call"
    );
    h.sled_says(beta, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":g,"progress":1}}));
    assert_eq!(h.streams[&t].len(), 1, "the call's own sled still reports");
}

#[test]
fn progress_without_an_sse_accept_gets_one_json_answer() {
    let mut h = Harness::new();
    let s = h.initialize();
    let beta = h.connect_sled("beta");
    let t = call_with_progress(&mut h, &s, json!(1), json!(7), "application/json");
    let f = h.take_frames(beta);
    h.sled_says(beta, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":f[0]["params"]["_meta"]["progressToken"],"progress":1}}));
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"content":[]}}),
    );
    assert!(h.streams.is_empty());
    assert_eq!(h.reply_json(t).unwrap()["id"], 1);
}

#[test]
fn a_client_cancel_reaches_the_sled_under_the_gateways_id() {
    let mut h = Harness::new();
    let (a, b) = (h.initialize(), h.initialize());
    let beta = h.connect_sled("beta");
    let ta = h.call(Some(&a), json!(5), "show", json!({"project":"beta"}));
    let tb = h.call(Some(&b), json!(5), "show", json!({"project":"beta"}));
    let f = h.take_frames(beta);
    // a cancels its id 5; b's id 5 is untouched.
    let r = h.post(Some(&a), json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"user"}}));
    assert_eq!(r.status, 202);
    let c = h.take_frames(beta);
    assert_eq!(c[0]["method"], "notifications/cancelled");
    assert_eq!(
        c[0]["params"]["requestId"], f[0]["id"],
        "the gateway's id, not the client's"
    );
    let r = h.reply_json(ta).unwrap();
    assert_eq!(
        (
            r["error"]["code"].as_i64(),
            r["error"]["data"]["kind"].as_str()
        ),
        (Some(-32800), Some("cancelled"))
    );
    assert!(!h.replies.contains_key(&tb));
    // The sled's answer to the cancelled call arrives anyway: dropped as late.
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{}}));
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"content":[]}}),
    );
    assert!(h.reply_json(tb).unwrap()["result"].is_object());
    let st = h.gw.stats();
    assert_eq!((st.calls_cancelled, st.responses_dropped_late), (1, 1));
    // A cancel for an id that already finished is tolerated.
    let r = h.post(
        Some(&a),
        json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}),
    );
    assert_eq!(r.status, 202);
}

#[test]
fn header_checks() {
    let mut h = Harness::new();
    let post = |h: &mut Harness, f: &dyn Fn(&mut HttpRequest)| {
        let mut r = HttpRequest {
            content_type: Some("application/json".into()),
            body: br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
            ..HttpRequest::default()
        };
        f(&mut r);
        let t = h.request(r);
        h.replies.remove(&t).unwrap().status
    };
    assert_eq!(
        post(&mut h, &|_| {}),
        200,
        "no Accept, no Origin, no version: fine"
    );
    assert_eq!(
        post(&mut h, &|r| r.origin = Some("http://evil.example".into())),
        403
    );
    assert_eq!(
        post(&mut h, &|r| r.origin = Some("http://localhost:6274".into())),
        200
    );
    assert_eq!(
        post(&mut h, &|r| r.protocol_version = Some("2030-01-01".into())),
        400
    );
    assert_eq!(
        post(&mut h, &|r| r.protocol_version = Some("2025-06-18".into())),
        200
    );
    assert_eq!(post(&mut h, &|r| r.accept = Some("text/html".into())), 406);
    let mut h = Harness::new();
    h.gw.config_mut().allowed_origins = vec!["https://ops.example".into()];
    assert_eq!(
        post(&mut h, &|r| r.origin = Some("https://ops.example".into())),
        200
    );
}

#[test]
fn long_tool_lists_are_paginated() {
    let mut h = Harness::new();
    h.gw.config_mut().tools_page_size = 3;
    h.connect_sled("alpha");
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let r = h.rpc(None, json!(1), "tools/list", params);
        names.extend(
            r["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned()),
        );
        pages += 1;
        match r["result"]["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    let expected: Vec<&str> = crate::GATEWAY_TOOLS
        .iter()
        .copied()
        .chain(["show", "create_story"])
        .collect();
    assert_eq!(names, expected);
    assert_eq!(pages, expected.len().div_ceil(3));
    let r = h.rpc(None, json!(1), "tools/list", json!({"cursor": "bogus"}));
    assert_eq!(r["error"]["code"], -32602);
}

#[test]
fn idle_sessions_expire_but_not_while_streaming() {
    let mut h = Harness::new();
    let idle = h.initialize();
    let busy = h.initialize();
    let streaming = h.initialize();
    get(&mut h, Some(&streaming), None);
    for _ in 0..8 {
        h.advance(Duration::from_secs(5 * 60));
        h.rpc(Some(&busy), json!(1), "ping", json!({}));
    }
    let r = h.post(Some(&idle), json!({"jsonrpc":"2.0","id":1,"method":"ping"}));
    assert_eq!(r.status, 404, "idle for 40 min with a 30 min TTL");
    for s in [&busy, &streaming] {
        let r = h.post(Some(s), json!({"jsonrpc":"2.0","id":1,"method":"ping"}));
        assert_eq!(r.status, 200);
    }
    assert_eq!(h.gw.stats().sessions_expired, 1);
}

#[test]
fn an_answer_becomes_a_stream_only_when_the_sled_has_something_to_say_first() {
    let mut h = Harness::new();
    let s = h.initialize();
    let beta = h.connect_sled("beta");
    // Nothing before the response: one JSON answer, even though the client reads SSE.
    let t1 = h.call(Some(&s), json!(1), "show", json!({"project":"beta"}));
    h.sled_answers_all(beta, "beta");
    assert!(h.reply_json(t1).is_some());
    assert!(h.streams.is_empty());
    // A log message for the call first: the answer becomes a stream, and the message's
    // routing key is gone from what the client sees.
    let t2 = h.call(Some(&s), json!(2), "show", json!({"project":"beta"}));
    let f = h.take_frames(beta);
    let log = json!({"jsonrpc":"2.0","method":"notifications/message","params":{
        "level":"info","data":"working","_meta":{"io.mcp-gateway/relatedRequest":f[0]["id"]}}});
    h.sled_says(beta, log);
    // A notification naming no pending call goes nowhere.
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/message","params":{
        "level":"info","data":"stray","_meta":{"io.mcp-gateway/relatedRequest":999}}}),
    );
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"content":[]}}),
    );
    let events = &h.streams[&t2];
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[0].1["params"],
        json!({"level":"info","data":"working"})
    );
    assert_eq!(events[1].1["id"], 2);
    assert!(h.streams_closed.contains(&t2));
}

/// Issue 26: a server's log message that names no call (server-everything logs of its own
/// accord) goes to the GET streams of the sessions whose default project is the sled's, each
/// at its own `logging/setLevel` threshold; never to a session on another project.
#[test]
fn a_sleds_own_log_message_reaches_the_sessions_on_its_project_at_their_level() {
    let mut h = Harness::new();
    let (a, b, c) = (h.initialize(), h.initialize(), h.initialize());
    let alpha = h.connect_sled("alpha");
    h.rpc(
        Some(&b),
        json!(1),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta"}}),
    );
    h.rpc(
        Some(&c),
        json!(2),
        "logging/setLevel",
        json!({"level":"error"}),
    );
    let (ta, tb, tc) = (
        get(&mut h, Some(&a), None),
        get(&mut h, Some(&b), None),
        get(&mut h, Some(&c), None),
    );
    let logs = |h: &Harness, t| {
        h.streams[&t]
            .iter()
            .filter(|(_, v)| v["method"] == "notifications/message")
            .map(|(_, v)| v["params"].clone())
            .collect::<Vec<Value>>()
    };
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","method":"notifications/message",
               "params":{"level":"info","logger":"srv","data":"tick"}}),
    );
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","method":"notifications/message",
               "params":{"level":"error","data":"broke","_meta":{}}}),
    );
    // Not a level MCP knows: nobody's threshold can place it.
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","method":"notifications/message",
               "params":{"level":"loud","data":"?"}}),
    );
    assert_eq!(
        logs(&h, ta),
        [
            json!({"level":"info","logger":"srv","data":"tick"}),
            json!({"level":"error","data":"broke"})
        ]
    );
    assert_eq!(logs(&h, tb), Vec::<Value>::new(), "b is on beta");
    assert_eq!(logs(&h, tc), [json!({"level":"error","data":"broke"})]);
}
