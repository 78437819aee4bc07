//! The stateless era's `subscriptions/listen`: one long-lived SSE answer carrying the change
//! notifications a client asked for, each tagged with the listen request's id.
//!
//! `toolsListChanged` is the gateway's: its stateless `tools/list` changes when a project's
//! sled comes, goes or changes its tools. The rest is one project's, named like any proxied
//! request (`_meta["io.mcp-gateway/project"]`, else the registry's default):
//! `promptsListChanged` and `resourcesListChanged` relay that project's sled's `list_changed`,
//! and `resourceSubscriptions` its `resources/updated` for those URIs only. The gateway
//! subscribes to a URI at the sled (`resources/subscribe`) when the first listener wants it,
//! again whenever the project's sled connects anew, and unsubscribes when the last listener
//! of it (and no session) is gone. The acknowledgment names what is honored, and the project.

use super::*;

/// At most this many URIs per listen request.
pub(super) const MAX_URIS: usize = 64;

/// One open `subscriptions/listen` stream.
#[derive(Debug)]
pub(super) struct Listen {
    pub(super) id: RawId,
    tools: bool,
    /// The project of the rest, when the client asked for any of it.
    project: Option<String>,
    prompts: bool,
    resources: bool,
    uris: BTreeSet<String>,
    /// The tasks whose `notifications/tasks` it wants, each (project, sled's id, the id the
    /// client knows): only the listener's own (`crate::tasks`).
    pub(super) tasks: Vec<(String, String, String)>,
    /// Who listens: a reload that takes its project away (or its credentials) ends it.
    holder: crate::auth::Holder,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Filter {
    #[serde(default)]
    tools_list_changed: bool,
    #[serde(default)]
    prompts_list_changed: bool,
    #[serde(default)]
    resources_list_changed: bool,
    #[serde(default)]
    resource_subscriptions: Vec<String>,
    /// The tasks extension: status notifications of these tasks.
    #[serde(default)]
    task_ids: Vec<String>,
}

#[derive(Deserialize)]
struct ListenParams {
    #[serde(default)]
    notifications: Option<Filter>,
    #[serde(rename = "_meta", default)]
    meta: Option<Map<String, Value>>,
}

impl Gateway {
    pub(super) fn listen(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        params: Option<&RawValue>,
    ) -> Result<Served, RpcError> {
        let Req { now, token, .. } = *req;
        let method = "subscriptions/listen";
        let p: ListenParams = jsonrpc::params_of(method, params)?;
        let filter = p.notifications.unwrap_or_default();
        if filter.resource_subscriptions.len() > MAX_URIS {
            return Err(RpcError::InvalidParams {
                method: method.into(),
                detail: format!("at most {MAX_URIS} resourceSubscriptions per listen"),
            });
        }
        if !filter.task_ids.is_empty() {
            let declared = p
                .meta
                .as_ref()
                .is_some_and(super::tasks::meta_declares_tasks);
            if !declared {
                return Err(RpcError::TasksNotDeclared {
                    what: "subscriptions/listen with taskIds".into(),
                });
            }
            if filter.task_ids.len() > MAX_URIS {
                return Err(RpcError::InvalidParams {
                    method: method.into(),
                    detail: format!("at most {MAX_URIS} taskIds per listen"),
                });
            }
        }
        // Only the caller's own tasks are honored; any other id is left out of the
        // acknowledgment, exactly as one that never existed.
        let creator = self.creator_of(req);
        let tasks: Vec<(String, String, String)> = filter
            .task_ids
            .iter()
            .filter_map(|id| {
                let s = self.tasks.open(id, &creator)?;
                Some((s.project, s.sled_id, id.clone()))
            })
            .collect();
        let wants_project = filter.prompts_list_changed
            || filter.resources_list_changed
            || !filter.resource_subscriptions.is_empty();
        let project = if wants_project {
            let named = p.meta.as_ref().and_then(|m| m.get(proxy::PROJECT_META));
            let project = match named {
                Some(Value::String(p)) => Some(p.clone()),
                Some(_) => {
                    return Err(RpcError::ProjectNotString {
                        tool: method.into(),
                    })
                }
                None => self
                    .registry
                    .default_project()
                    .filter(|p| self.sees(req.principal, p))
                    .map(str::to_owned),
            };
            if let Some(p) = &project {
                if self.registry.get(p).is_none() || !self.sees(req.principal, p) {
                    return Err(RpcError::UnknownProject {
                        project: p.clone(),
                        registered: self.visible_projects(req.principal),
                    });
                }
            }
            project
        } else {
            None
        };
        // In a cluster, a project's notifications come from where its sled is: a listen that
        // names one held by another replica is relayed there whole (its tool news too, which
        // every replica has).
        if let Some(p) = project.as_deref().filter(|p| !self.is_live(p)) {
            if let Some(away) = self.away(req, p)? {
                return Ok(Served::Away(away));
            }
        }
        let listen = Listen {
            id: id.clone(),
            tools: filter.tools_list_changed,
            prompts: project.is_some() && filter.prompts_list_changed,
            resources: project.is_some() && filter.resources_list_changed,
            uris: if project.is_some() {
                filter.resource_subscriptions.into_iter().collect()
            } else {
                BTreeSet::new()
            },
            project,
            tasks,
            holder: crate::auth::Holder::of(req.principal, &self.registry),
        };
        let mut honored = Map::new();
        for (key, on) in [
            ("toolsListChanged", listen.tools),
            ("promptsListChanged", listen.prompts),
            ("resourcesListChanged", listen.resources),
        ] {
            if on {
                honored.insert(key.into(), Value::Bool(true));
            }
        }
        if !listen.uris.is_empty() {
            honored.insert("resourceSubscriptions".into(), json!(listen.uris));
        }
        if !listen.tasks.is_empty() {
            let ids: Vec<&str> = listen.tasks.iter().map(|(_, _, id)| id.as_str()).collect();
            honored.insert("taskIds".into(), json!(ids));
        }
        let subscription: Value = serde_json::from_str(id.as_str()).expect("ids are JSON");
        let mut meta = json!({ "io.modelcontextprotocol/subscriptionId": subscription });
        if let Some(p) = &listen.project {
            meta[proxy::PROJECT_META] = Value::String(p.clone());
        }
        let ack = json!({
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": { "notifications": honored, "_meta": meta },
        });
        self.outputs.push_back(Output::StreamOpen { token });
        let n = Some(self.next_event_id());
        self.outputs.push_back(Output::StreamEvent {
            token,
            id: n,
            data: ack.to_string(),
        });
        if honored.is_empty() {
            // Nothing to listen to: end the subscription at once, gracefully.
            self.end_listen(token, id);
            return Ok(Served::Later);
        }
        let new_uris: Vec<(String, String)> = match &listen.project {
            Some(p) => listen
                .uris
                .iter()
                .filter(|u| !self.uri_wanted(p, u))
                .map(|u| (p.clone(), u.clone()))
                .collect(),
            None => Vec::new(),
        };
        self.listens.insert(token, listen);
        for (project, uri) in new_uris {
            self.sled_subscription(now, &project, &uri, "resources/subscribe");
        }
        Ok(Served::Later)
    }

    /// Whether a listener or a session already wants `uri` of `project`.
    fn uri_wanted(&self, project: &str, uri: &str) -> bool {
        self.listens
            .values()
            .any(|l| l.project.as_deref() == Some(project) && l.uris.contains(uri))
            || self
                .subscriptions
                .contains_key(&(project.to_owned(), uri.to_owned()))
    }

    /// Sends the gateway's own `resources/subscribe` or `resources/unsubscribe` for `uri` to
    /// `project`'s sled, if it is connected. The answer only ends the pending entry.
    fn sled_subscription(&mut self, now: Instant, project: &str, uri: &str, method: &'static str) {
        let Some(uplink) = self.projects.get(project).and_then(|s| s.uplink) else {
            return;
        };
        if !self.uplinks.contains_key(&uplink) {
            return;
        }
        let rpc_id = self.calls.next_id();
        self.calls.start(
            uplink,
            rpc_id,
            Pending::Subscription {
                project: project.to_owned(),
                deadline: now + self.config.refresh_timeout,
            },
        );
        let params = json!({ "uri": uri }).to_string();
        self.outputs.push_back(Output::UplinkSend {
            uplink,
            text: jsonrpc::request(rpc_id, method, &params),
        });
    }

    /// A project's sled connected: the URIs its listeners want are subscribed to again.
    pub(super) fn resubscribe_listeners(&mut self, now: Instant, project: &str) {
        let uris: BTreeSet<String> = self
            .listens
            .values()
            .filter(|l| l.project.as_deref() == Some(project))
            .flat_map(|l| l.uris.iter().cloned())
            .collect();
        for uri in uris {
            self.sled_subscription(now, project, &uri, "resources/subscribe");
        }
    }

    /// A listener went away: the URIs nobody else wants any more are unsubscribed at the sled.
    /// Returns whether `token` was a listener's.
    pub(super) fn listener_gone(&mut self, now: Instant, token: HttpToken) -> bool {
        let Some(listen) = self.listens.remove(&token) else {
            return false;
        };
        if let Some(project) = &listen.project {
            for uri in &listen.uris {
                if !self.uri_wanted(project, uri) {
                    self.sled_subscription(now, project, uri, "resources/unsubscribe");
                }
            }
        }
        true
    }

    /// After a reload: the listeners whose holder no longer sees their project, or is no
    /// longer let in at all, end as at shutdown (a result closes the stream), and the URIs
    /// nobody else wants are unsubscribed at the sled (security review finding 14). Listening
    /// again is answered as any request is: `unknown_project`, `forbidden` or 401.
    pub(super) fn end_revoked_listens(&mut self, now: Instant) {
        let revoked: Vec<(HttpToken, RawId)> = self
            .listens
            .iter()
            .filter(|(_, l)| match l.project.as_deref() {
                Some(p) => !self.holder_sees(&l.holder, p),
                None => l.holder.identity(&self.registry).is_none(),
            })
            .map(|(t, l)| (*t, l.id.clone()))
            .collect();
        if !revoked.is_empty() {
            tracing::info!(
                listeners = revoked.len(),
                "subscriptions/listen streams ended: their holders no longer see the project"
            );
        }
        for (token, id) in revoked {
            self.listener_gone(now, token);
            self.end_listen(token, &id);
        }
    }

    /// Tells every listener that wants it that the stateless `tools/list` changed.
    pub(super) fn notify_listeners_tools_changed(&mut self) {
        let to: Vec<(HttpToken, RawId)> = self
            .listens
            .iter()
            .filter(|(_, l)| l.tools)
            .map(|(t, l)| (*t, l.id.clone()))
            .collect();
        for (token, id) in to {
            self.listen_event(token, &id, "notifications/tools/list_changed", Map::new());
        }
    }

    /// A sled's `prompts/list_changed` or `resources/list_changed`: to the listeners of its
    /// project that asked for it.
    pub(super) fn notify_listeners_list_changed(&mut self, project: &str, method: &str) {
        let prompts = method == "notifications/prompts/list_changed";
        let to: Vec<(HttpToken, RawId)> = self
            .listens
            .iter()
            .filter(|(_, l)| {
                l.project.as_deref() == Some(project)
                    && if prompts { l.prompts } else { l.resources }
            })
            .map(|(t, l)| (*t, l.id.clone()))
            .collect();
        for (token, id) in to {
            self.listen_event(token, &id, method, Map::new());
        }
    }

    /// A sled's `resources/updated` for `uri`: to the listeners of its project subscribed to
    /// that URI.
    pub(super) fn notify_listeners_updated(&mut self, project: &str, uri: &str) {
        let to: Vec<(HttpToken, RawId)> = self
            .listens
            .iter()
            .filter(|(_, l)| l.project.as_deref() == Some(project) && l.uris.contains(uri))
            .map(|(t, l)| (*t, l.id.clone()))
            .collect();
        for (token, id) in to {
            let mut params = Map::new();
            params.insert("uri".into(), Value::String(uri.to_owned()));
            self.listen_event(token, &id, "notifications/resources/updated", params);
        }
    }

    /// `notifications/tasks` of `project`'s task `sled_id` to the listeners of it.
    pub(super) fn send_task_listeners(
        &mut self,
        project: &str,
        sled_id: &str,
        task: Map<String, Value>,
    ) {
        let to: Vec<(HttpToken, RawId, String)> = self
            .listens
            .iter()
            .filter_map(|(t, l)| {
                let (_, _, shown) = l
                    .tasks
                    .iter()
                    .find(|(p, s, _)| p == project && s == sled_id)?;
                Some((*t, l.id.clone(), shown.clone()))
            })
            .collect();
        for (token, id, shown) in to {
            let mut t = task.clone();
            t.insert("taskId".into(), Value::String(shown));
            self.listen_event(token, &id, "notifications/tasks", t);
        }
    }

    pub(super) fn listen_event(
        &mut self,
        token: HttpToken,
        id: &RawId,
        method: &str,
        mut params: Map<String, Value>,
    ) {
        let subscription: Value = serde_json::from_str(id.as_str()).expect("ids are JSON");
        params.insert(
            "_meta".into(),
            json!({ "io.modelcontextprotocol/subscriptionId": subscription }),
        );
        let data = json!({ "jsonrpc": "2.0", "method": method, "params": params });
        let n = Some(self.next_event_id());
        self.outputs.push_back(Output::StreamEvent {
            token,
            id: n,
            data: data.to_string(),
        });
    }

    /// Ends every subscription gracefully (shutdown).
    /// In a cluster, this replica no longer holds `project`'s sled: the listeners of the
    /// project's notifications are ended, so that their clients listen again
    /// where its sled is next (a listen naming a project held elsewhere is relayed there).
    pub(super) fn end_project_listens(&mut self, project: &str) {
        if !self.clustered() {
            return;
        }
        let ended: Vec<HttpToken> = self
            .listens
            .iter()
            .filter(|(_, l)| {
                l.project.as_deref() == Some(project)
                    && (l.prompts || l.resources || !l.uris.is_empty())
            })
            .map(|(t, _)| *t)
            .collect();
        for token in ended {
            if let Some(listen) = self.listens.remove(&token) {
                self.end_listen(token, &listen.id);
            }
        }
    }

    pub(super) fn end_listens(&mut self) {
        for (token, listen) in std::mem::take(&mut self.listens) {
            self.end_listen(token, &listen.id);
        }
    }

    fn end_listen(&mut self, token: HttpToken, id: &RawId) {
        let result = format!(
            r#"{{"resultType":"complete","_meta":{{"io.modelcontextprotocol/subscriptionId":{}}}}}"#,
            id.as_str()
        );
        let n = Some(self.next_event_id());
        self.outputs.push_back(Output::StreamEvent {
            token,
            id: n,
            data: jsonrpc::ok_response(id.as_str(), &result),
        });
        self.outputs.push_back(Output::StreamClose { token });
    }
}
