//! `gateway doctor`: proves a deployment works end to end by its effects, one line per check,
//! failing ones first; the exit status is 1 when any check fails. Each failing line says what
//! to change (there is no `--fix`).
//!
//! The checks:
//!
//! - **mcp**: the URL answers an MCP `initialize`; which protocol version was agreed. If it
//!   does not, nothing else can be asked and the doctor stops there.
//! - **auth**: the token as configured (flag, environment or none) is accepted, and whether the
//!   gateway requires one at all.
//! - **project P**, for every registered project: a live uplink, health `up`, and the sled's
//!   identity pinned and verified with no refused attempt (an impostor, or a real sled whose
//!   key changed).
//! - **whoami P**, for every live project: a `whoami` call with the per-call `project`
//!   reaches that project's sled (the answer names it). A sled error without a gateway
//!   `data.kind` still proves the round trip.
//! - **leases**: claim, renew, release and claim again of a resource of the doctor's own;
//!   renew keeps the fence, the second grant's fence is higher.
//! - **message**: a message to itself reaches a concurrent `wait` within 2 s.
//! - **board**: compare-and-set: set if absent, set at its revision, a set at the old revision
//!   refused (`revision_mismatch`), delete at the current one.
//! - **fences P**, for every live project: a fresh grant is above the highest fence the sled
//!   has accepted, so the sled will not refuse the holder's writes as stale. The sled's mark is
//!   its `whoami`'s `fence_high_water` when it reports one (sled-sim does), else what its
//!   hello said (`list_projects`' `fence_floor`).
//! - **agent**: the shell's identity file, if any, names an agent this gateway knows.
//!
//! The doctor works in an MCP session of its own (the coordination checks act as that
//! session's agent) and ends it, which releases anything it still held: it leaves nothing
//! behind, and uses no agent handle (the gateway keeps those until it stops).

use std::time::Duration;

use clap::{ArgMatches, Command};
use gateway_client::{ClientError, McpClient, TokioConnect};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{agent, tool_outcome, Conn, Failure};

/// How long the doctor's message may take to reach its own wait.
const MESSAGE_WITHIN: Duration = Duration::from_secs(2);
/// How long any one of the doctor's requests may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

pub(crate) fn command() -> Command {
    Command::new(super::DOCTOR)
        .about("Check the deployment end to end: one line per check, failing first; exit 1 if any fails")
        .long_about(
            "Check the deployment end to end, by effects: the URL answers MCP (and the \
             protocol version agreed); auth as configured; every registered project's uplink, \
             health and pinned identity; a whoami round trip to each live project; a claim, \
             renew and release whose fence grows; a message to itself that a concurrent wait \
             receives within 2 s; a board compare-and-set; each live sled's highest accepted \
             fence below the gateway's grants; the shell's agent identity.\n\n\
             Prints one line per check, failing ones first, each saying what to change; exits \
             1 if any fails. --json prints the checks as JSON.",
        )
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    name: String,
    ok: bool,
    detail: String,
}

fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        ok: true,
        detail: detail.into(),
    }
}

fn failed(name: impl Into<String>, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        ok: false,
        detail: detail.into(),
    }
}

/// The doctor's MCP session.
struct Session {
    client: McpClient<TokioConnect>,
    next_id: u64,
}

impl Session {
    async fn call(&mut self, conn: &Conn, tool: &str, args: Value) -> Result<Value, Failure> {
        self.next_id += 1;
        match self
            .client
            .tools_call(json!(self.next_id), tool, args)
            .await
        {
            Ok(r) => tool_outcome(&r),
            Err(e) => Err(conn.transport(e)),
        }
    }
}

pub(crate) async fn run(conn: &mut Conn, m: &ArgMatches) -> u8 {
    let mut checks = Vec::new();
    if let Some(mut session) = handshake(conn, &mut checks).await {
        fleet_checks(conn, &mut session, &mut checks).await;
        let _ = session.client.delete_session().await;
    }
    report(&checks, m.get_flag("json"))
}

/// Prints the checks (failing first); the exit status.
fn report(checks: &[Check], json: bool) -> u8 {
    let failing = checks.iter().filter(|c| !c.ok).count();
    let ordered = checks
        .iter()
        .filter(|c| !c.ok)
        .chain(checks.iter().filter(|c| c.ok));
    if json {
        let list: Vec<Value> = ordered
            .map(|c| json!({ "check": c.name, "ok": c.ok, "detail": c.detail }))
            .collect();
        println!("{}", json!({ "ok": failing == 0, "checks": list }));
    } else {
        for c in ordered {
            let status = if c.ok { "ok  " } else { "FAIL" };
            println!("{status} {}: {}", c.name, c.detail.replace('\n', " "));
        }
    }
    u8::from(failing > 0)
}

/// `mcp` and `auth`: initialize; the session, or `None` when nothing more can be asked.
async fn handshake(conn: &Conn, checks: &mut Vec<Check>) -> Option<Session> {
    let s = &conn.settings;
    let mut client = match conn.connect().await {
        Ok(c) => c,
        Err(f) => {
            checks.push(failed("mcp", f.line()));
            return None;
        }
    };
    client.set_timeout(Some(REQUEST_TIMEOUT));
    match client.initialize().await {
        Ok(r) => {
            let version = r["result"]["protocolVersion"].as_str().unwrap_or("?");
            let server = &r["result"]["serverInfo"];
            checks.push(ok(
                "mcp",
                format!(
                    "{} ({}) answers MCP: protocol {version} agreed with {} {}",
                    s.url,
                    s.url_from,
                    server["name"].as_str().unwrap_or("the server"),
                    server["version"].as_str().unwrap_or("")
                )
                .trim_end()
                .to_owned(),
            ));
        }
        Err(e @ ClientError::Http { status: 401, .. }) => {
            checks.push(failed("auth", conn.transport(e).line()));
            return None;
        }
        Err(e) => {
            checks.push(failed("mcp", conn.transport(e).line()));
            return None;
        }
    }
    checks.push(auth_check(conn).await);
    Some(Session { client, next_id: 0 })
}

/// The token as configured is accepted (the handshake was); whether one is required.
async fn auth_check(conn: &Conn) -> Check {
    let s = &conn.settings;
    // A sessionless ping without a token says whether the gateway requires one.
    let required = async {
        let mut c = McpClient::connect_with(TokioConnect, &s.url, s.trust.clone())
            .await
            .ok()?;
        c.set_timeout(Some(REQUEST_TIMEOUT));
        match c.request(json!(1), "ping", json!({})).await {
            Err(ClientError::Http { status: 401, .. }) => Some(true),
            Ok(_) => Some(false),
            Err(_) => None,
        }
    }
    .await;
    match (&s.token, required) {
        (Some((_, from)), Some(true)) => ok(
            "auth",
            format!("the token from {from} is accepted, and the gateway refuses requests without one"),
        ),
        (Some((_, from)), _) => ok(
            "auth",
            format!(
                "the token from {from} is accepted; the gateway does not require one (no \
                 client_tokens in its projects.toml), so anyone who reaches {} can call it",
                s.url
            ),
        ),
        (None, _) => ok(
            "auth",
            "no token configured, and the gateway requires none (no client_tokens in its projects.toml)",
        ),
    }
}

/// The checks that need the fleet's answers.
async fn fleet_checks(conn: &Conn, session: &mut Session, checks: &mut Vec<Check>) {
    let (projects, health, identity) = match (
        session.call(conn, "list_projects", json!({})).await,
        session.call(conn, "gateway_health", json!({})).await,
        session.call(conn, "fleet_identity", json!({})).await,
    ) {
        (Ok(p), Ok(h), Ok(i)) => (p, h, i),
        (p, h, i) => {
            for (tool, r) in [
                ("list_projects", p),
                ("gateway_health", h),
                ("fleet_identity", i),
            ] {
                if let Err(f) = r {
                    checks.push(failed("fleet", format!("{tool} failed: {}", f.line())));
                }
            }
            return;
        }
    };
    let empty = Vec::new();
    let list = projects["projects"].as_array().unwrap_or(&empty);
    if list.is_empty() {
        checks.push(failed(
            "projects",
            "no project is registered: add [[project]] tables to the gateway's projects.toml",
        ));
        return;
    }
    let find = |v: &Value, name: &str| -> Value {
        v["projects"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["project"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let mut live = Vec::new();
    for p in list {
        let name = p["name"].as_str().unwrap_or_default().to_owned();
        let is_live = p["live"] == true;
        checks.push(project_check(
            &name,
            is_live,
            &find(&health, &name),
            &find(&identity, &name),
        ));
        if let Some(check) = read_right_check(&name, &p["read_only_tools"]) {
            checks.push(check);
        }
        if is_live {
            live.push((name, p["sled"].clone(), p["fence_floor"].as_u64()));
        }
    }
    // The sled's high-water mark of accepted fences: what its whoami says now, when it
    // says, else what its hello said.
    let mut marks = Vec::new();
    for (name, sled, floor) in &live {
        let (check, observed) = whoami_check(conn, session, name, sled).await;
        checks.push(check);
        marks.push(match observed {
            Some(now) => (name.clone(), now, "whoami's fence_high_water"),
            None => (name.clone(), *floor, "its hello"),
        });
    }

    // Coordination, in the first live project (else the first registered: it needs no sled).
    let home = live
        .first()
        .map(|(n, _, _)| n.clone())
        .or_else(|| list[0]["name"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let me = match session
        .call(
            conn,
            "checkin",
            json!({ "project": home, "name": "gateway-doctor" }),
        )
        .await
    {
        Ok(r) => r["agent"].as_str().unwrap_or_default().to_owned(),
        Err(f) => {
            checks.push(failed(
                "coordination",
                format!("checkin in {home}: {}", f.line()),
            ));
            return;
        }
    };
    let tag = unique_tag();
    let (lease_check, home_fence) = lease_check(conn, session, &home, &tag).await;
    checks.push(lease_check);
    checks.push(message_check(conn, session, &home, &me, &tag).await);
    checks.push(board_check(conn, session, &home, &tag).await);
    for (name, mark, source) in &marks {
        let fence = if *name == home {
            home_fence
        } else {
            grant_once(conn, session, name, &tag).await
        };
        checks.push(fence_check(name, *mark, source, fence));
    }
    checks.push(agent_check(conn, &home).await);
}

/// `project P`: live uplink, health, identity.
fn project_check(name: &str, live: bool, health: &Value, identity: &Value) -> Check {
    let check = format!("project {name}");
    let mut problems = Vec::new();
    let status = health["status"].as_str().unwrap_or("unknown");
    let reasons: Vec<&str> = health["reasons"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !live {
        problems.push(format!(
            "no live uplink (health {status}{}): start its sled and check that it dials this \
             gateway's /uplink with the project's token",
            if reasons.is_empty() {
                String::new()
            } else {
                format!(": {}", reasons.join("; "))
            }
        ));
    } else if status != "up" {
        problems.push(format!("health {status}: {}", reasons.join("; ")));
    }
    let id_status = identity["status"].as_str().unwrap_or("unknown");
    if let Some(r) = identity["refused"].as_object() {
        problems.push(format!(
            "identity refused: a sled presenting key {} was refused {} time(s), last {} s ago \
             ({}); if that sled is the real one, `gateway fleet-identity --action repin \
             --project {name} --key {}`, else stop it",
            r.get("key").and_then(Value::as_str).unwrap_or("(none)"),
            r.get("attempts").and_then(Value::as_u64).unwrap_or(0),
            r.get("last_ms_ago").and_then(Value::as_u64).unwrap_or(0) / 1000,
            r.get("reason")
                .and_then(Value::as_str)
                .unwrap_or("no reason given"),
            r.get("key").and_then(Value::as_str).unwrap_or("KEY"),
        ));
    } else if live && id_status == "unsigned" {
        problems.push(
            "identity not pinned: the sled presents no identity key; give it one, and run the \
             gateway with --require-identity"
                .to_owned(),
        );
    } else if live && id_status != "verified" {
        problems.push(format!("identity {id_status}"));
    }
    if problems.is_empty() {
        ok(
            check,
            format!(
                "live uplink, health up, identity pinned and verified ({})",
                identity["pinned"].as_str().unwrap_or("?")
            ),
        )
    } else {
        failed(check, problems.join("; "))
    }
}

/// `read right on P`, when projects.toml gives the `read` right none of P's tools (it names
/// neither `read_only_tools` nor `trust_read_only_hints`): not a failure, since a project may
/// want it so, but said, since a reader then can call none of its tools.
fn read_right_check(project: &str, covers: &Value) -> Option<Check> {
    covers.as_array().filter(|tools| tools.is_empty())?;
    Some(ok(
        format!("read right on {project}"),
        format!(
            "covers none of its tools: callers with the read right may see {project}, read its \
             resources and prompts, and call no tool; to change that, list the tools in \
             projects.toml (read_only_tools = [\"...\"]) or, for a sled you trust, take its \
             annotations (trust_read_only_hints = true)"
        ),
    ))
}

/// `whoami P`: the per-call project reaches P's sled. Also the sled's `fence_high_water`,
/// when its answer has one (`Some(None)`: it has accepted none).
async fn whoami_check(
    conn: &Conn,
    session: &mut Session,
    name: &str,
    sled: &Value,
) -> (Check, Option<Option<u64>>) {
    let check = format!("whoami {name}");
    match session
        .call(conn, "whoami", json!({ "project": name }))
        .await
    {
        Ok(r) => {
            if r.get("project").is_some_and(|p| p != name) {
                let detail = format!(
                    "the call named project {name} but was answered for {}: the gateway routed \
                     it elsewhere",
                    r["project"]
                );
                return (failed(check, detail), None);
            }
            if r.get("sled").is_some_and(|s| s != sled) {
                let detail = format!(
                    "answered by sled {} but {name} is registered with sled {sled}: is another \
                     project's sled connected as {name}?",
                    r["sled"]
                );
                return (failed(check, detail), None);
            }
            let mark = r.get("fence_high_water").map(Value::as_u64);
            let sled = r["sled"].as_str().unwrap_or("?");
            (ok(check, format!("answered by sled {sled}")), mark)
        }
        // No gateway kind: the sled's own error, so the round trip reached it.
        Err(f @ Failure::Tool { kind: None, .. }) => {
            let detail = format!(
                "the sled answered (with an error: {}; it has no whoami tool)",
                f.line()
            );
            (ok(check, detail), None)
        }
        Err(f) => (failed(check, f.line()), None),
    }
}

/// A tag no other run uses, for the doctor's lease, message and board key.
fn unique_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{}", nanos, std::process::id())
}

/// `leases`: claim, renew, release, claim again (fence higher), release. Also the first
/// grant's fence, for the fence check.
async fn lease_check(
    conn: &Conn,
    session: &mut Session,
    project: &str,
    tag: &str,
) -> (Check, Option<u64>) {
    let check = format!("leases {project}");
    let resource = format!("doctor:{tag}");
    let args = json!({ "project": project, "resource": resource, "ttl_s": 30 });
    let steps = async {
        let first = session
            .call(conn, "claim", args.clone())
            .await
            .map_err(|f| format!("claim: {}", f.line()))?;
        if first["acquired"] != true {
            return Err(format!(
                "claim of {resource}, which nobody holds, was not granted: {first}"
            ));
        }
        let f1 = first["fence"]
            .as_u64()
            .ok_or("the claim carries no fence")?;
        let renewed = session
            .call(conn, "renew", args.clone())
            .await
            .map_err(|f| format!("renew: {}", f.line()))?;
        if renewed["fence"].as_u64() != Some(f1) {
            return Err(format!(
                "renew changed the fence from {f1} to {}",
                renewed["fence"]
            ));
        }
        let release = json!({ "project": project, "resource": resource });
        session
            .call(conn, "release", release.clone())
            .await
            .map_err(|f| format!("release: {}", f.line()))?;
        let second = session
            .call(conn, "claim", args.clone())
            .await
            .map_err(|f| format!("second claim: {}", f.line()))?;
        let f2 = second["fence"]
            .as_u64()
            .ok_or("the second claim carries no fence")?;
        session
            .call(conn, "release", release)
            .await
            .map_err(|f| format!("second release: {}", f.line()))?;
        if f2 <= f1 {
            return Err(format!(
                "the fence did not grow: {f1}, then {f2}; a stale holder's writes would pass"
            ));
        }
        Ok((f1, f2))
    };
    match steps.await {
        Ok((f1, f2)) => (
            ok(
                check,
                format!("claim, renew and release of {resource}; fence {f1}, then {f2}"),
            ),
            Some(f1),
        ),
        Err(e) => (failed(check, e), None),
    }
}

/// A claim and release in `project`: the fence granted.
async fn grant_once(conn: &Conn, session: &mut Session, project: &str, tag: &str) -> Option<u64> {
    let resource = format!("doctor:{tag}");
    let r = session
        .call(
            conn,
            "claim",
            json!({ "project": project, "resource": resource, "ttl_s": 30 }),
        )
        .await
        .ok()?;
    let _ = session
        .call(
            conn,
            "release",
            json!({ "project": project, "resource": resource }),
        )
        .await;
    r["fence"].as_u64()
}

/// `fences P`: a fresh grant is above the sled's high-water mark (`mark`, from `source`).
fn fence_check(project: &str, mark: Option<u64>, source: &str, fence: Option<u64>) -> Check {
    let check = format!("fences {project}");
    match (mark, fence) {
        (_, None) => failed(check, "no fence could be granted (see the leases check)"),
        (None, Some(f)) => ok(
            check,
            format!("the sled has accepted no fence (from {source}); the gateway granted {f}"),
        ),
        (Some(floor), Some(f)) if floor < f => ok(
            check,
            format!(
                "the sled's highest accepted fence ({floor}, from {source}) is below the \
                 gateway's grant ({f})"
            ),
        ),
        (Some(floor), Some(f)) => failed(
            check,
            format!(
                "the gateway granted fence {f} but the sled has accepted up to {floor}: its \
                 holders' writes will be refused as stale_fence; reconnect the sled so its \
                 hello raises the gateway's counter, and check that no second gateway serves \
                 {project}"
            ),
        ),
    }
}

/// `message`: a message to itself reaches a concurrent wait within [`MESSAGE_WITHIN`].
async fn message_check(
    conn: &Conn,
    session: &mut Session,
    project: &str,
    me: &str,
    tag: &str,
) -> Check {
    let check = format!("message {project}");
    // The wait runs on a connection of its own, in the same session (the same agent).
    let mut waiter = match conn.connect().await {
        Ok(c) => c,
        Err(f) => return failed(check, f.line()),
    };
    waiter.set_session_id(session.client.session_id().map(str::to_owned));
    waiter.set_protocol_version(session.client.protocol_version().map(str::to_owned));
    waiter.set_timeout(Some(REQUEST_TIMEOUT));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let project_owned = project.to_owned();
    let task = tokio::spawn(async move {
        for i in 0..10u64 {
            let r = waiter
                .tools_call(
                    json!(i),
                    "wait",
                    json!({ "projects": [project_owned], "timeout_s": 5 }),
                )
                .await;
            let stop = r.is_err();
            if tx.send((Instant::now(), r)).is_err() || stop {
                return;
            }
        }
    });
    // Let the wait park first (if it does not, it answers at once when the message comes:
    // the wait is level-triggered, so either way it must see it).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let body = format!("gateway doctor {tag}");
    let sent_at = Instant::now();
    let sent = session
        .call(
            conn,
            "send",
            json!({ "project": project, "to": me, "body": body, "ttl_s": 60 }),
        )
        .await;
    let id = match sent {
        Ok(r) => r["id"].clone(),
        Err(f) => {
            task.abort();
            return failed(check, format!("send to itself: {}", f.line()));
        }
    };
    let deadline = sent_at + MESSAGE_WITHIN;
    let outcome = loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Err(_) | Ok(None) => {
                break Err(format!(
                    "a message to itself did not wake its own wait within {} s: waits are not \
                     woken (is something between the client and the gateway buffering \
                     answers?)",
                    MESSAGE_WITHIN.as_secs()
                ))
            }
            Ok(Some((_, Err(e)))) => break Err(format!("wait: {}", conn.transport(e).line())),
            Ok(Some((at, Ok(r)))) => match tool_outcome(&r) {
                Err(f) => break Err(format!("wait: {}", f.line())),
                Ok(w) => {
                    let mine = w["reasons"].as_array().is_some_and(|rs| {
                        rs.iter().any(|r| r["kind"] == "message" && r["id"] == id)
                    });
                    if mine {
                        break Ok(at.saturating_duration_since(sent_at));
                    }
                    // Woken by something else (a sled event): the task waits again.
                }
            },
        }
    };
    task.abort();
    // Read it, so the doctor's inbox is left empty.
    let _ = session
        .call(conn, "inbox", json!({ "project": project }))
        .await;
    match outcome {
        Ok(took) => ok(
            check,
            format!(
                "a message to itself reached a concurrent wait in {} ms",
                took.as_millis()
            ),
        ),
        Err(e) => failed(check, e),
    }
}

/// `board`: compare-and-set.
async fn board_check(conn: &Conn, session: &mut Session, project: &str, tag: &str) -> Check {
    let check = format!("board {project}");
    let key = format!("doctor/{tag}");
    let steps = async {
        let set = |rev: u64, value: Value| json!({ "project": project, "key": key, "value": value, "if_revision": rev, "ttl_s": 60 });
        let r1 = session
            .call(conn, "board_set", set(0, json!({"n": 1})))
            .await
            .map_err(|f| format!("set if absent: {}", f.line()))?["revision"]
            .as_u64()
            .ok_or("no revision")?;
        let r2 = session
            .call(conn, "board_set", set(r1, json!({"n": 2})))
            .await
            .map_err(|f| format!("set at revision {r1}: {}", f.line()))?["revision"]
            .as_u64()
            .ok_or("no revision")?;
        match session
            .call(conn, "board_set", set(r1, json!({"n": 3})))
            .await
        {
            Err(f) if f.kind() == Some("revision_mismatch") => {}
            Err(f) => {
                return Err(format!(
                    "a set at the old revision {r1} failed otherwise: {}",
                    f.line()
                ))
            }
            Ok(r) => {
                return Err(format!(
                "a set at the old revision {r1} was accepted ({r}): compare-and-set does not hold"
            ))
            }
        }
        let got = session
            .call(conn, "board_get", json!({ "project": project, "key": key }))
            .await
            .map_err(|f| format!("get: {}", f.line()))?;
        if got["value"] != json!({"n": 2}) || got["revision"].as_u64() != Some(r2) {
            return Err(format!(
                "read back {got}, expected value {{\"n\":2}} at revision {r2}"
            ));
        }
        session
            .call(
                conn,
                "board_delete",
                json!({ "project": project, "key": key, "if_revision": r2 }),
            )
            .await
            .map_err(|f| format!("delete at revision {r2}: {}", f.line()))?;
        Ok((r1, r2))
    };
    match steps.await {
        Ok((r1, r2)) => ok(
            check,
            format!("set if absent (revision {r1}), set at {r1} ({r2}), a set at {r1} again refused, deleted at {r2}"),
        ),
        Err(e) => failed(check, e),
    }
}

/// `agent`: the shell's identity file.
async fn agent_check(conn: &Conn, project: &str) -> Check {
    let s = &conn.settings;
    let file = s.agent_file.display();
    let Some(id) = agent::load(&s.agent_file) else {
        return ok(
            "agent",
            format!(
                "no identity yet in {file} ({}); the first coordination command checks in",
                s.agent_file_from
            ),
        );
    };
    let mut probe = Conn::new(s.clone());
    let args = json!({ "project": project, "agent": id.handle });
    let args = args.as_object().expect("an object").clone();
    match probe
        .call("roster", &args, None, Some(REQUEST_TIMEOUT))
        .await
    {
        Ok(_) => ok(
            "agent",
            format!("{file} holds {}, known to the gateway", id.agent),
        ),
        Err(f) if f.kind() == Some("unknown_agent") => ok(
            "agent",
            format!(
                "{file} holds {}, whom this gateway does not know (it restarted?); the next \
                 coordination command checks in anew",
                id.agent
            ),
        ),
        Err(f) => failed("agent", format!("checking {file}: {}", f.line())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_checks_name_what_is_wrong() {
        let up = json!({"status": "up", "reasons": []});
        let verified = json!({"status": "verified", "pinned": "K", "refused": null});
        assert!(project_check("alpha", true, &up, &verified).ok);

        let down = json!({"status": "down", "reasons": ["no uplink, and probing its url failed"]});
        let offline = json!({"status": "offline", "refused": null});
        let c = project_check("beta", false, &down, &offline);
        assert!(!c.ok);
        assert!(
            c.detail
                .starts_with("no live uplink (health down: no uplink"),
            "{}",
            c.detail
        );

        let refused = json!({"status": "verified", "pinned": "K", "refused": {"key": "X", "attempts": 3, "last_ms_ago": 2000, "reason": "pinned to K"}});
        let c = project_check("gamma", true, &up, &refused);
        assert!(!c.ok);
        assert!(
            c.detail.contains("identity refused") && c.detail.contains("--key X"),
            "{}",
            c.detail
        );

        let unsigned = json!({"status": "unsigned", "refused": null});
        assert!(!project_check("delta", true, &up, &unsigned).ok);
    }

    #[test]
    fn a_read_right_covering_no_tool_is_said() {
        let none = read_right_check("alpha", &json!([])).expect("said");
        assert!(none.ok && none.detail.contains("covers none"), "{none:?}");
        assert_eq!(read_right_check("alpha", &json!(["status"])), None);
        assert_eq!(read_right_check("alpha", &json!("annotated")), None);
    }

    #[test]
    fn fences_must_be_above_the_sleds_floor() {
        assert!(fence_check("a", None, "x", Some(1)).ok);
        assert!(fence_check("a", Some(4), "x", Some(5)).ok);
        assert!(!fence_check("a", Some(5), "x", Some(5)).ok);
        assert!(!fence_check("a", Some(1), "x", None).ok);
    }

    #[test]
    fn failing_checks_come_first_and_set_the_status() {
        assert_eq!(report(&[ok("a", "x")], false), 0);
        assert_eq!(report(&[ok("a", "x"), failed("b", "y")], true), 1);
    }
}
