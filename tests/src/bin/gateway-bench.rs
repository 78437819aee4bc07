//! `gateway-bench`: the gateway's performance benchmark (issue 7). It prints figures; it is not
//! a test.
//!
//! The comparison run starts the release `gateway` and `sled-sim` binaries as child processes
//! (and Debian's nginx), then drives the same seeded tools/call workload (`show` and
//! `create_story` on a project chosen per call) through three paths, K sessions at a time:
//!
//! - `gateway`: POST /mcp on the gateway with a `project` argument (HTTP → uplink → sled);
//! - `direct`: POST /mcp on the chosen sled's own port (`sled-sim --direct-port-base`);
//! - `nginx`: POST /p/<project>/mcp on nginx, reverse-proxying to those same ports.
//!
//! The scale runs start their own gateway: `--run scale` connects 1,000 sleds and opens
//! 10,000 idle sessions and reads the gateway's RSS; `--run tools-list` connects emulated
//! sleds with 1,000 tools each (see `bench/widesled.rs`) and times tools/list.
//!
//! `--run coord` (bench/coord.rs) measures coordination: lease round trips and fenced writes
//! against plain calls, and 10,000 sessions parked in `wait` woken by one message.
//!
//! `--run connector` (bench/connector.rs; not in the default runs, it needs Node and npm's
//! server-everything: `--node`, `--everything-dir`, else the tests' install in
//! target/clients/) measures `gateway-sled`: server-everything's `echo` called directly over
//! stdio and Streamable HTTP, and through the gateway and the connector over each, beside
//! sled-sim's `whoami` directly and through the gateway, interleaved in rounds.
//!
//! Every child is stopped on exit, error or Ctrl-C; every load loop is bounded in time and
//! count. See BENCHMARKS.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use hyper::header::HeaderValue;

#[path = "../bench/client.rs"]
mod client;
#[path = "../bench/connector.rs"]
mod connector;
#[path = "../bench/coord.rs"]
mod coord;
#[path = "../bench/durable.rs"]
mod durable;
#[path = "../bench/procs.rs"]
mod procs;
#[path = "../bench/replicas.rs"]
mod replicas;
#[path = "../bench/restart.rs"]
mod restart;
#[path = "../bench/rolling.rs"]
mod rolling;
#[path = "../bench/widesled.rs"]
mod widesled;

use client::Conn;
use procs::{cpu_secs, cpu_secs_tree, self_cpu_secs, vm_kib, Proc, TempDir};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Run {
    /// gateway vs direct vs nginx on tools/call, at each --sessions level.
    Compare,
    /// --scale-sleds sleds and --idle-sessions idle sessions: gateway RSS.
    Scale,
    /// tools/list when projects expose --wide-tools tools.
    ToolsList,
    /// aggregate_pipeline_status across --fanout-sleds sleds against each sled's own answer
    /// time.
    Fanout,
    /// Coordination: lease round trips and fenced writes against plain calls, and
    /// --coord-waiters parked waits woken by one message.
    Coord,
    /// Replicas on NATS: a call through the owner, through another replica and through the
    /// single-process gateway; two replicas' throughput against one; --replica-sleds sleds
    /// over three replicas behind nginx, and a replica killed.
    Replicas,
    /// A relayed call sealed under the cluster secret against one through replicas of
    /// --baseline-gateway-bin (built before the cluster secret), side by side.
    SealedRelay,
    /// A rolling SIGTERM restart of three replicas behind the shipped examples/nginx.conf
    /// under --replica-clients callers: failures and latency during each move against the
    /// steady run.
    Rolling,
    /// Durable coordination (a single gateway's state directory) against
    /// --baseline-gateway-bin's in-memory one: claim + release and board_set latency, and
    /// board writes a second with 64 writers.
    DurableCoord,
    /// A single gateway restarted (SIGTERM, then kill -9) with --restart-sessions sessions, a
    /// lease each, and --restart-board-keys board keys in its state directory: time to its
    /// first answers.
    Restart,
    /// A real MCP server (npm's server-everything) through `gateway-sled` over stdio and
    /// Streamable HTTP, against the server called directly and against gateway + sled-sim.
    Connector,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Direct,
    Nginx,
    Gateway,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Nginx => "nginx",
            Mode::Gateway => "gateway",
        }
    }
}

/// The gateway's performance benchmark: prints throughput, latency percentiles, CPU and RSS.
#[derive(Debug, Parser)]
#[command(name = "gateway-bench")]
struct Args {
    /// Which runs (repeatable, or comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["compare", "scale", "tools-list", "fanout", "coord"])]
    run: Vec<Run>,
    /// Concurrent client sessions, one level per value.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
    sessions: Vec<usize>,
    /// Emulated sleds (projects) in the comparison run.
    #[arg(long, default_value_t = 8)]
    sleds: u16,
    /// Paths compared, in the order run.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["direct", "nginx", "gateway"])]
    modes: Vec<Mode>,
    /// Measured time of each (path, concurrency) phase.
    #[arg(long, default_value_t = 5.0)]
    duration_secs: f64,
    /// At most this many measured calls per session per phase.
    #[arg(long, default_value_t = 1_000_000)]
    calls: u64,
    /// Unmeasured calls per session before each phase.
    #[arg(long, default_value_t = 200)]
    warmup: u64,
    /// Workload seed: the same seed gives every path the same calls.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Sleds connected in the scale run.
    #[arg(long, default_value_t = 1000)]
    scale_sleds: u16,
    /// Idle sessions opened in the scale run.
    #[arg(long, default_value_t = 10_000)]
    idle_sessions: usize,
    /// Keep one open HTTP connection per idle session (else they are opened over a few).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    idle_connections: bool,
    /// The scale run's gateway closes HTTP connections idle this long (its
    /// --http-idle-timeout-secs); the run then waits for the open idle connections to go.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    scale_idle_timeout_secs: u64,
    /// Tools per project in the tools/list run.
    #[arg(long, default_value_t = 1000)]
    wide_tools: usize,
    /// Projects with --wide-tools tools in the tools/list run.
    #[arg(long, default_value_t = 4)]
    wide_projects: usize,
    /// Sleds (projects) in the fanout run.
    #[arg(long, default_value_t = 1000)]
    fanout_sleds: u16,
    /// Each sled's answer time in the fanout run (plus up to --fanout-jitter-ms).
    #[arg(long, default_value_t = 20)]
    fanout_latency_ms: u64,
    #[arg(long, default_value_t = 20)]
    fanout_jitter_ms: u64,
    /// aggregate_pipeline_status calls measured in the fanout run.
    #[arg(long, default_value_t = 20)]
    fanout_calls: usize,
    /// Measured round trips of each kind in the coord run.
    #[arg(long, default_value_t = 2000)]
    coord_calls: usize,
    /// Sessions (each holding a lease) in the state directory of the restart run.
    #[arg(long, default_value_t = 10_000)]
    restart_sessions: usize,
    /// Board keys in the state directory of the restart run (at most 100,000: 10 projects of
    /// 10,000).
    #[arg(long, default_value_t = 100_000)]
    restart_board_keys: usize,
    /// Sessions parked in `wait` at once in the coord run.
    #[arg(long, default_value_t = 10_000)]
    coord_waiters: usize,
    /// nginx worker_processes.
    #[arg(long, default_value = "auto")]
    nginx_workers: String,
    /// The gateway binary (default: next to this one).
    #[arg(long)]
    gateway_bin: Option<PathBuf>,
    /// `--run sealed-relay`: the gateway to compare with, built from a commit before the
    /// cluster secret (ac52bae), which takes no --cluster-secret-file. `--run durable-coord`:
    /// one built before coordination was kept (bc9971d).
    #[arg(long)]
    baseline_gateway_bin: Option<PathBuf>,
    /// `--run sealed-relay`: the baseline is this code built with
    /// `--features insecure-unauthenticated-cluster-bench`, run with
    /// `--insecure-unauthenticated-cluster-for-bench` (authentication off, everything else the
    /// same); give the same binary as --gateway-bin, so that both pairs run one build.
    #[arg(long)]
    baseline_unauthenticated: bool,
    /// The nats-server for `--run replicas` (default: PATH, then the tests' install in
    /// target/clients/nats-server/).
    #[arg(long)]
    nats_bin: Option<PathBuf>,
    /// `--run replicas`: concurrent clients of the throughput comparison.
    #[arg(long, default_value_t = 16)]
    replica_clients: usize,
    /// `--run replicas`: sleds spread over three replicas.
    #[arg(long, default_value_t = 1000)]
    replica_sleds: u16,
    /// The gateway's `--worker-threads` (1: a current-thread runtime; unset: the gateway's default).
    #[arg(long)]
    gateway_threads: Option<usize>,
    /// The sled-sim binary (default: next to this one).
    #[arg(long)]
    sled_bin: Option<PathBuf>,
    /// `--run connector`: the gateway-sled binary (default: next to this one).
    #[arg(long)]
    connector_bin: Option<PathBuf>,
    /// `--run connector`: measured calls per arm, spread over --connector-rounds rounds.
    #[arg(long, default_value_t = 5000)]
    connector_calls: usize,
    /// `--run connector`: unmeasured calls per arm before the first round.
    #[arg(long, default_value_t = 300)]
    connector_warmup: usize,
    /// `--run connector`: rounds; in each, every arm makes its block of calls in turn.
    #[arg(long, default_value_t = 5)]
    connector_rounds: usize,
    /// `--run connector`: unmeasured calls before each measured block, so that each block
    /// starts with its processes warm (the arm before it had the CPUs' caches).
    #[arg(long, default_value_t = 100)]
    connector_block_warmup: usize,
    /// `--run connector`: only the stdio arms and those they are measured against (direct
    /// stdio, sled-sim direct, gateway + sled-sim); the HTTP arms are set up and make only
    /// their readiness call.
    #[arg(long)]
    connector_stdio_only: bool,
    /// `--run connector`: the directory whose node_modules/ holds
    /// @modelcontextprotocol/server-everything (default: the tests' install,
    /// target/clients/servers/).
    #[arg(long, value_name = "DIR")]
    everything_dir: Option<PathBuf>,
    /// `--run connector`: the Node binary (default: the tests' Node 22 in target/clients/node/,
    /// then `node` on PATH).
    #[arg(long, value_name = "PATH")]
    node: Option<PathBuf>,
    /// Extra arguments for every sled-sim the bench starts, split at spaces
    /// (e.g. `--sled-args=--stall-relay`).
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    sled_args: String,
    #[arg(long, default_value = "nginx")]
    nginx_bin: PathBuf,
    /// Run the gateway under this command, e.g. "valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out".
    #[arg(long)]
    gateway_wrap: Option<String>,
    /// Record `perf record -e cpu-clock -g` of the gateway into this file during the gateway
    /// phase at the highest concurrency.
    #[arg(long)]
    perf_record: Option<PathBuf>,
    /// RUST_LOG of the gateway and sled-sim children.
    #[arg(long, default_value = "warn")]
    child_log: String,
    /// Keep the temporary directory (configs, child logs).
    #[arg(long)]
    keep_temp: bool,
}

type Res<T> = Result<T, String>;

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let outcome = rt.block_on(async {
        tokio::select! {
            r = run(&args) => r,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
        }
    });
    // Child guards have been dropped inside `run` (or by the select) by now.
    rt.shutdown_timeout(Duration::from_secs(1));
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

struct Targets {
    lines: Vec<(String, Option<bool>, String)>,
}

async fn run(args: &Args) -> Res<()> {
    let tmp = TempDir::new(args.keep_temp)?;
    print_machine();
    let mut targets = Targets { lines: Vec::new() };
    if args.run.contains(&Run::Compare) {
        compare(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::ToolsList) {
        tools_list(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::Scale) {
        scale(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::Fanout) {
        fanout(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::Coord) {
        coord::coord(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::Replicas) {
        replicas::replicas(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::SealedRelay) {
        replicas::sealed_relay(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::Rolling) {
        rolling::rolling(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::DurableCoord) {
        durable::durable_coord(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::Restart) {
        restart::restart(args, &tmp, &mut targets).await?;
    }
    if args.run.contains(&Run::Connector) {
        connector::connector(args, &tmp, &mut targets).await?;
    }
    println!("\n## Targets\n");
    for (what, met, detail) in &targets.lines {
        let verdict = match met {
            Some(true) => "MET",
            Some(false) => "NOT MET",
            None => "n/a",
        };
        println!("- [{verdict}] {what}: {detail}");
    }
    Ok(())
}

fn print_machine() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "# gateway-bench\n\nmachine: {} CPUs ({}), kernel {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu,
        kernel.trim()
    );
}

fn bin_path(given: &Option<PathBuf>, name: &str) -> Res<PathBuf> {
    if let Some(p) = given {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let p = exe.parent().ok_or("no exe dir")?.join(name);
    if p.exists() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found: cargo build --release -p gateway-server -p gateway-connector -p sled-sim",
            p.display()
        ))
    }
}

/// Writes a projects.toml and starts a gateway on a free port; returns it once it listens.
fn start_gateway(
    args: &Args,
    tmp: &TempDir,
    tag: &str,
    projects: &[(String, String)],
    extra: &[String],
) -> Res<(Proc, SocketAddr)> {
    start_gateway_bin(args, tmp, tag, projects, extra, None)
}

/// [`start_gateway`] with another gateway binary than `--gateway-bin`'s.
fn start_gateway_bin(
    args: &Args,
    tmp: &TempDir,
    tag: &str,
    projects: &[(String, String)],
    extra: &[String],
    bin: Option<&std::path::Path>,
) -> Res<(Proc, SocketAddr)> {
    // The emulated sleds present no uplink token: on loopback, for a benchmark only.
    let mut toml = format!(
        "default = \"{}\"\nallow_unauthenticated_uplinks = true\n",
        projects[0].0
    );
    for (name, url) in projects {
        toml.push_str(&format!(
            "\n[[project]]\nname = \"{name}\"\nurl = \"{url}\"\n"
        ));
    }
    let config = tmp.path.join(format!("projects-{tag}.toml"));
    std::fs::write(&config, toml).map_err(|e| e.to_string())?;
    let port = procs::free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut argv: Vec<String> = args
        .gateway_wrap
        .as_deref()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let wrapped = !argv.is_empty();
    argv.extend([
        match bin {
            Some(b) => b.to_owned(),
            None => bin_path(&args.gateway_bin, "gateway")?,
        }
        .display()
        .to_string(),
        "serve".into(),
        "--config".into(),
        config.display().to_string(),
        "--listen".into(),
        addr.to_string(),
    ]);
    if let Some(n) = args.gateway_threads {
        argv.extend(["--worker-threads".into(), n.to_string()]);
    }
    argv.extend(extra.iter().cloned());
    let grace = if wrapped { 60 } else { 15 };
    let mut gw = Proc::spawn(
        "gateway",
        &argv,
        &tmp.path.join(format!("gateway-{tag}.log")),
        &[("RUST_LOG", &args.child_log)],
        Duration::from_secs(grace),
    )?;
    procs::wait_listening(addr, Duration::from_secs(if wrapped { 60 } else { 10 }))?;
    gw.check_alive()?;
    println!("gateway ({tag}): pid {}, http://{addr}/mcp", gw.pid());
    Ok((gw, addr))
}

fn start_sleds(
    args: &Args,
    tmp: &TempDir,
    tag: &str,
    gateway: SocketAddr,
    n: u16,
    direct_base: Option<u16>,
) -> Res<Proc> {
    start_sleds_with(args, tmp, tag, gateway, n, direct_base, &[])
}

fn start_sleds_with(
    args: &Args,
    tmp: &TempDir,
    tag: &str,
    gateway: SocketAddr,
    n: u16,
    direct_base: Option<u16>,
    extra: &[String],
) -> Res<Proc> {
    let mut argv = vec![
        bin_path(&args.sled_bin, "sled-sim")?.display().to_string(),
        "--gateway".into(),
        format!("http://{gateway}"),
        "--projects".into(),
        n.to_string(),
    ];
    argv.extend(extra.iter().cloned());
    argv.extend(args.sled_args.split_whitespace().map(str::to_owned));
    if let Some(p) = direct_base {
        argv.extend(["--direct-port-base".into(), p.to_string()]);
    }
    Proc::spawn(
        "sled-sim",
        &argv,
        &tmp.path.join(format!("sled-sim-{tag}.log")),
        &[("RUST_LOG", &args.child_log)],
        Duration::from_secs(10),
    )
}

/// How many registered projects have a live sled, by `list_projects` without a session.
async fn live_count(gateway: SocketAddr) -> Res<usize> {
    let mut c = Conn::connect(gateway).await.map_err(|e| e.to_string())?;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_projects","arguments":{}}}"#;
    let a = c
        .post("/mcp", Bytes::from_static(body.as_bytes()))
        .await
        .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|e| e.to_string())?;
    Ok(v["result"]["structuredContent"]["projects"]
        .as_array()
        .map_or(0, |ps| ps.iter().filter(|p| p["live"] == true).count()))
}

async fn wait_live(
    gateway: SocketAddr,
    n: usize,
    limit: Duration,
    procs: &mut [&mut Proc],
) -> Res<()> {
    let until = Instant::now() + limit;
    loop {
        for p in procs.iter_mut() {
            p.check_alive()?;
        }
        let live = live_count(gateway).await.unwrap_or(0);
        if live >= n {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!("only {live} of {n} sleds live after {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn start_nginx(
    args: &Args,
    tmp: &TempDir,
    names: &[String],
    direct_base: u16,
) -> Res<(Proc, SocketAddr)> {
    let port = procs::free_port()?;
    let dir = tmp.path.join("nginx");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let d = dir.display();
    let mut conf = format!(
        "worker_processes {w};\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\ndaemon off;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         \x20 keepalive_requests 1000000;\n  keepalive_timeout 75s;\n",
        w = args.nginx_workers
    );
    for (i, _) in names.iter().enumerate() {
        conf.push_str(&format!(
            "  upstream sled{i} {{ server 127.0.0.1:{}; keepalive 64; keepalive_requests 1000000; }}\n",
            direct_base + i as u16
        ));
    }
    conf.push_str(&format!(
        "  server {{\n    listen 127.0.0.1:{port};\n    proxy_http_version 1.1;\n    proxy_set_header Connection \"\";\n"
    ));
    for (i, name) in names.iter().enumerate() {
        conf.push_str(&format!(
            "    location = /p/{name}/mcp {{ proxy_pass http://sled{i}/mcp; }}\n"
        ));
    }
    conf.push_str("  }\n}\n");
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).map_err(|e| e.to_string())?;
    let argv = vec![
        args.nginx_bin.display().to_string(),
        "-p".into(),
        dir.display().to_string(),
        "-c".into(),
        path.display().to_string(),
    ];
    let mut p = Proc::spawn(
        "nginx",
        &argv,
        &dir.join("stderr.log"),
        &[],
        Duration::from_secs(5),
    )?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    procs::wait_listening(addr, Duration::from_secs(10))?;
    p.check_alive()?;
    println!(
        "nginx: pid {}, http://{addr}/p/<project>/mcp ({} workers)",
        p.pid(),
        args.nginx_workers
    );
    Ok((p, addr))
}

/// SplitMix64: the seeded choice of project and tool per call.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct World {
    names: Vec<String>,
    /// A story of each project, for `show`.
    stories: Vec<String>,
    gateway: SocketAddr,
    nginx: Option<SocketAddr>,
    direct_base: u16,
}

/// One client session of one path: its connections and its seeded call sequence.
struct Session {
    mode: Mode,
    /// One connection (gateway, nginx), or one per sled (direct), opened on first use.
    conns: Vec<Option<Conn>>,
    rng: u64,
    id: u64,
}

impl Session {
    async fn new(mode: Mode, w: &World, index: usize, seed: u64) -> Res<Session> {
        let n = if mode == Mode::Direct {
            w.names.len()
        } else {
            1
        };
        let mut s = Session {
            mode,
            conns: (0..n).map(|_| None).collect(),
            rng: seed ^ (index as u64).wrapping_mul(0x1000_0000_01b3),
            id: 0,
        };
        if mode == Mode::Gateway {
            let mut c = Conn::connect(w.gateway).await.map_err(|e| e.to_string())?;
            c.initialize("/mcp")
                .await
                .map_err(|e| format!("gateway session: {e}"))?;
            s.conns[0] = Some(c);
        }
        Ok(s)
    }

    /// Makes the next call of the sequence; returns whether it succeeded.
    async fn call(&mut self, w: &World) -> Result<bool, String> {
        let r = splitmix(&mut self.rng);
        let p = (r % w.names.len() as u64) as usize;
        let write = (r >> 32) & 1 == 1;
        self.id += 1;
        let name = &w.names[p];
        let project = if self.mode == Mode::Gateway {
            format!(r#","project":"{name}""#)
        } else {
            String::new()
        };
        let (tool, args) = if write {
            (
                "create_story",
                r#""name":"bench story","acceptance_criteria":["it is fast"]"#.to_owned(),
            )
        } else {
            ("show", format!(r#""story_id":"{}""#, w.stories[p]))
        };
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"{tool}","arguments":{{{args}{project}}}}}}}"#,
            self.id
        );
        let (slot, addr, path) = match self.mode {
            Mode::Gateway => (0, w.gateway, "/mcp".to_owned()),
            Mode::Nginx => (0, w.nginx.ok_or("no nginx")?, format!("/p/{name}/mcp")),
            Mode::Direct => (
                p,
                SocketAddr::from(([127, 0, 0, 1], w.direct_base + p as u16)),
                "/mcp".to_owned(),
            ),
        };
        if self.conns[slot].is_none() {
            self.conns[slot] = Some(Conn::connect(addr).await.map_err(|e| e.to_string())?);
        }
        let conn = self.conns[slot].as_mut().ok_or("no connection")?;
        match conn.post(&path, Bytes::from(body)).await {
            Ok(a) => Ok(a.is_ok()),
            Err(_) => Ok(false),
        }
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("valid histogram bounds")
}

struct Phase {
    mode: Mode,
    k: usize,
    calls: u64,
    errors: u64,
    secs: f64,
    hist: Histogram<u64>,
    proxy_cpu: Option<f64>,
    sled_cpu: f64,
    client_cpu: f64,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.calls as f64 / self.secs
    }
    fn us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_phase(
    args: &Args,
    w: &Arc<World>,
    mode: Mode,
    k: usize,
    proxy_pid: Option<(u32, bool)>,
    sled_pid: u32,
    perf: Option<(PathBuf, u32)>,
    tmp: &TempDir,
) -> Res<Phase> {
    let mut sessions = Vec::with_capacity(k);
    for i in 0..k {
        sessions.push(Session::new(mode, w, i, args.seed).await?);
    }
    // Warmup.
    let mut tasks = Vec::new();
    for mut s in sessions {
        let w = w.clone();
        let n = args.warmup;
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                s.call(&w).await?;
            }
            Ok::<_, String>(s)
        }));
    }
    let mut sessions = Vec::new();
    for t in tasks {
        sessions.push(t.await.map_err(|e| e.to_string())??);
    }
    let proxy_cpu = |(pid, tree): (u32, bool)| {
        if tree {
            cpu_secs_tree(pid)
        } else {
            cpu_secs(pid)
        }
    };
    let _perf = match perf {
        Some((file, pid)) => Some(Proc::spawn(
            "perf",
            &[
                "perf".into(),
                "record".into(),
                "-e".into(),
                "cpu-clock".into(),
                "-F".into(),
                "2000".into(),
                "-g".into(),
                "-p".into(),
                pid.to_string(),
                "-o".into(),
                file.display().to_string(),
            ],
            &tmp.path.join("perf.log"),
            &[],
            Duration::from_secs(30),
        )?),
        None => None,
    };
    let p0 = proxy_pid.map(proxy_cpu);
    let s0 = cpu_secs(sled_pid);
    let c0 = self_cpu_secs();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.duration_secs);
    let mut tasks = Vec::new();
    for mut s in sessions {
        let w = w.clone();
        let max = args.calls;
        tasks.push(tokio::spawn(async move {
            let mut h = new_hist();
            let (mut calls, mut errors) = (0u64, 0u64);
            while calls < max {
                let t = Instant::now();
                if t >= deadline {
                    break;
                }
                let ok = s.call(&w).await?;
                let ns = t.elapsed().as_nanos() as u64;
                h.saturating_record(ns.max(1));
                calls += 1;
                errors += u64::from(!ok);
            }
            Ok::<_, String>((h, calls, errors))
        }));
    }
    let mut hist = new_hist();
    let (mut calls, mut errors) = (0, 0);
    for t in tasks {
        let (h, c, e) = t.await.map_err(|e| e.to_string())??;
        hist.add(&h).map_err(|e| e.to_string())?;
        calls += c;
        errors += e;
    }
    let secs = start.elapsed().as_secs_f64();
    let phase = Phase {
        mode,
        k,
        calls,
        errors,
        secs,
        hist,
        proxy_cpu: match (proxy_pid, p0) {
            (Some(p), Some(p0)) => Some(proxy_cpu(p) - p0),
            _ => None,
        },
        sled_cpu: cpu_secs(sled_pid) - s0,
        client_cpu: self_cpu_secs() - c0,
    };
    Ok(phase)
}

fn print_header() {
    println!(
        "\n| path | K | calls | errors | calls/s | p50 µs | p99 µs | p99.9 µs | max µs | proxy CPU s | proxy CPU µs/call | sled CPU s | client CPU s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
}

fn print_row(p: &Phase) {
    let (pc, pcc) = match p.proxy_cpu {
        Some(c) => (
            format!("{c:.2}"),
            format!("{:.1}", c * 1e6 / p.calls.max(1) as f64),
        ),
        None => ("-".into(), "-".into()),
    };
    println!(
        "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.2} | {:.2} |",
        p.mode.name(),
        p.k,
        p.calls,
        p.errors,
        p.rate(),
        p.us(0.5),
        p.us(0.99),
        p.us(0.999),
        p.hist.max() as f64 / 1000.0,
        pc,
        pcc,
        p.sled_cpu,
        p.client_cpu
    );
}

async fn compare(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    let m = args.sleds;
    let names = sled_sim::demo_project_names(usize::from(m));
    let direct_base = procs::free_port_range(m)?;
    let projects: Vec<(String, String)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.clone(),
                format!("http://127.0.0.1:{}", direct_base + i as u16),
            )
        })
        .collect();
    println!(
        "\n## Compare: {m} sleds, sessions {:?}, {} s per phase, warmup {} calls/session\n",
        args.sessions, args.duration_secs, args.warmup
    );
    let (mut gw, gw_addr) = start_gateway(args, tmp, "compare", &projects, &[])?;
    // The sleds (fresh for each phase) live at direct_base + i.
    let nginx = if args.modes.contains(&Mode::Nginx) {
        Some(start_nginx(args, tmp, &names, direct_base)?)
    } else {
        None
    };
    let top_k = args.sessions.iter().copied().max().unwrap_or(1);
    let mut all: Vec<Phase> = Vec::new();
    print_header();
    for &k in &args.sessions {
        for &mode in &args.modes {
            let proxy = match mode {
                Mode::Gateway => Some((gw.pid(), false)),
                Mode::Nginx => nginx.as_ref().map(|n| (n.0.pid(), true)),
                Mode::Direct => None,
            };
            let perf = match (&args.perf_record, mode) {
                (Some(f), Mode::Gateway) if k == top_k => Some((f.clone(), gw.pid())),
                _ => None,
            };
            // Fresh sleds for every phase: sled-sim's cost grows with the stories created, so
            // each path must start from the same sled state.
            let mut sleds = start_sleds(args, tmp, "compare", gw_addr, m, Some(direct_base))?;
            let w = Arc::new(
                prepare_world(
                    &names,
                    gw_addr,
                    nginx.as_ref().map(|n| n.1),
                    direct_base,
                    &mut gw,
                    &mut sleds,
                )
                .await?,
            );
            let p = run_phase(args, &w, mode, k, proxy, sleds.pid(), perf, tmp).await?;
            print_row(&p);
            all.push(p);
            gw.check_alive()?;
            sleds.check_alive()?;
        }
    }
    println!(
        "\ngateway peak RSS (VmHWM): {:.1} MiB; CPU total {:.2} s",
        vm_kib(gw.pid(), "VmHWM") as f64 / 1024.0,
        cpu_secs(gw.pid())
    );
    if let Some((n, _)) = &nginx {
        println!(
            "nginx master RSS (VmHWM): {:.1} MiB",
            vm_kib(n.pid(), "VmHWM") as f64 / 1024.0
        );
    }
    let find = |mode: Mode, k: usize| all.iter().find(|p| p.mode == mode && p.k == k);
    println!("\n| K | ratio | throughput | p50 | p99 | p99.9 | added p50 µs | added p99 µs |");
    println!("|---|---|---|---|---|---|---|---|");
    for &k in &args.sessions {
        let Some(a) = find(Mode::Gateway, k) else {
            continue;
        };
        for (label, other) in [
            ("a/b (gateway/direct)", find(Mode::Direct, k)),
            ("a/c (gateway/nginx)", find(Mode::Nginx, k)),
        ] {
            let Some(o) = other else { continue };
            println!(
                "| {k} | {label} | {:.2} | {:.2} | {:.2} | {:.2} | {:+.1} | {:+.1} |",
                a.rate() / o.rate(),
                a.us(0.5) / o.us(0.5),
                a.us(0.99) / o.us(0.99),
                a.us(0.999) / o.us(0.999),
                a.us(0.5) - o.us(0.5),
                a.us(0.99) - o.us(0.99)
            );
        }
    }
    if let (Some(a), Some(b)) = (find(Mode::Gateway, 1), find(Mode::Direct, 1)) {
        let (d50, d99) = (a.us(0.5) - b.us(0.5), a.us(0.99) - b.us(0.99));
        targets.lines.push((
            "K=1: gateway adds ≤ 50 µs at p50 over direct".into(),
            Some(d50 <= 50.0),
            format!(
                "adds {d50:.1} µs (gateway {:.1}, direct {:.1})",
                a.us(0.5),
                b.us(0.5)
            ),
        ));
        targets.lines.push((
            "K=1: gateway adds ≤ 250 µs at p99 over direct".into(),
            Some(d99 <= 250.0),
            format!(
                "adds {d99:.1} µs (gateway {:.1}, direct {:.1})",
                a.us(0.99),
                b.us(0.99)
            ),
        ));
    }
    if let (Some(a), Some(c)) = (find(Mode::Gateway, top_k), find(Mode::Nginx, top_k)) {
        targets.lines.push((
            format!("K={top_k}: gateway throughput ≥ nginx"),
            Some(a.rate() >= c.rate()),
            format!(
                "{:.0} vs {:.0} calls/s ({:.2}×)",
                a.rate(),
                c.rate(),
                a.rate() / c.rate()
            ),
        ));
        targets.lines.push((
            format!("K={top_k}: gateway p99 ≤ nginx p99"),
            Some(a.us(0.99) <= c.us(0.99)),
            format!("{:.1} vs {:.1} µs", a.us(0.99), c.us(0.99)),
        ));
    }
    let errors: u64 = all.iter().map(|p| p.errors).sum();
    if errors > 0 {
        println!(
            "\nWARNING: {errors} calls failed (non-200 or an error result); see the logs in {}",
            tmp.path.display()
        );
    }
    drop(nginx);
    drop(gw);
    Ok(())
}

/// Waits for a freshly started sled-sim to be live on both paths, and creates the story each
/// project's `show` reads.
async fn prepare_world(
    names: &[String],
    gateway: SocketAddr,
    nginx: Option<SocketAddr>,
    direct_base: u16,
    gw: &mut Proc,
    sleds: &mut Proc,
) -> Res<World> {
    let m = names.len() as u16;
    for i in 0..m {
        procs::wait_listening(
            ([127, 0, 0, 1], direct_base + i).into(),
            Duration::from_secs(10),
        )?;
    }
    wait_live(
        gateway,
        names.len(),
        Duration::from_secs(60),
        &mut [gw, sleds],
    )
    .await?;
    // A story per project for `show`, made on the direct port (the same sled serves both).
    let mut stories = Vec::new();
    for i in 0..m {
        let mut c = Conn::connect(([127, 0, 0, 1], direct_base + i).into())
            .await
            .map_err(|e| e.to_string())?;
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_story","arguments":{"name":"the story shown","acceptance_criteria":["shown"]}}}"#;
        let a = c
            .post("/mcp", Bytes::from_static(body.as_bytes()))
            .await
            .map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|e| e.to_string())?;
        let id = v["result"]["structuredContent"]["story"]["id"]
            .as_str()
            .ok_or_else(|| format!("create_story answered {v}"))?;
        stories.push(id.to_owned());
    }
    Ok(World {
        names: names.to_vec(),
        stories,
        gateway,
        nginx,
        direct_base,
    })
}

/// Walks `tools/list` to the end; returns (pages, tools, bytes, first page time).
/// Walks the whole `tools/list` (following `nextCursor`). Returns the pages, tools, bytes, the
/// first page's time, and the time spent in HTTP exchanges (request sent to whole body
/// received): the client's own scanning of the bodies is not the gateway's cost.
async fn list_walk(c: &mut Conn, id: &mut u64) -> Res<(u32, usize, usize, Duration, Duration)> {
    let mut cursor: Option<String> = None;
    let (mut pages, mut tools, mut bytes) = (0u32, 0usize, 0usize);
    let mut first = Duration::ZERO;
    let mut exchanges = Duration::ZERO;
    loop {
        *id += 1;
        let body = match &cursor {
            None => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{{}}}}"#),
            Some(c) => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{{"cursor":"{c}"}}}}"#
            ),
        };
        let t = Instant::now();
        let a = c
            .post("/mcp", Bytes::from(body))
            .await
            .map_err(|e| e.to_string())?;
        let took = t.elapsed();
        exchanges += took;
        if pages == 0 {
            first = took;
        }
        if a.status != 200 || memchr::memmem::find(&a.body, b"\"tools\"").is_none() {
            return Err(format!(
                "tools/list: HTTP {}: {}",
                a.status,
                String::from_utf8_lossy(&a.body[..a.body.len().min(300)])
            ));
        }
        pages += 1;
        bytes += a.body.len();
        tools += memchr::memmem::find_iter(&a.body, b"\"name\":\"t").count();
        let key = b"\"nextCursor\":\"";
        cursor = memchr::memmem::find(&a.body, key).and_then(|i| {
            let rest = &a.body[i + key.len()..];
            let end = memchr::memchr(b'"', rest)?;
            Some(String::from_utf8_lossy(&rest[..end]).into_owned())
        });
        if cursor.is_none() || pages >= 100 {
            return Ok((pages, tools, bytes, first, exchanges));
        }
    }
}

/// `(name, url)` rows for projects.toml. The url is the discard port: these sleds are reached
/// through their uplinks only, and a probe of it fails at once.
fn registered(names: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .map(|n| (n.clone(), "http://127.0.0.1:9".to_owned()))
        .collect()
}

async fn tools_list(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    let n = args.wide_projects.max(1);
    let names: Vec<String> = (0..n).map(|i| format!("wide-{i}")).collect();
    let projects = registered(&names);
    println!(
        "\n## tools/list: {n} projects with {} tools each (emulated sleds in the bench)\n",
        args.wide_tools
    );
    let (mut gw, addr) = start_gateway(args, tmp, "tools-list", &projects, &[])?;
    let tools = Arc::new(widesled::tools_result(args.wide_tools).to_string());
    println!("one sled's tools/list result: {} KiB", tools.len() / 1024);
    let mut sled_tasks = Vec::new();
    for name in &names {
        sled_tasks.push(
            widesled::connect(addr.port(), name.clone(), tools.clone())
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    wait_live(addr, n, Duration::from_secs(30), &mut [&mut gw]).await?;
    // Each session makes a different wide project its default.
    let mut conns = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
        c.initialize("/mcp").await.map_err(|e| e.to_string())?;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"switch_project","arguments":{{"project":"{name}"}}}}}}"#
        );
        let a = c
            .post("/mcp", Bytes::from(body))
            .await
            .map_err(|e| e.to_string())?;
        if !a.is_ok() {
            return Err(format!(
                "switch_project {name}: {}",
                String::from_utf8_lossy(&a.body)
            ));
        }
        // The gateway fetches a sled's tools after it connects: wait until they are listed.
        let until = Instant::now() + Duration::from_secs(30);
        let mut id = 10 + i as u64;
        loop {
            let (_, listed, _, _, _) = list_walk(&mut c, &mut id).await?;
            if listed >= args.wide_tools {
                break;
            }
            if Instant::now() > until {
                return Err(format!("{name}: only {listed} tools listed after 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        conns.push(c);
    }
    let rss_before = vm_kib(gw.pid(), "VmRSS");
    println!("\n| K | walks | pages/walk | tools/walk | KiB/walk | walk p50 µs | walk p99 µs | walk p99.9 µs | first page p50 µs | gateway CPU µs/walk |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut p50_k1 = None;
    for &k in &args.sessions {
        let k = k.min(64);
        let mut sessions = Vec::new();
        for i in 0..k {
            let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
            c.initialize("/mcp").await.map_err(|e| e.to_string())?;
            let name = &names[i % n];
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"switch_project","arguments":{{"project":"{name}"}}}}}}"#
            );
            c.post("/mcp", Bytes::from(body))
                .await
                .map_err(|e| e.to_string())?;
            sessions.push(c);
        }
        let g0 = cpu_secs(gw.pid());
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(args.duration_secs.min(10.0));
        let warm = args.warmup.min(50);
        let max = args.calls.min(100_000);
        let mut tasks = Vec::new();
        for mut c in sessions {
            tasks.push(tokio::spawn(async move {
                let (mut h, mut f) = (new_hist(), new_hist());
                let mut id = 100;
                let mut shape = (0, 0, 0);
                for _ in 0..warm {
                    list_walk(&mut c, &mut id).await?;
                }
                let mut walks = 0u64;
                while walks < max && Instant::now() < deadline {
                    let (pages, tools, bytes, first, took) = list_walk(&mut c, &mut id).await?;
                    h.saturating_record(took.as_nanos() as u64);
                    f.saturating_record(first.as_nanos() as u64);
                    shape = (pages, tools, bytes);
                    walks += 1;
                }
                Ok::<_, String>((h, f, walks, shape))
            }));
        }
        let (mut h, mut f, mut walks, mut shape) = (new_hist(), new_hist(), 0, (0, 0, 0));
        for t in tasks {
            let (hh, ff, w, s) = t.await.map_err(|e| e.to_string())??;
            h.add(&hh).map_err(|e| e.to_string())?;
            f.add(&ff).map_err(|e| e.to_string())?;
            walks += w;
            shape = s;
        }
        let cpu = cpu_secs(gw.pid()) - g0;
        let us = |h: &Histogram<u64>, q| h.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "| {k} | {walks} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            shape.0,
            shape.1,
            shape.2 / 1024,
            us(&h, 0.5),
            us(&h, 0.99),
            us(&h, 0.999),
            us(&f, 0.5),
            cpu * 1e6 / walks.max(1) as f64
        );
        if k == 1 {
            p50_k1 = Some(us(&h, 0.5));
        }
    }
    println!(
        "gateway RSS with {n} × {} tools cached: {:.1} MiB (peak {:.1} MiB)",
        args.wide_tools,
        rss_before as f64 / 1024.0,
        vm_kib(gw.pid(), "VmHWM") as f64 / 1024.0
    );
    if let Some(p50) = p50_k1 {
        targets.lines.push((
            format!(
                "tools/list with {}-tool projects < 1 ms at p50 (K=1, whole list)",
                args.wide_tools
            ),
            Some(p50 < 1000.0),
            format!("{p50:.1} µs"),
        ));
    }
    for t in sled_tasks {
        t.abort();
    }
    drop(conns);
    drop(gw);
    Ok(())
}

async fn scale(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    let m = args.scale_sleds;
    let names = sled_sim::demo_project_names(usize::from(m));
    let projects = registered(&names);
    println!(
        "\n## Scale: {m} sleds, {} idle sessions (one open connection each: {})\n",
        args.idle_sessions, args.idle_connections
    );
    let idle_timeout = args.scale_idle_timeout_secs;
    let (mut gw, addr) = start_gateway(
        args,
        tmp,
        "scale",
        &projects,
        &["--http-idle-timeout-secs".into(), idle_timeout.to_string()],
    )?;
    let pid = gw.pid();
    let mib = |field| vm_kib(pid, field) as f64 / 1024.0;
    println!("| stage | VmRSS MiB | VmHWM MiB | gateway CPU s | seconds |");
    println!("|---|---|---|---|---|");
    println!(
        "| started, {m} projects registered | {:.1} | {:.1} | {:.2} | |",
        mib("VmRSS"),
        mib("VmHWM"),
        cpu_secs(pid)
    );
    let t = Instant::now();
    let mut sleds = start_sleds(args, tmp, "scale", addr, m, None)?;
    wait_live(
        addr,
        names.len(),
        Duration::from_secs(120),
        &mut [&mut gw, &mut sleds],
    )
    .await?;
    println!(
        "| {m} sleds live | {:.1} | {:.1} | {:.2} | {:.1} |",
        mib("VmRSS"),
        mib("VmHWM"),
        cpu_secs(pid),
        t.elapsed().as_secs_f64()
    );
    // Idle sessions: initialized over 32 connections, then left alone (an MCP session needs
    // no open connection).
    let t = Instant::now();
    let workers = 32usize;
    let ids = open_sessions(addr, args.idle_sessions, workers).await?;
    let made = ids.len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sessions_hwm = mib("VmHWM");
    println!(
        "| + {made} idle sessions (opened over {workers} connections) | {:.1} | {sessions_hwm:.1} | {:.2} | {:.1} |",
        mib("VmRSS"),
        cpu_secs(pid),
        t.elapsed().as_secs_f64()
    );
    // The harsher variant: every idle session also keeps an open keep-alive connection of its
    // own (a ping on it, then nothing).
    let mut kept = Vec::new();
    let mut held = 0;
    if args.idle_connections {
        let t = Instant::now();
        let mut tasks = Vec::new();
        let per = ids.len().div_ceil(workers);
        for chunk in ids.chunks(per.max(1)) {
            let chunk = chunk.to_vec();
            tasks.push(tokio::spawn(async move {
                let mut held = Vec::new();
                for (session, version) in chunk {
                    let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
                    c.session = session;
                    c.version = version;
                    let ping = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
                    let a = c.post("/mcp", ping).await.map_err(|e| e.to_string())?;
                    if a.status != 200 {
                        return Err(format!("ping on an idle session: HTTP {}", a.status));
                    }
                    held.push(c);
                }
                Ok::<_, String>(held)
            }));
        }
        for t in tasks {
            kept.extend(t.await.map_err(|e| e.to_string())??);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        println!(
            "| + an open idle connection per session ({} connections) | {:.1} | {:.1} | {:.2} | {:.1} |",
            kept.len(),
            mib("VmRSS"),
            mib("VmHWM"),
            cpu_secs(pid),
            t.elapsed().as_secs_f64()
        );
        // The gateway closes them once idle past its timeout (the scrape is the one left).
        let t = Instant::now();
        let until = t + Duration::from_secs(idle_timeout + 30);
        let open = loop {
            let open = metric(addr, "gateway_http_connections_open").await?;
            if open <= 1.0 || Instant::now() > until {
                break open;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let closed = metric(addr, "gateway_http_idle_closed_total").await?;
        println!(
            "| after the {idle_timeout} s idle timeout: {open} HTTP connections open, {closed} closed idle | {:.1} | {:.1} | {:.2} | {:.1} |",
            mib("VmRSS"),
            mib("VmHWM"),
            cpu_secs(pid),
            t.elapsed().as_secs_f64()
        );
        held = kept.len();
        kept.clear();
    }
    // The fleet still answers: a short bounded burst of calls on random projects.
    let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
    c.initialize("/mcp").await.map_err(|e| e.to_string())?;
    let mut h = new_hist();
    let mut rng = args.seed;
    let mut errors = 0;
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut calls = 0;
    while calls < 20_000 && Instant::now() < deadline {
        let p = &names[(splitmix(&mut rng) % names.len() as u64) as usize];
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{calls},"method":"tools/call","params":{{"name":"list_stories","arguments":{{"project":"{p}"}}}}}}"#
        );
        let t = Instant::now();
        let ok = c
            .post("/mcp", Bytes::from(body))
            .await
            .map(|a| a.is_ok())
            .unwrap_or(false);
        h.saturating_record(t.elapsed().as_nanos() as u64);
        errors += u64::from(!ok);
        calls += 1;
    }
    println!(
        "\nwith {m} sleds and {made} sessions, K=1 list_stories on random projects: {calls} calls, {errors} errors, p50 {:.1} µs, p99 {:.1} µs",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0
    );
    let hwm = mib("VmHWM");
    println!("gateway peak RSS (VmHWM): {sessions_hwm:.1} MiB with the idle sessions, {hwm:.1} MiB in all");
    targets.lines.push((
        format!("{m} sleds + {made} idle sessions in ≤ 128 MiB gateway RSS"),
        Some(sessions_hwm <= 128.0),
        format!("VmHWM {sessions_hwm:.1} MiB"),
    ));
    if args.idle_connections {
        targets.lines.push((
            format!("… with an open idle HTTP connection per session ({held} connections)"),
            Some(hwm <= 128.0),
            format!("VmHWM {hwm:.1} MiB"),
        ));
    }
    drop(kept);
    drop(sleds);
    drop(gw);
    Ok(())
}

/// A session's `Mcp-Session-Id` and `MCP-Protocol-Version` headers.
type SessionHeaders = (Option<HeaderValue>, Option<HeaderValue>);

/// Opens `total` MCP sessions over `workers` connections (an MCP session needs no open
/// connection of its own) and returns their headers.
async fn open_sessions(addr: SocketAddr, total: usize, workers: usize) -> Res<Vec<SessionHeaders>> {
    let mut tasks = Vec::new();
    for wkr in 0..workers {
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
            for _ in (wkr..total).step_by(workers) {
                c.session = None;
                c.version = None;
                c.initialize("/mcp").await.map_err(|e| e.to_string())?;
                ids.push((c.session.clone(), c.version.clone()));
            }
            Ok::<_, String>(ids)
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.map_err(|e| e.to_string())??);
    }
    Ok(ids)
}

/// A series' value from the gateway's `GET /metrics`, over a connection of its own.
async fn metric(gateway: SocketAddr, name: &str) -> Res<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(gateway)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)
        .await
        .map_err(|e| e.to_string())?;
    gateway_tests::metric_series(&raw, name)
        .ok_or_else(|| format!("no {name} in the gateway's /metrics"))
}

/// One sessionless `tools/call` through the gateway; its parsed answer and time.
async fn timed_call(
    c: &mut Conn,
    id: u64,
    tool: &str,
    arguments: &str,
) -> Res<(serde_json::Value, Duration)> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
    );
    let t = Instant::now();
    let a = c
        .post("/mcp", Bytes::from(body))
        .await
        .map_err(|e| e.to_string())?;
    let took = t.elapsed();
    let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|e| e.to_string())?;
    Ok((v, took))
}

async fn fanout(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    let m = args.fanout_sleds;
    let names = sled_sim::demo_project_names(usize::from(m));
    let projects = registered(&names);
    println!(
        "\n## aggregate_pipeline_status: {m} sleds, each answering in {}–{} ms\n",
        args.fanout_latency_ms,
        args.fanout_latency_ms + args.fanout_jitter_ms
    );
    let (mut gw, addr) = start_gateway(args, tmp, "fanout", &projects, &[])?;
    let extra = [
        "--latency-ms".to_owned(),
        args.fanout_latency_ms.to_string(),
        "--jitter-ms".to_owned(),
        args.fanout_jitter_ms.to_string(),
    ];
    let mut sleds = start_sleds_with(args, tmp, "fanout", addr, m, None, &extra)?;
    wait_live(
        addr,
        names.len(),
        Duration::from_secs(120),
        &mut [&mut gw, &mut sleds],
    )
    .await?;
    // Each sled's own answer time: pipeline_status on every project, 16 at a time.
    let workers = 16usize;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let mine: Vec<String> = names.iter().skip(w).step_by(workers).cloned().collect();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
            let mut times = Vec::new();
            for (i, p) in mine.iter().enumerate() {
                let (v, took) = timed_call(
                    &mut c,
                    i as u64,
                    "pipeline_status",
                    &format!(r#"{{"project":"{p}"}}"#),
                )
                .await?;
                if v["result"]["structuredContent"]["stages"].is_null() {
                    return Err(format!("pipeline_status on {p} failed: {v}"));
                }
                times.push(took);
            }
            Ok::<_, String>(times)
        }));
    }
    let mut singles = new_hist();
    for t in tasks {
        for took in t.await.map_err(|e| e.to_string())?? {
            singles.saturating_record(took.as_nanos() as u64);
        }
    }
    let slowest = Duration::from_nanos(singles.max());
    println!(
        "single sled, through the gateway: {} calls, p50 {:.1} ms, p99 {:.1} ms, slowest {:.1} ms",
        singles.len(),
        singles.value_at_quantile(0.5) as f64 / 1e6,
        singles.value_at_quantile(0.99) as f64 / 1e6,
        slowest.as_secs_f64() * 1e3
    );
    let cpu0 = cpu_secs(gw.pid());
    let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
    let mut agg = new_hist();
    let mut short = 0;
    for i in 0..args.fanout_calls {
        let (v, took) = timed_call(&mut c, i as u64, "aggregate_pipeline_status", "{}").await?;
        let answered = v["result"]["structuredContent"]["totals"]["answered"]
            .as_u64()
            .unwrap_or(0);
        if answered != u64::from(m) {
            short += 1;
            if v["result"].is_null() {
                return Err(format!("aggregate_pipeline_status failed: {v}"));
            }
            println!(
                "  call {i}: only {answered} of {m} answered: {}",
                v["result"]["structuredContent"]["not_answered"]
            );
        }
        agg.saturating_record(took.as_nanos() as u64);
    }
    let cpu = (cpu_secs(gw.pid()) - cpu0) / args.fanout_calls as f64;
    let p50 = agg.value_at_quantile(0.5) as f64 / 1e6;
    let worst = agg.max() as f64 / 1e6;
    println!(
        "aggregate_pipeline_status over {m}: {} calls, p50 {p50:.1} ms, p99 {:.1} ms, max {worst:.1} ms, gateway CPU {:.1} ms per call, {short} calls with projects missing",
        agg.len(),
        agg.value_at_quantile(0.99) as f64 / 1e6,
        cpu * 1e3
    );
    let ratio = worst / (slowest.as_secs_f64() * 1e3);
    println!("ratio (slowest aggregate / slowest single sled): {ratio:.2}");
    targets.lines.push((
        format!("aggregate_pipeline_status over {m} projects ≤ 2 × the slowest single sled"),
        Some(ratio <= 2.0 && short == 0),
        format!(
            "aggregate max {worst:.1} ms (p50 {p50:.1}) vs slowest single sled {:.1} ms: {ratio:.2}×",
            slowest.as_secs_f64() * 1e3
        ),
    ));
    drop(sleds);
    drop(gw);
    Ok(())
}
