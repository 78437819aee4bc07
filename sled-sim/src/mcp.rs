//! The sans-IO MCP server of one project: [`Sled::handle`] takes one JSON-RPC message and
//! returns the response.
//!
//! Tool argument problems (missing or unknown properties, wrong types, bad enum values, unknown
//! story ids) come back as ordinary results with `isError: true` and a text that says exactly
//! what is wrong, so a model can correct itself. Protocol problems are JSON-RPC errors.
//!
//! Every tool result carries `"project"` in its structured content so a misrouted call is
//! visible; a `tools/call` whose `params._meta` holds [`NONCE_KEY`] gets the nonce echoed back
//! in the result's `_meta`, next to [`PROJECT_META_KEY`].
//!
//! Fences: every tool that writes a story declares its `story_id` leasable
//! ([`LEASE_KEYWORD`]` = "story"`, the resource `"story:<id>"`). A `tools/call` of such a tool
//! whose `params._meta` holds [`FENCE_META`] (`{"resource","fence"}`, put there by the gateway
//! for the lease holder) is refused with an `isError` result of `kind` `stale_fence` when the
//! fence is below the highest the sled has accepted for that resource, and `fence_mismatch`
//! when the fence names another resource; otherwise the fence is recorded ([`Fences`]). A call
//! without the key is unfenced. Read-only tools ignore fences.
//!
//! Trace context: the W3C `traceparent` (and `tracestate`) of each request that carries one in
//! `params._meta` is kept, the last [`TRACES_KEPT`] of them ([`Sled::traces_received`]), so a
//! test or an operator can see which trace, and which parent span, reached the sled.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};
pub use sled_uplink::tasks::TaskIds;
use sled_uplink::tasks::{admit, TaskOptions, TaskProgress, TaskRunner, TaskSupport};
use sled_uplink::CallContext;

pub use gateway_core::uplink::{FENCE_META, LEASE_KEYWORD};
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tracing::info;

use crate::model::{Fences, Project, Stage};

/// The MCP protocol versions this server speaks, newest first.
pub const SUPPORTED_PROTOCOL_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// The version answered when the client asks for one not in [`SUPPORTED_PROTOCOL_VERSIONS`].
pub const LATEST_PROTOCOL_VERSION: &str = "2025-11-25";
/// The `_meta` key of a `tools/call` nonce that the result echoes.
pub const NONCE_KEY: &str = "sled-sim/nonce";
/// The `_meta` key naming the project that answered a nonce-carrying call.
pub const PROJECT_META_KEY: &str = "sled-sim/project";

/// JSON-RPC error codes used here.
pub mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
}

/// Options of one sled's MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SledConfig {
    /// How many tools one `tools/list` page holds; `None` (the default) means all of them.
    /// `Some(0)` is treated as `Some(1)`.
    pub page_size: Option<usize>,
    /// How long one `run_tests` takes, in milliseconds: drawn from the sled's seed between
    /// these two (inclusive; default 200 to 2000), one draw per call in the order they arrive.
    pub run_tests_ms: (u64, u64),
    /// How its tasks are named ([`SharedSled`] runs them): random (the default), seeded, or a
    /// counter `t1, t2, …` that collides across sleds (the simulation's).
    pub task_ids: TaskIds,
    /// How many tasks one `tasks/list` page holds (at least 1; default 50). The tasks
    /// simulation makes it small so that its listings page.
    pub task_page_size: usize,
}

impl Default for SledConfig {
    fn default() -> Self {
        SledConfig {
            page_size: None,
            run_tests_ms: (200, 2000),
            task_ids: TaskIds::Random,
            task_page_size: 50,
        }
    }
}

/// The tool that runs the project's tests for a while and may run as a task.
pub const RUN_TESTS_TOOL: &str = "run_tests";
/// How many steps a `run_tests` takes (progress after each).
pub const RUN_TESTS_STEPS: u64 = 4;

/// The names of all the tools a sled serves, in `tools/list` order.
pub const TOOL_NAMES: [&str; 14] = [
    "create_story",
    "get_story_todos",
    "show",
    "list_stories",
    "update_story",
    "move_story",
    "add_todo",
    "complete_todo",
    "block_story",
    "unblock_story",
    "record_test_result",
    "pipeline_status",
    "whoami",
    RUN_TESTS_TOOL,
];

/// The MCP server of one project.
#[derive(Debug, Clone)]
pub struct Sled {
    project: Project,
    sled_name: String,
    seed: u64,
    config: SledConfig,
    disabled: BTreeSet<String>,
    fences: Fences,
    /// The trace context of the latest requests that carried one, oldest first.
    traces: VecDeque<ReceivedTrace>,
    /// The story URIs the gateway subscribed to (`resources/subscribe`).
    subscribed: BTreeSet<String>,
    /// Subscribed URIs whose story changed, until [`Sled::take_updated`].
    updated: Vec<String>,
    /// Draws each `run_tests`' duration ([`Sled::run_tests_duration`]).
    run_tests_rng: ChaCha8Rng,
}

/// How many received trace contexts a sled keeps.
pub const TRACES_KEPT: usize = 64;

/// The W3C trace context one request carried in its `params._meta`, as the sled received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedTrace {
    /// The request's method.
    pub method: String,
    /// `_meta.traceparent`, as written: `00-<trace id>-<parent span id>-<flags>`.
    pub traceparent: String,
    /// `_meta.tracestate`, if any.
    pub tracestate: Option<String>,
}

impl ReceivedTrace {
    /// The trace id field of the `traceparent`.
    pub fn trace_id(&self) -> Option<&str> {
        self.traceparent.split('-').nth(1)
    }

    /// The parent span id field of the `traceparent`: the span of whoever sent the request.
    pub fn parent_span_id(&self) -> Option<&str> {
        self.traceparent.split('-').nth(2)
    }
}

/// The fence a forwarded `tools/call` carries in `params._meta[`[`FENCE_META`]`]`: the lease
/// holder's fence for the resource it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The leased resource, e.g. `"story:beta-1"`.
    pub resource: String,
    pub fence: u64,
}

impl Fence {
    /// The fence in a request's `params._meta`: `Ok(None)` when there is none, `Err` with what
    /// is wrong when the key is there but not `{"resource": string, "fence": integer ≥ 0}`.
    pub fn from_meta(meta: Option<&Value>) -> Result<Option<Fence>, String> {
        let Some(value) = meta
            .and_then(Value::as_object)
            .and_then(|m| m.get(FENCE_META))
        else {
            return Ok(None);
        };
        let resource = value.get("resource").and_then(Value::as_str);
        let fence = value.get("fence").and_then(Value::as_u64);
        match (resource, fence) {
            (Some(resource), Some(fence)) => Ok(Some(Fence {
                resource: resource.to_owned(),
                fence,
            })),
            _ => Err(format!(
                "Invalid params: _meta[\"{FENCE_META}\"] must be {{\"resource\": string, \"fence\": non-negative integer}}, got {value}"
            )),
        }
    }
}

/// A JSON-RPC error: code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }
}

/// A JSON-RPC error response object.
pub fn error_response(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message.into() },
    })
}

fn result_response(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

impl Sled {
    /// A sled serving `project`, named `sled_name`, reporting `seed` in `whoami`.
    pub fn new(project: Project, sled_name: impl Into<String>, seed: u64) -> Self {
        Sled {
            project,
            sled_name: sled_name.into(),
            seed,
            config: SledConfig::default(),
            disabled: BTreeSet::new(),
            subscribed: BTreeSet::new(),
            updated: Vec::new(),
            fences: Fences::default(),
            traces: VecDeque::new(),
            run_tests_rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7e57_5eed),
        }
    }

    /// A sled whose project is [`Project::seeded`] from `seed` and whose sled name is the
    /// project name.
    pub fn seeded(project_name: &str, seed: u64) -> Self {
        Sled::new(Project::seeded(project_name, seed), project_name, seed)
    }

    /// The same sled with another configuration.
    pub fn with_config(mut self, config: SledConfig) -> Self {
        self.config = config;
        self
    }

    /// The project model.
    pub fn project(&self) -> &Project {
        &self.project
    }

    /// The project model, mutably (for tests that set up state directly).
    pub fn project_mut(&mut self) -> &mut Project {
        &mut self.project
    }

    /// The project's name.
    pub fn project_name(&self) -> &str {
        &self.project.name
    }

    /// The fences accepted for the project's resources.
    pub fn fences(&self) -> &Fences {
        &self.fences
    }

    /// The highest fence accepted for any of the project's resources (what the uplink `hello`
    /// reports), `None` when it never accepted one.
    pub fn fence_high_water(&self) -> Option<u64> {
        self.fences.high_water()
    }

    /// The sled's name (what it says in its uplink `hello`).
    pub fn sled_name(&self) -> &str {
        &self.sled_name
    }

    /// The trace context of the latest requests (at most [`TRACES_KEPT`]) that carried a
    /// `traceparent` in `params._meta`, oldest first.
    pub fn traces_received(&self) -> &VecDeque<ReceivedTrace> {
        &self.traces
    }

    /// The seed reported by `whoami`.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The configuration.
    pub fn config(&self) -> &SledConfig {
        &self.config
    }

    /// How long the next `run_tests` takes: drawn from the sled's seed within
    /// [`SledConfig::run_tests_ms`].
    pub fn run_tests_duration(&mut self) -> Duration {
        let (lo, hi) = self.config.run_tests_ms;
        Duration::from_millis(self.run_tests_rng.random_range(lo.min(hi)..=hi.max(lo)))
    }

    /// Changes the `tools/list` page size.
    pub fn set_page_size(&mut self, page_size: Option<usize>) {
        self.config.page_size = page_size;
    }

    /// Hides (`enabled = false`) or shows a tool: a hidden tool is not listed and calling it is
    /// an unknown tool. Returns whether the tool list changed (false for an unknown name or no
    /// change).
    pub fn set_tool_enabled(&mut self, name: &str, enabled: bool) -> bool {
        if !TOOL_NAMES.contains(&name) {
            return false;
        }
        if enabled {
            self.disabled.remove(name)
        } else {
            self.disabled.insert(name.to_owned())
        }
    }

    /// The names of the tools currently listed, in order.
    pub fn tool_names(&self) -> Vec<&'static str> {
        TOOL_NAMES
            .into_iter()
            .filter(|n| !self.disabled.contains(*n))
            .collect()
    }

    /// The tool definitions currently listed, in order.
    pub fn tools(&self) -> Vec<Value> {
        self.tool_names()
            .into_iter()
            .filter_map(tool_definition)
            .collect()
    }

    /// Handles one JSON-RPC message. Returns the response for a request, `None` for a
    /// notification or a response.
    pub fn handle(&mut self, msg: &Value) -> Option<Value> {
        let Some(obj) = msg.as_object() else {
            return Some(error_response(
                Value::Null,
                codes::INVALID_REQUEST,
                "Invalid Request: a JSON-RPC message must be a JSON object",
            ));
        };
        let id = match obj.get("id") {
            None => None,
            Some(id @ (Value::String(_) | Value::Number(_))) => Some(id.clone()),
            Some(other) => {
                return Some(error_response(
                    Value::Null,
                    codes::INVALID_REQUEST,
                    format!("Invalid Request: id must be a string or a number, got {other}"),
                ));
            }
        };
        let method = match obj.get("method") {
            Some(Value::String(m)) => m.as_str(),
            None if obj.contains_key("result") || obj.contains_key("error") => {
                // A response to a request we never send: nothing to answer.
                return None;
            }
            None => {
                return id.map(|id| {
                    error_response(id, codes::INVALID_REQUEST, "Invalid Request: no method")
                });
            }
            Some(_) => {
                return Some(error_response(
                    id.unwrap_or(Value::Null),
                    codes::INVALID_REQUEST,
                    "Invalid Request: method must be a string",
                ));
            }
        };
        // A notification (no id) never gets a response, not even an error.
        let id = id?;
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Some(error_response(
                id,
                codes::INVALID_REQUEST,
                "Invalid Request: jsonrpc must be \"2.0\"",
            ));
        }
        let empty = Map::new();
        let params = match params_object(obj, &empty) {
            Ok(p) => p,
            Err((code, message)) => return Some(error_response(id, code, message)),
        };
        let meta = params.get("_meta");
        if let Some(traceparent) = meta.and_then(|m| m.get("traceparent")?.as_str()) {
            if self.traces.len() == TRACES_KEPT {
                self.traces.pop_front();
            }
            self.traces.push_back(ReceivedTrace {
                method: method.to_owned(),
                traceparent: traceparent.to_owned(),
                tracestate: meta
                    .and_then(|m| m.get("tracestate")?.as_str())
                    .map(str::to_owned),
            });
        }
        let outcome = match method {
            "initialize" => Ok(self.initialize(params)),
            "ping" => Ok(json!({})),
            "tools/list" => self.list_tools(params),
            "tools/call" => self.call(params).inspect(|r| self.story_touched(params, r)),
            "resources/list" => Ok(self.list_resources()),
            "resources/subscribe" | "resources/unsubscribe" => {
                match params.get("uri").and_then(Value::as_str) {
                    Some(uri) if method == "resources/subscribe" => {
                        self.subscribed.insert(uri.to_owned());
                        Ok(json!({}))
                    }
                    Some(uri) => {
                        self.subscribed.remove(uri);
                        Ok(json!({}))
                    }
                    None => Err(RpcError::new(
                        codes::INVALID_PARAMS,
                        format!("Invalid params: {method} needs a string \"uri\""),
                    )),
                }
            }
            "resources/read" => self.read_resource(params),
            "prompts/list" => Ok(prompts_list()),
            "prompts/get" => self.get_prompt(params),
            other => Err(RpcError::new(
                codes::METHOD_NOT_FOUND,
                format!("Method not found: {other}"),
            )),
        };
        Some(match outcome {
            Ok(result) => result_response(id, result),
            Err(e) => error_response(id, e.code, e.message),
        })
    }

    /// After a tool call: the story it named or made, when its URI is subscribed, is updated.
    fn story_touched(&mut self, params: &Map<String, Value>, result: &Value) {
        if self.subscribed.is_empty() || result.get("isError") == Some(&Value::Bool(true)) {
            return;
        }
        let named = params.get("arguments").and_then(|a| a.get("story_id"));
        let made = result.pointer("/structuredContent/story/id");
        let Some(id) = named.or(made).and_then(Value::as_str) else {
            return;
        };
        let uri = format!("story://{}/{id}", self.project.name);
        if self.subscribed.contains(&uri) && !self.updated.contains(&uri) {
            self.updated.push(uri);
        }
    }

    /// The subscribed story URIs that changed since the last call, for
    /// `notifications/resources/updated`.
    pub fn take_updated(&mut self) -> Vec<String> {
        std::mem::take(&mut self.updated)
    }

    /// Each story is a resource, `story://<project>/<story id>`.
    fn list_resources(&self) -> Value {
        let resources: Vec<Value> = self
            .project
            .iter()
            .map(|s| {
                json!({
                    "uri": format!("story://{}/{}", self.project.name, s.id),
                    "name": s.id,
                    "title": s.name,
                    "mimeType": "application/json",
                })
            })
            .collect();
        json!({ "resources": resources })
    }

    fn read_resource(&self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let uri = params.get("uri").and_then(Value::as_str).unwrap_or("");
        let prefix = format!("story://{}/", self.project.name);
        let story = uri
            .strip_prefix(&prefix)
            .and_then(|id| self.project.story(id))
            .ok_or_else(|| {
                // MCP's code for a resource that does not exist.
                RpcError::new(
                    -32002,
                    format!(
                        "Resource not found: {uri} (project {} lists its stories as {prefix}<id>)",
                        self.project.name
                    ),
                )
            })?;
        let body = json!({ "project": self.project.name, "story": story.to_json() });
        Ok(json!({
            "contents": [{ "uri": uri, "mimeType": "application/json", "text": body.to_string() }]
        }))
    }

    fn get_prompt(&self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        if name != "story_brief" {
            return Err(RpcError::new(
                codes::INVALID_PARAMS,
                format!("Unknown prompt: {name}"),
            ));
        }
        let story_id = params
            .get("arguments")
            .and_then(|a| a.get("story_id"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                RpcError::new(
                    codes::INVALID_PARAMS,
                    "story_brief needs the story_id argument",
                )
            })?;
        let story = self
            .project
            .story(story_id)
            .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, self.unknown_story(story_id)))?;
        let text = format!(
            "Project {}: story {} \"{}\" is in {}. Acceptance criteria: {}. Summarise what is left to do.",
            self.project.name,
            story.id,
            story.name,
            story.stage.as_str(),
            story.acceptance_criteria.join("; ")
        );
        Ok(json!({
            "description": format!("A brief of story {story_id} of project {}", self.project.name),
            "messages": [{ "role": "user", "content": { "type": "text", "text": text } }],
        }))
    }

    fn initialize(&self, params: &Map<String, Value>) -> Value {
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        let version = match requested {
            Some(v) if SUPPORTED_PROTOCOL_VERSIONS.contains(&v) => v,
            _ => LATEST_PROTOCOL_VERSION,
        };
        json!({
            "protocolVersion": version,
            "capabilities": {
                "tools": { "listChanged": true },
                "resources": { "subscribe": true },
                "prompts": {},
            },
            "serverInfo": { "name": "sled-sim", "version": env!("CARGO_PKG_VERSION") },
            "instructions": format!(
                "Emulated sled {:?} serving project {:?}: stories, todos, tests and the pipeline.",
                self.sled_name, self.project.name
            ),
        })
    }

    fn list_tools(&self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let tools = self.tools();
        let start = match params.get("cursor") {
            None | Some(Value::Null) => 0,
            Some(Value::String(c)) => decode_cursor(c)
                .filter(|&offset| offset > 0 && offset < tools.len())
                .ok_or_else(|| {
                    RpcError::new(codes::INVALID_PARAMS, format!("Invalid cursor: {c:?}"))
                })?,
            Some(other) => {
                return Err(RpcError::new(
                    codes::INVALID_PARAMS,
                    format!("Invalid cursor: must be a string, got {other}"),
                ));
            }
        };
        let page = self.config.page_size.map_or(usize::MAX, |n| n.max(1));
        let end = start.saturating_add(page).min(tools.len());
        let mut result = json!({ "tools": tools[start..end] });
        if end < tools.len() {
            result["nextCursor"] = Value::String(encode_cursor(end));
        }
        Ok(result)
    }

    fn call(&mut self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let name = match params.get("name") {
            Some(Value::String(n)) => n.as_str(),
            Some(other) => {
                return Err(RpcError::new(
                    codes::INVALID_PARAMS,
                    format!("Invalid params: tools/call name must be a string, got {other}"),
                ));
            }
            None => {
                return Err(RpcError::new(
                    codes::INVALID_PARAMS,
                    "Invalid params: tools/call needs a \"name\"",
                ));
            }
        };
        if params.contains_key("task") {
            // A task-augmented call: only a tool that supports tasks takes one (the spec's
            // -32601 otherwise). `run_tests` is answered at once here; [`SharedSled`] runs it
            // for its duration, and as a task.
            let support =
                cached_definition(name).map_or(TaskSupport::Forbidden, TaskSupport::of_tool);
            if let Err(refusal) = admit(&json!({"params": params}), support) {
                let e = &refusal["error"];
                return Err(RpcError::new(
                    e["code"].as_i64().unwrap_or(codes::INVALID_PARAMS),
                    e["message"]
                        .as_str()
                        .unwrap_or("task-augmented call refused"),
                ));
            }
        }
        let fence = Fence::from_meta(params.get("_meta"))
            .map_err(|message| RpcError::new(codes::INVALID_PARAMS, message))?;
        let mut result = self.call_tool_fenced(name, params.get("arguments"), fence.as_ref())?;
        if let Some(nonce) = params
            .get("_meta")
            .and_then(Value::as_object)
            .and_then(|m| m.get(NONCE_KEY))
        {
            result["_meta"] = json!({
                NONCE_KEY: nonce,
                PROJECT_META_KEY: self.project.name,
            });
        }
        Ok(result)
    }

    /// Calls a tool: the `CallToolResult` (maybe with `isError: true`), or a JSON-RPC error for
    /// an unknown tool. `arguments` `None` or `null` means no arguments. Unfenced.
    pub fn call_tool(&mut self, name: &str, arguments: Option<&Value>) -> Result<Value, RpcError> {
        self.call_tool_fenced(name, arguments, None)
    }

    /// [`Sled::call_tool`] under the caller's `fence`: once the arguments are valid, a tool
    /// that writes a leased resource checks it (see the module docs) and records it before it
    /// runs; any other tool ignores it.
    pub fn call_tool_fenced(
        &mut self,
        name: &str,
        arguments: Option<&Value>,
        fence: Option<&Fence>,
    ) -> Result<Value, RpcError> {
        let schema = match cached_definition(name) {
            Some(def) if !self.disabled.contains(name) => &def["inputSchema"],
            _ => {
                return Err(RpcError::new(
                    codes::INVALID_PARAMS,
                    format!("Unknown tool: {name}"),
                ));
            }
        };
        let empty = Map::new();
        let args = match arguments {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(a)) => a,
            Some(other) => {
                return Ok(self.tool_error(
                    name,
                    format!("arguments must be a JSON object, got {}", type_name(other)),
                ));
            }
        };
        let problems = validate(schema, args);
        if !problems.is_empty() {
            return Ok(self.tool_error(name, problems.join("; ")));
        }
        if let (Some(fence), Some(resource)) = (fence, leased_resource(schema, args)) {
            if let Some(refusal) = self.admit_fence(name, &resource, fence) {
                return Ok(refusal);
            }
        }
        Ok(match self.run_tool(name, args) {
            Ok(mut structured) => {
                if let Value::Object(map) = &mut structured {
                    map.insert("project".into(), Value::String(self.project.name.clone()));
                }
                json!({
                    "content": [{ "type": "text", "text": structured.to_string() }],
                    "structuredContent": structured,
                })
            }
            Err(message) => self.tool_error(name, message),
        })
    }

    /// Checks a write to `resource` under `fence` and records the fence: `None` when the write
    /// may proceed, else the `isError` result that refuses it.
    fn admit_fence(&mut self, tool: &str, resource: &str, fence: &Fence) -> Option<Value> {
        let project = &self.project.name;
        if fence.resource != resource {
            let highest = self.fences.highest(resource);
            info!(project = %project, tool, resource, fence_resource = %fence.resource,
                fence = fence.fence, "refused a write whose fence names another resource");
            let text = format!(
                "{tool} (project {project}): refused: the call writes {resource} but its fence \
                 {} is for {}; a fence covers only the resource whose lease granted it",
                fence.fence, fence.resource
            );
            let structured = json!({
                "kind": "fence_mismatch",
                "resource": resource,
                "fence_resource": fence.resource,
                "fence": fence.fence,
                "highest": highest,
                "project": project,
            });
            return Some(refusal(text, structured));
        }
        let highest = self.fences.admit(resource, fence.fence).err()?;
        info!(project = %project, tool, resource, fence = fence.fence, highest,
            "refused a stale write: its fence is below the highest accepted");
        let text = format!(
            "{tool} (project {project}): refused: the lease on {resource} was lost: this call's \
             fence {} is below {highest}, the highest this sled has accepted for it, so a newer \
             holder has written since. Nothing was changed; acquire the lease again and re-read \
             {resource} before writing",
            fence.fence
        );
        let structured = json!({
            "kind": "stale_fence",
            "resource": resource,
            "fence": fence.fence,
            "highest": highest,
            "project": project,
        });
        Some(refusal(text, structured))
    }

    fn tool_error(&self, tool: &str, message: String) -> Value {
        let text = format!("{tool} (project {}): {message}", self.project.name);
        json!({
            "content": [{ "type": "text", "text": text }],
            "structuredContent": { "project": self.project.name, "error": message },
            "isError": true,
        })
    }

    fn unknown_story(&self, id: &str) -> String {
        const SHOWN: usize = 20;
        let ids = self.project.story_ids();
        let known = if ids.is_empty() {
            "it has no stories".to_owned()
        } else if ids.len() > SHOWN {
            format!(
                "known: {} and {} more",
                ids[..SHOWN].join(", "),
                ids.len() - SHOWN
            )
        } else {
            format!("known: {}", ids.join(", "))
        };
        format!(
            "unknown story_id {id:?} in project {} ({known})",
            self.project.name
        )
    }

    /// Runs a tool whose arguments passed [`validate`]: the structured content (without
    /// `project`), or a message for an `isError` result.
    fn run_tool(&mut self, name: &str, args: &Map<String, Value>) -> Result<Value, String> {
        let story_id = str_arg(args, "story_id");
        match name {
            "create_story" => {
                let criteria = strings_arg(args, "acceptance_criteria").unwrap_or_default();
                let origin = args
                    .get("origin")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                let story = self
                    .project
                    .create_story(str_arg(args, "name"), criteria, origin);
                Ok(json!({ "story": story.to_json() }))
            }
            "list_stories" => {
                let stage = args
                    .get("stage")
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse::<Stage>().ok());
                let stories: Vec<Value> = self
                    .project
                    .iter()
                    .filter(|s| stage.is_none_or(|st| s.stage == st))
                    .map(|s| s.summary_json())
                    .collect();
                Ok(json!({ "count": stories.len(), "stories": stories, "stage": stage }))
            }
            "pipeline_status" => {
                let stages: Map<String, Value> = self
                    .project
                    .stage_counts()
                    .into_iter()
                    .map(|(stage, n)| (stage.as_str().to_owned(), json!(n)))
                    .collect();
                let blocked: Vec<Value> = self
                    .project
                    .iter()
                    .filter_map(|s| {
                        s.blocked
                            .as_ref()
                            .map(|r| json!({ "id": s.id, "name": s.name, "reason": r }))
                    })
                    .collect();
                let failing: Vec<Value> = self
                    .project
                    .iter()
                    .filter(|s| !s.failing_tests().is_empty())
                    .map(|s| json!({ "id": s.id, "name": s.name, "tests": s.failing_tests() }))
                    .collect();
                Ok(json!({
                    "total": self.project.stories.len(),
                    "stages": stages,
                    "blocked": blocked,
                    "failing": failing,
                }))
            }
            "whoami" => Ok(json!({
                "sled": self.sled_name, "seed": self.seed,
                "fence_high_water": self.fence_high_water(),
            })),
            RUN_TESTS_TOOL => {
                let suite = args.get("suite").and_then(Value::as_str).unwrap_or("all");
                let (passed, failed) = test_outcome(self.seed, &self.project.name, suite);
                Ok(json!({
                    "sled": self.sled_name, "suite": suite, "passed": passed, "failed": failed,
                }))
            }
            _ => self.run_story_tool(name, story_id, args),
        }
    }

    /// The tools that act on one existing story.
    fn run_story_tool(
        &mut self,
        name: &str,
        story_id: &str,
        args: &Map<String, Value>,
    ) -> Result<Value, String> {
        if name == "update_story"
            && !args.contains_key("name")
            && !args.contains_key("acceptance_criteria")
        {
            return Err(
                "nothing to update: give at least one of name, acceptance_criteria".to_owned(),
            );
        }
        // The message lists the known ids: build it only on a miss.
        if self.project.story(story_id).is_none() {
            return Err(self.unknown_story(story_id));
        }
        let story = self
            .project
            .story_mut(story_id)
            .expect("the story was found just above");
        match name {
            "show" => Ok(json!({ "story": story.to_json() })),
            "get_story_todos" => Ok(json!({
                "story_id": story.id,
                "todos": story.todos,
                "done": story.todos_done(),
                "remaining": story.todos.len() - story.todos_done(),
            })),
            "update_story" => {
                if args.contains_key("name") {
                    story.name = str_arg(args, "name").to_owned();
                }
                if let Some(criteria) = strings_arg(args, "acceptance_criteria") {
                    story.acceptance_criteria = criteria;
                }
                Ok(json!({ "story": story.to_json() }))
            }
            "move_story" => {
                let Ok(to) = str_arg(args, "stage").parse::<Stage>() else {
                    return Err(format!("invalid stage {:?}", str_arg(args, "stage")));
                };
                let from = story.stage;
                story.stage = to;
                Ok(json!({ "from": from, "to": to, "story": story.to_json() }))
            }
            "add_todo" => {
                let todo = story.add_todo(str_arg(args, "text")).clone();
                Ok(json!({ "story_id": story.id, "todo": todo }))
            }
            "complete_todo" => {
                let todo_id = args.get("todo_id").and_then(Value::as_u64).unwrap_or(0);
                let id = story.id.clone();
                let known: Vec<String> = story.todos.iter().map(|t| t.id.to_string()).collect();
                match story.complete_todo(todo_id) {
                    Some((todo, was_done)) => Ok(json!({
                        "story_id": id,
                        "todo": todo,
                        "already_done": was_done,
                    })),
                    None => Err(format!(
                        "unknown todo_id {todo_id} in story {id} (its todos: {})",
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    )),
                }
            }
            "block_story" => {
                story.blocked = Some(str_arg(args, "reason").to_owned());
                Ok(json!({ "story": story.to_json() }))
            }
            "unblock_story" => {
                let was_blocked = story.blocked.take().is_some();
                Ok(json!({ "was_blocked": was_blocked, "story": story.to_json() }))
            }
            "record_test_result" => {
                let test = str_arg(args, "test").to_owned();
                let passed = args.get("passed").and_then(Value::as_bool).unwrap_or(false);
                story.record_test(test.clone(), passed);
                Ok(json!({
                    "story_id": story.id,
                    "test": test,
                    "passed": passed,
                    "failing_tests": story.failing_tests(),
                }))
            }
            other => Err(format!("tool {other} is not implemented")),
        }
    }
}

/// An `isError` result refusing a fenced write.
fn refusal(text: String, structured: Value) -> Value {
    json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
        "isError": true,
    })
}

/// The leased resource a call of the tool with `schema` writes: `"<kind>:<value>"` of the first
/// property that carries [`LEASE_KEYWORD`] and whose argument is a string.
fn leased_resource(schema: &Value, args: &Map<String, Value>) -> Option<String> {
    let properties = schema["properties"].as_object()?;
    properties.iter().find_map(|(name, prop)| {
        let kind = prop.get(LEASE_KEYWORD)?.as_str()?;
        let value = args.get(name)?.as_str()?;
        Some(format!("{kind}:{value}"))
    })
}

fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn strings_arg(args: &Map<String, Value>, key: &str) -> Option<Vec<String>> {
    args.get(key).and_then(Value::as_array).map(|items| {
        items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    })
}

const CURSOR_PREFIX: &str = "sled-sim:";

fn encode_cursor(offset: usize) -> String {
    format!("{CURSOR_PREFIX}{offset:x}")
}

fn decode_cursor(cursor: &str) -> Option<usize> {
    let hex = cursor.strip_prefix(CURSOR_PREFIX)?;
    if hex.is_empty() || hex.len() > 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    usize::from_str_radix(hex, 16).ok()
}

fn story_id_schema() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "description": "The story's id, e.g. \"alpha-3\" (from create_story or list_stories).",
    })
}

/// The `story_id` of a tool that writes the story: leasable, as the resource `story:<id>`.
fn leased_story_id_schema() -> Value {
    let mut schema = story_id_schema();
    schema[LEASE_KEYWORD] = json!("story");
    schema
}

fn stage_schema(description: &str) -> Value {
    json!({
        "type": "string",
        "enum": Stage::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "description": description,
    })
}

fn criteria_schema() -> Value {
    json!({
        "type": "array",
        "items": { "type": "string" },
        "description": "What must be true for the story to be done, one item per criterion.",
    })
}

fn object_schema(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// A request's `params` as an object (absent or `null`: `empty`), or the error code and
/// message a malformed one gets. Shared by every backend a sled serves.
pub(crate) fn params_object<'a>(
    obj: &'a Map<String, Value>,
    empty: &'a Map<String, Value>,
) -> Result<&'a Map<String, Value>, (i64, &'static str)> {
    match obj.get("params") {
        None | Some(Value::Null) => Ok(empty),
        Some(Value::Object(p)) => Ok(p),
        Some(Value::Array(_)) => Err((
            codes::INVALID_PARAMS,
            "Invalid params: MCP params must be an object, not an array",
        )),
        Some(_) => Err((
            codes::INVALID_REQUEST,
            "Invalid Request: params must be an object",
        )),
    }
}

/// The prompts every emulated project serves.
fn prompts_list() -> Value {
    json!({ "prompts": [{
        "name": "story_brief",
        "title": "Story brief",
        "description": "A brief of one story of this project, to start work on it.",
        "arguments": [{ "name": "story_id", "description": "The story's id, e.g. \"alpha-1\".", "required": true }],
    }]})
}

/// Every tool's definition, built once.
fn cached_definition(name: &str) -> Option<&'static Value> {
    static DEFINITIONS: std::sync::OnceLock<std::collections::BTreeMap<&'static str, Value>> =
        std::sync::OnceLock::new();
    DEFINITIONS
        .get_or_init(|| {
            TOOL_NAMES
                .iter()
                .filter_map(|n| tool_definition(n).map(|d| (*n, d)))
                .collect()
        })
        .get(name)
}

/// The definition (`name`, `title`, `description`, `inputSchema`, `annotations`) of a tool.
pub fn tool_definition(name: &str) -> Option<Value> {
    let (title, description, schema, read_only) = match name {
        "create_story" => (
            "Create story",
            "Create a story in the backlog of this project.",
            object_schema(
                json!({
                    "name": { "type": "string", "minLength": 1, "description": "The story's title." },
                    "acceptance_criteria": criteria_schema(),
                    "origin": { "type": "string", "description": "Where the story came from (a ticket, a conversation)." },
                }),
                &["name", "acceptance_criteria"],
            ),
            false,
        ),
        "get_story_todos" => (
            "Story todos",
            "List a story's todos with their ids and done flags.",
            object_schema(json!({ "story_id": story_id_schema() }), &["story_id"]),
            true,
        ),
        "show" => (
            "Show story",
            "Show everything about one story: stage, criteria, todos, tests, blocker.",
            object_schema(json!({ "story_id": story_id_schema() }), &["story_id"]),
            true,
        ),
        "list_stories" => (
            "List stories",
            "List this project's stories in creation order, optionally only those in one stage.",
            object_schema(
                json!({ "stage": stage_schema("Only stories in this stage.") }),
                &[],
            ),
            true,
        ),
        "update_story" => (
            "Update story",
            "Rename a story and/or replace its acceptance criteria.",
            object_schema(
                json!({
                    "story_id": leased_story_id_schema(),
                    "name": { "type": "string", "minLength": 1, "description": "The new title." },
                    "acceptance_criteria": criteria_schema(),
                }),
                &["story_id"],
            ),
            false,
        ),
        "move_story" => (
            "Move story",
            "Move a story to another pipeline stage.",
            object_schema(
                json!({
                    "story_id": leased_story_id_schema(),
                    "stage": stage_schema("The stage to move the story to."),
                }),
                &["story_id", "stage"],
            ),
            false,
        ),
        "add_todo" => (
            "Add todo",
            "Append a todo to a story.",
            object_schema(
                json!({
                    "story_id": leased_story_id_schema(),
                    "text": { "type": "string", "minLength": 1, "description": "What to do." },
                }),
                &["story_id", "text"],
            ),
            false,
        ),
        "complete_todo" => (
            "Complete todo",
            "Mark one of a story's todos done.",
            object_schema(
                json!({
                    "story_id": leased_story_id_schema(),
                    "todo_id": { "type": "integer", "minimum": 1, "description": "The todo's id within the story (from get_story_todos)." },
                }),
                &["story_id", "todo_id"],
            ),
            false,
        ),
        "block_story" => (
            "Block story",
            "Mark a story blocked, with the reason.",
            object_schema(
                json!({
                    "story_id": leased_story_id_schema(),
                    "reason": { "type": "string", "minLength": 1, "description": "Why the story cannot proceed." },
                }),
                &["story_id", "reason"],
            ),
            false,
        ),
        "unblock_story" => (
            "Unblock story",
            "Clear a story's blocker.",
            object_schema(
                json!({ "story_id": leased_story_id_schema() }),
                &["story_id"],
            ),
            false,
        ),
        "record_test_result" => (
            "Record test result",
            "Record the latest result of a named test for a story.",
            object_schema(
                json!({
                    "story_id": leased_story_id_schema(),
                    "test": { "type": "string", "minLength": 1, "description": "The test's name." },
                    "passed": { "type": "boolean", "description": "Whether it passed." },
                }),
                &["story_id", "test", "passed"],
            ),
            false,
        ),
        "pipeline_status" => (
            "Pipeline status",
            "Story counts per stage, plus the blocked stories and those with failing tests.",
            object_schema(json!({}), &[]),
            true,
        ),
        "whoami" => (
            "Who am I",
            "The project this sled serves, the sled's name, its seed, and the highest lease fence it has accepted (`fence_high_water`, null before any).",
            object_schema(json!({}), &[]),
            true,
        ),
        RUN_TESTS_TOOL => (
            "Run tests",
            "Run the project's tests (one suite, or all), reporting progress after each step; takes a while, so it may run as a task (execution.taskSupport optional). Changes nothing.",
            object_schema(
                json!({ "suite": { "type": "string", "minLength": 1, "description": "The suite to run (default: all)." } }),
                &[],
            ),
            true,
        ),
        _ => return None,
    };
    let mut def = json!({
        "name": name,
        "title": title,
        "description": description,
        "inputSchema": schema,
        "annotations": { "readOnlyHint": read_only },
    });
    if name == RUN_TESTS_TOOL {
        def["execution"] = json!({ "taskSupport": "optional" });
    }
    Some(def)
}

/// How many tests of `suite` pass and fail on the sled of `project` with `seed`: the same on
/// every run, and (by the project in the mix) telling one project's run from another's.
pub fn test_outcome(seed: u64, project: &str, suite: &str) -> (u64, u64) {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(project.as_bytes());
    h.update([0]);
    h.update(suite.as_bytes());
    let d = h.finalize();
    let passed = 10 + u64::from(d[0]) % 40;
    let failed = u64::from(d[1] % 4 == 0) * (1 + u64::from(d[2]) % 3);
    (passed, failed)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks arguments against the subset of JSON Schema the tool schemas use. Returns one message
/// per problem, empty when the arguments are valid.
fn validate(schema: &Value, args: &Map<String, Value>) -> Vec<String> {
    let mut problems = Vec::new();
    let empty = Map::new();
    let properties = schema["properties"].as_object().unwrap_or(&empty);
    let accepted = || {
        if properties.is_empty() {
            "this tool takes no arguments".to_owned()
        } else {
            let names: Vec<&str> = properties.keys().map(String::as_str).collect();
            format!("accepted: {}", names.join(", "))
        }
    };
    if let Some(required) = schema["required"].as_array() {
        for name in required.iter().filter_map(Value::as_str) {
            if !args.contains_key(name) {
                problems.push(format!("missing required property {name:?}"));
            }
        }
    }
    for (name, value) in args {
        let Some(prop) = properties.get(name) else {
            problems.push(format!("unknown property {name:?} ({})", accepted()));
            continue;
        };
        check_value(name, prop, value, &mut problems);
    }
    problems
}

fn check_value(path: &str, prop: &Value, value: &Value, problems: &mut Vec<String>) {
    let expected = prop["type"].as_str().unwrap_or("any");
    let ok = match expected {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    };
    if !ok {
        let article = if expected.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        problems.push(format!(
            "property {path:?} must be {article} {expected}, got {}",
            type_name(value)
        ));
        return;
    }
    if let (Some(allowed), Some(s)) = (prop["enum"].as_array(), value.as_str()) {
        if !allowed.iter().any(|a| a.as_str() == Some(s)) {
            let names: Vec<&str> = allowed.iter().filter_map(Value::as_str).collect();
            problems.push(format!(
                "property {path:?} must be one of {}, got {s:?}",
                names.join(", ")
            ));
        }
    }
    if let (Some(min), Some(s)) = (prop["minLength"].as_u64(), value.as_str()) {
        if (s.chars().count() as u64) < min {
            problems.push(format!(
                "property {path:?} must be at least {min} character(s) long"
            ));
        }
    }
    if let Some(min) = prop["minimum"].as_i64() {
        let below = match (value.as_i64(), value.as_u64()) {
            (Some(v), _) => v < min,
            (None, Some(_)) => false,
            _ => false,
        };
        if below {
            problems.push(format!(
                "property {path:?} must be at least {min}, got {value}"
            ));
        }
    }
    if let (Some(items), Some(array)) = (prop.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            check_value(&format!("{path}[{i}]"), items, item, problems);
        }
    }
}

/// A [`Sled`] shared between the uplink, the direct HTTP endpoint and tests. Cloning shares the
/// same sled. The lock is a std mutex held only for one synchronous call.
#[derive(Clone, Debug)]
pub struct SharedSled {
    inner: Arc<SharedInner>,
}

#[derive(Debug)]
struct SharedInner {
    sled: Mutex<Sled>,
    project: String,
    tools_changed: watch::Sender<u64>,
    /// Notifications every connected uplink sends ([`SharedSled::notify`]).
    notices: tokio::sync::broadcast::Sender<String>,
    /// Its tasks (`run_tests` as a task); status notifications go out with `notices`.
    tasks: TaskRunner,
}

impl SharedSled {
    /// Shares `sled`; its tasks' timestamps come from the system's clock.
    pub fn new(sled: Sled) -> Self {
        SharedSled::with_task_clock(sled, sled_uplink::tasks::system_clock)
    }

    /// Shares `sled`; its tasks' `createdAt` and `lastUpdatedAt` come from `clock` (the time
    /// since the Unix epoch: a simulation's, to stay deterministic).
    pub fn with_task_clock(sled: Sled, clock: fn() -> Duration) -> Self {
        let project = sled.project_name().to_owned();
        let notices = tokio::sync::broadcast::Sender::new(64);
        let tasks = TaskRunner::new(
            TaskOptions {
                ids: sled.config().task_ids.clone(),
                page_size: sled.config().task_page_size.max(1),
                clock,
                ..TaskOptions::default()
            },
            notices.clone(),
        );
        SharedSled {
            inner: Arc::new(SharedInner {
                sled: Mutex::new(sled),
                project,
                tools_changed: watch::Sender::new(0),
                notices,
                tasks,
            }),
        }
    }

    /// Its tasks.
    pub fn tasks(&self) -> &TaskRunner {
        &self.inner.tasks
    }

    /// The requests answered asynchronously (see [`SyncServer::handle_async`]
    /// (crate::uplink::SyncServer::handle_async)): `tasks/*`, and `run_tests`, which takes
    /// its seeded duration with progress after each of [`RUN_TESTS_STEPS`] steps (through
    /// `ctx`, the call's context on an uplink), as a plain call or, with `params.task`, as a
    /// task. `None` for everything else ([`SharedSled::handle`] answers it at once).
    pub fn handle_async(
        &self,
        msg: &Value,
        ctx: Option<&CallContext>,
    ) -> Option<BoxFuture<'static, Option<Value>>> {
        let method = msg.get("method").and_then(Value::as_str)?;
        msg.get("id")?;
        if TaskRunner::handles(method) {
            let (tasks, msg) = (self.inner.tasks.clone(), msg.clone());
            return Some(Box::pin(async move { tasks.answer(&msg).await }));
        }
        let listed = self.lock().tool_names().contains(&RUN_TESTS_TOOL);
        if method != "tools/call"
            || msg.pointer("/params/name") != Some(&json!(RUN_TESTS_TOOL))
            || !listed
        {
            return None;
        }
        let as_task = match admit(msg, TaskSupport::Optional) {
            Ok(as_task) => as_task,
            Err(refusal) => return Some(Box::pin(async move { Some(refusal) })),
        };
        // Drawn now, in the order the calls arrive, so a simulation stays deterministic.
        let duration = self.lock().run_tests_duration();
        let mut plain = msg.clone();
        if let Some(params) = plain.get_mut("params").and_then(Value::as_object_mut) {
            params.remove("task");
        }
        let sled = self.clone();
        if as_task {
            let created =
                self.inner
                    .tasks
                    .start(msg, ctx.cloned(), move |p: TaskProgress| async move {
                        let report = |step: u64, text: &str| {
                            p.progress(step as f64, Some(RUN_TESTS_STEPS as f64), Some(text));
                        };
                        run_tests(&sled, &plain, duration, report).await
                    });
            return Some(Box::pin(async move { Some(created) }));
        }
        let ctx = ctx.cloned();
        Some(Box::pin(async move {
            let report = |step: u64, text: &str| {
                if let Some(ctx) = &ctx {
                    ctx.progress(step as f64, Some(RUN_TESTS_STEPS as f64), Some(text));
                }
            };
            Some(run_tests(&sled, &plain, duration, report).await)
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Sled> {
        // A panic while holding the lock cannot leave the model half-updated in a way that
        // matters for a simulation; keep serving.
        self.inner
            .sled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Handles one JSON-RPC message (see [`Sled::handle`]); a subscribed story it changed is
    /// announced with `notifications/resources/updated` on every connected uplink.
    pub fn handle(&self, msg: &Value) -> Option<Value> {
        let (response, updated) = {
            let mut sled = self.lock();
            let response = sled.handle(msg);
            (response, sled.take_updated())
        };
        for uri in updated {
            self.notify(
                "notifications/resources/updated",
                Some(json!({ "uri": uri })),
            );
        }
        response
    }

    /// Runs `f` on the sled under the lock (to inspect or set up the model).
    pub fn with<R>(&self, f: impl FnOnce(&mut Sled) -> R) -> R {
        f(&mut self.lock())
    }

    /// The project's name.
    pub fn project_name(&self) -> &str {
        &self.inner.project
    }

    /// The sled's name.
    pub fn sled_name(&self) -> String {
        self.lock().sled_name().to_owned()
    }

    /// The highest fence the sled has accepted (see [`Sled::fence_high_water`]).
    pub fn fence_high_water(&self) -> Option<u64> {
        self.lock().fence_high_water()
    }

    /// The trace contexts the sled received (see [`Sled::traces_received`]), oldest first.
    pub fn traces_received(&self) -> Vec<ReceivedTrace> {
        self.lock().traces_received().iter().cloned().collect()
    }

    /// Shows or hides a tool (see [`Sled::set_tool_enabled`]); when the list changes, every
    /// connected uplink sends `notifications/tools/list_changed`.
    pub fn set_tool_enabled(&self, name: &str, enabled: bool) -> bool {
        let changed = self.lock().set_tool_enabled(name, enabled);
        if changed {
            self.notify_tools_list_changed();
        }
        changed
    }

    /// Makes every connected uplink send `notifications/tools/list_changed` now.
    pub fn notify_tools_list_changed(&self) {
        self.inner
            .tools_changed
            .send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A receiver that sees a change each time the tool list changes.
    pub fn subscribe_tools_changed(&self) -> watch::Receiver<u64> {
        self.inner.tools_changed.subscribe()
    }

    /// Makes every connected uplink send the notification `method` (with `params`) now, as a
    /// sled whose prompts or resources change does (`notifications/prompts/list_changed`,
    /// `notifications/resources/list_changed`, `notifications/resources/updated`). Returns
    /// how many uplinks will send it.
    pub fn notify(&self, method: &str, params: Option<Value>) -> usize {
        let mut n = json!({"jsonrpc": "2.0", "method": method});
        if let Some(p) = params {
            n["params"] = p;
        }
        self.inner.notices.send(n.to_string()).unwrap_or(0)
    }

    /// A receiver of what [`SharedSled::notify`] sends.
    pub fn subscribe_notices(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.inner.notices.subscribe()
    }
}

/// `run_tests` for `duration`, in [`RUN_TESTS_STEPS`] steps with `report` after each, then the
/// sled's answer to `msg` (a plain `tools/call`).
async fn run_tests(
    sled: &SharedSled,
    msg: &Value,
    duration: Duration,
    report: impl Fn(u64, &str),
) -> Value {
    let suite = msg
        .pointer("/params/arguments/suite")
        .and_then(Value::as_str)
        .unwrap_or("all")
        .to_owned();
    let step = duration / u32::try_from(RUN_TESTS_STEPS).unwrap_or(1);
    for i in 1..=RUN_TESTS_STEPS {
        tokio::time::sleep(step).await;
        report(
            i,
            &format!(
                "{}: suite {suite}, step {i} of {RUN_TESTS_STEPS}",
                sled.project_name()
            ),
        );
    }
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    sled.handle(msg)
        .unwrap_or_else(|| error_response(id, codes::INTERNAL_ERROR, "run_tests gave no answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sled() -> Sled {
        Sled::new(Project::new("beta"), "beta-sled", 7)
    }

    fn call(s: &mut Sled, name: &str, args: Value) -> Value {
        let resp = s
            .handle(&json!({
                "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": { "name": name, "arguments": args },
            }))
            .expect("a request gets a response");
        assert_eq!(resp["id"], 1);
        resp["result"].clone()
    }

    fn ok(s: &mut Sled, name: &str, args: Value) -> Value {
        let result = call(s, name, args);
        assert_eq!(result.get("isError"), None, "{result}");
        let structured = result["structuredContent"].clone();
        assert_eq!(structured["project"], "beta");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert_eq!(result["content"][0]["type"], "text");
        assert_eq!(serde_json::from_str::<Value>(text).unwrap(), structured);
        assert!(!text.contains('\n'));
        structured
    }

    fn err(s: &mut Sled, name: &str, args: Value) -> String {
        let result = call(s, name, args);
        assert_eq!(result["isError"], true, "{result}");
        assert_eq!(result["structuredContent"]["project"], "beta");
        result["content"][0]["text"].as_str().unwrap().to_owned()
    }

    fn create(s: &mut Sled, name: &str) -> String {
        ok(
            s,
            "create_story",
            json!({ "name": name, "acceptance_criteria": ["a"] }),
        )["story"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn rpc(s: &mut Sled, msg: Value) -> Value {
        s.handle(&msg).expect("a response")
    }

    #[test]
    fn initialize_negotiates_version() {
        let mut s = sled();
        for (asked, answered) in [
            (json!("2025-06-18"), "2025-06-18"),
            (json!("2025-03-26"), "2025-03-26"),
            (json!("2025-11-25"), "2025-11-25"),
            (json!("2024-11-05"), "2025-11-25"),
            (json!(42), "2025-11-25"),
        ] {
            let r = rpc(
                &mut s,
                json!({"jsonrpc":"2.0","id":"i","method":"initialize",
                       "params":{"protocolVersion":asked,"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
            );
            assert_eq!(r["id"], "i");
            assert_eq!(r["result"]["protocolVersion"], answered);
            assert_eq!(
                r["result"]["capabilities"],
                json!({"tools":{"listChanged":true},"resources":{"subscribe":true},"prompts":{}})
            );
            assert_eq!(r["result"]["serverInfo"]["name"], "sled-sim");
        }
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":2,"method":"initialize"}),
        );
        assert_eq!(r["result"]["protocolVersion"], "2025-11-25");
    }

    #[test]
    fn ping_notifications_and_protocol_errors() {
        let mut s = sled();
        assert_eq!(
            rpc(&mut s, json!({"jsonrpc":"2.0","id":5,"method":"ping"})),
            json!({"jsonrpc":"2.0","id":5,"result":{}})
        );
        assert_eq!(
            s.handle(&json!({"jsonrpc":"2.0","method":"notifications/initialized"})),
            None
        );
        assert_eq!(
            s.handle(&json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}})),
            None
        );
        assert_eq!(s.handle(&json!({"jsonrpc":"2.0","id":1,"result":{}})), None);
        let r = rpc(&mut s, json!({"jsonrpc":"2.0","id":1,"method":"nope"}));
        assert_eq!(r["error"]["code"], -32601);
        for bad in [
            json!([1, 2]),
            json!("x"),
            json!({"jsonrpc":"2.0","id":null,"method":"ping"}),
            json!({"jsonrpc":"2.0","id":{},"method":"ping"}),
            json!({"jsonrpc":"2.0","id":1,"method":7}),
            json!({"jsonrpc":"1.0","id":1,"method":"ping"}),
            json!({"id":1,"method":"ping"}),
            json!({"jsonrpc":"2.0","id":1}),
            json!({"jsonrpc":"2.0","id":1,"method":"ping","params":3}),
        ] {
            let r = rpc(&mut s, bad.clone());
            assert_eq!(r["error"]["code"], -32600, "{bad} → {r}");
            assert_eq!(r["jsonrpc"], "2.0");
        }
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":[1]}),
        );
        assert_eq!(r["error"]["code"], -32602);
    }

    #[test]
    fn tools_list_has_real_schemas_and_no_project_property() {
        let mut s = sled();
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
        );
        let tools = r["result"]["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 14);
        assert!(r["result"].get("nextCursor").is_none());
        for tool in tools {
            let schema = &tool["inputSchema"];
            assert_eq!(schema["type"], "object", "{tool}");
            assert!(schema["properties"].is_object());
            assert!(schema["required"].is_array());
            assert_eq!(schema["additionalProperties"], false);
            assert!(schema["properties"].get("project").is_none());
            let name = tool["name"].as_str().unwrap();
            assert!(name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)));
            for req in schema["required"].as_array().unwrap() {
                assert!(schema["properties"].get(req.as_str().unwrap()).is_some());
            }
        }
    }

    #[test]
    fn tools_list_paginates() {
        let mut s = sled().with_config(SledConfig {
            page_size: Some(5),
            ..SledConfig::default()
        });
        let mut names = Vec::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            let params = match &cursor {
                Some(c) => json!({ "cursor": c }),
                None => json!({}),
            };
            let r = rpc(
                &mut s,
                json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":params}),
            );
            pages += 1;
            for t in r["result"]["tools"].as_array().unwrap() {
                names.push(t["name"].as_str().unwrap().to_owned());
            }
            match r["result"].get("nextCursor").and_then(Value::as_str) {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(names, TOOL_NAMES.to_vec());
        for bad in [
            json!("garbage"),
            json!("sled-sim:zz"),
            json!("sled-sim:0"),
            json!("sled-sim:ff"),
            json!("sled-sim:ffffffffffffffffffff"),
            json!(3),
        ] {
            let r = rpc(
                &mut s,
                json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":bad}}),
            );
            assert_eq!(r["error"]["code"], -32602, "{bad}");
        }
        s.set_page_size(Some(0));
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
        );
        assert_eq!(r["result"]["tools"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn disabled_tools_are_unlisted_and_unknown() {
        let mut s = sled();
        assert!(s.set_tool_enabled("whoami", false));
        assert!(!s.set_tool_enabled("whoami", false));
        assert!(!s.set_tool_enabled("nope", false));
        assert_eq!(s.tools().len(), 13);
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami"}}),
        );
        assert_eq!(r["error"]["code"], -32602);
        assert!(s.set_tool_enabled("whoami", true));
        assert_eq!(s.tools().len(), 14);
    }

    #[test]
    fn unknown_tool_and_bad_call_params() {
        let mut s = sled();
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"frobnicate","arguments":{}}}),
        );
        assert_eq!(r["error"]["code"], -32602);
        assert_eq!(r["error"]["message"], "Unknown tool: frobnicate");
        assert_eq!(r["id"], 9);
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{}}),
        );
        assert_eq!(r["error"]["code"], -32602);
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":1}}),
        );
        assert_eq!(r["error"]["code"], -32602);
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"whoami","arguments":[1]}}),
        );
        assert_eq!(r["result"]["isError"], true);
        assert!(r["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("arguments must be a JSON object"));
    }

    #[test]
    fn create_story_and_validation() {
        let mut s = sled();
        let st = ok(
            &mut s,
            "create_story",
            json!({"name":"Fix login","acceptance_criteria":["works","tested"],"origin":"ticket 7"}),
        );
        assert_eq!(st["story"]["id"], "beta-1");
        assert_eq!(st["story"]["stage"], "backlog");
        assert_eq!(st["story"]["origin"], "ticket 7");
        assert_eq!(
            st["story"]["acceptance_criteria"],
            json!(["works", "tested"])
        );
        let st = ok(
            &mut s,
            "create_story",
            json!({"name":"Second","acceptance_criteria":[]}),
        );
        assert_eq!(st["story"]["id"], "beta-2");
        assert_eq!(st["story"]["origin"], Value::Null);

        let e = err(&mut s, "create_story", json!({"acceptance_criteria":[]}));
        assert!(e.contains("missing required property \"name\""), "{e}");
        let e = err(&mut s, "create_story", json!({"name":"x"}));
        assert!(
            e.contains("missing required property \"acceptance_criteria\""),
            "{e}"
        );
        let e = err(
            &mut s,
            "create_story",
            json!({"name":5,"acceptance_criteria":"x"}),
        );
        assert!(
            e.contains("\"name\" must be a string, got an integer"),
            "{e}"
        );
        assert!(
            e.contains("\"acceptance_criteria\" must be an array, got a string"),
            "{e}"
        );
        let e = err(
            &mut s,
            "create_story",
            json!({"name":"x","acceptance_criteria":["ok", 3]}),
        );
        assert!(
            e.contains("\"acceptance_criteria[1]\" must be a string"),
            "{e}"
        );
        let e = err(
            &mut s,
            "create_story",
            json!({"name":"x","acceptance_criteria":[],"project":"beta"}),
        );
        assert!(e.contains("unknown property \"project\""), "{e}");
        assert!(e.contains("accepted: "), "{e}");
        let e = err(
            &mut s,
            "create_story",
            json!({"name":"","acceptance_criteria":[]}),
        );
        assert!(e.contains("at least 1 character"), "{e}");
        assert_eq!(s.project().stories.len(), 2);
    }

    #[test]
    fn show_and_unknown_story() {
        let mut s = sled();
        let id = create(&mut s, "A");
        let st = ok(&mut s, "show", json!({ "story_id": id }));
        assert_eq!(st["story"]["name"], "A");
        assert_eq!(st["story"]["blocked"], false);
        let e = err(&mut s, "show", json!({ "story_id": "beta-2" }));
        assert!(e.contains("unknown story_id \"beta-2\""), "{e}");
        assert!(e.contains("known: beta-1"), "{e}");
        let e = err(&mut s, "show", json!({ "story_id": "alpha-1" }));
        assert!(
            e.contains("unknown story_id \"alpha-1\" in project beta"),
            "{e}"
        );
        let e = err(&mut s, "show", json!({}));
        assert!(e.contains("missing required property \"story_id\""), "{e}");
        let e = err(&mut s, "show", json!({ "story_id": 1 }));
        assert!(e.contains("must be a string"), "{e}");
    }

    #[test]
    fn todos_flow() {
        let mut s = sled();
        let id = create(&mut s, "A");
        let t = ok(
            &mut s,
            "add_todo",
            json!({ "story_id": id, "text": "write test" }),
        );
        assert_eq!(t["todo"], json!({"id":1,"text":"write test","done":false}));
        ok(&mut s, "add_todo", json!({ "story_id": id, "text": "fix" }));
        let t = ok(
            &mut s,
            "complete_todo",
            json!({ "story_id": id, "todo_id": 1 }),
        );
        assert_eq!(t["todo"]["done"], true);
        assert_eq!(t["already_done"], false);
        let t = ok(
            &mut s,
            "complete_todo",
            json!({ "story_id": id, "todo_id": 1 }),
        );
        assert_eq!(t["already_done"], true);
        let todos = ok(&mut s, "get_story_todos", json!({ "story_id": id }));
        assert_eq!(todos["done"], 1);
        assert_eq!(todos["remaining"], 1);
        assert_eq!(todos["todos"].as_array().unwrap().len(), 2);

        let e = err(
            &mut s,
            "complete_todo",
            json!({ "story_id": id, "todo_id": 3 }),
        );
        assert!(
            e.contains("unknown todo_id 3 in story beta-1 (its todos: 1, 2)"),
            "{e}"
        );
        let e = err(
            &mut s,
            "complete_todo",
            json!({ "story_id": id, "todo_id": 0 }),
        );
        assert!(e.contains("must be at least 1"), "{e}");
        let e = err(
            &mut s,
            "complete_todo",
            json!({ "story_id": id, "todo_id": 1.5 }),
        );
        assert!(e.contains("must be an integer, got a number"), "{e}");
        let e = err(
            &mut s,
            "complete_todo",
            json!({ "story_id": id, "todo_id": "1" }),
        );
        assert!(e.contains("must be an integer, got a string"), "{e}");
        let e = err(&mut s, "add_todo", json!({ "story_id": id }));
        assert!(e.contains("missing required property \"text\""), "{e}");
        let e = err(&mut s, "get_story_todos", json!({ "story_id": "beta-9" }));
        assert!(e.contains("unknown story_id"), "{e}");
    }

    #[test]
    fn list_move_update() {
        let mut s = sled();
        let a = create(&mut s, "A");
        create(&mut s, "B");
        let m = ok(
            &mut s,
            "move_story",
            json!({ "story_id": a, "stage": "review" }),
        );
        assert_eq!(m["from"], "backlog");
        assert_eq!(m["to"], "review");
        let l = ok(&mut s, "list_stories", json!({}));
        assert_eq!(l["count"], 2);
        assert_eq!(l["stories"][0]["id"], "beta-1");
        let l = ok(&mut s, "list_stories", json!({ "stage": "review" }));
        assert_eq!(l["count"], 1);
        assert_eq!(l["stories"][0]["name"], "A");
        let e = err(&mut s, "list_stories", json!({ "stage": "doing" }));
        assert!(
            e.contains("must be one of backlog, in_progress, review, done, got \"doing\""),
            "{e}"
        );
        let e = err(
            &mut s,
            "move_story",
            json!({ "story_id": a, "stage": "shipped" }),
        );
        assert!(e.contains("must be one of"), "{e}");
        let e = err(&mut s, "move_story", json!({ "story_id": a }));
        assert!(e.contains("missing required property \"stage\""), "{e}");

        let u = ok(
            &mut s,
            "update_story",
            json!({ "story_id": a, "name": "A2", "acceptance_criteria": ["x"] }),
        );
        assert_eq!(u["story"]["name"], "A2");
        assert_eq!(u["story"]["acceptance_criteria"], json!(["x"]));
        let u = ok(
            &mut s,
            "update_story",
            json!({ "story_id": a, "name": "A3" }),
        );
        assert_eq!(u["story"]["acceptance_criteria"], json!(["x"]));
        let e = err(&mut s, "update_story", json!({ "story_id": a }));
        assert!(e.contains("nothing to update"), "{e}");
        let e = err(
            &mut s,
            "update_story",
            json!({ "story_id": "beta-77", "name": "z" }),
        );
        assert!(e.contains("unknown story_id"), "{e}");
    }

    #[test]
    fn block_tests_and_pipeline() {
        let mut s = sled();
        let a = create(&mut s, "A");
        let b = create(&mut s, "B");
        let st = ok(
            &mut s,
            "block_story",
            json!({ "story_id": a, "reason": "waiting" }),
        );
        assert_eq!(st["story"]["blocked"], true);
        assert_eq!(st["story"]["blocked_reason"], "waiting");
        let e = err(&mut s, "block_story", json!({ "story_id": a }));
        assert!(e.contains("missing required property \"reason\""), "{e}");
        let r = ok(
            &mut s,
            "record_test_result",
            json!({ "story_id": b, "test": "login", "passed": false }),
        );
        assert_eq!(r["failing_tests"], json!(["login"]));
        let e = err(
            &mut s,
            "record_test_result",
            json!({ "story_id": b, "test": "login", "passed": "no" }),
        );
        assert!(
            e.contains("\"passed\" must be a boolean, got a string"),
            "{e}"
        );
        ok(
            &mut s,
            "move_story",
            json!({ "story_id": b, "stage": "in_progress" }),
        );

        let p = ok(&mut s, "pipeline_status", json!({}));
        assert_eq!(p["total"], 2);
        assert_eq!(
            p["stages"],
            json!({"backlog":1,"in_progress":1,"review":0,"done":0})
        );
        assert_eq!(
            p["blocked"],
            json!([{"id":"beta-1","name":"A","reason":"waiting"}])
        );
        assert_eq!(
            p["failing"],
            json!([{"id":"beta-2","name":"B","tests":["login"]}])
        );
        let e = err(&mut s, "pipeline_status", json!({ "x": 1 }));
        assert!(
            e.contains("unknown property \"x\" (this tool takes no arguments)"),
            "{e}"
        );

        let u = ok(&mut s, "unblock_story", json!({ "story_id": a }));
        assert_eq!(u["was_blocked"], true);
        let u = ok(&mut s, "unblock_story", json!({ "story_id": a }));
        assert_eq!(u["was_blocked"], false);
        ok(
            &mut s,
            "record_test_result",
            json!({ "story_id": b, "test": "login", "passed": true }),
        );
        let p = ok(&mut s, "pipeline_status", json!({}));
        assert_eq!(p["blocked"], json!([]));
        assert_eq!(p["failing"], json!([]));
    }

    #[test]
    fn whoami_and_nonce() {
        let mut s = sled();
        let w = ok(&mut s, "whoami", json!({}));
        assert_eq!(
            w,
            json!({"project":"beta","sled":"beta-sled","seed":7,"fence_high_water":null})
        );
        // No arguments at all is fine too.
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":3,"method":"tools/call",
                   "params":{"name":"whoami","_meta":{"sled-sim/nonce":"n-42","progressToken":1}}}),
        );
        assert_eq!(
            r["result"]["_meta"],
            json!({"sled-sim/nonce":"n-42","sled-sim/project":"beta"})
        );
        // Errors in tools echo it too.
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":3,"method":"tools/call",
                   "params":{"name":"show","arguments":{},"_meta":{"sled-sim/nonce":{"n":1}}}}),
        );
        assert_eq!(r["result"]["isError"], true);
        assert_eq!(r["result"]["_meta"]["sled-sim/nonce"], json!({"n":1}));
        // And without the nonce, no _meta.
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","_meta":{}}}),
        );
        assert!(r["result"].get("_meta").is_none());
    }

    #[test]
    fn shared_sled_notifies_tool_changes() {
        let shared = SharedSled::new(Sled::seeded("gamma", 3));
        assert_eq!(shared.project_name(), "gamma");
        let mut rx = shared.subscribe_tools_changed();
        assert!(!rx.has_changed().unwrap());
        assert!(shared.set_tool_enabled("show", false));
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert!(!shared.set_tool_enabled("show", false));
        assert!(!rx.has_changed().unwrap());
        let n = shared.with(|s| s.tools().len());
        assert_eq!(n, 13);
    }

    fn run_tests_call(id: u64, task: Option<Value>) -> Value {
        let mut params = json!({"name": RUN_TESTS_TOOL, "arguments": {"suite": "unit"},
            "_meta": {"progressToken": "tok"}});
        if let Some(task) = task {
            params["task"] = task;
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    }

    #[test]
    fn run_tests_may_run_as_a_task_and_names_its_project_and_suite() {
        let def = tool_definition(RUN_TESTS_TOOL).unwrap();
        assert_eq!(def["execution"]["taskSupport"], "optional");
        assert_eq!(def["annotations"]["readOnlyHint"], true);
        assert!(tool_definition("show").unwrap().get("execution").is_none());
        let mut s = sled();
        let r = rpc(&mut s, run_tests_call(1, None));
        let c = &r["result"]["structuredContent"];
        assert_eq!(c["project"], "beta");
        assert_eq!(c["suite"], "unit");
        let (passed, failed) = test_outcome(7, "beta", "unit");
        assert_eq!(
            (c["passed"].as_u64(), c["failed"].as_u64()),
            (Some(passed), Some(failed))
        );
        assert_ne!(
            test_outcome(7, "beta", "unit"),
            test_outcome(7, "gamma", "unit")
        );
        // A task-augmented call to a tool that does not support tasks: -32601.
        let r = rpc(
            &mut s,
            json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
                "params":{"name":"whoami","task":{"ttl":1000}}}),
        );
        assert_eq!(r["error"]["code"], codes::METHOD_NOT_FOUND);
        // Durations come from the seed, within the configured range.
        let mut a = Sled::seeded("beta", 3);
        let mut b = Sled::seeded("beta", 3);
        let da: Vec<Duration> = (0..5).map(|_| a.run_tests_duration()).collect();
        let db: Vec<Duration> = (0..5).map(|_| b.run_tests_duration()).collect();
        assert_eq!(da, db);
        assert!(da
            .iter()
            .all(|d| (200..=2000).contains(&(d.as_millis() as u64))));
    }

    #[tokio::test(start_paused = true)]
    async fn shared_sled_runs_run_tests_as_a_task() {
        let sled = sled().with_config(SledConfig {
            run_tests_ms: (1000, 1000),
            task_ids: TaskIds::Counter,
            ..SledConfig::default()
        });
        let shared = SharedSled::new(sled);
        let mut notices = shared.subscribe_notices();
        let start = tokio::time::Instant::now();
        let created = shared
            .handle_async(&run_tests_call(1, Some(json!({"ttl": 60_000}))), None)
            .expect("run_tests is answered asynchronously")
            .await
            .unwrap();
        assert_eq!(created["result"]["task"]["taskId"], "t1");
        assert_eq!(created["result"]["task"]["status"], "working");
        assert_eq!(start.elapsed(), Duration::ZERO);
        let ask = |id: u64, method: &str| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"taskId": "t1"}});
        let got = shared
            .handle_async(&ask(2, "tasks/get"), None)
            .unwrap()
            .await
            .unwrap();
        assert_eq!(got["result"]["status"], "working");
        let result = shared
            .handle_async(&ask(3, "tasks/result"), None)
            .unwrap()
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(result["result"]["structuredContent"]["project"], "beta");
        assert_eq!(result["result"]["structuredContent"]["suite"], "unit");
        assert_eq!(
            result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
            "t1"
        );
        let mut progress = 0;
        let mut statuses = Vec::new();
        while let Ok(n) = notices.try_recv() {
            let n: Value = serde_json::from_str(&n).unwrap();
            match n["method"].as_str() {
                Some("notifications/progress") => {
                    assert_eq!(n["params"]["progressToken"], "tok");
                    progress += 1;
                }
                Some("notifications/tasks/status") => statuses.push(n["params"]["status"].clone()),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(progress, RUN_TESTS_STEPS);
        assert_eq!(statuses, [json!("completed")]);
        // A plain call runs for its duration and answers the result itself.
        let start = tokio::time::Instant::now();
        let plain = shared
            .handle_async(&run_tests_call(4, None), None)
            .unwrap()
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(plain["result"]["structuredContent"]["suite"], "unit");
        assert!(plain["result"].get("task").is_none());
        // Anything else is the synchronous path's.
        assert!(shared
            .handle_async(&json!({"jsonrpc":"2.0","id":5,"method":"tools/list"}), None)
            .is_none());
    }
}

#[cfg(test)]
mod resource_tests {
    use super::*;

    fn rpc(sled: &mut Sled, method: &str, params: Value) -> Value {
        sled.handle(&json!({"jsonrpc":"2.0","id":1,"method":method,"params":params}))
            .expect("a request is answered")
    }

    #[test]
    fn stories_are_resources_and_a_prompt_names_its_project() {
        let mut sled = Sled::new(Project::new("beta"), "beta", 0);
        let created = sled
            .call_tool(
                "create_story",
                Some(&json!({"name":"Fix login","acceptance_criteria":["works"]})),
            )
            .unwrap();
        let id = created["structuredContent"]["story"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let list = rpc(&mut sled, "resources/list", json!({}));
        let uri = format!("story://beta/{id}");
        assert_eq!(list["result"]["resources"][0]["uri"], uri);
        let read = rpc(&mut sled, "resources/read", json!({"uri": uri}));
        let body: Value =
            serde_json::from_str(read["result"]["contents"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(
            (body["project"].as_str(), body["story"]["name"].as_str()),
            (Some("beta"), Some("Fix login"))
        );
        let missing = rpc(
            &mut sled,
            "resources/read",
            json!({"uri": "story://alpha/alpha-1"}),
        );
        assert_eq!(missing["error"]["code"], -32002);
        let prompts = rpc(&mut sled, "prompts/list", json!({}));
        assert_eq!(prompts["result"]["prompts"][0]["name"], "story_brief");
        let got = rpc(
            &mut sled,
            "prompts/get",
            json!({"name":"story_brief","arguments":{"story_id": id}}),
        );
        let text = got["result"]["messages"][0]["content"]["text"]
            .as_str()
            .unwrap();
        assert!(text.starts_with("Project beta: story beta-"), "{text}");
        let bad = rpc(
            &mut sled,
            "prompts/get",
            json!({"name":"story_brief","arguments":{}}),
        );
        assert_eq!(bad["error"]["code"], -32602);
    }

    #[test]
    fn a_subscribed_story_is_updated_when_a_call_changes_it_and_no_other() {
        let mut sled = Sled::new(Project::new("beta"), "beta", 0);
        let make = |sled: &mut Sled, name: &str| {
            let r = rpc(
                sled,
                "tools/call",
                json!({"name":"create_story","arguments":{"name":name,"acceptance_criteria":["x"]}}),
            );
            r["result"]["structuredContent"]["story"]["id"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        let (a, b) = (make(&mut sled, "a"), make(&mut sled, "b"));
        assert!(sled.take_updated().is_empty(), "nothing subscribed yet");
        let uri = format!("story://beta/{a}");
        let r = rpc(&mut sled, "resources/subscribe", json!({"uri": uri}));
        assert_eq!(r["result"], json!({}));
        let add = |sled: &mut Sled, id: &str| {
            rpc(
                sled,
                "tools/call",
                json!({"name":"add_todo","arguments":{"story_id":id,"text":"t"}}),
            )
        };
        add(&mut sled, &b);
        assert!(sled.take_updated().is_empty(), "b is not subscribed");
        add(&mut sled, &a);
        add(&mut sled, &a);
        assert_eq!(sled.take_updated(), vec![uri.clone()], "once until taken");
        rpc(&mut sled, "resources/unsubscribe", json!({"uri": uri}));
        add(&mut sled, &a);
        assert!(sled.take_updated().is_empty());
        let bad = rpc(&mut sled, "resources/subscribe", json!({}));
        assert_eq!(bad["error"]["code"], -32602);
    }
}

#[cfg(test)]
mod fence_tests {
    use super::*;

    /// The tools that write a story, whose `story_id` is leasable.
    const LEASED: [&str; 7] = [
        "update_story",
        "move_story",
        "add_todo",
        "complete_todo",
        "block_story",
        "unblock_story",
        "record_test_result",
    ];

    /// A sled of project beta with stories beta-1 and beta-2.
    fn sled() -> Sled {
        let mut s = Sled::new(Project::new("beta"), "beta", 0);
        for name in ["A", "B"] {
            s.call_tool(
                "create_story",
                Some(&json!({"name": name, "acceptance_criteria": []})),
            )
            .unwrap();
        }
        s
    }

    /// `tools/call` of `name` with `args` under `fence` (`Value::Null`: no fence key).
    fn call(s: &mut Sled, name: &str, args: Value, fence: Value) -> Value {
        let mut params = json!({ "name": name, "arguments": args });
        if !fence.is_null() {
            params["_meta"] = json!({ FENCE_META: fence });
        }
        let resp = s
            .handle(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":params}))
            .unwrap();
        resp.get("result").cloned().unwrap_or(resp)
    }

    fn fence(resource: &str, n: u64) -> Value {
        json!({ "resource": resource, "fence": n })
    }

    fn stage(s: &Sled, id: &str) -> &'static str {
        s.project().story(id).unwrap().stage.as_str()
    }

    fn move_to(s: &mut Sled, id: &str, to: &str, fence: Value) -> Value {
        call(s, "move_story", json!({"story_id": id, "stage": to}), fence)
    }

    #[test]
    fn fenced_writes_are_recorded_and_stale_ones_refused() {
        let mut s = sled();
        // (fence on story:beta-1 or none, stage asked, refused with this highest, stage after)
        for (given, to, refused_by, after) in [
            (Some(5), "in_progress", None, "in_progress"),
            // One holder writes several times under one fence.
            (Some(5), "review", None, "review"),
            // An evicted holder's late write: nothing changes.
            (Some(4), "done", Some(5), "review"),
            (Some(8), "done", None, "done"),
            (Some(5), "backlog", Some(8), "done"),
            // Unfenced: the gateway decided nobody holds a live lease.
            (None, "backlog", None, "backlog"),
            (Some(8), "in_progress", None, "in_progress"),
        ] {
            let f = given.map_or(Value::Null, |n| fence("story:beta-1", n));
            let r = move_to(&mut s, "beta-1", to, f);
            match refused_by {
                None => assert_eq!(r.get("isError"), None, "{given:?} {to}: {r}"),
                Some(highest) => {
                    assert_eq!(r["isError"], true, "{r}");
                    assert_eq!(
                        r["structuredContent"],
                        json!({"kind": "stale_fence", "resource": "story:beta-1",
                               "fence": given, "highest": highest, "project": "beta"})
                    );
                    let text = r["content"][0]["text"].as_str().unwrap();
                    assert!(text.contains("lease on story:beta-1 was lost"), "{text}");
                    assert!(text.contains("a newer holder has written"), "{text}");
                }
            }
            assert_eq!(stage(&s, "beta-1"), after, "{given:?} {to}");
        }
        assert_eq!(s.fences().highest("story:beta-1"), Some(8));
        assert_eq!(s.fence_high_water(), Some(8));
    }

    #[test]
    fn fences_are_per_resource_and_the_high_water_mark_spans_them() {
        let mut s = sled();
        assert_eq!(s.fence_high_water(), None);
        let r = move_to(&mut s, "beta-1", "review", fence("story:beta-1", 9));
        assert_eq!(r.get("isError"), None, "{r}");
        // A lower fence on another story is its own business.
        let r = move_to(&mut s, "beta-2", "review", fence("story:beta-2", 3));
        assert_eq!(r.get("isError"), None, "{r}");
        assert_eq!(
            (
                s.fences().highest("story:beta-1"),
                s.fences().highest("story:beta-2"),
                s.fence_high_water()
            ),
            (Some(9), Some(3), Some(9))
        );
    }

    #[test]
    fn a_fence_for_another_resource_is_refused() {
        let mut s = sled();
        move_to(&mut s, "beta-2", "review", fence("story:beta-2", 2));
        let r = move_to(&mut s, "beta-2", "done", fence("story:beta-1", 7));
        assert_eq!(r["isError"], true, "{r}");
        assert_eq!(
            r["structuredContent"],
            json!({"kind": "fence_mismatch", "resource": "story:beta-2",
                   "fence_resource": "story:beta-1", "fence": 7, "highest": 2,
                   "project": "beta"})
        );
        assert_eq!(stage(&s, "beta-2"), "review");
        // Nothing recorded for either resource.
        assert_eq!(s.fences().highest("story:beta-1"), None);
        assert_eq!(s.fence_high_water(), Some(2));
    }

    #[test]
    fn every_writing_tool_is_checked() {
        let mut s = sled();
        for (tool, args) in [
            ("update_story", json!({"story_id": "beta-1", "name": "A2"})),
            ("move_story", json!({"story_id": "beta-1", "stage": "done"})),
            ("add_todo", json!({"story_id": "beta-1", "text": "t"})),
            ("complete_todo", json!({"story_id": "beta-1", "todo_id": 1})),
            ("block_story", json!({"story_id": "beta-1", "reason": "r"})),
            ("unblock_story", json!({"story_id": "beta-1"})),
            (
                "record_test_result",
                json!({"story_id": "beta-1", "test": "t", "passed": false}),
            ),
        ] {
            let r = call(&mut s, tool, args.clone(), fence("story:beta-1", 10));
            assert_eq!(r.get("isError"), None, "{tool}: {r}");
            let before = s.project().clone();
            let r = call(&mut s, tool, args, fence("story:beta-1", 9));
            assert_eq!(r["structuredContent"]["kind"], "stale_fence", "{tool}: {r}");
            assert_eq!(
                s.project(),
                &before,
                "{tool} changed the story when refused"
            );
        }
        // The leased tools are exactly the writing ones that name a story.
        let writing: Vec<&str> = TOOL_NAMES
            .into_iter()
            .filter(|t| tool_definition(t).unwrap()["annotations"]["readOnlyHint"] == false)
            .filter(|t| *t != "create_story")
            .collect();
        assert_eq!(writing, LEASED);
    }

    #[test]
    fn read_only_tools_and_create_story_ignore_fences() {
        let mut s = sled();
        move_to(&mut s, "beta-1", "review", fence("story:beta-1", 9));
        for (tool, args) in [
            ("show", json!({"story_id": "beta-1"})),
            ("get_story_todos", json!({"story_id": "beta-1"})),
            ("list_stories", json!({})),
            ("pipeline_status", json!({})),
            ("whoami", json!({})),
            (
                "create_story",
                json!({"name": "C", "acceptance_criteria": []}),
            ),
        ] {
            // A stale fence, and one naming another resource: neither matters to a read.
            for f in [fence("story:beta-1", 1), fence("story:beta-2", 1)] {
                let r = call(&mut s, tool, args.clone(), f);
                assert_eq!(r.get("isError"), None, "{tool}: {r}");
            }
        }
        assert_eq!(s.fences().highest("story:beta-2"), None);
        assert_eq!(s.fence_high_water(), Some(9));
    }

    #[test]
    fn a_malformed_fence_is_invalid_params() {
        let mut s = sled();
        for bad in [
            json!(7),
            json!({"resource": "story:beta-1"}),
            json!({"fence": 3}),
            json!({"resource": "story:beta-1", "fence": -1}),
            json!({"resource": 1, "fence": 3}),
        ] {
            let r = move_to(&mut s, "beta-1", "done", bad.clone());
            assert_eq!(r["error"]["code"], codes::INVALID_PARAMS, "{bad}: {r}");
        }
        assert_eq!(stage(&s, "beta-1"), "backlog");
    }

    #[test]
    fn tools_list_declares_the_lease_exactly_on_the_writing_tools_story_id() {
        let mut s = sled();
        let r = s
            .handle(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
            .unwrap();
        let mut leased = Vec::new();
        for tool in r["result"]["tools"].as_array().unwrap() {
            let name = tool["name"].as_str().unwrap();
            for (prop, schema) in tool["inputSchema"]["properties"].as_object().unwrap() {
                if let Some(kind) = schema.get(LEASE_KEYWORD) {
                    assert_eq!((prop.as_str(), kind), ("story_id", &json!("story")));
                    leased.push(name);
                }
            }
        }
        assert_eq!(leased, LEASED);
        assert_eq!(LEASE_KEYWORD, "x-mcp-gateway-lease");
        assert_eq!(FENCE_META, "io.mcp-gateway/fence");
    }

    #[test]
    fn the_fence_table_is_kept_by_the_shared_sled() {
        let shared = SharedSled::new(sled());
        assert_eq!(shared.fence_high_water(), None);
        let r = shared
            .handle(
                &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
                "name": "add_todo", "arguments": {"story_id": "beta-2", "text": "t"},
                "_meta": {FENCE_META: fence("story:beta-2", 4), NONCE_KEY: "n"}}}),
            )
            .unwrap();
        assert_eq!(r["result"]["_meta"][NONCE_KEY], "n");
        assert_eq!(shared.fence_high_water(), Some(4));
        // A refusal echoes the nonce too.
        let r = shared
            .handle(
                &json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
                "name": "add_todo", "arguments": {"story_id": "beta-2", "text": "t"},
                "_meta": {FENCE_META: fence("story:beta-2", 3), NONCE_KEY: "m"}}}),
            )
            .unwrap();
        assert_eq!(r["result"]["isError"], true);
        assert_eq!(r["result"]["_meta"][NONCE_KEY], "m");
    }

    #[test]
    fn the_trace_context_of_each_request_is_kept_latest_last() {
        let shared = SharedSled::new(sled());
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        shared.handle(
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name": "list_stories", "_meta": {"traceparent": parent, "tracestate": "v=1"}}}),
        );
        // Without a traceparent nothing is kept.
        shared.handle(
            &json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{
            "_meta": {"tracestate": "v=2"}}}),
        );
        let got = shared.traces_received();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].method, "tools/call");
        assert_eq!(got[0].trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(got[0].parent_span_id(), Some("00f067aa0ba902b7"));
        assert_eq!(got[0].tracestate.as_deref(), Some("v=1"));
        for i in 0..TRACES_KEPT {
            let tp = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{:016x}-01", i + 1);
            shared.handle(&json!({"jsonrpc":"2.0","id":i,"method":"ping","params":{
                "_meta": {"traceparent": tp}}}));
        }
        let got = shared.traces_received();
        assert_eq!(got.len(), TRACES_KEPT);
        assert_eq!(got[0].parent_span_id(), Some("0000000000000001"));
        assert_eq!(
            got[TRACES_KEPT - 1].parent_span_id(),
            Some(format!("{TRACES_KEPT:016x}").as_str())
        );
    }
}
