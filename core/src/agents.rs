//! Agent handles: the secret a caller without a session passes as `agent` to act as the
//! agent `checkin` made for it.
//!
//! On one gateway a handle is 128 random bits (`ah-` and 32 hex digits) that the gateway
//! remembers. Replicas of a cluster share an [`AgentKey`] (derived from the cluster secret,
//! never kept in the engine: `crate::keys`), and a handle issued by any of them also carries a MAC of its random part
//! under that key (`ah-` and 64 hex digits): every replica recognises it at once, without
//! asking the engine or the replica that issued it, and nobody without the key can make one.
//! The MAC is HMAC-SHA-256 truncated to 128 bits, compared in constant time.
//!
//! A handle is its caller's alone: the gateway that issued it keeps the identity it was issued
//! to (`Identity::session_owner`), and the MAC of a cluster handle covers that identity too, so
//! a handle another identity presents (leaked, stolen, guessed from a log) is recognised by no
//! replica, exactly like one never issued.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The key that makes handles every replica of a cluster recognises.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentKey([u8; 32]);

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey(..)")
    }
}

impl AgentKey {
    pub fn new(bytes: [u8; 32]) -> AgentKey {
        AgentKey(bytes)
    }

    /// A key made from a replica's seed: its candidate for the cluster's key (the first
    /// replica to write one wins), deterministic so that simulations replay.
    pub fn derive(seed: &[u8; 32]) -> AgentKey {
        let mut mac = Hmac::<Sha256>::new_from_slice(seed).expect("HMAC takes any key length");
        mac.update(b"mcp-gateway agent key");
        AgentKey(mac.finalize().into_bytes().into())
    }

    /// The key as 64 hex digits, as the engine keeps it.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Reads a key kept as 64 hex digits.
    pub fn from_hex(text: &str) -> Option<AgentKey> {
        let bytes = unhex(text.trim())?;
        Some(AgentKey(bytes.try_into().ok()?))
    }

    /// The MAC of a handle's random part for `owner`: the owner goes in after a byte saying
    /// whether there is one and its length, so no two (random, owner) pairs give one input.
    fn tag(&self, random: &[u8], owner: Option<&str>) -> [u8; 16] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(b"agent handle ");
        mac.update(random);
        match owner {
            None => mac.update(&[0]),
            Some(o) => {
                mac.update(&[1]);
                mac.update(&(o.len() as u64).to_be_bytes());
                mac.update(o.as_bytes());
            }
        }
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&full[..16]);
        tag
    }
}

/// A new handle from 16 random bytes for the identity `owner`; with a key, one every holder of
/// the key recognises when `owner` presents it.
pub(crate) fn issue(random: [u8; 16], key: Option<&AgentKey>, owner: Option<&str>) -> String {
    let mut handle = format!("ah-{}", hex(&random));
    if let Some(k) = key {
        handle.push_str(&hex(&k.tag(&random, owner)));
    }
    handle
}

/// Whether `handle` was issued under `key` (by any replica holding it) to the identity `owner`.
pub(crate) fn verify(handle: &str, key: &AgentKey, owner: Option<&str>) -> bool {
    use subtle::ConstantTimeEq;
    let Some(bytes) = handle.strip_prefix("ah-").and_then(unhex) else {
        return false;
    };
    if bytes.len() != 32 {
        return false;
    }
    let (random, tag) = bytes.split_at(16);
    key.tag(random, owner).ct_eq(tag).into()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    hex::decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_issued_under_the_key_is_recognised_by_every_holder_of_it_only() {
        let key = AgentKey::derive(&[7; 32]);
        let same = AgentKey::from_hex(&key.to_hex()).unwrap();
        let other = AgentKey::derive(&[8; 32]);
        let ops = Some("ops");
        let h = issue([1; 16], Some(&key), ops);
        assert!(h.starts_with("ah-") && h.len() == 3 + 64, "{h}");
        assert!(verify(&h, &same, ops));
        assert!(!verify(&h, &other, ops));
        // Another identity, or none, presenting it: not recognised.
        for owner in [Some("carol"), Some("ops "), Some(""), None] {
            assert!(!verify(&h, &key, owner), "{owner:?}");
        }
        let anonymous = issue([1; 16], Some(&key), None);
        assert!(verify(&anonymous, &key, None));
        assert!(!verify(&anonymous, &key, Some("")));
        // Any change of the random part or the tag, and the short handles of one gateway,
        // are not recognised.
        let mut forged = h.clone().into_bytes();
        let last = forged.len() - 1;
        forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
        assert!(!verify(std::str::from_utf8(&forged).unwrap(), &key, ops));
        let mut forged = h.into_bytes();
        forged[3] = if forged[3] == b'0' { b'1' } else { b'0' };
        assert!(!verify(std::str::from_utf8(&forged).unwrap(), &key, ops));
        let single = issue([1; 16], None, ops);
        assert_eq!(single.len(), 3 + 32);
        assert!(!verify(&single, &key, ops));
        for junk in [
            "",
            "ah-",
            "ah-zz",
            "ah-0",
            "xx-00",
            &format!("ah-{}", "é".repeat(32)),
        ] {
            assert!(!verify(junk, &key, None), "{junk:?}");
        }
    }

    #[test]
    fn keys_round_trip_as_hex_and_do_not_show_in_logs() {
        let key = AgentKey::derive(&[3; 32]);
        assert_eq!(AgentKey::from_hex(&key.to_hex()), Some(key.clone()));
        assert_eq!(AgentKey::from_hex("00"), None);
        assert_eq!(AgentKey::from_hex(&"g".repeat(64)), None);
        assert_eq!(format!("{key:?}"), "AgentKey(..)");
        assert_ne!(AgentKey::derive(&[3; 32]), AgentKey::derive(&[4; 32]));
    }
}
