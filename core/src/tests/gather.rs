//! Fleet tools for the whole cluster, on the fake clock: `aggregate_pipeline_status` and
//! `gateway_health` asking the replicas that hold the other projects' sleds.

use std::time::Duration;

use serde_json::{json, Value};

use super::cluster::{event, owned_by, relay_answers, replica, take_actions};
use super::Harness;
use crate::cluster::{ClusterAction, ClusterEvent, RelaySent};
use crate::directory::ClaimOutcome;
use crate::{HttpMethod, HttpRequest, HttpToken, Input, UplinkId};

/// A sled of `project` on `h` that lists `pipeline_status`, its claim won at `revision`.
fn pipeline_sled(h: &mut Harness, project: &str, revision: u64) -> UplinkId {
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":project,"sled":project}),
    );
    take_actions(h);
    event(
        h,
        ClusterEvent::Claimed {
            project: project.into(),
            outcome: ClaimOutcome::Won(revision),
        },
    );
    let f = h.take_frames(u);
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":[{"name":"pipeline_status","inputSchema":{"type":"object"}}]}}),
    );
    u
}

fn status(backlog: u64) -> Value {
    let s = json!({"total": backlog, "stages": {"backlog": backlog}, "blocked": [], "failing": []});
    json!({"content":[{"type":"text","text":s.to_string()}],"structuredContent":s})
}

fn answer_locally(h: &mut Harness, u: UplinkId, backlog: u64) {
    for f in h.take_frames(u) {
        if f["method"] == "tools/call" {
            h.sled_says(
                u,
                json!({"jsonrpc":"2.0","id":f["id"],"result":status(backlog)}),
            );
        }
    }
}

/// The parts relayed: token, replica, and the request's body.
fn parts(h: &mut Harness) -> Vec<(HttpToken, String, Value, bool)> {
    take_actions(h)
        .into_iter()
        .filter_map(|a| match a {
            ClusterAction::Relay {
                token,
                replica,
                request,
                ..
            } => Some((
                token,
                replica,
                serde_json::from_slice(&request.body).unwrap(),
                request.relayed,
            )),
            _ => None,
        })
        .collect()
}

fn not_answered(r: &Value) -> Vec<(String, String, String)> {
    r["result"]["structuredContent"]["not_answered"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["project"].as_str().unwrap().to_owned(),
                n["reason"].as_str().unwrap().to_owned(),
                n["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn pipeline_status_asks_each_projects_holder() {
    let mut h = replica("r1");
    let alpha = pipeline_sled(&mut h, "alpha", 2);
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!("agg"), "aggregate_pipeline_status", json!({}));
    let sent = parts(&mut h);
    let [(part, to, body, relayed)] = sent.as_slice() else {
        panic!("{sent:?}");
    };
    assert_ne!(*part, t, "a part of its own, not the client's request");
    assert_eq!(to, "r2");
    assert!(relayed, "r2 answers for its own sled and relays nothing on");
    assert_eq!(body["method"], "tools/call");
    assert_eq!(body["params"]["name"], "pipeline_status");
    assert_eq!(body["params"]["arguments"], json!({"project": "beta"}));
    answer_locally(&mut h, alpha, 2);
    assert!(!h.replies.contains_key(&t), "beta's part is still out");
    relay_answers(
        &mut h,
        *part,
        json!({"jsonrpc":"2.0","id":1,"result":status(5)}),
    );
    let r = h.reply_json(t).expect("answered once both parts are in");
    let s = &r["result"]["structuredContent"];
    assert_eq!(s["totals"]["answered"], 2, "{s}");
    assert_eq!(s["totals"]["stages"]["backlog"], 7);
    assert!(not_answered(&r).is_empty());
    // A late message for the part changes nothing.
    relay_answers(
        &mut h,
        *part,
        json!({"jsonrpc":"2.0","id":1,"result":status(9)}),
    );
    assert!(!h.replies.contains_key(&t));
}

#[test]
fn a_part_without_an_answer_is_named_with_its_replica() {
    let mut h = replica("r1");
    owned_by(&mut h, "alpha", "r2", 2);
    owned_by(&mut h, "beta", "r3", 3);
    let t = h.call(
        None,
        json!(1),
        "aggregate_pipeline_status",
        json!({"per_project_timeout_ms": 1000}),
    );
    let sent = parts(&mut h);
    assert_eq!(sent.len(), 2, "{sent:?}");
    let by = |r: &str| sent.iter().find(|p| p.1 == r).unwrap().0;
    event(
        &mut h,
        ClusterEvent::RelayFailed {
            token: by("r2"),
            sent: RelaySent::Unknown,
        },
    );
    assert!(!h.replies.contains_key(&t));
    h.advance(Duration::from_millis(1000));
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::RelayAbort { token: by("r3") }],
        "the replica still at it is told to stop"
    );
    let r = h.reply_json(t).expect("answered at the part's deadline");
    let n = not_answered(&r);
    assert_eq!(n[0].0, "alpha");
    assert_eq!(n[0].1, "error");
    assert!(
        n[0].2.contains("'r2'") && n[0].2.contains("silent"),
        "{n:?}"
    );
    assert_eq!(n[1].0, "beta");
    assert_eq!(n[1].1, "timed_out");
    assert!(n[1].2.contains("'r3'"), "{n:?}");
}

#[test]
fn a_pipeline_client_going_away_stops_the_parts_elsewhere() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(1), "aggregate_pipeline_status", json!({}));
    let sent = parts(&mut h);
    h.handle(Input::HttpAborted { token: t });
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::RelayAbort { token: sent[0].0 }]
    );
}

fn health_rows(r: &Value) -> Vec<(String, String, Value)> {
    r["result"]["structuredContent"]["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["project"].as_str().unwrap().to_owned(),
                row["status"].as_str().unwrap().to_owned(),
                row["replica"].clone(),
            )
        })
        .collect()
}

#[test]
fn gateway_health_takes_the_rows_of_projects_held_elsewhere_from_their_holder() {
    let mut h = replica("r1");
    pipeline_sled(&mut h, "alpha", 2);
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(7), "gateway_health", json!({}));
    let sent = parts(&mut h);
    let [(part, to, body, true)] = sent.as_slice() else {
        panic!("{sent:?}");
    };
    assert_eq!(
        (to.as_str(), &body["params"]["name"]),
        ("r2", &json!("gateway_health"))
    );
    assert!(!h.replies.contains_key(&t));
    // r2's answer: its rows (beta up there; alpha, which r2 does not hold, down).
    let theirs = json!({"projects": [
        {"project": "alpha", "status": "down", "replica": "r1"},
        {"project": "beta", "status": "up", "via": "uplink", "replica": "r2"},
    ]});
    relay_answers(
        &mut h,
        *part,
        json!({"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":theirs}}),
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["id"], 7);
    assert_eq!(
        health_rows(&r),
        [
            ("alpha".to_owned(), "up".to_owned(), json!("r1")),
            ("beta".to_owned(), "up".to_owned(), json!("r2")),
        ]
    );
    let summary = &r["result"]["structuredContent"]["summary"];
    assert_eq!(summary["up"], json!(["alpha", "beta"]));
    assert_eq!(summary["down"], json!([]));
    // The text block says the same as the structured content.
    let text: Value =
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, r["result"]["structuredContent"]);
}

#[test]
fn gateway_health_says_which_replica_did_not_answer() {
    let mut h = replica("r1");
    owned_by(&mut h, "alpha", "r2", 2);
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(1), "gateway_health", json!({}));
    let sent = parts(&mut h);
    assert_eq!(sent.len(), 1, "one part per replica: {sent:?}");
    event(
        &mut h,
        ClusterEvent::RelayFailed {
            token: sent[0].0,
            sent: RelaySent::NotSent,
        },
    );
    let r = h.reply_json(t).unwrap();
    let rows = &r["result"]["structuredContent"]["projects"];
    for row in rows.as_array().unwrap() {
        assert_eq!(row["status"], "unknown", "{row}");
        assert!(
            row["reasons"][0].as_str().unwrap().contains("'r2'"),
            "{row}"
        );
    }
    assert_eq!(
        r["result"]["structuredContent"]["summary"]["unknown"],
        json!(["alpha", "beta"])
    );
}

#[test]
fn gateway_health_waits_no_longer_than_the_part_deadline() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(1), "gateway_health", json!({}));
    let sent = parts(&mut h);
    h.advance(crate::Config::default().fanout_sled_timeout);
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::RelayAbort { token: sent[0].0 }]
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(health_rows(&r)[1].1, "unknown");
}

#[test]
fn a_relayed_fleet_tool_answers_for_this_replicas_sleds_only() {
    let mut h = replica("r2");
    owned_by(&mut h, "alpha", "r1", 2);
    pipeline_sled(&mut h, "beta", 3);
    for tool in ["gateway_health", "aggregate_pipeline_status"] {
        let relayed = HttpRequest {
            method: HttpMethod::Post,
            content_type: Some("application/json".into()),
            accept: Some("application/json".into()),
            relayed: true,
            access_token: crate::AccessToken::Relayed(crate::auth::Caller::Anonymous),
            body: Harness::call_body(json!(1), tool, json!({})).into_bytes(),
            ..HttpRequest::default()
        };
        let t = h.request(relayed);
        assert!(parts(&mut h).is_empty(), "{tool}: nothing relayed on");
        if tool == "gateway_health" {
            let r = h.reply_json(t).unwrap();
            assert_eq!(health_rows(&r)[1].2, json!("r2"));
        }
    }
}

#[test]
fn fleet_identity_takes_the_rows_of_projects_held_elsewhere_from_their_holder() {
    let mut h = replica("r1");
    pipeline_sled(&mut h, "alpha", 2);
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(8), "fleet_identity", json!({}));
    let sent = parts(&mut h);
    let [(part, to, body, true)] = sent.as_slice() else {
        panic!("{sent:?}");
    };
    assert_eq!(
        (to.as_str(), &body["params"]["name"]),
        ("r2", &json!("fleet_identity"))
    );
    assert!(!h.replies.contains_key(&t), "it waits for r2's rows");
    // r2 holds beta's sled, which it verified; it sees alpha offline (not its sled).
    let theirs = json!({"projects": [
        {"project": "alpha", "status": "offline", "refused": null},
        {"project": "beta", "status": "verified", "pinned": "k", "live": "k", "refused": null},
    ]});
    relay_answers(
        &mut h,
        *part,
        json!({"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":theirs}}),
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["id"], 8);
    assert_eq!(
        health_rows(&r),
        [
            ("alpha".to_owned(), "unsigned".to_owned(), json!("r1")),
            ("beta".to_owned(), "verified".to_owned(), json!("r2")),
        ],
        "each project as the replica holding its sled sees it"
    );
    let summary = &r["result"]["structuredContent"]["summary"];
    assert_eq!(summary["verified"], json!(["beta"]));
    assert_eq!(summary["unsigned"], json!(["alpha"]));
    assert!(summary.get("offline").is_none(), "{summary}");
}
