//! `--run restart` (issue 25): how long a single gateway takes to come back with a full state
//! directory: `--restart-sessions` sessions (10,000 by default), a lease held by each (as many
//! leases), and `--restart-board-keys` board keys (100,000, over 10 projects: each project's
//! board holds at most 10,000). Filled through the gateway itself, 64 connections at a time;
//! then the gateway is stopped with SIGTERM and started again on the same directory, and then
//! killed with `kill -9` and started again. Each restart is timed to the first accepted
//! connection and to the first answers, which must show the state whole: a session's lease
//! (from its own session, so the session is there too) and the last board key written.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{
    client::Conn, open_sessions, procs, start_gateway_bin, timed_call, Args, Res, Targets, TempDir,
};

/// Projects the state is spread over.
const PROJECTS: usize = 10;
/// Connections filling the state at once.
const WORKERS: usize = 64;

/// A session's headers, as [`open_sessions`] gives them.
type Session = super::SessionHeaders;

fn project(i: usize) -> String {
    format!("p{}", i % PROJECTS)
}

/// Calls `tool` with `arguments(i)` for every `i` in `0..n`, spread over [`WORKERS`]
/// connections, in session `i % sessions.len()`.
async fn fill(
    addr: SocketAddr,
    sessions: &[Session],
    n: usize,
    tool: &'static str,
    arguments: fn(usize) -> String,
) -> Res<Duration> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let mine: Vec<(usize, Session)> = (w..n)
            .step_by(WORKERS)
            .map(|i| (i, sessions[i % sessions.len()].clone()))
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
            for (i, (session, version)) in mine {
                c.session = session;
                c.version = version;
                let (v, _) = timed_call(&mut c, i as u64 + 1, tool, &arguments(i)).await?;
                if v["result"].is_null() || v["result"]["isError"] == true {
                    return Err(format!("{tool} {i} failed: {v}"));
                }
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(started.elapsed())
}

/// Starts the gateway (as `tag`) on the state directory: the time until it accepts a
/// connection, and until its first answers show the state whole (session 0's lease, and the
/// last board key).
async fn back(
    args: &Args,
    tmp: &TempDir,
    (tag, projects, extra): (&str, &[(String, String)], &[String]),
    sessions: &[Session],
    keys: usize,
) -> Res<(procs::Proc, Duration, Duration)> {
    let started = Instant::now();
    // It returns once the gateway accepts connections.
    let (gw, addr) = start_gateway_bin(args, tmp, tag, projects, extra, None)?;
    let listening = started.elapsed();
    let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
    (c.session, c.version) = sessions[0].clone();
    let (v, _) = timed_call(
        &mut c,
        1,
        "claims",
        &format!(r#"{{"project":"{}"}}"#, project(0)),
    )
    .await?;
    let leases = v["result"]["structuredContent"]["leases"]
        .as_array()
        .map_or(0, Vec::len);
    if leases == 0 {
        return Err(format!(
            "session 0's project lists no lease after a restart: {v}"
        ));
    }
    let last = keys - 1;
    let (v, _) = timed_call(
        &mut c,
        2,
        "board_get",
        &format!(r#"{{"project":"{}","key":"k{last}"}}"#, project(last)),
    )
    .await?;
    if v["result"]["structuredContent"]["value"] != last {
        return Err(format!("board key k{last} after a restart: {v}"));
    }
    Ok((gw, listening, started.elapsed()))
}

pub(super) async fn restart(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    let (n_sessions, n_keys) = (args.restart_sessions, args.restart_board_keys);
    println!(
        "\n## Restart with a full state directory (issue 25): {n_sessions} sessions, {n_sessions} leases, {n_keys} board keys\n"
    );
    let projects: Vec<(String, String)> = (0..PROJECTS)
        .map(|i| (project(i), "http://127.0.0.1:9".to_owned()))
        .collect();
    let state = tmp.path.join("state-restart");
    let limit = (n_sessions + 16).to_string();
    let extra: Vec<String> = [
        "--state-dir",
        &state.display().to_string(),
        "--max-sessions",
        &limit,
        "--max-sessions-per-identity",
        &limit,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (gw, addr) = start_gateway_bin(args, tmp, "restart", &projects, &extra, None)?;
    let t = Instant::now();
    let sessions = open_sessions(addr, n_sessions, 16).await?;
    let took_sessions = t.elapsed();
    let took_leases = fill(addr, &sessions, n_sessions, "claim", |i| {
        format!(
            r#"{{"project":"{}","resource":"story:{i}","ttl_s":3600}}"#,
            project(i)
        )
    })
    .await?;
    let took_board = fill(addr, &sessions, n_keys, "board_set", |i| {
        format!(r#"{{"project":"{}","key":"k{i}","value":{i}}}"#, project(i))
    })
    .await?;
    let file = state.join("state.redb");
    let mib = std::fs::metadata(&file).map_or(0.0, |m| m.len() as f64 / (1024.0 * 1024.0));
    println!(
        "filled through the gateway: {n_sessions} sessions in {:.1} s, {n_sessions} leases in {:.1} s, {n_keys} board keys in {:.1} s; state.redb {mib:.1} MiB\n",
        took_sessions.as_secs_f64(),
        took_leases.as_secs_f64(),
        took_board.as_secs_f64()
    );
    println!("| restart | stop s | to listening s | to the state answered s |");
    println!("|---|---|---|---|");
    // SIGTERM: dropping the process stops it so, and waits for it to exit.
    let t = Instant::now();
    drop(gw);
    let stop = t.elapsed();
    let (mut gw, listening, answered) = back(
        args,
        tmp,
        ("restart-term", &projects, &extra),
        &sessions,
        n_keys,
    )
    .await?;
    println!(
        "| after SIGTERM | {:.2} | {:.2} | {:.2} |",
        stop.as_secs_f64(),
        listening.as_secs_f64(),
        answered.as_secs_f64()
    );
    gw.kill9();
    let (_gw, listening_k, answered_k) = back(
        args,
        tmp,
        ("restart-kill", &projects, &extra),
        &sessions,
        n_keys,
    )
    .await?;
    println!(
        "| after kill -9 | – | {:.2} | {:.2} |",
        listening_k.as_secs_f64(),
        answered_k.as_secs_f64()
    );
    targets.lines.push((
        format!("a single gateway restarts with {n_sessions} sessions, {n_sessions} leases and {n_keys} board keys"),
        None,
        format!(
            "state answered {:.2} s after a start (SIGTERM), {:.2} s (kill -9)",
            answered.as_secs_f64(),
            answered_k.as_secs_f64()
        ),
    ));
    Ok(())
}
