//! `--run coord`: what coordination costs. Side by side in one run, alternating call by call so
//! that the machine's noise falls on both sides alike:
//!
//! - a claim + release round trip against two plain `tools/call`s of a project tool (`whoami`)
//!   of the same size;
//! - a fenced write (`move_story` on a story the session holds a lease on: the lease check and
//!   the fence in `_meta`) against an unfenced one (`move_story` on a story nobody holds);
//! - `--coord-waiters` sessions parked in `wait` at once, each on an HTTP connection of its own:
//!   the gateway's RSS before and after, and the time from one channel message to the last
//!   waiter's answer.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{
    client::Conn, cpu_secs, metric, new_hist, open_sessions, registered, start_gateway,
    start_sleds_with, timed_call, vm_kib, wait_live, Args, Res, Targets, TempDir,
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

pub(super) async fn coord(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    let names = sled_sim::demo_project_names(2);
    let projects = registered(&names);
    let beta = &names[1];
    println!(
        "\n## Coordination: lease round trips, fenced writes, {} parked waits\n",
        args.coord_waiters
    );
    // Room for every waiter's session beside the measuring one.
    let room = [
        "--max-sessions".to_owned(),
        (args.coord_waiters + 16).to_string(),
    ];
    let (mut gw, addr) = start_gateway(args, tmp, "coord", &projects, &room)?;
    let zero = ["--latency-ms".to_owned(), "0".to_owned()];
    let mut sleds = start_sleds_with(args, tmp, "coord", addr, 2, None, &zero)?;
    wait_live(addr, 2, Duration::from_secs(60), &mut [&mut gw, &mut sleds]).await?;
    let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
    c.initialize("/mcp").await.map_err(|e| e.to_string())?;
    let mut stories = Vec::new();
    for i in 0..2 {
        let (v, _) = timed_call(
            &mut c,
            i,
            "create_story",
            &format!(r#"{{"project":"{beta}","name":"bench {i}","acceptance_criteria":["a"]}}"#),
        )
        .await?;
        ok(&v, "create_story")?;
        let id = v["result"]["structuredContent"]["story"]["id"]
            .as_str()
            .ok_or("create_story gave no story id")?
            .to_owned();
        stories.push(id);
    }
    let n = args.coord_calls;
    let resource = format!(
        r#"{{"project":"{beta}","resource":"story:{}"}}"#,
        stories[0]
    );
    let whoami = format!(r#"{{"project":"{beta}"}}"#);
    let (mut lease, mut plain) = (new_hist(), new_hist());
    let cpu0 = cpu_secs(gw.pid());
    for i in 0..n + n / 10 {
        let id = 10 + 4 * i as u64;
        let t = Instant::now();
        let (v, _) = timed_call(&mut c, id, "claim", &resource).await?;
        if v["result"]["structuredContent"]["acquired"] != true {
            return Err(format!("claim not acquired: {v}"));
        }
        let (v, _) = timed_call(&mut c, id + 1, "release", &resource).await?;
        ok(&v, "release")?;
        let took_lease = t.elapsed();
        let t = Instant::now();
        let (v, _) = timed_call(&mut c, id + 2, "whoami", &whoami).await?;
        ok(&v, "whoami")?;
        let (v, _) = timed_call(&mut c, id + 3, "whoami", &whoami).await?;
        ok(&v, "whoami")?;
        let took_plain = t.elapsed();
        if i >= n / 10 {
            lease.saturating_record(took_lease.as_nanos() as u64);
            plain.saturating_record(took_plain.as_nanos() as u64);
        }
    }
    let cpu = cpu_secs(gw.pid()) - cpu0;
    println!("| round trip ({n} each, alternating) | p50 µs | p99 µs |");
    println!("|---|---|---|");
    println!(
        "| claim + release (gateway only) | {:.1} | {:.1} |",
        us(&lease, 0.5),
        us(&lease, 0.99)
    );
    println!(
        "| two `whoami` tools/calls (gateway + sled) | {:.1} | {:.1} |",
        us(&plain, 0.5),
        us(&plain, 0.99)
    );
    let ratio = us(&lease, 0.5) / us(&plain, 0.5);
    println!(
        "\nclaim+release / two tools/calls, p50: {ratio:.2}× (gateway CPU over both: {:.1} µs per pair)",
        cpu * 1e6 / (2 * (n + n / 10)) as f64
    );
    targets.lines.push((
        "claim + release round trip against two plain tools/calls".into(),
        None,
        format!("{ratio:.2}× at p50"),
    ));

    // Fenced against unfenced writes.
    let held = format!(
        r#"{{"project":"{beta}","resource":"story:{}","ttl_s":3600}}"#,
        stories[0]
    );
    let (v, _) = timed_call(&mut c, 1, "claim", &held).await?;
    if v["result"]["structuredContent"]["acquired"] != true {
        return Err(format!("claim for the fenced writes: {v}"));
    }
    let (mut fenced, mut unfenced) = (new_hist(), new_hist());
    let stages = ["in_progress", "review"];
    for i in 0..n + n / 10 {
        let stage = stages[i % 2];
        let id = 100_000 + 2 * i as u64;
        let (v, f) = timed_call(
            &mut c,
            id,
            "move_story",
            &format!(
                r#"{{"project":"{beta}","story_id":"{}","stage":"{stage}"}}"#,
                stories[0]
            ),
        )
        .await?;
        ok(&v, "fenced move_story")?;
        let (v, u) = timed_call(
            &mut c,
            id + 1,
            "move_story",
            &format!(
                r#"{{"project":"{beta}","story_id":"{}","stage":"{stage}"}}"#,
                stories[1]
            ),
        )
        .await?;
        ok(&v, "unfenced move_story")?;
        if i >= n / 10 {
            fenced.saturating_record(f.as_nanos() as u64);
            unfenced.saturating_record(u.as_nanos() as u64);
        }
    }
    println!("\n| write ({n} each, alternating) | p50 µs | p99 µs |");
    println!("|---|---|---|");
    println!(
        "| fenced `move_story` (lease checked, fence attached and checked by the sled) | {:.1} | {:.1} |",
        us(&fenced, 0.5),
        us(&fenced, 0.99)
    );
    println!(
        "| unfenced `move_story` (lease checked, none held) | {:.1} | {:.1} |",
        us(&unfenced, 0.5),
        us(&unfenced, 0.99)
    );
    let ratio = us(&fenced, 0.5) / us(&unfenced, 0.5);
    println!("\nfenced / unfenced, p50: {ratio:.2}×");
    targets.lines.push((
        "a fenced write against an unfenced one".into(),
        None,
        format!("{ratio:.2}× at p50"),
    ));

    // Parked waits.
    let w = args.coord_waiters;
    let pid = gw.pid();
    let mib = |field| vm_kib(pid, field) as f64 / 1024.0;
    let before = mib("VmRSS");
    let t = Instant::now();
    let ids = open_sessions(addr, w, 32).await?;
    let sessions_at = t.elapsed();
    let wait = Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"wait","arguments":{{"projects":["{beta}"],"timeout_s":25}}}}}}"#
    ));
    let t = Instant::now();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for (session, version) in ids {
        let wait = wait.clone();
        let done = done_tx.clone();
        tokio::spawn(async move {
            let answer = async {
                let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
                c.session = session;
                c.version = version;
                let a = c.post("/mcp", wait).await.map_err(|e| e.to_string())?;
                let v: serde_json::Value =
                    serde_json::from_slice(&a.body).map_err(|e| e.to_string())?;
                Ok::<bool, String>(v["result"]["structuredContent"]["woke"] == true)
            }
            .await;
            let _ = done.send((Instant::now(), answer));
        });
    }
    drop(done_tx);
    let parked_by = Instant::now() + Duration::from_secs(20);
    let parked = loop {
        let parked = metric(addr, "gateway_coord_waits_parked").await?;
        if parked as usize >= w || Instant::now() > parked_by {
            break parked;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let parking = t.elapsed();
    let during = mib("VmRSS");
    let sent = Instant::now();
    let (v, _) = timed_call(
        &mut c,
        9,
        "send",
        &format!(r#"{{"project":"{beta}","body":"wake up"}}"#),
    )
    .await?;
    ok(&v, "send")?;
    let (mut woke, mut failed, mut last) = (0usize, 0usize, sent);
    let mut spread = new_hist();
    while let Some((at, answer)) = done_rx.recv().await {
        match answer {
            Ok(true) => {
                woke += 1;
                last = last.max(at);
                spread.saturating_record(at.saturating_duration_since(sent).as_nanos() as u64);
            }
            Ok(false) => failed += 1,
            Err(e) => {
                if failed == 0 {
                    println!("first failed waiter: {e}");
                }
                failed += 1;
            }
        }
    }
    let all = last.saturating_duration_since(sent);
    println!(
        "\n{w} sessions made in {:.1} s; {parked} waits parked after {:.1} s; gateway RSS {before:.1} MiB before, {during:.1} MiB with them parked ({:.1} KiB per parked wait)",
        sessions_at.as_secs_f64(),
        parking.as_secs_f64(),
        (during - before) * 1024.0 / w.max(1) as f64
    );
    println!(
        "one channel message → {woke} waiters answered (woke), {failed} not; from the send to the last answer {:.1} ms (p50 {:.1} ms, p99 {:.1} ms)",
        all.as_secs_f64() * 1e3,
        spread.value_at_quantile(0.5) as f64 / 1e6,
        spread.value_at_quantile(0.99) as f64 / 1e6
    );
    targets.lines.push((
        format!("{w} sessions parked in wait; one channel message wakes every one"),
        Some(woke == w && failed == 0),
        format!(
            "{woke}/{w} woke, last after {:.1} ms; RSS +{:.1} MiB",
            all.as_secs_f64() * 1e3,
            during - before
        ),
    ));
    drop(sleds);
    drop(gw);
    Ok(())
}
