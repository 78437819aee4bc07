//! Running seeds: which seeds a test runs (`DST_SEED`, `DST_SEEDS`), on how many threads
//! (`DST_THREADS`), and the command that replays one. Shared by `tests/tests/simulation.rs` and
//! `tests/tests/fleet_sim.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// An environment variable as a number, if set and numeric.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The seeds a test runs: only `DST_SEED` when set, else `default` seeds from 0
/// (`DST_SEEDS` overrides the count when `sized`).
pub fn seeds(default: u64, sized: bool) -> Vec<u64> {
    if let Some(seed) = env_u64("DST_SEED") {
        return vec![seed];
    }
    let n = if sized {
        env_u64("DST_SEEDS").unwrap_or(default)
    } else {
        default
    };
    (0..n).collect()
}

/// The seeds a sweep runs: only `DST_SEED` when set; else `DST_SEEDS` (or `default`) seeds, of
/// which, when `DST_FRESH_FROM` names a start, the last quarter are fresh ones from that start
/// instead of fixed ones from 0. CI takes the start from the commit id, so each run keeps the
/// same cost and most fixed seeds while, over many commits, thousands more are looked at; a
/// failing fresh seed prints its `DST_SEED` like any other.
pub fn sweep_seeds(default: u64) -> Vec<u64> {
    let all = seeds(default, true);
    let Some(start) = env_u64("DST_FRESH_FROM").filter(|_| !replaying()) else {
        return all;
    };
    fresh_window(all.len() as u64, start)
}

/// `n` seeds: the first three quarters from 0, the rest from `start`.
fn fresh_window(n: u64, start: u64) -> Vec<u64> {
    let fresh = n / 4;
    (0..n - fresh)
        .chain(start..start.saturating_add(fresh))
        .collect()
}

/// Whether `DST_SEED` names one seed to replay.
pub fn replaying() -> bool {
    env_u64("DST_SEED").is_some()
}

/// Threads to run seeds on: `DST_THREADS`, else one per core.
pub fn threads() -> usize {
    env_u64("DST_THREADS")
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1)
}

/// Runs `run` on every item, on [`threads`] threads (each run builds its own simulation);
/// the results in the items' order.
pub fn run_parallel<I: Sync, R: Send>(items: &[I], run: impl Fn(&I) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads().min(items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = run(item);
                results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

/// The command that replays `seed` of test `test` in the test binary `binary`.
pub fn replay_command(binary: &str, test: &str, seed: u64) -> String {
    format!(
        "DST_SEED={seed} cargo test -p gateway-tests --test {binary} {test} -- --exact --nocapture"
    )
}

/// The text a panic was raised with (empty when it was not a string).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// What one seed's run of a network simulation (`cluster`, `coord`, `fleet`) found.
#[derive(Debug, Clone)]
pub struct SweepReport {
    pub seed: u64,
    /// The drawn scenario, for the failure message.
    pub scenario: String,
    /// Everything the oracle objects to; empty for a passing run.
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    /// FNV-1a over the trace and the simulated time.
    pub trace_hash: u64,
    pub sim_time: Duration,
    /// Wall-clock time the run took (not part of the trace).
    pub wall: Duration,
    /// What the run exercised, summed over seeds by [`summary`].
    pub coverage: BTreeMap<String, usize>,
}

impl SweepReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// Its trace, for [`assert_same_run`].
    pub fn run_trace(&self) -> RunTrace<'_> {
        RunTrace {
            trace: &self.trace,
            trace_hash: self.trace_hash,
            sim_time: self.sim_time,
        }
    }
}

/// A failed seed of test `test` in test binary `binary`: its `DST_SEED`, scenario, replay
/// command and first violations.
pub fn describe(binary: &str, test: &str, r: &SweepReport) -> String {
    const SHOWN: usize = 16;
    let mut out = format!(
        "DST_SEED={}\n{}\n  replay: {}\n",
        r.seed,
        r.scenario,
        replay_command(binary, test, r.seed)
    );
    for v in r.violations.iter().take(SHOWN) {
        out.push_str(&format!("  - {v}\n"));
    }
    if r.violations.len() > SHOWN {
        out.push_str(&format!("  … and {} more\n", r.violations.len() - SHOWN));
    }
    out
}

/// Fails, describing each, if any seed failed.
pub fn assert_all_passed(binary: &str, test: &str, reports: &[SweepReport]) {
    let failures: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| describe(binary, test, r))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        reports.len(),
        failures.join("\n")
    );
}

/// Prints a sweep's size, time and coverage; when replaying one seed, also its scenario and
/// trace.
pub fn summary(test: &str, reports: &[SweepReport], wall: f64) {
    let simulated: f64 = reports.iter().map(|r| r.sim_time.as_secs_f64()).sum();
    let mut coverage: BTreeMap<String, usize> = BTreeMap::new();
    for r in reports {
        for (k, n) in &r.coverage {
            *coverage.entry(k.clone()).or_default() += n;
        }
    }
    println!(
        "{test}: {} seeds in {wall:.2} s wall on {} threads ({simulated:.0} simulated s, {:.1} seeds/s); slowest seed {:.2} s",
        reports.len(),
        threads(),
        reports.len() as f64 / wall.max(1e-9),
        reports
            .iter()
            .map(|r| r.wall.as_secs_f64())
            .fold(0.0, f64::max),
    );
    if !coverage.is_empty() {
        println!("{test}: coverage {coverage:?}");
    }
    if replaying() {
        if let Some(r) = reports.first() {
            println!("{}", r.scenario);
            println!(
                "trace hash {:016x}, simulated {:?}",
                r.trace_hash, r.sim_time
            );
            for line in &r.trace {
                println!("  {line}");
            }
        }
    }
}

/// One run's observable behaviour, for [`assert_same_run`].
pub struct RunTrace<'a> {
    pub trace: &'a [String],
    pub trace_hash: u64,
    pub sim_time: std::time::Duration,
}

/// Panics, naming the first line that differs and how to replay, when two runs of the same
/// seed did not behave the same (`what` names the run, e.g. "seed 7").
pub fn assert_same_run(what: &str, replay: &str, x: RunTrace<'_>, y: RunTrace<'_>) {
    assert!(!x.trace.is_empty(), "{what} recorded nothing");
    if x.trace != y.trace || x.trace_hash != y.trace_hash || x.sim_time != y.sim_time {
        let first = x
            .trace
            .iter()
            .zip(y.trace)
            .position(|(l, r)| l != r)
            .unwrap_or(x.trace.len().min(y.trace.len()));
        panic!(
            "{what} is not deterministic (traces {:016x} and {:016x}, simulated {:?} and {:?}); first difference at line {first}:\n  {:?}\n  {:?}\nreplay: {replay}",
            x.trace_hash,
            y.trace_hash,
            x.sim_time,
            y.sim_time,
            x.trace.get(first),
            y.trace.get(first),
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_fresh_window_keeps_the_count_and_most_fixed_seeds() {
        assert_eq!(super::fresh_window(8, 1000), [0, 1, 2, 3, 4, 5, 1000, 1001]);
        assert_eq!(super::fresh_window(3, 1000), [0, 1, 2]);
        let w = super::fresh_window(48, 7_000_000);
        assert_eq!(w.len(), 48);
        assert_eq!(w.iter().filter(|s| **s >= 7_000_000).count(), 12);
    }
}
