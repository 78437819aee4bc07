//! Tasks through the gateway (issue 27), both eras: ids sealed to their creator and routed
//! by the project in them, records for `tasks/list` and status notifications, progress that
//! outlives the creating call.

use serde_json::{json, Value};

use super::modern::{answer, modern};
use super::streams::get;
use super::Harness;
use crate::{HttpMethod, HttpToken, UplinkId};

fn tools() -> Value {
    json!([
        {"name":"run_tests","inputSchema":{"type":"object"},"execution":{"taskSupport":"optional"},"annotations":{"readOnlyHint":true}},
        {"name":"deploy","inputSchema":{"type":"object"},"execution":{"taskSupport":"required"}},
        {"name":"show","inputSchema":{"type":"object"}},
    ])
}

/// A sled for `project` whose tools may run as tasks.
fn connect(h: &mut Harness, project: &str) -> UplinkId {
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":project,"sled":project}),
    );
    let f = h.take_frames(u);
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":tools()}}),
    );
    u
}

fn task(id: &str, status: &str) -> Value {
    json!({"taskId":id,"status":status,"createdAt":"2026-12-07T10:00:00Z","lastUpdatedAt":"2026-12-07T10:00:00Z","ttl":60000,"pollInterval":500})
}

fn request(h: &mut Harness, session: &str, id: u64, method: &str, params: Value) -> HttpToken {
    let body = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
    h.send(HttpMethod::Post, Some(session), &body.to_string())
}

/// The one request the sled got since the last look.
fn one_frame(h: &mut Harness, u: UplinkId) -> Value {
    let mut f = h.take_frames(u);
    assert_eq!(f.len(), 1, "{f:?}");
    f.remove(0)
}

/// Starts `run_tests` on `project` as a task in `session` (asking for progress under
/// `progress`); the sled makes it with its own id `sled_id`. Returns the id the client sees.
fn start(
    h: &mut Harness,
    u: UplinkId,
    session: &str,
    project: &str,
    sled_id: &str,
    progress: Option<&str>,
) -> (String, Value) {
    let mut params =
        json!({"name":"run_tests","arguments":{"project":project},"task":{"ttl":60000}});
    if let Some(p) = progress {
        params["_meta"] = json!({"progressToken": p});
    }
    let t = request(h, session, 1, "tools/call", params);
    let f = one_frame(h, u);
    assert_eq!(f["params"]["task"], json!({"ttl":60000}), "{f}");
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"task":task(sled_id,"working")}}),
    );
    let r = h.reply_json(t).expect("answered");
    let id = r["result"]["task"]["taskId"].as_str().unwrap().to_owned();
    assert!(id.starts_with("mt1.") && id != sled_id, "{r}");
    assert_eq!(r["result"]["task"]["status"], "working");
    (id, f)
}

#[test]
fn a_task_id_routes_to_its_project_and_opens_only_for_its_session() {
    let mut h = Harness::new();
    let beta = connect(&mut h, "beta");
    let gamma = connect(&mut h, "gamma");
    let s1 = h.initialize();
    let s2 = h.initialize();
    // The same sled id in two projects: two tasks, two ids.
    let (in_beta, _) = start(&mut h, beta, &s1, "beta", "t1", None);
    let (in_gamma, _) = start(&mut h, gamma, &s1, "gamma", "t1", None);
    assert_ne!(in_beta, in_gamma);

    for (id, u) in [(&in_beta, beta), (&in_gamma, gamma)] {
        let t = request(&mut h, &s1, 2, "tasks/get", json!({"taskId": id}));
        let f = one_frame(&mut h, u);
        assert_eq!(
            (f["method"].as_str(), &f["params"]["taskId"]),
            (Some("tasks/get"), &json!("t1"))
        );
        assert!(h
            .take_frames(if u == beta { gamma } else { beta })
            .is_empty());
        h.sled_says(
            u,
            json!({"jsonrpc":"2.0","id":f["id"],"result":task("t1","working")}),
        );
        let r = h.reply_json(t).unwrap();
        assert_eq!(r["result"]["taskId"], json!(id), "{r}");
    }

    // Another session, the sled's own id, an altered id: an unknown task, nothing sent.
    let mut altered = in_beta.clone();
    altered.pop();
    altered.push(if in_beta.ends_with('A') { 'B' } else { 'A' });
    for (session, id) in [
        (&s2, in_beta.as_str()),
        (&s1, "t1"),
        (&s1, altered.as_str()),
    ] {
        for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
            let t = request(&mut h, session, 3, method, json!({"taskId": id}));
            let r = h.reply_json(t).expect("at once");
            assert_eq!(r["error"]["code"], -32602, "{method} {r}");
            assert_eq!(r["error"]["data"]["kind"], "unknown_task");
        }
    }
    assert!(h.take_frames(beta).is_empty() && h.take_frames(gamma).is_empty());
}

#[test]
fn status_notifications_and_late_progress_reach_only_the_creator() {
    let mut h = Harness::new();
    let beta = connect(&mut h, "beta");
    let s1 = h.initialize();
    let s2 = h.initialize();
    let g1 = get(&mut h, Some(&s1), None);
    let g2 = get(&mut h, Some(&s2), None);
    let (id, f) = start(&mut h, beta, &s1, "beta", "t7", Some("mine"));
    let token = f["params"]["_meta"]["progressToken"].clone();
    assert!(token.as_str().unwrap().starts_with("gw-"), "{f}");
    // Progress after the CreateTaskResult: to the creator's stream, under its own token.
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":token,"progress":1,"total":2,"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t7"}}}}),
    );
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/tasks/status","params":task("t7","completed")}),
    );
    // Progress after the task is terminal is not relayed.
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":token,"progress":2,"total":2}}),
    );
    let seen: Vec<Value> = h.streams[&g1].iter().map(|(_, v)| v.clone()).collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0]["method"], "notifications/progress");
    assert_eq!(seen[0]["params"]["progressToken"], "mine");
    assert_eq!(
        seen[0]["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(id),
        "the sled's own id stays at the gateway"
    );
    assert_eq!(seen[1]["method"], "notifications/tasks/status");
    assert_eq!(seen[1]["params"]["taskId"], json!(id));
    assert_eq!(seen[1]["params"]["status"], "completed");
    assert!(h.streams.get(&g2).is_none_or(Vec::is_empty));
}

#[test]
fn tasks_list_walks_the_callers_projects_and_shows_only_its_tasks() {
    let mut h = Harness::new();
    let beta = connect(&mut h, "beta");
    let gamma = connect(&mut h, "gamma");
    let s1 = h.initialize();
    let s2 = h.initialize();
    let (mine_beta, _) = start(&mut h, beta, &s1, "beta", "b1", None);
    let (_theirs, _) = start(&mut h, beta, &s2, "beta", "b2", None);
    let (mine_gamma, _) = start(&mut h, gamma, &s1, "gamma", "g1", None);

    // Page 1: beta, whose sled lists both sessions' tasks and has more.
    let t = request(&mut h, &s1, 4, "tasks/list", json!({}));
    let f = one_frame(&mut h, beta);
    assert_eq!(f["method"], "tasks/list");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"tasks":[task("b1","working"),task("b2","working")],"nextCursor":"p2"}}),
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["result"]["tasks"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["result"]["tasks"][0]["taskId"], json!(mine_beta));
    let cursor = r["result"]["nextCursor"].as_str().unwrap().to_owned();
    // Page 2: beta again, from the sled's cursor; then the cursor moves on to gamma.
    let t = request(&mut h, &s1, 5, "tasks/list", json!({"cursor": cursor}));
    let f = one_frame(&mut h, beta);
    assert_eq!(f["params"]["cursor"], "p2");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"tasks":[]}}),
    );
    let r = h.reply_json(t).unwrap();
    let cursor = r["result"]["nextCursor"].as_str().unwrap().to_owned();
    let t = request(&mut h, &s1, 6, "tasks/list", json!({"cursor": cursor}));
    let f = one_frame(&mut h, gamma);
    h.sled_says(
        gamma,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"tasks":[task("g1","completed")]}}),
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["result"]["tasks"][0]["taskId"], json!(mine_gamma));
    assert!(r["result"].get("nextCursor").is_none(), "{r}");

    // A session with no tasks: an empty list, asked of no sled, also from another's cursor
    // (which names only a project). A cursor not made here: refused.
    let s3 = h.initialize();
    let t = request(&mut h, &s3, 7, "tasks/list", json!({}));
    assert_eq!(h.reply_json(t).unwrap()["result"], json!({"tasks":[]}));
    let t = request(&mut h, &s3, 8, "tasks/list", json!({"cursor": cursor}));
    assert_eq!(h.reply_json(t).unwrap()["result"], json!({"tasks":[]}));
    let t = request(&mut h, &s3, 9, "tasks/list", json!({"cursor": "bm9wZQ"}));
    assert_eq!(h.reply_json(t).unwrap()["error"]["code"], -32602);
    assert!(h.take_frames(beta).is_empty() && h.take_frames(gamma).is_empty());
}

#[test]
fn a_task_of_a_tool_that_cannot_run_as_one_is_refused_unsent() {
    let mut h = Harness::new();
    let beta = connect(&mut h, "beta");
    let s = h.initialize();
    let t = request(
        &mut h,
        &s,
        1,
        "tools/call",
        json!({"name":"show","arguments":{"project":"beta"},"task":{}}),
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["code"], -32601, "{r}");
    assert_eq!(r["error"]["data"]["kind"], "task_not_supported");
    let t = request(
        &mut h,
        &s,
        2,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"},"task":5}),
    );
    assert_eq!(h.reply_json(t).unwrap()["error"]["code"], -32602);
    assert!(h.take_frames(beta).is_empty());
    // The capability is declared at initialize.
    let r = h.post(
        None,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
    );
    let v: Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
    assert_eq!(
        v["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"],
        json!({})
    );
}

fn declared() -> Value {
    json!({"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}})
}

#[test]
fn stateless_tasks_are_made_polled_and_finished_in_the_extensions_shapes() {
    let mut h = Harness::new();
    let beta = connect(&mut h, "beta");
    // Declared: a task, in the extension's shape.
    let t = modern(
        &mut h,
        1,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"},"_meta":declared()}),
        &|_| {},
    );
    let f = one_frame(&mut h, beta);
    assert!(f["params"]["task"]["ttl"].is_u64(), "{f}");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"task":task("t1","working")}}),
    );
    let (status, r) = answer(&mut h, t);
    assert_eq!(status, 200);
    let r = &r["result"];
    assert_eq!(
        (r["resultType"].as_str(), r["status"].as_str()),
        (Some("task"), Some("working")),
        "{r}"
    );
    assert_eq!(
        (r["ttlMs"].as_u64(), r["pollIntervalMs"].as_u64()),
        (Some(60000), Some(500))
    );
    assert!(r.get("ttl").is_none() && r.get("task").is_none());
    let id = r["taskId"].as_str().unwrap().to_owned();

    let get_it = |h: &mut Harness, n: u64| {
        let name = id.clone();
        modern(
            h,
            n,
            "tasks/get",
            json!({"taskId": id, "_meta": declared()}),
            &move |r| r.mcp_name = Some(name.clone()),
        )
    };
    // Working: the task as the sled says, made modern.
    let t = get_it(&mut h, 2);
    let f = one_frame(&mut h, beta);
    assert_eq!(
        (f["method"].as_str(), &f["params"]["taskId"]),
        (Some("tasks/get"), &json!("t1"))
    );
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":task("t1","working")}),
    );
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["result"]["resultType"], "complete");
    assert_eq!(r["result"]["taskId"], json!(id));
    assert!(r["result"].get("result").is_none());
    // Completed: the result is fetched and inlined.
    let t = get_it(&mut h, 3);
    let f = one_frame(&mut h, beta);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":task("t1","completed")}),
    );
    let f = one_frame(&mut h, beta);
    assert_eq!(
        (f["method"].as_str(), &f["params"]["taskId"]),
        (Some("tasks/result"), &json!("t1"))
    );
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"content":[{"type":"text","text":"42 passed"}],"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t1"}}}}),
    );
    let (_, r) = answer(&mut h, t);
    let r = &r["result"];
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["result"]["content"][0]["text"], "42 passed");
    // A 2026-07-28 CallToolResult, as the extension's DetailedTask holds one.
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert!(
        r["result"].get("_meta").is_none(),
        "the sled's id stays at the gateway: {r}"
    );

    // Cancel: an empty acknowledgement.
    let name = id.clone();
    let t = modern(
        &mut h,
        4,
        "tasks/cancel",
        json!({"taskId": id, "_meta": declared()}),
        &move |r| r.mcp_name = Some(name.clone()),
    );
    let f = one_frame(&mut h, beta);
    assert_eq!(f["method"], "tasks/cancel");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":task("t1","cancelled")}),
    );
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["result"]["resultType"], "complete");
}

#[test]
fn stateless_refusals_without_the_extension_or_with_a_wrong_mcp_name() {
    let mut h = Harness::new();
    let beta = connect(&mut h, "beta");
    // Not declared: an optional tool runs as a plain call; a required one is -32021.
    let t = modern(
        &mut h,
        1,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"}}),
        &|_| {},
    );
    let f = one_frame(&mut h, beta);
    assert!(f["params"].get("task").is_none(), "{f}");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"content":[]}}),
    );
    assert_eq!(answer(&mut h, t).1["result"]["resultType"], "complete");
    let t = modern(
        &mut h,
        2,
        "tools/call",
        json!({"name":"deploy","arguments":{"project":"beta"}}),
        &|_| {},
    );
    let (_, r) = answer(&mut h, t);
    assert_eq!(r["error"]["code"], -32021, "{r}");
    assert_eq!(
        r["error"]["data"]["requiredCapabilities"],
        json!({"extensions":{"io.modelcontextprotocol/tasks":{}}})
    );
    // tasks/get without the extension; with it but a wrong Mcp-Name.
    let t = modern(&mut h, 3, "tasks/get", json!({"taskId":"x"}), &|r| {
        r.mcp_name = Some("x".into())
    });
    assert_eq!(answer(&mut h, t).1["error"]["code"], -32021);
    let t = modern(
        &mut h,
        4,
        "tasks/get",
        json!({"taskId":"x","_meta":declared()}),
        &|r| r.mcp_name = Some("y".into()),
    );
    assert_eq!(
        answer(&mut h, t).1["error"]["data"]["kind"],
        "header_mismatch"
    );
    let t = modern(
        &mut h,
        5,
        "tasks/get",
        json!({"taskId":"x","_meta":declared()}),
        &|r| r.mcp_name = Some("x".into()),
    );
    assert_eq!(answer(&mut h, t).1["error"]["data"]["kind"], "unknown_task");
    assert!(h.take_frames(beta).is_empty());
    // Discovery offers the extension only to a request that declares it.
    let t = modern(&mut h, 6, "server/discover", json!({}), &|_| {});
    assert!(answer(&mut h, t).1["result"]["capabilities"]
        .get("extensions")
        .is_none());
    let t = modern(
        &mut h,
        7,
        "server/discover",
        json!({"_meta":declared()}),
        &|_| {},
    );
    assert_eq!(
        answer(&mut h, t).1["result"]["capabilities"]["extensions"],
        json!({"io.modelcontextprotocol/tasks":{}})
    );
}

#[test]
fn stateless_listeners_get_their_own_tasks_notifications_with_the_result() {
    let mut h = Harness::new();
    let beta = connect(&mut h, "beta");
    let t = modern(
        &mut h,
        1,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"},"_meta":declared()}),
        &|_| {},
    );
    let f = one_frame(&mut h, beta);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"task":task("t1","working")}}),
    );
    let id = answer(&mut h, t).1["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    // A session's task id does not open for a stateless caller.
    let s = h.initialize();
    let (theirs, _) = start(&mut h, beta, &s, "beta", "t2", None);

    let l = modern(
        &mut h,
        2,
        "subscriptions/listen",
        json!({"notifications":{"taskIds":[id, theirs]},"_meta":declared()}),
        &|_| {},
    );
    let events =
        |h: &Harness| -> Vec<Value> { h.streams[&l].iter().map(|(_, v)| v.clone()).collect() };
    let ack = &events(&h)[0];
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );

    for (sled_id, status) in [("t2", "completed"), ("t1", "working"), ("t1", "completed")] {
        h.sled_says(
            beta,
            json!({"jsonrpc":"2.0","method":"notifications/tasks/status","params":task(sled_id,status)}),
        );
    }
    // The gateway fetches the finished task's result for its listener (the other task has
    // none here).
    let f = one_frame(&mut h, beta);
    assert_eq!(
        (f["method"].as_str(), &f["params"]["taskId"]),
        (Some("tasks/result"), &json!("t1"))
    );
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"content":[{"type":"text","text":"ok"}]}}),
    );
    let got: Vec<Value> = events(&h)
        .into_iter()
        .skip(1)
        .filter(|e| e["method"] == "notifications/tasks")
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (
            got[0]["params"]["status"].as_str(),
            &got[0]["params"]["taskId"]
        ),
        (Some("working"), &json!(id))
    );
    assert_eq!(got[1]["params"]["status"], "completed");
    assert_eq!(got[1]["params"]["result"]["content"][0]["text"], "ok");
    assert_eq!(got[1]["params"]["result"]["resultType"], "complete");
    assert!(got[1]["params"]["ttlMs"].is_u64());

    // Without the extension: -32021.
    let t = modern(
        &mut h,
        3,
        "subscriptions/listen",
        json!({"notifications":{"taskIds":[id]}}),
        &|_| {},
    );
    assert_eq!(answer(&mut h, t).1["error"]["code"], -32021);
}

/// A single gateway with a store: a task is answered once its record is durable, and after a
/// restart the record comes back: `tasks/list` still shows the task to its creator only.
#[test]
fn with_a_store_a_task_is_answered_once_its_record_is_durable_and_listed_after_a_restart() {
    use crate::cluster::{ClusterAction, ClusterEvent};
    use crate::coord::StoredRecord;
    use crate::{Config, Input};
    let single = || {
        let config = Config {
            store_sessions: true,
            ..Config::default()
        };
        Harness::with_config(&["alpha", "beta"], Some("alpha"), config, [5; 32])
    };
    let mut h = single();
    let beta = connect(&mut h, "beta");
    // A session, made durable (its write answered).
    let t = h.send(
        HttpMethod::Post,
        None,
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
    );
    let mut session_record = None;
    let mut s = String::new();
    for a in std::mem::take(&mut h.cluster) {
        if let ClusterAction::StoreSession { session, record } = a {
            s = session.clone();
            session_record = record;
            h.handle(Input::Cluster(ClusterEvent::SessionStored {
                session,
                written: true,
            }));
        }
    }
    assert_eq!(h.replies.remove(&t).unwrap().status, 200);
    h.cluster.clear();

    let t = request(
        &mut h,
        &s,
        1,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"},"task":{"ttl":60000}}),
    );
    let f = one_frame(&mut h, beta);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"task":task("t1","working")}}),
    );
    assert!(
        !h.replies.contains_key(&t),
        "not before the record is durable"
    );
    let mut stored = Vec::new();
    for a in std::mem::take(&mut h.cluster) {
        if let ClusterAction::StoreCoord { batch, changes } = a {
            stored.extend(
                changes
                    .into_iter()
                    .filter(|c| crate::tasks::is_record_key(&c.key)),
            );
            h.handle(Input::Cluster(ClusterEvent::CoordStored {
                batch,
                failed: Vec::new(),
            }));
        }
    }
    assert_eq!(stored.len(), 1, "{stored:?}");
    let id = h.reply_json(t).unwrap()["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();

    // Another process, the same store and secret.
    let mut h = single();
    h.gw.restore_coordination(
        h.now,
        stored
            .into_iter()
            .map(|c| StoredRecord {
                key: c.key,
                value: c.value.unwrap(),
                age: std::time::Duration::from_secs(1),
            })
            .collect(),
    );
    let beta = connect(&mut h, "beta");
    let t = request(&mut h, &s, 2, "tasks/list", json!({}));
    h.handle(Input::Cluster(ClusterEvent::SessionLoaded {
        session: s.clone(),
        record: Ok(session_record),
        under_previous_secret: false,
    }));
    let f = one_frame(&mut h, beta);
    assert_eq!(f["method"], "tasks/list");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"tasks":[task("t1","working"),task("t9","working")]}}),
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["result"]["tasks"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["result"]["tasks"][0]["taskId"], json!(id));
}

/// `aggregate_pipeline_status` as a task of the gateway's own: answered at once with a task,
/// its result waited for by `tasks/result`, listed, cancelled, and its creator's alone.
#[test]
fn the_gateways_own_fanout_runs_as_a_task() {
    let mut h = Harness::new();
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta"}),
    );
    let f = h.take_frames(u);
    let mut listed = tools();
    listed
        .as_array_mut()
        .unwrap()
        .push(json!({"name":"pipeline_status","inputSchema":{"type":"object"}}));
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":listed}}),
    );
    let s1 = h.initialize();
    let s2 = h.initialize();
    let g1 = get(&mut h, Some(&s1), None);
    let aggregate = |h: &mut Harness, n: u64| {
        let t = request(
            h,
            &s1,
            n,
            "tools/call",
            json!({"name":"aggregate_pipeline_status","arguments":{},"task":{"ttl":60000}}),
        );
        let r = h.reply_json(t).expect("answered at once, with a task");
        assert_eq!(r["result"]["task"]["status"], "working", "{r}");
        r["result"]["task"]["taskId"].as_str().unwrap().to_owned()
    };
    let id = aggregate(&mut h, 1);
    let ask = one_frame(&mut h, u);
    assert_eq!(ask["params"]["name"], "pipeline_status");

    let waiting = request(&mut h, &s1, 2, "tasks/result", json!({"taskId": id}));
    assert!(!h.replies.contains_key(&waiting), "waits for the fan-out");
    // Another wait whose client goes away is forgotten then: nothing is answered to it.
    let gone = request(&mut h, &s1, 11, "tasks/result", json!({"taskId": id}));
    h.handle(crate::Input::HttpAborted { token: gone });
    let t = request(&mut h, &s1, 3, "tasks/get", json!({"taskId": id}));
    assert_eq!(h.reply_json(t).unwrap()["result"]["status"], "working");
    let t = request(&mut h, &s2, 4, "tasks/get", json!({"taskId": id}));
    assert_eq!(
        h.reply_json(t).unwrap()["error"]["data"]["kind"],
        "unknown_task"
    );

    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":ask["id"],"result":{"content":[],"structuredContent":{"stages":{"backlog":1,"in_progress":0,"review":0,"done":2},"blocked":[],"failing":[]}}}),
    );
    let r = h
        .reply_json(waiting)
        .expect("answered when the fan-out ends");
    assert!(
        !h.replies.contains_key(&gone),
        "answered a wait whose client went away"
    );
    assert!(
        r["result"]["structuredContent"]["projects"].is_object()
            || r["result"]["structuredContent"].is_object(),
        "{r}"
    );
    assert_eq!(
        r["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(id)
    );
    let told: Vec<&Value> = h.streams[&g1]
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["method"] == "notifications/tasks/status")
        .collect();
    assert_eq!(told.len(), 1);
    assert_eq!(
        (
            told[0]["params"]["taskId"].as_str(),
            told[0]["params"]["status"].as_str()
        ),
        (Some(id.as_str()), Some("completed"))
    );
    assert!(told[0]["params"]["createdAt"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    // A second one, cancelled: its sled's part is cancelled too, and it has no result.
    let second = aggregate(&mut h, 5);
    let ask = one_frame(&mut h, u);
    let t = request(&mut h, &s1, 6, "tasks/cancel", json!({"taskId": second}));
    assert_eq!(h.reply_json(t).unwrap()["result"]["status"], "cancelled");
    let f = one_frame(&mut h, u);
    assert_eq!(
        (f["method"].as_str(), &f["params"]["requestId"]),
        (Some("notifications/cancelled"), &ask["id"])
    );
    let t = request(&mut h, &s1, 7, "tasks/result", json!({"taskId": second}));
    assert_eq!(
        h.reply_json(t).unwrap()["error"]["data"]["kind"],
        "task_cancelled"
    );
    let t = request(&mut h, &s1, 8, "tasks/cancel", json!({"taskId": second}));
    assert_eq!(h.reply_json(t).unwrap()["error"]["code"], -32602);

    // Both listed for their creator (first, before the projects' tasks), none for another.
    let t = request(&mut h, &s1, 9, "tasks/list", json!({}));
    let r = h.reply_json(t).unwrap();
    let ids: Vec<&str> = r["result"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["taskId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{r}");
    assert!(ids.contains(&id.as_str()) && ids.contains(&second.as_str()));
    let t = request(&mut h, &s2, 10, "tasks/list", json!({}));
    assert_eq!(h.reply_json(t).unwrap()["result"]["tasks"], json!([]));
}

/// Client-hosted tasks (2025-11-25): a sled's sampling sent with `task` reaches the client of
/// its call, which runs it as a task of its own; the sled polls it through the gateway while
/// its call lasts, and only a client that declared `tasks` is asked.
#[test]
fn a_sleds_sampling_as_a_task_is_relayed_to_its_client_and_polled() {
    let mut h = Harness::new();
    let r = h.post(
        None,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{},"tasks":{"requests":{"sampling":{"createMessage":{}}}}},"clientInfo":{"name":"t","version":"0"}}}),
    );
    let s = r
        .headers
        .iter()
        .find(|(n, _)| *n == "Mcp-Session-Id")
        .unwrap()
        .1
        .clone();
    let plain = h.initialize();
    let beta = connect(&mut h, "beta");
    for (session, can) in [(&s, true), (&plain, false)] {
        let t = request(
            &mut h,
            session,
            1,
            "tools/call",
            json!({"name":"show","arguments":{"project":"beta"}}),
        );
        let call = one_frame(&mut h, beta);
        let meta = json!({"io.mcp-gateway/relatedRequest": call["id"]});
        h.sled_says(
            beta,
            json!({"jsonrpc":"2.0","id":"s-1","method":"sampling/createMessage","params":{"messages":[],"maxTokens":5,"task":{"ttl":1000},"_meta":meta}}),
        );
        if can {
            let ask = h.streams[&t].last().unwrap().1.clone();
            assert_eq!(ask["params"]["task"], json!({"ttl":1000}), "{ask}");
            h.post(
                Some(session),
                json!({"jsonrpc":"2.0","id":ask["id"],"result":{"task":task("c-1","working")}}),
            );
            assert_eq!(one_frame(&mut h, beta)["result"]["task"]["taskId"], "c-1");
        } else {
            h.take_frames(beta);
        }
        h.sled_says(
            beta,
            json!({"jsonrpc":"2.0","id":"s-2","method":"tasks/get","params":{"taskId":"c-1","_meta":meta}}),
        );
        if can {
            let ask = h.streams[&t].last().unwrap().1.clone();
            assert_eq!(
                (ask["method"].as_str(), &ask["params"]["taskId"]),
                (Some("tasks/get"), &json!("c-1"))
            );
            h.post(
                Some(session),
                json!({"jsonrpc":"2.0","id":ask["id"],"result":task("c-1","completed")}),
            );
            let back = one_frame(&mut h, beta);
            assert_eq!(
                (back["id"].as_str(), back["result"]["status"].as_str()),
                (Some("s-2"), Some("completed"))
            );
        } else {
            let back = one_frame(&mut h, beta);
            assert_eq!(back["error"]["code"], -32601, "{back}");
        }
        h.sled_says(
            beta,
            json!({"jsonrpc":"2.0","id":call["id"],"result":{"content":[]}}),
        );
    }
}

#[test]
fn a_task_asked_for_before_the_sleds_tools_are_listed_waits_for_the_listing() {
    let mut h = Harness::new();
    // beta's sled is connected; the gateway's tools/list to it is not answered yet.
    let beta = h.open_uplink();
    h.sled_says(
        beta,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta"}),
    );
    let f = h.take_frames(beta);
    let listing = f
        .iter()
        .find(|m| m["method"] == "tools/list")
        .expect("the gateway lists the sled's tools")["id"]
        .clone();
    let s = h.initialize();
    // Whether run_tests may run as a task is not known yet: neither era's call is refused,
    // run as a plain call, or sent.
    let handshake = request(
        &mut h,
        &s,
        1,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"},"task":{"ttl":60000}}),
    );
    let stateless = modern(
        &mut h,
        2,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"},"_meta":declared()}),
        &|_| {},
    );
    assert!(h.reply_json(handshake).is_none() && h.reply_json(stateless).is_none());
    assert!(h.take_frames(beta).is_empty());
    // Listed: both go to the sled as tasks.
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":listing,"result":{"tools":tools()}}),
    );
    let sent = h.take_frames(beta);
    let calls: Vec<&Value> = sent
        .iter()
        .filter(|m| m["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2, "{sent:?}");
    assert!(
        calls.iter().all(|c| c["params"]["task"]["ttl"].is_u64()),
        "{calls:?}"
    );
}

/// `tasks/*` asks the caller now for the right the creating call needed: a reload that takes
/// the project away ends access to its tasks (answered as unknown), and one that leaves only
/// `read` ends access to a writing tool's task (forbidden).
#[test]
fn a_reload_that_takes_the_project_or_the_right_away_ends_access_to_its_tasks() {
    use crate::{Gateway, Input, Registry};
    const ALICE: &str = "alice-token-0123456789";
    let file = |projects: &str, right: &str| {
        Registry::parse(
            "projects.toml",
            &format!(
                "default = \"alpha\"\n\
                 client_tokens = [{{ name = \"alice\", token = \"{ALICE}\" }}]\n\
                 [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n\
                 [[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9102\"\n\
                 [[access]]\ntoken = \"alice\"\nprojects = {projects}\nright = \"{right}\"\n"
            ),
        )
        .unwrap()
        .allowing_unauthenticated_uplinks()
    };
    let mut h = Harness::new();
    h.gw = Gateway::new(
        file("[\"alpha\", \"beta\"]", "write"),
        crate::Config::default(),
        [4; 32],
    );
    let beta = connect(&mut h, "beta");
    let bearer = |r: &mut crate::HttpRequest| r.authorization = Some(format!("Bearer {ALICE}"));
    let t = modern(
        &mut h,
        1,
        "tools/call",
        json!({"name":"deploy","arguments":{"project":"beta"},"_meta":declared()}),
        &bearer,
    );
    let f = one_frame(&mut h, beta);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"task":task("t1","working")}}),
    );
    let id = answer(&mut h, t).1["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(id.starts_with("mt1.") && id.contains(".w."), "{id}");
    let get = |h: &mut Harness| {
        let name = id.clone();
        let t = modern(
            h,
            2,
            "tasks/get",
            json!({"taskId": id, "_meta": declared()}),
            &move |r| {
                r.authorization = Some(format!("Bearer {ALICE}"));
                r.mcp_name = Some(name.clone());
            },
        );
        answer(h, t).1
    };
    // Only read on beta now: a writing tool's task is forbidden, nothing sent.
    h.handle(Input::Reload {
        registry: file("[\"alpha\", \"beta\"]", "read"),
    });
    assert_eq!(get(&mut h)["error"]["data"]["kind"], "forbidden");
    assert!(h.take_frames(beta).is_empty());
    // beta gone from alice's projects: as if the task never existed.
    h.handle(Input::Reload {
        registry: file("[\"alpha\"]", "write"),
    });
    assert_eq!(get(&mut h)["error"]["data"]["kind"], "unknown_task");
    assert!(h.take_frames(beta).is_empty());
    // Given back: reachable again.
    h.handle(Input::Reload {
        registry: file("[\"alpha\", \"beta\"]", "write"),
    });
    let t = {
        let name = id.clone();
        modern(
            &mut h,
            3,
            "tasks/get",
            json!({"taskId": id, "_meta": declared()}),
            &move |r| {
                r.authorization = Some(format!("Bearer {ALICE}"));
                r.mcp_name = Some(name.clone());
            },
        )
    };
    let f = one_frame(&mut h, beta);
    assert_eq!(f["method"], "tasks/get");
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":task("t1","working")}),
    );
    assert_eq!(answer(&mut h, t).1["result"]["status"], "working");
}

/// A sled that makes a task of a call that asked for none (no `task`, or a stateless request
/// without the extension) is answered as a bad response: the client never sees a task it
/// cannot handle.
#[test]
fn a_task_nobody_asked_for_is_a_bad_sled_response() {
    let mut h = Harness::new();
    let beta = connect(&mut h, "beta");
    let s = h.initialize();
    let t = request(
        &mut h,
        &s,
        1,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"}}),
    );
    let f = one_frame(&mut h, beta);
    assert!(f["params"].get("task").is_none());
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"task":task("t1","working")}}),
    );
    let r = h.reply_json(t).unwrap();
    assert_eq!(r["error"]["data"]["kind"], "bad_sled_response", "{r}");
    let t = modern(
        &mut h,
        2,
        "tools/call",
        json!({"name":"run_tests","arguments":{"project":"beta"}}),
        &|_| {},
    );
    let f = one_frame(&mut h, beta);
    h.sled_says(
        beta,
        json!({"jsonrpc":"2.0","id":f["id"],"result":{"task":task("t2","working")}}),
    );
    assert_eq!(
        answer(&mut h, t).1["error"]["data"]["kind"],
        "bad_sled_response"
    );
    // A result that merely mentions a taskId is a result.
    let t = request(
        &mut h,
        &s,
        3,
        "tools/call",
        json!({"name":"show","arguments":{"project":"beta"}}),
    );
    let f = one_frame(&mut h, beta);
    h.sled_says(beta, json!({"jsonrpc":"2.0","id":f["id"],"result":{"content":[{"type":"text","text":"\"taskId\""}],"structuredContent":{"taskId":"x"}}}));
    assert!(h.reply_json(t).unwrap()["result"]["content"].is_array());
}

/// In a cluster, a replica's own task (`aggregate_pipeline_status`) is kept in the engine and
/// read back when the replica starts again (same name, same engine): its result still answers
/// `tasks/get` after the restart.
#[test]
fn a_replicas_own_task_answers_after_the_replica_restarts() {
    let mut r1 = super::cluster::replica("r1");
    let t = modern(
        &mut r1,
        1,
        "tools/call",
        json!({"name":"aggregate_pipeline_status","arguments":{"timeout_ms":50},"_meta":declared()}),
        &|_| {},
    );
    let (status, created) = answer(&mut r1, t);
    assert_eq!(status, 200, "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_owned();
    // No sled anywhere: the fan-out ends at its deadline.
    r1.advance(std::time::Duration::from_millis(100));
    let poll = |h: &mut Harness| {
        let name = id.clone();
        let t = modern(
            h,
            2,
            "tasks/get",
            json!({"taskId": id, "_meta": declared()}),
            &move |r| r.mcp_name = Some(name.clone()),
        );
        answer(h, t).1
    };
    let before = poll(&mut r1);
    assert_eq!(before["result"]["status"], "completed", "{before}");
    // The replica starts again, on the same engine.
    let bucket = r1.coord_bucket.clone();
    let mut again = super::cluster::replica("r1");
    again.coord_bucket = bucket.clone();
    // Its first input (any) carries out the read it asked for when it was made.
    let t = modern(&mut again, 9, "server/discover", json!({}), &|_| {});
    answer(&mut again, t);
    let after = poll(&mut again);
    assert_eq!(after["result"]["status"], "completed", "{after}");
    assert_eq!(after["result"]["result"], before["result"]["result"]);
    // Another replica reads no other's: there the id is relayed to r1, never served.
    let mut r2 = super::cluster::replica("r2");
    r2.coord_bucket = bucket;
    let t = {
        let name = id.clone();
        modern(
            &mut r2,
            3,
            "tasks/get",
            json!({"taskId": id, "_meta": declared()}),
            &move |r| r.mcp_name = Some(name.clone()),
        )
    };
    assert!(!r2.replies.contains_key(&t), "relayed, not answered here");
}
