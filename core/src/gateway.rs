//! The gateway state machine.
//!
//! Methods come in four groups, in the quinn-proto order: getters; [`Gateway::handle`] and
//! [`Gateway::handle_timeout`] take events in; [`Gateway::poll_output`] and
//! [`Gateway::poll_timeout`] take decisions out. After every `handle*` call, drain
//! `poll_output` and re-read `poll_timeout`.

use std::time::{Duration, Instant};

use crate::registry::Registry;

/// An HTTP request to `/mcp`, named by the driver. The driver picks any token unique among the
/// requests still waiting for a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HttpToken(pub u64);

/// One uplink WebSocket connection, named by the driver; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UplinkId(pub u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMethod {
    Get,
    Post,
    Delete,
}

/// What the driver knows of an HTTP request to `/mcp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: HttpMethod,
    /// The `Mcp-Session-Id` header, if any.
    pub session: Option<String>,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// The answer to an HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    pub status: u16,
    /// Headers to set, beside `Content-Type: application/json` when there is a body.
    pub headers: Vec<(&'static str, String)>,
    /// A JSON document, or `None` for an empty body.
    pub body: Option<String>,
}

/// An event for the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// An HTTP request to `/mcp`. Exactly one [`Output::Http`] with the same token follows,
    /// now or later.
    Http { token: HttpToken, request: HttpRequest },
    /// The client behind an HTTP request went away; no reply is wanted any more.
    HttpAborted { token: HttpToken },
    /// A sled opened an uplink WebSocket.
    UplinkOpened { uplink: UplinkId },
    /// A text frame arrived on an uplink.
    UplinkText { uplink: UplinkId, text: String },
    /// A frame that is not text (binary) arrived on an uplink.
    UplinkBinary { uplink: UplinkId, len: usize },
    /// An uplink closed or failed.
    UplinkClosed { uplink: UplinkId },
    /// The gateway stops: every pending call fails now, every uplink is closed, and new
    /// requests are refused.
    Shutdown,
}

/// A decision for the driver to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Answer the HTTP request with this token.
    Http { token: HttpToken, reply: HttpReply },
    /// Send a text frame up an uplink.
    UplinkSend { uplink: UplinkId, text: String },
    /// Send a `closing` control frame has been queued already; close the WebSocket with this code
    /// and reason. The gateway has forgotten the uplink.
    UplinkClose {
        uplink: UplinkId,
        code: u16,
        reason: String,
    },
}

/// Settings of the state machine that are not per project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How often the gateway pings each uplink.
    pub heartbeat_interval: Duration,
    /// Silence from a sled for this long closes its uplink.
    pub heartbeat_timeout: Duration,
    /// A new uplink must say hello within this.
    pub hello_timeout: Duration,
    /// Deadline of the gateway's own `tools/list` requests to a sled.
    pub refresh_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(15),
            hello_timeout: Duration::from_secs(10),
            refresh_timeout: Duration::from_secs(30),
        }
    }
}

/// Counters and gauges, for logs, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub sessions: usize,
    pub live_uplinks: usize,
    pub pending_calls: usize,
    pub calls_forwarded: u64,
    pub calls_timed_out: u64,
    /// Responses from a sled that arrived after their call's deadline.
    pub responses_dropped_late: u64,
    /// Responses from a sled with an id the gateway never sent on that uplink.
    pub responses_dropped_unknown: u64,
    /// Frames from a sled that were not valid protocol messages.
    pub frames_invalid: u64,
}

/// The gateway: registry, sessions, uplinks and the calls pending on them.
#[derive(Debug)]
pub struct Gateway {
    _todo: (),
}

impl Gateway {
    /// A gateway for `registry`. `seed` drives the session-id generator: give it fresh OS
    /// randomness in production, and a fixed value in tests and simulations.
    pub fn new(registry: Registry, config: Config, seed: [u8; 32]) -> Gateway {
        let _ = (registry, config, seed);
        todo!()
    }

    pub fn registry(&self) -> &Registry {
        todo!()
    }

    pub fn stats(&self) -> Stats {
        todo!()
    }

    /// Takes one event in.
    pub fn handle(&mut self, now: Instant, input: Input) {
        let _ = (now, input);
        todo!()
    }

    /// Fires every timer due at `now` (pass the current time, not the deadline).
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
        todo!()
    }

    /// The next decision to carry out, if any.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        todo!()
    }

    /// When [`Gateway::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }
}
