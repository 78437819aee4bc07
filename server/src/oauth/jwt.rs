//! A JWT access token, read and checked: [`peek`] at the unverified header and issuer (to find
//! the key), [`verify`] the signature (jsonwebtoken), then [`principal`] from the verified
//! claims (issuer, audience, times, and the types of the claims a principal is made of).
//!
//! Every failure is a [`Rejection`], logged at debug by the caller and never told to the
//! client, who only learns that the token is not valid.

use std::collections::BTreeSet;

use base64::Engine as _;
use gateway_core::{OAuthConfig, Principal};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

/// The longest token looked at; real access tokens are 1–4 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a bearer token is not a valid access token for this gateway.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the token is longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error("not a signed JWT: {0}")]
    Malformed(&'static str),
    #[error("algorithm {0:?} is not accepted (only RS*, PS*, ES256, ES384 and EdDSA)")]
    Algorithm(String),
    #[error("the header names critical extensions")]
    Critical,
    #[error("typ {0:?} is not an access token's")]
    Type(String),
    #[error("issuer {0:?} is not a configured authorization server")]
    UnknownIssuer(String),
    #[error("the issuer has no key {kid:?} for {alg:?}")]
    UnknownKey { kid: Option<String>, alg: Algorithm },
    #[error("the issuer's keys could not be fetched: {0}")]
    KeysUnavailable(String),
    #[error("the signature does not verify: {0}")]
    Signature(String),
    #[error("claim `{0}` is missing")]
    MissingClaim(&'static str),
    #[error("claim `{0}` has the wrong type")]
    ClaimType(String),
    #[error("the audience does not name this gateway's resource")]
    Audience,
    #[error("expired")]
    Expired,
    #[error("not valid yet (nbf)")]
    NotYetValid,
}

/// What a token says of itself before its signature is checked: enough to find the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unverified {
    pub alg: Algorithm,
    pub kid: Option<String>,
    pub issuer: String,
}

/// The algorithms accepted: asymmetric signatures only (no `none`, no HS*, which would let
/// anyone holding a public key sign).
fn accepted(alg: &str) -> Option<Algorithm> {
    Some(match alg {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

/// A base64url (unpadded) JSON object.
fn json_part(part: &str) -> Result<Map<String, Value>, Rejection> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| Rejection::Malformed("a part is not base64url"))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(Rejection::Malformed("a part is not a JSON object")),
    }
}

/// Reads the header and the issuer of a compact JWS, without trusting either: the algorithm
/// must be one accepted, the issuer one of `issuers` (exactly).
pub fn peek(token: &str, issuers: &[String]) -> Result<Unverified, Rejection> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Rejection::TooLong);
    }
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Rejection::Malformed("not three dot-separated parts"));
    };
    if signature.is_empty() {
        return Err(Rejection::Malformed("no signature"));
    }
    let header = json_part(header)?;
    let alg = match header.get("alg") {
        Some(Value::String(a)) => accepted(a).ok_or_else(|| Rejection::Algorithm(a.clone()))?,
        Some(other) => return Err(Rejection::Algorithm(other.to_string())),
        None => return Err(Rejection::Malformed("no alg")),
    };
    if header.contains_key("crit") {
        return Err(Rejection::Critical);
    }
    match header.get("typ") {
        None => {}
        Some(Value::String(t))
            if ["at+jwt", "application/at+jwt", "jwt"]
                .iter()
                .any(|ok| t.eq_ignore_ascii_case(ok)) => {}
        Some(other) => return Err(Rejection::Type(other.to_string())),
    }
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(k)) => Some(k.clone()),
        Some(_) => return Err(Rejection::ClaimType("kid (header)".into())),
    };
    let claims = json_part(payload)?;
    let issuer = match claims.get("iss") {
        Some(Value::String(i)) => i,
        Some(_) => return Err(Rejection::ClaimType("iss".into())),
        None => return Err(Rejection::MissingClaim("iss")),
    };
    if !issuers.iter().any(|s| s == issuer) {
        return Err(Rejection::UnknownIssuer(issuer.clone()));
    }
    Ok(Unverified {
        alg,
        kid,
        issuer: issuer.clone(),
    })
}

/// Checks the signature with `key` under `alg` (which the key must be for) and returns the
/// claims. Nothing else about them is checked here.
pub fn verify(
    token: &str,
    key: &DecodingKey,
    alg: Algorithm,
) -> Result<Map<String, Value>, Rejection> {
    let mut validation = Validation::new(alg);
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation)
        .map(|data| data.claims)
        .map_err(|e| Rejection::Signature(e.to_string()))
}

/// A NumericDate claim (RFC 7519): a non-negative number of seconds.
fn numeric_date(claims: &Map<String, Value>, name: &'static str) -> Result<Option<f64>, Rejection> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(t)),
            _ => Err(Rejection::ClaimType(name.into())),
        },
        Some(_) => Err(Rejection::ClaimType(name.into())),
    }
}

fn string(claims: &Map<String, Value>, name: &str) -> Result<Option<String>, Rejection> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Rejection::ClaimType(name.into())),
    }
}

/// A claim that is a string or an array of strings.
fn strings(claims: &Map<String, Value>, name: &str) -> Result<Option<Vec<String>>, Rejection> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(Rejection::ClaimType(name.into())),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(Rejection::ClaimType(name.into())),
    }
}

/// The principal of verified `claims` from `issuer`, if they make a valid access token for
/// this gateway at `now` (Unix seconds): `iss` is `issuer`, `aud` names the resource, `exp` is
/// ahead (and `nbf` behind) within the leeway, `sub` is a string, and the claims a principal
/// is made of have their types.
pub fn principal(
    claims: &Map<String, Value>,
    issuer: &str,
    config: &OAuthConfig,
    now: u64,
) -> Result<Principal, Rejection> {
    match string(claims, "iss")? {
        Some(iss) if iss == issuer => {}
        Some(iss) => return Err(Rejection::UnknownIssuer(iss)),
        None => return Err(Rejection::MissingClaim("iss")),
    }
    let audience = strings(claims, "aud")?.ok_or(Rejection::MissingClaim("aud"))?;
    if !audience.contains(&config.resource) {
        return Err(Rejection::Audience);
    }
    let now = now as f64;
    let leeway = config.leeway.as_secs_f64();
    let exp = numeric_date(claims, "exp")?.ok_or(Rejection::MissingClaim("exp"))?;
    if now >= exp + leeway {
        return Err(Rejection::Expired);
    }
    if let Some(nbf) = numeric_date(claims, "nbf")? {
        if now + leeway < nbf {
            return Err(Rejection::NotYetValid);
        }
    }
    numeric_date(claims, "iat")?;
    let subject = string(claims, "sub")?.ok_or(Rejection::MissingClaim("sub"))?;
    let client_id = match string(claims, "client_id")? {
        Some(c) => Some(c),
        None => string(claims, "azp")?,
    };
    let mut scopes = BTreeSet::new();
    if let Some(s) = string(claims, "scope")? {
        scopes.extend(s.split(' ').filter(|s| !s.is_empty()).map(str::to_owned));
    }
    if let Some(scp) = strings(claims, "scp")? {
        for s in scp {
            scopes.extend(s.split(' ').filter(|s| !s.is_empty()).map(str::to_owned));
        }
    }
    let groups = strings(claims, &config.groups_claim)?.unwrap_or_default();
    Ok(Principal {
        issuer: issuer.to_owned(),
        subject,
        client_id,
        scopes,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ISSUER: &str = "https://id.example.com";
    const RESOURCE: &str = "https://gw.example.com/mcp";
    const NOW: u64 = 1_800_000_000;

    fn b64(v: &Value) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    }

    fn token(header: Value, claims: Value) -> String {
        format!("{}.{}.c2ln", b64(&header), b64(&claims))
    }

    fn config() -> OAuthConfig {
        let mut c = OAuthConfig::new(RESOURCE, vec![ISSUER.into()], vec!["mcp".into()]).unwrap();
        c.groups_claim = "roles".into();
        c
    }

    fn good_claims() -> Map<String, Value> {
        let Value::Object(m) = json!({
            "iss": ISSUER, "sub": "agent-7", "aud": [RESOURCE, "other"], "client_id": "ops-bot",
            "exp": NOW + 60, "nbf": NOW - 5, "iat": NOW - 5, "scope": "mcp openid", "roles": ["ops"],
        }) else {
            unreachable!("an object literal")
        };
        m
    }

    #[test]
    fn peek_reads_algorithm_key_id_and_issuer() {
        let issuers = [ISSUER.to_owned()];
        let t = token(
            json!({"alg":"ES256","kid":"k1","typ":"at+jwt"}),
            json!({"iss": ISSUER}),
        );
        assert_eq!(
            peek(&t, &issuers),
            Ok(Unverified {
                alg: Algorithm::ES256,
                kid: Some("k1".into()),
                issuer: ISSUER.into()
            })
        );
        let refused =
            |header: Value, claims: Value| peek(&token(header, claims), &issuers).unwrap_err();
        let iss = json!({"iss": ISSUER});
        assert_eq!(
            refused(json!({"alg":"none"}), iss.clone()),
            Rejection::Algorithm("none".into())
        );
        assert_eq!(
            refused(json!({"alg":"HS256"}), iss.clone()),
            Rejection::Algorithm("HS256".into())
        );
        assert_eq!(
            refused(json!({"alg":["RS256"]}), iss.clone()),
            Rejection::Algorithm("[\"RS256\"]".into())
        );
        assert_eq!(
            refused(json!({"typ":"JWT"}), iss.clone()),
            Rejection::Malformed("no alg")
        );
        assert_eq!(
            refused(json!({"alg":"RS256","crit":["exp"]}), iss.clone()),
            Rejection::Critical
        );
        assert_eq!(
            refused(json!({"alg":"RS256","typ":"dpop+jwt"}), iss.clone()),
            Rejection::Type("\"dpop+jwt\"".into())
        );
        assert_eq!(
            refused(json!({"alg":"RS256","kid":7}), iss.clone()),
            Rejection::ClaimType("kid (header)".into())
        );
        assert_eq!(
            refused(json!({"alg":"RS256"}), json!({"iss": "https://evil"})),
            Rejection::UnknownIssuer("https://evil".into())
        );
        assert_eq!(
            refused(json!({"alg":"RS256"}), json!({"iss": 1})),
            Rejection::ClaimType("iss".into())
        );
        assert_eq!(
            refused(json!({"alg":"RS256"}), json!({})),
            Rejection::MissingClaim("iss")
        );
        for garbage in [
            "",
            "a",
            "a.b",
            "a.b.c.d",
            "!!.e30.x",
            "e30.e30.",
            "W10.e30.x",
            &"a".repeat(MAX_TOKEN_BYTES + 1),
        ] {
            assert!(peek(garbage, &issuers).is_err(), "{garbage:.20}");
        }
    }

    #[test]
    fn a_principal_from_good_claims() {
        let p = principal(&good_claims(), ISSUER, &config(), NOW).unwrap();
        assert_eq!(p.subject, "agent-7");
        assert_eq!(p.client_id.as_deref(), Some("ops-bot"));
        assert_eq!(p.scopes.iter().collect::<Vec<_>>(), ["mcp", "openid"]);
        assert_eq!(p.groups, ["ops"]);
        // scp as an array, azp for the client, one audience as a string.
        let mut c = good_claims();
        c.remove("scope");
        c.remove("client_id");
        c.insert("scp".into(), json!(["mcp", "x"]));
        c.insert("azp".into(), json!("other-bot"));
        c.insert("aud".into(), json!(RESOURCE));
        let p = principal(&c, ISSUER, &config(), NOW).unwrap();
        assert_eq!(p.scopes.iter().collect::<Vec<_>>(), ["mcp", "x"]);
        assert_eq!(p.client_id.as_deref(), Some("other-bot"));
    }

    #[test]
    fn claims_that_refuse_a_token() {
        let leeway = config().leeway.as_secs();
        let cases: Vec<(&str, Value, Rejection)> = vec![
            (
                "aud",
                json!("https://other.example.com/mcp"),
                Rejection::Audience,
            ),
            (
                "aud",
                json!(["https://gw.example.com/mcp/"]),
                Rejection::Audience,
            ),
            ("aud", json!(7), Rejection::ClaimType("aud".into())),
            (
                "aud",
                json!([RESOURCE, 7]),
                Rejection::ClaimType("aud".into()),
            ),
            ("exp", json!(NOW - leeway), Rejection::Expired),
            (
                "exp",
                json!("2099-01-01"),
                Rejection::ClaimType("exp".into()),
            ),
            ("exp", json!(-1), Rejection::ClaimType("exp".into())),
            ("nbf", json!(NOW + leeway + 1), Rejection::NotYetValid),
            ("iat", json!(true), Rejection::ClaimType("iat".into())),
            (
                "iss",
                json!("https://id.example.com/"),
                Rejection::UnknownIssuer("https://id.example.com/".into()),
            ),
            ("sub", json!(42), Rejection::ClaimType("sub".into())),
            (
                "scope",
                json!(["mcp"]),
                Rejection::ClaimType("scope".into()),
            ),
            (
                "scp",
                json!({"mcp": true}),
                Rejection::ClaimType("scp".into()),
            ),
            (
                "client_id",
                json!(null),
                Rejection::ClaimType("client_id".into()),
            ),
            (
                "roles",
                json!([["ops"]]),
                Rejection::ClaimType("roles".into()),
            ),
        ];
        for (claim, value, want) in cases {
            let mut c = good_claims();
            c.insert(claim.into(), value.clone());
            assert_eq!(
                principal(&c, ISSUER, &config(), NOW),
                Err(want),
                "{claim} = {value}"
            );
        }
        for claim in ["aud", "exp", "sub", "iss"] {
            let mut c = good_claims();
            c.remove(claim);
            assert!(
                principal(&c, ISSUER, &config(), NOW).is_err(),
                "without {claim}"
            );
        }
        // Within the leeway either side, a token is taken.
        let mut c = good_claims();
        c.insert("exp".into(), json!(NOW - leeway + 1));
        c.insert("nbf".into(), json!(NOW + leeway));
        assert!(principal(&c, ISSUER, &config(), NOW).is_ok());
    }
}
