//! Projects served: each one's MCP server (a child over stdio, supervised, or a session with a
//! server at a URL) and its uplink to the gateway ([`Served`]). `gateway-sled` serves each
//! project of its config; `gateway demo --real` its one real server. They stop in order: the
//! uplinks first, each answering the calls running on it (the drain), then the servers.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use gateway_core::Secret;
use sled_uplink::uplink::{run_uplink_with, Backend, Handler, UplinkOptions};
use sled_uplink::{Connect, GatewayAddr, TokioConnect};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::leases::Leased;
use crate::{HttpServer, ProjectConfig, StdioServer, Upstream};

/// The first uplink reconnect delay (doubling per failed attempt).
pub const UPLINK_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest uplink reconnect delay.
pub const UPLINK_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// How a project's uplink reaches the gateway and proves itself there.
#[derive(Debug, Clone)]
pub struct Uplink {
    /// The gateway's address (`ws://` or `wss://` for its `/uplink`).
    pub gateway: GatewayAddr,
    /// The project's uplink token, presented in the hello when it has one.
    pub token: Option<Secret>,
    /// The project's identity key (see [`crate::identity`]).
    pub identity: SigningKey,
    /// The certificate authorities a `wss://` gateway (and an `https://` server) is verified
    /// against.
    pub tls: gateway_client::TlsTrust,
}

/// How long the uplinks may take at most, beyond their drain, and then the servers, to stop.
const STOP_SLACK: Duration = Duration::from_secs(2);
const SERVERS_STOP: Duration = Duration::from_secs(10);

/// The projects being served, and their order of stopping.
#[derive(Debug)]
pub struct Served {
    drain: Duration,
    stop_uplinks: watch::Sender<bool>,
    stop_servers: watch::Sender<bool>,
    uplinks: JoinSet<()>,
    servers: JoinSet<()>,
}

impl Served {
    /// Nothing served yet; at [`Served::stop`] each uplink has up to `drain` to answer the
    /// calls running on it.
    pub fn new(drain: Duration) -> Served {
        Served {
            drain,
            stop_uplinks: watch::channel(false).0,
            stop_servers: watch::channel(false).0,
            uplinks: JoinSet::new(),
            servers: JoinSet::new(),
        }
    }

    /// Starts `project`'s server and its uplink. `state_dir` keeps the fences of the project's
    /// leases. An error says why the project cannot be served (the server's bearer token
    /// cannot be read, its leases' state cannot be opened); a task already started for it
    /// ends at [`Served::stop`], or when this is dropped.
    pub fn spawn(
        &mut self,
        project: &ProjectConfig,
        state_dir: &Path,
        uplink: Uplink,
    ) -> Result<(), String> {
        self.spawn_with(TokioConnect, project, state_dir, uplink)
    }

    /// [`Served::spawn`], the uplink dialed through `connect` (the gateway's in-process
    /// connections for `gateway serve --connector`) instead of TCP.
    pub fn spawn_with<C: Connect>(
        &mut self,
        connect: C,
        project: &ProjectConfig,
        state_dir: &Path,
        uplink: Uplink,
    ) -> Result<(), String> {
        let servers_stop = self.stop_servers.subscribe();
        let server: Arc<dyn Handler> = match &project.upstream {
            Upstream::Stdio { command, cwd, env } => {
                let server =
                    StdioServer::new(&project.name, command.clone(), cwd.clone(), env.clone());
                self.servers.spawn(server.clone().supervise(servers_stop));
                server
            }
            Upstream::Http { url, bearer } => {
                let bearer = bearer
                    .read()
                    .map_err(|e| format!("the server's bearer token: {e}"))?;
                let server = HttpServer::new(&project.name, url, bearer, uplink.tls.clone());
                self.servers.spawn(server.clone().supervise(servers_stop));
                server
            }
        };
        let backend = if project.leases.is_empty() {
            Backend::Handler(server)
        } else {
            Backend::Handler(Leased::new(server, project.leases.clone(), state_dir)?)
        };
        let opts = UplinkOptions {
            sled_name: project.name.clone(),
            token: uplink.token,
            identity: Some(uplink.identity),
            backoff_min: UPLINK_BACKOFF_MIN,
            backoff_max: UPLINK_BACKOFF_MAX,
            tls: uplink.tls,
            drain: Some(self.drain),
            ..UplinkOptions::default()
        };
        let mut stopping = self.stop_uplinks.subscribe();
        self.uplinks.spawn(run_uplink_with(
            connect,
            uplink.gateway,
            backend,
            opts,
            async move {
                let _ = stopping.wait_for(|s| *s).await;
            },
        ));
        Ok(())
    }

    /// Stops everything, in order: the uplinks (each answers the calls running on it, up to
    /// the drain, refusing new ones), then the servers (a child's stdin is closed, then it is
    /// killed after 2 s). What has not stopped in time is aborted.
    pub async fn stop(mut self) {
        let _ = self.stop_uplinks.send(true);
        let uplinks = tokio::time::timeout(self.drain + STOP_SLACK, async {
            while self.uplinks.join_next().await.is_some() {}
        })
        .await;
        if uplinks.is_err() {
            tracing::warn!("uplinks still open after the drain; closing them");
            self.uplinks.shutdown().await;
        }
        let _ = self.stop_servers.send(true);
        let servers = tokio::time::timeout(SERVERS_STOP, async {
            while self.servers.join_next().await.is_some() {}
        })
        .await;
        if servers.is_err() {
            tracing::warn!(
                "servers still running {SERVERS_STOP:?} after being told to stop; killing them"
            );
            self.servers.shutdown().await;
        }
    }
}
