//! Limits: sessions (idle ones evicted first), calls in flight per session and per sled, a
//! refusal with a retry hint past each, and a stuck sled that delays no one else. Also the
//! counts behind `/metrics`.

use std::time::Duration;

use serde_json::{json, Value};

use super::Harness;
use crate::{HttpMethod, Input, Outcome, LATENCY_BUCKETS_SECONDS};

fn error_data(v: &Value) -> &Value {
    &v["error"]["data"]
}

#[test]
fn past_max_calls_per_sled_a_call_is_refused_at_once_with_a_retry_hint() {
    let mut h = Harness::new();
    h.gw.config_mut().max_calls_per_sled = 3;
    let alpha = h.connect_sled("alpha");
    let pending: Vec<_> = (0..3)
        .map(|i| h.call(None, json!(i), "show", json!({"story_id": "1"})))
        .collect();
    assert_eq!(h.take_frames(alpha).len(), 3);
    assert!(pending.iter().all(|t| !h.replies.contains_key(t)));

    let t = h.call(None, json!("over"), "show", json!({"story_id": "1"}));
    let r = h.reply_json(t).expect("refused at once, not queued");
    assert_eq!(r["id"], "over");
    assert_eq!(r["error"]["code"], -32000);
    assert_eq!(
        *error_data(&r),
        json!({"kind":"too_many_calls","project":"alpha","sled":"alpha","limit":"max_calls_per_sled","max":3,"retry_after_ms":1000,"outcome":"not_sent"})
    );
    assert!(h.take_frames(alpha).is_empty(), "nothing sent for it");
    assert_eq!(h.gw.stats().calls_refused, 1);
    assert_eq!(h.gw.stats().pending_calls, 3);

    let again = h.call(None, json!("again"), "show", json!({"story_id": "1"}));
    assert!(h.reply_json(again).is_some(), "still full");
    // Answers make room. Answer the three pending calls (the gateway's ids 1, 2, 3: 0 was the tools/list).
    for id in 1..=3 {
        h.sled_says(
            alpha,
            json!({"jsonrpc":"2.0","id":id,"result":{"content":[]}}),
        );
    }
    for t in pending {
        assert!(h.reply_json(t).unwrap()["result"].is_object());
    }
    let t = h.call(None, json!("room"), "show", json!({"story_id": "1"}));
    assert!(!h.replies.contains_key(&t), "forwarded");
    assert_eq!(h.take_frames(alpha).len(), 1);
}

#[test]
fn past_max_calls_per_session_only_that_session_is_refused() {
    let mut h = Harness::new();
    h.gw.config_mut().max_calls_per_session = 2;
    let alpha = h.connect_sled("alpha");
    let a = h.initialize();
    let b = h.initialize();
    let a1 = h.call(Some(&a), json!(1), "show", json!({"story_id": "1"}));
    let a2 = h.call(Some(&a), json!(2), "show", json!({"story_id": "1"}));
    let a3 = h.call(Some(&a), json!(3), "show", json!({"story_id": "1"}));
    let r = h.reply_json(a3).expect("refused at once");
    assert_eq!(error_data(&r)["kind"], "too_many_calls");
    assert_eq!(error_data(&r)["limit"], "max_calls_per_session");
    assert_eq!(error_data(&r)["max"], 2);
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("this session already has 2 calls pending"));
    // Another session is not affected.
    let b1 = h.call(Some(&b), json!(1), "show", json!({"story_id": "1"}));
    assert!(!h.replies.contains_key(&b1));
    assert_eq!(h.take_frames(alpha).len(), 3);

    // A call that ends (the client went away) frees its slot; so does one answered.
    h.handle(Input::HttpAborted { token: a1 });
    let a4 = h.call(Some(&a), json!(4), "show", json!({"story_id": "1"}));
    assert!(!h.replies.contains_key(&a4), "forwarded after the abort");
    let a5 = h.call(Some(&a), json!(5), "show", json!({"story_id": "1"}));
    assert_eq!(
        error_data(&h.reply_json(a5).unwrap())["kind"],
        "too_many_calls"
    );
    assert_eq!(h.sled_answers_all(alpha, "alpha"), 1, "a4");
    // a2 is still pending (its frame was taken above); answer it by the gateway's id 2.
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","id":2,"result":{"content":[]}}),
    );
    assert!(h.reply_json(a2).unwrap()["result"].is_object());
    let a6 = h.call(Some(&a), json!(6), "show", json!({"story_id": "1"}));
    assert!(!h.replies.contains_key(&a6));
}

#[test]
fn a_stuck_sled_delays_no_call_to_another_sled() {
    let mut h = Harness::new();
    h.gw.config_mut().max_calls_per_sled = 4;
    // Stuck in its tools, not dead: its uplink is not cut by the heartbeat.
    h.gw.config_mut().heartbeat_timeout = Duration::from_secs(3600);
    let alpha = h.connect_sled("alpha");
    let beta = h.connect_sled("beta");
    let s = h.initialize();
    // alpha is stuck: it reads its calls and never answers. Fill it to its limit, from
    // sessionless callers so the session limit is not what stops them.
    let stuck: Vec<_> = (0..4)
        .map(|i| h.call(None, json!(i), "show", json!({"story_id": "1"})))
        .collect();
    assert_eq!(h.take_frames(alpha).len(), 4);
    for round in 0..50 {
        // beta's calls go out at once and come back as soon as beta answers.
        let t = h.call(
            Some(&s),
            json!(round),
            "show",
            json!({"story_id": "1", "project": "beta"}),
        );
        assert_eq!(h.sled_answers_all(beta, "beta"), 1);
        let r = h.reply_json(t).expect("answered without waiting for alpha");
        assert_eq!(r["result"]["structuredContent"]["project"], "beta");
        // More calls to alpha are refused at once rather than queued behind it.
        let t = h.call(Some(&s), json!("a"), "show", json!({"story_id": "1"}));
        assert_eq!(
            error_data(&h.reply_json(t).unwrap())["limit"],
            "max_calls_per_sled"
        );
        h.advance(Duration::from_millis(100));
    }
    assert!(h
        .take_frames(alpha)
        .iter()
        .all(|f| f["method"] != "tools/call"));
    assert!(stuck.iter().all(|t| !h.replies.contains_key(t)));
    // alpha's calls end at their own deadline, and only they do.
    h.advance(Duration::from_secs(60));
    for t in stuck {
        assert_eq!(
            error_data(&h.reply_json(t).unwrap())["kind"],
            "timeout",
            "the stuck calls time out"
        );
    }
    assert_eq!(h.gw.stats().pending_calls, 0);
}

#[test]
fn at_max_sessions_the_least_recently_used_idle_session_is_evicted() {
    let mut h = Harness::new();
    h.gw.config_mut().max_sessions = 3;
    let a = h.initialize();
    h.advance(Duration::from_secs(1));
    let b = h.initialize();
    h.advance(Duration::from_secs(1));
    let c = h.initialize();
    h.advance(Duration::from_secs(1));
    // a was used last, so b is now the least recently used.
    h.rpc(Some(&a), json!(1), "ping", json!({}));
    let d = h.initialize();
    assert_eq!(h.gw.stats().sessions, 3);
    assert_eq!(h.gw.stats().sessions_evicted, 1);
    let r = h.post(Some(&b), json!({"jsonrpc":"2.0","id":2,"method":"ping"}));
    assert_eq!(r.status, 404, "b was evicted");
    for s in [&a, &c, &d] {
        let r = h.post(Some(s), json!({"jsonrpc":"2.0","id":2,"method":"ping"}));
        assert_eq!(r.status, 200);
    }
}

#[test]
fn at_max_sessions_with_none_idle_initialize_gets_503_and_retry_after() {
    let mut h = Harness::new();
    h.gw.config_mut().max_sessions = 2;
    let alpha = h.connect_sled("alpha");
    let a = h.initialize();
    let b = h.initialize();
    // a has an open GET stream; b has a call in flight: neither is idle.
    let get = h.send(HttpMethod::Get, Some(&a), "");
    assert!(h.streams.contains_key(&get));
    let call = h.call(Some(&b), json!(1), "show", json!({"story_id": "1"}));
    let r = h.post(
        None,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{}}}),
    );
    assert_eq!(r.status, 503);
    assert_eq!(r.headers, vec![("Retry-After", "1".to_owned())]);
    let body: Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
    assert_eq!(body["error"]["data"]["kind"], "too_many_sessions");
    assert_eq!(h.gw.stats().sessions_refused, 1);
    // Once b's call ends, b is idle and makes room.
    assert_eq!(h.sled_answers_all(alpha, "alpha"), 1);
    assert!(h.reply_json(call).is_some());
    let c = h.initialize();
    assert_eq!(h.gw.stats().sessions_evicted, 1);
    let r = h.post(Some(&b), json!({"jsonrpc":"2.0","id":2,"method":"ping"}));
    assert_eq!(r.status, 404);
    let r = h.post(Some(&c), json!({"jsonrpc":"2.0","id":2,"method":"ping"}));
    assert_eq!(r.status, 200);
}

#[test]
fn metrics_count_calls_by_tool_project_and_outcome_with_latency() {
    let mut h = Harness::new();
    h.gw.config_mut().max_calls_per_sled = 2;
    let alpha = h.connect_sled("alpha");
    let beta = h.connect_sled("beta");
    let s = h.initialize();
    // ok after 30 ms
    let t = h.call(Some(&s), json!(1), "show", json!({"story_id": "1"}));
    h.advance(Duration::from_millis(30));
    h.sled_answers_all(alpha, "alpha");
    assert!(h.reply_json(t).is_some());
    // an error from the sled
    h.call(
        Some(&s),
        json!(2),
        "create_story",
        json!({"project":"beta"}),
    );
    let f = h.take_frames(beta);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f[0]["id"],"error":{"code":-32602,"message":"name"}}),
    );
    // a tool the sled does not list
    let t = h.call(Some(&s), json!(3), "nope", json!({}));
    // two pending on alpha, then one refused
    let t2 = h.call(Some(&s), json!(4), "show", json!({}));
    h.call(Some(&s), json!(5), "show", json!({}));
    assert!(h.reply_json(t).is_none() && h.reply_json(t2).is_none());
    // the sled goes away: both pending calls are lost
    h.handle(Input::UplinkClosed { uplink: alpha });

    let m = h.gw.metrics();
    let count = |tool: &str, project: &str, outcome: Outcome| {
        m.calls
            .iter()
            .find(|c| c.tool == tool && c.project == project && c.outcome == outcome)
            .map_or(0, |c| c.count)
    };
    assert_eq!(count("show", "alpha", Outcome::Ok), 1);
    assert_eq!(count("create_story", "beta", Outcome::Error), 1);
    assert_eq!(count("_unlisted", "alpha", Outcome::UplinkLost), 1);
    assert_eq!(count("show", "alpha", Outcome::UplinkLost), 1);
    assert_eq!(count("show", "alpha", Outcome::Refused), 1);
    assert_eq!(m.calls.len(), 5);
    let alpha_latency = &m.latency["alpha"];
    assert_eq!(alpha_latency.count, 1);
    assert!((alpha_latency.sum_seconds - 0.03).abs() < 1e-6);
    let le_50ms = LATENCY_BUCKETS_SECONDS
        .iter()
        .position(|b| *b == 0.05)
        .unwrap();
    assert_eq!(alpha_latency.buckets[le_50ms - 1], 0, "not ≤ 25 ms");
    assert_eq!(alpha_latency.buckets[le_50ms], 1, "≤ 50 ms");
    assert_eq!(m.latency["beta"].count, 1);
    assert_eq!(m.stats.calls_refused, 1);
    assert_eq!(m.stats.live_uplinks, 1);
    assert_eq!(m.stats.pending_calls, 0);
}

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789abc";

/// alice and bob, client tokens with every right, under `config`.
fn two_identities(config: crate::Config) -> Harness {
    let registry = crate::Registry::parse(
        "projects.toml",
        &format!(
            "default = \"alpha\"\n\
             client_tokens = [{{ name = \"alice\", token = \"{ALICE}\" }}, {{ name = \"bob\", token = \"{BOB}\" }}]\n\
             [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n\
             [[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9102\"\n"
        ),
    )
    .unwrap()
    .allowing_unauthenticated_uplinks();
    let mut h = Harness::new();
    h.gw = crate::Gateway::new(registry, config, [4; 32]);
    h
}

fn post_as(h: &mut Harness, bearer: &str, session: Option<&str>, body: Value) -> crate::HttpToken {
    h.request(crate::HttpRequest {
        method: HttpMethod::Post,
        session: session.map(str::to_owned),
        authorization: Some(format!("Bearer {bearer}")),
        content_type: Some("application/json".into()),
        accept: Some("application/json, text/event-stream".into()),
        body: body.to_string().into_bytes(),
        ..crate::HttpRequest::default()
    })
}

fn show(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"show","arguments":{"story_id":"1"}}})
}

/// Security review finding 15: alice's budget of 3 calls in flight counts her calls in a
/// session, without one and in the stateless era alike; past it any of hers is refused at
/// once, while bob's go out. `Err` says what went wrong.
fn identity_budget_check(config: crate::Config) -> Result<(), String> {
    let mut h = two_identities(crate::Config {
        max_calls_per_identity: 3,
        ..config
    });
    let alpha = h.connect_sled("alpha");
    let t = post_as(
        &mut h,
        ALICE,
        None,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
    );
    let r = h.replies.remove(&t).unwrap();
    let s = r
        .headers
        .iter()
        .find(|(n, _)| *n == "Mcp-Session-Id")
        .unwrap()
        .1
        .clone();
    let mine = [
        post_as(&mut h, ALICE, Some(&s), show(1)),
        post_as(&mut h, ALICE, None, show(2)),
        super::modern::modern(
            &mut h,
            3,
            "tools/call",
            json!({"name":"show","arguments":{"project":"alpha","story_id":"1"}}),
            &|r| r.authorization = Some(format!("Bearer {ALICE}")),
        ),
    ];
    if mine.iter().any(|t| h.replies.contains_key(t)) {
        return Err(format!(
            "alice's first three calls were answered at once: {:?}",
            h.replies
        ));
    }
    if h.take_frames(alpha).len() != 3 {
        return Err("alice's three calls were not all sent".into());
    }
    // A fourth of hers, of any kind, is refused; the stateless one too.
    let over = super::modern::modern(
        &mut h,
        4,
        "tools/call",
        json!({"name":"show","arguments":{"project":"alpha","story_id":"1"}}),
        &|r| r.authorization = Some(format!("Bearer {ALICE}")),
    );
    let Some(r) = h.reply_json(over) else {
        return Err("alice's fourth call was sent past her budget".into());
    };
    let expected = json!({"kind":"too_many_calls","project":"alpha","sled":"alpha","limit":"max_calls_per_identity","max":3,"retry_after_ms":1000,"outcome":"not_sent"});
    if r["error"]["data"] != expected {
        return Err(format!("refused otherwise: {r}"));
    }
    let over = post_as(&mut h, ALICE, None, show(5));
    if h.reply_json(over).is_none() {
        return Err("alice's fifth call (sessionless) was sent past her budget".into());
    }
    if !h.take_frames(alpha).is_empty() {
        return Err("something was sent for a refused call".into());
    }
    // Bob is not alice.
    let theirs = post_as(&mut h, BOB, None, show(6));
    if h.replies.contains_key(&theirs) || h.take_frames(alpha).len() != 1 {
        return Err("bob's call did not go out".into());
    }
    // An answer makes room for one more of hers.
    h.handle(Input::HttpAborted { token: mine[1] });
    let again = post_as(&mut h, ALICE, None, show(7));
    if h.replies.contains_key(&again) {
        return Err("alice's call after one ended was refused".into());
    }
    Ok(())
}

#[test]
fn an_identitys_budget_counts_its_calls_with_and_without_a_session_and_stateless() {
    identity_budget_check(crate::Config::default()).unwrap();
}

/// Without client authentication there is no identity to count by: the per-session and
/// per-sled limits hold, and `max_calls_per_identity` does not.
#[test]
fn anonymous_callers_have_no_identity_budget() {
    let mut h = Harness::new();
    h.gw.config_mut().max_calls_per_identity = 1;
    let alpha = h.connect_sled("alpha");
    let ts: Vec<_> = (0..3)
        .map(|i| h.call(None, json!(i), "show", json!({"story_id": "1"})))
        .collect();
    assert!(ts.iter().all(|t| !h.replies.contains_key(t)));
    assert_eq!(h.take_frames(alpha).len(), 3);
}

#[cfg(feature = "planted-bugs")]
#[test]
fn planted_budget_skips_sessionless_is_caught() {
    let planted = crate::Config {
        planted: Some(crate::PlantedBug::BudgetSkipsSessionless),
        ..crate::Config::default()
    };
    let caught = identity_budget_check(planted).unwrap_err();
    assert!(caught.contains("past her budget"), "{caught}");
    identity_budget_check(crate::Config::default()).unwrap();
}

/// A sled of `project` that lists `pipeline_status` and does not answer it.
fn pipeline_sled(h: &mut Harness, project: &str) -> crate::UplinkId {
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":project,"sled":project}),
    );
    let f = h.take_frames(u);
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":[{"name":"pipeline_status","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]}}),
    );
    u
}

/// Security review finding 15: `aggregate_pipeline_status` sends a call to every sled; an
/// identity may have `max_fanouts_per_identity` running, then is refused at once, and nothing
/// is sent for the refused one.
#[test]
fn an_identity_may_run_only_so_many_fan_outs_at_once() {
    let mut h = two_identities(crate::Config {
        max_fanouts_per_identity: 1,
        ..crate::Config::default()
    });
    let alpha = pipeline_sled(&mut h, "alpha");
    let beta = pipeline_sled(&mut h, "beta");
    let fanout = |id: u64| json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"aggregate_pipeline_status","arguments":{"timeout_ms":3000}}});
    let first = post_as(&mut h, ALICE, None, fanout(1));
    assert!(!h.replies.contains_key(&first), "waits for the sleds");
    assert_eq!(h.take_frames(alpha).len() + h.take_frames(beta).len(), 2);
    let second = post_as(&mut h, ALICE, None, fanout(2));
    let r = h.reply_json(second).expect("refused at once");
    assert_eq!(
        r["error"]["data"],
        json!({"kind":"too_many_calls","limit":"max_fanouts_per_identity","max":1,"retry_after_ms":1000,"outcome":"not_sent"}),
        "{r}"
    );
    assert!(h.take_frames(alpha).is_empty() && h.take_frames(beta).is_empty());
    // Bob's is his own.
    let bobs = post_as(&mut h, BOB, None, fanout(3));
    assert!(!h.replies.contains_key(&bobs));
    assert_eq!(h.take_frames(alpha).len() + h.take_frames(beta).len(), 2);
    // Once alice's first ends (its deadline), she may run another.
    h.advance(Duration::from_secs(4));
    assert!(h.reply_json(first).is_some());
    let third = post_as(&mut h, ALICE, None, fanout(4));
    assert!(
        !h.replies.contains_key(&third),
        "{:?}",
        h.replies.get(&third)
    );
}
