//! Drain on shutdown, against a tiny fake gateway: with [`UplinkOptions::drain`], the calls
//! running when shutdown is asked are answered before the uplink closes, and a request that
//! arrives meanwhile is refused at once (`sled_shutting_down`, not applied); without it the
//! uplink closes at once, the call unanswered.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, SinkExt, StreamExt};
use gateway_core::uplink::{Control, PROTOCOL_VERSION};
use serde_json::{json, Value};
use sled_uplink::{
    run_uplink_with, Backend, CallContext, GatewayAddr, Handler, TokioConnect, UplinkOptions,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type Ws = WebSocketStream<TcpStream>;

const LIMIT: Duration = Duration::from_secs(10);

/// Answers each `tools/call` after `delay`.
struct Slow {
    delay: Duration,
}

impl Handler for Slow {
    fn project_name(&self) -> &str {
        "slow"
    }

    fn handle(self: Arc<Self>, msg: Value, _: CallContext) -> BoxFuture<'static, Option<Value>> {
        async move {
            let id = msg.get("id")?.clone();
            tokio::time::sleep(self.delay).await;
            Some(json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "done"}]}}))
        }
        .boxed()
    }
}

/// A frame from the sled: JSON text, or `None` for a close (or the end).
async fn next(ws: &mut Ws) -> Option<Value> {
    loop {
        match ws.next().await? {
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["uplink"] != "event" {
                    return Some(v);
                }
            }
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

fn call(id: u64) -> Message {
    Message::text(
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "work", "arguments": {}}})
        .to_string(),
    )
}

/// A sled serving [`Slow`] with `drain`, welcomed by the fake gateway; its stop switch.
async fn welcomed(
    drain: Option<Duration>,
) -> (Ws, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway =
        GatewayAddr::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let opts = UplinkOptions {
        sled_name: "slow".into(),
        relay_interval: Duration::ZERO,
        drain,
        ..UplinkOptions::default()
    };
    let backend = Backend::Handler(Arc::new(Slow {
        delay: Duration::from_millis(400),
    }));
    let task = tokio::spawn(run_uplink_with(
        TokioConnect,
        gateway,
        backend,
        opts,
        async {
            let _ = stopped.await;
        },
    ));
    let (tcp, _) = listener.accept().await.unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    let hello = next(&mut ws).await.unwrap();
    assert_eq!(hello["uplink"], "hello");
    let welcome = Control::Welcome {
        protocol: PROTOCOL_VERSION,
        heartbeat_ms: 5_000,
        epoch: None,
    };
    ws.send(Message::text(welcome.to_text())).await.unwrap();
    (ws, stop, task)
}

#[tokio::test]
async fn with_a_drain_the_calls_running_are_answered_before_the_uplink_closes() {
    timeout(LIMIT, async {
        let (mut ws, stop, task) = welcomed(Some(Duration::from_secs(5))).await;
        ws.send(call(1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        ws.send(call(2)).await.unwrap();
        let refused = next(&mut ws).await.expect("the new call is refused");
        assert_eq!(refused["id"], 2, "{refused}");
        assert_eq!(
            refused["error"]["data"]["kind"], "sled_shutting_down",
            "{refused}"
        );
        assert_eq!(refused["error"]["data"]["outcome"], "not_sent", "{refused}");
        let answered = next(&mut ws).await.expect("the running call is answered");
        assert_eq!(answered["id"], 1, "{answered}");
        assert_eq!(answered["result"]["content"][0]["text"], "done");
        assert_eq!(next(&mut ws).await, None, "then the uplink closes");
        task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn without_a_drain_the_uplink_closes_at_once() {
    timeout(LIMIT, async {
        let (mut ws, stop, task) = welcomed(None).await;
        ws.send(call(1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.send(()).unwrap();
        assert_eq!(next(&mut ws).await, None, "closed without the answer");
        task.await.unwrap();
    })
    .await
    .expect("test timed out");
}

#[tokio::test]
async fn a_drain_ends_at_its_limit() {
    timeout(LIMIT, async {
        let (mut ws, stop, task) = welcomed(Some(Duration::from_millis(100))).await;
        ws.send(call(1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.send(()).unwrap();
        assert_eq!(
            next(&mut ws).await,
            None,
            "closed at the limit, before the 400 ms call"
        );
        task.await.unwrap();
    })
    .await
    .expect("test timed out");
}
