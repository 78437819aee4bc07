//! `--run durable-coord` (issue 25): what keeping coordination durable costs. Two single
//! gateways side by side in one run, each with a state directory of its own: this one, which
//! answers a coordination write only once it is synced to `state.redb`, and
//! `--baseline-gateway-bin`, built before coordination was kept (bc9971d: its sessions are in
//! the store, its leases and board in memory only). No sleds: coordination needs none.
//!
//! - one session on each, alternating call by call (so the machine's noise falls on both):
//!   a claim + release round trip, and a `board_set`;
//! - 64 sessions writing the board at once for `--duration-secs`, on one gateway and then the
//!   other: writes per second (group commit: the writes waiting together share one sync).

use std::time::{Duration, Instant};

use super::{
    client::Conn, new_hist, open_sessions, start_gateway_bin, timed_call, Args, Res, Targets,
    TempDir,
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
    let mut d = Conn::connect(durable).await.map_err(|e| e.to_string())?;
    d.initialize("/mcp").await.map_err(|e| e.to_string())?;
    let mut m = Conn::connect(memory).await.map_err(|e| e.to_string())?;
    m.initialize("/mcp").await.map_err(|e| e.to_string())?;

    let n = args.coord_calls;
    let resource = r#"{"project":"alpha","resource":"story:bench"}"#;
    let (mut lease_d, mut lease_m, mut board_d, mut board_m) =
        (new_hist(), new_hist(), new_hist(), new_hist());
    for i in 0..n + n / 10 {
        let id = 10 + 4 * i as u64;
        let board = format!(r#"{{"project":"alpha","key":"bench","value":{i}}}"#);
        for (c, lease, board_h) in [
            (&mut d, &mut lease_d, &mut board_d),
            (&mut m, &mut lease_m, &mut board_m),
        ] {
            let t = Instant::now();
            let (v, _) = timed_call(c, id, "claim", resource).await?;
            if v["result"]["structuredContent"]["acquired"] != true {
                return Err(format!("claim not acquired: {v}"));
            }
            let (v, _) = timed_call(c, id + 1, "release", resource).await?;
            ok(&v, "release")?;
            let took_lease = t.elapsed();
            let (v, took_board) = timed_call(c, id + 2, "board_set", &board).await?;
            ok(&v, "board_set")?;
            if i >= n / 10 {
                lease.saturating_record(took_lease.as_nanos() as u64);
                board_h.saturating_record(took_board.as_nanos() as u64);
            }
        }
    }
    println!("| one session ({n} each, alternating) | durable p50 µs | p99 µs | in-memory p50 µs | p99 µs | p50 ratio |");
    println!("|---|---|---|---|---|---|");
    for (what, dh, mh) in [
        ("claim + release", &lease_d, &lease_m),
        ("`board_set`", &board_d, &board_m),
    ] {
        println!(
            "| {what} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}× |",
            us(dh, 0.5),
            us(dh, 0.99),
            us(mh, 0.5),
            us(mh, 0.99),
            us(dh, 0.5) / us(mh, 0.5)
        );
    }
    targets.lines.push((
        "a durable claim + release against an in-memory one".into(),
        None,
        format!("{:.2}× at p50", us(&lease_d, 0.5) / us(&lease_m, 0.5)),
    ));

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
