//! Sled identity keys: each emulated sled's Ed25519 key, derived from the fleet seed and its
//! project name, so a restarted sled presents the same key (and the gateway's trust-on-first-use
//! pin keeps matching) while another seed or project gives another key.
//!
//! The uplink signs the gateway's challenge with it (see
//! `gateway_core::identity::sign_challenge`). [`impostor_key`] is a second, different key for
//! the same project: a sled that presents it is refused once the real key is pinned.

use ed25519_dalek::SigningKey;
use sha2::{Digest, Sha256};

/// The key material: SHA-256 over a domain string, the seed (little-endian) and the project.
fn derive(domain: &[u8], seed: u64, project: &str) -> SigningKey {
    let mut hash = Sha256::new();
    hash.update(domain);
    hash.update(seed.to_le_bytes());
    hash.update(project.as_bytes());
    let bytes: [u8; 32] = hash.finalize().into();
    SigningKey::from_bytes(&bytes)
}

/// The identity key of `project`'s sled in a fleet seeded with `seed`: SHA-256 of
/// `b"sled-sim identity v1\n"`, `seed.to_le_bytes()` and the project name. Stable across runs,
/// platforms and versions.
pub fn sled_key(seed: u64, project: &str) -> SigningKey {
    derive(b"sled-sim identity v1\n", seed, project)
}

/// A key that is *not* `project`'s ([`sled_key`] with the domain `b"sled-sim impostor v1\n"`):
/// what a sled run with `--wrong-key` presents.
pub fn impostor_key(seed: u64, project: &str) -> SigningKey {
    derive(b"sled-sim impostor v1\n", seed, project)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::identity::encode_key;

    #[test]
    fn keys_are_stable() {
        assert_eq!(sled_key(0, "alpha"), sled_key(0, "alpha"));
        assert_eq!(impostor_key(7, "beta"), impostor_key(7, "beta"));
        // Pinned: a gateway's pin file must keep matching after an upgrade.
        assert_eq!(
            encode_key(&sled_key(0, "alpha").verifying_key()),
            "HdsBR1X+umC6AQYjMoBTKbbMi8FB7ZGftXcPaYTig2E="
        );
    }

    #[test]
    fn keys_differ_by_project_seed_and_role() {
        let base = sled_key(0, "alpha").verifying_key();
        assert_ne!(sled_key(0, "beta").verifying_key(), base);
        assert_ne!(sled_key(1, "alpha").verifying_key(), base);
        assert_ne!(impostor_key(0, "alpha").verifying_key(), base);
        // The seed and the name do not run into each other.
        assert_ne!(sled_key(0, "alpha1"), sled_key(1, "alpha"));
    }
}
