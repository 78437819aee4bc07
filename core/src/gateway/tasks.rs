//! Tasks through the gateway (issue 27), in both eras. The ids and records are the task
//! machine's (`crate::tasks`); this file routes `tasks/*` to the project a task id names, makes
//! a call a task where the client and the tool agree, and changes what comes back: every sled
//! task id becomes the id its caller sees, and the 2026-07-28 shapes are made from the
//! 2025-11-25 ones sleds speak.
//!
//! - **2025-11-25.** `params.task` on `tools/call` passes to the sled (its `ttl` bounded by
//!   [`tasks::MAX_TTL`]); `tasks/get`, `tasks/result` and `tasks/cancel` go to the sled the id
//!   names; `tasks/list` walks the caller's projects one page at a time (a composite cursor:
//!   the project and the sled's own cursor), keeping only the caller's tasks; the sled's
//!   `notifications/tasks/status` reach only the creator's session, as does progress under the
//!   creating call's token while the task runs.
//! - **2026-07-28** (`io.modelcontextprotocol/tasks`). A call of a tool whose
//!   `execution.taskSupport` is `optional` or `required` becomes a task when the request
//!   declares the extension (`required` without it is -32021); `tasks/get` asks the sled for the
//!   task and, once it is terminal, for its result, and answers the `DetailedTask`;
//!   `tasks/cancel` is `tasks/cancel`; `tasks/update` is acknowledged (the sleds' tasks never
//!   ask for input this way: every key is one not outstanding, which the extension says to
//!   ignore). `Mcp-Name` must be the `taskId` (`modern.rs`).

use super::*;
use crate::tasks::{self, Creator, Record, Sealed, Status, TaskSupport};

/// How an answer to a task-related request is changed on its way back (`Rewrite::Task`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TaskRewrite {
    /// A `tools/call` sent with `task`: a `CreateTaskResult` is recorded and gets the id the
    /// caller sees.
    Create {
        right: &'static str,
        creator: Creator,
    },
    /// `tasks/get`, `tasks/cancel` (2025-11-25): the task's id.
    Task { id: String, sealed: Sealed },
    /// `tasks/result`: the related-task id in `_meta`.
    Result { id: String, sealed: Sealed },
    /// One page of `tasks/list`, from `project`; `after`: the caller's projects after it.
    List {
        project: String,
        creator: Creator,
        after: Vec<String>,
    },
    /// 2026-07-28 `tasks/get`: the task, then (terminal) its result.
    ModernGet { id: String, sealed: Sealed },
    /// 2026-07-28 `tasks/get` of a terminal task, second step: its result, inlined into
    /// `task` (the first step's answer, made modern).
    ModernResult { task: Map<String, Value> },
    /// 2026-07-28 `tasks/cancel`: an empty acknowledgement.
    ModernCancel { sealed: Sealed },
}

/// `tasks/get`, `tasks/result`, `tasks/cancel` and `tasks/update` params.
#[derive(Deserialize)]
struct TaskParams {
    #[serde(rename = "taskId")]
    task_id: String,
    #[serde(rename = "_meta", default)]
    meta: Option<Value>,
}

/// `tasks/list` params.
#[derive(Deserialize, Default)]
struct ListParams {
    #[serde(default)]
    cursor: Option<String>,
    #[serde(rename = "_meta", default)]
    meta: Option<Value>,
}

/// The methods of each era that name a task.
pub(super) const HANDSHAKE_TASK_METHODS: &[&str] =
    &["tasks/get", "tasks/result", "tasks/cancel", "tasks/list"];
pub(super) const MODERN_TASK_METHODS: &[&str] = &["tasks/get", "tasks/update", "tasks/cancel"];

/// Whether a result is a 2025-11-25 `CreateTaskResult` (`{"task": {"taskId": …}}`): what a
/// sled may answer only to a call that asked for a task. Cheap for any other result.
pub(super) fn is_create_task_result(result: &str) -> bool {
    if !result.contains("\"taskId\"") {
        return false;
    }
    #[derive(Deserialize)]
    struct Shape<'a> {
        #[serde(borrow)]
        task: Option<&'a RawValue>,
    }
    serde_json::from_str::<Shape>(result)
        .ok()
        .and_then(|s| s.task)
        .and_then(|t| serde_json::from_str::<Map<String, Value>>(t.get()).ok())
        .is_some_and(|t| t.contains_key("taskId"))
}

/// Whether a stateless request's `_meta` declares the tasks extension.
pub(super) fn declares_tasks(meta: Option<&Value>) -> bool {
    meta.and_then(Value::as_object)
        .is_some_and(meta_declares_tasks)
}

/// [`declares_tasks`] of a `_meta` object.
pub(super) fn meta_declares_tasks(meta: &Map<String, Value>) -> bool {
    meta.get(headers::META_CLIENT_CAPABILITIES)
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(tasks::EXTENSION))
        .is_some()
}

fn right_letter(right: Right) -> &'static str {
    match right {
        Right::Read => "r",
        _ => "w",
    }
}

fn right_of(letter: &str) -> Right {
    match letter {
        "r" => Right::Read,
        _ => Right::Write,
    }
}

impl Gateway {
    /// Whether a `tools/call` of `tool` becomes a task, and what `task` to send the sled: the
    /// client's (2025-11-25, `client_task`), or the gateway's where a 2026-07-28 request
    /// declares the extension and the tool may run as one. `None`: a plain call.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn task_of_call(
        &self,
        req: &Req<'_>,
        project: &str,
        tool: &str,
        support: Option<TaskSupport>,
        client_task: Option<&RawValue>,
        meta: Option<&Value>,
        modern: bool,
    ) -> Result<Option<(Value, proxy::Rewrite)>, RpcError> {
        let support = support.unwrap_or_default();
        let ttl = if modern {
            let declared = declares_tasks(meta);
            match support {
                TaskSupport::Required if !declared => {
                    return Err(RpcError::TasksNotDeclared {
                        what: format!(
                        "tool '{tool}' of project '{project}' runs only as a task, so calling it"
                    ),
                    })
                }
                TaskSupport::Optional | TaskSupport::Required if declared => tasks::DEFAULT_TTL,
                _ => return Ok(None),
            }
        } else {
            let Some(raw) = client_task else {
                return Ok(None);
            };
            let task: Value =
                serde_json::from_str(raw.get()).map_err(|e| RpcError::InvalidParams {
                    method: "tools/call".into(),
                    detail: jsonrpc::clean_serde_message(&e),
                })?;
            let Value::Object(task) = task else {
                return Err(RpcError::InvalidParams {
                    method: "tools/call".into(),
                    detail: "`task` must be an object, like {\"ttl\": 60000}".into(),
                });
            };
            if support == TaskSupport::Forbidden {
                return Err(RpcError::TaskNotSupported {
                    tool: tool.to_owned(),
                    project: project.to_owned(),
                });
            }
            tasks::ttl_to_ask(task.get("ttl"))
        };
        let creator = self.creator_of(req);
        self.tasks
            .check_room(&creator)
            .map_err(|tasks::Refused::TooMany { max }| RpcError::TooManyTasks { max })?;
        let right = right_letter(self.right_for_tool(project, tool));
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        Ok(Some((
            json!({ "ttl": ttl_ms }),
            proxy::Rewrite::Task(Box::new(TaskRewrite::Create { right, creator })),
        )))
    }

    /// `tasks/*` of either era: the task id is opened for the caller (anything else is an
    /// unknown task), and the request goes to the sled of the project it names.
    pub(super) fn tasks_request(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        method: &str,
        params: Option<&RawValue>,
        mode: CallMode,
    ) -> Result<Served, RpcError> {
        let creator = self.creator_of(req);
        if method == "tasks/list" {
            return self.tasks_list(req, id, params, mode, creator);
        }
        let p: TaskParams = jsonrpc::params_of(method, params)?;
        let unknown = || RpcError::UnknownTask {
            method: method.to_owned(),
        };
        #[cfg(feature = "planted-bugs")]
        let opened = match self.config.planted {
            // The planted bug: the caller's id taken as a sled's own, in the caller's default
            // project (or the only one), as a gateway that never sealed ids would.
            Some(PlantedBug::TaskIdsUnsealed) => {
                self.tasks.open(&p.task_id, &creator).or_else(|| {
                    let project = self
                        .default_of(req)
                        .map(str::to_owned)
                        .or_else(|| self.registry.names().next().map(str::to_owned))?;
                    Some(Sealed {
                        project,
                        sled_id: p.task_id.clone(),
                        right: "r",
                    })
                })
            }
            _ => self.tasks.open(&p.task_id, &creator),
        };
        #[cfg(not(feature = "planted-bugs"))]
        let opened = self.tasks.open(&p.task_id, &creator);
        let sealed = opened.ok_or_else(unknown)?;
        if sealed.project == tasks::GATEWAY_PROJECT {
            return self.own_task_request(req, id, method, &sealed, mode.modern);
        }
        let route = match self.route(req, Some(&Value::String(sealed.project.clone())), method) {
            Ok(Placement::Here(route)) => route,
            Ok(Placement::Away(away)) => return Ok(Served::Away(away)),
            // A project gone from the registry, or hidden from the caller now: its tasks with
            // it.
            Err(RpcError::UnknownProject { .. }) => return Err(unknown()),
            Err(e) => return Err(e),
        };
        self.require(
            req.principal,
            &route.project,
            right_of(sealed.right),
            format_args!("{method}"),
        )?;
        if method == "tasks/update" {
            // No task of a sled asks for input through `inputRequests`: every key is one not
            // outstanding, which the extension says to acknowledge and ignore.
            return Ok(Served::Now("{}".to_owned()));
        }
        let (sled_method, rewrite) = match (mode.modern, method) {
            (true, "tasks/get") => (
                "tasks/get",
                TaskRewrite::ModernGet {
                    id: p.task_id.clone(),
                    sealed: sealed.clone(),
                },
            ),
            (true, _) => (
                "tasks/cancel",
                TaskRewrite::ModernCancel {
                    sealed: sealed.clone(),
                },
            ),
            (false, "tasks/result") => (
                "tasks/result",
                TaskRewrite::Result {
                    id: p.task_id.clone(),
                    sealed: sealed.clone(),
                },
            ),
            (false, m) => (
                if m == "tasks/get" || self.cancel_not_sent() {
                    "tasks/get"
                } else {
                    "tasks/cancel"
                },
                TaskRewrite::Task {
                    id: p.task_id.clone(),
                    sealed: sealed.clone(),
                },
            ),
        };
        let mut route = route;
        if sled_method == "tasks/result" {
            // It waits for the task, which may outlive any call's deadline: bounded by the
            // task's TTL instead.
            let left = self
                .tasks
                .get(&sealed.project, &sealed.sled_id)
                .map(|r| r.expires.saturating_duration_since(req.now))
                .unwrap_or(tasks::DEFAULT_TTL);
            route.timeout = left.max(route.timeout);
        }
        let mut object = Map::new();
        object.insert("taskId".into(), Value::String(sealed.sled_id.clone()));
        let params = proxy::Outgoing {
            object: Value::Object(object).to_string(),
            meta: p.meta,
        };
        self.forward(
            req,
            id,
            mode,
            route,
            sled_method,
            params,
            method.to_owned(),
            proxy::Rewrite::Task(Box::new(rewrite)),
        )
    }

    /// `tasks/list` (2025-11-25): one page from one project, kept to the caller's own tasks,
    /// with a cursor naming the project and the sled's own cursor. The pages walk the
    /// projects the caller sees, in registry order; a project held here where the caller has
    /// no task is skipped without asking its sled. A project held by another replica is served
    /// there (its records are where its sled is): the first page of a request is relayed
    /// there whole, and a walk that reaches one stops with a cursor naming it.
    fn tasks_list(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        params: Option<&RawValue>,
        mode: CallMode,
        creator: Creator,
    ) -> Result<Served, RpcError> {
        let p: ListParams = match params {
            Some(_) => jsonrpc::params_of("tasks/list", params)?,
            None => ListParams::default(),
        };
        #[cfg(feature = "planted-bugs")]
        let everyone = self.config.planted == Some(PlantedBug::TasksListUnfiltered);
        #[cfg(not(feature = "planted-bugs"))]
        let everyone = false;
        let with_tasks: BTreeSet<String> = if everyone {
            self.tasks.all().into_iter().map(|(p, _)| p).collect()
        } else {
            self.tasks
                .mine(&creator)
                .into_iter()
                .map(|(p, _)| p.to_owned())
                .collect()
        };
        // The gateway's own tasks first (those run here), then the projects'.
        let visible: Vec<String> = with_tasks
            .get(tasks::GATEWAY_PROJECT)
            .cloned()
            .into_iter()
            .chain(
                self.registry
                    .names()
                    .filter(|p| self.sees(req.principal, p))
                    .map(str::to_owned),
            )
            .collect();
        let bad_cursor = || RpcError::InvalidParams {
            method: "tasks/list".into(),
            detail: "the cursor is not one this gateway gave out for this caller".into(),
        };
        let (first, mut sled_cursor) = match p.cursor.as_deref() {
            None => (0, None),
            Some(c) => {
                let (project, cursor) = decode_list_cursor(c).ok_or_else(bad_cursor)?;
                let at = visible
                    .iter()
                    .position(|p| *p == project)
                    .ok_or_else(bad_cursor)?;
                (at, cursor)
            }
        };
        let here = |gw: &Gateway, p: &str| gw.projects.get(p).is_some_and(|s| s.uplink.is_some());
        let mut at = first;
        loop {
            let Some(project) = visible.get(at).cloned() else {
                return Ok(Served::Now(list_page(Vec::new(), None)));
            };
            if project == tasks::GATEWAY_PROJECT {
                let mine = self.own_tasks_of(&creator);
                let next = visible.get(at + 1).map(|p| encode_list_cursor(p, None));
                return Ok(Served::Now(list_page(mine, next)));
            }
            if !here(self, &project) {
                if at == first {
                    // Where its sled is, if anywhere: relayed there whole.
                    if let Ok(Placement::Away(away)) =
                        self.route(req, Some(&Value::String(project.clone())), "tasks/list")
                    {
                        return Ok(Served::Away(away));
                    }
                    // Its sled is nowhere now: its tasks cannot be listed; go on.
                } else if !self.clustered() {
                    // A single gateway has every record: nothing of the caller's is there.
                } else {
                    let next = encode_list_cursor(&project, None);
                    return Ok(Served::Now(list_page(Vec::new(), Some(next))));
                }
                at += 1;
                sled_cursor = None;
                continue;
            }
            if !with_tasks.contains(&project) {
                at += 1;
                sled_cursor = None;
                continue;
            }
            let route = match self.route(req, Some(&Value::String(project.clone())), "tasks/list") {
                Ok(Placement::Here(route)) => route,
                Ok(Placement::Away(away)) => return Ok(Served::Away(away)),
                Err(_) => {
                    at += 1;
                    sled_cursor = None;
                    continue;
                }
            };
            // Where the walk goes after this project: the next one that may hold something
            // of the caller's.
            let after: Vec<String> = visible[at + 1..]
                .iter()
                .filter(|p| with_tasks.contains(*p) || (!here(self, p) && self.clustered()))
                .cloned()
                .collect();
            let mut object = Map::new();
            if let Some(c) = sled_cursor {
                object.insert("cursor".into(), Value::String(c));
            }
            let params = proxy::Outgoing {
                object: Value::Object(object).to_string(),
                meta: p.meta,
            };
            return self.forward(
                req,
                id,
                mode,
                route,
                "tasks/list",
                params,
                "tasks/list".into(),
                proxy::Rewrite::Task(Box::new(TaskRewrite::List {
                    project,
                    creator,
                    after,
                })),
            );
        }
    }

    /// Whether `PlantedBug::TaskCancelNotSent` is planted.
    fn cancel_not_sent(&self) -> bool {
        #[cfg(feature = "planted-bugs")]
        return self.config.planted == Some(PlantedBug::TaskCancelNotSent);
        #[cfg(not(feature = "planted-bugs"))]
        false
    }

    /// A sled's answer to a task-related request (`call.rewrite` is a `Rewrite::Task`).
    pub(super) fn on_task_answer(
        &mut self,
        now: Instant,
        call: Call,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
    ) {
        let proxy::Rewrite::Task(rewrite) = call.rewrite.clone() else {
            return;
        };
        let took = now.saturating_duration_since(call.sent_at);
        let id = call.client_id.as_str().to_owned();
        let bad = |gw: &Gateway, call: &Call| {
            let project = call.project.clone();
            let sled = gw.sled_of(&project);
            RpcError::BadSledResponse { project, sled }.response(Some(&id))
        };
        let parsed: Option<Map<String, Value>> =
            result.and_then(|r| serde_json::from_str(r.get()).ok());
        let mut created = false;
        let (body, outcome) = match (parsed, error, *rewrite) {
            (None, Some(error), TaskRewrite::ModernResult { mut task })
                if error.get().starts_with('{') =>
            {
                // The task failed: its error, inlined.
                if let Ok(e) = serde_json::from_str::<Value>(error.get()) {
                    task.insert("status".into(), json!("failed"));
                    task.insert("error".into(), e);
                }
                (modern_body(&id, task), Outcome::Ok)
            }
            (None, Some(error), _) if error.get().starts_with('{') => (
                jsonrpc::raw_error_response(&id, error.get()),
                Outcome::Error,
            ),
            (Some(mut r), None, TaskRewrite::Create { right, creator }) => {
                match r.get_mut("task").and_then(Value::as_object_mut) {
                    Some(task) => match self.task_created(now, &call, task, right, creator) {
                        Some(()) if call.modern => {
                            created = true;
                            let mut t = modern_task(std::mem::take(task));
                            t.insert("resultType".into(), json!("task"));
                            (modern_body(&id, t), Outcome::Ok)
                        }
                        Some(()) => {
                            created = true;
                            (
                                jsonrpc::ok_response(&id, &Value::Object(r).to_string()),
                                Outcome::Ok,
                            )
                        }
                        None => {
                            self.counters.frames_invalid += 1;
                            (bad(self, &call), Outcome::BadResponse)
                        }
                    },
                    // The sled ran it as a plain call (the spec lets a receiver ignore `task`).
                    None if call.modern => (
                        jsonrpc::ok_response(
                            &id,
                            &basics::with_result_type(&Value::Object(r).to_string()),
                        ),
                        Outcome::Ok,
                    ),
                    None => (
                        jsonrpc::ok_response(&id, &Value::Object(r).to_string()),
                        Outcome::Ok,
                    ),
                }
            }
            (
                Some(mut r),
                None,
                TaskRewrite::Task {
                    id: sealed_id,
                    sealed,
                },
            ) => {
                self.task_seen(&sealed, &r);
                if call.tool == "tasks/cancel" && self.cancel_not_sent() {
                    r.insert("status".into(), json!("cancelled"));
                }
                r.insert("taskId".into(), Value::String(sealed_id));
                (
                    jsonrpc::ok_response(&id, &Value::Object(r).to_string()),
                    Outcome::Ok,
                )
            }
            (
                Some(mut r),
                None,
                TaskRewrite::Result {
                    id: sealed_id,
                    sealed,
                },
            ) => {
                if let Some(Value::Object(meta)) = r.get_mut("_meta") {
                    if let Some(Value::Object(related)) = meta.get_mut(tasks::RELATED_TASK) {
                        related.insert("taskId".into(), Value::String(sealed_id));
                    }
                }
                self.tasks
                    .handle_status(&sealed.project, &sealed.sled_id, Status::Completed);
                (
                    jsonrpc::ok_response(&id, &Value::Object(r).to_string()),
                    Outcome::Ok,
                )
            }
            (
                Some(r),
                None,
                TaskRewrite::List {
                    project,
                    creator,
                    after,
                },
            ) => {
                let listed = r
                    .get("tasks")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let mut kept = Vec::new();
                for mut t in listed {
                    let Some(sled_id) = t.get("taskId").and_then(Value::as_str).map(str::to_owned)
                    else {
                        continue;
                    };
                    #[cfg(feature = "planted-bugs")]
                    let everyone = self.config.planted == Some(PlantedBug::TasksListUnfiltered);
                    #[cfg(not(feature = "planted-bugs"))]
                    let everyone = false;
                    let Some(record) = self.tasks.get(&project, &sled_id) else {
                        continue;
                    };
                    if record.creator != creator && !everyone {
                        continue;
                    }
                    let sealed = Sealed {
                        project: project.clone(),
                        sled_id,
                        right: record.right,
                    };
                    let shown = self.tasks.seal(&sealed, &record.creator);
                    t["taskId"] = Value::String(shown);
                    kept.push(t);
                }
                let next = match r.get("nextCursor").and_then(Value::as_str) {
                    Some(c) => Some(encode_list_cursor(&project, Some(c))),
                    None => after.first().map(|p| encode_list_cursor(p, None)),
                };
                (
                    jsonrpc::ok_response(&id, &list_page(kept, next)),
                    Outcome::Ok,
                )
            }
            (
                Some(r),
                None,
                TaskRewrite::ModernGet {
                    id: sealed_id,
                    sealed,
                },
            ) => {
                self.task_seen(&sealed, &r);
                let status = r
                    .get("status")
                    .and_then(Value::as_str)
                    .and_then(Status::parse);
                let mut task = modern_task(r);
                task.insert("taskId".into(), Value::String(sealed_id));
                match status {
                    Some(Status::Completed | Status::Failed) => {
                        // Terminal: its result (or error) comes with it.
                        let params = json!({ "taskId": sealed.sled_id }).to_string();
                        return self.continue_call(
                            now,
                            call,
                            "tasks/result",
                            &params,
                            TaskRewrite::ModernResult { task },
                        );
                    }
                    Some(_) => (modern_body(&id, task), Outcome::Ok),
                    None => {
                        self.counters.frames_invalid += 1;
                        (bad(self, &call), Outcome::BadResponse)
                    }
                }
            }
            (Some(r), None, TaskRewrite::ModernResult { mut task }) => {
                task.insert("result".into(), modern_tool_result(r));
                (modern_body(&id, task), Outcome::Ok)
            }
            (Some(_), None, TaskRewrite::ModernCancel { sealed }) => {
                let _ = sealed;
                (
                    jsonrpc::ok_response(&id, r#"{"resultType":"complete"}"#),
                    Outcome::Ok,
                )
            }
            _ => {
                self.counters.frames_invalid += 1;
                (bad(self, &call), Outcome::BadResponse)
            }
        };
        // A new task is answered once its record is durable (with a store): a `tasks/list`
        // after a restart finds it. An answer already streaming goes at once.
        if created && self.keeps_records() && !call.streamed && call.mrtr.is_none() {
            self.call_ended(now, &call, outcome, Some(took));
            let reply = HttpReply {
                status: 200,
                headers: Vec::new(),
                body: Some(body),
            };
            let status_of: fn(i64) -> u16 = if call.modern {
                headers::modern_status
            } else {
                |_| 200
            };
            return self.answer_coordinated(
                now,
                call.token,
                (reply, call.client_id.as_str(), status_of),
                ("tools/call", call.project.clone()),
            );
        }
        self.finish_or_hold(now, call, body, outcome, took);
    }

    /// A sled's `CreateTaskResult` for `call`: the task is recorded for its creator and its id
    /// replaced by the one the caller sees. `None`: the task is malformed.
    fn task_created(
        &mut self,
        now: Instant,
        call: &Call,
        task: &mut Map<String, Value>,
        right: &'static str,
        creator: Creator,
    ) -> Option<()> {
        let sled_id = task.get("taskId")?.as_str()?.to_owned();
        if sled_id.is_empty() || sled_id.len() > 512 {
            return None;
        }
        let status = Status::parse(task.get("status")?.as_str()?)?;
        let ttl = tasks::ttl_kept(task.get("ttl").and_then(Value::as_u64));
        let sealed = Sealed {
            project: call.project.clone(),
            sled_id: sled_id.clone(),
            right,
        };
        let shown = self.tasks.seal(&sealed, &creator);
        // Progress under the creating call's token reaches its session's stream while the
        // task runs (the stateless era has no stream to carry it).
        let progress = call
            .progress
            .clone()
            .filter(|_| creator.session.is_some() && !status.is_terminal());
        self.tasks.handle_created(
            &call.project,
            &sled_id,
            Record {
                creator,
                right,
                created: now,
                expires: now + ttl,
                status,
                progress,
                own: None,
            },
        );
        task.insert("taskId".into(), Value::String(shown));
        Some(())
    }

    /// A task's status as a sled's answer shows it.
    fn task_seen(&mut self, sealed: &Sealed, task: &Map<String, Value>) {
        if let Some(status) = task
            .get("status")
            .and_then(Value::as_str)
            .and_then(Status::parse)
        {
            self.tasks
                .handle_status(&sealed.project, &sealed.sled_id, status);
        }
    }

    /// Sends the next step of a call up the same project's uplink, answering the same client
    /// request (2026-07-28 `tasks/get` of a terminal task asks for its result).
    fn continue_call(
        &mut self,
        now: Instant,
        call: Call,
        method: &str,
        params: &str,
        rewrite: TaskRewrite,
    ) {
        let uplink = self.projects.get(&call.project).and_then(|p| p.uplink);
        let Some(uplink) = uplink else {
            let project = call.project.clone();
            let sled = self.sled_of(&project);
            let body = RpcError::SledNotConnected { sled, project }
                .response(Some(call.client_id.as_str()));
            let took = now.saturating_duration_since(call.sent_at);
            return self.finish_or_hold(now, call, body, Outcome::Error, took);
        };
        let rpc_id = self.calls.next_id();
        let text = jsonrpc::request(rpc_id, method, params);
        let next = Call {
            rewrite: proxy::Rewrite::Task(Box::new(rewrite)),
            progress: None,
            ..call
        };
        self.calls.start(uplink, rpc_id, Pending::Call(next));
        self.outputs.push_back(Output::UplinkSend { uplink, text });
    }

    /// A sled's `notifications/tasks/status`: recorded, and sent (with the id the caller sees)
    /// to the creator's session, and nowhere else.
    pub(super) fn on_task_status(
        &mut self,
        now: Instant,
        uplink: UplinkId,
        params: Option<&RawValue>,
    ) {
        let Some(project) = self.live_project(uplink) else {
            return;
        };
        let Some(mut task) =
            params.and_then(|p| serde_json::from_str::<Map<String, Value>>(p.get()).ok())
        else {
            self.counters.frames_invalid += 1;
            return;
        };
        let (Some(sled_id), Some(status)) = (
            task.get("taskId")
                .and_then(Value::as_str)
                .map(str::to_owned),
            task.get("status")
                .and_then(Value::as_str)
                .and_then(Status::parse),
        ) else {
            self.counters.frames_invalid += 1;
            return;
        };
        // Stateless listeners of the task (whose ids opened for them when they listened).
        self.notify_task_listeners(now, &project, &sled_id, status, &task);
        let Some(record) = self
            .tasks
            .handle_status(&project, &sled_id, status)
            .cloned()
        else {
            // A task this gateway keeps no record of (made through another, or expired).
            return;
        };
        let Some(session) = record.creator.session.as_deref().map(str::to_owned) else {
            return;
        };
        let sealed = Sealed {
            project,
            sled_id,
            right: record.right,
        };
        let shown = self.tasks.seal(&sealed, &record.creator);
        name_related_task(&mut task, &shown);
        task.insert("taskId".into(), Value::String(shown));
        let data = jsonrpc::notification(
            "notifications/tasks/status",
            &Value::Object(task).to_string(),
        );
        self.notify_session_anywhere(&session, data);
    }

    /// `notifications/tasks` to the stateless listeners of a task: at once while it runs or
    /// once cancelled; a completed or failed one once its result (or error) is fetched, since
    /// the notification carries the whole `DetailedTask`.
    fn notify_task_listeners(
        &mut self,
        now: Instant,
        project: &str,
        sled_id: &str,
        status: Status,
        task: &Map<String, Value>,
    ) {
        let wanted = self
            .listens
            .values()
            .any(|l| l.tasks.iter().any(|(p, s, _)| p == project && s == sled_id));
        if !wanted {
            return;
        }
        if !matches!(status, Status::Completed | Status::Failed) {
            return self.send_task_listeners(project, sled_id, modern_task(task.clone()));
        }
        let Some(uplink) = self.projects.get(project).and_then(|p| p.uplink) else {
            return;
        };
        let rpc_id = self.calls.next_id();
        self.calls.start(
            uplink,
            rpc_id,
            Pending::TaskFetch {
                project: project.to_owned(),
                sled_id: sled_id.to_owned(),
                task: Box::new(task.clone()),
                deadline: now + self.config.refresh_timeout,
            },
        );
        let params = json!({ "taskId": sled_id }).to_string();
        let text = jsonrpc::request(rpc_id, "tasks/result", &params);
        self.outputs.push_back(Output::UplinkSend { uplink, text });
    }

    /// The result of a terminal task, fetched for its listeners.
    pub(super) fn on_task_fetched(
        &mut self,
        project: &str,
        sled_id: &str,
        task: Map<String, Value>,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
    ) {
        let mut t = modern_task(task);
        match (
            result.and_then(|r| serde_json::from_str::<Map<String, Value>>(r.get()).ok()),
            error.and_then(|e| serde_json::from_str::<Value>(e.get()).ok()),
        ) {
            (Some(r), _) => {
                t.insert("result".into(), modern_tool_result(r));
            }
            (None, Some(e)) => {
                t.insert("status".into(), json!("failed"));
                t.insert("error".into(), e);
            }
            _ => {
                self.counters.frames_invalid += 1;
                return;
            }
        }
        self.send_task_listeners(project, sled_id, t);
    }

    /// A sled's progress under a token no pending call has: the creating call of a task still
    /// running, answered since. It reaches the creator's session only, and only from the
    /// uplink now serving the task's project.
    pub(super) fn task_progress(
        &mut self,
        uplink: UplinkId,
        gateway_token: &str,
        mut params: Map<String, Value>,
    ) {
        let Some((project, sled_id, record)) = self.tasks.by_progress(gateway_token) else {
            return;
        };
        let shown = self.tasks.seal(
            &Sealed {
                project: project.to_owned(),
                sled_id: sled_id.to_owned(),
                right: record.right,
            },
            &record.creator,
        );
        if self.projects.get(project).and_then(|p| p.uplink) != Some(uplink) {
            return;
        }
        let (Some(session), Some((_, client_token))) =
            (record.creator.session.as_deref(), record.progress.as_ref())
        else {
            return;
        };
        let session = session.to_owned();
        let client_token: Value =
            serde_json::from_str(client_token.get()).expect("a progress token is JSON");
        params.insert("progressToken".into(), client_token);
        name_related_task(&mut params, &shown);
        let data =
            jsonrpc::notification("notifications/progress", &Value::Object(params).to_string());
        self.notify_session_anywhere(&session, data);
    }
}

/// A message's `_meta["io.modelcontextprotocol/related-task"]` names the task by the id its
/// client knows (the sled wrote its own).
fn name_related_task(params: &mut Map<String, Value>, shown: &str) {
    if let Some(Value::Object(meta)) = params.get_mut("_meta") {
        if let Some(Value::Object(related)) = meta.get_mut(tasks::RELATED_TASK) {
            related.insert("taskId".into(), Value::String(shown.to_owned()));
        }
    }
}

/// A 2025-11-25 `Task` made a 2026-07-28 one: `ttl` is `ttlMs`, `pollInterval` is
/// `pollIntervalMs`.
pub(super) fn modern_task(mut t: Map<String, Value>) -> Map<String, Value> {
    if let Some(ttl) = t.remove("ttl") {
        t.insert("ttlMs".into(), ttl);
    } else {
        t.insert("ttlMs".into(), Value::Null);
    }
    if let Some(p) = t.remove("pollInterval") {
        t.insert("pollIntervalMs".into(), p);
    }
    t.remove("_meta");
    t
}

/// A sled's `tools/call` result, inlined in a 2026-07-28 `DetailedTask`: a result of that era
/// (`resultType` `complete`, as every 2026-07-28 `CallToolResult` says), without the
/// related-task `_meta`, which names the sled's own id.
pub(super) fn modern_tool_result(mut r: Map<String, Value>) -> Value {
    if let Some(Value::Object(meta)) = r.get_mut("_meta") {
        meta.remove(tasks::RELATED_TASK);
        if meta.is_empty() {
            r.remove("_meta");
        }
    }
    r.entry("resultType").or_insert_with(|| json!("complete"));
    Value::Object(r)
}

/// A 2026-07-28 answer with `result`: `resultType` `complete` unless it says otherwise.
fn modern_body(id: &str, mut task: Map<String, Value>) -> String {
    let kind = task
        .remove("resultType")
        .unwrap_or_else(|| json!("complete"));
    let mut out = Map::new();
    out.insert("resultType".into(), kind);
    out.extend(task);
    jsonrpc::ok_response(id, &Value::Object(out).to_string())
}

fn list_page(tasks: Vec<Value>, next: Option<String>) -> String {
    let mut out = json!({ "tasks": tasks });
    if let Some(n) = next {
        out["nextCursor"] = Value::String(n);
    }
    out.to_string()
}

/// A `tasks/list` cursor: the project and the sled's own cursor, as base64url JSON.
fn encode_list_cursor(project: &str, sled: Option<&str>) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json!([project, sled]).to_string())
}

fn decode_list_cursor(cursor: &str) -> Option<(String, Option<String>)> {
    use base64::Engine;
    if cursor.len() > 4096 {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()?;
    let (project, sled): (String, Option<String>) = serde_json::from_slice(&bytes).ok()?;
    Some((project, sled))
}
