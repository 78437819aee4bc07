//! `sled-sim`: run emulated sleds against a real gateway until Ctrl-C.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Parser, Subcommand};
use sled_sim::net::GatewayAddr;
use sled_sim::{demo_project_names, Fleet, SledOptions};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

/// Emulated project containers ("sleds"): each connects out to the gateway's uplink and serves
/// MCP tools for its project.
#[derive(Debug, Parser)]
#[command(name = "sled-sim", version, about)]
#[command(group(ArgGroup::new("which").required(true).multiple(true).args(["project", "projects", "fixture_project"])))]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,

    /// The gateway's base URL, e.g. http://127.0.0.1:3000 (the uplink is at /uplink), or
    /// https://gateway.example (the uplink is then wss://…/uplink).
    #[arg(long, value_name = "URL", value_parser = parse_gateway, required = true)]
    gateway: Option<GatewayAddr>,

    /// The CA certificates (PEM) a wss:// gateway's certificate must chain to [else the file
    /// env MCP_GATEWAY_CA_FILE names, else the system's].
    #[arg(long = "ca-file", value_name = "FILE")]
    ca_file: Option<std::path::PathBuf>,

    /// A project to emulate a sled for (repeatable). The sled's name is the project's.
    #[arg(long, value_name = "NAME", value_parser = parse_project)]
    project: Vec<String>,

    /// Emulate N sleds for the demo projects alpha, beta, gamma, … (instead of --project).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..), conflicts_with = "project")]
    projects: Option<u16>,

    /// The fleet seed: each project's model and jitter derive from it.
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// How long each sled takes to answer a tools/call, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    latency_ms: u64,

    /// Up to this many extra milliseconds per tools/call, drawn from the seeded RNG.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    jitter_ms: u64,

    /// Also serve project i's MCP directly at http://127.0.0.1:(P+i)/mcp (and a health check,
    /// GET / → 200 {"project": …, "status": "ok"}, at http://127.0.0.1:(P+i)/).
    #[arg(long, value_name = "P")]
    direct_port_base: Option<u16>,

    /// With --direct-port-base: the direct ports accept connections and requests but never
    /// answer (an endpoint that has hung, for the gateway's health-probe timeouts).
    #[arg(long, requires = "direct_port_base")]
    http_silent: bool,

    /// Present no identity: hellos name no Ed25519 key (a gateway that requires identities
    /// refuses the sleds with close 4007). By default each sled signs the gateway's challenge
    /// with a key derived from --seed and its project name.
    #[arg(long, conflicts_with = "wrong_key")]
    no_identity: bool,

    /// Present an impostor key for every project this process runs (a key derived like the
    /// real one but from another domain): once the real keys are pinned, the gateway refuses
    /// these sleds with close 4007 and they retry with a long backoff.
    #[arg(long)]
    wrong_key: bool,

    /// Stall the CRDT event relay: the sleds keep answering calls and heartbeats but send no
    /// event frames, so the gateway should report their relay as stale.
    #[arg(long)]
    stall_relay: bool,

    /// How often each sled sends a `sync` event on its uplink (the CRDT anti-entropy tick),
    /// in milliseconds; 0 sends none (events after mutating calls still go out).
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    relay_interval_ms: u64,

    /// A project to serve with the conformance fixture (the tools, resources and prompts the
    /// official MCP conformance suite calls) instead of the story model (repeatable).
    #[arg(long, value_name = "NAME", value_parser = parse_project)]
    fixture_project: Vec<String>,

    /// The uplink token to present in each hello, when the gateway's projects.toml gives the
    /// projects a `token` (read from this environment variable, so it stays out of `ps`).
    #[arg(long, value_name = "ENV_VAR", default_value = "SLED_UPLINK_TOKEN")]
    token_env: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Play seeded client sessions against a running gateway (with its sleds connected) and
    /// report every response the per-session oracle objects to. Exits 1 on a violation.
    Script {
        /// The gateway's base URL, e.g. http://127.0.0.1:3000 (sessions use /mcp).
        #[arg(long, value_name = "URL", value_parser = parse_gateway)]
        gateway: GatewayAddr,
        /// How many concurrent sessions.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
        sessions: u16,
        /// Operations per session.
        #[arg(long, default_value_t = 20)]
        ops: usize,
        /// The workload seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The longest think time between two operations, in milliseconds.
        #[arg(long, value_name = "MS", default_value_t = 50)]
        think_ms: u64,
    },
}

fn parse_gateway(value: &str) -> Result<GatewayAddr, String> {
    GatewayAddr::parse(value).map_err(|e| e.reason)
}

fn parse_project(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(value.to_owned())
    } else {
        Err("a project name is 1-64 characters of letters, digits, '-' and '_'".to_owned())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    if let Some(Command::Script {
        gateway,
        sessions,
        ops,
        seed,
        think_ms,
    }) = args.command
    {
        return script(gateway, sessions, ops, seed, think_ms).await;
    }
    let Some(gateway) = args.gateway else {
        error!("--gateway is required");
        return ExitCode::FAILURE;
    };
    let env = |k: &str| std::env::var(k).ok();
    let tls = match gateway_client::TlsTrust::from_flag_or_env(args.ca_file.as_deref(), &env) {
        Ok(t) => t,
        Err(e) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let projects = match args.projects {
        Some(n) => demo_project_names(usize::from(n)),
        None => args.project.clone(),
    };
    let every_project = || -> BTreeSet<String> {
        projects
            .iter()
            .chain(&args.fixture_project)
            .cloned()
            .collect()
    };
    let opts = SledOptions {
        seed: args.seed,
        latency: Duration::from_millis(args.latency_ms),
        jitter: Duration::from_millis(args.jitter_ms),
        fixture_projects: args.fixture_project.clone(),
        uplink_token: std::env::var(&args.token_env)
            .ok()
            .filter(|t| !t.is_empty())
            .map(gateway_core::Secret::new),
        identity: !args.no_identity,
        wrong_key: if args.wrong_key {
            every_project()
        } else {
            BTreeSet::new()
        },
        stalled_relay: if args.stall_relay {
            every_project()
        } else {
            BTreeSet::new()
        },
        relay_interval: Duration::from_millis(args.relay_interval_ms),
        tls,
        ..SledOptions::default()
    };

    // Bind the direct endpoints first, so a port clash fails before anything connects.
    let mut listeners = Vec::new();
    if let Some(base) = args.direct_port_base {
        for (i, project) in projects.iter().enumerate() {
            let port = u16::try_from(i)
                .ok()
                .and_then(|i| base.checked_add(i))
                .filter(|p| *p != 0);
            let Some(port) = port else {
                error!(base, project = %project, "--direct-port-base {base}: port for project {i} is past 65535");
                return ExitCode::FAILURE;
            };
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => listeners.push((project.clone(), addr, l)),
                Err(e) => {
                    error!(%addr, project = %project, error = %e, "--direct-port-base {base}: cannot listen");
                    return ExitCode::FAILURE;
                }
            }
        }
    }

    let projects: Vec<String> = projects.into_iter().chain(args.fixture_project).collect();
    let fleet = Fleet::spawn(&gateway.to_string(), &projects, opts);
    info!(gateway = %gateway, uplink = %gateway.uplink_url(), sleds = projects.len(), seed = args.seed, "sled-sim running; Ctrl-C to stop");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    for (project, addr, listener) in listeners {
        let Some(sled) = fleet.sled(&project) else {
            continue;
        };
        let mut rx = stop_rx.clone();
        let stop = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        if args.http_silent {
            println!("{project}: direct endpoint at http://{addr}/ accepts but never answers");
            servers.push(tokio::spawn(async move {
                if let Err(e) = sled_sim::http::serve_silent(listener, stop).await {
                    error!(project = %project, error = %e, "silent direct endpoint failed");
                }
            }));
            continue;
        }
        println!("{project}: direct MCP at http://{addr}/mcp");
        servers.push(tokio::spawn(async move {
            if let Err(e) = sled_sim::http::serve(listener, sled, stop).await {
                error!(project = %project, error = %e, "direct MCP endpoint failed");
            }
        }));
    }

    if let Err(e) = tokio::signal::ctrl_c().await {
        error!(error = %e, "cannot wait for Ctrl-C; stopping");
    }
    info!("stopping");
    stop_tx.send_replace(true);
    fleet.shutdown().await;
    for server in servers {
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    }
    ExitCode::SUCCESS
}

/// `sled-sim script`: learn the registry from `list_projects`, play the sessions, judge them.
async fn script(
    gateway: GatewayAddr,
    sessions: u16,
    ops: usize,
    seed: u64,
    think_ms: u64,
) -> ExitCode {
    use sled_sim::script::{self, RunOptions, Workload};
    use sled_sim::{McpClient, TokioConnect};

    let url = gateway.mcp_url();
    let registry = async {
        let mut client = McpClient::connect(TokioConnect, &url).await?;
        client.initialize().await?;
        let r = client
            .tools_call(serde_json::json!(1), "list_projects", serde_json::json!({}))
            .await?;
        let sc = &r["result"]["structuredContent"];
        let names: Vec<String> = sc["projects"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| p["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let default = sc["active"].as_str().map(str::to_owned);
        Ok::<_, sled_sim::ClientError>((names, default))
    };
    let (projects, default) = match registry.await {
        Ok((names, _)) if names.is_empty() => {
            error!(%url, "list_projects named no projects");
            return ExitCode::FAILURE;
        }
        Ok(r) => r,
        Err(e) => {
            error!(%url, error = %e, "cannot read the registry with list_projects");
            return ExitCode::FAILURE;
        }
    };
    let workload = Workload {
        seed,
        projects: projects.clone(),
        ops: ops..=ops,
        think_max: Duration::from_millis(think_ms),
        hot_percent: 50,
        fixed_id_percent: 30,
    };
    let epoch = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..usize::from(sessions))
        .map(|i| {
            let opts = RunOptions {
                url: url.clone(),
                epoch,
                client_timeout: Duration::from_secs(60),
                probe_at: None,
                probe_timeout: Duration::from_secs(60),
                init_attempts: 3,
                bearer: None,
                probe_project: None,
            };
            let plan = script::session_plan(&workload, i);
            tokio::spawn(script::run_session(
                TokioConnect,
                plan,
                default.clone(),
                opts,
            ))
        })
        .collect();
    let mut histories = Vec::new();
    for task in tasks {
        match task.await {
            Ok(h) => histories.push(h),
            Err(e) => {
                error!(error = %e, "a session task failed");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut violations = 0;
    let mut requests = 0;
    for h in &histories {
        let report = script::check_session(h, &projects);
        requests += h.exchanges.len();
        for v in &report.violations {
            println!("VIOLATION {v}");
            violations += 1;
        }
        // Without injected faults, a request with no answer is a violation too.
        for n in report.failed {
            println!(
                "VIOLATION session {} exchange {n}: no answer: {:?}",
                h.index, h.exchanges[n].outcome
            );
            violations += 1;
        }
    }
    println!(
        "{} sessions, {requests} requests in {:.1} s, {} interleaved switches, {violations} violations (seed {seed})",
        histories.len(),
        epoch.elapsed().as_secs_f64(),
        script::interleavings(&histories),
    );
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
