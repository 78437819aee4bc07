//! `gateway`: the MCP gateway binary. `gateway serve` runs it for a `projects.toml`;
//! `gateway demo` runs it with an emulated fleet of sleds, for trying it out.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use gateway_core::{ProjectSpec, Registry};
use gateway_server::ServerOptions;
use tokio::net::TcpListener;

const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

/// An MCP gateway: one MCP endpoint (`/mcp`) in front of many projects.
///
/// Each project's sled dials out to the gateway over a WebSocket uplink (`/uplink`); MCP clients
/// talk to the gateway only. A `tools/call` goes to the project named in its `"project"`
/// argument, or to the session's default project (see the `switch_project` and
/// `list_projects` tools).
///
/// Logging: set RUST_LOG (default `info`), e.g. `RUST_LOG=gateway_server=debug`.
#[derive(Debug, Parser)]
#[command(
    name = "gateway",
    version,
    propagate_version = true,
    after_help = "Examples:\n  \
        gateway demo                                  # gateway + 3 emulated sleds on 127.0.0.1:7878\n  \
        gateway serve --config projects.toml          # listens on 127.0.0.1:7878\n  \
        gateway serve --config projects.toml --listen 0.0.0.0:7878\n  \
        gateway stdio --url http://127.0.0.1:7878/mcp # for stdio-only MCP clients"
)]
struct Cli {
    /// Log lines as JSON objects (one per line, for log shippers) instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway for the projects registered in a projects.toml
    ///
    /// The file lists one `[[project]]` table per project:
    ///
    ///     default = "alpha"                 # optional: where new sessions start
    ///     [[project]]
    ///     name = "alpha"
    ///     url = "http://127.0.0.1:9101"
    ///
    /// Point MCP clients at http://LISTEN/mcp and each project's sled at ws://LISTEN/uplink.
    /// Ctrl-C (or SIGTERM) shuts down gracefully: calls in flight get 10 s to finish.
    #[command(verbatim_doc_comment)]
    Serve {
        /// The projects.toml to load.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The address to listen on (port 0 picks a free port).
        #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
        listen: SocketAddr,
        #[command(flatten)]
        mcp: McpFlags,
    },
    /// Run the gateway with an emulated fleet of sleds, all in this process.
    ///
    /// Starts the gateway, then one emulated sled per project (alpha, beta, gamma, ...) that
    /// connects to it over loopback, and prints curl commands to try. Ctrl-C stops it all.
    Demo {
        /// The address to listen on (port 0 picks a free port).
        #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// How many projects (and sleds) to run.
        #[arg(long, value_name = "N", default_value_t = 3,
              value_parser = clap::value_parser!(u16).range(1..=64))]
        projects: u16,
        /// Seed of the emulated sleds' behaviour; the same seed gives the same answers.
        #[arg(long, value_name = "S", default_value_t = 1)]
        seed: u64,
        /// How long each emulated sled takes to answer a call, in milliseconds
        /// (default: the emulator's own).
        #[arg(long = "latency-ms", value_name = "L")]
        latency_ms: Option<u64>,
        #[command(flatten)]
        mcp: McpFlags,
    },
    /// Bridge a stdio MCP client to a gateway: newline-delimited JSON-RPC on stdin and stdout.
    ///
    /// For MCP clients that launch their server as a subprocess. Each line on stdin is POSTed
    /// to the gateway's /mcp; answers (and progress, and the session's notifications) come back
    /// on stdout, one message per line. Logs go to stderr (RUST_LOG; default `warn`). At the end
    /// of stdin, calls in flight get 10 s to finish and the session is ended.
    ///
    /// Example client configuration:
    ///
    ///     {"command": "gateway", "args": ["stdio", "--url", "http://127.0.0.1:7878/mcp"]}
    #[command(verbatim_doc_comment)]
    Stdio {
        /// The gateway's MCP endpoint, e.g. http://127.0.0.1:7878/mcp (plain http only).
        #[arg(long, value_name = "URL", value_parser = parse_mcp_url)]
        url: String,
    },
}

/// Checks a `--url` value (clap names the flag and the value when this fails, and exits 2).
fn parse_mcp_url(url: &str) -> Result<String, String> {
    sled_sim::HttpUrl::parse(url)
        .map(|_| url.to_owned())
        .map_err(|e| e.reason)
}

/// Settings of the `/mcp` endpoint.
#[derive(Debug, clap::Args)]
struct McpFlags {
    /// A browser Origin allowed to call /mcp, beside loopback ones (repeatable; `*` allows
    /// any). Requests without an Origin header (not from a browser) are always allowed.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    allow_origin: Vec<String>,
    /// End MCP sessions unused for this many seconds (their id then gets 404 and the client
    /// re-initializes).
    #[arg(long = "session-ttl-secs", value_name = "SECS", default_value_t = 1800,
          value_parser = clap::value_parser!(u64).range(1..))]
    session_ttl_secs: u64,
    /// The most MCP sessions held at once; at the limit, initialize ends the least recently
    /// used idle session, or gets 503 with Retry-After when none is idle.
    #[arg(long = "max-sessions", value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_sessions: u64,
    /// The most calls one session may have in flight; past it a call gets a
    /// `too_many_calls` error with `retry_after_ms`.
    #[arg(long = "max-calls-per-session", value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_calls_per_session: u64,
    /// The most calls one project's sled may have in flight; past it a call gets a
    /// `too_many_calls` error with `retry_after_ms`.
    #[arg(long = "max-calls-per-sled", value_name = "N", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_calls_per_sled: u64,
}

impl McpFlags {
    fn apply(&self, opts: &mut ServerOptions) {
        opts.core.allowed_origins = self.allow_origin.clone();
        opts.core.session_idle_ttl = Duration::from_secs(self.session_ttl_secs);
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        opts.core.max_sessions = size(self.max_sessions);
        opts.core.max_calls_per_session = size(self.max_calls_per_session);
        opts.core.max_calls_per_sled = size(self.max_calls_per_sled);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The stdio bridge's stderr usually lands in an MCP client's log: quieter, no colours.
    let stdio = matches!(cli.command, Command::Stdio { .. });
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if stdio { "warn" } else { "info" })
    });
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.log_json {
        logs.json().init();
    } else {
        logs.with_ansi(!stdio).init();
    }
    match cli.command {
        Command::Stdio { url } => run_stdio(&url),
        Command::Serve {
            config,
            listen,
            mcp,
        } => {
            let (registry, text) = match load_registry(&config) {
                Ok(r) => r,
                Err(message) => {
                    eprintln!("gateway: {message}");
                    return ExitCode::from(2);
                }
            };
            run(serve(registry, (config, text), listen, mcp))
        }
        Command::Demo {
            listen,
            projects,
            seed,
            latency_ms,
            mcp,
        } => run(demo(listen, projects.into(), seed, latency_ms, mcp)),
    }
}

/// `gateway stdio`: bridges stdin and stdout to the gateway at `url`. A bad URL exits 2, a
/// broken stdin or stdout 1.
fn run_stdio(url: &str) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let result = rt.block_on(gateway_server::stdio::bridge(
        url,
        stdin,
        tokio::io::stdout(),
    ));
    // A read of stdin may still be blocked in its thread (when stdout failed first): do not
    // wait for it.
    rt.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ gateway_server::stdio::BridgeError::Url { .. }) => {
            eprintln!("gateway: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `main_task` on a tokio runtime; an error is printed and exits 1.
fn run(main_task: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(main_task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gateway: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The registry in `path`, and the text it was parsed from.
fn load_registry(path: &std::path::Path) -> Result<(Registry, String), String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("config file {} does not exist", path.display()));
        }
        Err(e) => return Err(format!("cannot read config file {}: {e}", path.display())),
    };
    // The error names file:line:column and the field.
    let registry =
        Registry::parse(&path.display().to_string(), &text).map_err(|e| e.to_string())?;
    Ok((registry, text))
}

async fn bind(listen: SocketAddr) -> Result<(TcpListener, SocketAddr), String> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    Ok((listener, addr))
}

async fn serve(
    registry: Registry,
    reload_from: (std::path::PathBuf, String),
    listen: SocketAddr,
    mcp: McpFlags,
) -> Result<(), String> {
    let (listener, addr) = bind(listen).await?;
    log_registry(&registry);
    if registry.is_empty() {
        tracing::warn!("no projects are registered: every proxied call will fail");
    }
    tracing::info!(%addr, "gateway listening: MCP at http://{addr}/mcp, uplinks at ws://{addr}{}",
        gateway_core::uplink::UPLINK_PATH);
    let mut opts = ServerOptions::new(registry, rand::random());
    mcp.apply(&mut opts);
    // projects.toml is re-read on SIGHUP and whenever it changes.
    opts.reload_from = Some(reload_from);
    gateway_server::serve(listener, opts, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

fn log_registry(registry: &Registry) {
    for p in registry.projects() {
        tracing::info!(
            project = %p.name,
            url = %p.url,
            kind = p.kind.as_str(),
            sled = %p.sled,
            "registered project"
        );
    }
    tracing::info!(
        projects = registry.len(),
        default = registry.default_project().unwrap_or("(none)"),
        "registry loaded"
    );
}

async fn demo(
    listen: SocketAddr,
    n: usize,
    seed: u64,
    latency_ms: Option<u64>,
    mcp: McpFlags,
) -> Result<(), String> {
    let names = sled_sim::demo_project_names(n);
    let projects = names
        .iter()
        .enumerate()
        .map(|(i, name)| ProjectSpec::new(name.clone(), format!("http://127.0.0.1:{}", 9101 + i)))
        .collect();
    let registry = Registry::from_projects(projects, names.first().map(String::as_str))
        .map_err(|e| format!("demo registry: {e}"))?;

    let (listener, addr) = bind(listen).await?;
    log_registry(&registry);
    tracing::info!(%addr, "gateway listening");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut opts = ServerOptions::new(registry, rand::random());
    mcp.apply(&mut opts);
    let server = tokio::spawn(gateway_server::serve(listener, opts, async {
        let _ = stop_rx.await;
    }));

    let mut sled_opts = sled_sim::SledOptions {
        seed,
        ..Default::default()
    };
    if let Some(ms) = latency_ms {
        sled_opts.latency = Duration::from_millis(ms);
    }
    sled_opts.jitter = Duration::ZERO;
    let fleet = sled_sim::Fleet::spawn(&format!("http://{addr}"), &names, sled_opts);

    print!("{}", demo_instructions(addr, &names));

    shutdown_signal().await;
    let _ = stop_tx.send(());
    let served = match server.await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("the gateway task failed: {e}")),
    };
    fleet.shutdown().await;
    served
}

/// What the demo prints: the MCP URL and a curl session to paste.
fn demo_instructions(addr: SocketAddr, names: &[String]) -> String {
    let second = names
        .get(1)
        .or(names.first())
        .map_or("alpha", String::as_str);
    let json =
        "-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream'";
    let version = "-H 'MCP-Protocol-Version: 2025-11-25'";
    format!(
        r#"
MCP gateway demo: {n} projects ({list}), each with an emulated sled.

  MCP endpoint: http://{addr}/mcp

1. Start a session (note the Mcp-Session-Id header in the answer):

  curl -si http://{addr}/mcp {json} -d '{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"curl","version":"0"}}}}}}'

2. Finish the handshake and call a project's tool, naming the project in the arguments:

  curl -si http://{addr}/mcp {json} {version} -H 'Mcp-Session-Id: <id from above>' -d '{{"jsonrpc":"2.0","method":"notifications/initialized"}}'
  curl -s http://{addr}/mcp {json} {version} -H 'Mcp-Session-Id: <id from above>' -d '{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"create_story","arguments":{{"name":"Try the gateway","acceptance_criteria":["it answers"],"project":"{second}"}}}}}}'

3. List the projects without a session:

  curl -s http://{addr}/mcp {json} -d '{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"list_projects","arguments":{{}}}}}}'

Ctrl-C stops the gateway and the sleds.
"#,
        n = names.len(),
        list = names.join(", "),
    )
}

/// Resolves on Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        () = term => tracing::info!("SIGTERM: shutting down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn stdio_url_is_checked_by_the_parser() {
        let cli = Cli::try_parse_from(["gateway", "stdio", "--url", "http://127.0.0.1:1/mcp"]);
        assert!(matches!(cli.unwrap().command, Command::Stdio { .. }));
        let e = Cli::try_parse_from(["gateway", "stdio", "--url", "127.0.0.1:1"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        assert_eq!(e.exit_code(), 2);
        let text = e.to_string();
        assert!(
            text.contains("--url") && text.contains("127.0.0.1:1"),
            "{text}"
        );
    }

    #[test]
    fn demo_instructions_name_the_second_project() {
        let names = vec!["alpha".to_owned(), "beta".to_owned()];
        let text = demo_instructions("127.0.0.1:7878".parse().unwrap(), &names);
        assert!(text.contains("http://127.0.0.1:7878/mcp"));
        assert!(text.contains(r#""project":"beta""#));
        assert!(text.contains(r#""name":"list_projects""#));
    }
}
