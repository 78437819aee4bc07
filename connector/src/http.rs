//! An MCP server over Streamable HTTP, served to the gateway as a project: the connector is
//! its client (one session, initialized by the connector), and relays each of the gateway's
//! requests to it as a POST of its own.
//!
//! - **The session.** Initialized at start, declaring sampling and elicitation (which the
//!   connector relays to the calling client); its tools are then listed, and
//!   `notifications/tools/list_changed` goes to the gateway when they differ from the last
//!   listing. A call that finds the session gone (404) or the server unreachable marks the
//!   server down and wakes the supervisor, which initializes a new session, retrying with a
//!   backoff while it cannot ([`crate::upstream::backoff`]).
//! - **Calls.** Each request goes to the server under an id of the connector's own, on a
//!   connection it holds alone until the answer is read whole, and its answer (a JSON body or
//!   an event stream) comes back under the gateway's id. A call that ended cleanly leaves its
//!   connection for a later call in the same session (at most [`IDLE_CLIENTS`] idle, each for
//!   at most [`IDLE_AT_MOST`]); one that failed closes it, and a new session (or a lost one)
//!   closes them all. On the answer's event stream, progress and other notifications belong
//!   to that call and go up through its context, before its answer; the server's sampling and
//!   elicitation requests go to the call's client through the gateway, and the client's answer
//!   back to the server. While the server is down a request is answered at once with
//!   `upstream_down`; one whose connection fails midway, with `upstream_unreachable` (outcome
//!   unknown). A call the gateway cancels is cancelled at the server.
//! - **The bearer token** for the server, when it wants one, is read once at start from a file
//!   or the environment ([`crate::TokenSource`]) and sent on every request to it, never logged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use gateway_client::client::{AnswerFuture, ClientError, McpClient};
use gateway_client::TlsTrust;
use gateway_core::Secret;
use serde_json::{json, Value};
use sled_uplink::{CallContext, Handler, TokioConnect};
use tokio::sync::{broadcast, watch, Notify};
use tokio::time::{sleep, Instant};
use tracing::{debug, info, warn};

use crate::upstream::{
    answer_at_once, backoff, related_to, relay_request, status_frame, upstream_error, Status,
    TaskProgressRoutes, PROJECT_NOTIFICATIONS, STABLE_AFTER, TASK_STATUS,
};

/// The largest event read from the server's own event stream: the gateway's limit for one
/// uplink message.
const MAX_EVENT: usize = 16 * 1024 * 1024;

/// The most idle clients (each a keep-alive connection to the server) kept for the next calls.
const IDLE_CLIENTS: usize = 8;
/// How long a client may wait idle for its next call: well under the keep-alive timeouts of
/// common servers (Node's 5 s), so that a call seldom goes on a connection the server is
/// closing just then. Older ones are dropped, and the call dials anew.
const IDLE_AT_MOST: Duration = Duration::from_secs(1);

type Client = McpClient<TokioConnect>;

#[derive(Default)]
struct State {
    status: Option<Status>,
    /// The session: its id (if the server gave one) and the protocol version agreed.
    session: Option<(Option<String>, Option<String>)>,
    tools: Option<Vec<Value>>,
    /// The connector's id of each call from the gateway, by connection and gateway id.
    by_call: HashMap<(u64, u64), u64>,
    /// Counts the changes of `session`: a client taken in one session goes back to `idle`
    /// only if the session is still the same.
    epoch: u64,
    /// Clients of the current session between calls, each with the time it came back (the
    /// newest last).
    idle: Vec<(Client, Instant)>,
}

impl State {
    /// A new session, or none: the clients of the last one go.
    fn set_session(&mut self, session: Option<(Option<String>, Option<String>)>) {
        self.session = session;
        self.epoch += 1;
        self.idle.clear();
    }
}

/// One project's MCP server, at a URL.
pub struct HttpServer {
    project: String,
    url: String,
    bearer: Option<Secret>,
    tls: TlsTrust,
    state: Mutex<State>,
    /// A call found the server gone: the supervisor initializes again.
    lost: Notify,
    notices: broadcast::Sender<String>,
    /// Where the progress of its tasks goes after the calls that made them were answered.
    task_routes: TaskProgressRoutes,
    next_id: AtomicU64,
    /// Sessions made after the first.
    restarts: AtomicU64,
    /// Notifications on the server's own event stream that name no call.
    pub dropped_notifications: AtomicU64,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("project", &self.project)
            .field("url", &self.url)
            .field("status", &self.status())
            .finish()
    }
}

impl HttpServer {
    /// `project`'s server at `url` (checked), sent `bearer` when given, over TLS verified
    /// against `tls` for an `https` URL.
    pub fn new(project: &str, url: &str, bearer: Option<Secret>, tls: TlsTrust) -> Arc<HttpServer> {
        Arc::new(HttpServer {
            project: project.to_owned(),
            url: url.to_owned(),
            bearer,
            tls,
            state: Mutex::default(),
            lost: Notify::new(),
            notices: broadcast::channel(256).0,
            task_routes: TaskProgressRoutes::default(),
            next_id: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            dropped_notifications: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What the server is doing now.
    pub fn status(&self) -> Status {
        self.lock()
            .status
            .clone()
            .unwrap_or_else(|| Status::Down("not started yet".into()))
    }

    /// A client for one exchange, in the session when there is one, on a new connection.
    async fn client(&self) -> Result<Client, String> {
        let session = self.lock().session.clone();
        self.connect(session).await
    }

    /// A client on a new connection, in `session`.
    async fn connect(
        &self,
        session: Option<(Option<String>, Option<String>)>,
    ) -> Result<Client, String> {
        let mut c = McpClient::connect_with(TokioConnect, &self.url, self.tls.clone())
            .await
            .map_err(|e| format!("cannot reach {}: {e}", self.url))?;
        c.set_client_name("gateway-sled");
        c.set_bearer_token(self.bearer.as_ref().map(|b| b.expose().to_owned()));
        c.set_timeout(None);
        if let Some((session, version)) = session {
            c.set_session_id(session);
            c.set_protocol_version(version);
        }
        Ok(c)
    }

    /// A client for one call in the current session (an idle one if there is one, else one on
    /// a new connection), and the session's epoch, for [`HttpServer::give_back`].
    async fn take_client(&self) -> Result<(Client, u64), String> {
        let (idle, epoch, session) = {
            let mut s = self.lock();
            if s.idle
                .last()
                .is_some_and(|(_, since)| since.elapsed() >= IDLE_AT_MOST)
            {
                // The newest is too old, and so are the others.
                s.idle.clear();
            }
            (s.idle.pop(), s.epoch, s.session.clone())
        };
        match idle {
            Some((c, _)) => Ok((c, epoch)),
            None => Ok((self.connect(session).await?, epoch)),
        }
    }

    /// A client whose call ended cleanly, for the next call: kept while its session is the
    /// current one and running, and fewer than [`IDLE_CLIENTS`] are idle.
    fn give_back(&self, c: Client, epoch: u64) {
        let mut s = self.lock();
        if s.epoch == epoch
            && s.session.is_some()
            && s.status == Some(Status::Running)
            && s.idle.len() < IDLE_CLIENTS
        {
            s.idle.push((c, Instant::now()));
        }
    }

    /// Sets the server's status, and says it to the gateway (an `upstream` frame).
    fn say(&self, s: &mut State, status: Status) {
        let restarts = self.restarts.load(Ordering::Relaxed);
        let _ = self.notices.send(status_frame(&status, restarts));
        s.status = Some(status);
    }

    /// The server is not serving (`reason`): calls are refused until a new session is made.
    fn mark_lost(&self, reason: &str) {
        let mut s = self.lock();
        if s.status == Some(Status::Running) {
            warn!(project = %self.project, reason, "the MCP server is unreachable or its session is gone; initializing again");
            self.say(&mut s, Status::Down(reason.to_owned()));
            s.set_session(None);
            self.lost.notify_one();
        }
    }

    /// Keeps a session with the server until `stop` turns true: initializes one, and again
    /// after a call found it gone, with a backoff while it cannot.
    pub async fn supervise(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut failures: u32 = 0;
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) {
                self.restarts.fetch_add(1, Ordering::Relaxed);
            }
            let started = Instant::now();
            match self.initialize().await {
                Ok(()) => {
                    // The session's own event stream, for as long as the session lasts.
                    let listening = tokio::spawn(Arc::clone(&self).listen());
                    let stopped = tokio::select! {
                        () = self.lost.notified() => false,
                        _ = stop.wait_for(|s| *s) => true,
                    };
                    listening.abort();
                    if stopped {
                        return;
                    }
                }
                Err(reason) => {
                    warn!(project = %self.project, url = %self.url, %reason, "cannot initialize the MCP server");
                    self.say(&mut self.lock(), Status::Down(reason));
                }
            }
            if started.elapsed() >= STABLE_AFTER {
                failures = 0;
            }
            let delay = backoff(failures);
            failures = failures.saturating_add(1);
            tokio::select! {
                () = sleep(delay) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Reads the session's standalone event stream (GET), opening it again with a backoff when
    /// it ends, until the session is lost (the supervisor then aborts this task): what the
    /// server says there of its own accord is its project's (list changes, resource updates).
    /// A server that offers no such stream (405) is not asked again in this session.
    async fn listen(self: Arc<Self>) {
        let mut failures: u32 = 0;
        loop {
            let started = Instant::now();
            let ended = match self.client().await {
                Ok(c) => {
                    let this = Arc::clone(&self);
                    c.listen(MAX_EVENT, &mut |m| this.on_stream_message(m))
                        .await
                }
                Err(reason) => Err(ClientError::Protocol(reason)),
            };
            match ended {
                Err(ClientError::Http { status: 405, .. }) => {
                    info!(project = %self.project, "the MCP server offers no event stream of its own (GET: 405): what it says there (list changes, resource updates) cannot reach the gateway");
                    return;
                }
                Err(ClientError::Http { status: 404, .. }) => {
                    self.mark_lost("its session is gone (404 on its event stream)");
                    return;
                }
                Err(e) => {
                    debug!(project = %self.project, error = %e, "the MCP server's event stream ended; opening it again")
                }
                Ok(()) => {
                    debug!(project = %self.project, "the MCP server ended its event stream; opening it again")
                }
            }
            if started.elapsed() >= STABLE_AFTER {
                failures = 0;
            }
            sleep(backoff(failures)).await;
            failures = failures.saturating_add(1);
        }
    }

    /// A message on the session's own event stream: it names no call. A list change, a
    /// resource update or a log message goes to the gateway; a `ping` is answered, another request refused (it
    /// has no client to go to); anything else is dropped and counted.
    fn on_stream_message(self: &Arc<Self>, m: Value) {
        let method = m.get("method").and_then(Value::as_str).unwrap_or_default();
        if m.get("id").is_some() && !method.is_empty() {
            let reply = answer_at_once(&m).unwrap_or_else(|| {
                json!({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601,
                    "message": format!("{method} on the session's own stream names no call whose client could answer it")}})
            });
            let this = Arc::clone(self);
            tokio::spawn(async move {
                if let Ok(mut c) = this.client().await {
                    if let Err(e) = c.post_raw(reply.to_string().into_bytes(), &[]).await {
                        debug!(project = %this.project, error = %e, "an answer did not reach the MCP server");
                    }
                }
            });
        } else if PROJECT_NOTIFICATIONS.contains(&method) || method == "notifications/message" {
            // A log message here names no call: the project's (the gateway gives it to the
            // sessions working on it).
            if method == TASK_STATUS {
                self.task_routes.on_status(&m);
            }
            let _ = self.notices.send(m.to_string());
        } else if method == "notifications/progress" && self.task_routes.route(&m, &self.notices) {
            // A task's progress, after the call that made it was answered.
        } else {
            self.dropped_notifications.fetch_add(1, Ordering::Relaxed);
            debug!(project = %self.project, method, "a notification on the server's own stream names no call; dropped");
        }
    }

    /// A new session, then its tools: the gateway is told when they are not the last ones.
    async fn initialize(&self) -> Result<(), String> {
        {
            let mut s = self.lock();
            s.set_session(None);
            self.say(&mut s, Status::Starting);
        }
        let mut c = self.client().await?;
        let init = c
            .initialize_with(json!({"sampling": {}, "elicitation": {}}))
            .await
            .map_err(|e| format!("initialize failed: {e}"))?;
        let session = (
            c.session_id().map(str::to_owned),
            c.protocol_version().map(str::to_owned),
        );
        let server = init
            .pointer("/result/serverInfo/name")
            .and_then(Value::as_str)
            .unwrap_or("?");
        info!(project = %self.project, url = %self.url, protocol = ?session.1, server,
            "the MCP server is initialized");
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = c
                .tools_list(json!("gateway-sled-tools"), cursor.as_deref())
                .await
                .map_err(|e| format!("tools/list failed: {e}"))?;
            if let Some(t) = page.pointer("/result/tools").and_then(Value::as_array) {
                tools.extend(t.iter().cloned());
            }
            cursor = page
                .pointer("/result/nextCursor")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if cursor.is_none() || tools.len() > 100_000 {
                break;
            }
        }
        let changed = {
            let mut s = self.lock();
            let changed = s.tools.as_ref() != Some(&tools);
            s.tools = Some(tools);
            s.set_session(Some(session));
            self.say(&mut s, Status::Running);
            // Its connection, idle now, serves the first call.
            s.idle.push((c, Instant::now()));
            changed
        };
        if changed {
            let _ = self.notices.send(
                json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}).to_string(),
            );
        }
        Ok(())
    }

    async fn forward(self: Arc<Self>, msg: Value, ctx: CallContext) -> Option<Value> {
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let as_task = method == "tools/call" && params.get("task").is_some();
        let Some(gateway_id) = msg.get("id").cloned() else {
            // A notification for the server.
            if let Ok((mut c, epoch)) = self.take_client().await {
                match c.notify(&method, params).await {
                    Ok(_) => self.give_back(c, epoch),
                    Err(e) => {
                        debug!(project = %self.project, method, error = %e, "a notification did not reach the MCP server")
                    }
                }
            }
            return None;
        };
        let refused = match self.lock().status.clone() {
            Some(Status::Running) => None,
            Some(Status::Down(reason)) => Some(reason),
            Some(Status::Starting) => Some("it is being initialized".to_owned()),
            None => Some("not started yet".to_owned()),
        };
        if let Some(reason) = refused {
            return Some(upstream_error(
                &gateway_id,
                &self.project,
                "upstream_down",
                "not_sent",
                &reason,
            ));
        }
        let (mut client, epoch) = match self.take_client().await {
            Ok(c) => c,
            Err(reason) => {
                self.mark_lost(&reason);
                return Some(upstream_error(
                    &gateway_id,
                    &self.project,
                    "upstream_down",
                    "not_sent",
                    &reason,
                ));
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let call = ctx.request_id().map(|r| (ctx.connection(), r));
        if let Some(call) = call {
            self.lock().by_call.insert(call, id);
        }
        // However the call ends (answered, or its task aborted when its uplink connection
        // closed, which drops the POST and so its connection to the server), its id goes.
        let _forget = ForgetCall {
            server: Arc::clone(&self),
            call,
        };
        let token = ctx.progress_token().cloned();
        let asker = ctx.clone();
        let answer = &mut move |m: &Value| -> AnswerFuture {
            let (ctx, m) = (asker.clone(), m.clone());
            Box::pin(async move { relay_request(&ctx, &m).await })
        };
        let notified = &mut |n: &Value| {
            let method = n.get("method").and_then(Value::as_str).unwrap_or_default();
            if method == "notifications/progress" {
                if token.is_some() && n.pointer("/params/progressToken") == token.as_ref() {
                    ctx.send_as_is(n);
                }
            } else if PROJECT_NOTIFICATIONS.contains(&method) {
                if method == TASK_STATUS {
                    self.task_routes.on_status(n);
                }
                let _ = self.notices.send(n.to_string());
            } else if let Some(call) = ctx.request_id() {
                ctx.send_as_is(&related_to(n.clone(), call));
            }
        };
        let answered = client
            .request_streaming_async(json!(id), &method, params, &[], answer, notified)
            .await;
        Some(match answered {
            Ok((mut v, _)) => {
                // Its answer read whole: its connection is free for another call.
                self.give_back(client, epoch);
                self.task_routes.on_answer(as_task, &v, &ctx);
                v["id"] = gateway_id;
                v
            }
            Err(ClientError::Http { status: 404, .. }) => {
                self.mark_lost("its session is gone (404)");
                upstream_error(
                    &gateway_id,
                    &self.project,
                    "upstream_down",
                    "not_sent",
                    "its session is gone (404); initializing a new one",
                )
            }
            Err(ClientError::Http { status, body }) => {
                let body: String = body.chars().take(200).collect();
                upstream_error(
                    &gateway_id,
                    &self.project,
                    "upstream_unreachable",
                    "unknown",
                    &format!("it answered HTTP {status}: {body}"),
                )
            }
            Err(e) => {
                let reason = e.to_string();
                self.mark_lost(&reason);
                upstream_error(
                    &gateway_id,
                    &self.project,
                    "upstream_unreachable",
                    "unknown",
                    &reason,
                )
            }
        })
    }
}

/// Removes a call's id from `by_call` when the call ends, answered or abandoned.
struct ForgetCall {
    server: Arc<HttpServer>,
    call: Option<(u64, u64)>,
}

impl Drop for ForgetCall {
    fn drop(&mut self) {
        if let Some(call) = self.call {
            self.server.lock().by_call.remove(&call);
        }
    }
}

impl Handler for HttpServer {
    fn project_name(&self) -> &str {
        &self.project
    }

    fn handle(self: Arc<Self>, msg: Value, ctx: CallContext) -> BoxFuture<'static, Option<Value>> {
        self.forward(msg, ctx).boxed()
    }

    fn cancelled(&self, connection: u64, params: &Value) {
        let Some(rid) = params.get("requestId").and_then(Value::as_u64) else {
            return;
        };
        let Some(id) = self.lock().by_call.remove(&(connection, rid)) else {
            return;
        };
        let mut cancel = json!({"requestId": id});
        if let Some(reason) = params.get("reason") {
            cancel["reason"] = reason.clone();
        }
        let (url, tls, bearer, session) = (
            self.url.clone(),
            self.tls.clone(),
            self.bearer.as_ref().map(|b| b.expose().to_owned()),
            self.lock().session.clone(),
        );
        let project = self.project.clone();
        debug!(project, request = id, "cancelling a call at the MCP server");
        tokio::spawn(async move {
            let Ok(mut c) = McpClient::connect_with(TokioConnect, &url, tls).await else {
                return;
            };
            c.set_bearer_token(bearer);
            if let Some((session, version)) = session {
                c.set_session_id(session);
                c.set_protocol_version(version);
            }
            if let Err(e) = c.notify("notifications/cancelled", cancel).await {
                debug!(project, error = %e, "the cancellation did not reach the MCP server");
            }
        });
    }

    fn notices(&self) -> Option<broadcast::Receiver<String>> {
        Some(self.notices.subscribe())
    }

    fn welcome_frames(&self) -> Vec<String> {
        vec![status_frame(
            &self.status(),
            self.restarts.load(Ordering::Relaxed),
        )]
    }
}
