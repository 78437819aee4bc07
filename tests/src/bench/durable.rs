//! `--run durable-coord` (issue 25): what keeping coordination durable costs. Two single
//! gateways side by side in one run, each with a state directory of its own: this one, which
//! answers a coordination write only once it is synced to `state.redb`, and
//! `--baseline-gateway-bin`, built before coordination was kept (bc9971d: its sessions are in
//! the store, its leases and board in memory only). No sleds: coordination needs none.
//!
//! - one session on each, alternating call by call (so the machine's noise falls on both):
//!   a claim + release round trip, a `board_set`, and a plain `tools/call` (`list_projects`, which
//!   writes nothing and so should cost the same on both); then the plain call alone, with no
//!   write in the run, to tell its own cost from that of following a synced write;
//! - the same on replicas (`--cluster`): a replica of this gateway and one of the baseline on
//!   one nats-server, in namespaces of their own, each holding its own sled's project (this
//!   one keeps the project's coordination state in JetStream, the baseline in memory);
//! - 64 sessions writing the board at once for `--duration-secs`, on one gateway and then the
//!   other: writes per second (group commit: the writes waiting together share one sync).

use std::time::{Duration, Instant};

use std::net::SocketAddr;

use super::{
    client::Conn, new_hist, open_sessions, registered, replicas, start_gateway, start_gateway_bin,
    start_sleds_with, timed_call, Args, Res, Targets, TempDir,
};

/// Percentile of a histogram of nanoseconds, in microseconds.
fn us(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn ok(v: &serde_json::Value, what: &str) -> Res<()> {
    if v["result"].is_null() || v["result"]["isError"] == true {
        return Err(format!("{what} failed: {v}"));
    }
    Ok(())
}

/// Concurrent board writers.
const WRITERS: usize = 64;

pub(super) async fn durable_coord(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    let Some(baseline) = args.baseline_gateway_bin.as_deref() else {
        return Err("--run durable-coord needs --baseline-gateway-bin: a gateway built before coordination was kept (git worktree add ../base bc9971d && cd ../base && cargo build --release -p gateway-server --bin gateway)".into());
    };
    println!("\n## Durable coordination against in-memory (issue 25)\n");
    let projects = vec![("alpha".to_owned(), "http://127.0.0.1:9".to_owned())];
    let state = |tag: &str| {
        vec![
            "--state-dir".to_owned(),
            tmp.path.join(format!("state-{tag}")).display().to_string(),
            "--max-sessions".to_owned(),
            (WRITERS + 16).to_string(),
        ]
    };
    let (_durable_gw, durable) =
        start_gateway_bin(args, tmp, "durable", &projects, &state("durable"), None)?;
    let (_memory_gw, memory) = start_gateway_bin(
        args,
        tmp,
        "memory",
        &projects,
        &state("memory"),
        Some(baseline),
    )?;
    alternate(args, durable, memory, "alpha", "one gateway", targets).await?;
    in_a_cluster(args, tmp, baseline, targets).await?;

    // 64 writers at once, on each gateway in turn.
    let secs = args.duration_secs.max(1.0);
    let mut rates = Vec::new();
    for (tag, addr) in [("durable", durable), ("in-memory", memory)] {
        let sessions = open_sessions(addr, WRITERS, 8).await?;
        let until = Instant::now() + Duration::from_secs_f64(secs);
        let mut tasks = Vec::new();
        for (w, (session, version)) in sessions.into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
                c.session = session;
                c.version = version;
                let mut done = 0u64;
                let mut h = new_hist();
                while Instant::now() < until {
                    let args = format!(r#"{{"project":"alpha","key":"w{w}","value":{done}}}"#);
                    let (v, took) = timed_call(&mut c, done + 1, "board_set", &args).await?;
                    ok(&v, "board_set")?;
                    h.saturating_record(took.as_nanos() as u64);
                    done += 1;
                }
                Ok::<_, String>((done, h))
            }));
        }
        let (mut total, mut h) = (0u64, new_hist());
        for t in tasks {
            let (done, hw) = t.await.map_err(|e| e.to_string())??;
            total += done;
            h.add(&hw).map_err(|e| e.to_string())?;
        }
        let rate = total as f64 / secs;
        println!(
            "\n{tag}: {WRITERS} sessions writing the board for {secs} s: {total} writes, {rate:.0} a second, p50 {:.1} µs, p99 {:.1} µs",
            us(&h, 0.5),
            us(&h, 0.99)
        );
        rates.push(rate);
    }
    targets.lines.push((
        format!("board writes a second with {WRITERS} writers, durable against in-memory"),
        None,
        format!(
            "{:.0} against {:.0} ({:.2}×)",
            rates[0],
            rates[1],
            rates[0] / rates[1]
        ),
    ));
    Ok(())
}

type Hist = hdrhistogram::Histogram<u64>;

/// One session on `durable` and one on `memory`, alternating call by call: claim + release,
/// `board_set`, and `list_projects`; then `list_projects` alone; prints the table.
async fn alternate(
    args: &Args,
    durable: SocketAddr,
    memory: SocketAddr,
    project: &str,
    place: &str,
    targets: &mut Targets,
) -> Res<()> {
    let mut d = Conn::connect(durable).await.map_err(|e| e.to_string())?;
    d.initialize("/mcp").await.map_err(|e| e.to_string())?;
    let mut m = Conn::connect(memory).await.map_err(|e| e.to_string())?;
    m.initialize("/mcp").await.map_err(|e| e.to_string())?;

    let n = args.coord_calls;
    let resource = format!(r#"{{"project":"{project}","resource":"story:bench"}}"#);
    // The fleet tool `list_projects`: a tools/call that needs no sled and writes nothing.
    let plain = "{}";
    let mut hists: [[Hist; 4]; 2] = [
        [new_hist(), new_hist(), new_hist(), new_hist()],
        [new_hist(), new_hist(), new_hist(), new_hist()],
    ];
    for i in 0..n + n / 10 {
        let id = 10 + 4 * i as u64;
        let board = format!(r#"{{"project":"{project}","key":"bench","value":{i}}}"#);
        let [hd, hm] = &mut hists;
        for (c, h) in [(&mut d, hd), (&mut m, hm)] {
            let t = Instant::now();
            let (v, _) = timed_call(c, id, "claim", &resource).await?;
            if v["result"]["structuredContent"]["acquired"] != true {
                return Err(format!("claim not acquired: {v}"));
            }
            let (v, _) = timed_call(c, id + 1, "release", &resource).await?;
            ok(&v, "release")?;
            let took_lease = t.elapsed();
            let (v, took_board) = timed_call(c, id + 2, "board_set", &board).await?;
            ok(&v, "board_set")?;
            let (v, took_plain) = timed_call(c, id + 3, "list_projects", plain).await?;
            ok(&v, "list_projects")?;
            if i >= n / 10 {
                for (k, took) in [took_lease, took_board, took_plain].into_iter().enumerate() {
                    h[k].saturating_record(took.as_nanos() as u64);
                }
            }
        }
    }
    // The plain call again, with no write anywhere near it: what the call itself costs,
    // apart from following a write (which the durable gateway answered only after a sync).
    for i in 0..n + n / 10 {
        let id = 10 + 4 * (n + n / 10) as u64 + i as u64;
        let [hd, hm] = &mut hists;
        for (c, h) in [(&mut d, hd), (&mut m, hm)] {
            let (v, took) = timed_call(c, id, "list_projects", plain).await?;
            ok(&v, "list_projects")?;
            if i >= n / 10 {
                h[3].saturating_record(took.as_nanos() as u64);
            }
        }
    }
    println!("\n| {place}: one session ({n} each, alternating) | durable p50 µs | p99 µs | in-memory p50 µs | p99 µs | p50 ratio |");
    println!("|---|---|---|---|---|---|");
    let what = [
        "claim + release",
        "`board_set`",
        "`list_projects` right after the `board_set`",
        "`list_projects` alone (no write in the run)",
    ];
    for (k, what) in what.iter().enumerate() {
        let (dh, mh) = (&hists[0][k], &hists[1][k]);
        println!(
            "| {what} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}× |",
            us(dh, 0.5),
            us(dh, 0.99),
            us(mh, 0.5),
            us(mh, 0.99),
            us(dh, 0.5) / us(mh, 0.5)
        );
    }
    let ratio = |k: usize| us(&hists[0][k], 0.5) / us(&hists[1][k], 0.5);
    targets.lines.push((
        format!("{place}: a durable claim + release against an in-memory one"),
        None,
        format!("{:.2}× at p50", ratio(0)),
    ));
    targets.lines.push((
        format!("{place}: a plain tools/call with coordination kept against without"),
        None,
        format!(
            "{:.2}× at p50 alone, {:.2}× right after a write",
            ratio(3),
            ratio(2)
        ),
    ));
    Ok(())
}

/// [`alternate`] on replicas: one of this gateway's and one of the baseline's on one
/// nats-server, in namespaces of their own, each holding the project of its own sled.
async fn in_a_cluster(
    args: &Args,
    tmp: &TempDir,
    baseline: &std::path::Path,
    targets: &mut Targets,
) -> Res<()> {
    let (_nats, nats) = replicas::start_nats(args, tmp)?;
    let names = sled_sim::demo_project_names(1);
    let projects = registered(&names);
    let replica = |name: &str, namespace: &str| {
        let mut a = replicas::cluster_args(tmp, &nats, name);
        a.extend(["--cluster-namespace".into(), namespace.into()]);
        a
    };
    let (mut d, durable) = start_gateway(args, tmp, "d1", &projects, &replica("d1", "durable"))?;
    let (mut m, memory) = start_gateway_bin(
        args,
        tmp,
        "m1",
        &projects,
        &replica("m1", "memory"),
        Some(baseline),
    )?;
    let zero = ["--latency-ms".to_owned(), "0".to_owned()];
    let mut sd = start_sleds_with(args, tmp, "durable", durable, 1, None, &zero)?;
    let mut sm = start_sleds_with(args, tmp, "memory", memory, 1, None, &zero)?;
    let limit = Duration::from_secs(60);
    replicas::wait_held(durable, 1, |r| r == "d1", limit, &mut [&mut d, &mut sd]).await?;
    replicas::wait_held(memory, 1, |r| r == "m1", limit, &mut [&mut m, &mut sm]).await?;
    alternate(
        args,
        durable,
        memory,
        &names[0],
        "replicas on NATS",
        targets,
    )
    .await?;
    drop((sd, sm, d, m));
    Ok(())
}
