//! An MCP server run as a child over stdio, served to the gateway as a project: the
//! connector is the server's client (it initializes it), and relays the gateway's requests to
//! it and its answers and notifications back.
//!
//! - **The child's life.** Started with the project's command, environment and working
//!   directory; its stderr goes to the log, line by line. When it exits (or cannot start, or
//!   does not answer `initialize` within [`INIT_TIMEOUT`]) every call in flight is answered at
//!   once with `upstream_exited` (outcome unknown: the server may have acted), and it is
//!   started again after a backoff that doubles from [`BACKOFF_MIN`] to [`BACKOFF_MAX`] (and
//!   starts over once a child has run for [`STABLE_AFTER`]). After each start its tools are
//!   listed, and `notifications/tools/list_changed` goes to the gateway when they differ from
//!   the last listing.
//! - **Calls.** Each request from the gateway goes to the child under an id of the
//!   connector's own (the gateway's ids are unique per uplink connection only) and its answer
//!   comes back under the gateway's. While the child is not running a request is answered at
//!   once with `upstream_down`, naming the project and the reason. A call the gateway cancels
//!   is cancelled at the child (`notifications/cancelled` with the child's id).
//! - **What the child sends.** A line that is not a JSON object, a response for an id that is
//!   not in flight and a message that is no JSON-RPC are logged and counted, never forwarded;
//!   a line longer than [`MAX_LINE_BYTES`] (the gateway's uplink limit) is skipped and counted.
//!   Progress goes to the gateway as it is, on the way of the call whose token it names, so it
//!   arrives before that call's answer (as the server sent them); list changes and
//!   `resources/updated` go as they are. A log message names no call on stdio: it goes to the
//!   call in flight when there is exactly one, and up as the project's otherwise (the gateway
//!   gives it to the sessions working on the project); another notification is then dropped
//!   (and counted). Of the child's own requests `ping` is answered here;
//!   sampling and elicitation go to the client of the call in flight through the gateway (which
//!   refuses them for a client that did not declare them), and its answer back to the child,
//!   when exactly one call is in flight, for a request on stdio names no call; with none or
//!   several they are refused. Roots, which are a client's and not one call's, are refused
//!   with -32601 and not declared.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Value};
use sled_uplink::{CallContext, Handler};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{sleep, timeout, Instant};
use tracing::{debug, info, warn};

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::upstream::{
    answer_at_once, backoff, related_to, relay_request, status_frame, upstream_error, Status,
    TaskProgressRoutes, PROJECT_NOTIFICATIONS, STABLE_AFTER, TASK_STATUS,
};

/// How long a started child has to answer `initialize`.
pub const INIT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest line read from a child: the gateway's limit for one uplink message.
pub const MAX_LINE_BYTES: usize = 16 << 20;
/// The MCP revision the connector asks its child for.
pub const PROTOCOL_VERSION: &str = "2025-11-25";
/// At stop, how long the child gets to end once its stdin is closed (it is killed after 2 s).
const STOP_WAIT: Duration = Duration::from_secs(3);

/// What went wrong with what the child sent, and its restarts.
#[derive(Debug, Default)]
pub struct Counters {
    pub restarts: AtomicU64,
    pub non_json_lines: AtomicU64,
    pub oversized_lines: AtomicU64,
    pub invalid_messages: AtomicU64,
    pub unknown_responses: AtomicU64,
    pub dropped_notifications: AtomicU64,
}

/// A call in flight at the child, by the connector's id.
struct Pending {
    reply: oneshot::Sender<Value>,
    /// The uplink connection and the gateway's id, for a call from the gateway; `None` for
    /// the connector's own requests.
    call: Option<(u64, u64)>,
    /// The call's way to its client, for the server's requests and notifications during it.
    ctx: Option<CallContext>,
    /// The progress token the gateway gave the call.
    progress: Option<Value>,
}

#[derive(Default)]
struct Shared {
    /// Lines for the running child's stdin.
    stdin: Option<mpsc::UnboundedSender<String>>,
    status: Option<Status>,
    /// The last child's end, for the calls it took with it.
    last_exit: Option<String>,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    /// The connector's id of each call from the gateway, by connection and gateway id.
    by_call: HashMap<(u64, u64), u64>,
    /// The tools the last child listed.
    tools: Option<Vec<Value>>,
}

/// One project's MCP server, as a child over stdio.
pub struct StdioServer {
    project: String,
    /// The program and its arguments.
    command: Vec<String>,
    cwd: Option<PathBuf>,
    env: BTreeMap<String, String>,
    shared: Mutex<Shared>,
    notices: broadcast::Sender<String>,
    /// Where the progress of its tasks goes after the calls that made them were answered.
    task_routes: TaskProgressRoutes,
    pub counters: Counters,
}

impl std::fmt::Debug for StdioServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioServer")
            .field("project", &self.project)
            .field("status", &self.status())
            .finish()
    }
}

impl StdioServer {
    /// `project`'s server, run as `command` (not empty) in `cwd` with `env` added.
    pub fn new(
        project: &str,
        command: Vec<String>,
        cwd: Option<PathBuf>,
        env: BTreeMap<String, String>,
    ) -> Arc<StdioServer> {
        Arc::new(StdioServer {
            project: project.to_owned(),
            command,
            cwd,
            env,
            shared: Mutex::default(),
            notices: broadcast::channel(1024).0,
            task_routes: TaskProgressRoutes::default(),
            counters: Counters::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What the child is doing now.
    pub fn status(&self) -> Status {
        self.lock()
            .status
            .clone()
            .unwrap_or_else(|| Status::Down("not started yet".into()))
    }

    fn project(&self) -> &str {
        &self.project
    }

    /// Runs the child, and again each time it ends, until `stop` turns true; then stops the
    /// last one (its stdin closed, then killed after 2 s).
    pub async fn supervise(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut failures: u32 = 0;
        loop {
            let started = Instant::now();
            let run = self.clone().run_child();
            tokio::pin!(run);
            let stopping = tokio::select! {
                reason = &mut run => Err(reason),
                _ = stop.wait_for(|s| *s) => Ok(()),
            };
            let ended = match stopping {
                Err(reason) => reason,
                Ok(()) => {
                    // Its stdin is closed (the writer ends with its sender), which ends a server
                    // that reads it; `run_child` waits 2 s for the exit, else kills it. A child
                    // still starting is killed when `run` is dropped.
                    self.lock().stdin = None;
                    match timeout(STOP_WAIT, &mut run).await {
                        Ok(reason) => format!("the connector is stopping: {reason}"),
                        Err(_) => "the connector is stopping; killed".to_owned(),
                    }
                }
            };
            self.child_ended(&ended);
            if *stop.borrow() {
                return;
            }
            if started.elapsed() >= STABLE_AFTER {
                failures = 0;
            }
            let delay = backoff(failures);
            failures = failures.saturating_add(1);
            warn!(project = self.project(), reason = %ended, retry_in = ?delay, "the MCP server is down; restarting it");
            tokio::select! {
                () = sleep(delay) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            self.counters.restarts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sets the server's status, and says it to the gateway (an `upstream` frame).
    fn say(&self, s: &mut Shared, status: Status) {
        let restarts = self.counters.restarts.load(Ordering::Relaxed);
        let _ = self.notices.send(status_frame(&status, restarts));
        s.status = Some(status);
    }

    /// The child is gone: every call in flight is answered (`upstream_exited`), and new ones
    /// are refused until the next one runs.
    fn child_ended(&self, reason: &str) {
        let mut s = self.lock();
        s.stdin = None;
        self.say(&mut s, Status::Down(reason.to_owned()));
        s.last_exit = Some(reason.to_owned());
        // Dropping the senders answers each waiting call.
        s.pending.clear();
        s.by_call.clear();
    }

    /// One child, from its start to its end: why it ended.
    async fn run_child(self: Arc<Self>) -> String {
        let (program, args) = self
            .command
            .split_first()
            .expect("a checked config has a command");
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(&self.env)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        self.say(&mut self.lock(), Status::Starting);
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => return format!("cannot start {program}: {e}"),
        };
        info!(
            project = self.project(),
            pid = child.id(),
            "started the MCP server"
        );
        let (mut stdin, stdout, stderr) = (
            child.stdin.take().expect("piped"),
            child.stdout.take().expect("piped"),
            child.stderr.take().expect("piped"),
        );
        let (lines, mut to_write) = mpsc::unbounded_channel::<String>();
        let writer = async move {
            while let Some(mut line) = to_write.recv().await {
                line.push('\n');
                if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
            // Its stdin closes here: a server reading it ends.
        };
        let project = self.project().to_owned();
        tokio::spawn(async move {
            let mut stderr = BufReader::new(stderr);
            loop {
                match read_line(&mut stderr, 64 << 10).await {
                    Ok(Line::Text(line)) => {
                        info!(
                            project,
                            "stderr: {}",
                            String::from_utf8_lossy(&line).trim_end()
                        )
                    }
                    Ok(Line::TooLong) => info!(project, "stderr: (a line over 64 KiB, skipped)"),
                    Ok(Line::End) | Err(_) => break,
                }
            }
        });
        let me = self.clone();
        let reader = async move {
            let mut stdout = BufReader::new(stdout);
            loop {
                match read_line(&mut stdout, MAX_LINE_BYTES).await {
                    Ok(Line::Text(line)) => me.on_line(&line),
                    Ok(Line::TooLong) => {
                        me.counters.oversized_lines.fetch_add(1, Ordering::Relaxed);
                        warn!(
                            project = me.project(),
                            limit = MAX_LINE_BYTES,
                            "the MCP server wrote a message over the limit; skipped"
                        );
                    }
                    Ok(Line::End) => return "its stdout closed".to_owned(),
                    Err(e) => return format!("reading its stdout failed: {e}"),
                }
            }
        };
        self.lock().stdin = Some(lines);
        let me = self.clone();
        let life = async move {
            tokio::pin!(reader);
            let init = me.initialize();
            tokio::pin!(init);
            // Initialized while its stdout is read: the answer comes through the reader.
            tokio::select! {
                ended = &mut reader => return ended,
                r = &mut init => if let Err(e) = r { return e },
            }
            reader.await
        };
        let ended = tokio::select! {
            ended = life => ended,
            () = writer => "its stdin closed".to_owned(),
        };
        exit_of(&mut child, ended).await
    }

    /// Initializes the child as its client, then lists its tools: the gateway is told when
    /// they are not the ones the last child listed.
    async fn initialize(&self) -> Result<(), String> {
        let init = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    // What it relays to the calling client (`upstream::RELAYED_REQUESTS`); not roots,
                    // which are a client's and not one call's.
                    "capabilities": {"sampling": {}, "elicitation": {}},
                    "clientInfo": {"name": "gateway-sled", "version": env!("CARGO_PKG_VERSION")},
                }),
            )
            .await?;
        if let Some(e) = init.get("error") {
            return Err(format!("it refused initialize: {e}"));
        }
        let version = init.pointer("/result/protocolVersion").cloned();
        self.send_line(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
        );
        self.say(&mut self.lock(), Status::Running);
        info!(project = self.project(), protocol = ?version, "the MCP server is initialized");
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        loop {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let page = self.request("tools/list", params).await?;
            if let Some(t) = page.pointer("/result/tools").and_then(Value::as_array) {
                tools.extend(t.iter().cloned());
            }
            cursor = page
                .pointer("/result/nextCursor")
                .filter(|c| !c.is_null())
                .cloned();
            if cursor.is_none() || tools.len() > 100_000 {
                break;
            }
        }
        let changed = {
            let mut s = self.lock();
            let changed = s.tools.as_ref() != Some(&tools);
            s.tools = Some(tools);
            changed
        };
        if changed {
            debug!(
                project = self.project(),
                "its tools differ from the last listing; telling the gateway"
            );
            let _ = self.notices.send(
                json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}).to_string(),
            );
        }
        Ok(())
    }

    /// A request of the connector's own to the child, answered within [`INIT_TIMEOUT`].
    async fn request(&self, method: &str, params: Value) -> Result<Value, String> {
        let (reply, answer) = oneshot::channel();
        let id = {
            let mut s = self.lock();
            s.next_id += 1;
            let id = s.next_id;
            s.pending.insert(
                id,
                Pending {
                    reply,
                    call: None,
                    ctx: None,
                    progress: None,
                },
            );
            id
        };
        self.send_line(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        match timeout(INIT_TIMEOUT, answer).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(format!("it ended before answering {method}")),
            Err(_) => {
                self.lock().pending.remove(&id);
                Err(format!("no answer to {method} within {INIT_TIMEOUT:?}"))
            }
        }
    }

    fn send_line(&self, line: String) -> bool {
        self.lock()
            .stdin
            .as_ref()
            .is_some_and(|w| w.send(line).is_ok())
    }

    /// One line from the child's stdout.
    fn on_line(&self, line: &[u8]) {
        let project = self.project();
        let v: Value = match serde_json::from_slice(line) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                self.counters.non_json_lines.fetch_add(1, Ordering::Relaxed);
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                warn!(project, line = %shown.trim_end(), "the MCP server wrote a line that is not a JSON object; ignored");
                return;
            }
        };
        if v.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            self.counters
                .invalid_messages
                .fetch_add(1, Ordering::Relaxed);
            warn!(
                project,
                "the MCP server wrote a message that is not JSON-RPC 2.0; ignored"
            );
            return;
        }
        let method = v.get("method").and_then(Value::as_str);
        match (method, v.get("id")) {
            (None, Some(id)) if v.get("result").is_some() || v.get("error").is_some() => {
                let pending = id.as_u64().and_then(|id| {
                    let mut s = self.lock();
                    let p = s.pending.remove(&id)?;
                    if let Some(call) = p.call {
                        s.by_call.remove(&call);
                    }
                    Some(p)
                });
                match pending {
                    Some(p) => {
                        let _ = p.reply.send(v);
                    }
                    None => {
                        self.counters
                            .unknown_responses
                            .fetch_add(1, Ordering::Relaxed);
                        warn!(project, id = %id, "the MCP server answered a request that is not in flight; ignored");
                    }
                }
            }
            (Some(m), Some(_)) => self.on_request(m.to_owned(), v),
            (Some(m), None) => {
                let m = m.to_owned();
                self.on_notification(&m, v)
            }
            _ => {
                self.counters
                    .invalid_messages
                    .fetch_add(1, Ordering::Relaxed);
                warn!(project, "the MCP server wrote a JSON-RPC message that is neither request, response nor notification; ignored");
            }
        }
    }

    /// The server's own request: `ping` answered here; sampling and elicitation relayed to
    /// the client of the call in flight (on stdio a request names no call, so there must be
    /// exactly one); anything else refused.
    fn on_request(&self, method: String, v: Value) {
        if let Some(answer) = answer_at_once(&v) {
            self.send_line(answer.to_string());
            return;
        }
        let calls: Vec<CallContext> = {
            let s = self.lock();
            s.pending
                .values()
                .filter_map(|p| p.ctx.clone())
                .take(2)
                .collect()
        };
        let [ctx] = &calls[..] else {
            let refusal = json!({"jsonrpc": "2.0", "id": v["id"], "error": {"code": -32603,
            "message": format!(
                "gateway-sled cannot tell which call this {method} belongs to: {} calls are in flight, and a request on stdio names none",
                if calls.is_empty() { "no" } else { "several" }
            )}});
            self.send_line(refusal.to_string());
            return;
        };
        let (ctx, stdin) = (ctx.clone(), self.lock().stdin.clone());
        tokio::spawn(async move {
            let answer = relay_request(&ctx, &v).await;
            // To the child that asked, not a later one.
            if let Some(stdin) = stdin {
                let _ = stdin.send(answer.to_string());
            }
        });
    }

    /// A notification from the server. One for a call goes up through that call's context, so
    /// that it reaches the gateway before the call's answer, as the server sent them: progress
    /// by the call's token, anything else (a log message) to the call in flight when there is
    /// exactly one (on stdio it names none). List changes and `resources/updated` are the
    /// project's, not a call's.
    fn on_notification(&self, method: &str, mut v: Value) {
        if PROJECT_NOTIFICATIONS.contains(&method) {
            if method == TASK_STATUS {
                self.task_routes.on_status(&v);
            }
            let _ = self.notices.send(v.to_string());
            return;
        }
        let progress = method == "notifications/progress";
        let calls: Vec<(u64, CallContext)> = {
            let s = self.lock();
            let token = v.pointer("/params/progressToken");
            s.pending
                .values()
                .filter(|p| !progress || (p.progress.is_some() && p.progress.as_ref() == token))
                .filter_map(|p| Some((p.call?.1, p.ctx.clone()?)))
                .take(2)
                .collect()
        };
        let [(call, ctx)] = &calls[..] else {
            if progress && calls.is_empty() && self.task_routes.route(&v, &self.notices) {
                // A task's progress, after the call that made it was answered.
                return;
            }
            if method == "notifications/message" {
                // The server's own log message, or one of several calls': the project's (the
                // gateway gives it to the sessions working on it).
                let _ = self.notices.send(v.to_string());
                return;
            }
            self.counters
                .dropped_notifications
                .fetch_add(1, Ordering::Relaxed);
            debug!(project = self.project(), method, calls = calls.len(), "a notification for no call in flight, or one that names none with several in flight; dropped");
            return;
        };
        if !progress {
            v = related_to(v, *call);
        }
        ctx.send_as_is(&v);
    }

    /// Sends the gateway's request to the child under an id of the connector's own, at once
    /// (before the call's task first runs, so that nothing waits between the uplink frame and
    /// the child's stdin); the future is its answer under the gateway's id.
    fn forward(
        self: Arc<Self>,
        mut msg: Value,
        ctx: CallContext,
    ) -> BoxFuture<'static, Option<Value>> {
        let Some(gateway_id) = msg.get("id").cloned() else {
            // A notification for the server.
            self.send_line(msg.to_string());
            return futures_util::future::ready(None).boxed();
        };
        let as_task = msg.get("method").and_then(Value::as_str) == Some("tools/call")
            && msg.pointer("/params/task").is_some();
        let (reply, answer) = oneshot::channel();
        let id = {
            let mut s = self.lock();
            let running = s.status == Some(Status::Running) && s.stdin.is_some();
            if !running {
                let reason = match &s.status {
                    Some(Status::Down(r)) => r.clone(),
                    Some(Status::Starting) => "it is starting".to_owned(),
                    _ => "not started yet".to_owned(),
                };
                return futures_util::future::ready(Some(upstream_error(
                    &gateway_id,
                    self.project(),
                    "upstream_down",
                    "not_sent",
                    &reason,
                )))
                .boxed();
            }
            s.next_id += 1;
            let id = s.next_id;
            let call = ctx.request_id().map(|r| (ctx.connection(), r));
            s.pending.insert(
                id,
                Pending {
                    reply,
                    call,
                    ctx: Some(ctx.clone()),
                    progress: ctx.progress_token().cloned(),
                },
            );
            if let Some(call) = call {
                s.by_call.insert(call, id);
            }
            msg["id"] = json!(id);
            let sent = s
                .stdin
                .as_ref()
                .is_some_and(|w| w.send(msg.to_string()).is_ok());
            if !sent {
                s.pending.remove(&id);
                return futures_util::future::ready(Some(upstream_error(
                    &gateway_id,
                    self.project(),
                    "upstream_down",
                    "not_sent",
                    "its stdin is closed",
                )))
                .boxed();
            }
            id
        };
        // A call whose task ends before the server answers (its uplink connection closed, the
        // task aborted, even before it first ran) leaves nothing behind, and the server is
        // told to stop.
        let abandoned = Abandoned {
            server: Arc::clone(&self),
            id,
            answered: false,
        };
        self.answer(gateway_id, as_task, answer, abandoned, ctx)
            .boxed()
    }

    /// The answer to the call `abandoned` guards, under the gateway's id.
    async fn answer(
        self: Arc<Self>,
        gateway_id: Value,
        as_task: bool,
        answer: oneshot::Receiver<Value>,
        mut abandoned: Abandoned,
        ctx: CallContext,
    ) -> Option<Value> {
        let answered = answer.await;
        abandoned.answered = true;
        drop(abandoned);
        match answered {
            Ok(mut v) => {
                self.task_routes.on_answer(as_task, &v, &ctx);
                v["id"] = gateway_id;
                Some(v)
            }
            Err(_) => {
                let reason = self
                    .lock()
                    .last_exit
                    .clone()
                    .unwrap_or_else(|| "it exited".into());
                Some(upstream_error(
                    &gateway_id,
                    self.project(),
                    "upstream_exited",
                    "unknown",
                    &reason,
                ))
            }
        }
    }
}

/// Dropped before its call was answered: the call was abandoned (its task aborted, as when the
/// uplink connection it came on closes). Its pending entry goes, and the server hears
/// `notifications/cancelled`, so neither waits for an answer nobody will read.
struct Abandoned {
    server: Arc<StdioServer>,
    id: u64,
    answered: bool,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let pending = {
            let mut s = self.server.lock();
            let pending = s.pending.remove(&self.id);
            if let Some(call) = pending.as_ref().and_then(|p| p.call) {
                s.by_call.remove(&call);
            }
            pending
        };
        if pending.is_some() {
            debug!(
                project = self.server.project(),
                request = self.id,
                "a call's uplink connection closed before it was answered; cancelling it at the MCP server"
            );
            self.server.send_line(
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                       "params": {"requestId": self.id, "reason": "the gateway's connection for this call closed"}})
                .to_string(),
            );
        }
    }
}

impl Handler for StdioServer {
    fn project_name(&self) -> &str {
        &self.project
    }

    fn handle(self: Arc<Self>, msg: Value, ctx: CallContext) -> BoxFuture<'static, Option<Value>> {
        self.forward(msg, ctx)
    }

    fn cancelled(&self, connection: u64, params: &Value) {
        let Some(rid) = params.get("requestId").and_then(Value::as_u64) else {
            return;
        };
        let id = {
            let mut s = self.lock();
            let Some(id) = s.by_call.remove(&(connection, rid)) else {
                return;
            };
            s.pending.remove(&id);
            id
        };
        let mut cancel = json!({"requestId": id});
        if let Some(reason) = params.get("reason") {
            cancel["reason"] = reason.clone();
        }
        debug!(
            project = self.project(),
            request = id,
            "cancelling a call at the MCP server"
        );
        self.send_line(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
                .to_string(),
        );
    }

    fn notices(&self) -> Option<broadcast::Receiver<String>> {
        Some(self.notices.subscribe())
    }

    fn welcome_frames(&self) -> Vec<String> {
        vec![status_frame(
            &self.status(),
            self.counters.restarts.load(Ordering::Relaxed),
        )]
    }
}

/// How the child ended, once `ended` says its pipes did: its exit status if it exits within
/// 2 s, else it is killed.
async fn exit_of(child: &mut Child, ended: String) -> String {
    let status = match timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(e)) => format!("waiting for it failed: {e}"),
        Err(_) => {
            let _ = child.kill().await;
            "killed: it did not exit".to_owned()
        }
    };
    format!("{ended}; {status}")
}

/// One line read from a child.
enum Line {
    /// Without its newline.
    Text(Vec<u8>),
    /// Longer than the limit: skipped up to its newline.
    TooLong,
    End,
}

/// Reads one line of at most `limit` bytes (without buffering more than that of a longer one).
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, limit: usize) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if too_long {
                Line::TooLong
            } else if line.is_empty() {
                Line::End
            } else {
                Line::Text(line)
            });
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (&buf[..at], Some(at + 1)),
            None => (buf, None),
        };
        if !too_long && line.len() + chunk.len() > limit {
            too_long = true;
            line = Vec::new();
        }
        if !too_long {
            line.extend_from_slice(chunk);
        }
        let used = done.unwrap_or(buf.len());
        r.consume(used);
        if done.is_some() {
            if too_long {
                return Ok(Line::TooLong);
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Line::Text(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_over_the_limit_are_skipped_whole() {
        let input = b"short\nthis one is too long\r\nok\r\nlast".to_vec();
        let mut r = BufReader::with_capacity(4, &input[..]);
        let mut got = Vec::new();
        loop {
            match read_line(&mut r, 8).await.unwrap() {
                Line::Text(t) => got.push(String::from_utf8(t).unwrap()),
                Line::TooLong => got.push("<too long>".into()),
                Line::End => break,
            }
        }
        assert_eq!(got, ["short", "<too long>", "ok", "last"]);
    }
}
