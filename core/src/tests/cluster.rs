//! The gateway as a replica of a cluster, on the fake clock: claims before welcomes, the
//! epoch in the welcome, losing a claim, relaying to the holder, and sessions in the engine.

use std::time::Duration;

use serde_json::{json, Value};

use super::{sled_tools, Harness};
use crate::cluster::{
    ClusterAction, ClusterConfig, ClusterEvent, EngineDown, RelayMessage, RelaySent, SessionRecord,
};
use crate::directory::{ClaimOutcome, ClaimValue, DirectoryConfig, EntryState};
use crate::{Config, HttpMethod, HttpReply, HttpRequest, HttpToken, Input, UplinkId};

pub(super) fn replica(name: &str) -> Harness {
    replica_with_grace(name, Duration::from_secs(3))
}

fn replica_with_grace(name: &str, move_grace: Duration) -> Harness {
    let config = Config {
        cluster: Some(ClusterConfig {
            replica: name.into(),
            directory: DirectoryConfig::new(Duration::from_secs(9)),
            move_grace,
            agent_key: Some(crate::agents::AgentKey::derive(&[1; 32])),
            previous_agent_key: None,
            task_keys: Some((crate::tasks::TaskKey::new([1; 4], [1; 32]), None)),
        }),
        ..Config::default()
    };
    let mut h = Harness::with_config(
        &["alpha", "beta"],
        Some("alpha"),
        config,
        [name.len() as u8; 32],
    );
    h.coord_bucket = Some(crate::tests::CoordBucket::default());
    h
}

pub(super) fn event(h: &mut Harness, e: ClusterEvent) {
    h.handle(Input::Cluster(e));
}

pub(super) fn take_actions(h: &mut Harness) -> Vec<ClusterAction> {
    std::mem::take(&mut h.cluster)
}

/// A hello on `h` for `project`; the claim it makes is won at `revision`.
pub(super) fn sled_claimed(h: &mut Harness, project: &str, revision: u64) -> UplinkId {
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":project,"sled":project}),
    );
    assert!(h.take_frames(u).is_empty(), "no welcome before the claim");
    let claims: Vec<_> = take_actions(h)
        .into_iter()
        .filter(|a| matches!(a, ClusterAction::Claim { project: p, .. } if p == project))
        .collect();
    assert_eq!(claims.len(), 1, "{claims:?}");
    event(
        h,
        ClusterEvent::Claimed {
            project: project.into(),
            outcome: ClaimOutcome::Won(revision),
        },
    );
    let frames = h.take_frames(u);
    assert_eq!(frames[0]["uplink"], "welcome", "{frames:?}");
    assert_eq!(frames[0]["epoch"], revision);
    let id = frames[1]["id"].clone();
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":id,"result":{"tools":sled_tools()}}),
    );
    u
}

pub(super) fn owned_by(h: &mut Harness, project: &str, owner: &str, revision: u64) {
    event(
        h,
        ClusterEvent::Entry {
            project: project.into(),
            revision,
            state: EntryState::Claimed(ClaimValue {
                owner: owner.into(),
                epoch: None,
                handover: false,
            }),
        },
    );
}

/// The replica a part (or request) was relayed to answers it, whole, with this JSON-RPC
/// response.
pub(super) fn relay_answers(h: &mut Harness, token: HttpToken, response: Value) {
    event(
        h,
        ClusterEvent::Relayed {
            token,
            message: RelayMessage::Reply(HttpReply {
                status: 200,
                headers: Vec::new(),
                body: Some(response.to_string()),
            }),
        },
    );
}

fn body(reply: &HttpReply) -> Value {
    serde_json::from_str(reply.body.as_deref().unwrap()).unwrap()
}

#[test]
fn a_sled_is_welcomed_with_the_epoch_of_the_claim_it_won() {
    let mut h = replica("r1");
    let u = sled_claimed(&mut h, "alpha", 41);
    let t = h.call(None, json!(1), "echo", json!({"project":"alpha"}));
    assert_eq!(h.sled_answers_all(u, "alpha"), 1);
    assert_eq!(
        h.reply_json(t).unwrap()["result"]["structuredContent"]["project"],
        "alpha"
    );
    assert_eq!(h.gw.metrics().cluster.unwrap().claims_won, 1);
}

#[test]
fn a_claim_not_won_within_the_hello_timeout_sends_the_sled_away() {
    let mut h = replica("r1");
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"alpha","sled":"alpha"}),
    );
    event(&mut h, ClusterEvent::Engine { up: false });
    event(
        &mut h,
        ClusterEvent::Claimed {
            project: "alpha".into(),
            outcome: ClaimOutcome::Unavailable,
        },
    );
    h.advance(Duration::from_secs(30));
    let (code, reason) = h.closed.get(&u).expect("closed").clone();
    assert_eq!(code, crate::uplink::CloseCode::HelloTimeout.code());
    assert!(reason.contains("claim"), "{reason}");
}

#[test]
fn losing_the_claim_closes_the_uplink_as_superseded_and_fails_its_calls() {
    let mut h = replica("r1");
    let u = sled_claimed(&mut h, "alpha", 5);
    let t = h.call(None, json!(1), "echo", json!({"project":"alpha"}));
    // Another replica's sled of alpha claimed it.
    owned_by(&mut h, "alpha", "r2", 6);
    let (code, _) = h.closed.get(&u).expect("closed").clone();
    assert_eq!(code, crate::uplink::CloseCode::Superseded.code());
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["data"]["kind"], "uplink_lost");
    assert_eq!(r["error"]["data"]["reason"], "superseded");
    assert_eq!(h.gw.metrics().cluster.unwrap().claims_lost, 1);
    // From now on alpha's calls go to r2.
    h.call(None, json!(2), "echo", json!({"project":"alpha"}));
    let relays = take_actions(&mut h);
    assert!(
        relays
            .iter()
            .any(|a| matches!(a, ClusterAction::Relay { replica, .. } if replica == "r2")),
        "{relays:?}"
    );
}

#[test]
fn a_call_for_a_project_held_elsewhere_is_relayed_and_its_answer_relayed_back() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!("c1"), "echo", json!({"project":"beta"}));
    assert!(
        !h.replies.contains_key(&t),
        "answered only when the owner answers"
    );
    let actions = take_actions(&mut h);
    let [ClusterAction::Relay {
        token,
        replica,
        request,
        timeout,
    }] = actions.as_slice()
    else {
        panic!("{actions:?}");
    };
    assert_eq!((*token, replica.as_str()), (t, "r2"));
    assert_eq!(
        *timeout,
        crate::ProjectSpec::new("b", "http://x").call_timeout
    );
    assert!(request.relayed, "the owner must not relay it again");
    let answer = HttpReply {
        status: 200,
        headers: Vec::new(),
        body: Some(r#"{"jsonrpc":"2.0","id":"c1","result":{"content":[]}}"#.into()),
    };
    event(
        &mut h,
        ClusterEvent::Relayed {
            token: t,
            message: RelayMessage::Reply(answer.clone()),
        },
    );
    assert_eq!(h.replies.remove(&t), Some(answer));
    // A late message of an answer that is over changes nothing.
    event(
        &mut h,
        ClusterEvent::RelayFailed {
            token: t,
            sent: RelaySent::Unknown,
        },
    );
    assert!(!h.replies.contains_key(&t));
    assert_eq!(h.gw.metrics().cluster.unwrap().relays, 1);
}

#[test]
fn a_relay_without_a_whole_answer_says_whether_the_call_was_sent() {
    // Without a grace to wait for a moving project, a relay nobody took is answered at once.
    let mut h = replica_with_grace("r1", Duration::ZERO);
    owned_by(&mut h, "beta", "r2", 3);
    for (sent, outcome, reason) in [
        (RelaySent::NotSent, "not_sent", "not_relayed"),
        (RelaySent::Unknown, "unknown", "owner_lost"),
    ] {
        let t = h.call(None, json!(9), "echo", json!({"project":"beta"}));
        event(&mut h, ClusterEvent::RelayFailed { token: t, sent });
        let r = h.reply_json(t).unwrap();
        assert_eq!(r["id"], 9);
        assert_eq!(r["error"]["code"], -32603);
        assert_eq!(r["error"]["data"]["kind"], "uplink_lost");
        assert_eq!(r["error"]["data"]["outcome"], outcome);
        assert_eq!(r["error"]["data"]["reason"], reason);
    }
}

#[test]
fn a_streamed_relay_that_fails_ends_its_stream_with_the_error() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(4), "echo", json!({"project":"beta"}));
    event(
        &mut h,
        ClusterEvent::Relayed {
            token: t,
            message: RelayMessage::Open,
        },
    );
    event(
        &mut h,
        ClusterEvent::Relayed {
            token: t,
            message: RelayMessage::Event {
                id: None,
                data: r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#.into(),
            },
        },
    );
    event(
        &mut h,
        ClusterEvent::RelayFailed {
            token: t,
            sent: RelaySent::Unknown,
        },
    );
    let events = &h.streams[&t];
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].1["error"]["data"]["outcome"], "unknown");
    assert!(h.streams_closed.contains(&t));
}

#[test]
fn the_client_of_a_relay_going_away_is_told_to_the_owner() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    take_actions(&mut h);
    h.handle(Input::HttpAborted { token: t });
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::RelayAbort { token: t }]
    );
}

#[test]
fn a_relayed_request_is_served_here_or_answered_never_relayed_again() {
    let mut h = replica("r2");
    owned_by(&mut h, "beta", "r3", 8);
    let relayed = HttpRequest {
        method: HttpMethod::Post,
        content_type: Some("application/json".into()),
        accept: Some("application/json".into()),
        relayed: true,
        access_token: crate::AccessToken::Relayed(crate::auth::Caller::Anonymous),
        body: Harness::call_body(json!(1), "echo", json!({"project":"beta"})).into_bytes(),
        ..HttpRequest::default()
    };
    let t = h.request(relayed.clone());
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["data"]["kind"], "sled_elsewhere");
    assert_eq!(r["error"]["data"]["replica"], "r3");
    assert!(take_actions(&mut h).is_empty());
    // With the sled here, it is served.
    let u = sled_claimed(&mut h, "beta", 9);
    let t = h.request(relayed);
    assert_eq!(h.sled_answers_all(u, "beta"), 1);
    assert!(h.reply_json(t).unwrap()["result"].is_object());
}

/// A move's race (issue 30): the replica that relays a call sees the new holder's claim in
/// the directory before the new holder hears its claim was won. The new holder holds the
/// request until then, rather than answer `sled_not_connected` (or `sled_elsewhere`, naming
/// the last holder) for a sled that is arriving; no longer than the move grace.
#[test]
fn a_request_relayed_to_a_replica_still_claiming_its_project_waits_for_the_claim() {
    let mut h = replica("r2");
    owned_by(&mut h, "beta", "r1", 8);
    let relayed = |id: u64| HttpRequest {
        method: HttpMethod::Post,
        content_type: Some("application/json".into()),
        accept: Some("application/json".into()),
        relayed: true,
        access_token: crate::AccessToken::Relayed(crate::auth::Caller::Anonymous),
        body: Harness::call_body(json!(id), "echo", json!({"project":"beta"})).into_bytes(),
        ..HttpRequest::default()
    };
    // beta's sled moves here from r1: its hello asks for the claim.
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta","moving":true}),
    );
    assert!(take_actions(&mut h)
        .iter()
        .any(|a| matches!(a, ClusterAction::Claim { project, .. } if project == "beta")));
    // Relayed before this replica's watch shows its own claim, and after.
    let early = h.request(relayed(1));
    owned_by(&mut h, "beta", "r2", 9);
    let late = h.request(relayed(2));
    assert_eq!(h.reply_json(early), None, "held, not answered");
    assert_eq!(h.reply_json(late), None, "held, not answered");
    event(
        &mut h,
        ClusterEvent::Claimed {
            project: "beta".into(),
            outcome: ClaimOutcome::Won(9),
        },
    );
    // Welcomed, and the held calls go to the sled at once.
    let frames = h.take_frames(u);
    assert_eq!(frames[0]["uplink"], "welcome", "{frames:?}");
    let calls: Vec<&Value> = frames
        .iter()
        .filter(|f| f["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2, "{frames:?}");
    for call in calls {
        h.sled_says(
            u,
            json!({"jsonrpc":"2.0","id":call["id"],"result":{"content":[]}}),
        );
    }
    for t in [early, late] {
        let r = h.reply_json(t).unwrap();
        assert!(r["result"].is_object(), "{r}");
    }
    // A claim that is not answered within the grace: the request is answered as the project
    // is then, and not held again for that claim.
    let mut h = replica("r2");
    owned_by(&mut h, "beta", "r1", 8);
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta","moving":true}),
    );
    owned_by(&mut h, "beta", "r2", 9);
    let t = h.request(relayed(3));
    assert_eq!(h.reply_json(t), None);
    h.advance(Duration::from_secs(3));
    let r = h.reply_json(t).expect("answered once the grace is over");
    assert_eq!(r["error"]["data"]["kind"], "sled_not_connected", "{r}");
}

#[test]
fn list_projects_names_the_replica_holding_each_sled() {
    let mut h = replica("r1");
    sled_claimed(&mut h, "alpha", 2);
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(1), "list_projects", json!({}));
    let r = h.reply_json(t).unwrap();
    let projects = &r["result"]["structuredContent"]["projects"];
    assert_eq!(projects[0]["replica"], "r1");
    assert_eq!(projects[0]["live"], true);
    assert_eq!(projects[1]["replica"], "r2");
    assert_eq!(projects[1]["live"], true);
}

fn record(default: &str) -> SessionRecord {
    SessionRecord {
        default_project: Some(default.into()),
        protocol_version: "2025-11-25".into(),
        log_level: None,
        client_capabilities: json!({}),
        owner: None,
    }
}

/// `initialize` on a replica: answered once the engine has the session. Returns its id; the
/// store action stays for the test to see.
pub(super) fn initialize(h: &mut Harness) -> String {
    let t = h.send(
        HttpMethod::Post,
        None,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
    );
    assert!(
        !h.replies.contains_key(&t),
        "not before the session is in the engine"
    );
    let session = h
        .cluster
        .iter()
        .find_map(|a| match a {
            ClusterAction::StoreSession { session, .. } => Some(session.clone()),
            _ => None,
        })
        .expect("the new session is written");
    event(
        h,
        ClusterEvent::SessionStored {
            session: session.clone(),
            written: true,
        },
    );
    let r = h.replies.remove(&t).expect("answered once stored");
    assert!(r
        .headers
        .iter()
        .any(|(n, v)| *n == "Mcp-Session-Id" && *v == session));
    session
}

#[test]
fn sessions_are_written_when_they_change() {
    let mut h = replica("r1");
    let s = initialize(&mut h);
    let stored = take_actions(&mut h);
    assert_eq!(
        stored,
        vec![ClusterAction::StoreSession {
            session: s.clone(),
            record: Some(record("alpha")),
        }]
    );
    let t = h.call(
        Some(&s),
        json!(1),
        "switch_project",
        json!({"project":"beta"}),
    );
    assert!(
        !h.replies.contains_key(&t),
        "a switch is confirmed once the engine has it"
    );
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::StoreSession {
            session: s.clone(),
            record: Some(record("beta")),
        }]
    );
    event(
        &mut h,
        ClusterEvent::SessionStored {
            session: s.clone(),
            written: true,
        },
    );
    assert!(h.reply_json(t).is_some());
    let t = h.send(HttpMethod::Delete, Some(&s), "");
    assert_eq!(h.replies[&t].status, 204);
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::StoreSession {
            session: s,
            record: None,
        }]
    );
}

#[test]
fn a_session_made_on_another_replica_is_read_from_the_engine_first() {
    let mut h = replica("r1");
    let body = Harness::call_body(json!(1), "list_projects", json!({}));
    let t1 = h.send(HttpMethod::Post, Some("s-from-r2"), &body);
    let t2 = h.send(HttpMethod::Post, Some("s-from-r2"), &body);
    assert!(h.replies.is_empty(), "both wait for the session");
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::LoadSession {
            session: "s-from-r2".into()
        }],
        "read once"
    );
    event(
        &mut h,
        ClusterEvent::SessionLoaded {
            session: "s-from-r2".into(),
            record: Ok(Some(record("beta"))),
            under_previous_secret: false,
        },
    );
    for t in [t1, t2] {
        let r = h.reply_json(t).unwrap();
        assert_eq!(r["result"]["structuredContent"]["active"], "beta");
    }
    assert!(
        !take_actions(&mut h)
            .iter()
            .any(|a| matches!(a, ClusterAction::StoreSession { .. })),
        "a record just read is not written again"
    );
    // Read under the previous cluster secret (a roll): written again, as it was.
    let t3 = h.send(HttpMethod::Post, Some("s-rolled"), &body);
    take_actions(&mut h);
    event(
        &mut h,
        ClusterEvent::SessionLoaded {
            session: "s-rolled".into(),
            record: Ok(Some(record("beta"))),
            under_previous_secret: true,
        },
    );
    let actions = take_actions(&mut h);
    assert!(
        actions.iter().any(|a| matches!(
            a,
            ClusterAction::StoreSession { session, record: Some(r) }
                if session == "s-rolled" && r.default_project.as_deref() == Some("beta")
        )),
        "written again under the current secret: {actions:?}"
    );
    // Answered once written, as after any write of a session.
    event(
        &mut h,
        ClusterEvent::SessionStored {
            session: "s-rolled".into(),
            written: true,
        },
    );
    assert!(h.replies.contains_key(&t3), "answered");
    // Another replica switches it; this one follows.
    event(
        &mut h,
        ClusterEvent::SessionChanged {
            session: "s-from-r2".into(),
            record: Some(record("alpha")),
        },
    );
    let t = h.send(HttpMethod::Post, Some("s-from-r2"), &body);
    assert_eq!(
        h.reply_json(t).unwrap()["result"]["structuredContent"]["active"],
        "alpha"
    );
    // Deleted elsewhere: gone here too.
    event(
        &mut h,
        ClusterEvent::SessionChanged {
            session: "s-from-r2".into(),
            record: None,
        },
    );
    take_actions(&mut h);
    let t = h.send(HttpMethod::Post, Some("s-from-r2"), &body);
    event(
        &mut h,
        ClusterEvent::SessionLoaded {
            session: "s-from-r2".into(),
            record: Ok(None),
            under_previous_secret: false,
        },
    );
    assert_eq!(h.replies[&t].status, 404);
}

#[test]
fn a_session_the_engine_cannot_be_asked_about_is_not_declared_lost() {
    let mut h = replica("r1");
    let t = h.send(
        HttpMethod::Post,
        Some("s9"),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    event(
        &mut h,
        ClusterEvent::SessionLoaded {
            session: "s9".into(),
            record: Err(EngineDown),
            under_previous_secret: false,
        },
    );
    let reply = &h.replies[&t];
    assert_eq!(reply.status, 503, "not 404: the client must not start over");
    assert!(reply.headers.iter().any(|(n, _)| *n == "Retry-After"));
    assert_eq!(
        body(reply)["error"]["data"]["kind"],
        "session_store_unavailable"
    );
}

#[test]
fn news_of_a_session_older_than_a_write_in_flight_is_ignored() {
    let mut h = replica("r1");
    let s = initialize(&mut h);
    h.call(
        Some(&s),
        json!(1),
        "switch_project",
        json!({"project":"beta"}),
    );
    // The watch echoes the first write (default alpha) while the second is in flight.
    event(
        &mut h,
        ClusterEvent::SessionChanged {
            session: s.clone(),
            record: Some(record("alpha")),
        },
    );
    assert_eq!(h.gw.session_default(&s), Some("beta"));
}

#[test]
fn shutdown_releases_the_claims_and_fails_the_relays() {
    let mut h = replica("r1");
    sled_claimed(&mut h, "alpha", 12);
    owned_by(&mut h, "beta", "r2", 13);
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    take_actions(&mut h);
    h.handle(Input::Shutdown);
    let actions = take_actions(&mut h);
    assert!(
        actions.contains(&ClusterAction::Release {
            project: "alpha".into(),
            revision: 12
        }),
        "{actions:?}"
    );
    assert!(actions.contains(&ClusterAction::RelayAbort { token: t }));
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["data"]["kind"], "shutting_down");
    let _: HttpToken = t;
}

#[test]
fn tools_list_is_made_where_the_default_projects_sled_is() {
    let mut h = replica("r1");
    owned_by(&mut h, "alpha", "r2", 3);
    let t = h.send(
        HttpMethod::Post,
        None,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    );
    let actions = take_actions(&mut h);
    assert!(
        matches!(actions.as_slice(), [ClusterAction::Relay { token, replica, .. }] if *token == t && replica == "r2"),
        "{actions:?}"
    );
    // With alpha's sled here, listed here.
    let mut h = replica("r2");
    sled_claimed(&mut h, "alpha", 4);
    let r = h.rpc(None, json!(1), "tools/list", json!({}));
    let tools = r["result"]["tools"].as_array().unwrap();
    assert!(tools.len() > crate::GATEWAY_TOOLS.len());
    assert!(take_actions(&mut h)
        .iter()
        .all(|a| !matches!(a, ClusterAction::Relay { .. })));
}

#[test]
fn a_lease_on_a_project_held_elsewhere_is_taken_where_its_sled_is() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let s = initialize(&mut h);
    take_actions(&mut h);
    let t = h.call(
        Some(&s),
        json!(1),
        "claim",
        json!({"project":"beta","resource":"main"}),
    );
    let actions = take_actions(&mut h);
    assert!(
        matches!(actions.as_slice(), [ClusterAction::Relay { token, replica, .. }] if *token == t && replica == "r2"),
        "{actions:?}"
    );
    // A project with its sled here keeps its leases here.
    let u = sled_claimed(&mut h, "alpha", 4);
    let _ = u;
    let t = h.call(
        Some(&s),
        json!(2),
        "claim",
        json!({"project":"alpha","resource":"main"}),
    );
    let r = h.reply_json(t).unwrap();
    assert!(r["result"]["structuredContent"]["fence"].is_u64(), "{r}");
}

#[test]
fn an_agent_handle_issued_by_one_replica_is_recognised_by_every_other() {
    let tool = |h: &mut Harness, id: u64, name: &str, arguments: Value| {
        let t = h.call(None, json!(id), name, arguments);
        h.reply_json(t).expect("answered at once")
    };
    let mut r1 = replica("r1");
    sled_claimed(&mut r1, "alpha", 3);
    let r = tool(
        &mut r1,
        1,
        "checkin",
        json!({"project":"alpha","name":"ci"}),
    );
    let handle = r["result"]["structuredContent"]["handle"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(handle.len(), 3 + 64, "with the cluster's MAC: {handle}");
    // r2 (the same cluster key) takes it for a lease in beta, whose sled is there.
    let mut r2 = replica("r2");
    sled_claimed(&mut r2, "beta", 4);
    let r = tool(
        &mut r2,
        2,
        "claim",
        json!({"project":"beta","resource":"x","agent":handle}),
    );
    assert_eq!(r["result"]["structuredContent"]["acquired"], true, "{r}");
    // The same agent again, by the same handle: it holds the lease.
    let r = tool(
        &mut r2,
        3,
        "claims",
        json!({"project":"beta","agent":handle}),
    );
    let holder = &r["result"]["structuredContent"]["leases"][0]["holder"];
    assert!(holder.is_string(), "{r}");
    // A handle with a forged MAC, or a single gateway's kind, is nobody's.
    let mut forged = handle.clone();
    let last = if forged.ends_with('0') { "1" } else { "0" };
    forged.replace_range(forged.len() - 1.., last);
    for h in [forged, format!("ah-{}", "0".repeat(32))] {
        let r = tool(
            &mut r2,
            4,
            "claim",
            json!({"project":"beta","resource":"y","agent":h}),
        );
        assert_eq!(r["error"]["data"]["kind"], "unknown_agent", "{h}: {r}");
    }
}

fn relays(h: &mut Harness) -> Vec<(HttpToken, String)> {
    take_actions(h)
        .into_iter()
        .filter_map(|a| match a {
            ClusterAction::Relay { token, replica, .. } => Some((token, replica)),
            _ => None,
        })
        .collect()
}

fn gone(h: &mut Harness, project: &str, revision: u64) {
    event(
        h,
        ClusterEvent::Entry {
            project: project.into(),
            revision,
            state: EntryState::Deleted,
        },
    );
}

#[test]
fn a_call_while_its_project_moves_waits_for_the_next_holder() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    // r2 shuts down: it released beta; the sled is on its way to another replica.
    gone(&mut h, "beta", 4);
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    assert!(!h.replies.contains_key(&t), "held, not failed");
    assert!(relays(&mut h).is_empty());
    h.advance(Duration::from_secs(1));
    owned_by(&mut h, "beta", "r3", 5);
    assert_eq!(relays(&mut h), vec![(t, "r3".to_owned())]);
    assert_eq!(h.gw.metrics().cluster.unwrap().held, 1);
}

#[test]
fn a_move_that_takes_too_long_answers_sled_not_connected() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    gone(&mut h, "beta", 4);
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    h.advance(Duration::from_secs(4));
    let r = h.reply_json(t).expect("answered when the grace is over");
    assert_eq!(r["error"]["data"]["kind"], "sled_not_connected");
    // A project never connected anywhere is answered at once.
    let t = h.call(None, json!(2), "echo", json!({"project":"alpha"}));
    assert_eq!(
        h.reply_json(t).unwrap()["error"]["data"]["kind"],
        "sled_not_connected"
    );
}

#[test]
fn a_relay_nobody_takes_waits_for_the_sled_to_come_back_elsewhere() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    assert_eq!(relays(&mut h), vec![(t, "r2".to_owned())]);
    // r2 died: nobody listens for it. Not sent, so held; and not relayed to r2 again.
    event(
        &mut h,
        ClusterEvent::RelayFailed {
            token: t,
            sent: RelaySent::NotSent,
        },
    );
    assert!(!h.replies.contains_key(&t));
    assert!(relays(&mut h).is_empty());
    let t2 = h.call(None, json!(2), "echo", json!({"project":"beta"}));
    assert!(relays(&mut h).is_empty(), "r2 takes nothing");
    // beta's sled dialed again and landed here.
    let u = sled_claimed(&mut h, "beta", 6);
    let sent: Vec<Value> = h.frame_texts[&u]
        .iter()
        .map(|t| serde_json::from_str(t).unwrap())
        .filter(|f: &Value| f["method"] == "tools/call")
        .collect();
    assert_eq!(h.sled_answers_all_frames(u, sent), 2);
    for t in [t, t2] {
        assert!(h.reply_json(t).unwrap()["result"].is_object());
    }
}

#[test]
fn a_held_request_whose_client_goes_away_is_forgotten() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    gone(&mut h, "beta", 4);
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    h.handle(Input::HttpAborted { token: t });
    owned_by(&mut h, "beta", "r3", 5);
    assert!(relays(&mut h).is_empty());
    assert!(!h.replies.contains_key(&t));
}

#[test]
fn relays_to_a_replica_that_lost_the_project_fail_at_once_as_unknown() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    take_actions(&mut h);
    // beta's sled came back through r3 (r2 died): r2 will never answer.
    owned_by(&mut h, "beta", "r3", 4);
    let r = h.reply_json(t).expect("failed at once");
    assert_eq!(r["error"]["data"]["outcome"], "unknown");
    assert_eq!(r["error"]["data"]["reason"], "owner_lost");
    assert!(take_actions(&mut h).contains(&ClusterAction::RelayAbort { token: t }));
    // A release is not a loss: the releasing replica answered its calls first.
    let t = h.call(None, json!(2), "echo", json!({"project":"beta"}));
    take_actions(&mut h);
    gone(&mut h, "beta", 5);
    assert!(!h.replies.contains_key(&t));
}

/// A hello with key `k` for `project`, its challenge answered; the frames after the proof.
pub(super) fn hello_with_key(
    h: &mut Harness,
    project: &str,
    k: &ed25519_dalek::SigningKey,
) -> (UplinkId, Vec<Value>) {
    use crate::identity::{encode_key, sign_challenge};
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":project,"sled":"s","key":encode_key(&k.verifying_key())}),
    );
    let f = h.take_frames(u);
    assert_eq!(f[0]["uplink"], "challenge", "{f:?}");
    let sig = sign_challenge(k, "gw", project, f[0]["nonce"].as_str().unwrap()).unwrap();
    h.sled_says(u, json!({"uplink":"proof","signature":sig,"gateway":"gw"}));
    (u, h.take_frames(u))
}

#[test]
fn a_first_use_pin_is_one_create_in_the_engine_and_the_first_replica_wins() {
    use crate::cluster::PinOutcome;
    use crate::identity::encode_key;
    let (mine, theirs) = (
        ed25519_dalek::SigningKey::from_bytes(&[1; 32]),
        ed25519_dalek::SigningKey::from_bytes(&[2; 32]),
    );
    let mut h = replica("r1");
    let (u, frames) = hello_with_key(&mut h, "alpha", &mine);
    assert!(frames.is_empty(), "no welcome before the pin: {frames:?}");
    let actions = take_actions(&mut h);
    let [ClusterAction::CreatePin { project, pin }] = actions.as_slice() else {
        panic!("{actions:?}");
    };
    assert_eq!(
        (project.as_str(), pin.key.clone()),
        ("alpha", encode_key(&mine.verifying_key()))
    );
    // Another replica pinned alpha to another key first: this sled is refused, here too.
    let winner = crate::Pin {
        key: encode_key(&theirs.verifying_key()),
        sled: "s".into(),
    };
    event(
        &mut h,
        ClusterEvent::PinCreated {
            project: "alpha".into(),
            outcome: PinOutcome::Exists(winner.clone()),
        },
    );
    assert_eq!(
        h.closed[&u].0,
        crate::uplink::CloseCode::IdentityRefused.code()
    );
    assert_eq!(h.gw.pins().get("alpha"), Some(&winner));
    // The winning key is accepted at once (known now), and claims the project.
    let (_, frames) = hello_with_key(&mut h, "alpha", &theirs);
    assert!(frames.is_empty());
    let actions = take_actions(&mut h);
    assert!(
        matches!(actions.as_slice(), [ClusterAction::Claim { project, .. }] if project == "alpha"),
        "{actions:?}"
    );
}

#[test]
fn during_a_secret_roll_the_holder_writes_its_pin_and_tools_again_and_nobody_else_does() {
    use crate::cluster::PinOutcome;
    use crate::identity::encode_key;
    let k = ed25519_dalek::SigningKey::from_bytes(&[4; 32]);
    let pin = crate::Pin {
        key: encode_key(&k.verifying_key()),
        sled: "s".into(),
    };
    let listing = serde_json::to_string(&sled_tools()).unwrap();
    let news = |previous: bool| {
        [
            ClusterEvent::PinChanged {
                project: "beta".into(),
                pin: Some(pin.clone()),
                under_previous_secret: previous,
            },
            ClusterEvent::ToolsChanged {
                project: "beta".into(),
                listing: Some(listing.clone()),
                under_previous_secret: previous,
            },
        ]
    };
    let mut h = replica("r1");
    // Not the holder (beta's sled is on r2): read, never written back.
    owned_by(&mut h, "beta", "r2", 3);
    take_actions(&mut h);
    for e in news(true) {
        event(&mut h, e);
    }
    assert_eq!(take_actions(&mut h), []);
    // The holder: under the current secret nothing is written; under the previous one the
    // pin and the listing are written again as they are.
    let mut h = replica("r1");
    let (u, _) = hello_with_key(&mut h, "beta", &k);
    take_actions(&mut h);
    event(
        &mut h,
        ClusterEvent::PinCreated {
            project: "beta".into(),
            outcome: PinOutcome::Created,
        },
    );
    event(
        &mut h,
        ClusterEvent::Claimed {
            project: "beta".into(),
            outcome: ClaimOutcome::Won(5),
        },
    );
    assert!(h.gw.is_live("beta"), "{:?}", h.closed.get(&u));
    take_actions(&mut h);
    for e in news(false) {
        event(&mut h, e);
    }
    assert_eq!(take_actions(&mut h), []);
    for e in news(true) {
        event(&mut h, e);
    }
    assert_eq!(
        take_actions(&mut h),
        [
            ClusterAction::StorePin {
                project: "beta".into(),
                pin: pin.clone(),
            },
            ClusterAction::StoreTools {
                project: "beta".into(),
                listing: listing.clone(),
            },
        ]
    );

    // A replica that learnt the pin under the previous secret before it held the sled (a
    // restart in the roll: its watch reads every pin at once) writes it when it comes to.
    let mut h = replica("r1");
    let [pin_news, _] = news(true);
    event(&mut h, pin_news);
    assert_eq!(take_actions(&mut h), []);
    hello_with_key(&mut h, "beta", &k);
    take_actions(&mut h);
    event(
        &mut h,
        ClusterEvent::Claimed {
            project: "beta".into(),
            outcome: ClaimOutcome::Won(6),
        },
    );
    assert!(h.gw.is_live("beta"));
    let actions = take_actions(&mut h);
    assert!(
        actions.contains(&ClusterAction::StorePin {
            project: "beta".into(),
            pin: pin.clone(),
        }),
        "{actions:?}"
    );
}

#[test]
fn a_pin_created_here_serves_and_the_engine_down_sends_the_sled_away() {
    use crate::cluster::PinOutcome;
    let k = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
    let mut h = replica("r1");
    let (u, _) = hello_with_key(&mut h, "beta", &k);
    take_actions(&mut h);
    event(
        &mut h,
        ClusterEvent::PinCreated {
            project: "beta".into(),
            outcome: PinOutcome::Created,
        },
    );
    assert!(h.gw.pins().get("beta").is_some());
    assert!(take_actions(&mut h)
        .iter()
        .any(|a| matches!(a, ClusterAction::Claim { project, .. } if project == "beta")));
    assert!(!h.closed.contains_key(&u));
    let (u2, _) = hello_with_key(&mut h, "alpha", &k);
    event(
        &mut h,
        ClusterEvent::PinCreated {
            project: "alpha".into(),
            outcome: PinOutcome::Unavailable,
        },
    );
    assert_eq!(
        h.closed[&u2].0,
        crate::uplink::CloseCode::HelloTimeout.code()
    );
    assert!(
        h.gw.pins().get("alpha").is_none(),
        "nothing pinned without the engine"
    );
}

#[test]
fn pins_made_elsewhere_are_followed_here() {
    let mut h = replica("r1");
    let pin = crate::Pin {
        key: "AAAA".into(),
        sled: "s".into(),
    };
    event(
        &mut h,
        ClusterEvent::PinChanged {
            project: "alpha".into(),
            pin: Some(pin.clone()),
            under_previous_secret: false,
        },
    );
    assert_eq!(h.gw.pins().get("alpha"), Some(&pin));
}

#[test]
fn a_new_session_is_answered_only_once_any_replica_can_read_it() {
    let mut h = replica("r1");
    initialize(&mut h);
}

#[test]
fn a_new_session_the_engine_did_not_take_is_not_given_out() {
    let mut h = replica("r1");
    let t = h.send(
        HttpMethod::Post,
        None,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
    );
    let session = take_actions(&mut h)
        .into_iter()
        .find_map(|a| match a {
            ClusterAction::StoreSession { session, .. } => Some(session),
            _ => None,
        })
        .expect("the new session is written");
    event(
        &mut h,
        ClusterEvent::SessionStored {
            session: session.clone(),
            written: false,
        },
    );
    // Another replica would not find it: refused, retryable, and no id given out.
    let r = h.replies.remove(&t).expect("answered");
    assert_eq!(r.status, 503);
    assert!(r.headers.iter().all(|(n, _)| *n != "Mcp-Session-Id"));
    assert!(r.headers.iter().any(|(n, _)| *n == "Retry-After"));
    let body: serde_json::Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
    assert_eq!(
        body["error"]["data"]["kind"], "session_not_stored",
        "{body}"
    );
    // Nor kept here: a request naming it is read from the engine like any unknown one.
    h.call(Some(&session), json!(1), "list_projects", json!({}));
    assert!(take_actions(&mut h)
        .iter()
        .any(|a| matches!(a, ClusterAction::LoadSession { session: s } if *s == session)));
}

#[test]
fn a_session_write_that_failed_is_written_again_at_the_next_use() {
    let mut h = replica("r1");
    let s = initialize(&mut h);
    take_actions(&mut h);
    let t = h.call(
        Some(&s),
        json!(1),
        "switch_project",
        json!({"project":"beta"}),
    );
    take_actions(&mut h);
    event(
        &mut h,
        ClusterEvent::SessionStored {
            session: s.clone(),
            written: false,
        },
    );
    assert!(h.reply_json(t).is_some());
    let t = h.call(Some(&s), json!(2), "list_projects", json!({}));
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::StoreSession {
            session: s.clone(),
            record: Some(record("beta")),
        }]
    );
    event(
        &mut h,
        ClusterEvent::SessionStored {
            session: s,
            written: true,
        },
    );
    assert!(h.reply_json(t).is_some());
}

#[test]
fn a_switch_is_written_even_when_this_replicas_copy_already_says_so() {
    let mut h = replica("r1");
    let s = initialize(&mut h);
    take_actions(&mut h);
    // This replica's copy says alpha; another replica switched to beta (not seen here yet).
    let t = h.call(
        Some(&s),
        json!(1),
        "switch_project",
        json!({"project":"alpha"}),
    );
    assert!(!h.replies.contains_key(&t));
    assert_eq!(
        take_actions(&mut h),
        vec![ClusterAction::StoreSession {
            session: s,
            record: Some(record("alpha")),
        }]
    );
}

/// Issue 25: a project's coordination state goes with it from replica to replica. The holder
/// writes it to the engine's bucket (modelled) before answering, releases its claim only after
/// its writes, and the next holder reads it before serving; an agent (a handle) has the same
/// name on every replica, so its lease is still its own.
#[test]
fn a_project_moving_between_replicas_takes_its_coordination_state_along() {
    let tool = |h: &mut Harness, id: u64, name: &str, arguments: Value| {
        let t = h.call(None, json!(id), name, arguments);
        h.reply_json(t).expect("answered at once")["result"]["structuredContent"].clone()
    };
    let bucket = crate::tests::CoordBucket::default();
    let mut r1 = replica("r1");
    r1.coord_bucket = Some(bucket.clone());
    let u1 = sled_claimed(&mut r1, "alpha", 3);
    let handle_of = |h: &mut Harness, id, name: &str| {
        tool(h, id, "checkin", json!({"project":"alpha","name":name}))["handle"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let ann = handle_of(&mut r1, 1, "ann");
    let lease = tool(
        &mut r1,
        2,
        "claim",
        json!({"project":"alpha","resource":"story:1","agent":ann,"ttl_s":60}),
    );
    assert_eq!(lease["acquired"], true, "{lease}");
    let set = tool(
        &mut r1,
        3,
        "board_set",
        json!({"project":"alpha","key":"plan","value":"v1","agent":ann}),
    );
    assert!(set["revision"].is_u64(), "{set}");
    assert!(!bucket.borrow().is_empty(), "written before answered");
    // r1's sled goes; its claim is released.
    take_actions(&mut r1);
    r1.handle(Input::UplinkClosed { uplink: u1 });
    assert!(
        take_actions(&mut r1)
            .iter()
            .any(|a| matches!(a, ClusterAction::Release { project, .. } if project == "alpha")),
        "released"
    );
    // r2 wins alpha and reads what r1 kept before it serves.
    // (Another seed than r1's: not the same handles.)
    let mut r2 = replica("r22");
    r2.coord_bucket = Some(bucket.clone());
    sled_claimed(&mut r2, "alpha", 5);
    let bob = handle_of(&mut r2, 4, "bob");
    let taken = tool(
        &mut r2,
        5,
        "claim",
        json!({"project":"alpha","resource":"story:1","agent":bob}),
    );
    assert_eq!(taken["acquired"], false, "ann still holds it: {taken}");
    assert!(
        taken["holder"].as_str().unwrap().starts_with("agent-"),
        "{taken}"
    );
    let again = tool(
        &mut r2,
        6,
        "claim",
        json!({"project":"alpha","resource":"story:1","agent":ann,"ttl_s":60}),
    );
    assert_eq!(again["fence"], lease["fence"], "the same lease: {again}");
    let got = tool(
        &mut r2,
        7,
        "board_get",
        json!({"project":"alpha","key":"plan","agent":bob}),
    );
    assert_eq!(got["value"], "v1", "{got}");
    // r2 changes the board; when alpha comes back to r1, r1 serves r2's state, not its own
    // stale one.
    tool(
        &mut r2,
        8,
        "board_set",
        json!({"project":"alpha","key":"plan","value":"v2","agent":bob}),
    );
    owned_by(&mut r1, "alpha", "r22", 5);
    owned_by(&mut r1, "alpha", "r22", 6);
    let r1_again = sled_claimed(&mut r1, "alpha", 7);
    let _ = r1_again;
    let got = tool(
        &mut r1,
        9,
        "board_get",
        json!({"project":"alpha","key":"plan","agent":ann}),
    );
    assert_eq!(got["value"], "v2", "{got}");
}

/// `project` was claimed by `owner` at `revision` in a handover: its sled moved there when
/// the replica holding it asked it to.
fn handed_to(h: &mut Harness, project: &str, owner: &str, revision: u64) {
    event(
        h,
        ClusterEvent::Entry {
            project: project.into(),
            revision,
            state: EntryState::Claimed(ClaimValue {
                owner: owner.into(),
                epoch: None,
                handover: true,
            }),
        },
    );
}

#[test]
fn a_stopping_replica_hands_its_projects_over_make_before_break() {
    let mut h = replica("r1");
    let u = sled_claimed(&mut h, "beta", 5);
    h.take_frames(u);
    // A call runs on beta's uplink when the replica is asked to stop.
    let running = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    let sent = h.take_frames(u);
    assert_eq!(sent.len(), 1, "{sent:?}");
    h.handle(Input::Handover);
    let frames = h.take_frames(u);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0]["uplink"], "move", "{frames:?}");
    assert!(h.gw.handing_over(h.now));
    // No new uplink is taken meanwhile: the sled dials again and lands elsewhere.
    let other = h.open_uplink();
    assert_eq!(
        h.closed.get(&other).map(|(c, _)| *c),
        Some(crate::uplink::CloseCode::GoingAway.code())
    );
    // A call that comes now waits for the next holder: nothing goes on the old uplink.
    let waiting = h.call(None, json!(2), "echo", json!({"project":"beta"}));
    assert!(h.take_frames(u).is_empty());
    assert!(!h.replies.contains_key(&waiting));
    assert!(relays(&mut h).is_empty());
    // beta's sled is claimed by r2, in a handover: the waiting call goes there, and the old
    // uplink stays open for the call running on it.
    handed_to(&mut h, "beta", "r2", 6);
    assert_eq!(relays(&mut h), vec![(waiting, "r2".to_owned())]);
    assert!(
        !h.closed.contains_key(&u),
        "the old uplink finishes its call"
    );
    assert!(!h.gw.handing_over(h.now), "beta has its next holder");
    assert_eq!(h.gw.metrics().cluster.unwrap().claims_lost, 0);
    h.sled_answers_all_frames(u, sent);
    assert!(h.reply_json(running).unwrap()["result"].is_object());
    assert_eq!(
        h.closed.get(&u).map(|(c, _)| *c),
        Some(crate::uplink::CloseCode::Superseded.code()),
        "closed once its calls are answered"
    );
}

#[test]
fn a_handover_nobody_takes_serves_its_held_calls_on_the_old_uplink_after_the_grace() {
    let mut h = replica("r1");
    let u = sled_claimed(&mut h, "beta", 5);
    h.take_frames(u);
    h.handle(Input::Handover);
    assert_eq!(h.take_frames(u)[0]["uplink"], "move");
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    assert!(h.take_frames(u).is_empty(), "held");
    h.advance(Duration::from_secs(4));
    assert!(!h.gw.handing_over(h.now), "the grace is over");
    assert_eq!(h.sled_answers_all(u, "beta"), 1);
    assert!(h.reply_json(t).unwrap()["result"].is_object());
}

#[test]
fn relays_to_a_replica_handing_its_project_over_wait_for_its_answer() {
    let mut h = replica("r1");
    owned_by(&mut h, "beta", "r2", 3);
    let t = h.call(None, json!(1), "echo", json!({"project":"beta"}));
    assert_eq!(relays(&mut h), vec![(t, "r2".to_owned())]);
    // r2 is stopping; beta's sled moved to r3, and r2 still answers what runs on its old
    // uplink.
    handed_to(&mut h, "beta", "r3", 4);
    assert!(!h.replies.contains_key(&t), "not failed: r2 answers it");
    relay_answers(
        &mut h,
        t,
        json!({"jsonrpc":"2.0","id":1,"result":{"content":[]}}),
    );
    assert!(h.reply_json(t).unwrap()["result"].is_object());
}

#[test]
fn a_hello_that_answers_a_move_claims_as_a_handover() {
    let mut h = replica("r1");
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta","moving":true}),
    );
    let claim = take_actions(&mut h)
        .into_iter()
        .find_map(|a| match a {
            ClusterAction::Claim { project, value, .. } if project == "beta" => Some(value),
            _ => None,
        })
        .expect("a claim");
    assert!(claim.handover);
    assert!(claim.to_json().contains(r#""handover":true"#));
}
