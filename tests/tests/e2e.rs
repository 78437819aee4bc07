//! End-to-end over real loopback sockets: the real gateway server, the real sled-sim fleet,
//! and MCP client sessions, as a user would run them.

#[path = "support/sse.rs"]
mod sse;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use gateway_core::{ProjectSpec, Registry};
use gateway_server::{serve, ServerOptions};
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};
use sse::{next_event_with, open_get_stream};
use tokio::sync::oneshot;

/// A gateway serving alpha, beta and gamma (default alpha) on a loopback port.
struct Gateway {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Gateway {
    async fn start() -> Gateway {
        gateway_tests::init_tracing();
        let specs = ["alpha", "beta", "gamma"]
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut spec = ProjectSpec::new(*p, format!("http://127.0.0.1:{}", 9101 + i));
                spec.sled = format!("{p}-sled");
                spec
            })
            .collect();
        let registry = Registry::from_projects(specs, Some("alpha"))
            .unwrap()
            .allowing_unauthenticated_uplinks(); // its sleds present no token
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let opts = ServerOptions::new(registry, [3; 32]);
        let task = tokio::spawn(serve(listener, opts, async {
            let _ = stopped.await;
        }));
        Gateway {
            addr,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn fleet(&self, projects: &[&str], latency: Duration) -> Fleet {
        let names: Vec<String> = projects.iter().map(|p| (*p).to_owned()).collect();
        let opts = SledOptions {
            latency,
            ..SledOptions::default()
        };
        Fleet::spawn(&self.url(), &names, opts)
    }

    async fn client(&self) -> McpClient<TokioConnect> {
        McpClient::connect(TokioConnect, &format!("{}/mcp", self.url()))
            .await
            .unwrap()
    }

    async fn session(&self) -> McpClient<TokioConnect> {
        let mut c = self.client().await;
        c.initialize().await.unwrap();
        assert!(c.session_id().is_some());
        c
    }

    /// Waits until exactly these projects have live uplinks and their tools are listed.
    async fn wait_live(&self, projects: &[&str]) {
        let mut c = self.client().await;
        within(async {
            loop {
                let r = c
                    .tools_call(json!(0), "list_projects", json!({}))
                    .await
                    .unwrap();
                let live: Vec<&str> = r["result"]["structuredContent"]["projects"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|p| p["live"] == true)
                    .map(|p| p["name"].as_str().unwrap())
                    .collect();
                if live == projects {
                    let tools = c.tools_list(json!(1), None).await.unwrap();
                    let listed = tools["result"]["tools"].as_array().unwrap().len();
                    // Without a session the file's default (alpha) lists its tools.
                    if !projects.contains(&"alpha") || listed > gateway_core::GATEWAY_TOOLS.len() {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        within(self.task).await.unwrap().unwrap();
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

fn error(r: &Value) -> (i64, &str) {
    (
        r["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("not an error: {r}")),
        r["error"]["data"]["kind"].as_str().unwrap(),
    )
}

#[tokio::test]
async fn the_walkthrough_from_the_issue() {
    let gw = Gateway::start().await;
    let fleet = gw.fleet(&["alpha", "beta"], Duration::ZERO);
    gw.wait_live(&["alpha", "beta"]).await;
    let mut s = gw.session().await;

    // tools/list: gateway tools, then alpha's, each project tool with `project` injected.
    let tools = s.tools_list(json!(1), None).await.unwrap();
    let tools = tools["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(&names[..2], ["switch_project", "list_projects"]);
    for want in ["create_story", "get_story_todos", "show"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(tools.len() >= 14, "at least 12 project tools: {names:?}");
    for t in &tools[gateway_core::GATEWAY_TOOLS.len()..] {
        assert_eq!(
            t["inputSchema"]["properties"]["project"]["type"], "string",
            "{t}"
        );
        let required = t["inputSchema"]["required"].as_array();
        assert!(
            !required.is_some_and(|r| r.contains(&json!("project"))),
            "{t}"
        );
    }

    // Default alpha, but a per-call project creates the story on beta.
    let r = s
        .tools_call(
            json!(2),
            "create_story",
            json!({"name": "Fix login bug", "acceptance_criteria": ["login works"], "project": "beta"}),
        )
        .await
        .unwrap();
    let story = &structured(&r)["story"];
    assert_eq!(structured(&r)["project"], "beta");
    let id = story["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("beta-"), "{id}");
    let in_beta = fleet
        .sled("beta")
        .unwrap()
        .with(|s| s.project().story(&id).is_some());
    let in_alpha = fleet
        .sled("alpha")
        .unwrap()
        .with(|s| s.project().story(&id).is_some());
    assert!(in_beta && !in_alpha);
    // Reading it back per call, and the default still being alpha.
    let r = s
        .tools_call(json!(3), "show", json!({"story_id": id, "project": "beta"}))
        .await
        .unwrap();
    assert_eq!(structured(&r)["story"]["name"], "Fix login bug");
    let r = s.tools_call(json!(4), "whoami", json!({})).await.unwrap();
    assert_eq!(structured(&r)["project"], "alpha");

    // Unknown project: -32602 listing the registered names.
    let r = s
        .tools_call(
            json!(5),
            "show",
            json!({"story_id": "x", "project": "zeta"}),
        )
        .await
        .unwrap();
    assert_eq!(error(&r), (-32602, "unknown_project"));
    assert_eq!(
        r["error"]["data"]["registered"],
        json!(["alpha", "beta", "gamma"])
    );
    // Gamma is registered but its sled is not connected: -32603 naming the sled.
    let r = s
        .tools_call(
            json!(6),
            "show",
            json!({"story_id": "x", "project": "gamma"}),
        )
        .await
        .unwrap();
    assert_eq!(error(&r), (-32603, "sled_not_connected"));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'gamma-sled'"),
        "{r}"
    );
    // `project` of the wrong type, or empty.
    let r = s
        .tools_call(json!(7), "show", json!({"story_id": "x", "project": 3}))
        .await
        .unwrap();
    assert_eq!(error(&r), (-32602, "project_not_string"));
    let r = s
        .tools_call(json!(8), "show", json!({"story_id": "x", "project": ""}))
        .await
        .unwrap();
    assert_eq!(error(&r), (-32602, "project_empty"));

    fleet.shutdown().await;
    gw.stop().await;
}

#[tokio::test]
async fn two_sessions_switching_concurrently_never_see_each_other() {
    let gw = Gateway::start().await;
    let fleet = gw.fleet(&["alpha", "beta", "gamma"], Duration::from_millis(2));
    gw.wait_live(&["alpha", "beta", "gamma"]).await;
    let (mut a, mut b) = (gw.session().await, gw.session().await);
    let run = |mut c: McpClient<TokioConnect>, mine: &'static str, other: &'static str| async move {
        for round in 0..20 {
            // Switch back and forth between two projects while the other session does too.
            let target = if round % 2 == 0 { mine } else { other };
            let r = c
                .tools_call(json!(round), "switch_project", json!({"project": target}))
                .await
                .unwrap();
            assert_eq!(structured(&r)["project"], target);
            let r = c
                .tools_call(json!(round), "whoami", json!({}))
                .await
                .unwrap();
            assert_eq!(structured(&r)["project"], target, "round {round}");
            // A per-call project to a third project leaves the default alone.
            let r = c
                .tools_call(json!(round), "whoami", json!({"project": "gamma"}))
                .await
                .unwrap();
            assert_eq!(structured(&r)["project"], "gamma");
            let r = c
                .tools_call(json!(round), "whoami", json!({}))
                .await
                .unwrap();
            assert_eq!(structured(&r)["project"], target, "round {round}");
        }
        c
    };
    let (ra, rb) =
        within(async { tokio::join!(run(a, "alpha", "beta"), run(b, "beta", "alpha")) }).await;
    (a, b) = (ra, rb);
    // list_projects marks each session's own default as active.
    for (c, want) in [(&mut a, "beta"), (&mut b, "alpha")] {
        let r = c
            .tools_call(json!(99), "list_projects", json!({}))
            .await
            .unwrap();
        assert_eq!(structured(&r)["active"], want);
    }
    fleet.shutdown().await;
    gw.stop().await;
}

#[tokio::test]
async fn the_same_id_from_two_sessions_at_once_comes_back_to_each() {
    let gw = Gateway::start().await;
    // A slow sled, so both calls are in flight on one uplink at the same time.
    let fleet = gw.fleet(&["alpha", "beta"], Duration::from_millis(150));
    gw.wait_live(&["alpha", "beta"]).await;
    let (mut a, mut b) = (gw.session().await, gw.session().await);
    async fn create(
        c: &mut McpClient<TokioConnect>,
        name: &str,
    ) -> Result<Value, sled_sim::ClientError> {
        let args = json!({"name": name, "acceptance_criteria": [], "project": "beta"});
        c.tools_call(json!(1), "create_story", args).await
    }
    let (ra, rb) =
        within(async { tokio::join!(create(&mut a, "from a"), create(&mut b, "from b")) }).await;
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!((ra["id"].clone(), rb["id"].clone()), (json!(1), json!(1)));
    assert_eq!(structured(&ra)["story"]["name"], "from a");
    assert_eq!(structured(&rb)["story"]["name"], "from b");
    // A string id comes back as the same string.
    let r = a
        .tools_call(json!("1"), "whoami", json!({"project": "beta"}))
        .await
        .unwrap();
    assert_eq!(r["id"], json!("1"));
    fleet.shutdown().await;
    gw.stop().await;
}

#[tokio::test]
async fn a_sled_killed_mid_call_fails_its_pending_calls_at_once() {
    let gw = Gateway::start().await;
    // Beta takes 10 s per call; the gateway's deadline is 30 s.
    let mut fleet = gw.fleet(&["alpha", "beta"], Duration::from_secs(10));
    gw.wait_live(&["alpha", "beta"]).await;
    let mut s = gw.session().await;
    let mut other = gw.session().await;
    let pending = tokio::spawn(async move {
        let args = json!({"name": "doomed", "acceptance_criteria": [], "project": "beta"});
        s.tools_call(json!(1), "create_story", args).await
    });
    let pending2 = tokio::spawn(async move {
        other
            .tools_call(json!(1), "whoami", json!({"project": "beta"}))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fleet.stop("beta"));
    // Both calls fail with the sled named, long before the sled's 10 s or the 30 s deadline.
    for p in [pending, pending2] {
        let r = tokio::time::timeout(Duration::from_secs(5), p)
            .await
            .expect("the pending call failed at once, not at its deadline")
            .unwrap()
            .unwrap();
        assert_eq!(error(&r), (-32603, "uplink_lost"));
        assert_eq!(r["error"]["data"]["outcome"], "unknown");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("beta-sled"),
            "{r}"
        );
    }
    // Beta is now not connected, alpha still is, and beta comes back when its sled does.
    let mut c = gw.session().await;
    let r = c
        .tools_call(json!(2), "whoami", json!({"project": "beta"}))
        .await
        .unwrap();
    assert_eq!(error(&r), (-32603, "sled_not_connected"));
    let r = c
        .tools_call(json!(3), "list_projects", json!({}))
        .await
        .unwrap();
    let live: Vec<bool> = structured(&r)["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["live"] == true)
        .collect();
    assert_eq!(live, [true, false, false]);
    assert!(fleet.start("beta"));
    gw.wait_live(&["alpha", "beta"]).await;
    fleet.shutdown().await;
    gw.stop().await;
}

#[tokio::test]
async fn sessions_are_per_client_and_end_with_delete() {
    let gw = Gateway::start().await;
    let fleet = gw.fleet(&["alpha"], Duration::ZERO);
    gw.wait_live(&["alpha"]).await;
    let mut s = gw.session().await;
    // switch_project without a session explains how to get one.
    let mut anon = gw.client().await;
    let r = anon
        .tools_call(json!(1), "switch_project", json!({"project": "beta"}))
        .await
        .unwrap();
    assert_eq!(error(&r), (-32602, "switch_without_session"));
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("initialize"));
    // A sessionless per-call project works.
    let r = anon
        .tools_call(json!(2), "whoami", json!({"project": "alpha"}))
        .await
        .unwrap();
    assert_eq!(structured(&r)["project"], "alpha");
    // DELETE ends the session; the id is then unknown (404).
    let ended = s.session_id().unwrap().to_owned();
    assert_eq!(s.delete_session().await.unwrap(), 204);
    s.set_session_id(Some(ended));
    let err = s
        .tools_call(json!(3), "whoami", json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(err, sled_sim::ClientError::Http { status: 404, .. }),
        "{err:?}"
    );
    // Garbage gets a JSON-RPC parse error and the gateway keeps serving.
    let (status, _, body) = anon.post_raw(b"{not json".to_vec(), &[]).await.unwrap();
    assert_eq!(status, 400);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], -32700);
    let r = anon.request(json!(4), "ping", json!({})).await.unwrap();
    assert_eq!(r["result"], json!({}));
    fleet.shutdown().await;
    gw.stop().await;
}

#[tokio::test]
async fn list_changed_reaches_the_sessions_get_stream() {
    let gw = Gateway::start().await;
    let mut fleet = gw.fleet(&["alpha", "beta"], Duration::ZERO);
    gw.wait_live(&["alpha", "beta"]).await;
    let mut s = gw.session().await;
    let mut events = open_get_stream(gw.addr, s.session_id().unwrap()).await;
    // Switching this session's default changes its tool list.
    s.tools_call(json!(1), "switch_project", json!({"project": "beta"}))
        .await
        .unwrap();
    next_event_with(&mut events, "notifications/tools/list_changed").await;
    // Its default project's sled going away changes it too.
    assert!(fleet.stop("beta"));
    next_event_with(&mut events, "notifications/tools/list_changed").await;
    let tools = s.tools_list(json!(2), None).await.unwrap();
    assert_eq!(
        tools["result"]["tools"].as_array().unwrap().len(),
        gateway_core::GATEWAY_TOOLS.len(),
        "beta's tools are gone"
    );
    fleet.shutdown().await;
    gw.stop().await;
}

#[tokio::test]
async fn progress_comes_back_on_the_calls_stream_and_a_cancel_stops_the_call() {
    let gw = Gateway::start().await;
    let fleet = gw.fleet(&["alpha", "beta"], Duration::from_millis(600));
    gw.wait_live(&["alpha", "beta"]).await;
    let mut s = gw.session().await;
    // Progress, under the client's own token, then the answer, on one SSE answer.
    let body = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{
        "name":"whoami","arguments":{"project":"beta"},"_meta":{"progressToken":"mine"}}});
    let (status, headers, body) = s
        .post_raw(body.to_string().into_bytes(), &[])
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    let text = String::from_utf8(body.to_vec()).unwrap();
    let data: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(data.len(), 2, "{text}");
    assert_eq!(data[0]["method"], "notifications/progress");
    assert_eq!(data[0]["params"]["progressToken"], "mine");
    assert_eq!(data[1]["id"], 7);
    assert_eq!(structured(&data[1])["project"], "beta");

    // A slow write, cancelled by the client: the call ends at once and is not applied.
    let session = s.session_id().unwrap().to_owned();
    let mut canceller = gw.client().await;
    canceller.set_session_id(Some(session));
    let write = tokio::spawn(async move {
        let args = json!({"name": "never", "acceptance_criteria": [], "project": "beta"});
        s.tools_call(json!(8), "create_story", args).await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let status = canceller
        .notify(
            "notifications/cancelled",
            json!({"requestId": 8, "reason": "changed my mind"}),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    let r = within(write).await.unwrap().unwrap();
    assert_eq!(error(&r), (-32800, "cancelled"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let created = fleet
        .sled("beta")
        .unwrap()
        .with(|s| s.project().iter().any(|story| story.name == "never"));
    assert!(
        !created,
        "the sled dropped the cancelled call before applying it"
    );
    fleet.shutdown().await;
    gw.stop().await;
}
