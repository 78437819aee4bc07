//! gateway-sled: existing MCP servers as projects of the gateway.
//!
//! Each configured project's server runs as a child over stdio ([`stdio::StdioServer`]) or is
//! reached over Streamable HTTP ([`http::HttpServer`]), and
//! the connector dials the gateway's `/uplink` for it, as a sled does: the hello with the
//! project's token and its identity key ([`identity`]), heartbeats, reconnects with backoff,
//! epochs (the sled-uplink library). The gateway then lists the server's tools
//! with `project` injected and routes each call to it, like any sled's. [`config`] says what
//! runs; [`serve::Served`] runs projects and stops them (the `gateway-sled` binary, and in the
//! gateway's process `gateway demo --real` and `gateway serve --connector`).

pub mod config;
pub mod http;
pub mod leases;
pub mod serve;
pub mod stdio;
pub mod upstream;

/// Each project's identity key file, sled-uplink's.
pub use sled_uplink::identity;
/// Where a project's uplink dials (re-exported for `gateway serve --connector`).
pub use sled_uplink::GatewayAddr;

pub use config::{ConnectorConfig, ProjectConfig, TokenSource, Upstream};
pub use http::HttpServer;
pub use stdio::StdioServer;
pub use upstream::Status;
