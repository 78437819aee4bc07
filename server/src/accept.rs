//! The HTTP/1 accept loop: one hyper connection task per accepted socket, serving the router.
//!
//! `axum::serve` does the same but installs no timer in hyper, so an idle keep-alive
//! connection is held open forever (a file descriptor and hyper's ~19 KiB of buffers each).
//! Here every connection gets [`hyper_util::rt::TokioTimer`] and a `header_read_timeout` of
//! [`crate::ServerOptions::http_idle_timeout`]: hyper starts that clock whenever it waits for
//! a request head, so it bounds both the idle time between requests and a client that sends
//! its headers too slowly, and closes the connection when it runs out. A connection busy with a
//! request (a long call, an SSE stream) is not waiting for a head and is never cut by it, and
//! an upgraded uplink WebSocket has left hyper altogether. `tokio::time` drives the timer, so
//! turmoil's clock drives it in the simulation.
//!
//! Shutdown is axum's: when `signal` resolves the listener is dropped, every connection is told
//! to finish the request it is serving and close, and [`serve_http`] returns once they all
//! have.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;

use crate::fleet::ServerCounters;

/// Accepts on `listener` and serves `app` until `signal` resolves, then waits for the open
/// connections to finish (the caller bounds that wait).
pub(crate) async fn serve_http<L>(
    mut listener: L,
    app: Router,
    idle_timeout: Option<Duration>,
    counters: Arc<ServerCounters>,
    signal: impl Future<Output = ()>,
) where
    L: Listener,
    L::Addr: std::fmt::Debug,
{
    // `stop_tx` is dropped when shutdown starts: each connection then finishes gracefully.
    // Each connection task holds a `done_rx`; `done_tx.closed()` resolves when all are gone.
    let (stop_tx, stop_rx) = watch::channel(());
    let (done_tx, done_rx) = watch::channel(());
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(idle_timeout);

    let mut signal = std::pin::pin!(signal);
    loop {
        // `Listener::accept` retries failed accepts itself (and backs off when out of file
        // descriptors), so it only ever yields a connection.
        let (io, peer) = tokio::select! {
            conn = listener.accept() => conn,
            () = &mut signal => break,
        };
        tracing::trace!(?peer, "HTTP connection accepted");
        let conn = builder
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(app.clone()))
            .with_upgrades();
        let mut stop_rx = stop_rx.clone();
        let done_rx = done_rx.clone();
        let counters = counters.clone();
        counters
            .http_connections_open
            .fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = stop_rx.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            match result {
                Ok(()) => {}
                Err(e) if e.is_timeout() => {
                    counters.http_idle_closed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(?peer, "HTTP connection closed: idle past the timeout");
                }
                Err(e) => tracing::debug!(?peer, error = %e, "HTTP connection ended"),
            }
            counters
                .http_connections_open
                .fetch_sub(1, Ordering::Relaxed);
            drop(done_rx);
        });
    }
    drop(listener);
    drop(stop_tx);
    drop(done_rx);
    done_tx.closed().await;
}
