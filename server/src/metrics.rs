//! `GET /metrics`: the core's counts ([`gateway_core::Metrics`]) in the OpenMetrics text
//! format, encoded by `prometheus-client` (the Prometheus project's Rust client) from a
//! [`Collector`] over one snapshot per scrape. Its text encoder writes label values as given,
//! so every value here goes through [`Escaped`]: a tool name is a sled's to choose, and must
//! not be able to end its label and write a series of its own.
//!
//! Series:
//!
//! - `gateway_calls_total{tool,project,outcome}`: forwarded calls by how they ended (`ok`,
//!   `error`, `bad_response`, `timeout`, `uplink_lost`, `cancelled`, `aborted`) and calls
//!   `refused` by a limit;
//! - `gateway_call_duration_seconds{project}`: histogram of forwarded calls' latency, for those
//!   the sled answered or that timed out;
//! - gauges `gateway_sessions`, `gateway_uplinks_live`, `gateway_calls_pending`,
//!   `gateway_open_streams`;
//! - counters `gateway_responses_dropped_total{reason="late"|"unknown"}`,
//!   `gateway_frames_invalid_total`, `gateway_calls_forwarded_total`,
//!   `gateway_sessions_expired_total`, `gateway_sessions_evicted_total`,
//!   `gateway_sessions_refused_total`, `gateway_calls_refused_total`;
//! - coordination: gauges `gateway_coord_leases_live`, `gateway_coord_agents_present`,
//!   `gateway_coord_waits_parked`, and `gateway_coord_events_total{event}` (claims, releases,
//!   expiries, messages, board writes, waits, refusals at a limit);
//! - with a state directory: `gateway_coord_records_kept` (gauge),
//!   `gateway_store_coordination_batches_total`,
//!   `gateway_store_coordination_write_failures_total` and the histogram
//!   `gateway_store_coordination_write_seconds` (each batch's time to durable);
//! - in a cluster only: `gateway_cluster_events_total{event}` (relays out and their failures,
//!   relays in, claims won, claim conflicts, claims lost, engine reconnects, sessions loaded);
//! - counted by the server itself ([`crate::fleet::ServerCounters`]):
//!   `gateway_pin_file_write_errors_total`, `gateway_http_connections_open` (gauge),
//!   `gateway_http_idle_closed_total`, and the refusals before anything reaches the core:
//!   `gateway_http_refused_before_body_total`, `gateway_http_body_timeouts_total`,
//!   `gateway_http_connections_refused_total`,
//!   `gateway_http_connections_refused_per_address_total`, `gateway_uplink_pre_welcome_cut_total`;
//!   with TLS, `gateway_tls_handshakes_failed_total`; in a cluster,
//!   `gateway_cluster_unverified_total{source,reason}`: values read from a bucket (`directory`,
//!   `sessions`, `pins`, `tools`) and messages heard (`relay`, `handoff`, `inbox`, `news`) that
//!   failed verification under the cluster secret (`malformed`, `unknown_key`, `bad_tag`,
//!   `expired`, `replayed`, `rolled_back`), and were ignored.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use gateway_core::{Metrics, LATENCY_BUCKETS_SECONDS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::fleet::ServerCounters;

/// The `Content-Type` of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The whole exposition: the core's counts and the server's own.
pub fn render(m: &Metrics, server: &ServerCounters) -> String {
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    let snapshot = Snapshot {
        m: m.clone(),
        pin_file_write_errors: load(&server.pin_file_write_errors),
        http_connections_open: load(&server.http_connections_open),
        http_idle_closed: load(&server.http_idle_closed),
        refused: [
            (
                "gateway_http_refused_before_body",
                "/mcp requests refused for their credentials before their body was read.",
                load(&server.http_refused_before_body),
            ),
            (
                "gateway_http_body_timeouts",
                "/mcp requests whose body did not arrive within the body read deadline (408).",
                load(&server.http_body_timeouts),
            ),
            (
                "gateway_http_connections_refused",
                "Connections refused at accept (503): the server held --max-connections.",
                load(&server.http_connections_refused),
            ),
            (
                "gateway_http_connections_refused_per_address",
                "Connections refused at accept (503): their address held --max-connections-per-address.",
                load(&server.http_connections_refused_per_address),
            ),
            (
                "gateway_uplink_pre_welcome_cut",
                "Uplinks cut for sending more than the pre-welcome allowance before their welcome.",
                load(&server.uplink_pre_welcome_cut),
            ),
            (
                "gateway_tls_handshakes_failed",
                "TLS handshakes that failed or did not finish in time (a client that does not \
                 trust the certificate, or that does not speak TLS).",
                load(&server.tls_handshakes_failed),
            ),
        ],
        unverified: Vec::new(),
        store_batches: load(&server.store_writes.batches),
        store_failed: load(&server.store_writes.failed),
        store_buckets: std::array::from_fn(|i| load(&server.store_writes.buckets[i])),
        store_sum_seconds: load(&server.store_writes.sum_micros) as f64 / 1e6,
    };
    let mut snapshot = snapshot;
    snapshot.unverified = server.cluster_unverified.snapshot();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut out = String::with_capacity(4096);
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("writing to a String does not fail");
    out
}

/// One scrape's counts.
#[derive(Debug)]
struct Snapshot {
    m: Metrics,
    pin_file_write_errors: u64,
    http_connections_open: u64,
    http_idle_closed: u64,
    /// The server's refusals before anything reaches the core, and failed TLS handshakes:
    /// name, help, count.
    refused: [(&'static str, &'static str, u64); 6],
    /// In a cluster: what failed verification under the cluster secret, by source and reason.
    unverified: Vec<((&'static str, &'static str), u64)>,
    /// A single gateway's coordination writes: batches, failed writes, each bucket's own
    /// count, the sum.
    store_batches: u64,
    store_failed: u64,
    store_buckets: [u64; 14],
    store_sum_seconds: f64,
}

/// A label value with backslash, double quote and newline escaped.
#[derive(Debug, Clone, Copy)]
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// A counter family (its samples are `<name>_total`) with one label.
fn counters(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in values {
        let labels = [(label, Escaped(value))];
        ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    n: u64,
) -> std::fmt::Result {
    let c = ConstCounter::new(n);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let m = &self.m;
        let s = &m.stats;
        let e = &mut encoder;
        let mut calls = e.encode_descriptor(
            "gateway_calls",
            "Calls forwarded to sleds (or refused by a limit), by tool, project and outcome.",
            None,
            MetricType::Counter,
        )?;
        for c in &m.calls {
            let labels = [
                ("tool", Escaped(&c.tool)),
                ("project", Escaped(&c.project)),
                ("outcome", Escaped(c.outcome.name())),
            ];
            ConstCounter::new(c.count).encode(calls.encode_family(&labels)?)?;
        }
        let mut latency = e.encode_descriptor(
            "gateway_call_duration_seconds",
            "Latency of forwarded calls that the sled answered or that timed out, by project.",
            None,
            MetricType::Histogram,
        )?;
        for (project, h) in &m.latency {
            // The snapshot's buckets are cumulative; the encoder wants each bucket's own
            // count, and adds them up again.
            let mut below = 0;
            let mut buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_SECONDS
                .iter()
                .zip(&h.buckets)
                .map(|(le, n)| {
                    let own = n.saturating_sub(below);
                    below = *n;
                    (*le, own)
                })
                .collect();
            buckets.push((f64::MAX, h.count.saturating_sub(below)));
            let labels = [("project", Escaped(project))];
            family_histogram(&mut latency, &labels, h.sum_seconds, h.count, &buckets)?;
        }
        for (name, help, v) in [
            ("gateway_sessions", "Live MCP sessions.", s.sessions),
            (
                "gateway_uplinks_live",
                "Projects whose sled has a live uplink.",
                s.live_uplinks,
            ),
            (
                "gateway_calls_pending",
                "Calls forwarded and not yet answered.",
                s.pending_calls,
            ),
            (
                "gateway_open_streams",
                "Open SSE streams (GET streams and streamed answers).",
                s.open_streams,
            ),
            (
                "gateway_calls_parked",
                "Stateless calls waiting for their client's retry with input (input_required).",
                s.parked_calls,
            ),
        ] {
            gauge(e, name, help, v as u64)?;
        }
        counters(
            e,
            "gateway_responses_dropped",
            "Responses from sleds dropped: late (after the call's deadline) or unknown (an id never sent).",
            "reason",
            &[
                ("late", s.responses_dropped_late),
                ("unknown", s.responses_dropped_unknown),
            ],
        )?;
        for (name, help, v) in [
            (
                "gateway_frames_invalid",
                "Uplink frames that were not valid protocol messages.",
                s.frames_invalid,
            ),
            (
                "gateway_frames_unreadable_at_sled",
                "Frames a sled said it could not read (unreadable control frames).",
                s.frames_unreadable_at_sled,
            ),
            (
                "gateway_calls_forwarded",
                "Requests forwarded to sleds.",
                s.calls_forwarded,
            ),
            (
                "gateway_sessions_expired",
                "Sessions ended by the idle TTL.",
                s.sessions_expired,
            ),
            (
                "gateway_sessions_evicted",
                "Idle sessions ended to make room under max_sessions.",
                s.sessions_evicted,
            ),
            (
                "gateway_sessions_refused",
                "initialize requests refused at max_sessions (503).",
                s.sessions_refused,
            ),
            (
                "gateway_calls_refused",
                "Calls refused by max_calls_per_session, max_calls_per_sled, max_calls_per_identity or max_fanouts_per_identity.",
                s.calls_refused,
            ),
            (
                "gateway_calls_timed_out",
                "Forwarded calls that reached their deadline.",
                s.calls_timed_out,
            ),
            (
                "gateway_input_required",
                "Stateless requests answered input_required: a sled asked their client for input.",
                s.input_required,
            ),
        ] {
            counter(e, name, help, v)?;
        }
        let c = &m.coordination;
        for (name, help, v) in [
            (
                "gateway_coord_leases_live",
                "Live leases, over every project.",
                c.live_leases,
            ),
            (
                "gateway_coord_agents_present",
                "Agents present, counted once per project.",
                c.present_agents,
            ),
            (
                "gateway_coord_waits_parked",
                "Coordination waits parked now.",
                c.parked_waiters,
            ),
            (
                "gateway_coord_records_kept",
                "Coordination records kept in the store (a single gateway with a state directory): leases, board keys, messages, members' cursors and counters.",
                c.records_kept,
            ),
        ] {
            gauge(e, name, help, v as u64)?;
        }
        counters(
            e,
            "gateway_coord_events",
            "Coordination events by kind: claims (acquired, reentrant, conflict), renewals, releases, expiries, forced releases, messages (sent, refused), board (set, cas_failure, delete), waits (ready at once, parked, woken, timed out) and refusals at a limit.",
            "event",
            &[
                ("claim_acquired", c.claims_acquired),
                ("claim_reentrant", c.claims_reentrant),
                ("claim_conflict", c.claims_conflict),
                ("renewal", c.renewals),
                ("release", c.releases),
                ("expiry", c.expiries),
                ("forced_release", c.forced),
                ("message_sent", c.messages_sent),
                ("message_refused", c.messages_refused),
                ("board_set", c.board_sets),
                ("board_cas_failure", c.board_cas_failures),
                ("board_delete", c.board_deletes),
                ("wait_ready_at_once", c.waits_ready_at_once),
                ("wait_parked", c.waits_parked),
                ("wait_woken", c.waits_woken),
                ("wait_timed_out", c.waits_timed_out),
                ("refused_by_limit", c.refused_by_limit),
            ],
        )?;
        if let Some(k) = &m.cluster {
            counters(
                e,
                "gateway_cluster_events",
                "This replica's cluster events: requests relayed to the replica holding their project (relay_out) and those with no whole answer (relay_failed), requests served for other replicas (relay_in), directory claims won (each a new epoch), claim conflicts, claims lost (a project this replica stopped serving), engine reconnects, and sessions read from the engine.",
                "event",
                &[
                    ("relay_out", k.relays),
                    ("relay_failed", k.relays_failed),
                    ("relay_in", k.relayed_in),
                    ("claim_won", k.claims_won),
                    ("claim_conflict", k.claim_conflicts),
                    ("claim_lost", k.claims_lost),
                    ("engine_reconnect", k.engine_reconnects),
                    ("session_loaded", k.sessions_loaded),
                ],
            )?;
        }
        counter(
            e,
            "gateway_pin_file_write_errors",
            "Writes of the pin file that failed (the pins stay in memory).",
            self.pin_file_write_errors,
        )?;
        gauge(
            e,
            "gateway_http_connections_open",
            "HTTP connections open (an uplink leaves the count when it upgrades to a WebSocket).",
            self.http_connections_open,
        )?;
        counter(
            e,
            "gateway_http_idle_closed",
            "HTTP connections closed after waiting longer than the idle timeout for a request.",
            self.http_idle_closed,
        )?;
        for (name, help, n) in self.refused {
            counter(e, name, help, n)?;
        }
        if self.store_batches > 0 {
            counter(
                e,
                "gateway_store_coordination_batches",
                "Batches of coordination records written to the store (each durable before the answers that waited for it).",
                self.store_batches,
            )?;
            counter(
                e,
                "gateway_store_coordination_write_failures",
                "Coordination records the store could not write (their calls were answered state_not_durable).",
                self.store_failed,
            )?;
            let mut family = e.encode_descriptor(
                "gateway_store_coordination_write_seconds",
                "How long each batch of coordination records took to be durable.",
                None,
                MetricType::Histogram,
            )?;
            let mut bounds: Vec<f64> = LATENCY_BUCKETS_SECONDS.to_vec();
            bounds.push(f64::MAX);
            let buckets: Vec<(f64, u64)> = bounds.into_iter().zip(self.store_buckets).collect();
            family_histogram(
                &mut family,
                &[("bucket", Escaped("coordination"))],
                self.store_sum_seconds,
                self.store_batches,
                &buckets,
            )?;
        }
        if !self.unverified.is_empty() {
            let mut family = e.encode_descriptor(
                "gateway_cluster_unverified",
                "Values and messages in the cluster's engine that failed verification under the cluster secret and were ignored, by source and reason.",
                None,
                MetricType::Counter,
            )?;
            for ((source, reason), n) in &self.unverified {
                let labels = [("source", Escaped(source)), ("reason", Escaped(reason))];
                ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// One labelled histogram of a family.
fn family_histogram(
    family: &mut prometheus_client::encoding::MetricEncoder<'_>,
    labels: &[(&str, Escaped<'_>)],
    sum: f64,
    count: u64,
    buckets: &[(f64, u64)],
) -> std::fmt::Result {
    family
        .encode_family(&labels)?
        .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, buckets, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::{CallCount, Histogram, Outcome};

    /// A fresh gateway's counts.
    fn empty() -> Metrics {
        let file = "[[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9\"\n";
        let registry = gateway_core::Registry::parse("projects.toml", file).expect("valid");
        gateway_core::Gateway::new(registry, gateway_core::Config::default(), [0; 32]).metrics()
    }

    fn with_call(tool: &str) -> Metrics {
        let mut m = empty();
        m.calls.push(CallCount {
            tool: tool.to_owned(),
            project: "alpha".into(),
            outcome: Outcome::Ok,
            count: 3,
        });
        m
    }

    #[test]
    fn a_tool_name_cannot_write_a_series_of_its_own() {
        let body = render(
            &with_call("x\"} 1\ngateway_sessions 999\n#"),
            &ServerCounters::default(),
        );
        assert!(
            body.contains(r#"gateway_calls_total{tool="x\"} 1\ngateway_sessions 999\n#",project="alpha",outcome="ok"} 3"#),
            "{body}"
        );
        assert_eq!(
            body.lines()
                .filter(|l| l.starts_with("gateway_sessions "))
                .count(),
            1,
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"));
    }

    #[test]
    fn latency_buckets_are_cumulative_and_end_at_inf() {
        let mut m = empty();
        let mut buckets = vec![0; LATENCY_BUCKETS_SECONDS.len()];
        // One call at 3 ms, one at 40 ms, one past 60 s.
        for (i, b) in LATENCY_BUCKETS_SECONDS.iter().enumerate() {
            buckets[i] = u64::from(*b >= 0.005) + u64::from(*b >= 0.05);
        }
        m.latency.insert(
            "alpha".into(),
            Histogram {
                buckets,
                count: 3,
                sum_seconds: 61.043,
            },
        );
        let body = render(&m, &ServerCounters::default());
        for (le, n) in [
            ("0.005", 1),
            ("0.025", 1),
            ("0.05", 2),
            ("60.0", 2),
            ("+Inf", 3),
        ] {
            let line = format!(
                "gateway_call_duration_seconds_bucket{{le=\"{le}\",project=\"alpha\"}} {n}"
            );
            assert!(body.contains(&line), "{line} in {body}");
        }
        assert!(body.contains("gateway_call_duration_seconds_count{project=\"alpha\"} 3"));
    }
}
