//! `GET /metrics`: the core's counts ([`gateway_core::Metrics`]) in the Prometheus text
//! exposition format (version 0.0.4), written by hand.
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
//! - in a cluster only: `gateway_cluster_events_total{event}` (relays out and their failures,
//!   relays in, claims won, claim conflicts, claims lost, engine reconnects, sessions loaded);
//! - counted by the server itself ([`crate::fleet::ServerCounters`]):
//!   `gateway_pin_file_write_errors_total`, `gateway_http_connections_open` (gauge),
//!   `gateway_http_idle_closed_total`.

use std::fmt::Write as _;

use gateway_core::{Metrics, LATENCY_BUCKETS_SECONDS};

use crate::fleet::ServerCounters;

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The whole exposition: the core's counts and the server's own.
pub fn render(m: &Metrics, server: &ServerCounters) -> String {
    let mut out = String::with_capacity(4096);
    let s = &m.stats;
    header(
        &mut out,
        "gateway_calls_total",
        "counter",
        "Calls forwarded to sleds (or refused by a limit), by tool, project and outcome.",
    );
    for c in &m.calls {
        let _ = writeln!(
            out,
            "gateway_calls_total{{tool=\"{}\",project=\"{}\",outcome=\"{}\"}} {}",
            escape(&c.tool),
            escape(&c.project),
            c.outcome.name(),
            c.count
        );
    }
    header(
        &mut out,
        "gateway_call_duration_seconds",
        "histogram",
        "Latency of forwarded calls that the sled answered or that timed out, by project.",
    );
    for (project, h) in &m.latency {
        let project = escape(project);
        for (le, n) in LATENCY_BUCKETS_SECONDS.iter().zip(&h.buckets) {
            let _ = writeln!(
                out,
                "gateway_call_duration_seconds_bucket{{project=\"{project}\",le=\"{le}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "gateway_call_duration_seconds_bucket{{project=\"{project}\",le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(
            out,
            "gateway_call_duration_seconds_sum{{project=\"{project}\"}} {}",
            h.sum_seconds
        );
        let _ = writeln!(
            out,
            "gateway_call_duration_seconds_count{{project=\"{project}\"}} {}",
            h.count
        );
    }
    let gauges: [(&str, &str, usize); 5] = [
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
    ];
    for (name, help, v) in gauges {
        header(&mut out, name, "gauge", help);
        let _ = writeln!(out, "{name} {v}");
    }
    header(
        &mut out,
        "gateway_responses_dropped_total",
        "counter",
        "Responses from sleds dropped: late (after the call's deadline) or unknown (an id never sent).",
    );
    let _ = writeln!(
        out,
        "gateway_responses_dropped_total{{reason=\"late\"}} {}",
        s.responses_dropped_late
    );
    let _ = writeln!(
        out,
        "gateway_responses_dropped_total{{reason=\"unknown\"}} {}",
        s.responses_dropped_unknown
    );
    let counters: [(&str, &str, u64); 9] = [
        (
            "gateway_frames_invalid_total",
            "Uplink frames that were not valid protocol messages.",
            s.frames_invalid,
        ),
        (
            "gateway_frames_unreadable_at_sled_total",
            "Frames a sled said it could not read (unreadable control frames).",
            s.frames_unreadable_at_sled,
        ),
        (
            "gateway_calls_forwarded_total",
            "Requests forwarded to sleds.",
            s.calls_forwarded,
        ),
        (
            "gateway_sessions_expired_total",
            "Sessions ended by the idle TTL.",
            s.sessions_expired,
        ),
        (
            "gateway_sessions_evicted_total",
            "Idle sessions ended to make room under max_sessions.",
            s.sessions_evicted,
        ),
        (
            "gateway_sessions_refused_total",
            "initialize requests refused at max_sessions (503).",
            s.sessions_refused,
        ),
        (
            "gateway_calls_refused_total",
            "Calls refused by max_calls_per_session or max_calls_per_sled.",
            s.calls_refused,
        ),
        (
            "gateway_calls_timed_out_total",
            "Forwarded calls that reached their deadline.",
            s.calls_timed_out,
        ),
        (
            "gateway_input_required_total",
            "Stateless requests answered input_required: a sled asked their client for input.",
            s.input_required,
        ),
    ];
    for (name, help, v) in counters {
        header(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
    }
    let c = &m.coordination;
    let coord_gauges: [(&str, &str, usize); 3] = [
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
    ];
    for (name, help, v) in coord_gauges {
        header(&mut out, name, "gauge", help);
        let _ = writeln!(out, "{name} {v}");
    }
    header(
        &mut out,
        "gateway_coord_events_total",
        "counter",
        "Coordination events by kind: claims (acquired, reentrant, conflict), renewals, releases, expiries, forced releases, messages (sent, refused), board (set, cas_failure, delete), waits (ready at once, parked, woken, timed out) and refusals at a limit.",
    );
    for (event, v) in [
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
    ] {
        let _ = writeln!(out, "gateway_coord_events_total{{event=\"{event}\"}} {v}");
    }
    if let Some(k) = &m.cluster {
        header(
            &mut out,
            "gateway_cluster_events_total",
            "counter",
            "This replica's cluster events: requests relayed to the replica holding their project (relay_out) and those with no whole answer (relay_failed), requests served for other replicas (relay_in), directory claims won (each a new epoch), claim conflicts, claims lost (a project this replica stopped serving), engine reconnects, and sessions read from the engine.",
        );
        for (event, v) in [
            ("relay_out", k.relays),
            ("relay_failed", k.relays_failed),
            ("relay_in", k.relayed_in),
            ("claim_won", k.claims_won),
            ("claim_conflict", k.claim_conflicts),
            ("claim_lost", k.claims_lost),
            ("engine_reconnect", k.engine_reconnects),
            ("session_loaded", k.sessions_loaded),
        ] {
            let _ = writeln!(out, "gateway_cluster_events_total{{event=\"{event}\"}} {v}");
        }
    }
    header(
        &mut out,
        "gateway_pin_file_write_errors_total",
        "counter",
        "Writes of the pin file that failed (the pins stay in memory).",
    );
    let load = |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed);
    let _ = writeln!(
        out,
        "gateway_pin_file_write_errors_total {}",
        load(&server.pin_file_write_errors)
    );
    header(
        &mut out,
        "gateway_http_connections_open",
        "gauge",
        "HTTP connections open (an uplink leaves the count when it upgrades to a WebSocket).",
    );
    let _ = writeln!(
        out,
        "gateway_http_connections_open {}",
        load(&server.http_connections_open)
    );
    header(
        &mut out,
        "gateway_http_idle_closed_total",
        "counter",
        "HTTP connections closed after waiting longer than the idle timeout for a request.",
    );
    let _ = writeln!(
        out,
        "gateway_http_idle_closed_total {}",
        load(&server.http_idle_closed)
    );
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
