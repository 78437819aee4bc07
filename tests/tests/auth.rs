//! Who gets in, over real sockets: a sled must present its project's uplink token, and a
//! client its bearer token; a wrong one is refused and the gateway keeps serving.

use std::time::Duration;

use gateway_core::{ProjectSpec, Registry, Secret};
use gateway_server::ServerOptions;
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};

#[path = "support/processes.rs"]
mod processes;
#[path = "support/stdio.rs"]
mod stdio;

const SLED_TOKEN: &str = "uplink-token-for-beta-0001";
const CLIENT_TOKEN: &str = "client-token-for-ops-0001";

async fn post(c: &mut McpClient<TokioConnect>, auth: Option<&str>, body: Value) -> (u16, Value) {
    let bearer = auth.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    if let Some(b) = &bearer {
        headers.push(("authorization", b));
    }
    let (status, _, body) = c
        .post_raw(body.to_string().into_bytes(), &headers)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleds_and_clients_present_their_tokens() {
    gateway_tests::init_tracing();
    let mut beta = ProjectSpec::new("beta", "http://127.0.0.1:9102");
    beta.token = Some(Secret::new(SLED_TOKEN));
    let registry = Registry::from_projects(vec![beta], Some("beta"))
        .unwrap()
        .with_client_tokens(vec![Secret::new(CLIENT_TOKEN)]);
    let gateway = gateway_tests::Gateway::start(ServerOptions::new(registry, [4; 32])).await;
    let addr = gateway.addr;
    let projects = ["beta".to_owned()];
    // An impostor without the token, and the real sled with it.
    let impostor = Fleet::spawn(&format!("http://{addr}"), &projects, SledOptions::default());
    let real = Fleet::spawn(
        &format!("http://{addr}"),
        &projects,
        SledOptions {
            uplink_token: Some(Secret::new(SLED_TOKEN)),
            ..SledOptions::default()
        },
    );
    let mut c = McpClient::connect(TokioConnect, &format!("http://{addr}/mcp"))
        .await
        .unwrap();
    // Without a bearer token: 401 with the challenge.
    let (status, body) = post(
        &mut c,
        None,
        json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["data"]["kind"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, _) = post(
        &mut c,
        Some("not-the-token-at-all"),
        json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
    )
    .await;
    assert_eq!(status, 401);
    // With it: the real sled serves beta, whatever the impostor keeps trying.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}});
        let (status, body) = post(&mut c, Some(CLIENT_TOKEN), call).await;
        assert_eq!(status, 200);
        if body["result"]["structuredContent"]["project"] == "beta" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "beta never came up: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let story = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"create_story","arguments":{"name":"real","acceptance_criteria":[]}}});
    let (_, body) = post(&mut c, Some(CLIENT_TOKEN), story).await;
    let id = body["result"]["structuredContent"]["story"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        real.sled("beta")
            .unwrap()
            .with(|s| s.project().story(&id).is_some()),
        "served by the sled with the token"
    );
    assert!(impostor
        .sled("beta")
        .unwrap()
        .with(|s| s.project().story(&id).is_none()));
    impostor.shutdown().await;
    real.shutdown().await;
    gateway.stop().await;
}

/// A gateway on a loopback port, with `/metrics` on an address of its own when asked.
struct Served {
    addr: std::net::SocketAddr,
    metrics: Option<std::net::SocketAddr>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(opts: ServerOptions, metrics_address: bool) -> Served {
        gateway_tests::init_tracing();
        let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
        let listener = bind().await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics_listener = match metrics_address {
            true => Some(bind().await.unwrap()),
            false => None,
        };
        let metrics = metrics_listener.as_ref().map(|l| l.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(gateway_server::serve_with_metrics(
            listener,
            metrics_listener,
            opts,
            async {
                let _ = stopped.await;
            },
        ));
        Served {
            addr,
            metrics,
            stop,
            server,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.server)
            .await
            .expect("the gateway stopped within 20 s")
            .expect("no panic")
            .expect("serve returned Ok");
    }
}

/// `GET path` at `addr` over a fresh connection: the status, and the body when 200.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    (status, body.to_owned())
}

/// A 200 with the Prometheus text of the gateway, or the status.
async fn scrape(addr: std::net::SocketAddr) -> Result<(), u16> {
    match get(addr, "/metrics").await {
        (200, body) => {
            assert!(
                gateway_tests::metric_series(&body, "gateway_sessions").is_some(),
                "{body}"
            );
            Ok(())
        }
        (status, _) => Err(status),
    }
}

fn with_client_token(registry: Registry) -> Registry {
    registry.with_client_tokens(vec![Secret::new(CLIENT_TOKEN)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_leave_the_mcp_port_when_clients_must_authenticate() {
    let registry = || gateway_tests::registry(&["alpha"], Some("alpha"));

    // Authentication on, no metrics address: /metrics is nowhere; /mcp still wants the token
    // and /healthz still answers.
    let gw = Served::start(
        ServerOptions::new(with_client_token(registry()), [5; 32]),
        false,
    )
    .await;
    assert_eq!(scrape(gw.addr).await, Err(404));
    assert_eq!(get(gw.addr, "/healthz").await, (200, "ok".to_owned()));
    let mut c = McpClient::connect(TokioConnect, &format!("http://{}/mcp", gw.addr))
        .await
        .unwrap();
    let ping = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    assert_eq!(post(&mut c, None, ping.clone()).await.0, 401);
    assert_eq!(post(&mut c, Some(CLIENT_TOKEN), ping.clone()).await.0, 200);
    gw.stop().await;

    // Authentication on, a metrics address: 404 on the MCP port, served on its own address
    // (which serves nothing of MCP).
    let gw = Served::start(
        ServerOptions::new(with_client_token(registry()), [5; 32]),
        true,
    )
    .await;
    let at = gw.metrics.unwrap();
    assert_eq!(scrape(gw.addr).await, Err(404));
    assert_eq!(scrape(at).await, Ok(()));
    assert_eq!(get(at, "/healthz").await, (200, "ok".to_owned()));
    assert_eq!(get(at, "/mcp").await.0, 404);
    assert_eq!(get(at, gateway_core::uplink::UPLINK_PATH).await.0, 404);
    gw.stop().await;
    assert!(
        tokio::net::TcpStream::connect(at).await.is_err(),
        "the metrics address is closed once serve returned"
    );

    // Authentication off: on the MCP port as before; with an address, only there.
    let gw = Served::start(ServerOptions::new(registry(), [5; 32]), false).await;
    assert_eq!(scrape(gw.addr).await, Ok(()));
    gw.stop().await;
    let gw = Served::start(ServerOptions::new(registry(), [5; 32]), true).await;
    assert_eq!(scrape(gw.addr).await, Err(404));
    assert_eq!(scrape(gw.metrics.unwrap()).await, Ok(()));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_the_mcp_port_follow_authentication_across_reloads() {
    let dir = std::env::temp_dir().join(format!("gateway-metrics-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("projects.toml");
    let plain = "[[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n";
    let with_tokens = format!("client_tokens = [\"{CLIENT_TOKEN}\"]\n{plain}");
    std::fs::write(&path, plain).unwrap();
    let mut opts = ServerOptions::new(Registry::parse("projects.toml", plain).unwrap(), [6; 32]);
    opts.reload_from = Some((path.clone(), plain.to_owned()));
    let gw = Served::start(opts, false).await;
    assert_eq!(scrape(gw.addr).await, Ok(()));

    // Each reload is seen by the next request, whichever it is: once /mcp wants the token,
    // /metrics is gone from the port, and once it does not, /metrics is back.
    let mut c = McpClient::connect(TokioConnect, &format!("http://{}/mcp", gw.addr))
        .await
        .unwrap();
    let ping = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    for (text, status, metrics) in [(with_tokens.as_str(), 401, Err(404)), (plain, 200, Ok(()))] {
        std::fs::write(&path, text).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while post(&mut c, None, ping.clone()).await.0 != status {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no reload within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(scrape(gw.addr).await, metrics);
    }
    gw.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A desktop client that speaks only stdio reaches a gateway with `client_tokens` through the
/// shipped `gateway stdio`, with the token in a file or the environment; without it, or with a
/// wrong one, every request is answered with an error that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_stdio_sends_its_token_from_a_file_or_the_environment() {
    gateway_tests::init_tracing();
    let registry = Registry::from_projects(
        vec![ProjectSpec::new("beta", "http://127.0.0.1:9102")],
        Some("beta"),
    )
    .unwrap()
    .allowing_unauthenticated_uplinks()
    .with_client_tokens(vec![Secret::new(CLIENT_TOKEN)]);
    let gateway = gateway_tests::Gateway::start(ServerOptions::new(registry, [5; 32])).await;
    let addr = gateway.addr;
    let _sled = Fleet::spawn(
        &format!("http://{addr}"),
        &["beta".to_owned()],
        SledOptions::default(),
    );
    let url = format!("http://{addr}/mcp");
    let bin = processes::workspace_bin("gateway");
    let whoami = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}});
    let dir = processes::scratch("stdio-token");
    let file = dir.join("token");
    std::fs::write(&file, format!("{CLIENT_TOKEN}\n")).unwrap();

    // With the token: a session, and a call that reaches beta's sled (once it is live).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let lines = stdio::run(
            &bin,
            &url,
            stdio::Token::File(&file),
            &stdio::session(std::slice::from_ref(&whoami)),
        )
        .await;
        assert_eq!(
            stdio::answer(&lines, 1)["result"]["protocolVersion"],
            "2025-11-25",
            "{lines:?}"
        );
        if stdio::answer(&lines, 2)["result"]["structuredContent"]["project"] == "beta" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "beta never served: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lines = stdio::run(
        &bin,
        &url,
        stdio::Token::Env(CLIENT_TOKEN),
        &stdio::session(std::slice::from_ref(&whoami)),
    )
    .await;
    assert_eq!(
        stdio::answer(&lines, 2)["result"]["structuredContent"]["project"],
        "beta",
        "{lines:?}"
    );

    // Without a token, or with a wrong one: the 401 is the answer, and it says what was sent.
    let lines = stdio::run(&bin, &url, stdio::Token::None, &stdio::session(&[])).await;
    let error = &stdio::answer(&lines, 1)["error"];
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("401")
            && message.contains("sent no token")
            && message.contains("--token-file"),
        "{error}"
    );
    let lines = stdio::run(
        &bin,
        &url,
        stdio::Token::Env("not-the-token-at-all"),
        &stdio::session(&[]),
    )
    .await;
    let message = stdio::answer(&lines, 1)["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("401") && message.contains("the token from MCP_GATEWAY_TOKEN"),
        "{message}"
    );
    assert!(
        !message.contains("not-the-token-at-all"),
        "the answer must not repeat the token: {message}"
    );
    gateway.stop().await;
}
