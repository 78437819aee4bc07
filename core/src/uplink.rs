//! The uplink protocol: what a sled and the gateway say to each other over the WebSocket.
//!
//! A sled dials out to the gateway at [`UPLINK_PATH`]. Every message is one WebSocket *text*
//! frame holding one JSON object. An object with an `"uplink"` key is a [`Control`] frame;
//! anything else is a JSON-RPC 2.0 message (the gateway sends requests and notifications, the
//! sled sends responses and notifications). The sequence:
//!
//! 1. sled → gateway: `{"uplink":"hello","protocol":1,"project":"alpha","sled":"alpha-sled"}`,
//!    within [`crate::Config::hello_timeout`] of the connection opening, with `"token"` when
//!    the project requires one and `"key"` (its Ed25519 public key) when the sled has an
//!    identity, and `"fence":N` when the sled has ever accepted a fenced write: the highest
//!    fence it has accepted for the project, so a restarted gateway starts above it. With a
//!    key, the gateway sends `{"uplink":"challenge","nonce":…}` and the sled answers
//!    `{"uplink":"proof","signature":…,"gateway":…}`, signed for the gateway it dialed; the key
//!    is then checked against the project's pin (see [`crate::identity`]).
//! 2. gateway → sled: `{"uplink":"welcome","protocol":1,"heartbeat_ms":5000}`, or a
//!    `closing` frame and a WebSocket close with one of the [`CloseCode`]s.
//! 3. gateway → sled: a `tools/list` request (repeated with `cursor` while the sled returns a
//!    `nextCursor`), then `tools/call` requests as clients make them. Each request carries an id
//!    the gateway chose (a number unique on this connection), never the client's.
//! 4. sled → gateway: a response for each request, with the id it was sent;
//!    `notifications/tools/list_changed` whenever its tool list changes;
//!    `notifications/progress` under the progress token the gateway gave the call; and any
//!    other notification meant for one call's client (e.g. `notifications/message`) with the
//!    call's id in `params._meta["io.mcp-gateway/relatedRequest"]`.
//! 5. gateway → sled: `{"uplink":"ping","seq":N}` every `heartbeat_ms`; the sled answers
//!    `{"uplink":"pong","seq":N}`. Any frame from the sled counts as a sign of life; silence for
//!    [`crate::Config::heartbeat_timeout`] closes the uplink. A sled that hears nothing from the
//!    gateway for three heartbeats reconnects.
//! 6. sled → gateway: `{"uplink":"event","seq":N,"kind":"story_moved","story":"alpha-3"}`, the
//!    sled's CRDT event relay (a `sync` event at least every few seconds when nothing else
//!    happens). The gateway reports a project whose relay went quiet as stale.
//!
//! Leases: a sled declares which tool arguments name a leasable resource by giving that
//! property of the tool's input schema the keyword [`LEASE_KEYWORD`] (`"story"` on `story_id`:
//! the resource is `"story:<story_id>"`; or inside an array, see [`crate::lease_spot`]). A
//! forwarded `tools/call` whose session holds that resource's lease carries
//! `params._meta[`[`FENCE_META`]`]` = `{"resource":"story:beta-1","fence":7}` (an array of such
//! objects when it writes several resources the session holds); the sled keeps the highest
//! fence it has accepted per resource and refuses a write with a lower one (and one whose fence
//! names another resource).

use serde::{Deserialize, Serialize};

/// The `params._meta` key by which a sled's notification names the call it belongs to (the
/// gateway's request id, a number): the gateway relays it to that call's client.
pub const RELATED_REQUEST_META: &str = "io.mcp-gateway/relatedRequest";

/// The keyword a sled puts on a tool's input-schema property to say that the argument names a
/// leasable resource: its value is the resource kind, and the resource is
/// `"<kind>:<argument value>"` (e.g. `"x-mcp-gateway-lease": "story"` on `story_id`).
pub const LEASE_KEYWORD: &str = "x-mcp-gateway-lease";

/// The `params._meta` key of a forwarded `tools/call` that carries the calling session's fence
/// for the resource it writes: `{"resource":"story:beta-1","fence":7}`. The gateway strips any
/// such key a client sent; a call without it is unfenced.
pub const FENCE_META: &str = "io.mcp-gateway/fence";

/// The path of the uplink WebSocket endpoint on the gateway.
pub const UPLINK_PATH: &str = "/uplink";

/// The version of this protocol, carried in `hello` and `welcome`.
pub const PROTOCOL_VERSION: u32 = 1;

/// A control frame: everything on the uplink that is not JSON-RPC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "uplink", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    /// sled → gateway, first frame: which project this connection serves.
    Hello {
        protocol: u32,
        project: String,
        sled: String,
        /// The project's uplink token, when its registration requires one (never shown by
        /// `Debug`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<crate::Secret>,
        /// The sled's Ed25519 public key (32 bytes, standard base64), when it has an identity.
        /// The gateway then sends a [`Control::Challenge`] before anything else.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// The highest fence this sled has accepted for the project (see [`FENCE_META`]), so a
        /// restarted gateway starts above it; absent when it never accepted one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fence: Option<u64>,
        /// The highest epoch this sled has been welcomed with (see [`Control::Welcome`]), so a
        /// replica's new claim starts above it; absent when no welcome carried one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch_seen: Option<u64>,
        /// This connection answers a [`Control::Move`]: the sled's other uplink is live on a
        /// replica that is stopping. The replica that claims the project for it says so in
        /// its claim, so the others leave the calls still running on the old uplink to be
        /// answered there (see `crate::replica`). Absent otherwise.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        moving: bool,
    },
    /// gateway → sled, after a hello with a `key`: prove you hold its private half by signing
    /// [`crate::identity::challenge_message`] of the gateway's name (the host you dialed), your
    /// project and this nonce (32 random bytes, standard base64).
    Challenge { nonce: String },
    /// sled → gateway: the Ed25519 signature (64 bytes, standard base64) of the challenge, and
    /// the gateway name it was made for ([`crate::identity::gateway_name`] of the host the
    /// sled dialed). A gateway with a public name refuses a proof made for another.
    Proof {
        signature: String,
        /// Absent from a sled that signs no gateway name: refused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gateway: Option<String>,
    },
    /// sled → gateway, at any time on a live uplink: one event of the sled's CRDT event relay
    /// (`kind`: `story_created`, `story_moved`, `story_blocked`, `test_failed`, `sync` …).
    /// The gateway keeps the newest event time per project to report relay staleness.
    Event {
        /// The sled's own sequence number of the event.
        seq: u64,
        kind: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        story: Option<String>,
    },
    /// gateway → sled: the hello was accepted.
    Welcome {
        protocol: u32,
        heartbeat_ms: u64,
        /// The replica's claim on the project (issue 15: a revision of the directory, won by
        /// compare-and-set; see `crate::directory`): the sled serves calls only on the uplink
        /// welcomed with its highest epoch, refuses a welcome at or below one it has seen, and
        /// closes an older uplink with [`CloseCode::Superseded`]. Absent from a gateway that
        /// is not in a cluster: the uplink serves as before.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<u64>,
    },
    /// gateway → sled: are you there?
    Ping { seq: u64 },
    /// sled → gateway: the answer to a ping with the same `seq`.
    Pong { seq: u64 },
    /// gateway → sled, just before a WebSocket close: why.
    Closing { code: u16, reason: String },
    /// sled → gateway: a frame the gateway sent could not be read (not JSON a strict parser
    /// accepts, or not a message the sled understands). `id` is the JSON-RPC id of the
    /// request it carried when the sled could recover it ([`recover_request_id`]); the gateway
    /// then fails that request at once (not applied) instead of at its deadline.
    Unreadable {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        reason: String,
    },
    /// gateway → sled, on a live uplink of a replica that is stopping (issue 30): open a new
    /// uplink now, through the same address (the balancer sends it to another replica), with
    /// `"moving": true` in its hello, and keep this one meanwhile. Once the new one is
    /// welcomed with a higher epoch, this one takes no new call: the sled finishes the calls
    /// running on it, then closes it with [`CloseCode::Superseded`]. A sled that does not
    /// know the frame ignores it and moves when the replica closes the uplink, as before.
    Move { reason: String },
    /// sled → gateway, on a live uplink: the state of the MCP server behind a sled that
    /// fronts one (a connector, `gateway-sled`), sent after each welcome and whenever it
    /// changes. The gateway shows it in `gateway_health` (a server that is down makes its
    /// project `down`, naming why) and so in `gateway doctor`. A sled that serves its tools
    /// itself never sends it.
    Upstream {
        state: UpstreamState,
        /// Why it is not running (at most [`MAX_UPSTREAM_REASON`] characters are kept).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// How many times it was started again since the sled started.
        #[serde(default)]
        restarts: u64,
    },
}

/// The state of the MCP server behind a connector sled ([`Control::Upstream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamState {
    /// Being started or initialized.
    Starting,
    /// Serving calls.
    Running,
    /// Not serving; calls are refused at once.
    Down,
}

impl UpstreamState {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamState::Starting => "starting",
            UpstreamState::Running => "running",
            UpstreamState::Down => "down",
        }
    }
}

/// The longest [`Control::Upstream`] reason the gateway keeps, in characters.
pub const MAX_UPSTREAM_REASON: usize = 512;

impl Control {
    /// The frame as the text of one WebSocket message.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a Control frame always serialises")
    }
}

/// Whether a frame the gateway sends is a welcome (the server lifts the pre-welcome read
/// limit when it sends one).
pub fn is_welcome(text: &str) -> bool {
    text.starts_with(r#"{"uplink":"welcome""#)
}

/// The id of a request frame from the gateway that could not be parsed: the gateway writes
/// every request as `{"jsonrpc":"2.0","id":N,` followed by the rest, so the id can be read
/// from the prefix even when what follows is unreadable.
pub fn recover_request_id(text: &str) -> Option<u64> {
    let rest = text.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest
        .strip_prefix(r#""jsonrpc""#)?
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let rest = rest
        .strip_prefix(r#""2.0""#)?
        .trim_start()
        .strip_prefix(',')?
        .trim_start();
    let rest = rest
        .strip_prefix(r#""id""#)?
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    match rest.as_bytes().get(digits) {
        Some(b',' | b'}' | b' ') if digits > 0 => rest[..digits].parse().ok(),
        _ => None,
    }
}

/// Why the gateway closes an uplink: the WebSocket close code it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum CloseCode {
    /// The gateway is shutting down.
    GoingAway = 1001,
    /// Another connection for the same project took this one's place.
    Replaced = 4001,
    /// No frame arrived from the sled within the heartbeat timeout.
    HeartbeatTimeout = 4002,
    /// The hello named a project that is not registered.
    UnknownProject = 4003,
    /// A frame broke the protocol (bad hello, unsupported version, control frame out of place).
    ProtocolError = 4004,
    /// No hello arrived within the hello timeout.
    HelloTimeout = 4005,
    /// The hello's token is missing or wrong for its project.
    Unauthorized = 4006,
    /// The sled's identity was refused: its key differs from the project's pinned key, it
    /// presented none while one is pinned (or required), or its proof did not verify.
    IdentityRefused = 4007,
    /// Sent by the *sled*: this uplink's epoch is no longer its newest (another connection was
    /// welcomed with a higher one), or its welcome carried an epoch at or below one it had
    /// already seen. The replica that sent it lost its claim on the project.
    Superseded = 4008,
    /// The hello proved nothing (no token, no pinned key: a project under
    /// `allow_unauthenticated_uplinks`) and its project has a live uplink, which only a sled
    /// that proves itself may replace. The sled tries again later.
    Occupied = 4009,
}

impl CloseCode {
    pub fn code(self) -> u16 {
        self as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_welcome_is_known_by_its_prefix() {
        let welcome = Control::Welcome {
            protocol: PROTOCOL_VERSION,
            heartbeat_ms: 10_000,
            epoch: Some(3),
        };
        assert!(is_welcome(&welcome.to_text()));
        let challenge = Control::Challenge { nonce: "n".into() };
        assert!(!is_welcome(&challenge.to_text()));
        assert!(!is_welcome(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        ));
    }

    #[test]
    fn a_request_id_is_recovered_from_the_frames_prefix() {
        for (text, id) in [
            (
                r#"{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"a":"\ud800"}}"#,
                Some(17),
            ),
            (r#" { "jsonrpc" : "2.0" , "id" : 4 }"#, Some(4)),
            (
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#,
                None,
            ),
            (r#"{"jsonrpc":"2.0","id":"x","method":"m"}"#, None),
            (r#"{"jsonrpc":"2.0","id":99999999999999999999999,"#, None),
            (r#"{"jsonrpc":"2.0","id":12"#, None),
            ("not json", None),
            ("", None),
        ] {
            assert_eq!(recover_request_id(text), id, "{text}");
        }
    }

    #[test]
    fn a_hellos_fence_is_optional() {
        let bare = r#"{"uplink":"hello","protocol":1,"project":"beta","sled":"b"}"#;
        let hello = Control::Hello {
            protocol: 1,
            project: "beta".into(),
            sled: "b".into(),
            token: None,
            key: None,
            fence: None,
            epoch_seen: None,
            moving: false,
        };
        assert_eq!(serde_json::from_str::<Control>(bare).unwrap(), hello);
        assert_eq!(hello.to_text(), bare);
        let fenced = Control::Hello {
            protocol: 1,
            project: "beta".into(),
            sled: "b".into(),
            token: None,
            key: None,
            fence: Some(7),
            epoch_seen: None,
            moving: false,
        };
        assert_eq!(
            fenced.to_text(),
            r#"{"uplink":"hello","protocol":1,"project":"beta","sled":"b","fence":7}"#
        );
        assert_eq!(
            serde_json::from_str::<Control>(&fenced.to_text()).unwrap(),
            fenced
        );
    }

    #[test]
    fn the_welcomes_epoch_and_the_hellos_epoch_seen_are_optional() {
        let bare = r#"{"uplink":"welcome","protocol":1,"heartbeat_ms":5000}"#;
        let welcome = Control::Welcome {
            protocol: 1,
            heartbeat_ms: 5000,
            epoch: None,
        };
        assert_eq!(serde_json::from_str::<Control>(bare).unwrap(), welcome);
        assert_eq!(
            welcome.to_text(),
            bare,
            "a gateway not in a cluster sends what it did"
        );
        let claimed = Control::Welcome {
            protocol: 1,
            heartbeat_ms: 5000,
            epoch: Some(12),
        };
        let text = r#"{"uplink":"welcome","protocol":1,"heartbeat_ms":5000,"epoch":12}"#;
        assert_eq!(claimed.to_text(), text);
        assert_eq!(serde_json::from_str::<Control>(text).unwrap(), claimed);
        let hello =
            r#"{"uplink":"hello","protocol":1,"project":"beta","sled":"b","epoch_seen":12}"#;
        let Control::Hello { epoch_seen, .. } = serde_json::from_str::<Control>(hello).unwrap()
        else {
            panic!("not a hello");
        };
        assert_eq!(epoch_seen, Some(12));
    }

    #[test]
    fn unreadable_frames_round_trip() {
        let c = Control::Unreadable {
            id: Some(3),
            reason: "lone leading surrogate".into(),
        };
        assert_eq!(
            c.to_text(),
            r#"{"uplink":"unreadable","id":3,"reason":"lone leading surrogate"}"#
        );
        assert_eq!(serde_json::from_str::<Control>(&c.to_text()).unwrap(), c);
        let without: Control =
            serde_json::from_str(r#"{"uplink":"unreadable","reason":"r"}"#).unwrap();
        assert_eq!(
            without,
            Control::Unreadable {
                id: None,
                reason: "r".into()
            }
        );
    }
}
