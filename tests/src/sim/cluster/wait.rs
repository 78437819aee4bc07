//! No lost wakeup across replicas: agents `wait` in both projects (alpha's sled on r1, beta's
//! on r2) through any replica, and another agent sends them messages in either project through
//! any replica. Oracle: a wait that timed out while a message to its agent in one of its
//! projects had been acknowledged [`SLACK`] before the wait ended, and not read before the wait
//! began, lost a wakeup. The planted `PlantedBug::WaitHereOnly` (a wait waits where it came
//! in, as one gateway would) must be caught.

use super::*;

/// How long before a wait's end a message's acknowledgment must be for the wait to have had
/// to see it: the relays of the message and of the part's answer, on a network of at most
/// 20 ms per hop.
const SLACK: Duration = Duration::from_millis(500);
/// Each wait's `timeout_s`.
const WAIT_S: u64 = 2;
/// How many agents wait.
const WAITERS: usize = 2;

/// A message the sender got acknowledged.
#[derive(Debug, Clone)]
struct Sent {
    to: usize,
    project: &'static str,
    id: u64,
    acked: Duration,
}

/// One `wait` of a waiter.
#[derive(Debug, Clone)]
struct Waited {
    who: usize,
    started: Duration,
    ended: Duration,
    /// `Some(project)` when it woke there, `None` when it timed out.
    woke: Option<Option<String>>,
    /// Messages read (project, id) before it started.
    read_before: BTreeSet<(String, u64)>,
}

#[derive(Default)]
struct Board {
    /// Each waiter's agent name in each project (where that project's state is).
    names: BTreeMap<(usize, &'static str), String>,
    sent: Vec<Sent>,
    waits: Vec<Waited>,
}

fn structured(o: &Outcome) -> Option<&Value> {
    match o {
        Outcome::Ok(v) => Some(v),
        _ => None,
    }
}

/// The run: `WAITERS` waiting sessions and one sending session, for `secs` seconds; with
/// `bug`, the replicas carry that planted bug.
pub fn run_spread_waits(seed: u64, secs: u64, bug: Option<PlantedBug>) -> ClusterReport {
    let mut s = scripted(seed, Duration::from_secs(secs), Vec::new());
    s.bug = bug;
    run_with(&s, move |s, log| {
        let (mut sim, switch, hosts) = build(s, log);
        let board: Arc<Mutex<Board>> = Arc::default();
        let (client_log, end, seed) = (log.clone(), s.run_for, s.seed);
        sim.client(CLIENT_HOST, async move {
            let mut tasks = Vec::new();
            for w in 0..WAITERS {
                let session = Session::new(w, seed, client_log.clone(), end);
                tasks.push(tokio::spawn(waiter(session, w, board.clone(), end)));
            }
            let session = Session::new(WAITERS, seed, client_log.clone(), end);
            tasks.push(tokio::spawn(sender(session, board.clone(), end)));
            for t in tasks {
                t.await?;
            }
            let b = lock(&board);
            for v in judge_waits(&b) {
                client_log.note(format!("lost wakeup: {v}"));
                lock(&client_log.violations).push(format!("(w) lost wakeup: {v}"));
            }
            client_log.note(format!(
                "{} waits ({} woke), {} messages",
                b.waits.len(),
                b.waits
                    .iter()
                    .filter(|w| matches!(w.woke, Some(Some(_))))
                    .count(),
                b.sent.len()
            ));
            Ok(())
        });
        drive(sim, s, log, switch, hosts)
    })
}

fn tool(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

/// Starts a session, checks in in both projects (learning its names there), then waits and
/// reads what woke it until the end.
async fn waiter(mut session: Session, who: usize, board: Arc<Mutex<Board>>, end: Duration) {
    until(WARMUP).await;
    let home = session.rng.random_range(0..REPLICAS.len());
    session.start(home).await;
    for project in PROJECTS {
        loop {
            let r = session.rng.random_range(0..REPLICAS.len());
            let o = session
                .request(
                    r,
                    Op::List,
                    "tools/call",
                    tool("checkin", json!({"project": project})),
                )
                .await;
            if let Some(name) = structured(&o).and_then(|v| v["agent"].as_str()) {
                lock(&board).names.insert((who, project), name.to_owned());
                break;
            }
            if now() > end {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut read: BTreeSet<(String, u64)> = BTreeSet::new();
    while now() + Duration::from_secs(WAIT_S) + SLACK < end {
        let r = session.rng.random_range(0..REPLICAS.len());
        let started = now();
        let args = json!({"projects": PROJECTS, "timeout_s": WAIT_S});
        let o = session
            .request(r, Op::List, "tools/call", tool("wait", args))
            .await;
        let woke = structured(&o).map(|v| {
            (v["woke"] == true).then(|| v["project"].as_str().unwrap_or_default().to_owned())
        });
        lock(&board).waits.push(Waited {
            who,
            started,
            ended: now(),
            woke: woke.clone(),
            read_before: read.clone(),
        });
        // What woke it is read (through any replica), so the next wait waits anew.
        if let Some(Some(project)) = woke {
            let r = session.rng.random_range(0..REPLICAS.len());
            let args = json!({"project": project, "limit": 100});
            let o = session
                .request(r, Op::List, "tools/call", tool("inbox", args))
                .await;
            if let Some(messages) = structured(&o).and_then(|v| v["messages"].as_array()) {
                for m in messages {
                    if let Some(id) = m["id"].as_u64() {
                        read.insert((project.clone(), id));
                    }
                }
            }
        }
    }
}

/// Sends the waiters messages in either project through any replica, at random pauses.
async fn sender(mut session: Session, board: Arc<Mutex<Board>>, end: Duration) {
    until(WARMUP).await;
    let home = session.rng.random_range(0..REPLICAS.len());
    session.start(home).await;
    while now() < end {
        let pause = ms(&mut session.rng, 300, 1_500);
        tokio::time::sleep(pause).await;
        let to = session.rng.random_range(0..WAITERS);
        let project = PROJECTS[session.rng.random_range(0..PROJECTS.len())];
        let Some(name) = lock(&board).names.get(&(to, project)).cloned() else {
            continue;
        };
        let r = session.rng.random_range(0..REPLICAS.len());
        let args = json!({"project": project, "to": name, "body": "your turn"});
        let o = session
            .request(r, Op::List, "tools/call", tool("send", args))
            .await;
        if let Some(id) = structured(&o).and_then(|v| v["id"].as_u64()) {
            lock(&board).sent.push(Sent {
                to,
                project,
                id,
                acked: now(),
            });
        }
    }
}

/// The waits that timed out though a message they had to see was there.
fn judge_waits(b: &Board) -> Vec<String> {
    let mut out = Vec::new();
    for w in &b.waits {
        if w.woke != Some(None) {
            continue;
        }
        let missed = b.sent.iter().find(|m| {
            m.to == w.who
                && m.acked + SLACK < w.ended
                && !w.read_before.contains(&(m.project.to_owned(), m.id))
        });
        if let Some(m) = missed {
            out.push(format!(
                "waiter {}'s wait {:?}..{:?} timed out; message {} in {} was acknowledged at {:?}",
                w.who, w.started, w.ended, m.id, m.project, m.acked
            ));
        }
    }
    out
}
