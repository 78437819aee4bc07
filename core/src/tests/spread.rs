//! A `wait` across replicas: a part at each other holder, the first to wake answers
//! (`gateway/spread.rs`).

use std::time::Duration;

use serde_json::{json, Value};

use super::cluster::{
    event, initialize, owned_by, relay_answers, replica, sled_claimed, take_actions,
};
use super::Harness;
use crate::cluster::{ClusterAction, ClusterEvent, RelaySent};
use crate::{HttpRequest, HttpToken, UplinkId};

/// r1 holds alpha's sled, r2 beta's; a session made on r1 is present in alpha.
fn setup() -> (Harness, UplinkId, String) {
    let mut h = replica("r1");
    let alpha = sled_claimed(&mut h, "alpha", 3);
    owned_by(&mut h, "beta", "r2", 4);
    let s = initialize(&mut h);
    let t = h.call(Some(&s), json!(0), "checkin", json!({"project":"alpha"}));
    assert!(h.reply_json(t).is_some());
    take_actions(&mut h);
    (h, alpha, s)
}

/// The parts relayed: (token, replica, the relayed request).
fn parts(h: &mut Harness) -> Vec<(HttpToken, String, Box<HttpRequest>)> {
    take_actions(h)
        .into_iter()
        .filter_map(|a| match a {
            ClusterAction::Relay {
                token,
                replica,
                request,
                ..
            } => Some((token, replica, request)),
            _ => None,
        })
        .collect()
}

fn arguments(request: &HttpRequest) -> Value {
    let v: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(v["params"]["name"], "wait");
    v["params"]["arguments"].clone()
}

fn woke_in(project: &str) -> Value {
    json!({"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{
        "woke":true,"project":project,"reasons":[{"kind":"message","id":1,"from":"agent-9","to":"you"}]}}})
}

#[test]
fn a_wait_in_projects_of_two_replicas_is_answered_by_the_first_to_wake() {
    let (mut h, _, s) = setup();
    let t = h.call(
        Some(&s),
        json!(1),
        "wait",
        json!({"projects":["alpha","beta"],"timeout_s":10}),
    );
    assert!(!h.replies.contains_key(&t), "parked");
    let ps = parts(&mut h);
    let [(part, replica, request)] = ps.as_slice() else {
        panic!("{ps:?}");
    };
    assert_eq!(replica, "r2");
    assert_eq!(
        request.session.as_deref(),
        Some(s.as_str()),
        "as the same agent"
    );
    assert!(request.relayed);
    assert_eq!(
        arguments(request),
        json!({"projects":["beta"],"timeout_s":10})
    );
    // beta's holder wakes it: the client gets that answer, and the waiter here is gone.
    relay_answers(&mut h, *part, woke_in("beta"));
    let r = h.reply_json(t).expect("answered");
    assert_eq!(r["result"]["structuredContent"]["project"], "beta", "{r}");
    assert!(take_actions(&mut h).is_empty(), "nothing left to abort");
    let t2 = h.call(
        Some(&s),
        json!(2),
        "send",
        json!({"project":"alpha","body":"hi"}),
    );
    assert!(h.reply_json(t2).is_some());
    assert!(!h.replies.contains_key(&t), "answered once");
}

#[test]
fn a_wait_woken_here_withdraws_its_parts_elsewhere() {
    let (mut h, _, s) = setup();
    let other = {
        take_actions(&mut h);
        let o = initialize(&mut h);
        take_actions(&mut h);
        o
    };
    let t = h.call(
        Some(&s),
        json!(1),
        "wait",
        json!({"projects":["alpha","beta"]}),
    );
    let ps = parts(&mut h);
    let part = ps[0].0;
    // A message to it in alpha, here: the wait answers, and r2 is told to withdraw its part.
    let roster = h.call(Some(&s), json!(2), "roster", json!({"project":"alpha"}));
    let me = h.reply_json(roster).unwrap()["result"]["structuredContent"]["agents"][0]["agent"]
        .as_str()
        .unwrap()
        .to_owned();
    let t2 = h.call(
        Some(&other),
        json!(3),
        "send",
        json!({"project":"alpha","body":"hi","to":me}),
    );
    assert!(h.reply_json(t2).is_some());
    let r = h.reply_json(t).expect("woken here");
    assert_eq!(r["result"]["structuredContent"]["project"], "alpha", "{r}");
    assert!(take_actions(&mut h).contains(&ClusterAction::RelayAbort { token: part }));
    // The part's late answer changes nothing.
    relay_answers(&mut h, part, woke_in("beta"));
    assert!(!h.replies.contains_key(&t));
}

#[test]
fn a_wait_only_elsewhere_ends_with_its_parts() {
    let (mut h, _, s) = setup();
    // The part times out there: so does the client's wait.
    let t = h.call(
        Some(&s),
        json!(1),
        "wait",
        json!({"projects":["beta"],"timeout_s":2}),
    );
    let part = parts(&mut h)[0].0;
    relay_answers(
        &mut h,
        part,
        json!({"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"woke":false,"project":null,"reasons":[]}}}),
    );
    let r = h.reply_json(t).expect("answered");
    assert_eq!(r["result"]["structuredContent"]["woke"], false, "{r}");
    // An error there is the client's answer.
    let t = h.call(Some(&s), json!(2), "wait", json!({"projects":["beta"]}));
    let part = parts(&mut h)[0].0;
    relay_answers(
        &mut h,
        part,
        json!({"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no","data":{"kind":"x"}}}),
    );
    let r = h.reply_json(t).expect("answered");
    assert_eq!(r["error"]["data"]["kind"], "x", "{r}");
    // A replica that never answers: given up past the timeout, the wait times out.
    let t = h.call(
        Some(&s),
        json!(3),
        "wait",
        json!({"projects":["beta"],"timeout_s":1}),
    );
    let part = parts(&mut h)[0].0;
    event(
        &mut h,
        ClusterEvent::RelayFailed {
            token: part,
            sent: RelaySent::Unknown,
        },
    );
    let r = h.reply_json(t).expect("answered");
    assert_eq!(r["result"]["structuredContent"]["woke"], false, "{r}");
    // Its client going away aborts the part.
    let t = h.call(Some(&s), json!(4), "wait", json!({"projects":["beta"]}));
    let part = parts(&mut h)[0].0;
    h.handle(crate::Input::HttpAborted { token: t });
    assert!(take_actions(&mut h).contains(&ClusterAction::RelayAbort { token: part }));
    h.advance(Duration::from_secs(30));
    assert!(!h.replies.contains_key(&t));
}

#[test]
fn a_wait_naming_no_project_asks_every_holder_for_its_own() {
    let (mut h, _, s) = setup();
    let t = h.call(Some(&s), json!(1), "wait", json!({}));
    let ps = parts(&mut h);
    let [(_, replica, request)] = ps.as_slice() else {
        panic!("{ps:?}");
    };
    assert_eq!(replica, "r2");
    let args = arguments(request);
    assert!(
        args.get("projects").is_none(),
        "its own presence there: {args}"
    );
    assert!(!h.replies.contains_key(&t), "alpha waited in here");
    // Outside a cluster nothing is relayed (the harness of one gateway).
    let mut one = Harness::new();
    one.connect_sled("alpha");
    let s1 = one.initialize();
    let t = one.call(Some(&s1), json!(1), "checkin", json!({"project":"alpha"}));
    assert!(one.reply_json(t).is_some());
    let t = one.call(Some(&s1), json!(2), "wait", json!({"timeout_s":1}));
    assert!(one.cluster.is_empty());
    one.advance(Duration::from_secs(2));
    assert!(one.reply_json(t).is_some());
}
