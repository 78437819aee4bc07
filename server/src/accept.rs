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
//! With TLS ([`crate::tls::ServerTls`]), each accepted connection's handshake runs in its own
//! task with the configuration in force when it was accepted, bounded by
//! [`crate::tls::HANDSHAKE_TIMEOUT`]; HTTP (and an uplink's WebSocket) runs over it. A failed
//! handshake ends that connection only, logged at debug level and counted.
//!
//! Shutdown, when `signal` resolves (see [`Drain`]): the connections the kernel has already
//! completed (the accept backlog) are accepted and served, so that none is reset when the
//! listener closes; the listener is dropped, so new connections are refused (a load balancer
//! tries another server; nothing was sent); from then on every answer but an upgrade's says
//! `Connection: close`, so a balancer's keep-alive pool drops each connection after its next
//! answer; then, `settle` later (time for what was just accepted to reach the driver, and for
//! a balancer to close the pooled connections it did not use: nginx's upstream
//! `keepalive_timeout` shorter than `settle`), `then` runs (the server's drain starts), every
//! connection is told to finish the request it is serving and close, and [`serve_http`]
//! returns once they all have. A connection closed while idle can cross a request the balancer
//! just sent on it; the balancer cannot tell whether a POST reached us and answers 502, so the
//! settle is what keeps keep-alive from costing a deploy calls.

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
use crate::limits::{Budgeted, Connection, Gate, PeerAddr, ReadBudget};
use crate::tls::{ServerStream, ServerTls};

/// A listener whose accept backlog can be taken at once, when the server stops accepting.
pub trait Backlog: Listener + Sized {
    /// Every connection the kernel has completed and not yet handed over, taken now without
    /// waiting; the listener closes after. The default takes none (a listener without a
    /// kernel backlog, such as the simulation's).
    fn take_backlog(self) -> Vec<(Self::Io, Self::Addr)> {
        Vec::new()
    }
}

impl Backlog for tokio::net::TcpListener {
    fn take_backlog(self) -> Vec<(Self::Io, Self::Addr)> {
        // Straight to the socket (non-blocking, as tokio left it): tokio's own accept waits
        // for the reactor to have seen a connection, which it may not have yet.
        let Ok(listener) = self.into_std() else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        while let Ok((stream, peer)) = listener.accept() {
            let stream = stream
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpStream::from_std(stream));
            match stream {
                Ok(s) => taken.push((s, peer)),
                Err(e) => {
                    tracing::debug!(error = %e, "a connection of the backlog could not be served")
                }
            }
        }
        taken
    }
}

/// How [`serve_http`] stops: when `signal` resolves it stops accepting, waits `settle`, runs
/// `then`, and lets the connections finish.
pub(crate) struct Drain<S, T> {
    pub(crate) signal: S,
    pub(crate) settle: Duration,
    pub(crate) then: T,
}

/// Accepts on `listener` and serves `app` until `drain.signal` resolves, then drains (see the
/// module docs) and waits for the open connections to finish (the caller bounds that wait).
/// With `tls`, every connection speaks TLS.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_http<L, S, T>(
    mut listener: L,
    app: Router,
    idle_timeout: Option<Duration>,
    counters: Arc<ServerCounters>,
    gate: Arc<Gate>,
    tls: Option<ServerTls>,
    drain: Drain<S, T>,
) where
    L: Backlog,
    L::Addr: std::fmt::Debug + PeerAddr,
    S: Future<Output = ()>,
    T: Future<Output = ()>,
{
    let Drain {
        signal,
        settle,
        then,
    } = drain;
    // `stop_tx` is dropped when shutdown starts: each connection then finishes gracefully.
    // Each connection task holds a `done_rx`; `done_tx.closed()` resolves when all are gone.
    let (stop_tx, stop_rx) = watch::channel(());
    // Set when shutdown starts: answers from then on close their connection.
    let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (done_tx, done_rx) = watch::channel(());
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(idle_timeout);

    let serve_one = |io: L::Io, peer: L::Addr| {
        tracing::trace!(?peer, "HTTP connection accepted");
        // The caps hold before anything is read: a connection over one is answered 503 and
        // closed (`limits.rs`).
        let permit = match gate.admit(peer.peer_ip()) {
            Ok(permit) => permit,
            Err(refused) => {
                let counter = match refused {
                    gateway_core::HttpError::TooManyConnections { per_address: true } => {
                        &counters.http_connections_refused_per_address
                    }
                    _ => &counters.http_connections_refused,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(?peer, "connection refused: {}", refused.message());
                if tls.is_some() {
                    // A plain answer means nothing to a TLS client, and a handshake costs what
                    // the cap is there to save: the connection is closed.
                    return;
                }
                let answer = crate::limits::refusal_bytes(&refused);
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let mut io = io;
                    let _ = tokio::time::timeout(Duration::from_secs(1), async {
                        io.write_all(&answer).await?;
                        io.shutdown().await
                    })
                    .await;
                });
                return;
            }
        };
        let budget = ReadBudget::unlimited();
        let connection = Connection {
            budget: budget.clone(),
            permit: Arc::new(std::sync::Mutex::new(Some(permit))),
        };
        let service = tower::ServiceExt::map_request(
            app.clone(),
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(connection.clone());
                request
            },
        );
        // Once shutdown has started, every answer (but an upgrade's) says `Connection: close`,
        // and hyper closes the connection after it: a balancer's keep-alive pool lets go of
        // this server's connections while it still serves (see the module docs).
        let closing = closing.clone();
        let service = tower::ServiceExt::map_response(
            service,
            move |mut response: axum::response::Response| {
                if closing.load(Ordering::Relaxed)
                    && response.status() != hyper::StatusCode::SWITCHING_PROTOCOLS
                {
                    response.headers_mut().insert(
                        hyper::header::CONNECTION,
                        hyper::header::HeaderValue::from_static("close"),
                    );
                }
                response
            },
        );
        let builder = builder.clone();
        // The TLS configuration in force now: a reload after this affects later connections.
        let acceptor = tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(t.config()));
        let mut stop_rx = stop_rx.clone();
        let done_rx = done_rx.clone();
        let counters = counters.clone();
        counters
            .http_connections_open
            .fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let served = {
                let counters = counters.clone();
                async move {
                    let io = match acceptor {
                        None => ServerStream::Plain(io),
                        Some(acceptor) => {
                            let handshake = tokio::select! {
                                r = crate::tls::accept(acceptor, io) => r,
                                _ = stop_rx.changed() => Err(crate::tls::HandshakeFailed::Shutdown),
                            };
                            match handshake {
                                Ok(tls) => ServerStream::Tls(Box::new(tls)),
                                Err(crate::tls::HandshakeFailed::Shutdown) => return,
                                Err(why) => {
                                    counters
                                        .tls_handshakes_failed
                                        .fetch_add(1, Ordering::Relaxed);
                                    tracing::debug!(?peer, "TLS handshake failed: {why}");
                                    return;
                                }
                            }
                        }
                    };
                    let conn = builder
                        .serve_connection(
                            TokioIo::new(Budgeted { io, budget }),
                            TowerToHyperService::new(service),
                        )
                        .with_upgrades();
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
                }
            };
            served.await;
            counters
                .http_connections_open
                .fetch_sub(1, Ordering::Relaxed);
            drop(done_rx);
        });
    };
    let mut signal = std::pin::pin!(signal);
    loop {
        // `Listener::accept` retries failed accepts itself (and backs off when out of file
        // descriptors), so it only ever yields a connection.
        let (io, peer) = tokio::select! {
            conn = listener.accept() => conn,
            () = &mut signal => break,
        };
        serve_one(io, peer);
    }
    closing.store(true, Ordering::Relaxed);
    // What the kernel completed and nobody accepted yet would be reset when the listener
    // closes: taken and served first. The listener is closed then.
    let backlog = listener.take_backlog();
    if !backlog.is_empty() {
        tracing::debug!(
            connections = backlog.len(),
            "serving the accept backlog at shutdown"
        );
    }
    for (io, peer) in backlog {
        serve_one(io, peer);
    }
    if !settle.is_zero() {
        tokio::time::sleep(settle).await;
    }
    then.await;
    drop(stop_tx);
    drop(done_rx);
    done_tx.closed().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server of `/healthz` on `listener` that stops on `signal` and settles for `settle`;
    /// the receiver hears when the drain starts.
    fn healthz_server(
        listener: tokio::net::TcpListener,
        signal: impl Future<Output = ()> + Send + 'static,
        settle: Duration,
    ) -> (
        tokio::task::JoinHandle<()>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let app = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let (then_tx, then_rx) = tokio::sync::oneshot::channel();
        let drain = Drain {
            signal,
            settle,
            then: async move {
                let _ = then_tx.send(());
            },
        };
        let server = tokio::spawn(serve_http(
            listener,
            app,
            None,
            Arc::new(ServerCounters::default()),
            crate::limits::Gate::new(crate::limits::Limits::default()),
            None,
            drain,
        ));
        (server, then_rx)
    }

    /// Connections the kernel completed before shutdown (the backlog) are served, not reset,
    /// and a connection after it is refused. Several rounds: the accept loop's `select!`
    /// picks between a ready accept and the ready signal at random.
    #[tokio::test]
    async fn the_backlog_at_shutdown_is_served_and_later_connections_refused() {
        for _ in 0..4 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            // Completed by the kernel before the server runs at all.
            let mut waiting = Vec::new();
            for _ in 0..5 {
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await
                    .unwrap();
                waiting.push(s);
            }
            let (server, then_rx) =
                healthz_server(listener, std::future::ready(()), Duration::from_millis(20));
            for mut s in waiting {
                let mut answer = String::new();
                s.read_to_string(&mut answer).await.unwrap();
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
            }
            then_rx.await.unwrap();
            assert!(tokio::net::TcpStream::connect(addr).await.is_err());
            tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .unwrap()
                .unwrap();
        }
    }

    /// A keep-alive connection (a balancer's pooled one) is served as before once shutdown
    /// has started, for the whole settle, but its answer then says `Connection: close` and the
    /// server closes it: the balancer lets go of it before the drain closes anything.
    #[tokio::test]
    async fn after_shutdown_starts_answers_close_their_keep_alive_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            let _ = stop_rx.await;
        };
        let (server, mut then_rx) = healthz_server(listener, signal, Duration::from_millis(500));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut buf = vec![0u8; 4096];
        s.write_all(request).await.unwrap();
        let n = s.read(&mut buf).await.unwrap();
        let first = String::from_utf8_lossy(&buf[..n]).to_lowercase();
        assert!(
            first.starts_with("http/1.1 200") && !first.contains("connection: close"),
            "{first}"
        );

        stop_tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Within the settle: served, and told to close.
        s.write_all(request).await.unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        let answer = answer.to_lowercase();
        assert!(
            answer.starts_with("http/1.1 200") && answer.contains("connection: close"),
            "{answer}"
        );
        assert!(
            then_rx.try_recv().is_err(),
            "the drain started before the settle ended"
        );
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }
}
