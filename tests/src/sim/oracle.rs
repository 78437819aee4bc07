//! The oracle: what must hold of every run, whatever its faults.
//!
//! - Per response (`sled_sim::script::check_session`): it answers the request it was sent for
//!   (id and echoed nonce), it was served by a project the session's own history allows, errors
//!   have the documented shapes, stories read back as created, and the liveness probe after the
//!   final heal succeeds.
//! - No request goes unanswered: a request with no JSON-RPC answer (client deadline, lost
//!   connection) is only excused while its client host's link to the gateway is faulted (up to
//!   one client deadline after the fault ends, for a connection that stalled on a lost segment).
//! - A story created by a success response exists in exactly that project, once; one whose
//!   outcome is unknown exists at most once, in a project the call may have gone to; one the
//!   gateway never forwarded (`sled_not_connected`) does not exist; and no story exists that no
//!   request asked for.
//! - Progress and cancellation, both eras. Per response (`check_session`): every notification
//!   on a call's answer is progress of that very call (it asked for progress, the token is the
//!   one its client chose, the message names its nonce, the values increase); a `run_checks`
//!   the sled completed carried every step's progress; -32800 `cancelled` answers only a call
//!   its own session cancelled. Across the run, from what the sleds recorded
//!   (`sled_sim::sim_sled::SledLog`): every request reached the sleds at most once; a request
//!   carries a progress token at the sled exactly when its client asked for progress, and no
//!   two requests carry the same one (the gateway's own tokens, so equal client tokens of
//!   different sessions cannot meet at a sled); every `notifications/cancelled` a sled receives
//!   names a request that sled received on that connection, and a client request it names was
//!   cancelled by its own client (`notifications/cancelled`, or by closing the stream), or its
//!   client went away (no answer), or the gateway's deadline answered it (-32001). So a call
//!   its client did not cancel is never cancelled at the sled.
//! - Rights (issue 17). Each session uses one client token (or none), and the run's
//!   `[[access]]` rules ([`super::scenario::Access`]) say what its caller may do per project.
//!   Per response (`check_session_with`): no answer names a project the caller may not see
//!   unless the request named it; a project it may not see is answered `unknown_project`
//!   listing exactly the projects it sees, a missing default `no_project_selected`; a write
//!   where it may only read is refused `forbidden` (right `write`), and nothing it may do is
//!   refused; `list_projects` lists exactly what it sees; coordination answers (`roster`,
//!   `claims`) show nothing of another project. A read-only tool refused as a write (the
//!   gateway does not know the tool's annotation until the sled's tool list arrives) is excused
//!   only while that sled's tool list was being fetched (the sled received the gateway's
//!   `tools/list` within [`LISTING_SLACK`] of the call) or its link was faulted. From the
//!   sleds' logs: no request reaches a project's sled from a session whose caller lacks the
//!   right it needs there (`read` for tools the sled annotates `readOnlyHint`, resources and
//!   prompts; `write` for any other tool), and the caller a sled is told of
//!   (`_meta["io.mcp-gateway/principal"]`) is exactly the session's token's name where the
//!   project asks (`forward_principal`), and absent elsewhere, whatever the client put there.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use sled_sim::script::{self, Exchange, Outcome, SessionHistory};
use sled_sim::sim_sled::Received;

use super::scenario::{FaultKind, Level, Scenario, CLIENT_TIMEOUT};

/// How far from a call refused as a write (a read-only tool, by a caller that may read) the
/// gateway's `tools/list` must have reached the sled for the refusal to be excused: the
/// listing was still on its way. Before the call: a listing answered up to a heartbeat
/// timeout and a deadline late (past both the uplink is dropped and the call finds no sled);
/// after it: the longest one-way latency (a spike).
pub const LISTING_SLACK: (Duration, Duration) =
    (Duration::from_secs(4), Duration::from_millis(1_500));

/// Every violation of the run, as text.
pub fn judge(
    s: &Scenario,
    histories: &[SessionHistory],
    stories: &BTreeMap<String, Vec<(String, String)>>,
    received: &BTreeMap<String, Vec<Received>>,
) -> Vec<String> {
    let mut out = judge_sleds(histories, received);
    out.extend(judge_rights(s, histories, received));
    let mut claims = Vec::new();
    for h in histories {
        let rights = s.access.rights(h.index, &s.projects);
        let report = script::check_session_with(h, &s.projects, &rights);
        out.extend(report.violations.iter().map(ToString::to_string));
        for &n in &report.refused_reads {
            let x = &h.exchanges[n];
            let project = match &x.outcome {
                Outcome::Response(v) => v["error"]["data"]["project"].as_str().unwrap_or(""),
                _ => "",
            };
            if !listing_near(s, received, project, x) {
                out.push(format!(
                    "session {} exchange {n}: a read-only tool was refused as a write on {project}, where its caller may read, and the sled's tools were not being listed then: {:?} sent {:?}, ended {:?}: {:?}",
                    h.index, x.op, x.sent, x.received, x.outcome
                ));
            }
        }
        let client = h.index % s.client_hosts;
        for n in report.failed {
            let x = &h.exchanges[n];
            if !client_faulted(s, client, x.sent, x.received) {
                out.push(format!(
                    "session {} exchange {n}: no answer, and its link to the gateway was never faulted: {:?} sent {:?}, ended {:?}: {:?}",
                    h.index, x.op, x.sent, x.received, x.outcome
                ));
            }
        }
        for (at, why) in &h.init_failures {
            if !client_faulted(s, client, at.saturating_sub(CLIENT_TIMEOUT), *at) {
                out.push(format!(
                    "session {}: initialize failed at {at:?} without a fault: {why}",
                    h.index
                ));
            }
        }
        claims.extend(report.stories);
    }
    let mut claimed = std::collections::BTreeSet::new();
    for c in &claims {
        claimed.insert(c.name.clone());
        let found: &[(String, String)] = stories.get(&c.name).map_or(&[], Vec::as_slice);
        let at = format!("session {} exchange {}", c.session, c.exchange);
        match &c.created {
            Some((project, id)) => {
                if found != [(project.clone(), id.clone())] {
                    out.push(format!(
                        "{at}: created {id} in {project}, but the sleds hold {found:?}"
                    ));
                }
            }
            None if c.never_sent => {
                if !found.is_empty() {
                    out.push(format!(
                        "{at}: the gateway said the call never reached a sled, but the sleds hold {found:?}"
                    ));
                }
            }
            None => {
                if found.len() > 1 || found.iter().any(|(p, _)| !c.candidates.contains(p)) {
                    out.push(format!(
                        "{at}: a create with an unknown outcome may exist once in {:?}; the sleds hold {found:?}",
                        c.candidates
                    ));
                }
            }
        }
    }
    for (name, found) in stories {
        if !claimed.contains(name) {
            out.push(format!(
                "story {name:?} exists ({found:?}) but no request created it"
            ));
        }
    }
    out
}

/// What the sleds received, against what the sessions sent and saw: requests at most once,
/// progress tokens exactly where asked and never shared, cancellations only of requests their
/// own clients cancelled or gave up on.
fn judge_sleds(
    histories: &[SessionHistory],
    received: &BTreeMap<String, Vec<Received>>,
) -> Vec<String> {
    let mut out = Vec::new();
    // Nonces are unique in the run: each names one exchange of one session.
    let mut by_nonce: BTreeMap<&str, (usize, usize, &Exchange)> = BTreeMap::new();
    for h in histories {
        for (n, x) in h.exchanges.iter().enumerate() {
            by_nonce.insert(x.nonce.as_str(), (h.index, n, x));
        }
    }
    let mut reached: BTreeMap<&str, usize> = BTreeMap::new();
    let mut tokens: BTreeMap<String, &str> = BTreeMap::new();
    for (project, log) in received {
        for r in log {
            match r {
                Received::Request {
                    sled,
                    nonce: Some(nonce),
                    progress_token,
                    ..
                } => {
                    let Some(&(session, n, x)) = by_nonce.get(nonce.as_str()) else {
                        out.push(format!(
                            "{sled} received a request no session sent (nonce {nonce}): {r:?}"
                        ));
                        continue;
                    };
                    let at = format!("session {session} exchange {n}");
                    let times = reached.entry(nonce).or_default();
                    *times += 1;
                    if *times == 2 {
                        out.push(format!(
                            "{at}: its request reached the sleds more than once ({project})"
                        ));
                    }
                    if progress_token.is_some() != x.progress_token.is_some() {
                        out.push(format!(
                            "{at}: the client's progress token {:?} reached {sled} as {progress_token:?}",
                            x.progress_token
                        ));
                    }
                    if let Some(token) = progress_token {
                        if let Some(other) = tokens.insert(token.to_string(), nonce) {
                            out.push(format!(
                                "{at}: {sled} was given progress token {token}, which request {other} had too"
                            ));
                        }
                    }
                }
                Received::Request { .. } => {}
                Received::Cancelled {
                    sled,
                    connection,
                    request_id,
                    request,
                    reason,
                } => {
                    let named = request.and_then(|i| log.get(i));
                    let Some(Received::Request { nonce, method, .. }) = named else {
                        out.push(format!(
                            "{sled} was told to cancel request {request_id} on connection {connection}, which it never received there ({reason:?})"
                        ));
                        continue;
                    };
                    // The gateway's own requests (tools/list) are its own to cancel.
                    let Some(nonce) = nonce else { continue };
                    let Some(&(session, n, x)) = by_nonce.get(nonce.as_str()) else {
                        continue;
                    };
                    if !cancel_excused(x) {
                        out.push(format!(
                            "session {session} exchange {n}: its {method} was cancelled at {sled} ({reason:?}), but its client neither cancelled it nor gave up on it, and no deadline answered it: {:?} -> {:?}",
                            x.op, x.outcome
                        ));
                    }
                }
            }
        }
    }
    out
}

/// From the sleds' logs: every request that reached a project's sled came from a session whose
/// caller has the right it needs there, and the sled was told of exactly that caller where
/// the project asks (`forward_principal`), and of nobody elsewhere.
fn judge_rights(
    s: &Scenario,
    histories: &[SessionHistory],
    received: &BTreeMap<String, Vec<Received>>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_nonce: BTreeMap<&str, (usize, usize, &Exchange)> = BTreeMap::new();
    for h in histories {
        for (n, x) in h.exchanges.iter().enumerate() {
            by_nonce.insert(x.nonce.as_str(), (h.index, n, x));
        }
    }
    for (project, log) in received {
        for r in log {
            let Received::Request {
                sled,
                method,
                tool,
                nonce: Some(nonce),
                principal,
                at,
                ..
            } = r
            else {
                continue;
            };
            let Some(&(session, n, x)) = by_nonce.get(nonce.as_str()) else {
                continue;
            };
            // The clocks the listing excuse compares: a request whose result came back reached
            // its sled between its sending and its answer.
            if matches!(&x.outcome, Outcome::Response(v) if v.get("result").is_some())
                && (*at < x.sent || *at > x.received)
            {
                out.push(format!(
                    "session {session} exchange {n}: reached {sled} at {at:?}, outside its sending at {:?} and its answer at {:?}",
                    x.sent, x.received
                ));
            }
            let who = s
                .access
                .principal(session)
                .map_or("anonymous", |p| p.name.as_str());
            let need = match (method.as_str(), tool) {
                ("tools/call", Some(t)) if sled_sim::sim_sled::read_only(t) == Some(true) => {
                    Level::Read
                }
                ("tools/call", _) => Level::Write,
                _ => Level::Read,
            };
            let has = s.access.level(session, project);
            if has < Some(need) {
                out.push(format!(
                    "session {session} exchange {n}: its {method} {} reached {sled} of project {project}, which needs {}; its caller ({who}) has {:?} there",
                    tool.as_deref().unwrap_or(""),
                    need.name(),
                    has.map(Level::name)
                ));
            }
            let told = if s.access.forward_principal.contains(project) {
                s.access
                    .principal(session)
                    .map(|p| json!({ "token": p.name }))
            } else {
                None
            };
            if principal != &told {
                out.push(format!(
                    "session {session} exchange {n}: {sled} of project {project} was told the caller is {principal:?}; it is {who}, and the project {} to know",
                    if told.is_some() { "asks" } else { "does not ask" }
                ));
            }
        }
    }
    out
}

/// Whether `project`'s sled was being (re)listed around exchange `x`: it received a
/// `tools/list` of the gateway's within [`LISTING_SLACK`] of the exchange, or its link was
/// faulted then (a listing lost on the way).
fn listing_near(
    s: &Scenario,
    received: &BTreeMap<String, Vec<Received>>,
    project: &str,
    x: &Exchange,
) -> bool {
    let (before, after) = LISTING_SLACK;
    let from = x.sent.saturating_sub(before);
    let to = x.received + after;
    let listed = received.get(project).into_iter().flatten().any(|r| {
        matches!(r, Received::Request { method, nonce: None, at, .. }
            if method == "tools/list" && *at >= from && *at <= to)
    });
    let sled = s.projects.iter().position(|p| p == project);
    let faulted = s.faults.iter().any(|f| {
        let on_sled = match f.kind {
            FaultKind::PartitionSled { sled: i, .. }
            | FaultKind::CrashRestart { sled: i }
            | FaultKind::Twin { sled: i }
            | FaultKind::Slow { sled: i } => Some(i) == sled,
            FaultKind::LatencySpike { .. } => true,
            FaultKind::PartitionClient { .. } => false,
        };
        on_sled && f.at <= to && f.until + before >= x.sent
    });
    listed || faulted
}

/// Whether a sled may be told to cancel this exchange's request: its client cancelled it
/// (either era's way), went away (no answer: a client deadline or a lost connection, after
/// which the gateway cancels), or the gateway's deadline answered it (-32001, which cancels).
fn cancel_excused(x: &Exchange) -> bool {
    x.cancel.is_some()
        || matches!(x.outcome, Outcome::Failed(_))
        || matches!(&x.outcome, Outcome::Response(v) if v["error"]["code"] == -32001)
}

/// Whether client host `client`'s link to the gateway was faulted at some point of
/// `[from, to]`, counting a client deadline after each fault ends.
fn client_faulted(s: &Scenario, client: usize, from: Duration, to: Duration) -> bool {
    s.faults.iter().any(|f| match f.kind {
        FaultKind::PartitionClient { client: c, .. } if c == client => {
            from <= f.until + CLIENT_TIMEOUT && to >= f.at
        }
        _ => false,
    })
}
