//! The uplink against a tiny fake gateway written with `tokio_tungstenite::accept_hdr_async`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use gateway_core::identity::{encode_key, parse_key, verify_challenge};
use gateway_core::uplink::{CloseCode, Control, FENCE_META, PROTOCOL_VERSION, UPLINK_PATH};
use serde_json::{json, Value};
use sled_sim::fleet::{Fleet, SledOptions};
use sled_sim::mcp::{SharedSled, Sled};
use sled_sim::model::Project;
use sled_sim::net::{GatewayAddr, TokioConnect};
use sled_sim::sim_sled::SimSled;
use sled_sim::uplink::{run_uplink, run_uplink_with, Backend, UplinkOptions};
use sled_sim::{impostor_key, sled_key, Fixture};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::{timeout, Instant};
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type Ws = WebSocketStream<TcpStream>;

const LIMIT: Duration = Duration::from_secs(10);

/// Accepts one uplink connection; returns it with the request's path and `Host` header.
#[allow(clippy::result_large_err)] // the callback's error type is tungstenite's
async fn accept(listener: &TcpListener) -> (Ws, String, String) {
    let (tcp, _) = listener.accept().await.unwrap();
    let seen = Arc::new(Mutex::new((String::new(), String::new())));
    let seen2 = seen.clone();
    let ws = tokio_tungstenite::accept_hdr_async(tcp, move |req: &Request, resp: Response| {
        let host = req
            .headers()
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        *seen2.lock().unwrap() = (req.uri().path().to_owned(), host);
        Ok(resp)
    })
    .await
    .unwrap();
    let (path, host) = seen.lock().unwrap().clone();
    (ws, path, host)
}

/// The next text frame as JSON (skipping WebSocket pings/pongs); `None` when the connection
/// ends or a close frame arrives.
async fn next_frame(ws: &mut Ws) -> Option<Value> {
    loop {
        match ws.next().await? {
            Ok(Message::Text(t)) => return Some(serde_json::from_str(&t).unwrap()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Like [`next_frame`], skipping the relay's `event` frames too.
async fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        let frame = next_frame(ws).await?;
        if frame["uplink"] != "event" {
            return Some(frame);
        }
    }
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

async fn send_control(ws: &mut Ws, c: Control) {
    ws.send(Message::text(c.to_text())).await.unwrap();
}

async fn expect_hello(ws: &mut Ws) -> Control {
    let hello = next_json(ws).await.expect("a hello");
    serde_json::from_value(hello).unwrap()
}

fn welcome(heartbeat_ms: u64) -> Control {
    Control::Welcome {
        protocol: PROTOCOL_VERSION,
        heartbeat_ms,
        epoch: None,
    }
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

fn start(listener: &TcpListener, sled: SharedSled, opts: UplinkOptions) -> Running {
    let addr = listener.local_addr().unwrap();
    let gateway = GatewayAddr::parse(&format!("http://{addr}")).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run_uplink(TokioConnect, gateway, sled, opts, async {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        task,
    }
}

fn fast(name: &str) -> UplinkOptions {
    UplinkOptions {
        sled_name: name.to_owned(),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(20),
        ..UplinkOptions::default()
    }
}

#[tokio::test]
async fn hello_welcome_ping_and_calls() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sled = SharedSled::new(Sled::new(Project::new("alpha"), "alpha-sled", 5));
        let opts = UplinkOptions {
            latency: Duration::from_millis(30),
            ..fast("alpha-sled")
        };
        let mut running = start(&listener, sled.clone(), opts);

        let (mut ws, path, host) = accept(&listener).await;
        assert_eq!(path, UPLINK_PATH);
        assert_eq!(host, addr.to_string());
        assert_eq!(
            expect_hello(&mut ws).await,
            Control::Hello {
                protocol: PROTOCOL_VERSION,
                project: "alpha".into(),
                sled: "alpha-sled".into(),
                token: None,
                key: None,
                fence: None,
                epoch_seen: None,
                moving: false,
            }
        );
        send_control(&mut ws, welcome(5_000)).await;

        send_control(&mut ws, Control::Ping { seq: 7 }).await;
        let pong: Control = serde_json::from_value(next_json(&mut ws).await.unwrap()).unwrap();
        assert_eq!(pong, Control::Pong { seq: 7 });

        // tools/list, then two calls in flight at once: each answered under its own id,
        // after the configured latency.
        send(&mut ws, json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})).await;
        let list = next_json(&mut ws).await.unwrap();
        assert_eq!(list["id"], 1);
        assert_eq!(list["result"]["tools"].as_array().unwrap().len(), 14);

        let sent = Instant::now();
        send(
            &mut ws,
            json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
                "name":"create_story",
                "arguments":{"name":"Over the uplink","acceptance_criteria":["a"]},
                "_meta":{"sled-sim/nonce":"n2"}}}),
        )
        .await;
        send(
            &mut ws,
            json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}),
        )
        .await;
        // A notification gets no answer.
        send(&mut ws, json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9}})).await;
        let mut by_id = std::collections::BTreeMap::new();
        for _ in 0..2 {
            let resp = next_json(&mut ws).await.unwrap();
            by_id.insert(resp["id"].as_u64().unwrap(), resp);
        }
        assert!(sent.elapsed() >= Duration::from_millis(30));
        assert_eq!(by_id.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
        let created = &by_id[&2]["result"];
        assert_eq!(created["structuredContent"]["project"], "alpha");
        assert_eq!(created["structuredContent"]["story"]["id"], "alpha-1");
        assert_eq!(
            created["_meta"],
            json!({"sled-sim/nonce":"n2","sled-sim/project":"alpha"})
        );
        assert_eq!(by_id[&3]["result"]["structuredContent"]["sled"], "alpha-sled");
        assert!(sled.with(|s| s.project().story("alpha-1").is_some()));

        // Garbage from the gateway does not kill the sled; what it cannot read it says so,
        // naming the request when the frame's prefix gives its id.
        ws.send(Message::text("{not json")).await.unwrap();
        let said: Control = serde_json::from_value(next_json(&mut ws).await.unwrap()).unwrap();
        assert!(matches!(said, Control::Unreadable { id: None, .. }), "{said:?}");
        ws.send(Message::text(
            r#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"whoami","arguments":{"a":"\ud800"}}}"#,
        ))
        .await
        .unwrap();
        match serde_json::from_value(next_json(&mut ws).await.unwrap()).unwrap() {
            Control::Unreadable { id, reason } => {
                assert_eq!(id, Some(12));
                assert!(reason.contains("escape"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        send(&mut ws, json!({"uplink":"bogus"})).await;
        ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
        send_control(&mut ws, Control::Ping { seq: 8 }).await;
        let pong: Control = serde_json::from_value(next_json(&mut ws).await.unwrap()).unwrap();
        assert_eq!(pong, Control::Pong { seq: 8 });

        // A tool list change is announced.
        assert!(sled.set_tool_enabled("whoami", false));
        let note = next_json(&mut ws).await.unwrap();
        assert_eq!(
            note,
            json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"})
        );
        sled.notify_tools_list_changed();
        let note = next_json(&mut ws).await.unwrap();
        assert_eq!(note["method"], "notifications/tools/list_changed");

        // Shutdown sends a WebSocket close and ends the task.
        running.stop.take().unwrap().send(()).unwrap();
        let close = loop {
            match ws.next().await {
                Some(Ok(Message::Close(frame))) => break frame,
                Some(Ok(_)) => {}
                other => panic!("expected a close frame, got {other:?}"),
            }
        };
        assert_eq!(close.map(|f| f.code), Some(WsCloseCode::Normal));
        running.task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn reconnects_after_close_silence_and_unknown_project() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sled = SharedSled::new(Sled::seeded("beta", 3));
        let mut running = start(&listener, sled, fast("beta"));

        // 1: the gateway replaces the connection with a closing frame and a close.
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(5_000)).await;
        send_control(
            &mut ws,
            Control::Closing {
                code: CloseCode::Replaced.code(),
                reason: "another sled".into(),
            },
        )
        .await;
        ws.close(Some(CloseFrame {
            code: WsCloseCode::from(CloseCode::Replaced.code()),
            reason: "replaced".into(),
        }))
        .await
        .unwrap();

        // 2: it comes back; this time the gateway goes silent after welcome, and the sled
        // gives up after three heartbeats.
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(40)).await;
        let silent = Instant::now();
        assert!(
            next_json(&mut ws).await.is_none(),
            "the sled should hang up"
        );
        let waited = silent.elapsed();
        assert!(waited >= Duration::from_millis(110), "{waited:?}");

        // 3: the gateway rejects the project before welcome; the sled retries, slowly.
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(
            &mut ws,
            Control::Closing {
                code: CloseCode::UnknownProject.code(),
                reason: "no project beta".into(),
            },
        )
        .await;
        ws.close(Some(CloseFrame {
            code: WsCloseCode::from(CloseCode::UnknownProject.code()),
            reason: "unknown project".into(),
        }))
        .await
        .unwrap();
        let rejected = Instant::now();

        // 4: back again after the long backoff (6 × 20 ms), and works.
        let (mut ws, _, _) = accept(&listener).await;
        assert!(rejected.elapsed() >= Duration::from_millis(100));
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(5_000)).await;
        send(&mut ws, json!({"jsonrpc":"2.0","id":"x","method":"ping"})).await;
        assert_eq!(
            next_json(&mut ws).await.unwrap(),
            json!({"jsonrpc":"2.0","id":"x","result":{}})
        );

        // 5: the TCP connection just drops: reconnect.
        drop(ws);
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;

        running.stop.take().unwrap().send(()).unwrap();
        running.task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn connection_refused_is_retried() {
    timeout(LIMIT, async {
        // Reserve a port, then close it so the first attempts are refused.
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let gateway = GatewayAddr::parse(&format!("http://{addr}")).unwrap();
        let sled = SharedSled::new(Sled::seeded("delta", 0));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run_uplink(TokioConnect, gateway, sled, fast("delta"), async {
            let _ = stopped.await;
        }));
        tokio::time::sleep(Duration::from_millis(60)).await;
        let listener = TcpListener::bind(addr).await.unwrap();
        let (mut ws, _, _) = accept(&listener).await;
        assert!(matches!(expect_hello(&mut ws).await, Control::Hello { project, .. } if project == "delta"));
        stop.send(()).unwrap();
        task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn fleet_connects_stops_and_shuts_down() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let projects = sled_sim::fleet::demo_project_names(3);
        let mut fleet = Fleet::spawn(&format!("http://{addr}"), &projects, SledOptions::default());
        assert_eq!(fleet.projects(), vec!["alpha", "beta", "gamma"]);

        let mut conns = std::collections::BTreeMap::new();
        for _ in 0..3 {
            let (mut ws, _, _) = accept(&listener).await;
            let Control::Hello {
                project, sled, key, ..
            } = expect_hello(&mut ws).await
            else {
                panic!("not a hello");
            };
            assert_eq!(project, sled);
            // A fleet's sleds have identities by default, derived from the fleet seed; a
            // gateway that sends no challenge welcomes them all the same.
            assert_eq!(
                key,
                Some(encode_key(&sled_key(0, &project).verifying_key()))
            );
            send_control(&mut ws, welcome(5_000)).await;
            conns.insert(project, ws);
        }
        assert_eq!(
            conns.keys().cloned().collect::<BTreeSet<_>>(),
            projects.iter().cloned().collect::<BTreeSet<_>>()
        );

        // Each sled serves its own project (seeded from the fleet seed and its name).
        for (project, ws) in &mut conns {
            send(ws, json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami"}})).await;
            let resp = next_json(ws).await.unwrap();
            assert_eq!(resp["result"]["structuredContent"]["project"], *project);
            assert_eq!(
                resp["result"]["structuredContent"]["seed"],
                sled_sim::fleet::sled_seed(0, project)
            );
            let model_len = fleet.sled(project).unwrap().with(|s| s.project().stories.len());
            assert!(model_len <= 4);
        }
        assert!(fleet.sled("omega").is_none());

        // Stopping one kills its socket without a close handshake.
        assert!(fleet.stop("beta"));
        assert!(!fleet.stop("beta"));
        assert!(!fleet.is_running("beta"));
        let mut beta = conns.remove("beta").unwrap();
        assert!(next_json(&mut beta).await.is_none());
        // The others are still there.
        let alpha = conns.get_mut("alpha").unwrap();
        send_control(alpha, Control::Ping { seq: 1 }).await;
        assert_eq!(next_json(alpha).await.unwrap(), json!({"uplink":"pong","seq":1}));

        // Starting it again reconnects with the same model.
        assert!(fleet.start("beta"));
        let (mut ws, _, _) = accept(&listener).await;
        assert!(matches!(expect_hello(&mut ws).await, Control::Hello { project, .. } if project == "beta"));
        send_control(&mut ws, welcome(5_000)).await;
        send_control(&mut ws, Control::Ping { seq: 2 }).await;
        assert_eq!(next_json(&mut ws).await.unwrap(), json!({"uplink":"pong","seq":2}));
        conns.insert("beta".into(), ws);

        // Shutdown closes the rest gracefully.
        fleet.shutdown().await;
        for (_, mut ws) in conns {
            let got_close = loop {
                match ws.next().await {
                    Some(Ok(Message::Close(_))) => break true,
                    Some(Ok(_)) => {}
                    _ => break false,
                }
            };
            assert!(got_close);
        }
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn fleet_with_bad_gateway_starts_nothing() {
    let fleet = Fleet::spawn("not a url", &["alpha".to_owned()], SledOptions::default());
    assert!(fleet.sled("alpha").is_some());
    assert!(!fleet.is_running("alpha"));
    fleet.shutdown().await;
}

/// Closes the connection the way the gateway refuses a sled: `closing`, then a close frame.
async fn refuse(ws: &mut Ws, code: CloseCode, reason: &str) {
    send_control(
        ws,
        Control::Closing {
            code: code.code(),
            reason: reason.into(),
        },
    )
    .await;
    ws.close(Some(CloseFrame {
        code: WsCloseCode::from(code.code()),
        reason: reason.to_owned().into(),
    }))
    .await
    .unwrap();
}

/// Sends a challenge and checks the proof: a signature of the challenge by the hello's key.
async fn challenge(ws: &mut Ws, project: &str, key: &str, nonce: [u8; 32]) {
    send_control(
        ws,
        Control::Challenge {
            nonce: BASE64.encode(nonce),
        },
    )
    .await;
    let proof: Control = serde_json::from_value(next_frame(ws).await.unwrap()).unwrap();
    let Control::Proof { signature, gateway } = proof else {
        panic!("expected a proof, got {proof:?}");
    };
    // Made for the gateway the sled dialed.
    assert_eq!(gateway.as_deref(), Some("127.0.0.1"));
    let gw = "127.0.0.1";
    let key = parse_key(key).unwrap();
    verify_challenge(&key, gw, project, &nonce, &signature).expect("the proof verifies");
    // Worth nothing for another nonce, project or gateway.
    assert!(verify_challenge(&key, gw, project, &[0; 32], &signature).is_err());
    assert!(verify_challenge(&key, gw, "other", &nonce, &signature).is_err());
    assert!(verify_challenge(&key, "localhost", project, &nonce, &signature).is_err());
}

#[tokio::test]
async fn identity_answers_the_challenge_then_is_welcomed() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sled = SharedSled::new(Sled::seeded("alpha", 1));
        let opts = UplinkOptions {
            identity: Some(sled_key(7, "alpha")),
            ..fast("alpha-sled")
        };
        let mut running = start(&listener, sled, opts);

        let (mut ws, _, _) = accept(&listener).await;
        let Control::Hello { key, token, .. } = expect_hello(&mut ws).await else {
            panic!("not a hello");
        };
        assert_eq!(token, None);
        let key = key.expect("the hello names the sled's key");
        assert_eq!(key, encode_key(&sled_key(7, "alpha").verifying_key()));
        assert_ne!(key, encode_key(&impostor_key(7, "alpha").verifying_key()));
        challenge(&mut ws, "alpha", &key, [42; 32]).await;
        send_control(&mut ws, welcome(5_000)).await;
        send_control(&mut ws, Control::Ping { seq: 1 }).await;
        assert_eq!(
            next_json(&mut ws).await.unwrap(),
            json!({"uplink":"pong","seq":1})
        );

        // After a lost connection the same key proves itself to a fresh nonce.
        drop(ws);
        let (mut ws, _, _) = accept(&listener).await;
        let Control::Hello { key: again, .. } = expect_hello(&mut ws).await else {
            panic!("not a hello");
        };
        assert_eq!(again.as_deref(), Some(key.as_str()));
        challenge(&mut ws, "alpha", &key, [7; 32]).await;
        send_control(&mut ws, welcome(5_000)).await;
        send(&mut ws, json!({"jsonrpc":"2.0","id":1,"method":"ping"})).await;
        assert_eq!(next_json(&mut ws).await.unwrap()["id"], 1);

        running.stop.take().unwrap().send(()).unwrap();
        running.task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn a_challenge_without_identity_fails_the_attempt() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sled = SharedSled::new(Sled::seeded("beta", 1));
        let mut running = start(&listener, sled, fast("beta"));

        let (mut ws, _, _) = accept(&listener).await;
        let Control::Hello { key, .. } = expect_hello(&mut ws).await else {
            panic!("not a hello");
        };
        assert_eq!(key, None);
        send_control(
            &mut ws,
            Control::Challenge {
                nonce: BASE64.encode([1u8; 32]),
            },
        )
        .await;
        // The sled hangs up rather than answer (a protocol error on its side)...
        let close = loop {
            match ws.next().await {
                Some(Ok(Message::Close(frame))) => break frame,
                Some(Ok(Message::Text(t))) => panic!("the sled answered a challenge: {t}"),
                Some(Ok(_)) => {}
                other => panic!("expected a close, got {other:?}"),
            }
        };
        assert_eq!(close.map(|f| f.code), Some(WsCloseCode::Protocol));
        // ...and tries again after an ordinary backoff.
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(5_000)).await;
        send_control(&mut ws, Control::Ping { seq: 3 }).await;
        assert_eq!(
            next_json(&mut ws).await.unwrap(),
            json!({"uplink":"pong","seq":3})
        );

        running.stop.take().unwrap().send(()).unwrap();
        running.task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn identity_refused_backs_off_like_unauthorized() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sled = SharedSled::new(Sled::seeded("gamma", 1));
        let opts = UplinkOptions {
            identity: Some(impostor_key(0, "gamma")),
            ..fast("gamma")
        };
        let mut running = start(&listener, sled, opts);
        // The long backoff: 6 × backoff_max (20 ms) = 120 ms; the ordinary one is at most 20 ms.
        let long = Duration::from_millis(100);

        // 4006 before welcome.
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        refuse(&mut ws, CloseCode::Unauthorized, "wrong token").await;
        let refused = Instant::now();
        let (mut ws, _, _) = accept(&listener).await;
        assert!(refused.elapsed() >= long, "{:?}", refused.elapsed());

        // 4007 after the proof: the same long wait.
        let Control::Hello { key, .. } = expect_hello(&mut ws).await else {
            panic!("not a hello");
        };
        challenge(&mut ws, "gamma", &key.unwrap(), [5; 32]).await;
        refuse(
            &mut ws,
            CloseCode::IdentityRefused,
            "the key differs from the pinned key",
        )
        .await;
        let refused = Instant::now();
        let (mut ws, _, _) = accept(&listener).await;
        assert!(refused.elapsed() >= long, "{:?}", refused.elapsed());

        // 4007 on a live uplink (the pin changed under it): the same.
        let Control::Hello { key, .. } = expect_hello(&mut ws).await else {
            panic!("not a hello");
        };
        challenge(&mut ws, "gamma", &key.unwrap(), [6; 32]).await;
        send_control(&mut ws, welcome(5_000)).await;
        refuse(&mut ws, CloseCode::IdentityRefused, "repinned").await;
        let refused = Instant::now();
        let (mut ws, _, _) = accept(&listener).await;
        assert!(refused.elapsed() >= long, "{:?}", refused.elapsed());
        expect_hello(&mut ws).await;

        running.stop.take().unwrap().send(()).unwrap();
        running.task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

/// The next relay event, as (seq, kind, story), skipping `sync` ones unless `sync` is set.
async fn next_event(ws: &mut Ws, sync: bool) -> (u64, String, Option<String>) {
    loop {
        let frame = next_frame(ws).await.expect("the uplink stays open");
        if frame["uplink"] != "event" {
            continue;
        }
        let Control::Event { seq, kind, story } = serde_json::from_value(frame).unwrap() else {
            unreachable!()
        };
        if sync || kind != "sync" {
            return (seq, kind, story);
        }
    }
}

fn call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":arguments}})
}

/// Sends a call and returns its response, then the relay events (not `sync`) that arrived
/// after it, up to the pong of a ping sent once the response was in.
async fn call_and_events(
    ws: &mut Ws,
    id: u64,
    name: &str,
    arguments: Value,
) -> (Value, Vec<Value>) {
    send(ws, call(id, name, arguments)).await;
    let response = loop {
        let frame = next_frame(ws).await.expect("the uplink stays open");
        if frame["id"] == id {
            break frame;
        }
        assert!(
            frame["uplink"] == "event" && frame["kind"] == "sync",
            "before the response: {frame}"
        );
    };
    send_control(ws, Control::Ping { seq: id }).await;
    let mut events = Vec::new();
    loop {
        let frame = next_frame(ws).await.expect("the uplink stays open");
        if frame == json!({"uplink":"pong","seq":id}) {
            return (response, events);
        }
        assert_eq!(frame["uplink"], "event", "{frame}");
        if frame["kind"] != "sync" {
            events.push(frame);
        }
    }
}

#[tokio::test]
async fn relay_sends_sync_ticks_and_an_event_per_mutation() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sled = SharedSled::new(Sled::new(Project::new("alpha"), "alpha", 5));
        let interval = Duration::from_millis(150);
        let opts = UplinkOptions {
            relay_interval: interval,
            ..fast("alpha")
        };
        let mut running = start(&listener, sled, opts);

        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(5_000)).await;
        let welcomed = Instant::now();
        // The anti-entropy tick: sync events, one interval apart.
        assert_eq!(next_event(&mut ws, true).await, (1, "sync".into(), None));
        assert!(welcomed.elapsed() >= interval, "{:?}", welcomed.elapsed());
        assert_eq!(next_event(&mut ws, true).await, (2, "sync".into(), None));
        assert!(
            welcomed.elapsed() >= interval * 2,
            "{:?}",
            welcomed.elapsed()
        );

        // Each successful mutating call: its response, then its event naming the story.
        let cases = [
            (
                "create_story",
                json!({"name":"s","acceptance_criteria":["a"]}),
                Some("story_created"),
            ),
            (
                "move_story",
                json!({"story_id":"alpha-1","stage":"in_progress"}),
                Some("story_moved"),
            ),
            (
                "block_story",
                json!({"story_id":"alpha-1","reason":"waiting"}),
                Some("story_blocked"),
            ),
            (
                "unblock_story",
                json!({"story_id":"alpha-1"}),
                Some("story_updated"),
            ),
            (
                "record_test_result",
                json!({"story_id":"alpha-1","test":"t1","passed":false}),
                Some("test_failed"),
            ),
            (
                "record_test_result",
                json!({"story_id":"alpha-1","test":"t1","passed":true}),
                Some("story_updated"),
            ),
            (
                "add_todo",
                json!({"story_id":"alpha-1","text":"do it"}),
                Some("story_updated"),
            ),
            (
                "update_story",
                json!({"story_id":"alpha-1","name":"renamed"}),
                Some("story_updated"),
            ),
            // Reads and failed calls relay nothing.
            ("show", json!({"story_id":"alpha-1"}), None),
            (
                "move_story",
                json!({"story_id":"alpha-99","stage":"in_progress"}),
                None,
            ),
            ("create_story", json!({}), None),
        ];
        let mut last_seq = 2;
        for (i, (tool, args, kind)) in cases.into_iter().enumerate() {
            let id = 10 + i as u64;
            let (response, events) = call_and_events(&mut ws, id, tool, args).await;
            assert!(response.get("result").is_some(), "{response}");
            match kind {
                Some(kind) => {
                    assert_eq!(response["result"].get("isError"), None, "{response}");
                    assert_eq!(events.len(), 1, "{tool}: {events:?}");
                    assert_eq!(events[0]["kind"], kind, "{tool}");
                    assert_eq!(events[0]["story"], "alpha-1", "{tool}");
                    let seq = events[0]["seq"].as_u64().unwrap();
                    assert!(seq > last_seq, "{seq} after {last_seq}");
                    last_seq = seq;
                }
                None => assert!(events.is_empty(), "{tool}: {events:?}"),
            }
        }

        // The sequence carries on across a reconnect.
        drop(ws);
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(5_000)).await;
        let (_, events) = call_and_events(
            &mut ws,
            1,
            "create_story",
            json!({"name":"t","acceptance_criteria":[]}),
        )
        .await;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["story"], "alpha-2");
        assert!(events[0]["seq"].as_u64().unwrap() > last_seq);

        running.stop.take().unwrap().send(()).unwrap();
        running.task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn relay_events_follow_delayed_calls() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sled = SharedSled::new(Sled::new(Project::new("alpha"), "alpha", 5));
        let opts = UplinkOptions {
            latency: Duration::from_millis(20),
            ..fast("alpha")
        };
        let mut running = start(&listener, sled, opts);
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(5_000)).await;
        let (response, events) = call_and_events(
            &mut ws,
            1,
            "create_story",
            json!({"name":"slow","acceptance_criteria":[]}),
        )
        .await;
        assert_eq!(
            response["result"]["structuredContent"]["story"]["id"],
            "alpha-1"
        );
        assert_eq!(
            events,
            vec![json!({"uplink":"event","seq":1,"kind":"story_created","story":"alpha-1"})]
        );
        running.stop.take().unwrap().send(()).unwrap();
        running.task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn a_stalled_relay_sends_no_events_but_serves() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sled = SharedSled::new(Sled::new(Project::new("alpha"), "alpha", 5));
        let opts = UplinkOptions {
            relay_interval: Duration::from_millis(20),
            stall_relay: true,
            ..fast("alpha")
        };
        let mut running = start(&listener, sled.clone(), opts);
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(5_000)).await;
        let started = Instant::now();
        let mut id = 0;
        // Well past ten sync intervals: calls and pings answered, and no event frame at all.
        while started.elapsed() < Duration::from_millis(300) {
            id += 1;
            let (response, events) = call_and_events(
                &mut ws,
                id,
                "create_story",
                json!({"name": format!("s{id}"), "acceptance_criteria":[]}),
            )
            .await;
            assert_eq!(
                response["result"]["structuredContent"]["story"]["id"],
                format!("alpha-{id}")
            );
            assert!(events.is_empty(), "{events:?}");
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        // Nothing was queued behind the last pong either.
        send_control(&mut ws, Control::Ping { seq: 999 }).await;
        assert_eq!(
            next_frame(&mut ws).await.unwrap(),
            json!({"uplink":"pong","seq":999})
        );
        assert_eq!(sled.with(|s| s.project().stories.len()), id as usize);

        running.stop.take().unwrap().send(()).unwrap();
        running.task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn a_handler_backend_relays_only_sync_ticks() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gateway = GatewayAddr::parse(&format!("http://{addr}")).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let opts = UplinkOptions {
            relay_interval: Duration::from_millis(40),
            ..fast("conf")
        };
        let backend = Backend::Handler(Arc::new(Fixture::new("conf")));
        let task = tokio::spawn(run_uplink_with(
            TokioConnect,
            gateway,
            backend,
            opts,
            async {
                let _ = stopped.await;
            },
        ));
        let (mut ws, _, _) = accept(&listener).await;
        expect_hello(&mut ws).await;
        send_control(&mut ws, welcome(5_000)).await;
        send(
            &mut ws,
            json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
        )
        .await;
        let mut kinds = Vec::new();
        let mut answered = false;
        while kinds.len() < 3 {
            let frame = next_frame(&mut ws).await.unwrap();
            if frame["id"] == 1 {
                answered = true;
            } else if frame["uplink"] == "event" {
                kinds.push((frame["seq"].as_u64().unwrap(), frame["kind"].clone()));
            }
        }
        assert!(answered);
        assert_eq!(
            kinds,
            vec![(1, json!("sync")), (2, json!("sync")), (3, json!("sync"))]
        );
        stop.send(()).unwrap();
        task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

/// A fenced `tools/call` of `move_story` on `alpha-1`.
fn fenced_move(id: u64, stage: &str, fence: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
        "name": "move_story",
        "arguments": {"story_id": "alpha-1", "stage": stage},
        "_meta": {FENCE_META: {"resource": "story:alpha-1", "fence": fence}}}})
}

#[tokio::test]
async fn a_reconnecting_sleds_hello_carries_the_highest_fence_it_accepted() {
    // The story sled served directly, and wrapped as the simulation's handler.
    for wrapped in [false, true] {
        timeout(LIMIT, async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let gateway = GatewayAddr::parse(&format!("http://{addr}")).unwrap();
            let sled = SharedSled::new(Sled::new(Project::new("alpha"), "alpha", 1));
            sled.with(|s| {
                s.call_tool(
                    "create_story",
                    Some(&json!({"name": "A", "acceptance_criteria": []})),
                )
                .unwrap()
            });
            let backend = if wrapped {
                Backend::Handler(Arc::new(SimSled::new(
                    sled.clone(),
                    Duration::ZERO,
                    Duration::ZERO,
                    1,
                )))
            } else {
                sled_sim::uplink::story(sled.clone())
            };
            let (stop, stopped) = oneshot::channel::<()>();
            let task = tokio::spawn(run_uplink_with(
                TokioConnect,
                gateway,
                backend,
                fast("alpha"),
                async {
                    let _ = stopped.await;
                },
            ));
            let (mut ws, _, _) = accept(&listener).await;
            let Control::Hello { fence, .. } = expect_hello(&mut ws).await else {
                panic!("not a hello");
            };
            assert_eq!(fence, None, "a fresh sled never accepted a fence");
            send_control(&mut ws, welcome(5_000)).await;
            send(&mut ws, fenced_move(1, "review", 7)).await;
            let moved = next_json(&mut ws).await.unwrap();
            assert_eq!(
                moved["result"]["structuredContent"]["to"], "review",
                "{moved}"
            );
            // A stale holder's write is refused by the sled itself.
            send(&mut ws, fenced_move(2, "done", 6)).await;
            let refused = next_json(&mut ws).await.unwrap();
            assert_eq!(refused["result"]["isError"], true, "{refused}");
            assert_eq!(
                refused["result"]["structuredContent"],
                json!({"kind": "stale_fence", "resource": "story:alpha-1", "fence": 6,
                       "highest": 7, "project": "alpha"})
            );
            assert_eq!(
                sled.with(|s| s.project().story("alpha-1").unwrap().stage.as_str()),
                "review"
            );

            // The connection drops; the next hello reports fence 7.
            drop(ws);
            let (mut ws, _, _) = accept(&listener).await;
            let Control::Hello { fence, .. } = expect_hello(&mut ws).await else {
                panic!("not a hello");
            };
            assert_eq!(fence, Some(7), "wrapped: {wrapped}");
            stop.send(()).unwrap();
            task.await.unwrap();
        })
        .await
        .expect("test timed out");
    }
}

/// `run_tests` as a task over a real uplink, for both ways a sled-sim sled is served (the
/// story model's synchronous backend and the simulation's handler): the `CreateTaskResult`
/// comes at once, progress under the gateway's token and the status notification after it,
/// then `tasks/get`, `tasks/list` and `tasks/result`; a second task is cancelled, and never
/// reports completed.
#[tokio::test]
async fn run_tests_runs_as_a_task_over_the_uplink() {
    for wrapped in [false, true] {
        timeout(LIMIT, async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let gateway = GatewayAddr::parse(&format!("http://{addr}")).unwrap();
            let config = sled_sim::SledConfig {
                run_tests_ms: (400, 400),
                task_ids: sled_sim::mcp::TaskIds::Counter,
                ..sled_sim::SledConfig::default()
            };
            let sled =
                SharedSled::new(Sled::new(Project::new("alpha"), "alpha", 1).with_config(config));
            let backend = if wrapped {
                Backend::Handler(Arc::new(SimSled::new(
                    sled.clone(),
                    Duration::ZERO,
                    Duration::ZERO,
                    1,
                )))
            } else {
                sled_sim::uplink::story(sled.clone())
            };
            let (stop, stopped) = oneshot::channel::<()>();
            let task = tokio::spawn(run_uplink_with(
                TokioConnect,
                gateway,
                backend,
                fast("alpha"),
                async {
                    let _ = stopped.await;
                },
            ));
            let (mut ws, _, _) = accept(&listener).await;
            expect_hello(&mut ws).await;
            send_control(&mut ws, welcome(5_000)).await;

            let call = |id: u64, suite: &str| {
                json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
                "name":"run_tests","arguments":{"suite":suite},"task":{"ttl":60_000},
                "_meta":{"progressToken":format!("gw-{id}")}}})
            };
            let sent = Instant::now();
            send(&mut ws, call(1, "unit")).await;
            let created = next_json(&mut ws).await.unwrap();
            assert_eq!(created["id"], 1, "{created}");
            assert_eq!(created["result"]["task"]["taskId"], "t1", "{created}");
            assert_eq!(created["result"]["task"]["status"], "working");
            assert!(
                sent.elapsed() < Duration::from_millis(300),
                "answered at once"
            );
            send(
                &mut ws,
                json!({"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId":"t1"}}),
            )
            .await;
            let got = next_json(&mut ws).await.unwrap();
            assert_eq!(
                (got["id"].clone(), got["result"]["status"].clone()),
                (json!(2), json!("working")),
                "{got}"
            );
            send(
                &mut ws,
                json!({"jsonrpc":"2.0","id":3,"method":"tasks/result","params":{"taskId":"t1"}}),
            )
            .await;
            // Progress under the gateway's token; the status notification and the result (in
            // either order: the one goes out with the sled's notices, the other with the call).
            let mut progress = 0;
            let mut status = None;
            let mut result = None;
            while status.is_none() || result.is_none() {
                let frame = next_json(&mut ws).await.unwrap();
                match frame["method"].as_str() {
                    Some("notifications/progress") => {
                        assert!(result.is_none(), "progress after the result: {frame}");
                        assert_eq!(frame["params"]["progressToken"], "gw-1");
                        assert_eq!(
                            frame["params"]["_meta"]["io.modelcontextprotocol/related-task"]
                                ["taskId"],
                            "t1"
                        );
                        progress += 1;
                    }
                    Some("notifications/tasks/status") => status = Some(frame["params"].clone()),
                    _ if frame["id"] == 3 => result = Some(frame),
                    _ => panic!("unexpected {frame}"),
                }
            }
            let result = result.unwrap();
            assert_eq!(progress, 4);
            let status = status.unwrap();
            assert_eq!(
                (status["taskId"].as_str(), status["status"].as_str()),
                (Some("t1"), Some("completed"))
            );
            let content = &result["result"]["structuredContent"];
            assert_eq!(
                (content["project"].as_str(), content["suite"].as_str()),
                (Some("alpha"), Some("unit"))
            );
            assert_eq!(
                result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
                "t1"
            );

            send(&mut ws, call(4, "slow")).await;
            let second = next_json(&mut ws).await.unwrap();
            assert_eq!(second["result"]["task"]["taskId"], "t2", "{second}");
            send(
                &mut ws,
                json!({"jsonrpc":"2.0","id":5,"method":"tasks/cancel","params":{"taskId":"t2"}}),
            )
            .await;
            let cancelled = loop {
                let frame = next_json(&mut ws).await.unwrap();
                if frame["id"] == 5 {
                    break frame;
                }
            };
            assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
            send(
                &mut ws,
                json!({"jsonrpc":"2.0","id":6,"method":"tasks/list"}),
            )
            .await;
            // Past the second task's would-be end: nothing more about it but its cancellation.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let listed = loop {
                let frame = next_json(&mut ws).await.unwrap();
                assert_ne!(frame["params"]["status"], "completed", "{frame}");
                if frame["id"] == 6 {
                    break frame;
                }
            };
            let tasks: Vec<(Value, Value)> = listed["result"]["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (t["taskId"].clone(), t["status"].clone()))
                .collect();
            assert_eq!(
                tasks,
                [
                    (json!("t1"), json!("completed")),
                    (json!("t2"), json!("cancelled"))
                ]
            );
            send(
                &mut ws,
                json!({"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"taskId":"t2"}}),
            )
            .await;
            let after = loop {
                let frame = next_json(&mut ws).await.unwrap();
                assert_ne!(frame["params"]["status"], "completed", "{frame}");
                if frame["id"] == 7 {
                    break frame;
                }
            };
            assert_eq!(after["result"]["status"], "cancelled");
            let _ = stop.send(());
            let _ = task.await;
        })
        .await
        .unwrap_or_else(|_| panic!("timed out (wrapped: {wrapped})"));
    }
}
