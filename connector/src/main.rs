//! `gateway-sled`: puts existing MCP servers behind the gateway, one uplink per project.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gateway_connector::serve::{Served, Uplink};
use gateway_connector::{identity, ConnectorConfig, ProjectConfig, TokenSource, Upstream};
use sled_uplink::GatewayAddr;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

/// Put existing MCP servers behind the gateway: each runs as a child over stdio, and the
/// connector dials the gateway's /uplink for its project, as a sled does.
///
/// One server: `gateway-sled --gateway URL --project NAME -- COMMAND ARGS...` (a stdio server),
/// or `gateway-sled --gateway URL --project NAME --url http://host:port/mcp` (Streamable HTTP).
/// Several: `gateway-sled --config sleds.toml` (see the README).
#[derive(Debug, Parser)]
#[command(name = "gateway-sled", version)]
struct Args {
    /// A file naming the gateway and each project's server (instead of the flags below).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["gateway", "project", "command", "url"])]
    config: Option<PathBuf>,

    /// The gateway's base URL: http://host:port, or https://host:port (the uplink is then wss://).
    #[arg(long, value_name = "URL")]
    gateway: Option<String>,

    /// The project the server serves, as the gateway's projects.toml names it.
    #[arg(long, value_name = "NAME")]
    project: Option<String>,

    /// The server's Streamable HTTP endpoint (instead of a command).
    #[arg(long, value_name = "URL", conflicts_with_all = ["command", "cwd", "env"])]
    url: Option<String>,

    /// A file holding the bearer token for the server at --url.
    #[arg(
        long,
        value_name = "FILE",
        requires = "url",
        conflicts_with = "bearer_token_env"
    )]
    bearer_token_file: Option<PathBuf>,

    /// The environment variable holding the bearer token for the server at --url.
    #[arg(long, value_name = "VAR", requires = "url")]
    bearer_token_env: Option<String>,

    /// A tool whose calls write a leasable resource: `TOOL=ARGUMENT:KIND` (the resource is
    /// `KIND:<the argument's value>`; repeatable). ARGUMENT may name each string of an array
    /// (`entityNames[]`) or a field of each object of one (`observations[].entityName`). The
    /// connector marks it for the gateway and refuses a call whose fence is stale before the
    /// server sees it.
    #[arg(long = "lease", value_name = "TOOL=ARGUMENT:KIND", value_parser = gateway_connector::leases::parse_flag)]
    leases: Vec<(String, gateway_connector::leases::LeasedArgument)>,

    /// The server's working directory.
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,

    /// A variable added to the server's environment (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,

    /// A file holding the project's uplink token.
    #[arg(long, value_name = "FILE", conflicts_with = "token_env")]
    token_file: Option<PathBuf>,

    /// The environment variable holding the project's uplink token (default: SLED_UPLINK_TOKEN,
    /// when it is set).
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,

    /// Where each project's identity key is kept (made on first run, mode 0600).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,

    /// The certificate authorities a https:// gateway is verified against (default: the
    /// system's; also GATEWAY_CA_FILE).
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,

    /// At SIGTERM or Ctrl-C, how long the calls running may take to be answered before the
    /// uplinks close (new calls are refused meanwhile); the servers stop after.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    drain_secs: u64,

    /// Threads of the runtime that relays calls: 0 (the default) one per CPU; 1 runs every
    /// uplink and server on one thread, which hands a call from the uplink to the server and
    /// back with fewer context switches (BENCHMARKS.md), but pauses every project while a
    /// fence is synced to disk (a lease's first write).
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=64))]
    worker_threads: u16,

    /// The server's command and arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn parse_env(value: &str) -> Result<(String, String), String> {
    value
        .split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| "expected KEY=VALUE".to_owned())
}

fn config(args: Args) -> Result<ConnectorConfig, String> {
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut config = ConnectorConfig::parse(path, &text)?;
        if let Some(dir) = args.state_dir {
            config.state_dir = dir;
        }
        return Ok(config);
    }
    let gateway = args.gateway.ok_or("--gateway (or --config) is required")?;
    let project = args.project.ok_or("--project (or --config) is required")?;
    let upstream = match args.url {
        Some(url) => Upstream::Http {
            url,
            bearer: match (args.bearer_token_file, args.bearer_token_env) {
                (Some(f), _) => TokenSource::File(f),
                (None, Some(v)) => TokenSource::Env(v),
                (None, None) => TokenSource::None,
            },
        },
        None if args.command.is_empty() => {
            return Err("the server's command (after `--`) or --url is required".into())
        }
        None => Upstream::Stdio {
            command: args.command,
            cwd: args.cwd,
            env: args.env.into_iter().collect::<BTreeMap<_, _>>(),
        },
    };
    let token = match (args.token_file, args.token_env) {
        (Some(f), _) => TokenSource::File(f),
        (None, Some(v)) => TokenSource::Env(v),
        (None, None) if std::env::var_os("SLED_UPLINK_TOKEN").is_some() => {
            TokenSource::Env("SLED_UPLINK_TOKEN".into())
        }
        (None, None) => TokenSource::None,
    };
    ConnectorConfig {
        gateway: Some(gateway),
        state_dir: args
            .state_dir
            .unwrap_or_else(|| PathBuf::from(gateway_connector::config::DEFAULT_STATE_DIR)),
        projects: vec![ProjectConfig::from_flags(
            project,
            upstream,
            token,
            args.leases.into_iter().collect(),
        )?],
    }
    .checked()
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let runtime = match args.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(n))
            .enable_all()
            .build(),
    };
    match runtime {
        Ok(rt) => rt.block_on(run(args)),
        Err(e) => {
            error!("cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> ExitCode {
    let drain = Duration::from_secs(args.drain_secs);
    let env = |k: &str| std::env::var(k).ok();
    let tls = match gateway_client::TlsTrust::from_flag_or_env(args.ca_file.as_deref(), &env) {
        Ok(t) => t,
        Err(e) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let config = match config(args) {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    let Some(url) = &config.gateway else {
        error!("the config names no gateway: add gateway = \"http://host:port\" (a file without one is for `gateway serve --connector`, which serves its projects inside the gateway)");
        return ExitCode::from(2);
    };
    let gateway = GatewayAddr::parse(url).expect("a checked config's URL parses");
    // The uplinks stop first (each answers the calls running on it, up to `drain`), then the
    // servers that answer them.
    let mut served = Served::new(drain);
    for project in &config.projects {
        let token = match project.token.read() {
            Ok(t) => t,
            Err(e) => {
                error!(project = %project.name, "{e}");
                return ExitCode::FAILURE;
            }
        };
        let key = match identity::load_or_create(&config.state_dir, &project.name) {
            Ok(k) => k,
            Err(e) => {
                error!(project = %project.name, "{e}");
                return ExitCode::FAILURE;
            }
        };
        let uplink = Uplink {
            gateway: gateway.clone(),
            token,
            identity: key,
            tls: tls.clone(),
        };
        if let Err(e) = served.spawn(project, &config.state_dir, uplink) {
            error!(project = %project.name, "{e}");
            return ExitCode::FAILURE;
        }
        info!(project = %project.name, gateway = %url, "serving");
    }
    shutdown_signal().await;
    info!(drain = ?drain, "stopping: answering the calls running, then closing the uplinks and the servers");
    served.stop().await;
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler can be installed");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
