//! The simulation's sled: the story [`SharedSled`] served as a [`Handler`], with the latency
//! knob of the story backend, a nonce echo on `resources/read` and `prompts/get`, and one tool
//! more, [`SUMMARIZE_TOOL`], that asks the calling client for a sampling mid-call.
//!
//! `summarize_story` sends `sampling/createMessage` up the uplink (naming the call, so the
//! gateway relays it to the calling session on that call's event stream) with the call's nonce
//! in the prompt text, and puts the client's answer text in its result
//! (`structuredContent.summary`); when the gateway answers with an error instead (-32601 for a
//! client without the `sampling` capability), the result is `isError` with
//! `structuredContent.sampling_error` = `{code, message}`.

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

/// The story sled of one project as a [`Handler`].
pub struct SimSled {
    sled: SharedSled,
    project: String,
    latency: Duration,
    jitter: Duration,
    rng: Mutex<ChaCha8Rng>,
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
        }
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

    fn tool_definition() -> Value {
        json!({
            "name": SUMMARIZE_TOOL,
            "description": "Summarizes through the client's LLM (sampling/createMessage)",
            "inputSchema": {"type": "object", "properties": {}},
        })
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
                    tools.push(Self::tool_definition());
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
        let is_call = msg.get("method").and_then(Value::as_str) == Some("tools/call")
            && msg.get("id").is_some();
        // Drawn now, in the order the requests arrive, so the run stays deterministic.
        let delay = if is_call {
            self.delay()
        } else {
            Duration::ZERO
        };
        Box::pin(async move {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::Sled;
    use crate::model::Project;

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
