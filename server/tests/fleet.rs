//! The server's side of the fleet tools, over real sockets and files: the HTTP prober and the
//! pin file.

use std::path::PathBuf;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use gateway_core::{ProbeOutcome, ProjectSpec, Registry};
use gateway_server::fleet::{pin_tmp_path, write_pins_atomically};
use gateway_server::{serve, HttpProber, Prober, ServerOptions};
use tokio::net::TcpListener;

const PATIENCE: Duration = Duration::from_secs(10);

fn prober() -> HttpProber<sled_sim::TokioConnect> {
    HttpProber(sled_sim::TokioConnect)
}

/// A fresh directory of this test's own.
fn scratch_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("gateway-server-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn registry() -> Registry {
    Registry::from_projects(
        vec![ProjectSpec::new("alpha", "http://127.0.0.1:9")],
        Some("alpha"),
    )
    .expect("a valid registry")
    .allowing_unauthenticated_uplinks()
}

fn pin_text(project: &str, seed: u8) -> String {
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]).verifying_key();
    let mut pins = gateway_core::Pins::default();
    pins.pins.insert(
        project.to_owned(),
        gateway_core::Pin {
            key: gateway_core::identity::encode_key(&key),
            sled: format!("{project}-sled"),
        },
    );
    pins.to_toml()
}

#[tokio::test]
async fn a_probe_reports_the_status_of_the_path_in_the_url() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let expected_host = addr.to_string();
    let app = axum::Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/health",
            get(move |headers: HeaderMap| {
                let expected_host = expected_host.clone();
                async move {
                    // The Host header names the URL's host and port.
                    match headers.get("host").and_then(|h| h.to_str().ok()) {
                        Some(h) if h == expected_host => StatusCode::SERVICE_UNAVAILABLE,
                        _ => StatusCode::BAD_REQUEST,
                    }
                }
            }),
        );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let timeout = Duration::from_secs(5);
    assert_eq!(
        prober().probe(&format!("http://{addr}"), timeout).await,
        ProbeOutcome::Status(200)
    );
    assert_eq!(
        prober()
            .probe(&format!("http://{addr}/health"), timeout)
            .await,
        ProbeOutcome::Status(503)
    );
    assert_eq!(
        prober()
            .probe(&format!("http://{addr}/nowhere"), timeout)
            .await,
        ProbeOutcome::Status(404)
    );
    server.abort();
}

#[tokio::test]
async fn a_probe_of_a_closed_port_fails() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let outcome = tokio::time::timeout(
        PATIENCE,
        prober().probe(&format!("http://{addr}"), Duration::from_secs(5)),
    )
    .await
    .expect("a refused connection fails at once");
    match outcome {
        ProbeOutcome::Failed(reason) => assert!(reason.contains("refused"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_probe_of_a_silent_server_fails_at_its_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts, reads nothing, answers nothing.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let started = std::time::Instant::now();
    let outcome = prober()
        .probe(&format!("http://{addr}/"), Duration::from_millis(300))
        .await;
    let took = started.elapsed();
    assert_eq!(
        outcome,
        ProbeOutcome::Failed("no answer within 300 ms".into())
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    silent.abort();
}

#[tokio::test]
async fn unreachable_and_garbage_urls_fail_at_once() {
    for url in [
        "https://127.0.0.1:1/",
        "wss://127.0.0.1:1/",
        "127.0.0.1:1",
        "",
    ] {
        match prober().probe(url, Duration::from_secs(60)).await {
            ProbeOutcome::Failed(_) => {}
            other => panic!("{url:?}: {other:?}"),
        }
    }
}

#[test]
fn an_atomic_write_leaves_a_parsable_file_and_no_tmp() {
    let dir = scratch_dir("atomic");
    let path = dir.join("pins.toml");
    std::fs::write(&path, "# old\n").unwrap();
    let text = pin_text("alpha", 4);
    write_pins_atomically(&path, &text).unwrap();
    let back = std::fs::read_to_string(&path).unwrap();
    assert_eq!(back, text);
    assert!(gateway_core::Pins::parse(&back)
        .unwrap()
        .get("alpha")
        .is_some());
    assert!(!pin_tmp_path(&path).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

async fn serve_once(opts: ServerOptions) -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    tokio::time::timeout(PATIENCE, serve(listener, opts, async {}))
        .await
        .expect("serve returns")
}

#[tokio::test]
async fn a_corrupt_pin_file_stops_serve_and_names_the_file() {
    let dir = scratch_dir("corrupt");
    let path = dir.join("pins.toml");
    std::fs::write(&path, "[pins.alpha]\nkey = \"AAAA\"\n").unwrap();
    let mut opts = ServerOptions::new(registry(), [1; 32]);
    opts.pin_file = Some(path.clone());
    let e = serve_once(opts).await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    // The file is left as it was, for the operator to look at.
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "[pins.alpha]\nkey = \"AAAA\"\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_missing_or_valid_pin_file_lets_serve_run_and_is_not_rewritten_for_nothing() {
    let dir = scratch_dir("valid");
    let missing = dir.join("none.toml");
    let mut opts = ServerOptions::new(registry(), [1; 32]);
    opts.shutdown_grace = Duration::from_millis(100);
    opts.pin_file = Some(missing.clone());
    serve_once(opts)
        .await
        .expect("a missing pin file is no pins yet");
    assert!(!missing.exists());

    let path = dir.join("pins.toml");
    let text = pin_text("alpha", 5);
    std::fs::write(&path, &text).unwrap();
    let mut opts = ServerOptions::new(registry(), [1; 32]);
    opts.shutdown_grace = Duration::from_millis(100);
    opts.pin_file = Some(path.clone());
    serve_once(opts).await.expect("a valid pin file loads");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gateway serve` with a pin file it cannot read refuses to start before it listens: the
/// operator reads one error, not a "listening" line followed by an exit.
#[test]
fn serve_refuses_an_unreadable_pin_file_before_it_listens() {
    let dir = scratch_dir("serve-bad-pins");
    let config = dir.join("projects.toml");
    std::fs::write(
        &config,
        "[[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n",
    )
    .unwrap();
    let pins = dir.join("pins.toml");
    std::fs::write(&pins, "this is not toml [").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--pin-file")
        .arg(&pins)
        .output()
        .expect("gateway runs");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("is not valid"), "{all}");
    assert!(!all.contains("listening"), "{all}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gateway on a loopback port, stopped by dropping or sending on `stop`.
struct Running {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn start(opts: ServerOptions) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, opts, async {
            let _ = stop_rx.await;
        }));
        Running { addr, stop, task }
    }

    /// A sessionless `tools/call` of a gateway tool; its `structuredContent`.
    async fn tool(&self, name: &str, arguments: serde_json::Value) -> serde_json::Value {
        let url = format!("http://{}/mcp", self.addr);
        let mut c = sled_sim::McpClient::connect(sled_sim::TokioConnect, &url)
            .await
            .expect("connect");
        let r = c
            .tools_call(serde_json::json!(1), name, arguments)
            .await
            .expect("tools/call");
        r["result"]["structuredContent"].clone()
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("serve returns")
            .expect("serve task")
            .expect("serve result");
    }
}

/// Polls `check` every 50 ms until it returns `Some`, for at most PATIENCE.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(t) = check().await {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn row<'a>(s: &'a serde_json::Value, project: &str) -> &'a serde_json::Value {
    s["projects"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["project"] == project))
        .unwrap_or_else(|| panic!("no row for {project} in {s}"))
}

#[tokio::test]
async fn an_existing_pin_file_is_loaded_before_any_sled_connects() {
    let dir = scratch_dir("loaded");
    let path = dir.join("pins.toml");
    let text = pin_text("alpha", 6);
    std::fs::write(&path, &text).unwrap();
    let mut opts = ServerOptions::new(registry(), [1; 32]);
    opts.shutdown_grace = Duration::from_millis(100);
    opts.pin_file = Some(path.clone());
    let gw = Running::start(opts).await;
    let s = gw.tool("fleet_identity", serde_json::json!({})).await;
    let pinned = gateway_core::Pins::parse(&text).unwrap().pins["alpha"]
        .key
        .clone();
    assert_eq!(row(&s, "alpha")["pinned"], pinned.as_str(), "{s}");
    gw.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_sled_pinned_on_first_use_is_in_the_pin_file_when_serve_returns() {
    let dir = scratch_dir("first-use");
    let path = dir.join("pins.toml");
    let mut opts = ServerOptions::new(registry(), [1; 32]);
    opts.shutdown_grace = Duration::from_millis(100);
    opts.pin_file = Some(path.clone());
    let gw = Running::start(opts).await;
    let sled_opts = sled_sim::SledOptions {
        seed: 11,
        ..Default::default()
    };
    let fleet = sled_sim::Fleet::spawn(
        &format!("http://{}", gw.addr),
        &["alpha".to_owned()],
        sled_opts,
    );
    let expected =
        gateway_core::identity::encode_key(&sled_sim::sled_key(11, "alpha").verifying_key());
    eventually("alpha verified", || async {
        let s = gw.tool("fleet_identity", serde_json::json!({})).await;
        (row(&s, "alpha")["status"] == "verified").then_some(())
    })
    .await;
    fleet.shutdown().await;
    gw.stop().await;
    let pins = gateway_core::Pins::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        pins.get("alpha").map(|p| p.key.as_str()),
        Some(expected.as_str())
    );
    assert!(!pin_tmp_path(&path).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_gateway_probes_projects_without_an_uplink() {
    // alpha answers, beta's port is closed, gamma accepts and never answers.
    let up = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up_addr = up.local_addr().unwrap();
    let up_task = tokio::spawn(async move {
        axum::serve(up, axum::Router::new().route("/", get(|| async { "ok" }))).await
    });
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let silent_task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let registry = Registry::from_projects(
        vec![
            ProjectSpec::new("alpha", format!("http://{up_addr}")),
            ProjectSpec::new("beta", format!("http://{closed}")),
            ProjectSpec::new("gamma", format!("http://{silent_addr}/health")),
        ],
        Some("alpha"),
    )
    .unwrap()
    .allowing_unauthenticated_uplinks();
    let mut opts = ServerOptions::new(registry, [1; 32]);
    opts.shutdown_grace = Duration::from_millis(100);
    opts.core.probe_interval = Duration::from_millis(100);
    opts.core.probe_timeout = Duration::from_millis(300);
    let gw = Running::start(opts).await;
    let s = eventually("every project probed", || async {
        let s = gw.tool("gateway_health", serde_json::json!({})).await;
        ["alpha", "beta", "gamma"]
            .iter()
            .all(|p| row(&s, p)["probe"].is_object())
            .then_some(s)
    })
    .await;
    let alpha = &row(&s, "alpha")["probe"];
    assert_eq!(
        (alpha["ok"].clone(), alpha["status"].clone()),
        (true.into(), 200.into()),
        "{s}"
    );
    let beta = &row(&s, "beta")["probe"];
    assert!(beta["error"].as_str().unwrap().contains("refused"), "{s}");
    let gamma = &row(&s, "gamma")["probe"];
    assert_eq!(gamma["error"], "no answer within 300 ms", "{s}");
    gw.stop().await;
    up_task.abort();
    silent_task.abort();
}
