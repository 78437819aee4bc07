//! Replicas on a real nats-server (issue 15), in this process: three gateways joined into one
//! cluster, each in a tokio runtime of its own (so that a "kill" drops everything it has at
//! once, its NATS connection included), sled-sim sleds dialing one replica each, and MCP
//! clients on any replica. Skipped with a note when nats-server cannot be installed; failing
//! when `CI` is set (see `support/nats.rs`).

#[path = "support/nats.rs"]
mod nats;
#[path = "support/replica.rs"]
mod replica;
#[path = "support/sse.rs"]
mod sse;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use gateway_core::{ProjectSpec, Registry};
use replica::Replica;
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};

fn registry() -> Registry {
    let specs = ["alpha", "beta", "gamma"]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut spec = ProjectSpec::new(*p, format!("http://127.0.0.1:{}", 9101 + i));
            spec.sled = format!("{p}-sled");
            spec.token = Some(gateway_core::Secret::new(UPLINK_TOKEN));
            spec
        })
        .collect();
    Registry::from_projects(specs, Some("alpha")).unwrap()
}

/// The projects' uplink token, which the tests' sleds present: uplinks are closed by default,
/// and a sled that moves between replicas replaces its old uplink, which only an
/// authenticated one may.
const UPLINK_TOKEN: &str = "cluster-test-uplink-token";

fn sled_options() -> SledOptions {
    SledOptions {
        uplink_token: Some(gateway_core::Secret::new(UPLINK_TOKEN)),
        ..SledOptions::default()
    }
}

/// What the tests here ask of a replica beyond the shared one's.
trait ReplicaExt {
    fn fleet(&self, projects: &[&str], latency: Duration) -> Fleet;
    async fn client(&self, session: Option<&str>) -> McpClient<TokioConnect>;
}

impl ReplicaExt for Replica {
    fn fleet(&self, projects: &[&str], latency: Duration) -> Fleet {
        let names: Vec<String> = projects.iter().map(|p| (*p).to_owned()).collect();
        let opts = SledOptions {
            latency,
            ..sled_options()
        };
        Fleet::spawn(&self.url(), &names, opts)
    }

    async fn client(&self, session: Option<&str>) -> McpClient<TokioConnect> {
        let mut c = McpClient::connect(TokioConnect, &self.mcp()).await.unwrap();
        c.set_session_id(session.map(str::to_owned));
        c
    }
}

/// Bounds a step of a test, so a hang fails instead of blocking CI.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("step did not finish within 20 s")
}

fn structured(r: &Value) -> &Value {
    assert!(r.get("error").is_none(), "unexpected error: {r}");
    assert_ne!(r["result"]["isError"], true, "tool error: {r}");
    &r["result"]["structuredContent"]
}

/// Waits until `via` lists each project in `held` live at its replica (`None`: not live).
async fn wait_held(via: &Replica, held: &[(&str, Option<&str>)]) {
    let mut c = via.client(None).await;
    within(async {
        loop {
            let r = c
                .tools_call(json!(0), "list_projects", json!({}))
                .await
                .unwrap();
            let projects = structured(&r)["projects"].as_array().unwrap().clone();
            let ok = held.iter().all(|(name, replica)| {
                let p = projects.iter().find(|p| p["name"] == *name).unwrap();
                match replica {
                    Some(r) => p["live"] == true && p["replica"] == *r,
                    None => p["live"] == false,
                }
            });
            if ok {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
}

/// `GET /metrics` of a replica.
async fn get_metrics(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    within(s.read_to_string(&mut out)).await.unwrap();
    out
}

/// Whether `fleet`'s sled of `project` holds the story `r` (a create_story answer) made.
fn holds(fleet: &Fleet, project: &str, r: &Value) -> bool {
    let id = structured(r)["story"]["id"].as_str().unwrap().to_owned();
    fleet
        .sled(project)
        .unwrap()
        .with(|s| s.project().story(&id).is_some())
}

/// A request of the stateless era (2026-07-28) to a replica: the JSON-RPC response.
async fn stateless(via: &Replica, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let mut c = via.client(None).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let (status, _, body) = within(c.post_raw(
        body.to_string().into_bytes(),
        &[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", method),
        ],
    ))
    .await
    .unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

/// The names of the tools a replica's stateless `tools/list` lists.
async fn stateless_tools(via: &Replica) -> Vec<String> {
    let r = stateless(via, "tools/list", json!({})).await;
    r["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Two replicas (claims live 30 s), alpha's sled on r1 and beta's on r2, both held.
async fn alpha_on_r1_beta_on_r2(nats: &nats::NatsServer) -> (Replica, Replica, (Fleet, Fleet)) {
    let ttl = Duration::from_secs(30);
    let r1 = Replica::start(&nats.url(), "r1", registry(), Some(ttl));
    let r2 = Replica::start(&nats.url(), "r2", registry(), Some(ttl));
    let alpha = r1.fleet(&["alpha"], Duration::ZERO);
    let beta = r2.fleet(&["beta"], Duration::ZERO);
    wait_held(&r1, &[("alpha", Some("r1")), ("beta", Some("r2"))]).await;
    (r1, r2, (alpha, beta))
}

async fn create_story(c: &mut McpClient<TokioConnect>, id: i64, args: Value) -> Value {
    let mut arguments = json!({"name": format!("story {id}"), "acceptance_criteria": ["done"]});
    for (k, v) in args.as_object().unwrap() {
        arguments[k] = v.clone();
    }
    within(c.tools_call(json!(id), "create_story", arguments))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_serves_any_session_and_any_call() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    let ttl = Duration::from_secs(6);
    let mut r1 = Replica::start(&nats.url(), "r1", registry(), Some(ttl));
    let r2 = Replica::start(&nats.url(), "r2", registry(), Some(ttl));
    let r3 = Replica::start(&nats.url(), "r3", registry(), Some(ttl));
    let alpha = r1.fleet(&["alpha"], Duration::ZERO);
    let beta = r2.fleet(&["beta"], Duration::ZERO);
    wait_held(
        &r3,
        &[("alpha", Some("r1")), ("beta", Some("r2")), ("gamma", None)],
    )
    .await;

    // alpha's key was pinned cluster-wide when its sled first came (to r1): an impostor on r3
    // is refused there, and alpha stays with r1.
    let impostor = {
        let opts = SledOptions {
            wrong_key: ["alpha".to_owned()].into(),
            ..sled_options()
        };
        Fleet::spawn(&r3.url(), &["alpha".to_owned()], opts)
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_held(&r2, &[("alpha", Some("r1"))]).await;
    let mut c = r3.client(None).await;
    let r = within(c.tools_call(json!(0), "fleet_identity", json!({})))
        .await
        .unwrap();
    let refused = &structured(&r)["projects"];
    assert!(
        refused.to_string().contains("is pinned to key"),
        "r3 refused the impostor for alpha's pin: {r}"
    );
    drop(impostor);

    // A session made on r1 is used on r3: its default (alpha, held by r1) is relayed there.
    let mut c1 = r1.client(None).await;
    c1.initialize().await.unwrap();
    let session = c1.session_id().unwrap().to_owned();
    let mut c3 = r3.client(Some(&session)).await;
    let r = create_story(&mut c3, 1, json!({})).await;
    assert_eq!(structured(&r)["project"], "alpha");
    assert!(holds(&alpha, "alpha", &r), "executed by alpha's sled");
    // A per-call project from r1 goes to r2's sled.
    let r = create_story(&mut c1, 2, json!({"project": "beta"})).await;
    assert_eq!(structured(&r)["project"], "beta");
    assert!(holds(&beta, "beta", &r));
    assert!(!holds(&alpha, "alpha", &r));

    // Each replica counts its part: r3 relayed the call, and asked r1 and r2 for their rows
    // of `fleet_identity`; r1 served the call and its part.
    let metrics = get_metrics(r3.addr).await;
    assert!(
        metrics.contains("gateway_cluster_events_total{event=\"relay_out\"} 3"),
        "{metrics}"
    );
    assert!(metrics.contains("gateway_cluster_events_total{event=\"session_loaded\"} 1"));
    let metrics = get_metrics(r1.addr).await;
    assert!(
        metrics.contains("gateway_cluster_events_total{event=\"relay_in\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("gateway_cluster_events_total{event=\"claim_won\"} 1"));

    // switch_project on r2 is seen on r3 (through the engine's watch: a moment later).
    let mut c2 = r2.client(Some(&session)).await;
    let r = within(c2.tools_call(json!(3), "switch_project", json!({"project": "beta"})))
        .await
        .unwrap();
    assert_eq!(structured(&r)["project"], "beta");
    within(async {
        loop {
            let r = c3
                .tools_call(json!(4), "list_projects", json!({}))
                .await
                .unwrap();
            if structured(&r)["active"] == "beta" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let r = create_story(&mut c3, 5, json!({})).await;
    assert_eq!(structured(&r)["project"], "beta");

    // The replica that made the session goes away gracefully: it releases alpha, and the
    // session lives on.
    r1.stop().await;
    wait_held(&r3, &[("alpha", None), ("beta", Some("r2"))]).await;
    let r = create_story(&mut c3, 6, json!({})).await;
    assert_eq!(structured(&r)["project"], "beta");
    let r = within(c3.tools_call(
        json!(7),
        "create_story",
        json!({"name": "x", "acceptance_criteria": ["y"], "project": "alpha"}),
    ))
    .await
    .unwrap();
    assert_eq!(r["error"]["data"]["kind"], "sled_not_connected", "{r}");
    // A replica that never saw the session serves it too.
    let r4 = Replica::start(&nats.url(), "r4", registry(), Some(ttl));
    let mut c4 = r4.client(Some(&session)).await;
    let r = within(c4.tools_call(json!(8), "list_projects", json!({})))
        .await
        .unwrap();
    assert_eq!(structured(&r)["active"], "beta");
    // A session nobody made is still unknown.
    let mut stranger = r4.client(Some("0123456789abcdef0123456789abcdef")).await;
    let e = within(stranger.tools_call(json!(9), "list_projects", json!({}))).await;
    assert!(e.is_err(), "{e:?}");
    drop((alpha, beta));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_dying_mid_call_is_an_unknown_outcome_and_a_dead_owner_not_sent() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let mut r1 = Replica::start(&nats.url(), "r1", registry(), Some(ttl));
    let r2 = Replica::start(&nats.url(), "r2", registry(), Some(ttl));
    let _alpha = r1.fleet(&["alpha"], Duration::from_secs(30));
    wait_held(&r2, &[("alpha", Some("r1"))]).await;
    let mut c = r2.client(None).await;
    let call = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let r = c
            .tools_call(
                json!(1),
                "create_story",
                json!({"name": "slow", "acceptance_criteria": ["x"]}),
            )
            .await
            .unwrap();
        (r, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    r1.kill();
    let (r, took) = within(call).await.unwrap();
    assert_eq!(r["error"]["code"], -32603, "{r}");
    assert_eq!(r["error"]["data"]["kind"], "uplink_lost");
    assert_eq!(r["error"]["data"]["outcome"], "unknown");
    assert_eq!(r["error"]["data"]["reason"], "owner_lost");
    assert!(took < Duration::from_secs(10), "{took:?}: not at once");
    // r1's claim lives on (30 s) but nobody listens for it: the next call is not sent there;
    // it waits for alpha's sled to be claimed again (it never is: it dials dead r1), and then
    // says so.
    let mut c = r2.client(None).await;
    let started = std::time::Instant::now();
    let r = within(c.tools_call(
        json!(2),
        "create_story",
        json!({"name": "x", "acceptance_criteria": ["y"]}),
    ))
    .await
    .unwrap();
    assert_eq!(r["error"]["data"]["kind"], "sled_not_connected", "{r}");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "held for the move grace"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_moving_to_another_replica_takes_its_project_along() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let mut r1 = Replica::start(&nats.url(), "r1", registry(), Some(ttl));
    let r2 = Replica::start(&nats.url(), "r2", registry(), Some(ttl));
    let alpha = r1.fleet(&["alpha"], Duration::ZERO);
    wait_held(&r2, &[("alpha", Some("r1"))]).await;
    // r1 dies; alpha's sled comes back through r2 (as a load balancer would send it) and
    // takes the project over at once, without waiting for r1's claim to expire.
    r1.kill();
    drop(alpha);
    let alpha = r2.fleet(&["alpha"], Duration::ZERO);
    wait_held(&r2, &[("alpha", Some("r2"))]).await;
    let mut c = r2.client(None).await;
    let r = create_story(&mut c, 1, json!({})).await;
    assert_eq!(structured(&r)["project"], "alpha");
    assert!(holds(&alpha, "alpha", &r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_tools_answer_for_every_project_wherever_its_sled_is() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    // gamma has no sled anywhere.
    let (r1, r2, _sleds) = alpha_on_r1_beta_on_r2(&nats).await;
    for (via, name) in [(&r1, "r1"), (&r2, "r2")] {
        let mut c = via.client(None).await;
        let r = within(c.tools_call(json!(1), "gateway_health", json!({})))
            .await
            .unwrap();
        let rows = structured(&r)["projects"].as_array().unwrap().clone();
        let row = |p: &str| rows.iter().find(|r| r["project"] == p).unwrap().clone();
        for (project, holder) in [("alpha", "r1"), ("beta", "r2")] {
            let row = row(project);
            assert_eq!(row["status"], "up", "via {name}: {row}");
            assert_eq!(row["via"], "uplink", "via {name}: {row}");
            assert_eq!(row["replica"], holder, "via {name}: {row}");
        }
        // No sled anywhere: this replica's own view (not probed yet, or its url down).
        let gamma = row("gamma");
        assert!(
            gamma["status"] == "unknown" || gamma["status"] == "down",
            "{gamma}"
        );
        assert_eq!(gamma["replica"], Value::Null, "via {name}: {gamma}");
        assert_eq!(
            structured(&r)["summary"]["up"],
            json!(["alpha", "beta"]),
            "via {name}"
        );
        let r = within(c.tools_call(json!(2), "aggregate_pipeline_status", json!({})))
            .await
            .unwrap();
        let s = structured(&r);
        assert_eq!(s["totals"]["answered"], 2, "via {name}: {s}");
        let not: Vec<&str> = s["not_answered"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["project"].as_str().unwrap())
            .collect();
        assert_eq!(not, ["gamma"], "via {name}: {s}");
    }
    // Each replica asked the other twice (beta's health and pipeline from r1, alpha's from r2).
    let metrics = get_metrics(r1.addr).await;
    for line in [
        "gateway_cluster_events_total{event=\"relay_out\"} 2",
        "gateway_cluster_events_total{event=\"relay_in\"} 2",
        "gateway_cluster_events_total{event=\"relay_failed\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_hear_of_their_projects_wherever_the_sleds_are() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let r1 = Replica::start(&nats.url(), "r1", registry(), Some(ttl));
    let r2 = Replica::start(&nats.url(), "r2", registry(), Some(ttl));
    let alpha = r1.fleet(&["alpha"], Duration::ZERO);
    wait_held(&r2, &[("alpha", Some("r1")), ("beta", None)]).await;
    // r2's stateless tools/list lists alpha's tools as r1 listed them (the tools bucket).
    within(async {
        while !stateless_tools(&r2)
            .await
            .iter()
            .any(|t| t == "block_story")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // A session made on r2 (its default alpha, whose sled is on r1), its GET stream on r2,
    // and a stateless listener of the tool list on r2.
    let mut s = r2.client(None).await;
    s.initialize().await.unwrap();
    let session = s.session_id().unwrap().to_owned();
    let mut events = sse::open_get_stream(r2.addr, &session).await;
    let mut tools_news = sse::open_listen(r2.addr, json!({"toolsListChanged": true}), None).await;
    sse::next_event_with(&mut tools_news, "acknowledged").await;

    // alpha's sled hides a tool: r1 lists its tools again, and r2's streams hear of it.
    assert!(alpha
        .sled("alpha")
        .unwrap()
        .set_tool_enabled("block_story", false));
    sse::next_event_with(&mut events, "notifications/tools/list_changed").await;
    sse::next_event_with(&mut tools_news, "notifications/tools/list_changed").await;
    let tools = stateless_tools(&r2).await;
    assert!(tools.iter().any(|t| t == "create_story"), "{tools:?}");
    assert!(!tools.iter().any(|t| t == "block_story"), "{tools:?}");
    let r = within(s.tools_list(json!(1), None)).await.unwrap();
    let listed = r["result"]["tools"].as_array().unwrap();
    assert!(listed.iter().any(|t| t["name"] == "create_story"), "{r}");
    assert!(!listed.iter().any(|t| t["name"] == "block_story"), "{r}");

    // Its prompts change: the session whose default it is hears of it on r2.
    let told = alpha
        .sled("alpha")
        .unwrap()
        .notify("notifications/prompts/list_changed", None);
    assert_eq!(told, 1, "one uplink sends it");
    sse::next_event_with(&mut events, "notifications/prompts/list_changed").await;

    // A story the session subscribed to through r2 (the subscription is kept at r1, with
    // alpha's sled) changes: its update comes to the session's stream on r2. A listener on r2
    // naming alpha is relayed to r1 and hears it too.
    let r = create_story(&mut s, 2, json!({})).await;
    let id = structured(&r)["story"]["id"].as_str().unwrap().to_owned();
    let uri = format!("story://alpha/{id}");
    let r = within(s.request(json!(3), "resources/subscribe", json!({"uri": uri})))
        .await
        .unwrap();
    assert_eq!(r["result"], json!({}), "{r}");
    let mut story_news = sse::open_listen(
        r2.addr,
        json!({"resourceSubscriptions": [uri]}),
        Some("alpha"),
    )
    .await;
    let ack = sse::next_event_with(&mut story_news, "acknowledged").await;
    assert!(ack.contains(&uri), "{ack}");
    let mut other = r1.client(Some(&session)).await;
    let r = within(other.tools_call(
        json!(4),
        "add_todo",
        json!({"story_id": id, "text": "from r1"}),
    ))
    .await
    .unwrap();
    structured(&r);
    let update = sse::next_event_with(&mut events, "notifications/resources/updated").await;
    assert!(update.contains(&uri), "{update}");
    let update = sse::next_event_with(&mut story_news, "notifications/resources/updated").await;
    assert!(update.contains(&uri), "{update}");

    // alpha's sled leaves the cluster: r2's listing drops its tools, and its streams hear so.
    alpha.shutdown().await;
    sse::next_event_with(&mut tools_news, "notifications/tools/list_changed").await;
    sse::next_event_with(&mut events, "notifications/tools/list_changed").await;
    let tools = stateless_tools(&r2).await;
    assert!(!tools.iter().any(|t| t == "create_story"), "{tools:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_retry_on_another_replica_resumes_the_parked_call() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let mut r1 = Replica::start(&nats.url(), "r1", registry(), Some(ttl));
    let r2 = Replica::start(&nats.url(), "r2", registry(), Some(ttl));
    let r3 = Replica::start(&nats.url(), "r3", registry(), Some(ttl));
    let opts = SledOptions {
        fixture_projects: vec!["beta".into()],
        ..sled_options()
    };
    let _beta = Fleet::spawn(&r1.url(), &["beta".to_owned()], opts);
    wait_held(&r2, &[("beta", Some("r1"))]).await;
    let sampling = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"sampling": {}},
    });
    let call = |state: Option<(&Value, Value)>| {
        let mut params = json!({"name": "test_sampling",
            "arguments": {"project": "beta", "prompt": "2+2?"}, "_meta": sampling});
        if let Some((s, responses)) = state {
            params["requestState"] = s.clone();
            params["inputResponses"] = responses;
        }
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).to_string()
    };
    let post = |via: &Replica, body: String| {
        let url = via.url();
        async move {
            let mut c = McpClient::connect(TokioConnect, &format!("{url}/mcp"))
                .await
                .unwrap();
            let headers = [
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "test_sampling"),
                ("mcp-param-project", "beta"),
            ];
            let (status, _, body) = within(c.post_raw(body.into_bytes(), &headers))
                .await
                .unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            (status, v)
        }
    };
    // Asked through r2, parked at r1 (beta's holder): the handle names r1.
    let (status, r) = post(&r2, call(None)).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let state = r["result"]["requestState"].clone();
    assert!(state.as_str().unwrap().ends_with(".r1"), "{state}");
    let key = r["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    // The retry lands on r3 (a load balancer's choice): relayed to r1, it resumes the call.
    let answer =
        json!({key: {"role": "assistant", "content": {"type": "text", "text": "4"}, "model": "m"}});
    let (status, r) = post(&r3, call(Some((&state, answer.clone())))).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["content"][0]["text"], "LLM response: 4", "{r}");
    // The handle was used: once more is unknown, wherever it lands.
    let (_, r) = post(&r2, call(Some((&state, answer.clone())))).await;
    assert_eq!(r["error"]["data"]["kind"], "unknown_request_state", "{r}");

    // A call parked at a replica that dies: its retry elsewhere has an unknown outcome.
    let (_, r) = post(&r2, call(None)).await;
    let state = r["result"]["requestState"].clone();
    r1.kill();
    let (_, r) = post(&r3, call(Some((&state, answer)))).await;
    assert_eq!(r["error"]["data"]["kind"], "uplink_lost", "{r}");
    assert_eq!(r["error"]["data"]["outcome"], "unknown", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_coordinate_across_replicas() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    let (r1, r2, _sleds) = alpha_on_r1_beta_on_r2(&nats).await;

    // A caller without a session checks in on alpha through r2 (served by r1, alpha's
    // holder): its handle works on r2 too, for beta.
    let mut anon = r2.client(None).await;
    let r = within(anon.tools_call(json!(1), "checkin", json!({"project": "alpha"})))
        .await
        .unwrap();
    let handle = structured(&r)["handle"].as_str().unwrap().to_owned();
    let r = within(anon.tools_call(
        json!(2),
        "checkin",
        json!({"project": "beta", "agent": handle}),
    ))
    .await
    .unwrap();
    structured(&r);

    // A session (made on r1) present in both waits through r1 in both: beta's part waits at
    // r2, and a message to it in beta wakes it.
    let mut s = r1.client(None).await;
    s.initialize().await.unwrap();
    let mut me = String::new();
    for (id, p) in [(3, "alpha"), (4, "beta")] {
        let r = within(s.tools_call(json!(id), "checkin", json!({"project": p})))
            .await
            .unwrap();
        // Its name where beta's coordination state is.
        me = structured(&r)["agent"].as_str().unwrap().to_owned();
    }
    let session = s.session_id().unwrap().to_owned();
    let waiter = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let r = s
            .tools_call(json!(6), "wait", json!({"timeout_s": 20}))
            .await
            .unwrap();
        (r, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = within(anon.tools_call(
        json!(7),
        "send",
        json!({"project": "beta", "agent": handle, "to": me, "body": "your turn"}),
    ))
    .await
    .unwrap();
    structured(&r);
    let (r, took) = within(waiter).await.unwrap();
    let woke = structured(&r);
    assert_eq!(woke["woke"], true, "{r}");
    assert_eq!(woke["project"], "beta", "{r}");
    assert!(
        took < Duration::from_secs(10),
        "{took:?}: woken, not timed out"
    );

    // gamma has no sled anywhere: no replica keeps coordination state for it.
    let mut c = r2.client(Some(&session)).await;
    let r = within(c.tools_call(
        json!(8),
        "claim",
        json!({"project": "gamma", "resource": "x"}),
    ))
    .await
    .unwrap();
    assert_eq!(r["error"]["data"]["kind"], "sled_not_connected", "{r}");
}
