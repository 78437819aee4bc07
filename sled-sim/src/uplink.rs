//! The sled side of the uplink is sled-uplink's ([`sled_uplink::uplink`], re-exported here so
//! that `sled_sim::uplink::…` paths keep working); this adds the story model as a
//! [`SyncServer`] (its relay events are the story model's) and [`run_uplink`] for it.

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

pub use sled_uplink::uplink::*;

use crate::mcp::SharedSled;
use crate::net::{Connect, GatewayAddr};

impl SyncServer for SharedSled {
    fn project_name(&self) -> &str {
        SharedSled::project_name(self)
    }

    fn handle(&self, msg: &Value) -> Option<Value> {
        SharedSled::handle(self, msg)
    }

    fn fence_high_water(&self) -> Option<u64> {
        SharedSled::fence_high_water(self)
    }

    fn subscribe_tools_changed(&self) -> Option<watch::Receiver<u64>> {
        Some(SharedSled::subscribe_tools_changed(self))
    }

    fn subscribe_notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(SharedSled::subscribe_notices(self))
    }

    fn event_of(&self, msg: &Value, resp: &Value) -> Option<(&'static str, Option<String>)> {
        story_event(msg, resp)
    }

    fn handle_async(
        &self,
        msg: &Value,
        ctx: &CallContext,
    ) -> Option<futures_util::future::BoxFuture<'static, Option<Value>>> {
        SharedSled::handle_async(self, msg, Some(ctx))
    }
}

/// The story-model sled as an uplink's backend.
pub fn story(sled: SharedSled) -> Backend {
    Backend::Sync(Arc::new(sled))
}

/// Runs the story-model sled's uplink until `shutdown` completes ([`run_uplink_with`]).
pub async fn run_uplink<C: Connect>(
    connector: C,
    gateway: GatewayAddr,
    sled: SharedSled,
    opts: UplinkOptions,
    shutdown: impl Future<Output = ()>,
) {
    run_uplink_with(connector, gateway, story(sled), opts, shutdown).await;
}

/// The relay event of one story-model request and its response: for a successful (not
/// `isError`) mutating `tools/call`, the event's kind and the story it touched.
fn story_event(msg: &Value, resp: &Value) -> Option<(&'static str, Option<String>)> {
    if msg.get("method").and_then(Value::as_str) != Some("tools/call") {
        return None;
    }
    let result = resp.get("result")?;
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let args = msg.pointer("/params/arguments");
    let content = result.get("structuredContent");
    let kind = match msg.pointer("/params/name").and_then(Value::as_str)? {
        "create_story" => "story_created",
        "move_story" => "story_moved",
        "block_story" => "story_blocked",
        "record_test_result" => {
            let passed = content
                .and_then(|c| c.get("passed"))
                .or_else(|| args.and_then(|a| a.get("passed")))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if passed {
                "story_updated"
            } else {
                "test_failed"
            }
        }
        "update_story" | "add_todo" | "complete_todo" | "unblock_story" => "story_updated",
        _ => return None,
    };
    let story = content
        .and_then(|c| c.pointer("/story/id").or_else(|| c.get("story_id")))
        .or_else(|| args.and_then(|a| a.get("story_id")))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some((kind, story))
}
