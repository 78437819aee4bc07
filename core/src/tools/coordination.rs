//! The coordination tools' names and definitions (the rules are in [`crate::coord`]; the
//! gateway's handling of their calls in `gateway/coordination/`).

use serde_json::{json, Value};

/// The most messages one `inbox` answer carries.
pub(crate) const INBOX_PAGE_MAX: usize = 100;

pub(crate) const CHECKIN: &str = "checkin";
pub(crate) const ROSTER: &str = "roster";
pub(crate) const CLAIM: &str = "claim";
pub(crate) const RENEW: &str = "renew";
pub(crate) const RELEASE: &str = "release";
pub(crate) const CLAIMS: &str = "claims";
pub(crate) const SEND: &str = "send";
pub(crate) const INBOX: &str = "inbox";
pub(crate) const BOARD_SET: &str = "board_set";
pub(crate) const BOARD_GET: &str = "board_get";
pub(crate) const BOARD_LIST: &str = "board_list";
pub(crate) const BOARD_DELETE: &str = "board_delete";
pub(crate) const WAIT: &str = "wait";

/// The coordination tools, in the order `tools/list` shows them.
pub(crate) const COORDINATION_TOOLS: &[&str] = &[
    CHECKIN,
    ROSTER,
    CLAIM,
    RENEW,
    RELEASE,
    CLAIMS,
    SEND,
    INBOX,
    BOARD_SET,
    BOARD_GET,
    BOARD_LIST,
    BOARD_DELETE,
    WAIT,
];

/// The gateway's coordination tool definitions, for `tools/list`.
pub(crate) fn tool_definitions() -> Vec<Value> {
    let project = json!({ "type": "string", "description": "The project to act in (list_projects names them). Omit it for this session's default project." });
    let agent = json!({ "type": "string", "description": "An agent handle from checkin, for callers without a session (the 2026-07-28 era, a shell). Sessions are agents themselves and leave it out." });
    let resource = json!({ "type": "string", "minLength": 1, "maxLength": 256, "description": "What to lease, e.g. \"story:beta-4\" (a sled names its resources in its tools' schemas)." });
    let ttl = |what: &str, default: u64, max: u64| json!({ "type": "integer", "minimum": 1, "description": format!("{what} in seconds (default {default}, at most {max}; a longer one is clamped and the answer says so).") });
    let key = json!({ "type": "string", "minLength": 1, "maxLength": 256, "description": "The board key." });
    let object = |properties: Value, required: &[&str]| json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false });
    vec![
        json!({
            "name": CHECKIN,
            "title": "Check in to a project",
            "description": "Say you are here (presence, with a display name and task), renew every lease you hold in the project, and read your inbox, in one call. Without a session, it issues an agent handle to pass back as `agent`. Every result of a coordination tool carries `unread` and any lease you lost since your last result (`lost`).",
            "inputSchema": object(json!({
                "project": project, "agent": agent,
                "name": { "type": "string", "maxLength": 256, "description": "Your display name." },
                "task": { "type": "string", "maxLength": 1024, "description": "What you are working on (\"\" clears it)." },
                "ttl_s": ttl("How long your presence lasts without another call", 120, 3600),
            }), &[]),
        }),
        json!({
            "name": ROSTER,
            "title": "Who is on a project",
            "description": "The agents present on a project: name, task, how long ago each was seen, active or stale, and the resources each holds.",
            "inputSchema": object(json!({ "project": project, "agent": agent }), &[]),
            "annotations": { "readOnlyHint": true }
        }),
        json!({
            "name": CLAIM,
            "title": "Lease a resource",
            "description": "Take an exclusive lease on a resource of the project, with a fence (a number that only grows) that the gateway attaches to your writes and the sled checks. Claiming what you hold renews it and keeps its fence. If someone else holds it, the answer says who and for how long (`acquired: false`); `wait` wakes you when it is released. The gateway refuses other agents' writes to a leased resource.",
            "inputSchema": object(json!({ "resource": resource, "project": project, "agent": agent, "ttl_s": ttl("The lease's lifetime", 300, 3600) }), &["resource"]),
        }),
        json!({
            "name": RENEW,
            "title": "Renew a lease",
            "description": "Extend a lease you hold (same fence). Renewing a lease you do not hold, or one that expired, is an error, never a quiet success.",
            "inputSchema": object(json!({ "resource": resource, "project": project, "agent": agent, "ttl_s": ttl("The new lifetime from now", 300, 3600) }), &["resource"]),
        }),
        json!({
            "name": RELEASE,
            "title": "Release a lease",
            "description": "Give up a lease you hold. Releasing one you do not hold, or one that expired, is an error. An operator's `force` ends whoever's lease it is: its holder is told (in `lost`, once), and the fence moves on so the evicted holder's writes in flight are refused by the sled.",
            "inputSchema": object(json!({
                "resource": resource, "project": project, "agent": agent,
                "force": { "type": "boolean", "description": "End the lease whoever holds it (an operator's act)." },
            }), &["resource"]),
        }),
        json!({
            "name": CLAIMS,
            "title": "Leases on a project",
            "description": "Every live lease of the project: resource, holder, fence, and when it expires.",
            "inputSchema": object(json!({ "project": project, "agent": agent }), &[]),
            "annotations": { "readOnlyHint": true }
        }),
        json!({
            "name": SEND,
            "title": "Send a message",
            "description": "Send a message to one agent of the project (`to`, a name from roster) or, without `to`, to the project's channel (everyone on it).",
            "inputSchema": object(json!({
                "body": { "type": "string", "minLength": 1, "description": "The message (at most 16 KiB)." },
                "to": { "type": "string", "description": "An agent's name from roster; omit it for the project's channel." },
                "project": project, "agent": agent,
                "ttl_s": ttl("How long the message is kept", 3600, 86400),
            }), &["body"]),
        }),
        json!({
            "name": INBOX,
            "title": "Read your messages",
            "description": "Your unread messages in the project (direct and channel), oldest first. Reading moves your cursor past them; `peek` does not. Pages neither skip nor repeat.",
            "inputSchema": object(json!({
                "project": project, "agent": agent,
                "peek": { "type": "boolean", "description": "Read without moving your cursor." },
                "limit": { "type": "integer", "minimum": 1, "maximum": INBOX_PAGE_MAX, "description": "At most this many messages (default and most 100)." },
            }), &[]),
        }),
        json!({
            "name": BOARD_SET,
            "title": "Set a board key",
            "description": "Set a key on the project's shared board to any JSON value. With `if_revision`, only if the key is at that revision (0: only if absent), so concurrent writers cannot overwrite each other unseen. Revisions are never reused.",
            "inputSchema": object(json!({
                "key": key, "value": { "description": "Any JSON value (at most 64 KiB)." },
                "if_revision": { "type": "integer", "minimum": 0, "description": "Compare-and-set: the revision the key must be at (0: absent)." },
                "project": project, "agent": agent,
                "ttl_s": ttl("How long the key lives (without it, until deleted)", 0, 604800),
            }), &["key", "value"]),
        }),
        json!({
            "name": BOARD_GET,
            "title": "Read a board key",
            "description": "A key of the project's board: its value, revision, who set it and when it expires.",
            "inputSchema": object(json!({ "key": key, "project": project, "agent": agent }), &["key"]),
            "annotations": { "readOnlyHint": true }
        }),
        json!({
            "name": BOARD_LIST,
            "title": "List board keys",
            "description": "The keys of the project's board (with a prefix, those starting with it), with values and revisions; at most 200, `more` says when there are others.",
            "inputSchema": object(json!({ "prefix": { "type": "string" }, "project": project, "agent": agent }), &[]),
            "annotations": { "readOnlyHint": true }
        }),
        json!({
            "name": BOARD_DELETE,
            "title": "Delete a board key",
            "description": "Delete a key of the project's board; with `if_revision`, only at that revision.",
            "inputSchema": object(json!({ "key": key, "if_revision": { "type": "integer", "minimum": 1 }, "project": project, "agent": agent }), &["key"]),
        }),
        json!({
            "name": WAIT,
            "title": "Wait for anything that concerns you",
            "description": "Block until something concerns you in any of the named projects (default: every project you are present in): a message to you or your channels, a lease of yours lost, a lease you were refused now released, or a sled event (story moved, blocked, test failed). Returns at once if something is already waiting; at most 25 s (then `woke: false`). Asks for progress to keep the call alive: send a progressToken.",
            "inputSchema": object(json!({
                "projects": { "type": "array", "items": { "type": "string" }, "maxItems": 64, "description": "Projects to wait in." },
                "timeout_s": { "type": "integer", "minimum": 1, "maximum": 25, "description": "At most this long (default and most 25)." },
                "agent": agent,
            }), &[]),
        }),
    ]
}
