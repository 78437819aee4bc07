//! The coordination tools (presence, leases, messages, board, wait) and the enforcement of
//! leases on project writes. The rules are [`crate::coord::Coord`]'s; this file turns tool
//! calls into its calls and its answers into tool results, parks `wait` requests, and keeps
//! who is who.
//!
//! **Agents.** A session is an agent. So is an *agent handle*, issued by `checkin` to a caller
//! without a session (the stateless era, a shell) and passed back as the `agent` argument:
//! 128 bits from the gateway's seeded generator, so unguessable. Neither a session id nor a
//! handle is ever shown to another caller: the coordination state knows each agent by a
//! public name (`agent-N`), which is what rosters, holders and messages show.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::*;
use crate::coord::{
    Claim, Coord, CoordError, Inbox, LeaseView, LostLease, LostReason, MessageTo, PresenceStatus,
    Recipient, WaitReady, WaitReason, WaitStart, WaitToken, WriteCheck,
};

pub(crate) use crate::tools::coordination::*;

/// The `params._meta` key by which a caller without a session names its agent handle on a
/// project tool call, so that its writes are checked (and fenced) as that agent's. Removed
/// before the call is forwarded.
pub(crate) const AGENT_META: &str = "io.mcp-gateway/agent";

/// The notification a session gets on its event stream (GET) when something concerns it in a
/// project: what would wake its `wait` there.
pub(crate) const COORDINATION_NOTIFICATION: &str = "notifications/io.mcp-gateway/coordination";

/// The most entries one `board_list` answer carries (`more` says when there were others).
const BOARD_LIST_PAGE: usize = 200;
/// A parked `wait` that asked for progress gets a progress notification this often, so
/// clients' idle timers do not cut it.
pub(crate) const WAIT_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Coordination state, with the gateway's bookkeeping around it.
#[derive(Debug)]
pub(super) struct Coordination {
    pub(super) coord: Coord,
    /// Public agent names, by session id or handle.
    names: HashMap<String, String>,
    /// Session ids, by the public name of their agent (handles are not here).
    sessions: HashMap<String, String>,
    /// Issued agent handles (the secret), by public name, so that ending one is possible.
    handles: HashMap<String, String>,
    /// Each handle's identity and last use, by public name (quotas and expiry).
    handle_use: HashMap<String, HandleUse>,
    next_agent: u64,
    parked: HashMap<WaitToken, Parked>,
    by_http: HashMap<HttpToken, WaitToken>,
    /// Parked waits that asked for progress, by when the next is due.
    progress_due: std::collections::BTreeSet<(Instant, WaitToken)>,
    next_wait: u64,
    /// Whether coordination state is kept in the store (a single gateway with a state
    /// directory): its answers wait for their writes.
    durable: Option<durable::Durable>,
    /// Public names of agents from before a restart, by the SHA-256 of their session id or
    /// handle, until it comes back.
    earlier_names: HashMap<String, String>,
    /// Names given or forgotten since the last batch, for the store.
    name_changes: Vec<crate::coord::RecordChange>,
    /// Names whose write failed: written again with the next batch.
    name_retries: Vec<crate::coord::RecordChange>,
    /// In a cluster: an agent's name is derived from its session id or handle, the same on
    /// every replica (a lease kept by one holder names the same agent on the next), and none
    /// is written.
    derived_names: bool,
}

/// Who an agent handle belongs to, and when it was last used.
#[derive(Debug)]
pub(super) struct HandleUse {
    /// The identity that got it (`Identity::session_owner`; `None` without authentication).
    owner: Option<String>,
    last_used: Instant,
}

/// A `wait` whose answer has not come yet.
#[derive(Debug)]
pub(super) struct Parked {
    http: HttpToken,
    client_id: RawId,
    pub(super) agent: String,
    project: Option<String>,
    /// The client's progress token, when it asked for progress and reads SSE.
    progress: Option<Box<RawValue>>,
    /// Whether the answer has become an SSE stream (after the first progress).
    streamed: bool,
    next_progress: Instant,
    sent_progress: u64,
    /// Who waits, and in which projects: a reload that takes one of them away ends the wait
    /// (security review finding 14).
    holder: crate::auth::Holder,
    projects: Vec<String>,
}

impl Coordination {
    pub(super) fn new(
        limits: crate::coord::Limits,
        durable: bool,
        derived_names: bool,
    ) -> Coordination {
        let mut coord = Coord::new(limits);
        if durable {
            coord.persist();
        }
        Coordination {
            coord,
            names: HashMap::new(),
            sessions: HashMap::new(),
            handles: HashMap::new(),
            handle_use: HashMap::new(),
            next_agent: 0,
            parked: HashMap::new(),
            by_http: HashMap::new(),
            progress_due: std::collections::BTreeSet::new(),
            next_wait: 0,
            durable: durable.then(durable::Durable::default),
            earlier_names: HashMap::new(),
            name_changes: Vec::new(),
            name_retries: Vec::new(),
            derived_names,
        }
    }

    /// `action` now, or (`None`) once the coordination writes in flight are done.
    pub(super) fn after_writes(&mut self, action: AfterWrites) -> Option<AfterWrites> {
        match self.durable.as_mut() {
            Some(d) => d.defer(action),
            None => Some(action),
        }
    }

    /// The planted bug `CoordAckBeforeDurable`.
    #[cfg(feature = "planted-bugs")]
    pub(super) fn ack_before_durable(&mut self) {
        if let Some(d) = self.durable.as_mut() {
            d.ack_early = true;
        }
    }

    /// The public name of the agent behind `secret` (a session id or handle), made on first use
    /// (or the one it had before a restart).
    fn name_of(&mut self, secret: &str) -> String {
        if let Some(n) = self.names.get(secret) {
            return n.clone();
        }
        if self.derived_names {
            let name = derived_name(secret);
            self.names.insert(secret.to_owned(), name.clone());
            return name;
        }
        if self.durable.is_some() {
            if let Some(n) = self.earlier_names.remove(&name_key(secret)) {
                self.names.insert(secret.to_owned(), n.clone());
                return n;
            }
        }
        self.next_agent += 1;
        let name = format!("agent-{}", self.next_agent);
        self.names.insert(secret.to_owned(), name.clone());
        if self.durable.is_some() {
            self.name_changes.push(crate::coord::RecordChange {
                key: name_key(secret),
                value: Some(name.clone().into_bytes()),
            });
        }
        name
    }

    /// Forgets the public name of `secret` (an expired handle, an ended session).
    fn forget_name(&mut self, secret: &str) -> Option<String> {
        let name = self.names.remove(secret)?;
        if self.durable.is_some() && !self.derived_names {
            self.name_changes.push(crate::coord::RecordChange {
                key: name_key(secret),
                value: None,
            });
        }
        Some(name)
    }

    pub(super) fn known_name(&self, secret: &str) -> Option<&str> {
        self.names.get(secret).map(String::as_str)
    }

    /// Whether the agent of `session` holds a live lease.
    pub(in crate::gateway) fn session_holds_leases(&self, now: Instant, session: &str) -> bool {
        self.known_name(session)
            .is_some_and(|name| self.coord.holds_leases(now, name))
    }

    /// When the next coordination timer is due (expiries, wait deadlines, progress ticks).
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let progress = self.progress_due.first().map(|(at, _)| *at);
        let writes = self
            .durable
            .as_ref()
            .and_then(durable::Durable::poll_timeout);
        [self.coord.poll_timeout(), progress, writes]
            .into_iter()
            .flatten()
            .min()
    }

    fn park(&mut self, wait: WaitToken, parked: Parked) {
        self.by_http.insert(parked.http, wait);
        if parked.progress.is_some() {
            self.progress_due.insert((parked.next_progress, wait));
        }
        self.parked.insert(wait, parked);
    }

    /// Forgets a parked wait (answered, withdrawn or ended).
    pub(super) fn unpark(&mut self, wait: WaitToken) -> Option<Parked> {
        let parked = self.parked.remove(&wait)?;
        self.by_http.remove(&parked.http);
        self.progress_due.remove(&(parked.next_progress, wait));
        Some(parked)
    }

    pub(super) fn stats(&self) -> crate::coord::CoordStats {
        self.coord.stats()
    }
}

/// A lease's or wait's duration, as the results show it.
/// The store key of an agent's public name: the SHA-256 of its session id or handle, so the
/// store holds no secret to act with.
fn name_key(secret: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(secret.as_bytes());
    format!("{NAME_PREFIX}{}", hex::encode(digest))
}

/// A cluster's name for the agent behind `secret`: `agent-` and 64 bits of a SHA-256 of it
/// (one-way: the name, which everyone in the project sees, gives nothing to act with).
fn derived_name(secret: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"mcp-gateway agent name\0");
    h.update(secret.as_bytes());
    let digest = h.finalize();
    format!("agent-{}", hex::encode(&digest[..8]))
}

/// Where agents' public names are kept in the store (coordination records are keyed by the
/// project's name in hex, which never starts so).
const NAME_PREFIX: &str = "_n.";

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn lost_json(lost: &[LostLease]) -> Value {
    lost.iter()
        .map(|l| {
            json!({
                "project": l.project, "resource": l.resource, "fence": l.fence,
                "reason": lost_reason(l.reason),
            })
        })
        .collect()
}

fn lost_reason(r: LostReason) -> &'static str {
    match r {
        LostReason::Expired => "expired",
        LostReason::ForcedRelease => "forced_release",
    }
}

fn lease_json(l: &LeaseView) -> Value {
    json!({
        "resource": l.resource, "holder": l.holder, "holder_name": l.holder_name,
        "fence": l.fence, "expires_in_ms": ms(l.expires_in),
    })
}

fn inbox_json(inbox: &Inbox) -> Value {
    let messages: Vec<Value> = inbox
        .messages
        .iter()
        .map(|m| {
            json!({
                "id": m.id, "from": m.from, "from_name": m.from_name,
                "to": match m.to { MessageTo::Agent => "you", MessageTo::Channel => "channel" },
                "body": m.body, "sent_ms_ago": ms(m.sent_ago),
            })
        })
        .collect();
    json!({ "messages": messages, "more": inbox.more, "unread": inbox.unread })
}

fn ready_json(ready: &WaitReady) -> Value {
    let reasons: Vec<Value> = ready
        .reasons
        .iter()
        .map(|r| match r {
            WaitReason::Message { id, from, to } => json!({
                "kind": "message", "id": id, "from": from,
                "to": match to { MessageTo::Agent => "you", MessageTo::Channel => "channel" },
            }),
            WaitReason::LeaseLost {
                resource,
                fence,
                reason,
            } => json!({
                "kind": "lease_lost", "resource": resource, "fence": fence,
                "reason": lost_reason(*reason),
            }),
            WaitReason::Released { resource } => {
                json!({ "kind": "released", "resource": resource })
            }
            WaitReason::SledEvent { seq, kind, story } => json!({
                "kind": "sled_event", "seq": seq, "event": kind, "story": story,
            }),
        })
        .collect();
    json!({ "woke": !ready.reasons.is_empty(), "project": ready.project, "reasons": reasons })
}

/// Reads an optional argument of a coordination tool.
fn arg<'a, T: serde::Deserialize<'a>>(
    tool: &str,
    arguments: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<T>, RpcError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v)
            .map(Some)
            .map_err(|e| RpcError::InvalidParams {
                method: tool.to_owned(),
                detail: format!("`{name}`: {e}"),
            }),
    }
}

fn required<'a, T: serde::Deserialize<'a>>(
    tool: &str,
    arguments: &'a Map<String, Value>,
    name: &str,
) -> Result<T, RpcError> {
    arg(tool, arguments, name)?.ok_or_else(|| RpcError::InvalidParams {
        method: tool.to_owned(),
        detail: format!("the `{name}` argument is required"),
    })
}

fn seconds(
    tool: &str,
    arguments: &Map<String, Value>,
    name: &str,
) -> Result<Option<Duration>, RpcError> {
    Ok(arg::<u64>(tool, arguments, name)?.map(Duration::from_secs))
}

fn coord_error(tool: &'static str, error: CoordError) -> RpcError {
    RpcError::Coordination { tool, error }
}

/// The tool's arguments as the gateway allows them.
fn allowed(tool: &str) -> &'static [&'static str] {
    match tool {
        CHECKIN => &["project", "agent", "name", "task", "ttl_s"],
        ROSTER | CLAIMS => &["project", "agent"],
        CLAIM | RENEW => &["resource", "project", "agent", "ttl_s"],
        RELEASE => &["resource", "project", "agent", "force"],
        SEND => &["body", "to", "project", "agent", "ttl_s"],
        INBOX => &["project", "agent", "peek", "limit"],
        BOARD_SET => &["key", "value", "if_revision", "project", "agent", "ttl_s"],
        BOARD_GET => &["key", "project", "agent"],
        BOARD_LIST => &["prefix", "project", "agent"],
        BOARD_DELETE => &["key", "if_revision", "project", "agent"],
        _ => &["projects", "timeout_s", "agent"],
    }
}

mod agents;
mod durable;
pub(super) use durable::AfterWrites;
mod leases;
mod wait;

impl Gateway {
    /// Answers a coordination tool now (`Ok(Some)`), or parks a `wait` (`Ok(None)`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn coordination_call(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        tool: &'static str,
        arguments: &Map<String, Value>,
        meta: Option<&Value>,
        mode: CallMode,
    ) -> Result<Served, RpcError> {
        let now = req.now;
        basics::only_arguments(tool, arguments, allowed(tool))?;
        // In a cluster, a project's coordination state lives where its sled is: the call is
        // relayed there whole (before anything is made here for it).
        // A project no replica holds has no coordination state anywhere (it would live on
        // whichever replica was asked, and a sled connecting to another would not see it):
        // the call waits a moment for a sled on the move, else it is refused.
        if tool != WAIT && self.clustered() {
            let project = self.coordination_project(req, arguments, tool)?;
            if !self.is_live(&project) || self.handing_off(req, &project) {
                return match self.away(req, &project)? {
                    Some(away) => Ok(Served::Away(away)),
                    None => Err(RpcError::SledNotConnected {
                        sled: self.sled_of(&project),
                        project,
                    }),
                };
            }
        }
        if tool == WAIT {
            let (agent, _) = self.agent_of(req, arguments, tool)?;
            let given: Option<String> = arg(tool, arguments, "agent")?;
            return self.coordination_wait(
                req,
                id,
                (&agent, given.as_deref()),
                arguments,
                meta,
                mode,
            );
        }
        let project = self.coordination_project(req, arguments, tool)?;
        let force = tool == RELEASE && arguments.get("force") == Some(&Value::Bool(true));
        let need = match tool {
            RELEASE if force => Right::Admin,
            CLAIM | RENEW | RELEASE | SEND | BOARD_SET | BOARD_DELETE => Right::Write,
            _ => Right::Read,
        };
        self.require(req.principal, &project, need, format_args!("{tool}"))?;
        // A handle is issued only once the caller may act on the project (security review
        // finding 9): a caller without rights gets nothing to fill the table with.
        let (agent, handle) = self.agent_of(req, arguments, tool)?;
        if force {
            tracing::info!(
                target: "audit",
                principal = self.principal_label(req.principal),
                project,
                tool,
                action = "force_release",
                "admin action"
            );
        }
        let c = &mut self.coordination.coord;
        let mut out = match tool {
            CHECKIN => {
                let name: Option<String> = arg(tool, arguments, "name")?;
                let task: Option<String> = arg(tool, arguments, "task")?;
                let ttl = seconds(tool, arguments, "ttl_s")?;
                let got = c
                    .checkin(now, &project, &agent, name, task, ttl)
                    .map_err(|e| coord_error(tool, e))?;
                let renewed: Vec<Value> = got.renewed.iter().map(lease_json).collect();
                let mut v = json!({
                    "agent": agent,
                    "expires_in_ms": ms(got.expires_in),
                    "renewed": renewed,
                    "inbox": inbox_json(&got.inbox),
                });
                if let Some(t) = got.ttl_clamped {
                    v["ttl_clamped_s"] = json!(t.as_secs());
                }
                if let Some(h) = handle {
                    v["handle"] = json!(h);
                }
                let mut lost = got.lost;
                lost.extend(c.take_lost(now, &agent, None));
                v["lost"] = lost_json(&lost);
                v
            }
            ROSTER => {
                let agents: Vec<Value> = c
                    .roster(now, &project)
                    .iter()
                    .map(|r| {
                        json!({
                            "agent": r.agent, "name": r.name, "task": r.task,
                            "last_seen_ms_ago": ms(r.last_seen_ago),
                            "status": match r.status { PresenceStatus::Active => "active", PresenceStatus::Stale => "stale" },
                            "holds": r.held,
                        })
                    })
                    .collect();
                json!({ "agents": agents })
            }
            CLAIM => {
                let resource: String = required(tool, arguments, "resource")?;
                let ttl = seconds(tool, arguments, "ttl_s")?;
                match c
                    .claim(now, &project, &agent, &resource, ttl)
                    .map_err(|e| coord_error(tool, e))?
                {
                    Claim::Acquired {
                        fence,
                        expires_in,
                        reentrant,
                        ttl_clamped,
                    } => {
                        let mut v = json!({
                            "acquired": true, "resource": resource, "fence": fence,
                            "expires_in_ms": ms(expires_in), "reentrant": reentrant,
                        });
                        if let Some(t) = ttl_clamped {
                            v["ttl_clamped_s"] = json!(t.as_secs());
                        }
                        v
                    }
                    Claim::Held {
                        holder,
                        holder_name,
                        expires_in,
                    } => json!({
                        "acquired": false, "resource": resource, "holder": holder,
                        "holder_name": holder_name, "expires_in_ms": ms(expires_in),
                    }),
                }
            }
            RENEW => {
                let resource: String = required(tool, arguments, "resource")?;
                let ttl = seconds(tool, arguments, "ttl_s")?;
                let r = c
                    .renew(now, &project, &agent, &resource, ttl)
                    .map_err(|e| coord_error(tool, e))?;
                let mut v = json!({
                    "renewed": true, "resource": resource, "fence": r.fence,
                    "expires_in_ms": ms(r.expires_in),
                });
                if let Some(t) = r.ttl_clamped {
                    v["ttl_clamped_s"] = json!(t.as_secs());
                }
                v
            }
            RELEASE => {
                let resource: String = required(tool, arguments, "resource")?;
                let force = arg::<bool>(tool, arguments, "force")?.unwrap_or(false);
                let r = if force {
                    let holder = c
                        .claims(now, &project)
                        .into_iter()
                        .find(|l| l.resource == resource)
                        .map(|l| l.holder);
                    let r = c
                        .force_release(now, &project, &resource)
                        .map_err(|e| coord_error(tool, e))?;
                    tracing::warn!(
                        project,
                        resource,
                        by = agent,
                        holder = holder.as_deref().unwrap_or("?"),
                        "lease released by force"
                    );
                    r
                } else {
                    c.release(now, &project, &agent, &resource)
                        .map_err(|e| coord_error(tool, e))?
                };
                json!({ "released": true, "resource": resource, "fence": r.fence, "forced": force })
            }
            CLAIMS => {
                let leases: Vec<Value> = c.claims(now, &project).iter().map(lease_json).collect();
                json!({ "leases": leases })
            }
            SEND => {
                let body: String = required(tool, arguments, "body")?;
                let to: Option<String> = arg(tool, arguments, "to")?;
                let ttl = seconds(tool, arguments, "ttl_s")?;
                let recipient = match &to {
                    Some(a) => Recipient::Agent(a.clone()),
                    None => Recipient::Channel,
                };
                let sent = c
                    .send(now, &project, &agent, recipient, body, ttl)
                    .map_err(|e| coord_error(tool, e))?;
                let mut v = json!({
                    "sent": true, "id": sent.id, "to": to.as_deref().unwrap_or("channel"),
                    "expires_in_ms": ms(sent.expires_in),
                });
                if let Some(t) = sent.ttl_clamped {
                    v["ttl_clamped_s"] = json!(t.as_secs());
                }
                v
            }
            INBOX => {
                let peek = arg::<bool>(tool, arguments, "peek")?.unwrap_or(false);
                let limit = arg::<usize>(tool, arguments, "limit")?
                    .unwrap_or(INBOX_PAGE_MAX)
                    .clamp(1, INBOX_PAGE_MAX);
                let inbox = c
                    .inbox(now, &project, &agent, peek, limit)
                    .map_err(|e| coord_error(tool, e))?;
                inbox_json(&inbox)
            }
            BOARD_SET => {
                let key: String = required(tool, arguments, "key")?;
                let Some(value) = arguments.get("value") else {
                    return Err(RpcError::InvalidParams {
                        method: tool.to_owned(),
                        detail: "the `value` argument is required".into(),
                    });
                };
                let if_revision: Option<u64> = arg(tool, arguments, "if_revision")?;
                let ttl = seconds(tool, arguments, "ttl_s")?;
                let set = c
                    .board_set(
                        now,
                        &project,
                        &agent,
                        &key,
                        value.to_string(),
                        if_revision,
                        ttl,
                    )
                    .map_err(|e| coord_error(tool, e))?;
                let mut v = json!({ "key": key, "revision": set.revision });
                if let Some(t) = set.ttl_clamped {
                    v["ttl_clamped_s"] = json!(t.as_secs());
                }
                v
            }
            BOARD_GET => {
                let key: String = required(tool, arguments, "key")?;
                match c.board_get(now, &project, &key) {
                    Some(e) => json!({
                        "key": key, "found": true,
                        "value": serde_json::from_str::<Value>(&e.value).unwrap_or(Value::Null),
                        "revision": e.revision, "set_by": e.set_by,
                        "expires_in_ms": e.expires_in.map(ms),
                    }),
                    None => json!({ "key": key, "found": false }),
                }
            }
            BOARD_LIST => {
                let prefix: Option<String> = arg(tool, arguments, "prefix")?;
                let all = c.board_list(now, &project, prefix.as_deref());
                let more = all.len() > BOARD_LIST_PAGE;
                let entries: Vec<Value> = all
                    .iter()
                    .take(BOARD_LIST_PAGE)
                    .map(|e| {
                        json!({
                            "key": e.key,
                            "value": serde_json::from_str::<Value>(&e.value).unwrap_or(Value::Null),
                            "revision": e.revision, "set_by": e.set_by,
                            "expires_in_ms": e.expires_in.map(ms),
                        })
                    })
                    .collect();
                json!({ "entries": entries, "more": more })
            }
            _ => {
                let key: String = required(tool, arguments, "key")?;
                let if_revision: Option<u64> = arg(tool, arguments, "if_revision")?;
                let revision = c
                    .board_delete(now, &project, &agent, &key, if_revision)
                    .map_err(|e| coord_error(tool, e))?;
                json!({ "key": key, "deleted": true, "revision": revision })
            }
        };
        out["project"] = json!(project);
        if tool != CHECKIN {
            out["lost"] = lost_json(&c.take_lost(now, &agent, None));
        }
        out["unread"] = json!(c.unread(now, &agent, &project));
        self.drain_woken(now);
        Ok(Served::Coordinated {
            result: basics::tool_result(out),
            tool,
            project,
        })
    }

    /// The project a coordination call acts in: its `project`, else the caller's default.
    fn coordination_project(
        &self,
        req: &Req<'_>,
        arguments: &Map<String, Value>,
        tool: &'static str,
    ) -> Result<String, RpcError> {
        let project = match arguments.get("project") {
            None | Some(Value::Null) => match self.default_of(req) {
                Some(p) => p.to_owned(),
                None => {
                    return Err(RpcError::NoProjectSelected {
                        tool: tool.into(),
                        registered: self.visible_projects(req.principal),
                    })
                }
            },
            Some(Value::String(p)) if p.is_empty() => {
                return Err(RpcError::ProjectEmpty { tool: tool.into() })
            }
            Some(Value::String(p)) => p.clone(),
            Some(_) => return Err(RpcError::ProjectNotString { tool: tool.into() }),
        };
        if self.registry.get(&project).is_none() || !self.sees(req.principal, &project) {
            return Err(RpcError::UnknownProject {
                project,
                registered: self.visible_projects(req.principal),
            });
        }
        Ok(project)
    }

    /// A sled relayed an event: agents waiting in its project hear of it.
    pub(super) fn coordination_sled_event(
        &mut self,
        now: Instant,
        project: &str,
        kind: &str,
        story: Option<&str>,
    ) {
        if kind == "sync" {
            return;
        }
        if let Err(e) = self.coordination.coord.sled_event(
            now,
            project,
            kind.to_owned(),
            story.map(str::to_owned),
        ) {
            tracing::warn!(project, "sled event not recorded: {e}");
        }
        self.drain_woken(now);
    }
}
