//! Who gets in: uplink tokens per project, bearer tokens for clients.

use serde_json::json;

use super::Harness;
use crate::{Config, Gateway, HttpRequest, Input, ProjectSpec, Registry, Secret};

const SLED_TOKEN: &str = "sled-token-0123456789";
const CLIENT_TOKEN: &str = "client-token-0123456789";

fn harness() -> Harness {
    let mut h = Harness::new();
    let mut beta = ProjectSpec::new("beta", "http://127.0.0.1:9102");
    beta.token = Some(Secret::new(SLED_TOKEN));
    let registry = Registry::from_projects(
        vec![ProjectSpec::new("alpha", "http://127.0.0.1:9101"), beta],
        Some("alpha"),
    )
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
    // A project without a token takes any hello, as before.
    let a = h.open_uplink();
    h.sled_says(
        a,
        json!({"uplink":"hello","protocol":1,"project":"alpha","sled":"alpha"}),
    );
    assert!(h.gw.is_live("alpha"));
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
