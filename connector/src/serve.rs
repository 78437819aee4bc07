//! One project served: its MCP server (a child over stdio, supervised, or a session with a
//! server at a URL) and its uplink to the gateway. `gateway-sled` runs this for each project
//! of its config; `gateway demo --real` for its one real server.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use gateway_core::Secret;
use sled_sim::uplink::{run_uplink_with, Backend, Handler, UplinkOptions};
use sled_sim::{GatewayAddr, TokioConnect};
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

/// Starts `project`'s server and its uplink as tasks in `running`, which end once `stop`
/// turns true (the child's stdin is closed, then it is killed after 2 s). `state_dir` keeps
/// the fences of the project's leases. An error says why the project cannot be served (the
/// server's bearer token cannot be read, its leases' state cannot be opened); a task already
/// started for it then ends with `stop`, or when `running` is dropped.
pub fn spawn_project(
    project: &ProjectConfig,
    state_dir: &Path,
    uplink: Uplink,
    stop: &watch::Receiver<bool>,
    running: &mut JoinSet<()>,
) -> Result<(), String> {
    let server: Arc<dyn Handler> = match &project.upstream {
        Upstream::Stdio { command, cwd, env } => {
            let server = StdioServer::new(&project.name, command.clone(), cwd.clone(), env.clone());
            running.spawn(server.clone().supervise(stop.clone()));
            server
        }
        Upstream::Http { url, bearer } => {
            let bearer = bearer
                .read()
                .map_err(|e| format!("the server's bearer token: {e}"))?;
            let server = HttpServer::new(&project.name, url, bearer, uplink.tls.clone());
            running.spawn(server.clone().supervise(stop.clone()));
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
        ..UplinkOptions::default()
    };
    let mut stopping = stop.clone();
    running.spawn(run_uplink_with(
        TokioConnect,
        uplink.gateway,
        backend,
        opts,
        async move {
            let _ = stopping.wait_for(|s| *s).await;
        },
    ));
    Ok(())
}
