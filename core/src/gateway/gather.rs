//! Fleet tools answered for the whole cluster (issue 15): `aggregate_pipeline_status` asks
//! each project's `pipeline_status` of the replica holding its sled, and `gateway_health`
//! and `fleet_identity` take the rows of the projects another replica holds from it. The parts are
//! relayed requests of this replica's own (`crate::gather`); a replica answering one serves it
//! for its own sleds only, since it is marked relayed.

use super::*;
use crate::gather::{Answer, HealthGather, Purpose};

impl Gateway {
    /// Whether a fleet tool serving `req` asks the other replicas for their projects: in a
    /// cluster, for a client's request (a relayed one is answered for this replica's sleds).
    fn gathers_elsewhere(&self, req: &Req<'_>) -> bool {
        self.clustered() && !req.relayed
    }

    /// Relays a part of a fleet tool to `replica`: a `tools/call` of `tool` with `arguments`,
    /// to be answered within `timeout`; in `session` when it is given.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn relay_part(
        &mut self,
        req: &Req<'_>,
        replica: String,
        purpose: Purpose,
        timeout: Duration,
        tool: &str,
        arguments: Value,
        session: Option<&str>,
    ) -> Option<HttpToken> {
        if !self.clustered() {
            return None;
        }
        let deadline = req.now + timeout;
        let (token, mut request) =
            self.gathers
                .start(purpose, deadline, tool, arguments, req.credentials);
        request.session = session.map(str::to_owned);
        self.send_part(token, replica, request, timeout);
        Some(token)
    }

    /// A part of `aggregate_pipeline_status` for a project whose sled `replica` holds.
    pub(super) fn relay_pipeline_part(
        &mut self,
        req: &Req<'_>,
        fanout: u64,
        project: &str,
        per_sled: Duration,
    ) -> Option<HttpToken> {
        let now = req.now;
        if !self.gathers_elsewhere(req) {
            return None;
        }
        let replica = self.relay_target(project)?;
        let purpose = Purpose::Pipeline {
            fanout,
            project: project.to_owned(),
            replica: replica.clone(),
            sent_at: now,
        };
        let arguments = json!({ "project": project });
        self.relay_part(
            req,
            replica,
            purpose,
            per_sled,
            fleet::PIPELINE_TOOL,
            arguments,
            None,
        )
    }

    /// Gives up a part still open (its call's deadline passed, or its client went away): the
    /// replica asked is told, and cancels it.
    pub(super) fn abort_part(&mut self, token: HttpToken) {
        if self.gathers.take(token).is_some() {
            self.cancel_part(token);
        }
    }

    // ---- gateway_health and fleet_identity ----

    /// `gateway_health`: this replica's rows, and in a cluster, those of the projects other
    /// replicas hold taken from them (`Later`: the answer comes when they have answered).
    pub(super) fn gateway_health_call(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        modern: bool,
        arguments: &Map<String, Value>,
    ) -> Result<Served, RpcError> {
        let result = self.gateway_health(req, arguments)?;
        Ok(self.rows_from_holders(req, id, modern, GATEWAY_HEALTH, json!({}), result))
    }

    /// A fleet tool's `result` with a row per project: in a cluster, each row names its
    /// project's replica, and (for a client's request) the rows of projects other replicas
    /// hold are asked of them with `tool` and `arguments`; the answer waits for theirs.
    pub(super) fn rows_from_holders(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        modern: bool,
        tool: &'static str,
        arguments: Value,
        mut result: Value,
    ) -> Served {
        if !self.clustered() {
            return Served::Now(basics::tool_result(result));
        }
        let mut elsewhere: BTreeMap<String, Vec<String>> = BTreeMap::new();
        if let Some(rows) = result["projects"].as_array_mut() {
            for row in rows {
                let Some(project) = row["project"].as_str().map(str::to_owned) else {
                    continue;
                };
                row["replica"] = self.holder_of(&project).map_or(Value::Null, Value::from);
                if self.gathers_elsewhere(req) && !self.is_live(&project) {
                    if let Some(replica) = self.relay_target(&project) {
                        elsewhere.entry(replica).or_default().push(project);
                    }
                }
            }
        }
        if elsewhere.is_empty() {
            return Served::Now(basics::tool_result(result));
        }
        let gather = self.gathers.new_gather();
        let timeout = self.config.fanout_sled_timeout;
        for replica in elsewhere.keys() {
            let purpose = Purpose::Health {
                gather,
                replica: replica.clone(),
            };
            self.relay_part(
                req,
                replica.clone(),
                purpose,
                timeout,
                tool,
                arguments.clone(),
                None,
            );
        }
        self.gathers.health.insert(
            gather,
            HealthGather {
                tool,
                token: req.token,
                client_id: id.as_str().to_owned(),
                modern,
                result,
                waiting: elsewhere,
            },
        );
        Served::Later
    }

    /// A replica's `gateway_health` or `fleet_identity`: its rows for the projects it holds
    /// replace this one's.
    pub(super) fn health_part(&mut self, gather: u64, replica: &str, answer: Answer) {
        let Some(g) = self.gathers.health.get_mut(&gather) else {
            return;
        };
        let Some(projects) = g.waiting.remove(replica) else {
            return;
        };
        let theirs: Result<Vec<Value>, String> = match answer {
            Answer::Response {
                result: Some(r), ..
            } => serde_json::from_str::<Value>(r.get())
                .ok()
                .and_then(|v| v["structuredContent"]["projects"].as_array().cloned())
                .ok_or_else(|| "its answer has no rows".to_owned()),
            Answer::Response { error, .. } => Err(format!(
                "it answered with an error: {}",
                error.map_or_else(String::new, |e| e.get().to_owned())
            )),
            Answer::Failed(why) => Err(why),
        };
        let rows = g.result["projects"].as_array_mut();
        for row in rows.into_iter().flatten() {
            let Some(project) = row["project"].as_str() else {
                continue;
            };
            if !projects.iter().any(|p| p == project) {
                continue;
            }
            let replaced = match &theirs {
                Ok(their_rows) => their_rows
                    .iter()
                    .find(|r| r["project"].as_str() == Some(project))
                    .cloned()
                    .ok_or_else(|| "its rows do not include the project".to_owned()),
                Err(why) => Err(why.clone()),
            };
            match replaced {
                Ok(mut r) => {
                    if r["replica"].is_null() {
                        r["replica"] = replica.into();
                    }
                    // A sled refused here (an impostor that dialed this replica) is news the
                    // holder may not have: it stays in the row.
                    if g.tool == FLEET_IDENTITY && r["refused"].is_null() {
                        r["refused"] = row["refused"].take();
                    }
                    *row = r;
                }
                Err(why) => {
                    let what = if g.tool == GATEWAY_HEALTH {
                        "health"
                    } else {
                        "identity"
                    };
                    row["status"] = "unknown".into();
                    row["via"] = "replica".into();
                    row["reasons"] = json!([format!(
                        "its sled is held by replica '{replica}', which did not give its {what}: {why}"
                    )]);
                }
            }
        }
        if g.waiting.is_empty() {
            self.finish_health(gather);
        }
    }

    fn finish_health(&mut self, gather: u64) {
        let Some(mut g) = self.gathers.health.remove(&gather) else {
            return;
        };
        // The summary, again from the rows as they are now: every health status, or the
        // identity statuses present and the projects with a refused key.
        let every: &[&str] = if g.tool == GATEWAY_HEALTH {
            &["up", "down", "stale", "unknown"]
        } else {
            &[]
        };
        let mut summary: BTreeMap<String, Vec<Value>> = every
            .iter()
            .map(|s| ((*s).to_owned(), Vec::new()))
            .collect();
        for row in g.result["projects"].as_array().into_iter().flatten() {
            if let Some(status) = row["status"].as_str() {
                summary
                    .entry(status.to_owned())
                    .or_default()
                    .push(row["project"].clone());
            }
            if g.tool == FLEET_IDENTITY && !row["refused"].is_null() {
                summary
                    .entry("refused".to_owned())
                    .or_default()
                    .push(row["project"].clone());
            }
        }
        g.result["summary"] = json!(summary);
        let result = basics::tool_result(g.result);
        let body = if g.modern {
            jsonrpc::ok_response(&g.client_id, &basics::with_result_type(&result))
        } else {
            jsonrpc::ok_response(&g.client_id, &result)
        };
        self.reply(g.token, 200, Vec::new(), Some(body));
    }

    /// The client of a `gateway_health` waiting for other replicas went away; `true` when
    /// `token` was one.
    pub(super) fn abort_health(&mut self, token: HttpToken) -> bool {
        let Some(gather) = self
            .gathers
            .health
            .iter()
            .find(|(_, g)| g.token == token)
            .map(|(n, _)| *n)
        else {
            return false;
        };
        self.gathers.health.remove(&gather);
        let open = self
            .gathers
            .open_parts(|p| matches!(p, Purpose::Health { gather: g, .. } if *g == gather));
        for part in open {
            self.abort_part(part);
        }
        true
    }
}
