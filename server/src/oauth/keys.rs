//! An authorization server's signing keys: found through its metadata (`jwks_uri` in
//! `/.well-known/openid-configuration`, else RFC 8414's `/.well-known/oauth-authorization-server`),
//! fetched, cached, and fetched again when a token names a key the cache does not hold (the
//! provider rotated its keys) or when the cache is older than its maximum age.
//!
//! Fetching happens on demand, in the task of the request that needs it, under a timeout; one
//! fetch per issuer at a time (a tokio mutex), and the requests that waited for it use what it
//! found. A fetch prompted by an unknown key id happens at most once per cooldown, so a flood
//! of tokens with forged key ids costs the provider one request per cooldown and each of them
//! is refused at once. A stale cache keeps serving while a task refreshes it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;
use tokio::time::Instant;

use super::fetch::{Fetch, FetchError};
use super::jwt::Rejection;

/// The most keys kept from one JWKS.
const MAX_KEYS: usize = 64;

/// How the keys are kept and fetched.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Past this age the key set is fetched again (in the background; the old keys serve
    /// meanwhile).
    pub max_age: Duration,
    /// The least time between two fetches of an issuer's keys (an unknown key id waits for
    /// no fetch within it: it is refused at once).
    pub cooldown: Duration,
    /// A fetch (discovery and JWKS) that takes longer fails.
    pub timeout: Duration,
}

/// Which algorithms a key verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

/// One verification key of a JWKS.
#[derive(Debug)]
struct Key {
    kid: Option<String>,
    /// The key's own `alg`, when its JWK names one.
    alg: Option<Algorithm>,
    kind: KeyKind,
    key: DecodingKey,
}

impl Key {
    /// A JWK usable to verify signatures, or why not.
    fn from_jwk(value: &Value) -> Result<Key, String> {
        let jwk: Jwk = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
        if let Some(u) = &jwk.common.public_key_use {
            if *u != PublicKeyUse::Signature {
                return Err("not a signature key (use)".into());
            }
        }
        let alg = match value.get("alg") {
            None => None,
            Some(Value::String(a)) => Some(
                a.parse::<Algorithm>()
                    .map_err(|_| format!("algorithm {a:?} is not a signature algorithm"))?,
            ),
            Some(other) => return Err(format!("alg {other} is not a string")),
        };
        let kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => KeyKind::Rsa,
            AlgorithmParameters::EllipticCurve(p) => match p.curve {
                EllipticCurve::P256 => KeyKind::P256,
                EllipticCurve::P384 => KeyKind::P384,
                ref c => return Err(format!("curve {c:?} is not supported")),
            },
            AlgorithmParameters::OctetKeyPair(p) => match p.curve {
                // jsonwebtoken slices the first 32 bytes of the key when it verifies: a shorter
                // `x` must not get that far.
                EllipticCurve::Ed25519 if decoded_len(&p.x) == Some(32) => KeyKind::Ed25519,
                EllipticCurve::Ed25519 => return Err("an Ed25519 x that is not 32 bytes".into()),
                ref c => return Err(format!("curve {c:?} is not supported")),
            },
            AlgorithmParameters::OctetKey(_) => return Err("a symmetric key".into()),
        };
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| e.to_string())?;
        Ok(Key {
            kid: jwk.common.key_id,
            alg,
            kind,
            key,
        })
    }

    /// Whether this key verifies signatures made with `alg`.
    fn verifies(&self, alg: Algorithm) -> bool {
        let kind_fits = match alg {
            Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512 => self.kind == KeyKind::Rsa,
            Algorithm::ES256 => self.kind == KeyKind::P256,
            Algorithm::ES384 => self.kind == KeyKind::P384,
            Algorithm::EdDSA => self.kind == KeyKind::Ed25519,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => false,
        };
        kind_fits && self.alg.is_none_or(|a| a == alg)
    }
}

/// The length of a base64url value, decoded.
fn decoded_len(b64: &str) -> Option<usize> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(b64.trim_end_matches('='))
        .ok()
        .map(|v| v.len())
}

/// Reads a JWKS: its usable signature keys (others are skipped, and logged at debug).
fn parse_jwks(issuer: &str, body: &[u8]) -> Result<Vec<Arc<Key>>, String> {
    let jwks: Value =
        serde_json::from_slice(body).map_err(|e| format!("the JWKS is not JSON: {e}"))?;
    let Some(listed) = jwks.get("keys").and_then(Value::as_array) else {
        return Err("the JWKS has no `keys` array".into());
    };
    let mut keys = Vec::new();
    for (i, value) in listed.iter().enumerate() {
        match Key::from_jwk(value) {
            Ok(k) if keys.len() < MAX_KEYS => keys.push(Arc::new(k)),
            Ok(_) => {
                tracing::warn!(
                    issuer,
                    max = MAX_KEYS,
                    "JWKS has more keys than kept; the rest are ignored"
                );
                break;
            }
            Err(why) => tracing::debug!(issuer, key = i, why, "JWKS key skipped"),
        }
    }
    Ok(keys)
}

#[derive(Debug, Default)]
struct State {
    keys: Vec<Arc<Key>>,
    /// From the metadata; forgotten when fetching it fails, so the next fetch discovers anew.
    jwks_uri: Option<String>,
    fetched_at: Option<Instant>,
    last_attempt: Option<Instant>,
    /// Bumped by every successful fetch.
    generation: u64,
}

impl State {
    /// The key for a token's `kid` and `alg`. Without a `kid`, the only key for `alg`.
    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let mut fits = self.keys.iter().filter(|k| k.verifies(alg));
        let found = match kid {
            Some(kid) => fits.find(|k| k.kid.as_deref() == Some(kid)),
            None => match (fits.next(), fits.next()) {
                (Some(only), None) => Some(only),
                _ => None,
            },
        };
        found.map(|k| k.key.clone())
    }

    fn cooling(&self, now: Instant, cooldown: Duration) -> bool {
        self.last_attempt.is_some_and(|t| now < t + cooldown)
    }
}

/// The keys of one authorization server.
#[derive(Debug)]
pub struct IssuerKeys {
    issuer: String,
    state: Mutex<State>,
    /// Held while fetching: one fetch at a time.
    fetching: Arc<tokio::sync::Mutex<()>>,
}

impl IssuerKeys {
    pub fn new(issuer: &str) -> IssuerKeys {
        IssuerKeys {
            issuer: issuer.to_owned(),
            state: Mutex::new(State::default()),
            fetching: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key that verifies a token with this `kid` and `alg`, fetching the key set when it
    /// is not held and no fetch happened within the cooldown.
    pub async fn key_for(
        self: &Arc<Self>,
        kid: Option<&str>,
        alg: Algorithm,
        fetch: &Arc<dyn Fetch>,
        timing: Timing,
    ) -> Result<DecodingKey, Rejection> {
        let unknown = || Rejection::UnknownKey {
            kid: kid.map(str::to_owned),
            alg,
        };
        let generation = {
            let s = self.state();
            if let Some(key) = s.find(kid, alg) {
                let stale = s
                    .fetched_at
                    .is_none_or(|t| Instant::now() >= t + timing.max_age);
                if stale && !s.cooling(Instant::now(), timing.cooldown) {
                    drop(s);
                    self.refresh_in_background(fetch.clone(), timing);
                }
                return Ok(key);
            }
            s.generation
        };
        // One fetch at a time. A fetch under way may bring the key: wait for it (within the
        // timeout) and look again; otherwise fetch unless one happened within the cooldown.
        let _one_at_a_time = match self.fetching.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                let guard =
                    tokio::time::timeout(timing.timeout, self.fetching.clone().lock_owned())
                        .await
                        .map_err(|_| {
                            Rejection::KeysUnavailable(
                                "a fetch under way did not end in time".into(),
                            )
                        })?;
                let s = self.state();
                if s.generation != generation {
                    if let Some(key) = s.find(kid, alg) {
                        return Ok(key);
                    }
                }
                guard
            }
        };
        if self.state().cooling(Instant::now(), timing.cooldown) {
            return Err(unknown());
        }
        self.fetch_now(fetch.as_ref(), timing)
            .await
            .map_err(Rejection::KeysUnavailable)?;
        self.state().find(kid, alg).ok_or_else(unknown)
    }

    /// Fetches the keys in a task of their own, unless a fetch is under way.
    pub fn refresh_in_background(self: &Arc<Self>, fetch: Arc<dyn Fetch>, timing: Timing) {
        let Ok(guard) = self.fetching.clone().try_lock_owned() else {
            return;
        };
        let this = self.clone();
        tokio::spawn(async move {
            let _one_at_a_time = guard;
            if let Err(e) = this.fetch_now(fetch.as_ref(), timing).await {
                tracing::debug!(
                    issuer = this.issuer,
                    error = e,
                    "background key refresh failed"
                );
            }
        });
    }

    /// Fetches the key set now (the caller holds `fetching`), within `timing.timeout`.
    async fn fetch_now(&self, fetch: &dyn Fetch, timing: Timing) -> Result<(), String> {
        let known_uri = {
            let mut s = self.state();
            s.last_attempt = Some(Instant::now());
            s.jwks_uri.clone()
        };
        let issuer = self.issuer.as_str();
        let work = async {
            let uri = match known_uri {
                Some(u) => u,
                None => discover(issuer, fetch).await?,
            };
            let body = fetch
                .get(&uri)
                .await
                .map_err(|e| format!("JWKS {uri}: {e}"))?;
            Ok::<_, String>((
                uri.clone(),
                parse_jwks(issuer, &body).map_err(|e| format!("JWKS {uri}: {e}"))?,
            ))
        };
        let outcome = match tokio::time::timeout(timing.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no answer within {} ms",
                timing.timeout.as_millis()
            )),
        };
        let mut s = self.state();
        match outcome {
            Ok((uri, keys)) => {
                if keys.is_empty() {
                    tracing::warn!(
                        issuer,
                        jwks_uri = uri,
                        "the issuer's JWKS has no usable signature key"
                    );
                } else {
                    tracing::debug!(
                        issuer,
                        jwks_uri = uri,
                        keys = keys.len(),
                        "issuer keys fetched"
                    );
                }
                s.keys = keys;
                s.jwks_uri = Some(uri);
                s.fetched_at = Some(Instant::now());
                s.generation += 1;
                Ok(())
            }
            Err(e) => {
                s.jwks_uri = None;
                tracing::warn!(
                    issuer,
                    error = e,
                    "cannot fetch the issuer's keys; the keys held stay in use"
                );
                Err(e)
            }
        }
    }
}

/// The `jwks_uri` of `issuer`'s metadata: OpenID Connect discovery first, then RFC 8414. The
/// metadata's `issuer` must be `issuer` exactly.
async fn discover(issuer: &str, fetch: &dyn Fetch) -> Result<String, String> {
    let trimmed = issuer.trim_end_matches('/');
    let (origin, path) = match trimmed.split_once("://") {
        Some((scheme, rest)) => match rest.find('/') {
            Some(i) => (format!("{scheme}://{}", &rest[..i]), &rest[i..]),
            None => (trimmed.to_owned(), ""),
        },
        None => return Err(format!("issuer {issuer:?} is not a URL")),
    };
    let urls = [
        format!("{trimmed}/.well-known/openid-configuration"),
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
    ];
    let mut why = Vec::new();
    for url in &urls {
        let body = match fetch.get(url).await {
            Ok(b) => b,
            Err(e @ FetchError::Status(_)) => {
                why.push(format!("{url}: {e}"));
                continue;
            }
            Err(e) => return Err(format!("{url}: {e}")),
        };
        let metadata: Value =
            serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON metadata: {e}"))?;
        if metadata["issuer"].as_str() != Some(issuer) {
            return Err(format!(
                "{url}: the metadata's issuer {} is not {issuer:?}",
                metadata["issuer"]
            ));
        }
        return match metadata["jwks_uri"].as_str() {
            Some(uri) if uri.starts_with("https://") || is_loopback_http(uri) => Ok(uri.to_owned()),
            Some(uri) => Err(format!("{url}: jwks_uri {uri:?} is not an https:// URL")),
            None => Err(format!("{url}: no jwks_uri")),
        };
    }
    Err(format!(
        "no authorization server metadata: {}",
        why.join("; ")
    ))
}

/// `http://` on a loopback host, allowed as it is for the configured URLs.
fn is_loopback_http(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => format!("[{}]", v6.split(']').next().unwrap_or("")),
        None => authority.split(':').next().unwrap_or("").to_owned(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_signature_keys_that_fit_the_algorithm() {
        let ec = json!({"kty":"EC","crv":"P-256","kid":"ec","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"});
        let ed = json!({"kty":"OKP","crv":"Ed25519","kid":"ed","alg":"EdDSA","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"});
        let rsa = json!({"kty":"RSA","kid":"rsa","use":"sig","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"});
        let enc = json!({"kty":"RSA","kid":"enc","use":"enc","n":"sXch","e":"AQAB"});
        let hmac = json!({"kty":"oct","kid":"hs","k":"c2VjcmV0"});
        let weird = json!({"kty":"XYZ","kid":"x"});
        let short_ed = json!({"kty":"OKP","crv":"Ed25519","kid":"short","x":"11qYAYKx"});
        let body = json!({"keys":[ec, ed, rsa, enc, hmac, weird, short_ed]}).to_string();
        let keys = parse_jwks("https://id", body.as_bytes()).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.clone().unwrap()).collect();
        assert_eq!(kids, ["ec", "ed", "rsa"]);
        let state = State {
            keys,
            ..State::default()
        };
        assert!(state.find(Some("ec"), Algorithm::ES256).is_some());
        assert!(
            state.find(Some("ec"), Algorithm::ES384).is_none(),
            "P-256 is not ES384's"
        );
        assert!(state.find(Some("ec"), Algorithm::RS256).is_none());
        assert!(
            state.find(Some("ec"), Algorithm::HS256).is_none(),
            "never HMAC with a public key"
        );
        assert!(state.find(Some("rsa"), Algorithm::PS512).is_some());
        assert!(state.find(Some("ed"), Algorithm::EdDSA).is_some());
        assert!(state.find(Some("nope"), Algorithm::EdDSA).is_none());
        // Without a kid: the one key for the algorithm.
        assert!(state.find(None, Algorithm::EdDSA).is_some());
        assert!(parse_jwks("https://id", b"{\"keys\":{}}").is_err());
        assert!(parse_jwks("https://id", b"[]").is_err());
    }

    #[test]
    fn loopback_http_only() {
        assert!(is_loopback_http("http://127.0.0.1:9/jwks"));
        assert!(is_loopback_http("http://localhost/jwks"));
        assert!(is_loopback_http("http://[::1]:8/jwks"));
        assert!(!is_loopback_http("http://id.example.com/jwks"));
        assert!(!is_loopback_http("https://127.0.0.1/jwks"));
    }
}
