//! Tasks through the gateway (issue 27), black-box over real sockets: the real gateway with two
//! client tokens, sled-sim's sleds (whose `run_tests` may run as a task), in both eras, and a
//! cluster of replicas on a real nats-server where a task made through one replica is polled
//! and cancelled through another by its `Mcp-Name`.
//!
//! The client here is hand-written (the workspace's `gateway-client`, raw JSON-RPC), for what
//! no installed SDK shows: another token's `tasks/*` answered -32602 `unknown_task`, progress
//! and status notifications on the session's GET stream after the `CreateTaskResult`, the
//! 2026-07-28 extension's shapes (`Mcp-Name`, `subscriptions/listen` with `taskIds`), and a
//! second replica. The official TypeScript SDK's own tasks client (2025-11-25) runs here too:
//! `clients/ts_tasks_client.mjs`; so does the 2026-07-28 extension's own,
//! `@modelcontextprotocol/ext-tasks` over the SDK v2 client: `clients/ts_ext_tasks_client.mjs`.

#[path = "support/nats.rs"]
mod nats;
#[path = "support/node.rs"]
mod node;
#[path = "support/replica.rs"]
mod replica;
#[path = "support/sse.rs"]
mod sse;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use gateway_core::{ProjectSpec, Registry, Secret};
use gateway_server::ServerOptions;
use replica::Replica;
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledConfig, SledOptions, TokioConnect};
use sse::{next_event_with, open_get_stream_as, open_listen_as};

/// The two client tokens: A makes the tasks, B must not see them.
const TOKEN_A: &str = "tasks-client-token-a-000001";
const TOKEN_B: &str = "tasks-client-token-b-000002";
/// The projects' uplink token (the cluster's sleds move between replicas only with one).
const UPLINK_TOKEN: &str = "tasks-test-uplink-token-0001";
const MODERN: &str = "2026-07-28";
const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// alpha, beta and gamma (default alpha), letting in either client token.
fn registry() -> Registry {
    let specs = ["alpha", "beta", "gamma"]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut spec = ProjectSpec::new(*p, format!("http://127.0.0.1:{}", 9101 + i));
            spec.token = Some(Secret::new(UPLINK_TOKEN));
            spec
        })
        .collect();
    Registry::from_projects(specs, Some("alpha"))
        .unwrap()
        .with_client_tokens(vec![Secret::new(TOKEN_A), Secret::new(TOKEN_B)])
}

fn sled_options() -> SledOptions {
    SledOptions {
        uplink_token: Some(Secret::new(UPLINK_TOKEN)),
        ..SledOptions::default()
    }
}

/// Bounds a step of a test, so a hang fails instead of blocking CI.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("step did not finish within 30 s")
}

/// Makes each of `fleet`'s `run_tests` from now on take `ms` milliseconds.
fn run_tests_take(fleet: &Fleet, project: &str, ms: u64) {
    fleet.sled(project).unwrap().with(|s| {
        let config = SledConfig {
            run_tests_ms: (ms, ms),
            ..s.config().clone()
        };
        *s = s.clone().with_config(config);
    });
}

/// A client of `mcp` presenting `token`.
async fn client(mcp: &str, token: &str) -> McpClient<TokioConnect> {
    let mut c = McpClient::connect(TokioConnect, mcp).await.unwrap();
    c.set_bearer_token(Some(token.to_owned()));
    c
}

/// A session (2025-11-25) of `mcp` presenting `token`.
async fn session(mcp: &str, token: &str) -> McpClient<TokioConnect> {
    let mut c = client(mcp, token).await;
    within(c.initialize()).await.unwrap();
    assert!(c.session_id().is_some());
    c
}

/// Waits until `projects` are live at `mcp` (asked as token A), each held by `replica` when
/// one is named.
async fn wait_live(mcp: &str, projects: &[&str], replica: Option<&str>) {
    let mut c = client(mcp, TOKEN_A).await;
    within(async {
        loop {
            let r = c
                .tools_call(json!(0), "list_projects", json!({}))
                .await
                .unwrap();
            let listed = r["result"]["structuredContent"]["projects"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let live = projects.iter().all(|name| {
                listed.iter().any(|p| {
                    p["name"] == *name
                        && p["live"] == true
                        && replica.is_none_or(|r| p["replica"] == r)
                })
            });
            if live {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
}

/// One request in a session; the whole JSON-RPC response.
async fn ask(c: &mut McpClient<TokioConnect>, method: &str, params: Value) -> Value {
    within(c.request(json!(7), method, params)).await.unwrap()
}

fn assert_unknown_task(r: &Value, what: &str) {
    assert_eq!(r["error"]["code"], -32602, "{what}: {r}");
    assert_eq!(r["error"]["data"]["kind"], "unknown_task", "{what}: {r}");
}

/// The JSON of an SSE `data:` line.
fn data(line: &str) -> Value {
    serde_json::from_str(line.trim_start_matches("data:").trim()).unwrap()
}

/// Starts `run_tests` on beta as a task in session `c`; the task's id.
async fn start(c: &mut McpClient<TokioConnect>) -> String {
    let params = json!({"name": "run_tests", "arguments": {"project": "beta"},
        "task": {"ttl": 60_000}});
    let r = ask(c, "tools/call", params).await;
    r["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("not a task: {r}"))
        .to_owned()
}

/// The `notifications/tasks/status` on `stream` (task id, status) up to the one saying `id` is
/// `status`.
async fn statuses_until(stream: &mut sse::Events, id: &str, status: &str) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    loop {
        let m = data(&next_event_with(stream, "notifications/tasks/status").await);
        let p = &m["params"];
        let got = (
            p["taskId"].as_str().unwrap().to_owned(),
            p["status"].as_str().unwrap().to_owned(),
        );
        let last = got.0 == id && got.1 == status;
        seen.push(got);
        if last {
            return seen;
        }
    }
}

/// `tasks/get` until the task is terminal; its last answer.
async fn until_terminal(c: &mut McpClient<TokioConnect>, id: &str) -> Value {
    within(async {
        loop {
            let r = c
                .request(json!(8), "tasks/get", json!({"taskId": id}))
                .await
                .unwrap();
            let status = r["result"]["status"].as_str().unwrap_or("").to_owned();
            assert!(
                ["working", "completed", "failed", "cancelled"].contains(&status.as_str()),
                "{r}"
            );
            if status != "working" {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_makes_polls_lists_and_cancels_tasks_that_another_token_cannot_see() {
    let gateway = gateway_tests::Gateway::start(ServerOptions::new(registry(), [27; 32])).await;
    let names = ["beta".to_owned(), "gamma".to_owned()];
    let fleet = Fleet::spawn(&gateway.base(), &names, sled_options());
    let mcp = gateway.url();
    wait_live(&mcp, &["beta", "gamma"], None).await;

    let mut a = session(&mcp, TOKEN_A).await;
    let session_a = a.session_id().unwrap().to_owned();
    let mut stream = open_get_stream_as(gateway.addr, &session_a, Some(TOKEN_A)).await;

    // The first task, with a progress token: its CreateTaskResult comes at once, its progress
    // afterwards on the session's GET stream, under the client's own token.
    run_tests_take(&fleet, "beta", 400);
    let created = ask(
        &mut a,
        "tools/call",
        json!({"name": "run_tests", "arguments": {"project": "beta", "suite": "unit"},
            "task": {"ttl": 60_000}, "_meta": {"progressToken": "mine-1"}}),
    )
    .await;
    let task = &created["result"]["task"];
    assert_eq!(task["status"], "working", "{created}");
    let first = task["taskId"].as_str().unwrap().to_owned();
    assert!(first.starts_with("mt1."), "a gateway task id: {first}");
    let progress = data(&next_event_with(&mut stream, "notifications/progress").await);
    assert_eq!(progress["params"]["progressToken"], "mine-1", "{progress}");
    assert!(progress["params"]["message"]
        .as_str()
        .unwrap()
        .starts_with("beta: suite unit"));

    // Listed; polled to the end; its result names beta and the task.
    let listed = ask(&mut a, "tasks/list", json!({})).await;
    let ids: Vec<&str> = listed["result"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["taskId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [first.as_str()], "{listed}");
    let done = until_terminal(&mut a, &first).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(done["result"]["taskId"], json!(first));
    let result = ask(&mut a, "tasks/result", json!({"taskId": first})).await;
    let r = &result["result"];
    assert_eq!(r["structuredContent"]["project"], "beta", "{result}");
    assert_eq!(r["structuredContent"]["suite"], "unit");
    assert_eq!(
        r["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(first)
    );
    let seen = statuses_until(&mut stream, &first, "completed").await;
    assert!(seen.iter().all(|(id, _)| *id == first), "{seen:?}");

    // A second task, long enough to be cancelled while it runs; then a third, as long, made
    // after it: once the third is done, the second would have been too, had it not been
    // cancelled.
    run_tests_take(&fleet, "beta", 3000);
    let second = start(&mut a).await;
    let cancelled = ask(&mut a, "tasks/cancel", json!({"taskId": second})).await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["result"]["taskId"], json!(second));
    let third = start(&mut a).await;

    // Token B, in a session of its own: none of A's tasks exist. So for A's own token in
    // another session: a 2025-11-25 task is bound to its session.
    let mut b = session(&mcp, TOKEN_B).await;
    let mut a2 = session(&mcp, TOKEN_A).await;
    for (who, c) in [("token B", &mut b), ("A's other session", &mut a2)] {
        for id in [&first, &second, &third] {
            for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
                let r = ask(c, method, json!({"taskId": id})).await;
                assert_unknown_task(&r, &format!("{who} {method}"));
            }
        }
        let r = ask(c, "tasks/list", json!({})).await;
        assert_eq!(r["result"], json!({"tasks": []}), "{who}: {r}");
    }

    // The third completes; the second is still cancelled, and its stream never said completed.
    let done = until_terminal(&mut a, &third).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let seen = statuses_until(&mut stream, &third, "completed").await;
    assert!(
        !seen.contains(&(second.clone(), "completed".to_owned())),
        "{seen:?}"
    );
    let r = ask(&mut a, "tasks/get", json!({"taskId": second})).await;
    assert_eq!(r["result"]["status"], "cancelled", "{r}");
    let listed = ask(&mut a, "tasks/list", json!({})).await;
    let mut listed: Vec<(String, String)> = listed["result"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["taskId"].as_str().unwrap().to_owned(),
                t["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    listed.sort();
    let mut expected = vec![
        (first.clone(), "completed".to_owned()),
        (second.clone(), "cancelled".to_owned()),
        (third.clone(), "completed".to_owned()),
    ];
    expected.sort();
    assert_eq!(listed, expected);

    fleet.shutdown().await;
    gateway.stop().await;
}

/// Runs `tests/clients/<script>` with Node 22 against a gateway with two client tokens and beta's
/// sled (its `run_tests` taking 3 s), as `node SCRIPT URL TOKEN_A TOKEN_B`, and asserts every
/// check it printed passed (`client` names it in the failure).
async fn run_node_client(script: &str, client: &str) {
    let node = node::node().await;
    let gateway = gateway_tests::Gateway::start(ServerOptions::new(registry(), [29; 32])).await;
    let fleet = Fleet::spawn(&gateway.base(), &["beta".to_owned()], sled_options());
    wait_live(&gateway.url(), &["beta"], None).await;
    run_tests_take(&fleet, "beta", 3000);
    // Run from the install directory, so that the script's imports find the packages there.
    let installed = node.script(script);
    let mut cmd = node.command();
    cmd.arg(&installed)
        .args([&gateway.url(), TOKEN_A, TOKEN_B])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{client} finished within 120 s"))
        .unwrap_or_else(|e| panic!("{client} ran: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains(" passed, 0 failed"),
        "{client}'s tasks checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fleet.shutdown().await;
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdks_tasks_client_makes_polls_lists_and_cancels_and_another_token_sees_none(
) {
    run_node_client("ts_tasks_client.mjs", "the TypeScript SDK 1.32.2").await;
}

/// The 2026-07-28 tasks extension's own client, `@modelcontextprotocol/ext-tasks` 0.2.2 over
/// `@modelcontextprotocol/client` 2.3.1: a task settled to its result, a second cancelled, and
/// another token told -32602.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ext_tasks_client_settles_a_task_cancels_another_and_another_token_sees_neither() {
    run_node_client("ts_ext_tasks_client.mjs", "ext-tasks 0.2.2").await;
}

/// A 2026-07-28 request: `_meta` says the version and declares the tasks extension (unless
/// `declare` is false), the headers mirror the method and `name` (`Mcp-Name`: the tool or the
/// task id). The JSON-RPC response.
async fn modern(
    mcp: &str,
    token: &str,
    method: &str,
    name: &str,
    mut params: Value,
    declare: bool,
) -> Value {
    let extensions = match declare {
        true => json!({EXTENSION: {}}),
        false => json!({}),
    };
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
    });
    let mut c = client(mcp, token).await;
    let headers = [
        ("mcp-protocol-version", MODERN),
        ("mcp-method", method),
        ("mcp-name", name),
    ];
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    // A refusal comes with an HTTP error status in this era: the body is read either way.
    let (status, headers, body) = within(c.post_raw(body.to_string().into_bytes(), &headers))
        .await
        .unwrap();
    let sse = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let r = match sse {
        true => sled_sim::client::response_from_sse(&body, &json!(1)).unwrap(),
        false => serde_json::from_slice(&body).unwrap(),
    };
    assert_eq!(
        status == 200,
        r.get("result").is_some(),
        "HTTP {status} for {r}"
    );
    r
}

/// `subscriptions/listen` (2026-07-28, the extension declared) for `ids` as `token`.
async fn listen(addr: SocketAddr, token: &str, ids: &[&str]) -> sse::Events {
    let params = json!({"notifications": {"taskIds": ids}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
    }});
    open_listen_as(addr, params, Some(token)).await
}

/// A 2026-07-28 `tools/call` of `run_tests` on beta declaring the extension: the task's id.
async fn start_modern(mcp: &str) -> String {
    let r = modern(
        mcp,
        TOKEN_A,
        "tools/call",
        "run_tests",
        json!({"name": "run_tests", "arguments": {"project": "beta"}}),
        true,
    )
    .await;
    let res = &r["result"];
    assert_eq!(
        (res["resultType"].as_str(), res["status"].as_str()),
        (Some("task"), Some("working")),
        "{r}"
    );
    assert!(
        res["ttlMs"].is_u64() && res["pollIntervalMs"].is_u64(),
        "{r}"
    );
    res["taskId"].as_str().unwrap().to_owned()
}

/// 2026-07-28 `tasks/get` as token A through `mcp` until the task is terminal; the last answer.
async fn modern_until_terminal(mcp: &str, id: &str) -> Value {
    within(async {
        loop {
            let r = modern(mcp, TOKEN_A, "tasks/get", id, json!({"taskId": id}), true).await;
            assert_eq!(r["result"]["resultType"], "complete", "{r}");
            assert_eq!(r["result"]["taskId"], json!(id), "{r}");
            if r["result"]["status"] != "working" {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// The 2026-07-28 walk, token A making tasks through `make` and polling, listening and
/// cancelling through `poll` (the same gateway, or another replica of its cluster, where
/// `listen_at` is the replica holding beta's sled); token B sees none of them.
async fn modern_walk(fleet: &Fleet, make: &str, poll: &str, listen_at: SocketAddr) {
    // The first task: listened for, polled until its result comes inlined.
    run_tests_take(fleet, "beta", 2000);
    let first = start_modern(make).await;
    assert!(first.starts_with("mt1."), "{first}");
    let mut events = listen(listen_at, TOKEN_A, &[&first]).await;
    let ack = data(&next_event_with(&mut events, "acknowledged").await);
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([first]),
        "{ack}"
    );
    let done = modern_until_terminal(poll, &first).await;
    let r = &done["result"];
    assert_eq!(r["status"], "completed", "{done}");
    assert_eq!(
        r["result"]["structuredContent"]["project"], "beta",
        "{done}"
    );
    assert!(r["result"].get("_meta").is_none(), "{done}");
    // A 2026-07-28 CallToolResult (ext-tasks' schema refuses one without it).
    assert_eq!(r["result"]["resultType"], "complete", "{done}");
    let heard = data(&next_event_with(&mut events, "\"completed\"").await);
    assert_eq!(heard["method"], "notifications/tasks", "{heard}");
    assert_eq!(heard["params"]["taskId"], json!(first));
    assert_eq!(
        heard["params"]["result"]["structuredContent"]["project"],
        "beta"
    );

    // A second, cancelled while it runs; a third as long made after it.
    run_tests_take(fleet, "beta", 3000);
    let second = start_modern(make).await;
    let r = modern(
        poll,
        TOKEN_A,
        "tasks/cancel",
        &second,
        json!({"taskId": second}),
        true,
    )
    .await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    let third = start_modern(make).await;

    // Token B: unknown, whichever way it asks; its listener is told of none of them.
    for id in [&first, &second, &third] {
        for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
            let mut params = json!({"taskId": id});
            if method == "tasks/update" {
                params["inputResponses"] = json!({});
            }
            let r = modern(poll, TOKEN_B, method, id, params, true).await;
            assert_unknown_task(&r, &format!("token B {method}"));
        }
    }
    let mut theirs = listen(listen_at, TOKEN_B, &[&first, &second, &third]).await;
    let ack = data(&next_event_with(&mut theirs, "acknowledged").await);
    assert!(
        ack["params"]["notifications"]
            .get("taskIds")
            .is_none_or(|ids| ids == &json!([])),
        "none of A's tasks is acknowledged to B: {ack}"
    );
    // Token A without the extension declared: -32021.
    let r = modern(
        poll,
        TOKEN_A,
        "tasks/get",
        &first,
        json!({"taskId": first}),
        false,
    )
    .await;
    assert_eq!(r["error"]["code"], -32021, "{r}");

    // Once the third is done, the second is still cancelled.
    let done = modern_until_terminal(poll, &third).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let r = modern(
        poll,
        TOKEN_A,
        "tasks/get",
        &second,
        json!({"taskId": second}),
        true,
    )
    .await;
    assert_eq!(r["result"]["status"], "cancelled", "{r}");
    assert!(r["result"].get("result").is_none(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_clients_make_poll_and_cancel_tasks_by_mcp_name_and_another_token_sees_none() {
    let gateway = gateway_tests::Gateway::start(ServerOptions::new(registry(), [28; 32])).await;
    let fleet = Fleet::spawn(&gateway.base(), &["beta".to_owned()], sled_options());
    let mcp = gateway.url();
    wait_live(&mcp, &["beta"], None).await;
    modern_walk(&fleet, &mcp, &mcp, gateway.addr).await;
    fleet.shutdown().await;
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_made_through_one_replica_is_polled_and_cancelled_through_another() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    // beta's sled on r3; tasks made through r1, polled and cancelled through r2: each request
    // goes to beta's holder, found by the project in the task id.
    let mut r1 = Replica::start(&nats.url(), "r1", registry(), None);
    let mut r2 = Replica::start(&nats.url(), "r2", registry(), None);
    let mut r3 = Replica::start(&nats.url(), "r3", registry(), None);
    let fleet = Fleet::spawn(&r3.url(), &["beta".to_owned()], sled_options());
    wait_live(&r1.mcp(), &["beta"], Some("r3")).await;
    wait_live(&r2.mcp(), &["beta"], Some("r3")).await;
    modern_walk(&fleet, &r1.mcp(), &r2.mcp(), r3.addr).await;
    // 2025-11-25 (where-the-issues-meet §5): a session's task made through r1 is listed through
    // r2 (the session is the cluster's), its record being where beta's sled is; token B's
    // session lists none.
    let mut a = session(&r1.mcp(), TOKEN_A).await;
    let id = start(&mut a).await;
    let mut a2 = client(&r2.mcp(), TOKEN_A).await;
    a2.set_session_id(a.session_id().map(str::to_owned));
    assert_eq!(listed(&mut a2).await, std::slice::from_ref(&id));
    let mut b = session(&r2.mcp(), TOKEN_B).await;
    assert!(listed(&mut b).await.is_empty());
    assert_unknown_task(
        &ask(&mut b, "tasks/get", json!({"taskId": id})).await,
        "B's get",
    );
    fleet.shutdown().await;
    for r in [&mut r1, &mut r2, &mut r3] {
        r.stop().await;
    }
}

/// Every task `tasks/list` shows `c`, following `nextCursor` to the end.
async fn listed(c: &mut McpClient<TokioConnect>) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let r = ask(c, "tasks/list", params).await;
        let tasks = r["result"]["tasks"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"));
        ids.extend(
            tasks
                .iter()
                .filter_map(|t| t["taskId"].as_str().map(str::to_owned)),
        );
        match r["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return ids,
        }
    }
    panic!("tasks/list did not end within 20 pages");
}
