//! The adversary: host `mallory`, which holds NATS credentials (it reaches the engine host as a
//! replica does, with a [`NetEngine`] of its own) but not the cluster secret. It runs only in
//! the adversary's scenario ([`run_adversary`]), beside the sweep's workload and sleds, with
//! no faults (each replica keeps one run, so its nonces and its counts of refusals cover the
//! whole run, and nothing it refuses was sealed before it started).
//!
//! From [`WARMUP`] until [`SILENT_BEFORE_END`] before the end of the workload it:
//!
//! - listens on every replica's relay subject (`sim.relay.*`) and on the news (`sim.news`),
//!   and sends again what it hears, within the message's lifetime: each genuine relay envelope
//!   of a client's `create_story` (up to [`MAX_REPLAYS`]) to the same subject 0.3–3 s later,
//!   as a request with a reply subject of its own (a replica that took it would have the
//!   story made again), and every third one also to another replica's relay subject; each
//!   announcement (up to [`MAX_REPLAYS`]) to the news again (the sweep's workload makes none
//!   so far: no client holds a stream);
//! - every 1–2 s, forges a relay envelope on the model of the last `create_story` it heard,
//!   naming a story no client sends ([`FORGED_PREFIX`]), and sends it to every replica's relay
//!   subject, in turn unsealed, sealed under a secret of its own, and under the cluster's key
//!   id (public: every sealed item names it) with a tag of its own;
//! - every 2–4 s, publishes a forged announcement on the news, sealed the same three ways;
//! - every 3–5 s, writes a forged tool listing of alpha or beta (listing [`FORGED_TOOL`]) to
//!   the tools bucket, and every 4–6 s a forged directory claim of alpha or beta naming
//!   itself as the holder at a high epoch, both sealed the same three ways (a value under its
//!   own secret or its own tag is sealed at a version above any);
//! - every 2–3 s, reads a project's genuine directory claim, or writes the one it read back
//!   once a newer genuine claim is there (an old value put back: `rolled_back`).
//!
//! It keeps, per replica, how many of each it sent and for which reason the replica must
//! refuse it (`malformed`, `unknown_key`, `bad_tag`, `replayed`, `rolled_back`) and from
//! which source
//! (`relay`, `news`, `tools`, `directory`: a value is heard by every replica's watch). Once
//! its last requests have timed out it reads each replica's `/metrics` and judges:
//!
//! - **(h2)** each replica counted, in `gateway_cluster_unverified_total{source,reason}`, at
//!   least as many refusals of each source and reason as mallory sent it items that must be
//!   refused for that reason (a forgery or replay silently accepted fails the run);
//! - **(h3)** no replica answered anything mallory sent (a replica answers a relay it took).
//!
//! (h1) (every story a sled executed was asked for by a client), (b) (no story executed
//! twice: a replay taken) and (h4) (no replica's stateless `tools/list` lists
//! [`FORGED_TOOL`]: checked by the probes of (f)) are the oracle's, from what the sleds and
//! clients recorded; (a) and (e) judge whether the forged claims took a project away.
//!
//! Mallory is stronger than NATS credentials of one replica under the shipped
//! `examples/nats-server.conf` allow (a replica's user listens only on its own relay subject):
//! it hears every replica's relays.
//!
//! Mallory's subscription to the relay subjects counts as a responder for the engine, as any
//! NATS subscriber does: a relay to a replica that is not listening no longer fails at once
//! with no responders (one more reason this scenario has no faults).

use super::*;
use bytes::Bytes;
use gateway_core::keys::{GatewaySecret, KeyRing};
use gateway_server::cluster::relay::{Envelope, WireRequest};
use gateway_server::cluster::{Engine, Incoming, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The adversary's host.
pub(super) const MALLORY_HOST: &str = "mallory";
/// The names of the stories mallory forges (no client sends one).
pub const FORGED_PREFIX: &str = "mallory-";
/// The tool mallory's forged tool listings list (no sled lists it).
pub(super) const FORGED_TOOL: &str = "mallory-tool";
/// How many genuine relays (and, apart, announcements) mallory sends again at most.
const MAX_REPLAYS: usize = 12;
/// How long mallory waits for an answer to a request it sends.
const ANSWER_WAIT: Duration = Duration::from_secs(3);
/// Mallory sends nothing in the last moments of the workload (so that its last items are
/// handled, and its requests timed out, before it reads the counts).
const SILENT_BEFORE_END: Duration = Duration::from_secs(3);

/// How mallory seals what it forges, and the reason a replica refuses it for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forgery {
    /// Not at all: `malformed`.
    Unsealed,
    /// Under a secret of its own: `unknown_key`.
    OwnSecret,
    /// Under the cluster's key id, with a tag of its own making: `bad_tag`.
    GuessedTag,
}

impl Forgery {
    const ALL: [Forgery; 3] = [Forgery::Unsealed, Forgery::OwnSecret, Forgery::GuessedTag];

    fn reason(self) -> &'static str {
        match self {
            Forgery::Unsealed => "malformed",
            Forgery::OwnSecret => "unknown_key",
            Forgery::GuessedTag => "bad_tag",
        }
    }
}

/// Mallory's own secret.
fn own_keys() -> KeyRing {
    let secret =
        GatewaySecret::parse("a77ac4e5a77ac4e5a77ac4e5a77ac4e5a77ac4e5a77ac4e5a77ac4e5a77ac4e6")
            .expect("a valid secret");
    KeyRing::new(&secret, None)
}

/// What mallory sent, and what it must have been refused for.
#[derive(Default)]
struct Ledger {
    /// Per (replica, source, reason): how many items must have been refused so.
    expected: BTreeMap<(usize, &'static str, &'static str), u64>,
    /// What a replica answered (it must answer nothing).
    answered: Vec<String>,
    forged_relays: usize,
    forged_news: usize,
    forged_tools: usize,
    forged_claims: usize,
    /// Genuine claims read and written back once a newer one was there.
    claims_put_back: usize,
    replays: usize,
    misdirected: usize,
    news_replays: usize,
}

impl Ledger {
    fn expect(&mut self, replica: usize, source: &'static str, reason: &'static str) {
        *self.expected.entry((replica, source, reason)).or_default() += 1;
    }
}

/// Something mallory will send again.
struct Replay {
    at: Duration,
    /// The replica whose relay subject it goes to; `None`: the news.
    to: Option<usize>,
    payload: Bytes,
    /// Whether the subject is the one it was heard on.
    same: bool,
}

/// Adds mallory to the simulation; it judges (h2) and (h3) into `log` when it is done.
pub(super) fn add(sim: &mut turmoil::Sim<'_>, s: &ClusterScenario, log: &Arc<Log>) {
    let (seed, end, log) = (s.seed, s.run_for, log.clone());
    sim.client(MALLORY_HOST, async move {
        Mallory::new(seed, log).run(end).await;
        Ok(())
    });
}

fn relay_subject(replica: usize) -> String {
    format!("{NAMESPACE}.relay.{}", REPLICAS[replica])
}

fn news_subject() -> String {
    format!("{NAMESPACE}.news")
}

/// What follows a sealed item's header line (all of it when it has none).
fn payload_of(item: &[u8]) -> &[u8] {
    match item.iter().position(|b| *b == b'\n') {
        Some(end) if item.starts_with(b"mgw1 ") => &item[end + 1..],
        _ => item,
    }
}

/// A sealed item with the key id of its header replaced by `key_id`.
fn with_key_id(item: Vec<u8>, key_id: &str) -> Vec<u8> {
    let text = String::from_utf8(item).expect("a sealed item of mallory's is text");
    let (header, rest) = text.split_once('\n').expect("a header line");
    let mut fields: Vec<&str> = header.split(' ').collect();
    fields[1] = key_id;
    format!("{}\n{rest}", fields.join(" ")).into_bytes()
}

/// The version a sealed value's header names.
fn version_of(item: &[u8]) -> Option<u64> {
    let end = item.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&item[..end]).ok()?;
    let fields: Vec<&str> = header.split(' ').collect();
    (fields.len() == 4 && fields[0] == "mgw1").then_some(())?;
    u64::from_str_radix(fields[2], 16).ok()
}

/// The key id a sealed item names.
fn key_id_of(item: &[u8]) -> Option<String> {
    let end = item.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&item[..end]).ok()?;
    let mut fields = header.split(' ');
    (fields.next() == Some("mgw1")).then_some(())?;
    fields.next().map(str::to_owned)
}

struct Mallory {
    log: Arc<Log>,
    rng: ChaCha8Rng,
    ledger: Arc<Mutex<Ledger>>,
    /// Everything heard or sent, so that nothing is taken for new twice.
    seen: BTreeSet<Vec<u8>>,
    /// The last `create_story` relayed, as the model of a forgery.
    template: Option<WireRequest>,
    /// The cluster's key id, as sealed items name it.
    key_id: Option<String>,
    pending: Vec<Replay>,
    /// A genuine claim read from the directory (its key, value and version), to be written
    /// back once a newer one is there.
    old_claim: Option<(String, Bytes, u64)>,
    relays_heard: usize,
    news_heard: usize,
    requests: tokio::task::JoinSet<()>,
    engine: Option<Arc<NetEngine>>,
}

impl Mallory {
    fn new(seed: u64, log: Arc<Log>) -> Mallory {
        Mallory {
            log,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x6d61_6c6c_6f72_7900),
            ledger: Arc::default(),
            seen: BTreeSet::new(),
            template: None,
            key_id: None,
            pending: Vec::new(),
            old_claim: None,
            relays_heard: 0,
            news_heard: 0,
            requests: tokio::task::JoinSet::new(),
            engine: None,
        }
    }

    fn violation(&self, line: String) {
        self.log.note(line.clone());
        lock(&self.log.violations).push(line);
    }

    async fn run(mut self, end: Duration) {
        let engine = Arc::new(NetEngine::new(
            format!("{ENGINE_HOST}:{ENGINE_PORT}"),
            MALLORY_HOST,
        ));
        self.engine = Some(engine.clone());
        until(WARMUP).await;
        if !engine.wait_connected(Duration::from_secs(10)).await {
            self.violation("(h) mallory could not reach the engine".to_owned());
            return;
        }
        let subscribed = async {
            let relays = engine.subscribe(&format!("{NAMESPACE}.relay.*")).await?;
            let news = engine.subscribe(&news_subject()).await?;
            Ok::<_, gateway_server::cluster::EngineError>((relays, news))
        };
        let (mut relays, mut news) = match subscribed.await {
            Ok(s) => s,
            Err(e) => {
                self.violation(format!("(h) mallory could not subscribe: {e}"));
                return;
            }
        };
        let stop_at = end.saturating_sub(SILENT_BEFORE_END);
        let mut next_forgery = now() + ms(&mut self.rng, 1_000, 2_000);
        let mut next_news = now() + ms(&mut self.rng, 2_000, 4_000);
        let mut next_tools = now() + ms(&mut self.rng, 3_000, 5_000);
        let mut next_claim = now() + ms(&mut self.rng, 4_000, 6_000);
        let mut next_put_back = now() + ms(&mut self.rng, 2_000, 3_000);
        let (mut relays_open, mut news_open) = (true, true);
        while now() < stop_at {
            let deadline = self
                .pending
                .iter()
                .map(|r| r.at)
                .chain([
                    next_forgery,
                    next_news,
                    next_tools,
                    next_claim,
                    next_put_back,
                    stop_at,
                ])
                .min()
                .unwrap_or(stop_at);
            tokio::select! {
                biased;
                m = relays.next(), if relays_open => match m {
                    Some(m) => self.heard(m),
                    None => relays_open = false,
                },
                m = news.next(), if news_open => match m {
                    Some(m) => self.heard(m),
                    None => news_open = false,
                },
                _ = until(deadline) => {}
            }
            let t = now();
            if t >= stop_at {
                break;
            }
            // The replays due, in the order they were scheduled.
            let (due, later): (Vec<Replay>, Vec<Replay>) = std::mem::take(&mut self.pending)
                .into_iter()
                .partition(|r| r.at <= t);
            self.pending = later;
            for r in due {
                self.replay(r).await;
            }
            if t >= next_forgery {
                self.forge_relay();
                next_forgery = t + ms(&mut self.rng, 1_000, 2_000);
            }
            if t >= next_news {
                self.forge_news().await;
                next_news = t + ms(&mut self.rng, 2_000, 4_000);
            }
            if t >= next_tools {
                self.forge_tools().await;
                next_tools = t + ms(&mut self.rng, 3_000, 5_000);
            }
            if t >= next_claim {
                self.forge_claim().await;
                next_claim = t + ms(&mut self.rng, 4_000, 6_000);
            }
            if t >= next_put_back {
                self.put_back_claim().await;
                next_put_back = t + ms(&mut self.rng, 2_000, 3_000);
            }
        }
        // From here on the engine treats the replicas as before (mallory no longer listens).
        drop((relays, news));
        while self.requests.join_next().await.is_some() {}
        // The last items reach the replicas (a few latencies), then the counts are read.
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.judge().await;
    }

    /// A message heard on a relay subject or the news: a genuine one is kept for replaying.
    fn heard(&mut self, m: Incoming) {
        if !self.seen.insert(m.payload.to_vec()) {
            return;
        }
        if let Some(id) = key_id_of(&m.payload) {
            self.key_id.get_or_insert(id);
        }
        let at = now() + ms(&mut self.rng, 300, 3_000);
        if m.subject == news_subject() {
            self.news_heard += 1;
            if self.news_heard <= MAX_REPLAYS {
                self.pending.push(Replay {
                    at,
                    to: None,
                    payload: m.payload,
                    same: true,
                });
            }
            return;
        }
        let Some(replica) = (0..REPLICAS.len()).find(|r| m.subject == relay_subject(*r)) else {
            return;
        };
        let Ok(Envelope::Request { request, .. }) =
            serde_json::from_slice::<Envelope>(payload_of(&m.payload))
        else {
            return;
        };
        let body: Value = serde_json::from_str(&request.body).unwrap_or_default();
        if body.pointer("/params/name").and_then(Value::as_str) != Some("create_story") {
            return;
        }
        self.template = Some(*request);
        self.relays_heard += 1;
        if self.relays_heard > MAX_REPLAYS {
            return;
        }
        self.pending.push(Replay {
            at,
            to: Some(replica),
            payload: m.payload.clone(),
            same: true,
        });
        if self.relays_heard % 3 == 1 {
            let other = (replica + self.rng.random_range(1..REPLICAS.len())) % REPLICAS.len();
            let at = now() + ms(&mut self.rng, 300, 3_000);
            self.pending.push(Replay {
                at,
                to: Some(other),
                payload: m.payload,
                same: false,
            });
        }
    }

    /// Sends a heard message again.
    async fn replay(&mut self, r: Replay) {
        let reason = if r.same { "replayed" } else { "bad_tag" };
        match r.to {
            Some(replica) => {
                {
                    let mut l = lock(&self.ledger);
                    l.expect(replica, "relay", reason);
                    if r.same {
                        l.replays += 1;
                    } else {
                        l.misdirected += 1;
                    }
                }
                let what = if r.same {
                    "a genuine relay sent again"
                } else {
                    "a genuine relay sent again to another replica"
                };
                self.request(replica, r.payload, what.to_owned());
            }
            None => {
                {
                    let mut l = lock(&self.ledger);
                    for replica in 0..REPLICAS.len() {
                        l.expect(replica, "news", reason);
                    }
                    l.news_replays += 1;
                }
                self.publish_news(r.payload).await;
            }
        }
    }

    /// `payload` sealed (or not) for `context` as `forgery` says.
    fn forge(&mut self, forgery: Forgery, context: &str, payload: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; 16];
        self.rng.fill(&mut nonce);
        let now_ms = (crate::sim::sim_wall_clock())();
        let own = own_keys().seal_message(context, nonce, now_ms, payload);
        match forgery {
            Forgery::Unsealed => payload.to_vec(),
            Forgery::OwnSecret => own,
            Forgery::GuessedTag => with_key_id(own, self.key_id.as_deref().expect("a key id")),
        }
    }

    /// A relay envelope of mallory's making, on the model of the last `create_story` heard,
    /// sent to every replica.
    fn forge_relay(&mut self) {
        let Some(mut request) = self.template.clone() else {
            return;
        };
        let n = {
            let mut l = lock(&self.ledger);
            l.forged_relays += 1;
            l.forged_relays
        };
        let mut body: Value = serde_json::from_str(&request.body).unwrap_or_default();
        body["params"]["arguments"]["name"] = json!(format!("{FORGED_PREFIX}{n}"));
        request.body = body.to_string();
        let envelope = Envelope::Request {
            inbox: format!("{NAMESPACE}.inbox.{MALLORY_HOST}.x.{n}"),
            request: Box::new(request),
        };
        let envelope = serde_json::to_vec(&envelope).expect("an envelope serialises");
        let forgery = Forgery::ALL[n % Forgery::ALL.len()];
        for replica in 0..REPLICAS.len() {
            let sealed = self.forge(forgery, &relay_subject(replica), &envelope);
            self.seen.insert(sealed.clone());
            lock(&self.ledger).expect(replica, "relay", forgery.reason());
            let what = format!("forged relay {FORGED_PREFIX}{n} ({})", forgery.reason());
            self.request(replica, Bytes::from(sealed), what);
        }
    }

    /// An announcement of mallory's making, on the news.
    async fn forge_news(&mut self) {
        let n = {
            let mut l = lock(&self.ledger);
            l.forged_news += 1;
            l.forged_news
        };
        let mut forgery = Forgery::ALL[n % Forgery::ALL.len()];
        if forgery == Forgery::GuessedTag && self.key_id.is_none() {
            forgery = Forgery::OwnSecret;
        }
        let news = json!({"from": REPLICAS[0], "news": {"mallory": n}}).to_string();
        let sealed = self.forge(forgery, &news_subject(), news.as_bytes());
        self.seen.insert(sealed.clone());
        {
            let mut l = lock(&self.ledger);
            for replica in 0..REPLICAS.len() {
                l.expect(replica, "news", forgery.reason());
            }
        }
        self.publish_news(Bytes::from(sealed)).await;
    }

    /// A tool listing of mallory's making for one project, listing [`FORGED_TOOL`], written
    /// over the project's listing in the tools bucket.
    async fn forge_tools(&mut self) {
        let n = {
            let mut l = lock(&self.ledger);
            l.forged_tools += 1;
            l.forged_tools
        };
        let mut forgery = Forgery::ALL[n % Forgery::ALL.len()];
        if forgery == Forgery::GuessedTag && self.key_id.is_none() {
            forgery = Forgery::OwnSecret;
        }
        let (bucket, key) = (
            format!("{NAMESPACE}_tools"),
            format!("p.{}", PROJECTS[n % PROJECTS.len()]),
        );
        let listing = json!([{
            "name": FORGED_TOOL,
            "description": "made by mallory",
            "inputSchema": {"type": "object"},
        }])
        .to_string();
        self.write_forged(forgery, &bucket, &key, listing.into_bytes(), "tools")
            .await;
    }

    /// A directory claim of mallory's making for one project, naming mallory as its holder at
    /// a high epoch, written over the project's claim.
    async fn forge_claim(&mut self) {
        let n = {
            let mut l = lock(&self.ledger);
            l.forged_claims += 1;
            l.forged_claims
        };
        let mut forgery = Forgery::ALL[n % Forgery::ALL.len()];
        if forgery == Forgery::GuessedTag && self.key_id.is_none() {
            forgery = Forgery::OwnSecret;
        }
        let (bucket, key) = (
            format!("{NAMESPACE}_directory"),
            format!("p.{}", PROJECTS[(n / Forgery::ALL.len()) % PROJECTS.len()]),
        );
        let claim = json!({"owner": MALLORY_HOST, "epoch": 1_000_000 + n}).to_string();
        self.write_forged(forgery, &bucket, &key, claim.into_bytes(), "directory")
            .await;
    }

    /// Reads a project's genuine claim, and at a later turn, once a newer genuine claim is
    /// there (claims are refreshed every third of the claim TTL), writes the old one back:
    /// every replica has seen a newer version of the key, and must refuse it as rolled back.
    async fn put_back_claim(&mut self) {
        let engine = self.engine.clone().expect("connected");
        let bucket = format!("{NAMESPACE}_directory");
        let key = match &self.old_claim {
            Some((key, _, _)) => key.clone(),
            None => format!("p.{}", PROJECTS[self.rng.random_range(0..PROJECTS.len())]),
        };
        let current = match engine.get(&bucket, &key).await {
            Ok(Some(e)) => e.value,
            Ok(None) => return,
            Err(e) => {
                self.violation(format!("(h) mallory could not read {key}: {e}"));
                return;
            }
        };
        // Only a genuine value: one sealed under the cluster's key id, and none of mallory's.
        let genuine = self.key_id.is_some()
            && key_id_of(&current) == self.key_id
            && !self.seen.contains(current.as_ref());
        let Some(version) = version_of(&current).filter(|_| genuine) else {
            return;
        };
        match self.old_claim.take() {
            None => self.old_claim = Some((key, current, version)),
            Some((key, old, old_version)) if version > old_version => {
                self.seen.insert(old.to_vec());
                match engine.put(&bucket, &key, old).await {
                    Ok(_) => {
                        let mut l = lock(&self.ledger);
                        l.claims_put_back += 1;
                        for replica in 0..REPLICAS.len() {
                            l.expect(replica, "directory", "rolled_back");
                        }
                    }
                    Err(e) => self.violation(format!("(h) mallory could not write {key}: {e}")),
                }
            }
            // Not refreshed yet: try again at the next turn.
            Some(old) => self.old_claim = Some(old),
        }
    }

    /// Writes `payload` to `key` of `bucket`, sealed as `forgery` says; each replica must
    /// refuse it (counted under `source`).
    async fn write_forged(
        &mut self,
        forgery: Forgery,
        bucket: &str,
        key: &str,
        payload: Vec<u8>,
        source: &'static str,
    ) {
        let own = own_keys().seal_value(bucket, key, u64::MAX / 2, &payload);
        let value = match forgery {
            Forgery::Unsealed => payload,
            Forgery::OwnSecret => own,
            Forgery::GuessedTag => with_key_id(own, self.key_id.as_deref().expect("a key id")),
        };
        let engine = self.engine.clone().expect("connected");
        match engine.put(bucket, key, Bytes::from(value)).await {
            Ok(_) => {
                let mut l = lock(&self.ledger);
                for replica in 0..REPLICAS.len() {
                    l.expect(replica, source, forgery.reason());
                }
            }
            Err(e) => self.violation(format!("(h) mallory could not write {key}: {e}")),
        }
    }

    async fn publish_news(&self, payload: Bytes) {
        let engine = self.engine.clone().expect("connected");
        if let Err(e) = engine.publish(&news_subject(), payload).await {
            self.violation(format!("(h) mallory could not publish news: {e}"));
        }
    }

    /// Sends `payload` to `replica`'s relay subject as a request, in a task; an answer is
    /// recorded for (h3).
    fn request(&mut self, replica: usize, payload: Bytes, what: String) {
        let engine = self.engine.clone().expect("connected");
        let (ledger, log) = (self.ledger.clone(), self.log.clone());
        let subject = relay_subject(replica);
        self.requests.spawn(async move {
            let sent = now();
            match engine.request(&subject, payload, ANSWER_WAIT).await {
                Ok(answer) => {
                    let answer = String::from_utf8_lossy(payload_of(&answer)).into_owned();
                    let line = format!(
                        "{} answered {what} sent at {} ms: {}",
                        REPLICAS[replica],
                        sent.as_millis(),
                        short(&answer)
                    );
                    log.note(format!("mallory: {line}"));
                    lock(&ledger).answered.push(line);
                }
                Err(gateway_server::cluster::EngineError::Timeout) => {}
                Err(e) => log.note(format!("mallory: {what} to {}: {e}", REPLICAS[replica])),
            }
        });
    }

    /// (h2) and (h3), from each replica's `/metrics`.
    async fn judge(&self) {
        let mut counted: Vec<BTreeMap<(String, String), u64>> = Vec::new();
        for (replica, name) in REPLICAS.iter().enumerate() {
            match unverified(replica).await {
                Ok(c) => counted.push(c),
                Err(e) => {
                    self.violation(format!(
                        "(h2) mallory could not read {name}'s /metrics: {e}"
                    ));
                    return;
                }
            }
        }
        let ledger = lock(&self.ledger);
        self.log.note(format!(
            "mallory sent {} forged relays (to each replica), {} forged announcements, {} forged tool listings, {} forged claims, {} genuine claims put back, {} genuine relays again ({} to another replica), {} announcements again; refusals counted {:?}",
            ledger.forged_relays,
            ledger.forged_news,
            ledger.forged_tools,
            ledger.forged_claims,
            ledger.claims_put_back,
            ledger.replays,
            ledger.misdirected,
            ledger.news_replays,
            counted
        ));
        {
            let mut cov = lock(&self.log.coverage);
            let mut add = |k: &str, n: usize| *cov.entry(k.to_owned()).or_default() += n;
            add("mallory forged relays", ledger.forged_relays);
            add("mallory forged news", ledger.forged_news);
            add("mallory forged tools", ledger.forged_tools);
            add("mallory forged claims", ledger.forged_claims);
            add("mallory claims put back", ledger.claims_put_back);
            add("mallory replays", ledger.replays);
            add("mallory misdirected replays", ledger.misdirected);
            add("mallory news replays", ledger.news_replays);
        }
        let mut f = Findings {
            out: Vec::new(),
            counts: BTreeMap::new(),
        };
        for ((replica, source, reason), n) in &ledger.expected {
            let key = ((*source).to_owned(), (*reason).to_owned());
            let got = counted[*replica].get(&key).copied().unwrap_or(0);
            if got < *n {
                f.push(
                    "(h2) refusals not counted",
                    format!(
                        "(h2) {} counted {got} {source} messages refused as {reason}, though mallory sent it {n} it had to refuse so (forged or heard before): some were taken",
                        REPLICAS[*replica]
                    ),
                );
            }
        }
        for line in &ledger.answered {
            f.push(
                "(h3) answered mallory",
                format!("(h3) a replica took what mallory sent: {line}"),
            );
        }
        for v in f.finish() {
            self.violation(v);
        }
    }
}

/// `gateway_cluster_unverified_total` of `replica`'s `/metrics`, by source and reason (a few
/// tries).
async fn unverified(replica: usize) -> Result<BTreeMap<(String, String), u64>, String> {
    let mut last = String::new();
    for _ in 0..5 {
        match scrape(replica).await {
            Ok(body) => {
                return Ok(body
                    .lines()
                    .filter_map(|line| {
                        let rest =
                            line.strip_prefix("gateway_cluster_unverified_total{source=\"")?;
                        let (source, rest) = rest.split_once("\",reason=\"")?;
                        let (reason, n) = rest.split_once("\"} ")?;
                        Some(((source.to_owned(), reason.to_owned()), n.parse().ok()?))
                    })
                    .collect())
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

/// `GET /metrics` of `replica` on its MCP port (no client authentication in the simulation):
/// the body.
async fn scrape(replica: usize) -> Result<String, String> {
    let exchange = async {
        let mut s = turmoil::net::TcpStream::connect((REPLICAS[replica], GATEWAY_PORT))
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| format!("writing: {e}"))?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .await
            .map_err(|e| format!("reading: {e}"))?;
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw
            .split_once("\r\n\r\n")
            .ok_or_else(|| "no head".to_owned())?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("answered {}", short(head)));
        }
        Ok(body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| "no answer within 2 s".to_owned())?
}

/// The adversary's run of `seed`: the sweep's scenario of that seed without its faults (its
/// sessions, sleds and twins), with mallory; with `bug`, the replicas carry that planted bug.
pub fn run_adversary(seed: u64, bug: Option<PlantedBug>) -> ClusterReport {
    let mut s = ClusterScenario::draw(seed, false);
    s.faults.clear();
    s.bug = bug;
    s.adversary = true;
    run_cluster(&s)
}
