//! turmoil's network as the gateway's listener and as the sleds' and clients' connector.

use std::net::SocketAddr;

use sled_sim::net::Connect;

/// Opens turmoil TCP connections: the sleds' uplinks and the clients' HTTP connections.
#[derive(Debug, Clone, Copy, Default)]
pub struct TurmoilConnect;

impl Connect for TurmoilConnect {
    type Stream = turmoil::net::TcpStream;

    async fn connect(&self, host_port: &str) -> std::io::Result<Self::Stream> {
        turmoil::net::TcpStream::connect(host_port).await
    }
}

/// A turmoil listener that `axum::serve` (and so `gateway_server::serve`) accepts.
#[allow(missing_debug_implementations)]
pub struct TurmoilListener(pub turmoil::net::TcpListener);

impl axum::serve::Listener for TurmoilListener {
    type Io = turmoil::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // turmoil's accept fails only for a connection that is already gone: take the next.
            if let Ok(conn) = self.0.accept().await {
                return conn;
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// turmoil has no kernel backlog to take at shutdown.
impl gateway_server::Backlog for TurmoilListener {}
