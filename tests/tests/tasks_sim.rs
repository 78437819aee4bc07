//! Tasks (issue 27) under turmoil (the harness and its oracle are `gateway_tests::sim::tasks`):
//! the real gateway, real sled uplinks whose task ids collide across projects, and sessions of
//! two principals making, polling, listing, waiting on and cancelling `run_tests` tasks in both
//! eras, and using ids that are not theirs, under sled power losses, partitions and latency
//! spikes drawn from the seed.
//!
//! - `tasks_sweep`: `DST_SEEDS` seeds (default 48; with `DST_FRESH_FROM`, a quarter fresh), on
//!   every core; fails on any violation, and (from 24 seeds) when a part of the surface was
//!   never exercised (tasks made in either era, results, cancels acknowledged, listings that
//!   paged, others' and raw ids refused, status and progress notifications, 2026-07-28
//!   `subscriptions/listen` acknowledgements and `notifications/tasks` with results).
//! - `tasks_same_seed_same_trace`: one seed run twice gives the same trace.
//! - `tasks_planted_*_is_caught`: the gateway with `PlantedBug::TaskIdsUnsealed` (a caller's id
//!   taken as a sled's own in its default project) and `PlantedBug::TasksListUnfiltered`
//!   (`tasks/list` shows everyone's tasks), and `PlantedBug::TaskCancelNotSent` (a 2025-11-25
//!   cancel acknowledged `cancelled` on a `tasks/get`: the sled never hears of it, for rule
//!   (c)) must fail some of 8 fixed seeds (half without
//!   faults), with a violation that shows the leak, and the first failing seed must replay to
//!   the same violations. Each prints its seeds-to-detection.
//!
//! A failing seed prints `DST_SEED=<n>` and the command that replays it; `DST_SEED=<n>` runs only
//! that seed and prints its scenario and trace; `DST_LOG=debug` adds every host's logs.

use std::time::Instant;

use gateway_core::PlantedBug;
use gateway_tests::sim::runner::{
    self, assert_all_passed, assert_same_run, env_u64, replay_command, run_parallel, seeds,
    summary, sweep_seeds,
};
use gateway_tests::sim::tasks::{run_tasks, TaskScenario, TasksReport};
use gateway_tests::sim::FaultMode;

#[test]
fn tasks_sweep() {
    let test = "tasks_sweep";
    let scenarios: Vec<TaskScenario> = sweep_seeds(48)
        .into_iter()
        .map(|seed| TaskScenario::draw(seed, FaultMode::Drawn, None))
        .collect();
    let started = Instant::now();
    let reports = run_parallel(&scenarios, run_tasks);
    summary(test, &reports, started.elapsed().as_secs_f64());
    assert_all_passed("tasks_sim", test, &reports);
    if reports.len() >= 24 {
        let mut total = std::collections::BTreeMap::new();
        for r in &reports {
            for (k, n) in &r.coverage {
                *total.entry(k.as_str()).or_insert(0usize) += n;
            }
        }
        for key in [
            "tasks made, 2025-11-25",
            "tasks made, 2026-07-28",
            "results, 2025-11-25",
            "results inlined, 2026-07-28",
            "cancels acknowledged",
            "listings completed",
            "tasks listed",
            "others' ids refused unknown_task",
            "raw ids refused unknown_task",
            "status notifications",
            "progress notifications",
            "subscriptions acknowledged",
            "task notifications, 2026-07-28",
            "results notified, 2026-07-28",
            "requests of a session begun again (gateway power loss)",
        ] {
            assert!(
                total.get(key).copied().unwrap_or(0) > 0,
                "never exercised in {} seeds: {key}; coverage {total:?}",
                reports.len()
            );
        }
        let paged = reports
            .iter()
            .filter(|r| r.coverage.get("list pages") > r.coverage.get("listings completed"))
            .count();
        assert!(paged > 0, "no listing ever followed a nextCursor");
    }
}

#[test]
fn tasks_same_seed_same_trace() {
    let seed = env_u64("DST_SEED").unwrap_or(3);
    let s = TaskScenario::draw(seed, FaultMode::Always, None);
    let runs = run_parallel(&[0, 1], |_| run_tasks(&s));
    let (x, y) = (&runs[0], &runs[1]);
    assert_same_run(
        &format!("seed {seed}"),
        &replay_command("tasks_sim", "tasks_same_seed_same_trace", seed),
        x.run_trace(),
        y.run_trace(),
    );
    assert_eq!(
        x.violations, y.violations,
        "seed {seed}: same trace, different verdicts"
    );
}

/// Runs the gateway with `bug` planted over the first `default_seeds` seeds, even ones without
/// faults, odd ones with; some must fail, some violation must say each of `signs` (the checks
/// that see the leak itself), and the first failing seed must replay to the same violations.
fn planted(test: &str, bug: PlantedBug, default_seeds: u64, signs: &[&str]) {
    let scenarios: Vec<TaskScenario> = seeds(default_seeds, false)
        .into_iter()
        .map(|seed| {
            let faults = if seed % 2 == 0 {
                FaultMode::Never
            } else {
                FaultMode::Always
            };
            TaskScenario::draw(seed, faults, Some(bug))
        })
        .collect();
    let started = Instant::now();
    let reports: Vec<TasksReport> = run_parallel(&scenarios, run_tasks);
    summary(test, &reports, started.elapsed().as_secs_f64());
    let caught = reports.iter().filter(|r| !r.passed()).count();
    let first = reports.iter().position(|r| !r.passed());
    println!(
        "{bug:?}: caught by {caught}/{} seeds ({:.0} % per seed); seeds to detection: {}",
        reports.len(),
        100.0 * caught as f64 / reports.len().max(1) as f64,
        first.map_or("none".to_owned(), |i| format!(
            "{} (first caught at seed {})",
            i + 1,
            reports[i].seed
        )),
    );
    let Some(first) = first else {
        panic!("{bug:?} was not caught by any of {} seeds", reports.len());
    };
    let r = &reports[first];
    println!("{}", runner::describe("tasks_sim", test, r));
    for sign in signs {
        let shown = reports
            .iter()
            .position(|r| r.violations.iter().any(|v| v.contains(sign)));
        println!(
            "{bug:?}: {} of {} seeds show {sign:?}; seeds to detection by it: {}",
            reports
                .iter()
                .filter(|r| r.violations.iter().any(|v| v.contains(sign)))
                .count(),
            reports.len(),
            shown.map_or("none".to_owned(), |i| (i + 1).to_string()),
        );
        assert!(
            shown.is_some(),
            "{bug:?} failed seeds, but no violation says {sign:?}; first failure:\n{}",
            runner::describe("tasks_sim", test, r)
        );
    }
    let again = run_tasks(&scenarios[first]);
    assert_eq!(
        (&again.violations, again.trace_hash),
        (&r.violations, r.trace_hash),
        "seed {} does not replay to the same failure",
        r.seed
    );
}

#[test]
fn tasks_planted_task_ids_unsealed_is_caught() {
    planted(
        "tasks_planted_task_ids_unsealed_is_caught",
        PlantedBug::TaskIdsUnsealed,
        8,
        &["was answered with"],
    );
}

#[test]
fn tasks_planted_tasks_list_unfiltered_is_caught() {
    planted(
        "tasks_planted_tasks_list_unfiltered_is_caught",
        PlantedBug::TasksListUnfiltered,
        8,
        &["tasks/list showed"],
    );
}

#[test]
fn tasks_planted_task_cancel_not_sent_is_caught() {
    planted(
        "tasks_planted_task_cancel_not_sent_is_caught",
        PlantedBug::TaskCancelNotSent,
        8,
        &["though its cancel was acknowledged"],
    );
}
