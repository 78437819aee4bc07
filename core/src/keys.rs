//! The gateway's key hierarchy (where-the-issues-meet §1, §2): one secret, a subkey per
//! purpose, and what replicas seal with them so that nothing in the engine is taken on its
//! word alone (security review findings 1–4).
//!
//! - **The secret** ([`GatewaySecret`]): 32 random bytes. In a cluster it is the cluster secret,
//!   the same on every replica, given from a file or the environment and never written to the
//!   engine. During a roll a replica also holds the previous one ([`KeyRing::new`]): what was
//!   sealed under it is still accepted, and everything new is sealed under the current one.
//! - **Subkeys**: HKDF-SHA-256 of the secret, one fixed label per purpose ([`Purpose`]); no
//!   purpose uses the secret itself, and no two share a subkey. Each secret also has a short
//!   public *key id*, which every sealed item names, so a receiver picks the key at once.
//! - **Values** a replica writes to a bucket ([`KeyRing::seal_value`]): a MAC over the bucket,
//!   the key and a version counter kept in the value, so a value copied to another key fails,
//!   and [`Versions`] refuses one older than a version already seen for its key (an old claim
//!   or pin put back).
//! - **Messages** replicas send each other ([`KeyRing::seal_message`]): a MAC over a context
//!   the receiver knows (the subject it listens on, or the request a reply answers), a random
//!   nonce and an expiry. [`Replays`] refuses a nonce seen before its expiry, and every
//!   receiver refuses an expired message.
//!
//! Sealed items are text headers before the payload, so `nats kv get` still shows what is
//! there: `mgw1 <key id> <version> <tag>\n<payload>` for a value and
//! `mgw1 <key id> <nonce> <expiry> <tag>\n<payload>` for a message (hex, the expiry in
//! milliseconds since the Unix epoch). The tag is HMAC-SHA-256 over a label and every field,
//! each length-prefixed, compared in constant time.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::agents::{hex, unhex, AgentKey};

/// How long a sealed message is valid after it is made: the longest a replica's clock may be
/// off from another's plus the longest a message may take. A replica keeps the nonces it has
/// seen this long.
pub const MESSAGE_LIFETIME: Duration = Duration::from_secs(30);

/// The gateway secret: 32 bytes, written as 64 hex digits. Its `Debug` shows only its key id.
#[derive(Clone, PartialEq, Eq)]
pub struct GatewaySecret([u8; 32]);

impl std::fmt::Debug for GatewaySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GatewaySecret(key id {})", self.key_id())
    }
}

/// Why a secret's text was refused. Never holds the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a gateway secret is 64 hex digits (32 random bytes), and this text has {0} characters; make one with `openssl rand -hex 32`")]
    Length(usize),
    #[error("a gateway secret is 64 hex digits, and this text has a character that is not one")]
    NotHex,
    #[error("this gateway secret is all one byte: make a random one with `openssl rand -hex 32`")]
    NotRandom,
}

impl GatewaySecret {
    pub fn new(bytes: [u8; 32]) -> GatewaySecret {
        GatewaySecret(bytes)
    }

    /// Reads a secret written as 64 hex digits (surrounding white space ignored, as in a file
    /// that ends in a newline).
    pub fn parse(text: &str) -> Result<GatewaySecret, SecretError> {
        let text = text.trim();
        if text.len() != 64 {
            return Err(SecretError::Length(text.chars().count()));
        }
        let bytes = unhex(text).ok_or(SecretError::NotHex)?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| SecretError::NotHex)?;
        if bytes.iter().all(|b| *b == bytes[0]) {
            return Err(SecretError::NotRandom);
        }
        Ok(GatewaySecret(bytes))
    }

    /// The secret as 64 hex digits, as a secret file holds it.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The public name of this secret: 8 hex digits every sealed item carries.
    pub fn key_id(&self) -> KeyId {
        let mut id = [0u8; 4];
        id.copy_from_slice(&self.derive(Purpose::KeyId)[..4]);
        KeyId(id)
    }

    /// The subkey for `purpose`: HKDF-SHA-256 (RFC 5869) with no salt and the purpose's label.
    fn derive(&self, purpose: Purpose) -> [u8; 32] {
        let mut okm = [0u8; 32];
        hkdf::Hkdf::<Sha256>::new(None, &self.0)
            .expand(purpose.label().as_bytes(), &mut okm)
            .expect("32 bytes is a valid HKDF-SHA-256 output length");
        okm
    }
}

/// What a subkey is for. Each has its own label, so no two purposes share a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The secret's public key id.
    KeyId,
    /// MACs of the messages replicas send each other (relays, their answers, news).
    Messages,
    /// MACs of the values replicas write to the engine's buckets.
    Values,
    /// Agent handles every replica recognises.
    AgentHandles,
    /// The tags of task ids (`crate::tasks`): any replica routes and checks them.
    TaskIds,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::KeyId => "mcp-gateway v1 key id",
            Purpose::Messages => "mcp-gateway v1 cluster messages",
            Purpose::Values => "mcp-gateway v1 bucket values",
            Purpose::AgentHandles => "mcp-gateway v1 agent handles",
            Purpose::TaskIds => "mcp-gateway v1 task ids",
        }
    }
}

/// A secret's public name (the first 4 bytes of its `KeyId` subkey).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId([u8; 4]);

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// The subkeys of one secret.
#[derive(Clone)]
struct Keys {
    id: KeyId,
    messages: [u8; 32],
    values: [u8; 32],
    agents: AgentKey,
    tasks: crate::tasks::TaskKey,
}

impl Keys {
    fn of(secret: &GatewaySecret) -> Keys {
        Keys {
            id: secret.key_id(),
            messages: secret.derive(Purpose::Messages),
            values: secret.derive(Purpose::Values),
            agents: AgentKey::new(secret.derive(Purpose::AgentHandles)),
            tasks: crate::tasks::TaskKey::new(secret.key_id().0, secret.derive(Purpose::TaskIds)),
        }
    }
}

/// Why a sealed value or message was refused. Counted by the server per source and reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// Not a sealed item at all (no header, or a header that cannot be read).
    Malformed,
    /// Sealed under a key this replica does not hold.
    UnknownKey,
    /// The tag does not match: forged, altered, or sealed for another bucket, key or context.
    BadTag,
    /// A message past its expiry, or one whose expiry is further ahead than any honest
    /// replica makes.
    Expired,
    /// A message whose nonce was seen before.
    Replayed,
    /// A value older than one already seen for its key.
    RolledBack,
}

impl Refusal {
    /// The name in logs and in `/metrics`' `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::UnknownKey => "unknown_key",
            Refusal::BadTag => "bad_tag",
            Refusal::Expired => "expired",
            Refusal::Replayed => "replayed",
            Refusal::RolledBack => "rolled_back",
        }
    }
}

/// A message that verified: its nonce, its expiry, and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened<'a> {
    pub nonce: [u8; 16],
    pub expires_ms: u64,
    pub payload: &'a [u8],
}

/// The keys a replica seals and verifies with: the current secret's, and during a roll the
/// previous secret's too (accepted, never used to seal). Its `Debug` shows key ids only.
#[derive(Clone)]
pub struct KeyRing {
    current: Keys,
    previous: Option<Keys>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing")
            .field("current", &self.current.id)
            .field("previous", &self.previous.as_ref().map(|k| k.id))
            .finish()
    }
}

impl KeyRing {
    pub fn new(current: &GatewaySecret, previous: Option<&GatewaySecret>) -> KeyRing {
        KeyRing {
            current: Keys::of(current),
            previous: previous.filter(|p| *p != current).map(Keys::of),
        }
    }

    /// The key id new items are sealed under.
    pub fn current_id(&self) -> KeyId {
        self.current.id
    }

    /// The key agent handles are issued under, and the previous secret's, still recognised.
    pub fn agent_keys(&self) -> (AgentKey, Option<AgentKey>) {
        (
            self.current.agents.clone(),
            self.previous.as_ref().map(|k| k.agents.clone()),
        )
    }

    /// The key task ids are made under, and the previous secret's, still opened.
    pub fn task_keys(&self) -> (crate::tasks::TaskKey, Option<crate::tasks::TaskKey>) {
        (
            self.current.tasks.clone(),
            self.previous.as_ref().map(|k| k.tasks.clone()),
        )
    }

    fn keys(&self, id: &[u8]) -> Option<&Keys> {
        std::iter::once(&self.current)
            .chain(self.previous.as_ref())
            .find(|k| k.id.0 == id)
    }

    /// Whether `sealed` names the previous secret's key id: during a roll, a value that
    /// verified under the previous secret, which its writer is to write again under the
    /// current one before the previous secret is dropped.
    pub fn under_previous(&self, sealed: &[u8]) -> bool {
        let Some(previous) = &self.previous else {
            return false;
        };
        header::<3>(sealed)
            .ok()
            .and_then(|(fields, _)| fixed_hex::<4>(fields[0]))
            .is_some_and(|id| id == previous.id.0)
    }

    /// `payload` sealed for `key` of `bucket` at `version`.
    pub fn seal_value(&self, bucket: &str, key: &str, version: u64, payload: &[u8]) -> Vec<u8> {
        let k = &self.current;
        let tag = if authenticated() {
            value_tag(&k.values, bucket, key, version, payload)
        } else {
            [0; 32]
        };
        sealed(&[&k.id.0, &[], &tag], version, payload)
    }

    /// The version and payload of a value read from `key` of `bucket`, if it was sealed there
    /// by a holder of a key this ring has.
    pub fn open_value<'a>(
        &self,
        bucket: &str,
        key: &str,
        sealed: &'a [u8],
    ) -> Result<(u64, &'a [u8]), Refusal> {
        let (fields, payload) = header::<3>(sealed)?;
        let keys = self.keys(&fixed_hex::<4>(fields[0]).ok_or(Refusal::Malformed)?);
        let version = u64::from_str_radix(fields[1], 16).map_err(|_| Refusal::Malformed)?;
        let tag = tag_of(fields[2])?;
        let keys = keys.ok_or(Refusal::UnknownKey)?;
        if authenticated()
            && !constant_time_eq(
                &value_tag(&keys.values, bucket, key, version, payload),
                &tag,
            )
        {
            return Err(Refusal::BadTag);
        }
        Ok((version, payload))
    }

    /// `payload` sealed for `context` (what the receiver knows the message is for), with a
    /// random `nonce`, valid until `now_ms` + [`MESSAGE_LIFETIME`].
    pub fn seal_message(
        &self,
        context: &str,
        nonce: [u8; 16],
        now_ms: u64,
        payload: &[u8],
    ) -> Vec<u8> {
        let k = &self.current;
        let expires_ms = now_ms.saturating_add(MESSAGE_LIFETIME.as_millis() as u64);
        let tag = if authenticated() {
            message_tag(&k.messages, context, &nonce, expires_ms, payload)
        } else {
            [0; 32]
        };
        sealed(&[&k.id.0, &nonce, &tag], expires_ms, payload)
    }

    /// A message received for `context` at `now_ms`, if a holder of a key this ring has
    /// sealed it for that context and it has not expired. Replays are [`Replays`]' to refuse.
    pub fn open_message<'a>(
        &self,
        context: &str,
        now_ms: u64,
        sealed: &'a [u8],
    ) -> Result<Opened<'a>, Refusal> {
        let (fields, payload) = header::<4>(sealed)?;
        let keys = self.keys(&fixed_hex::<4>(fields[0]).ok_or(Refusal::Malformed)?);
        let nonce: [u8; 16] = fixed_hex(fields[1]).ok_or(Refusal::Malformed)?;
        let expires_ms = u64::from_str_radix(fields[2], 16).map_err(|_| Refusal::Malformed)?;
        let tag = tag_of(fields[3])?;
        let keys = keys.ok_or(Refusal::UnknownKey)?;
        if authenticated()
            && !constant_time_eq(
                &message_tag(&keys.messages, context, &nonce, expires_ms, payload),
                &tag,
            )
        {
            return Err(Refusal::BadTag);
        }
        let lifetime = MESSAGE_LIFETIME.as_millis() as u64;
        // Made more than a lifetime ahead of this clock: no honest replica's clock is that far
        // off, and accepting it would keep its nonce for longer than a lifetime.
        if now_ms > expires_ms || expires_ms > now_ms.saturating_add(2 * lifetime) {
            return Err(Refusal::Expired);
        }
        Ok(Opened {
            nonce,
            expires_ms,
            payload,
        })
    }
}

/// The nonces of the messages a replica accepted, each until its expiry: a message seen once
/// is refused the second time (where-the-issues-meet §2). Bounded by what honest replicas send
/// in [`MESSAGE_LIFETIME`] and a little more (every entry is verified before it is kept, and
/// none lives longer than two lifetimes).
#[derive(Debug, Default)]
pub struct Replays {
    seen: HashMap<[u8; 16], u64>,
    /// The same nonces by expiry, to forget them in order.
    by_expiry: BTreeMap<(u64, [u8; 16]), ()>,
}

impl Replays {
    pub fn new() -> Replays {
        Replays::default()
    }

    /// Accepts a verified message's nonce at `now_ms`, or refuses it as a replay.
    pub fn handle_message(&mut self, now_ms: u64, opened: &Opened<'_>) -> Result<(), Refusal> {
        self.forget(now_ms);
        if self.seen.contains_key(&opened.nonce) {
            return Err(Refusal::Replayed);
        }
        self.seen.insert(opened.nonce, opened.expires_ms);
        self.by_expiry.insert((opened.expires_ms, opened.nonce), ());
        Ok(())
    }

    /// Forgets the nonces of the messages expired at `now_ms`: they are refused as expired.
    pub fn forget(&mut self, now_ms: u64) {
        while let Some((&(expires, nonce), _)) = self.by_expiry.first_key_value() {
            if expires >= now_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.seen.remove(&nonce);
        }
    }

    /// How many nonces are kept.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// The highest version seen of each key of one bucket: a value older than one seen is refused
/// (an old value put back), and a replica writes each key at a version above any it has seen.
/// Versions are microseconds of wall time, or one more than the highest seen when that is
/// higher, so a replica that has seen a key's latest value writes a newer one even when its
/// clock is behind. Only verified values are kept, so the table holds honest keys only.
///
/// What a replica wrote itself counts as seen only once it reads it back: a write that lost
/// its compare-and-set (another replica's claim beat it) is not in the engine, and a value
/// below it, the one that won, is not an old value put back (a stopping replica's refresh
/// raced a handover's claim: seed 0 of the graceful-stop sweep refused the claim, and the
/// stopping replica took its project back).
#[derive(Debug, Default)]
pub struct Versions {
    highest: HashMap<String, u64>,
    /// The version of each key's last write of this replica's, seen back or not.
    written: HashMap<String, u64>,
}

impl Versions {
    pub fn new() -> Versions {
        Versions::default()
    }

    /// A verified value of `key` at `version`: accepted (and remembered) unless a higher
    /// version of the key was seen. The same version again is accepted: a watch may deliver
    /// the latest value once more after a reconnect.
    pub fn handle_value(&mut self, key: &str, version: u64) -> Result<(), Refusal> {
        match self.highest.get_mut(key) {
            Some(h) if *h > version => Err(Refusal::RolledBack),
            Some(h) => {
                *h = version;
                Ok(())
            }
            None => {
                self.highest.insert(key.to_owned(), version);
                Ok(())
            }
        }
    }

    /// The version to write `key` at, at `now_us` (microseconds of wall time); remembered.
    pub fn next(&mut self, key: &str, now_us: u64) -> u64 {
        let seen = self.highest.get(key).copied().unwrap_or(0);
        let w = self.written.entry(key.to_owned()).or_insert(0);
        *w = now_us.max(seen.saturating_add(1)).max(w.saturating_add(1));
        *w
    }

    /// Forgets the keys last seen at or before `before_us`: in a bucket whose values expire
    /// after a while, a value that old is refused anyway ([`Versions::too_old`]).
    pub fn forget_before(&mut self, before_us: u64) {
        self.highest.retain(|_, v| *v > before_us);
        self.written.retain(|_, v| *v > before_us);
    }

    /// Whether a value at `version` is older than a bucket whose values live `max_age`
    /// keeps at `now_us`, with `MESSAGE_LIFETIME` of leeway for the writer's clock: such a
    /// value can only have been put back.
    pub fn too_old(version: u64, now_us: u64, max_age: Duration) -> bool {
        let window = (max_age + MESSAGE_LIFETIME).as_micros() as u64;
        version < now_us.saturating_sub(window)
    }

    pub fn len(&self) -> usize {
        self.highest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.highest.is_empty()
    }
}

type HmacSha256 = Hmac<Sha256>;

fn field(mac: &mut HmacSha256, bytes: &[u8]) {
    mac.update(&(bytes.len() as u64).to_be_bytes());
    mac.update(bytes);
}

/// Set by [`set_unauthenticated_for_bench`].
#[cfg(feature = "insecure-unauthenticated-cluster-bench")]
static UNAUTHENTICATED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns cluster authentication off for this process: only in a build with the
/// `insecure-unauthenticated-cluster-bench` feature, which exists so that a benchmark can set
/// the relay with authentication against the same binary without it (BENCHMARKS.md); such a
/// process must never serve anyone.
#[cfg(feature = "insecure-unauthenticated-cluster-bench")]
pub fn set_unauthenticated_for_bench() {
    UNAUTHENTICATED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether cluster items are MAC'd and verified: always, but in a process of a build with the
/// `insecure-unauthenticated-cluster-bench` feature that turned it off.
#[inline]
pub fn authenticated() -> bool {
    #[cfg(feature = "insecure-unauthenticated-cluster-bench")]
    if UNAUTHENTICATED.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    true
}

fn value_tag(key: &[u8; 32], bucket: &str, name: &str, version: u64, payload: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    field(&mut mac, b"value");
    field(&mut mac, bucket.as_bytes());
    field(&mut mac, name.as_bytes());
    field(&mut mac, &version.to_be_bytes());
    field(&mut mac, payload);
    mac.finalize().into_bytes().into()
}

fn message_tag(
    key: &[u8; 32],
    context: &str,
    nonce: &[u8; 16],
    expires_ms: u64,
    payload: &[u8],
) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    field(&mut mac, b"message");
    field(&mut mac, context.as_bytes());
    field(&mut mac, nonce);
    field(&mut mac, &expires_ms.to_be_bytes());
    field(&mut mac, payload);
    mac.finalize().into_bytes().into()
}

/// A sealed item: `mgw1`, the key id, the nonce (a value has none), the number (a value's
/// version, a message's expiry) and the tag, the first and last two in hex, then a newline
/// and the payload. Made in one allocation: every relay seals twice (where-the-issues-meet
/// §2's budget for the relayed call).
fn sealed(hexed: &[&[u8]; 3], number: u64, payload: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let [id, nonce, tag] = *hexed;
    let mut out = Vec::with_capacity(128 + payload.len());
    out.extend_from_slice(b"mgw1");
    push_hex(&mut out, id);
    push_hex(&mut out, nonce);
    write!(out, " {number:x}").expect("writing to a Vec cannot fail");
    push_hex(&mut out, tag);
    out.push(b'\n');
    out.extend_from_slice(payload);
    out
}

/// A space and `bytes` in lower-case hex, appended to `out` (nothing for no bytes).
fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let mut buf = [0u8; 64];
    let digits = &mut buf[..2 * bytes.len()];
    hex::encode_to_slice(bytes, digits).expect("64 digits hold the 32 bytes of a tag");
    out.push(b' ');
    out.extend_from_slice(digits);
}

/// `N` bytes from exactly `2 * N` hex digits.
fn fixed_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

/// The `N` fields of a sealed item's header (after `mgw1`) and its payload.
fn header<const N: usize>(sealed: &[u8]) -> Result<([&str; N], &[u8]), Refusal> {
    // A header is short: a longer first line is not one.
    let end = sealed
        .iter()
        .take(256)
        .position(|b| *b == b'\n')
        .ok_or(Refusal::Malformed)?;
    let line = std::str::from_utf8(&sealed[..end]).map_err(|_| Refusal::Malformed)?;
    let mut parts = line.split(' ');
    if parts.next() != Some("mgw1") {
        return Err(Refusal::Malformed);
    }
    let mut fields = [""; N];
    for field in &mut fields {
        *field = parts
            .next()
            .filter(|f| !f.is_empty())
            .ok_or(Refusal::Malformed)?;
    }
    if parts.next().is_some() {
        return Err(Refusal::Malformed);
    }
    Ok((fields, &sealed[end + 1..]))
}

fn tag_of(text: &str) -> Result<[u8; 32], Refusal> {
    fixed_hex(text).ok_or(Refusal::Malformed)
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_under_the_previous_secret_is_known_as_such() {
        let (old, new) = (secret(1), secret(2));
        let before = KeyRing::new(&old, None);
        let during = KeyRing::new(&new, Some(&old));
        let v = before.seal_value("pins", "p.alpha", 1, b"{}");
        assert!(during.open_value("pins", "p.alpha", &v).is_ok());
        assert!(during.under_previous(&v));
        assert!(!during.under_previous(&during.seal_value("pins", "p.alpha", 2, b"{}")));
        assert!(
            !before.under_previous(&v),
            "no previous secret: nothing is under it"
        );
        assert!(!during.under_previous(b"not sealed"));
    }

    /// The bytes on the wire stay as the module docs give them (replicas of two versions share
    /// a cluster during a rolling upgrade).
    #[test]
    fn sealed_items_are_the_documented_text_header_and_the_payload() {
        let ring = KeyRing::new(&secret(3), None);
        let k = &ring.current;
        let v = ring.seal_value("pins", "p.alpha", 0x1f, b"{}");
        let tag = value_tag(&k.values, "pins", "p.alpha", 0x1f, b"{}");
        assert_eq!(
            v,
            format!("mgw1 {} 1f {}\n{{}}", k.id, hex(&tag)).into_bytes()
        );
        let nonce = [0xab; 16];
        let m = ring.seal_message("relay", nonce, NOW, b"x");
        let expires = NOW + MESSAGE_LIFETIME.as_millis() as u64;
        let tag = message_tag(&k.messages, "relay", &nonce, expires, b"x");
        let text = format!("mgw1 {} {} {expires:x} {}\nx", k.id, hex(&nonce), hex(&tag));
        assert_eq!(m, text.into_bytes());
        // A header with a field too many, too few, or empty is not one.
        for bad in [
            "mgw1 a b c d e\nx",
            "mgw1 a b\nx",
            "mgw1 a  b c\nx",
            "mgw2 a b c\nx",
        ] {
            assert_eq!(
                ring.open_value("pins", "p.alpha", bad.as_bytes()),
                Err(Refusal::Malformed),
                "{bad}"
            );
        }
    }

    fn secret(b: u8) -> GatewaySecret {
        let mut bytes = [b; 32];
        bytes[0] = b.wrapping_add(1);
        GatewaySecret::new(bytes)
    }

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn a_secret_is_64_hex_digits_and_never_shown() {
        let s = secret(7);
        let text = s.to_hex();
        assert_eq!(GatewaySecret::parse(&format!("{text}\n")), Ok(s.clone()));
        assert_eq!(GatewaySecret::parse("abc"), Err(SecretError::Length(3)));
        assert_eq!(
            GatewaySecret::parse(&"g".repeat(64)),
            Err(SecretError::NotHex)
        );
        assert_eq!(
            GatewaySecret::parse(&"0".repeat(64)),
            Err(SecretError::NotRandom)
        );
        let shown = format!("{s:?} {:?}", KeyRing::new(&s, None));
        assert!(!shown.contains(&text[..16]), "{shown}");
        assert!(shown.contains(&s.key_id().to_string()));
    }

    #[test]
    fn each_purpose_has_its_own_subkey_and_each_secret_its_own_id() {
        let s = secret(1);
        let all = [
            Purpose::KeyId,
            Purpose::Messages,
            Purpose::Values,
            Purpose::AgentHandles,
            Purpose::TaskIds,
        ]
        .map(|p| s.derive(p));
        for (i, a) in all.iter().enumerate() {
            assert_ne!(a, &s.0, "a purpose uses the secret itself");
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_ne!(secret(1).key_id(), secret(2).key_id());
        assert_eq!(secret(1).key_id(), secret(1).key_id());
    }

    #[test]
    fn a_value_opens_only_under_its_bucket_and_key_and_unaltered() {
        let ring = KeyRing::new(&secret(1), None);
        let sealed = ring.seal_value("pins", "p.alpha", 42, b"{\"key\":1}");
        assert_eq!(
            ring.open_value("pins", "p.alpha", &sealed),
            Ok((42, &b"{\"key\":1}"[..]))
        );
        assert_eq!(
            ring.open_value("pins", "p.beta", &sealed),
            Err(Refusal::BadTag)
        );
        assert_eq!(
            ring.open_value("tools", "p.alpha", &sealed),
            Err(Refusal::BadTag)
        );
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() = b']';
        assert_eq!(
            ring.open_value("pins", "p.alpha", &altered),
            Err(Refusal::BadTag)
        );
        // The version is covered too.
        let text = String::from_utf8(sealed.clone()).unwrap();
        let bumped = text.replacen(" 2a ", " 2b ", 1);
        assert_eq!(
            ring.open_value("pins", "p.alpha", bumped.as_bytes()),
            Err(Refusal::BadTag)
        );
        assert_eq!(
            ring.open_value("pins", "p.alpha", b"{\"key\":1}"),
            Err(Refusal::Malformed)
        );
        let other = KeyRing::new(&secret(2), None);
        assert_eq!(
            other.open_value("pins", "p.alpha", &sealed),
            Err(Refusal::UnknownKey)
        );
    }

    #[test]
    fn a_message_opens_only_for_its_context_before_its_expiry() {
        let ring = KeyRing::new(&secret(1), None);
        let sealed = ring.seal_message("ns.relay.r2", [9; 16], NOW, b"hello");
        let opened = ring.open_message("ns.relay.r2", NOW + 1, &sealed).unwrap();
        assert_eq!(opened.payload, b"hello");
        assert_eq!(opened.nonce, [9; 16]);
        assert_eq!(
            ring.open_message("ns.relay.r3", NOW, &sealed),
            Err(Refusal::BadTag)
        );
        let lifetime = MESSAGE_LIFETIME.as_millis() as u64;
        assert!(ring
            .open_message("ns.relay.r2", NOW + lifetime, &sealed)
            .is_ok());
        assert_eq!(
            ring.open_message("ns.relay.r2", NOW + lifetime + 1, &sealed),
            Err(Refusal::Expired)
        );
        // Sealed by a replica whose clock is far ahead: refused, not kept for long.
        let ahead = ring.seal_message("ns.relay.r2", [8; 16], NOW + 2 * lifetime, b"x");
        assert_eq!(
            ring.open_message("ns.relay.r2", NOW, &ahead),
            Err(Refusal::Expired)
        );
        let stranger = KeyRing::new(&secret(3), None);
        assert_eq!(
            stranger.open_message("ns.relay.r2", NOW, &sealed),
            Err(Refusal::UnknownKey)
        );
    }

    #[test]
    fn during_a_roll_the_previous_secret_is_accepted_and_never_used_to_seal() {
        let (old, new) = (secret(1), secret(2));
        let before = KeyRing::new(&old, None);
        let rolling = KeyRing::new(&new, Some(&old));
        let after = KeyRing::new(&new, None);
        let v = before.seal_value("b", "k", 1, b"v");
        let m = before.seal_message("c", [1; 16], NOW, b"m");
        assert!(rolling.open_value("b", "k", &v).is_ok());
        assert!(rolling.open_message("c", NOW, &m).is_ok());
        // What the rolling replica seals, a replica that has only the new secret reads,
        // and one still on the old secret does not.
        let v2 = rolling.seal_value("b", "k", 2, b"v");
        assert!(after.open_value("b", "k", &v2).is_ok());
        assert_eq!(before.open_value("b", "k", &v2), Err(Refusal::UnknownKey));
        assert_eq!(after.open_value("b", "k", &v), Err(Refusal::UnknownKey));
        assert_eq!(rolling.current_id(), new.key_id());
        let (current, previous) = rolling.agent_keys();
        assert_eq!(current, after.agent_keys().0);
        assert_eq!(previous, Some(before.agent_keys().0));
    }

    #[test]
    fn a_nonce_is_refused_the_second_time_until_it_expires() {
        let ring = KeyRing::new(&secret(1), None);
        let mut replays = Replays::new();
        let sealed = ring.seal_message("c", [5; 16], NOW, b"m");
        let opened = ring.open_message("c", NOW, &sealed).unwrap();
        assert_eq!(replays.handle_message(NOW, &opened), Ok(()));
        assert_eq!(
            replays.handle_message(NOW + 10, &opened),
            Err(Refusal::Replayed)
        );
        let other = ring.seal_message("c", [6; 16], NOW, b"m");
        let other = ring.open_message("c", NOW, &other).unwrap();
        assert_eq!(replays.handle_message(NOW, &other), Ok(()));
        assert_eq!(replays.len(), 2);
        // Past their expiry they are forgotten (the message itself is refused as expired).
        replays.forget(opened.expires_ms + 1);
        assert!(replays.is_empty());
    }

    #[test]
    fn an_older_version_of_a_key_is_refused_once_a_newer_one_was_seen() {
        let mut v = Versions::new();
        assert_eq!(v.handle_value("p.alpha", 10), Ok(()));
        assert_eq!(v.handle_value("p.alpha", 10), Ok(()));
        assert_eq!(v.handle_value("p.alpha", 12), Ok(()));
        assert_eq!(v.handle_value("p.alpha", 11), Err(Refusal::RolledBack));
        assert_eq!(v.handle_value("p.beta", 1), Ok(()));
        // A writer whose clock is behind still writes above what it saw.
        assert_eq!(v.next("p.alpha", 5), 13);
        assert_eq!(v.next("p.alpha", 100), 100);
        assert_eq!(v.next("p.gamma", 7), 7);
        // A write of its own that did not land (it lost a compare-and-set) does not make the
        // value that won look old; its next write is still above both.
        assert_eq!(v.handle_value("p.gamma", 6), Ok(()));
        assert_eq!(v.next("p.gamma", 3), 8);
        // Its write of alpha at 100, read back.
        assert_eq!(v.handle_value("p.alpha", 100), Ok(()));
        v.forget_before(50);
        assert_eq!(v.len(), 1);
        let day = Duration::from_secs(86_400);
        assert!(Versions::too_old(1, 2 * day.as_micros() as u64, day));
        assert!(!Versions::too_old(
            day.as_micros() as u64,
            2 * day.as_micros() as u64,
            day
        ));
    }
}
