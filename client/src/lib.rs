//! gateway-client: the MCP Streamable-HTTP client shared by the gateway's own programs (the
//! `gateway` binary's stdio bridge, health probes and shell commands) and by the emulator and
//! tests (`sled-sim` re-exports it).
//!
//! [`McpClient`] speaks MCP over one HTTP/1 connection at a time; [`net::Connect`] says how a
//! connection is opened, so the same code runs over real TCP ([`TokioConnect`]) and inside a
//! deterministic simulation; [`tls::dial`] layers TLS on it for `https://` URLs, verifying the
//! server against [`TlsTrust`]'s authorities. It depends on no other crate of the workspace.

pub mod client;
pub mod net;
pub mod tls;

pub use client::{response_from_sse, AnsweredRequest, ClientError, McpClient};
pub use net::{Connect, HttpUrl, TokioConnect, UrlError};
pub use tls::{dial, MaybeTls, TlsError, TlsTrust};
