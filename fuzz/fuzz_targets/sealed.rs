//! What a replica reads from the engine is verified before anything acts on it
//! (`gateway_core::keys`): whatever bytes arrive, opening them never panics, and what opens is
//! exactly what a holder of the cluster secret sealed, for that bucket and key or that context.
//!
//! The input is a list of operations. Three key rings seal: the receiver's current secret, the
//! previous one (still accepted during a roll), and a stranger's (never accepted). What they seal
//! is kept; later operations open it as it is (a replay), edited (a bit flipped, cut, a byte put
//! in, something appended), under another bucket, key or context, or open raw bytes. The checks:
//!
//! - a value that opens has the bucket, key, version and payload of a value sealed under an
//!   accepted secret (a different spelling of the same header is harmless; a different meaning
//!   is a forgery);
//! - a message that opens has the context, nonce, expiry and payload of one sealed under an
//!   accepted secret, and is not expired and not made too far ahead;
//! - `Replays` accepts each message (nonce and expiry) once, the clock only moving forward (an
//!   honest sealer never makes a nonce twice; the fuzzer may, once the first has expired);
//! - `Versions` never accepts a version of a key below one it accepted.
#![no_main]

use std::collections::{HashMap, HashSet};

use arbitrary::Arbitrary;
use gateway_core::keys::{GatewaySecret, KeyRing, Replays, Versions, MESSAGE_LIFETIME};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 4] = ["directory", "sessions", "pins", "tools"];
const KEYS: [&str; 4] = ["p.alpha", "p.beta", "s-1", ""];
const CONTEXTS: [&str; 4] = ["mcpgw.relay.a", "mcpgw.news", "a handoff 00", ""];

#[derive(Arbitrary, Debug)]
enum Sealer {
    Current,
    Previous,
    Stranger,
}

#[derive(Arbitrary, Debug)]
enum Edit {
    AsIs,
    Flip { at: u16, bit: u8 },
    Cut { at: u16 },
    Put { at: u16, byte: u8 },
    Append(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Op {
    SealValue {
        by: Sealer,
        bucket: u8,
        key: u8,
        version: u64,
        payload: Vec<u8>,
    },
    SealMessage {
        by: Sealer,
        context: u8,
        nonce: [u8; 16],
        payload: Vec<u8>,
    },
    /// Opens a sealed item (picked by `which`), edited, as a value of `bucket`/`key` or a
    /// message for `context`.
    Open {
        which: u16,
        edit: Edit,
        bucket: u8,
        key: u8,
        context: u8,
    },
    Raw {
        bytes: Vec<u8>,
        bucket: u8,
        key: u8,
        context: u8,
    },
    Advance {
        ms: u16,
    },
}

fn pick<'a>(names: &[&'a str], i: u8) -> &'a str {
    names[i as usize % names.len()]
}

fn edited(mut bytes: Vec<u8>, edit: &Edit) -> Vec<u8> {
    match edit {
        Edit::AsIs => {}
        Edit::Flip { at, bit } => {
            if !bytes.is_empty() {
                let at = *at as usize % bytes.len();
                bytes[at] ^= 1 << (bit % 8);
            }
        }
        Edit::Cut { at } => bytes.truncate(*at as usize % (bytes.len() + 1)),
        Edit::Put { at, byte } => bytes.insert(*at as usize % (bytes.len() + 1), *byte),
        Edit::Append(more) => bytes.extend_from_slice(more),
    }
    bytes
}

struct World {
    current: KeyRing,
    previous: KeyRing,
    stranger: KeyRing,
    /// The receiver: the current secret and the previous one.
    receiver: KeyRing,
    now_ms: u64,
    sealed: Vec<Vec<u8>>,
    values: HashSet<(String, String, u64, Vec<u8>)>,
    messages: HashSet<(String, [u8; 16], u64, Vec<u8>)>,
    replays: Replays,
    accepted: HashSet<([u8; 16], u64)>,
    versions: HashMap<String, Versions>,
    highest: HashMap<(String, String), u64>,
}

impl World {
    fn new() -> World {
        let (s0, s1, s2) = (
            GatewaySecret::new([1; 32]),
            GatewaySecret::new([2; 32]),
            GatewaySecret::new([3; 32]),
        );
        World {
            current: KeyRing::new(&s1, None),
            previous: KeyRing::new(&s0, None),
            stranger: KeyRing::new(&s2, None),
            receiver: KeyRing::new(&s1, Some(&s0)),
            now_ms: 1_800_000_000_000,
            sealed: Vec::new(),
            values: HashSet::new(),
            messages: HashSet::new(),
            replays: Replays::new(),
            accepted: HashSet::new(),
            versions: HashMap::new(),
            highest: HashMap::new(),
        }
    }

    fn ring(&self, by: &Sealer) -> (&KeyRing, bool) {
        match by {
            Sealer::Current => (&self.current, true),
            Sealer::Previous => (&self.previous, true),
            Sealer::Stranger => (&self.stranger, false),
        }
    }

    fn open(&mut self, bytes: &[u8], bucket: &str, key: &str, context: &str) {
        if let Ok((version, payload)) = self.receiver.open_value(bucket, key, bytes) {
            let item = (bucket.to_owned(), key.to_owned(), version, payload.to_vec());
            assert!(
                self.values.contains(&item),
                "a value opened that no accepted secret sealed: {item:?}"
            );
            let versions = self.versions.entry(bucket.to_owned()).or_default();
            let highest = self
                .highest
                .entry((bucket.to_owned(), key.to_owned()))
                .or_insert(0);
            if versions.handle_value(key, version).is_ok() {
                assert!(
                    version >= *highest,
                    "version {version} of {bucket}/{key} accepted after {highest}"
                );
                *highest = version;
            }
        }
        if let Ok(opened) = self.receiver.open_message(context, self.now_ms, bytes) {
            let item = (
                context.to_owned(),
                opened.nonce,
                opened.expires_ms,
                opened.payload.to_vec(),
            );
            assert!(
                self.messages.contains(&item),
                "a message opened that no accepted secret sealed: {item:?}"
            );
            let lifetime = MESSAGE_LIFETIME.as_millis() as u64;
            assert!(
                opened.expires_ms >= self.now_ms && opened.expires_ms <= self.now_ms + 2 * lifetime,
                "a message opened outside its lifetime"
            );
            if self.replays.handle_message(self.now_ms, &opened).is_ok() {
                assert!(
                    self.accepted.insert((opened.nonce, opened.expires_ms)),
                    "message with nonce {:?} accepted twice",
                    opened.nonce
                );
            }
        }
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::SealValue {
                by,
                bucket,
                key,
                version,
                payload,
            } => {
                let (bucket, key) = (pick(&NAMES, bucket), pick(&KEYS, key));
                let (ring, accepted) = self.ring(&by);
                let bytes = ring.seal_value(bucket, key, version, &payload);
                if accepted {
                    self.values
                        .insert((bucket.to_owned(), key.to_owned(), version, payload));
                }
                self.sealed.push(bytes);
            }
            Op::SealMessage {
                by,
                context,
                nonce,
                payload,
            } => {
                let context = pick(&CONTEXTS, context);
                let (ring, accepted) = self.ring(&by);
                let bytes = ring.seal_message(context, nonce, self.now_ms, &payload);
                if accepted {
                    let expires = self.now_ms + MESSAGE_LIFETIME.as_millis() as u64;
                    self.messages
                        .insert((context.to_owned(), nonce, expires, payload));
                }
                self.sealed.push(bytes);
            }
            Op::Open {
                which,
                edit,
                bucket,
                key,
                context,
            } => {
                if self.sealed.is_empty() {
                    return;
                }
                let original = self.sealed[which as usize % self.sealed.len()].clone();
                let bytes = edited(original, &edit);
                self.open(
                    &bytes,
                    pick(&NAMES, bucket),
                    pick(&KEYS, key),
                    pick(&CONTEXTS, context),
                );
            }
            Op::Raw {
                bytes,
                bucket,
                key,
                context,
            } => self.open(
                &bytes,
                pick(&NAMES, bucket),
                pick(&KEYS, key),
                pick(&CONTEXTS, context),
            ),
            Op::Advance { ms } => self.now_ms += ms as u64 * 10,
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut world = World::new();
    for op in ops.into_iter().take(256) {
        world.run(op);
    }
});
