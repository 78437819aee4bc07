//! The same library code as a host inside a turmoil simulation: the uplink against a fake
//! gateway, the direct HTTP endpoint driven by `McpClient`, and same seed → same run.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway_core::uplink::{Control, PROTOCOL_VERSION};
use serde_json::{json, Value};
use sled_sim::client::McpClient;
use sled_sim::mcp::{SharedSled, Sled};
use sled_sim::net::{Connect, GatewayAddr};
use sled_sim::uplink::{run_uplink, UplinkOptions};
use tokio_tungstenite::tungstenite::Message;

#[derive(Clone, Copy, Debug)]
struct TurmoilConnect;

impl Connect for TurmoilConnect {
    type Stream = turmoil::net::TcpStream;

    async fn connect(&self, host_port: &str) -> std::io::Result<Self::Stream> {
        turmoil::net::TcpStream::connect(host_port).await
    }
}

struct TurmoilListener(turmoil::net::TcpListener);

impl axum::serve::Listener for TurmoilListener {
    type Io = turmoil::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if let Ok(conn) = self.0.accept().await {
                return conn;
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

async fn next_json<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>) -> Option<Value>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match ws.next().await? {
            Ok(Message::Text(t)) => {
                let frame: Value = serde_json::from_str(&t).ok()?;
                // The sled's relay events (one per story created here) are not looked at.
                if frame["uplink"] != "event" {
                    return Some(frame);
                }
            }
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// One simulated run: a sled with latency and jitter behind a fake gateway that fires eight
/// calls at once, drops the connection and waits for the sled to come back. Returns what the
/// gateway saw, with simulated timestamps.
fn uplink_run(seed: u64) -> Vec<String> {
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(Duration::from_secs(60))
        .build();
    sim.host("sled", move || async move {
        let sled = SharedSled::new(Sled::seeded("alpha", seed));
        let opts = UplinkOptions {
            latency: Duration::from_millis(10),
            jitter: Duration::from_millis(40),
            seed,
            sled_name: "alpha".into(),
            ..UplinkOptions::default()
        };
        let gateway = GatewayAddr::parse("http://gateway:80").expect("a valid address");
        run_uplink(TurmoilConnect, gateway, sled, opts, std::future::pending()).await;
        Ok(())
    });
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    sim.client("gateway", async move {
        let note = |s: String| {
            let t = turmoil::elapsed();
            seen.lock().unwrap().push(format!("{t:?} {s}"));
        };
        let listener = turmoil::net::TcpListener::bind("0.0.0.0:80").await?;
        for round in 0..2 {
            let (tcp, _) = listener.accept().await?;
            let mut ws = tokio_tungstenite::accept_async(tcp).await?;
            let hello: Control = serde_json::from_value(next_json(&mut ws).await.unwrap())?;
            note(format!("round {round}: {hello:?}"));
            let welcome = Control::Welcome {
                protocol: PROTOCOL_VERSION,
                heartbeat_ms: 1_000,
                epoch: None,
            };
            ws.send(Message::text(welcome.to_text())).await?;
            for id in 0..8 {
                let call = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
                    "name":"create_story","arguments":{"name":format!("s{round}-{id}"),"acceptance_criteria":[]},
                    "_meta":{"sled-sim/nonce": id}}});
                ws.send(Message::text(call.to_string())).await?;
            }
            for _ in 0..8 {
                let resp = next_json(&mut ws).await.unwrap();
                let result = &resp["result"];
                assert_eq!(result["_meta"]["sled-sim/nonce"], resp["id"]);
                assert_eq!(result["_meta"]["sled-sim/project"], "alpha");
                note(format!(
                    "id {} → {}",
                    resp["id"], result["structuredContent"]["story"]["id"]
                ));
            }
            ws.send(Message::text(Control::Ping { seq: 1 }.to_text()))
                .await?;
            let pong: Control = serde_json::from_value(next_json(&mut ws).await.unwrap())?;
            assert_eq!(pong, Control::Pong { seq: 1 });
            // Hang up without a close handshake; the sled must reconnect.
        }
        Ok(())
    });
    sim.run().expect("the simulation completes");
    let log = log.lock().unwrap().clone();
    log
}

#[test]
fn uplink_in_simulation_is_deterministic() {
    let a = uplink_run(1);
    assert_eq!(a.len(), 2 + 16, "{a:#?}");
    assert!(a[0].contains("project: \"alpha\""), "{a:#?}");
    assert_eq!(a, uplink_run(1), "same seed, same run");
    let others: Vec<Vec<String>> = (2..5).map(uplink_run).collect();
    assert!(
        others.iter().any(|o| *o != a),
        "different seeds should give different timings"
    );
}

#[test]
fn direct_http_in_simulation() {
    let mut sim = turmoil::Builder::new()
        .rng_seed(3)
        .simulation_duration(Duration::from_secs(30))
        .build();
    sim.host("sled", || async {
        let sled = SharedSled::new(Sled::seeded("beta", 3));
        let listener = turmoil::net::TcpListener::bind("0.0.0.0:8080").await?;
        sled_sim::http::serve(TurmoilListener(listener), sled, std::future::pending()).await?;
        Ok(())
    });
    sim.client("client", async {
        let mut client = McpClient::connect(TurmoilConnect, "http://sled:8080/mcp").await?;
        let init = client.initialize().await?;
        assert_eq!(init["result"]["serverInfo"]["name"], "sled-sim");
        let created = client
            .tools_call(
                json!(1),
                "create_story",
                json!({"name":"in the sim","acceptance_criteria":["deterministic"]}),
            )
            .await?;
        let id = created["result"]["structuredContent"]["story"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(id.starts_with("beta-"));
        let shown = client
            .tools_call(json!(2), "show", json!({ "story_id": id }))
            .await?;
        assert_eq!(
            shown["result"]["structuredContent"]["story"]["name"],
            "in the sim"
        );
        Ok(())
    });
    sim.run().expect("the simulation completes");
}

/// The next text frame, events included.
async fn next_raw(ws: &mut tokio_tungstenite::WebSocketStream<turmoil::net::TcpStream>) -> Value {
    match ws.next().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(&t).unwrap(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// A sled with an identity and a relay against a fake gateway in simulated time: it proves its
/// key, then sends `sync` ticks exactly `relay_interval` apart and a `story_created` after a
/// call. Returns what the gateway saw, with simulated timestamps.
fn relay_run(seed: u64) -> Vec<String> {
    use base64::Engine as _;
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(Duration::from_secs(60))
        .build();
    sim.host("sled", move || async move {
        let sled = SharedSled::new(Sled::seeded("alpha", seed));
        let opts = UplinkOptions {
            seed,
            sled_name: "alpha".into(),
            identity: Some(sled_sim::sled_key(seed, "alpha")),
            relay_interval: Duration::from_secs(2),
            ..UplinkOptions::default()
        };
        let gateway = GatewayAddr::parse("http://gateway:80").expect("a valid address");
        run_uplink(TurmoilConnect, gateway, sled, opts, std::future::pending()).await;
        Ok(())
    });
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    sim.client("gateway", async move {
        let note = |s: String| {
            let t = turmoil::elapsed();
            seen.lock().unwrap().push(format!("{t:?} {s}"));
        };
        let listener = turmoil::net::TcpListener::bind("0.0.0.0:80").await?;
        let (tcp, _) = listener.accept().await?;
        let mut ws = tokio_tungstenite::accept_async(tcp).await?;
        let hello: Control = serde_json::from_value(next_raw(&mut ws).await)?;
        let Control::Hello { key: Some(key), .. } = hello else {
            panic!("a hello with a key, got {hello:?}");
        };
        let nonce = [seed as u8; 32];
        let challenge = Control::Challenge {
            nonce: base64::engine::general_purpose::STANDARD.encode(nonce),
        };
        ws.send(Message::text(challenge.to_text())).await?;
        let Control::Proof { signature, gateway } =
            serde_json::from_value(next_raw(&mut ws).await)?
        else {
            panic!("expected a proof");
        };
        assert_eq!(gateway.as_deref(), Some("gateway"));
        let vk = gateway_core::identity::parse_key(&key).unwrap();
        gateway_core::identity::verify_challenge(&vk, "gateway", "alpha", &nonce, &signature)
            .unwrap();
        note(format!("proof from {key}"));
        let welcome = Control::Welcome {
            protocol: PROTOCOL_VERSION,
            heartbeat_ms: 0,
            epoch: None,
        };
        ws.send(Message::text(welcome.to_text())).await?;
        let welcomed = turmoil::elapsed();
        for _ in 0..3 {
            let frame = next_raw(&mut ws).await;
            note(format!("{frame} after {:?}", turmoil::elapsed() - welcomed));
        }
        let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"create_story","arguments":{"name":"relayed","acceptance_criteria":[]}}});
        ws.send(Message::text(call.to_string())).await?;
        for _ in 0..2 {
            let frame = next_raw(&mut ws).await;
            let shown = if frame.get("id").is_some() {
                "the response".to_owned()
            } else {
                frame.to_string()
            };
            note(shown);
        }
        Ok(())
    });
    sim.run().expect("the simulation completes");
    let log = log.lock().unwrap().clone();
    log
}

#[test]
fn relay_in_simulation_is_deterministic() {
    let a = relay_run(1);
    assert_eq!(a.len(), 6, "{a:#?}");
    for (i, line) in a[1..4].iter().enumerate() {
        let seq = i + 1;
        assert!(
            line.contains(&format!(
                r#"{{"kind":"sync","seq":{seq},"uplink":"event"}}"#
            )),
            "{a:#?}"
        );
        // One interval apart (plus the simulated network's latency).
        assert!(line.contains(&format!(" after {}.", 2 * seq)), "{a:#?}");
    }
    assert!(a[4].ends_with("the response"), "{a:#?}");
    assert!(a[5].contains(r#""kind":"story_created""#), "{a:#?}");
    assert!(a[5].contains(r#""seq":4"#), "{a:#?}");
    assert_eq!(a, relay_run(1), "same seed, same run");
}
