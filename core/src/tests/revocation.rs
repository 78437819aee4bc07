//! Security review finding 14: a reload that takes a project from a principal ends what that
//! principal set up on it before: resource subscriptions, `subscriptions/listen` streams,
//! parked `wait`s and coordination notices, and list changes to sessions whose default it is.
//!
//! Each scenario returns what reached alice about beta after the reload that took beta from
//! her (it must be nothing), and checks on the way that bob, whose rights stay, still hears;
//! with [`crate::PlantedBug::RightsCheckedOnlyAtSetUp`] each must find a leak.

use serde_json::{json, Value};

use super::modern::{answer, modern};
use super::Harness;
use crate::{Config, Gateway, HttpMethod, HttpRequest, HttpToken, Input, Registry, UplinkId};

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789abc";
const CAROL: &str = "carol-token-0123456789ab";

/// alice and bob write to alpha and beta, carol to beta; after the reload alice has alpha only.
fn file(alice: &str) -> Registry {
    Registry::parse(
        "projects.toml",
        &format!(
            "default = \"alpha\"\n\
             client_tokens = [{{ name = \"alice\", token = \"{ALICE}\" }}, {{ name = \"bob\", token = \"{BOB}\" }}, {{ name = \"carol\", token = \"{CAROL}\" }}]\n\
             [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n\
             [[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9102\"\n\
             [[access]]\ntoken = \"alice\"\nprojects = {alice}\nright = \"write\"\n\
             [[access]]\ntoken = \"bob\"\nprojects = [\"alpha\", \"beta\"]\nright = \"write\"\n\
             [[access]]\ntoken = \"carol\"\nprojects = [\"beta\"]\nright = \"write\"\n"
        ),
    )
    .unwrap()
    .allowing_unauthenticated_uplinks()
}

fn harness(config: Config) -> Harness {
    let mut h = Harness::new();
    h.gw = Gateway::new(file("[\"alpha\", \"beta\"]"), config, [9; 32]);
    h
}

/// The reload that takes beta from alice.
fn revoke(h: &mut Harness) {
    h.handle(Input::Reload {
        registry: file("[\"alpha\"]"),
    });
}

fn post(h: &mut Harness, bearer: &str, session: Option<&str>, body: Value) -> HttpToken {
    h.request(HttpRequest {
        method: HttpMethod::Post,
        session: session.map(str::to_owned),
        authorization: Some(format!("Bearer {bearer}")),
        content_type: Some("application/json".into()),
        accept: Some("application/json, text/event-stream".into()),
        body: body.to_string().into_bytes(),
        ..HttpRequest::default()
    })
}

fn rpc(h: &mut Harness, bearer: &str, session: &str, method: &str, params: Value) -> Value {
    let t = post(
        h,
        bearer,
        Some(session),
        json!({"jsonrpc":"2.0","id":1,"method":method,"params":params}),
    );
    h.reply_json(t).expect("an immediate answer")
}

fn tool(h: &mut Harness, bearer: &str, session: &str, name: &str, arguments: Value) -> Value {
    rpc(
        h,
        bearer,
        session,
        "tools/call",
        json!({"name":name,"arguments":arguments}),
    )
}

/// A session of `bearer` with its GET stream open.
fn session(h: &mut Harness, bearer: &str) -> (String, HttpToken) {
    let t = post(
        h,
        bearer,
        None,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
    );
    let r = h.replies.remove(&t).unwrap();
    let id = r
        .headers
        .iter()
        .find(|(n, _)| *n == "Mcp-Session-Id")
        .unwrap()
        .1
        .clone();
    let stream = h.request(HttpRequest {
        method: HttpMethod::Get,
        session: Some(id.clone()),
        authorization: Some(format!("Bearer {bearer}")),
        accept: Some("text/event-stream".into()),
        ..HttpRequest::default()
    });
    assert!(h.streams.contains_key(&stream), "the GET stream opened");
    (id, stream)
}

/// The events on `stream` since the last look.
fn events(h: &mut Harness, stream: HttpToken) -> Vec<Value> {
    h.streams
        .get_mut(&stream)
        .map(|e| std::mem::take(e).into_iter().map(|(_, v)| v).collect())
        .unwrap_or_default()
}

/// The methods of `events` that are about beta's sled or coordination.
fn methods(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e["method"].as_str().map(str::to_owned))
        .collect()
}

const UPDATED: &str = "notifications/resources/updated";

fn updated(h: &mut Harness, beta: UplinkId) {
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":UPDATED,"params":{"uri":"story://beta/beta-1"}}),
    );
}

/// Both subscribe to a story of beta in their sessions; after the reload, an update reaches
/// bob only.
fn subscription_leaks(config: Config) -> Vec<String> {
    let mut h = harness(config);
    let beta = h.connect_sled("beta");
    let (a, a_stream) = session(&mut h, ALICE);
    let (b, b_stream) = session(&mut h, BOB);
    for (bearer, s) in [(ALICE, &a), (BOB, &b)] {
        let sub = json!({"uri":"story://beta/beta-1","_meta":{"io.mcp-gateway/project":"beta"}});
        let t = post(
            &mut h,
            bearer,
            Some(s),
            json!({"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":sub}),
        );
        let f = h.take_frames(beta).pop().expect("forwarded");
        h.sled_says(beta, json!({"jsonrpc":"2.0","id":f["id"],"result":{}}));
        assert!(h.reply_json(t).unwrap()["result"].is_object());
    }
    updated(&mut h, beta);
    assert_eq!(methods(&events(&mut h, a_stream)), [UPDATED], "before");
    assert_eq!(methods(&events(&mut h, b_stream)), [UPDATED]);
    revoke(&mut h);
    updated(&mut h, beta);
    assert_eq!(methods(&events(&mut h, b_stream)), [UPDATED], "bob still");
    methods(&events(&mut h, a_stream))
}

#[test]
fn a_reload_ends_the_resource_subscriptions_of_whoever_lost_the_project() {
    assert_eq!(subscription_leaks(Config::default()), Vec::<String>::new());
}

/// Both listen (stateless) to beta's resource and list changes; after the reload alice's
/// stream is ended with a result, bob's goes on.
fn listen_leaks(config: Config) -> Vec<String> {
    let mut h = harness(config);
    let beta = h.connect_sled("beta");
    let listen = |h: &mut Harness, bearer: &'static str| {
        let t = modern(
            h,
            7,
            "subscriptions/listen",
            json!({"notifications":{"resourcesListChanged":true,"resourceSubscriptions":["story://beta/beta-1"]},
                   "_meta":{"io.mcp-gateway/project":"beta"}}),
            &|r| r.authorization = Some(format!("Bearer {bearer}")),
        );
        assert!(
            h.streams.contains_key(&t),
            "a stream: {:?}",
            h.replies.get(&t)
        );
        t
    };
    let a = listen(&mut h, ALICE);
    let b = listen(&mut h, BOB);
    let subscribed = h.take_frames(beta);
    assert_eq!(
        subscribed
            .iter()
            .filter(|f| f["method"] == "resources/subscribe")
            .count(),
        1,
        "the gateway subscribes once: {subscribed:?}"
    );
    events(&mut h, a);
    events(&mut h, b);
    revoke(&mut h);
    let ended = events(&mut h, a);
    if !ended.is_empty() {
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert_eq!(ended[0]["result"]["resultType"], "complete", "{ended:?}");
        assert!(h.streams_closed.contains(&a), "alice's stream closed");
    }
    assert!(
        !h.take_frames(beta)
            .iter()
            .any(|f| f["method"] == "resources/unsubscribe"),
        "bob still wants the URI: no unsubscribe"
    );
    updated(&mut h, beta);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/resources/list_changed"}),
    );
    assert_eq!(
        methods(&events(&mut h, b)),
        [UPDATED, "notifications/resources/list_changed"],
        "bob still"
    );
    methods(&events(&mut h, a))
}

#[test]
fn a_reload_ends_the_listen_streams_of_whoever_lost_the_project() {
    assert_eq!(listen_leaks(Config::default()), Vec::<String>::new());
}

const NOTICE: &str = "notifications/io.mcp-gateway/coordination";

/// alice and bob check in at beta in their sessions; alice also waits there in a stateless
/// request with a handle. After the reload her wait ends at once, saying why, and carol's
/// message to beta's channel sends her session no notice; bob's session hears.
fn coordination_leaks(config: Config) -> Vec<String> {
    let mut h = harness(config);
    h.connect_sled("beta");
    let (a, a_stream) = session(&mut h, ALICE);
    let (b, b_stream) = session(&mut h, BOB);
    for (bearer, s) in [(ALICE, &a), (BOB, &b)] {
        let r = tool(&mut h, bearer, s, "checkin", json!({"project":"beta"}));
        assert!(r["result"].is_object(), "{r}");
    }
    // Alice, without a session, waits in beta as the agent of a handle.
    let r = post(
        &mut h,
        ALICE,
        None,
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"checkin","arguments":{"project":"beta"}}}),
    );
    let r = h.reply_json(r).unwrap();
    let handle = r["result"]["structuredContent"]["handle"]
        .as_str()
        .unwrap_or_else(|| panic!("a handle: {r}"))
        .to_owned();
    let wait = post(
        &mut h,
        ALICE,
        None,
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"wait","arguments":{"projects":["beta"],"agent":handle,"timeout_s":20}}}),
    );
    assert!(
        !h.replies.contains_key(&wait),
        "parked: {:?}",
        h.replies.get(&wait)
    );
    events(&mut h, a_stream);
    events(&mut h, b_stream);
    revoke(&mut h);
    let mut leaks = Vec::new();
    match h.reply_json(wait) {
        Some(r) => {
            let s = &r["result"]["structuredContent"];
            assert_eq!(
                (s["woke"].as_bool(), s["ended"].is_string()),
                (Some(false), true),
                "{r}"
            );
        }
        None => leaks.push("a parked wait".to_owned()),
    }
    let (c, _) = session(&mut h, CAROL);
    let r = tool(
        &mut h,
        CAROL,
        &c,
        "send",
        json!({"project":"beta","body":"story beta-1 moves to review"}),
    );
    assert_eq!(r["result"]["structuredContent"]["sent"], true, "{r}");
    assert_eq!(methods(&events(&mut h, b_stream)), [NOTICE], "bob still");
    // Carol's message would have woken alice's wait.
    if h.reply_json(wait).is_some() {
        leaks.push("a woken wait".to_owned());
    }
    leaks.extend(methods(&events(&mut h, a_stream)));
    leaks
}

#[test]
fn a_reload_ends_the_parked_waits_and_notices_of_whoever_lost_the_project() {
    assert_eq!(coordination_leaks(Config::default()), Vec::<String>::new());
}

/// Both sessions make beta their default; after the reload, beta's list changes reach bob's
/// session only.
fn list_changed_leaks(config: Config) -> Vec<String> {
    let mut h = harness(config);
    let beta = h.connect_sled("beta");
    let (a, a_stream) = session(&mut h, ALICE);
    let (b, b_stream) = session(&mut h, BOB);
    for (bearer, s) in [(ALICE, &a), (BOB, &b)] {
        let r = tool(
            &mut h,
            bearer,
            s,
            "switch_project",
            json!({"project":"beta"}),
        );
        assert_eq!(r["result"]["structuredContent"]["project"], "beta", "{r}");
    }
    events(&mut h, a_stream);
    events(&mut h, b_stream);
    revoke(&mut h);
    let changes = [
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
    ];
    for method in changes {
        h.sled_says(beta, json!({"jsonrpc":"2.0","method":method}));
    }
    // And its tools change: the gateway lists them again.
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
    );
    let list = h
        .take_frames(beta)
        .pop()
        .expect("the gateway lists beta's tools");
    assert_eq!(list["method"], "tools/list");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":list["id"],"result":{"tools":[{"name":"renamed","inputSchema":{"type":"object"}}]}}),
    );
    assert_eq!(
        methods(&events(&mut h, b_stream)),
        [changes[0], changes[1], "notifications/tools/list_changed"],
        "bob still"
    );
    methods(&events(&mut h, a_stream))
}

#[test]
fn a_reload_ends_the_list_changes_to_sessions_whose_default_was_taken_away() {
    assert_eq!(list_changed_leaks(Config::default()), Vec::<String>::new());
}

/// The planted bug (rights decided only when a delivery is set up) leaks in every scenario:
/// each check above can fail.
#[cfg(feature = "planted-bugs")]
#[test]
fn planted_rights_checked_only_at_set_up_is_caught_by_each_scenario() {
    let planted = || Config {
        planted: Some(crate::PlantedBug::RightsCheckedOnlyAtSetUp),
        ..Config::default()
    };
    assert_eq!(subscription_leaks(planted()), [UPDATED]);
    assert_eq!(
        listen_leaks(planted()),
        [UPDATED, "notifications/resources/list_changed"]
    );
    assert!(
        coordination_leaks(planted()).contains(&"a parked wait".to_owned()),
        "{:?}",
        coordination_leaks(planted())
    );
    assert!(coordination_leaks(planted()).contains(&NOTICE.to_owned()));
    assert_eq!(list_changed_leaks(planted()).len(), 3);
}

/// The reload that takes beta from alice takes nothing from answer shapes: a listen naming
/// beta again is refused as for a project that does not exist.
#[test]
fn after_the_reload_listening_again_is_refused_as_for_an_unknown_project() {
    let mut h = harness(Config::default());
    h.connect_sled("beta");
    revoke(&mut h);
    let t = modern(
        &mut h,
        8,
        "subscriptions/listen",
        json!({"notifications":{"resourcesListChanged":true},"_meta":{"io.mcp-gateway/project":"beta"}}),
        &|r| r.authorization = Some(format!("Bearer {ALICE}")),
    );
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["error"]["data"]["kind"], "unknown_project", "{r}");
}
