//! `--run rolling`: a rolling deploy under load (issue 30). A nats-server, three release
//! replicas as `examples/replicas.sh` runs them (`--drain-settle-ms 1500`), nginx from
//! `examples/nginx.conf` as shipped (its ports changed), and sled-sim serving alpha and beta
//! through it. `--replica-clients` clients call `whoami` on alpha and beta in turn through
//! nginx, without a pause, for `--duration-secs` of steady state; then each replica in turn is
//! stopped with SIGTERM, started again on its port, and given a second once both projects are
//! live again. Each call is counted in the window it was sent in: the steady run, or the move
//! of one replica (from its SIGTERM to a second after both projects were live again). Printed
//! side by side: calls, failures, p50, p99 and max latency.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{bin_path, client::Conn, new_hist, procs, Args, Proc, Res, Targets, TempDir};

/// The shipped examples' replica ports and balancer address, replaced by free ones.
const SHIPPED_PORTS: [&str; 3] = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"];
const SHIPPED_LB: &str = "127.0.0.1:8080";

/// One call: when it was sent, how long it took, whether it succeeded.
struct Sample {
    sent: Instant,
    took: Duration,
    ok: bool,
}

fn start_replica(
    args: &Args,
    tmp: &TempDir,
    name: &str,
    port: u16,
    nats: &str,
    round: u32,
) -> Res<Proc> {
    let config = tmp.path.join("projects-rolling.toml");
    let mut argv = vec![
        bin_path(&args.gateway_bin, "gateway")?
            .display()
            .to_string(),
        "serve".into(),
        "--config".into(),
        config.display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--drain-settle-ms".into(),
        "1500".into(),
        "--trusted-proxy".into(),
        "127.0.0.1".into(),
    ];
    argv.extend(super::replicas::cluster_args(tmp, nats, name));
    let p = Proc::spawn(
        "gateway",
        &argv,
        &tmp.path.join(format!("rolling-{name}-{round}.log")),
        &[("RUST_LOG", &args.child_log)],
        Duration::from_secs(30),
    )?;
    procs::wait_listening(([127, 0, 0, 1], port).into(), Duration::from_secs(10))?;
    Ok(p)
}

/// nginx with `examples/nginx.conf` as shipped, its ports changed.
fn start_shipped_nginx(args: &Args, tmp: &TempDir, ports: &[u16], lb: u16) -> Res<Proc> {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/nginx.conf");
    let mut conf = std::fs::read_to_string(&shipped).map_err(|e| e.to_string())?;
    for (from, port) in SHIPPED_PORTS.iter().zip(ports) {
        conf = conf.replace(from, &format!("127.0.0.1:{port}"));
    }
    conf = conf.replace(SHIPPED_LB, &format!("127.0.0.1:{lb}"));
    let dir = tmp.path.join("nginx-rolling");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
    let argv = vec![
        args.nginx_bin.display().to_string(),
        "-p".into(),
        dir.display().to_string(),
        "-c".into(),
        "nginx.conf".into(),
        "-e".into(),
        "error.log".into(),
    ];
    let p = Proc::spawn(
        "nginx",
        &argv,
        &tmp.path.join("nginx-rolling.log"),
        &[],
        Duration::from_secs(5),
    )?;
    procs::wait_listening(([127, 0, 0, 1], lb).into(), Duration::from_secs(10))?;
    Ok(p)
}

/// Whether `via` lists both projects live.
async fn both_live(via: SocketAddr) -> bool {
    let Ok(mut c) = Conn::connect(via).await else {
        return false;
    };
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_projects","arguments":{}}}"#;
    let Ok(a) = c.post("/mcp", Bytes::from_static(body.as_bytes())).await else {
        return false;
    };
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_default();
    v["result"]["structuredContent"]["projects"]
        .as_array()
        .is_some_and(|ps| ps.iter().filter(|p| p["live"] == true).count() == 2)
}

async fn wait_both_live(via: SocketAddr, limit: Duration) -> Res<()> {
    let until = Instant::now() + limit;
    while !both_live(via).await {
        if Instant::now() > until {
            return Err(format!("alpha and beta not both live within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

pub(super) async fn rolling(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    println!("\n## A rolling deploy under load: three replicas behind the shipped nginx.conf\n");
    let (_nats, nats) = super::replicas::start_nats(args, tmp)?;
    let toml = "default = \"alpha\"\nallow_unauthenticated_uplinks = true\n\n\
        [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9\"\n\n\
        [[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9\"\n";
    std::fs::write(tmp.path.join("projects-rolling.toml"), toml).map_err(|e| e.to_string())?;
    let names = ["r1", "r2", "r3"];
    let mut ports = Vec::new();
    for _ in &names {
        ports.push(procs::free_port()?);
    }
    let mut replicas = Vec::new();
    for (name, port) in names.iter().zip(&ports) {
        replicas.push(Some(start_replica(args, tmp, name, *port, &nats, 0)?));
    }
    let lb_port = procs::free_port()?;
    let _nginx = start_shipped_nginx(args, tmp, &ports, lb_port)?;
    let lb: SocketAddr = ([127, 0, 0, 1], lb_port).into();
    let _sleds = super::start_sleds_with(args, tmp, "rolling", lb, 2, None, &[])?;
    wait_both_live(lb, Duration::from_secs(30)).await?;

    // The callers.
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for i in 0..args.replica_clients {
        let stop = stop.clone();
        callers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut c = Conn::connect(lb).await.map_err(|e| e.to_string())?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let project = ["alpha", "beta"][(n as usize + i) % 2];
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{{"name":"whoami","arguments":{{"project":"{project}"}}}}}}"#
                );
                n += 1;
                let sent = Instant::now();
                let ok = match c.post("/mcp", Bytes::from(body)).await {
                    Ok(a) => a.is_ok(),
                    Err(_) => {
                        // A new connection, as a client does after an error.
                        if let Ok(fresh) = Conn::connect(lb).await {
                            c = fresh;
                        }
                        false
                    }
                };
                samples.push(Sample {
                    sent,
                    took: sent.elapsed(),
                    ok,
                });
            }
            Ok::<Vec<Sample>, String>(samples)
        }));
    }
    let steady_from = Instant::now() + Duration::from_secs(1);
    tokio::time::sleep(Duration::from_secs_f64(1.0 + args.duration_secs)).await;
    let steady_to = Instant::now();

    // The deploy: each replica in turn.
    let mut moves = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let from = Instant::now();
        let old = replicas[i].take().ok_or("a replica is missing")?;
        // Dropping the process sends SIGTERM and waits for it to exit.
        tokio::task::spawn_blocking(move || drop(old))
            .await
            .map_err(|e| e.to_string())?;
        replicas[i] = Some(start_replica(args, tmp, name, ports[i], &nats, 1)?);
        wait_both_live(lb, Duration::from_secs(30)).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        moves.push((format!("move of {name}"), from, Instant::now()));
    }
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for c in callers {
        samples.extend(c.await.map_err(|e| e.to_string())??);
    }

    println!(
        "{} clients through nginx, whoami on alpha and beta in turn; each replica stopped with SIGTERM and started again\n",
        args.replica_clients
    );
    println!("| window | seconds | calls | failed | calls/s | p50 µs | p99 µs | max µs |\n|---|---|---|---|---|---|---|---|");
    let windows: Vec<(String, Instant, Instant)> =
        std::iter::once(("steady".to_owned(), steady_from, steady_to))
            .chain(moves)
            .collect();
    let mut failed_in_moves = 0;
    let mut steady_p99 = 0.0;
    let mut worst_move_p99: f64 = 0.0;
    for (label, from, to) in &windows {
        let mut h = new_hist();
        let (mut calls, mut failed) = (0u64, 0u64);
        for s in samples.iter().filter(|s| s.sent >= *from && s.sent < *to) {
            calls += 1;
            if !s.ok {
                failed += 1;
            }
            let _ = h.record(s.took.as_micros() as u64);
        }
        let secs = (*to - *from).as_secs_f64();
        let p99 = h.value_at_quantile(0.99) as f64;
        if label == "steady" {
            steady_p99 = p99;
        } else {
            failed_in_moves += failed;
            worst_move_p99 = worst_move_p99.max(p99);
        }
        println!(
            "| {label} | {secs:.1} | {calls} | {failed} | {:.0} | {} | {} | {} |",
            calls as f64 / secs,
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.max()
        );
    }
    targets.lines.push((
        "a rolling SIGTERM restart of 3 replicas under load fails no call".into(),
        Some(failed_in_moves == 0),
        format!(
            "{failed_in_moves} failed; p99 during the worst move {:.1}x the steady p99",
            worst_move_p99 / steady_p99.max(1.0)
        ),
    ));
    Ok(())
}
