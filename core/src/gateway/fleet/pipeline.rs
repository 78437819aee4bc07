//! `aggregate_pipeline_status`: `pipeline_status` asked of every project's sled at once.

use super::*;
use crate::gateway::own_tasks::{own_modern, own_result, own_task_json};
use crate::gateway::tasks::modern_task;
use crate::tasks::{self, Own, Record, Status};

/// The sled tool `aggregate_pipeline_status` calls on every project.
pub(in crate::gateway) const PIPELINE_TOOL: &str = "pipeline_status";

/// The longest overall deadline a caller may ask of `aggregate_pipeline_status`.
const MAX_FANOUT_TIMEOUT: Duration = Duration::from_secs(60);

/// One `aggregate_pipeline_status` call, waiting for its sleds.
#[derive(Debug)]
pub(in crate::gateway) struct Fanout {
    token: HttpToken,
    client_id: RawId,
    modern: bool,
    started: Instant,
    deadline: Instant,
    per_sled: Duration,
    parts: BTreeMap<String, Part>,
    waiting: usize,
    /// The identity it counts for (`max_fanouts_per_identity`), with authentication on.
    owner: Option<String>,
    /// It runs as a task of the gateway's own, with this id (`crate::tasks::GATEWAY_PROJECT`):
    /// its result goes to the task, not to the HTTP request (answered when it began).
    task: Option<String>,
}

#[derive(Debug)]
enum Part {
    Waiting {
        uplink: UplinkId,
        rpc_id: u64,
    },
    /// Asked of the replica that holds the project's sled (`gather.rs`).
    Relayed {
        token: HttpToken,
    },
    Answered(Answered),
    Failed {
        reason: &'static str,
        detail: String,
    },
}

impl Part {
    /// Still waiting for its answer.
    fn open(&self) -> bool {
        matches!(self, Part::Waiting { .. } | Part::Relayed { .. })
    }
}

/// A sled's pipeline status, taken apart when it arrives: its row of the answer, already
/// serialised, and what it adds to the fleet's totals. The rows are then only joined when the
/// last sled has answered.
#[derive(Debug)]
pub(in crate::gateway) struct Answered {
    row: String,
    total: u64,
    stages: BTreeMap<String, u64>,
    blocked: usize,
    failing: usize,
}

impl Gateway {
    // ---- aggregate_pipeline_status ----

    /// Sends `pipeline_status` to every registered project's sled at once; answers when all
    /// have answered or failed, or at the overall deadline, naming every project that did not
    /// answer and why.
    pub(in crate::gateway) fn aggregate_pipeline_status(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        modern: bool,
        arguments: &Map<String, Value>,
        task: Option<Duration>,
    ) -> Result<Served, RpcError> {
        let Req { now, token, .. } = *req;
        basics::only_arguments(
            AGGREGATE_PIPELINE_STATUS,
            arguments,
            &["timeout_ms", "per_project_timeout_ms"],
        )?;
        let ms = |name: &str, default: Duration| -> Result<Duration, RpcError> {
            match arguments.get(name) {
                None => Ok(default),
                Some(v) => match v.as_u64() {
                    Some(n) if n >= 1 && Duration::from_millis(n) <= MAX_FANOUT_TIMEOUT => {
                        Ok(Duration::from_millis(n))
                    }
                    _ => Err(RpcError::InvalidParams {
                        method: AGGREGATE_PIPELINE_STATUS.into(),
                        detail: format!(
                            "`{name}` must be a whole number of milliseconds from 1 to {}, not {v}",
                            millis(MAX_FANOUT_TIMEOUT)
                        ),
                    }),
                },
            }
        };
        let overall = ms("timeout_ms", self.config.fanout_timeout)?;
        let per_sled = ms(
            "per_project_timeout_ms",
            self.config.fanout_sled_timeout.min(overall),
        )?
        .min(overall);
        // One fan-out asks every visible sled: an identity may have only a few running
        // (security review finding 15).
        let owner = req.principal.session_owner(&self.registry);
        if let Some(o) = owner.as_deref() {
            let running = self
                .fanouts
                .values()
                .filter(|(f, _)| f.owner.as_deref() == Some(o))
                .count();
            let max = self.config.max_fanouts_per_identity;
            if running >= max {
                self.counters.calls_refused += 1;
                tracing::debug!(max, "aggregate_pipeline_status refused by a limit");
                return Err(RpcError::TooManyFanouts {
                    max,
                    retry_after: self.config.retry_after,
                });
            }
        }
        let fanout_id = self.next_fanout;
        self.next_fanout += 1;
        let mut parts = BTreeMap::new();
        let mut waiting = 0;
        let names = self.visible_projects(req.principal);
        let params = json!({ "name": PIPELINE_TOOL, "arguments": {} }).to_string();
        for project in names {
            let part = self.send_pipeline_status(req, fanout_id, &project, per_sled, &params);
            if part.open() {
                waiting += 1;
            }
            parts.insert(project, part);
        }
        let mut fanout = Fanout {
            token,
            client_id: id.clone(),
            modern,
            started: now,
            deadline: now + overall,
            per_sled,
            parts,
            waiting,
            owner,
            task: None,
        };
        if let Some(ttl) = task {
            let created = self.start_own_task(req, ttl, modern);
            fanout.task = Some(created.0.clone());
            if waiting == 0 {
                let result = fanout_result(now, fanout, overall);
                self.own_task_done(now, &created.0, Ok(result));
            } else {
                self.timers
                    .insert((fanout.deadline, Timer::Fanout(fanout_id)));
                self.fanouts.insert(fanout_id, (fanout, overall));
            }
            // Answered once its record is durable, where records are kept.
            return Ok(Served::Coordinated {
                result: created.1,
                tool: AGGREGATE_PIPELINE_STATUS,
                project: crate::tasks::GATEWAY_PROJECT.to_owned(),
            });
        }
        if waiting == 0 {
            return Ok(Served::Now(fanout_result(now, fanout, overall)));
        }
        self.timers
            .insert((fanout.deadline, Timer::Fanout(fanout_id)));
        self.fanout_by_token.insert(token, fanout_id);
        self.fanouts.insert(fanout_id, (fanout, overall));
        Ok(Served::Later)
    }

    fn send_pipeline_status(
        &mut self,
        req: &Req<'_>,
        fanout: u64,
        project: &str,
        per_sled: Duration,
        params: &str,
    ) -> Part {
        let state = &self.projects[project];
        let Some(uplink_id) = state.uplink else {
            // In a cluster, another replica may hold its sled: asked there.
            if let Some(token) = self.relay_pipeline_part(req, fanout, project, per_sled) {
                return Part::Relayed { token };
            }
            let sled = self.sled_of(project);
            return Part::Failed {
                reason: "no_uplink",
                detail: format!("sled '{sled}' is not connected"),
            };
        };
        if state
            .tools
            .as_ref()
            .is_some_and(|ts| !ts.iter().any(|t| t.name == PIPELINE_TOOL))
        {
            return Part::Failed {
                reason: "error",
                detail: format!("the sled does not list a `{PIPELINE_TOOL}` tool"),
            };
        }
        if self.calls.on_uplink(uplink_id) >= self.config.max_calls_per_sled {
            self.counters.calls_refused += 1;
            self.call_metrics
                .count(PIPELINE_TOOL, project, Outcome::Refused);
            return Part::Failed {
                reason: "error",
                detail: format!(
                    "the sled has {} calls in flight, its limit (max_calls_per_sled)",
                    self.config.max_calls_per_sled
                ),
            };
        }
        let rpc_id = self.calls.next_id();
        let now = req.now;
        self.calls.start(
            uplink_id,
            rpc_id,
            Pending::FanoutPart {
                fanout,
                project: project.to_owned(),
                sent_at: now,
                deadline: now + per_sled,
            },
        );
        self.counters.calls_forwarded += 1;
        self.outputs.push_back(Output::UplinkSend {
            uplink: uplink_id,
            text: jsonrpc::request(rpc_id, "tools/call", params),
        });
        Part::Waiting {
            uplink: uplink_id,
            rpc_id,
        }
    }

    /// A sled's answer to its part of a fan-out (its pending entry already removed).
    pub(in crate::gateway) fn on_fanout_answer(
        &mut self,
        now: Instant,
        fanout: u64,
        project: String,
        sent_at: Instant,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
    ) {
        let took = now.saturating_duration_since(sent_at);
        let (part, outcome) = match (result, error) {
            (Some(r), None) => match parse_pipeline_status(r.get(), &project, took) {
                Ok(answered) => (Part::Answered(answered), Outcome::Ok),
                Err(detail) => (
                    Part::Failed {
                        reason: "error",
                        detail,
                    },
                    Outcome::Error,
                ),
            },
            (None, Some(e)) => {
                let message = serde_json::from_str::<Value>(e.get())
                    .ok()
                    .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| e.get().to_owned());
                (
                    Part::Failed {
                        reason: "error",
                        detail: format!("the sled answered with an error: {message}"),
                    },
                    Outcome::Error,
                )
            }
            _ => {
                self.counters.frames_invalid += 1;
                (
                    Part::Failed {
                        reason: "error",
                        detail: "the sled's response had neither a result nor an error".into(),
                    },
                    Outcome::BadResponse,
                )
            }
        };
        self.call_metrics.count(PIPELINE_TOOL, &project, outcome);
        self.call_metrics.observe(&project, took);
        self.settle_part(now, fanout, &project, part);
    }

    /// A fan-out part that will get no answer: its sled's deadline passed or its uplink went.
    pub(in crate::gateway) fn fail_fanout_part(
        &mut self,
        now: Instant,
        fanout: u64,
        project: &str,
        reason: &'static str,
        detail: String,
        outcome: Outcome,
    ) {
        self.call_metrics.count(PIPELINE_TOOL, project, outcome);
        self.settle_part(now, fanout, project, Part::Failed { reason, detail });
    }

    pub(in crate::gateway) fn fanout_sled_timeout(&self, fanout: u64) -> Duration {
        self.fanouts
            .get(&fanout)
            .map_or(Duration::ZERO, |(f, _)| f.per_sled)
    }

    fn settle_part(&mut self, now: Instant, fanout: u64, project: &str, part: Part) {
        let Some((f, _)) = self.fanouts.get_mut(&fanout) else {
            return;
        };
        let Some(slot) = f.parts.get_mut(project) else {
            return;
        };
        if !slot.open() {
            return;
        }
        *slot = part;
        f.waiting -= 1;
        if f.waiting == 0 {
            self.finish_fanout(now, fanout);
        }
    }

    /// The overall deadline: every sled still waited for is given up on.
    pub(in crate::gateway) fn on_fanout_deadline(&mut self, now: Instant, fanout: u64) {
        let Some((f, overall)) = self.fanouts.get_mut(&fanout) else {
            return;
        };
        let overall = *overall;
        let late: Vec<(String, Part)> = f
            .parts
            .iter()
            .filter_map(|(p, part)| match part {
                Part::Waiting { uplink, rpc_id } => Some((
                    p.clone(),
                    Part::Waiting {
                        uplink: *uplink,
                        rpc_id: *rpc_id,
                    },
                )),
                Part::Relayed { token } => Some((p.clone(), Part::Relayed { token: *token })),
                _ => None,
            })
            .collect();
        for (project, part) in late {
            match part {
                Part::Waiting { uplink, rpc_id } => {
                    self.calls.take(rpc_id);
                    self.send_cancelled(
                        uplink,
                        rpc_id,
                        "the gateway's overall deadline for aggregate_pipeline_status passed",
                    );
                }
                Part::Relayed { token } => self.abort_part(token),
                _ => {}
            }
            if let Some((f, _)) = self.fanouts.get_mut(&fanout) {
                if let Some(slot) = f.parts.get_mut(&project) {
                    *slot = Part::Failed {
                        reason: "timed_out",
                        detail: format!(
                            "no answer before the overall deadline of {} ms",
                            millis(overall)
                        ),
                    };
                    f.waiting -= 1;
                }
            }
            self.counters.calls_timed_out += 1;
            self.call_metrics
                .count(PIPELINE_TOOL, &project, Outcome::Timeout);
        }
        self.finish_fanout(now, fanout);
    }

    fn finish_fanout(&mut self, now: Instant, fanout: u64) {
        let Some((f, overall)) = self.fanouts.remove(&fanout) else {
            return;
        };
        self.timers.remove(&(f.deadline, Timer::Fanout(fanout)));
        if let Some(task) = f.task.clone() {
            let result = fanout_result(now, f, overall);
            return self.own_task_done(now, &task, Ok(result));
        }
        self.fanout_by_token.remove(&f.token);
        let (token, client_id, modern) = (f.token, f.client_id.clone(), f.modern);
        let result = fanout_result(now, f, overall);
        let body = if modern {
            jsonrpc::ok_response(client_id.as_str(), &basics::with_result_type(&result))
        } else {
            jsonrpc::ok_response(client_id.as_str(), &result)
        };
        self.reply(token, 200, Vec::new(), Some(body));
    }

    /// A task of the gateway's own begins, for the caller of `req`, living `ttl`: its id (as the
    /// task machine keeps it) and the `CreateTaskResult` in the request's era.
    pub(in crate::gateway) fn start_own_task(
        &mut self,
        req: &Req<'_>,
        ttl: Duration,
        modern: bool,
    ) -> (String, String) {
        let now = req.now;
        let mut random = [0u8; 16];
        {
            use rand_chacha::rand_core::RngCore;
            self.rng.fill_bytes(&mut random);
        }
        let random = crate::agents::hex(&random);
        let id = match self.replica_name() {
            Some(r) => format!("{r}.{random}"),
            None => random,
        };
        let creator = self.creator_of(req);
        let ms = self.wall_ms(now);
        self.tasks.handle_created(
            tasks::GATEWAY_PROJECT,
            &id,
            Record {
                creator,
                right: "r",
                created: now,
                expires: now + ttl,
                status: Status::Working,
                progress: None,
                own: Some(Box::new(Own {
                    created_ms: ms,
                    updated_ms: ms,
                    result: None,
                    message: None,
                })),
            },
        );
        let task = own_task_json(&self.tasks, &id).unwrap_or_default();
        let body = if modern {
            let mut out = Map::new();
            out.insert("resultType".into(), json!("task"));
            out.extend(modern_task(task));
            Value::Object(out).to_string()
        } else {
            json!({ "task": task }).to_string()
        };
        (id, body)
    }

    /// A task of the gateway's own ended: its result (a `CallToolResult`'s JSON) or why not.
    /// Its waiting `tasks/result` requests are answered, and its creator's streams told.
    pub(in crate::gateway) fn own_task_done(
        &mut self,
        now: Instant,
        id: &str,
        outcome: Result<String, (Status, String)>,
    ) {
        let ms = self.wall_ms(now);
        let (status, result, message) = match outcome {
            Ok(r) => (Status::Completed, Some(r), None),
            Err((s, m)) => (s, None, Some(m)),
        };
        let Some(record) = self
            .tasks
            .finish_own(id, status, result, message, ms)
            .cloned()
        else {
            return;
        };
        for (token, rid) in self.own_waiters.remove(id).unwrap_or_default() {
            let body = match own_result(&self.tasks, id) {
                Ok(r) => jsonrpc::ok_response(rid.as_str(), &r),
                Err(e) => e.response(Some(rid.as_str())),
            };
            self.reply(token, 200, Vec::new(), Some(body));
        }
        let Some(mut task) = own_task_json(&self.tasks, id) else {
            return;
        };
        if let Some(session) = record.creator.session.as_deref() {
            let data = jsonrpc::notification(
                "notifications/tasks/status",
                &Value::Object(task.clone()).to_string(),
            );
            self.notify_session_anywhere(session, data);
        }
        let _ = task.remove("taskId");
        let modern = own_modern(&self.tasks, id, task);
        self.send_task_listeners(tasks::GATEWAY_PROJECT, id, modern);
    }

    /// The fan-out a task of the gateway's own runs, cancelled; `false` when none runs.
    pub(in crate::gateway) fn cancel_task_fanout(&mut self, task: &str) -> bool {
        let Some(fanout) = self
            .fanouts
            .iter()
            .find(|(_, (f, _))| f.task.as_deref() == Some(task))
            .map(|(id, _)| *id)
        else {
            return false;
        };
        self.stop_fanout(fanout);
        true
    }

    /// The client of a fan-out went away: its sleds' requests are cancelled.
    pub(in crate::gateway) fn abort_fanout(&mut self, token: HttpToken) -> bool {
        let Some(fanout) = self.fanout_by_token.remove(&token) else {
            return false;
        };
        self.stop_fanout(fanout);
        true
    }

    /// A fan-out ended unfinished: its sleds' requests are cancelled.
    fn stop_fanout(&mut self, fanout: u64) {
        let Some((f, _)) = self.fanouts.remove(&fanout) else {
            return;
        };
        self.timers.remove(&(f.deadline, Timer::Fanout(fanout)));
        for (project, part) in f.parts {
            if let Part::Relayed { token } = part {
                self.abort_part(token);
                self.call_metrics
                    .count(PIPELINE_TOOL, &project, Outcome::Aborted);
            }
            if let Part::Waiting { uplink, rpc_id } = part {
                self.calls.take(rpc_id);
                self.send_cancelled(uplink, rpc_id, "the fan-out was given up");
                self.call_metrics
                    .count(PIPELINE_TOOL, &project, Outcome::Aborted);
            }
        }
    }
}

/// The members of a `pipeline_status` tool result the aggregate reads, each kept raw.
#[derive(Deserialize)]
struct ToolAnswer<'a> {
    #[serde(borrow, default, rename = "isError")]
    is_error: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "structuredContent")]
    structured: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// A sled's pipeline status object, each member kept raw.
#[derive(Deserialize)]
struct StatusMembers<'a> {
    #[serde(borrow, default)]
    stages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    blocked: Option<&'a RawValue>,
    #[serde(borrow, default)]
    failing: Option<&'a RawValue>,
    #[serde(borrow, default)]
    total: Option<&'a RawValue>,
}

/// The text of a tool result's first content block, if it has one.
fn first_text(content: Option<&RawValue>) -> Option<String> {
    #[derive(Deserialize)]
    struct Block {
        text: Option<String>,
    }
    let blocks: Vec<&RawValue> = serde_json::from_str(content?.get()).ok()?;
    serde_json::from_str::<Block>(blocks.first()?.get())
        .ok()?
        .text
}

/// A `pipeline_status` tool result, reduced to what the aggregate shows: the sled's `stages`,
/// `blocked` and `failing` go into the row as the sled wrote them, read only to be counted.
fn parse_pipeline_status(result: &str, project: &str, took: Duration) -> Result<Answered, String> {
    let is_object = |s: &str| s.trim_start().starts_with('{');
    if !is_object(result) {
        return Err("not a tool result: a result must be a JSON object".into());
    }
    let answer: ToolAnswer = serde_json::from_str(result).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            format!("not JSON: {e}")
        } else {
            format!("not a tool result: {e}")
        }
    })?;
    if answer.is_error.is_some_and(|e| e.get() == "true") {
        let text = first_text(answer.content).unwrap_or_else(|| "(no text)".into());
        return Err(format!("{PIPELINE_TOOL} failed at the sled: {text}"));
    }
    match answer.structured.filter(|s| is_object(s.get())) {
        Some(s) => status_row(s.get(), project, took),
        None => {
            let unreadable =
                || format!("{PIPELINE_TOOL} answered without structured content or a JSON text");
            let text = first_text(answer.content).ok_or_else(unreadable)?;
            if !is_object(&text) || serde_json::from_str::<&RawValue>(&text).is_err() {
                return Err(unreadable());
            }
            status_row(&text, project, took)
        }
    }
}

/// The row and counts of one status object's text.
fn status_row<'a>(status: &'a str, project: &str, took: Duration) -> Result<Answered, String> {
    let m: StatusMembers<'a> =
        serde_json::from_str(status).map_err(|e| format!("{PIPELINE_TOOL}'s status: {e}"))?;
    // `stages`, `blocked` and `failing` go into the row as the sled wrote them: read only to
    // be checked and counted, never serialised again.
    let no_stages = || format!("{PIPELINE_TOOL}'s answer has no `stages` object of counts");
    let stages_raw = m.stages.ok_or_else(no_stages)?.get();
    let stages: BTreeMap<String, u64> =
        serde_json::from_str(stages_raw).map_err(|_| no_stages())?;
    let list = |raw: Option<&'a RawValue>, k: &str| match raw {
        None => Ok(("[]", 0)),
        Some(r) => serde_json::from_str::<Vec<&RawValue>>(r.get())
            .map(|items| (r.get(), items.len()))
            .map_err(|_| format!("{PIPELINE_TOOL}'s `{k}` is not a list")),
    };
    let (blocked, n_blocked) = list(m.blocked, "blocked")?;
    let (failing, n_failing) = list(m.failing, "failing")?;
    let total = m
        .total
        .and_then(|t| serde_json::from_str::<u64>(t.get()).ok())
        .unwrap_or_else(|| stages.values().fold(0u64, |sum, n| sum.saturating_add(*n)));
    // In serde_json's (sorted) key order, as the other rows are.
    let row = format!(
        r#"{{"blocked":{blocked},"failing":{failing},"project":{},"stages":{stages_raw},"status":"ok","took_ms":{},"total":{total}}}"#,
        Value::from(project),
        millis(took),
    );
    Ok(Answered {
        row,
        total,
        stages,
        blocked: n_blocked,
        failing: n_failing,
    })
}

fn fanout_result(now: Instant, f: Fanout, overall: Duration) -> String {
    let mut rows: Vec<String> = Vec::with_capacity(f.parts.len());
    let mut not_answered = Vec::new();
    let mut stages: BTreeMap<String, u64> = BTreeMap::new();
    let (mut stories, mut blocked, mut failing, mut answered) = (0u64, 0usize, 0usize, 0usize);
    let registered = f.parts.len();
    for (project, part) in f.parts {
        let (reason, detail) = match part {
            Part::Answered(a) => {
                answered += 1;
                // Saturating: the counts are a sled's to choose.
                stories = stories.saturating_add(a.total);
                for (stage, n) in &a.stages {
                    let sum = stages.entry(stage.clone()).or_default();
                    *sum = sum.saturating_add(*n);
                }
                blocked += a.blocked;
                failing += a.failing;
                rows.push(a.row);
                continue;
            }
            Part::Failed { reason, detail } => (reason, detail),
            // Only finished fan-outs are reported; the overall deadline settles every part.
            Part::Waiting { .. } | Part::Relayed { .. } => {
                ("timed_out", "no answer yet".to_owned())
            }
        };
        rows.push(json!({ "project": project, "status": reason, "detail": detail }).to_string());
        not_answered.push(json!({ "project": project, "reason": reason, "detail": detail }));
    }
    let totals = json!({
        "registered": registered,
        "answered": answered,
        "not_answered": registered - answered,
        "stories": stories,
        "stages": stages,
        "blocked": blocked,
        "failing": failing,
    });
    let deadlines = json!({ "overall": millis(overall), "per_project": millis(f.per_sled) });
    let not_answered = Value::Array(not_answered).to_string();
    let took = millis(now.saturating_duration_since(f.started));
    // The object by hand around the rows serialised as they came (keys in serde_json's sorted
    // order, as a `Value` would write them): the last answer only joins them.
    let mut out = String::with_capacity(rows.iter().map(|r| r.len() + 1).sum::<usize>() + 512);
    out.push_str(r#"{"deadline_ms":"#);
    out.push_str(&deadlines.to_string());
    out.push_str(r#","not_answered":"#);
    out.push_str(&not_answered);
    out.push_str(r#","projects":["#);
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(row);
    }
    out.push_str(r#"],"took_ms":"#);
    out.push_str(&took.to_string());
    out.push_str(r#","totals":"#);
    out.push_str(&totals.to_string());
    out.push('}');
    basics::tool_result_raw(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(result: Value) -> Result<(Value, Answered), String> {
        let a = parse_pipeline_status(&result.to_string(), "alpha", Duration::from_millis(7))?;
        let row: Value = serde_json::from_str(&a.row).expect("a row is JSON");
        Ok((row, a))
    }

    #[test]
    fn a_pipeline_status_becomes_a_row_and_its_counts() {
        let status = json!({"total": 5, "stages": {"backlog": 3, "done": 2},
            "blocked": [{"id": "s1"}], "failing": [], "extra": "dropped"});
        let (row, a) = parse(json!({"content": [{"type": "text", "text": "…"}],
            "structuredContent": status}))
        .unwrap();
        assert_eq!(
            row,
            json!({"project": "alpha", "status": "ok", "took_ms": 7, "total": 5,
                "stages": {"backlog": 3, "done": 2}, "blocked": [{"id": "s1"}], "failing": []})
        );
        assert_eq!((a.total, a.blocked, a.failing), (5, 1, 0));
        assert_eq!(a.stages.get("backlog"), Some(&3));

        // No total: the stages' sum. No lists: empty. Only a JSON text: read from the text.
        let text = json!({"stages": {"backlog": 1, "review": 4}}).to_string();
        let (row, a) = parse(json!({"content": [{"type": "text", "text": text}]})).unwrap();
        assert_eq!(a.total, 5);
        assert_eq!(row["blocked"], json!([]));
        assert_eq!(row["failing"], json!([]));
        // A structuredContent that is not an object falls back to the text too.
        let (_, a) = parse(json!({"content": [{"type": "text", "text": text}],
            "structuredContent": [1]}))
        .unwrap();
        assert_eq!(a.total, 5);
    }

    #[test]
    fn a_pipeline_status_that_cannot_be_read_is_an_error_naming_why() {
        let err = |result: Value| parse(result).expect_err("an error");
        assert!(
            err(json!({"isError": true, "content": [{"type": "text", "text": "db down"}]}))
                .contains("failed at the sled: db down")
        );
        assert!(
            err(json!({"content": [{"type": "text", "text": "not json"}]}))
                .contains("without structured content or a JSON text")
        );
        assert!(err(json!({"content": []})).contains("without structured content"));
        assert!(err(json!({"structuredContent": {"total": 1}})).contains("`stages`"));
        assert!(err(json!({"structuredContent": {"stages": {"a": -1}}})).contains("`stages`"));
        assert!(err(json!({"structuredContent": {"stages": {"a": 1.5}}})).contains("`stages`"));
        assert!(
            err(json!({"structuredContent": {"stages": {}, "blocked": 3}}))
                .contains("`blocked` is not a list")
        );
        assert!(
            err(json!({"structuredContent": {"stages": {}, "failing": {}}}))
                .contains("`failing` is not a list")
        );
        let e = parse_pipeline_status("{", "alpha", Duration::ZERO)
            .err()
            .unwrap();
        assert!(e.starts_with("not JSON"), "{e}");
        let e = parse_pipeline_status("[1]", "alpha", Duration::ZERO).expect_err("an array");
        assert!(e.starts_with("not a tool result"), "{e}");
        // Only the first content block is read.
        let text = json!({"stages": {"a": 2}}).to_string();
        let (_, a) =
            parse(json!({"content": [{"type": "text", "text": text}, {"text": 5}]})).unwrap();
        assert_eq!(a.total, 2);
        // isError that is not a bool is not an error flag.
        assert!(parse(json!({"isError": "yes", "structuredContent": {"stages": {}}})).is_ok());
        // Counts near the top of u64 saturate instead of overflowing.
        let (_, a) =
            parse(json!({"structuredContent": {"stages": {"a": u64::MAX, "b": 1}}})).unwrap();
        assert_eq!(a.total, u64::MAX);
    }
}
