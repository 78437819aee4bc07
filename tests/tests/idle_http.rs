//! HTTP connections that wait too long for a request are closed; busy ones are not.

use std::time::Duration;

use gateway_server::ServerOptions;
use serde_json::json;
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const IDLE: Duration = Duration::from_millis(400);

use gateway_tests::metric_series as series;

/// The body of the gateway's `GET /metrics`.
async fn metrics(addr: std::net::SocketAddr) -> String {
    gateway_tests::scrape_metrics(addr).await.1
}

/// Reads until the peer closes; how long that took, and everything read.
async fn until_closed(s: &mut TcpStream) -> (Duration, Vec<u8>) {
    let started = Instant::now();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("the gateway closed the connection within 10 s")
        .expect("a clean close");
    (started.elapsed(), got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_after_the_timeout_and_busy_ones_do_not() {
    gateway_tests::init_tracing();
    let registry = gateway_tests::registry(&["alpha"], Some("alpha"));
    let mut opts = ServerOptions::new(registry, [9; 32]);
    opts.http_idle_timeout = Some(IDLE);
    let gateway = gateway_tests::Gateway::start(opts).await;
    let (addr, base, url) = (gateway.addr, gateway.base(), gateway.url());
    // Every call takes 3 idle timeouts at the sled.
    let fleet = Fleet::spawn(
        &base,
        &["alpha".to_owned()],
        SledOptions {
            latency: IDLE * 3,
            ..SledOptions::default()
        },
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while series(&metrics(addr).await, "gateway_uplinks_live") != Some(1.0) {
        assert!(Instant::now() < deadline, "the sled did not connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The uplink upgraded and left the HTTP count; the scrape's own connection is the one left.
    assert_eq!(
        series(&metrics(addr).await, "gateway_http_connections_open"),
        Some(1.0)
    );
    let closed_before = series(&metrics(addr).await, "gateway_http_idle_closed_total").unwrap();

    // A connection that never sends a byte is closed after the timeout.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (took, got) = until_closed(&mut silent).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(
        took >= IDLE - Duration::from_millis(50),
        "closed after {took:?}"
    );

    // A keep-alive connection is served, then closed once idle for the timeout.
    let mut keep = TcpStream::connect(addr).await.unwrap();
    keep.write_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    let (took, got) = until_closed(&mut keep).await;
    let got = String::from_utf8(got).unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with("ok"), "{got}");
    assert!(
        took >= IDLE - Duration::from_millis(50),
        "closed after {took:?}"
    );

    // Headers trickling in slower than the timeout allows: closed mid-head.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let (_, got) = until_closed(&mut slow).await;
    assert!(
        !String::from_utf8_lossy(&got).contains("200 OK"),
        "served a request whose headers never ended"
    );

    // A call that takes three timeouts at the sled is answered on its connection.
    let mut client = McpClient::connect(TokioConnect, &url).await.unwrap();
    let started = Instant::now();
    let r = client
        .tools_call(json!(1), "whoami", json!({ "project": "alpha" }))
        .await
        .unwrap();
    assert!(r["result"].is_object(), "{r}");
    assert!(started.elapsed() >= IDLE * 3, "{:?}", started.elapsed());
    // After an idle spell its connection is gone; the session is not, and the client goes on.
    tokio::time::sleep(IDLE * 2).await;
    let r = client
        .tools_call(json!(2), "whoami", json!({ "project": "alpha" }))
        .await
        .unwrap();
    assert!(r["result"].is_object(), "{r}");

    let body = metrics(addr).await;
    let closed = series(&body, "gateway_http_idle_closed_total").unwrap() - closed_before;
    // silent, keep, slow and the client's first connection at least.
    assert!(closed >= 4.0, "idle closes counted: {closed}\n{body}");
    assert!(series(&body, "gateway_uplinks_live") == Some(1.0), "{body}");

    fleet.shutdown().await;
    gateway.stop().await;
}
