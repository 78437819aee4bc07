//! The conformance fixture: a second kind of sled that serves, behind an uplink, the tools,
//! resources, prompts and completions the official MCP conformance suite
//! (npm `@modelcontextprotocol/conformance`) calls, as its reference "everything" server does.
//!
//! Tools that talk to the client during the call do it over the uplink through their
//! [`CallContext`]: `test_tool_with_progress` sends `notifications/progress` under the
//! gateway's token, `test_tool_with_logging` sends `notifications/message` naming the call in
//! `_meta["io.mcp-gateway/relatedRequest"]`, and the sampling and elicitation tools send
//! `sampling/createMessage` / `elicitation/create` requests up the uplink and wait for the
//! answer (an error answer, or none in time, makes an `isError` result that says why).
//!
//! Select it per project with `SledOptions::fixture_projects` (or `sled-sim --fixture-project`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{json, Map, Value};
use tokio::time::sleep;

use crate::mcp::{codes, error_response, LATEST_PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS};
use crate::uplink::{CallContext, Handler};

/// A 1×1 red PNG.
pub const TEST_IMAGE_BASE64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A WAV file of one silent 16-bit sample at 8 kHz.
pub const TEST_AUDIO_BASE64: &str =
    "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAAAAA==";
/// The JSON Schema dialect of `json_schema_2020_12_tool`'s input schema.
pub const JSON_SCHEMA_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";
/// How long a tool waits for the client's answer to its sampling or elicitation request.
pub const CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// The pause between two of a tool's progress or log notifications.
pub const STEP: Duration = Duration::from_millis(50);
/// The `logger` of the fixture's log messages.
pub const LOGGER: &str = "conformance-fixture";

/// The fixture's tools, in `tools/list` order.
pub const TOOL_NAMES: [&str; 15] = [
    "test_simple_text",
    "test_image_content",
    "test_audio_content",
    "test_embedded_resource",
    "test_multiple_content_types",
    "test_tool_with_logging",
    "test_tool_with_progress",
    "test_error_handling",
    "test_reconnection",
    "test_sampling",
    "test_elicitation",
    "test_elicitation_sep1034_defaults",
    "test_elicitation_sep1330_enums",
    "json_schema_2020_12_tool",
    "whoami",
];

/// The conformance fixture of one project.
#[derive(Debug)]
pub struct Fixture {
    project: String,
    subscriptions: Mutex<BTreeSet<String>>,
}

fn no_arguments() -> Value {
    json!({"type": "object", "properties": {}})
}

fn one_string(name: &str, description: &str) -> Value {
    json!({
        "type": "object",
        "properties": {name: {"type": "string", "description": description}},
        "required": [name],
    })
}

fn text(t: impl Into<String>) -> Value {
    json!({"type": "text", "text": t.into()})
}

fn text_result(t: impl Into<String>) -> Value {
    json!({"content": [text(t)]})
}

fn error_result(t: impl Into<String>) -> Value {
    json!({"content": [text(t)], "isError": true})
}

/// The definition of one of the fixture's tools.
pub fn tool_definition(name: &str) -> Option<Value> {
    let (description, schema) = match name {
        "test_simple_text" => ("Returns simple text content", no_arguments()),
        "test_image_content" => ("Returns image content (a 1x1 PNG)", no_arguments()),
        "test_audio_content" => ("Returns audio content (a tiny WAV)", no_arguments()),
        "test_embedded_resource" => ("Returns an embedded text resource", no_arguments()),
        "test_multiple_content_types" => (
            "Returns text, image and resource content together",
            no_arguments(),
        ),
        "test_tool_with_logging" => (
            "Sends three log messages while it runs, 50 ms apart",
            no_arguments(),
        ),
        "test_tool_with_progress" => (
            "Reports progress 0, 50 and 100 of 100, 50 ms apart, when asked for progress",
            no_arguments(),
        ),
        "test_error_handling" => ("Always fails with an isError result", no_arguments()),
        "test_reconnection" => (
            "Waits 100 ms, then answers (the SSE reconnection test's tool)",
            no_arguments(),
        ),
        "test_sampling" => (
            "Asks the client for an LLM completion of `prompt` (sampling/createMessage)",
            one_string("prompt", "The prompt to send to the LLM"),
        ),
        "test_elicitation" => (
            "Asks the user for a username and an email (elicitation/create)",
            one_string("message", "The message to show the user"),
        ),
        "test_elicitation_sep1034_defaults" => (
            "Elicits a form whose fields have defaults of every primitive type (SEP-1034)",
            no_arguments(),
        ),
        "test_elicitation_sep1330_enums" => (
            "Elicits a form with the five enum schema variants (SEP-1330)",
            no_arguments(),
        ),
        "json_schema_2020_12_tool" => (
            "Tool with JSON Schema 2020-12 features ($schema, $defs, additionalProperties)",
            json!({
                "$schema": JSON_SCHEMA_2020_12,
                "type": "object",
                "$defs": {
                    "address": {
                        "type": "object",
                        "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                    },
                },
                "properties": {
                    "name": {"type": "string"},
                    "address": {"$ref": "#/$defs/address"},
                },
                "additionalProperties": false,
            }),
        ),
        "whoami" => (
            "Names the project and sled serving this call",
            no_arguments(),
        ),
        _ => return None,
    };
    Some(json!({"name": name, "description": description, "inputSchema": schema}))
}

/// The fixture's static resources.
fn resources() -> Value {
    json!([
        {
            "uri": "test://static-text",
            "name": "static-text",
            "title": "Static Text Resource",
            "description": "A static text resource for testing",
            "mimeType": "text/plain",
        },
        {
            "uri": "test://static-binary",
            "name": "static-binary",
            "title": "Static Binary Resource",
            "description": "A static binary resource (a PNG) for testing",
            "mimeType": "image/png",
        },
        {
            "uri": "test://watched-resource",
            "name": "watched-resource",
            "title": "Watched Resource",
            "description": "A resource to subscribe to",
            "mimeType": "text/plain",
        },
    ])
}

fn resource_templates() -> Value {
    json!([{
        "uriTemplate": "test://template/{id}/data",
        "name": "template",
        "title": "Resource Template",
        "description": "A resource template with parameter substitution",
        "mimeType": "application/json",
    }])
}

fn prompts() -> Value {
    json!([
        {
            "name": "test_simple_prompt",
            "title": "Simple Test Prompt",
            "description": "A simple prompt without arguments",
        },
        {
            "name": "test_prompt_with_arguments",
            "title": "Prompt With Arguments",
            "description": "A prompt with required arguments",
            "arguments": [
                {"name": "arg1", "description": "First test argument", "required": true},
                {"name": "arg2", "description": "Second test argument", "required": true},
            ],
        },
        {
            "name": "test_prompt_with_embedded_resource",
            "title": "Prompt With Embedded Resource",
            "description": "A prompt that includes an embedded resource",
            "arguments": [
                {"name": "resourceUri", "description": "URI of the resource to embed", "required": true},
            ],
        },
        {
            "name": "test_prompt_with_image",
            "title": "Prompt With Image",
            "description": "A prompt that includes image content",
        },
    ])
}

/// Why a request fails as a JSON-RPC error.
type RpcFailure = (i64, String);

fn invalid_params(message: impl Into<String>) -> RpcFailure {
    (codes::INVALID_PARAMS, message.into())
}

fn string_arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, String> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("argument {name:?} must be a string, got {other}")),
        None => Err(format!("missing required argument {name:?}")),
    }
}

impl Fixture {
    /// The fixture serving `project`.
    pub fn new(project: impl Into<String>) -> Self {
        Fixture {
            project: project.into(),
            subscriptions: Mutex::new(BTreeSet::new()),
        }
    }

    /// The tool definitions, in `tools/list` order.
    pub fn tools() -> Vec<Value> {
        TOOL_NAMES
            .iter()
            .filter_map(|n| tool_definition(n))
            .collect()
    }

    /// The resource URIs subscribed to, sorted.
    pub fn subscriptions(&self) -> Vec<String> {
        self.lock_subscriptions().iter().cloned().collect()
    }

    fn lock_subscriptions(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.subscriptions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Answers one JSON-RPC message: the response, or `None` for a notification or response.
    pub async fn respond(&self, msg: &Value, ctx: &CallContext) -> Option<Value> {
        let obj = msg.as_object()?;
        let method = obj.get("method").and_then(Value::as_str);
        let id = obj.get("id").cloned();
        let (Some(method), Some(id)) = (method, id) else {
            // Notifications and stray responses need no answer.
            return None;
        };
        let empty = Map::new();
        let params = match crate::mcp::params_object(obj, &empty) {
            Ok(p) => p,
            Err((code, message)) => return Some(error_response(id, code, message)),
        };
        let outcome = match method {
            "initialize" => Ok(self.initialize(params)),
            "ping" | "logging/setLevel" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": Fixture::tools()})),
            "tools/call" => self.call(params, ctx).await,
            "resources/list" => Ok(json!({"resources": resources()})),
            "resources/templates/list" => Ok(json!({"resourceTemplates": resource_templates()})),
            "resources/read" => read_resource(params),
            "resources/subscribe" | "resources/unsubscribe" => {
                match params.get("uri").and_then(Value::as_str) {
                    Some(uri) => {
                        let mut subs = self.lock_subscriptions();
                        if method == "resources/subscribe" {
                            subs.insert(uri.to_owned());
                        } else {
                            subs.remove(uri);
                        }
                        Ok(json!({}))
                    }
                    None => Err(invalid_params(format!("{method} needs a string \"uri\""))),
                }
            }
            "prompts/list" => Ok(json!({"prompts": prompts()})),
            "prompts/get" => get_prompt(params),
            "completion/complete" => Ok(complete(params)),
            other => Err((
                codes::METHOD_NOT_FOUND,
                format!("Method not found: {other}"),
            )),
        };
        Some(match outcome {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => error_response(id, code, message),
        })
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
                "tools": {"listChanged": true},
                "resources": {"subscribe": true, "listChanged": true},
                "prompts": {"listChanged": true},
                "logging": {},
                "completions": {},
            },
            "serverInfo": {"name": "sled-sim-fixture", "version": env!("CARGO_PKG_VERSION")},
            "instructions": format!("The conformance fixture, serving project {:?}.", self.project),
        })
    }

    async fn call(
        &self,
        params: &Map<String, Value>,
        ctx: &CallContext,
    ) -> Result<Value, RpcFailure> {
        let name = match params.get("name") {
            Some(Value::String(n)) => n.as_str(),
            _ => return Err(invalid_params("tools/call needs a string \"name\"")),
        };
        let empty = Map::new();
        let args = match params.get("arguments") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(a)) => a,
            Some(other) => {
                return Ok(error_result(format!(
                    "arguments must be an object, got {other}"
                )))
            }
        };
        let result = match name {
            "test_simple_text" => text_result("This is a simple text response for testing."),
            "test_image_content" => json!({"content": [
                {"type": "image", "data": TEST_IMAGE_BASE64, "mimeType": "image/png"},
            ]}),
            "test_audio_content" => json!({"content": [
                {"type": "audio", "data": TEST_AUDIO_BASE64, "mimeType": "audio/wav"},
            ]}),
            "test_embedded_resource" => json!({"content": [{
                "type": "resource",
                "resource": {
                    "uri": "test://embedded-resource",
                    "mimeType": "text/plain",
                    "text": "This is an embedded resource content.",
                },
            }]}),
            "test_multiple_content_types" => json!({"content": [
                text("Multiple content types test:"),
                {"type": "image", "data": TEST_IMAGE_BASE64, "mimeType": "image/png"},
                {
                    "type": "resource",
                    "resource": {
                        "uri": "test://mixed-content-resource",
                        "mimeType": "application/json",
                        "text": json!({"test": "data", "value": 123}).to_string(),
                    },
                },
            ]}),
            "test_tool_with_logging" => {
                ctx.log("info", LOGGER, json!("Tool execution started"));
                sleep(STEP).await;
                ctx.log("info", LOGGER, json!("Tool processing data"));
                sleep(STEP).await;
                ctx.log("info", LOGGER, json!("Tool execution completed"));
                text_result("Tool with logging executed successfully")
            }
            "test_tool_with_progress" => {
                for (i, step) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if i > 0 {
                        sleep(STEP).await;
                    }
                    let message = format!("Completed step {step} of 100");
                    ctx.progress(step, Some(100.0), Some(&message));
                }
                match ctx.progress_token() {
                    Some(token) => text_result(format!("Progress reported under token {token}")),
                    None => text_result("Done (no progress token was given)"),
                }
            }
            "test_error_handling" => {
                error_result("This tool intentionally returns an error for testing")
            }
            "test_reconnection" => {
                sleep(2 * STEP).await;
                text_result("Reconnection test completed successfully.")
            }
            "test_sampling" => match string_arg(args, "prompt") {
                Err(e) => error_result(e),
                Ok(prompt) => {
                    let request = json!({
                        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
                        "maxTokens": 100,
                    });
                    match ctx
                        .request("sampling/createMessage", request, CLIENT_REQUEST_TIMEOUT)
                        .await
                    {
                        Ok(answer) => {
                            let reply = answer
                                .pointer("/content/text")
                                .and_then(Value::as_str)
                                .unwrap_or("(no text)");
                            text_result(format!("LLM response: {reply}"))
                        }
                        Err(e) => error_result(format!("sampling/createMessage failed: {e}")),
                    }
                }
            },
            "test_elicitation" => match string_arg(args, "message") {
                Err(e) => error_result(e),
                Ok(message) => {
                    let schema = json!({
                        "type": "object",
                        "properties": {
                            "username": {"type": "string", "description": "User's response"},
                            "email": {"type": "string", "description": "User's email address"},
                        },
                        "required": ["username", "email"],
                    });
                    elicit(ctx, message, schema, "User response").await
                }
            },
            "test_elicitation_sep1034_defaults" => {
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "User name", "default": "John Doe"},
                        "age": {"type": "integer", "description": "User age", "default": 30},
                        "score": {"type": "number", "description": "User score", "default": 95.5},
                        "status": {
                            "type": "string",
                            "description": "User status",
                            "enum": ["active", "inactive", "pending"],
                            "default": "active",
                        },
                        "verified": {"type": "boolean", "description": "Verification status", "default": true},
                    },
                    "required": [],
                });
                let message = "Please review and update the form fields with defaults";
                elicit(ctx, message, schema, "Elicitation completed").await
            }
            "test_elicitation_sep1330_enums" => {
                let titled = |word: &str| {
                    json!([
                        {"const": "value1", "title": format!("First {word}")},
                        {"const": "value2", "title": format!("Second {word}")},
                        {"const": "value3", "title": format!("Third {word}")},
                    ])
                };
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "untitledSingle": {
                            "type": "string",
                            "description": "Select one option",
                            "enum": ["option1", "option2", "option3"],
                        },
                        "titledSingle": {
                            "type": "string",
                            "description": "Select one option with titles",
                            "oneOf": titled("Option"),
                        },
                        "legacyEnum": {
                            "type": "string",
                            "description": "Select one option (legacy)",
                            "enum": ["opt1", "opt2", "opt3"],
                            "enumNames": ["Option One", "Option Two", "Option Three"],
                        },
                        "untitledMulti": {
                            "type": "array",
                            "description": "Select multiple options",
                            "minItems": 1,
                            "maxItems": 3,
                            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                        },
                        "titledMulti": {
                            "type": "array",
                            "description": "Select multiple options with titles",
                            "minItems": 1,
                            "maxItems": 3,
                            "items": {"anyOf": titled("Choice")},
                        },
                    },
                    "required": [],
                });
                let message = "Please select options from the enum fields";
                elicit(ctx, message, schema, "Elicitation completed").await
            }
            "json_schema_2020_12_tool" => text_result(format!(
                "JSON Schema 2020-12 tool called with: {}",
                Value::Object(args.clone())
            )),
            "whoami" => json!({
                "content": [text(format!("project {}, the conformance fixture", self.project))],
                "structuredContent": {"project": self.project, "sled": "fixture"},
            }),
            other => {
                return Err(invalid_params(format!(
                    "Unknown tool: {other}; this fixture serves {}",
                    TOOL_NAMES.join(", ")
                )))
            }
        };
        Ok(result)
    }
}

/// Sends `elicitation/create` and describes the answer as `"{label}: action=…, content=…"`.
async fn elicit(ctx: &CallContext, message: &str, schema: Value, label: &str) -> Value {
    let request = json!({"mode": "form", "message": message, "requestedSchema": schema});
    match ctx
        .request("elicitation/create", request, CLIENT_REQUEST_TIMEOUT)
        .await
    {
        Ok(answer) => {
            let action = answer
                .get("action")
                .and_then(Value::as_str)
                .unwrap_or("(none)");
            let content = answer.get("content").cloned().unwrap_or_else(|| json!({}));
            text_result(format!("{label}: action={action}, content={content}"))
        }
        Err(e) => error_result(format!("elicitation/create failed: {e}")),
    }
}

fn read_resource(params: &Map<String, Value>) -> Result<Value, RpcFailure> {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Err(invalid_params("resources/read needs a string \"uri\""));
    };
    let content = match uri {
        "test://static-text" => json!({
            "uri": uri, "mimeType": "text/plain",
            "text": "This is the content of the static text resource.",
        }),
        "test://static-binary" => {
            json!({"uri": uri, "mimeType": "image/png", "blob": TEST_IMAGE_BASE64})
        }
        "test://watched-resource" => json!({
            "uri": uri, "mimeType": "text/plain", "text": "Watched resource content",
        }),
        _ => match uri
            .strip_prefix("test://template/")
            .and_then(|rest| rest.strip_suffix("/data"))
            .filter(|id| !id.is_empty() && !id.contains('/'))
        {
            Some(id) => json!({
                "uri": uri,
                "mimeType": "application/json",
                "text": json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")}).to_string(),
            }),
            // -32002 is MCP's "resource not found".
            None => return Err((-32002, format!("Resource not found: {uri}"))),
        },
    };
    Ok(json!({"contents": [content]}))
}

fn get_prompt(params: &Map<String, Value>) -> Result<Value, RpcFailure> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err(invalid_params("prompts/get needs a string \"name\""));
    };
    let empty = Map::new();
    let args = params
        .get("arguments")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let arg = |n: &str| string_arg(args, n).map_err(invalid_params);
    let user = |content: Value| json!({"role": "user", "content": content});
    let messages = match name {
        "test_simple_prompt" => vec![user(text("This is a simple prompt for testing."))],
        "test_prompt_with_arguments" => {
            let (a, b) = (arg("arg1")?, arg("arg2")?);
            vec![user(text(format!(
                "Prompt with arguments: arg1='{a}', arg2='{b}'"
            )))]
        }
        "test_prompt_with_embedded_resource" => {
            let uri = arg("resourceUri")?;
            vec![
                user(json!({
                    "type": "resource",
                    "resource": {
                        "uri": uri,
                        "mimeType": "text/plain",
                        "text": "Embedded resource content for testing.",
                    },
                })),
                user(text("Please process the embedded resource above.")),
            ]
        }
        "test_prompt_with_image" => vec![
            user(json!({"type": "image", "data": TEST_IMAGE_BASE64, "mimeType": "image/png"})),
            user(text("Please analyze the image above.")),
        ],
        other => return Err(invalid_params(format!("Unknown prompt: {other}"))),
    };
    Ok(json!({"messages": messages}))
}

/// Completions for `test_prompt_with_arguments`' arguments: the candidates that start with
/// what was typed; none for anything else.
fn complete(params: &Map<String, Value>) -> Value {
    const CANDIDATES: [&str; 5] = ["paris", "park", "party", "test", "testing"];
    let prompt = prompt_ref(params);
    let typed = params
        .get("argument")
        .and_then(|a| a.get("value"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let values: Vec<&str> = match prompt {
        Some("test_prompt_with_arguments") => CANDIDATES
            .into_iter()
            .filter(|c| c.starts_with(typed))
            .collect(),
        _ => Vec::new(),
    };
    json!({"completion": {"values": values, "total": values.len(), "hasMore": false}})
}

/// `params.ref.name` of a `completion/complete` for a prompt.
fn prompt_ref(params: &Map<String, Value>) -> Option<&str> {
    let r = params.get("ref")?;
    if r.get("type").and_then(Value::as_str) != Some("ref/prompt") {
        return None;
    }
    r.get("name").and_then(Value::as_str)
}

impl Handler for Fixture {
    fn project_name(&self) -> &str {
        &self.project
    }

    fn handle(self: Arc<Self>, msg: Value, ctx: CallContext) -> BoxFuture<'static, Option<Value>> {
        Box::pin(async move { self.respond(&msg, &ctx).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_a_definition_with_a_valid_name() {
        let tools = Fixture::tools();
        assert_eq!(tools.len(), TOOL_NAMES.len());
        for t in &tools {
            let name = t["name"].as_str().unwrap();
            assert!(
                name.len() <= 128
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            );
            assert!(
                t["description"].is_string() && t["inputSchema"].is_object(),
                "{t}"
            );
        }
        let schema = &tool_definition("json_schema_2020_12_tool").unwrap()["inputSchema"];
        assert_eq!(schema["$schema"], JSON_SCHEMA_2020_12);
        assert_eq!(schema["additionalProperties"], false);
    }

    #[test]
    fn resources_prompts_and_completion() {
        let read = |uri: &str| read_resource(json!({"uri": uri}).as_object().unwrap());
        assert_eq!(
            read("test://static-binary").unwrap()["contents"][0]["blob"],
            TEST_IMAGE_BASE64
        );
        let t = read("test://template/123/data").unwrap();
        assert!(t["contents"][0]["text"].as_str().unwrap().contains("123"));
        assert_eq!(read("test://nope").unwrap_err().0, -32002);
        assert_eq!(read("test://template//data").unwrap_err().0, -32002);

        let get = |p: Value| get_prompt(p.as_object().unwrap());
        let r = get(
            json!({"name": "test_prompt_with_arguments", "arguments": {"arg1": "hello", "arg2": "world"}}),
        );
        assert_eq!(
            r.unwrap()["messages"][0]["content"]["text"],
            "Prompt with arguments: arg1='hello', arg2='world'"
        );
        assert_eq!(
            get(json!({"name": "test_prompt_with_arguments"}))
                .unwrap_err()
                .0,
            codes::INVALID_PARAMS
        );
        assert_eq!(
            get(json!({"name": "nope"})).unwrap_err().0,
            codes::INVALID_PARAMS
        );

        let c = complete(
            json!({"ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"}, "argument": {"name": "arg1", "value": "par"}})
                .as_object()
                .unwrap(),
        );
        assert_eq!(c["completion"]["values"], json!(["paris", "park", "party"]));
        let none = complete(
            json!({"ref": {"type": "ref/resource", "uri": "x"}})
                .as_object()
                .unwrap(),
        );
        assert_eq!(none["completion"]["values"], json!([]));
    }
}
