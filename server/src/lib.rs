//! The MCP gateway server: the only code that touches sockets.
//!
//! It is thin. HTTP requests to `/mcp` and frames on uplink WebSockets become
//! [`gateway_core::Input`]s; the [`gateway_core::Output`]s the core decides on become HTTP
//! responses, frames and closes. Nothing here decides anything about MCP.
//!
//! # Shape
//!
//! - One *driver* task owns the [`gateway_core::Gateway`] by `&mut` (see `driver.rs`). It is the
//!   only place that calls `handle`, `handle_timeout` and `poll_*`.
//! - HTTP connections are accepted in `accept.rs` (hyper's HTTP/1 with a timer, so idle
//!   keep-alive connections close after [`ServerOptions::http_idle_timeout`]) and routed by
//!   axum.
//! - Connection tasks (axum handlers for `/mcp`, one task per uplink WebSocket) talk to it over
//!   one bounded command channel, and get their answers over a oneshot (HTTP) or a per-uplink
//!   channel of outbound frames.
//! - Time comes only from `tokio::time`, so the same code runs on turmoil's simulated clock, and
//!   [`serve`] is generic over [`axum::serve::Listener`], so it runs on turmoil's sockets.
//!
//! # Shutdown
//!
//! When the `shutdown` future given to [`serve`] resolves:
//!
//! 1. the listener stops accepting and open HTTP connections finish the request they are
//!    serving (idle keep-alive connections close; see `accept.rs`);
//! 2. the driver gives the HTTP requests still waiting for an answer up to
//!    [`ServerOptions::shutdown_grace`] to be answered;
//! 3. then (or as soon as none is waiting) it feeds [`gateway_core::Input::Shutdown`] to the core,
//!    which fails whatever is still pending and closes every uplink with `GoingAway`; the driver
//!    carries those outputs out, and the uplink tasks send their close frames and end;
//! 4. the driver keeps answering (the core refuses new requests) until every connection task has
//!    ended, and [`serve`] returns. Should a peer hold a connection open past
//!    `shutdown_grace` + [`SHUTDOWN_LINGER`], `serve` stops waiting for it and returns anyway.
//! 5. with a pin file, the last pins the core asked to save are written before `serve` returns;
//!    with a store ([`ServerOptions::store`]), so are the last session writes (the caller then
//!    closes the store).
//!
//! # Fleet
//!
//! The core asks for HTTP health probes ([`gateway_core::Output::Probe`]): each runs in a task
//! of its own through [`ServerOptions::prober`] and reports back through the driver's command
//! channel. It asks for the pin file to be saved ([`gateway_core::Output::SavePins`]): with
//! [`ServerOptions::pin_file`], one writer task replaces the file atomically (see
//! [`fleet::write_pins_atomically`]); without, the pins live in memory only. A pin file is
//! read when `serve` starts, before any event; one that does not parse is an error.
//!
//! # Tracing
//!
//! With [`ServerOptions::otlp`], the core's spans ([`gateway_core::Output::Span`]) are exported
//! to an OpenTelemetry collector over OTLP/HTTP (see [`otlp`]): the driver converts their
//! instants to wall-clock times and hands them to the SDK's batch processor, whose own thread
//! sends them; `serve` flushes what is left once the driver has stopped. Without it, nothing is
//! built, no thread or task is started, and the core makes no span (so a simulation stays
//! deterministic).

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

pub use accept::Backlog;
pub use fleet::{HttpProber, Prober};
pub use limits::{Limits, PeerAddr};

mod accept;
mod admission;
pub mod cluster;
mod driver;
pub mod fleet;
mod hangup;
mod http;
pub mod in_process;
pub mod limits;
pub mod metrics;
pub mod oauth;
mod ops;
pub mod otlp;
mod reload;
pub mod stdio;
pub mod store;
pub mod tls;
mod uplink;

/// The wall-clock time now, in milliseconds since the Unix epoch, for
/// `gateway_core::Config::wall_clock_ms` (the times of the tasks the gateway runs itself).
pub fn wall_clock_ms() -> Option<u64> {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    u64::try_from(since.as_millis()).ok()
}

/// The default of [`ServerOptions::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// `gateway serve`'s [`ServerOptions::drain_settle`].
pub const DEFAULT_DRAIN_SETTLE: Duration = Duration::from_millis(250);

/// The default of [`ServerOptions::max_body_bytes`]: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// The largest message accepted on an uplink WebSocket: 16 MiB.
pub const MAX_UPLINK_MESSAGE_BYTES: usize = 16 << 20;

/// The default of [`ServerOptions::http_idle_timeout`]: nginx's `keepalive_timeout` is 75 s,
/// MCP clients' own pools let connections go after 5 s (httpx) to 4 s (undici).
pub const DEFAULT_HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long past the grace period [`serve`] waits for connections that will not close.
pub const SHUTDOWN_LINGER: Duration = Duration::from_secs(5);

/// How long a stopping replica goes on refusing relays once its claims are released: the other
/// replicas hear of the releases within it, and hold their requests for the projects' next
/// holders instead.
const RELAY_REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// How many commands connection tasks may queue for the driver before they wait.
const COMMAND_QUEUE: usize = 1024;

/// Everything [`serve`] needs besides a listener and a shutdown signal.
#[derive(Clone)]
pub struct ServerOptions {
    pub registry: gateway_core::Registry,
    pub core: gateway_core::Config,
    /// Seed of the session-id generator: fresh OS randomness in production, fixed in tests.
    pub seed: [u8; 32],
    /// How long calls in flight get to finish once shutdown starts.
    pub shutdown_grace: Duration,
    /// At shutdown, how long the server goes on serving once it has stopped accepting
    /// (and has accepted what the kernel had completed), before the drain starts: time for
    /// the connections just accepted to deliver their requests, so that a load balancer's
    /// request is neither reset nor refused as the server goes. `gateway serve` uses
    /// [`DEFAULT_DRAIN_SETTLE`]; zero here.
    pub drain_settle: Duration,
    /// The largest `/mcp` request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
    /// The projects.toml to reload on SIGHUP or when it changes, with the text `registry`
    /// was parsed from; `None`: no reloading.
    pub reload_from: Option<(std::path::PathBuf, String)>,
    /// Carries out the core's HTTP health probes. Default: [`HttpProber`] over tokio TCP; a
    /// simulation gives one over its own network.
    pub prober: Arc<dyn Prober>,
    /// Where sled identity pins are kept across restarts: read when [`serve`] starts (a missing
    /// file means no pins yet; one that does not parse is an error), replaced atomically
    /// whenever the core changes a pin. `None`: pins are kept in memory only.
    pub pin_file: Option<std::path::PathBuf>,
    /// With [`ServerOptions::store`]: keep the pins in the store instead (bucket `pins`), each
    /// first-use pin written there before its sled is welcomed. A `pin_file` that exists is
    /// then moved into the store once and renamed `<file>.imported`.
    pub pins_in_store: bool,
    /// How long an HTTP connection may wait for the head of its next request (idle between
    /// requests, or sending its headers) before it is closed; `None`: never closed for that.
    pub http_idle_timeout: Option<Duration>,
    /// How access tokens' keys are fetched and kept, when projects.toml has `[oauth]`.
    pub oauth: oauth::OAuthOptions,
    /// Where the core's spans are exported over OTLP/HTTP; `None` (the default): no export,
    /// and [`gateway_core::Config::export_spans`] is turned off.
    pub otlp: Option<otlp::OtlpConfig>,
    /// Join a cluster of replicas through its engine (see [`cluster::replica`]); `None` (the
    /// default): a single-process gateway, no engine.
    pub cluster: Option<cluster::replica::ClusterOptions>,
    /// Where a single gateway keeps its sessions across restarts (see [`store::records`];
    /// `gateway serve` gives the embedded store of its `--state-dir`), opened and closed by
    /// the caller. `None` (the default): sessions live in memory only. A replica of a cluster
    /// keeps them in the cluster's engine instead, and [`serve`] refuses both at once.
    pub store: Option<Arc<dyn store::Store>>,
    /// The wall clock the store's coordination records are stamped and aged by (the system's;
    /// the simulation's follows simulated time).
    pub store_clock: cluster::seal::WallClock,
    /// Connection caps and the body read deadline, which hold before authentication.
    pub limits: limits::Limits,
    /// Serve HTTPS and WSS with this certificate and key, on every listener, reloaded on SIGHUP
    /// and when the files change (see [`tls`]); `None` (the default): plain HTTP, for loopback
    /// or behind a proxy that ends TLS.
    pub tls: Option<tls::ServerTls>,
    /// Also serve the connections dialed in this process through the pair's
    /// [`in_process::InProcessConnect`] (sleds run by `gateway serve --connector`), plain,
    /// under the same caps; `None` (the default): none.
    pub in_process: Option<in_process::InProcessListener>,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("registry", &self.registry)
            .field("core", &self.core)
            .field("seed", &"..")
            .field("shutdown_grace", &self.shutdown_grace)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("reload_from", &self.reload_from.as_ref().map(|(p, _)| p))
            .field("prober", &"dyn Prober")
            .field("pin_file", &self.pin_file)
            .field("pins_in_store", &self.pins_in_store)
            .field("http_idle_timeout", &self.http_idle_timeout)
            .field("oauth", &self.oauth)
            .field("otlp", &self.otlp)
            .field("cluster", &self.cluster)
            .field("store", &self.store.as_ref().map(|_| "dyn Store"))
            .field("limits", &self.limits)
            .field("tls", &self.tls)
            .field("in_process", &self.in_process.is_some())
            .finish()
    }
}

impl ServerOptions {
    /// Options with the defaults for everything but the registry and the seed.
    pub fn new(registry: gateway_core::Registry, seed: [u8; 32]) -> ServerOptions {
        ServerOptions {
            registry,
            core: gateway_core::Config::default(),
            seed,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            drain_settle: Duration::ZERO,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            reload_from: None,
            prober: Arc::new(HttpProber(gateway_client::TokioConnect)),
            pin_file: None,
            pins_in_store: false,
            http_idle_timeout: Some(DEFAULT_HTTP_IDLE_TIMEOUT),
            oauth: oauth::OAuthOptions::default(),
            otlp: None,
            cluster: None,
            store: None,
            store_clock: cluster::seal::system_clock(),
            limits: limits::Limits::default(),
            tls: None,
            in_process: None,
        }
    }
}

/// Runs the gateway on `listener` until `shutdown` resolves and the shutdown sequence (see the
/// crate docs) has run its course.
///
/// Routes: `POST`/`GET`/`DELETE /mcp` (MCP Streamable HTTP, decided by the core),
/// `GET /healthz` (`ok`), `GET /metrics` (the OpenMetrics text format, see [`metrics`]; only
/// while client authentication is off, see [`serve_with_metrics`]), and
/// `GET` [`gateway_core::uplink::UPLINK_PATH`] (the sleds' uplink WebSocket).
pub async fn serve<L>(
    listener: L,
    opts: ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: Backlog,
    L::Addr: std::fmt::Debug + PeerAddr,
{
    serve_with_metrics(listener, None::<L>, opts, shutdown).await
}

/// [`serve`], with `GET /metrics` (and `GET /healthz`) also served on `metrics_listener`, when
/// given, by a task of its own; `/metrics` is then never served on `listener`. Without it,
/// `listener` serves `/metrics` only while projects.toml turns on no client authentication
/// (no `client_tokens`, no `[oauth]`), following the file in force across reloads; with
/// authentication on it answers 404 there. The metrics listener stops accepting when shutdown
/// starts.
pub async fn serve_with_metrics<L, M>(
    listener: L,
    metrics_listener: Option<M>,
    opts: ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: Backlog,
    L::Addr: std::fmt::Debug + PeerAddr,
    M: Backlog,
    M::Addr: std::fmt::Debug + PeerAddr,
{
    let ServerOptions {
        registry,
        mut core,
        seed,
        shutdown_grace,
        drain_settle,
        max_body_bytes,
        reload_from,
        prober,
        pin_file,
        pins_in_store,
        http_idle_timeout,
        oauth,
        otlp,
        cluster,
        store,
        store_clock,
        limits,
        tls,
        in_process,
    } = opts;
    if cluster.is_some() && store.is_some() {
        return Err(std::io::Error::other(
            "a replica of a cluster keeps its sessions in the cluster's engine: give no store",
        ));
    }
    // A single gateway with a store keeps its sessions there.
    core.store_sessions = store.is_some();
    core.store_pins = pins_in_store && store.is_some();
    if let Some(c) = &cluster {
        core.cluster = Some(c.core_config());
    }
    let session_ttl = core.session_idle_ttl;
    // Spans are made only when they can go somewhere.
    core.export_spans = otlp.is_some();
    // Bearer tokens are verified in the request tasks; new issuers' keys are fetched from now
    // on, so the first request finds them.
    let resource_server = oauth::ResourceServer::new(registry.oauth(), oauth);
    let metrics_placement = ops::MetricsPlacement::new(metrics_listener.is_some(), &registry);
    let admission = Arc::new(admission::Admission::new(&registry));
    #[cfg(feature = "planted-bugs")]
    let core_planted = core.planted;
    let registry_names: Vec<String> = registry.names().map(str::to_owned).collect();
    let mut gateway = gateway_core::Gateway::new(registry, core, seed);
    let counters = Arc::new(fleet::ServerCounters::default());
    // The pins from an earlier run go in before any event, so no sled is pinned anew by
    // mistake; a pin file that cannot be used stops the server rather than forget them.
    let (pins, pin_writer) = match (pin_file, &store) {
        (pin_file, Some(store)) if pins_in_store => {
            if let Some(path) = pin_file {
                if let Some((n, to)) = store::records::import_pin_file(store, &path)
                    .await
                    .map_err(std::io::Error::other)?
                {
                    tracing::warn!(pinned = n, from = %path.display(), renamed = %to.display(),
                        "the pin file's pins are moved into the state store; the file is kept, renamed, and no longer read");
                }
            }
            let pins = store::records::load_pins(store).await.map_err(|e| {
                std::io::Error::other(format!("reading the pins from the state store: {e}"))
            })?;
            tracing::info!(pinned = pins.pins.len(), "pins read from the state store");
            gateway.load_pins(pins);
            (fleet::PinSink::Memory, None)
        }
        (Some(path), _) => {
            match fleet::load_pins(&path)? {
                Some(pins) => {
                    tracing::info!(path = %path.display(), pinned = pins.pins.len(), "pin file loaded");
                    gateway.load_pins(pins);
                }
                None => {
                    tracing::info!(path = %path.display(), "no pin file yet; sleds are pinned on first use");
                }
            }
            let (sink, task) = fleet::spawn_pin_writer(path, counters.clone());
            (sink, Some(task))
        }
        (None, _) => (fleet::PinSink::Memory, None),
    };
    // Built last before the driver starts, so that no early return leaves its thread behind.
    let spans = match &otlp {
        Some(config) => Some(Arc::new(
            otlp::SpanExport::start(config).map_err(std::io::Error::other)?,
        )),
        None => None,
    };
    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
    let ids = Arc::new(Ids::default());
    // Set when shutdown starts: from then on a replica refuses requests other replicas relay
    // (they wait for the project's next holder instead).
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // In a cluster, the engine is set up (buckets, the relay subject, the watches) before the
    // driver takes any event; a replica that cannot reach it does not start.
    let (cluster_io, cluster_tasks) = match &cluster {
        Some(c) => {
            let run = hex::encode(&seed[..4]);
            let seal = cluster::seal::Seal::new(
                c.keys.clone(),
                c.clock.clone(),
                counters.cluster_unverified.clone(),
            );
            #[cfg(feature = "planted-bugs")]
            let seal = match core_planted {
                Some(gateway_core::PlantedBug::TrustTheEngine) => seal.trusting_everything(),
                Some(gateway_core::PlantedBug::ForgetNonces) => seal.forgetting_nonces(),
                _ => seal,
            };
            #[cfg(feature = "planted-bugs")]
            let c = &cluster::replica::ClusterOptions {
                planted: core_planted,
                ..c.clone()
            };
            let (io, running) = cluster::replica::start(
                c,
                Arc::new(seal),
                session_ttl,
                run,
                cmd_tx.downgrade(),
                ids.clone(),
                (draining.clone(), counters.clone()),
                registry_names,
            )
            .await
            .map_err(|e| std::io::Error::other(format!("joining the cluster: {e}")))?;
            tracing::info!(
                replica = c.replica,
                namespace = c.namespace,
                "joined the cluster"
            );
            (Some(io), Some(running))
        }
        None => (None, None),
    };
    // A single gateway's sessions: the bucket is made before the driver takes any event; a
    // store that cannot be written stops the start.
    let (records_io, records_task) = match store {
        Some(store) => {
            // What agents left in the coordination state (leases, the board) comes back
            // before any event.
            let records = store::records::load_coordination(&store, &store_clock)
                .await
                .map_err(|e| {
                    std::io::Error::other(format!("reading the coordination state: {e}"))
                })?;
            if !records.is_empty() {
                let restored =
                    gateway.restore_coordination(tokio::time::Instant::now().into_std(), records);
                tracing::info!(
                    projects = restored.projects,
                    leases = restored.leases,
                    board_keys = restored.board_keys,
                    skipped = restored.skipped,
                    "coordination state restored from the store"
                );
            }
            let (io, task) = store::records::start(
                store,
                session_ttl,
                store_clock,
                counters.clone(),
                cmd_tx.downgrade(),
            )
            .await
            .map_err(|e| std::io::Error::other(format!("opening the session store: {e}")))?;
            (Some(io), Some(task))
        }
        None => (None, None),
    };
    let fleet_io = driver::FleetIo {
        prober,
        commands: cmd_tx.downgrade(),
        pins,
        spans: spans.clone(),
        cluster: cluster_io,
        records: records_io,
    };

    // Dropped when the driver task ends, whichever way: a driver that died before shutdown
    // (a bug in the core) takes the server down with it instead of leaving it answering 503.
    // How long a stopping gateway lets its calls in flight finish before it closes its
    // uplinks (none, with the planted bug).
    let drain_grace = shutdown_grace;
    #[cfg(feature = "planted-bugs")]
    let drain_grace = match core_planted {
        Some(gateway_core::PlantedBug::StopWithoutDrain) => Duration::ZERO,
        _ => drain_grace,
    };
    let (driver_alive, driver_gone) = oneshot::channel::<()>();
    let driver = tokio::spawn(async move {
        let _alive = driver_alive;
        driver::run(gateway, cmd_rx, drain_grace, fleet_io).await;
    });
    // A replica's driver learns where each project's sled is before it takes any request
    // (the accept loop starts below).
    let mut cluster_tasks = cluster_tasks;
    if let Some(running) = cluster_tasks.as_mut() {
        for event in std::mem::take(&mut running.directory) {
            // The driver is running: the queue frees up; a driver gone fails the start below.
            let _ = cmd_tx.send(driver::Command::Cluster(event)).await;
        }
    }
    // The watcher holds a sender of the driver's: it is stopped when shutdown starts, so the
    // driver can end once the connections have.
    let watcher = reload_from.map(|(path, text)| {
        tokio::spawn(reload::watch(
            path,
            Some(text),
            cmd_tx.clone(),
            resource_server.clone(),
            metrics_placement.clone(),
            admission.clone(),
        ))
    });

    let state = http::AppState {
        cmd: cmd_tx.clone(),
        ids,
        max_body_bytes,
        counters: counters.clone(),
        oauth: resource_server,
        metrics: metrics_placement,
        admission,
        body_timeout: limits.body_timeout,
    };
    let app = http::router(state);

    // The metrics listener, if any: its own accept loop, a task, until shutdown starts (when
    // `ops_stop` is dropped). Its connections are not counted with the MCP port's.
    let (ops_stop, mut ops_stopped) = tokio::sync::watch::channel(());
    let ops = metrics_listener.map(|l| {
        let app = ops::router(cmd_tx.downgrade(), counters.clone());
        tokio::spawn(accept::serve_http(
            l,
            app,
            http_idle_timeout,
            Arc::new(fleet::ServerCounters::default()),
            limits::Gate::new(limits::Limits::default()),
            tls.clone(),
            accept::Drain {
                signal: async move {
                    let _ = ops_stopped.changed().await;
                },
                settle: Duration::ZERO,
                then: async {},
            },
        ))
    });

    let gate = limits::Gate::new(limits);
    // The in-process connections: their own accept loop, a task, plain, under the same caps,
    // until shutdown starts (when `ops_stop` is dropped), like the TCP listener's.
    let in_process = in_process.map(|l| {
        let mut stopped = ops_stop.subscribe();
        tokio::spawn(accept::serve_http(
            l,
            app.clone(),
            http_idle_timeout,
            counters.clone(),
            gate.clone(),
            None,
            accept::Drain {
                signal: async move {
                    let _ = stopped.changed().await;
                },
                settle: Duration::ZERO,
                then: async {},
            },
        ))
    });
    let (started_tx, started_rx) = oneshot::channel::<Instant>();
    let signal = async move {
        tokio::select! {
            () = shutdown => {
                tracing::info!(grace = ?shutdown_grace, settle = ?drain_settle, "shutting down: no new connections, calls in flight may finish");
            }
            _ = driver_gone => {
                tracing::error!("the gateway driver stopped; shutting the server down");
            }
        }
    };
    // Once accepting has stopped and settled: the drain.
    let then = async move {
        draining.store(true, std::sync::atomic::Ordering::Relaxed);
        // If the driver is gone there is nobody to tell; the send fails and that is fine.
        let _ = cmd_tx.send(driver::Command::Shutdown).await;
        drop(ops_stop);
        let _ = started_tx.send(Instant::now());
    };
    let drain = accept::Drain {
        signal,
        settle: drain_settle,
        then,
    };

    // The certificate and key are re-read on SIGHUP and whenever they change.
    let tls_watcher = tls.clone().map(|t| tokio::spawn(tls::watch(t)));
    let server = accept::serve_http(listener, app, http_idle_timeout, counters, gate, tls, drain);
    let mut server = std::pin::pin!(server);
    let mut served = false;
    // Phase 1: serve until shutdown starts.
    let started = tokio::select! {
        () = &mut server => { served = true; None }
        s = started_rx => s.ok(),
    };
    if let Some(w) = &watcher {
        w.abort();
    }
    if let Some(w) = &tls_watcher {
        w.abort();
    }
    let give_up = started.unwrap_or_else(Instant::now) + shutdown_grace + SHUTDOWN_LINGER;
    // Phase 2: open HTTP connections finish their requests, the driver waits for every
    // connection task.
    if !served && tokio::time::timeout_at(give_up, server).await.is_err() {
        tracing::warn!("HTTP connections still open after the grace period; not waiting");
    }
    if let Some(ops) = ops {
        let ops_abort = ops.abort_handle();
        if tokio::time::timeout_at(give_up, ops).await.is_err() {
            tracing::warn!("metrics connections still open after the grace period; not waiting");
            ops_abort.abort();
        }
    }
    if let Some(in_process) = in_process {
        let abort = in_process.abort_handle();
        if tokio::time::timeout_at(give_up, in_process).await.is_err() {
            tracing::warn!("in-process connections still open after the grace period; not waiting");
            abort.abort();
        }
    }
    let driver_abort = driver.abort_handle();
    let driven = match tokio::time::timeout_at(give_up, driver).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("uplinks or requests still open after the grace period; not waiting");
            driver_abort.abort();
            Ok(())
        }
    };
    // The driver is gone: the cluster's executor finishes what it was handed (the releases of
    // the claims among them). The relays other replicas send before they hear of the releases
    // are refused for a moment more (they wait for the projects' next holders: a relay dropped
    // unanswered would end `unknown`); then the watches and the relay subscription stop.
    if let Some(running) = cluster_tasks {
        let executor_abort = running.executor.abort_handle();
        if tokio::time::timeout(SHUTDOWN_LINGER, running.executor)
            .await
            .is_err()
        {
            tracing::warn!("cluster actions still in flight after the linger; not waiting");
            executor_abort.abort();
        }
        tokio::time::sleep(RELAY_REFUSAL_LINGER).await;
        for task in &running.others {
            task.abort();
        }
    }
    // The driver is gone: the store's executor finishes the session writes it was handed.
    if let Some(task) = records_task {
        let abort = task.abort_handle();
        if tokio::time::timeout(SHUTDOWN_LINGER, task).await.is_err() {
            tracing::warn!("session writes still in flight after the linger; not waiting");
            abort.abort();
        }
    }
    // The driver is gone: the spans it handed over (the last ones from the core's shutdown
    // among them) go out now, on a thread that may block.
    if let Some(spans) = spans {
        let flushed = tokio::task::spawn_blocking(move || spans.shutdown()).await;
        if let Err(e) = flushed {
            tracing::error!(error = %e, "flushing the span export failed");
        }
    }
    // The driver is gone, and with it the pin sink: the writer writes the last pins it was
    // handed, if any, and ends.
    if let Some(writer) = pin_writer {
        if let Err(e) = writer.await {
            tracing::error!(error = %e, "the pin file writer failed");
        }
    }
    if let Err(e) = driven {
        if e.is_panic() {
            return Err(std::io::Error::other(format!(
                "the gateway driver panicked: {e}"
            )));
        }
    }
    Ok(())
}

/// Names the driver's requests and uplinks. Connection tasks take them from here so they know
/// their own name without a round trip to the driver (an HTTP request needs it to report its
/// abort). Both only count up, so a name is never reused.
#[derive(Debug, Default)]
pub(crate) struct Ids {
    http: AtomicU64,
    uplink: AtomicU64,
}

impl Ids {
    pub(crate) fn next_http(&self) -> gateway_core::HttpToken {
        gateway_core::HttpToken(self.http.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    pub(crate) fn next_uplink(&self) -> gateway_core::UplinkId {
        gateway_core::UplinkId(
            self.uplink
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }
}
