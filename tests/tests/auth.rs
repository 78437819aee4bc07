//! Who gets in, over real sockets: a sled must present its project's uplink token, and a
//! client its bearer token; a wrong one is refused and the gateway keeps serving.

use std::time::Duration;

use gateway_core::{ProjectSpec, Registry, Secret};
use gateway_server::ServerOptions;
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};

const SLED_TOKEN: &str = "uplink-token-for-beta-0001";
const CLIENT_TOKEN: &str = "client-token-for-ops-0001";

async fn post(c: &mut McpClient<TokioConnect>, auth: Option<&str>, body: Value) -> (u16, Value) {
    let bearer = auth.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    if let Some(b) = &bearer {
        headers.push(("authorization", b));
    }
    let (status, _, body) = c
        .post_raw(body.to_string().into_bytes(), &headers)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleds_and_clients_present_their_tokens() {
    gateway_tests::init_tracing();
    let mut beta = ProjectSpec::new("beta", "http://127.0.0.1:9102");
    beta.token = Some(Secret::new(SLED_TOKEN));
    let registry = Registry::from_projects(vec![beta], Some("beta"))
        .unwrap()
        .with_client_tokens(vec![Secret::new(CLIENT_TOKEN)]);
    let gateway = gateway_tests::Gateway::start(ServerOptions::new(registry, [4; 32])).await;
    let addr = gateway.addr;
    let projects = ["beta".to_owned()];
    // An impostor without the token, and the real sled with it.
    let impostor = Fleet::spawn(&format!("http://{addr}"), &projects, SledOptions::default());
    let real = Fleet::spawn(
        &format!("http://{addr}"),
        &projects,
        SledOptions {
            uplink_token: Some(Secret::new(SLED_TOKEN)),
            ..SledOptions::default()
        },
    );
    let mut c = McpClient::connect(TokioConnect, &format!("http://{addr}/mcp"))
        .await
        .unwrap();
    // Without a bearer token: 401 with the challenge.
    let (status, body) = post(
        &mut c,
        None,
        json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["data"]["kind"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, _) = post(
        &mut c,
        Some("not-the-token-at-all"),
        json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
    )
    .await;
    assert_eq!(status, 401);
    // With it: the real sled serves beta, whatever the impostor keeps trying.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}});
        let (status, body) = post(&mut c, Some(CLIENT_TOKEN), call).await;
        assert_eq!(status, 200);
        if body["result"]["structuredContent"]["project"] == "beta" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "beta never came up: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let story = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"create_story","arguments":{"name":"real","acceptance_criteria":[]}}});
    let (_, body) = post(&mut c, Some(CLIENT_TOKEN), story).await;
    let id = body["result"]["structuredContent"]["story"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        real.sled("beta")
            .unwrap()
            .with(|s| s.project().story(&id).is_some()),
        "served by the sled with the token"
    );
    assert!(impostor
        .sled("beta")
        .unwrap()
        .with(|s| s.project().story(&id).is_none()));
    impostor.shutdown().await;
    real.shutdown().await;
    gateway.stop().await;
}
