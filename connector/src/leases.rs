//! Leases for servers that know nothing of them. The config names, per tool, the argument
//! that names a leasable resource and the resource's kind (`leases = { "write_note" = {
//! argument = "title", kind = "note" } }`), or where in an array argument the resources are
//! named (`argument = "entityNames[]"`, each string of an array; `argument =
//! "observations[].entityName"`, a field of each object of an array: a
//! [`gateway_core::lease_spot::LeaseSpot`]); the connector then
//!
//! - annotates that spot of the tool's input schema with the lease keyword
//!   ([`gateway_core::uplink::LEASE_KEYWORD`]) in the listings it passes to the gateway, so the
//!   gateway grants leases on `<kind>:<value>` and puts the holder's fences on each such call
//!   (a call that names a resource another agent holds is refused by the gateway);
//! - checks the fence before it forwards the call, as a sled that knows leases does: a fence
//!   below the highest it has accepted for the resource, or one for another resource, is
//!   refused with the same typed tool error as sled-sim's (`stale_fence`, `fence_mismatch`),
//!   and the server never sees the write;
//! - keeps the highest fence per resource in `<state_dir>/<project>.fences.json`, written
//!   (synced, then renamed into place) before the call goes on, and reports the highest of
//!   all in its hello, so neither its restart nor the gateway's lets an old fence through.
//!
//! The fence itself is taken out of the call's `_meta` before the server sees the call.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use gateway_core::lease_spot::{fences_from_meta, LeaseSpot};
use gateway_core::uplink::FENCE_META;
use serde_json::{json, Value};
use sled_uplink::fences::{FenceFile, Fences};
use sled_uplink::{CallContext, Handler};
use tracing::{info, warn};

/// The argument of a tool that names the resource it writes, and the resource's kind.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeasedArgument {
    pub argument: String,
    pub kind: String,
}

/// A server's handler with leases: the listings annotated, each fenced call checked.
pub struct Leased {
    inner: Arc<dyn Handler>,
    project: String,
    tools: BTreeMap<String, LeaseSpot>,
    fences: Mutex<Fences>,
    file: FenceFile,
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("project", &self.project)
            .field("tools", &self.tools)
            .finish()
    }
}

/// A refused call's result, as sled-sim words it: `isError`, with a typed `structuredContent`.
fn refusal(text: String, structured: Value) -> Value {
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": true,
    })
}

impl Leased {
    /// `inner` with leases on `tools`, its fences kept under `state_dir`.
    pub fn new(
        inner: Arc<dyn Handler>,
        tools: BTreeMap<String, LeasedArgument>,
        state_dir: &Path,
    ) -> Result<Arc<Leased>, String> {
        let project = inner.project_name().to_owned();
        let file = FenceFile::in_state_dir(state_dir, &project);
        std::fs::create_dir_all(state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
        let fences = Mutex::new(file.load()?);
        let tools = tools
            .into_iter()
            .map(|(tool, l)| Ok((tool, LeaseSpot::parse(&l.argument, &l.kind)?)))
            .collect::<Result<_, String>>()?;
        Ok(Arc::new(Leased {
            inner,
            project,
            tools,
            fences,
            file,
        }))
    }

    /// The listing with each leased tool's spot marked.
    fn annotate(&self, response: &mut Value) {
        let Some(tools) = response
            .pointer_mut("/result/tools")
            .and_then(Value::as_array_mut)
        else {
            return;
        };
        for tool in tools {
            let Some(spot) = tool
                .get("name")
                .and_then(Value::as_str)
                .and_then(|n| self.tools.get(n))
            else {
                continue;
            };
            if !spot.mark(tool) {
                warn!(project = %self.project, tool = %tool["name"], argument = %spot,
                    "the config leases an argument the tool's schema does not list in that shape; not leased");
            }
        }
    }

    /// A `tools/call` of a leased tool with fences: `None` when it may go on (its fences
    /// recorded), else the result that refuses it. Each fence must be for a resource the call
    /// writes and not below the highest accepted for it; a resource without a fence is one
    /// nobody held when the gateway checked the call.
    fn admit(
        &self,
        tool: &str,
        arguments: Option<&Value>,
        given: &[(String, u64)],
    ) -> Option<Value> {
        let spot = self.tools.get(tool)?;
        let project = &self.project;
        let resources = match spot.resources(arguments.and_then(|a| a.get(&spot.argument))) {
            Ok(r) => r,
            Err(e) => {
                return Some(refusal(
                    format!("{tool} (project {project}): refused: {e}"),
                    json!({"kind": "too_many_resources", "project": project}),
                ))
            }
        };
        let mut fences = self
            .fences
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((other, fence)) = given.iter().find(|(r, _)| !resources.contains(r)) {
            let writes = resources.join(", ");
            info!(project, tool, writes, fence_resource = %other, fence,
                "refused a write whose fence names another resource");
            return Some(refusal(
                format!(
                    "{tool} (project {project}): refused: the call writes {writes} but its \
                     fence {fence} is for {other}; a fence covers only the resource whose lease \
                     granted it"
                ),
                json!({"kind": "fence_mismatch", "resource": resources.first(), "resources": resources,
                       "fence_resource": other, "fence": fence,
                       "highest": fences.highest(other), "project": project}),
            ));
        }
        let before = fences.clone();
        for (resource, fence) in given {
            if let Err(highest) = fences.admit(resource, *fence) {
                *fences = before;
                info!(
                    project,
                    tool,
                    resource,
                    fence,
                    highest,
                    "refused a stale write: its fence is below the highest accepted"
                );
                return Some(refusal(
                    format!(
                        "{tool} (project {project}): refused: the lease on {resource} was lost: \
                         this call's fence {fence} is below {highest}, the highest accepted for \
                         it, so a newer holder has written since. Nothing was changed; acquire \
                         the lease again and re-read {resource} before writing"
                    ),
                    json!({"kind": "stale_fence", "resource": resource, "fence": fence,
                           "highest": highest, "project": project}),
                ));
            }
        }
        // Kept before the server sees the write: a restart must not forget it.
        if *fences != before {
            if let Err(e) = self.file.save(&fences) {
                *fences = before;
                warn!(project, file = %self.file.path().display(), error = %e, "could not keep a fence; the write is refused");
                return Some(refusal(
                    format!("{tool} (project {project}): refused: the connector could not record the fence: {e}"),
                    json!({"kind": "fence_not_recorded", "resources": resources, "project": project}),
                ));
            }
        }
        None
    }

    async fn forward(self: Arc<Self>, mut msg: Value, ctx: CallContext) -> Option<Value> {
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if method == "tools/call" {
            let meta = msg.pointer("/params/_meta").and_then(Value::as_object);
            let fences = match fences_from_meta(meta) {
                Ok(f) => f,
                Err(problem) => {
                    return Some(json!({"jsonrpc": "2.0", "id": msg.get("id"),
                        "error": {"code": -32602, "message": problem}}))
                }
            };
            if !fences.is_empty() {
                let tool = msg
                    .pointer("/params/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if let Some(result) = self.admit(tool, msg.pointer("/params/arguments"), &fences) {
                    return Some(json!({"jsonrpc": "2.0", "id": msg.get("id"), "result": result}));
                }
                // The server knows nothing of fences.
                if let Some(meta) = msg
                    .pointer_mut("/params/_meta")
                    .and_then(Value::as_object_mut)
                {
                    meta.remove(FENCE_META);
                }
            }
        }
        let mut answer = Arc::clone(&self.inner).handle(msg, ctx).await;
        if method == "tools/list" {
            if let Some(answer) = answer.as_mut() {
                self.annotate(answer);
            }
        }
        answer
    }
}

impl Handler for Leased {
    fn project_name(&self) -> &str {
        &self.project
    }

    fn handle(self: Arc<Self>, msg: Value, ctx: CallContext) -> BoxFuture<'static, Option<Value>> {
        self.forward(msg, ctx).boxed()
    }

    fn cancelled(&self, connection: u64, params: &Value) {
        self.inner.cancelled(connection, params);
    }

    fn fence_high_water(&self) -> Option<u64> {
        self.fences
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .high_water()
    }

    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        self.inner.notices()
    }

    fn welcome_frames(&self) -> Vec<String> {
        self.inner.welcome_frames()
    }
}

/// Parses `--lease TOOL=ARGUMENT:KIND`.
pub fn parse_flag(value: &str) -> Result<(String, LeasedArgument), String> {
    let (tool, rest) = value.split_once('=').ok_or("expected TOOL=ARGUMENT:KIND")?;
    let (argument, kind) = rest.split_once(':').ok_or("expected TOOL=ARGUMENT:KIND")?;
    if tool.is_empty() || argument.is_empty() || kind.is_empty() {
        return Err("expected TOOL=ARGUMENT:KIND, none of them empty".into());
    }
    Ok((
        tool.to_owned(),
        LeasedArgument {
            argument: argument.to_owned(),
            kind: kind.to_owned(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::uplink::LEASE_KEYWORD;

    struct Nothing;
    impl Handler for Nothing {
        fn project_name(&self) -> &str {
            "notes"
        }
        fn handle(self: Arc<Self>, _: Value, _: CallContext) -> BoxFuture<'static, Option<Value>> {
            async { None }.boxed()
        }
    }

    fn leased(dir: &Path) -> Arc<Leased> {
        let tools = [(
            "write_note".to_owned(),
            LeasedArgument {
                argument: "title".into(),
                kind: "note".into(),
            },
        )]
        .into_iter()
        .collect();
        Leased::new(Arc::new(Nothing), tools, dir).unwrap()
    }

    fn fence(resource: &str, fence: u64) -> [(String, u64); 1] {
        [(resource.into(), fence)]
    }

    #[test]
    fn stale_and_mismatched_fences_are_refused_and_accepted_ones_kept_across_a_restart() {
        let dir = std::env::temp_dir().join(format!("gateway-sled-fences-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let l = leased(&dir);
        let args = json!({"title": "x"});
        assert_eq!(
            l.admit("write_note", Some(&args), &fence("note:x", 5)),
            None
        );
        // Equal passes: one holder writes several times under one fence.
        assert_eq!(
            l.admit("write_note", Some(&args), &fence("note:x", 5)),
            None
        );
        let stale = l
            .admit("write_note", Some(&args), &fence("note:x", 3))
            .unwrap();
        assert_eq!(stale["structuredContent"]["kind"], "stale_fence");
        assert_eq!(stale["structuredContent"]["highest"], 5);
        let other = l
            .admit("write_note", Some(&args), &fence("note:y", 9))
            .unwrap();
        assert_eq!(other["structuredContent"]["kind"], "fence_mismatch");
        // A tool the config does not lease is not checked.
        assert_eq!(l.admit("read_note", Some(&args), &fence("note:x", 1)), None);
        assert_eq!(l.fence_high_water(), Some(5));

        // A new connector on the same state directory remembers.
        let again = leased(&dir);
        assert_eq!(again.fence_high_water(), Some(5));
        let stale = again
            .admit("write_note", Some(&args), &fence("note:x", 4))
            .unwrap();
        assert_eq!(stale["structuredContent"]["kind"], "stale_fence");

        // A fence file it cannot read stops it: forgetting could take a stale write.
        std::fs::write(FenceFile::in_state_dir(&dir, "notes").path(), "nonsense").unwrap();
        let tools = BTreeMap::new();
        assert!(Leased::new(Arc::new(Nothing), tools, &dir)
            .unwrap_err()
            .contains("restore the file"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// server-memory's shape: the resources are named in an array's objects. Each fence must
    /// be for one of them, none stale; a refused call records none of its fences.
    #[test]
    fn a_call_naming_several_resources_is_checked_for_each_fence() {
        let dir = std::env::temp_dir().join(format!("gateway-sled-several-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tools = [(
            "add_observations".to_owned(),
            LeasedArgument {
                argument: "observations[].entityName".into(),
                kind: "entity".into(),
            },
        )]
        .into_iter()
        .collect();
        let l = Leased::new(Arc::new(Nothing), tools, &dir).unwrap();
        let args = json!({"observations": [{"entityName": "a", "contents": []},
                                           {"entityName": "b", "contents": []}]});
        let both = [("entity:a".to_owned(), 4), ("entity:b".to_owned(), 7)];
        assert_eq!(l.admit("add_observations", Some(&args), &both), None);
        assert_eq!(l.fence_high_water(), Some(7));
        // One stale fence refuses the call, and the other (higher) is not recorded.
        let mixed = [("entity:a".to_owned(), 9), ("entity:b".to_owned(), 6)];
        let r = l.admit("add_observations", Some(&args), &mixed).unwrap();
        assert_eq!(r["structuredContent"]["kind"], "stale_fence");
        assert_eq!(r["structuredContent"]["resource"], "entity:b");
        assert_eq!(l.fence_high_water(), Some(7));
        let r = l
            .admit("add_observations", Some(&args), &fence("entity:a", 3))
            .unwrap();
        assert_eq!(
            r["structuredContent"]["kind"], "stale_fence",
            "a's 4 was kept"
        );
        // A fence for an entity the call does not write.
        let r = l
            .admit("add_observations", Some(&args), &fence("entity:c", 99))
            .unwrap();
        assert_eq!(r["structuredContent"]["kind"], "fence_mismatch");
        assert_eq!(
            r["structuredContent"]["resources"],
            json!(["entity:a", "entity:b"])
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn listings_mark_the_leased_argument() {
        let dir =
            std::env::temp_dir().join(format!("gateway-sled-annotate-{}", std::process::id()));
        let l = leased(&dir);
        let mut listing = json!({"result": {"tools": [
            {"name": "write_note", "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}}}},
            {"name": "read_note", "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}}}},
        ]}});
        l.annotate(&mut listing);
        assert_eq!(
            listing["result"]["tools"][0]["inputSchema"]["properties"]["title"][LEASE_KEYWORD],
            "note"
        );
        assert!(
            listing["result"]["tools"][1]["inputSchema"]["properties"]["title"]
                .get(LEASE_KEYWORD)
                .is_none()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_flag_reads_tool_argument_and_kind() {
        assert_eq!(
            parse_flag("write_note=title:note").unwrap(),
            (
                "write_note".into(),
                LeasedArgument {
                    argument: "title".into(),
                    kind: "note".into()
                }
            )
        );
        assert!(parse_flag("write_note=title").is_err());
        assert_eq!(
            parse_flag("add_observations=observations[].entityName:entity")
                .unwrap()
                .1
                .argument,
            "observations[].entityName"
        );
        assert!(parse_flag("=title:note").is_err());
    }
}
