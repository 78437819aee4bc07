//! The cluster engine: the narrow interface replicas use to share state and talk to each other.
//!
//! Replicas of the gateway (issue 15) keep what they share in an *engine*: NATS in production
//! ([`nats::NatsEngine`]), a model of it in the simulation (`gateway_tests::engine_model`).
//! Both implement [`Engine`], whose operations are exactly what the replicas need:
//!
//! - **Key/value in named buckets** ([`Engine::ensure_bucket`]), each with an optional
//!   `max_age` after which a key that was not written again expires: [`Engine::get`],
//!   [`Engine::create`] (fails if the key holds a value), [`Engine::put`] (writes whatever the
//!   key holds), [`Engine::update`] (compare-and-set on
//!   the key's revision), [`Engine::delete`] (optionally compare-and-set), and
//!   [`Engine::watch`] (the latest entry of every matching key, then every change).
//! - **Messages on subjects**: [`Engine::request`] (one answer, within a timeout, or
//!   [`EngineError::NoResponders`] at once when nobody subscribes), [`Engine::subscribe`] (to
//!   serve requests or hear broadcasts), and [`Engine::publish`] (to answer a request, or to
//!   broadcast).
//!
//! # The contract
//!
//! `tests/tests/engine_contract.rs` runs one set of tests against both implementations; what it
//! checks is what callers may rely on:
//!
//! - **Revisions.** Every write (create, update, delete, and an expiry) gets the next revision
//!   of its bucket: one sequence per bucket, starting at 1, increasing by one per write (a
//!   refused write takes none), and never reused, also across an engine restart. A revision
//!   won by compare-and-set is therefore a fencing token (the directory's *epoch*).
//! - **Compare-and-set.** `update(key, value, expected)` succeeds only when `expected` is the
//!   revision of the key's latest write, where a key never written (or whose last trace has
//!   aged out) is at revision 0 and a deleted or expired key is at the revision of its delete
//!   or expiry. Otherwise it fails with [`EngineError::Conflict`] naming that revision.
//!   `create` succeeds when the key holds no value (never written, deleted, or expired) and
//!   fails with `Conflict` naming the value's revision otherwise. Decide ownership only by
//!   these writes: on a clustered NATS, [`Engine::get`] may be answered by a follower and be
//!   stale.
//! - **Expiry.** In a bucket with a `max_age`, a key not written for `max_age` expires: `get`
//!   no longer sees it, watchers see [`ChangeKind::Expired`], and it can be created again. It
//!   never expires earlier; NATS expires on a timer of its own, a fraction of a second later
//!   (the model is exact, on tokio's clock, so under turmoil it follows simulated time). A
//!   deletion ages out the same way. The expiry marker itself goes silently after another
//!   `max_age`, and then the key is at revision 0 again.
//! - **Watches** deliver changes in revision order, beginning with the latest write of every
//!   matching key that still exists (deletions and expiries included). A watcher that falls
//!   behind, or is cut off from the engine, may skip superseded revisions of a key (a bucket
//!   keeps only the latest write per key), but never sees them out of order, and always
//!   reaches the latest. A watch survives an engine restart.
//! - **Requests.** A request goes to every subscriber of its subject and takes the first
//!   answer; with no subscriber it fails at once with [`EngineError::NoResponders`], without
//!   an answer within its timeout with [`EngineError::Timeout`]. A subscription is in place
//!   when [`Engine::subscribe`] returns (for clients of the same NATS server; across a NATS
//!   cluster, interest spreads a moment later), ends when dropped, and is resumed by the
//!   client after an engine restart. Messages are delivered at most once: one published while
//!   a subscriber is cut off is lost to it.
//! - **Outages.** While the engine cannot be reached every operation fails with
//!   [`EngineError::Unavailable`], promptly (the client's connection state says so). A write
//!   that fails that way may still have been applied: read, or retry by compare-and-set,
//!   before acting on it.
//!
//! # Names
//!
//! Bucket names are `[A-Za-z0-9_-]+`. Keys are tokens of `[-/_=A-Za-z0-9]` joined by dots
//! (`project.alpha`). Subjects are non-empty tokens of printable ASCII but space, `*` and `>`,
//! joined by dots; in a subscription or a watch's key filter a token may be `*` (any one
//! token), and the last may be `>` (one or more tokens). Anything else is
//! [`EngineError::Invalid`], checked here, before either implementation sees it.

pub mod nats;
pub mod nats_auth;
pub mod relay;
pub mod replica;
pub mod seal;

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, Stream, StreamExt};

/// A bucket's write sequence number; see the module docs ("Revisions").
pub type Revision = u64;

/// What [`Engine::ensure_bucket`] makes.
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

/// A key's value, as [`Engine::get`] reads it.
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
    /// Deleted by [`Engine::delete`].
    Deleted,
    /// Not written for the bucket's `max_age`.
    Expired,
}

/// A message on a subject, as a subscription receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    pub subject: String,
    pub payload: Bytes,
    /// Where the answer goes ([`Engine::publish`] to it), when this is a request.
    pub reply: Option<String>,
}

/// The engine's failures. Each operation's docs say which it gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A compare-and-set or a create lost: the key is at `current_revision` (0: no trace).
    #[error("the key is at revision {current_revision}")]
    Conflict { current_revision: Revision },
    /// The bucket has not been made ([`Engine::ensure_bucket`]).
    #[error("no bucket {0}")]
    BucketNotFound(String),
    /// Nobody subscribes to the request's subject.
    #[error("no responders on {0}")]
    NoResponders(String),
    /// No answer came within the request's timeout.
    #[error("no answer within the timeout")]
    Timeout,
    /// The engine cannot be reached now. A write may still have been applied.
    #[error("the engine is unavailable: {0}")]
    Unavailable(String),
    /// A name that breaks the rules in the module docs, or a bucket setting out of range.
    #[error("invalid: {0}")]
    Invalid(String),
    /// Anything else the engine refused, with its reason.
    #[error("the engine refused: {0}")]
    Other(String),
}

/// The operations replicas need from the engine. See the module docs for the contract.
///
/// Futures are `'static` (arguments are copied in), so a caller may spawn them. Implementations
/// use only `tokio::time` and tokio tasks, never threads of their own.
pub trait Engine: Send + Sync + 'static {
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

    /// Sends `payload` to every subscriber of `subject`, at most once, with no answer.
    fn publish(&self, subject: &str, payload: Bytes)
        -> BoxFuture<'static, Result<(), EngineError>>;

    /// Sends `payload` to the subscribers of `subject` and waits up to `timeout` for the first
    /// answer. [`EngineError::Unavailable`] means nothing was sent (the engine could not be
    /// reached); once the request may have gone out, a missing answer is
    /// [`EngineError::Timeout`] or [`EngineError::Other`], never `Unavailable`: a relayed
    /// call's answer to its client (`not_sent` or `unknown`) depends on it.
    fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, EngineError>>;

    /// The messages on `subject` (a pattern with `*` and `>` allowed), from the moment this
    /// returns until the subscription is dropped.
    fn subscribe(&self, subject: &str) -> BoxFuture<'static, Result<Subscription, EngineError>>;
}

/// The changes of a watch ([`Engine::watch`]); it ends only when the engine client is gone.
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

/// The messages of a subscription ([`Engine::subscribe`]); dropping it unsubscribes.
pub struct Subscription(BoxStream<'static, Incoming>);

impl Subscription {
    /// Wraps an implementation's stream; dropping the stream must unsubscribe.
    pub fn new(messages: impl Stream<Item = Incoming> + Send + 'static) -> Subscription {
        Subscription(messages.boxed())
    }

    /// The next message.
    pub async fn next(&mut self) -> Option<Incoming> {
        self.0.next().await
    }
}

impl Stream for Subscription {
    type Item = Incoming;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Incoming>> {
        self.0.poll_next_unpin(cx)
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Subscription")
    }
}

// Names. Both implementations call these before anything else, so they refuse the same names.

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

/// A subject to publish or send a request to: non-empty tokens of printable non-space ASCII,
/// with no wildcard.
pub fn check_subject(subject: &str) -> Result<(), EngineError> {
    let ok = tokens_ok(subject, |t, _| t.bytes().all(subject_byte));
    ok.then_some(())
        .ok_or_else(|| EngineError::Invalid(format!("subject {subject:?}")))
}

/// A subject to subscribe to: like [`check_subject`], with `*` tokens and a last `>`.
pub fn check_subject_pattern(pattern: &str) -> Result<(), EngineError> {
    let ok = tokens_ok(pattern, |t, last| {
        t == "*" || (t == ">" && last) || t.bytes().all(subject_byte)
    });
    ok.then_some(())
        .ok_or_else(|| EngineError::Invalid(format!("subject pattern {pattern:?}")))
}

/// Whether `subject` (no wildcards) matches `pattern` (`*` one token, a last `>` one or more).
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
fn tokens_ok(s: &str, token_ok: impl Fn(&str, bool) -> bool) -> bool {
    let count = s.split('.').count();
    !s.is_empty()
        && s.split('.')
            .enumerate()
            .all(|(i, t)| !t.is_empty() && token_ok(t, i + 1 == count))
}

fn key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_' | b'=')
}

/// Printable ASCII but the wildcards, which are never part of a literal subject here.
fn subject_byte(b: u8) -> bool {
    b.is_ascii_graphic() && b != b'*' && b != b'>'
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
        for ok in ["gw.replica.r1.call", "_INBOX.x7.1", "a:b"] {
            assert_eq!(check_subject(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a.*", "a.>", "a b", "a..b", ".a", "a\n"] {
            assert!(check_subject(bad).is_err(), "{bad:?}");
        }
        for ok in ["a.*.c", "a.>", ">", "*"] {
            assert_eq!(check_subject_pattern(ok), Ok(()), "{ok}");
        }
        for bad in ["a.>.c", "a*", "a.b>", ""] {
            assert!(check_subject_pattern(bad).is_err(), "{bad:?}");
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
