//! The MCP surface beyond tools, per project: resources, prompts, completion, logging, and a
//! sled's requests to the client of its call.

use serde_json::{json, Value};

use super::Harness;
use crate::{HttpRequest, HttpToken};

/// A session whose client declared sampling and elicitation.
fn capable_session(h: &mut Harness) -> String {
    let r = h.post(
        None,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{},"elicitation":{}},"clientInfo":{"name":"t","version":"0"}}}),
    );
    let caps: Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
    assert!(caps["result"]["capabilities"]["resources"]["subscribe"] == true);
    r.headers
        .iter()
        .find(|(h, _)| *h == "Mcp-Session-Id")
        .unwrap()
        .1
        .clone()
}

/// Answers the one pending request on `uplink` with `result`.
fn sled_answers(h: &mut Harness, uplink: crate::UplinkId, result: Value) -> Value {
    let f = h.take_frames(uplink).pop().expect("a request for the sled");
    h.sled_says(
        uplink,
        json!({"jsonrpc":"2.0","id":f["id"],"result":result}),
    );
    f
}

#[test]
fn resources_and_prompts_go_to_the_named_project_or_the_default() {
    let mut h = Harness::new();
    let s = h.initialize();
    let alpha = h.connect_sled("alpha");
    let beta = h.connect_sled("beta");
    let t = h.send(
        crate::HttpMethod::Post,
        Some(&s),
        &json!({"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"test://a"}})
            .to_string(),
    );
    let f = sled_answers(
        &mut h,
        alpha,
        json!({"contents":[{"uri":"test://a","text":"from alpha"}]}),
    );
    assert_eq!(f["params"], json!({"uri":"test://a"}));
    assert_eq!(
        h.reply_json(t).unwrap()["result"]["contents"][0]["text"],
        "from alpha"
    );
    // Per request, by _meta; the key does not reach the sled.
    let t = h.send(crate::HttpMethod::Post, Some(&s), &json!({"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"test://a","_meta":{"io.mcp-gateway/project":"beta"}}}).to_string());
    let f = sled_answers(
        &mut h,
        beta,
        json!({"contents":[{"uri":"test://a","text":"from beta"}]}),
    );
    assert_eq!(f["params"], json!({"uri":"test://a"}));
    assert_eq!(
        h.reply_json(t).unwrap()["result"]["contents"][0]["text"],
        "from beta"
    );
    // An unknown project named this way is refused like any other.
    let r = h.rpc(
        Some(&s),
        json!(3),
        "resources/read",
        json!({"uri":"x","_meta":{"io.mcp-gateway/project":"zeta"}}),
    );
    assert_eq!(r["error"]["data"]["kind"], "unknown_project");
    // prompts/get routes by its `project` argument, which the sled never sees.
    let t = h.send(crate::HttpMethod::Post, Some(&s), &json!({"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{"name":"p","arguments":{"x":"1","project":"beta"}}}).to_string());
    let f = sled_answers(&mut h, beta, json!({"messages":[]}));
    assert_eq!(f["params"], json!({"name":"p","arguments":{"x":"1"}}));
    assert!(h.reply_json(t).unwrap()["result"].is_object());
    // prompts/list offers that argument.
    let t = h.send(
        crate::HttpMethod::Post,
        Some(&s),
        &json!({"jsonrpc":"2.0","id":5,"method":"prompts/list"}).to_string(),
    );
    sled_answers(
        &mut h,
        alpha,
        json!({"prompts":[{"name":"p","arguments":[{"name":"x","required":true}]},{"name":"q"}]}),
    );
    let r = h.reply_json(t).unwrap();
    for p in r["result"]["prompts"].as_array().unwrap() {
        assert!(
            p["arguments"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["name"] == "project" && a["required"] == false),
            "{p}"
        );
    }
    // completion/complete is forwarded the same way.
    let t = h.send(crate::HttpMethod::Post, Some(&s), &json!({"jsonrpc":"2.0","id":6,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"x","value":"a"}}}).to_string());
    sled_answers(&mut h, alpha, json!({"completion":{"values":["ab"]}}));
    assert_eq!(
        h.reply_json(t).unwrap()["result"]["completion"]["values"][0],
        "ab"
    );
}

fn get(h: &mut Harness, session: &str) -> HttpToken {
    h.request(HttpRequest {
        method: crate::HttpMethod::Get,
        session: Some(session.to_owned()),
        accept: Some("text/event-stream".into()),
        ..HttpRequest::default()
    })
}

#[test]
fn resource_updates_reach_only_the_subscribed_session() {
    let mut h = Harness::new();
    let (a, b) = (h.initialize(), h.initialize());
    let beta = h.connect_sled("beta");
    let (ga, gb) = (get(&mut h, &a), get(&mut h, &b));
    let t = h.send(crate::HttpMethod::Post, Some(&a), &json!({"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":"test://w","_meta":{"io.mcp-gateway/project":"beta"}}}).to_string());
    sled_answers(&mut h, beta, json!({}));
    assert!(h.reply_json(t).is_some());
    h.sled_says(beta, json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"test://w"}}));
    h.sled_says(beta, json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"test://other"}}));
    let got = |h: &Harness, t| {
        h.streams[&t]
            .iter()
            .filter(|(_, v)| v["method"] == "notifications/resources/updated")
            .count()
    };
    assert_eq!((got(&h, ga), got(&h, gb)), (1, 0));
    // Unsubscribed: no more.
    let t = h.send(crate::HttpMethod::Post, Some(&a), &json!({"jsonrpc":"2.0","id":2,"method":"resources/unsubscribe","params":{"uri":"test://w","_meta":{"io.mcp-gateway/project":"beta"}}}).to_string());
    sled_answers(&mut h, beta, json!({}));
    assert!(h.reply_json(t).is_some());
    h.sled_says(beta, json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"test://w"}}));
    assert_eq!(got(&h, ga), 1);
}

#[test]
fn a_sleds_sampling_request_reaches_the_calls_client_and_the_answer_goes_back() {
    let mut h = Harness::new();
    let s = capable_session(&mut h);
    let plain = h.initialize();
    let beta = h.connect_sled("beta");
    let t = h.call(
        Some(&s),
        json!(1),
        "test_sampling",
        json!({"project":"beta"}),
    );
    let call = h.take_frames(beta).pop().unwrap();
    let ask = json!({"jsonrpc":"2.0","id":"s-1","method":"sampling/createMessage","params":{"messages":[],"maxTokens":5,"_meta":{"io.mcp-gateway/relatedRequest":call["id"]}}});
    h.sled_says(beta, ask);
    let events = h.streams[&t].clone();
    assert_eq!(events.len(), 1);
    let req = &events[0].1;
    assert_eq!(req["method"], "sampling/createMessage");
    assert!(
        req["params"].get("_meta").is_none(),
        "the routing key stays at the gateway"
    );
    let gid = req["id"].clone();
    assert_ne!(gid, json!("s-1"), "the client sees the gateway's id");
    // Another session cannot answer it.
    let r = h.post(
        Some(&plain),
        json!({"jsonrpc":"2.0","id":gid,"result":{"role":"assistant"}}),
    );
    assert_eq!(r.status, 202);
    assert!(h.take_frames(beta).is_empty());
    // Its own client's answer goes back under the sled's id.
    let r = h.post(Some(&s), json!({"jsonrpc":"2.0","id":gid,"result":{"role":"assistant","content":{"type":"text","text":"hi"}}}));
    assert_eq!(r.status, 202);
    let back = h.take_frames(beta);
    assert_eq!(back[0]["id"], "s-1");
    assert_eq!(back[0]["result"]["content"]["text"], "hi");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":call["id"],"result":{"content":[]}}),
    );
    assert!(h.streams_closed.contains(&t));
}

#[test]
fn a_client_without_the_capability_makes_the_sled_get_an_error_not_a_hang() {
    let mut h = Harness::new();
    let s = h.initialize();
    let beta = h.connect_sled("beta");
    h.call(
        Some(&s),
        json!(1),
        "test_sampling",
        json!({"project":"beta"}),
    );
    let call = h.take_frames(beta).pop().unwrap();
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":9,"method":"elicitation/create","params":{"_meta":{"io.mcp-gateway/relatedRequest":call["id"]}}}));
    let back = h.take_frames(beta);
    assert_eq!(back[0]["id"], 9);
    assert_eq!(back[0]["error"]["code"], -32601);
    assert!(back[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("elicitation"));
    // A ping from a sled is answered.
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":10,"method":"ping"}));
    assert_eq!(
        h.take_frames(beta)[0],
        json!({"jsonrpc":"2.0","id":10,"result":{}})
    );
}

#[test]
fn log_messages_respect_the_sessions_level() {
    let mut h = Harness::new();
    let s = h.initialize();
    let beta = h.connect_sled("beta");
    let r = h.rpc(
        Some(&s),
        json!(1),
        "logging/setLevel",
        json!({"level":"warning"}),
    );
    assert_eq!(r["result"], json!({}));
    let r = h.rpc(
        Some(&s),
        json!(2),
        "logging/setLevel",
        json!({"level":"loud"}),
    );
    assert_eq!(r["error"]["code"], -32602);
    let t = h.call(Some(&s), json!(3), "show", json!({"project":"beta"}));
    let call = h.take_frames(beta).pop().unwrap();
    for level in ["info", "error"] {
        h.sled_says(beta, json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":level,"data":level,"_meta":{"io.mcp-gateway/relatedRequest":call["id"]}}}));
    }
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":call["id"],"result":{"content":[]}}),
    );
    let levels: Vec<&Value> = h.streams[&t]
        .iter()
        .filter_map(|(_, v)| v["params"].get("level"))
        .collect();
    assert_eq!(levels, [&json!("error")]);
}

/// Security review finding 16: a sled's requests to the client of a call (whose client never
/// answers them) die with the call, however it ends (answered, timed out, cancelled), and one
/// call holds at most `MAX_ASKS_PER_CALL` of them: a sled cannot grow the table past its calls.
#[test]
fn a_sleds_requests_to_a_client_die_with_their_call_and_are_bounded_per_call() {
    let mut h = Harness::new();
    let s = capable_session(&mut h);
    let beta = h.connect_sled("beta");
    let mut next = 0;
    // A call on beta whose sled asks its client 40 times; returns the call's frame and token.
    let mut flood = |h: &mut Harness| {
        next += 1;
        let t = h.call(
            Some(&s),
            json!(next),
            "test_sampling",
            json!({"project":"beta"}),
        );
        let call = h.take_frames(beta).pop().unwrap();
        for i in 0..40 {
            h.sled_says(beta, json!({"jsonrpc":"2.0","id":format!("s-{next}-{i}"),"method":"sampling/createMessage","params":{"messages":[],"maxTokens":5,"_meta":{"io.mcp-gateway/relatedRequest":call["id"]}}}));
        }
        let relayed = h.streams[&t]
            .iter()
            .filter(|(_, v)| v["method"] == "sampling/createMessage")
            .count();
        let refused = h
            .take_frames(beta)
            .iter()
            .filter(|f| f["error"]["code"] == -32601)
            .count();
        assert_eq!((relayed, refused), (16, 24));
        assert_eq!(h.gw.sled_requests_waiting(), 16);
        (call, t)
    };
    // Answered by the sled.
    let (call, _) = flood(&mut h);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":call["id"],"result":{"content":[]}}),
    );
    assert_eq!(h.gw.sled_requests_waiting(), 0, "gone with the answer");
    // Past its deadline.
    flood(&mut h);
    let timeout = h.gw.registry().get("beta").unwrap().1.call_timeout;
    for _ in 0..(timeout.as_secs() / 5 + 1) {
        h.advance(std::time::Duration::from_secs(5));
        for f in h.take_frames(beta) {
            if f["uplink"] == "ping" {
                h.sled_says(beta, json!({"uplink":"pong","seq":f["seq"]}));
            }
        }
    }
    assert_eq!(h.gw.sled_requests_waiting(), 0, "gone with the deadline");
    // Cancelled by its client.
    let (_, t) = flood(&mut h);
    let n = next;
    let r = h.post(
        Some(&s),
        json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":n}}),
    );
    assert_eq!(r.status, 202);
    assert!(h.streams_closed.contains(&t) || h.replies.contains_key(&t));
    assert_eq!(h.gw.sled_requests_waiting(), 0, "gone with the cancel");
}
