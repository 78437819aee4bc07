//! The server's side of OAuth (projects.toml's `[oauth]`; the core's `auth` module has the
//! decisions): verifying a request's bearer token as a JWT access token, and serving the
//! protected resource metadata (RFC 9728).
//!
//! [`ResourceServer::check`] runs in the task of each `/mcp` request, before the request goes
//! to the driver: it reads the token's header and unverified issuer ([`jwt::peek`]), gets the
//! issuer's key ([`keys::IssuerKeys`], fetching the JWKS on demand under a timeout), checks
//! the signature ([`jwt::verify`], jsonwebtoken) and the claims ([`jwt::principal`]), and
//! hands the core an [`AccessToken`]: a principal, or `Invalid` with the reason logged at
//! debug. The driver never waits on any of it.
//!
//! Wall-clock time for `exp` and `nbf` is read at each check from [`OAuthOptions::clock`]:
//! the system time by default ([`SystemClock`]), so a clock that was wrong at boot, corrected
//! by NTP since, or a host that was suspended, counts as the system counts it now (security
//! review finding 16). A simulation gives [`TokioClock`], a start instant moved on by
//! `tokio::time` (turmoil's), so that its runs stay a function of the seed.

pub mod fetch;
pub mod jwt;
pub mod keys;

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use gateway_core::{AccessToken, OAuthConfig};

pub use fetch::{Fetch, FetchError, HttpFetch, MAX_DOCUMENT_BYTES};
use jwt::Rejection;
use keys::{IssuerKeys, Timing};

/// The wall clock access tokens' `exp` and `nbf` are checked against, read at each check.
pub trait WallClock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The system's clock: `SystemTime::now()` at each check.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock for simulations: `start`, moved on by `tokio::time` since the clock was made
/// (turmoil's time under turmoil), so a run reads no real clock.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: SystemTime,
    at: tokio::time::Instant,
}

impl TokioClock {
    /// Reads `start` now, and later `start` plus the tokio time elapsed.
    pub fn starting_at(start: SystemTime) -> TokioClock {
        TokioClock {
            start,
            at: tokio::time::Instant::now(),
        }
    }
}

impl WallClock for TokioClock {
    fn now(&self) -> SystemTime {
        self.start + self.at.elapsed()
    }
}

/// How the server gets and keeps the authorization servers' keys.
#[derive(Clone)]
pub struct OAuthOptions {
    /// Fetches discovery metadata and JWKS. Default: [`HttpFetch`] over tokio TCP.
    pub fetch: Arc<dyn Fetch>,
    /// A key set older than this is fetched again (the old keys serve meanwhile). Default 15
    /// minutes.
    pub jwks_max_age: Duration,
    /// The least time between two fetches of one issuer's keys: a token naming an unknown key
    /// within it is refused at once. Default 10 s.
    pub jwks_cooldown: Duration,
    /// A fetch (discovery and JWKS) that takes longer fails, and so does the request that
    /// waited for it. Default 5 s.
    pub fetch_timeout: Duration,
    /// The wall clock tokens' validity times are checked against, at each check. Default
    /// [`SystemClock`]; a simulation gives a [`TokioClock`].
    pub clock: Arc<dyn WallClock>,
}

impl Default for OAuthOptions {
    fn default() -> Self {
        OAuthOptions {
            fetch: Arc::new(HttpFetch::new(gateway_client::TokioConnect)),
            jwks_max_age: Duration::from_secs(15 * 60),
            jwks_cooldown: Duration::from_secs(10),
            fetch_timeout: Duration::from_secs(5),
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for OAuthOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthOptions")
            .field("jwks_max_age", &self.jwks_max_age)
            .field("jwks_cooldown", &self.jwks_cooldown)
            .field("fetch_timeout", &self.fetch_timeout)
            .finish_non_exhaustive()
    }
}

/// The configuration in force and the keys of its issuers.
#[derive(Debug, Default)]
struct Active {
    config: Option<OAuthConfig>,
    issuers: HashMap<String, Arc<IssuerKeys>>,
}

/// Verifies access tokens and serves the metadata, for the `[oauth]` in force (none: it
/// checks nothing).
#[derive(Debug)]
pub struct ResourceServer {
    active: RwLock<Arc<Active>>,
    opts: OAuthOptions,
}

impl ResourceServer {
    pub fn new(config: Option<&OAuthConfig>, opts: OAuthOptions) -> Arc<ResourceServer> {
        let rs = Arc::new(ResourceServer {
            active: RwLock::new(Arc::new(Active::default())),
            opts,
        });
        rs.reconfigure(config);
        rs
    }

    fn active(&self) -> Arc<Active> {
        self.active
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn timing(&self) -> Timing {
        Timing {
            max_age: self.opts.jwks_max_age,
            cooldown: self.opts.jwks_cooldown,
            timeout: self.opts.fetch_timeout,
        }
    }

    /// Puts `config` in force (projects.toml was read again). The keys of issuers that stay
    /// are kept; a new issuer's are fetched in the background, when a runtime is there.
    pub fn reconfigure(&self, config: Option<&OAuthConfig>) {
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        if active.config.as_ref() == config {
            return;
        }
        let mut fresh = Vec::new();
        let issuers = config
            .map(|c| {
                c.authorization_servers
                    .iter()
                    .map(|iss| {
                        let keys = active.issuers.get(iss).cloned().unwrap_or_else(|| {
                            let k = Arc::new(IssuerKeys::new(iss));
                            fresh.push(k.clone());
                            k
                        });
                        (iss.clone(), keys)
                    })
                    .collect()
            })
            .unwrap_or_default();
        *active = Arc::new(Active {
            config: config.cloned(),
            issuers,
        });
        drop(active);
        match config {
            Some(c) => tracing::info!(
                resource = c.resource,
                authorization_servers = ?c.authorization_servers,
                "OAuth: access tokens for this resource are accepted"
            ),
            None => tracing::debug!("OAuth is off"),
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            for keys in fresh {
                keys.refresh_in_background(self.opts.fetch.clone(), self.timing());
            }
        }
    }

    /// The protected resource metadata (JSON), when OAuth is on.
    pub fn metadata(&self) -> Option<String> {
        self.active()
            .config
            .as_ref()
            .map(OAuthConfig::metadata_json)
    }

    /// Now, in seconds since the Unix epoch, as the clock says at this check.
    fn now_unix(&self) -> u64 {
        self.opts
            .clock
            .now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// What the request's `Authorization` header holds: nothing to check (OAuth is off, or
    /// no bearer token), a valid access token's principal, or an invalid token.
    pub async fn check(&self, authorization: Option<&str>) -> AccessToken {
        let active = self.active();
        let Some(config) = &active.config else {
            return AccessToken::Unchecked;
        };
        let Some(token) = bearer(authorization) else {
            return AccessToken::Unchecked;
        };
        match self.validate(&active, config, token).await {
            Ok(p) => AccessToken::Valid(Box::new(p)),
            Err(why) => {
                // A client token, when the file has them, is not an access token either:
                // the core lets it in all the same.
                tracing::debug!(reason = %why, "the bearer token is not a valid access token");
                AccessToken::Invalid
            }
        }
    }

    async fn validate(
        &self,
        active: &Active,
        config: &OAuthConfig,
        token: &str,
    ) -> Result<gateway_core::Principal, Rejection> {
        let unverified = jwt::peek(token, &config.authorization_servers)?;
        let keys = active
            .issuers
            .get(&unverified.issuer)
            .ok_or_else(|| Rejection::UnknownIssuer(unverified.issuer.clone()))?;
        let key = keys
            .key_for(
                unverified.kid.as_deref(),
                unverified.alg,
                &self.opts.fetch,
                self.timing(),
            )
            .await?;
        let claims = jwt::verify(token, &key, unverified.alg)?;
        jwt::principal(&claims, &unverified.issuer, config, self.now_unix())
    }
}

/// The token of a `Bearer` `Authorization` header (the scheme in any case).
fn bearer(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use base64::Engine as _;
    use bytes::Bytes;
    use futures_util::future::BoxFuture;
    use serde_json::json;

    use super::*;

    const ISSUER: &str = "https://id.example.com";
    const RESOURCE: &str = "https://gw.example.com/mcp";
    const NOW: u64 = 1_800_000_000;

    /// A clock a test sets by hand.
    struct HandClock(Mutex<SystemTime>);

    impl WallClock for Arc<HandClock> {
        fn now(&self) -> SystemTime {
            *self.0.lock().unwrap()
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// The issuer's discovery document and JWKS, from memory.
    struct Documents(String);

    impl Fetch for Documents {
        fn get(&self, url: &str) -> BoxFuture<'static, Result<Bytes, FetchError>> {
            let body = if url.ends_with("/.well-known/openid-configuration") {
                Ok(json!({"issuer": ISSUER, "jwks_uri": format!("{ISSUER}/jwks")}).to_string())
            } else if url == format!("{ISSUER}/jwks") {
                Ok(self.0.clone())
            } else {
                Err(FetchError::Status(404))
            };
            Box::pin(async move { body.map(Bytes::from) })
        }
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Security review finding 16: the wall clock is read at each check, not once at start
    /// and moved on by a monotonic clock: a token valid now is refused once the clock says it
    /// expired, though no tokio time passed, and one not yet valid is taken once it is.
    #[tokio::test]
    async fn each_check_reads_the_wall_clock() {
        let signing = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let jwks = json!({"keys":[{"kty":"OKP","crv":"Ed25519","use":"sig","alg":"EdDSA","kid":"k1",
            "x": b64(signing.verifying_key().as_bytes())}]});
        // PKCS#8 v1 for Ed25519: a fixed prefix, then the 32-byte seed.
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend_from_slice(signing.as_bytes());
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some("k1".into());
        header.typ = Some("at+jwt".into());
        let token = |nbf: u64, exp: u64| {
            let claims = json!({"iss": ISSUER, "sub": "agent", "aud": RESOURCE, "nbf": nbf, "exp": exp, "scope": "mcp"});
            let t = jsonwebtoken::encode(
                &header,
                &claims,
                &jsonwebtoken::EncodingKey::from_ed_der(&der),
            )
            .unwrap();
            format!("Bearer {t}")
        };
        let clock = Arc::new(HandClock(Mutex::new(at(NOW))));
        let config = OAuthConfig::new(RESOURCE, vec![ISSUER.into()], vec![]).unwrap();
        let leeway = config.leeway.as_secs();
        let rs = ResourceServer::new(
            Some(&config),
            OAuthOptions {
                fetch: Arc::new(Documents(jwks.to_string())),
                clock: Arc::new(clock.clone()),
                ..OAuthOptions::default()
            },
        );
        let valid = |t: &AccessToken| matches!(t, AccessToken::Valid(_));
        let expiring = token(NOW - 10, NOW + 60);
        assert!(valid(&rs.check(Some(&expiring)).await));
        *clock.0.lock().unwrap() = at(NOW + 60 + leeway);
        assert_eq!(rs.check(Some(&expiring)).await, AccessToken::Invalid);
        let later = token(NOW + 3600, NOW + 7200);
        assert_eq!(rs.check(Some(&later)).await, AccessToken::Invalid);
        *clock.0.lock().unwrap() = at(NOW + 3600);
        assert!(valid(&rs.check(Some(&later)).await));
    }

    #[test]
    fn the_default_clock_is_the_systems() {
        let before = SystemTime::now();
        let read = OAuthOptions::default().clock.now();
        assert!(read >= before && read <= SystemTime::now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_simulations_clock_moves_with_tokio_time() {
        let clock = TokioClock::starting_at(at(NOW));
        assert_eq!(clock.now(), at(NOW));
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(clock.now(), at(NOW + 90));
    }
}
