//! The gateway's own tools, and the project tools it merges into `tools/list`.
//!
//! Every proxied tool gets a `project` property in `inputSchema.properties` (the object is
//! created when absent), so clients that validate arguments against the schema let the per-call
//! `project` through. Nothing else in the schema changes, `required` included. A project tool
//! that already declares its own `project` property keeps its schema untouched; for that tool
//! `arguments.project` still routes the call and is also forwarded to the sled unchanged (see
//! ARCHITECTURE.md, "The `project` argument").

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use crate::lease_spot::LeaseSpot;

pub(crate) mod coordination;

/// Names of the gateway's own tools. They are answered by the gateway, and a sled tool with
/// one of these names is not listed.
pub const GATEWAY_TOOLS: &[&str] = &[
    SWITCH_PROJECT,
    LIST_PROJECTS,
    GATEWAY_HEALTH,
    AGGREGATE_PIPELINE_STATUS,
    FLEET_IDENTITY,
    // The coordination tools (`gateway/coordination/`), in its order.
    "checkin",
    "roster",
    "claim",
    "renew",
    "release",
    "claims",
    "send",
    "inbox",
    "board_set",
    "board_get",
    "board_list",
    "board_delete",
    "wait",
];

pub(crate) const SWITCH_PROJECT: &str = "switch_project";
pub(crate) const LIST_PROJECTS: &str = "list_projects";
pub(crate) const GATEWAY_HEALTH: &str = "gateway_health";
pub(crate) const AGGREGATE_PIPELINE_STATUS: &str = "aggregate_pipeline_status";
pub(crate) const FLEET_IDENTITY: &str = "fleet_identity";

/// The description of the injected `project` property.
const PROJECT_PROPERTY_DESCRIPTION: &str = "Registered project to run this call on (list_projects names them). Omit it to use this session's default project (set by switch_project).";

/// The gateway's tools as they appear in `tools/list`, each serialised once.
pub(crate) fn gateway_tool_definitions() -> Vec<String> {
    tool_definitions().iter().map(Value::to_string).collect()
}

/// The gateway's own tools (name, title, description, `inputSchema`, annotations) in the order
/// `tools/list` shows them, for programs that mirror them: the `gateway` binary's shell
/// commands are generated from these, so a tool and its command cannot drift. Exported as
/// `gateway_core::gateway_tool_definitions`.
pub fn tool_definitions() -> Vec<Value> {
    let defs = [
        json!({
            "name": SWITCH_PROJECT,
            "title": "Switch this session's default project",
            "description": "Set the default project of this MCP session only: later project tool calls from this session that carry no `project` argument go there. Other sessions are not affected. Needs an Mcp-Session-Id (send initialize first).",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "project": { "type": "string", "description": "A registered project name (list_projects names them)." }
                },
                "required": ["project"],
                "additionalProperties": false
            }
        }),
        json!({
            "name": LIST_PROJECTS,
            "title": "List registered projects",
            "description": "Every registered project: name, url, ssh_port, host_path, kind (adopted or built-in), its sled, whether its uplink is live now, and `active` for this session's own default project. No probing: what the gateway already knows.",
            "inputSchema": { "type": "object", "properties": {}, "additionalProperties": false }
        }),
        json!({
            "name": GATEWAY_HEALTH,
            "title": "Fleet health",
            "description": "Every registered project: up, down, stale or unknown, with the reasons. From the sled's uplink heartbeat (time since it was last heard), or for a project without an uplink from polling its url over HTTP; and the staleness of the sled's CRDT event relay against its threshold. `summary` names the projects in each state.",
            "inputSchema": { "type": "object", "properties": {}, "additionalProperties": false },
            "annotations": { "readOnlyHint": true }
        }),
        json!({
            "name": AGGREGATE_PIPELINE_STATUS,
            "title": "Pipeline status across the fleet",
            "description": "Stage counts and blocked and failing items of every registered project, asked of all sleds in parallel, each with its own deadline, answered within one overall deadline even when sleds are down or slow. `not_answered` names every project that did not answer and why (no_uplink, timed_out, error); `totals` sums the fleet.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "timeout_ms": { "type": "integer", "minimum": 1, "maximum": 60000, "description": "Overall deadline in milliseconds (default 5000)." },
                    "per_project_timeout_ms": { "type": "integer", "minimum": 1, "maximum": 60000, "description": "Each sled's deadline in milliseconds (default 2000, at most the overall deadline)." }
                },
                "additionalProperties": false
            },
            "execution": { "taskSupport": "optional" },
            "annotations": { "readOnlyHint": true }
        }),
        json!({
            "name": FLEET_IDENTITY,
            "title": "Sled identities",
            "description": "Per project: the sled key pinned on first use against the key its live sled proved it holds, and the last refused attempt (another key, or none) with its reason. With action \"repin\", a project and a key, pins that project to that key (one refused for it, or one provisioned before its sled first connects); nothing else ever changes a pin.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "action": { "type": "string", "enum": ["show", "repin"], "description": "\"show\" (the default) or \"repin\"." },
                    "project": { "type": "string", "description": "The project to show, or to re-pin (required with repin)." },
                    "key": { "type": "string", "description": "With repin (required): the Ed25519 public key to pin, base64." }
                },
                "additionalProperties": false
            },
            "annotations": { "destructiveHint": false }
        }),
    ];
    defs.into_iter()
        .chain(coordination::tool_definitions())
        .collect()
}

/// A project tool as the gateway lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedTool {
    pub(crate) name: String,
    /// The sled's own schema declares a `project` property.
    pub(crate) declares_project: bool,
    /// The tool definition with `project` injected, serialised.
    pub(crate) json: String,
    /// Where the tool's arguments name the resources it writes, when the sled marked a spot
    /// with [`crate::uplink::LEASE_KEYWORD`]: the call writes `kind:value` for each.
    pub(crate) lease: Option<LeaseSpot>,
    /// The sled annotates it `readOnlyHint: true`: calling it needs only the `read` right
    /// where its project says `trust_read_only_hints` ([`crate::ReadOnlyTools`]).
    pub(crate) read_only: bool,
    /// Its `execution.taskSupport`: whether a call of it may, or must, be a task.
    pub(crate) task_support: crate::tasks::TaskSupport,
}

/// Whether `name` is a valid MCP tool name: 1 to 128 characters of `[A-Za-z0-9_.-]`.
pub(crate) fn valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Turns a sled's reported tools into the gateway's listing of them: invalid entries, reserved
/// names and repeated names are left out with a warning; `project` is injected into the rest.
pub(crate) fn prepare_sled_tools(project: &str, tools: Vec<Value>) -> Vec<CachedTool> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(tools.len());
    for mut tool in tools {
        let Some(name) = tool.get("name").and_then(Value::as_str).map(str::to_owned) else {
            tracing::warn!(
                project,
                "sled listed a tool without a string name; not listed"
            );
            continue;
        };
        if !valid_tool_name(&name) {
            tracing::warn!(project, tool = %name, "sled listed a tool with an invalid name; not listed");
            continue;
        }
        if GATEWAY_TOOLS.contains(&name.as_str()) {
            tracing::warn!(project, tool = %name, "sled tool has a gateway tool's reserved name; not listed");
            continue;
        }
        if !seen.insert(name.clone()) {
            tracing::warn!(project, tool = %name, "sled listed the same tool twice; the first is listed");
            continue;
        }
        let declares_project = inject_project(&mut tool);
        if declares_project {
            tracing::warn!(project, tool = %name, "sled tool declares its own `project` property; its values must be registered project names, since the gateway routes on them");
        }
        let lease = LeaseSpot::in_tool(&tool);
        let read_only = tool
            .pointer("/annotations/readOnlyHint")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let task_support = crate::tasks::TaskSupport::of_tool(&tool);
        out.push(CachedTool {
            task_support,
            read_only,
            name,
            declares_project,
            json: tool.to_string(),
            lease,
        });
    }
    out
}

/// Adds the `project` property to a tool's `inputSchema.properties`, creating the objects when
/// absent. Returns whether the tool already declared `project` (then nothing changes).
pub(crate) fn inject_project(tool: &mut Value) -> bool {
    let Some(tool) = tool.as_object_mut() else {
        return false;
    };
    let schema = tool
        .entry("inputSchema")
        .or_insert_with(|| json!({ "type": "object" }));
    if !schema.is_object() {
        *schema = json!({ "type": "object" });
    }
    let schema = schema.as_object_mut().expect("made an object just above");
    let props = schema
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if !props.is_object() {
        *props = Value::Object(Map::new());
    }
    let props = props.as_object_mut().expect("made an object just above");
    if props.contains_key("project") {
        return true;
    }
    // `x-mcp-header` (2026-07-28): clients mirror the argument into an `Mcp-Param-Project`
    // header, so that a load balancer can route on it without reading the body.
    props.insert(
        "project".into(),
        json!({
            "type": "string",
            "description": PROJECT_PROPERTY_DESCRIPTION,
            "x-mcp-header": "Project",
        }),
    );
    if let Some(schema) = tool.get_mut("inputSchema") {
        admit_project(schema);
    }
    false
}

/// The most subschemas [`admit_project`] visits in one tool's schema.
const MAX_SUBSCHEMAS: usize = 256;

/// Lets `project` through every subschema the root's object is also validated against (issue
/// 26: schemas as real servers write them). In JSON Schema 2020-12 a `$ref` beside other
/// keywords applies too, and so does each `allOf`, `anyOf` and `oneOf` branch. One of them that
/// closes its object (`additionalProperties` or `unevaluatedProperties` other than `true`)
/// would refuse the `project` the root now lists, so `project` is listed in its `properties`
/// too. Only local references (`#/...`) are followed, each once; a branch's other rules are
/// untouched (so `oneOf` picks the same branch as before).
fn admit_project(root: &mut Value) {
    let mut seen: HashSet<String> = HashSet::new();
    let mut todo: Vec<String> = vec![String::new()];
    let mut closed: Vec<String> = Vec::new();
    while let Some(at) = todo.pop() {
        if seen.len() >= MAX_SUBSCHEMAS || !seen.insert(at.clone()) {
            continue;
        }
        let Some(schema) = root.pointer(&at).and_then(Value::as_object) else {
            continue;
        };
        let closes = |k: &str| schema.get(k).is_some_and(|v| *v != Value::Bool(true));
        if !at.is_empty() && (closes("additionalProperties") || closes("unevaluatedProperties")) {
            closed.push(at.clone());
        }
        if let Some(target) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
        {
            todo.push(target.to_owned());
        }
        for k in ["allOf", "anyOf", "oneOf"] {
            if let Some(branches) = schema.get(k).and_then(Value::as_array) {
                todo.extend((0..branches.len()).map(|i| format!("{at}/{k}/{i}")));
            }
        }
    }
    let property = json!({ "type": "string" });
    for at in closed {
        let Some(schema) = root.pointer_mut(&at).and_then(Value::as_object_mut) else {
            continue;
        };
        let props = schema
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(props) = props.as_object_mut() {
            props.entry("project").or_insert_with(|| property.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injection_adds_only_the_property() {
        let mut t = json!({
            "name": "show",
            "inputSchema": {"type":"object","properties":{"story_id":{"type":"string"}},"required":["story_id"],"additionalProperties":false}
        });
        assert!(!inject_project(&mut t));
        insta::assert_json_snapshot!(t);
    }

    #[test]
    fn injection_creates_missing_objects() {
        let mut no_schema = json!({"name": "a"});
        assert!(!inject_project(&mut no_schema));
        assert_eq!(no_schema["inputSchema"]["type"], "object");
        assert!(no_schema["inputSchema"]["properties"]["project"].is_object());
        let mut no_props = json!({"name": "a", "inputSchema": {"type": "object", "required": []}});
        assert!(!inject_project(&mut no_props));
        assert_eq!(no_props["inputSchema"]["required"], json!([]));
        assert!(no_props["inputSchema"]["properties"]["project"].is_object());
    }

    /// Schemas as real servers write them (issue 26): the root a `$ref` into `$defs`, a
    /// composition, a closed object. `project` is listed wherever the object is also checked
    /// against a closed schema; open ones and non-local references are left alone.
    #[test]
    fn injection_reaches_referenced_and_composed_schemas_that_close_the_object() {
        let mut by_ref = json!({"name": "create_entities", "inputSchema": {
            "$ref": "#/$defs/Args",
            "$defs": {"Args": {"type": "object", "properties": {"name": {"type": "string"}},
                "required": ["name"], "additionalProperties": false}}
        }});
        inject_project(&mut by_ref);
        insta::assert_json_snapshot!("by_ref", by_ref);
        let mut composed = json!({"name": "c", "inputSchema": {
            "type": "object",
            "allOf": [
                {"$ref": "#/definitions/Base"},
                {"properties": {"n": {"type": "integer"}}, "unevaluatedProperties": false}
            ],
            "anyOf": [
                {"properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false},
                {"properties": {"b": {"type": "string"}}, "required": ["b"], "additionalProperties": {"type": "number"}},
                {"properties": {"c": {"type": "string"}}, "additionalProperties": true}
            ],
            "oneOf": [{"$ref": "https://example.com/other.json"}],
            "definitions": {"Base": {"type": "object", "additionalProperties": false}}
        }});
        inject_project(&mut composed);
        insta::assert_json_snapshot!("composed", composed);
        let s = &composed["inputSchema"];
        for at in ["/definitions/Base", "/allOf/1", "/anyOf/0", "/anyOf/1"] {
            assert!(
                s.pointer(&format!("{at}/properties/project")).is_some(),
                "{at}"
            );
        }
        assert!(s.pointer("/anyOf/2/properties/project").is_none(), "open");
        assert!(s.pointer("/oneOf/0/properties").is_none(), "not local");
        // A reference to itself is followed once.
        let mut cycle = json!({"name": "d", "inputSchema": {
            "$ref": "#", "type": "object", "additionalProperties": false
        }});
        inject_project(&mut cycle);
        assert!(cycle["inputSchema"]["properties"]["project"].is_object());
    }

    #[test]
    fn a_declared_project_property_is_untouched() {
        let original = json!({"name":"a","inputSchema":{"type":"object","properties":{"project":{"type":"string","description":"mine"}}}});
        let mut t = original.clone();
        assert!(inject_project(&mut t));
        assert_eq!(t, original);
    }

    #[test]
    fn prepare_filters_reserved_invalid_and_repeated() {
        let tools = vec![
            json!({"name": "show", "inputSchema": {"type": "object"}}),
            json!({"name": "switch_project", "inputSchema": {"type": "object"}}),
            json!({"name": "bad name", "inputSchema": {"type": "object"}}),
            json!({"name": 5}),
            json!({"name": "show"}),
            json!({"name": "x".repeat(129)}),
            json!({"name": "own", "inputSchema": {"type":"object","properties":{"project":{"type":"integer"}}}}),
        ];
        let out = prepare_sled_tools("alpha", tools);
        let names: Vec<_> = out
            .iter()
            .map(|t| (t.name.as_str(), t.declares_project))
            .collect();
        assert_eq!(names, [("show", false), ("own", true)]);
    }

    #[test]
    fn tool_names() {
        assert!(valid_tool_name("a.b-c_D9"));
        assert!(!valid_tool_name(""));
        assert!(!valid_tool_name("a/b"));
        assert!(valid_tool_name(&"x".repeat(128)));
    }
}
