//! Tasks (MCP 2025-11-25, `basic/utilities/tasks`): a table of a sled's tasks and the code that
//! runs them, for any [`Handler`](crate::Handler) (or [`SyncServer`](crate::SyncServer)) whose
//! tools may run as tasks.
//!
//! A `tools/call` with `params.task` (`{"ttl": ms}`, ttl optional) to a tool whose definition
//! says `execution.taskSupport: "optional"` or `"required"` is answered at once with a
//! `CreateTaskResult` (`{"task": Task}`, status `working`), and the tool runs on as a tokio task
//! of its own, not tied to the uplink connection the call came on ([`TaskRunner::start`]).
//! [`admit`] decides a call first: `params.task` on a tool that does not support tasks, and a
//! plain call to a tool that requires them, are -32601 (the spec's tool-level negotiation); a
//! malformed `params.task` is -32602.
//!
//! [`TaskRunner::answer`] answers `tasks/get` (the Task), `tasks/result` (waits until the task
//! is terminal, then exactly what the call would have returned: its `CallToolResult`, with
//! `_meta["io.modelcontextprotocol/related-task"] = {"taskId"}`, or its JSON-RPC error),
//! `tasks/list` (oldest first, [`TaskOptions::page_size`] a page, `nextCursor` while there are
//! more) and `tasks/cancel` (the Task, now `cancelled`; the work is aborted). An unknown or
//! expired task id, a cursor that is not one of ours, and cancelling a terminal task are
//! -32602. A cancelled task's `tasks/result` is -32603 with `data.kind = "task_cancelled"`
//! (a cancelled call has no answer of its own to give back).
//!
//! A tool result with `isError: true`, or a JSON-RPC error, makes the task `failed` (its
//! `statusMessage` says why); any other result `completed`. Every change of status after
//! creation is sent as `notifications/tasks/status` (the Task as `params`) on the runner's
//! notices channel, which an uplink sends on each welcomed connection
//! ([`Handler::notices`](crate::Handler::notices)). Progress under the call's
//! `_meta.progressToken` goes on being sent after the `CreateTaskResult` until the task is
//! terminal ([`TaskProgress`]), naming the task in `_meta`.
//!
//! Each task lives [`TaskOptions::default_ttl`] from its creation, or what the call asked, at
//! most [`TaskOptions::max_ttl`]; past it the task is forgotten (its work aborted), whatever its
//! status. Timing is `tokio::time` only (a paused clock in tests, turmoil's in a simulation);
//! `createdAt` and `lastUpdatedAt` come from [`TaskOptions::clock`], a function that can be
//! deterministic. Task ids are random 128-bit hex ([`TaskIds::Random`]), or drawn from a
//! seeded RNG, or a counter `t1, t2, …` ([`TaskIds::Counter`], for simulations that need ids
//! to collide across sleds): a sled's ids are unique only among its own tasks.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::uplink::CallContext;

/// The `_meta` key that names the task a message belongs to.
pub const RELATED_TASK_META: &str = "io.modelcontextprotocol/related-task";
/// The notification that carries a task's new status.
pub const STATUS_NOTIFICATION: &str = "notifications/tasks/status";
/// The methods a [`TaskRunner`] answers.
pub const TASK_METHODS: [&str; 4] = ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"];

const INVALID_PARAMS: i64 = -32602;
const METHOD_NOT_FOUND: i64 = -32601;
const INTERNAL_ERROR: i64 = -32603;

/// A task's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    /// The status as the wire spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Whether no status follows this one.
    pub fn is_terminal(self) -> bool {
        match self {
            TaskStatus::Working | TaskStatus::InputRequired => false,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled => true,
        }
    }

    /// The status the wire spells `s`.
    pub fn parse(s: &str) -> Option<TaskStatus> {
        Some(match s {
            "working" => TaskStatus::Working,
            "input_required" => TaskStatus::InputRequired,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            _ => return None,
        })
    }
}

/// Whether a tool may run as a task (`execution.taskSupport` in its definition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    /// Absent or `"forbidden"`: never as a task.
    Forbidden,
    /// `"optional"`: as a task or as a plain call.
    Optional,
    /// `"required"`: only as a task.
    Required,
}

impl TaskSupport {
    /// What a tool definition (a `tools/list` entry) says; absent or unreadable is forbidden.
    pub fn of_tool(definition: &Value) -> TaskSupport {
        match definition
            .pointer("/execution/taskSupport")
            .and_then(Value::as_str)
        {
            Some("optional") => TaskSupport::Optional,
            Some("required") => TaskSupport::Required,
            _ => TaskSupport::Forbidden,
        }
    }
}

/// How a runner makes its task ids.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TaskIds {
    /// 128 random bits from the thread's OS-seeded cryptographic RNG, in hex: unguessable.
    #[default]
    Random,
    /// 128 bits from a ChaCha RNG seeded with this, in hex: the same ids on every run (a
    /// simulation's sled).
    Seeded(u64),
    /// `t1`, `t2`, …: ids that collide across sleds (a simulation checking that nobody takes a
    /// sled's task id for a global one).
    Counter,
}

/// How a [`TaskRunner`] keeps its tasks.
#[derive(Debug, Clone)]
pub struct TaskOptions {
    pub ids: TaskIds,
    /// How long a task lives when the call names no `ttl`.
    pub default_ttl: Duration,
    /// The longest a task lives, whatever the call asks.
    pub max_ttl: Duration,
    /// The `pollInterval` suggested to requestors.
    pub poll_interval: Duration,
    /// How many tasks one `tasks/list` page holds (at least 1).
    pub page_size: usize,
    /// How many tasks the table holds at most; a task-augmented call beyond it is refused
    /// (-32603, `data.kind = "too_many_tasks"`) until some expire.
    pub max_tasks: usize,
    /// The wall clock, as the time since the Unix epoch, for `createdAt` and `lastUpdatedAt`
    /// only ([`system_clock`] by default; a simulation's own clock to stay deterministic).
    pub clock: fn() -> Duration,
}

impl Default for TaskOptions {
    fn default() -> Self {
        TaskOptions {
            ids: TaskIds::Random,
            default_ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(24 * 3600),
            poll_interval: Duration::from_millis(1000),
            page_size: 50,
            max_tasks: 10_000,
            clock: system_clock,
        }
    }
}

/// The system's wall clock, as the time since the Unix epoch (zero before it).
pub fn system_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// `since_epoch` as an RFC 3339 UTC timestamp with milliseconds: `2025-11-25T10:30:00.000Z`.
pub fn iso8601(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs();
    let millis = since_epoch.subsec_millis();
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// What a `tools/call` asks about tasks: `Ok(None)` a plain call, `Ok(Some(ttl))` a task (the
/// ttl it asked for, if any), `Err` what is wrong with `params.task`.
pub fn requested_task(msg: &Value) -> Result<Option<Option<u64>>, String> {
    let Some(task) = msg.pointer("/params/task") else {
        return Ok(None);
    };
    let Some(task) = task.as_object() else {
        return Err(format!("params.task must be an object, got {task}"));
    };
    match task.get("ttl") {
        None | Some(Value::Null) => Ok(Some(None)),
        Some(ttl) => match ttl.as_u64() {
            Some(ms) => Ok(Some(Some(ms))),
            None => Err(format!(
                "params.task.ttl must be a non-negative integer (milliseconds), got {ttl}"
            )),
        },
    }
}

/// Decides a `tools/call` of a tool with `support`: `Ok(true)` to run it as a task
/// ([`TaskRunner::start`]), `Ok(false)` as a plain call, or `Err` with the JSON-RPC error
/// response that refuses it.
pub fn admit(msg: &Value, support: TaskSupport) -> Result<bool, Value> {
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let tool = msg
        .pointer("/params/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let asked = requested_task(msg).map_err(|e| error(&id, INVALID_PARAMS, e, None))?;
    match (asked.is_some(), support) {
        (true, TaskSupport::Forbidden) => Err(error(
            &id,
            METHOD_NOT_FOUND,
            format!("tool {tool} does not support task-augmented calls (execution.taskSupport is not optional or required)"),
            None,
        )),
        (false, TaskSupport::Required) => Err(error(
            &id,
            METHOD_NOT_FOUND,
            format!("tool {tool} must be called as a task (execution.taskSupport is required): add params.task"),
            None,
        )),
        (as_task, _) => Ok(as_task),
    }
}

fn error(id: &Value, code: i64, message: impl Into<String>, data: Option<Value>) -> Value {
    let mut e = json!({"code": code, "message": message.into()});
    if let Some(data) = data {
        e["data"] = data;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": e})
}

fn ok(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A task's sled-side record.
struct Entry {
    id: String,
    status: TaskStatus,
    message: Option<String>,
    created: Duration,
    updated: Duration,
    ttl: Duration,
    expires: Option<Instant>,
    /// The call's final answer (`{"result": …}` or `{"error": …}` members), once terminal
    /// other than by cancellation.
    outcome: Option<Map<String, Value>>,
    /// `true` once terminal; `tasks/result` waits on it.
    done: watch::Sender<bool>,
    work: Option<AbortHandle>,
}

impl Entry {
    fn to_json(&self, poll: Duration) -> Value {
        let mut t = json!({
            "taskId": self.id,
            "status": self.status.as_str(),
            "createdAt": iso8601(self.created),
            "lastUpdatedAt": iso8601(self.updated),
            "ttl": u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
            "pollInterval": u64::try_from(poll.as_millis()).unwrap_or(u64::MAX),
        });
        if let Some(m) = &self.message {
            t["statusMessage"] = json!(m);
        }
        t
    }
}

#[derive(Default)]
struct Table {
    /// By creation order (the `tasks/list` order and cursor).
    by_seq: BTreeMap<u64, Entry>,
    by_id: HashMap<String, u64>,
    next_seq: u64,
    counter: u64,
    rng: Option<ChaCha8Rng>,
    /// Work to abort once the lock is released ([`Locked`]'s drop): aborting never runs while
    /// the table is locked, whatever the work's drop does.
    to_abort: Vec<AbortHandle>,
}

/// The locked table; on drop it unlocks, then aborts the work queued in `to_abort`.
struct Locked<'a> {
    guard: Option<MutexGuard<'a, Table>>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Table;
    fn deref(&self) -> &Table {
        self.guard
            .as_ref()
            .expect("a Locked holds its guard until dropped")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Table {
        self.guard
            .as_mut()
            .expect("a Locked holds its guard until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let pending = self
            .guard
            .as_mut()
            .map(|g| std::mem::take(&mut g.to_abort))
            .unwrap_or_default();
        drop(self.guard.take());
        for work in pending {
            work.abort();
        }
    }
}

impl Table {
    /// Forgets the tasks whose TTL has passed, aborting their work.
    fn purge(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .by_seq
            .iter()
            .filter(|(_, e)| e.expires.is_some_and(|x| x <= now))
            .map(|(s, _)| *s)
            .collect();
        for seq in expired {
            if let Some(e) = self.by_seq.remove(&seq) {
                self.by_id.remove(&e.id);
                self.to_abort.extend(e.work);
            }
        }
    }

    fn get_mut(&mut self, id: &str) -> Option<&mut Entry> {
        let seq = self.by_id.get(id)?;
        self.by_seq.get_mut(seq)
    }

    fn new_id(&mut self, ids: &TaskIds) -> String {
        loop {
            let id = match ids {
                TaskIds::Counter => {
                    self.counter += 1;
                    format!("t{}", self.counter)
                }
                TaskIds::Seeded(seed) => {
                    let rng = self
                        .rng
                        .get_or_insert_with(|| ChaCha8Rng::seed_from_u64(*seed));
                    format!("{:032x}", rng.random::<u128>())
                }
                TaskIds::Random => format!("{:032x}", rand::rng().random::<u128>()),
            };
            // Unique among this sled's tasks, as the spec asks (a collision of 128 random
            // bits is only theory; a counter never repeats).
            if !self.by_id.contains_key(&id) {
                return id;
            }
        }
    }
}

struct Shared {
    opts: TaskOptions,
    table: Mutex<Table>,
    notices: broadcast::Sender<String>,
}

/// A sled's tasks: the table, and the work of each. Cloning shares it.
#[derive(Clone)]
pub struct TaskRunner {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TaskRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRunner")
            .field("opts", &self.shared.opts)
            .field("tasks", &self.lock().by_seq.len())
            .finish()
    }
}

/// What a task's work can tell its requestor: progress under the token its call carried, sent
/// on the call's connection while it lives and then on the sled's notices (every welcomed
/// connection), each naming the task in `_meta`.
#[derive(Clone)]
pub struct TaskProgress {
    task_id: String,
    token: Option<Value>,
    ctx: Option<CallContext>,
    notices: broadcast::Sender<String>,
}

impl std::fmt::Debug for TaskProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskProgress")
            .field("task_id", &self.task_id)
            .field("token", &self.token)
            .finish()
    }
}

impl TaskProgress {
    /// The task's id.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// The progress token the call carried, if the client asked for progress.
    pub fn token(&self) -> Option<&Value> {
        self.token.as_ref()
    }

    /// Sends `notifications/progress`; false when the call asked for none or nothing could
    /// take it.
    pub fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        let mut params = json!({
            "progressToken": token,
            "progress": progress,
            "_meta": {RELATED_TASK_META: {"taskId": self.task_id}},
        });
        if let Some(total) = total {
            params["total"] = json!(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        let n = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params});
        if self.ctx.as_ref().is_some_and(|c| c.send_as_is(&n)) {
            return true;
        }
        self.notices.send(n.to_string()).is_ok()
    }
}

/// Finishes a task whose work ends without an answer (its future dropped: the sled's runtime
/// stopped): `failed`, unless it already ended otherwise (cancelled, expired).
struct Unfinished {
    runner: TaskRunner,
    id: String,
    armed: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if self.armed {
            let outcome = json!({"error": {
                "code": INTERNAL_ERROR,
                "message": "the task's work stopped before it finished (the sled stopped)",
                "data": {"kind": "task_abandoned"},
            }});
            self.runner.finish(&self.id, &outcome);
        }
    }
}

impl TaskRunner {
    /// A runner that sends status notifications (and progress once a call's connection is
    /// gone) on `notices`.
    pub fn new(opts: TaskOptions, notices: broadcast::Sender<String>) -> Self {
        TaskRunner {
            shared: Arc::new(Shared {
                opts,
                table: Mutex::default(),
                notices,
            }),
        }
    }

    /// Its options.
    pub fn options(&self) -> &TaskOptions {
        &self.shared.opts
    }

    fn lock(&self) -> Locked<'_> {
        Locked {
            guard: Some(
                self.shared
                    .table
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            ),
        }
    }

    fn now_wall(&self) -> Duration {
        (self.shared.opts.clock)()
    }

    fn poll(&self) -> Duration {
        self.shared.opts.poll_interval
    }

    /// Whether `method` is one [`TaskRunner::answer`] answers.
    pub fn handles(method: &str) -> bool {
        TASK_METHODS.contains(&method)
    }

    /// The task `id` as `tasks/get` shows it, if it is (still) known.
    pub fn task(&self, id: &str) -> Option<Value> {
        let mut t = self.lock();
        t.purge(Instant::now());
        let poll = self.poll();
        t.get_mut(id).map(|e| e.to_json(poll))
    }

    /// Starts the task-augmented call `msg` (admitted by [`admit`]): its work is `work`, given
    /// the task's [`TaskProgress`], resolving to the JSON-RPC response the call would have had
    /// (its `id` is not read). Returns the response to give now: the `CreateTaskResult`, or
    /// an error when the table is full. `ctx` is the call's context on an uplink (its progress
    /// goes there first).
    pub fn start<F, Fut>(&self, msg: &Value, ctx: Option<CallContext>, work: F) -> Value
    where
        F: FnOnce(TaskProgress) -> Fut,
        Fut: Future<Output = Value> + Send + 'static,
    {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let asked = match requested_task(msg) {
            Ok(asked) => asked.flatten(),
            Err(e) => return error(&id, INVALID_PARAMS, e, None),
        };
        let opts = &self.shared.opts;
        let ttl = asked
            .map_or(opts.default_ttl, Duration::from_millis)
            .min(opts.max_ttl);
        let now = Instant::now();
        let wall = self.now_wall();
        let mut t = self.lock();
        t.purge(now);
        if t.by_seq.len() >= opts.max_tasks {
            return error(
                &id,
                INTERNAL_ERROR,
                format!(
                    "this sled holds {} tasks already, its most; try again once some expire",
                    t.by_seq.len()
                ),
                Some(json!({"kind": "too_many_tasks"})),
            );
        }
        let task_id = t.new_id(&opts.ids);
        let seq = t.next_seq;
        t.next_seq += 1;
        let entry = Entry {
            id: task_id.clone(),
            status: TaskStatus::Working,
            message: None,
            created: wall,
            updated: wall,
            ttl,
            expires: now.checked_add(ttl),
            outcome: None,
            done: watch::Sender::new(false),
            work: None,
        };
        let created = entry.to_json(self.poll());
        t.by_id.insert(task_id.clone(), seq);
        t.by_seq.insert(seq, entry);
        let progress = TaskProgress {
            task_id: task_id.clone(),
            token: msg.pointer("/params/_meta/progressToken").cloned(),
            ctx,
            notices: self.shared.notices.clone(),
        };
        let fut = work(progress);
        let mut guard = Unfinished {
            runner: self.clone(),
            id: task_id.clone(),
            armed: true,
        };
        let handle = tokio::spawn(async move {
            let response = fut.await;
            guard.armed = false;
            guard.runner.finish(&guard.id, &response);
        });
        if let Some(e) = t.by_seq.get_mut(&seq) {
            e.work = Some(handle.abort_handle());
        }
        drop(t);
        ok(&id, json!({"task": created}))
    }

    /// Records a task's final answer (a JSON-RPC response, or its `result`/`error` members):
    /// `failed` for an error or an `isError` result, else `completed`. Nothing for a task that
    /// is already terminal or gone.
    fn finish(&self, task_id: &str, response: &Value) {
        let mut outcome = Map::new();
        let (status, message) = if let Some(e) = response.get("error") {
            outcome.insert("error".into(), e.clone());
            let m = e.get("message").and_then(Value::as_str).unwrap_or("error");
            (TaskStatus::Failed, Some(m.to_owned()))
        } else {
            let result = response.get("result").cloned().unwrap_or_else(|| json!({}));
            let failed = result.get("isError") == Some(&Value::Bool(true));
            let text = result
                .pointer("/content/0/text")
                .and_then(Value::as_str)
                .map(|t| t.chars().take(512).collect::<String>());
            outcome.insert("result".into(), result);
            if failed {
                (
                    TaskStatus::Failed,
                    Some(text.unwrap_or_else(|| "the tool reported an error".into())),
                )
            } else {
                (TaskStatus::Completed, None)
            }
        };
        self.transition(task_id, status, message, Some(outcome));
    }

    /// Moves a non-terminal task to `status`, notifies, and wakes its `tasks/result` waiters
    /// when terminal. Returns the task as it is now, or `None` when it is unknown or already
    /// terminal.
    fn transition(
        &self,
        task_id: &str,
        status: TaskStatus,
        message: Option<String>,
        outcome: Option<Map<String, Value>>,
    ) -> Option<Value> {
        let wall = self.now_wall();
        let poll = self.poll();
        let mut t = self.lock();
        let e = t.get_mut(task_id)?;
        if e.status.is_terminal() {
            return None;
        }
        e.status = status;
        e.message = message;
        e.updated = wall.max(e.created);
        let mut work = None;
        if status.is_terminal() {
            e.outcome = outcome;
            e.done.send_replace(true);
            work = e.work.take();
        }
        let task = e.to_json(poll);
        t.to_abort.extend(work);
        // Sent under the lock, so notifications go out in the order of the changes.
        let n = json!({"jsonrpc": "2.0", "method": STATUS_NOTIFICATION, "params": task});
        let _ = self.shared.notices.send(n.to_string());
        Some(task)
    }

    /// Moves a working task to `input_required` or back to `working` (a tool waiting on its
    /// requestor); false when the task is unknown or terminal.
    pub fn set_status(&self, task_id: &str, status: TaskStatus, message: Option<String>) -> bool {
        !status.is_terminal() && self.transition(task_id, status, message, None).is_some()
    }

    /// Answers a `tasks/get`, `tasks/result`, `tasks/list` or `tasks/cancel` request; `None`
    /// for any other message (or a notification). `tasks/result` waits until the task is
    /// terminal (or forgotten at its TTL).
    pub async fn answer(&self, msg: &Value) -> Option<Value> {
        let method = msg.get("method").and_then(Value::as_str)?;
        if !Self::handles(method) {
            return None;
        }
        let id = msg.get("id")?.clone();
        let params = msg.get("params");
        if method == "tasks/list" {
            return Some(self.list(&id, params));
        }
        let Some(task_id) = params.and_then(|p| p.get("taskId")).and_then(Value::as_str) else {
            return Some(error(
                &id,
                INVALID_PARAMS,
                format!("{method} needs params.taskId, a string"),
                None,
            ));
        };
        Some(match method {
            "tasks/get" => match self.task(task_id) {
                Some(task) => ok(&id, task),
                None => not_found(&id, task_id),
            },
            "tasks/cancel" => self.cancel(&id, task_id),
            _ => self.result(&id, task_id).await,
        })
    }

    fn cancel(&self, id: &Value, task_id: &str) -> Value {
        {
            let mut t = self.lock();
            t.purge(Instant::now());
            match t.get_mut(task_id) {
                None => return not_found(id, task_id),
                Some(e) if e.status.is_terminal() => {
                    return error(
                        id,
                        INVALID_PARAMS,
                        format!(
                            "Cannot cancel task: already in terminal status '{}'",
                            e.status.as_str()
                        ),
                        None,
                    )
                }
                Some(_) => {}
            }
        }
        match self.transition(
            task_id,
            TaskStatus::Cancelled,
            Some("The task was cancelled by request.".into()),
            None,
        ) {
            Some(task) => ok(id, task),
            // It ended between the two looks.
            None => match self.task(task_id) {
                Some(task) => error(
                    id,
                    INVALID_PARAMS,
                    format!(
                        "Cannot cancel task: already in terminal status '{}'",
                        task["status"].as_str().unwrap_or("")
                    ),
                    None,
                ),
                None => not_found(id, task_id),
            },
        }
    }

    async fn result(&self, id: &Value, task_id: &str) -> Value {
        let (mut done, expires) = {
            let mut t = self.lock();
            t.purge(Instant::now());
            match t.get_mut(task_id) {
                Some(e) => (e.done.subscribe(), e.expires),
                None => return not_found(id, task_id),
            }
        };
        let terminal = done.wait_for(|d| *d);
        let waited = match expires {
            Some(at) => tokio::time::timeout_at(at, terminal).await.ok(),
            None => Some(terminal.await),
        };
        if !matches!(waited, Some(Ok(_))) {
            // Forgotten at its TTL while it worked.
            return not_found(id, task_id);
        }
        let mut t = self.lock();
        t.purge(Instant::now());
        let Some(e) = t.get_mut(task_id) else {
            return not_found(id, task_id);
        };
        match (&e.outcome, e.status) {
            (Some(o), _) if o.contains_key("error") => {
                json!({"jsonrpc": "2.0", "id": id, "error": o["error"]})
            }
            (Some(o), _) => {
                let mut result = o.get("result").cloned().unwrap_or_else(|| json!({}));
                if let Some(obj) = result.as_object_mut() {
                    let meta = obj.entry("_meta").or_insert_with(|| json!({}));
                    if !meta.is_object() {
                        *meta = json!({});
                    }
                    meta[RELATED_TASK_META] = json!({"taskId": task_id});
                }
                ok(id, result)
            }
            (None, _) => error(
                id,
                INTERNAL_ERROR,
                format!("task {task_id} was cancelled; it has no result"),
                Some(json!({"kind": "task_cancelled", "taskId": task_id})),
            ),
        }
    }

    fn list(&self, id: &Value, params: Option<&Value>) -> Value {
        let from = match params.and_then(|p| p.get("cursor")) {
            None | Some(Value::Null) => 0,
            Some(c) => match c.as_str().and_then(|c| c.parse::<u64>().ok()) {
                Some(seq) => seq,
                None => {
                    return error(
                        id,
                        INVALID_PARAMS,
                        format!("tasks/list: {c} is not a cursor this sled gave"),
                        None,
                    )
                }
            },
        };
        let page = self.shared.opts.page_size.max(1);
        let poll = self.poll();
        let mut t = self.lock();
        t.purge(Instant::now());
        let mut tasks = Vec::new();
        let mut next = None;
        for (seq, e) in t.by_seq.range(from..) {
            if tasks.len() == page {
                next = Some(seq.to_string());
                break;
            }
            tasks.push(e.to_json(poll));
        }
        let mut result = json!({"tasks": tasks});
        if let Some(next) = next {
            result["nextCursor"] = json!(next);
        }
        ok(id, result)
    }
}

fn not_found(id: &Value, task_id: &str) -> Value {
    error(
        id,
        INVALID_PARAMS,
        format!("Failed to retrieve task: no task {task_id} (unknown, or expired and forgotten)"),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> Duration {
        // 2025-11-25T10:30:00Z
        Duration::from_secs(1_764_066_600)
    }

    fn runner(ids: TaskIds) -> (TaskRunner, broadcast::Receiver<String>) {
        let (tx, rx) = broadcast::channel(64);
        let opts = TaskOptions {
            ids,
            page_size: 2,
            clock,
            ..TaskOptions::default()
        };
        (TaskRunner::new(opts, tx), rx)
    }

    fn call(id: u64, task: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "slow", "arguments": {}, "task": task, "_meta": {"progressToken": "p"}}})
    }

    fn req(id: u64, method: &str, params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    }

    /// Work that sleeps `ms`, reports progress once, then answers `result`.
    fn slow(ms: u64, result: Value) -> impl FnOnce(TaskProgress) -> BoxedWork {
        move |p: TaskProgress| -> BoxedWork {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                p.progress(1.0, Some(1.0), Some("done"));
                json!({"jsonrpc": "2.0", "id": 0, "result": result})
            })
        }
    }

    type BoxedWork = std::pin::Pin<Box<dyn Future<Output = Value> + Send>>;

    fn notices(rx: &mut broadcast::Receiver<String>) -> Vec<Value> {
        let mut out = Vec::new();
        while let Ok(n) = rx.try_recv() {
            out.push(serde_json::from_str(&n).unwrap());
        }
        out
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(iso8601(Duration::ZERO), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(clock()), "2025-11-25T10:30:00.000Z");
        assert_eq!(
            iso8601(Duration::from_millis(951_782_400_123)),
            "2000-02-29T00:00:00.123Z"
        );
    }

    #[test]
    fn admission_follows_the_tool_level_negotiation() {
        let tool = |s: &str| json!({"name": "x", "execution": {"taskSupport": s}});
        assert_eq!(
            TaskSupport::of_tool(&tool("optional")),
            TaskSupport::Optional
        );
        assert_eq!(
            TaskSupport::of_tool(&tool("required")),
            TaskSupport::Required
        );
        assert_eq!(
            TaskSupport::of_tool(&tool("forbidden")),
            TaskSupport::Forbidden
        );
        assert_eq!(
            TaskSupport::of_tool(&json!({"name": "x"})),
            TaskSupport::Forbidden
        );
        let plain = req(1, "tools/call", json!({"name": "x"}));
        let tasked = call(1, json!({"ttl": 5}));
        assert_eq!(admit(&plain, TaskSupport::Optional), Ok(false));
        assert_eq!(admit(&tasked, TaskSupport::Optional), Ok(true));
        assert_eq!(admit(&tasked, TaskSupport::Required), Ok(true));
        assert_eq!(
            admit(&plain, TaskSupport::Required).unwrap_err()["error"]["code"],
            -32601
        );
        assert_eq!(
            admit(&tasked, TaskSupport::Forbidden).unwrap_err()["error"]["code"],
            -32601
        );
        for bad in [json!(5), json!({"ttl": -1}), json!({"ttl": "1"})] {
            assert_eq!(
                admit(&call(1, bad), TaskSupport::Optional).unwrap_err()["error"]["code"],
                -32602
            );
        }
        assert_eq!(admit(&call(1, json!({})), TaskSupport::Optional), Ok(true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_runs_in_the_background_and_gives_its_result() {
        let (r, mut rx) = runner(TaskIds::Counter);
        let created = r.start(
            &call(7, json!({"ttl": 60_000})),
            None,
            slow(
                500,
                json!({
            "content": [{"type": "text", "text": "ok"}], "_meta": {"x": 1}}),
            ),
        );
        assert_eq!(created["id"], 7);
        let task = &created["result"]["task"];
        assert_eq!(task["taskId"], "t1");
        assert_eq!(task["status"], "working");
        assert_eq!(task["ttl"], 60_000);
        assert_eq!(task["pollInterval"], 1000);
        assert_eq!(task["createdAt"], "2025-11-25T10:30:00.000Z");
        assert_eq!(task["lastUpdatedAt"], "2025-11-25T10:30:00.000Z");
        let got = r
            .answer(&req(8, "tasks/get", json!({"taskId": "t1"})))
            .await
            .unwrap();
        assert_eq!(got["result"]["status"], "working");
        assert_eq!(got["result"]["taskId"], "t1");
        // tasks/result waits until the work is done.
        let result = r
            .answer(&req(9, "tasks/result", json!({"taskId": "t1"})))
            .await
            .unwrap();
        assert_eq!(result["id"], 9);
        assert_eq!(result["result"]["content"][0]["text"], "ok");
        assert_eq!(result["result"]["_meta"]["x"], 1);
        assert_eq!(result["result"]["_meta"][RELATED_TASK_META]["taskId"], "t1");
        let got = r
            .answer(&req(10, "tasks/get", json!({"taskId": "t1"})))
            .await
            .unwrap();
        assert_eq!(got["result"]["status"], "completed");
        // Progress (to the notices: no call context) names the task, then the status change.
        let sent = notices(&mut rx);
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[0]["method"], "notifications/progress");
        assert_eq!(sent[0]["params"]["progressToken"], "p");
        assert_eq!(
            sent[0]["params"]["_meta"][RELATED_TASK_META]["taskId"],
            "t1"
        );
        assert_eq!(sent[1]["method"], STATUS_NOTIFICATION);
        assert_eq!(sent[1]["params"]["taskId"], "t1");
        assert_eq!(sent[1]["params"]["status"], "completed");
        // Terminal: cannot be cancelled.
        let c = r
            .answer(&req(11, "tasks/cancel", json!({"taskId": "t1"})))
            .await
            .unwrap();
        assert_eq!(c["error"]["code"], -32602);
        assert!(c["error"]["message"]
            .as_str()
            .unwrap()
            .contains("completed"));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_failed_tasks_whose_result_is_what_the_call_gave() {
        let (r, mut rx) = runner(TaskIds::Counter);
        r.start(
            &call(1, json!({})),
            None,
            slow(
                10,
                json!({
            "content": [{"type": "text", "text": "3 tests failed"}], "isError": true}),
            ),
        );
        let rpc_error = |_: TaskProgress| async {
            json!({"jsonrpc": "2.0", "id": 0, "error": {"code": -32602, "message": "bad suite"}})
        };
        r.start(&call(2, json!({})), None, rpc_error);
        let first = r
            .answer(&req(3, "tasks/result", json!({"taskId": "t1"})))
            .await
            .unwrap();
        assert_eq!(first["result"]["isError"], true);
        assert_eq!(first["result"]["_meta"][RELATED_TASK_META]["taskId"], "t1");
        let second = r
            .answer(&req(4, "tasks/result", json!({"taskId": "t2"})))
            .await
            .unwrap();
        assert_eq!(
            second["error"],
            json!({"code": -32602, "message": "bad suite"})
        );
        assert_eq!(second["id"], 4);
        let t1 = r.task("t1").unwrap();
        assert_eq!(t1["status"], "failed");
        assert_eq!(t1["statusMessage"], "3 tests failed");
        assert_eq!(r.task("t2").unwrap()["statusMessage"], "bad suite");
        let statuses: Vec<Value> = notices(&mut rx)
            .into_iter()
            .filter(|n| n["method"] == STATUS_NOTIFICATION)
            .map(|n| n["params"]["status"].clone())
            .collect();
        assert_eq!(statuses, [json!("failed"), json!("failed")]);
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_aborts_the_work_and_stays_cancelled() {
        let (r, mut rx) = runner(TaskIds::Counter);
        let ran_to_end = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&ran_to_end);
        r.start(&call(1, json!({})), None, move |_p| async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            json!({"jsonrpc": "2.0", "id": 0, "result": {"content": []}})
        });
        // A tasks/result already waiting hears of the cancellation.
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move {
                r.answer(&req(5, "tasks/result", json!({"taskId": "t1"})))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let c = r
            .answer(&req(2, "tasks/cancel", json!({"taskId": "t1"})))
            .await
            .unwrap();
        assert_eq!(c["result"]["status"], "cancelled");
        assert_eq!(c["result"]["taskId"], "t1");
        let waited = waiter.await.unwrap().unwrap();
        assert_eq!(waited["error"]["code"], -32603);
        assert_eq!(waited["error"]["data"]["kind"], "task_cancelled");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!ran_to_end.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(r.task("t1").unwrap()["status"], "cancelled");
        let again = r
            .answer(&req(3, "tasks/cancel", json!({"taskId": "t1"})))
            .await
            .unwrap();
        assert_eq!(again["error"]["code"], -32602);
        let sent = notices(&mut rx);
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0]["params"]["status"], "cancelled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_past_its_ttl_is_forgotten() {
        let (r, _rx) = runner(TaskIds::Counter);
        r.start(
            &call(1, json!({"ttl": 1_000})),
            None,
            slow(5_000, json!({"content": []})),
        );
        r.start(
            &call(2, json!({"ttl": 10_000})),
            None,
            slow(10, json!({"content": []})),
        );
        // Waiting on a task that expires while it works ends at its TTL.
        let waited = r
            .answer(&req(3, "tasks/result", json!({"taskId": "t1"})))
            .await
            .unwrap();
        assert_eq!(waited["error"]["code"], -32602);
        assert!(r.task("t1").is_none());
        assert_eq!(r.task("t2").unwrap()["status"], "completed");
        tokio::time::sleep(Duration::from_secs(10)).await;
        for m in ["tasks/get", "tasks/result", "tasks/cancel"] {
            let a = r.answer(&req(4, m, json!({"taskId": "t2"}))).await.unwrap();
            assert_eq!(a["error"]["code"], -32602, "{m}: {a}");
        }
        let listed = r.answer(&req(5, "tasks/list", json!({}))).await.unwrap();
        assert_eq!(listed["result"]["tasks"], json!([]));
    }

    #[tokio::test(start_paused = true)]
    async fn the_ttl_is_capped_and_defaulted() {
        let (tx, _rx) = broadcast::channel(4);
        let r = TaskRunner::new(
            TaskOptions {
                ids: TaskIds::Counter,
                default_ttl: Duration::from_secs(7),
                max_ttl: Duration::from_secs(60),
                clock,
                ..TaskOptions::default()
            },
            tx,
        );
        let a = r.start(&call(1, json!({})), None, slow(1, json!({})));
        let b = r.start(
            &call(2, json!({"ttl": 3_600_000})),
            None,
            slow(1, json!({})),
        );
        assert_eq!(a["result"]["task"]["ttl"], 7_000);
        assert_eq!(b["result"]["task"]["ttl"], 60_000);
    }

    #[tokio::test(start_paused = true)]
    async fn list_pages_oldest_first_and_refuses_foreign_cursors() {
        let (r, _rx) = runner(TaskIds::Counter);
        for i in 0..5 {
            r.start(
                &call(i, json!({})),
                None,
                slow(1_000, json!({"content": []})),
            );
        }
        let mut seen = Vec::new();
        let mut cursor = Value::Null;
        loop {
            let page = r
                .answer(&req(9, "tasks/list", json!({"cursor": cursor})))
                .await
                .unwrap();
            let tasks = page["result"]["tasks"].as_array().unwrap().clone();
            assert!(tasks.len() <= 2);
            seen.extend(
                tasks
                    .iter()
                    .map(|t| t["taskId"].as_str().unwrap().to_owned()),
            );
            match page["result"].get("nextCursor") {
                Some(c) => cursor = c.clone(),
                None => break,
            }
        }
        assert_eq!(seen, ["t1", "t2", "t3", "t4", "t5"]);
        // No params at all is the first page.
        let first = r
            .answer(&json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/list"}))
            .await
            .unwrap();
        assert_eq!(first["result"]["tasks"].as_array().unwrap().len(), 2);
        let bad = r
            .answer(&req(9, "tasks/list", json!({"cursor": "nope"})))
            .await
            .unwrap();
        assert_eq!(bad["error"]["code"], -32602);
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_ids_and_bad_params_are_invalid_params() {
        let (r, _rx) = runner(TaskIds::Random);
        for m in ["tasks/get", "tasks/result", "tasks/cancel"] {
            let a = r
                .answer(&req(1, m, json!({"taskId": "nope"})))
                .await
                .unwrap();
            assert_eq!(a["error"]["code"], -32602, "{m}");
            let b = r.answer(&req(1, m, json!({"taskId": 5}))).await.unwrap();
            assert_eq!(b["error"]["code"], -32602, "{m}");
            let c = r
                .answer(&json!({"jsonrpc": "2.0", "id": 1, "method": m}))
                .await
                .unwrap();
            assert_eq!(c["error"]["code"], -32602, "{m}");
        }
        assert!(r.answer(&req(1, "tools/list", json!({}))).await.is_none());
        assert!(r
            .answer(&json!({"jsonrpc": "2.0", "method": "tasks/get", "params": {"taskId": "x"}}))
            .await
            .is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn ids_are_random_seeded_or_counted() {
        let ids = |kind: TaskIds| {
            let (r, _rx) = runner(kind);
            (0..3)
                .map(|i| {
                    r.start(&call(i, json!({})), None, slow(1, json!({})))["result"]["task"]
                        ["taskId"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect::<Vec<_>>()
        };
        let random = ids(TaskIds::Random);
        assert!(random.iter().all(|id| id.len() == 32));
        assert_ne!(random, ids(TaskIds::Random));
        assert_eq!(ids(TaskIds::Seeded(4)), ids(TaskIds::Seeded(4)));
        assert_ne!(ids(TaskIds::Seeded(4)), ids(TaskIds::Seeded(5)));
        assert_eq!(ids(TaskIds::Counter), ["t1", "t2", "t3"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_refuses_new_tasks() {
        let (tx, _rx) = broadcast::channel(4);
        let r = TaskRunner::new(
            TaskOptions {
                ids: TaskIds::Counter,
                max_tasks: 1,
                ..TaskOptions::default()
            },
            tx,
        );
        r.start(&call(1, json!({})), None, slow(1, json!({})));
        let refused = r.start(&call(2, json!({})), None, slow(1, json!({})));
        assert_eq!(refused["error"]["data"]["kind"], "too_many_tasks");
    }

    #[test]
    fn work_dropped_unfinished_fails_its_task() {
        let (tx, mut rx) = broadcast::channel(4);
        let opts = TaskOptions {
            ids: TaskIds::Counter,
            clock,
            ..TaskOptions::default()
        };
        let r = TaskRunner::new(opts, tx);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            r.start(&call(1, json!({})), None, slow(60_000, json!({})));
            tokio::task::yield_now().await;
        });
        // The runtime stops (a sled host crashing): its tasks' work is dropped.
        drop(rt);
        let t = r.task("t1").unwrap();
        assert_eq!(t["status"], "failed", "{t}");
        let n: Value = serde_json::from_str(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(n["params"]["status"], "failed");
    }
}
