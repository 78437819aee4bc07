//! The stateless era (2026-07-28) beside the handshake era, on the same gateway.

use serde_json::{json, Value};

use super::Harness;
use crate::{HttpMethod, HttpRequest, HttpToken};

const V: &str = "2026-07-28";

fn envelope() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
    })
}

/// A 2026-07-28 request with consistent headers; `tweak` may spoil them.
pub(super) fn modern(
    h: &mut Harness,
    id: u64,
    method: &str,
    mut params: Value,
    tweak: &dyn Fn(&mut HttpRequest),
) -> HttpToken {
    let mut meta = envelope();
    if let Some(Value::Object(given)) = params.get("_meta") {
        for (k, v) in given {
            meta[k] = v.clone();
        }
    }
    params["_meta"] = meta;
    let name = params["name"].as_str().map(str::to_owned);
    let project = params["arguments"]["project"].as_str().map(str::to_owned);
    let body = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
    let mut r = HttpRequest {
        content_type: Some("application/json".into()),
        accept: Some("application/json, text/event-stream".into()),
        protocol_version: Some(V.into()),
        mcp_method: Some(method.into()),
        mcp_name: name,
        mcp_param_project: project,
        body: body.to_string().into_bytes(),
        ..HttpRequest::default()
    };
    tweak(&mut r);
    h.request(r)
}

pub(super) fn answer(h: &mut Harness, t: HttpToken) -> (u16, Value) {
    let r = h.replies.remove(&t).expect("an answer");
    (
        r.status,
        r.body
            .map_or(Value::Null, |b| serde_json::from_str(&b).unwrap()),
    )
}

#[test]
fn discover_and_the_same_tools_list_for_everyone() {
    let mut h = Harness::new();
    h.connect_sled("alpha");
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta"}),
    );
    let f = h.take_frames(u);
    let beta_tools = json!([{"name":"show","inputSchema":{"type":"object"}},{"name":"beta_only","inputSchema":{"type":"object"}}]);
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":beta_tools}}),
    );

    let t = modern(&mut h, 1, "server/discover", json!({}), &|_| {});
    let (status, d) = answer(&mut h, t);
    assert_eq!(status, 200);
    assert_eq!(d["result"]["supportedVersions"], json!([V]));
    assert_eq!(d["result"]["resultType"], "complete");
    assert!(d["result"]["ttlMs"].is_u64() && d["result"]["cacheScope"].is_string());
    // Probing without the header (an "auto" client) finds the stateless era too.
    let d2 = h.rpc(None, json!(1), "server/discover", json!({}));
    assert_eq!(d2["result"]["supportedVersions"], json!([V]));

    let t = modern(&mut h, 2, "tools/list", json!({}), &|_| {});
    let (status, l) = answer(&mut h, t);
    assert_eq!(status, 200);
    let names: Vec<&str> = l["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = crate::GATEWAY_TOOLS
        .iter()
        .copied()
        .filter(|t| *t != "switch_project")
        .chain(["show", "create_story", "beta_only"])
        .collect();
    assert_eq!(names, expected, "no switch_project; each name once");
    let show = &l["result"]["tools"][crate::GATEWAY_TOOLS.len() - 1];
    assert_eq!(
        show["inputSchema"]["properties"]["project"]["x-mcp-header"],
        "Project"
    );
    assert_eq!(l["result"]["resultType"], "complete");
    assert_eq!(l["result"]["cacheScope"], "private");
}

#[test]
fn a_stateless_call_names_its_project_and_the_headers_must_agree() {
    let mut h = Harness::new();
    let beta = h.connect_sled("beta");
    let t = modern(
        &mut h,
        3,
        "tools/call",
        json!({"name":"show","arguments":{"project":"beta","story_id":"x"}}),
        &|_| {},
    );
    let f = h.take_frames(beta);
    assert_eq!(f[0]["params"]["arguments"], json!({"story_id":"x"}));
    assert!(
        f[0]["params"].get("_meta").is_none_or(|m| m
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("io.modelcontextprotocol/"))),
        "{f:?}"
    );
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"content":[],"structuredContent":{"project":"beta"}}}));
    let (status, r) = answer(&mut h, t);
    assert_eq!(status, 200);
    assert_eq!(r["result"]["resultType"], "complete");
    assert_eq!(r["result"]["structuredContent"]["project"], "beta");

    type Case = (&'static str, Box<dyn Fn(&mut HttpRequest)>, u16, i64);
    let cases: Vec<Case> = vec![
        (
            "Mcp-Method",
            Box::new(|r: &mut HttpRequest| r.mcp_method = Some("tools/list".into())),
            400,
            -32020,
        ),
        (
            "Mcp-Name",
            Box::new(|r: &mut HttpRequest| r.mcp_name = Some("other".into())),
            400,
            -32020,
        ),
        (
            "Mcp-Param-Project",
            Box::new(|r: &mut HttpRequest| r.mcp_param_project = Some("alpha".into())),
            400,
            -32020,
        ),
        (
            "base64 Mcp-Param-Project that agrees",
            Box::new(|r: &mut HttpRequest| {
                r.mcp_param_project = Some("=?base64?YmV0YQ==?=".into())
            }),
            200,
            0,
        ),
    ];
    for (what, tweak, status, code) in cases {
        let t = modern(
            &mut h,
            4,
            "tools/call",
            json!({"name":"whoami","arguments":{"project":"beta"}}),
            &*tweak,
        );
        if status == 200 {
            h.sled_answers_all(beta, "beta");
        }
        let (s, r) = answer(&mut h, t);
        assert_eq!(s, status, "{what}: {r}");
        if code != 0 {
            assert_eq!(r["error"]["code"], code, "{what}");
        }
    }
    // switch_project has no session to act on; an unknown project is 400; unknown methods 404.
    let t = modern(
        &mut h,
        5,
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta"}}),
        &|_| {},
    );
    let (s, r) = answer(&mut h, t);
    assert_eq!(
        (s, r["error"]["data"]["kind"].as_str()),
        (400, Some("unknown_tool"))
    );
    let t = modern(
        &mut h,
        6,
        "tools/call",
        json!({"name":"show","arguments":{"project":"zeta"}}),
        &|_| {},
    );
    assert_eq!(answer(&mut h, t).0, 400);
    let t = modern(&mut h, 7, "ping", json!({}), &|_| {});
    assert_eq!(answer(&mut h, t).0, 404);
}

#[test]
fn stateless_refusals() {
    let mut h = Harness::new();
    // No envelope.
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}});
    let t = h.request(HttpRequest {
        content_type: Some("application/json".into()),
        protocol_version: Some(V.into()),
        mcp_method: Some("tools/list".into()),
        body: body.to_string().into_bytes(),
        ..HttpRequest::default()
    });
    let (s, r) = answer(&mut h, t);
    assert_eq!((s, r["error"]["code"].as_i64()), (400, Some(-32602)));
    assert_eq!(r["error"]["data"]["kind"], "missing_envelope");
    // Header version and envelope version disagree.
    let t = modern(&mut h, 2, "tools/list", json!({}), &|r| {
        let b = String::from_utf8(r.body.clone())
            .unwrap()
            .replace(V, "2025-11-25");
        r.body = b.into_bytes();
    });
    assert_eq!(answer(&mut h, t).1["error"]["code"], -32020);
    // GET and DELETE are not part of this era.
    for method in [HttpMethod::Get, HttpMethod::Delete] {
        let t = h.request(HttpRequest {
            method,
            protocol_version: Some(V.into()),
            ..HttpRequest::default()
        });
        let r = h.replies.remove(&t).unwrap();
        assert_eq!(
            (r.status, r.headers),
            (405, vec![("Allow", "POST".to_owned())])
        );
    }
    // Notifications are acknowledged and dropped.
    let t = h.request(HttpRequest {
        content_type: Some("application/json".into()),
        protocol_version: Some(V.into()),
        body: br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#
            .to_vec(),
        ..HttpRequest::default()
    });
    assert_eq!(answer(&mut h, t).0, 202);
}

#[test]
fn both_eras_side_by_side() {
    let mut h = Harness::new();
    let legacy = h.initialize();
    let beta = h.connect_sled("beta");
    h.rpc(
        Some(&legacy),
        json!(1),
        "tools/call",
        json!({"name":"switch_project","arguments":{"project":"beta"}}),
    );
    let tl = h.call(Some(&legacy), json!(1), "whoami", json!({}));
    let tm = modern(
        &mut h,
        1,
        "tools/call",
        json!({"name":"whoami","arguments":{"project":"beta"}}),
        &|_| {},
    );
    assert_eq!(h.sled_answers_all(beta, "beta"), 2);
    let rl = h.reply_json(tl).unwrap();
    let (_, rm) = answer(&mut h, tm);
    assert!(
        rl["result"].get("resultType").is_none(),
        "the handshake era has no resultType"
    );
    assert_eq!(rm["result"]["resultType"], "complete");
    assert_eq!(rl["result"]["structuredContent"]["project"], "beta");
    assert_eq!(rm["result"]["structuredContent"]["project"], "beta");
}

#[test]
fn a_listener_hears_when_the_stateless_tool_list_changes() {
    let mut h = Harness::new();
    let t = modern(
        &mut h,
        9,
        "subscriptions/listen",
        json!({"notifications":{"toolsListChanged":true,"promptsListChanged":true}}),
        &|_| {},
    );
    let ack = h.streams[&t][0].1.clone();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged":true,"promptsListChanged":true}),
        "the prompts of the registry's default project"
    );
    assert_eq!(ack["params"]["_meta"]["io.mcp-gateway/project"], "alpha");
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        9
    );
    let beta = h.connect_sled("beta");
    assert_eq!(h.streams[&t].len(), 2);
    assert_eq!(
        h.streams[&t][1].1["method"],
        "notifications/tools/list_changed"
    );
    h.handle(crate::Input::UplinkClosed { uplink: beta });
    assert_eq!(h.streams[&t].len(), 3);
    // Shutdown ends it gracefully: a result naming the subscription, then the end.
    h.handle(crate::Input::Shutdown);
    let last = &h.streams[&t].last().unwrap().1;
    assert_eq!(last["id"], 9);
    assert_eq!(
        last["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        9
    );
    assert!(h.streams_closed.contains(&t));
}

#[test]
fn a_stateless_client_coordinates_with_an_agent_handle() {
    let mut h = Harness::new();
    h.connect_sled("beta");
    let t = modern(
        &mut h,
        1,
        "tools/call",
        json!({"name":"checkin","arguments":{"project":"beta","name":"stateless"}}),
        &|_| {},
    );
    let (status, r) = answer(&mut h, t);
    assert_eq!(status, 200, "{r}");
    let sc = &r["result"]["structuredContent"];
    let handle = sc["handle"]
        .as_str()
        .expect("a handle for a caller without a session")
        .to_owned();
    assert_eq!(r["result"]["resultType"], "complete");
    let t = modern(
        &mut h,
        2,
        "tools/call",
        json!({"name":"claim","arguments":{"project":"beta","resource":"story:beta-1","agent":handle}}),
        &|_| {},
    );
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["result"]["structuredContent"]["acquired"], true, "{r}");
    // A handshake-era session sees the stateless agent as the holder, by its public name.
    let s = h.initialize();
    let r = h.rpc(
        Some(&s),
        json!(3),
        "tools/call",
        json!({"name":"claims","arguments":{"project":"beta"}}),
    );
    let leases = &r["result"]["structuredContent"]["leases"];
    assert_eq!(leases[0]["holder"], sc["agent"], "{r}");
    assert!(
        !r.to_string().contains(&handle),
        "a handle is never shown to others"
    );
    // Without the handle, a stateless coordination call has no agent.
    let t = modern(
        &mut h,
        4,
        "tools/call",
        json!({"name":"release","arguments":{"project":"beta","resource":"story:beta-1"}}),
        &|_| {},
    );
    let (status, r) = answer(&mut h, t);
    assert_eq!(
        (status, r["error"]["data"]["kind"].as_str()),
        (400, Some("no_agent")),
        "{r}"
    );
}

#[test]
fn resources_prompts_and_completion_are_routed_per_request() {
    let mut h = Harness::new();
    let alpha = h.connect_sled("alpha");
    let beta = h.connect_sled("beta");
    // resources/read names its project in _meta; the key and the era's fields are removed.
    let t = modern(
        &mut h,
        1,
        "resources/read",
        json!({"uri":"story://beta/beta-1","_meta":{"io.mcp-gateway/project":"beta"}}),
        &|r| r.mcp_param_project = Some("beta".into()),
    );
    assert!(h.take_frames(alpha).is_empty());
    let f = h.take_frames(beta);
    assert_eq!(f[0]["method"], "resources/read");
    assert_eq!(f[0]["params"]["uri"], "story://beta/beta-1");
    assert!(f[0]["params"].get("_meta").is_none(), "{}", f[0]);
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"contents":[{"uri":"story://beta/beta-1","text":"{}"}]}}));
    let (status, r) = answer(&mut h, t);
    assert_eq!(status, 200);
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(r["result"]["contents"][0]["uri"], "story://beta/beta-1");
    // prompts/get names it in its `project` argument; without any, the file's default.
    let t = modern(
        &mut h,
        2,
        "prompts/get",
        json!({"name":"story_brief","arguments":{"project":"beta","story_id":"beta-1"}}),
        &|_| {},
    );
    let f = h.take_frames(beta);
    assert_eq!(f[0]["params"]["arguments"], json!({"story_id":"beta-1"}));
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"messages":[]}}),
    );
    assert_eq!(answer(&mut h, t).0, 200);
    let t = modern(
        &mut h,
        3,
        "completion/complete",
        json!({"ref":{"type":"ref/prompt","name":"story_brief"},"argument":{"name":"story_id","value":"al"}}),
        &|_| {},
    );
    let f = h.take_frames(alpha);
    assert_eq!(f[0]["method"], "completion/complete");
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"completion":{"values":["alpha-1"]}}}),
    );
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["result"]["completion"]["values"][0], "alpha-1");
    // The header must mirror the body.
    let t = modern(
        &mut h,
        4,
        "resources/read",
        json!({"uri":"story://beta/beta-1","_meta":{"io.mcp-gateway/project":"beta"}}),
        &|r| r.mcp_param_project = Some("alpha".into()),
    );
    let (status, r) = answer(&mut h, t);
    assert_eq!(
        (status, r["error"]["data"]["kind"].as_str()),
        (400, Some("header_mismatch"))
    );
    let t = modern(
        &mut h,
        5,
        "resources/read",
        json!({"uri":"x","_meta":{"io.mcp-gateway/project":"zeta"}}),
        &|_| {},
    );
    let (status, r) = answer(&mut h, t);
    assert_eq!(
        (status, r["error"]["data"]["kind"].as_str()),
        (400, Some("unknown_project")),
        "{r}"
    );
}

#[test]
fn a_stateless_requests_own_log_level_filters_its_log_messages() {
    let mut h = Harness::new();
    let alpha = h.connect_sled("alpha");
    let t = modern(
        &mut h,
        1,
        "tools/call",
        json!({"name":"show","arguments":{"story_id":"alpha-1"},"_meta":{"io.modelcontextprotocol/logLevel":"warning"}}),
        &|_| {},
    );
    let f = h.take_frames(alpha);
    let id = f[0]["id"].clone();
    assert!(
        f[0]["params"].get("_meta").is_none(),
        "the era's fields stay at the gateway"
    );
    for (level, text) in [("info", "quiet"), ("error", "loud")] {
        h.sled_says(
            alpha,
            json!({"jsonrpc":"2.0","method":"notifications/message","params":{
            "level":level,"data":text,"_meta":{"io.mcp-gateway/relatedRequest":id}}}),
        );
    }
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","id":id,"result":{"content":[]}}),
    );
    let events = &h.streams[&t];
    let logs: Vec<&Value> = events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e["method"] == "notifications/message")
        .collect();
    assert_eq!(logs.len(), 1, "{events:?}");
    assert_eq!(logs[0]["params"]["data"], "loud");
    // A level that is not one is refused, naming the levels.
    let t = modern(
        &mut h,
        2,
        "tools/call",
        json!({"name":"show","arguments":{},"_meta":{"io.modelcontextprotocol/logLevel":"loud"}}),
        &|_| {},
    );
    let (status, r) = answer(&mut h, t);
    assert_eq!(
        (status, r["error"]["code"].as_i64()),
        (400, Some(-32602)),
        "{r}"
    );
}

#[test]
fn a_listener_hears_its_projects_resource_updates_and_list_changes_and_no_others() {
    let mut h = Harness::new();
    let t = modern(
        &mut h,
        5,
        "subscriptions/listen",
        json!({"notifications":{"resourceSubscriptions":["story://beta/1"],"resourcesListChanged":true},
               "_meta":{"io.mcp-gateway/project":"beta"}}),
        &|_| {},
    );
    let ack = &h.streams[&t][0].1;
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourcesListChanged":true,"resourceSubscriptions":["story://beta/1"]})
    );
    // The sled is subscribed when it connects.
    let beta = h.open_uplink();
    h.sled_says(
        beta,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta"}),
    );
    let frames = h.take_frames(beta);
    let sub = frames
        .iter()
        .find(|f| f["method"] == "resources/subscribe")
        .expect("subscribed at the sled");
    assert_eq!(sub["params"]["uri"], "story://beta/1");
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":sub["id"],"result":{}}));
    let alpha = h.connect_sled("alpha");
    for (u, uri) in [
        (beta, "story://beta/1"),
        (beta, "story://beta/2"),
        (alpha, "story://beta/1"),
    ] {
        h.sled_says(u, json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":uri}}));
    }
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","method":"notifications/resources/list_changed"}),
    );
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}),
    );
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/resources/list_changed"}),
    );
    let got: Vec<(String, Value)> = h.streams[&t][1..]
        .iter()
        .map(|(_, e)| {
            (
                e["method"].as_str().unwrap().to_owned(),
                e["params"].clone(),
            )
        })
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, "notifications/resources/updated");
    assert_eq!(got[0].1["uri"], "story://beta/1");
    assert_eq!(
        got[0].1["_meta"]["io.modelcontextprotocol/subscriptionId"],
        5
    );
    assert_eq!(got[1].0, "notifications/resources/list_changed");
    // The listener goes: the sled is unsubscribed.
    h.take_frames(beta);
    h.handle(crate::Input::HttpAborted { token: t });
    let frames = h.take_frames(beta);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0]["method"], "resources/unsubscribe");
    assert_eq!(frames[0]["params"]["uri"], "story://beta/1");
    // An unknown project is refused before any stream opens.
    let t = modern(
        &mut h,
        6,
        "subscriptions/listen",
        json!({"notifications":{"promptsListChanged":true},"_meta":{"io.mcp-gateway/project":"zeta"}}),
        &|_| {},
    );
    let (status, r) = answer(&mut h, t);
    assert_eq!(
        (status, r["error"]["data"]["kind"].as_str()),
        (400, Some("unknown_project"))
    );
}

#[test]
fn stateless_results_carry_the_gateways_server_info() {
    let mut h = Harness::new();
    let alpha = h.connect_sled("alpha");
    let t = modern(&mut h, 1, "tools/list", json!({}), &|_| {});
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["result"]["resultType"], "complete");
    assert_eq!(
        r["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "mcp-gateway"
    );
    let t = modern(
        &mut h,
        2,
        "tools/call",
        json!({"name":"show","arguments":{"story_id":"alpha-1"}}),
        &|_| {},
    );
    let f = h.take_frames(alpha);
    h.sled_says(
        alpha,
        json!({"jsonrpc":"2.0","id":f[0]["id"],"result":{"content":[],"_meta":{"sled/own":1,"io.modelcontextprotocol/serverInfo":"forged"}}}),
    );
    let (_, r) = answer(&mut h, t);
    let meta = &r["result"]["_meta"];
    assert_eq!(r["result"]["resultType"], "complete");
    assert_eq!(meta["sled/own"], 1, "a sled's own keys are kept");
    assert_eq!(
        meta["io.modelcontextprotocol/serverInfo"]["name"],
        "mcp-gateway"
    );
}
