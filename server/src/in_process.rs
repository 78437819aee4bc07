//! Uplinks made inside the gateway's process: a sled (gateway-sled's connector, served by
//! `gateway serve --connector`) that runs in the same process reaches the gateway over an
//! in-memory byte stream instead of a socket.
//!
//! Nothing else changes: the sled dials ([`InProcessConnect`], a [`gateway_client::Connect`]),
//! the gateway serves the stream as it serves a TCP connection ([`InProcessListener`], an
//! [`axum::serve::Listener`] given to [`crate::ServerOptions::in_process`]), and the uplink on
//! it is the same HTTP upgrade, the same hello with its token and identity proof, the same
//! frames. What is saved is a socket pair and, per call, the wakeups of one more process on the
//! way (BENCHMARKS.md). No TLS on this hop: the bytes never leave the process.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::io::DuplexStream;
use tokio::sync::{mpsc, Mutex};

use crate::limits::PeerAddr;

/// Each direction's buffer of an in-process connection: a writer waits when it is full.
const BUFFER: usize = 256 * 1024;
/// Connections dialed and not yet accepted.
const QUEUE: usize = 64;

/// Makes a connected pair: the listener for the gateway, the connector for its sleds.
pub fn pair() -> (InProcessListener, InProcessConnect) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        InProcessListener {
            incoming: Arc::new(Mutex::new(rx)),
        },
        InProcessConnect { dial: tx },
    )
}

/// The gateway's end: accepts the connections its [`InProcessConnect`]s dial.
#[derive(Debug, Clone)]
pub struct InProcessListener {
    incoming: Arc<Mutex<mpsc::Receiver<DuplexStream>>>,
}

/// Where an in-process connection comes from: this process, no address. It is under no
/// per-address cap (the total cap holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InProcessPeer;

impl PeerAddr for InProcessPeer {
    fn peer_ip(&self) -> Option<IpAddr> {
        None
    }
}

impl axum::serve::Listener for InProcessListener {
    type Io = DuplexStream;
    type Addr = InProcessPeer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.lock().await.recv().await {
            Some(io) => (io, InProcessPeer),
            // Every dialer is gone: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(InProcessPeer)
    }
}

impl crate::accept::Backlog for InProcessListener {}

/// A sled's end: each `connect` makes a connection the gateway's [`InProcessListener`]
/// accepts; the host and port asked for are not used (the uplink's URL still names the
/// gateway, for the `Host` header and the identity proof).
#[derive(Debug, Clone)]
pub struct InProcessConnect {
    dial: mpsc::Sender<DuplexStream>,
}

impl gateway_client::Connect for InProcessConnect {
    type Stream = DuplexStream;

    async fn connect(&self, _host_port: &str) -> std::io::Result<DuplexStream> {
        let (ours, theirs) = tokio::io::duplex(BUFFER);
        self.dial.send(theirs).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "the gateway accepts no more in-process connections (it is stopping)",
            )
        })?;
        Ok(ours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener;
    use gateway_client::Connect;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_dialed_connection_is_accepted_and_carries_bytes_both_ways() {
        let (mut listener, connect) = pair();
        let mut dialed = connect.connect("ignored:1").await.unwrap();
        let (mut accepted, peer) = listener.accept().await;
        assert_eq!(peer.peer_ip(), None);
        dialed.write_all(b"hello").await.unwrap();
        let mut got = [0; 5];
        accepted.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        accepted.write_all(b"back").await.unwrap();
        let mut got = [0; 4];
        dialed.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"back");
    }

    #[tokio::test]
    async fn without_a_listener_a_dial_is_refused() {
        let (listener, connect) = pair();
        drop(listener);
        let err = connect.connect("ignored:1").await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
