//! What a replica writes to the engine and sends other replicas, sealed under the cluster
//! secret, and what it reads and hears, verified before anything acts on it. The rules are the
//! core's (`gateway_core::keys`); this is where the replica's tasks meet them, with the wall
//! clock, random nonces, and the count of what was refused.
//!
//! A value or message that fails verification is dropped, counted in `/metrics`
//! (`gateway_cluster_unverified_total{source,reason}`), and logged once per source and reason:
//! whoever can write to NATS without the secret can fill a log otherwise.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use gateway_core::keys::{KeyRing, Opened, Refusal, Replays, Versions};

/// Milliseconds since the Unix epoch, as replicas agree on time (within
/// [`gateway_core::keys::MESSAGE_LIFETIME`]). The simulation gives each host its own.
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system's clock.
pub fn system_clock() -> WallClock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    })
}

/// Where a refused item came from: a bucket's name without the namespace, or a subject's kind.
pub type Source = &'static str;

/// The counts of refused items, by source and reason, for `/metrics`.
#[derive(Debug, Default)]
pub struct Unverified(Mutex<BTreeMap<(Source, &'static str), u64>>);

impl Unverified {
    pub fn snapshot(&self) -> Vec<((Source, &'static str), u64)> {
        self.0
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// How many items from `source` were refused, for every reason.
    pub fn from_source(&self, source: Source) -> u64 {
        self.0
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|((s, _), _)| *s == source)
            .map(|(_, n)| n)
            .sum()
    }
}

/// A replica's seal: its keys, its clock, the nonces and versions it has seen.
pub struct Seal {
    keys: KeyRing,
    clock: WallClock,
    replays: Mutex<Replays>,
    versions: Mutex<HashMap<String, Versions>>,
    unverified: Arc<Unverified>,
    logged: Mutex<HashSet<(Source, &'static str)>>,
    /// When this seal was made, on its clock. A message sealed before it (on the sender's
    /// clock) may have been taken by this replica's previous run, whose nonces went with it:
    /// it is refused as a replay. (Clocks in step, no honest message is: this replica was not
    /// listening yet.)
    started_ms: u64,
    /// A planted bug for the simulation: nothing is verified.
    trusting: bool,
    /// A planted bug for the simulation: no nonce is kept.
    forgetful: bool,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Seal {
    pub fn new(keys: KeyRing, clock: WallClock, unverified: Arc<Unverified>) -> Seal {
        let started_ms = clock();
        Seal {
            keys,
            clock,
            started_ms,
            replays: Mutex::default(),
            versions: Mutex::default(),
            unverified,
            logged: Mutex::default(),
            trusting: false,
            forgetful: false,
        }
    }

    /// A planted bug (the simulation's proof that its adversary is caught): this replica
    /// believes whatever the engine gives it, as the gateway did before the cluster secret.
    pub fn trusting_everything(mut self) -> Seal {
        self.trusting = true;
        self
    }

    /// A planted bug: messages are verified, but heard again they are taken again.
    pub fn forgetting_nonces(mut self) -> Seal {
        self.forgetful = true;
        self
    }

    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }

    pub fn now_ms(&self) -> u64 {
        (self.clock)()
    }

    /// When this seal was made, on its clock: this run of the replica began.
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    fn refused(&self, source: Source, reason: Refusal) {
        *self
            .unverified
            .0
            .lock()
            .expect("not poisoned")
            .entry((source, reason.as_str()))
            .or_default() += 1;
        if self
            .logged
            .lock()
            .expect("not poisoned")
            .insert((source, reason.as_str()))
        {
            tracing::warn!(
                source,
                reason = reason.as_str(),
                "an item in the cluster's engine failed verification under the cluster secret and was ignored (logged once per source and reason; counted in gateway_cluster_unverified_total)"
            );
        }
    }

    /// `payload` sealed for `key` of `bucket`, at a version above any this replica has seen
    /// of the key.
    pub fn seal_value(&self, bucket: &str, key: &str, payload: &[u8]) -> Bytes {
        let now_us = self.now_ms().saturating_mul(1000);
        let version = self
            .versions
            .lock()
            .expect("not poisoned")
            .entry(bucket.to_owned())
            .or_default()
            .next(key, now_us);
        Bytes::from(self.keys.seal_value(bucket, key, version, payload))
    }

    /// The payload of a value read from `key` of `bucket`, when it verifies and is not older
    /// than one seen of the key (nor, in a bucket whose values expire after `max_age`, older
    /// than the bucket keeps). `None` (counted, logged once) otherwise.
    pub fn open_value(
        &self,
        source: Source,
        bucket: &str,
        key: &str,
        value: &[u8],
        max_age: Option<Duration>,
    ) -> Option<Bytes> {
        if self.trusting {
            return Some(match self.keys.open_value(bucket, key, value) {
                Ok((_, payload)) => Bytes::copy_from_slice(payload),
                Err(_) => Bytes::copy_from_slice(strip_header(value)),
            });
        }
        let opened = self.keys.open_value(bucket, key, value).and_then(|(v, p)| {
            let now_us = self.now_ms().saturating_mul(1000);
            if max_age.is_some_and(|age| Versions::too_old(v, now_us, age)) {
                return Err(Refusal::RolledBack);
            }
            let mut versions = self.versions.lock().expect("not poisoned");
            let seen = versions.entry(bucket.to_owned()).or_default();
            if let Some(age) = max_age {
                // Keys not written for longer than the bucket keeps them are forgotten: a
                // value that old is refused as too old.
                if seen.len() > 1024 {
                    let window = (age + gateway_core::keys::MESSAGE_LIFETIME).as_micros() as u64;
                    seen.forget_before(now_us.saturating_sub(window));
                }
            }
            seen.handle_value(key, v).map(|()| p)
        });
        match opened {
            Ok(p) => Some(Bytes::copy_from_slice(p)),
            Err(reason) => {
                self.refused(source, reason);
                None
            }
        }
    }

    /// `payload` sealed for `context`, with a fresh random nonce.
    pub fn seal_message(&self, context: &str, payload: &[u8]) -> Bytes {
        Bytes::from(
            self.keys
                .seal_message(context, rand::random(), self.now_ms(), payload),
        )
    }

    /// A message sealed with `nonce` (a sequence number, for the answers on a relay's inbox).
    pub fn seal_message_with(&self, context: &str, nonce: [u8; 16], payload: &[u8]) -> Bytes {
        Bytes::from(
            self.keys
                .seal_message(context, nonce, self.now_ms(), payload),
        )
    }

    /// The nonce and payload of a message heard for `context`, when it verifies, has not
    /// expired and (with `once`) its nonce was not heard before, nor was it sealed before this
    /// seal was made. `None` (counted, logged once) otherwise.
    pub fn open_message(
        &self,
        source: Source,
        context: &str,
        message: &[u8],
        once: bool,
    ) -> Option<([u8; 16], Bytes)> {
        if self.trusting {
            let (nonce, payload) = match self.keys.open_message(context, self.now_ms(), message) {
                Ok(o) => (o.nonce, o.payload),
                Err(_) => (rand::random(), strip_header(message)),
            };
            return Some((nonce, Bytes::copy_from_slice(payload)));
        }
        let now = self.now_ms();
        let opened = self
            .keys
            .open_message(context, now, message)
            .and_then(|o: Opened<'_>| {
                if once && !self.forgetful && gateway_core::keys::authenticated() {
                    let lifetime = gateway_core::keys::MESSAGE_LIFETIME.as_millis() as u64;
                    if o.expires_ms.saturating_sub(lifetime) < self.started_ms {
                        return Err(Refusal::Replayed);
                    }
                    self.replays
                        .lock()
                        .expect("not poisoned")
                        .handle_message(now, &o)?;
                }
                Ok((o.nonce, Bytes::copy_from_slice(o.payload)))
            });
        match opened {
            Ok(o) => Some(o),
            Err(reason) => {
                self.refused(source, reason);
                None
            }
        }
    }
}

/// The environment variable holding the cluster secret when no file is named.
pub const SECRET_ENV: &str = "MCP_GATEWAY_CLUSTER_SECRET";
/// The environment variable holding the previous cluster secret during a roll.
pub const PREVIOUS_SECRET_ENV: &str = "MCP_GATEWAY_PREVIOUS_CLUSTER_SECRET";

/// What a replica refuses to start without, and how to make it.
const HOW_TO_MAKE: &str = "every replica of a cluster needs the same cluster secret: make one with `openssl rand -hex 32 > cluster.secret && chmod 600 cluster.secret`, copy it to each replica, and name it with --cluster-secret-file (or put the 64 hex digits in MCP_GATEWAY_CLUSTER_SECRET)";

/// The cluster's keys from `--cluster-secret-file` (else [`SECRET_ENV`]) and, during a roll,
/// `--previous-cluster-secret-file` (else [`PREVIOUS_SECRET_ENV`]). An error is a line to
/// print, without any secret.
pub fn resolve_keys(
    file: Option<&std::path::Path>,
    previous_file: Option<&std::path::Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<KeyRing, String> {
    use gateway_core::keys::GatewaySecret;
    let read = |file: Option<&std::path::Path>, var: &str, flag: &str| {
        let text = match file {
            Some(f) => Some(std::fs::read_to_string(f).map_err(|e| {
                format!(
                    "cannot read the cluster secret {} ({flag}): {e}",
                    f.display()
                )
            })?),
            None => env(var).filter(|v| !v.trim().is_empty()),
        };
        let Some(text) = text else {
            return Ok(None);
        };
        let from = file.map_or_else(|| var.to_owned(), |f| format!("{} ({flag})", f.display()));
        GatewaySecret::parse(&text)
            .map(Some)
            .map_err(|e| format!("the cluster secret in {from}: {e}"))
    };
    let current = read(file, SECRET_ENV, "--cluster-secret-file")?.ok_or_else(|| {
        format!("a replica does not start without the cluster secret: {HOW_TO_MAKE}")
    })?;
    let previous = read(
        previous_file,
        PREVIOUS_SECRET_ENV,
        "--previous-cluster-secret-file",
    )?;
    let keys = KeyRing::new(&current, previous.as_ref());
    tracing::info!(
        key_id = %current.key_id(),
        previous_key_id = previous.as_ref().map(|p| p.key_id().to_string()),
        "sealing what the cluster shares under the cluster secret"
    );
    Ok(keys)
}

/// What follows a sealed item's header line, or the whole when it has none (for the trusting
/// planted bug only).
fn strip_header(item: &[u8]) -> &[u8] {
    if item.starts_with(b"mgw1 ") {
        if let Some(end) = item.iter().position(|b| *b == b'\n') {
            return &item[end + 1..];
        }
    }
    item
}

/// The nonce of the `n`th answer on a relay's inbox: answers come in order, and a receiver
/// takes each number once.
pub fn sequence_nonce(n: u64) -> [u8; 16] {
    (n as u128).to_be_bytes()
}

/// The number a [`sequence_nonce`] carries.
pub fn sequence_of(nonce: &[u8; 16]) -> u64 {
    u128::from_be_bytes(*nonce).min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::keys::GatewaySecret;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn seal(secret: u8, clock: Arc<AtomicU64>) -> (Seal, Arc<Unverified>) {
        let mut bytes = [secret; 32];
        bytes[1] = 0;
        let keys = KeyRing::new(&GatewaySecret::new(bytes), None);
        let unverified = Arc::new(Unverified::default());
        let clock: WallClock = Arc::new(move || clock.load(Ordering::Relaxed));
        (Seal::new(keys, clock, unverified.clone()), unverified)
    }

    #[test]
    fn a_value_put_back_is_refused_and_counted_once_a_newer_one_was_read() {
        let clock = Arc::new(AtomicU64::new(1_800_000_000_000));
        let (writer, _) = seal(1, clock.clone());
        let (reader, unverified) = seal(1, clock.clone());
        let old = writer.seal_value("ns_pins", "p.alpha", b"old");
        clock.fetch_add(1, Ordering::Relaxed);
        let new = writer.seal_value("ns_pins", "p.alpha", b"new");
        assert_eq!(
            reader.open_value("pins", "ns_pins", "p.alpha", &new, None),
            Some(Bytes::from_static(b"new"))
        );
        assert_eq!(
            reader.open_value("pins", "ns_pins", "p.alpha", &old, None),
            None
        );
        assert_eq!(
            reader.open_value("pins", "ns_pins", "p.beta", &new, None),
            None
        );
        assert_eq!(
            reader.open_value("pins", "ns_pins", "p.alpha", b"{\"forged\":1}", None),
            None
        );
        assert_eq!(unverified.from_source("pins"), 3);
        let (stranger, _) = seal(2, clock);
        let forged = stranger.seal_value("ns_pins", "p.alpha", b"x");
        assert_eq!(
            reader.open_value("pins", "ns_pins", "p.alpha", &forged, None),
            None
        );
    }

    #[test]
    fn a_message_is_taken_once_and_the_trusting_bug_takes_anything() {
        let clock = Arc::new(AtomicU64::new(1_800_000_000_000));
        let (a, _) = seal(1, clock.clone());
        let (b, unverified) = seal(1, clock.clone());
        let m = a.seal_message("ns.news", b"hi");
        assert!(b.open_message("news", "ns.news", &m, true).is_some());
        assert!(b.open_message("news", "ns.news", &m, true).is_none());
        assert!(b.open_message("news", "ns.other", &m, true).is_none());
        assert_eq!(unverified.from_source("news"), 2);
        let (c, _) = seal(1, clock);
        let c = c.trusting_everything();
        assert_eq!(
            c.open_message("news", "ns.news", b"forged", true)
                .map(|m| m.1),
            Some(Bytes::from_static(b"forged"))
        );
    }

    #[test]
    fn a_message_sealed_before_a_replica_started_is_a_replay_to_it() {
        let clock = Arc::new(AtomicU64::new(1_800_000_000_000));
        let (a, _) = seal(1, clock.clone());
        let m = a.seal_message("ns.relay.r1", b"call");
        clock.fetch_add(2_000, Ordering::Relaxed);
        // r1 starts again 2 s later: its previous run may have taken the message.
        let (r1, unverified) = seal(1, clock.clone());
        assert!(r1.open_message("relay", "ns.relay.r1", &m, true).is_none());
        assert_eq!(
            unverified.snapshot(),
            vec![(("relay", Refusal::Replayed.as_str()), 1)]
        );
        // What is sealed from then on is taken, once; answers (not `once`) are not its to
        // refuse.
        let later = a.seal_message("ns.relay.r1", b"call");
        assert!(r1
            .open_message("relay", "ns.relay.r1", &later, true)
            .is_some());
        assert!(r1
            .open_message("handoff", "ns.relay.r1", &m, false)
            .is_some());
    }

    #[test]
    fn the_secret_comes_from_a_file_or_the_environment_and_is_never_echoed() {
        let dir = std::env::temp_dir().join(format!("seal-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cluster.secret");
        let text = "0123456789abcdef".repeat(4);
        std::fs::write(&file, format!("{text}\n")).unwrap();
        let none = |_: &str| None;
        let from_file = resolve_keys(Some(&file), None, &none).unwrap();
        let env_text = text.clone();
        let env = move |k: &str| (k == SECRET_ENV).then(|| env_text.clone());
        let from_env = resolve_keys(None, None, &env).unwrap();
        assert_eq!(from_file.current_id(), from_env.current_id());
        let missing = resolve_keys(None, None, &none).unwrap_err();
        assert!(missing.contains("openssl rand -hex 32"), "{missing}");
        std::fs::write(&file, format!("{}zz", &text[..62])).unwrap();
        let bad = resolve_keys(Some(&file), None, &none).unwrap_err();
        assert!(
            bad.contains("cluster.secret") && !bad.contains(&text[..62]),
            "{bad}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sequence_numbers_ride_in_the_nonce() {
        assert_eq!(sequence_of(&sequence_nonce(7)), 7);
        assert_ne!(sequence_nonce(1), sequence_nonce(2));
    }
}
