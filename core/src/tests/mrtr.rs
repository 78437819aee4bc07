//! The stateless era's multi round-trip requests: a sled's sampling, elicitation or roots
//! request reaches a stateless client as an `input_required` answer, and the client's retry
//! goes back to the same pending sled call.

use std::time::Duration;

use serde_json::{json, Value};

use super::modern::{answer, modern};
use super::Harness;
use crate::HttpToken;

fn sampling_caps() -> Value {
    json!({"io.modelcontextprotocol/clientCapabilities": {"sampling": {}}})
}

/// A stateless `test_sampling` call on beta, and the sled's request for the client.
fn call_that_asks(h: &mut Harness, caps: Value) -> (crate::UplinkId, Value, HttpToken) {
    let beta = h.connect_sled("beta");
    let t = modern(
        h,
        1,
        "tools/call",
        json!({"name":"test_sampling","arguments":{"project":"beta","prompt":"2+2?"},"_meta":caps}),
        &|_| {},
    );
    let call = h.take_frames(beta).pop().unwrap();
    let ask = json!({"jsonrpc":"2.0","id":"s-1","method":"sampling/createMessage","params":{
        "messages":[{"role":"user","content":{"type":"text","text":"2+2?"}}],"maxTokens":5,
        "_meta":{"io.mcp-gateway/relatedRequest":call["id"]}}});
    h.sled_says(beta, ask);
    (beta, call, t)
}

fn retry(h: &mut Harness, id: u64, state: &Value, responses: Value) -> HttpToken {
    let mut params = json!({"name":"test_sampling","arguments":{"project":"beta","prompt":"2+2?"},
        "requestState":state,"inputResponses":responses});
    params["_meta"] = sampling_caps();
    modern(h, id, "tools/call", params, &|_| {})
}

#[test]
fn a_sleds_sampling_request_round_trips_through_input_required() {
    let mut h = Harness::new();
    let (beta, call, t) = call_that_asks(&mut h, sampling_caps());
    let (status, r) = answer(&mut h, t);
    assert_eq!(status, 200, "{r}");
    let result = &r["result"];
    assert_eq!(result["resultType"], "input_required", "{r}");
    let requests = result["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1);
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["maxTokens"], 5);
    assert!(
        request["params"].get("_meta").is_none(),
        "the routing key stays at the gateway"
    );
    let state = result["requestState"].clone();
    assert!(state.as_str().unwrap().len() > 20, "an unguessable handle");
    assert_eq!(h.gw.stats().parked_calls, 1);

    // The retry's answer goes back to the sled under its own id, and the sled's call goes on.
    let t2 = retry(
        &mut h,
        2,
        &state,
        json!({key: {"role":"assistant","content":{"type":"text","text":"4"},"model":"m"}}),
    );
    let back = h.take_frames(beta);
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0]["id"], "s-1");
    assert_eq!(back[0]["result"]["content"]["text"], "4");
    assert!(!h.replies.contains_key(&t2), "waits for the sled's answer");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":call["id"],"result":{"content":[{"type":"text","text":"LLM response: 4"}]}}),
    );
    let (status, r) = answer(&mut h, t2);
    assert_eq!(status, 200);
    assert_eq!(r["id"], 2, "answered under the retry's id");
    assert_eq!(r["result"]["resultType"], "complete");
    assert_eq!(r["result"]["content"][0]["text"], "LLM response: 4");
    assert_eq!(h.gw.stats().parked_calls, 0);
    assert_eq!(h.gw.stats().input_required, 1);

    // The state was used: a replay is refused, typed, at once.
    let t3 = retry(&mut h, 3, &state, json!({}));
    let (status, r) = answer(&mut h, t3);
    assert_eq!((status, r["error"]["code"].as_i64()), (400, Some(-32602)));
    assert_eq!(r["error"]["data"]["kind"], "unknown_request_state");
    assert!(h.take_frames(beta).is_empty(), "nothing reaches the sled");
}

#[test]
fn a_client_without_the_capability_gets_32021_and_the_sled_call_is_cancelled() {
    let mut h = Harness::new();
    let (beta, call, t) = call_that_asks(&mut h, json!({}));
    let (status, r) = answer(&mut h, t);
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["code"], -32021);
    assert_eq!(
        r["error"]["data"]["requiredCapabilities"],
        json!({"sampling": {}})
    );
    let back = h.take_frames(beta);
    assert_eq!(back[0]["id"], "s-1");
    assert_eq!(back[0]["error"]["code"], -32021);
    assert_eq!(back[1]["method"], "notifications/cancelled");
    assert_eq!(back[1]["params"]["requestId"], call["id"]);
    assert_eq!(h.gw.stats().pending_calls, 0);
}

#[test]
fn a_retry_must_repeat_the_method_and_name_and_an_unanswered_request_is_asked_again() {
    let mut h = Harness::new();
    let (beta, _call, t) = call_that_asks(&mut h, sampling_caps());
    let (_, r) = answer(&mut h, t);
    let state = r["result"]["requestState"].clone();
    let key = r["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    // Another tool with this state: refused, and the state stays good for the real retry.
    let mut params = json!({"name":"show","arguments":{"project":"beta"},"requestState":state});
    params["_meta"] = sampling_caps();
    let bad = modern(&mut h, 2, "tools/call", params, &|_| {});
    let (status, r) = answer(&mut h, bad);
    assert_eq!(
        (status, r["error"]["data"]["kind"].as_str()),
        (400, Some("unknown_request_state"))
    );
    // A retry without the answer is asked again, under a new state.
    let t2 = retry(&mut h, 3, &state, json!({}));
    let (status, r) = answer(&mut h, t2);
    assert_eq!(status, 200);
    assert_eq!(r["result"]["resultType"], "input_required");
    assert!(r["result"]["inputRequests"].get(&key).is_some());
    assert_ne!(r["result"]["requestState"], state);
    assert!(h.take_frames(beta).is_empty());
}

#[test]
fn a_sled_answer_while_parked_is_held_for_the_retry_and_a_parked_call_still_has_a_deadline() {
    let mut h = Harness::new();
    let (beta, call, t) = call_that_asks(&mut h, sampling_caps());
    let (_, r) = answer(&mut h, t);
    let state = r["result"]["requestState"].clone();
    // The sled gives up on its request and answers the call while the client is away.
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":call["id"],"result":{"content":[],"isError":true}}),
    );
    let t2 = retry(&mut h, 2, &state, json!({}));
    let (status, r) = answer(&mut h, t2);
    assert_eq!(status, 200);
    assert_eq!(
        (r["id"].as_u64(), r["result"]["isError"].as_bool()),
        (Some(2), Some(true))
    );

    // A parked call nobody comes back for ends at its deadline and is cancelled at the sled.
    let t = modern(
        &mut h,
        4,
        "tools/call",
        json!({"name":"test_sampling","arguments":{"project":"beta","prompt":"x"},"_meta":sampling_caps()}),
        &|_| {},
    );
    let call = h.take_frames(beta).pop().unwrap();
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":"s-2","method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"_meta":{"io.mcp-gateway/relatedRequest":call["id"]}}}));
    let (_, r) = answer(&mut h, t);
    let state = r["result"]["requestState"].clone();
    let mut back = Vec::new();
    for _ in 0..7 {
        h.advance(Duration::from_secs(5));
        for f in h.take_frames(beta) {
            if f["uplink"] == "ping" {
                h.sled_says(beta, json!({"uplink":"pong","seq":f["seq"]}));
            } else {
                back.push(f);
            }
        }
    }
    assert!(
        back.iter()
            .any(|f| f["method"] == "notifications/cancelled"
                && f["params"]["requestId"] == call["id"]),
        "{back:?}"
    );
    assert_eq!(h.gw.stats().parked_calls, 0);
    let t = retry(&mut h, 5, &state, json!({}));
    let (status, r) = answer(&mut h, t);
    assert_eq!(
        (status, r["error"]["data"]["kind"].as_str()),
        (400, Some("unknown_request_state"))
    );
}

#[test]
fn in_a_cluster_a_retry_goes_to_the_replica_that_parked_its_call() {
    use super::cluster::{event, owned_by, replica, sled_claimed, take_actions};
    use crate::cluster::{ClusterAction, ClusterEvent, RelaySent};
    // r1 parks a call; its handle names r1.
    let mut h = replica("r1");
    let beta = sled_claimed(&mut h, "beta", 3);
    let t = modern(
        &mut h,
        1,
        "tools/call",
        json!({"name":"test_sampling","arguments":{"project":"beta","prompt":"2+2?"},"_meta":sampling_caps()}),
        &|_| {},
    );
    let call = h.take_frames(beta).pop().unwrap();
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":"s-1","method":"sampling/createMessage","params":{
            "messages":[],"maxTokens":5,"_meta":{"io.mcp-gateway/relatedRequest":call["id"]}}}),
    );
    let (_, r) = answer(&mut h, t);
    let state = r["result"]["requestState"].clone();
    assert!(state.as_str().unwrap().ends_with(".r1"), "{state}");
    // A retry that comes to r1 itself attaches to the call there.
    take_actions(&mut h);
    let t = retry(&mut h, 2, &state, json!({}));
    assert!(
        take_actions(&mut h).is_empty(),
        "served where it was parked"
    );
    let (_, r) = answer(&mut h, t);
    assert_eq!(
        r["result"]["resultType"], "input_required",
        "asked again: {r}"
    );
    assert_ne!(r["result"]["requestState"], state, "a new handle");

    // On r2 a retry naming r1 is relayed to r1 whole, never served again elsewhere: with
    // nobody taking it there, the parked call died with r1 and its outcome is unknown.
    let mut h = replica("r2");
    owned_by(&mut h, "beta", "r1", 3);
    take_actions(&mut h);
    let state = json!(format!("rs-{}.r1", "ab".repeat(16)));
    let t = retry(&mut h, 3, &state, json!({}));
    let actions = take_actions(&mut h);
    assert!(
        matches!(actions.as_slice(), [ClusterAction::Relay { token, replica, timeout, .. }]
            if *token == t && replica == "r1" && *timeout == h.gw.registry().get("beta").unwrap().1.call_timeout),
        "{actions:?}"
    );
    event(
        &mut h,
        ClusterEvent::RelayFailed {
            token: t,
            sent: RelaySent::NotSent,
        },
    );
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["error"]["data"]["kind"], "uplink_lost", "{r}");
    assert_eq!(r["error"]["data"]["outcome"], "unknown", "{r}");
    assert!(take_actions(&mut h).is_empty(), "not relayed again");
    // A handle naming no replica, or one that is no name, is unknown here.
    for forged in ["rs-00", "rs-00.", "rs-00.r/1", "rs-00.r2"] {
        let t = retry(&mut h, 4, &json!(forged), json!({}));
        let (_, r) = answer(&mut h, t);
        assert_eq!(
            r["error"]["data"]["kind"], "unknown_request_state",
            "{forged}: {r}"
        );
    }
}

/// Two client tokens writing to alpha and beta; `alice` loses beta in [`RIGHTS_REVOKED`].
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789abc";

fn rights_file(alice_on_beta: &str) -> crate::Registry {
    crate::Registry::parse(
        "projects.toml",
        &format!(
            "default = \"alpha\"\n\
             client_tokens = [{{ name = \"alice\", token = \"{ALICE}\" }}, {{ name = \"bob\", token = \"{BOB}\" }}]\n\
             [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n\
             [[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9102\"\n\
             [[access]]\ntoken = \"alice\"\nprojects = {alice_on_beta}\nright = \"write\"\n\
             [[access]]\ntoken = \"bob\"\nprojects = [\"alpha\", \"beta\"]\nright = \"write\"\n"
        ),
    )
    .unwrap()
    .allowing_unauthenticated_uplinks()
}

/// What alice may write to, before and after the reload that revokes beta.
const RIGHTS_GRANTED: &str = "[\"alpha\", \"beta\"]";
const RIGHTS_REVOKED: &str = "[\"alpha\"]";

fn authed_harness() -> Harness {
    let mut h = Harness::new();
    h.gw = crate::Gateway::new(
        rights_file(RIGHTS_GRANTED),
        crate::Config::default(),
        [5; 32],
    );
    h
}

/// A stateless `test_sampling` call on beta (its sled on `beta`) as `bearer`, parked for its
/// client's input: the call's frame and the `requestState`.
fn parked_as(h: &mut Harness, beta: crate::UplinkId, bearer: &'static str) -> (Value, Value) {
    let t = modern(
        h,
        1,
        "tools/call",
        json!({"name":"test_sampling","arguments":{"project":"beta","prompt":"2+2?"},"_meta":sampling_caps()}),
        &|r| r.authorization = Some(format!("Bearer {bearer}")),
    );
    let call = h.take_frames(beta).pop().unwrap();
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":"s-1","method":"sampling/createMessage","params":{
            "messages":[],"maxTokens":5,"_meta":{"io.mcp-gateway/relatedRequest":call["id"]}}}),
    );
    let (_, r) = answer(h, t);
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let state = r["result"]["requestState"].clone();
    (call, state)
}

fn retry_as(h: &mut Harness, bearer: &'static str, id: u64, state: &Value) -> HttpToken {
    let mut params = json!({"name":"test_sampling","arguments":{"project":"beta","prompt":"2+2?"},
        "requestState":state,"inputResponses":{}});
    params["_meta"] = sampling_caps();
    modern(h, id, "tools/call", params, &|r| {
        r.authorization = Some(format!("Bearer {bearer}"))
    })
}

/// Security review finding 13: a `requestState` is its caller's alone. Another identity
/// presenting it (leaked, say) is answered exactly as for a handle that names nothing, and
/// touches nothing: the call stays parked for its own caller.
#[test]
fn a_request_state_retried_by_another_identity_is_unknown_and_touches_nothing() {
    let mut h = authed_harness();
    let beta = h.connect_sled("beta");
    let (_call, state) = parked_as(&mut h, beta, ALICE);
    let t = retry_as(&mut h, BOB, 2, &state);
    let (status, theirs) = answer(&mut h, t);
    assert_eq!(status, 400, "{theirs}");
    assert_eq!(theirs["error"]["data"]["kind"], "unknown_request_state");
    assert!(h.take_frames(beta).is_empty(), "nothing reaches the sled");
    assert_eq!(h.gw.stats().parked_calls, 1, "still parked");
    // Byte for byte the answer to a handle that never was.
    let forged = json!(format!("rs-{}", "ab".repeat(16)));
    let t = retry_as(&mut h, BOB, 2, &forged);
    let (_, never) = answer(&mut h, t);
    assert_eq!(theirs, never);
    // The caller's own retry still attaches: the sled's request is asked again.
    let t = retry_as(&mut h, ALICE, 3, &state);
    let (status, r) = answer(&mut h, t);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
}

/// Security review finding 13: on a retry the parked call's right is asked again of the rules
/// in force: a reload that took it refuses the retry, and the call ends, cancelled at the
/// sled; an answer the sled gave meanwhile is not handed out either.
#[test]
fn a_reload_that_takes_the_right_refuses_the_retry_of_a_parked_call() {
    let mut h = authed_harness();
    let beta = h.connect_sled("beta");
    let (call, state) = parked_as(&mut h, beta, ALICE);
    h.handle(crate::Input::Reload {
        registry: rights_file(RIGHTS_REVOKED),
    });
    let t = retry_as(&mut h, ALICE, 2, &state);
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["error"]["data"]["kind"], "unknown_project", "{r}");
    let back = h.take_frames(beta);
    assert!(
        back.iter()
            .any(|f| f["method"] == "notifications/cancelled"
                && f["params"]["requestId"] == call["id"]),
        "the call is cancelled at the sled: {back:?}"
    );
    assert!(
        !back.iter().any(|f| f["id"] == "s-1"),
        "no answer goes to the sled's request: {back:?}"
    );
    assert_eq!(h.gw.stats().parked_calls, 0);

    // The same with the sled's answer held for the retry: it is not given.
    h.handle(crate::Input::Reload {
        registry: rights_file(RIGHTS_GRANTED),
    });
    let (call, state) = parked_as(&mut h, beta, ALICE);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":call["id"],"result":{"content":[{"type":"text","text":"secret"}]}}),
    );
    h.handle(crate::Input::Reload {
        registry: rights_file(RIGHTS_REVOKED),
    });
    let t = retry_as(&mut h, ALICE, 3, &state);
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["error"]["data"]["kind"], "unknown_project", "{r}");
    assert!(!r.to_string().contains("secret"), "{r}");
    assert_eq!(h.gw.stats().parked_calls, 0);
}
