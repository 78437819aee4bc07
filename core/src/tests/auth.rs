//! Who gets in: uplink tokens per project, bearer tokens for clients.

use serde_json::json;

use super::Harness;
use crate::{AccessToken, Config, Gateway, HttpRequest, Input, ProjectSpec, Registry, Secret};

const SLED_TOKEN: &str = "sled-token-0123456789";
const CLIENT_TOKEN: &str = "client-token-0123456789";

/// alpha with the harness's uplink token, beta with its own, gamma with none.
fn harness() -> Harness {
    let mut h = Harness::new();
    let mut alpha = ProjectSpec::new("alpha", "http://127.0.0.1:9101");
    alpha.token = Some(Secret::new(super::HARNESS_UPLINK_TOKEN));
    let mut beta = ProjectSpec::new("beta", "http://127.0.0.1:9102");
    beta.token = Some(Secret::new(SLED_TOKEN));
    let gamma = ProjectSpec::new("gamma", "http://127.0.0.1:9103");
    let registry = Registry::from_projects(vec![alpha, beta, gamma], Some("alpha"))
        .unwrap()
        .with_client_tokens(vec![Secret::new(CLIENT_TOKEN)]);
    h.gw = Gateway::new(registry, Config::default(), [1; 32]);
    h
}

#[test]
fn an_uplink_needs_its_projects_token_and_an_impostor_replaces_nothing() {
    let mut h = harness();
    for token in [None, Some("wrong-token-0123456789")] {
        let u = h.open_uplink();
        let mut hello = json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta"});
        if let Some(t) = token {
            hello["token"] = json!(t);
        }
        h.sled_says(u, hello);
        assert_eq!(h.closed[&u].0, 4006);
        assert!(
            !h.closed[&u].1.contains("wrong-token"),
            "no secret in the reason"
        );
    }
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta","token":SLED_TOKEN}),
    );
    assert!(!h.closed.contains_key(&u));
    assert!(h.gw.is_live("beta"));
    // An impostor without the token does not take the live uplink's place.
    let impostor = h.open_uplink();
    h.sled_says(
        impostor,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"evil"}),
    );
    assert_eq!(h.closed[&impostor].0, 4006);
    assert!(!h.closed.contains_key(&u));
    assert!(h.gw.is_live("beta"));
    // A project with neither a token nor a pin takes no hello: uplinks are closed by default.
    let g = h.open_uplink();
    h.sled_says(
        g,
        json!({"uplink":"hello","protocol":1,"project":"gamma","sled":"gamma"}),
    );
    assert_eq!(h.closed[&g].0, 4006);
    assert!(
        h.closed[&g].1.contains("allow_unauthenticated_uplinks"),
        "the reason says how to open it: {}",
        h.closed[&g].1
    );
    assert!(!h.gw.is_live("gamma"));
}

/// The same projects as [`harness`], with `allow_unauthenticated_uplinks = true`.
fn open_harness() -> Harness {
    let mut h = Harness::new();
    let registry = Registry::parse(
        "projects.toml",
        &format!(
            "allow_unauthenticated_uplinks = true\n\
             [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n\
             [[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9102\"\ntoken = \"{SLED_TOKEN}\"\n"
        ),
    )
    .unwrap();
    assert!(registry.allows_unauthenticated_uplinks());
    h.gw = Gateway::new(registry, Config::default(), [1; 32]);
    h
}

#[test]
fn an_open_project_takes_an_unauthenticated_sled_only_while_it_has_no_live_one() {
    let mut h = open_harness();
    let hello = |sled: &str| json!({"uplink":"hello","protocol":1,"project":"alpha","sled":sled});
    let first = h.open_uplink();
    h.sled_says(first, hello("alpha"));
    assert!(!h.closed.contains_key(&first));
    assert!(h.gw.is_live("alpha"));
    // A second sled that proves nothing does not push the live one off.
    let impostor = h.open_uplink();
    h.sled_says(impostor, hello("evil"));
    assert_eq!(h.closed[&impostor].0, 4009, "{:?}", h.closed[&impostor]);
    assert!(!h.closed.contains_key(&first));
    // Nor does one with a key of its own: a first-use pin proves nothing.
    let keyed = h.open_uplink();
    let signing = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let mut with_key = hello("evil");
    with_key["key"] = json!(crate::identity::encode_key(&signing.verifying_key()));
    h.sled_says(keyed, with_key);
    let challenge = h.take_frames(keyed);
    let nonce = challenge[0]["nonce"]
        .as_str()
        .expect("a challenge")
        .to_owned();
    let signature = crate::identity::sign_challenge(&signing, "gw", "alpha", &nonce).unwrap();
    h.sled_says(
        keyed,
        json!({"uplink":"proof","signature":signature,"gateway":"gw"}),
    );
    assert_eq!(h.closed[&keyed].0, 4009, "{:?}", h.closed.get(&keyed));
    assert!(!h.closed.contains_key(&first));
    assert!(h.gw.is_live("alpha"));
    // Once the live one is gone, the next takes its place.
    h.handle(crate::Input::UplinkClosed { uplink: first });
    let next = h.open_uplink();
    h.sled_says(next, hello("alpha"));
    assert!(!h.closed.contains_key(&next));
    assert!(h.gw.is_live("alpha"));
    // A project with a token still needs it, flag or not; and its sled replaces a live one.
    let b1 = h.open_uplink();
    h.sled_says(
        b1,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta"}),
    );
    assert_eq!(h.closed[&b1].0, 4006);
    for _ in 0..2 {
        let b = h.open_uplink();
        h.sled_says(
            b,
            json!({"uplink":"hello","protocol":1,"project":"beta","sled":"beta","token":SLED_TOKEN}),
        );
        assert!(!h.closed.contains_key(&b));
    }
    assert!(h.gw.is_live("beta"));
    assert_eq!(
        h.closed.values().filter(|(code, _)| *code == 4001).count(),
        1,
        "the second authenticated beta sled replaced the first"
    );
}

#[test]
fn clients_need_a_bearer_token_and_it_never_reaches_a_sled() {
    let mut h = harness();
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec();
    let ask = |h: &mut Harness, auth: Option<&str>| {
        let t = h.request(HttpRequest {
            content_type: Some("application/json".into()),
            authorization: auth.map(str::to_owned),
            body: ping.clone(),
            ..HttpRequest::default()
        });
        h.replies.remove(&t).unwrap()
    };
    let r = ask(&mut h, None);
    assert_eq!(r.status, 401);
    assert_eq!(
        r.headers,
        vec![(
            "WWW-Authenticate",
            r#"Bearer realm="mcp-gateway""#.to_owned()
        )]
    );
    let r = ask(&mut h, Some("Bearer nope"));
    assert_eq!(r.status, 401);
    assert!(r.headers[0].1.contains("invalid_token"));
    assert_eq!(
        ask(&mut h, Some(&format!("Basic {CLIENT_TOKEN}"))).status,
        401
    );
    assert_eq!(
        ask(&mut h, Some(&format!("Bearer {CLIENT_TOKEN}"))).status,
        200
    );
    // A call goes through with the token, and the sled sees no credential.
    let alpha = h.connect_sled("alpha");
    let body = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"show","arguments":{}}});
    h.request(HttpRequest {
        content_type: Some("application/json".into()),
        authorization: Some(format!("Bearer {CLIENT_TOKEN}")),
        body: body.to_string().into_bytes(),
        ..HttpRequest::default()
    });
    let frames = h.take_frames(alpha);
    assert!(!frames.iter().any(|f| f.to_string().contains(CLIENT_TOKEN)));
    h.handle(Input::Shutdown);
}

#[test]
fn tokens_in_projects_toml() {
    let text = format!(
        "client_tokens = [\"{CLIENT_TOKEN}\"]\n[[project]]\nname = \"a\"\nurl = \"http://x\"\ntoken = \"{SLED_TOKEN}\"\n"
    );
    let r = Registry::parse("p.toml", &text).unwrap();
    assert!(r.projects()[0].token.as_ref().unwrap().matches(SLED_TOKEN));
    assert!(r.client_tokens()[0].matches(CLIENT_TOKEN));
    assert_eq!(
        format!("{:?}", r.projects()[0].token),
        "Some(Secret(..))",
        "Debug hides it"
    );
    let short = "[[project]]\nname = \"a\"\nurl = \"http://x\"\ntoken = \"short\"\n";
    assert_eq!(
        Registry::parse("p.toml", short).unwrap_err().to_string(),
        "p.toml:4:9: `project[0].token`: a token must be at least 16 characters long"
    );
}

// ---- OAuth: the core's decisions on what the server found in the token ----

const RESOURCE: &str = "https://gw.example.com/mcp";
const ISSUER: &str = "https://id.example.com";
const METADATA: &str = "https://gw.example.com/.well-known/oauth-protected-resource/mcp";
const ACCESS_TOKEN: &str = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhZ2VudCJ9.c2lnbmF0dXJl";

fn oauth_harness(client_tokens: Vec<Secret>) -> Harness {
    let mut h = Harness::new();
    let oauth = crate::OAuthConfig::new(RESOURCE, vec![ISSUER.into()], vec!["mcp".into()]).unwrap();
    let mut alpha = ProjectSpec::new("alpha", "http://127.0.0.1:9101");
    alpha.token = Some(Secret::new(super::HARNESS_UPLINK_TOKEN));
    let registry = Registry::from_projects(vec![alpha], Some("alpha"))
        .unwrap()
        .with_client_tokens(client_tokens)
        .with_oauth(oauth);
    h.gw = Gateway::new(registry, Config::default(), [1; 32]);
    h
}

fn principal(subject: &str, scopes: &[&str]) -> crate::Principal {
    crate::Principal {
        issuer: ISSUER.into(),
        subject: subject.into(),
        client_id: Some(format!("{subject}-client")),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        groups: vec!["ops".into()],
    }
}

fn valid(subject: &str, scopes: &[&str]) -> AccessToken {
    AccessToken::Valid(Box::new(principal(subject, scopes)))
}

/// POSTs `body` with an `Authorization` header and what the server made of it; the reply.
fn send_with(
    h: &mut Harness,
    session: Option<&str>,
    auth: Option<&str>,
    token: AccessToken,
    body: serde_json::Value,
) -> crate::HttpReply {
    let t = h.request(HttpRequest {
        content_type: Some("application/json".into()),
        accept: Some("application/json, text/event-stream".into()),
        session: session.map(str::to_owned),
        authorization: auth.map(str::to_owned),
        access_token: token,
        body: body.to_string().into_bytes(),
        ..HttpRequest::default()
    });
    h.replies.remove(&t).expect("answered at once")
}

fn ping() -> serde_json::Value {
    json!({"jsonrpc":"2.0","id":1,"method":"ping"})
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

#[test]
fn without_a_valid_access_token_the_challenge_points_at_the_metadata() {
    let mut h = oauth_harness(Vec::new());
    let auth = bearer(ACCESS_TOKEN);
    // (Authorization, what the server found) → (status, challenge).
    let cases: Vec<(Option<&str>, AccessToken, u16, String)> = vec![
        (
            None,
            AccessToken::Unchecked,
            401,
            format!(r#"Bearer resource_metadata="{METADATA}", scope="mcp""#),
        ),
        (
            Some("Basic dXNlcjpwYXNz"),
            AccessToken::Unchecked,
            401,
            format!(r#"Bearer resource_metadata="{METADATA}", scope="mcp""#),
        ),
        (
            Some(&auth),
            AccessToken::Invalid,
            401,
            format!(r#"Bearer error="invalid_token", resource_metadata="{METADATA}", scope="mcp""#),
        ),
        // A principal with no bearer token in the request is not a way in.
        (
            None,
            valid("agent", &["mcp"]),
            401,
            format!(r#"Bearer resource_metadata="{METADATA}", scope="mcp""#),
        ),
        (
            Some(&auth),
            valid("agent", &["openid", "profile"]),
            403,
            format!(
                r#"Bearer error="insufficient_scope", scope="mcp", resource_metadata="{METADATA}""#
            ),
        ),
    ];
    for (authorization, token, status, challenge) in cases {
        let r = send_with(&mut h, None, authorization, token.clone(), ping());
        assert_eq!(r.status, status, "{authorization:?} {token:?}");
        assert_eq!(
            r.headers,
            vec![("WWW-Authenticate", challenge)],
            "{authorization:?} {token:?}"
        );
        let body: serde_json::Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
        let kind = if status == 401 {
            "unauthorized"
        } else {
            "insufficient_scope"
        };
        assert_eq!(body["error"]["data"]["kind"], kind);
    }
    let r = send_with(&mut h, None, Some(&auth), valid("agent", &["mcp"]), ping());
    assert_eq!(r.status, 200);
}

#[test]
fn an_access_token_never_reaches_a_sled() {
    let mut h = oauth_harness(Vec::new());
    let alpha = h.connect_sled("alpha");
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"show","arguments":{}}});
    let t = h.request(HttpRequest {
        content_type: Some("application/json".into()),
        accept: Some("application/json, text/event-stream".into()),
        authorization: Some(bearer(ACCESS_TOKEN)),
        access_token: valid("agent", &["mcp"]),
        body: call.to_string().into_bytes(),
        ..HttpRequest::default()
    });
    let frames = h.take_frames(alpha);
    assert!(
        frames.iter().any(|f| f["method"] == "tools/call"),
        "forwarded: {frames:?}"
    );
    assert!(!frames.iter().any(|f| f.to_string().contains(ACCESS_TOKEN)));
    assert!(!h.replies.contains_key(&t), "waits for the sled");
    h.handle(Input::Shutdown);
}

#[test]
fn with_client_tokens_and_oauth_either_lets_in() {
    let mut h = oauth_harness(vec![Secret::new(CLIENT_TOKEN)]);
    // The client token is that token, whatever the server made of it as a JWT.
    let r = send_with(
        &mut h,
        None,
        Some(&bearer(CLIENT_TOKEN)),
        AccessToken::Invalid,
        ping(),
    );
    assert_eq!(r.status, 200);
    let r = send_with(
        &mut h,
        None,
        Some(&bearer(ACCESS_TOKEN)),
        valid("agent", &["mcp"]),
        ping(),
    );
    assert_eq!(r.status, 200);
    // Anything else gets the OAuth challenge.
    let r = send_with(
        &mut h,
        None,
        Some(&bearer("not-a-token-of-any-kind")),
        AccessToken::Invalid,
        ping(),
    );
    assert_eq!(r.status, 401);
    assert!(r.headers[0].1.contains("resource_metadata="));
}

#[test]
fn a_session_belongs_to_the_identity_that_made_it() {
    let mut h = oauth_harness(vec![Secret::new(CLIENT_TOKEN)]);
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let auth = bearer(ACCESS_TOKEN);
    let r = send_with(&mut h, None, Some(&auth), valid("agent", &["mcp"]), init);
    assert_eq!(r.status, 200);
    let session = r
        .headers
        .iter()
        .find(|(n, _)| *n == "Mcp-Session-Id")
        .map(|(_, v)| v.clone())
        .unwrap();
    // The same principal, with another token (say, refreshed, with more scopes): its session.
    let r = send_with(
        &mut h,
        Some(&session),
        Some(&auth),
        valid("agent", &["mcp", "more"]),
        ping(),
    );
    assert_eq!(r.status, 200);
    // Another subject, or a client token, naming it: no such session.
    let r = send_with(
        &mut h,
        Some(&session),
        Some(&auth),
        valid("intruder", &["mcp"]),
        ping(),
    );
    assert_eq!(r.status, 404);
    let r = send_with(
        &mut h,
        Some(&session),
        Some(&bearer(CLIENT_TOKEN)),
        AccessToken::Unchecked,
        ping(),
    );
    assert_eq!(r.status, 404);
    // And the same issuer's subject under another issuer is someone else.
    let mut elsewhere = principal("agent", &["mcp"]);
    elsewhere.issuer = "https://other-id.example.com".into();
    let r = send_with(
        &mut h,
        Some(&session),
        Some(&auth),
        AccessToken::Valid(Box::new(elsewhere)),
        ping(),
    );
    assert_eq!(r.status, 404);
}

#[test]
fn oauth_in_projects_toml() {
    let text = r#"
[oauth]
resource = "https://gw.example.com/mcp"
authorization_servers = ["https://id.example.com/realms/ops"]
required_scopes = ["mcp"]
scopes_supported = ["mcp:admin", "mcp"]
groups_claim = "roles"
leeway_secs = 10
"#;
    let r = Registry::parse("p.toml", text).unwrap();
    let o = r.oauth().unwrap();
    assert_eq!(o.resource, "https://gw.example.com/mcp");
    assert_eq!(
        o.authorization_servers,
        ["https://id.example.com/realms/ops"]
    );
    assert_eq!(o.required_scopes, ["mcp"]);
    assert_eq!(o.scopes_supported, ["mcp", "mcp:admin"], "required first");
    assert_eq!(o.groups_claim, "roles");
    assert_eq!(o.leeway, std::time::Duration::from_secs(10));
    let metadata: serde_json::Value = serde_json::from_str(&o.metadata_json()).unwrap();
    assert_eq!(
        metadata,
        json!({
            "resource": "https://gw.example.com/mcp",
            "authorization_servers": ["https://id.example.com/realms/ops"],
            "scopes_supported": ["mcp", "mcp:admin"],
            "bearer_methods_supported": ["header"],
            "resource_name": "mcp-gateway",
        })
    );
    let minimal = "[oauth]\nresource = \"http://127.0.0.1:8080/mcp\"\nauthorization_servers = [\"http://localhost:9000\"]\n";
    let o = Registry::parse("p.toml", minimal).unwrap();
    let o = o.oauth().unwrap();
    assert!(o.required_scopes.is_empty() && o.scopes_supported.is_empty());
    assert_eq!(o.groups_claim, "groups");
    assert_eq!(o.leeway, crate::auth::DEFAULT_LEEWAY);

    let err = |text: &str| Registry::parse("p.toml", text).unwrap_err().to_string();
    let head = "[oauth]\nresource = \"https://gw.example.com/mcp\"\n";
    let cases = [
        (
            "[oauth]\nresource = \"http://gw.example.com/mcp\"\nauthorization_servers = [\"https://id.example.com\"]\n".to_owned(),
            "p.toml:2:12: `oauth.resource`: 'http://gw.example.com/mcp': http:// only for a loopback host (localhost, 127.0.0.1, [::1]); use https://",
        ),
        (
            format!("{head}authorization_servers = []\n"),
            "p.toml:3:25: `oauth.authorization_servers`: name at least one authorization server (its issuer URL)",
        ),
        (
            format!("{head}authorization_servers = [\"https://id.example.com?x\"]\n"),
            "p.toml:3:26: `oauth.authorization_servers[0]`: 'https://id.example.com?x' must have no query and no fragment",
        ),
        (
            format!("{head}authorization_servers = [\"https://id\"]\nrequired_scopes = [\"a b\"]\n"),
            "p.toml:4:20: `oauth.required_scopes[0]`: 'a b' has the character ' ': a scope is printable ASCII without spaces, quotes or backslashes",
        ),
        (
            format!("{head}authorization_servers = [\"https://id\"]\nrequired_scopes = [\"mcp\"]\nscopes_supported = [\"other\"]\n"),
            "p.toml:5:20: `oauth.scopes_supported`: lists no 'mcp', which required_scopes requires: clients choose the scopes they ask for from this list",
        ),
        (
            format!("{head}authorization_servers = [\"https://id\"]\nleeway_secs = 3600\n"),
            "p.toml:4:15: `oauth.leeway_secs`: at most 300 seconds",
        ),
        (
            format!("{head}authorization_servers = [\"https://id\"]\naudience = \"x\"\n"),
            "p.toml:4:1: `oauth.audience`: unknown field `audience`, expected one of `resource`, `authorization_servers`, `required_scopes`, `scopes_supported`, `groups_claim`, `leeway_secs`",
        ),
        (
            "[oauth]\nauthorization_servers = [\"https://id\"]\n".to_owned(),
            "p.toml:1:1: `oauth`: missing field `resource`",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(err(&text), want, "for {text:?}");
    }
}

/// Security review finding 12: sessions are owned by a client token's name or hash, not its
/// place in the list. Reordering the tokens keeps every session with its token; a reload that
/// removes a token ends its sessions (and releases their leases), and no other token ever
/// inherits them.
#[test]
fn a_session_is_owned_by_its_token_not_its_place_and_revoking_the_token_ends_it() {
    const ALICE: &str = "alice-token-0123456789";
    const BOB: &str = "bob-token-0123456789";
    let file = |tokens: &[&str]| {
        let list: Vec<String> = tokens.iter().map(|t| format!("\"{t}\"")).collect();
        Registry::parse(
            "projects.toml",
            &format!(
                "client_tokens = [{}]\n[[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\ntoken = \"{}\"\n",
                list.join(", "),
                super::HARNESS_UPLINK_TOKEN
            ),
        )
        .unwrap()
    };
    let mut h = Harness::new();
    h.gw = Gateway::new(file(&[ALICE, BOB]), Config::default(), [1; 32]);
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let r = send_with(
        &mut h,
        None,
        Some(&bearer(ALICE)),
        AccessToken::Unchecked,
        init,
    );
    assert_eq!(r.status, 200);
    let session = r
        .headers
        .iter()
        .find(|(n, _)| *n == "Mcp-Session-Id")
        .map(|(_, v)| v.clone())
        .unwrap();
    let claim = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"claim","arguments":{"project":"alpha","resource":"story:alpha-1","ttl_s":3600}}});
    let r = send_with(
        &mut h,
        Some(&session),
        Some(&bearer(ALICE)),
        AccessToken::Unchecked,
        claim,
    );
    let body: serde_json::Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
    assert_eq!(
        body["result"]["structuredContent"]["acquired"], true,
        "{body}"
    );
    // Reordered: alice keeps her session, bob (now first) is not her.
    h.handle(Input::Reload {
        registry: file(&[BOB, ALICE]),
    });
    let alice_ping = |h: &mut Harness| {
        send_with(
            h,
            Some(&session),
            Some(&bearer(ALICE)),
            AccessToken::Unchecked,
            ping(),
        )
        .status
    };
    assert_eq!(alice_ping(&mut h), 200);
    let r = send_with(
        &mut h,
        Some(&session),
        Some(&bearer(BOB)),
        AccessToken::Unchecked,
        ping(),
    );
    assert_eq!(r.status, 404);
    // Alice's token revoked: her session ends, and bob, now alone in the list, is not her.
    h.handle(Input::Reload {
        registry: file(&[BOB]),
    });
    let r = send_with(
        &mut h,
        Some(&session),
        Some(&bearer(BOB)),
        AccessToken::Unchecked,
        ping(),
    );
    assert_eq!(r.status, 404);
    // Her lease went with the session: bob claims the story at once.
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let r = send_with(
        &mut h,
        None,
        Some(&bearer(BOB)),
        AccessToken::Unchecked,
        init,
    );
    let bob = r
        .headers
        .iter()
        .find(|(n, _)| *n == "Mcp-Session-Id")
        .map(|(_, v)| v.clone())
        .unwrap();
    let claim = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"claim","arguments":{"project":"alpha","resource":"story:alpha-1"}}});
    let r = send_with(
        &mut h,
        Some(&bob),
        Some(&bearer(BOB)),
        AccessToken::Unchecked,
        claim,
    );
    let body: serde_json::Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
    assert_eq!(
        body["result"]["structuredContent"]["acquired"], true,
        "alice's lease ended with her session: {body}"
    );
    // Alice back with her old token: the session is gone for good.
    h.handle(Input::Reload {
        registry: file(&[BOB, ALICE]),
    });
    assert_eq!(alice_ping(&mut h), 404);
}

/// Security review finding 8: session quotas are per identity. A token with no rights that
/// floods `initialize` ends only its own sessions at its quota, and at the table's limit only
/// idle sessions that hold no lease: an operator's session with a lease survives.
#[test]
fn an_initialize_flood_ends_nobody_elses_session_with_a_lease() {
    const OPS: &str = "ops-token-0123456789";
    const NOBODY: &str = "nobody-token-0123456789";
    const CAROL: &str = "carol-token-0123456789";
    let registry = Registry::parse(
        "projects.toml",
        &format!(
            "client_tokens = [{{ name = \"ops\", token = \"{OPS}\" }}, {{ name = \"nobody\", token = \"{NOBODY}\" }}, {{ name = \"carol\", token = \"{CAROL}\" }}]\n\
             [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n\
             [[access]]\ntoken = \"ops\"\nprojects = [\"*\"]\nright = \"admin\"\n"
        ),
    )
    .unwrap();
    let config = Config {
        max_sessions: 3,
        max_sessions_per_identity: 2,
        ..Config::default()
    };
    let mut h = Harness::new();
    h.gw = Gateway::new(registry, config, [1; 32]);
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let start = |h: &mut Harness, token: &str| {
        let r = send_with(
            h,
            None,
            Some(&bearer(token)),
            AccessToken::Unchecked,
            init.clone(),
        );
        (
            r.status,
            r.headers
                .iter()
                .find(|(n, _)| *n == "Mcp-Session-Id")
                .map(|(_, v)| v.clone()),
        )
    };
    let alive = |h: &mut Harness, token: &str, session: &str| {
        send_with(
            h,
            Some(session),
            Some(&bearer(token)),
            AccessToken::Unchecked,
            ping(),
        )
        .status
            == 200
    };
    let (_, ops) = start(&mut h, OPS);
    let ops = ops.unwrap();
    let claim = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"claim","arguments":{"project":"alpha","resource":"story:alpha-1","ttl_s":3600}}});
    let r = send_with(
        &mut h,
        Some(&ops),
        Some(&bearer(OPS)),
        AccessToken::Unchecked,
        claim,
    );
    let body: serde_json::Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
    assert_eq!(
        body["result"]["structuredContent"]["acquired"], true,
        "{body}"
    );
    // The flood: every initialize of the no-rights token is let in by ending its own oldest.
    let mut mine = Vec::new();
    for _ in 0..5 {
        h.advance(std::time::Duration::from_millis(10));
        let (status, s) = start(&mut h, NOBODY);
        assert_eq!(status, 200);
        mine.push(s.unwrap());
    }
    assert!(
        alive(&mut h, OPS, &ops),
        "the operator's session survives the flood"
    );
    assert!(
        !alive(&mut h, NOBODY, &mine[0]),
        "the flooder's own oldest went"
    );
    assert!(alive(&mut h, NOBODY, &mine[4]));
    // Table full (ops + 2 of nobody's): carol's initialize ends an idle session with no lease,
    // never the operator's.
    let (status, _) = start(&mut h, CAROL);
    assert_eq!(status, 200);
    assert!(
        alive(&mut h, OPS, &ops),
        "a session holding a lease is never another's to end"
    );
}

/// Security review finding 9: an agent handle is issued only after the rights check, handles
/// are capped per identity, and a handle unused for the session TTL (its agent present nowhere,
/// holding nothing) is forgotten when room is needed.
#[test]
fn agent_handles_come_after_the_rights_check_are_capped_per_identity_and_expire() {
    const OPS: &str = "ops-token-0123456789";
    const NOBODY: &str = "nobody-token-0123456789";
    let registry = Registry::parse(
        "projects.toml",
        &format!(
            "client_tokens = [{{ name = \"ops\", token = \"{OPS}\" }}, {{ name = \"nobody\", token = \"{NOBODY}\" }}]\n\
             [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n\
             [[access]]\ntoken = \"ops\"\nprojects = [\"*\"]\nright = \"write\"\n"
        ),
    )
    .unwrap();
    let config = Config {
        max_sessions: 3,
        max_sessions_per_identity: 2,
        ..Config::default()
    };
    let ttl = config.session_idle_ttl;
    let mut h = Harness::new();
    h.gw = Gateway::new(registry, config, [1; 32]);
    let checkin = |h: &mut Harness, token: &str| -> serde_json::Value {
        let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"checkin","arguments":{"project":"alpha","ttl_s":1}}});
        let r = send_with(h, None, Some(&bearer(token)), AccessToken::Unchecked, call);
        serde_json::from_str(r.body.as_deref().unwrap()).unwrap()
    };
    // A caller without rights gets no handle, however often it asks.
    for _ in 0..10 {
        let r = checkin(&mut h, NOBODY);
        assert!(r["error"].is_object(), "{r}");
        assert!(
            !r.to_string().contains("ah-"),
            "no handle for a caller without rights: {r}"
        );
    }
    // The operator gets its quota of two, then the per-identity limit.
    let first = checkin(&mut h, OPS);
    let handle = first["result"]["structuredContent"]["handle"]
        .as_str()
        .unwrap_or_else(|| panic!("a handle: {first}"))
        .to_owned();
    assert!(checkin(&mut h, OPS)["result"].is_object());
    let third = checkin(&mut h, OPS);
    assert_eq!(third["error"]["data"]["kind"], "limit", "{third}");
    // Unused past the session TTL, present nowhere: forgotten when room is needed.
    h.advance(ttl + std::time::Duration::from_secs(5));
    let again = checkin(&mut h, OPS);
    assert!(again["result"].is_object(), "{again}");
    let use_old = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"roster","arguments":{"project":"alpha","agent":handle}}});
    let r = send_with(
        &mut h,
        None,
        Some(&bearer(OPS)),
        AccessToken::Unchecked,
        use_old,
    );
    let r: serde_json::Value = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
    assert_eq!(r["error"]["data"]["kind"], "unknown_agent", "{r}");
}

/// Agent-handle expiry: when room is needed, a handle unused for the session TTL whose agent
/// is present nowhere and holds nothing is forgotten, and one whose agent still holds a lease
/// is kept, so its holder can renew or release it. `Err` says which rule broke.
fn handle_expiry_check(config: Config) -> Result<(), String> {
    const OPS: &str = "ops-token-0123456789";
    let registry = Registry::parse(
        "projects.toml",
        &format!(
            "client_tokens = [{{ name = \"ops\", token = \"{OPS}\" }}]\n\
             [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n"
        ),
    )
    .unwrap();
    let config = Config {
        max_sessions_per_identity: 2,
        session_idle_ttl: std::time::Duration::from_secs(60),
        ..config
    };
    let mut h = Harness::new();
    h.gw = Gateway::new(registry, config, [1; 32]);
    let tool = |h: &mut Harness, name: &str, arguments: serde_json::Value| {
        let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":arguments}});
        let r = send_with(h, None, Some(&bearer(OPS)), AccessToken::Unchecked, call);
        serde_json::from_str::<serde_json::Value>(r.body.as_deref().unwrap()).unwrap()
    };
    let handle = |r: &serde_json::Value| -> Result<String, String> {
        r["result"]["structuredContent"]["handle"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("no handle: {r}"))
    };
    let holder = handle(&tool(
        &mut h,
        "checkin",
        json!({"project":"alpha","ttl_s":1}),
    ))?;
    let r = tool(
        &mut h,
        "claim",
        json!({"project":"alpha","resource":"story:alpha-1","ttl_s":3600,"agent":holder}),
    );
    if r["result"]["structuredContent"]["acquired"] != true {
        return Err(format!("no lease: {r}"));
    }
    let idle = handle(&tool(
        &mut h,
        "checkin",
        json!({"project":"alpha","ttl_s":1}),
    ))?;
    // Past the TTL and every presence, the lease still live: a third handle needs room.
    h.advance(std::time::Duration::from_secs(200));
    handle(&tool(
        &mut h,
        "checkin",
        json!({"project":"alpha","ttl_s":1}),
    ))?;
    let r = tool(&mut h, "roster", json!({"project":"alpha","agent":idle}));
    if r["error"]["data"]["kind"] != "unknown_agent" {
        return Err(format!("the idle handle was kept: {r}"));
    }
    let r = tool(
        &mut h,
        "renew",
        json!({"project":"alpha","resource":"story:alpha-1","ttl_s":60,"agent":holder}),
    );
    if r["result"].is_null() {
        return Err(format!("the lease holder's handle was forgotten: {r}"));
    }
    Ok(())
}

#[test]
fn an_unused_handle_expires_but_not_while_its_agent_holds_a_lease() {
    handle_expiry_check(Config::default()).unwrap();
}

#[cfg(feature = "planted-bugs")]
#[test]
fn planted_handle_expiry_ignoring_leases_is_caught() {
    let planted = Config {
        planted: Some(crate::PlantedBug::HandleExpiryIgnoresLeases),
        ..Config::default()
    };
    let caught = handle_expiry_check(planted).unwrap_err();
    assert!(
        caught.contains("lease holder's handle was forgotten"),
        "{caught}"
    );
    handle_expiry_check(Config::default()).unwrap();
}

/// An agent handle is its caller's alone: another identity presenting it (a leaked or stolen
/// handle) is answered `unknown_agent` for every use (claim, release, roster: the same lookup
/// a project call's `_meta` handle takes), exactly as for a handle never issued, and touches
/// nothing; its own
/// identity goes on using it. `Err` says which rule broke.
fn handle_owner_check(config: Config) -> Result<(), String> {
    const OPS: &str = "ops-token-0123456789";
    const CAROL: &str = "carol-token-0123456789";
    let registry = Registry::parse(
        "projects.toml",
        &format!(
            "client_tokens = [{{ name = \"ops\", token = \"{OPS}\" }}, {{ name = \"carol\", token = \"{CAROL}\" }}]\n\
             [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9101\"\n"
        ),
    )
    .unwrap();
    let mut h = Harness::new();
    h.gw = Gateway::new(registry, config, [1; 32]);
    let tool = |h: &mut Harness, token: &str, name: &str, arguments: serde_json::Value| {
        let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":name,"arguments":arguments}});
        let r = send_with(h, None, Some(&bearer(token)), AccessToken::Unchecked, call);
        serde_json::from_str::<serde_json::Value>(r.body.as_deref().unwrap()).unwrap()
    };
    let r = tool(
        &mut h,
        OPS,
        "checkin",
        json!({"project":"alpha","ttl_s":60}),
    );
    let handle = r["result"]["structuredContent"]["handle"]
        .as_str()
        .ok_or_else(|| format!("no handle: {r}"))?
        .to_owned();
    let r = tool(
        &mut h,
        OPS,
        "claim",
        json!({"project":"alpha","resource":"story:alpha-1","ttl_s":60,"agent":handle}),
    );
    if r["result"]["structuredContent"]["acquired"] != true {
        return Err(format!("its own identity got no lease: {r}"));
    }
    for (name, arguments) in [
        ("roster", json!({"project":"alpha","agent":handle})),
        (
            "release",
            json!({"project":"alpha","resource":"story:alpha-1","agent":handle}),
        ),
        (
            "claim",
            json!({"project":"alpha","resource":"story:alpha-2","ttl_s":60,"agent":handle}),
        ),
    ] {
        let r = tool(&mut h, CAROL, name, arguments);
        if r["error"]["data"]["kind"] != "unknown_agent" {
            return Err(format!("another identity used the handle for {name}: {r}"));
        }
    }
    // Nothing was touched: the lease is still its holder's, who renews it.
    let r = tool(
        &mut h,
        OPS,
        "renew",
        json!({"project":"alpha","resource":"story:alpha-1","ttl_s":60,"agent":handle}),
    );
    if r["result"].is_null() || r["result"]["isError"] == true {
        return Err(format!("the holder lost its lease: {r}"));
    }
    Ok(())
}

#[test]
fn an_agent_handle_serves_only_the_identity_it_was_issued_to() {
    handle_owner_check(Config::default()).unwrap();
}

#[cfg(feature = "planted-bugs")]
#[test]
fn planted_handle_across_identities_is_caught() {
    let planted = Config {
        planted: Some(crate::PlantedBug::HandleAcrossIdentities),
        ..Config::default()
    };
    let caught = handle_owner_check(planted).unwrap_err();
    assert!(
        caught.contains("another identity used the handle"),
        "{caught}"
    );
}

/// Security review finding 16: nothing the core holds a credential in shows it in `Debug`:
/// a request's `Authorization`, the credentials a fleet tool's parts are asked with, the
/// registry's client and uplink tokens, a hello's uplink token (which is written only into
/// the frame itself).
#[test]
fn debug_shows_no_token() {
    let secret = "Sup3rSecretToken-0123456789";
    let request = HttpRequest {
        authorization: Some(format!("Bearer {secret}")),
        ..HttpRequest::default()
    };
    let credentials = crate::gather::Credentials::of(&request);
    let mut spec = ProjectSpec::new("alpha", "http://127.0.0.1:9101");
    spec.token = Some(Secret::new(secret));
    let registry = Registry::from_projects(vec![spec], Some("alpha"))
        .unwrap()
        .with_client_tokens(vec![Secret::new(secret)]);
    let hello = crate::uplink::Control::Hello {
        protocol: 1,
        project: "alpha".into(),
        sled: "a".into(),
        token: Some(Secret::new(secret)),
        key: None,
        fence: None,
        epoch_seen: None,
        moving: false,
    };
    for shown in [
        format!("{request:?}"),
        format!("{credentials:?}"),
        format!("{registry:?}"),
        format!("{hello:?}"),
        format!(
            "{:?}",
            Input::Http {
                token: crate::HttpToken(1),
                request: request.clone()
            }
        ),
    ] {
        assert!(!shown.contains(secret), "{shown}");
    }
    // The hello's frame carries it, as the protocol says.
    assert!(hello.to_text().contains(secret));
    let back: crate::uplink::Control = serde_json::from_str(&hello.to_text()).unwrap();
    assert_eq!(back, hello);
}
