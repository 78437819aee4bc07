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
//! Wall-clock time for `exp` and `nbf` is the system time read once when the resource server
//! is made, moved on by `tokio::time` since: the server reads no other clock, so it runs the
//! same on turmoil's.

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
}

impl Default for OAuthOptions {
    fn default() -> Self {
        OAuthOptions {
            fetch: Arc::new(HttpFetch::new(gateway_client::TokioConnect)),
            jwks_max_age: Duration::from_secs(15 * 60),
            jwks_cooldown: Duration::from_secs(10),
            fetch_timeout: Duration::from_secs(5),
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
    /// The system time when this was made, and tokio's instant then.
    epoch: (SystemTime, tokio::time::Instant),
}

impl ResourceServer {
    pub fn new(config: Option<&OAuthConfig>, opts: OAuthOptions) -> Arc<ResourceServer> {
        let rs = Arc::new(ResourceServer {
            active: RwLock::new(Arc::new(Active::default())),
            opts,
            epoch: (SystemTime::now(), tokio::time::Instant::now()),
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

    /// Now, in seconds since the Unix epoch.
    fn now_unix(&self) -> u64 {
        let (system, instant) = self.epoch;
        (system + instant.elapsed())
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
