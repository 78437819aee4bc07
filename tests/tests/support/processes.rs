//! Real processes for the replica tests: the workspace's own `gateway` and `sled-sim`
//! binaries (built by `cargo test --workspace`, the README's test command), and Debian's nginx
//! as the load balancer in front of them.
//!
//! Included with `#[path = "support/processes.rs"] mod processes;`. nginx is skipped with a
//! note when it is not installed, and missing under `CI` is a failure (`.ci/run` installs
//! Debian's `nginx-light`).

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::process::{Child, Command};

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// A binary of the workspace, as `cargo test --workspace` built it (same profile as this test).
pub fn workspace_bin(name: &str) -> PathBuf {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let path = target_dir().join(profile).join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (which builds it), or `cargo build -p gateway-server -p sled-sim -p gateway-connector --bins` first",
        path.display()
    );
    path
}

/// A directory of its own under the system's temporary directory, emptied first.
pub fn scratch(what: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gateway-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory can be made");
    dir
}

/// A free loopback port (bound and released: good enough on a test machine).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits up to `limit` until `GET /healthz` on `port` answers 200.
pub async fn wait_healthy(port: u16, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if healthz(port).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn healthz(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let req = "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut out = String::new();
    let read = tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut out)).await;
    matches!(read, Ok(Ok(_))) && out.starts_with("HTTP/1.1 200")
}

/// One `gateway serve --cluster` process.
pub struct GatewayProcess {
    pub name: String,
    pub port: u16,
    config: PathBuf,
    nats: String,
    dir: PathBuf,
    child: Option<Child>,
    claim_ttl_secs: u64,
    /// More of `gateway serve`'s arguments, and its environment beside `RUST_LOG=info` (and
    /// the tests' cluster secret in `MCP_GATEWAY_CLUSTER_SECRET`, which `env` may replace);
    /// changed between a stop and [`GatewayProcess::restart`] to restart it otherwise.
    pub launch: Launch,
}

/// How a replica is started beyond its cluster and name: more arguments, environment
/// variables, and whether `--replica` is given.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    pub args: Vec<std::ffi::OsString>,
    pub env: Vec<(String, std::ffi::OsString)>,
    /// Leave `--replica` out (the replica is then named after the host; `name` must be that).
    pub unnamed: bool,
}

impl GatewayProcess {
    /// Starts replica `name` of the cluster on `nats` serving `config`, and waits until it is
    /// healthy.
    pub async fn start(config: &Path, nats: &str, name: &str, claim_ttl_secs: u64) -> Self {
        Self::start_with(config, nats, name, claim_ttl_secs, Launch::default()).await
    }

    /// [`GatewayProcess::start`], with `launch`'s arguments and environment.
    pub async fn start_with(
        config: &Path,
        nats: &str,
        name: &str,
        claim_ttl_secs: u64,
        launch: Launch,
    ) -> Self {
        let mut g = GatewayProcess {
            name: name.to_owned(),
            port: free_port(),
            config: config.to_owned(),
            nats: nats.to_owned(),
            dir: scratch(&format!("replica-{name}")),
            child: None,
            claim_ttl_secs,
            launch,
        };
        g.restart().await;
        g
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Starts it again on the same port (after [`GatewayProcess::kill9`] or
    /// [`GatewayProcess::terminate`]).
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "replica {} is running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("gateway.log"))
            .expect("the log can be opened");
        let mut command = Command::new(workspace_bin("gateway"));
        command
            .args(["serve", "--config"])
            .arg(&self.config)
            .args(["--listen", &self.addr().to_string()])
            .args(["--cluster", &self.nats]);
        if !self.launch.unnamed {
            command.args(["--replica", &self.name]);
        }
        let child = command
            .args(["--claim-ttl-secs", &self.claim_ttl_secs.to_string()])
            .arg("--pin-file")
            .arg(self.dir.join("pins.toml"))
            // As examples/replicas.sh: longer than nginx.conf's upstream keepalive_timeout.
            .args(["--drain-settle-ms", "1500"])
            .args(&self.launch.args)
            .env("RUST_LOG", "info")
            .env(
                gateway_server::cluster::seal::SECRET_ENV,
                gateway_tests::TEST_CLUSTER_SECRET,
            )
            .envs(self.launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("the gateway starts");
        self.child = Some(child);
        assert!(
            wait_healthy(self.port, Duration::from_secs(20)).await,
            "replica {} did not become healthy:\n{}",
            self.name,
            self.log()
        );
    }

    /// `kill -9`: no goodbye, no release.
    pub async fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// SIGTERM, then waits (up to 30 s) for a graceful exit, which must be a success.
    pub async fn terminate(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = c.id().expect("running").to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .expect("kill runs");
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(30), c.wait())
            .await
            .expect("the replica exits within 30 s of SIGTERM")
            .expect("waitable");
        assert!(
            status.success(),
            "replica {} exited with {status}:\n{}",
            self.name,
            self.log()
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("gateway.log")).unwrap_or_default()
    }

    /// Its `--pin-file`: its copy of the cluster's pins.
    pub fn pin_file(&self) -> PathBuf {
        self.dir.join("pins.toml")
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One `gateway serve` process, not in a cluster, with a state directory of its own (every
/// test that spawns a gateway gives it one, so that nothing is written beside the config).
pub struct SingleGateway {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl SingleGateway {
    /// Writes `projects_toml` into a scratch directory and starts `gateway serve` on it, with
    /// `--state-dir` and `--pin-file` in that directory; waits until it is healthy.
    pub async fn start(projects_toml: &str) -> Self {
        let mut g = SingleGateway::prepare(projects_toml);
        g.restart().await;
        g
    }

    /// Its directory and config, not started yet (a test may put files there first; then
    /// [`SingleGateway::restart`] starts it).
    pub fn prepare(projects_toml: &str) -> Self {
        let dir = scratch("single");
        std::fs::write(dir.join("projects.toml"), projects_toml).expect("the config is written");
        SingleGateway {
            port: free_port(),
            dir,
            child: None,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The directory holding its config, its log and its state directory (`state/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The `gateway serve` command line, for a test that runs it itself.
    pub fn command(&self) -> Command {
        let mut command = Command::new(workspace_bin("gateway"));
        command
            .args(["serve", "--config"])
            .arg(self.dir.join("projects.toml"))
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--pin-file")
            .arg(self.dir.join("pins.toml"))
            .arg("--state-dir")
            .arg(self.state_dir())
            .env("RUST_LOG", "info");
        command
    }

    /// Starts it (again) on the same port and state directory.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "the gateway is running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("gateway.log"))
            .expect("the log can be opened");
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("the gateway starts");
        self.child = Some(child);
        assert!(
            wait_healthy(self.port, Duration::from_secs(20)).await,
            "the gateway did not become healthy:\n{}",
            self.log()
        );
    }

    /// `kill -9`: no goodbye.
    pub async fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// SIGTERM, then waits (up to 30 s) for a graceful exit, which must be a success.
    pub async fn terminate(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = c.id().expect("running").to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .expect("kill runs");
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(30), c.wait())
            .await
            .expect("the gateway exits within 30 s of SIGTERM")
            .expect("waitable");
        assert!(status.success(), "exited with {status}:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("gateway.log")).unwrap_or_default()
    }
}

impl Drop for SingleGateway {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A `tools/call` of `tool` with `arguments` through the gateway at `base` (`http://…`), as
/// the client token `bearer` if one is given: the JSON-RPC response.
pub async fn call_tool(
    base: &str,
    bearer: Option<&str>,
    tool: &str,
    arguments: serde_json::Value,
) -> serde_json::Value {
    let mut c = sled_sim::McpClient::connect(sled_sim::TokioConnect, &format!("{base}/mcp"))
        .await
        .unwrap();
    c.set_bearer_token(bearer.map(str::to_owned));
    c.tools_call(serde_json::json!(1), tool, arguments)
        .await
        .unwrap()
}

/// The replica holding `project` as the gateway at `base` lists it to `bearer`, once it is
/// live (within 20 s).
pub async fn holder(base: &str, bearer: Option<&str>, project: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = call_tool(base, bearer, "list_projects", serde_json::json!({})).await;
        if let Some(projects) = r["result"]["structuredContent"]["projects"].as_array() {
            if let Some(p) = projects
                .iter()
                .find(|p| p["name"] == project && p["live"] == true)
            {
                return p["replica"].as_str().unwrap_or_default().to_owned();
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{project} not live at {base}: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The uplink token [`sled_sim_with`]'s sleds present (`$SLED_UPLINK_TOKEN`): a test's
/// projects.toml gives it to its projects (uplinks are closed by default); a project without
/// a token ignores it.
pub const SLED_TOKEN: &str = "test-uplink-token-0123456789";

/// A `sled-sim` process emulating the sleds of `projects`, dialing `gateway`.
pub fn sled_sim(gateway: &str, projects: &[&str], latency_ms: u64) -> Child {
    let mut args = vec!["--latency-ms".to_owned(), latency_ms.to_string()];
    for p in projects {
        args.extend(["--project".to_owned(), (*p).to_owned()]);
    }
    sled_sim_with(gateway, &args)
}

/// A `sled-sim` process dialing `gateway` with these arguments (its projects among them).
pub fn sled_sim_with(gateway: &str, args: &[String]) -> Child {
    let mut c = Command::new(workspace_bin("sled-sim"));
    c.args(["--gateway", gateway]).args(args);
    c.env("SLED_UPLINK_TOKEN", SLED_TOKEN);
    c.env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("sled-sim starts")
}

/// Debian's nginx, if installed; `None` (with a note) when it is not, a failure under `CI`.
pub fn nginx_binary() -> Option<PathBuf> {
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return Some(PathBuf::from(p));
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!("nginx is not installed: `apt-get install nginx-light` (Debian's nginx; .ci/run installs it)");
    }
    eprintln!("SKIPPED: nginx is not installed (apt-get install nginx-light); the load-balancer tests need it");
    None
}

/// nginx balancing `/mcp` and the `/uplink` WebSocket round-robin over `upstreams`, with no
/// stickiness, as a production deployment would.
pub struct Nginx {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl Nginx {
    /// nginx run from the shipped `examples/nginx.conf` (the README's), with only its ports
    /// changed: the three replicas' for `upstreams`, and a free one to listen on.
    pub async fn start(binary: &Path, upstreams: &[u16]) -> Nginx {
        let dir = scratch("nginx");
        let port = free_port();
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/nginx.conf");
        let mut conf = std::fs::read_to_string(&shipped).expect("examples/nginx.conf");
        let listen = port.to_string();
        let ports: Vec<String> = upstreams.iter().map(u16::to_string).collect();
        let shipped_ports = ["7001", "7002", "7003"];
        assert_eq!(
            ports.len(),
            shipped_ports.len(),
            "examples/nginx.conf balances three replicas"
        );
        for (from, to) in shipped_ports.iter().zip(&ports).chain([(&"8080", &listen)]) {
            let from = format!("127.0.0.1:{from}");
            assert_eq!(
                conf.matches(&from).count(),
                1,
                "examples/nginx.conf names {from} once"
            );
            conf = conf.replace(&from, &format!("127.0.0.1:{to}"));
        }
        std::fs::write(dir.join("nginx.conf"), conf).expect("the config can be written");
        let child = Command::new(binary)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg("nginx.conf")
            .arg("-e")
            .arg("error.log")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nginx starts");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "nginx did not listen within 10 s:\n{}",
                std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Nginx { port, dir, child }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// The processes whose parent is `pid` (from `/proc`).
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            // /proc/<p>/stat: "pid (comm) state ppid …"; comm may hold spaces, not ')'.
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|st| {
                    let rest = st.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Whether process `pid` is running (there, and not a zombie).
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
            st.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
}

impl Nginx {
    /// Stops nginx the way it expects (SIGQUIT to the master: the workers finish and exit, then
    /// the master), and returns the processes it started that are still running after 10 s
    /// (then killed).
    fn stop(&mut self) -> Vec<u32> {
        let Some(master) = self.child.id() else {
            return Vec::new();
        };
        let workers = children_of(master);
        let _ = std::process::Command::new("kill")
            .args(["-QUIT", &master.to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut left: Vec<u32> = workers.clone();
        loop {
            let master_done = matches!(self.child.try_wait(), Ok(Some(_)));
            left.retain(|w| alive(*w));
            if master_done && left.is_empty() {
                return Vec::new();
            }
            if std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.start_kill();
        let mut outlived: Vec<u32> = left.clone();
        for w in &left {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &w.to_string()])
                .status();
        }
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            outlived.push(master);
        }
        outlived
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let outlived = self.stop();
        if !outlived.is_empty() && !std::thread::panicking() {
            panic!("nginx processes {outlived:?} outlived a graceful stop by 10 s");
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
            let mut last = "";
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| {
                    // One line per kind of error in a row is enough.
                    let kind = l.split(", client").next().unwrap_or(l);
                    let kind = kind.split_once("*").map_or(kind, |(_, k)| k);
                    let kind = kind.split_once(' ').map_or(kind, |(_, k)| k);
                    let new = kind != last;
                    last = kind;
                    new
                })
                .collect();
            let first: Vec<&str> = lines.iter().take(40).copied().collect();
            eprintln!(
                "nginx's error log (repeats left out):\n{}",
                first.join("\n")
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
