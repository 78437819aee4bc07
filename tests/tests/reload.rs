//! projects.toml reloads over real sockets: an added project is routable at once, an invalid
//! file is refused with the old one kept, a removed project's pending call fails clearly, and
//! sessions survive it all.

use std::time::Duration;

use gateway_core::Registry;
use gateway_server::ServerOptions;
use serde_json::json;
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};

const ONE: &str =
    "allow_unauthenticated_uplinks = true\ndefault = \"alpha\"\n[[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n";
const TWO: &str = "allow_unauthenticated_uplinks = true\ndefault = \"alpha\"\n[[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n[[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9102\"\n";
const BETA_ONLY: &str = "allow_unauthenticated_uplinks = true\n[[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9102\"\n";

async fn registered(c: &mut McpClient<TokioConnect>) -> Vec<String> {
    let r = c
        .tools_call(json!(0), "list_projects", json!({}))
        .await
        .unwrap();
    r["result"]["structuredContent"]["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Polls until the registered names are `want` (the watcher reads the file every 2 s).
async fn until_registered(c: &mut McpClient<TokioConnect>, want: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while registered(c).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never became {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projects_toml_reloads_without_dropping_sessions() {
    gateway_tests::init_tracing();
    let dir = std::env::temp_dir().join(format!("gateway-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("projects.toml");
    std::fs::write(&path, ONE).unwrap();
    let registry = Registry::parse("projects.toml", ONE).unwrap();
    let mut opts = ServerOptions::new(registry, [2; 32]);
    opts.reload_from = Some((path.clone(), ONE.to_owned()));
    let gateway = gateway_tests::Gateway::start(opts).await;
    let addr = gateway.addr;
    let mut s = McpClient::connect(TokioConnect, &format!("http://{addr}/mcp"))
        .await
        .unwrap();
    s.initialize().await.unwrap();
    assert_eq!(registered(&mut s).await, ["alpha"]);

    // Added: routable at once (a sled for it may connect).
    std::fs::write(&path, TWO).unwrap();
    until_registered(&mut s, &["alpha", "beta"]).await;
    let fleet = Fleet::spawn(
        &format!("http://{addr}"),
        &["beta".to_owned()],
        SledOptions {
            latency: Duration::from_secs(5),
            ..SledOptions::default()
        },
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = s
            .tools_call(json!(1), "list_projects", json!({}))
            .await
            .unwrap();
        if r["result"]["structuredContent"]["projects"][1]["live"] == true {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "beta's sled never came up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Invalid: refused, the old registry stays.
    std::fs::write(&path, "[[project]]\nname = \"beta\"\n").unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(registered(&mut s).await, ["alpha", "beta"]);

    // Removed while a call to it is pending: that call fails at once, naming why.
    let session = s.session_id().unwrap().to_owned();
    let mut caller = McpClient::connect(TokioConnect, &format!("http://{addr}/mcp"))
        .await
        .unwrap();
    caller.set_session_id(Some(session));
    let pending = tokio::spawn(async move {
        caller
            .tools_call(json!(2), "whoami", json!({"project": "beta"}))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::write(&path, BETA_ONLY.replace("beta", "gamma")).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(4), pending)
        .await
        .expect("the pending call failed when its project was removed, before the sled's 5 s")
        .unwrap()
        .unwrap();
    assert_eq!(r["error"]["data"]["reason"], "unregistered");
    until_registered(&mut s, &["gamma"]).await;
    // The session lived through all of it.
    let r = s.request(json!(3), "ping", json!({})).await.unwrap();
    assert_eq!(r["result"], json!({}));

    fleet.shutdown().await;
    gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
