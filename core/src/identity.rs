//! Sled identity (story 1206): Ed25519 keys, the challenge a sled signs on connect, and the
//! pins the gateway keeps (trust on first use).
//!
//! A sled with an identity names its public key in `hello`; the gateway answers with a fresh
//! 32-byte nonce, and the sled signs [`challenge_message`] of the gateway's name (the host it
//! dialed), its project and that nonce, and names that gateway in its `proof`. A gateway with a
//! public name (`gateway serve --public-name`) refuses a proof made for another name; a good
//! signature then proves the sled holds the key. The name binds the proof to the gateway the
//! sled meant to reach rather than to the TLS channel, because TLS may end at a proxy in front
//! of the gateway: a gateway the sled dialed by another name (which could relay the real
//! gateway's challenge) gets a proof the real one refuses. The key is then compared with the project's
//! pin: none yet, and it is pinned (the gateway asks its driver to save [`Pins::to_toml`]);
//! the same, and the uplink is accepted; another, and the uplink is refused and the attempt is
//! kept for `fleet_identity` to show. Only an explicit `fleet_identity` request naming the
//! action and the project changes a pin.
//!
//! Keys and signatures travel as standard base64 (32 and 64 bytes).

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

/// A gateway's name as a sled signs it and a gateway compares it: the host as a URL names it,
/// in lower case, without an IPv6 address's brackets or a DNS name's final dot.
pub fn gateway_name(host: &str) -> String {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// What a sled signs: a fixed context, the gateway's name (see [`gateway_name`]), its project,
/// and the gateway's nonce, so a signature made for one gateway, one project or one connection
/// is worth nothing for another.
pub fn challenge_message(gateway: &str, project: &str, nonce: &[u8]) -> Vec<u8> {
    const CONTEXT: &[u8] = b"mcp-gateway/uplink-identity/v2\n";
    let mut m =
        Vec::with_capacity(CONTEXT.len() + gateway.len() + 1 + project.len() + 1 + nonce.len());
    m.extend_from_slice(CONTEXT);
    m.extend_from_slice(gateway.as_bytes());
    m.push(b'\n');
    m.extend_from_slice(project.as_bytes());
    m.push(b'\n');
    m.extend_from_slice(nonce);
    m
}

/// A public key as it travels and is pinned: standard base64 of its 32 bytes.
pub fn encode_key(key: &VerifyingKey) -> String {
    BASE64.encode(key.as_bytes())
}

/// Reads a public key from its base64 text.
pub fn parse_key(text: &str) -> Result<VerifyingKey, String> {
    let bytes = BASE64
        .decode(text)
        .map_err(|e| format!("the key is not base64: {e}"))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("an Ed25519 key is 32 bytes, this one is {}", b.len()))?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| "the key is not a valid Ed25519 point".into())
}

/// The sled's side: the `proof` signature for a `challenge` nonce (base64 in, base64 out) from
/// the gateway named `gateway` (see [`gateway_name`]).
pub fn sign_challenge(
    key: &SigningKey,
    gateway: &str,
    project: &str,
    nonce: &str,
) -> Result<String, String> {
    let nonce = BASE64
        .decode(nonce)
        .map_err(|e| format!("the nonce is not base64: {e}"))?;
    let signature = key.sign(&challenge_message(gateway, project, &nonce));
    Ok(BASE64.encode(signature.to_bytes()))
}

/// The gateway's side: whether `signature` (base64) is `key`'s signature of the challenge made
/// for `gateway`.
pub fn verify_challenge(
    key: &VerifyingKey,
    gateway: &str,
    project: &str,
    nonce: &[u8],
    signature: &str,
) -> Result<(), String> {
    if gateway.is_empty() || gateway.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the gateway name in the proof is empty or has whitespace".into());
    }
    let bytes = BASE64
        .decode(signature)
        .map_err(|e| format!("the signature is not base64: {e}"))?;
    let bytes: [u8; 64] = bytes.try_into().map_err(|b: Vec<u8>| {
        format!("an Ed25519 signature is 64 bytes, this one is {}", b.len())
    })?;
    key.verify_strict(
        &challenge_message(gateway, project, nonce),
        &Signature::from_bytes(&bytes),
    )
    .map_err(|_| "the signature does not verify with the presented key".into())
}

/// Standard base64, for nonces.
pub(crate) fn encode_bytes(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// One project's pinned key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    /// The public key, standard base64.
    pub key: String,
    /// The sled name the key was first seen with (informative).
    pub sled: String,
}

/// Every project's pinned key: the pin file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pins {
    #[serde(default)]
    pub pins: BTreeMap<String, Pin>,
}

/// A pin file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pin file: {0}")]
pub struct PinsError(pub String);

const PINS_HEADER: &str = "# Sled identity keys pinned by the MCP gateway on first use (story 1206).\n# Written by the gateway; change a pin with the fleet_identity tool (action \"repin\").\n\n";

impl Pins {
    /// Reads a pin file's text; every key must be a valid Ed25519 public key.
    pub fn parse(text: &str) -> Result<Pins, PinsError> {
        let pins: Pins = toml::from_str(text).map_err(|e| PinsError(e.to_string()))?;
        for (project, pin) in &pins.pins {
            parse_key(&pin.key)
                .map_err(|e| PinsError(format!("the pin of project '{project}': {e}")))?;
        }
        Ok(pins)
    }

    /// The pin file's text.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("pins always serialise to TOML");
        format!("{PINS_HEADER}{body}")
    }

    pub fn get(&self, project: &str) -> Option<&Pin> {
        self.pins.get(project)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SigningKey {
        SigningKey::from_bytes(&[n; 32])
    }

    #[test]
    fn a_signed_challenge_verifies_only_for_its_key_gateway_project_and_nonce() {
        let k = key(1);
        let nonce = [9u8; 32];
        let gw = "gw.example";
        let sig = sign_challenge(&k, gw, "alpha", &encode_bytes(&nonce)).unwrap();
        let vk = k.verifying_key();
        assert!(verify_challenge(&vk, gw, "alpha", &nonce, &sig).is_ok());
        assert!(verify_challenge(&vk, "evil.example", "alpha", &nonce, &sig).is_err());
        assert!(verify_challenge(&vk, gw, "beta", &nonce, &sig).is_err());
        assert!(verify_challenge(&vk, gw, "alpha", &[8u8; 32], &sig).is_err());
        assert!(verify_challenge(&key(2).verifying_key(), gw, "alpha", &nonce, &sig).is_err());
        assert!(verify_challenge(&vk, gw, "alpha", &nonce, "not base64!").is_err());
        assert!(verify_challenge(&vk, gw, "alpha", &nonce, "AAAA").is_err());
        // The fields cannot be shifted into one another.
        let shifted = sign_challenge(&k, "gw.example\nalpha", "", &encode_bytes(&nonce)).unwrap();
        assert!(verify_challenge(&vk, "gw.example\nalpha", "", &nonce, &shifted).is_err());
        assert!(verify_challenge(&vk, "", "alpha", &nonce, &sig).is_err());
    }

    #[test]
    fn gateway_names_compare_as_hosts_do() {
        assert_eq!(gateway_name("GW.Example."), "gw.example");
        assert_eq!(gateway_name("[::1]"), "::1");
        assert_eq!(gateway_name("127.0.0.1"), "127.0.0.1");
    }

    #[test]
    fn keys_round_trip_and_bad_keys_are_refused() {
        let vk = key(3).verifying_key();
        assert_eq!(parse_key(&encode_key(&vk)).unwrap(), vk);
        assert!(parse_key("AAAA").unwrap_err().contains("32 bytes"));
        assert!(parse_key("%%%").unwrap_err().contains("base64"));
    }

    #[test]
    fn the_pin_file_round_trips_and_rejects_bad_keys() {
        let mut pins = Pins::default();
        pins.pins.insert(
            "alpha".into(),
            Pin {
                key: encode_key(&key(4).verifying_key()),
                sled: "alpha-sled".into(),
            },
        );
        let text = pins.to_toml();
        assert!(text.starts_with("# Sled identity keys"));
        assert_eq!(Pins::parse(&text).unwrap(), pins);
        assert_eq!(Pins::parse("").unwrap(), Pins::default());
        let bad = "[pins.alpha]\nkey = \"AAAA\"\nsled = \"s\"\n";
        assert!(Pins::parse(bad).unwrap_err().0.contains("alpha"));
        assert!(Pins::parse("[pins.alpha]\nkey = 1\n").is_err());
    }
}
