//! Limits that hold before anyone is authenticated: how many connections the server holds, in
//! all and per address, and how long a request's body may take.
//!
//! A connection over a cap is answered 503 (`too_many_connections`, `Retry-After: 1`) and
//! closed at once; each refusal is counted in `/metrics`. The per-address cap uses the peer's
//! address. A peer listed in `trusted_proxies` (a load balancer: every client behind it shares
//! its address) is held only to the global cap: the client address it forwards in
//! `X-Forwarded-For` is for the proxy to limit, and for the logs. The list is empty by default.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use gateway_core::HttpError;

/// The default of [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// The default of [`Limits::max_connections_per_address`].
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// The default of [`Limits::body_timeout`].
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// What an uplink may send before its welcome (its hello and its proof are a few hundred
/// bytes): beyond it the connection is cut. The 16 MiB message limit applies after.
pub const PRE_WELCOME_BYTES: u64 = 16 << 10;

/// The connection and body limits of [`crate::ServerOptions`].
#[derive(Debug, Clone)]
pub struct Limits {
    /// HTTP connections held at once (uplinks included); more are refused 503.
    pub max_connections: usize,
    /// HTTP connections held at once from one address (not a trusted proxy's).
    pub max_connections_per_address: usize,
    /// Peers whose connections carry many clients (a load balancer): no per-address cap.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// How long a request's body may take to arrive once its head has; then 408.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            trusted_proxies: Vec::new(),
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }
}

/// The address a connection came from, as far as the listener knows it.
pub trait PeerAddr {
    /// The peer's IP address, if the listener has one.
    fn peer_ip(&self) -> Option<IpAddr>;
}

impl PeerAddr for SocketAddr {
    fn peer_ip(&self) -> Option<IpAddr> {
        Some(self.ip())
    }
}

/// Counts the connections held, in all and per address.
#[derive(Debug)]
pub(crate) struct Gate {
    limits: Limits,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// One admitted connection: its count is given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    gate: Arc<Gate>,
    address: Option<IpAddr>,
}

impl Gate {
    pub(crate) fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            held: Mutex::new(Held::default()),
        })
    }

    /// Admits a connection from `peer`, or says which cap it is over.
    pub(crate) fn admit(self: &Arc<Gate>, peer: Option<IpAddr>) -> Result<Permit, HttpError> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.total >= self.limits.max_connections {
            return Err(HttpError::TooManyConnections { per_address: false });
        }
        let address = peer.filter(|ip| {
            !self
                .limits
                .trusted_proxies
                .iter()
                .any(|net| net.contains(ip))
        });
        if let Some(ip) = address {
            let n = held.by_address.entry(ip).or_default();
            if *n >= self.limits.max_connections_per_address {
                return Err(HttpError::TooManyConnections { per_address: true });
            }
            *n += 1;
        }
        held.total += 1;
        Ok(Permit {
            gate: self.clone(),
            address,
        })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.gate.held.lock().unwrap_or_else(|e| e.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(ip) = self.address {
            if let Some(n) = held.by_address.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    held.by_address.remove(&ip);
                }
            }
        }
    }
}

/// How many more bytes a connection may read: unlimited for HTTP, [`PRE_WELCOME_BYTES`] for an
/// uplink until its welcome. Reads beyond it fail, and the connection ends.
#[derive(Debug)]
pub(crate) struct ReadBudget(AtomicU64);

impl ReadBudget {
    const UNLIMITED: u64 = u64::MAX;

    pub(crate) fn unlimited() -> Arc<ReadBudget> {
        Arc::new(ReadBudget(AtomicU64::new(Self::UNLIMITED)))
    }

    /// From now on, at most `bytes` more.
    pub(crate) fn limit(&self, bytes: u64) {
        self.0.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn lift(&self) {
        self.0.store(Self::UNLIMITED, Ordering::Relaxed);
    }

    /// Whether the connection read all it was allowed.
    pub(crate) fn exhausted(&self) -> bool {
        self.0.load(Ordering::Relaxed) == 0
    }
}

/// What a connection's requests carry (as a request extension) for the handlers that take
/// the connection over: the uplink limits its reads until its welcome and holds the
/// connection's place under the caps until then.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    pub(crate) budget: Arc<ReadBudget>,
    pub(crate) permit: Arc<Mutex<Option<Permit>>>,
}

impl Connection {
    /// Takes the connection's place under the caps (its hyper task lets go of it when the
    /// connection upgrades).
    pub(crate) fn take_permit(&self) -> Option<Permit> {
        self.permit.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A connection's byte stream, reading within its [`ReadBudget`].
#[derive(Debug)]
pub(crate) struct Budgeted<I> {
    pub(crate) io: I,
    pub(crate) budget: Arc<ReadBudget>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Budgeted<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let left = self.budget.0.load(Ordering::Relaxed);
        if left == ReadBudget::UNLIMITED {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        if left == 0 {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the connection sent more than it may before its welcome",
            )));
        }
        let room = usize::try_from(left).unwrap_or(usize::MAX);
        let before = buf.filled().len();
        let result = if room >= buf.remaining() {
            Pin::new(&mut self.io).poll_read(cx, buf)
        } else {
            // Only while limited (a few KiB before a welcome): read into a buffer of the
            // allowance, then copy.
            let mut small = vec![0u8; room];
            let mut limited = ReadBuf::new(&mut small);
            let r = Pin::new(&mut self.io).poll_read(cx, &mut limited);
            buf.put_slice(limited.filled());
            r
        };
        let n = buf.filled().len() - before;
        if n > 0 {
            let _ = self
                .budget
                .0
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                    (l != ReadBudget::UNLIMITED).then(|| l.saturating_sub(n as u64))
                });
        }
        result
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Budgeted<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The whole HTTP/1.1 answer to a connection refused at accept.
pub(crate) fn refusal_bytes(e: &HttpError) -> Vec<u8> {
    let body = serde_json::json!({"error": e.kind(), "message": e.message()}).to_string();
    let mut head = format!(
        "HTTP/1.1 {} Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        e.status(),
        body.len()
    );
    for (name, value) in e.headers() {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(&body);
    head.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn connections_are_capped_in_all_and_per_address_and_given_back() {
        let gate = Gate::new(Limits {
            max_connections: 4,
            max_connections_per_address: 2,
            trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
            ..Limits::default()
        });
        let a1 = gate.admit(ip("192.0.2.1")).unwrap();
        let _a2 = gate.admit(ip("192.0.2.1")).unwrap();
        assert!(matches!(
            gate.admit(ip("192.0.2.1")),
            Err(HttpError::TooManyConnections { per_address: true })
        ));
        // Another address, and a trusted proxy (no per-address cap), still get in.
        let _b = gate.admit(ip("192.0.2.2")).unwrap();
        let _p = gate.admit(ip("10.1.2.3")).unwrap();
        assert!(matches!(
            gate.admit(ip("10.1.2.3")),
            Err(HttpError::TooManyConnections { per_address: false })
        ));
        drop(a1);
        let _a3 = gate.admit(ip("192.0.2.1")).unwrap();
    }

    #[test]
    fn a_refusal_is_a_whole_http_answer() {
        let text = String::from_utf8(refusal_bytes(&HttpError::TooManyConnections {
            per_address: true,
        }))
        .unwrap();
        assert!(text.starts_with("HTTP/1.1 503 "), "{text}");
        assert!(text.contains("Retry-After: 1\r\n"), "{text}");
        assert!(text.ends_with('}'), "{text}");
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
    }
}
