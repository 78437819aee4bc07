//! A single gateway's state directory (issue 25), over the real binaries: `gateway serve`
//! keeps its sessions in `--state-dir` (the embedded store), so a session survives a restart,
//! graceful (SIGTERM) or not (`kill -9`), and so do the coordination writes it acknowledged,
//! under load too; a state file it cannot use stops it at start, naming the file; and the hot
//! path stays off the disk (a plain `tools/call` writes nothing), counted on the real store in
//! process.
//!
//! `kill -9` leaves the page cache to the kernel, so these tests cannot tell a store that
//! syncs from one that does not; `engine_contract.rs`'s power cut on a simulated disk does.

#[path = "support/processes.rs"]
mod processes;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gateway_client::{ClientError, McpClient, TokioConnect};
use gateway_server::store::redb::RedbStore;
use gateway_server::ServerOptions;
use gateway_tests::coord_load::Load;
use gateway_tests::hooked_store::HookedStore;
use processes::{SingleGateway, SLED_TOKEN};
use serde_json::{json, Value};

fn projects_toml() -> String {
    format!(
        "default = \"alpha\"\n\
         [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{SLED_TOKEN}\"\n\
         [[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{SLED_TOKEN}\"\n"
    )
}

/// The session's default project, as `list_projects` says (a gateway tool: no sled needed).
async fn active(client: &mut McpClient<TokioConnect>) -> Result<Value, ClientError> {
    let r = client
        .tools_call(json!(1), "list_projects", json!({}))
        .await?;
    Ok(r["result"]["structuredContent"]["active"].clone())
}

/// `whoami` without `project` (the session's default's sled), until its sled is back after a
/// restart: the project that answered.
async fn whoami(client: &mut McpClient<TokioConnect>, gw: &SingleGateway) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = client.tools_call(json!(2), "whoami", json!({})).await;
        if let Ok(r) = &r {
            if r["result"]["structuredContent"]["project"].is_string() {
                return r["result"]["structuredContent"]["project"].clone();
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "whoami never answered: {r:?}\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn switch(client: &mut McpClient<TokioConnect>, project: &str) {
    let r = client
        .tools_call(json!(3), "switch_project", json!({ "project": project }))
        .await
        .expect("switched");
    assert!(r.get("error").is_none(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_survives_sigterm_and_kill_9_of_a_single_gateway() {
    let mut gw = SingleGateway::start(&projects_toml()).await;
    let _sleds = processes::sled_sim(&gw.url(), &["alpha", "beta"], 0);
    let mut client = McpClient::connect(TokioConnect, &format!("{}/mcp", gw.url()))
        .await
        .expect("connects");
    client.initialize().await.expect("a session");
    let session = client.session_id().expect("a session id").to_owned();
    switch(&mut client, "beta").await;
    assert_eq!(whoami(&mut client, &gw).await, "beta");

    // Graceful: SIGTERM, and the same session carries on where it was, with no initialize.
    gw.terminate().await;
    gw.restart().await;
    assert_eq!(client.session_id(), Some(session.as_str()));
    assert_eq!(
        active(&mut client).await.expect("the session is known"),
        "beta",
        "{}",
        gw.log()
    );
    assert_eq!(whoami(&mut client, &gw).await, "beta");

    // Not graceful: a switch acknowledged, then kill -9 at once.
    switch(&mut client, "alpha").await;
    gw.kill9().await;
    gw.restart().await;
    assert_eq!(
        active(&mut client).await.expect("the session is known"),
        "alpha",
        "{}",
        gw.log()
    );
    assert_eq!(whoami(&mut client, &gw).await, "alpha");

    // What kept it is the state directory: a session it never had is unknown, and one ended
    // stays ended across a restart.
    let mut stranger = McpClient::connect(TokioConnect, &format!("{}/mcp", gw.url()))
        .await
        .expect("connects");
    stranger.set_session_id(Some("0123456789abcdef0123456789abcdef".into()));
    assert!(
        matches!(
            active(&mut stranger).await,
            Err(ClientError::Http { status: 404, .. })
        ),
        "an id the gateway never made"
    );
    assert_eq!(client.delete_session().await.expect("deleted"), 204);
    gw.terminate().await;
    gw.restart().await;
    client.set_session_id(Some(session));
    assert!(
        matches!(
            active(&mut client).await,
            Err(ClientError::Http { status: 404, .. })
        ),
        "an ended session stays ended"
    );
    assert!(gw.state_dir().join("state.redb").is_file());
}

/// Calls a coordination tool and returns its structured result (an error's JSON when it
/// failed).
async fn coord(client: &mut McpClient<TokioConnect>, tool: &str, args: Value) -> Value {
    let r = client
        .tools_call(json!(9), tool, args)
        .await
        .expect("answered");
    match r["result"]["structuredContent"].clone() {
        Value::Null => r,
        v => v,
    }
}

/// Issue 25's scene: a session claims a story on beta, writes the board and sends another
/// session a message; SIGTERM and a restart, then a write and `kill -9` at once, and a
/// restart: the lease is held by the same agent under the same fence (another session is
/// refused, the holder renews), the other session is still present under its name, the
/// unread message is there (once), the board entries are there at their revisions, and the
/// numbers go on where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_messages_and_the_board_survive_sigterm_and_kill_9_of_a_single_gateway() {
    let mut gw = SingleGateway::start(&projects_toml()).await;
    let mcp = format!("{}/mcp", gw.url());
    let mut a = McpClient::connect(TokioConnect, &mcp)
        .await
        .expect("connects");
    a.initialize().await.expect("a session");
    let claimed = coord(
        &mut a,
        "claim",
        json!({"project": "beta", "resource": "story:beta-1", "ttl_s": 600}),
    )
    .await;
    assert_eq!(claimed["acquired"], true, "{claimed}");
    let fence = claimed["fence"].clone();
    let before = coord(&mut a, "claims", json!({"project": "beta"})).await;
    let holder = before["leases"][0]["holder"].clone();
    assert!(holder.is_string(), "{before}");
    let set = coord(
        &mut a,
        "board_set",
        json!({"project": "beta", "key": "plan", "value": {"step": 1}}),
    )
    .await;
    assert_eq!(set["revision"], 1, "{set}");

    // B checks in (an agent with a name) and A writes to it; B reads only after the restart.
    let mut b = McpClient::connect(TokioConnect, &mcp)
        .await
        .expect("connects");
    b.initialize().await.expect("a session");
    let checked_in = coord(&mut b, "checkin", json!({"project": "beta", "name": "b"})).await;
    let b_agent = checked_in["agent"].clone();
    assert!(b_agent.is_string(), "{checked_in}");
    let sent = coord(
        &mut a,
        "send",
        json!({"project": "beta", "to": b_agent, "body": "plan is on the board"}),
    )
    .await;
    assert!(sent["id"].is_u64(), "{sent}");

    gw.terminate().await;
    gw.restart().await;
    // B holds no lease: it is present after the restart because its presence was kept.
    let roster = coord(&mut a, "roster", json!({"project": "beta"})).await;
    let names: Vec<&Value> = roster["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .filter(|m| m["agent"] == b_agent)
        .map(|m| &m["name"])
        .collect();
    assert_eq!(names, [&json!("b")], "presence is kept: {roster}");
    let inbox = coord(&mut b, "inbox", json!({"project": "beta"})).await;
    assert_eq!(
        inbox["messages"][0]["body"],
        "plan is on the board",
        "unread mail survives a restart: {inbox}\n{}",
        gw.log()
    );
    assert_eq!(inbox["messages"][0]["from"], holder, "{inbox}");
    let again = coord(&mut b, "inbox", json!({"project": "beta"})).await;
    assert_eq!(again["messages"], json!([]), "read once: {again}");
    let claims = coord(&mut a, "claims", json!({"project": "beta"})).await;
    let lease = &claims["leases"][0];
    assert_eq!(lease["resource"], "story:beta-1", "{claims}\n{}", gw.log());
    assert_eq!(lease["fence"], fence, "{claims}");
    assert_eq!(lease["holder"], holder, "the same agent holds it: {claims}");
    let ttl_left = lease["expires_in_ms"].as_u64().expect("a deadline");
    assert!(
        ttl_left > 590_000 && ttl_left <= 600_000,
        "the lease's time left after a restart: {ttl_left} ms"
    );
    let refused = coord(
        &mut b,
        "claim",
        json!({"project": "beta", "resource": "story:beta-1"}),
    )
    .await;
    assert_eq!(refused["acquired"], false, "{refused}");
    assert_eq!(refused["holder"], lease["holder"], "{refused}");
    let renewed = coord(
        &mut a,
        "renew",
        json!({"project": "beta", "resource": "story:beta-1"}),
    )
    .await;
    assert_eq!(
        renewed["fence"], fence,
        "the holder renews under its fence: {renewed}"
    );
    let got = coord(
        &mut b,
        "board_get",
        json!({"project": "beta", "key": "plan"}),
    )
    .await;
    assert_eq!(
        (got["revision"].clone(), got["value"].clone()),
        (json!(1), json!({"step": 1})),
        "{got}"
    );

    // A write acknowledged, then kill -9 at once.
    let set = coord(
        &mut a,
        "board_set",
        json!({"project": "beta", "key": "plan", "value": {"step": 2}}),
    )
    .await;
    assert_eq!(set["revision"], 2, "{set}");
    gw.kill9().await;
    gw.restart().await;
    let got = coord(
        &mut b,
        "board_get",
        json!({"project": "beta", "key": "plan"}),
    )
    .await;
    assert_eq!(
        (got["revision"].clone(), got["value"].clone()),
        (json!(2), json!({"step": 2})),
        "{got}\n{}",
        gw.log()
    );
    let other = coord(
        &mut b,
        "claim",
        json!({"project": "beta", "resource": "story:beta-2"}),
    )
    .await;
    assert_eq!(
        other["fence"].as_u64(),
        fence.as_u64().map(|f| f + 1),
        "fences go on from where they were: {other}"
    );
    // /metrics counts the batches written since the restart, and what is kept.
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", gw.port)
        .parse()
        .expect("an address");
    let (_, metrics) = gateway_tests::scrape_metrics(addr).await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert!(
        value("gateway_store_coordination_batches_total ") >= 1.0,
        "{metrics}"
    );
    assert!(
        value("gateway_store_coordination_write_seconds_count{bucket=\"coordination\"} ") >= 1.0,
        "{metrics}"
    );
    assert_eq!(
        value("gateway_store_coordination_write_failures_total "),
        0.0
    );
    assert!(value("gateway_coord_records_kept ") >= 4.0, "{metrics}");
    // The holder releases; the lease is gone for good, across a restart too.
    let released = coord(
        &mut a,
        "release",
        json!({"project": "beta", "resource": "story:beta-1"}),
    )
    .await;
    assert_eq!(released["fence"], fence, "{released}");
    gw.terminate().await;
    gw.restart().await;
    let claims = coord(&mut b, "claims", json!({"project": "beta"})).await;
    let held: Vec<&Value> = claims["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| &l["resource"])
        .collect();
    assert_eq!(held, [&json!("story:beta-2")], "{claims}");
}

/// Issue 25's proof on real processes: `kill -9` of a single gateway while eight sessions
/// write the board and send messages as fast as it answers them, each holding a lease, and a
/// restart: every acknowledged write is there (`gateway_tests::coord_load::Load::check`) and
/// every session answers. (With `PlantedBug::CoordAckBeforeDurable` forced on in the gateway
/// binary, the acknowledged board values were behind in 4 runs of 4 on 2026-12-07.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_coordination_writes_under_load_survive_kill_9_of_a_single_gateway() {
    let mut gw = SingleGateway::start(&projects_toml()).await;
    let mcp = format!("{}/mcp", gw.url());
    let mut load = Load::start(&mcp, "beta", 8).await;
    let writers = load.spawn();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    gw.kill9().await;
    load.stop();
    let mut acked = Vec::new();
    for w in writers {
        acked.push(w.await.expect("a writer"));
    }
    let writes: u64 = acked.iter().map(|a| a.value).sum();
    assert!(
        writes >= 64,
        "a load: {writes} writes answered before the kill"
    );
    gw.restart().await;
    load.check(&acked, || gw.log()).await;
}

#[tokio::test]
async fn a_state_file_it_cannot_use_stops_the_gateway_naming_the_file() {
    let mut gw = SingleGateway::start(&projects_toml()).await;
    gw.terminate().await;
    let file = gw.state_dir().join("state.redb");
    std::fs::write(&file, vec![0x5a; 20_000]).expect("the file is overwritten");
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        gw.command()
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("it stops at once")
    .expect("it runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&file.display().to_string()) && stderr.contains("refusing to start"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--reset-state"),
        "it says how to start afresh: {stderr}"
    );
    assert_eq!(
        std::fs::read(&file).expect("kept"),
        vec![0x5a; 20_000],
        "never replaced"
    );

    // --reset-state moves it aside (never deletes it) and starts with an empty state.
    let mut child = gw
        .command()
        .arg("--reset-state")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("it runs");
    assert!(
        processes::wait_healthy(gw.port, Duration::from_secs(20)).await,
        "it starts with --reset-state"
    );
    let _ = child.kill().await;
    let aside: Vec<std::path::PathBuf> = std::fs::read_dir(gw.state_dir())
        .expect("the state directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.to_string_lossy().contains("state.redb.reset-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(&aside[0]).expect("kept aside"),
        vec![0x5a; 20_000]
    );
}

/// The hot path stays off the disk: on a gateway keeping its sessions in the embedded store,
/// `initialize` and a switch are written, and 200 plain `tools/call`s (in the session and
/// without one) write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_tools_call_does_no_store_write() {
    let dir = processes::scratch("hot-path");
    let redb = Arc::new(RedbStore::open(&dir).await.expect("opens"));
    let writes = Arc::new(AtomicU64::new(0));
    let counted = writes.clone();
    let store = Arc::new(HookedStore {
        inner: redb.clone(),
        hook: Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::ready(()))
        }),
    });
    let count = || writes.load(Ordering::SeqCst);
    let registry = gateway_tests::registry(&["alpha", "beta"], Some("alpha"));
    let mut opts = ServerOptions::new(registry, [9; 32]);
    opts.store = Some(store);
    let stack = gateway_tests::Stack::start_with(opts, &["alpha"], Default::default()).await;
    stack.wait_live(&["alpha"]).await;
    // At start the coordination state is read back (one mark written after it).
    let started = count();
    let mut client = McpClient::connect(TokioConnect, &stack.url())
        .await
        .expect("connects");
    client.initialize().await.expect("a session");
    assert_eq!(count() - started, 1, "initialize writes the new session");
    switch(&mut client, "beta").await;
    switch(&mut client, "alpha").await;
    assert_eq!(count() - started, 3, "each switch is written");

    let mut sessionless = McpClient::connect(TokioConnect, &stack.url())
        .await
        .expect("connects");
    for i in 0..100 {
        let r = client
            .tools_call(json!(i), "whoami", json!({}))
            .await
            .expect("answered");
        assert_eq!(r["result"]["structuredContent"]["project"], "alpha", "{r}");
        let r = sessionless
            .tools_call(json!(i), "whoami", json!({"project": "alpha"}))
            .await
            .expect("answered");
        assert_eq!(r["result"]["structuredContent"]["project"], "alpha", "{r}");
    }
    assert_eq!(count() - started, 3, "200 tools/call wrote nothing");
    stack.stop().await;
    redb.close().await;
}

/// Where-the-issues-meet §1: a single gateway makes its secret in its state directory on first
/// start (mode 0600) and keeps it, and signs agent handles under a key derived from it. A
/// handle `checkin` gave a caller without a session before a restart still names the same
/// agent after it: its lease renews under the same fence. The secret is in no log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_handle_outlives_a_restart_of_a_single_gateway() {
    use std::os::unix::fs::PermissionsExt;
    let mut gw = SingleGateway::start(&projects_toml()).await;
    let mcp = format!("{}/mcp", gw.url());
    let mut anon = McpClient::connect(TokioConnect, &mcp)
        .await
        .expect("connects");
    let checked_in = coord(&mut anon, "checkin", json!({"project": "beta"})).await;
    let handle = checked_in["handle"].as_str().expect("a handle").to_owned();
    let agent = checked_in["agent"].clone();
    let claimed = coord(
        &mut anon,
        "claim",
        json!({"project": "beta", "resource": "story:beta-7", "ttl_s": 600, "agent": handle}),
    )
    .await;
    assert_eq!(claimed["acquired"], true, "{claimed}");
    let secret_file = gw.state_dir().join("gateway.secret");
    let mode = std::fs::metadata(&secret_file)
        .expect("the secret is kept in the state directory")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let secret = std::fs::read_to_string(&secret_file).unwrap();

    gw.terminate().await;
    gw.restart().await;
    let renewed = coord(
        &mut anon,
        "renew",
        json!({"project": "beta", "resource": "story:beta-7", "agent": handle}),
    )
    .await;
    assert_eq!(
        renewed["fence"],
        claimed["fence"],
        "{renewed}\n{}",
        gw.log()
    );
    let claims = coord(
        &mut anon,
        "claims",
        json!({"project": "beta", "agent": handle}),
    )
    .await;
    assert_eq!(claims["leases"][0]["holder"], agent, "{claims}");
    // A handle nobody issued is still nobody's.
    let forged = format!("ah-{}", "0".repeat(64));
    let r = anon
        .tools_call(
            json!(3),
            "renew",
            json!({"project": "beta", "resource": "story:beta-7", "agent": forged}),
        )
        .await
        .expect("answered");
    assert_eq!(r["error"]["data"]["kind"], "unknown_agent", "{r}");
    assert!(
        !gw.log().contains(secret.trim()),
        "the secret is never logged"
    );
}

/// `fleet_identity`'s rows by project: (status, pinned key, refused key).
async fn identities(
    client: &mut McpClient<TokioConnect>,
) -> std::collections::BTreeMap<String, (Value, Value, Value)> {
    let r = client
        .tools_call(json!(4), "fleet_identity", json!({}))
        .await
        .expect("answered");
    r["result"]["structuredContent"]["projects"]
        .as_array()
        .unwrap_or_else(|| panic!("rows: {r}"))
        .iter()
        .map(|row| {
            (
                row["project"].as_str().unwrap_or_default().to_owned(),
                (
                    row["status"].clone(),
                    row["pinned"].clone(),
                    row["refused"]["key"].clone(),
                ),
            )
        })
        .collect()
}

/// Polls `fleet_identity` until `done` holds of its rows (30 s at most).
async fn identities_until(
    client: &mut McpClient<TokioConnect>,
    gw: &SingleGateway,
    done: impl Fn(&std::collections::BTreeMap<String, (Value, Value, Value)>) -> bool,
) -> std::collections::BTreeMap<String, (Value, Value, Value)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let rows = identities(client).await;
        if done(&rows) {
            return rows;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fleet_identity never came to it: {rows:?}\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue 25: a single gateway keeps sled pins in its state store. A pin file an earlier
/// version wrote is moved in once (renamed `.imported`) and its pins are enforced; a pin made
/// on first use is in the store before its sled is welcomed, so after `kill -9` an impostor
/// with the project's token is still refused rather than pinned anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_move_into_the_state_store_and_a_first_use_pin_outlives_kill_9() {
    let mut gw = SingleGateway::prepare(&projects_toml());
    let other = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let other_key = gateway_core::identity::encode_key(&other.verifying_key());
    let mut pins = gateway_core::Pins::default();
    pins.pins.insert(
        "beta".into(),
        gateway_core::Pin {
            key: other_key.clone(),
            sled: "beta-sled".into(),
        },
    );
    let pin_file = gw.dir().join("pins.toml");
    std::fs::write(&pin_file, pins.to_toml()).unwrap();
    gw.restart().await;
    assert!(!pin_file.exists(), "the pin file is moved in");
    let imported = gw.dir().join("pins.toml.imported");
    assert_eq!(std::fs::read_to_string(&imported).unwrap(), pins.to_toml());

    let mut client = McpClient::connect(TokioConnect, &format!("{}/mcp", gw.url()))
        .await
        .expect("connects");
    client.initialize().await.expect("a session");
    let sleds = processes::sled_sim(&gw.url(), &["alpha", "beta"], 0);
    // alpha is pinned on first use; beta's own sled is refused: the imported pin holds.
    let rows = identities_until(&mut client, &gw, |rows| {
        rows["alpha"].0 == "verified" && rows["beta"].2.is_string()
    })
    .await;
    assert_eq!(rows["beta"].1, other_key.as_str(), "{rows:?}");
    assert_ne!(rows["beta"].0, "verified", "{rows:?}");
    let alpha_key = rows["alpha"].1.clone();
    assert!(alpha_key.is_string(), "{rows:?}");

    // kill -9 right after the first use, with the sleds gone too; then an impostor for alpha,
    // which presents alpha's token, comes first.
    gw.kill9().await;
    drop(sleds);
    gw.restart().await;
    assert!(!pin_file.exists(), "no pin file is written any more");
    let _impostor = processes::sled_sim_with(
        &gw.url(),
        &["--project".into(), "alpha".into(), "--wrong-key".into()],
    );
    let mut client = McpClient::connect(TokioConnect, &format!("{}/mcp", gw.url()))
        .await
        .expect("connects");
    client.initialize().await.expect("a session");
    let rows = identities_until(&mut client, &gw, |rows| rows["alpha"].2.is_string()).await;
    assert_eq!(
        rows["alpha"].1, alpha_key,
        "the first-use pin is kept: {rows:?}"
    );
    assert_ne!(rows["alpha"].0, "verified", "{rows:?}");
    assert_eq!(rows["beta"].1, other_key.as_str(), "{rows:?}");
}
