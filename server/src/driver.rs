//! The driver: the one task that owns the [`Gateway`] and runs its loop.
//!
//! Connection tasks send [`Command`]s; the driver turns each into an [`Input`], feeds it to the
//! core with the current time, and carries out every [`Output`] the core then has. Between
//! commands it sleeps until the core's next timeout, and calls `handle_timeout` with the time it
//! woke at (not the deadline it slept until).
//!
//! **Architecture Invariant:** the driver never awaits anything but its command channel and its
//! timers. Answers and frames go out with `try_send` on bounded channels, so one slow peer
//! cannot stall the gateway: a stream or uplink whose queue is full is cut off. HTTP probes run
//! in tasks of their own and come back as [`Command::ProbeDone`]; pins go to the pin writer
//! through a `watch`; spans go to the OTLP batch processor's bounded queue with a `try_send`.

use std::collections::HashMap;
use std::time::Duration;

use std::sync::Arc;

use gateway_core::{
    Gateway, HttpReply, HttpRequest, HttpToken, Input, Output, ProbeId, ProbeOutcome, UplinkId,
};
use tokio::sync::mpsc;

use crate::fleet::{PinSink, Prober};
use tokio::time::Instant;

/// What a connection task asks of the driver.
#[derive(Debug)]
pub(crate) enum Command {
    /// An HTTP request to `/mcp`; the answer goes to `reply`.
    Http {
        token: HttpToken,
        /// Boxed: commands wait in a bounded queue, whose slots are as large as the largest.
        request: Box<HttpRequest>,
        reply: mpsc::Sender<HttpMsg>,
    },
    /// The client behind an [`Command::Http`] went away before its answer.
    HttpAborted {
        token: HttpToken,
    },
    /// A sled opened an uplink; frames for it go to `tx`.
    UplinkOpened {
        uplink: UplinkId,
        tx: mpsc::Sender<Outbound>,
    },
    UplinkText {
        uplink: UplinkId,
        text: String,
    },
    UplinkBinary {
        uplink: UplinkId,
        len: usize,
    },
    /// The uplink closed or failed; its task is ending.
    UplinkClosed {
        uplink: UplinkId,
    },
    /// Start the shutdown sequence: grace period, then [`Input::Shutdown`].
    Shutdown,
    /// A snapshot of the core's counts for `/metrics`; the asker renders it, so the driver
    /// only copies numbers.
    Metrics {
        reply: tokio::sync::oneshot::Sender<gateway_core::Metrics>,
    },
    /// A new registry, from a changed projects.toml.
    Reload(Box<gateway_core::Registry>),
    /// An HTTP health probe the driver started for [`Output::Probe`] ended.
    ProbeDone {
        probe: ProbeId,
        outcome: ProbeOutcome,
    },
    /// What the cluster's engine said (`cluster/replica.rs`).
    Cluster(gateway_core::cluster::ClusterEvent),
}

/// How the driver carries out the outputs that are neither answers nor frames: the fleet's
/// probes and pins, and spans.
pub(crate) struct FleetIo {
    pub(crate) prober: Arc<dyn Prober>,
    /// The driver's own command channel, for probe results. Weak, so that it does not keep
    /// the driver alive: the driver ends when every connection task has.
    pub(crate) commands: mpsc::WeakSender<Command>,
    pub(crate) pins: PinSink,
    /// Where spans are exported; `None` when no OTLP endpoint is configured (the core then
    /// makes none).
    pub(crate) spans: Option<Arc<crate::otlp::SpanExport>>,
    /// The replica's tasks, in a cluster.
    pub(crate) cluster: Option<crate::cluster::replica::ClusterIo>,
    /// A single gateway's session store (`store/records.rs`).
    pub(crate) records: Option<crate::store::records::RecordsIo>,
}

/// What the driver sends an HTTP handler: one whole answer, or a stream of events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpMsg {
    Reply(HttpReply),
    /// Answer with an SSE stream; [`HttpMsg::Event`]s and one [`HttpMsg::Close`] follow.
    Open,
    Event {
        id: Option<u64>,
        data: String,
    },
    Close,
}

/// How many SSE events may wait for one HTTP connection. A client that falls this far behind
/// is cut off (its call is cancelled; a GET stream can resume with `Last-Event-ID`).
pub(crate) const STREAM_QUEUE: usize = 256;

/// What the driver asks of an uplink task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outbound {
    /// Send this text frame.
    Text(String),
    /// Send a close frame with this code and reason, then end.
    Close { code: u16, reason: String },
}

/// How many frames may wait for one uplink's socket. A sled that falls this far behind is cut
/// off rather than letting the gateway's memory grow.
pub(crate) const UPLINK_QUEUE: usize = 1024;

/// Where the driver is in the shutdown sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Shutdown started; calls in flight may finish until the deadline.
    Draining {
        until: Instant,
    },
    /// [`Input::Shutdown`] has been fed to the core.
    Stopped,
}

struct Driver {
    gateway: Gateway,
    /// HTTP requests the core has not answered yet.
    http: HashMap<HttpToken, mpsc::Sender<HttpMsg>>,
    /// GET streams: long-lived, so shutdown does not wait for them to end by themselves.
    get_streams: std::collections::HashSet<HttpToken>,
    /// Uplinks the core knows about.
    uplinks: HashMap<UplinkId, mpsc::Sender<Outbound>>,
    grace: Duration,
    phase: Phase,
    fleet: FleetIo,
}

/// Runs the gateway until every sender of `commands` is gone.
pub(crate) async fn run(
    gateway: Gateway,
    mut commands: mpsc::Receiver<Command>,
    grace: Duration,
    fleet: FleetIo,
) {
    let mut d = Driver {
        fleet,
        gateway,
        http: HashMap::new(),
        get_streams: std::collections::HashSet::new(),
        uplinks: HashMap::new(),
        grace,
        phase: Phase::Running,
    };
    loop {
        let timeout = d.gateway.poll_timeout().map(Instant::from_std);
        let drain_until = match d.phase {
            Phase::Draining { until } => Some(until),
            Phase::Running | Phase::Stopped => None,
        };
        tokio::select! {
            cmd = commands.recv() => match cmd {
                Some(cmd) => d.command(cmd),
                None => break,
            },
            () = sleep_until(timeout), if timeout.is_some() => {
                d.gateway.handle_timeout(now());
            }
            () = sleep_until(drain_until), if drain_until.is_some() => {
                tracing::info!(
                    unanswered = d.http.len(),
                    "grace period over; failing the calls still in flight"
                );
                d.stop();
            }
        }
        d.drain_outputs();
        // Drained: no call in flight, and no project handed over still waiting for its next
        // holder (its sled's old uplink stays meanwhile: make-before-break).
        if matches!(d.phase, Phase::Draining { .. })
            && d.http.len() == d.get_streams.len()
            && !d.gateway.handing_over(now())
        {
            tracing::info!("no calls in flight; closing the uplinks");
            d.stop();
            d.drain_outputs();
        }
    }
    let stats = d.gateway.stats();
    tracing::info!(?stats, "gateway driver stopped");
}

impl Driver {
    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Http {
                token,
                request,
                reply,
            } => {
                if request.method == gateway_core::HttpMethod::Get {
                    self.get_streams.insert(token);
                }
                self.http.insert(token, reply);
                self.gateway.handle(
                    now(),
                    Input::Http {
                        token,
                        request: *request,
                    },
                );
            }
            Command::HttpAborted { token } => {
                // An abort that raced with its answer is old news.
                self.get_streams.remove(&token);
                if self.http.remove(&token).is_some() {
                    tracing::debug!(token = token.0, "HTTP client went away before its answer");
                    self.gateway.handle(now(), Input::HttpAborted { token });
                }
            }
            Command::UplinkOpened { uplink, tx } => {
                self.uplinks.insert(uplink, tx);
                self.gateway.handle(now(), Input::UplinkOpened { uplink });
                // After Input::Shutdown the core closes it at once with GoingAway.
            }
            // Frames and closes of an uplink the core has already closed are dropped: the core
            // has forgotten it, and ids are never reused.
            Command::UplinkText { uplink, text } => {
                if self.uplinks.contains_key(&uplink) {
                    self.gateway
                        .handle(now(), Input::UplinkText { uplink, text });
                }
            }
            Command::UplinkBinary { uplink, len } => {
                if self.uplinks.contains_key(&uplink) {
                    self.gateway
                        .handle(now(), Input::UplinkBinary { uplink, len });
                }
            }
            Command::UplinkClosed { uplink } => {
                if self.uplinks.remove(&uplink).is_some() {
                    self.gateway.handle(now(), Input::UplinkClosed { uplink });
                }
            }
            Command::Reload(registry) => {
                let registry = *registry;
                self.gateway.handle(now(), Input::Reload { registry });
            }
            Command::ProbeDone { probe, outcome } => {
                self.gateway
                    .handle(now(), Input::ProbeDone { probe, outcome });
            }
            Command::Cluster(event) => self.gateway.handle(now(), Input::Cluster(event)),
            Command::Metrics { reply } => {
                // The asker may have gone; then nobody wants it.
                let _ = reply.send(self.gateway.metrics());
            }
            Command::Shutdown => {
                if self.phase == Phase::Running {
                    self.phase = Phase::Draining {
                        until: Instant::now() + self.grace,
                    };
                    // In a cluster, the sleds held here move to other replicas first.
                    self.gateway.handle(now(), Input::Handover);
                }
            }
        }
    }

    /// Feeds [`Input::Shutdown`] to the core, once.
    fn stop(&mut self) {
        if self.phase != Phase::Stopped {
            self.phase = Phase::Stopped;
            self.gateway.handle(now(), Input::Shutdown);
        }
    }

    /// Starts an HTTP probe in a task of its own; its outcome comes back as
    /// [`Command::ProbeDone`]. The task applies the timeout itself, so it ends by then.
    fn start_probe(&self, probe: ProbeId, project: String, url: String, timeout: Duration) {
        tracing::debug!(probe = probe.0, %project, %url, "probing");
        let running = self.fleet.prober.probe(&url, timeout);
        let commands = self.fleet.commands.clone();
        tokio::spawn(async move {
            let outcome = running.await;
            tracing::debug!(probe = probe.0, %project, ?outcome, "probe ended");
            // The driver may be gone (shutdown); then nobody wants the outcome.
            if let Some(tx) = commands.upgrade() {
                let _ = tx.send(Command::ProbeDone { probe, outcome }).await;
            }
        });
    }

    /// Sends one message of a stream; a client that is gone or too far behind is cut off
    /// (the core hears of it as [`Input::HttpAborted`]).
    fn stream_send(&mut self, token: HttpToken, msg: HttpMsg) {
        let Some(tx) = self.http.get(&token) else {
            return;
        };
        if let Err(e) = tx.try_send(msg) {
            if matches!(e, mpsc::error::TrySendError::Full(_)) {
                tracing::warn!(
                    token = token.0,
                    queued = STREAM_QUEUE,
                    "SSE client is not reading; cutting it off"
                );
            }
            self.http.remove(&token);
            self.get_streams.remove(&token);
            self.gateway.handle(now(), Input::HttpAborted { token });
        }
    }

    /// Carries out every output the core has.
    fn drain_outputs(&mut self) {
        while let Some(output) = self.gateway.poll_output() {
            match output {
                Output::Http { token, reply } => {
                    self.get_streams.remove(&token);
                    match self.http.remove(&token) {
                        // A fresh channel has room for its one answer; the receiver may be
                        // gone (client left), and then there is nothing to do.
                        Some(tx) => {
                            let _ = tx.try_send(HttpMsg::Reply(reply));
                        }
                        None => {
                            tracing::debug!(token = token.0, "answer for a request nobody awaits")
                        }
                    }
                }
                Output::StreamOpen { token } => self.stream_send(token, HttpMsg::Open),
                Output::StreamEvent { token, id, data } => {
                    self.stream_send(token, HttpMsg::Event { id, data })
                }
                Output::StreamClose { token } => {
                    self.stream_send(token, HttpMsg::Close);
                    self.get_streams.remove(&token);
                    self.http.remove(&token);
                }
                Output::UplinkSend { uplink, text } => {
                    let Some(tx) = self.uplinks.get(&uplink) else {
                        tracing::debug!(uplink = uplink.0, "frame for an uplink that is gone");
                        continue;
                    };
                    match tx.try_send(Outbound::Text(text)) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            tracing::warn!(
                                uplink = uplink.0,
                                queued = UPLINK_QUEUE,
                                "uplink is not reading its frames; cutting it off"
                            );
                            // Dropping the sender ends the uplink task, which closes the socket.
                            self.uplinks.remove(&uplink);
                            self.gateway.handle(now(), Input::UplinkClosed { uplink });
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            // The task ended; its UplinkClosed is on the way, but tell the core
                            // now so it stops routing calls here.
                            self.uplinks.remove(&uplink);
                            self.gateway.handle(now(), Input::UplinkClosed { uplink });
                        }
                    }
                }
                Output::UplinkClose {
                    uplink,
                    code,
                    reason,
                } => {
                    if let Some(tx) = self.uplinks.remove(&uplink) {
                        tracing::info!(uplink = uplink.0, code, %reason, "closing uplink");
                        // If the queue is full or the task gone, dropping `tx` ends it anyway.
                        let _ = tx.try_send(Outbound::Close { code, reason });
                    }
                }
                Output::Probe {
                    probe,
                    project,
                    url,
                    timeout,
                } => self.start_probe(probe, project, url, timeout),
                Output::SavePins { text } => self.fleet.pins.save(text),
                Output::Span(span) => match &self.fleet.spans {
                    Some(spans) => {
                        // One reading of both clocks for the span's two instants, so that its
                        // duration is the core's.
                        let (mono, wall) = (now(), std::time::SystemTime::now());
                        spans.export(*span, |at| wall_clock(at, mono, wall));
                    }
                    None => tracing::debug!("a span with no exporter; dropped"),
                },
                Output::Cluster(action) => match (&self.fleet.cluster, &self.fleet.records) {
                    (Some(cluster), _) => cluster.act(action),
                    (None, Some(records)) => records.act(action),
                    (None, None) => {
                        tracing::error!(?action, "a cluster action outside any cluster")
                    }
                },
            }
        }
    }
}

/// The current time, as the core takes it.
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// The wall-clock time of the driver's instant `at`, given one reading of both clocks
/// (`mono`, `wall`) taken at or after it.
fn wall_clock(
    at: std::time::Instant,
    mono: std::time::Instant,
    wall: std::time::SystemTime,
) -> std::time::SystemTime {
    let ago = mono.saturating_duration_since(at);
    wall.checked_sub(ago).unwrap_or(wall)
}

/// Sleeps until `at`; never resolves for `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_become_wall_clock_times_by_their_distance_from_now() {
        let mono = std::time::Instant::now();
        let wall = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let start = mono.checked_sub(Duration::from_millis(1500)).unwrap();
        let end = mono.checked_sub(Duration::from_millis(250)).unwrap();
        assert_eq!(
            wall_clock(start, mono, wall),
            wall - Duration::from_millis(1500)
        );
        assert_eq!(
            wall_clock(end, mono, wall),
            wall - Duration::from_millis(250)
        );
        assert_eq!(wall_clock(mono, mono, wall), wall);
        // An instant after the reading (not given by the driver) is taken as now.
        assert_eq!(wall_clock(mono + Duration::from_secs(1), mono, wall), wall);
    }
}
