//! The store's and the cluster engine's contracts (`gateway_server::store`,
//! `gateway_server::cluster`), each test body generic over where it runs, so that no engine can
//! drift from the others unnoticed:
//!
//! - the store's tests against the model the simulation uses (`gateway_tests::engine_model`, on
//!   tokio's paused clock), a real nats-server (installed on first use into `target/`, one per
//!   test on a free loopback port; skipped with a note when it cannot be installed, failing
//!   when `CI` is set), the embedded redb engine on a file (paused clock too; a restart closes
//!   and reopens the file), and the redb engine on a disk that loses power
//!   (`gateway_tests::crash_disk`: a restart is a power cut, which drops every write not yet
//!   synced);
//! - the engine's messaging tests against the model and nats-server.
//!
//! The planted bug "acknowledge before durable" (`StoreBug::AckBeforeDurable`) fails the
//! durability test on the disk that loses power.

#[path = "support/nats.rs"]
mod nats;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gateway_server::cluster::nats::{NatsEngine, NatsOptions};
use gateway_server::cluster::{
    BucketConfig, Change, ChangeKind, Engine, EngineError, Entry, Incoming, Revision, Store, Watch,
};
use gateway_server::store::redb::{RedbOptions, RedbStore, StoreBug};
use gateway_tests::crash_disk::CrashDisk;
use gateway_tests::engine_model::{Model, ModelEngine};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Where the tests' engine runs, and the faults they can cause it.
trait Backend {
    /// A new client of the engine (a replica's connection).
    fn connect(&mut self, name: &str) -> impl Future<Output = Arc<dyn Engine>>;
    /// A new client whose link to the engine [`Link::cut`] can break.
    fn connect_linked(&mut self, name: &str) -> impl Future<Output = (Arc<dyn Engine>, Link)>;
    /// The engine crashes (the process is killed; its clients see the connection drop).
    fn crash(&mut self) -> impl Future<Output = ()>;
    /// The engine starts again with the data it had.
    fn restart(&mut self) -> impl Future<Output = ()>;
}

/// Where the store's tests run.
trait StoreBackend {
    /// A client of the store (a replica's connection; an embedded store is one, the same
    /// for every name).
    fn store(&mut self, name: &str) -> impl Future<Output = Arc<dyn Store>>;
    /// The engine stops without warning (a power cut where the backend can model one) and
    /// starts again with what it had made durable. Clients made before may be gone (an
    /// embedded store's are): take new ones.
    fn restart(&mut self) -> impl Future<Output = ()>;
}

/// A client's link to the engine, which a test can break: its connection is closed and new
/// ones are refused until [`Link::heal`].
enum Link {
    Model(Arc<ModelEngine>),
    Proxy(Arc<Proxy>),
}

impl Link {
    fn cut(&self) {
        match self {
            Link::Model(engine) => engine.cut_off(),
            Link::Proxy(proxy) => proxy.set_cut(true),
        }
    }

    fn heal(&self) {
        match self {
            Link::Model(engine) => engine.reconnect(),
            Link::Proxy(proxy) => proxy.set_cut(false),
        }
    }
}

struct ModelBackend(Model);

impl Backend for ModelBackend {
    async fn connect(&mut self, name: &str) -> Arc<dyn Engine> {
        Arc::new(self.0.client(name))
    }

    async fn connect_linked(&mut self, name: &str) -> (Arc<dyn Engine>, Link) {
        let engine = Arc::new(self.0.client(name));
        (engine.clone(), Link::Model(engine))
    }

    async fn crash(&mut self) {
        self.0.stop();
    }

    async fn restart(&mut self) {
        self.0.start();
    }
}

impl StoreBackend for ModelBackend {
    async fn store(&mut self, name: &str) -> Arc<dyn Store> {
        Arc::new(self.0.client(name))
    }

    async fn restart(&mut self) {
        self.0.stop();
        self.0.start();
    }
}

struct NatsBackend {
    server: nats::NatsServer,
    /// The links' proxies, kept until the test ends.
    proxies: Vec<Arc<Proxy>>,
}

impl NatsBackend {
    async fn start() -> Option<NatsBackend> {
        Some(NatsBackend {
            server: nats::NatsServer::start().await?,
            proxies: Vec::new(),
        })
    }
}

impl Backend for NatsBackend {
    async fn connect(&mut self, name: &str) -> Arc<dyn Engine> {
        let opts = NatsOptions::new(self.server.url(), name);
        Arc::new(
            NatsEngine::connect(opts)
                .await
                .expect("nats-server accepts"),
        )
    }

    async fn connect_linked(&mut self, name: &str) -> (Arc<dyn Engine>, Link) {
        let proxy = Proxy::start(self.server.port).await;
        self.proxies.push(proxy.clone());
        let url = format!("nats://127.0.0.1:{}", proxy.port);
        let engine = NatsEngine::connect(NatsOptions::new(url, name))
            .await
            .expect("nats-server accepts through the proxy");
        (Arc::new(engine), Link::Proxy(proxy))
    }

    async fn crash(&mut self) {
        self.server.kill().await;
    }

    async fn restart(&mut self) {
        self.server.resume().await;
    }
}

impl StoreBackend for NatsBackend {
    async fn store(&mut self, name: &str) -> Arc<dyn Store> {
        self.connect(name).await
    }

    /// `kill -9` of nats-server (whose page cache survives: its `sync_interval: always` is
    /// what the README promises, not what this shows), and a start on the same store.
    async fn restart(&mut self) {
        self.server.kill().await;
        self.server.resume().await;
    }
}

/// The embedded engine on a file in a scratch directory, or on a [`CrashDisk`].
struct RedbBackend {
    dir: std::path::PathBuf,
    /// With a disk that loses power: a restart is a power cut.
    disk: Option<CrashDisk>,
    options: RedbOptions,
    open: Option<Arc<RedbStore>>,
}

impl RedbBackend {
    fn on_file() -> RedbBackend {
        RedbBackend {
            dir: scratch("redb"),
            disk: None,
            options: RedbOptions::default(),
            open: None,
        }
    }

    fn on_crash_disk(options: RedbOptions) -> RedbBackend {
        let dir = scratch("redb-crash");
        RedbBackend {
            disk: Some(CrashDisk::new(&dir.join("state.redb"))),
            dir,
            options,
            open: None,
        }
    }

    async fn open(&mut self) -> Arc<RedbStore> {
        if let Some(open) = &self.open {
            return open.clone();
        }
        let store = match &self.disk {
            None => RedbStore::open(&self.dir).await,
            Some(disk) => {
                let backend = disk.backend().expect("the disk's file opens");
                let name = disk.path().display().to_string();
                RedbStore::open_with_backend(backend, name, self.options.clone()).await
            }
        };
        let store = Arc::new(store.expect("the state file opens"));
        self.open = Some(store.clone());
        store
    }
}

impl StoreBackend for RedbBackend {
    async fn store(&mut self, _name: &str) -> Arc<dyn Store> {
        self.open().await
    }

    async fn restart(&mut self) {
        if let Some(disk) = &self.disk {
            disk.power_cut();
        }
        if let Some(open) = self.open.take() {
            open.close().await;
        }
    }
}

/// A directory of its own under the system's temporary directory, emptied first.
fn scratch(what: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gateway-contract-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory can be made");
    dir
}

/// A TCP proxy in front of nats-server whose link can be cut: open connections are closed, new
/// ones closed as soon as accepted, until healed.
struct Proxy {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: u16) -> Arc<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    let _ = client.shutdown().await;
                    continue;
                }
                let mut cut_rx = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut_rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Arc::new(Proxy { port, cut, task })
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Each store test body against the model, nats-server, redb on a file and redb on a disk
/// that loses power; each engine test body against the model and nats-server.
macro_rules! contract {
    (store: $($store:ident),* $(,)?; engine: $($engine:ident),* $(,)?) => {
        mod model {
            $(
                #[tokio::test(start_paused = true)]
                async fn $store() {
                    super::$store(&mut super::ModelBackend(super::Model::new())).await;
                }
            )*
            $(
                #[tokio::test(start_paused = true)]
                async fn $engine() {
                    super::$engine(&mut super::ModelBackend(super::Model::new())).await;
                }
            )*
        }
        mod nats_server {
            $(
                #[tokio::test]
                async fn $store() {
                    let Some(mut backend) = super::NatsBackend::start().await else {
                        return;
                    };
                    super::$store(&mut backend).await;
                }
            )*
            $(
                #[tokio::test]
                async fn $engine() {
                    let Some(mut backend) = super::NatsBackend::start().await else {
                        return;
                    };
                    super::$engine(&mut backend).await;
                }
            )*
        }
        mod redb {
            $(
                #[tokio::test(start_paused = true)]
                async fn $store() {
                    super::$store(&mut super::RedbBackend::on_file()).await;
                }
            )*
        }
        mod redb_power_cut {
            $(
                #[tokio::test(start_paused = true)]
                async fn $store() {
                    let options = super::RedbOptions::default();
                    super::$store(&mut super::RedbBackend::on_crash_disk(options)).await;
                }
            )*
        }
    };
}

contract!(
    store:
    create_fails_while_the_key_holds_a_value,
    one_of_many_concurrent_claims_wins,
    update_is_compare_and_set_on_the_revision,
    put_writes_whatever_the_key_holds,
    every_write_takes_the_next_revision_of_its_bucket,
    delete_compares_and_is_a_write_of_its_own,
    watch_gives_the_latest_of_each_key_then_every_change_in_order,
    a_watcher_that_falls_behind_reaches_the_latest_in_order,
    keys_expire_after_max_age_unless_written_again,
    acknowledged_writes_survive_a_restart_and_revisions_go_on,
    keys_are_checked_before_anything_is_written;
    engine:
    requests_reach_a_subscriber_and_come_back,
    a_request_nobody_subscribes_to_fails_at_once,
    a_request_nobody_answers_times_out,
    publish_reaches_every_matching_subscriber,
    a_crashed_engine_is_unavailable_and_comes_back_with_everything,
    a_request_lost_after_it_went_out_is_not_unavailable,
    a_client_cut_off_misses_messages_but_its_watch_catches_up,
    subjects_are_checked_before_anything_is_sent,
);

/// The planted bug "acknowledge before durable" loses acknowledged writes at a power cut, and
/// the durability test says which.
#[tokio::test(start_paused = true)]
async fn redb_acknowledging_before_durable_fails_the_durability_test() {
    let planted = RedbOptions {
        planted: Some(StoreBug::AckBeforeDurable),
        ..RedbOptions::default()
    };
    let lost = lost_across_a_restart(&mut RedbBackend::on_crash_disk(planted)).await;
    assert!(
        !lost.is_empty(),
        "the planted bug went unnoticed: every acknowledged write survived the power cut"
    );
    eprintln!("the planted bug is caught: {lost:?}");
    // The same writes, acknowledged only once synced, all survive the same power cut.
    let mut honest = RedbBackend::on_crash_disk(RedbOptions::default());
    assert_eq!(
        lost_across_a_restart(&mut honest).await,
        Vec::<String>::new()
    );
}

/// Group commit: every acknowledgement waits for a sync, and a burst of concurrent writes
/// shares a few.
#[tokio::test(start_paused = true)]
async fn redb_acknowledges_after_a_sync_and_a_burst_shares_its_syncs() {
    const BURST: usize = 200;
    let mut b = RedbBackend::on_crash_disk(RedbOptions::default());
    let disk = b.disk.clone().expect("a crash disk");
    let e = b.store("r1").await;
    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    let before = disk.syncs();
    e.put(BUCKET, "one", v("x")).await.unwrap();
    assert!(
        disk.syncs() > before,
        "a write is acknowledged after a sync"
    );
    let before = disk.syncs();
    let burst = (0..BURST).map(|i| e.put(BUCKET, &format!("k{i}"), v("x")));
    for r in futures_util::future::join_all(burst).await {
        r.expect("written");
    }
    let syncs = disk.syncs() - before;
    eprintln!("{BURST} concurrent writes: {syncs} syncs");
    assert!(
        (1..=4).contains(&syncs),
        "{BURST} concurrent writes took {syncs} syncs"
    );
}

/// A disk that fails under the embedded store (here: the power is gone): every write is
/// refused `Unavailable`, at once, the expiries that fall due meanwhile too; nothing panics.
#[tokio::test(start_paused = true)]
async fn redb_refuses_writes_it_cannot_sync_as_unavailable() {
    let mut b = RedbBackend::on_crash_disk(RedbOptions::default());
    let disk = b.disk.clone().expect("a crash disk");
    let e = b.store("r1").await;
    e.ensure_bucket(BucketConfig::with_max_age(BUCKET, Duration::from_secs(1)))
        .await
        .unwrap();
    e.ensure_bucket(BucketConfig::new("kept")).await.unwrap();
    e.put(BUCKET, "k", v("x")).await.unwrap();
    let r = e.put("kept", "k", v("x")).await.unwrap();
    disk.power_cut();
    for _ in 0..3 {
        let w = within("a write on a dead disk", e.put("kept", "k", v("y"))).await;
        assert!(matches!(w, Err(EngineError::Unavailable(_))), "{w:?}");
    }
    // An expiry falls due meanwhile, cannot be written, and is tried again later.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let w = within("a create on a dead disk", e.create(BUCKET, "k", v("z"))).await;
    assert!(matches!(w, Err(EngineError::Unavailable(_))), "{w:?}");
    b.restart().await;
    let e = b.store("r1").await;
    assert_eq!(
        e.get("kept", "k").await,
        Ok(entry("k", "x", r)),
        "what was refused left nothing"
    );
}

const BUCKET: &str = "directory";

fn v(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn entry(key: &str, value: &str, revision: Revision) -> Option<Entry> {
    Some(Entry {
        key: key.to_owned(),
        value: v(value),
        revision,
    })
}

fn conflict(current_revision: Revision) -> EngineError {
    EngineError::Conflict { current_revision }
}

fn put(key: &str, value: &str, revision: Revision) -> Change {
    Change {
        key: key.to_owned(),
        revision,
        kind: ChangeKind::Put(v(value)),
    }
}

fn gone(key: &str, revision: Revision, kind: ChangeKind) -> Change {
    Change {
        key: key.to_owned(),
        revision,
        kind,
    }
}

/// Bounds a step, so a hang fails the test instead of blocking it.
async fn within<T>(what: &str, step: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(15), step)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within 15 s"))
}

/// The watch's next `n` changes.
async fn changes(watch: &mut Watch, n: usize) -> Vec<Change> {
    let mut got = Vec::new();
    while got.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(10), watch.next()).await;
        match next {
            Ok(Some(change)) => got.push(change),
            Ok(None) => panic!("the watch ended after {got:?}"),
            Err(_) => panic!("only {got:?} within 10 s; {n} expected"),
        }
    }
    got
}

/// The changes up to the last of `expected`, which must be what the watch reports: the
/// contract lets a watcher skip superseded revisions of a key (on NATS, a watch that falls
/// behind is resumed from the latest), never reorder them or miss the latest.
async fn changes_through(watch: &mut Watch, expected: &[Change]) {
    let last = expected.last().expect("something expected").revision;
    let mut got: Vec<Change> = Vec::new();
    while got.last().is_none_or(|c| c.revision < last) {
        match tokio::time::timeout(Duration::from_secs(10), watch.next()).await {
            Ok(Some(change)) => got.push(change),
            Ok(None) => panic!("the watch ended after {got:?}"),
            Err(_) => panic!("only {got:?} within 10 s; {expected:?} expected"),
        }
    }
    let mut rest = expected.iter();
    for c in &got {
        assert!(
            rest.any(|e| e == c),
            "{got:?}: not {expected:?} in order, with only superseded ones skipped"
        );
    }
    assert_eq!(got.last(), expected.last(), "the latest is reported");
}

/// Asserts nothing more comes on the watch for a while.
async fn quiet(watch: &mut Watch) {
    if let Ok(more) = tokio::time::timeout(Duration::from_millis(300), watch.next()).await {
        panic!("no more changes expected, got {more:?}");
    }
}

/// Retries `attempt` every 50 ms until `done` holds of its result (at most 15 s); the result.
async fn eventually<T: std::fmt::Debug, F: Future<Output = T>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let result = attempt().await;
        if done(&result) {
            return result;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {result:?} after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`eventually`], for its wait alone.
async fn wait_until<T: std::fmt::Debug, F: Future<Output = T>>(
    what: &str,
    attempt: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) {
    eventually(what, attempt, done).await;
}

/// Answers every request on `subject` with `<subject>:<payload>` until dropped.
async fn responder(engine: &Arc<dyn Engine>, subject: &str) -> tokio::task::JoinHandle<()> {
    let mut requests = engine.subscribe(subject).await.expect("subscribed");
    let engine = engine.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let Some(reply) = request.reply else { continue };
            let answer = format!(
                "{}:{}",
                request.subject,
                String::from_utf8_lossy(&request.payload)
            );
            // A reply the engine cannot take is lost, like any message.
            let _ = engine.publish(&reply, v(&answer)).await;
        }
    })
}

// The tests.

async fn create_fails_while_the_key_holds_a_value(b: &mut impl StoreBackend) {
    let e = b.store("r1").await;
    let missing = EngineError::BucketNotFound("nowhere".into());
    assert_eq!(e.create("nowhere", "k", v("x")).await, Err(missing.clone()));
    assert_eq!(e.get("nowhere", "k").await, Err(missing));

    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    // Every replica makes the buckets it needs when it starts: making one again is fine.
    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    assert_eq!(e.get(BUCKET, "project.alpha").await, Ok(None));
    let r1 = e.create(BUCKET, "project.alpha", v("r1")).await.unwrap();
    assert_eq!(r1, 1, "a bucket's first write is revision 1");
    assert_eq!(
        e.create(BUCKET, "project.alpha", v("again")).await,
        Err(conflict(r1))
    );

    let other = b.store("r2").await;
    assert_eq!(
        other.create(BUCKET, "project.alpha", v("r2")).await,
        Err(conflict(r1))
    );
    assert_eq!(
        other.get(BUCKET, "project.alpha").await,
        Ok(entry("project.alpha", "r1", r1))
    );
}

async fn one_of_many_concurrent_claims_wins(b: &mut impl StoreBackend) {
    let replicas = [
        b.store("r1").await,
        b.store("r2").await,
        b.store("r3").await,
    ];
    replicas[0]
        .ensure_bucket(BucketConfig::new(BUCKET))
        .await
        .unwrap();
    let claims = replicas
        .iter()
        .enumerate()
        .map(|(i, e)| e.create(BUCKET, "project.alpha", v(&format!("r{}", i + 1))));
    let results = within("the claims", futures_util::future::join_all(claims)).await;
    let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "exactly one claim wins: {results:?}");
    let epoch = *won[0];
    for r in &results {
        assert!(
            *r == Ok(epoch) || *r == Err(conflict(epoch)),
            "the others lose to the winner's revision: {results:?}"
        );
    }
    let winner = results.iter().position(|r| r.is_ok()).expect("one won");
    assert_eq!(
        replicas[2].get(BUCKET, "project.alpha").await,
        Ok(entry("project.alpha", &format!("r{}", winner + 1), epoch))
    );

    // Taking over from the winner is a compare-and-set on its epoch: again one wins.
    let takeovers = replicas
        .iter()
        .map(|e| e.update(BUCKET, "project.alpha", v("taken"), epoch));
    let results = within("the takeovers", futures_util::future::join_all(takeovers)).await;
    let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "exactly one takeover wins: {results:?}");
    assert!(*won[0] > epoch, "a new epoch is above the old one");
}

async fn update_is_compare_and_set_on_the_revision(b: &mut impl StoreBackend) {
    let e = b.store("r1").await;
    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    let r1 = e.create(BUCKET, "session.s1", v("alpha")).await.unwrap();
    let r2 = e.update(BUCKET, "session.s1", v("beta"), r1).await.unwrap();
    assert_eq!(r2, r1 + 1);
    assert_eq!(
        e.update(BUCKET, "session.s1", v("gamma"), r1).await,
        Err(conflict(r2)),
        "a stale revision loses and learns the current one"
    );
    assert_eq!(
        e.update(BUCKET, "session.s1", v("gamma"), 0).await,
        Err(conflict(r2)),
        "0 means a key never written"
    );
    assert_eq!(
        e.get(BUCKET, "session.s1").await,
        Ok(entry("session.s1", "beta", r2))
    );
    assert_eq!(
        e.update(BUCKET, "session.s2", v("x"), 7).await,
        Err(conflict(0)),
        "a key never written is at revision 0"
    );
    let r3 = e.update(BUCKET, "session.s2", v("x"), 0).await.unwrap();
    assert_eq!(r3, r2 + 1, "expecting 0 writes a key never written");
}

async fn put_writes_whatever_the_key_holds(b: &mut impl StoreBackend) {
    let e = b.store("r1").await;
    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    let r1 = e.put(BUCKET, "session.s1", v("alpha")).await.unwrap();
    let r2 = e.put(BUCKET, "session.s1", v("beta")).await.unwrap();
    assert_eq!(r2, r1 + 1, "a put over a value is a write like any other");
    assert_eq!(
        e.get(BUCKET, "session.s1").await,
        Ok(entry("session.s1", "beta", r2))
    );
    let r3 = e.delete(BUCKET, "session.s1", None).await.unwrap();
    let r4 = e.put(BUCKET, "session.s1", v("gamma")).await.unwrap();
    assert_eq!(r4, r3 + 1, "a put over a deletion");
    assert_eq!(
        e.update(BUCKET, "session.s1", v("delta"), r4).await,
        Ok(r4 + 1),
        "a put's revision is what compare-and-set expects"
    );
    assert_eq!(
        e.put("no-such-bucket", "session.s1", v("x")).await,
        Err(EngineError::BucketNotFound("no-such-bucket".into()))
    );
}

async fn every_write_takes_the_next_revision_of_its_bucket(b: &mut impl StoreBackend) {
    let e = b.store("r1").await;
    e.ensure_bucket(BucketConfig::new("one")).await.unwrap();
    e.ensure_bucket(BucketConfig::new("two")).await.unwrap();
    assert_eq!(e.create("one", "a", v("1")).await, Ok(1));
    assert_eq!(e.create("one", "b", v("1")).await, Ok(2));
    assert_eq!(e.create("one", "a", v("2")).await, Err(conflict(1)));
    assert_eq!(e.update("one", "b", v("2"), 1).await, Err(conflict(2)));
    assert_eq!(
        e.update("one", "a", v("2"), 1).await,
        Ok(3),
        "refused writes take no revision"
    );
    assert_eq!(e.delete("one", "b", None).await, Ok(4));
    assert_eq!(
        e.create("two", "a", v("1")).await,
        Ok(1),
        "each bucket counts alone"
    );
    assert_eq!(e.create("one", "c", v("1")).await, Ok(5));
}

async fn delete_compares_and_is_a_write_of_its_own(b: &mut impl StoreBackend) {
    let e = b.store("r1").await;
    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    let r1 = e.create(BUCKET, "project.alpha", v("r1")).await.unwrap();
    assert_eq!(
        e.delete(BUCKET, "project.alpha", Some(r1 + 5)).await,
        Err(conflict(r1))
    );
    assert_eq!(
        e.get(BUCKET, "project.alpha").await,
        Ok(entry("project.alpha", "r1", r1))
    );
    let r2 = e.delete(BUCKET, "project.alpha", Some(r1)).await.unwrap();
    assert_eq!(r2, r1 + 1);
    assert_eq!(e.get(BUCKET, "project.alpha").await, Ok(None));
    assert_eq!(
        e.update(BUCKET, "project.alpha", v("late"), r1).await,
        Err(conflict(r2)),
        "a deleted key is at its deletion's revision"
    );
    let r3 = e
        .create(BUCKET, "project.alpha", v("r2"))
        .await
        .expect("a deleted key can be created again");
    assert_eq!(r3, r2 + 1);
    assert_eq!(e.delete(BUCKET, "project.alpha", None).await, Ok(r3 + 1));
    assert_eq!(
        e.delete(BUCKET, "project.never", Some(3)).await,
        Err(conflict(0))
    );
    assert_eq!(
        e.delete(BUCKET, "project.never", None).await,
        Ok(r3 + 2),
        "deleting a key never written is a write too"
    );
}

async fn watch_gives_the_latest_of_each_key_then_every_change_in_order(b: &mut impl StoreBackend) {
    let e = b.store("r1").await;
    let other = b.store("r2").await;
    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    assert_eq!(
        e.watch("nowhere", ">").await.err(),
        Some(EngineError::BucketNotFound("nowhere".into()))
    );
    other.create(BUCKET, "p.a", v("1")).await.unwrap(); // 1
    other.create(BUCKET, "p.b", v("1")).await.unwrap(); // 2
    other.delete(BUCKET, "p.b", Some(2)).await.unwrap(); // 3
    other.create(BUCKET, "q.c", v("1")).await.unwrap(); // 4
    other.update(BUCKET, "p.a", v("2"), 1).await.unwrap(); // 5

    let mut p = e.watch(BUCKET, "p.>").await.unwrap();
    assert_eq!(
        changes(&mut p, 2).await,
        [gone("p.b", 3, ChangeKind::Deleted), put("p.a", "2", 5)],
        "the latest write of each key, in revision order"
    );
    quiet(&mut p).await;

    other.create(BUCKET, "p.c", v("1")).await.unwrap(); // 6
    other.update(BUCKET, "q.c", v("2"), 4).await.unwrap(); // 7
    other.delete(BUCKET, "p.a", Some(5)).await.unwrap(); // 8
    other.create(BUCKET, "p.a", v("3")).await.unwrap(); // 9
    assert_eq!(
        changes(&mut p, 3).await,
        [
            put("p.c", "1", 6),
            gone("p.a", 8, ChangeKind::Deleted),
            put("p.a", "3", 9)
        ]
    );
    quiet(&mut p).await;

    let mut all = e.watch(BUCKET, ">").await.unwrap();
    assert_eq!(
        changes(&mut all, 4).await,
        [
            gone("p.b", 3, ChangeKind::Deleted),
            put("p.c", "1", 6),
            put("q.c", "2", 7),
            put("p.a", "3", 9)
        ]
    );
    let mut one = e.watch(BUCKET, "p.a").await.unwrap();
    assert_eq!(changes(&mut one, 1).await, [put("p.a", "3", 9)]);
    let mut star = e.watch(BUCKET, "*.c").await.unwrap();
    assert_eq!(
        changes(&mut star, 2).await,
        [put("p.c", "1", 6), put("q.c", "2", 7)]
    );
    other.update(BUCKET, "q.c", v("3"), 7).await.unwrap(); // 10
    assert_eq!(changes(&mut all, 1).await, [put("q.c", "3", 10)]);
    assert_eq!(changes(&mut star, 1).await, [put("q.c", "3", 10)]);
    quiet(&mut one).await;
}

async fn keys_expire_after_max_age_unless_written_again(b: &mut impl StoreBackend) {
    let e = b.store("r1").await;
    // The key must be written again within its age. A loaded machine can stall past that
    // between two writes, and then the test cannot tell: it runs again in a fresh bucket
    // (each bucket has revisions of its own), at most three times.
    for attempt in 0..3 {
        if expiry_in(&*e, &format!("alive{attempt}")).await {
            return;
        }
        eprintln!("attempt {attempt}: the machine stalled past max_age between two writes");
    }
    panic!("the machine stalled past max_age three times; the test cannot tell");
}

/// [`keys_expire_after_max_age_unless_written_again`] in `bucket`; `false` when the machine
/// stalled.
async fn expiry_in(e: &dyn Store, bucket: &str) -> bool {
    const AGE: Duration = Duration::from_secs(1);
    // NATS expires on a timer of its own: up to this much late (the model is exact).
    const LATE: Duration = Duration::from_millis(2500);
    assert!(matches!(
        e.ensure_bucket(BucketConfig::with_max_age(
            bucket,
            Duration::from_millis(500)
        ))
        .await,
        Err(EngineError::Invalid(_))
    ));
    e.ensure_bucket(BucketConfig::with_max_age(bucket, 2 * AGE))
        .await
        .unwrap();
    assert!(
        matches!(
            e.ensure_bucket(BucketConfig::new(bucket)).await,
            Err(EngineError::Other(_))
        ),
        "a max_age cannot be removed"
    );
    e.ensure_bucket(BucketConfig::with_max_age(bucket, AGE))
        .await
        .expect("a max_age can change");
    let mut watch = e.watch(bucket, ">").await.unwrap();

    let first_write = Instant::now();
    let r1 = e.create(bucket, "replica.r1", v("up")).await.unwrap();
    tokio::time::sleep(AGE / 2).await;
    let r2 = e.update(bucket, "replica.r1", v("still up"), r1).await;
    let last_write = Instant::now();
    if last_write - first_write >= AGE {
        return false;
    }
    let r2 = r2.expect("not expired half way through its age");

    // Gone no earlier than `max_age` after the last write, and not much later.
    let absent = eventually(
        "the key expires",
        || e.get(bucket, "replica.r1"),
        |r| *r == Ok(None),
    )
    .await;
    assert_eq!(absent, Ok(None));
    let lived = Instant::now() - last_write;
    assert!(lived >= AGE, "expired {lived:?} after its last write");
    assert!(lived <= AGE + LATE, "expired only {lived:?} after");

    // The expiry is a write of its own, which the watch sees.
    let r3 = r2 + 1;
    changes_through(
        &mut watch,
        &[
            put("replica.r1", "up", r1),
            put("replica.r1", "still up", r2),
            gone("replica.r1", r3, ChangeKind::Expired),
        ],
    )
    .await;
    assert_eq!(
        e.update(bucket, "replica.r1", v("late"), r2).await,
        Err(conflict(r3)),
        "an expired key is at its expiry's revision"
    );
    let r4 = e
        .create(bucket, "replica.r1", v("back"))
        .await
        .expect("an expired key can be created again");
    assert_eq!(r4, r3 + 1);

    // A deletion ages out the same way.
    let r5 = e.delete(bucket, "replica.r1", Some(r4)).await.unwrap();
    changes_through(
        &mut watch,
        &[
            put("replica.r1", "back", r4),
            gone("replica.r1", r5, ChangeKind::Deleted),
            gone("replica.r1", r5 + 1, ChangeKind::Expired),
        ],
    )
    .await;
    // The expiry marker goes after another `max_age`, silently: then the key is at 0.
    let recreated = eventually(
        "the expiry marker goes",
        || e.update(bucket, "replica.r1", v("new"), 0),
        |r| r.is_ok(),
    )
    .await;
    assert_eq!(recreated, Ok(r5 + 2));
    assert_eq!(
        changes(&mut watch, 1).await,
        [put("replica.r1", "new", r5 + 2)],
        "the marker went without a change"
    );
    true
}

async fn requests_reach_a_subscriber_and_come_back(b: &mut impl Backend) {
    let owner = b.connect("owner").await;
    let caller = b.connect("caller").await;
    let _serving = responder(&owner, "gw.replica.owner.>").await;
    let answer = caller
        .request("gw.replica.owner.call", v("hello"), Duration::from_secs(5))
        .await;
    assert_eq!(answer, Ok(v("gw.replica.owner.call:hello")));

    // Concurrent requests each get their own answer.
    let requests = (0..8).map(|i| {
        caller.request(
            "gw.replica.owner.call",
            v(&format!("n{i}")),
            Duration::from_secs(5),
        )
    });
    let answers = within("the requests", futures_util::future::join_all(requests)).await;
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer, Ok(v(&format!("gw.replica.owner.call:n{i}"))));
    }
}

async fn a_request_nobody_subscribes_to_fails_at_once(b: &mut impl Backend) {
    let e = b.connect("r1").await;
    let other = b.connect("r2").await;
    let started = Instant::now();
    assert_eq!(
        e.request("gw.replica.gone.call", v("x"), Duration::from_secs(5))
            .await,
        Err(EngineError::NoResponders("gw.replica.gone.call".into()))
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no responders is known at once, not after the timeout"
    );

    // A subscription counts while it lives.
    let serving = responder(&other, "gw.replica.gone.call").await;
    assert_eq!(
        e.request("gw.replica.gone.call", v("x"), Duration::from_secs(5))
            .await,
        Ok(v("gw.replica.gone.call:x"))
    );
    serving.abort();
    let _ = serving.await;
    wait_until(
        "the dropped subscription stops counting",
        || e.request("gw.replica.gone.call", v("x"), Duration::from_secs(5)),
        |r| matches!(r, Err(EngineError::NoResponders(_))),
    )
    .await;
}

async fn a_request_nobody_answers_times_out(b: &mut impl Backend) {
    let e = b.connect("r1").await;
    let silent = b.connect("silent").await;
    let mut requests = silent.subscribe("gw.replica.silent.call").await.unwrap();
    let started = Instant::now();
    assert_eq!(
        e.request("gw.replica.silent.call", v("x"), Duration::from_millis(300))
            .await,
        Err(EngineError::Timeout)
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "waited {waited:?} for a 300 ms timeout"
    );
    let request = within("the request arrives", requests.next())
        .await
        .expect("subscribed");
    assert_eq!(request.subject, "gw.replica.silent.call");
    assert_eq!(request.payload, v("x"));
    assert!(request.reply.is_some(), "a request says where to answer");
}

async fn publish_reaches_every_matching_subscriber(b: &mut impl Backend) {
    let a = b.connect("r1").await;
    let c = b.connect("r2").await;
    let mut every = a.subscribe("events.>").await.unwrap();
    let mut changed = c.subscribe("events.*.changed").await.unwrap();
    let mut other = c.subscribe("events.*.other").await.unwrap();
    a.publish("events.alpha.changed", v("tools")).await.unwrap();
    let expected = Incoming {
        subject: "events.alpha.changed".into(),
        payload: v("tools"),
        reply: None,
    };
    assert_eq!(
        within("the event", every.next()).await,
        Some(expected.clone())
    );
    assert_eq!(within("the event", changed.next()).await, Some(expected));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), other.next())
            .await
            .is_err(),
        "a subscription that does not match hears nothing"
    );
}

async fn a_crashed_engine_is_unavailable_and_comes_back_with_everything(b: &mut impl Backend) {
    let owner = b.connect("owner").await;
    let caller = b.connect("caller").await;
    owner
        .ensure_bucket(BucketConfig::new(BUCKET))
        .await
        .unwrap();
    let r1 = owner
        .create(BUCKET, "project.alpha", v("owner"))
        .await
        .unwrap();
    let _serving = responder(&owner, "gw.replica.owner.call").await;
    let mut watch = caller.watch(BUCKET, ">").await.unwrap();
    assert_eq!(
        changes(&mut watch, 1).await,
        [put("project.alpha", "owner", r1)]
    );

    b.crash().await;
    let unavailable =
        |r: &Result<Option<Entry>, EngineError>| matches!(r, Err(EngineError::Unavailable(_)));
    wait_until(
        "the crash is noticed",
        || caller.get(BUCKET, "project.alpha"),
        unavailable,
    )
    .await;
    let started = Instant::now();
    assert!(matches!(
        caller.create(BUCKET, "project.beta", v("caller")).await,
        Err(EngineError::Unavailable(_))
    ));
    assert!(matches!(
        caller
            .request("gw.replica.owner.call", v("x"), Duration::from_secs(5))
            .await,
        Err(EngineError::Unavailable(_))
    ));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "an outage is told at once, not after a timeout"
    );

    b.restart().await;
    wait_until(
        "the data is back",
        || caller.get(BUCKET, "project.alpha"),
        |r| *r == Ok(entry("project.alpha", "owner", r1)),
    )
    .await;
    wait_until(
        "the owner's subscription is back",
        || caller.request("gw.replica.owner.call", v("again"), Duration::from_secs(5)),
        |r| *r == Ok(v("gw.replica.owner.call:again")),
    )
    .await;
    let r2 = caller
        .update(BUCKET, "project.alpha", v("caller"), r1)
        .await
        .unwrap();
    assert_eq!(r2, r1 + 1, "revisions go on where they were");
    assert_eq!(
        changes(&mut watch, 1).await,
        [put("project.alpha", "caller", r2)],
        "the watch goes on, nothing lost or repeated"
    );
}

/// `Unavailable` from `request` means nothing was sent (a relayed call is then answered
/// `not_sent`): a request the engine lost once it had gone out fails otherwise (`Timeout`, or
/// `Other`), since its subscriber may have acted on it.
async fn a_request_lost_after_it_went_out_is_not_unavailable(b: &mut impl Backend) {
    let caller = b.connect("caller").await;
    let owner = b.connect("owner").await;
    let mut requests = owner.subscribe("gw.replica.owner.call").await.unwrap();
    let request = tokio::spawn({
        let caller = caller.clone();
        async move {
            caller
                .request("gw.replica.owner.call", v("x"), Duration::from_secs(3))
                .await
        }
    });
    within("the request arrives", requests.next())
        .await
        .expect("subscribed");
    b.crash().await;
    let answer = within("the request ends", request).await.unwrap();
    assert!(
        matches!(answer, Err(EngineError::Timeout | EngineError::Other(_))),
        "a request that went out and was lost: {answer:?}"
    );
    b.restart().await;
}

async fn a_client_cut_off_misses_messages_but_its_watch_catches_up(b: &mut impl Backend) {
    let (cut, link) = b.connect_linked("cut").await;
    let other = b.connect("other").await;
    other
        .ensure_bucket(BucketConfig::new(BUCKET))
        .await
        .unwrap();
    let r1 = other.create(BUCKET, "session.s1", v("a")).await.unwrap();
    let unchanged = other.create(BUCKET, "session.s0", v("z")).await.unwrap();
    let mut watch = cut.watch(BUCKET, ">").await.unwrap();
    assert_eq!(
        changes(&mut watch, 2).await,
        [
            put("session.s1", "a", r1),
            put("session.s0", "z", unchanged)
        ]
    );
    let _serving = responder(&cut, "gw.replica.cut.call").await;
    let mut events = cut.subscribe("events.>").await.unwrap();

    link.cut();
    wait_until(
        "the cut is noticed",
        || cut.get(BUCKET, "session.s1"),
        |r| matches!(r, Err(EngineError::Unavailable(_))),
    )
    .await;
    wait_until(
        "its subscriptions stop counting",
        || other.request("gw.replica.cut.call", v("x"), Duration::from_secs(5)),
        |r| matches!(r, Err(EngineError::NoResponders(_))),
    )
    .await;
    other.publish("events.lost", v("lost")).await.unwrap();
    // Meanwhile the key is written twice: the first of these is superseded.
    let r2 = other
        .update(BUCKET, "session.s1", v("b"), r1)
        .await
        .unwrap();
    let r3 = other
        .update(BUCKET, "session.s1", v("c"), r2)
        .await
        .unwrap();

    link.heal();
    wait_until(
        "the link is back",
        || other.request("gw.replica.cut.call", v("y"), Duration::from_secs(5)),
        |r| *r == Ok(v("gw.replica.cut.call:y")),
    )
    .await;
    assert_eq!(
        changes(&mut watch, 1).await,
        [put("session.s1", "c", r3)],
        "the watch catches up from where it was, skipping what was superseded"
    );
    quiet(&mut watch).await;
    other.publish("events.heard", v("heard")).await.unwrap();
    let heard = within("the event", events.next())
        .await
        .expect("subscribed");
    assert_eq!(
        heard.subject, "events.heard",
        "what was published while cut off is lost"
    );
}

async fn keys_are_checked_before_anything_is_written(b: &mut impl StoreBackend) {
    let e = b.store("r1").await;
    let invalid = |r: Result<Revision, EngineError>| matches!(r, Err(EngineError::Invalid(_)));
    assert!(matches!(
        e.ensure_bucket(BucketConfig::new("a.b")).await,
        Err(EngineError::Invalid(_))
    ));
    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    for key in ["", ".a", "a.", "a..b", "a b", "a*", "a.>", "ünï"] {
        assert!(invalid(e.create(BUCKET, key, v("x")).await), "{key:?}");
        assert!(invalid(e.put(BUCKET, key, v("x")).await), "{key:?}");
    }
    assert!(matches!(
        e.watch(BUCKET, "a.>.b").await.err(),
        Some(EngineError::Invalid(_))
    ));
    // Everything the rules allow, the engine takes.
    let key = "Project-1/x=y_z.alpha.9";
    let r = e.create(BUCKET, key, v("x")).await.unwrap();
    assert_eq!(e.get(BUCKET, key).await, Ok(entry(key, "x", r)));
}

async fn subjects_are_checked_before_anything_is_sent(b: &mut impl Backend) {
    let e = b.connect("r1").await;
    for subject in ["", "a.*", "a.>", "a b", "a..b"] {
        assert!(
            matches!(
                e.publish(subject, v("x")).await,
                Err(EngineError::Invalid(_))
            ),
            "{subject:?}"
        );
        assert!(
            matches!(
                e.request(subject, v("x"), Duration::from_secs(1)).await,
                Err(EngineError::Invalid(_))
            ),
            "{subject:?}"
        );
    }
    assert!(matches!(
        e.subscribe("a.>.b").await.err(),
        Some(EngineError::Invalid(_))
    ));
}

/// A watcher that reads nothing while many writes happen: when it reads, it sees revisions
/// in increasing order only, ending with the latest write of every key.
async fn a_watcher_that_falls_behind_reaches_the_latest_in_order(b: &mut impl StoreBackend) {
    const KEYS: usize = 40;
    const WRITES: usize = 2500;
    let e = b.store("r1").await;
    e.ensure_bucket(BucketConfig::new(BUCKET)).await.unwrap();
    let mut watch = e.watch(BUCKET, "k.>").await.unwrap();
    let mut latest = std::collections::BTreeMap::new();
    // In rounds of concurrent writes (one key each), so that the embedded engine commits
    // several per sync and the run stays short.
    for round in 0..WRITES / KEYS {
        let writes = (0..KEYS).map(|k| {
            let key = format!("k.{k}");
            let value = format!("{round}");
            let write = e.put(BUCKET, &key, v(&value));
            async move { (key, value, write.await.expect("written")) }
        });
        for (key, value, revision) in futures_util::future::join_all(writes).await {
            latest.insert(key, (value, revision));
        }
    }
    // A write to a key the watch does not match does not show.
    e.put(BUCKET, "other", v("x")).await.unwrap();
    let last = latest.values().map(|(_, r)| *r).max().expect("written");
    let mut seen = std::collections::BTreeMap::new();
    let mut previous = 0;
    while seen.len() < KEYS
        || seen
            .values()
            .any(|(_, r)| !latest.values().any(|(_, l)| l == r))
    {
        let change = within("the watch catches up", watch.next())
            .await
            .expect("the watch goes on");
        assert!(
            change.revision > previous,
            "revision {} after {previous}: out of order",
            change.revision
        );
        previous = change.revision;
        let ChangeKind::Put(value) = change.kind else {
            panic!("only puts were written: {change:?}");
        };
        seen.insert(
            change.key,
            (
                String::from_utf8_lossy(&value).into_owned(),
                change.revision,
            ),
        );
        if previous == last {
            break;
        }
    }
    assert_eq!(
        seen, latest,
        "the latest write of every key, with its revision"
    );
    quiet(&mut watch).await;
}

async fn acknowledged_writes_survive_a_restart_and_revisions_go_on(b: &mut impl StoreBackend) {
    assert_eq!(lost_across_a_restart(b).await, Vec::<String>::new());
}

/// Writes (a burst of concurrent ones, then single ones, in two buckets, one of them with a
/// `max_age`), a restart, and then what is missing or wrong: every acknowledged write must be
/// there, each key at its revision, and new writes must go on above them.
async fn lost_across_a_restart(b: &mut impl StoreBackend) -> Vec<String> {
    let e = b.store("r1").await;
    e.ensure_bucket(BucketConfig::new("one")).await.unwrap();
    e.ensure_bucket(BucketConfig::with_max_age("two", Duration::from_secs(3600)))
        .await
        .unwrap();
    let burst = (0..32).map(|i| e.put("one", &format!("k{i}"), v(&format!("v{i}"))));
    let revisions: Vec<Revision> = within("the burst", futures_util::future::join_all(burst))
        .await
        .into_iter()
        .map(|r| r.expect("written"))
        .collect();
    let mut sorted = revisions.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=32).collect::<Vec<_>>(), "one revision each");
    // What each key must hold after the restart: a value at a revision, or nothing.
    let mut expected: std::collections::BTreeMap<(&str, String), Option<(String, Revision)>> = (0
        ..32)
        .map(|i| {
            let key = ("one", format!("k{i}"));
            (key, Some((format!("v{i}"), revisions[i])))
        })
        .collect();
    let r = e
        .update("one", "k0", v("again"), revisions[0])
        .await
        .unwrap();
    expected.insert(("one", "k0".into()), Some(("again".into(), r)));
    e.delete("one", "k1", None).await.unwrap();
    expected.insert(("one", "k1".into()), None);
    let r = e.create("two", "a", v("kept")).await.unwrap();
    expected.insert(("two", "a".into()), Some(("kept".into(), r)));
    let last_one = 34;
    let last_two = r;
    drop(e);

    b.restart().await;
    let mut lost = Vec::new();
    let e = b.store("r1").await;
    for ((bucket, key), want) in &expected {
        let got = within("a read after the restart", e.get(bucket, key)).await;
        let want = want
            .as_ref()
            .map(|(value, revision)| entry(key, value, *revision).expect("an entry"));
        if got != Ok(want.clone()) {
            lost.push(format!("{bucket}/{key}: {got:?}, not {want:?}"));
        }
    }
    match within("a write after the restart", e.put("one", "k1", v("back"))).await {
        Ok(r) if r == last_one + 1 => {}
        other => lost.push(format!(
            "a write after the restart is {other:?}: not revision {}",
            last_one + 1
        )),
    }
    match within("a create after the restart", e.create("two", "b", v("new"))).await {
        Ok(r) if r == last_two + 1 => {}
        other => lost.push(format!(
            "a create in the other bucket is {other:?}: not revision {}",
            last_two + 1
        )),
    }
    lost
}
