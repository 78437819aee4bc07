//! `tools/call` in both eras: a gateway tool is answered by its feature, a project's tool is
//! routed and forwarded (`proxy.rs`). `client.rs` and `modern.rs` both come here; it calls only
//! down, into the features and the call path.

use super::*;
use crate::lease_spot;
use crate::ReadOnlyTools;
use basics::{only_arguments, tool_result};

/// `tools/call` params. The arguments stay raw: the gateway's own tools read them as a
/// `Map`, a project's tool only has `project` taken out and the rest passed on as written.
#[derive(Deserialize)]
struct CallParams<'a> {
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<&'a RawValue>,
    /// 2025-11-25: run it as a task (`{"ttl": ms}`).
    #[serde(borrow, default)]
    task: Option<&'a RawValue>,
}

/// Reads raw `tools/call` arguments as `T` (absent: `{}`), failing as invalid params.
fn call_arguments<'a, T: Deserialize<'a>>(arguments: Option<&'a RawValue>) -> Result<T, RpcError> {
    jsonrpc::params_of("tools/call", arguments)
}

impl Gateway {
    /// Answers a `tools/call` now, forwards it, or says where it goes instead.
    pub(super) fn tools_call(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        params: Option<&RawValue>,
        mode: CallMode,
    ) -> Result<Served, RpcError> {
        let CallMode { stream_ok, modern } = mode;
        let now = req.now;
        let params: CallParams = jsonrpc::params_of("tools/call", params)?;
        let gateway_tool = [
            SWITCH_PROJECT,
            LIST_PROJECTS,
            GATEWAY_HEALTH,
            FLEET_IDENTITY,
            AGGREGATE_PIPELINE_STATUS,
        ]
        .contains(&params.name.as_str());
        if let Some(&tool) = coordination::COORDINATION_TOOLS
            .iter()
            .find(|t| **t == params.name)
        {
            let arguments: Map<String, Value> = call_arguments(params.arguments)?;
            let meta = match params.meta {
                Some(m) => Some(call_arguments::<Value>(Some(m))?),
                None => None,
            };
            return self.coordination_call(req, id, tool, &arguments, meta.as_ref(), mode);
        }
        if gateway_tool {
            let arguments: Map<String, Value> = call_arguments(params.arguments)?;
            return match params.name.as_str() {
                SWITCH_PROJECT if modern => Err(RpcError::UnknownTool {
                    tool: SWITCH_PROJECT.into(),
                    why: "requests of protocol 2026-07-28 have no session to keep a default in: pass \"project\" in each call's arguments",
                }),
                SWITCH_PROJECT => self.switch_project(req, &arguments).map(Served::Now),
                LIST_PROJECTS => self.list_projects(req, &arguments).map(Served::Now),
                GATEWAY_HEALTH => self.gateway_health_call(req, id, modern, &arguments),
                FLEET_IDENTITY => self.fleet_identity_call(req, id, modern, &arguments),
                _ => {
                    // It runs as a task of the gateway's own where asked (2025-11-25) or where
                    // the request declares the extension (2026-07-28).
                    let meta = match params.meta {
                        Some(m) => Some(call_arguments::<Value>(Some(m))?),
                        None => None,
                    };
                    let project = crate::tasks::GATEWAY_PROJECT;
                    let task = self
                        .task_of_call(
                            req,
                            project,
                            AGGREGATE_PIPELINE_STATUS,
                            Some(crate::tasks::TaskSupport::Optional),
                            params.task,
                            meta.as_ref(),
                            modern,
                        )?
                        .map(|(t, _)| crate::tasks::ttl_to_ask(t.get("ttl")));
                    self.aggregate_pipeline_status(req, id, modern, &arguments, task)
                }
            };
        }
        // A project's tool: its arguments are looked at only for `project`.
        let mut arguments: BTreeMap<String, &RawValue> = call_arguments(params.arguments)?;
        let explicit = match arguments.get("project") {
            Some(p) => Some(call_arguments::<Value>(Some(p))?),
            None => None,
        };
        let tool = params.name;
        let route = match self.route(req, explicit.as_ref(), &tool)? {
            Placement::Here(route) => route,
            Placement::Away(away) => return Ok(Served::Away(away)),
        };
        let listed = self
            .projects
            .get(&route.project)
            .and_then(|s| s.tools.as_deref())
            .and_then(|ts| ts.iter().find(|t| t.name == tool));
        self.require(
            req.principal,
            &route.project,
            self.right_for_tool(&route.project, &tool),
            format_args!("tools/call {tool}"),
        )?;
        if !listed.is_some_and(|t| t.declares_project) {
            arguments.remove("project");
        }
        // The metrics label: the tool if the sled lists it (clients must not grow the set).
        let task_support = listed.map(|t| t.task_support);
        let label = match listed {
            Some(_) => tool.clone(),
            None => "_unlisted".to_owned(),
        };
        let lease = match listed {
            Some(t) => t.lease.clone(),
            // Not listed now: the sled's uplink came back and its tools are not listed again
            // yet. Writes stay checked by what it listed last, or wait for the listing.
            None => match self.remembered_lease(now, &route.project, &tool) {
                Some(lease) => lease,
                None => {
                    return Ok(Served::AwaitListing {
                        project: route.project,
                    })
                }
            },
        };
        let mut meta = match params.meta {
            Some(m) => Some(call_arguments::<Value>(Some(m))?),
            None => None,
        };
        // Whether a call runs as a task depends on the tool's `execution.taskSupport`: one
        // that asks for a task (2025-11-25 `params.task`, or a 2026-07-28 request declaring the
        // extension) before the sled's tools are listed waits for the listing, rather than
        // being refused (2025-11-25) or run as a plain call (2026-07-28) on a guess.
        let unlisted = self
            .projects
            .get(&route.project)
            .is_none_or(|s| s.tools.is_none());
        let asks_task =
            params.task.is_some() || (modern && super::tasks::declares_tasks(meta.as_ref()));
        if unlisted && asks_task {
            return Ok(Served::AwaitListing {
                project: route.project,
            });
        }
        // The fence is the gateway's to give: a client's is never passed on. An agent handle
        // (callers without a session) says who writes, and is never passed on either.
        let mut handle = None;
        #[cfg(feature = "planted-bugs")]
        let strip_fence =
            self.config.coordination.planted != Some(crate::coord::CoordBug::ClientFenceTrusted);
        #[cfg(not(feature = "planted-bugs"))]
        let strip_fence = true;
        if let Some(Value::Object(m)) = meta.as_mut() {
            if strip_fence {
                m.remove(FENCE_META);
            }
            handle = m.remove(coordination::AGENT_META);
            if m.is_empty() {
                meta = None;
            }
        }
        // A handle is checked whether or not the write turns out to be leased: one this
        // gateway did not issue to the caller is `unknown_agent`, never ignored.
        let named = match handle.as_ref() {
            Some(_) => Some(self.writer_of(req, handle.as_ref())?),
            None => None,
        };
        // A write to resources the sled declared leasable: refused if another agent holds any
        // of them, fenced for each the caller holds.
        let resources = match &lease {
            Some(spot) => {
                let value = match arguments.get(&spot.argument) {
                    Some(raw) => serde_json::from_str::<Value>(raw.get()).ok(),
                    None => None,
                };
                spot.resources(value.as_ref())
                    .map_err(|detail| RpcError::InvalidParams {
                        method: "tools/call".into(),
                        detail,
                    })?
            }
            None => Vec::new(),
        };
        #[cfg(feature = "planted-bugs")]
        let resources = match self.config.coordination.planted {
            Some(crate::coord::CoordBug::FirstResourceOnly) => {
                resources.into_iter().take(1).collect()
            }
            _ => resources,
        };
        let mut fences = Vec::new();
        if !resources.is_empty() {
            let agent = match named {
                Some(agent) => agent,
                None => self.writer_of(req, None)?,
            };
            for resource in resources {
                if let Some(fence) =
                    self.check_lease(now, agent.as_deref(), &route.project, &resource)?
                {
                    fences.push((resource, fence));
                }
            }
        }
        if let Some(fenced) = lease_spot::fences_meta(&fences) {
            let m = meta.get_or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = m {
                m.insert(FENCE_META.to_owned(), fenced);
            }
        }
        // A task where the client asks for one (2025-11-25), or where the tool may run as
        // one and the request declares the extension (2026-07-28).
        let (task, rewrite) = match self.task_of_call(
            req,
            &route.project,
            &tool,
            task_support,
            params.task,
            meta.as_ref(),
            modern,
        )? {
            Some((task, rewrite)) => (Some(task), rewrite),
            None => (None, proxy::Rewrite::None),
        };
        #[derive(serde::Serialize)]
        struct Forwarded<'a> {
            name: &'a str,
            arguments: &'a BTreeMap<String, &'a RawValue>,
            #[serde(skip_serializing_if = "Option::is_none")]
            task: Option<Value>,
        }
        let object = serde_json::to_string(&Forwarded {
            name: &tool,
            arguments: &arguments,
            task,
        })
        .map_err(|e| RpcError::InvalidParams {
            method: "tools/call".into(),
            detail: jsonrpc::clean_serde_message(&e),
        })?;
        self.forward(
            req,
            id,
            CallMode { stream_ok, modern },
            route,
            "tools/call",
            proxy::Outgoing { object, meta },
            label,
            rewrite,
        )
    }

    pub(super) fn switch_project(
        &mut self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<String, RpcError> {
        only_arguments(SWITCH_PROJECT, arguments, &["project"])?;
        let project = match arguments.get("project") {
            None => {
                return Err(RpcError::InvalidParams {
                    method: SWITCH_PROJECT.into(),
                    detail: "the `project` argument is required: name a registered project".into(),
                })
            }
            Some(Value::String(p)) if p.is_empty() => {
                return Err(RpcError::ProjectEmpty {
                    tool: SWITCH_PROJECT.into(),
                })
            }
            Some(Value::String(p)) => p.clone(),
            Some(_) => {
                return Err(RpcError::ProjectNotString {
                    tool: SWITCH_PROJECT.into(),
                })
            }
        };
        let now = req.now;
        let Scope::Session(session) = req.scope else {
            return Err(RpcError::SwitchWithoutSession);
        };
        let sid = session;
        if self.registry.get(&project).is_none() || !self.sees(req.principal, &project) {
            return Err(RpcError::UnknownProject {
                project,
                registered: self.visible_projects(req.principal),
            });
        }
        let live = self.is_live(&project);
        let session = self
            .sessions
            .get_mut(session)
            .expect("the caller's session was looked up for this request");
        let previous = session.default_project.replace(project.clone());
        let changed = previous.as_deref() != Some(project.as_str());
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(PlantedBug::SharedActiveProject) {
            self.shared_active = Some(project.clone());
        }
        // In a cluster, written even when unchanged here: this replica's copy may be older
        // than the engine's (a switch through another replica a moment ago).
        if changed || self.clustered() {
            self.store_session(now, sid);
        }
        if changed {
            // This session's tools/list now shows another project's tools.
            self.notify_session(sid, streams::TOOLS_LIST_CHANGED.to_owned());
        }
        Ok(tool_result(json!({
            "project": project,
            "previous": previous,
            "live": live,
            "scope": "session",
        })))
    }

    pub(super) fn list_projects(
        &self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
    ) -> Result<String, RpcError> {
        only_arguments(LIST_PROJECTS, arguments, &[])?;
        let active = self.default_of(req).filter(|p| self.sees(req.principal, p));
        let projects: Vec<Value> = self
            .registry
            .projects()
            .iter()
            .filter(|p| self.sees(req.principal, &p.name))
            .map(|p| {
                let mut entry = json!({
                    "name": p.name,
                    "url": p.url,
                    "ssh_port": p.ssh_port,
                    "host_path": p.host_path,
                    "kind": p.kind.as_str(),
                    "sled": p.sled,
                    "live": self.is_live(&p.name) || self.relay_target(&p.name).is_some(),
                    "active": active == Some(p.name.as_str()),
                    // What the `read` right covers: the tools the sled annotates read-only
                    // (`"annotated"`), or a list (empty: none of them).
                    "read_only_tools": match &p.read_only_tools {
                        ReadOnlyTools::Hints => json!("annotated"),
                        ReadOnlyTools::Listed(tools) => json!(tools),
                        ReadOnlyTools::None => json!([]),
                    },
                });
                // In a cluster: the replica that holds the project's uplink.
                if let Some(replica) = self.holder_of(&p.name) {
                    entry["replica"] = json!(replica);
                }
                // The live sled's high-water mark of accepted fences, when its hello reported
                // one; every fence granted since is above it, which `gateway doctor` checks.
                let floor = self
                    .projects
                    .get(&p.name)
                    .and_then(|s| s.uplink)
                    .and_then(|id| self.uplinks.get(&id))
                    .and_then(|u| u.fence_floor);
                if let Some(floor) = floor {
                    entry["fence_floor"] = json!(floor);
                }
                entry
            })
            .collect();
        Ok(tool_result(
            json!({ "projects": projects, "active": active }),
        ))
    }

    /// `fleet_identity`: a re-pin here; its rows as for `gateway_health`, each project's from
    /// the replica holding its sled, which is the one that saw its key.
    pub(super) fn fleet_identity_call(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        modern: bool,
        arguments: &Map<String, Value>,
    ) -> Result<Served, RpcError> {
        match self.fleet_identity(req, arguments)? {
            fleet::Identity::Done(text) => Ok(Served::Now(text)),
            fleet::Identity::Rows(result) => {
                let asked = Value::Object(arguments.clone());
                Ok(self.rows_from_holders(req, id, modern, FLEET_IDENTITY, asked, result))
            }
        }
    }
}
