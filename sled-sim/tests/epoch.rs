//! The sled's epoch fence against fake gateways: a sled reports the highest epoch it was
//! welcomed with, refuses a stale one, serves calls only on its newest-epoch uplink, and
//! closes an older one with 4008 (`Superseded`).

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway_core::uplink::{CloseCode, Control, PROTOCOL_VERSION};
use serde_json::{json, Value};
use sled_sim::mcp::{SharedSled, Sled};
use sled_sim::model::Project;
use sled_sim::net::{GatewayAddr, TokioConnect};
use sled_sim::uplink::{run_uplink_fenced, UplinkOptions};
use sled_sim::EpochFence;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type Ws = WebSocketStream<TcpStream>;

const LIMIT: Duration = Duration::from_secs(10);

/// What the sled sent next: a JSON frame (relay events skipped), or how it closed.
#[derive(Debug, PartialEq)]
enum Next {
    Json(Value),
    Closed(Option<u16>),
}

async fn next(ws: &mut Ws) -> Next {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["uplink"] != "event" {
                    return Next::Json(v);
                }
            }
            Some(Ok(Message::Close(frame))) => {
                return Next::Closed(frame.map(|f| u16::from(f.code)))
            }
            None | Some(Err(_)) => return Next::Closed(None),
            Some(Ok(_)) => {}
        }
    }
}

/// Accepts the sled's next connection and reads its hello's `epoch_seen`.
async fn accept(listener: &TcpListener) -> (Ws, Option<u64>) {
    let (tcp, _) = listener.accept().await.unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    let Next::Json(hello) = next(&mut ws).await else {
        panic!("no hello");
    };
    let Control::Hello { epoch_seen, .. } = serde_json::from_value(hello).unwrap() else {
        panic!("not a hello");
    };
    (ws, epoch_seen)
}

async fn welcome(ws: &mut Ws, epoch: Option<u64>) {
    let welcome = Control::Welcome {
        protocol: PROTOCOL_VERSION,
        heartbeat_ms: 0,
        epoch,
    };
    ws.send(Message::text(welcome.to_text())).await.unwrap();
}

/// Sends a `tools/call` and returns what the sled sent back.
async fn call(ws: &mut Ws, id: u64) -> Next {
    let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "list_stories", "arguments": {}}});
    ws.send(Message::text(call.to_string())).await.unwrap();
    next(ws).await
}

fn answered(next: &Next, id: u64) -> bool {
    matches!(next, Next::Json(v) if v["id"] == id && v.get("result").is_some())
}

struct Uplink {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn start(listener: &TcpListener, sled: &SharedSled, fence: &EpochFence) -> Uplink {
    let addr = listener.local_addr().unwrap();
    let gateway = GatewayAddr::parse(&format!("http://{addr}")).unwrap();
    let opts = UplinkOptions {
        sled_name: "alpha-sled".into(),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(20),
        relay_interval: Duration::ZERO,
        ..UplinkOptions::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run_uplink_fenced(
        TokioConnect,
        gateway,
        sled_sim::uplink::story(sled.clone()),
        opts,
        fence.clone(),
        async {
            let _ = stopped.await;
        },
    ));
    Uplink { stop, task }
}

impl Uplink {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap();
    }
}

fn sled() -> SharedSled {
    SharedSled::new(Sled::new(Project::new("alpha"), "alpha-sled", 3))
}

#[tokio::test]
async fn the_highest_epoch_is_kept_across_reconnects_and_a_stale_one_refused() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fence = EpochFence::default();
        let uplink = start(&listener, &sled(), &fence);

        let (mut ws, seen) = accept(&listener).await;
        assert_eq!(seen, None, "a new sled has seen no epoch");
        welcome(&mut ws, Some(5)).await;
        assert!(answered(&call(&mut ws, 1).await, 1));
        assert_eq!(fence.seen(), Some(5));
        drop(ws);

        // The next hello reports it; a welcome at or below it is a stale claim.
        let (mut ws, seen) = accept(&listener).await;
        assert_eq!(seen, Some(5));
        welcome(&mut ws, Some(5)).await;
        assert_eq!(
            next(&mut ws).await,
            Next::Closed(Some(CloseCode::Superseded.code()))
        );
        let (mut ws, seen) = accept(&listener).await;
        assert_eq!(seen, Some(5));
        welcome(&mut ws, Some(4)).await;
        assert_eq!(
            next(&mut ws).await,
            Next::Closed(Some(CloseCode::Superseded.code()))
        );

        // A welcome without an epoch (a gateway not in a cluster) serves as before, and the
        // fence stays where it was.
        let (mut ws, seen) = accept(&listener).await;
        assert_eq!(seen, Some(5));
        welcome(&mut ws, None).await;
        assert!(answered(&call(&mut ws, 2).await, 2));
        drop(ws);
        let (mut ws, seen) = accept(&listener).await;
        assert_eq!(seen, Some(5));
        welcome(&mut ws, Some(8)).await;
        assert!(answered(&call(&mut ws, 3).await, 3));
        assert_eq!(fence.seen(), Some(8));
        uplink.stop().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn a_newer_epoch_on_another_connection_closes_the_older_one() {
    timeout(LIMIT, async {
        let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sled = sled();
        let fence = EpochFence::default();
        // One sled, two connections (to replicas `a` and `b`) sharing its fence.
        let to_a = start(&a, &sled, &fence);
        let (mut on_a, _) = accept(&a).await;
        welcome(&mut on_a, Some(3)).await;
        assert!(answered(&call(&mut on_a, 1).await, 1));

        let to_b = start(&b, &sled, &fence);
        let (mut on_b, seen) = accept(&b).await;
        assert_eq!(seen, Some(3));
        welcome(&mut on_b, Some(4)).await;
        // `a` lost its claim: its uplink is closed, and a call sent on it is not served.
        let on_a_next = call(&mut on_a, 2).await;
        assert_eq!(
            on_a_next,
            Next::Closed(Some(CloseCode::Superseded.code())),
            "served on a superseded uplink"
        );
        assert!(answered(&call(&mut on_b, 2).await, 2));

        // `a`'s loop reconnects, reporting the newer epoch; `a` claims above it and wins
        // back, and now `b`'s connection is the older one.
        let (mut on_a, seen) = accept(&a).await;
        assert_eq!(seen, Some(4));
        welcome(&mut on_a, Some(6)).await;
        assert_eq!(
            next(&mut on_b).await,
            Next::Closed(Some(CloseCode::Superseded.code()))
        );
        assert!(answered(&call(&mut on_a, 3).await, 3));
        to_a.stop().await;
        to_b.stop().await;
    })
    .await
    .expect("test timed out");
}

/// Issue 30, make-before-break: asked to move, the sled opens a new uplink (its hello says
/// `moving`) while the old one stays; once the new one is welcomed with a higher epoch, the
/// old one answers the call running on it, refuses a new one (not applied), and closes with
/// 4008.
#[tokio::test]
async fn asked_to_move_the_sled_opens_a_new_uplink_first_and_the_old_one_answers_its_calls() {
    timeout(LIMIT, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fence = EpochFence::default();
        let opts = UplinkOptions {
            sled_name: "alpha-sled".into(),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(20),
            relay_interval: Duration::ZERO,
            latency: Duration::from_millis(300),
            ..UplinkOptions::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run_uplink_fenced(
            TokioConnect,
            GatewayAddr::parse(&format!("http://{addr}")).unwrap(),
            sled_sim::uplink::story(sled()),
            opts,
            fence.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        let (mut old, _) = accept(&listener).await;
        welcome(&mut old, Some(5)).await;
        let running = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "list_stories", "arguments": {}}});
        old.send(Message::text(running.to_string())).await.unwrap();
        let ask = Control::Move {
            reason: "stopping".into(),
        };
        old.send(Message::text(ask.to_text())).await.unwrap();

        // A new connection, with the old one still open.
        let (tcp, _) = listener.accept().await.unwrap();
        let mut new = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let Next::Json(hello) = next(&mut new).await else {
            panic!("no hello");
        };
        let Control::Hello {
            epoch_seen, moving, ..
        } = serde_json::from_value(hello).unwrap()
        else {
            panic!("not a hello");
        };
        assert_eq!((epoch_seen, moving), (Some(5), true));
        welcome(&mut new, Some(6)).await;
        while fence.seen() != Some(6) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A request on the old one is refused, not applied; the new one serves.
        let late = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "list_stories", "arguments": {}}});
        old.send(Message::text(late.to_string())).await.unwrap();
        assert!(answered(&call(&mut new, 2).await, 2));
        let mut seen = Vec::new();
        loop {
            match next(&mut old).await {
                Next::Json(v) => seen.push(v),
                Next::Closed(code) => {
                    assert_eq!(code, Some(CloseCode::Superseded.code()), "{seen:?}");
                    break;
                }
            }
        }
        let answer = seen
            .iter()
            .find(|v| v["id"] == 1)
            .expect("the running call is answered");
        assert!(answer.get("result").is_some(), "{seen:?}");
        let refused = seen
            .iter()
            .find(|v| v["id"] == 3)
            .expect("the late call is refused");
        assert_eq!(refused["error"]["data"]["kind"], "superseded", "{seen:?}");
        stop.send(()).unwrap();
        task.await.unwrap();
    })
    .await
    .expect("the test hung");
}
