//! Deterministic simulation of the gateway under turmoil (the harness is `gateway_tests::sim`).
//!
//! - `sweep`: `DST_SEEDS` seeds (default 500), on every core; fails on any violation, and when
//!   the race story 1208 is about is (almost) never exercised, progress and cancellation
//!   never reach a sled in either era, or the rights are never exercised (writes refused,
//!   hidden projects answered as unknown, reads by callers that may only read, callers named
//!   to sleds that ask). Prints seeds per minute and simulated seconds per wall second.
//! - `same_seed_same_trace`: a sample of seeds run twice give the same trace hash.
//! - `planted_*`: the gateway with a planted bug must fail some of the first seeds; prints the
//!   detection rate, with and without faults.
//!
//! A failing seed prints `DST_SEED=<n>` and the command that replays it; `DST_SEED=<n>` runs only
//! that seed (printing its scenario and every violation), and `DST_LOG=debug` adds the logs of
//! every host.

use std::time::{Duration, Instant};

use gateway_core::PlantedBug;
use gateway_tests::sim::runner::{env_u64, run_parallel, seeds, sweep_seeds, threads};
use gateway_tests::sim::{self, FaultMode, Report, Scenario};
use sled_sim::script::{CancelHow, Era, Op, Outcome, Tool};
use sled_sim::sim_sled::Received;

/// Runs `scenarios` on every core, each thread with its own simulations; reports in order.
fn run_all(scenarios: Vec<Scenario>) -> Vec<Report> {
    run_parallel(&scenarios, sim::run)
}

fn replay_command(test: &str, seed: u64) -> String {
    sim::runner::replay_command("simulation", test, seed)
}

fn describe_failure(test: &str, s: &Scenario, r: &Report) -> String {
    let mut out = format!(
        "DST_SEED={}\n{s:?}\n  replay: {}\n",
        r.seed,
        replay_command(test, r.seed)
    );
    for v in r.violations.iter().take(12) {
        out.push_str(&format!("  - {v}\n"));
    }
    if r.violations.len() > 12 {
        out.push_str(&format!("  … and {} more\n", r.violations.len() - 12));
    }
    out
}

#[test]
fn sweep() {
    let seeds = sweep_seeds(500);
    let scenarios: Vec<Scenario> = seeds
        .iter()
        .map(|&seed| Scenario::draw(seed, FaultMode::Drawn, None))
        .collect();
    if seeds.len() == 1 {
        println!("{:?}", scenarios[0]);
    }
    let started = Instant::now();
    let reports = run_all(scenarios.clone());
    let wall = started.elapsed();
    let sim_time: Duration = reports.iter().map(|r| r.sim_time).sum();
    let exchanges: usize = reports.iter().map(|r| r.exchanges).sum();
    let covered = |faulty: bool| {
        let pick: Vec<&Report> = reports
            .iter()
            .zip(&scenarios)
            .filter(|(_, s)| s.faults.is_empty() != faulty)
            .map(|(r, _)| r)
            .collect();
        let hit = pick.iter().filter(|r| r.interleavings > 0).count();
        (hit, pick.len())
    };
    let (hit_clean, clean) = covered(false);
    let (hit_faulty, faulty) = covered(true);
    let hit = hit_clean + hit_faulty;
    let failures: Vec<String> = reports
        .iter()
        .zip(&scenarios)
        .filter(|(r, _)| !r.passed())
        .map(|(r, s)| describe_failure("sweep", s, r))
        .collect();
    println!(
        "sweep: {} seeds ({} with faults) in {:.1} s wall on {} threads: {:.0} seeds/min, {:.1} simulated s per wall s, {} requests",
        reports.len(),
        faulty,
        wall.as_secs_f64(),
        threads(),
        reports.len() as f64 / wall.as_secs_f64() * 60.0,
        sim_time.as_secs_f64() / wall.as_secs_f64(),
        exchanges,
    );
    println!(
        "coverage: another session's switch landed between a session's switch and its call in {hit}/{} seeds ({:.0} %): {hit_clean}/{clean} without faults, {hit_faulty}/{faulty} with",
        reports.len(),
        100.0 * hit as f64 / reports.len() as f64,
    );
    // What the faults produced: every outcome by kind, so a fault that stopped biting shows.
    let mut kinds: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for h in reports.iter().flat_map(|r| &r.histories) {
        for x in &h.exchanges {
            let kind = match &x.outcome {
                Outcome::Failed(_) => "no answer (client link faulted)".to_owned(),
                Outcome::Abandoned => "stream closed by the client (cancelled)".to_owned(),
                Outcome::Response(v) => match v.get("error") {
                    Some(e) => format!(
                        "{} {}{}",
                        e["code"],
                        e["data"]["kind"].as_str().unwrap_or("?"),
                        e["data"]["reason"]
                            .as_str()
                            .map_or(String::new(), |r| format!(" ({r})"))
                    ),
                    None if v["result"]["isError"] == true => "isError result".to_owned(),
                    None => "result".to_owned(),
                },
            };
            *kinds.entry(kind).or_default() += 1;
        }
    }
    println!("outcomes: {kinds:?}");
    // The surface beyond tools: reads, prompts, and sampling round trips through the gateway.
    let mut surface: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for h in reports.iter().flat_map(|r| &r.histories) {
        for x in &h.exchanges {
            let Outcome::Response(v) = &x.outcome else {
                continue;
            };
            let ok = v.get("result").is_some();
            let key = match (&x.op, ok) {
                (Op::ReadResource { .. }, true) => "resource reads answered",
                (Op::ReadResource { .. }, false) => "resource reads with an error",
                (Op::GetPrompt { .. }, true) => "prompt gets answered",
                (Op::GetPrompt { .. }, false) => "prompt gets with an error",
                (
                    Op::Call {
                        tool: Tool::Summarize,
                        ..
                    },
                    true,
                ) if v["result"]["isError"] != true => "sampling round trips",
                (
                    Op::Call {
                        tool: Tool::Summarize,
                        ..
                    },
                    true,
                ) if !h.sampling => "sampling refused (-32601, no capability)",
                (
                    Op::Call {
                        tool: Tool::Summarize,
                        ..
                    },
                    _,
                ) => "summarize_story otherwise",
                _ => continue,
            };
            *surface.entry(key).or_default() += 1;
        }
    }
    println!("surface: {surface:?}");
    let progress = progress_coverage(&reports);
    println!("progress and cancellation: {progress:?}");
    let rights = rights_coverage(&reports, &scenarios);
    println!("rights: {rights:?}");
    if std::env::var_os("DST_VERBOSE").is_some() {
        for (r, s) in reports.iter().zip(&scenarios) {
            println!(
                "seed {:>5}: {:>6.2} s wall, {:>6.1} s simulated, {:>2} sessions, {:>2} sleds, {} faults, {} requests",
                r.seed,
                r.wall.as_secs_f64(),
                r.sim_time.as_secs_f64(),
                s.sessions,
                s.projects.len(),
                s.faults.len(),
                r.exchanges
            );
        }
    }
    if seeds.len() == 1 {
        let r = &reports[0];
        println!(
            "trace hash {:016x}, simulated {:?}",
            r.trace_hash, r.sim_time
        );
        for v in &r.violations {
            println!("  - {v}");
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        reports.len(),
        failures.join("\n")
    );
    if reports.len() >= 50 {
        assert!(
            hit * 10 >= reports.len(),
            "the race is barely exercised: only {hit} of {} seeds had another session's switch between a session's switch and its call",
            reports.len()
        );
        for (key, what) in [
            (
                "stateless calls answered",
                "no stateless-era call was answered",
            ),
            (
                "progress relayed, session era",
                "no progress reached a session-era call",
            ),
            (
                "progress relayed, stateless era",
                "no progress reached a stateless-era call",
            ),
            (
                "sled cancels: notifications/cancelled",
                "no client's notifications/cancelled reached a sled",
            ),
            (
                "sled cancels: stream closed",
                "no stateless client's closed stream cancelled a call at its sled",
            ),
        ] {
            assert!(
                progress.get(key).copied().unwrap_or(0) > 0,
                "{what} in {} seeds: {progress:?}",
                reports.len()
            );
        }
        for (key, what) in [
            (
                "writes refused forbidden",
                "no write was refused for want of the right",
            ),
            (
                "hidden projects answered unknown_project",
                "no request named a project its caller may not see",
            ),
            (
                "no default: no_project_selected",
                "no session went without a default it may not see",
            ),
            (
                "read-only calls answered where only read is allowed",
                "no read-only tool was called by a caller that may only read",
            ),
            (
                "sled told the caller (forward_principal)",
                "no sled that asks was told who calls",
            ),
            ("forged callers sent", "no session forged a caller in _meta"),
            ("coordination answered", "no coordination tool was answered"),
        ] {
            assert!(
                rights.get(key).copied().unwrap_or(0) > 0,
                "{what} in {} seeds: {rights:?}",
                reports.len()
            );
        }
    }
}

/// How much the runs exercised the rights: refusals by kind, reads by callers that may only
/// read, callers named to sleds, forged callers, coordination.
fn rights_coverage(
    reports: &[Report],
    scenarios: &[Scenario],
) -> std::collections::BTreeMap<&'static str, usize> {
    let mut out: std::collections::BTreeMap<&'static str, usize> =
        std::collections::BTreeMap::new();
    let mut add = |k: &'static str, n: usize| *out.entry(k).or_default() += n;
    for (r, s) in reports.iter().zip(scenarios) {
        let a = &s.access;
        if a.rules {
            add("seeds with [[access]] rules", 1);
        }
        for h in &r.histories {
            let rights = a.rights(h.index, &s.projects);
            for x in &h.exchanges {
                if x.params["_meta"][sled_sim::script::PRINCIPAL_META].is_object() {
                    add("forged callers sent", 1);
                }
                let Outcome::Response(v) = &x.outcome else {
                    continue;
                };
                let kind = v["error"]["data"]["kind"].as_str();
                let named = v["error"]["data"]["project"].as_str().unwrap_or("");
                match kind {
                    Some("forbidden") if x.op.needs_write() == Some(true) => {
                        add("writes refused forbidden", 1)
                    }
                    Some("forbidden") => add("read-only calls refused (tools not listed yet)", 1),
                    Some("unknown_project") if s.projects.iter().any(|p| p == named) => {
                        add("hidden projects answered unknown_project", 1)
                    }
                    Some("no_project_selected") => add("no default: no_project_selected", 1),
                    _ => {}
                }
                let result = &v["result"];
                if matches!(x.op, Op::Coord { .. }) && result.is_object() {
                    add("coordination answered", 1);
                }
                if let (Op::Call { tool, .. }, Some(p)) =
                    (&x.op, result["structuredContent"]["project"].as_str())
                {
                    if tool.read_only() && rights.sees(p) && !rights.may(p, true) {
                        add("read-only calls answered where only read is allowed", 1);
                    }
                }
            }
        }
        for log in r.received.values() {
            for e in log {
                if let Received::Request {
                    principal: Some(_), ..
                } = e
                {
                    add("sled told the caller (forward_principal)", 1);
                }
            }
        }
    }
    out
}

/// How much the runs exercised progress and cancellation, in both eras: progress
/// notifications clients received, cancellations they made, and the cancellations the sleds
/// received, by what the client of the call did.
fn progress_coverage(reports: &[Report]) -> std::collections::BTreeMap<&'static str, usize> {
    let mut out: std::collections::BTreeMap<&'static str, usize> =
        std::collections::BTreeMap::new();
    let mut add = |k: &'static str, n: usize| *out.entry(k).or_default() += n;
    for r in reports {
        let mut by_nonce = std::collections::BTreeMap::new();
        for h in &r.histories {
            for x in &h.exchanges {
                by_nonce.insert(x.nonce.as_str(), x);
                let era = h.era == Era::Stateless;
                if era && matches!(x.outcome, Outcome::Response(_)) {
                    add("stateless calls answered", 1);
                }
                let notes = x.notifications.len();
                add(
                    if era {
                        "progress relayed, stateless era"
                    } else {
                        "progress relayed, session era"
                    },
                    notes,
                );
                match x.cancel.as_ref().map(|c| &c.how) {
                    Some(CancelHow::Notified(_)) => add("cancelled by notifications/cancelled", 1),
                    Some(CancelHow::Dropped) => add("cancelled by closing the stream", 1),
                    None => {}
                }
                if matches!(&x.outcome, Outcome::Response(v) if v["error"]["code"] == -32800) {
                    add("answered -32800 cancelled", 1);
                }
            }
        }
        for log in r.received.values() {
            for e in log {
                let Received::Cancelled {
                    request: Some(i), ..
                } = e
                else {
                    continue;
                };
                let Some(Received::Request {
                    nonce: Some(nonce), ..
                }) = log.get(*i)
                else {
                    add("sled cancels: the gateway's own requests", 1);
                    continue;
                };
                let key = match by_nonce.get(nonce.as_str()) {
                    Some(x) => match (x.cancel.as_ref().map(|c| &c.how), &x.outcome) {
                        (Some(CancelHow::Notified(_)), _) => {
                            "sled cancels: notifications/cancelled"
                        }
                        (Some(CancelHow::Dropped), _) => "sled cancels: stream closed",
                        (None, Outcome::Failed(_)) => "sled cancels: client gave up",
                        _ => "sled cancels: deadline",
                    },
                    None => "sled cancels: unknown request",
                };
                add(key, 1);
            }
        }
    }
    out
}

#[test]
fn same_seed_same_trace() {
    let sample: Vec<u64> = match env_u64("DST_SEED") {
        Some(seed) => vec![seed],
        None => vec![0, 1, 2, 3, 17, 42, 99, 123],
    };
    let scenarios: Vec<Scenario> = sample
        .iter()
        .map(|&seed| Scenario::draw(seed, FaultMode::Drawn, None))
        .collect();
    let twice: Vec<Scenario> = scenarios.iter().chain(&scenarios).cloned().collect();
    let reports = run_all(twice);
    let (a, b) = reports.split_at(sample.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (x.trace_hash, &x.violations, x.sim_time),
            (y.trace_hash, &y.violations, y.sim_time),
            "seed {} is not deterministic; replay: {}",
            x.seed,
            replay_command("same_seed_same_trace", x.seed)
        );
    }
    if a.len() > 1 {
        let distinct: std::collections::BTreeSet<u64> = a.iter().map(|r| r.trace_hash).collect();
        assert_eq!(distinct.len(), a.len(), "different seeds, different traces");
    }
}

/// Runs the planted bug over the first seeds, half without faults and half with; the suite
/// must catch it (each of `signs` showing up in some violation: the checks that must see it),
/// and a failing seed must replay to the same failure.
fn planted(test: &str, bug: PlantedBug, default_seeds: u64, signs: &[&str]) {
    let seeds = seeds(default_seeds, false);
    let mode = |seed: u64| {
        if seed & 1 == 0 {
            FaultMode::Never
        } else {
            FaultMode::Always
        }
    };
    let scenarios: Vec<Scenario> = seeds
        .iter()
        .map(|&seed| Scenario::draw(seed, mode(seed), Some(bug)))
        .collect();
    let reports = run_all(scenarios.clone());
    let rate = |faulty: bool| {
        let pick: Vec<&Report> = reports
            .iter()
            .filter(|r| (mode(r.seed) == FaultMode::Always) == faulty)
            .collect();
        let caught = pick.iter().filter(|r| !r.passed()).count();
        (caught, pick.len())
    };
    let (caught_clean, clean) = rate(false);
    let (caught_faulty, faulty) = rate(true);
    let caught = caught_clean + caught_faulty;
    let first = reports.iter().position(|r| !r.passed());
    println!(
        "{bug:?}: caught by {caught}/{} seeds ({:.0} % per seed): {caught_clean}/{clean} without faults, {caught_faulty}/{faulty} with; first caught at seed {:?}",
        reports.len(),
        100.0 * caught as f64 / reports.len().max(1) as f64,
        first.map(|i| reports[i].seed),
    );
    let Some(first) = first else {
        panic!("{bug:?} was not caught by any of {} seeds", reports.len());
    };
    let r = &reports[first];
    println!("{}", describe_failure(test, &scenarios[first], r));
    for sign in signs {
        let seen = reports
            .iter()
            .flat_map(|r| &r.violations)
            .any(|v| v.contains(sign));
        assert!(
            seen,
            "{bug:?} failed seeds, but no violation says {sign:?}; first failure:\n{}",
            describe_failure(test, &scenarios[first], r)
        );
    }
    let again = sim::run(&scenarios[first]);
    assert_eq!(
        (&again.violations, again.trace_hash),
        (&r.violations, r.trace_hash),
        "seed {} does not replay to the same failure",
        r.seed
    );
}

#[test]
fn planted_shared_active_project_is_caught() {
    planted(
        "planted_shared_active_project_is_caught",
        PlantedBug::SharedActiveProject,
        50,
        &[],
    );
}

#[test]
fn planted_correlate_by_client_id_is_caught() {
    planted(
        "planted_correlate_by_client_id_is_caught",
        PlantedBug::CorrelateByClientId,
        50,
        &[],
    );
}

#[test]
fn planted_progress_by_client_token_is_caught() {
    planted(
        "planted_progress_by_client_token_is_caught",
        PlantedBug::ProgressByClientToken,
        24,
        &["progress of another call reached", "ended with progress"],
    );
}

#[test]
fn planted_rights_ignore_read_only_is_caught() {
    planted(
        "planted_rights_ignore_read_only_is_caught",
        PlantedBug::RightsIgnoreReadOnly,
        24,
        &["which needs write", "was not refused"],
    );
}

#[test]
fn planted_hidden_projects_listed_is_caught() {
    planted(
        "planted_hidden_projects_listed_is_caught",
        PlantedBug::HiddenProjectsListed,
        24,
        &["which its caller may not see", "listing exactly"],
    );
}

#[test]
fn planted_cancel_across_sessions_is_caught() {
    planted(
        "planted_cancel_across_sessions_is_caught",
        PlantedBug::CancelAcrossSessions,
        24,
        &["never cancelled it", "neither cancelled it"],
    );
}
