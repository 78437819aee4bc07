//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`) against the real
//! gateway, in front of sled-sim's conformance fixture (the default project) and one ordinary
//! emulated project, over loopback.
//!
//! Every server scenario the suite lists runs. A scenario that cannot pass yet is listed, with
//! its reason, in `tests/conformance-baseline.txt`; the test fails when a scenario outside the
//! baseline fails, and when one inside it passes (so the baseline only shrinks).

#[path = "support/node.rs"]
mod node;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_tests::Stack;
use sled_sim::SledOptions;
use tokio::sync::Semaphore;

/// The fixture project (the registry's default) and the ordinary one beside it.
const FIXTURE: &str = "conformance";
const ORDINARY: &str = "alpha";
/// Scenarios run at once.
const PARALLEL: usize = 4;
/// The longest one scenario may take.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(60);

/// `scenario -> reason` from the baseline file: `name  # reason` lines; blank lines and lines
/// starting with `#` are ignored.
fn baseline() -> BTreeMap<String, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conformance-baseline.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, reason) = match line.split_once('#') {
            Some((name, reason)) => (name.trim(), reason.trim()),
            None => (line, ""),
        };
        assert!(
            !reason.is_empty(),
            "{}:{}: `{name}` needs a reason after `#`",
            path.display(),
            n + 1
        );
        let dup = out.insert(name.to_owned(), reason.to_owned());
        assert!(
            dup.is_none(),
            "{}:{}: `{name}` listed twice",
            path.display(),
            n + 1
        );
    }
    out
}

/// One scenario's outcome.
#[derive(Debug)]
struct Outcome {
    passed: bool,
    /// The suite's "Passed: a/b, c failed, d warnings" line, or why there is none.
    summary: String,
    /// The whole output, for failures.
    output: String,
    took: Duration,
}

async fn run_scenario(node: &node::Node, url: &str, scenario: &str) -> Outcome {
    let start = Instant::now();
    let mut cmd = node.command();
    cmd.arg(node.bin("@modelcontextprotocol/conformance", "conformance"))
        .args(["server", "--url", url, "--scenario", scenario])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (passed, output) = match tokio::time::timeout(SCENARIO_TIMEOUT, cmd.output()).await {
        Ok(Ok(out)) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Ok(Err(e)) => (false, format!("the suite did not run: {e}")),
        Err(_) => (false, format!("no verdict within {SCENARIO_TIMEOUT:?}")),
    };
    let summary = output
        .lines()
        .find(|l| l.trim_start().starts_with("Passed:"))
        .map_or_else(
            || output.lines().last().unwrap_or("no output").to_owned(),
            |l| l.trim().to_owned(),
        );
    Outcome {
        passed,
        summary,
        output,
        took: start.elapsed(),
    }
}

/// The server scenarios, from `conformance list --server` (lines `  - name [versions]`).
async fn server_scenarios(node: &node::Node) -> Vec<String> {
    let out = node
        .command()
        .arg(node.bin("@modelcontextprotocol/conformance", "conformance"))
        .args(["list", "--server"])
        .output()
        .await
        .expect("the conformance suite runs");
    assert!(
        out.status.success(),
        "conformance list --server failed: {out:?}"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_official_conformance_suite_passes_except_the_baseline() {
    gateway_tests::init_tracing();
    let node = node::node().await;
    let scenarios = server_scenarios(&node).await;
    assert!(scenarios.len() >= 30, "few scenarios listed: {scenarios:?}");
    let baseline = baseline();

    let registry = gateway_tests::registry(&[FIXTURE, ORDINARY], Some(FIXTURE));
    let opts = SledOptions {
        fixture_projects: vec![FIXTURE.to_owned()],
        ..SledOptions::default()
    };
    let stack = Stack::start(registry, &[FIXTURE, ORDINARY], opts).await;
    let url = stack.url();

    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(PARALLEL));
    let mut runs = tokio::task::JoinSet::new();
    for scenario in scenarios.clone() {
        let (node, url, gate) = (node.clone(), url.clone(), gate.clone());
        runs.spawn(async move {
            let _permit = gate
                .acquire_owned()
                .await
                .expect("the semaphore stays open");
            let outcome = run_scenario(&node, &url, &scenario).await;
            (scenario, outcome)
        });
    }
    let mut outcomes = BTreeMap::new();
    while let Some(joined) = runs.join_next().await {
        let (scenario, outcome) = joined.expect("a scenario task does not panic");
        outcomes.insert(scenario, outcome);
    }

    let mut unexpected_failures = Vec::new();
    let mut unexpected_passes = Vec::new();
    println!(
        "\n{:<32} {:<16} {:>6}  details",
        "scenario", "result", "secs"
    );
    for scenario in &scenarios {
        let o = &outcomes[scenario];
        let expected = baseline.get(scenario);
        let result = match (o.passed, expected) {
            (true, None) => "pass",
            (false, Some(_)) => "fail (baseline)",
            (false, None) => {
                unexpected_failures.push(scenario.clone());
                "FAIL"
            }
            (true, Some(_)) => {
                unexpected_passes.push(scenario.clone());
                "PASS (baseline!)"
            }
        };
        let details = match expected {
            Some(reason) => format!("{}; baseline: {reason}", o.summary),
            None => o.summary.clone(),
        };
        println!(
            "{scenario:<32} {result:<16} {:>6.1}  {details}",
            o.took.as_secs_f64()
        );
    }
    let total = scenarios.len();
    let passed = outcomes.values().filter(|o| o.passed).count();
    println!(
        "\n{passed} of {total} scenarios pass, {} in the baseline; {:.1} s",
        baseline.len(),
        started.elapsed().as_secs_f64()
    );
    for scenario in &unexpected_failures {
        println!("\n--- {scenario} ---\n{}", outcomes[scenario].output);
    }
    let stale: Vec<&String> = baseline.keys().filter(|s| !scenarios.contains(s)).collect();

    stack.stop().await;

    assert!(
        unexpected_failures.is_empty(),
        "scenarios outside tests/conformance-baseline.txt failed: {unexpected_failures:?}"
    );
    assert!(
        unexpected_passes.is_empty(),
        "scenarios in tests/conformance-baseline.txt now pass; take them out: {unexpected_passes:?}"
    );
    assert!(
        stale.is_empty(),
        "tests/conformance-baseline.txt names scenarios the suite does not have: {stale:?}"
    );
}
