//! The sans-IO core of the MCP gateway.
//!
//! Everything the gateway *decides* lives here: the project registry parsed from
//! `projects.toml`, the MCP session table, which project a `tools/call` goes to, which uplink
//! request a sled's response belongs to, the merged `tools/list`, and every JSON-RPC error
//! shape. Nothing here touches a socket, a clock or the operating system's randomness.
//!
//! # The run loop
//!
//! A driver (the `gateway-server` crate, or a test harness) owns one [`Gateway`] by `&mut` and
//! runs this loop:
//!
//! 1. feed each event in with [`Gateway::handle`]`(now, input)`, one of the [`Input`]s: an
//!    HTTP request to `/mcp` ([`Input::Http`]) or its client gone ([`Input::HttpAborted`]), an
//!    uplink opening, a text or binary frame from a sled, an uplink closing, a shutdown, a new
//!    registry, a probe's outcome, or (in a cluster) what the engine said;
//! 2. drain [`Gateway::poll_output`] until it returns `None`, carrying out each [`Output`]:
//!    answer an HTTP request or stream it events, send a frame up an uplink, close an uplink,
//!    probe a project's URL, save the pin file, export a span, or (in a cluster) act on the
//!    engine;
//! 3. sleep until [`Gateway::poll_timeout`] (or the next event), then call
//!    [`Gateway::handle_timeout`] with the *current* time, and go to 2.
//!
//! Time is always the caller's `now`; session ids come from a seeded generator
//! ([`Gateway::new`] takes the seed), so the same inputs give the same outputs.

pub mod agents;
pub mod auth;
pub mod cluster;
pub mod coord;
pub mod directory;
mod error;
mod gateway;
mod gather;
mod http;
pub mod identity;
mod io;
mod jsonrpc;
pub mod keys;
pub mod lease_spot;
mod metrics;
mod records;
mod registry;
mod replica;
pub mod rights;
mod session;
mod strict;
pub mod tasks;
mod tools;
mod trace;
pub mod uplink;

#[cfg(test)]
mod tests;

pub use auth::{AccessToken, Identity, OAuthConfig, Principal};
pub use error::{CallLimit, HttpError, RpcError, UplinkLoss};
#[cfg(feature = "planted-bugs")]
pub use gateway::PlantedBug;
pub use gateway::{Config, Gateway, Stats};
pub use identity::{Pin, Pins, PinsError};
pub use io::{
    HttpMethod, HttpReply, HttpRequest, HttpToken, Input, Output, ProbeId, ProbeOutcome, UplinkId,
};
pub use metrics::{CallCount, Histogram, Metrics, Outcome, LATENCY_BUCKETS_SECONDS};
pub use registry::{
    LeaseMode, ProjectKind, ProjectSpec, ReadOnlyTools, Registry, RegistryError, Secret,
};
pub use strict::{Unreadable, MAX_CLIENT_DEPTH, MAX_FRAME_DEPTH};
pub use tools::{tool_definitions as gateway_tool_definitions, GATEWAY_TOOLS};
pub use trace::{AttributeValue, SpanRecord};
