//! `[[access]]`: who may do what on which project, decided per request on its credentials.

use serde_json::{json, Value};

use super::Harness;
use crate::{Config, Gateway, HttpMethod, HttpRequest, HttpToken, Registry, UplinkId};

const READER: &str = "reader-token-0123456789";
const WRITER: &str = "writer-token-0123456789";
const OPS: &str = "ops-token-0123456789abc";

const FILE: &str = r#"
default = "alpha"
client_tokens = [
  { name = "reader", token = "reader-token-0123456789" },
  { name = "writer", token = "writer-token-0123456789" },
  { name = "ops", token = "ops-token-0123456789abc" },
  { name = "gammer", token = "gammer-token-0123456789" },
]

[[project]]
name = "alpha"
url = "http://127.0.0.1:9101"
trust_read_only_hints = true

[[project]]
name = "beta"
url = "http://127.0.0.1:9102"
forward_principal = true

[[project]]
name = "gamma"
url = "http://127.0.0.1:9103"

[[access]]
token = "reader"
projects = ["alpha"]
right = "read"

[[access]]
token = "writer"
projects = ["alpha", "beta"]
right = "write"

[[access]]
token = "gammer"
projects = ["gamma"]
right = "read"

[[access]]
token = "ops"
projects = ["*"]
right = "admin"
"#;

fn harness() -> Harness {
    let mut h = Harness::new();
    let registry = Registry::parse("projects.toml", FILE)
        .unwrap()
        .allowing_unauthenticated_uplinks();
    h.gw = Gateway::new(registry, Config::default(), [3; 32]);
    h
}

/// A sled for `project` whose `show` is annotated read-only and `move_story` is not.
fn connect(h: &mut Harness, project: &str) -> UplinkId {
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":project,"sled":project}),
    );
    let f = h.take_frames(u);
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":[
            {"name":"show","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},
            {"name":format!("{project}_move"),"inputSchema":{"type":"object"}},
        ]}}),
    );
    u
}

fn post_as(h: &mut Harness, bearer: &str, session: Option<&str>, body: Value) -> HttpToken {
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

fn initialize(h: &mut Harness, bearer: &str) -> String {
    let t = post_as(
        h,
        bearer,
        None,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
    );
    let r = h.replies.remove(&t).unwrap();
    r.headers
        .iter()
        .find(|(n, _)| *n == "Mcp-Session-Id")
        .unwrap()
        .1
        .clone()
}

fn call(h: &mut Harness, bearer: &str, s: &str, tool: &str, arguments: Value) -> HttpToken {
    post_as(
        h,
        bearer,
        Some(s),
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":tool,"arguments":arguments}}),
    )
}

fn answer(h: &mut Harness, t: HttpToken) -> Value {
    h.reply_json(t).expect("an immediate answer")
}

fn structured(v: &Value) -> Value {
    serde_json::from_str(v["result"]["content"][0]["text"].as_str().unwrap()).unwrap()
}

#[test]
fn a_reader_reads_its_project_and_nothing_else_is_there_for_it() {
    let mut h = harness();
    let alpha = connect(&mut h, "alpha");
    let beta = connect(&mut h, "beta");
    connect(&mut h, "gamma");
    let s = initialize(&mut h, READER);

    // A read-only tool of alpha is forwarded.
    call(&mut h, READER, &s, "show", json!({}));
    assert_eq!(h.take_frames(alpha).len(), 1);
    // A write to alpha is refused, naming the project and the right.
    let t = call(&mut h, READER, &s, "alpha_move", json!({}));
    let r = answer(&mut h, t);
    assert_eq!(r["error"]["data"]["kind"], "forbidden", "{r}");
    assert_eq!(r["error"]["data"]["project"], "alpha");
    assert_eq!(r["error"]["data"]["right"], "write");
    assert!(h.take_frames(alpha).is_empty(), "nothing was sent");
    // beta is answered exactly as a project that does not exist, listing only alpha.
    let t = call(&mut h, READER, &s, "show", json!({"project":"beta"}));
    let hidden = answer(&mut h, t);
    let t = call(&mut h, READER, &s, "show", json!({"project":"zeta"}));
    let missing = answer(&mut h, t);
    assert_eq!(hidden["error"]["data"]["kind"], "unknown_project");
    assert_eq!(
        hidden["error"]["data"]["registered"],
        missing["error"]["data"]["registered"]
    );
    assert_eq!(hidden["error"]["data"]["registered"], json!(["alpha"]));
    assert!(h.take_frames(beta).is_empty());
    // Listings show alpha only.
    let t = call(&mut h, READER, &s, "list_projects", json!({}));
    let listed = structured(&answer(&mut h, t));
    let names: Vec<&str> = listed["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha"]);
    let t = call(&mut h, READER, &s, "gateway_health", json!({}));
    let health = answer(&mut h, t).to_string();
    assert!(
        !health.contains("beta") && !health.contains("gamma"),
        "{health}"
    );
    // Nor can it switch to, read from or claim in beta; claiming in alpha needs write.
    let t = call(
        &mut h,
        READER,
        &s,
        "switch_project",
        json!({"project":"beta"}),
    );
    assert_eq!(
        answer(&mut h, t)["error"]["data"]["kind"],
        "unknown_project"
    );
    let t = post_as(
        &mut h,
        READER,
        Some(&s),
        json!({"jsonrpc":"2.0","id":2,"method":"resources/list","params":{"_meta":{"io.mcp-gateway/project":"beta"}}}),
    );
    assert_eq!(
        answer(&mut h, t)["error"]["data"]["kind"],
        "unknown_project"
    );
    let t = call(&mut h, READER, &s, "claim", json!({"resource":"story:1"}));
    let r = answer(&mut h, t);
    assert_eq!(
        (
            r["error"]["data"]["kind"].as_str(),
            r["error"]["data"]["right"].as_str()
        ),
        (Some("forbidden"), Some("write"))
    );
    let t = call(&mut h, READER, &s, "roster", json!({"project":"gamma"}));
    assert_eq!(
        answer(&mut h, t)["error"]["data"]["kind"],
        "unknown_project"
    );
}

#[test]
fn writes_need_write_and_operators_acts_need_admin() {
    let mut h = harness();
    let alpha = connect(&mut h, "alpha");
    let s = initialize(&mut h, WRITER);
    call(&mut h, WRITER, &s, "alpha_move", json!({}));
    assert_eq!(h.take_frames(alpha).len(), 1, "a writer writes");
    for (tool, args) in [
        ("release", json!({"resource":"story:1","force":true})),
        (
            "fleet_identity",
            json!({"action":"repin","project":"alpha"}),
        ),
    ] {
        let t = call(&mut h, WRITER, &s, tool, args);
        let r = answer(&mut h, t);
        assert_eq!(r["error"]["data"]["kind"], "forbidden", "{tool}: {r}");
        assert_eq!(r["error"]["data"]["right"], "admin");
    }
    // gamma is not the writer's at all.
    let t = call(&mut h, WRITER, &s, "show", json!({"project":"gamma"}));
    assert_eq!(
        answer(&mut h, t)["error"]["data"]["kind"],
        "unknown_project"
    );
    // An operator may force a release (here there is no lease: a coordination error, not a
    // refusal).
    let o = initialize(&mut h, OPS);
    let t = call(
        &mut h,
        OPS,
        &o,
        "release",
        json!({"resource":"story:1","force":true}),
    );
    let r = answer(&mut h, t);
    assert_ne!(r["error"]["data"]["kind"], "forbidden", "{r}");
}

#[test]
fn a_project_that_asks_learns_who_calls_and_nobody_can_say_it_for_the_gateway() {
    let mut h = harness();
    let alpha = connect(&mut h, "alpha");
    let beta = connect(&mut h, "beta");
    let s = initialize(&mut h, WRITER);
    let forged = json!({"io.mcp-gateway/principal":{"subject":"root"}});
    for (project, u) in [("beta", beta), ("alpha", alpha)] {
        post_as(
            &mut h,
            WRITER,
            Some(&s),
            json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"show","arguments":{"project":project},"_meta":forged}}),
        );
        let f = h.take_frames(u);
        let said = &f[0]["params"]["_meta"]["io.mcp-gateway/principal"];
        if project == "beta" {
            assert_eq!(said, &json!({"token":"writer"}), "beta asked for it");
        } else {
            assert!(
                said.is_null(),
                "alpha did not ask, and the client's is dropped: {f:?}"
            );
        }
        assert!(!f[0].to_string().contains(WRITER), "never the token");
    }
}

#[test]
fn the_stateless_tools_list_shows_only_the_callers_projects() {
    let mut h = harness();
    for p in ["alpha", "beta", "gamma"] {
        connect(&mut h, p);
    }
    let list = |h: &mut Harness, bearer: &str| -> Vec<String> {
        let t = h.request(HttpRequest {
            method: HttpMethod::Post,
            authorization: Some(format!("Bearer {bearer}")),
            content_type: Some("application/json".into()),
            accept: Some("application/json, text/event-stream".into()),
            protocol_version: Some("2026-07-28".into()),
            mcp_method: Some("tools/list".into()),
            body: json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{
                "io.modelcontextprotocol/protocolVersion":"2026-07-28",
                "io.modelcontextprotocol/clientCapabilities":{}}}})
            .to_string()
            .into_bytes(),
            ..HttpRequest::default()
        });
        let r = h.reply_json(t).unwrap();
        r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .filter(|n| n.ends_with("_move"))
            .collect()
    };
    assert_eq!(list(&mut h, READER), ["alpha_move"]);
    assert_eq!(list(&mut h, WRITER), ["alpha_move", "beta_move"]);
    assert_eq!(list(&mut h, OPS), ["alpha_move", "beta_move", "gamma_move"]);
    assert_eq!(
        list(&mut h, READER),
        ["alpha_move"],
        "nothing cached across callers"
    );
}

#[test]
fn a_default_the_caller_cannot_see_is_no_default_and_is_never_named() {
    let mut h = harness();
    connect(&mut h, "alpha");
    connect(&mut h, "gamma");
    // A stateless call without `project`: the file's default is alpha, which gammer cannot see.
    let t = h.request(HttpRequest {
        method: HttpMethod::Post,
        authorization: Some("Bearer gammer-token-0123456789".into()),
        content_type: Some("application/json".into()),
        accept: Some("application/json, text/event-stream".into()),
        protocol_version: Some("2026-07-28".into()),
        mcp_method: Some("tools/call".into()),
        mcp_name: Some("show".into()),
        body: json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"show","arguments":{},
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{}}}})
        .to_string()
        .into_bytes(),
        ..HttpRequest::default()
    });
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["data"]["kind"], "no_project_selected", "{r}");
    assert!(!r.to_string().contains("alpha"), "{r}");
    // A session starts with no default either.
    let s = initialize(&mut h, "gammer-token-0123456789");
    let t = call(&mut h, "gammer-token-0123456789", &s, "show", json!({}));
    let r = answer(&mut h, t);
    assert_eq!(r["error"]["data"]["kind"], "no_project_selected", "{r}");
    assert!(!r.to_string().contains("alpha"), "{r}");
}

/// Security review finding 11: a sled's close reason was once made with the rights of
/// whichever HTTP request came last, naming every project an operator may see. An uplink has
/// no principal at all now; its refusal names nothing but its own project, whoever asked last.
#[test]
fn an_uplink_refused_for_an_unknown_project_learns_no_names_whoever_asked_last() {
    let mut h = harness();
    for bearer in [OPS, READER] {
        let s = initialize(&mut h, bearer);
        let t = call(&mut h, bearer, &s, "list_projects", json!({}));
        assert!(answer(&mut h, t)["result"].is_object());
        let u = h.open_uplink();
        h.sled_says(
            u,
            json!({"uplink":"hello","protocol":1,"project":"zeta","sled":"z"}),
        );
        let (code, reason) = &h.closed[&u];
        assert_eq!(*code, 4003);
        for name in ["alpha", "beta", "gamma"] {
            assert!(
                !reason.contains(name),
                "after a request with {bearer}: {reason}"
            );
        }
    }
}

/// Which tools `read` covers is the gateway's to say, per project: the sled's `readOnlyHint`
/// only where projects.toml trusts it, a list where it gives one, and else none. A sled that
/// annotates a writing tool read-only hands it to no reader of a project that does not trust it.
#[test]
fn the_read_right_covers_the_tools_projects_toml_says_whatever_the_sled_annotates() {
    let file = r#"
client_tokens = [{ name = "reader", token = "reader-token-0123456789" }]

[[project]]
name = "hinted"
url = "http://127.0.0.1:9101"
trust_read_only_hints = true

[[project]]
name = "listed"
url = "http://127.0.0.1:9102"
read_only_tools = ["status"]

[[project]]
name = "plain"
url = "http://127.0.0.1:9103"

[[access]]
token = "reader"
projects = ["*"]
right = "read"
"#;
    let mut h = Harness::new();
    let registry = Registry::parse("projects.toml", file)
        .unwrap()
        .allowing_unauthenticated_uplinks();
    h.gw = Gateway::new(registry, Config::default(), [3; 32]);
    let mut uplinks = Vec::new();
    for project in ["hinted", "listed", "plain"] {
        let u = h.open_uplink();
        h.sled_says(
            u,
            json!({"uplink":"hello","protocol":1,"project":project,"sled":project}),
        );
        let f = h.take_frames(u);
        // `show` reads and says so; `wipe` writes and says it reads; `status` reads and says
        // nothing.
        h.sled_says(
            u,
            json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":[
                {"name":"show","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},
                {"name":"wipe","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},
                {"name":"status","inputSchema":{"type":"object"}},
            ]}}),
        );
        uplinks.push((project, u));
    }
    let s = initialize(&mut h, READER);
    for (project, u) in uplinks {
        for tool in ["show", "wipe", "status"] {
            let covered = match project {
                "hinted" => tool != "status",
                "listed" => tool == "status",
                _ => false,
            };
            let t = call(&mut h, READER, &s, tool, json!({ "project": project }));
            if covered {
                assert_eq!(h.take_frames(u).len(), 1, "{project} {tool}: forwarded");
                continue;
            }
            let r = answer(&mut h, t);
            assert_eq!(
                r["error"]["data"]["kind"], "forbidden",
                "{project} {tool}: {r}"
            );
            assert_eq!(
                r["error"]["data"]["right"], "write",
                "{project} {tool}: {r}"
            );
            assert!(
                h.take_frames(u).is_empty(),
                "{project} {tool}: nothing sent"
            );
        }
    }
    // `list_projects` says what `read` covers, for `gateway doctor`.
    let t = call(&mut h, READER, &s, "list_projects", json!({}));
    let listed = structured(&answer(&mut h, t));
    let covers: Vec<Value> = listed["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["read_only_tools"].clone())
        .collect();
    assert_eq!(covers, [json!("annotated"), json!(["status"]), json!([])]);
}
