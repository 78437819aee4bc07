//! Counts for monitoring: plain integers kept by the core as it decides, and a snapshot of them
//! ([`Metrics`]) for the driver to render (the server writes the Prometheus text format). No
//! metrics crate, no clock: latencies are differences of the `now`s the driver passes in.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Stats;

/// Upper bounds, in seconds, of the buckets of the forwarded-call latency histogram.
pub const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How a forwarded call (or one refused before forwarding) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// The sled answered with a result.
    Ok,
    /// The sled answered with a JSON-RPC error.
    Error,
    /// The sled answered with something that is not a JSON-RPC response.
    BadResponse,
    /// No answer within the project's deadline.
    Timeout,
    /// The uplink went away (closed, replaced, heartbeat, shutdown) with the call pending.
    UplinkLost,
    /// The client cancelled it (`notifications/cancelled`).
    Cancelled,
    /// The client went away (HTTP connection closed) before the answer.
    Aborted,
    /// Refused by a limit on calls in flight; never sent.
    Refused,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::BadResponse,
        Outcome::Timeout,
        Outcome::UplinkLost,
        Outcome::Cancelled,
        Outcome::Aborted,
        Outcome::Refused,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::BadResponse => "bad_response",
            Outcome::Timeout => "timeout",
            Outcome::UplinkLost => "uplink_lost",
            Outcome::Cancelled => "cancelled",
            Outcome::Aborted => "aborted",
            Outcome::Refused => "refused",
        }
    }
}

/// Calls of one tool (or proxied method) of one project that ended one way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallCount {
    /// The tool's name, when the project's sled lists it; `_unlisted` for a name it does not
    /// list (so clients cannot grow the label set); the method for resources, prompts and
    /// completion.
    pub tool: String,
    pub project: String,
    pub outcome: Outcome,
    pub count: u64,
}

/// A latency histogram: `buckets[i]` counts observations ≤ [`LATENCY_BUCKETS_SECONDS`]`[i]`
/// (cumulative, as Prometheus wants them); `count` is all of them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Histogram {
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

/// A snapshot of everything the core counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    pub stats: Stats,
    /// Ordered by tool, project, outcome.
    pub calls: Vec<CallCount>,
    /// Latency of forwarded calls the sled answered (ok, error, bad response) or that timed
    /// out, from forwarding to the answer, by project.
    pub latency: BTreeMap<String, Histogram>,
    /// Coordination's counters and gauges.
    pub coordination: crate::coord::CoordStats,
    /// The cluster's counts, when the gateway is a replica of one.
    pub cluster: Option<crate::cluster::ClusterCounts>,
}

/// The core's running counts behind [`Metrics`].
#[derive(Debug, Default)]
pub(crate) struct CallMetrics {
    /// By tool, then project: a count per outcome, in [`Outcome::ALL`]'s order. Nested so a
    /// count is two lookups by `&str`, with no key built (and allocated) per call.
    calls: BTreeMap<String, BTreeMap<String, [u64; Outcome::ALL.len()]>>,
    /// Per project: non-cumulative bucket counts (one more for +Inf), total micros.
    latency: BTreeMap<String, (Vec<u64>, u128)>,
}

impl CallMetrics {
    pub(crate) fn count(&mut self, tool: &str, project: &str, outcome: Outcome) {
        // Tools and projects come from the registry and the sleds' lists: the keys are bounded.
        let by_project = match self.calls.get_mut(tool) {
            Some(m) => m,
            None => self.calls.entry(tool.to_owned()).or_default(),
        };
        let counts = match by_project.get_mut(project) {
            Some(c) => c,
            None => by_project.entry(project.to_owned()).or_default(),
        };
        counts[outcome as usize] += 1;
    }

    pub(crate) fn observe(&mut self, project: &str, took: Duration) {
        let (buckets, micros) = match self.latency.get_mut(project) {
            Some(h) => h,
            None => self
                .latency
                .entry(project.to_owned())
                .or_insert_with(|| (vec![0; LATENCY_BUCKETS_SECONDS.len() + 1], 0)),
        };
        let secs = took.as_secs_f64();
        let i = LATENCY_BUCKETS_SECONDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS_SECONDS.len());
        buckets[i] += 1;
        *micros += took.as_micros();
    }

    pub(crate) fn snapshot(&self, stats: Stats, coordination: crate::coord::CoordStats) -> Metrics {
        let calls = self
            .calls
            .iter()
            .flat_map(|(tool, by_project)| {
                by_project.iter().flat_map(move |(project, counts)| {
                    Outcome::ALL
                        .iter()
                        .zip(counts)
                        .filter(|(_, &count)| count > 0)
                        .map(move |(&outcome, &count)| CallCount {
                            tool: tool.clone(),
                            project: project.clone(),
                            outcome,
                            count,
                        })
                })
            })
            .collect();
        let latency = self
            .latency
            .iter()
            .map(|(project, (raw, micros))| {
                let mut acc = 0;
                let buckets = raw[..LATENCY_BUCKETS_SECONDS.len()]
                    .iter()
                    .map(|n| {
                        acc += n;
                        acc
                    })
                    .collect();
                let h = Histogram {
                    buckets,
                    count: raw.iter().sum(),
                    #[allow(clippy::cast_precision_loss)]
                    sum_seconds: *micros as f64 / 1e6,
                };
                (project.clone(), h)
            })
            .collect();
        Metrics {
            stats,
            calls,
            latency,
            coordination,
            cluster: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_index_their_own_slot() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{o:?}");
        }
    }

    #[test]
    fn a_snapshot_lists_what_was_counted_by_tool_project_and_outcome() {
        let mut m = CallMetrics::default();
        m.count("show", "beta", Outcome::Ok);
        m.count("show", "alpha", Outcome::Refused);
        m.count("show", "beta", Outcome::Ok);
        m.count("create", "beta", Outcome::Timeout);
        m.count("show", "beta", Outcome::Error);
        let calls: Vec<(String, String, Outcome, u64)> = m
            .snapshot(Stats::default(), Default::default())
            .calls
            .into_iter()
            .map(|c| (c.tool, c.project, c.outcome, c.count))
            .collect();
        let row = |t: &str, p: &str, o, n| (t.to_owned(), p.to_owned(), o, n);
        assert_eq!(
            calls,
            [
                row("create", "beta", Outcome::Timeout, 1),
                row("show", "alpha", Outcome::Refused, 1),
                row("show", "beta", Outcome::Ok, 2),
                row("show", "beta", Outcome::Error, 1),
            ]
        );
    }
}
