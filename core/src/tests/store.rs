//! A single gateway that keeps its sessions in a store (`Config::store_sessions`, a state
//! directory): each change of a session is written before it is confirmed, a session made
//! before a restart is read back when named, and a plain `tools/call` writes nothing.

use serde_json::json;

use super::Harness;
use crate::cluster::{ClusterAction, ClusterEvent, EngineDown, SessionRecord};
use crate::{Config, HttpMethod, Input};

fn single(store_sessions: bool) -> Harness {
    let config = Config {
        store_sessions,
        ..Config::default()
    };
    Harness::with_config(&["alpha", "beta"], Some("alpha"), config, [3; 32])
}

fn stored(h: &mut Harness, session: &str) {
    h.handle(Input::Cluster(ClusterEvent::SessionStored {
        session: session.into(),
        written: true,
    }));
}

fn writes(h: &mut Harness) -> Vec<(String, Option<SessionRecord>)> {
    std::mem::take(&mut h.cluster)
        .into_iter()
        .map(|a| match a {
            ClusterAction::StoreSession { session, record } => (session, record),
            other => panic!("a single gateway asks its store only for sessions: {other:?}"),
        })
        .collect()
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"t","version":"0"}}}"#;

/// `initialize`, answered once its write is done; the session's id.
fn initialize(h: &mut Harness) -> String {
    let t = h.send(HttpMethod::Post, None, INITIALIZE);
    assert!(
        !h.replies.contains_key(&t),
        "not before the session is stored"
    );
    let written = writes(h);
    let [(session, Some(record))] = written.as_slice() else {
        panic!("one write of the new session: {written:?}");
    };
    assert_eq!(record.default_project.as_deref(), Some("alpha"));
    assert_eq!(record.client_capabilities, json!({"sampling":{}}));
    let session = session.clone();
    stored(h, &session);
    let r = h.replies.remove(&t).expect("answered once stored");
    assert!(r
        .headers
        .iter()
        .any(|(n, v)| *n == "Mcp-Session-Id" && *v == session));
    session
}

#[test]
fn a_session_is_written_when_it_changes_and_confirmed_after() {
    let mut h = single(true);
    let s = initialize(&mut h);
    let t = h.call(
        Some(&s),
        json!(1),
        "switch_project",
        json!({"project":"beta"}),
    );
    assert!(!h.replies.contains_key(&t), "a switch waits for its write");
    let w = writes(&mut h);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(
        w[0].1.as_ref().and_then(|r| r.default_project.as_deref()),
        Some("beta")
    );
    stored(&mut h, &s);
    assert!(h.reply_json(t).is_some());
    // A switch to where it is already: nothing changes, nothing is written.
    let t = h.call(
        Some(&s),
        json!(2),
        "switch_project",
        json!({"project":"beta"}),
    );
    assert!(h.reply_json(t).is_some());
    assert_eq!(writes(&mut h), []);
    let t = h.send(HttpMethod::Delete, Some(&s), "");
    assert_eq!(h.replies[&t].status, 204);
    assert_eq!(writes(&mut h), [(s, None)]);
}

#[test]
fn a_session_made_before_a_restart_is_read_back_when_named() {
    let mut h = single(true);
    let s = initialize(&mut h);
    h.call(
        Some(&s),
        json!(1),
        "switch_project",
        json!({"project":"beta"}),
    );
    let record = writes(&mut h).pop().and_then(|(_, r)| r).expect("written");
    stored(&mut h, &s);

    // Another process, the same store.
    let mut h = single(true);
    let body = Harness::call_body(json!(2), "list_projects", json!({}));
    let t1 = h.send(HttpMethod::Post, Some(&s), &body);
    let t2 = h.send(HttpMethod::Post, Some(&s), &body);
    assert!(h.replies.is_empty(), "both wait for the read");
    assert_eq!(
        std::mem::take(&mut h.cluster),
        [ClusterAction::LoadSession { session: s.clone() }],
        "read once"
    );
    h.handle(Input::Cluster(ClusterEvent::SessionLoaded {
        session: s.clone(),
        record: Ok(Some(record)),
        under_previous_secret: false,
    }));
    for t in [t1, t2] {
        let r = h.reply_json(t).expect("answered");
        assert_eq!(r["result"]["structuredContent"]["active"], "beta", "{r}");
    }
    // An id the store never had is unknown; a store that cannot be read is not a 404.
    let t = h.send(HttpMethod::Post, Some("s-never"), &body);
    h.handle(Input::Cluster(ClusterEvent::SessionLoaded {
        session: "s-never".into(),
        record: Ok(None),
        under_previous_secret: false,
    }));
    assert_eq!(h.replies[&t].status, 404);
    let t = h.send(HttpMethod::Post, Some("s-unreadable"), &body);
    h.handle(Input::Cluster(ClusterEvent::SessionLoaded {
        session: "s-unreadable".into(),
        record: Err(EngineDown),
        under_previous_secret: false,
    }));
    assert_eq!(h.replies[&t].status, 503);
}

/// The hot path stays off the disk: calls to a sled, in a session and without one, write
/// nothing (the session's refresh, a third of the idle TTL after its last write, aside).
#[test]
fn a_plain_tools_call_writes_nothing() {
    let mut h = single(true);
    let u = h.connect_sled("alpha");
    let s = initialize(&mut h);
    for i in 0..50 {
        let t = h.call(Some(&s), json!(i), "show", json!({"story_id":"alpha-1"}));
        h.sled_answers_all(u, "alpha");
        assert!(h.reply_json(t).is_some(), "call {i} answered");
        let t = h.call(
            None,
            json!(i),
            "show",
            json!({"story_id":"alpha-1","project":"alpha"}),
        );
        h.sled_answers_all(u, "alpha");
        assert!(h.reply_json(t).is_some(), "sessionless call {i} answered");
    }
    assert_eq!(writes(&mut h), [], "no store write for 100 tools/call");
    // Used a third of the idle TTL after its last write, the session is written again, so
    // that the store's max_age ends only idle sessions.
    h.advance(h.gw.config().session_idle_ttl / 3);
    let t = h.call(Some(&s), json!(99), "show", json!({"story_id":"alpha-1"}));
    h.sled_answers_all(u, "alpha");
    assert_eq!(writes(&mut h).len(), 1, "the refresh");
    stored(&mut h, &s);
    assert!(h.reply_json(t).is_some());
}

#[test]
fn without_a_store_nothing_is_asked_and_an_unknown_session_is_404_at_once() {
    let mut h = single(false);
    let s = h.initialize();
    h.call(
        Some(&s),
        json!(1),
        "switch_project",
        json!({"project":"beta"}),
    );
    let t = h.send(
        HttpMethod::Post,
        Some("s-never"),
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    );
    assert_eq!(h.replies[&t].status, 404);
    assert_eq!(h.cluster, []);
    // Store answers for a gateway without a store are ignored.
    h.handle(Input::Cluster(ClusterEvent::SessionStored {
        session: s,
        written: true,
    }));
}

/// The coordination batches the gateway asked its store to write: (batch, keys written,
/// keys deleted).
fn coord_batches(h: &mut Harness) -> Vec<(u64, Vec<String>, Vec<String>)> {
    std::mem::take(&mut h.cluster)
        .into_iter()
        .map(|a| match a {
            ClusterAction::StoreCoord { batch, changes } => {
                let (put, deleted): (Vec<_>, Vec<_>) =
                    changes.into_iter().partition(|c| c.value.is_some());
                (
                    batch,
                    put.into_iter().map(|c| c.key).collect(),
                    deleted.into_iter().map(|c| c.key).collect(),
                )
            }
            other => panic!("a coordination batch, not {other:?}"),
        })
        .collect()
}

#[test]
fn a_coordination_write_is_answered_once_durable_and_refused_when_it_is_not() {
    let mut h = single(true);
    let s = initialize(&mut h);
    let t = h.call(
        Some(&s),
        json!(1),
        "claim",
        json!({"project":"beta","resource":"story:beta-1"}),
    );
    assert!(!h.replies.contains_key(&t), "a claim waits for its write");
    let batches = coord_batches(&mut h);
    let [(b1, put, deleted)] = batches.as_slice() else {
        panic!("one batch: {batches:?}");
    };
    // The agent's name, the project's counters, the agent as a member, and the lease.
    assert_eq!(put.len(), 4, "{put:?}");
    assert!(deleted.is_empty());
    h.handle(Input::Cluster(ClusterEvent::CoordStored {
        batch: *b1,
        failed: Vec::new(),
    }));
    let r = h.reply_json(t).expect("answered once durable");
    assert_eq!(r["result"]["structuredContent"]["acquired"], true, "{r}");

    // A read with nothing in flight changes nothing and is answered at once.
    let t = h.call(Some(&s), json!(2), "claims", json!({"project":"beta"}));
    assert!(h.reply_json(t).is_some());
    assert!(coord_batches(&mut h).is_empty(), "a read writes nothing");

    // A write the store cannot keep: typed, retryable, and written again with the next.
    let t = h.call(
        Some(&s),
        json!(3),
        "board_set",
        json!({"project":"beta","key":"plan","value":1}),
    );
    let batches = coord_batches(&mut h);
    let [(b2, put, _)] = batches.as_slice() else {
        panic!("one batch: {batches:?}");
    };
    h.handle(Input::Cluster(ClusterEvent::CoordStored {
        batch: *b2,
        failed: put.clone(),
    }));
    let r = h.reply_json(t).expect("answered");
    assert_eq!(r["error"]["data"]["kind"], "state_not_durable", "{r}");
    assert_eq!(r["error"]["data"]["outcome"], "applied", "{r}");
    let failed = put.clone();
    h.call(
        Some(&s),
        json!(4),
        "board_set",
        json!({"project":"beta","key":"other","value":2}),
    );
    let batches = coord_batches(&mut h);
    let [(_, put, _)] = batches.as_slice() else {
        panic!("one batch: {batches:?}");
    };
    for key in &failed {
        assert!(put.contains(key), "{key} written again: {put:?}");
    }
}

#[test]
fn with_pins_in_the_store_a_first_use_pin_is_created_there_before_its_sled_is_welcomed() {
    use crate::cluster::PinOutcome;
    use crate::identity::encode_key;
    let config = Config {
        store_sessions: true,
        store_pins: true,
        pin_save_delay: std::time::Duration::ZERO,
        ..Config::default()
    };
    let mut h = Harness::with_config(&["alpha", "beta"], Some("alpha"), config, [3; 32]);
    let k = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let (u, frames) = super::cluster::hello_with_key(&mut h, "alpha", &k);
    assert!(
        frames.is_empty(),
        "no welcome before the pin is kept: {frames:?}"
    );
    let actions = std::mem::take(&mut h.cluster);
    let [ClusterAction::CreatePin { project, pin }] = actions.as_slice() else {
        panic!("{actions:?}");
    };
    assert_eq!(project, "alpha");
    assert_eq!(pin.key, encode_key(&k.verifying_key()));
    h.handle(Input::Cluster(ClusterEvent::PinCreated {
        project: "alpha".into(),
        outcome: PinOutcome::Created,
    }));
    let frames = h.take_frames(u);
    assert_eq!(
        frames.first().map(|f| &f["uplink"]),
        Some(&json!("welcome")),
        "{frames:?} {:?}",
        h.closed
    );
    assert_eq!(h.gw.pins().get("alpha"), Some(pin));
    assert!(h.saved_pins.is_empty(), "no pin file is written");
    // A store that cannot take the pin sends the sled away to try again; nothing is pinned.
    let (u, _) = super::cluster::hello_with_key(&mut h, "beta", &k);
    std::mem::take(&mut h.cluster);
    h.handle(Input::Cluster(ClusterEvent::PinCreated {
        project: "beta".into(),
        outcome: PinOutcome::Unavailable,
    }));
    assert_eq!(
        h.closed[&u].0,
        crate::uplink::CloseCode::HelloTimeout.code()
    );
    assert!(h.closed[&u].1.contains("state store"), "{:?}", h.closed[&u]);
    assert_eq!(h.gw.pins().get("beta"), None);
}

#[test]
fn without_pins_in_the_store_a_first_use_pin_is_saved_to_the_pin_file() {
    let config = Config {
        store_sessions: true,
        pin_save_delay: std::time::Duration::ZERO,
        ..Config::default()
    };
    let mut h = Harness::with_config(&["alpha"], Some("alpha"), config, [3; 32]);
    let k = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let (_, frames) = super::cluster::hello_with_key(&mut h, "alpha", &k);
    assert_eq!(frames[0]["uplink"], "welcome", "{frames:?}");
    assert!(h.cluster.is_empty(), "{:?}", h.cluster);
    assert_eq!(h.saved_pins.len(), 1);
}
