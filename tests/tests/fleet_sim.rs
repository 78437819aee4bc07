//! The fleet tools in the deterministic simulation (the harness is `gateway_tests::sim::fleet`):
//! the real gateway, real sled uplinks and an MCP client on turmoil hosts.
//!
//! - `fanout_with_slow_and_dead_sleds`: `aggregate_pipeline_status` with sleds that are slow,
//!   never started, crashed before or during the call, or powered off during it.
//! - `impostor_is_refused_until_repinned`: a second sled with another key for a pinned project.
//! - `stalled_relays_show_stale`: `gateway_health` with stalled relays, a crash, a project that
//!   never connected.
//! - `fleet_same_seed_same_trace`: one seed of each, run twice, gives the same trace.
//!
//! Each test runs `DST_SEEDS` seeds (a handful by default) on every core. A failing seed prints
//! `DST_SEED=<n>` and the command that replays it; `DST_SEED=<n>` runs only that seed and prints
//! its scenario and the client's trace; `DST_LOG=debug` adds every host's logs.

use std::time::Instant;

use gateway_tests::sim::fleet::{
    run_fanout, run_impostor, run_relay, FanoutScenario, FleetReport, ImpostorScenario,
    RelayScenario,
};
use gateway_tests::sim::runner::{
    assert_all_passed, assert_same_run, replay_command, run_parallel, summary, sweep_seeds,
};

/// Runs `run` over the test's seeds, prints what happened, and fails with every failing seed.
fn sweep<S: Sync>(
    test: &str,
    default_seeds: u64,
    draw: impl Fn(u64) -> S,
    run: impl Fn(&S) -> FleetReport + Sync,
) {
    let scenarios: Vec<S> = sweep_seeds(default_seeds).into_iter().map(draw).collect();
    let started = Instant::now();
    let reports = run_parallel(&scenarios, run);
    summary(test, &reports, started.elapsed().as_secs_f64());
    assert_all_passed("fleet_sim", test, &reports);
}

#[test]
fn fanout_with_slow_and_dead_sleds() {
    sweep(
        "fanout_with_slow_and_dead_sleds",
        64,
        FanoutScenario::draw,
        run_fanout,
    );
}

#[test]
fn impostor_is_refused_until_repinned() {
    sweep(
        "impostor_is_refused_until_repinned",
        32,
        ImpostorScenario::draw,
        run_impostor,
    );
}

#[test]
fn stalled_relays_show_stale() {
    sweep(
        "stalled_relays_show_stale",
        48,
        RelayScenario::draw,
        run_relay,
    );
}

#[test]
fn fleet_same_seed_same_trace() {
    let seed = gateway_tests::sim::runner::env_u64("DST_SEED").unwrap_or(3);
    type Run = Box<dyn Fn() -> FleetReport + Sync>;
    let runs: Vec<(&str, Run)> = vec![
        (
            "fan-out",
            Box::new(move || run_fanout(&FanoutScenario::draw(seed))),
        ),
        (
            "impostor",
            Box::new(move || run_impostor(&ImpostorScenario::draw(seed))),
        ),
        (
            "relay",
            Box::new(move || run_relay(&RelayScenario::draw(seed))),
        ),
    ];
    let twice: Vec<usize> = (0..runs.len()).chain(0..runs.len()).collect();
    let reports = run_parallel(&twice, |i| runs[*i].1());
    let (a, b) = reports.split_at(runs.len());
    for ((name, _), (x, y)) in runs.iter().zip(a.iter().zip(b)) {
        assert_same_run(
            &format!("the {name} run of seed {seed}"),
            &replay_command("fleet_sim", "fleet_same_seed_same_trace", seed),
            x.run_trace(),
            y.run_trace(),
        );
        assert_eq!(
            x.violations, y.violations,
            "the {name} run of seed {seed}: same trace, different verdicts"
        );
    }
}
