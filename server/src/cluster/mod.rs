//! The cluster engine: the narrow interface replicas use to share state and talk to each other.
//!
//! Replicas of the gateway (issue 15) keep what they share in an *engine*: NATS in production
//! ([`nats::NatsEngine`]), a model of it in the simulation (`gateway_tests::engine_model`).
//! Both implement [`Engine`], whose operations are exactly what the replicas need:
//!
//! - **Key/value in named buckets**: the engine is a [`Store`] (`crate::store`, whose docs hold
//!   the key/value half of the contract: revisions, compare-and-set, durability, expiry,
//!   watches, outages), the interface a single gateway keeps its state through too.
//! - **Messages on subjects**: [`Engine::request`] (one answer, within a timeout, or
//!   [`EngineError::NoResponders`] at once when nobody subscribes), [`Engine::subscribe`] (to
//!   serve requests or hear broadcasts), and [`Engine::publish`] (to answer a request, or to
//!   broadcast).
//!
//! # The contract
//!
//! `tests/tests/engine_contract.rs` runs one set of tests against both implementations; what it
//! checks is what callers may rely on. Beside the store's contract (`crate::store`):
//!
//! - **Requests.** A request goes to every subscriber of its subject and takes the first
//!   answer; with no subscriber it fails at once with [`EngineError::NoResponders`], without
//!   an answer within its timeout with [`EngineError::Timeout`]. A subscription is in place
//!   when [`Engine::subscribe`] returns (for clients of the same NATS server; across a NATS
//!   cluster, interest spreads a moment later), ends when dropped, and is resumed by the
//!   client after an engine restart. Messages are delivered at most once: one published while
//!   a subscriber is cut off is lost to it.
//! - **Outages.** While the engine cannot be reached every operation fails with
//!   [`EngineError::Unavailable`], promptly (the client's connection state says so). A request
//!   that fails that way was not sent.
//!
//! # Names
//!
//! Bucket names and keys follow the store's rules (`crate::store`). Subjects are non-empty
//! tokens of printable ASCII but space, `*` and `>`, joined by dots; in a subscription a token
//! may be `*` (any one token), and the last may be `>` (one or more tokens). Anything else is
//! [`EngineError::Invalid`], checked here, before either implementation sees it.

pub mod nats;
pub mod nats_auth;
pub mod outcomes;
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

pub use crate::store::{
    check_bucket, check_key, check_key_filter, subject_matches, BucketConfig, Change, ChangeKind,
    EngineError, Entry, Revision, Store, Watch, MIN_MAX_AGE,
};

/// A message on a subject, as a subscription receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    pub subject: String,
    pub payload: Bytes,
    /// Where the answer goes ([`Engine::publish`] to it), when this is a request.
    pub reply: Option<String>,
}

/// The operations replicas need from the engine: a [`Store`], and messages. See the module
/// docs for the contract.
///
/// Futures are `'static` (arguments are copied in), so a caller may spawn them. Implementations
/// use only `tokio::time` and tokio tasks, never threads of their own.
pub trait Engine: Store {
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

// Subjects. Both implementations call these before anything else, so they refuse the same
// subjects.

/// A subject to publish or send a request to: non-empty tokens of printable non-space ASCII,
/// with no wildcard.
pub fn check_subject(subject: &str) -> Result<(), EngineError> {
    let ok = crate::store::tokens_ok(subject, |t, _| t.bytes().all(subject_byte));
    ok.then_some(())
        .ok_or_else(|| EngineError::Invalid(format!("subject {subject:?}")))
}

/// A subject to subscribe to: like [`check_subject`], with `*` tokens and a last `>`.
pub fn check_subject_pattern(pattern: &str) -> Result<(), EngineError> {
    let ok = crate::store::tokens_ok(pattern, |t, last| {
        t == "*" || (t == ">" && last) || t.bytes().all(subject_byte)
    });
    ok.then_some(())
        .ok_or_else(|| EngineError::Invalid(format!("subject pattern {pattern:?}")))
}

/// Printable ASCII but the wildcards, which are never part of a literal subject here.
fn subject_byte(b: u8) -> bool {
    b.is_ascii_graphic() && b != b'*' && b != b'>'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_rules() {
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
}
