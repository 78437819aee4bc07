//! sled-sim: emulated project containers ("sleds") for the MCP gateway.
//!
//! A sled serves one project's MCP tools ([`mcp::Sled`], over the project model in [`model`])
//! and connects out to the gateway over a WebSocket uplink ([`uplink::run_uplink`]); it can also
//! serve MCP directly over HTTP ([`http::router`]). [`client::McpClient`] (from `gateway-client`)
//! drives a gateway (or a sled) over Streamable HTTP, and [`fleet::Fleet`] runs one sled per project. [`script`] plays
//! seeded client sessions against a gateway and judges every response. Each sled can prove an
//! Ed25519 identity on connect ([`identity::sled_key`]) and relays CRDT events up its uplink.
//!
//! Networking is generic over [`net::Connect`], time is only `tokio::time`, randomness only a
//! seeded RNG, and nothing observable depends on hash order: the same code runs as a host in a
//! deterministic simulation.

pub mod fixture;
pub mod fleet;
pub mod http;
pub mod identity;
pub mod mcp;
pub mod model;
pub mod script;
pub mod sim_sled;
pub mod uplink;

/// The sled side of the uplink, sled-uplink's (re-exported so that `sled_sim::epoch::…` and
/// `sled_sim::net::…` paths keep working).
pub use sled_uplink::{epoch, net};

/// The MCP client, `gateway-client`'s (re-exported so that `sled_sim::client::…` paths keep
/// working).
pub use gateway_client::client;

pub use client::{ClientError, McpClient};
pub use epoch::EpochFence;
pub use fixture::Fixture;
pub use fleet::{demo_project_names, Fleet, SledOptions};
pub use identity::{impostor_key, sled_key};
pub use mcp::{ReceivedTrace, SharedSled, Sled, SledConfig};
pub use model::{Project, Stage, Story, Todo};
pub use net::{Connect, GatewayAddr, HttpUrl, TokioConnect, UrlError};
pub use script::{check_session, run_session, session_plan, SessionHistory, SessionPlan, Workload};
pub use uplink::{
    run_uplink, run_uplink_fenced, run_uplink_with, Backend, CallContext, Handler, SyncServer,
    UplinkOptions,
};
