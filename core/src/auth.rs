//! Who gets in to `/mcp`: the decision on a request's credentials.
//!
//! Two ways in, set in projects.toml, each optional:
//!
//! - **Client tokens** (`client_tokens = [...]`): static bearer tokens, compared in constant
//!   time. The simple mode.
//! - **OAuth** (`[oauth]`): the gateway is an OAuth 2.1 resource server as the MCP
//!   authorization spec (2025-11-25, 2026-07-28) asks. Access tokens are JWTs from the
//!   configured authorization servers, for this gateway's resource URI:
//!
//! ```toml
//! [oauth]
//! resource = "https://gateway.example.com/mcp"        # this gateway's resource URI: every
//!                                                     # token's audience must name it
//! authorization_servers = ["https://id.example.com"]  # issuers, as their tokens' `iss`
//! required_scopes = ["mcp"]                           # optional: scopes every request needs
//! scopes_supported = ["mcp", "mcp:admin"]             # optional: default `required_scopes`
//! groups_claim = "groups"                             # optional: the claim naming groups
//! leeway_secs = 30                                    # optional: clock skew on exp/nbf
//! ```
//!
//! The split: the server verifies a token (signature against the issuer's JWKS, `iss`, `aud`,
//! `exp`/`nbf`), since that needs keys fetched over the network and the wall clock, and hands
//! the core what it found as an [`AccessToken`]: a [`Principal`] or `Invalid` (why is logged by
//! the server at debug, never told to the client). The core decides: `authenticate` turns the
//! request's credentials into an [`Identity`] or the refusal (401 with the challenge pointing
//! at the protected resource metadata, or 403 `insufficient_scope`).
//!
//! With both configured, a bearer token equal to one of `client_tokens` is that client token;
//! any other bearer token must be a valid access token.

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::error::HttpError;
use crate::registry::Registry;

/// The default of `leeway_secs`.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);

/// The largest `leeway_secs` accepted: past a few minutes an expired token is not "skew".
const MAX_LEEWAY_SECS: u64 = 300;

/// The path of the protected resource metadata (RFC 9728), before the resource's own path.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// `[oauth]` of projects.toml: this gateway as an OAuth resource server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthConfig {
    /// This gateway's resource URI (RFC 8707): what clients ask tokens for, and the audience
    /// every access token must name.
    pub resource: String,
    /// The authorization servers' issuer identifiers, compared exactly with a token's `iss`.
    pub authorization_servers: Vec<String>,
    /// Scopes a token must carry, all of them, to use `/mcp`; none: any valid token will do.
    pub required_scopes: Vec<String>,
    /// The scopes named in the metadata: the required ones, then the others configured.
    pub scopes_supported: Vec<String>,
    /// The claim (a string or an array of strings) that names the principal's groups.
    pub groups_claim: String,
    /// How far past `exp` (before `nbf`) a token is still taken, for clock skew.
    pub leeway: Duration,
}

impl OAuthConfig {
    /// A configuration for `resource` trusting `authorization_servers`, with the defaults for
    /// the rest; checked as the file's would be.
    pub fn new(
        resource: impl Into<String>,
        authorization_servers: Vec<String>,
        required_scopes: Vec<String>,
    ) -> Result<OAuthConfig, String> {
        let resource = resource.into();
        check_url(&resource).map_err(|m| format!("resource: {m}"))?;
        if authorization_servers.is_empty() {
            return Err("authorization_servers: name at least one".into());
        }
        for s in &authorization_servers {
            check_url(s).map_err(|m| format!("authorization_servers: {m}"))?;
        }
        for s in &required_scopes {
            check_scope(s).map_err(|m| format!("required_scopes: {m}"))?;
        }
        Ok(OAuthConfig {
            resource,
            authorization_servers,
            scopes_supported: required_scopes.clone(),
            required_scopes,
            groups_claim: "groups".into(),
            leeway: DEFAULT_LEEWAY,
        })
    }

    /// Where the protected resource metadata is: the resource's origin, then
    /// [`METADATA_PATH`], then the resource's path (RFC 9728 §3.1), e.g.
    /// `https://gw.example.com/.well-known/oauth-protected-resource/mcp`.
    pub fn resource_metadata_url(&self) -> String {
        let (scheme, rest) = self
            .resource
            .split_once("://")
            .expect("the resource URI was checked to have a scheme");
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let path = if path == "/" { "" } else { path };
        format!("{scheme}://{authority}{METADATA_PATH}{path}")
    }

    /// The protected resource metadata document (RFC 9728 §2), as JSON text.
    pub fn metadata_json(&self) -> String {
        serde_json::json!({
            "resource": self.resource,
            "authorization_servers": self.authorization_servers,
            "scopes_supported": self.scopes_supported,
            "bearer_methods_supported": ["header"],
            "resource_name": "mcp-gateway",
        })
        .to_string()
    }

    /// The `scope` of a challenge: the required scopes, space-separated, if any.
    fn challenge_scope(&self) -> Option<String> {
        (!self.required_scopes.is_empty()).then(|| self.required_scopes.join(" "))
    }
}

/// Who an access token speaks for: what the server read from a token it verified. Rules on
/// who may do what are decided on this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `iss`: one of the configured authorization servers.
    pub issuer: String,
    /// `sub`.
    pub subject: String,
    /// `client_id` (RFC 9068), else `azp`, when the token has one.
    pub client_id: Option<String>,
    /// `scope` (space-separated) or `scp` (an array).
    pub scopes: BTreeSet<String>,
    /// The configured groups claim (a string or an array of strings); empty without one.
    pub groups: Vec<String>,
}

/// What the server made of a request's bearer token (an [`crate::HttpRequest`] field).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AccessToken {
    /// Nothing was checked: OAuth is off, or the request has no bearer token.
    #[default]
    Unchecked,
    /// A JWT access token whose signature, issuer, audience and validity times the server
    /// verified.
    Valid(Box<Principal>),
    /// A bearer token that is not a valid access token for this gateway. Why is logged by the
    /// server, never told to the client.
    Invalid,
    /// A request another replica of the cluster relayed: who it let in, in a sealed envelope
    /// (`crate::keys`). No credential crosses the cluster (security review finding 3); this
    /// replica applies its own rules to the caller. Only a request marked
    /// [`crate::HttpRequest::relayed`] may carry it.
    Relayed(Caller),
}

/// Who a relayed request comes from, as the relaying replica verified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Client authentication was off there.
    Anonymous,
    /// A client token, by its owner name ([`Registry::client_token_owner`]: its name, or a
    /// hash of the token).
    ClientToken { owner: String },
    /// An OAuth access token's principal.
    Token(Box<Principal>),
}

/// Who a request comes from, once let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Client authentication is off.
    Anonymous,
    /// One of projects.toml's `client_tokens`, by its position in the list.
    ClientToken(usize),
    /// An OAuth access token's principal.
    Token(Box<Principal>),
}

impl Identity {
    /// What a session created by this identity is bound to: a request naming the session must
    /// come from the same one (the same client token, or the same issuer and subject). `None`
    /// when authentication is off. A client token owns by its name, or, unnamed, by a hash of
    /// the token itself: never by its position in the list, which a reload may change
    /// (security review finding 12).
    pub(crate) fn session_owner(&self, registry: &Registry) -> Option<String> {
        match self {
            Identity::Anonymous => None,
            Identity::ClientToken(i) => registry.client_token_owner(*i).map(str::to_owned),
            Identity::Token(p) => Some(format!("oauth {} {}", p.issuer, p.subject)),
        }
    }

    /// What a request let in as this identity carries from here on, instead of its
    /// credentials: who it is, for a replica it is relayed to.
    pub(crate) fn as_relayed(&self, registry: &Registry) -> AccessToken {
        AccessToken::Relayed(match self {
            Identity::Anonymous => Caller::Anonymous,
            Identity::ClientToken(i) => match registry.client_token_owner(*i) {
                Some(owner) => Caller::ClientToken {
                    owner: owner.to_owned(),
                },
                None => Caller::Anonymous,
            },
            Identity::Token(p) => Caller::Token(p.clone()),
        })
    }
}

/// Who set up something that outlives its request (a session, a resource subscription, a
/// `subscriptions/listen` stream, a parked `wait`), kept so that what it may see can be asked
/// again under the rules in force: a reload that takes a project away ends what was set up on
/// it (security review finding 14). A client token is held by its owner
/// ([`Identity::session_owner`]: its name, or a hash of it), never by its position in the
/// list, which a reload may change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Client authentication was off.
    Anonymous,
    /// A client token, by its owner (`client <name>` or `client sha256:<hash>`).
    ClientToken(String),
    /// An OAuth access token's principal, as its latest request proved it.
    Token(Box<Principal>),
}

impl Holder {
    /// The holder `identity` (let in under `registry`) is.
    pub(crate) fn of(identity: &Identity, registry: &Registry) -> Holder {
        match identity {
            Identity::Anonymous => Holder::Anonymous,
            // The index comes from `registry` itself, so it has an owner; without one the
            // holder names no token, and sees nothing.
            Identity::ClientToken(i) => {
                Holder::ClientToken(registry.client_token_owner(*i).unwrap_or("").to_owned())
            }
            Identity::Token(p) => Holder::Token(p.clone()),
        }
    }

    /// The holder of a session known only by its owner (one another replica made): an OAuth
    /// principal is then known by its issuer and subject only, without its client or groups,
    /// until its next request here.
    pub(crate) fn of_owner(owner: Option<&str>) -> Holder {
        let Some(owner) = owner else {
            return Holder::Anonymous;
        };
        match owner
            .strip_prefix("oauth ")
            .and_then(|rest| rest.split_once(' '))
        {
            Some((issuer, subject)) => Holder::Token(Box::new(Principal {
                issuer: issuer.to_owned(),
                subject: subject.to_owned(),
                client_id: None,
                scopes: BTreeSet::new(),
                groups: Vec::new(),
            })),
            None => Holder::ClientToken(owner.to_owned()),
        }
    }

    /// Who the holder is under `registry`, as a request of theirs would be let in; `None` when
    /// it would not be (its token or issuer is gone, or anonymous callers are no longer let
    /// in).
    pub(crate) fn identity(&self, registry: &Registry) -> Option<Identity> {
        match self {
            Holder::Anonymous => (registry.client_tokens().is_empty()
                && registry.oauth().is_none())
            .then_some(Identity::Anonymous),
            Holder::ClientToken(owner) => (0..registry.client_tokens().len())
                .find(|&i| registry.client_token_owner(i) == Some(owner.as_str()))
                .map(Identity::ClientToken),
            Holder::Token(p) => registry
                .oauth()
                .is_some_and(|o| o.authorization_servers.contains(&p.issuer))
                .then(|| Identity::Token(p.clone())),
        }
    }
}

/// Whether a session owned by `owner` may still be used under `registry`: its client token is
/// still listed (by name, or the same token), or its issuer is still an authorization server.
/// A reload that revokes a token or an issuer ends its sessions.
pub(crate) fn owner_still_admitted(owner: &str, registry: &Registry) -> bool {
    if let Some(rest) = owner.strip_prefix("oauth ") {
        return registry.oauth().is_some_and(|o| {
            o.authorization_servers
                .iter()
                .any(|issuer| rest.starts_with(&format!("{issuer} ")))
        });
    }
    (0..registry.client_tokens().len()).any(|i| registry.client_token_owner(i) == Some(owner))
}

/// The bearer token of an `Authorization` header (the scheme is case-insensitive).
fn bearer(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Lets a request in as an [`Identity`], or refuses it: 401 when credentials are needed and
/// missing or invalid, 403 `insufficient_scope` when a valid access token lacks a required
/// scope. A request let in before ([`AccessToken::Relayed`]: by the replica that relayed it, or
/// by this one) is let in by its [`Caller`] under this replica's rules; a relayed request
/// (`relayed`) by nothing else.
pub fn authenticate(
    registry: &Registry,
    authorization: Option<&str>,
    access_token: &AccessToken,
    relayed: bool,
) -> Result<Identity, HttpError> {
    let tokens = registry.client_tokens();
    let oauth = registry.oauth();
    match access_token {
        // Let in before: by another replica (in its sealed envelope), or by this one when the
        // request is handled again (held for a project's next holder, for instance). Only the
        // core and the relay's verified envelope make one; the server never does from a client.
        AccessToken::Relayed(caller) => return relayed_caller(registry, caller),
        // A relayed request without its caller: a driver's mistake, no way in.
        _ if relayed => {
            return Err(HttpError::Unauthorized {
                presented: false,
                resource_metadata: None,
                scope: None,
            })
        }
        _ => {}
    }
    if tokens.is_empty() && oauth.is_none() {
        return Ok(Identity::Anonymous);
    }
    let given = bearer(authorization);
    if let Some(g) = given {
        if let Some(i) = tokens.iter().position(|t| t.matches(g)) {
            return Ok(Identity::ClientToken(i));
        }
    }
    let presented = given.is_some();
    let Some(oauth) = oauth else {
        return Err(HttpError::Unauthorized {
            presented,
            resource_metadata: None,
            scope: None,
        });
    };
    match access_token {
        AccessToken::Valid(p) if presented => {
            if oauth
                .required_scopes
                .iter()
                .all(|s| p.scopes.contains(s.as_str()))
            {
                Ok(Identity::Token(p.clone()))
            } else {
                Err(HttpError::InsufficientScope {
                    scope: oauth.required_scopes.join(" "),
                    resource_metadata: oauth.resource_metadata_url(),
                })
            }
        }
        // A principal without a bearer token in the header is a driver's mistake: no way in.
        AccessToken::Valid(_)
        | AccessToken::Unchecked
        | AccessToken::Invalid
        | AccessToken::Relayed(_) => Err(HttpError::Unauthorized {
            presented,
            resource_metadata: Some(oauth.resource_metadata_url()),
            scope: oauth.challenge_scope(),
        }),
    }
}

/// The identity of a relayed request's caller under this replica's rules: the same client
/// token (by owner) still listed, or a principal of an issuer still configured with the
/// required scopes; anonymous only where authentication is off here too.
fn relayed_caller(registry: &Registry, caller: &Caller) -> Result<Identity, HttpError> {
    let refused = || HttpError::Unauthorized {
        presented: true,
        resource_metadata: registry.oauth().map(OAuthConfig::resource_metadata_url),
        scope: registry.oauth().and_then(OAuthConfig::challenge_scope),
    };
    let open = registry.client_tokens().is_empty() && registry.oauth().is_none();
    match caller {
        Caller::Anonymous if open => Ok(Identity::Anonymous),
        Caller::Anonymous => Err(refused()),
        Caller::ClientToken { owner } => (0..registry.client_tokens().len())
            .find(|i| registry.client_token_owner(*i) == Some(owner.as_str()))
            .map(Identity::ClientToken)
            .ok_or_else(refused),
        Caller::Token(p) => {
            let Some(oauth) = registry.oauth() else {
                return Err(refused());
            };
            if !oauth.authorization_servers.contains(&p.issuer) {
                return Err(refused());
            }
            if !oauth
                .required_scopes
                .iter()
                .all(|s| p.scopes.contains(s.as_str()))
            {
                return Err(HttpError::InsufficientScope {
                    scope: oauth.required_scopes.join(" "),
                    resource_metadata: oauth.resource_metadata_url(),
                });
            }
            Ok(Identity::Token(p.clone()))
        }
    }
}

/// `[oauth]` as written in projects.toml.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOAuth {
    resource: Spanned<String>,
    authorization_servers: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    required_scopes: Vec<Spanned<String>>,
    scopes_supported: Option<Spanned<Vec<Spanned<String>>>>,
    groups_claim: Option<Spanned<String>>,
    leeway_secs: Option<Spanned<u64>>,
}

/// A refusal of `[oauth]`: where, which field, what.
pub(crate) type RawError = (Option<Range<usize>>, String, String);

impl RawOAuth {
    pub(crate) fn check(self) -> Result<OAuthConfig, RawError> {
        let err = |span: Range<usize>, field: String, m: String| (Some(span), field, m);
        check_url(self.resource.get_ref())
            .map_err(|m| err(self.resource.span(), "oauth.resource".into(), m))?;
        let servers_span = self.authorization_servers.span();
        let servers = self.authorization_servers.into_inner();
        if servers.is_empty() {
            return Err(err(
                servers_span,
                "oauth.authorization_servers".into(),
                "name at least one authorization server (its issuer URL)".into(),
            ));
        }
        let mut authorization_servers = Vec::with_capacity(servers.len());
        for (i, s) in servers.into_iter().enumerate() {
            let field = format!("oauth.authorization_servers[{i}]");
            check_url(s.get_ref()).map_err(|m| err(s.span(), field.clone(), m))?;
            if authorization_servers.contains(s.get_ref()) {
                return Err(err(s.span(), field, "listed twice".into()));
            }
            authorization_servers.push(s.into_inner());
        }
        let mut required_scopes: Vec<String> = Vec::new();
        for (i, s) in self.required_scopes.into_iter().enumerate() {
            let field = format!("oauth.required_scopes[{i}]");
            check_scope(s.get_ref()).map_err(|m| err(s.span(), field, m))?;
            if !required_scopes.contains(s.get_ref()) {
                required_scopes.push(s.into_inner());
            }
        }
        let mut scopes_supported = required_scopes.clone();
        if let Some(listed) = self.scopes_supported {
            let listed_span = listed.span();
            let mut named = BTreeSet::new();
            for (i, s) in listed.into_inner().into_iter().enumerate() {
                let field = format!("oauth.scopes_supported[{i}]");
                check_scope(s.get_ref()).map_err(|m| err(s.span(), field, m))?;
                named.insert(s.get_ref().clone());
                if !scopes_supported.contains(s.get_ref()) {
                    scopes_supported.push(s.into_inner());
                }
            }
            if let Some(missing) = required_scopes.iter().find(|s| !named.contains(*s)) {
                return Err((
                    Some(listed_span),
                    "oauth.scopes_supported".into(),
                    format!("lists no '{missing}', which required_scopes requires: clients choose the scopes they ask for from this list"),
                ));
            }
        }
        let groups_claim = match self.groups_claim {
            Some(g) if g.get_ref().is_empty() => {
                return Err(err(
                    g.span(),
                    "oauth.groups_claim".into(),
                    "must not be empty".into(),
                ))
            }
            Some(g) => g.into_inner(),
            None => "groups".into(),
        };
        let leeway = match self.leeway_secs {
            Some(l) if *l.get_ref() > MAX_LEEWAY_SECS => {
                return Err(err(
                    l.span(),
                    "oauth.leeway_secs".into(),
                    format!("at most {MAX_LEEWAY_SECS} seconds"),
                ))
            }
            Some(l) => Duration::from_secs(l.into_inner()),
            None => DEFAULT_LEEWAY,
        };
        Ok(OAuthConfig {
            resource: self.resource.into_inner(),
            authorization_servers,
            required_scopes,
            scopes_supported,
            groups_claim,
            leeway,
        })
    }
}

/// An absolute `https://` URL without query or fragment (`http://` only for a loopback host,
/// for development and tests), with nothing that would need escaping in a header.
fn check_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("'{url}' is not an absolute https:// URL"));
    };
    if url
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\\'))
    {
        return Err(format!(
            "'{url}' has whitespace, a control character, a quote or a backslash"
        ));
    }
    if rest.contains('#') || rest.contains('?') {
        return Err(format!("'{url}' must have no query and no fragment"));
    }
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().map(|h| format!("[{h}]")),
        None => authority.split(':').next().map(str::to_owned),
    }
    .unwrap_or_default();
    if host.is_empty() || authority.contains('@') {
        return Err(format!("'{url}' has no host"));
    }
    match scheme {
        "https" => Ok(()),
        "http" if is_loopback(&host) => Ok(()),
        "http" => Err(format!(
            "'{url}': http:// only for a loopback host (localhost, 127.0.0.1, [::1]); use https://"
        )),
        _ => Err(format!("'{url}' is not an absolute https:// URL")),
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A scope token (RFC 6749 §3.3): printable ASCII but space, `"` and `\`.
fn check_scope(scope: &str) -> Result<(), String> {
    if scope.is_empty() {
        return Err("a scope must not be empty".into());
    }
    match scope
        .chars()
        .find(|c| !matches!(c, '\x21' | '\x23'..='\x5b' | '\x5d'..='\x7e'))
    {
        Some(c) => Err(format!(
            "'{scope}' has the character {c:?}: a scope is printable ASCII without spaces, quotes or backslashes"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(resource: &str) -> OAuthConfig {
        OAuthConfig::new(
            resource,
            vec!["https://id.example.com".into()],
            vec!["mcp".into()],
        )
        .unwrap()
    }

    #[test]
    fn the_metadata_url_sits_between_host_and_path() {
        let cases = [
            (
                "https://gw.example.com/mcp",
                "https://gw.example.com/.well-known/oauth-protected-resource/mcp",
            ),
            (
                "https://gw.example.com",
                "https://gw.example.com/.well-known/oauth-protected-resource",
            ),
            (
                "https://gw.example.com/",
                "https://gw.example.com/.well-known/oauth-protected-resource",
            ),
            (
                "http://127.0.0.1:8080/mcp",
                "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp",
            ),
        ];
        for (resource, want) in cases {
            assert_eq!(config(resource).resource_metadata_url(), want, "{resource}");
        }
    }

    #[test]
    fn urls_and_scopes_are_checked() {
        for bad in [
            "gw.example.com/mcp",
            "ftp://gw.example.com",
            "http://gw.example.com/mcp",
            "https://gw.example.com/mcp?x=1",
            "https://gw.example.com/mcp#f",
            "https:///mcp",
            "https://user@gw.example.com/",
            "https://gw.example.com/a\"b",
        ] {
            assert!(check_url(bad).is_err(), "{bad} accepted");
        }
        for good in [
            "https://gw.example.com/mcp",
            "http://localhost:9/mcp",
            "http://127.0.0.2/mcp",
            "http://[::1]:80/",
        ] {
            assert_eq!(check_url(good), Ok(()), "{good}");
        }
        assert!(check_scope("mcp:tools.read").is_ok());
        for bad in ["", "a b", "a\"b", "a\\b", "é"] {
            assert!(check_scope(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn bearer_schemes_are_case_insensitive() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("BEARER abc")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    /// A holder outlives its request and the registry it came in under: it is found again by
    /// its token's name (not its position), and is nobody once its credentials are gone.
    #[test]
    fn a_holder_is_found_again_after_a_reload_by_name_not_position() {
        let file = |tokens: &str| {
            Registry::parse(
                "projects.toml",
                &format!(
                    "client_tokens = [{tokens}]\n[[project]]\nname = \"alpha\"\nurl = \"http://a\"\n"
                ),
            )
            .unwrap()
        };
        let alice = r#"{ name = "alice", token = "alice-token-0123456789" }"#;
        let bob = r#"{ name = "bob", token = "bob-token-0123456789abc" }"#;
        let before = file(&format!("{alice}, {bob}"));
        let holder = Holder::of(&Identity::ClientToken(0), &before);
        assert_eq!(holder, Holder::ClientToken("client alice".into()));
        // Reordered: still alice, at her new place.
        let after = file(&format!("{bob}, {alice}"));
        assert_eq!(holder.identity(&after), Some(Identity::ClientToken(1)));
        // Revoked: nobody; and an anonymous holder is nobody once tokens are needed.
        assert_eq!(holder.identity(&file(bob)), None);
        assert_eq!(Holder::Anonymous.identity(&after), None);
        // A session known only by its owner: an OAuth subject without its groups.
        let Holder::Token(p) = Holder::of_owner(Some("oauth https://id.example.com agent 7"))
        else {
            panic!("an OAuth holder");
        };
        assert_eq!(
            (p.issuer.as_str(), p.subject.as_str()),
            ("https://id.example.com", "agent 7")
        );
        assert!(p.groups.is_empty());
        assert_eq!(Holder::of_owner(None), Holder::Anonymous);
        assert_eq!(
            Holder::of_owner(Some("client bob")),
            Holder::ClientToken("client bob".into())
        );
    }
}
