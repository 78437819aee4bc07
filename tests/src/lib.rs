//! Shared helpers for the black-box tests (`tests/tests/*.rs`) and the deterministic
//! simulation (`tests/tests/simulation.rs`).

pub mod coord_load;
pub mod crash_disk;
pub mod engine_model;
pub mod engine_net;
pub mod hooked_store;
pub mod sim;

/// The cluster secret of the tests' replicas (64 hex digits), given to spawned replicas as
/// `MCP_GATEWAY_CLUSTER_SECRET` or in a file.
pub const TEST_CLUSTER_SECRET: &str =
    "5ec2e7c1a55e7b0c2d4f6a8b9c0d1e2f3a4b5c6d7e8f90112233445566778899";

/// The tests' replicas' keys ([`TEST_CLUSTER_SECRET`]).
pub fn test_cluster_keys() -> gateway_core::keys::KeyRing {
    let secret = gateway_core::keys::GatewaySecret::parse(TEST_CLUSTER_SECRET)
        .expect("the tests' cluster secret parses");
    gateway_core::keys::KeyRing::new(&secret, None)
}

use std::net::SocketAddr;
use std::time::Duration;

use gateway_core::{ProjectSpec, Registry};
use gateway_server::{serve, ServerOptions};
use serde_json::json;
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};

/// Logs to the test's captured output, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// `GET /metrics` of the gateway at `addr` over a fresh connection: the response head and body.
pub async fn scrape_metrics(addr: SocketAddr) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the gateway accepts");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        .await
        .expect("the request is written");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("the answer is read");
    let raw = String::from_utf8(raw).expect("metrics are text");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    (head.to_owned(), body.to_owned())
}

/// The value of the series `name` (with its labels exactly as written) in a Prometheus text
/// exposition, if present.
pub fn metric_series(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A registry of `projects` (made-up container URLs), with `default`, whose projects take
/// sleds that present no token or key (`allow_unauthenticated_uplinks`), as the demo's do.
pub fn registry(projects: &[&str], default: Option<&str>) -> Registry {
    let specs = projects
        .iter()
        .enumerate()
        .map(|(i, p)| ProjectSpec::new(*p, format!("http://127.0.0.1:{}", 9101 + i)))
        .collect();
    Registry::from_projects(specs, default)
        .expect("a valid test registry")
        .allowing_unauthenticated_uplinks()
}

/// The real gateway serving `opts` on a loopback port, until [`Gateway::stop`].
pub struct Gateway {
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Gateway {
    /// Binds a free loopback port and serves on it.
    pub async fn start(opts: ServerOptions) -> Gateway {
        init_tracing();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("a bound address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, opts, async {
            let _ = stopped.await;
        }));
        Gateway { addr, stop, server }
    }

    /// `http://<addr>`, where sleds connect.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Shuts the gateway down and checks that it stopped cleanly within 20 s.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.server)
            .await
            .expect("the gateway stopped within 20 s")
            .expect("the server task did not panic")
            .expect("serve returned Ok");
    }
}

/// The real gateway serving on a loopback port, and an emulated fleet connected to it.
pub struct Stack {
    pub addr: SocketAddr,
    pub fleet: Fleet,
    gateway: Gateway,
}

impl Stack {
    /// Starts the gateway for `registry` and one sled per project in `sleds`.
    pub async fn start(registry: Registry, sleds: &[&str], opts: SledOptions) -> Stack {
        Stack::start_with(ServerOptions::new(registry, [7; 32]), sleds, opts).await
    }

    /// Starts the gateway with `server` and one sled per project in `sleds`.
    pub async fn start_with(server: ServerOptions, sleds: &[&str], opts: SledOptions) -> Stack {
        let gateway = Gateway::start(server).await;
        let names: Vec<String> = sleds.iter().map(|s| (*s).to_owned()).collect();
        let fleet = Fleet::spawn(&gateway.base(), &names, opts);
        let stack = Stack {
            addr: gateway.addr,
            fleet,
            gateway,
        };
        stack.wait_live(sleds).await;
        stack
    }

    /// The MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Waits (at most 15 s) until every project in `live` has a live uplink, and the default
    /// project's tools are listed if it is among them.
    pub async fn wait_live(&self, live: &[&str]) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let ready = async {
                let mut c = McpClient::connect(TokioConnect, &self.url()).await.ok()?;
                let r = c
                    .tools_call(json!(1), "list_projects", json!({}))
                    .await
                    .ok()?;
                let s = &r["result"]["structuredContent"];
                let projects = s["projects"].as_array()?;
                let all_live = live.iter().all(|name| {
                    projects
                        .iter()
                        .any(|p| p["name"] == *name && p["live"] == true)
                });
                let default_listed = match s["active"].as_str() {
                    Some(d) if live.contains(&d) => {
                        let tools = c.tools_list(json!(2), None).await.ok()?;
                        tools["result"]["tools"].as_array()?.len()
                            > gateway_core::GATEWAY_TOOLS.len()
                    }
                    _ => true,
                };
                (all_live && default_listed).then_some(())
            };
            if ready.await.is_some() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the sleds {live:?} did not come up within 15 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Shuts the fleet and the gateway down, and checks that the gateway stopped cleanly.
    pub async fn stop(self) {
        self.fleet.shutdown().await;
        self.gateway.stop().await;
    }
}
