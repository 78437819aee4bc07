//! The store: keyed records in named buckets, with revisions, compare-and-set, expiry and
//! watches (issue 25). It is the key/value half of the cluster's engine
//! ([`crate::cluster::Engine`] is a [`Store`] with messaging beside it), and a single gateway
//! keeps what must outlive it through the same interface.
//!
//! Its engines: the embedded one on redb ([`redb::RedbStore`], one file in the gateway's state
//! directory, the default of a single gateway), NATS JetStream in a cluster
//! ([`crate::cluster::nats::NatsEngine`]), and the simulation's model
//! (`gateway_tests::engine_model`). The operations:
//!
//! - **Buckets** ([`Store::ensure_bucket`]), each with an optional `max_age` after which a key
//!   that was not written again expires.
//! - **Keys**: [`Store::get`], [`Store::create`] (fails if the key holds a value),
//!   [`Store::put`] (writes whatever the key holds), [`Store::update`] (compare-and-set on the
//!   key's revision), [`Store::delete`] (optionally compare-and-set), and [`Store::watch`] (the
//!   latest entry of every matching key, then every change).
//!
//! # The contract
//!
//! `tests/tests/engine_contract.rs` runs one set of tests against every engine; what it checks
//! is what callers may rely on:
//!
//! - **Revisions.** Every write (create, update, delete, and an expiry) gets the next revision
//!   of its bucket: one sequence per bucket, starting at 1, increasing by one per write (a
//!   refused write takes none), and never reused, also across a restart of the engine (a power
//!   cut included). A revision won by compare-and-set is therefore a fencing token (the
//!   directory's *epoch*).
//! - **Compare-and-set.** `update(key, value, expected)` succeeds only when `expected` is the
//!   revision of the key's latest write, where a key never written (or whose last trace has
//!   aged out) is at revision 0 and a deleted or expired key is at the revision of its delete
//!   or expiry. Otherwise it fails with [`EngineError::Conflict`] naming that revision.
//!   `create` succeeds when the key holds no value (never written, deleted, or expired) and
//!   fails with `Conflict` naming the value's revision otherwise. Decide ownership only by
//!   these writes: on a clustered NATS, [`Store::get`] may be answered by a follower and be
//!   stale.
//! - **Durability.** A write is acknowledged (its future resolves `Ok`) only once it is
//!   durable: it is there after the engine restarts, a power cut included. The embedded engine
//!   commits every acknowledged write with an fsync (several writes may share one, each
//!   acknowledged only after it); NATS does with `sync_interval: always` (see the README).
//! - **Expiry.** In a bucket with a `max_age`, a key not written for `max_age` expires: `get`
//!   no longer sees it, watchers see [`ChangeKind::Expired`], and it can be created again. It
//!   never expires earlier; NATS expires on a timer of its own, a fraction of a second later
//!   (the model and the embedded engine are exact, on tokio's clock, so under turmoil they
//!   follow simulated time). A deletion ages out the same way. The expiry marker itself goes
//!   silently after another `max_age`, and then the key is at revision 0 again. Ages count
//!   across a restart: a key written before it expires `max_age` after that write.
//! - **Watches** deliver changes in revision order, beginning with the latest write of every
//!   matching key that still exists (deletions and expiries included). A watcher that falls
//!   behind, or is cut off from the engine, may skip superseded revisions of a key (a bucket
//!   keeps only the latest write per key), but never sees them out of order, and always
//!   reaches the latest. A watch sees only acknowledged writes, and survives a restart of a
//!   networked engine (an embedded one's watches end with it).
//! - **Outages.** While the engine cannot be reached (or, embedded, cannot write its file)
//!   every operation fails with [`EngineError::Unavailable`], promptly. A write that fails that
//!   way may still have been applied: read, or retry by compare-and-set, before acting on it.
//!
//! # Names
//!
//! Bucket names are `[A-Za-z0-9_-]+`. Keys are tokens of `[-/_=A-Za-z0-9]` joined by dots
//! (`project.alpha`); in a watch's key filter a token may be `*` (any one token), and the last
//! may be `>` (one or more tokens). Anything else is [`EngineError::Invalid`], checked here,
//! before any engine sees it.

pub mod records;
pub mod redb;

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, Stream, StreamExt};

/// A bucket's write sequence number; see the module docs ("Revisions").
pub type Revision = u64;

/// What [`Store::ensure_bucket`] makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketConfig {
    pub name: String,
    /// How long a key lives after its last write; `None`: for ever. At least one second (the
    /// engine's resolution for expiry markers).
    pub max_age: Option<Duration>,
}

impl BucketConfig {
    /// A bucket whose keys live for ever.
    pub fn new(name: impl Into<String>) -> BucketConfig {
        BucketConfig {
            name: name.into(),
            max_age: None,
        }
    }

    /// A bucket whose keys expire `max_age` after their last write.
    pub fn with_max_age(name: impl Into<String>, max_age: Duration) -> BucketConfig {
        BucketConfig {
            name: name.into(),
            max_age: Some(max_age),
        }
    }

    /// Checks the name and the age.
    pub fn validate(&self) -> Result<(), EngineError> {
        check_bucket(&self.name)?;
        match self.max_age {
            Some(age) if age < MIN_MAX_AGE => Err(EngineError::Invalid(format!(
                "bucket {}: max_age {age:?} is below {MIN_MAX_AGE:?}",
                self.name
            ))),
            _ => Ok(()),
        }
    }
}

/// The shortest `max_age` a bucket may have.
pub const MIN_MAX_AGE: Duration = Duration::from_secs(1);

/// A key's value, as [`Store::get`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Bytes,
    pub revision: Revision,
}

/// One write, as a watch sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub revision: Revision,
    pub kind: ChangeKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created or updated with this value.
    Put(Bytes),
    /// Deleted by [`Store::delete`].
    Deleted,
    /// Not written for the bucket's `max_age`.
    Expired,
}

/// The failures of the store and of the cluster's engine. Each operation's docs say which it
/// gives; `NoResponders` and `Timeout` come only from the engine's messaging.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A compare-and-set or a create lost: the key is at `current_revision` (0: no trace).
    #[error("the key is at revision {current_revision}")]
    Conflict { current_revision: Revision },
    /// The bucket has not been made ([`Store::ensure_bucket`]).
    #[error("no bucket {0}")]
    BucketNotFound(String),
    /// Nobody subscribes to the request's subject.
    #[error("no responders on {0}")]
    NoResponders(String),
    /// No answer came within the request's timeout.
    #[error("no answer within the timeout")]
    Timeout,
    /// The engine cannot be reached now (embedded: its file cannot be written). A write may
    /// still have been applied.
    #[error("the engine is unavailable: {0}")]
    Unavailable(String),
    /// A name that breaks the rules in the module docs, or a bucket setting out of range.
    #[error("invalid: {0}")]
    Invalid(String),
    /// Anything else the engine refused, with its reason.
    #[error("the engine refused: {0}")]
    Other(String),
}

/// Keyed records with revisions, compare-and-set, expiry and watches. See the module docs for
/// the contract.
///
/// Futures are `'static` (arguments are copied in), so a caller may spawn them. Implementations
/// use only `tokio::time`, tokio tasks and tokio's blocking pool, never threads of their own.
pub trait Store: Send + Sync + 'static {
    /// Makes the bucket, or changes an existing one to `config` (the last call wins). A
    /// `max_age` may change but, once set, not be removed (NATS refuses: [`EngineError::Other`]).
    fn ensure_bucket(&self, config: BucketConfig) -> BoxFuture<'static, Result<(), EngineError>>;

    /// The key's value, `None` when it has none (never written, deleted or expired).
    fn get(
        &self,
        bucket: &str,
        key: &str,
    ) -> BoxFuture<'static, Result<Option<Entry>, EngineError>>;

    /// Writes the key only when it holds no value; its new revision, or `Conflict` naming the
    /// value's.
    fn create(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>>;

    /// Writes the key whatever it holds (last writer wins); its new revision. For state that
    /// one writer owns at a time (a session's record), never for ownership itself.
    fn put(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
    ) -> BoxFuture<'static, Result<Revision, EngineError>>;

    /// Writes the key only when its latest write is at `expected` (0: none); its new revision,
    /// or `Conflict` naming the current one.
    fn update(
        &self,
        bucket: &str,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'static, Result<Revision, EngineError>>;

    /// Deletes the key (a write of its own, with a revision), when `expected` is `None` or the
    /// revision of its latest write; else `Conflict`.
    fn delete(
        &self,
        bucket: &str,
        key: &str,
        expected: Option<Revision>,
    ) -> BoxFuture<'static, Result<Revision, EngineError>>;

    /// The keys matching `filter` (a key, or a pattern with `*` and `>`): the latest write of
    /// each, then every change, in revision order.
    fn watch(&self, bucket: &str, filter: &str) -> BoxFuture<'static, Result<Watch, EngineError>>;
}

/// The changes of a watch ([`Store::watch`]); it ends only when the engine client is gone.
pub struct Watch(BoxStream<'static, Change>);

impl Watch {
    /// Wraps an implementation's stream.
    pub fn new(changes: impl Stream<Item = Change> + Send + 'static) -> Watch {
        Watch(changes.boxed())
    }

    /// The next change.
    pub async fn next(&mut self) -> Option<Change> {
        self.0.next().await
    }
}

impl Stream for Watch {
    type Item = Change;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Change>> {
        self.0.poll_next_unpin(cx)
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Watch")
    }
}

// Names. Every engine calls these before anything else, so they refuse the same names.

/// A bucket name: `[A-Za-z0-9_-]+`.
pub fn check_bucket(name: &str) -> Result<(), EngineError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then_some(())
        .ok_or_else(|| EngineError::Invalid(format!("bucket name {name:?}")))
}

/// A key: tokens of `[-/_=A-Za-z0-9]` joined by dots.
pub fn check_key(key: &str) -> Result<(), EngineError> {
    let ok = tokens_ok(key, |t, _| t.bytes().all(key_byte));
    ok.then_some(())
        .ok_or_else(|| EngineError::Invalid(format!("key {key:?}")))
}

/// A watch's key filter: a key whose tokens may be `*`, the last one `>`.
pub fn check_key_filter(filter: &str) -> Result<(), EngineError> {
    let ok = tokens_ok(filter, |t, last| {
        t == "*" || (t == ">" && last) || t.bytes().all(key_byte)
    });
    ok.then_some(())
        .ok_or_else(|| EngineError::Invalid(format!("key filter {filter:?}")))
}

/// Whether `subject` (a key, or a subject: no wildcards) matches `pattern` (a key filter or a
/// subscription: `*` one token, a last `>` one or more), as NATS matches them.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for p in pattern.split('.') {
        match (p, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (p, Some(s)) if p == s => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

/// Whether `s` is non-empty tokens joined by dots, each passing `token_ok(token, is_last)`.
pub(crate) fn tokens_ok(s: &str, token_ok: impl Fn(&str, bool) -> bool) -> bool {
    let count = s.split('.').count();
    !s.is_empty()
        && s.split('.')
            .enumerate()
            .all(|(i, t)| !t.is_empty() && token_ok(t, i + 1 == count))
}

fn key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_' | b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rules() {
        for ok in ["directory", "sessions_2", "a-b"] {
            assert_eq!(check_bucket(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a.b", "a b", "a*", "é"] {
            assert!(check_bucket(bad).is_err(), "{bad:?}");
        }
        for ok in ["alpha", "project.alpha", "a/b=c-d_e.F9"] {
            assert_eq!(check_key(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "a b", "a*", "a.>", "a:b"] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
        for ok in [">", "project.*", "project.>", "*.a.>", "a"] {
            assert_eq!(check_key_filter(ok), Ok(()), "{ok}");
        }
        for bad in ["", ">.a", "a.>.b", "a.b*", "a..b"] {
            assert!(check_key_filter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wildcards_match_like_nats() {
        let cases = [
            ("a.b", "a.b", true),
            ("a.b", "a.b.c", false),
            ("a.*", "a.b", true),
            ("a.*", "a.b.c", false),
            ("a.*", "a", false),
            ("a.>", "a.b.c", true),
            ("a.>", "a", false),
            (">", "a", true),
            ("*.b.>", "x.b.y", true),
            ("*.b.>", "x.c.y", false),
        ];
        for (pattern, subject, want) in cases {
            assert_eq!(
                subject_matches(pattern, subject),
                want,
                "{pattern} ~ {subject}"
            );
        }
    }
}
