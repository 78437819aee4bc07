//! The simulation's sled: the story [`SharedSled`] served as a [`Handler`], with the latency
//! knob of the story backend, a nonce echo on `resources/read` and `prompts/get`, and two tools
//! more: [`SUMMARIZE_TOOL`], that asks the calling client for a sampling mid-call, and
//! [`RUN_CHECKS_TOOL`], that runs for a while and reports progress after each step.
//!
//! `summarize_story` sends `sampling/createMessage` up the uplink (naming the call, so the
//! gateway relays it to the calling session on that call's event stream) with the call's nonce
//! in the prompt text, and puts the client's answer text in its result
//! (`structuredContent.summary`); when the gateway answers with an error instead (-32601 for a
//! client without the `sampling` capability), the result is `isError` with
//! `structuredContent.sampling_error` = `{code, message}`.
//!
//! `run_checks {steps, step_ms}` waits out the latency knob, then `steps` steps of `step_ms`
//! each; after each, when the gateway gave the call a progress token, it sends
//! `notifications/progress` (`step` of `steps`) whose message names the call's nonce
//! ([`check_progress_message`]), so a client can tell its own call's progress from another's.
//! It changes nothing in the project.
//!
//! Both tools change nothing, and their definitions say so (`readOnlyHint: true`), so a caller
//! with only the `read` right on the project may call them ([`read_only`] answers for every
//! tool this sled serves).
//!
//! With a [`SledLog`] ([`SimSled::with_log`]) the sled records every request the gateway sends
//! it (connection, id, method, tool, nonce, the progress token it was given, the caller the
//! gateway named in `_meta["io.mcp-gateway/principal"]`, and when, by the log's clock) and every
//! `notifications/cancelled`, with the request it names, for the simulation's oracle.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use tokio::time::sleep;

use crate::mcp::{SharedSled, NONCE_KEY, PROJECT_META_KEY};
use crate::uplink::{CallContext, Handler, RequestError};

/// The tool that asks the client for a sampling.
pub const SUMMARIZE_TOOL: &str = "summarize_story";

/// How long `summarize_story` waits for the client's answer (the gateway's call deadline
/// cancels it sooner).
pub const SAMPLING_WAIT: Duration = Duration::from_secs(30);

/// The prompt text of the sampling request of the call with `nonce` in `project`.
pub fn sampling_prompt(project: &str, nonce: &str) -> String {
    format!("Summarize for call {nonce} of project {project}")
}

/// The tool that runs for a while, reporting progress after each step.
pub const RUN_CHECKS_TOOL: &str = "run_checks";
/// The most steps `run_checks` takes.
pub const MAX_CHECK_STEPS: u64 = 10;
/// The longest step `run_checks` takes, in milliseconds.
pub const MAX_CHECK_STEP_MS: u64 = 2_000;

/// The message of `run_checks`' progress after `step` of `steps`, on the call with `nonce`.
pub fn check_progress_message(step: u64, steps: u64, nonce: &str) -> String {
    format!("check {step} of {steps} for call {nonce}")
}

/// Where the gateway puts the caller it names to a project that asks (`forward_principal`).
pub const PRINCIPAL_META_KEY: &str = "io.mcp-gateway/principal";

/// Every tool this sled serves, as it lists them: the story sled's, then its own two.
pub fn tool_definitions() -> Vec<Value> {
    crate::mcp::TOOL_NAMES
        .iter()
        .filter_map(|n| crate::mcp::tool_definition(n))
        .chain(SimSled::tool_definitions())
        .collect()
}

/// Whether `tool`, as this sled defines it, is annotated read-only (`readOnlyHint: true`);
/// `None` for a tool it does not serve.
pub fn read_only(tool: &str) -> Option<bool> {
    let definition = SimSled::tool_definitions()
        .into_iter()
        .find(|d| d["name"] == json!(tool))
        .or_else(|| crate::mcp::tool_definition(tool))?;
    Some(definition["annotations"]["readOnlyHint"] == json!(true))
}

/// What one project's simulation sleds received from the gateway, in the order it arrived
/// (every host of the project, its restarts and its twin, writes to the same log). It lives
/// outside the hosts, like the stories, so the oracle reads it after the run.
#[derive(Debug, Clone, Default)]
pub struct SledLog {
    entries: Arc<Mutex<Vec<Received>>>,
    /// Stamps each request ([`Received::Request::at`]); none: every stamp is zero.
    clock: Option<fn() -> Duration>,
}

impl SledLog {
    pub fn new() -> Self {
        SledLog::default()
    }

    /// A log that stamps each request with `clock` (a simulation's clock, shared by its hosts).
    pub fn with_clock(clock: fn() -> Duration) -> Self {
        SledLog {
            entries: Arc::default(),
            clock: Some(clock),
        }
    }

    fn now(&self) -> Duration {
        self.clock.map_or(Duration::ZERO, |c| c())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Received>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends `r`; returns its position.
    fn push(&self, r: Received) -> usize {
        let mut log = self.lock();
        log.push(r);
        log.len() - 1
    }

    /// Everything received so far.
    pub fn entries(&self) -> Vec<Received> {
        self.lock().clone()
    }
}

/// One message a simulation sled received from the gateway.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// A JSON-RPC request.
    Request {
        /// The sled host that received it (as [`SimSled::with_log`] named it).
        sled: String,
        /// The uplink connection it came on ([`CallContext::connection`]).
        connection: u64,
        /// The gateway's id for it.
        id: u64,
        method: String,
        /// `params.name`, for a `tools/call`.
        tool: Option<String>,
        /// `params._meta["sled-sim/nonce"]`: which client request it is.
        nonce: Option<String>,
        /// `params._meta.progressToken`: the progress token the gateway gave the sled.
        progress_token: Option<Value>,
        /// `params._meta["io.mcp-gateway/principal"]`: who the gateway says calls.
        principal: Option<Value>,
        /// When it arrived, by the log's clock ([`SledLog::with_clock`]).
        at: Duration,
    },
    /// A `notifications/cancelled`.
    Cancelled {
        sled: String,
        connection: u64,
        /// `params.requestId` as sent.
        request_id: Value,
        /// `params.reason`.
        reason: Option<String>,
        /// The position in the log of the request it names, received by the same host on the
        /// same connection; `None` when that host received no such request there.
        request: Option<usize>,
    },
}

/// Where a [`SimSled`] records what it receives.
struct Recorder {
    log: SledLog,
    /// The host's name, in every entry.
    sled: String,
    /// This host's requests by (connection, the gateway's id), to their position in the log.
    requests: Mutex<BTreeMap<(u64, u64), usize>>,
}

/// The story sled of one project as a [`Handler`].
pub struct SimSled {
    sled: SharedSled,
    project: String,
    latency: Duration,
    jitter: Duration,
    rng: Mutex<ChaCha8Rng>,
    recorder: Option<Recorder>,
}

impl std::fmt::Debug for SimSled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimSled")
            .field("project", &self.project)
            .field("latency", &self.latency)
            .field("jitter", &self.jitter)
            .finish()
    }
}

impl SimSled {
    /// Serves `sled`; each `tools/call` waits `latency` plus up to `jitter` (drawn from a RNG
    /// seeded with `seed`) before it is applied.
    pub fn new(sled: SharedSled, latency: Duration, jitter: Duration, seed: u64) -> Self {
        SimSled {
            project: sled.project_name().to_owned(),
            sled,
            latency,
            jitter,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            recorder: None,
        }
    }

    /// Records what the sled receives in `log`, naming the host `sled`.
    pub fn with_log(mut self, log: SledLog, sled: impl Into<String>) -> Self {
        self.recorder = Some(Recorder {
            log,
            sled: sled.into(),
            requests: Mutex::new(BTreeMap::new()),
        });
        self
    }

    /// Records a request (anything with a method and a numeric id).
    fn record_request(&self, msg: &Value, connection: u64) {
        let Some(r) = &self.recorder else { return };
        let (Some(id), Some(method)) = (
            msg.get("id").and_then(Value::as_u64),
            msg.get("method").and_then(Value::as_str),
        ) else {
            return;
        };
        let meta = msg.pointer("/params/_meta");
        let at = r.log.push(Received::Request {
            sled: r.sled.clone(),
            connection,
            id,
            method: method.to_owned(),
            tool: msg
                .pointer("/params/name")
                .and_then(Value::as_str)
                .map(str::to_owned),
            nonce: meta
                .and_then(|m| m.get(NONCE_KEY))
                .and_then(Value::as_str)
                .map(str::to_owned),
            progress_token: meta.and_then(|m| m.get("progressToken")).cloned(),
            principal: meta.and_then(|m| m.get(PRINCIPAL_META_KEY)).cloned(),
            at: r.log.now(),
        });
        r.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((connection, id), at);
    }

    fn delay(&self) -> Duration {
        if self.jitter.is_zero() {
            return self.latency;
        }
        let nanos = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        let extra = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .random_range(0..=nanos);
        self.latency.saturating_add(Duration::from_nanos(extra))
    }

    fn tool_definitions() -> [Value; 2] {
        [
            json!({
                "name": SUMMARIZE_TOOL,
                "description": "Summarizes through the client's LLM (sampling/createMessage); changes nothing",
                "inputSchema": {"type": "object", "properties": {}},
                "annotations": {"readOnlyHint": true},
            }),
            json!({
                "name": RUN_CHECKS_TOOL,
                "description": "Runs the project's checks step by step, reporting progress after each step when asked; changes nothing",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "steps": {"type": "integer", "minimum": 1, "maximum": MAX_CHECK_STEPS},
                        "step_ms": {"type": "integer", "minimum": 0, "maximum": MAX_CHECK_STEP_MS},
                    },
                    "required": ["steps", "step_ms"],
                },
                "annotations": {"readOnlyHint": true},
            }),
        ]
    }

    /// `run_checks`: the latency knob's `delay`, then each step, with progress after each when
    /// the call has a progress token.
    async fn run_checks(&self, msg: &Value, ctx: &CallContext, delay: Duration) -> Value {
        let arg = |k: &str| {
            msg.pointer("/params/arguments")
                .and_then(|a| a.get(k))
                .and_then(Value::as_u64)
        };
        let nonce = msg
            .pointer("/params/_meta")
            .and_then(|m| m.get(NONCE_KEY))
            .cloned()
            .unwrap_or(Value::Null);
        let sled = self.sled.sled_name();
        let mut result = match (arg("steps"), arg("step_ms")) {
            (Some(steps @ 1..=MAX_CHECK_STEPS), Some(step_ms @ 0..=MAX_CHECK_STEP_MS)) => {
                sleep(delay).await;
                for step in 1..=steps {
                    sleep(Duration::from_millis(step_ms)).await;
                    let message = check_progress_message(step, steps, nonce.as_str().unwrap_or(""));
                    ctx.progress(step as f64, Some(steps as f64), Some(&message));
                }
                json!({
                    "content": [{"type": "text", "text": format!("{steps} checks passed")}],
                    "structuredContent": {
                        "project": self.project,
                        "sled": sled,
                        "steps": steps,
                        "progress": ctx.progress_token().is_some(),
                    },
                })
            }
            _ => json!({
                "content": [{"type": "text", "text": format!(
                    "run_checks needs steps (1 to {MAX_CHECK_STEPS}) and step_ms (0 to {MAX_CHECK_STEP_MS}), integers"
                )}],
                "isError": true,
            }),
        };
        if !nonce.is_null() {
            result["_meta"] = json!({NONCE_KEY: nonce, PROJECT_META_KEY: self.project});
        }
        json!({"jsonrpc": "2.0", "id": msg["id"], "result": result})
    }

    async fn summarize(&self, msg: &Value, ctx: &CallContext) -> Value {
        let nonce = msg
            .pointer("/params/_meta")
            .and_then(|m| m.get(NONCE_KEY))
            .cloned()
            .unwrap_or(Value::Null);
        let request = json!({
            "messages": [{"role": "user", "content": {
                "type": "text",
                "text": sampling_prompt(&self.project, nonce.as_str().unwrap_or("")),
            }}],
            "maxTokens": 64,
        });
        let sled = self.sled.sled_name();
        let mut result = match ctx
            .request("sampling/createMessage", request, SAMPLING_WAIT)
            .await
        {
            Ok(r) => {
                let text = r.pointer("/content/text").cloned().unwrap_or(Value::Null);
                json!({
                    "content": [{"type": "text", "text": format!("summary: {text}")}],
                    "structuredContent": {"project": self.project, "sled": sled, "summary": text},
                })
            }
            Err(e) => {
                let (code, message) = match e {
                    RequestError::Rpc { code, message } => (json!(code), message),
                    other => (Value::Null, other.to_string()),
                };
                json!({
                    "content": [{"type": "text", "text": format!("sampling failed: {message}")}],
                    "structuredContent": {
                        "project": self.project,
                        "sled": sled,
                        "sampling_error": {"code": code, "message": message},
                    },
                    "isError": true,
                })
            }
        };
        if !nonce.is_null() {
            result["_meta"] = json!({NONCE_KEY: nonce, PROJECT_META_KEY: self.project});
        }
        json!({"jsonrpc": "2.0", "id": msg["id"], "result": result})
    }

    /// The story sled's answer, with the extra tool listed and the nonce echoed on reads.
    fn story_answer(&self, msg: &Value) -> Option<Value> {
        let mut resp = self.sled.handle(msg)?;
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        let result = resp.get_mut("result").filter(|r| r.is_object());
        match (method, result) {
            ("tools/list", Some(r)) if r.get("nextCursor").is_none() => {
                if let Some(tools) = r["tools"].as_array_mut() {
                    tools.extend(Self::tool_definitions());
                }
            }
            ("resources/read" | "prompts/get", Some(r)) => {
                if let Some(nonce) = msg.pointer("/params/_meta").and_then(|m| m.get(NONCE_KEY)) {
                    r["_meta"] = json!({NONCE_KEY: nonce, PROJECT_META_KEY: self.project});
                }
            }
            _ => {}
        }
        Some(resp)
    }
}

impl Handler for SimSled {
    fn project_name(&self) -> &str {
        &self.project
    }

    fn handle(self: Arc<Self>, msg: Value, ctx: CallContext) -> BoxFuture<'static, Option<Value>> {
        self.record_request(&msg, ctx.connection());
        let is_call = msg.get("method").and_then(Value::as_str) == Some("tools/call")
            && msg.get("id").is_some();
        // Drawn now, in the order the requests arrive, so the run stays deterministic.
        let delay = if is_call {
            self.delay()
        } else {
            Duration::ZERO
        };
        // run_tests (with its own seeded duration, as a plain call or a task) and tasks/*:
        // the story sled's own asynchronous answers, as its uplink gives them.
        if let Some(answer) = self.sled.handle_async(&msg, Some(&ctx)) {
            return answer;
        }
        Box::pin(async move {
            if is_call && msg.pointer("/params/name") == Some(&json!(RUN_CHECKS_TOOL)) {
                return Some(self.run_checks(&msg, &ctx, delay).await);
            }
            if !delay.is_zero() {
                // A call that asked for progress hears of it halfway through.
                if ctx.progress_token().is_some() {
                    sleep(delay / 2).await;
                    ctx.progress(1.0, Some(2.0), Some("working"));
                    sleep(delay - delay / 2).await;
                } else {
                    sleep(delay).await;
                }
            }
            if is_call && msg.pointer("/params/name") == Some(&json!(SUMMARIZE_TOOL)) {
                return Some(self.summarize(&msg, &ctx).await);
            }
            self.story_answer(&msg)
        })
    }

    fn fence_high_water(&self) -> Option<u64> {
        self.sled.fence_high_water()
    }

    /// The story sled's own notifications: its tasks' status changes (and their progress once
    /// the connection of the call that made them is gone), and what it is told to announce.
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(self.sled.subscribe_notices())
    }

    fn cancelled(&self, connection: u64, params: &Value) {
        let Some(r) = &self.recorder else { return };
        let request_id = params.get("requestId").cloned().unwrap_or(Value::Null);
        let request = request_id.as_u64().and_then(|id| {
            r.requests
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&(connection, id))
                .copied()
        });
        r.log.push(Received::Cancelled {
            sled: r.sled.clone(),
            connection,
            request_id,
            reason: params
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_owned),
            request,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::Sled;
    use crate::model::Project;

    #[test]
    fn says_which_tools_only_read() {
        for (tool, want) in [
            ("show", Some(true)),
            ("whoami", Some(true)),
            (RUN_CHECKS_TOOL, Some(true)),
            (SUMMARIZE_TOOL, Some(true)),
            ("create_story", Some(false)),
            ("move_story", Some(false)),
            ("no_such_tool", None),
        ] {
            assert_eq!(read_only(tool), want, "{tool}");
        }
        assert_eq!(tool_definitions().len(), crate::mcp::TOOL_NAMES.len() + 2);
    }

    #[test]
    fn lists_the_extra_tool_and_echoes_nonces_on_reads() {
        let shared = SharedSled::new(Sled::new(Project::new("alpha"), "alpha", 1));
        let sim = SimSled::new(shared.clone(), Duration::ZERO, Duration::ZERO, 1);
        let list = sim
            .story_answer(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}))
            .unwrap();
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert!(names.contains(&SUMMARIZE_TOOL) && names.contains(&"show"));
        let created = shared.handle(&json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
            "params":{"name":"create_story","arguments":{"name":"x","acceptance_criteria":["y"]}}}));
        let id = created.unwrap()["result"]["structuredContent"]["story"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let read = sim
            .story_answer(&json!({"jsonrpc":"2.0","id":3,"method":"resources/read",
                "params":{"uri": format!("story://alpha/{id}"), "_meta": {NONCE_KEY: "n1"}}}))
            .unwrap();
        assert_eq!(read["result"]["_meta"][NONCE_KEY], "n1");
        assert_eq!(read["result"]["_meta"][PROJECT_META_KEY], "alpha");
    }
}
