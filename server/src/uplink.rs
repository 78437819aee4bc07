//! One task per uplink WebSocket: frames in become commands for the driver, [`Outbound`]s from
//! the driver become frames out.
//!
//! The task is written against a `Stream` of incoming messages and a `Sink` of outgoing ones
//! (axum's `testing-websockets` pattern), so its tests feed it channels.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use gateway_core::UplinkId;
use tokio::sync::mpsc;

use crate::driver::{Command, Outbound, UPLINK_QUEUE};
use crate::http::AppState;

/// After sending a close frame, how long to wait for the sled's close frame before dropping the
/// connection. Reading until then keeps unread frames from turning our close into a reset.
const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// The WebSocket close code when the gateway cuts an uplink off without the core deciding to
/// (its queue overflowed, or the gateway is going away): 1011, internal error.
const CODE_CUT_OFF: u16 = 1011;

/// Runs an upgraded uplink WebSocket to its end. `connection` (absent only where no accept
/// loop of ours made the connection) reads within the pre-welcome allowance and holds its
/// place under the connection caps until the welcome.
pub(crate) async fn run(
    socket: WebSocket,
    state: AppState,
    connection: Option<crate::limits::Connection>,
) {
    let uplink = state.ids.next_uplink();
    let (sink, stream) = socket.split();
    let pre = connection.map(|c| PreWelcome {
        _permit: c.take_permit(),
        budget: c.budget,
    });
    let cut = drive(uplink, stream, sink, state.cmd, pre).await;
    if cut {
        state
            .counters
            .uplink_pre_welcome_cut
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An uplink before its welcome: it reads within a small allowance, and holds its
/// connection's place under the caps.
pub(crate) struct PreWelcome {
    /// Held, never read: dropped with the rest at the welcome.
    pub(crate) _permit: Option<crate::limits::Permit>,
    pub(crate) budget: std::sync::Arc<crate::limits::ReadBudget>,
}

/// Pumps one uplink: `incoming` to the driver, the driver's [`Outbound`]s to `outgoing`.
/// `pre` is let go when the welcome is sent. Says whether the uplink was cut for reading past
/// its pre-welcome allowance.
pub(crate) async fn drive<I, O, E>(
    uplink: UplinkId,
    mut incoming: I,
    mut outgoing: O,
    cmd: mpsc::Sender<Command>,
    mut pre: Option<PreWelcome>,
) -> bool
where
    I: Stream<Item = Result<Message, E>> + Unpin,
    E: std::fmt::Display,
    O: Sink<Message> + Unpin,
    O::Error: std::fmt::Display,
{
    let (tx, mut rx) = mpsc::channel(UPLINK_QUEUE);
    if cmd
        .send(Command::UplinkOpened { uplink, tx })
        .await
        .is_err()
    {
        // The driver is gone: the gateway is stopping.
        let _ = close(
            &mut incoming,
            &mut outgoing,
            1001,
            "the gateway is shutting down",
        )
        .await;
        return false;
    }
    tracing::info!(uplink = uplink.0, "uplink opened");
    let why = loop {
        tokio::select! {
            out = rx.recv() => {
                // Everything already queued goes out with one flush: under load a burst of
                // calls to one sled costs one write, not one per frame.
                let mut next = out;
                // What ended the burst: nothing (the queue is empty), a close, or the
                // driver's end (`Some(None)`).
                let mut ended: Option<Option<Outbound>> = None;
                let mut failed = None;
                loop {
                    match next.take() {
                        Some(Outbound::Text(text)) => {
                            if pre.is_some() && gateway_core::uplink::is_welcome(&text) {
                                if let Some(p) = pre.take() {
                                    p.budget.lift();
                                }
                            }
                            if let Err(e) = outgoing.feed(Message::Text(text.into())).await {
                                failed = Some(format!("send failed: {e}"));
                                break;
                            }
                            match rx.try_recv() {
                                Ok(more) => next = Some(more),
                                Err(mpsc::error::TryRecvError::Empty) => break,
                                Err(mpsc::error::TryRecvError::Disconnected) => {
                                    ended = Some(None);
                                    break;
                                }
                            }
                        }
                        other => {
                            ended = Some(other);
                            break;
                        }
                    }
                }
                if failed.is_none() {
                    if let Err(e) = outgoing.flush().await {
                        failed = Some(format!("send failed: {e}"));
                    }
                }
                if let Some(why) = failed {
                    break why;
                }
                match ended {
                    None | Some(Some(Outbound::Text(_))) => {}
                    Some(Some(Outbound::Close { code, reason })) => {
                        // The core has closed it and forgotten it: no UplinkClosed.
                        if let Err(e) = close(&mut incoming, &mut outgoing, code, &reason).await {
                            tracing::debug!(uplink = uplink.0, error = %e, "close frame not sent");
                        }
                        return false;
                    }
                    Some(None) => {
                        // The driver dropped us (queue overflow) or is gone; it already knows.
                        tracing::info!(uplink = uplink.0, code = CODE_CUT_OFF, "uplink cut off");
                        let _ = close(&mut incoming, &mut outgoing, CODE_CUT_OFF, "uplink cut off").await;
                        return false;
                    }
                }
            }
            frame = incoming.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    let text = text.as_str().to_owned();
                    if cmd.send(Command::UplinkText { uplink, text }).await.is_err() {
                        break "the gateway is stopping".to_owned();
                    }
                }
                Some(Ok(Message::Binary(data))) => {
                    let len = data.len();
                    if cmd.send(Command::UplinkBinary { uplink, len }).await.is_err() {
                        break "the gateway is stopping".to_owned();
                    }
                }
                // Pings are answered by the WebSocket layer; pongs mean nothing to us.
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(frame))) => {
                    break match frame {
                        Some(f) => format!("closed by the sled: {} {}", f.code, f.reason.as_str()),
                        None => "closed by the sled".to_owned(),
                    };
                }
                Some(Err(e)) => break format!("receive failed: {e}"),
                None => break "connection ended".to_owned(),
            },
        }
    };
    let cut = pre.is_some_and(|p| p.budget.exhausted());
    if cut {
        tracing::info!(
            uplink = uplink.0,
            allowance = crate::limits::PRE_WELCOME_BYTES,
            "uplink cut: it sent more than it may before its welcome"
        );
    }
    tracing::info!(uplink = uplink.0, reason = %why, "uplink closed");
    let _ = cmd.send(Command::UplinkClosed { uplink }).await;
    // Answer a close handshake / finish the socket; errors here change nothing.
    let _ = outgoing.close().await;
    cut
}

/// Sends a close frame, then reads (and ignores) frames until the sled's close or
/// [`CLOSE_LINGER`].
async fn close<I, O, E>(
    incoming: &mut I,
    outgoing: &mut O,
    code: u16,
    reason: &str,
) -> Result<(), O::Error>
where
    I: Stream<Item = Result<Message, E>> + Unpin,
    O: Sink<Message> + Unpin,
{
    let frame = CloseFrame {
        code,
        reason: truncate(reason, MAX_CLOSE_REASON).into(),
    };
    outgoing.send(Message::Close(Some(frame))).await?;
    let _ = tokio::time::timeout(CLOSE_LINGER, async {
        while let Some(Ok(frame)) = incoming.next().await {
            if matches!(frame, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
    Ok(())
}

/// A close frame's reason may be at most 123 bytes (125 less the code).
const MAX_CLOSE_REASON: usize = 123;

/// `s` cut to at most `max` bytes, at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures_util::{sink, stream};

    use super::*;

    /// A sink that hands every message to `out`.
    fn recorder(
        out: mpsc::UnboundedSender<Message>,
    ) -> std::pin::Pin<Box<impl Sink<Message, Error = Infallible>>> {
        Box::pin(sink::unfold(out, |out, msg| async move {
            let _ = out.send(msg);
            Ok::<_, Infallible>(out)
        }))
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc", 123), "abc");
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate(&"x".repeat(200), 123).len(), 123);
    }

    /// Frames in, commands out, then the driver closes the uplink.
    #[tokio::test(start_paused = true)]
    async fn forwards_frames_and_closes_on_command() {
        let (cmd_tx, mut cmd_rx) = mpsc::channel(16);
        let incoming = stream::iter([
            Ok::<_, Infallible>(Message::Text("hello".into())),
            Ok(Message::Ping(Default::default())),
            Ok(Message::Binary(vec![1, 2, 3].into())),
        ])
        .chain(stream::pending());
        let (out_tx, mut out_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(drive(
            UplinkId(7),
            Box::pin(incoming),
            recorder(out_tx),
            cmd_tx,
            None,
        ));

        let Some(Command::UplinkOpened { uplink, tx }) = cmd_rx.recv().await else {
            panic!("expected UplinkOpened");
        };
        assert_eq!(uplink, UplinkId(7));
        match cmd_rx.recv().await {
            Some(Command::UplinkText { uplink, text }) => {
                assert_eq!((uplink, text.as_str()), (UplinkId(7), "hello"));
            }
            other => panic!("expected UplinkText, got {other:?}"),
        }
        match cmd_rx.recv().await {
            Some(Command::UplinkBinary { uplink, len }) => {
                assert_eq!((uplink, len), (UplinkId(7), 3))
            }
            other => panic!("expected UplinkBinary, got {other:?}"),
        }
        tx.send(Outbound::Text("welcome".into())).await.unwrap();
        tx.send(Outbound::Close {
            code: 4001,
            reason: "replaced".into(),
        })
        .await
        .unwrap();
        task.await.unwrap();
        let mut sent = Vec::new();
        while let Some(m) = out_rx.recv().await {
            sent.push(m);
        }
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0], Message::Text("welcome".into()));
        assert_eq!(
            sent[1],
            Message::Close(Some(CloseFrame {
                code: 4001,
                reason: "replaced".into()
            }))
        );
        // The core closed it: the task must not report UplinkClosed.
        assert!(cmd_rx.recv().await.is_none());
    }

    /// What a [`Recording`] sink saw.
    #[derive(Debug, PartialEq)]
    enum SinkEvent {
        Fed(Message),
        Flushed,
    }

    /// A sink that records every message and every flush.
    struct Recording(mpsc::UnboundedSender<SinkEvent>);

    impl Sink<Message> for Recording {
        type Error = Infallible;
        fn poll_ready(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Infallible>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn start_send(self: std::pin::Pin<&mut Self>, msg: Message) -> Result<(), Infallible> {
            let _ = self.0.send(SinkEvent::Fed(msg));
            Ok(())
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Infallible>> {
            let _ = self.0.send(SinkEvent::Flushed);
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_close(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Infallible>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// Frames the driver queued while the task was busy go out with one flush (one socket
    /// write), and a close queued behind them still goes out after them.
    #[tokio::test(start_paused = true)]
    async fn queued_frames_share_one_flush() {
        let (cmd_tx, mut cmd_rx) = mpsc::channel(16);
        let (out_tx, mut out_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(drive(
            UplinkId(3),
            Box::pin(stream::pending::<Result<Message, Infallible>>()),
            Recording(out_tx),
            cmd_tx,
            None,
        ));
        let Some(Command::UplinkOpened { tx, .. }) = cmd_rx.recv().await else {
            panic!("expected UplinkOpened");
        };
        for text in ["a", "b", "c"] {
            tx.try_send(Outbound::Text(text.into())).unwrap();
        }
        tx.try_send(Outbound::Close {
            code: 4001,
            reason: "replaced".into(),
        })
        .unwrap();
        task.await.unwrap();
        let mut seen = Vec::new();
        while let Some(e) = out_rx.recv().await {
            seen.push(e);
        }
        assert_eq!(
            seen[..4],
            [
                SinkEvent::Fed(Message::Text("a".into())),
                SinkEvent::Fed(Message::Text("b".into())),
                SinkEvent::Fed(Message::Text("c".into())),
                SinkEvent::Flushed,
            ]
        );
        assert!(
            matches!(&seen[4], SinkEvent::Fed(Message::Close(Some(f))) if f.code == 4001),
            "{seen:?}"
        );
    }

    /// The sled closing reports UplinkClosed.
    #[tokio::test]
    async fn sled_close_is_reported() {
        let (cmd_tx, mut cmd_rx) = mpsc::channel(16);
        let incoming = stream::iter([Ok::<_, Infallible>(Message::Close(None))]);
        let (out_tx, _out_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(drive(
            UplinkId(1),
            Box::pin(incoming),
            recorder(out_tx),
            cmd_tx,
            None,
        ));
        assert!(matches!(
            cmd_rx.recv().await,
            Some(Command::UplinkOpened { .. })
        ));
        assert!(matches!(
            cmd_rx.recv().await,
            Some(Command::UplinkClosed {
                uplink: UplinkId(1)
            })
        ));
        task.await.unwrap();
    }
}
