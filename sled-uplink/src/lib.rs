//! sled-uplink: the sled side of the MCP gateway's uplink, for any project that wants its
//! container to be a sled natively (sled-sim's emulated sleds and gateway-sled's connector are
//! built on it). The protocol itself is `gateway_core::uplink`'s, and ARCHITECTURE.md's
//! "Uplink protocol" is the reference for other languages.
//!
//! - [`uplink`]: dial out to the gateway (`ws://` or `wss://`), say hello with the project's
//!   token and Ed25519 identity ([`identity`]), answer the challenge, keep the epoch
//!   ([`epoch`]), heartbeats, reconnect with backoff, report the unreadable frame, and serve a
//!   [`Handler`] (or a synchronous [`uplink::SyncServer`]) until shutdown, draining calls in
//!   flight first when asked to ([`UplinkOptions::drain`]).
//! - [`fences`]: the fence table that refuses a stale write, and a file that keeps it
//!   ([`fences::FenceFile`]), so a restart lets no old fence through; its high-water mark goes
//!   in each hello.
//! - [`tasks`]: MCP 2025-11-25 tasks for a sled's tools: a task-augmented `tools/call` answered
//!   with a `CreateTaskResult` while the tool runs on in the background, `tasks/get`,
//!   `tasks/result`, `tasks/list`, `tasks/cancel`, status notifications, TTL expiry
//!   ([`TaskRunner`]).
//! - [`net`]: where the gateway is ([`GatewayAddr`]), over gateway-client's connections.
//!
//! Time is only `tokio::time` and randomness only a seeded RNG, so the same code runs as a
//! host in a deterministic simulation.

pub mod epoch;
pub mod fences;
pub mod identity;
pub mod net;
pub mod tasks;
pub mod uplink;

pub use epoch::EpochFence;
pub use fences::{FenceFile, Fences};
pub use net::{Connect, GatewayAddr, HttpUrl, TokioConnect, UrlError};
pub use tasks::{TaskOptions, TaskRunner};
pub use uplink::{
    run_uplink_fenced, run_uplink_with, Backend, CallContext, Handler, RequestError, SyncServer,
    UplinkOptions,
};
