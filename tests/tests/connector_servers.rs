//! Issue 26's proof: four real MCP servers that nobody here wrote, each a project of one
//! gateway, all four served by one `gateway-sled --config sleds.toml` process (one uplink and
//! one token each), and worked by one session of each client (the gateway's own, the official
//! TypeScript and Python SDKs, the Inspector CLI) that never switches projects: every call
//! names its project in its own `project` argument.
//!
//! - npm's `@modelcontextprotocol/server-filesystem` as `files`, on a fresh directory holding a
//!   file the test wrote; `@modelcontextprotocol/server-memory` as `memory`, its knowledge graph
//!   in a file of the test's (`MEMORY_FILE_PATH`, from the config's `env`); PyPI's
//!   `mcp-server-time` as `time`, from a virtualenv; `@modelcontextprotocol/server-everything`
//!   as `everything`. All over stdio, all pinned.
//! - The gateway lists every project's tools, each with `project` injected; `list_projects`
//!   shows the four live.
//! - Calls interleaved across the projects are each answered by the server their `project`
//!   names: the file's content comes from `files` only (the same call naming another project
//!   does not reach it), the time from `time`, the entity created in `memory` is read back
//!   from `memory` (and is in its file), the echo from `everything`.
//! - A call naming a project the gateway does not have is -32602 `unknown_project`.
//! - Then the clients people use, against the same gateway and connector, each by per-call
//!   `project` and none switching: the official TypeScript SDK
//!   (`tests/clients/ts_servers_client.mjs`, one handshake-era session) and Python SDK
//!   (`tests/clients/python_servers_client.py`, a handshake-era session and a stateless
//!   2026-07-28 one) read the test's file from `files`, ask `time` for the time in UTC, create
//!   an entity in `memory` and open it again, echo through `everything`, and get -32602
//!   `unknown_project` for a project the gateway does not have; what they created is in
//!   `memory`'s graph next to ours. The MCP Inspector CLI calls one tool of each of the four
//!   with `--tool-arg project=...` in the stateless era, where the gateway lists every
//!   project's tools; in the handshake era it calls only the tools its session lists (the
//!   active project's), so there it reaches `files` and refuses `time`'s tool itself.
//! - When the test ends, the connector and every server it started are gone.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sled_sim::{McpClient, TokioConnect};
use tokio::process::{Child, Command};

#[path = "support/node.rs"]
mod node;
#[path = "support/processes.rs"]
mod processes;
#[path = "support/python.rs"]
mod python;

/// The npm servers, pinned.
const SERVERS: [(&str, &str); 3] = [
    ("@modelcontextprotocol/server-everything", "2026.8.31"),
    ("@modelcontextprotocol/server-filesystem", "2026.8.31"),
    ("@modelcontextprotocol/server-memory", "2026.8.31"),
];

/// The Python server, pinned.
const TIME_SERVER: &str = "mcp-server-time==2026.10.19";

/// The four projects, each with its own uplink token.
const PROJECTS: [(&str, &str); 4] = [
    ("files", "files-uplink-token-0123456789"),
    ("time", "time-uplink-token-0123456789"),
    ("memory", "memory-uplink-token-0123456789"),
    ("everything", "everything-uplink-token-0123456789"),
];

/// Tools each project's server lists (not all of them: enough to know the server is there).
const TOOLS: [(&str, &[&str]); 4] = [
    (
        "files",
        &[
            "read_text_file",
            "list_directory",
            "list_allowed_directories",
        ],
    ),
    ("time", &["get_current_time", "convert_time"]),
    ("memory", &["create_entities", "read_graph", "open_nodes"]),
    ("everything", &["echo", "get-sum"]),
];

/// How long the four servers may take to start and be listed (a first run of Python is slow).
const READY_WITHIN: Duration = Duration::from_secs(120);

fn projects_toml() -> String {
    let mut toml = "default = \"files\"\n".to_owned();
    for (name, token) in PROJECTS {
        toml.push_str(&format!(
            "[[project]]\nname = \"{name}\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{token}\"\n\
             call_timeout_ms = 60000\n"
        ));
    }
    toml
}

/// A virtualenv in `target/clients/time-server/` with [`TIME_SERVER`] installed (on first
/// use, as `support/python.rs` installs the SDK): its `mcp-server-time` entry point.
async fn time_server() -> PathBuf {
    let venv = node::clients_dir().join("time-server");
    let entry = venv.join("bin/mcp-server-time");
    let marker = venv.join(format!("installed-{TIME_SERVER}"));
    if marker.exists() && entry.exists() {
        return entry;
    }
    let status = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .await
        .expect("python3 is needed for the time server (it is on every machine of this kind)");
    assert!(
        status.success(),
        "python3 -m venv {} failed",
        venv.display()
    );
    let install = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            TIME_SERVER,
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), install)
        .await
        .expect("pip finished within 10 minutes")
        .expect("pip runs");
    assert!(
        out.status.success(),
        "pip install {TIME_SERVER} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(entry.exists(), "{} is missing", entry.display());
    std::fs::write(&marker, "").expect("the marker can be written");
    entry
}

/// The connector: killed with every process it started (its process group) when dropped, so
/// that no server outlives the test, passing or failing.
struct Connector {
    child: Child,
    group: u32,
    log: PathBuf,
}

impl Connector {
    /// `gateway-sled --config config`, in a process group of its own, logging to `log`.
    fn start(config: &Path, log: &Path) -> Self {
        let child = Command::new(processes::workspace_bin("gateway-sled"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info,gateway_connector=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("gateway-sled starts");
        let group = child.id().expect("running");
        Connector {
            child,
            group,
            log: log.to_owned(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The processes of its group still alive (the connector and its servers).
    fn alive(&self) -> Vec<String> {
        alive_in(self.group)
    }

    fn kill_group(&self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.group)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        self.kill_group();
    }
}

/// The processes of process group `group` that are alive (not zombies), as `pid command`.
fn alive_in(group: u32) -> Vec<String> {
    let out = std::process::Command::new("pgrep")
        .args(["-g", &group.to_string(), "-a"])
        .output()
        .expect("pgrep runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| {
            let pid = line.split(' ').next().unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The state follows the command's closing parenthesis.
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            matches!(state, Some(Some(s)) if s != 'Z')
        })
        .map(str::to_owned)
        .collect()
}

async fn session(url: &str) -> McpClient<TokioConnect> {
    let mut c = McpClient::connect(TokioConnect, &format!("{url}/mcp"))
        .await
        .unwrap();
    c.set_timeout(Some(Duration::from_secs(30)));
    c.initialize().await.unwrap();
    c
}

/// Every live project's tools as the gateway lists them to anyone: its stateless
/// (2026-07-28) `tools/list`, asked over the session's connection without the session.
async fn every_projects_tools(c: &mut McpClient<TokioConnect>) -> Vec<Value> {
    let body = json!({"jsonrpc": "2.0", "id": "all", "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }}});
    let (status, _, body) = c
        .post_raw(
            body.to_string().into_bytes(),
            &[
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/list"),
                ("mcp-session-id", ""),
            ],
        )
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200, "{body}");
    body["result"]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("{body}"))
}

/// Waits (within [`READY_WITHIN`]) until the gateway lists every project's tools; returns
/// that listing.
async fn until_listed(
    c: &mut McpClient<TokioConnect>,
    sled: &Connector,
    gw: &processes::SingleGateway,
) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    loop {
        let tools = every_projects_tools(c).await;
        let missing: Vec<&str> = TOOLS
            .iter()
            .flat_map(|(_, names)| names.iter().copied())
            .filter(|n| !tools.iter().any(|t| t["name"] == *n))
            .collect();
        if missing.is_empty() {
            return tools;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not listed within {READY_WITHIN:?}: {missing:?}\n--- gateway-sled:\n{}\n--- gateway:\n{}",
            sled.log(),
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `tools/call` of `tool` in `project`, `arguments` and `project` its arguments.
async fn call(
    c: &mut McpClient<TokioConnect>,
    project: &str,
    tool: &str,
    arguments: Value,
) -> Value {
    let mut arguments = arguments;
    arguments["project"] = json!(project);
    c.tools_call(json!(format!("{project}-{tool}")), tool, arguments)
        .await
        .unwrap()
}

fn text(r: &Value) -> &str {
    assert_ne!(r["result"]["isError"], true, "{r}");
    r["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {r}"))
}

/// Seconds since the epoch of an RFC 3339 time with an offset, as `mcp-server-time` writes it
/// (`2026-12-07T10:31:34+00:00`).
fn epoch_seconds(rfc3339: &str) -> Option<i64> {
    let (date, rest) = rfc3339.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|n| n.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (clock, sign, offset) = match rest.find(['+', '-']) {
        Some(i) => (&rest[..i], &rest[i..i + 1], &rest[i + 1..]),
        None => (rest.strip_suffix('Z')?, "+", "00:00"),
    };
    let mut t = clock.splitn(3, ':');
    let (hh, mm) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let ss = t.next()?.split('.').next()?.parse::<i64>().ok()?;
    let (oh, om) = offset.split_once(':')?;
    let offset = (oh.parse::<i64>().ok()? * 60 + om.parse::<i64>().ok()?) * 60;
    let offset = if sign == "-" { -offset } else { offset };
    let valid = (1..=12).contains(&m)
        && (1..=31).contains(&day)
        && (0..24).contains(&hh)
        && (0..60).contains(&mm)
        && (0..=60).contains(&ss);
    if !valid {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss - offset)
}

#[test]
fn epoch_seconds_reads_the_time_servers_format() {
    assert_eq!(epoch_seconds("1970-01-01T00:00:00+00:00"), Some(0));
    assert_eq!(
        epoch_seconds("2026-12-07T10:31:34+00:00"),
        Some(1_796_639_494)
    );
    assert_eq!(
        epoch_seconds("2026-12-07T11:31:34+01:00"),
        Some(1_796_639_494)
    );
    assert_eq!(epoch_seconds("2026-13-07T10:31:34+00:00"), None);
    assert_eq!(epoch_seconds("yesterday"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_of_each_client_works_four_real_servers_by_per_call_project() {
    let started = std::time::Instant::now();
    let node = node::node().await;
    let servers = node::packages("real-servers", &SERVERS).await;
    let time_server = time_server().await;
    let package = |name: &str| {
        servers
            .join("node_modules/@modelcontextprotocol")
            .join(name)
            .join("dist/index.js")
            .display()
            .to_string()
    };
    let node_bin = node.node.display().to_string();
    eprintln!("installed in {:?}", started.elapsed());

    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector-servers");
    // The filesystem server's directory, fresh, with a file only the test wrote.
    let files = dir.join("files");
    std::fs::create_dir_all(&files).unwrap();
    let files = files.canonicalize().unwrap();
    let note = format!(
        "written by the test, process {}, at {:?}\n",
        std::process::id(),
        SystemTime::now()
    );
    std::fs::write(files.join("note.txt"), &note).unwrap();
    let memory_file = dir.join("memory.jsonl");

    // sleds.toml: the four servers over stdio, one token file each.
    let command = |parts: &[&str]| {
        parts
            .iter()
            .map(|p| format!("{p:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut config = format!(
        "gateway = \"{}\"\nstate_dir = \"{}\"\n",
        gw.url(),
        dir.join("state").display()
    );
    let files_dir = files.display().to_string();
    let everything = package("server-everything");
    let commands: [(&str, String, String); 4] = [
        (
            "files",
            command(&[&node_bin, &package("server-filesystem"), &files_dir]),
            String::new(),
        ),
        (
            "time",
            command(&[
                &time_server.display().to_string(),
                "--local-timezone",
                "UTC",
            ]),
            String::new(),
        ),
        (
            "memory",
            command(&[&node_bin, &package("server-memory")]),
            format!(
                "env = {{ MEMORY_FILE_PATH = {:?} }}\n",
                memory_file.display().to_string()
            ),
        ),
        (
            "everything",
            command(&[&node_bin, &everything, "stdio"]),
            String::new(),
        ),
    ];
    for ((name, token), (project, command, extra)) in PROJECTS.iter().zip(&commands) {
        assert_eq!(name, project);
        let token_file = dir.join(format!("{name}.token"));
        std::fs::write(&token_file, token).unwrap();
        config.push_str(&format!(
            "\n[[project]]\nname = \"{name}\"\ncommand = [{command}]\n{extra}token_file = \"{}\"\n",
            token_file.display()
        ));
    }
    std::fs::write(dir.join("sleds.toml"), &config).unwrap();
    let sled = Connector::start(&dir.join("sleds.toml"), &dir.join("sled.log"));

    // One session, whose default is `files`; it never switches.
    let mut c = session(&gw.url()).await;
    let listed = until_listed(&mut c, &sled, &gw).await;
    eprintln!("all four listed {:?} after start", started.elapsed());

    // Every project's tools, each with `project` injected.
    for (project, names) in TOOLS {
        for name in names {
            let tool = listed
                .iter()
                .find(|t| t["name"] == *name)
                .unwrap_or_else(|| panic!("{project}'s {name} is not listed"));
            assert_eq!(
                tool["inputSchema"]["properties"]["project"]["type"], "string",
                "{tool}"
            );
        }
    }
    // The session's own listing: the gateway's tools and its default's (`files`) only.
    let own = c.tools_list(json!("own"), None).await.unwrap();
    let own: Vec<&str> = own["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{own}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(own.contains(&"read_text_file"), "{own:?}");
    assert!(
        !own.contains(&"echo") && !own.contains(&"get_current_time"),
        "{own:?}"
    );

    // All four live, the session's default `files`.
    let projects = c
        .tools_call(json!("projects"), "list_projects", json!({}))
        .await
        .unwrap();
    let live: Vec<(Value, Value)> = projects["result"]["structuredContent"]["projects"]
        .as_array()
        .unwrap_or_else(|| panic!("{projects}"))
        .iter()
        .map(|p| (p["name"].clone(), p["live"].clone()))
        .collect();
    assert_eq!(
        live,
        PROJECTS.map(|(name, _)| (json!(name), json!(true))),
        "{projects}"
    );

    // Calls interleaved across the four, each naming its project.
    let read = call(
        &mut c,
        "files",
        "read_text_file",
        json!({"path": files.join("note.txt")}),
    )
    .await;
    assert_eq!(text(&read), note, "{read}");

    let now = call(
        &mut c,
        "time",
        "get_current_time",
        json!({"timezone": "UTC"}),
    )
    .await;
    let datetime = now["result"]["structuredContent"]["datetime"]
        .as_str()
        .unwrap_or_else(|| panic!("{now}"));
    let told = epoch_seconds(datetime).unwrap_or_else(|| panic!("not a time: {now}"));
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((told - clock).abs() < 300, "{datetime} is not now: {now}");
    assert_eq!(
        now["result"]["structuredContent"]["timezone"], "UTC",
        "{now}"
    );
    assert!(text(&now).contains(datetime), "{now}");

    let created = call(
        &mut c,
        "memory",
        "create_entities",
        json!({"entities": [{"name": "gateway-sled", "entityType": "connector",
                             "observations": ["reached through the gateway"]}]}),
    )
    .await;
    assert!(text(&created).contains("gateway-sled"), "{created}");

    let echo = call(
        &mut c,
        "everything",
        "echo",
        json!({"message": "four at once"}),
    )
    .await;
    assert_eq!(text(&echo), "Echo: four at once", "{echo}");

    let listing = call(
        &mut c,
        "files",
        "list_directory",
        json!({"path": files_dir}),
    )
    .await;
    assert!(text(&listing).contains("note.txt"), "{listing}");

    let opened = call(
        &mut c,
        "memory",
        "open_nodes",
        json!({"names": ["gateway-sled"]}),
    )
    .await;
    assert!(
        text(&opened).contains("reached through the gateway"),
        "{opened}"
    );

    let converted = call(
        &mut c,
        "time",
        "convert_time",
        json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
    )
    .await;
    assert_eq!(
        converted["result"]["structuredContent"]["time_difference"], "+9.0h",
        "{converted}"
    );

    let graph = call(&mut c, "memory", "read_graph", json!({})).await;
    let entities = graph["result"]["structuredContent"]["entities"].clone();
    let names: Vec<&str> = entities
        .as_array()
        .map(|es| es.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_else(|| panic!("{graph}"));
    assert_eq!(names, ["gateway-sled"], "{graph}");
    // The memory server keeps its graph where the config's `env` told it to.
    let kept = std::fs::read_to_string(&memory_file).unwrap_or_default();
    assert!(kept.contains("reached through the gateway"), "{kept}");

    let sum = call(&mut c, "everything", "get-sum", json!({"a": 20, "b": 6})).await;
    assert_eq!(text(&sum), "The sum of 20 and 6 is 26.", "{sum}");

    // The project named is the server that answers: the same read naming another project is
    // refused by that project's own server, in its own SDK's words (the gateway's errors carry
    // a `kind`), and the file's content comes from `files` only; so is an echo naming `files`.
    for project in ["time", "memory", "everything"] {
        let args = json!({"path": files.join("note.txt")});
        let r = call(&mut c, project, "read_text_file", args).await;
        assert!(!r.to_string().contains(note.trim_end()), "{project}: {r}");
        if project == "time" {
            // The Python SDK: a JSON-RPC error.
            assert_eq!(r["error"]["code"], -32602, "{r}");
            assert_eq!(r["error"]["message"], "Unknown tool: read_text_file", "{r}");
            assert!(r["error"].get("data").is_none(), "{r}");
        } else {
            // The TypeScript SDK: a tool result that is an error.
            assert_eq!(r["result"]["isError"], true, "{project}: {r}");
            assert_eq!(
                r["result"]["content"][0]["text"],
                "MCP error -32602: Tool read_text_file not found",
                "{project}: {r}"
            );
        }
    }
    let r = call(&mut c, "files", "echo", json!({"message": "x"})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(
        r["result"]["content"][0]["text"], "MCP error -32602: Tool echo not found",
        "{r}"
    );

    // A project the gateway does not have.
    let unknown = call(&mut c, "nowhere", "echo", json!({"message": "x"})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert_eq!(
        unknown["error"]["data"]["kind"], "unknown_project",
        "{unknown}"
    );
    assert_eq!(unknown["error"]["data"]["project"], "nowhere", "{unknown}");
    assert_eq!(
        unknown["error"]["data"]["registered"],
        json!(PROJECTS.map(|(name, _)| name)),
        "{unknown}"
    );

    // Nothing switched the session: its default is still `files`.
    let projects = c
        .tools_call(json!("after"), "list_projects", json!({}))
        .await
        .unwrap();
    assert_eq!(
        projects["result"]["structuredContent"]["active"], "files",
        "{projects}"
    );
    eprintln!("served after {:?}", started.elapsed());

    // The official clients, against the same gateway and connector.
    let mcp = format!("{}/mcp", gw.url());
    let file = files.join("note.txt").display().to_string();
    sdks_and_inspector(&node, &mcp, &file, &note, &sled, &gw).await;
    // What they created is in the same graph as ours.
    let graph = call(&mut c, "memory", "read_graph", json!({})).await;
    let names: Vec<&str> = graph["result"]["structuredContent"]["entities"]
        .as_array()
        .map(|es| es.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_else(|| panic!("{graph}"));
    assert_eq!(
        names,
        [
            "gateway-sled",
            "typescript-sdk",
            "python-sdk-legacy",
            "python-sdk-2026-07-28"
        ],
        "{graph}"
    );
    eprintln!(
        "the SDKs and the Inspector done after {:?}",
        started.elapsed()
    );

    // The connector and every server it started end with the test.
    let running = sled.alive();
    assert!(
        running.len() >= 5,
        "the connector and four servers: {running:?}"
    );
    let group = sled.group;
    drop(sled);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = alive_in(group);
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a Node command (at most 120 s; killed if it takes longer): whether it succeeded, its
/// stdout and its stderr.
async fn run_node(mut cmd: Command, what: &str) -> (bool, String, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} finished within 120 s"))
        .unwrap_or_else(|e| panic!("{what} ran: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The official clients work the four projects by per-call `project` through the gateway at
/// `mcp`, none switching: the TypeScript SDK and the Python SDK (`tests/clients/
/// ts_servers_client.mjs` and `python_servers_client.py`, given the test's `file` and its
/// `content`), then the Inspector CLI, one call to each project.
async fn sdks_and_inspector(
    node: &node::Node,
    mcp: &str,
    file: &str,
    content: &str,
    sled: &Connector,
    gw: &processes::SingleGateway,
) {
    let logs = || {
        format!(
            "--- gateway-sled:\n{}\n--- gateway:\n{}",
            sled.log(),
            gw.log()
        )
    };

    // The TypeScript SDK, run from its install directory so that its imports find it.
    let script = node.script("ts_servers_client.mjs");
    let mut cmd = node.command();
    cmd.arg(&script).args([mcp, file, content]);
    let (ok, stdout, stderr) = run_node(cmd, "the TypeScript client").await;
    println!("{stdout}");
    assert!(
        ok && stdout.contains(" passed, 0 failed"),
        "{stdout}\n{stderr}\n{}",
        logs()
    );

    let python = python::python_with_sdk().await;
    python::run_checks(&python, "python_servers_client.py", &[mcp, file, content]).await;

    // The Inspector CLI's `tools/call` of `tool` with `args` (`key=value`), in protocol `era`.
    let inspector = node.bin("@modelcontextprotocol/inspector", "mcp-inspector");
    let inspect = |era: &str, tool: &str, args: &[String]| {
        let mut cmd = node.command();
        cmd.arg(&inspector)
            .args(["--cli", mcp, "--transport", "http", "--protocol-era", era])
            .args(["--method", "tools/call", "--tool-name", tool, "--tool-arg"])
            .args(args);
        run_node(cmd, "the Inspector CLI")
    };

    // In the handshake era the Inspector calls only tools its session lists, and a session
    // lists its active project's (`files`): a call naming `files` works, one of `time`'s tools
    // is refused by the Inspector itself, which never sends the call.
    let (ok, stdout, stderr) = inspect(
        "legacy",
        "read_text_file",
        &[format!("path={file}"), "project=files".to_owned()],
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}\n{}", logs());
    let read: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(read["content"][0]["text"], content, "{read}");
    let (ok, stdout, stderr) = inspect(
        "legacy",
        "get_current_time",
        &["timezone=UTC".to_owned(), "project=time".to_owned()],
    )
    .await;
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("\"tool_not_found\""), "{stdout}\n{stderr}");

    // In the stateless era (2026-07-28) the gateway lists every live project's tools: one call
    // to each project, each naming it.
    let mut called = Vec::new();
    for (project, tool, args) in [
        ("files", "read_text_file", vec![format!("path={file}")]),
        ("time", "get_current_time", vec!["timezone=UTC".to_owned()]),
        ("memory", "read_graph", vec![]),
        ("everything", "echo", vec!["message=inspected".to_owned()]),
    ] {
        let mut args = args;
        args.push(format!("project={project}"));
        let (ok, stdout, stderr) = inspect("modern", tool, &args).await;
        assert!(ok, "{project} {tool}: {stdout}\n{stderr}\n{}", logs());
        let result: Value =
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_ne!(result["isError"], true, "{project} {tool}: {result}");
        called.push(result);
    }
    assert_eq!(called[0]["content"][0]["text"], content, "{}", called[0]);
    assert_eq!(
        called[1]["structuredContent"]["timezone"], "UTC",
        "{}",
        called[1]
    );
    let datetime = called[1]["structuredContent"]["datetime"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", called[1]));
    let told = epoch_seconds(datetime).unwrap_or_else(|| panic!("not a time: {}", called[1]));
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((told - clock).abs() < 300, "{datetime} is not now");
    // The graph holds what the SDKs created.
    let graph = called[2]["content"][0]["text"].as_str().unwrap_or_default();
    for entity in [
        "typescript-sdk",
        "python-sdk-legacy",
        "python-sdk-2026-07-28",
    ] {
        assert!(graph.contains(entity), "{entity}: {}", called[2]);
    }
    assert_eq!(
        called[3]["content"][0]["text"], "Echo: inspected",
        "{}",
        called[3]
    );
}

/// Issue 27 through issue 26's connector (where-the-issues-meet §5): server-everything's task
/// tool `simulate-research-query` (`execution.taskSupport: "required"`) run as a task through
/// the gateway and gateway-sled over stdio: the id the client gets is the gateway's (bound to
/// its session), `tasks/get` and `tasks/list` reach the server, `tasks/result` waits out the
/// research (four 1 s stages) and names the task by the client's id, a second task is
/// cancelled at the server, and another session reaches neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_servers_task_runs_through_the_gateway_and_the_connector() {
    let node = node::node().await;
    let servers = node::packages("real-servers", &SERVERS).await;
    let everything = servers
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string();
    let gw = processes::SingleGateway::start(&projects_toml()).await;
    let dir = processes::scratch("connector-tasks");
    let (name, token) = PROJECTS[3];
    let token_file = dir.join("everything.token");
    std::fs::write(&token_file, token).unwrap();
    let config = format!(
        "gateway = \"{}\"\nstate_dir = \"{}\"\n\n[[project]]\nname = \"{name}\"\ncommand = [{:?}, {:?}, \"stdio\"]\ntoken_file = \"{}\"\n",
        gw.url(),
        dir.join("state").display(),
        node.node.display().to_string(),
        everything,
        token_file.display()
    );
    std::fs::write(dir.join("sleds.toml"), &config).unwrap();
    let sled = Connector::start(&dir.join("sleds.toml"), &dir.join("sled.log"));
    let mut c = session(&gw.url()).await;
    let mut other = session(&gw.url()).await;
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    let tool = loop {
        let tools = every_projects_tools(&mut c).await;
        if let Some(t) = tools
            .iter()
            .find(|t| t["name"] == "simulate-research-query")
        {
            break t.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not listed\n{}\n{}",
            sled.log(),
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(tool["execution"]["taskSupport"], "required", "{tool}");

    let created = start_research(&mut c, 1).await;
    let id = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}\n{}", sled.log()))
        .to_owned();
    assert!(id.starts_with("mt1."), "{created}");
    let got = c
        .request(json!("get"), "tasks/get", json!({"taskId": id}))
        .await
        .unwrap();
    assert_eq!(got["result"]["taskId"], json!(id), "{got}");
    assert!(["working", "completed"].contains(&got["result"]["status"].as_str().unwrap()));
    // Another session: as if it did not exist.
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let r = other
            .request(json!("x"), method, json!({"taskId": id}))
            .await
            .unwrap();
        assert_eq!(r["error"]["data"]["kind"], "unknown_task", "{method}: {r}");
    }
    let listed = other
        .request(json!("l"), "tasks/list", json!({}))
        .await
        .unwrap();
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    let listed = c
        .request(json!("l"), "tasks/list", json!({}))
        .await
        .unwrap();
    let ids: Vec<&str> = listed["result"]["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|t| t["taskId"].as_str())
        .collect();
    assert_eq!(ids, [id.as_str()], "{listed}");
    // The result, once the research is done.
    let result = c
        .request(json!("result"), "tasks/result", json!({"taskId": id}))
        .await
        .unwrap();
    assert_ne!(result["result"]["isError"], true, "{result}");
    assert!(
        result["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("topic 1")),
        "{result}"
    );
    assert_eq!(
        result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(id)
    );
    // A second one, cancelled at the server.
    let created = start_research(&mut c, 2).await;
    let second = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancelled = c
        .request(json!("cancel"), "tasks/cancel", json!({"taskId": second}))
        .await
        .unwrap();
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = c
        .request(json!("get2"), "tasks/get", json!({"taskId": second}))
        .await
        .unwrap();
    assert_eq!(
        got["result"]["status"], "cancelled",
        "never completed: {got}"
    );
}

/// `simulate-research-query` on `topic {n}`, as a task.
async fn start_research(c: &mut McpClient<TokioConnect>, n: u32) -> Value {
    let params = json!({"name":"simulate-research-query","arguments":{"project":"everything","topic":format!("topic {n}")},"task":{"ttl":60000}});
    c.request(json!(format!("start-{n}")), "tools/call", params)
        .await
        .unwrap()
}
