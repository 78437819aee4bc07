//! Span export over OTLP/HTTP, off unless an endpoint is configured.
//!
//! The core decides the spans ([`gateway_core::Output::Span`], with
//! [`gateway_core::Config::export_spans`]); this module sends them to an OpenTelemetry
//! collector with the `opentelemetry` SDK: each span goes with the ids the core gave it (the
//! client's trace, the gateway's span id that the sled saw as its parent, the client's span as
//! the remote parent), its start and end times, and its attributes, from resource
//! `service.name = mcp-gateway`.
//!
//! Where spans go ([`OtlpConfig::resolve`]): `--otlp-endpoint URL`, else
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the traces URL as written), else
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL, `/v1/traces` appended). None set: nothing is
//! built, no thread runs, and the core makes no span. Bodies are protobuf (`http/protobuf`);
//! the SDK's standard variables for headers (`OTEL_EXPORTER_OTLP_HEADERS`), timeout and batching
//! (`OTEL_BSP_*`) apply.
//!
//! **Architecture Invariant:** export never slows or fails a call. The driver hands a span to
//! the SDK's batch processor, a `try_send` into a bounded queue (a full queue drops the span);
//! batches go out on the processor's own thread through a blocking HTTP client. An unreachable
//! or failing collector costs dropped spans and a warning at most once a minute
//! ([`ERROR_LOG_INTERVAL`]). On graceful shutdown, the spans still queued are flushed, waiting
//! at most [`FLUSH_TIMEOUT`].

use std::borrow::Cow;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use gateway_core::{AttributeValue, SpanRecord};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SpanData, SpanEvents, SpanExporter, SpanLinks, SpanProcessor,
};
use opentelemetry_sdk::Resource;

/// The `service.name` of the gateway's spans.
pub const SERVICE_NAME: &str = "mcp-gateway";

/// An export failure is logged at most this often (with the count of failed batches since).
pub const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// How long a graceful shutdown waits for the last spans to reach the collector.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The standard variables, in the order they are looked at after `--otlp-endpoint`.
pub const TRACES_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The path of the traces signal under a base OTLP/HTTP URL.
const TRACES_PATH: &str = "/v1/traces";

/// Where spans are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The URL spans are POSTed to, e.g. `http://127.0.0.1:4318/v1/traces`.
    pub traces_url: String,
}

impl OtlpConfig {
    /// Where spans go, if anywhere: `flag` (`--otlp-endpoint`, a base URL like
    /// `http://127.0.0.1:4318`; `/v1/traces` is appended unless the URL already ends with it),
    /// else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as written), else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL, as the flag). Empty values count as unset.
    /// `env` reads a variable. An URL that is not `http://host…` is an error.
    pub fn resolve(
        flag: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpConfig>, String> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let (source, traces_url) = if let Some(base) = flag.filter(|f| !f.trim().is_empty()) {
            ("--otlp-endpoint", with_traces_path(base))
        } else if let Some(url) = env(TRACES_ENDPOINT_VAR) {
            (TRACES_ENDPOINT_VAR, url.trim().to_owned())
        } else if let Some(base) = env(ENDPOINT_VAR) {
            (ENDPOINT_VAR, with_traces_path(&base))
        } else {
            return Ok(None);
        };
        check_url(&traces_url).map_err(|why| format!("{source}: {why}"))?;
        Ok(Some(OtlpConfig { traces_url }))
    }
}

/// `base` with the traces path, unless it is there already.
fn with_traces_path(base: &str) -> String {
    let base = base.trim().trim_end_matches('/');
    if base.ends_with(TRACES_PATH) {
        base.to_owned()
    } else {
        format!("{base}{TRACES_PATH}")
    }
}

/// An OTLP/HTTP URL the exporter can use: plain `http` with a host.
fn check_url(url: &str) -> Result<(), String> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(if url.starts_with("https://") {
            format!("{url}: https is not supported; export to a collector or agent reachable over http (e.g. one on the same host)")
        } else {
            format!("{url} is not an http:// URL")
        });
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!("{url} names no host"));
    }
    Ok(())
}

/// The exporter: the SDK's batch span processor in front of the OTLP/HTTP exporter.
#[derive(Debug)]
pub(crate) struct SpanExport {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
}

impl SpanExport {
    /// Builds the exporter for `config` and starts the processor's export thread.
    pub(crate) fn start(config: &OtlpConfig) -> Result<SpanExport, String> {
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Ok(p) = std::env::var(var) {
                if p != "http/protobuf" {
                    tracing::warn!(
                        var,
                        value = %p,
                        "the gateway exports spans as http/protobuf only; ignored"
                    );
                }
            }
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.traces_url.clone())
            .build()
            .map_err(|e| format!("cannot build the OTLP span exporter: {e}"))?;
        let mut exporter = LoggedExporter {
            inner: exporter,
            url: config.traces_url.clone(),
            failures: Mutex::new(Failures::default()),
        };
        let resource = Resource::builder()
            .with_service_name(SERVICE_NAME)
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        exporter.set_resource(&resource);
        let processor = BatchSpanProcessor::builder(exporter).build();
        tracing::info!(url = %config.traces_url, "exporting spans over OTLP/HTTP");
        Ok(SpanExport {
            processor,
            scope: InstrumentationScope::builder("gateway-server")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        })
    }

    /// Queues one span of the core's; `wall` turns the core's instants into wall-clock times.
    /// Spans of traces the client did not sample (flags bit 0 clear) are not exported, as an
    /// SDK's parent-based sampler would. Never blocks.
    pub(crate) fn export(&self, span: SpanRecord, wall: impl Fn(std::time::Instant) -> SystemTime) {
        if !span.sampled() {
            return;
        }
        let trace_state = span
            .tracestate
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let data = SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(span.trace_id),
                SpanId::from_bytes(span.span_id),
                TraceFlags::new(span.flags),
                false,
                trace_state,
            ),
            parent_span_id: SpanId::from_bytes(span.parent_span_id),
            parent_span_is_remote: true,
            span_kind: SpanKind::Server,
            name: Cow::Owned(span.name),
            start_time: wall(span.start),
            end_time: wall(span.end),
            attributes: span
                .attributes
                .into_iter()
                .map(|(key, value)| match value {
                    AttributeValue::String(s) => KeyValue::new(key, s),
                    AttributeValue::Int(i) => KeyValue::new(key, i),
                })
                .collect(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: match span.error {
                Some(description) => Status::error(description),
                None => Status::Unset,
            },
            instrumentation_scope: self.scope.clone(),
        };
        self.processor.on_end(data);
    }

    /// Exports the spans still queued and stops the export thread, waiting at most
    /// [`FLUSH_TIMEOUT`]. Blocks: call it where blocking is allowed.
    pub(crate) fn shutdown(&self) {
        match self.processor.shutdown_with_timeout(FLUSH_TIMEOUT) {
            Ok(()) => tracing::debug!("span export flushed and stopped"),
            Err(e) => tracing::warn!(error = %e, "span export did not flush before shutdown"),
        }
    }
}

#[derive(Debug, Default)]
struct Failures {
    /// When a failure was last logged.
    logged: Option<std::time::Instant>,
    /// Batches that failed since.
    since: u64,
}

/// An exporter (the OTLP one) whose failures are logged at most once per
/// [`ERROR_LOG_INTERVAL`].
#[derive(Debug)]
struct LoggedExporter<E> {
    inner: E,
    url: String,
    failures: Mutex<Failures>,
}

impl<E> LoggedExporter<E> {
    /// Counts a failed batch at `now`; logs it, with the count since the last log, when the
    /// last log is old enough. Returns whether it logged.
    fn failed(&self, error: &dyn std::fmt::Display, now: std::time::Instant) -> bool {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.since += 1;
        let due = f
            .logged
            .is_none_or(|at| now.saturating_duration_since(at) >= ERROR_LOG_INTERVAL);
        if due {
            tracing::warn!(
                url = %self.url,
                %error,
                failed_batches = f.since,
                "span export to the OTLP collector failed; those spans are dropped (said at most once a minute)"
            );
            f.logged = Some(now);
            f.since = 0;
        }
        due
    }
}

impl<E: SpanExporter> SpanExporter for LoggedExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            // On the export thread, which may read the clock.
            self.failed(e, std::time::Instant::now());
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(flag: Option<&str>, vars: &[(&str, &str)]) -> Result<Option<String>, String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        OtlpConfig::resolve(flag, |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .map(|c| c.map(|c| c.traces_url))
    }

    #[test]
    fn the_flag_wins_then_the_traces_variable_then_the_base_variable() {
        assert_eq!(resolve(None, &[]), Ok(None));
        assert_eq!(resolve(Some(""), &[(ENDPOINT_VAR, " ")]), Ok(None));
        let both = [
            (TRACES_ENDPOINT_VAR, "http://traces:4318/custom"),
            (ENDPOINT_VAR, "http://base:4318"),
        ];
        assert_eq!(
            resolve(Some("http://flag:4318"), &both).unwrap().as_deref(),
            Some("http://flag:4318/v1/traces")
        );
        assert_eq!(
            resolve(None, &both).unwrap().as_deref(),
            Some("http://traces:4318/custom"),
            "the traces variable is used as written"
        );
        assert_eq!(
            resolve(None, &both[1..]).unwrap().as_deref(),
            Some("http://base:4318/v1/traces")
        );
        assert_eq!(
            resolve(Some("http://flag:4318/v1/traces/"), &[])
                .unwrap()
                .as_deref(),
            Some("http://flag:4318/v1/traces")
        );
        assert_eq!(
            resolve(None, &[(ENDPOINT_VAR, "http://base:4318/otel/")])
                .unwrap()
                .as_deref(),
            Some("http://base:4318/otel/v1/traces")
        );
    }

    #[test]
    fn export_failures_are_logged_at_most_once_a_minute() {
        let logged = LoggedExporter {
            inner: (),
            url: "http://127.0.0.1:1/v1/traces".into(),
            failures: Mutex::new(Failures::default()),
        };
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(
            logged.failed(&"refused", at(0)),
            "the first failure is said"
        );
        assert!(!logged.failed(&"refused", at(1)));
        assert!(!logged.failed(&"refused", at(59)));
        assert!(logged.failed(&"refused", at(60)), "a minute later, again");
        assert_eq!(logged.failures.lock().unwrap().since, 0);
        assert!(!logged.failed(&"refused", at(61)));
        assert_eq!(logged.failures.lock().unwrap().since, 1);
    }

    #[test]
    fn endpoints_that_cannot_be_used_are_errors_naming_their_source() {
        let e = resolve(Some("https://collector:4318"), &[]).unwrap_err();
        assert!(
            e.starts_with("--otlp-endpoint") && e.contains("https"),
            "{e}"
        );
        let e = resolve(None, &[(ENDPOINT_VAR, "collector:4318")]).unwrap_err();
        assert!(e.starts_with(ENDPOINT_VAR), "{e}");
        let e = resolve(None, &[(TRACES_ENDPOINT_VAR, "http:///v1/traces")]).unwrap_err();
        assert!(e.contains("no host"), "{e}");
    }
}
