//! A coordination load (issue 25: acknowledged means durable): writers each holding a lease
//! write the board and send messages as fast as they are answered, until they are stopped;
//! then every acknowledged write must be there. `tests/tests/state.rs` kills a single gateway
//! under it, `tests/tests/replicas.rs` the replica holding the project, and restarts every
//! replica in turn under it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sled_sim::{McpClient, TokioConnect};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Messages each writer sends at most (with every fourth write), so that the receiver's inbox
/// holds them all.
const MESSAGES_EACH: u64 = 20;

/// What one writer had acknowledged, and what it sent that did not succeed (its outcome
/// unknown: cut off, or refused with an error that may come after the write).
#[derive(Debug, Default)]
pub struct Acked {
    /// The last board value (and its revision) answered.
    pub value: u64,
    pub revision: u64,
    /// The board values written after it whose writes did not succeed.
    pub unsure: Vec<u64>,
    /// Message bodies answered, and those whose sends did not succeed.
    pub sent: Vec<String>,
    pub unsure_sent: Vec<String>,
    /// Calls that did not succeed.
    pub failed: u64,
}

/// The receiver and the writers, each writer holding the lease `story:w<n>` of the project.
pub struct Load {
    mcp: String,
    project: String,
    receiver: McpClient<TokioConnect>,
    /// The receiver's agent.
    to: Value,
    writers: Vec<McpClient<TokioConnect>>,
    /// Each lease's resource, holder and fence.
    leases: Vec<(Value, Value, Value)>,
    stop: Arc<AtomicBool>,
}

/// A coordination tool's structured result, once it succeeds (a project between holders may
/// refuse for a moment), within 30 s.
pub async fn coord_eventually(c: &mut McpClient<TokioConnect>, tool: &str, args: Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.tools_call(json!(1), tool, args.clone()).await;
        match r {
            Ok(r) if r.get("error").is_none() && r["result"]["isError"] != true => {
                return r["result"]["structuredContent"].clone()
            }
            r if Instant::now() > deadline => panic!("{tool} {args} never succeeded: {r:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn session(mcp: &str) -> McpClient<TokioConnect> {
    let mut c = McpClient::connect(TokioConnect, mcp)
        .await
        .expect("connects");
    c.set_timeout(Some(Duration::from_secs(30)));
    c.initialize().await.expect("a session");
    c
}

/// Each lease's resource, holder and fence in a `claims` result (its time left goes down).
fn held(claims: &Value) -> Vec<(Value, Value, Value)> {
    let leases = claims["leases"].as_array().cloned().unwrap_or_default();
    let lease = |l: &Value| {
        (
            l["resource"].clone(),
            l["holder"].clone(),
            l["fence"].clone(),
        )
    };
    leases.iter().map(lease).collect()
}

impl Load {
    /// Sessions for a receiver (checked in) and `writers` writers on `project` at `mcp`, each
    /// writer claiming its lease.
    pub async fn start(mcp: &str, project: &str, writers: usize) -> Load {
        let mut receiver = session(mcp).await;
        let checked_in = coord_eventually(
            &mut receiver,
            "checkin",
            json!({"project": project, "name": "receiver"}),
        )
        .await;
        let to = checked_in["agent"].clone();
        assert!(to.is_string(), "{checked_in}");
        let mut all = Vec::new();
        for w in 0..writers {
            let mut c = session(mcp).await;
            let lease =
                json!({"project": project, "resource": format!("story:w{w}"), "ttl_s": 600});
            let claimed = coord_eventually(&mut c, "claim", lease).await;
            assert_eq!(claimed["acquired"], true, "{claimed}");
            all.push(c);
        }
        let claims = coord_eventually(&mut receiver, "claims", json!({"project": project})).await;
        let leases = held(&claims);
        assert_eq!(leases.len(), writers, "{claims}");
        Load {
            mcp: mcp.to_owned(),
            project: project.to_owned(),
            receiver,
            to,
            writers: all,
            leases,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The writers, each on a connection of its own, until [`Load::stop`] (a call that does not
    /// succeed is tried again with the next value a moment later).
    pub fn spawn(&self) -> Vec<JoinHandle<Acked>> {
        self.writers
            .iter()
            .enumerate()
            .map(|(w, c)| {
                let session = c.session_id().expect("a session id").to_owned();
                let (mcp, project, to) = (self.mcp.clone(), self.project.clone(), self.to.clone());
                tokio::spawn(write(mcp, session, project, w, to, self.stop.clone()))
            })
            .collect()
    }

    /// Stops the writers: each ends after its call in flight.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Every acknowledged write is there: each writer's board value (or the one it did not
    /// see succeed), each lease with its holder and fence (its holder renews under it), each
    /// message in the receiver's inbox exactly once (with at most those not seen to succeed
    /// besides), and board revisions going on above every one answered. Every session is used.
    pub async fn check(&mut self, acked: &[Acked], log: impl Fn() -> String) {
        let project = self.project.clone();
        let claims =
            coord_eventually(&mut self.receiver, "claims", json!({"project": project})).await;
        assert_eq!(held(&claims), self.leases, "leases: {claims}\n{}", log());
        let mut top_revision = 0;
        for (w, (c, a)) in self.writers.iter_mut().zip(acked).enumerate() {
            let key = json!({"project": project, "key": format!("w{w}")});
            let got = coord_eventually(c, "board_get", key).await;
            let value = got["value"].as_u64().unwrap_or_else(|| panic!("{got}"));
            assert!(
                value == a.value || a.unsure.contains(&value),
                "writer {w}: {value} on the board; {} acknowledged, {:?} not seen to succeed\n{}",
                a.value,
                a.unsure,
                log()
            );
            let revision = got["revision"].as_u64().unwrap_or_else(|| panic!("{got}"));
            assert!(
                revision >= a.revision,
                "writer {w}: {got}, acknowledged {}",
                a.revision
            );
            top_revision = top_revision.max(revision);
            let resource = json!(format!("story:w{w}"));
            let renew = json!({"project": project, "resource": resource});
            let renewed = coord_eventually(c, "renew", renew).await;
            let (_, _, fence) = self
                .leases
                .iter()
                .find(|(r, _, _)| *r == resource)
                .unwrap_or_else(|| panic!("{resource} in {:?}", self.leases));
            assert_eq!(&renewed["fence"], fence, "writer {w} renews: {renewed}");
        }
        let mut bodies: Vec<String> = Vec::new();
        loop {
            let read = json!({"project": project, "limit": 100});
            let page = coord_eventually(&mut self.receiver, "inbox", read).await;
            let messages = page["messages"].as_array().cloned().unwrap_or_default();
            if messages.is_empty() {
                break;
            }
            let body = |m: &Value| m["body"].as_str().unwrap_or_default().to_owned();
            bodies.extend(messages.iter().map(body));
        }
        let mut once = bodies.clone();
        once.sort();
        once.dedup();
        assert_eq!(
            once.len(),
            bodies.len(),
            "a message delivered twice: {bodies:?}"
        );
        for (w, a) in acked.iter().enumerate() {
            for body in &a.sent {
                assert!(
                    bodies.contains(body),
                    "writer {w}'s {body} is lost\n{}",
                    log()
                );
            }
        }
        let asked = |b: &String| {
            acked
                .iter()
                .any(|a| a.sent.contains(b) || a.unsure_sent.contains(b))
        };
        assert!(bodies.iter().all(asked), "only what was sent: {bodies:?}");
        let after = json!({"project": project, "key": "after", "value": 1});
        let set = coord_eventually(&mut self.writers[0], "board_set", after).await;
        let revision = set["revision"].as_u64().unwrap_or_else(|| panic!("{set}"));
        assert!(
            revision > top_revision,
            "a revision reused: {revision} after {top_revision}"
        );
    }
}

/// One writer: board writes of its own key, 1, 2, 3, …, and a message to `to` with every
/// fourth, until `stop`.
async fn write(
    mcp: String,
    session: String,
    project: String,
    w: usize,
    to: Value,
    stop: Arc<AtomicBool>,
) -> Acked {
    let mut c = McpClient::connect(TokioConnect, &mcp)
        .await
        .expect("connects");
    c.set_session_id(Some(session));
    c.set_timeout(Some(Duration::from_secs(30)));
    let ok = |r: &Result<Value, _>| {
        r.as_ref()
            .is_ok_and(|r: &Value| r.get("error").is_none() && r["result"]["isError"] != true)
    };
    let mut acked = Acked::default();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let args = json!({"project": project, "key": format!("w{w}"), "value": i});
        let r = c.tools_call(json!(i), "board_set", args).await;
        if !ok(&r) {
            acked.unsure.push(i);
            acked.failed += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let set = r.expect("answered");
        let set = &set["result"]["structuredContent"];
        let revision = set["revision"].as_u64().unwrap_or_else(|| panic!("{set}"));
        (acked.value, acked.revision) = (i, revision);
        acked.unsure.clear();
        if i % 4 == 0 && i / 4 <= MESSAGES_EACH {
            let body = format!("w{w}-{i}");
            let args = json!({"project": project, "to": to, "body": body});
            let r = c.tools_call(json!(i), "send", args).await;
            if ok(&r) {
                acked.sent.push(body);
            } else {
                acked.unsure_sent.push(body);
                acked.failed += 1;
            }
        }
    }
    acked
}
