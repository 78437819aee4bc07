//! What the server does for the fleet tools: HTTP health probes ([`Prober`], [`HttpProber`])
//! and the pin file ([`write_pins_atomically`], and the writer task behind
//! [`gateway_core::Output::SavePins`]).
//!
//! The core decides when to probe and what the pins are; this module only carries that out,
//! off the driver: each probe runs in its own task and reports back through the driver's
//! command channel, and the pin file is written by one task fed through a `watch` (the latest
//! text wins, and handing it over never blocks the driver).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use gateway_client::Connect;
use gateway_core::ProbeOutcome;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

/// Carries out [`gateway_core::Output::Probe`]: one `GET` of a project's `url`.
///
/// The future must end within `timeout` (give or take a timer tick) with the HTTP status, or
/// with [`ProbeOutcome::Failed`] saying why there was none. It runs in a task of its own, so it
/// may take its time, but it must use only `tokio::time` and a [`Connect`]-style network, so
/// that it runs on turmoil too.
pub trait Prober: Send + Sync + 'static {
    fn probe(&self, url: &str, timeout: Duration) -> BoxFuture<'static, ProbeOutcome>;
}

/// The real prober: HTTP/1.1 `GET` over a [`Connect`] (tokio TCP in production, turmoil's
/// network in the simulation), with TLS for `https://` URLs (the system's CA certificates).
/// Any other scheme fails at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpProber<C: Connect>(pub C);

impl<C: Connect> Prober for HttpProber<C> {
    fn probe(&self, url: &str, timeout: Duration) -> BoxFuture<'static, ProbeOutcome> {
        let parsed = match gateway_client::HttpUrl::parse(url) {
            Ok(u) => u,
            Err(e) => {
                let reason = format!("cannot probe {url:?}: {}", e.reason);
                return Box::pin(std::future::ready(ProbeOutcome::Failed(reason)));
            }
        };
        let connector = self.0.clone();
        Box::pin(async move {
            match tokio::time::timeout(timeout, get_status(connector, parsed)).await {
                Ok(Ok(status)) => ProbeOutcome::Status(status),
                Ok(Err(reason)) => ProbeOutcome::Failed(reason),
                Err(_) => {
                    ProbeOutcome::Failed(format!("no answer within {} ms", timeout.as_millis()))
                }
            }
        })
    }
}

/// Aborts a task when dropped: the probe's connection task ends with the probe, whichever way
/// the probe ends (answered, failed, or timed out and dropped).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One `GET`: connect, send, wait for the response head. The body is not read.
async fn get_status<C: Connect>(connector: C, url: gateway_client::HttpUrl) -> Result<u16, String> {
    let host_port = url.host_port();
    let stream = gateway_client::dial(&connector, &url, &gateway_client::TlsTrust::system())
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => format!("connection refused ({host_port})"),
            _ => format!("cannot connect to {host_port}: {e}"),
        })?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {host_port} failed: {e}"))?;
    let _conn = AbortOnDrop(
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "probe connection ended");
            }
        })
        .abort_handle(),
    );
    let request = hyper::Request::get(url.path.as_str())
        .header(hyper::header::HOST, host_port.as_str())
        .header(hyper::header::USER_AGENT, "mcp-gateway-probe")
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("cannot build the probe request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("no HTTP answer from {host_port}: {e}"))?;
    Ok(response.status().as_u16())
}

/// The path of the temporary file a pin file is written to before the rename:
/// `<pin_file>.tmp`, in the same directory.
pub fn pin_tmp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_else(|| "pins.toml".into());
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replaces `path`'s content with `text` atomically: writes `<path>.tmp` in the same
/// directory, syncs it, renames it over `path`, then syncs the directory (on unix; a failure
/// of that last step is only logged at debug). A reader sees the old file or the new one,
/// never a mix; after a crash the file is one or the other. Blocking: run it off the runtime.
pub fn write_pins_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = pin_tmp_path(path);
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        // Best effort: do not leave a half-written temporary file behind.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(path);
    Ok(())
}

/// Makes the rename durable: fsync of the directory that holds `path` (unix only).
pub(crate) fn sync_dir(path: &Path) {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot fsync the pin file's directory");
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Reads the pin file at `path` for [`crate::serve`]: `Ok(None)` if it does not exist yet;
/// an error naming the file if it cannot be read or does not parse.
pub fn load_pins(path: &Path) -> std::io::Result<Option<gateway_core::Pins>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("cannot read the pin file {}: {e}", path.display()),
            ))
        }
    };
    gateway_core::Pins::parse(&text).map(Some).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the pin file {} is not valid; fix it, or move it away to pin every sled anew: {}",
                path.display(),
                e.0
            ),
        )
    })
}

/// Counts kept by the server itself (not the core), rendered at `/metrics`.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// Pin file writes that failed.
    pub pin_file_write_errors: AtomicU64,
    /// HTTP connections open now (uplink WebSockets leave this count when they upgrade).
    pub http_connections_open: AtomicU64,
    /// HTTP connections closed for waiting longer than the idle timeout for a request head.
    pub http_idle_closed: AtomicU64,
    /// `/mcp` requests refused for their credentials before their body was read.
    pub http_refused_before_body: AtomicU64,
    /// `/mcp` requests whose body did not arrive within the body read deadline.
    pub http_body_timeouts: AtomicU64,
    /// Connections refused at accept: the server held `max_connections`.
    pub http_connections_refused: AtomicU64,
    /// Connections refused at accept: their address held `max_connections_per_address`.
    pub http_connections_refused_per_address: AtomicU64,
    /// Uplinks cut for sending more than the pre-welcome allowance before their welcome.
    pub uplink_pre_welcome_cut: AtomicU64,
    /// TLS handshakes that failed or did not finish in time (with `--tls-cert` only).
    pub tls_handshakes_failed: AtomicU64,
    /// In a cluster: values and messages in the engine that failed verification under the
    /// cluster secret, by source and reason.
    pub cluster_unverified: std::sync::Arc<crate::cluster::seal::Unverified>,
    /// A single gateway with a store: its coordination batches written.
    pub store_writes: StoreWrites,
}

/// The coordination batches a single gateway wrote to its store: how many, how many writes
/// failed, and how long each batch took to be durable (buckets as the core's latency
/// histograms, each bucket's own count, the last one past them).
#[derive(Debug, Default)]
pub struct StoreWrites {
    pub batches: AtomicU64,
    pub failed: AtomicU64,
    pub buckets: [AtomicU64; 14],
    pub sum_micros: AtomicU64,
}

impl StoreWrites {
    /// One batch, durable (or failed) after `took`, with `failed` writes that failed.
    pub fn observe(&self, took: Duration, failed: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.failed.fetch_add(failed as u64, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        let i = gateway_core::LATENCY_BUCKETS_SECONDS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(gateway_core::LATENCY_BUCKETS_SECONDS.len());
        self.buckets[i.min(self.buckets.len() - 1)].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// The driver's end of the pin file: hands the latest text to the writer task.
#[derive(Debug)]
pub(crate) enum PinSink {
    /// No pin file: pins live only in the core's memory.
    Memory,
    File {
        path: PathBuf,
        tx: watch::Sender<Option<String>>,
    },
}

impl PinSink {
    /// Never blocks: the writer takes the latest text when it is free.
    pub(crate) fn save(&self, text: String) {
        match self {
            PinSink::Memory => {
                tracing::debug!("pins changed; kept in memory only (no pin file)");
            }
            PinSink::File { path, tx } => {
                tracing::debug!(path = %path.display(), "pins changed; writing the pin file");
                tx.send_replace(Some(text));
            }
        }
    }
}

/// Starts the pin file's writer task. It writes each text handed to the [`PinSink`] (only the
/// latest, if several came while it was writing), and ends once the sink is dropped and the
/// last text is written: await the handle to know the file is up to date.
pub(crate) fn spawn_pin_writer(
    path: PathBuf,
    counters: Arc<ServerCounters>,
) -> (PinSink, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = watch::channel::<Option<String>>(None);
    let sink = PinSink::File {
        path: path.clone(),
        tx,
    };
    let task = tokio::spawn(async move {
        // `changed` reports a value not yet seen even after the sender is gone, so the last
        // save before shutdown is written before the task ends.
        while rx.changed().await.is_ok() {
            let Some(text) = rx.borrow_and_update().clone() else {
                continue;
            };
            let p = path.clone();
            let result = tokio::task::spawn_blocking(move || write_pins_atomically(&p, &text))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            match result {
                Ok(()) => tracing::info!(path = %path.display(), "pin file written"),
                Err(e) => {
                    counters
                        .pin_file_write_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::error!(path = %path.display(), error = %e, "cannot write the pin file; the pins stay in memory and the next change tries again");
                }
            }
        }
    });
    (sink, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tmp_file_sits_beside_the_pin_file() {
        assert_eq!(
            pin_tmp_path(Path::new("/etc/gw/pins.toml")),
            Path::new("/etc/gw/pins.toml.tmp")
        );
        assert_eq!(pin_tmp_path(Path::new("p")), Path::new("p.tmp"));
    }

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gateway-server-fleet-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[tokio::test]
    async fn the_writer_writes_the_latest_text_before_it_ends() {
        let dir = scratch_dir("writer");
        let path = dir.join("pins.toml");
        let counters = Arc::new(ServerCounters::default());
        let (sink, task) = spawn_pin_writer(path.clone(), counters.clone());
        sink.save("# first\n".into());
        sink.save("# second\n".into());
        drop(sink);
        task.await.expect("writer task");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "# second\n");
        assert!(!pin_tmp_path(&path).exists());
        assert_eq!(counters.pin_file_write_errors.load(Ordering::Relaxed), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_failed_write_is_counted_and_leaves_no_tmp_file() {
        let dir = scratch_dir("fail");
        // The pin file's directory does not exist: the write fails.
        let path = dir.join("missing").join("pins.toml");
        let counters = Arc::new(ServerCounters::default());
        let (sink, task) = spawn_pin_writer(path.clone(), counters.clone());
        sink.save("# pins\n".into());
        drop(sink);
        task.await.expect("writer task");
        assert_eq!(counters.pin_file_write_errors.load(Ordering::Relaxed), 1);
        assert!(!path.exists() && !pin_tmp_path(&path).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn without_a_save_nothing_is_written() {
        let dir = scratch_dir("idle");
        let path = dir.join("pins.toml");
        let (sink, task) = spawn_pin_writer(path.clone(), Arc::default());
        drop(sink);
        task.await.expect("writer task");
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_bad_url_fails_at_once() {
        let p = HttpProber(gateway_client::TokioConnect);
        for url in ["wss://x:1/", "not a url", "ftp://x"] {
            match p.probe(url, Duration::from_secs(60)).await {
                ProbeOutcome::Failed(reason) => assert!(reason.contains(url), "{reason}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
