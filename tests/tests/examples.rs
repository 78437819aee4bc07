//! The README's examples as shipped (issue 31): each is a file in `examples/`, the README shows
//! it verbatim, and this test runs it as a user would, with only the ports changed.

#[path = "support/nats.rs"]
mod nats;
#[path = "support/node.rs"]
mod node;
#[path = "support/processes.rs"]
mod processes;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The README's fenced block that follows `marker`, without its fences.
fn readme_block(marker: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("the README has no {marker:?}"));
    let rest = &readme[at..];
    let open = rest.find("```").expect("a fenced block follows");
    let body = &rest[open..];
    let body = &body[body.find('\n').expect("a fence line") + 1..];
    body[..body.find("```").expect("the block ends")].to_owned()
}

#[test]
fn the_readme_shows_every_example_as_shipped() {
    for file in [
        "projects.toml",
        "replicas.sh",
        "nginx.conf",
        "curl-session.sh",
        "leases.sh",
        "tasks.sh",
        "shell.sh",
        "oauth_client.py",
        "access.toml",
        "tls.sh",
        "sleds.toml",
        "everything-projects.toml",
        "connector.toml",
    ] {
        let shipped = std::fs::read_to_string(root().join("examples").join(file)).unwrap();
        assert_eq!(
            readme_block(&format!("`examples/{file}`, as shipped")),
            shipped,
            "README.md's {file} block differs from examples/{file}"
        );
    }
}

/// `gateway doctor --url mcp` again and again until it passes (sleds dial with a backoff);
/// `Err` with its last output when it has not passed within `limit`.
async fn doctor_passes(mcp: &str, limit: Duration) -> Result<(), String> {
    doctor_passes_with(&[], mcp, limit).await
}

/// [`doctor_passes`] with client flags before the command (`--ca-file FILE`).
async fn doctor_passes_with(flags: &[&str], mcp: &str, limit: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let out = Command::new(processes::workspace_bin("gateway"))
            .args(flags)
            .args(["doctor", "--url", mcp])
            .env_remove("MCP_GATEWAY_TOKEN")
            .env_remove("MCP_GATEWAY_URL")
            .output()
            .await
            .expect("gateway doctor runs");
        if out.status.success() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Three consecutive free loopback ports (the replicas' in `examples/replicas.sh`).
fn three_free_ports() -> u16 {
    loop {
        let first = processes::free_port();
        let rest_free = (1..3).all(|i| {
            first
                .checked_add(i)
                .is_some_and(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        });
        if rest_free {
            return first;
        }
    }
}

/// A shipped example with its ports changed: each `from` must be in it.
fn with_ports(file: &str, ports: &[(&str, String)]) -> String {
    let mut text = std::fs::read_to_string(root().join("examples").join(file)).unwrap();
    for (from, to) in ports {
        assert!(text.contains(from), "examples/{file} has no {from:?}");
        text = text.replace(from, to);
    }
    text
}

/// A shipped shell script running in a process group of its own, its output in a log file.
struct Script {
    child: tokio::process::Child,
    group: u32,
    log: PathBuf,
}

impl Script {
    /// `sh script` in `run`, with `path` as its PATH.
    fn start(script: &Path, run: &Path, path: &str, log: &Path) -> Script {
        let file = std::fs::File::create(log).unwrap();
        let child = Command::new("sh")
            .arg(script)
            .current_dir(run)
            .env("PATH", path)
            .env_remove("MCP_GATEWAY_TOKEN")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("sh runs the script");
        let group = child.id().expect("the script runs");
        Script {
            child,
            group,
            log: log.to_owned(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` (`-INT`, `-KILL`) to the script's whole group.
    fn signal(&self, sig: &str) {
        let _ = std::process::Command::new("kill")
            .args([sig, "--", &format!("-{}", self.group)])
            .stderr(Stdio::null())
            .status();
    }

    /// How many processes are left in the script's group.
    fn in_group(&self) -> usize {
        std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                    .filter(|pid| {
                        std::fs::read_to_string(format!("/proc/{pid}/stat"))
                            .ok()
                            .and_then(|s| {
                                // After the command's name: state, parent, process group.
                                let after = s.rsplit_once(')')?.1.to_owned();
                                after.split_whitespace().nth(2)?.parse::<u32>().ok()
                            })
                            == Some(self.group)
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// Stops it as Ctrl-C does its terminal's group: it must end, and everything it started
    /// with it.
    async fn stop(mut self) {
        self.signal("-INT");
        let ended = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
        // What it started may take a moment more to stop (a gateway drains its calls).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut leftover = self.in_group();
        while leftover > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            leftover = self.in_group();
        }
        self.signal("-KILL");
        assert!(
            ended.is_ok(),
            "the script did not end on SIGINT:\n{}",
            self.log()
        );
        assert_eq!(
            leftover,
            0,
            "processes of the script outlived it:\n{}",
            self.log()
        );
    }
}

/// `examples/replicas.sh` as shipped, with only its ports changed, in a directory holding
/// `examples/projects.toml`: it makes the certificates and the cluster secret, starts
/// nats-server with `examples/nats-server.conf`, three replicas, nginx with
/// `examples/nginx.conf` and sled-sim. Through the balancer `gateway doctor` passes and a
/// session's calls reach both projects; stopping the script stops everything it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_replicas_sh_runs_as_shipped() {
    let Some(nginx) = processes::nginx_binary() else {
        return;
    };
    let Some(nats) = nats::nats_server_binary().await else {
        return;
    };
    let dir = processes::scratch("replicas-sh");
    let (nats_port, lb_port) = (processes::free_port(), processes::free_port());
    let first = three_free_ports();
    let nats_addr = ("127.0.0.1:4222", format!("127.0.0.1:{nats_port}"));
    let lb_addr = ("127.0.0.1:8080", format!("127.0.0.1:{lb_port}"));
    let examples = dir.join("examples");
    std::fs::create_dir_all(&examples).unwrap();
    let files = [
        (
            "nats-server.conf",
            with_ports("nats-server.conf", std::slice::from_ref(&nats_addr)),
        ),
        (
            "nginx.conf",
            with_ports(
                "nginx.conf",
                &[
                    ("127.0.0.1:7001", format!("127.0.0.1:{first}")),
                    ("127.0.0.1:7002", format!("127.0.0.1:{}", first + 1)),
                    ("127.0.0.1:7003", format!("127.0.0.1:{}", first + 2)),
                    lb_addr.clone(),
                ],
            ),
        ),
        (
            "replicas.sh",
            with_ports(
                "replicas.sh",
                &[
                    nats_addr.clone(),
                    ("port=7001", format!("port={first}")),
                    lb_addr.clone(),
                ],
            ),
        ),
    ];
    for (name, text) in files {
        std::fs::write(examples.join(name), text).unwrap();
    }
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::copy(
        root().join("examples/projects.toml"),
        run.join("projects.toml"),
    )
    .unwrap();
    // What the script expects on PATH.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, target) in [
        ("gateway", processes::workspace_bin("gateway")),
        ("sled-sim", processes::workspace_bin("sled-sim")),
        ("nats-server", nats),
        ("nginx", nginx),
    ] {
        std::os::unix::fs::symlink(target, bin.join(name)).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = Script::start(
        &examples.join("replicas.sh"),
        &run,
        &path,
        &dir.join("replicas.log"),
    );
    let log_text = || script.log();
    // Doctor through the balancer until both sleds are up, then it must pass.
    let mcp = format!("http://{}/mcp", lb_addr.1);
    if let Err(out) = doctor_passes(&mcp, Duration::from_secs(90)).await {
        script.signal("-KILL");
        panic!(
            "gateway doctor failed through the balancer of examples/replicas.sh:\n{out}\nthe script's output:\n{}",
            log_text()
        );
    }
    // A session's calls reach both projects, whichever replica each lands on.
    let mut c = sled_sim::McpClient::connect(sled_sim::TokioConnect, &mcp)
        .await
        .expect("the balancer takes a client");
    c.initialize()
        .await
        .expect("a session through the balancer");
    for (i, project) in ["alpha", "beta", "alpha", "beta"].into_iter().enumerate() {
        let r = c
            .tools_call(
                serde_json::json!(i),
                "create_story",
                serde_json::json!({"name": format!("example {i}"), "acceptance_criteria": [], "project": project}),
            )
            .await
            .expect("an answer");
        assert_eq!(
            r["result"]["structuredContent"]["project"],
            project,
            "{r}\nthe script's output:\n{}",
            log_text()
        );
    }
    script.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `examples/tls.sh` as shipped, with only its port changed, in a directory holding
/// `examples/projects.toml`: it makes a CA and a certificate for localhost, serves HTTPS and
/// WSS only, and sled-sim and the shell dial `https://` trusting that CA. `gateway doctor`
/// with that CA passes; without it the certificate is refused; stopping the script stops
/// everything it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_tls_sh_runs_as_shipped() {
    let dir = processes::scratch("tls-sh");
    let port = processes::free_port();
    let script_text = with_ports(
        "tls.sh",
        &[
            ("localhost:8443", format!("localhost:{port}")),
            ("127.0.0.1:8443", format!("127.0.0.1:{port}")),
        ],
    );
    std::fs::write(dir.join("tls.sh"), script_text).unwrap();
    std::fs::copy(
        root().join("examples/projects.toml"),
        dir.join("projects.toml"),
    )
    .unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["gateway", "sled-sim"] {
        std::os::unix::fs::symlink(processes::workspace_bin(name), bin.join(name)).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = Script::start(&dir.join("tls.sh"), &dir, &path, &dir.join("tls.log"));
    let mcp = format!("https://localhost:{port}/mcp");
    let ca = dir.join("tls/ca.pem");
    let ca = ca.to_str().expect("a UTF-8 path");
    if let Err(out) = doctor_passes_with(&["--ca-file", ca], &mcp, Duration::from_secs(60)).await {
        script.signal("-KILL");
        panic!(
            "gateway doctor failed against examples/tls.sh:\n{out}\nthe script's output:\n{}",
            script.log()
        );
    }
    // The script's own shell command listed both projects over HTTPS.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !script.log().contains("\"projects\":[") && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        script.log().contains("\"name\":\"beta\""),
        "{}",
        script.log()
    );
    // A client that does not trust the example's CA is refused.
    let untrusting = Command::new(processes::workspace_bin("gateway"))
        .args(["list-projects", "--url", &mcp])
        .env_remove("MCP_GATEWAY_CA_FILE")
        .output()
        .await
        .expect("gateway runs");
    assert!(!untrusting.status.success());
    assert!(
        String::from_utf8_lossy(&untrusting.stderr).contains("UnknownIssuer"),
        "{}",
        String::from_utf8_lossy(&untrusting.stderr)
    );
    script.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gateway serve --config examples/projects.toml`, the README's sled-sim line for alpha and
/// beta, and `gateway doctor`: every check passes, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_projects_toml_serves_and_doctor_passes() {
    let dir = processes::scratch("examples");
    let port = processes::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut gateway = Command::new(processes::workspace_bin("gateway"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--config",
        ])
        .arg(root().join("examples/projects.toml"))
        // The pin file and the state directory would default to beside the config, in the
        // repository: kept apart.
        .arg("--pin-file")
        .arg(dir.join("pins.toml"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("gateway serve starts");
    assert!(
        processes::wait_healthy(port, Duration::from_secs(20)).await,
        "gateway serve did not come up with examples/projects.toml"
    );
    let _sleds = processes::sled_sim_with(
        &base,
        &[
            "--project".into(),
            "alpha".into(),
            "--project".into(),
            "beta".into(),
        ],
    );
    // Doctor until both sleds are up (they dial with a backoff), then it must pass.
    if let Err(out) = doctor_passes(&format!("{base}/mcp"), Duration::from_secs(30)).await {
        panic!("gateway doctor failed against examples/projects.toml:\n{out}");
    }
    let _ = gateway.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gateway demo` on a port of its own, once every emulated sled is live (doctor passes).
async fn demo() -> (tokio::process::Child, String) {
    demo_with(&[], &[]).await
}

/// `gateway demo` with `extra` arguments, checked by `gateway doctor` with `doctor` flags.
async fn demo_with(extra: &[String], doctor: &[&str]) -> (tokio::process::Child, String) {
    let port = processes::free_port();
    let child = Command::new(processes::workspace_bin("gateway"))
        .args(["demo", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("gateway demo starts");
    assert!(
        processes::wait_healthy(port, Duration::from_secs(20)).await,
        "gateway demo did not come up"
    );
    let mcp = format!("http://127.0.0.1:{port}/mcp");
    if let Err(out) = doctor_passes_with(doctor, &mcp, Duration::from_secs(30)).await {
        panic!("the demo's sleds did not come up:\n{out}");
    }
    (child, mcp)
}

/// Runs `examples/<file>` as shipped against the gateway at `mcp`, in a scratch directory, with
/// the workspace's `gateway` first on PATH and a fresh agent identity. Its stdout, line by line;
/// it must exit 0.
async fn run_example(file: &str, mcp: &str) -> Vec<String> {
    run_example_with(file, mcp, &[]).await
}

/// [`run_example`] with command-line arguments.
async fn run_example_with(file: &str, mcp: &str, args: &[String]) -> Vec<String> {
    let dir = processes::scratch("example");
    let bin = processes::workspace_bin("gateway");
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(root().join("examples").join(file))
            .args(args)
            .current_dir(&dir)
            .env("MCP_GATEWAY_URL", mcp)
            .env("PATH", path)
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("TMPDIR", &dir)
            .env_remove("MCP_GATEWAY_TOKEN")
            .env_remove("MCP_GATEWAY_AGENT_FILE")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("examples/{file} did not end within 120 s"))
    .unwrap_or_else(|e| panic!("examples/{file} cannot run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "examples/{file} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    stdout.lines().map(str::to_owned).collect()
}

/// One line of an example's output as JSON.
fn json_line(file: &str, lines: &[String], i: usize) -> serde_json::Value {
    let line = lines.get(i).unwrap_or_else(|| {
        panic!(
            "examples/{file} printed only {} lines: {lines:#?}",
            lines.len()
        )
    });
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("examples/{file}'s line {i} is not JSON ({e}): {line}"))
}

/// `examples/curl-session.sh` against the demo: each step answers what the README says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_curl_session_sh_runs_as_shipped() {
    let (_demo, mcp) = demo().await;
    let file = "curl-session.sh";
    let lines = run_example(file, &mcp).await;
    let at = |i| json_line(file, &lines, i);
    assert_eq!(at(0)["result"]["protocolVersion"], "2025-11-25");
    // The gateway's 18 tools, then alpha's, each with a `project` property.
    let tools = at(1)["result"]["tools"].as_array().cloned().unwrap();
    let gateway: Vec<String> = gateway_core::gateway_tool_definitions()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(gateway.len(), 18, "the README's comment counts 18");
    let (ours, alpha): (Vec<_>, Vec<_>) = tools
        .iter()
        .partition(|t| gateway.iter().any(|g| t["name"] == g.as_str()));
    assert_eq!(ours.len(), 18, "{tools:#?}");
    assert!(!alpha.is_empty(), "no project tools listed");
    for t in &alpha {
        assert!(t["inputSchema"]["properties"]["project"].is_object(), "{t}");
    }
    let story = &at(2)["result"]["structuredContent"];
    assert_eq!(story["project"], "beta");
    assert!(
        story["story"]["id"].as_str().unwrap().starts_with("beta-"),
        "{story}"
    );
    let unknown = &at(3)["error"];
    assert_eq!(unknown["code"], -32602);
    assert_eq!(
        unknown["message"],
        "Unknown project 'zeta'; registered projects: alpha, beta, gamma"
    );
    assert_eq!(unknown["data"]["kind"], "unknown_project");
    assert_eq!(
        unknown["data"]["registered"],
        serde_json::json!(["alpha", "beta", "gamma"])
    );
    assert_eq!(at(4)["result"]["structuredContent"]["project"], "beta");
    assert_eq!(at(5)["result"]["structuredContent"]["project"], "beta");
    assert_eq!(lines.get(6).map(String::as_str), Some("204"), "{lines:#?}");
}

/// `examples/leases.sh` against the demo: A's claim, B's refused write naming A, A's release,
/// and B's wait woken by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_leases_sh_runs_as_shipped() {
    let (_demo, mcp) = demo().await;
    let file = "leases.sh";
    let lines = run_example(file, &mcp).await;
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let claim = &json_line(file, &lines, 0)["result"]["structuredContent"];
    // Fence 1 on a fresh demo; doctor (which waited for the sleds) may have taken some.
    assert!(
        claim["acquired"] == true && claim["fence"].as_u64().is_some_and(|f| f >= 1),
        "{claim}"
    );
    let refused = &json_line(file, &lines, 1)["error"];
    assert_eq!(refused["code"], -32000);
    assert_eq!(refused["data"]["kind"], "lease_held");
    assert!(refused["data"]["holder"].is_string(), "{refused}");
    // The release and the woken wait come in either order.
    let (mut released, mut woke) = (false, false);
    for i in 2..4 {
        let r = &json_line(file, &lines, i)["result"]["structuredContent"];
        released |= r["released"] == true;
        woke |= r["woke"] == true
            && r["reasons"][0]
                == serde_json::json!({"kind": "released", "resource": "story:beta-1"});
    }
    assert!(released && woke, "{lines:#?}");
}

/// `examples/tasks.sh` against the demo with two client tokens, as the README runs it: A's task
/// made, listed, completed with beta's results, a second cancelled; B, another token, is told
/// neither exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_tasks_sh_runs_as_shipped() {
    let tokens = processes::scratch("tasks-tokens");
    let files: Vec<String> = ["a", "b"]
        .iter()
        .map(|who| {
            let f = tokens.join(format!("{who}.token"));
            std::fs::write(&f, format!("{who}-demo-client-token-0123456789\n")).unwrap();
            f.display().to_string()
        })
        .collect();
    let (_demo, mcp) = demo_with(
        &[
            "--client-token-file".into(),
            files[0].clone(),
            "--client-token-file".into(),
            files[1].clone(),
        ],
        &["--token-file", &files[0]],
    )
    .await;
    let file = "tasks.sh";
    let lines = run_example_with(file, &mcp, &files).await;
    assert_eq!(lines.len(), 9, "{lines:#?}");
    let at = |i| json_line(file, &lines, i);
    let created = &at(0)["result"]["task"];
    assert_eq!(created["status"], "working", "{lines:#?}");
    let first = created["taskId"].as_str().unwrap().to_owned();
    assert!(first.starts_with("mt1."), "{first}");
    assert_eq!(at(1)["result"]["tasks"][0]["taskId"], first.as_str());
    assert_eq!(at(2)["result"]["status"], "completed");
    let result = at(3)["result"].clone();
    assert_eq!(result["structuredContent"]["project"], "beta", "{result}");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        first.as_str()
    );
    let cancelled = &at(4)["result"];
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_ne!(cancelled["taskId"], first.as_str());
    for i in 5..8 {
        let refused = at(i);
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
        assert_eq!(refused["error"]["data"]["kind"], "unknown_task");
    }
    assert_eq!(at(8)["result"], serde_json::json!({"tasks": []}));
}

/// `examples/shell.sh` against the demo: every command answers, the other agent's write is
/// refused, `listen` wakes on its message, and doctor passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_shell_sh_runs_as_shipped() {
    let (_demo, mcp) = demo().await;
    let file = "shell.sh";
    let lines = run_example(file, &mcp).await;
    let (json, text): (Vec<_>, Vec<_>) = lines.iter().partition(|l| l.starts_with('{'));
    let json: Vec<serde_json::Value> = json
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let find = |what: &str, f: &dyn Fn(&serde_json::Value) -> bool| {
        json.iter()
            .find(|v| f(v))
            .cloned()
            .unwrap_or_else(|| panic!("examples/{file} printed no {what}: {lines:#?}"))
    };
    let projects = find("list-projects", &|v| v["projects"].is_array());
    assert_eq!(projects["projects"].as_array().unwrap().len(), 3);
    find("health", &|v| v["heartbeat_ms"].is_number());
    find("story", &|v| v["story"]["id"] == "beta-1");
    find("claim", &|v| v["acquired"] == true);
    find("release", &|v| v["released"] == true);
    find("board-set", &|v| {
        v["key"] == "release/v2" && v["revision"] == 1
    });
    let woke = find("listen", &|v| v["woke"] == true);
    assert_eq!(woke["reasons"][0]["kind"], "message", "{woke}");
    let inbox = find("inbox", &|v| v["messages"].is_array());
    assert_eq!(inbox["messages"][0]["body"], "deployed", "{inbox}");
    assert!(
        text.iter().any(|l| l.starts_with("refused (exit 1)")),
        "the other agent's move-story was not refused: {lines:#?}"
    );
    let doctor: Vec<_> = text
        .iter()
        .filter(|l| l.starts_with("ok ") || l.starts_with("FAIL"))
        .collect();
    assert!(
        doctor.len() >= 10 && doctor.iter().all(|l| l.starts_with("ok ")),
        "{doctor:#?}"
    );
}

/// `gateway serve` with `examples/access.toml` as shipped: the named token `ops` sees and may
/// do everything; the plain token is let in, sees only beta (the `anyone` rule) and may only
/// read there; alpha is not there for it at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_access_toml_gives_each_token_its_rights() {
    let toml = std::fs::read_to_string(root().join("examples/access.toml")).unwrap();
    let gw = processes::SingleGateway::start(&toml).await;
    let base = gw.url();
    let (plain, ops) = (
        Some("plain-token-at-least-16-chars"),
        Some("ops-token-at-least-16-chars"),
    );
    let names = |r: &serde_json::Value| -> Vec<String> {
        r["result"]["structuredContent"]["projects"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let listed = processes::call_tool(&base, ops, "list_projects", serde_json::json!({})).await;
    assert_eq!(names(&listed), ["alpha", "beta"]);
    let listed = processes::call_tool(&base, plain, "list_projects", serde_json::json!({})).await;
    assert_eq!(names(&listed), ["beta"]);
    // A write on beta: plain may only read there (refused at once, naming the right); ops may
    // write (the lease is granted: no sled is needed for it).
    let claim = serde_json::json!({"project": "beta", "resource": "story:beta-1"});
    let refused = processes::call_tool(&base, plain, "claim", claim.clone()).await;
    assert_eq!(refused["error"]["data"]["kind"], "forbidden", "{refused}");
    let checkin = processes::call_tool(&base, ops, "checkin", serde_json::json!({})).await;
    let mut claim = claim;
    claim["agent"] = checkin["result"]["structuredContent"]["handle"].clone();
    let granted = processes::call_tool(&base, ops, "claim", claim).await;
    assert_eq!(
        granted["result"]["structuredContent"]["acquired"], true,
        "{granted}"
    );
    // Alpha is not there for plain: as if it were not registered.
    let hidden = processes::call_tool(
        &base,
        plain,
        "show",
        serde_json::json!({"project": "alpha", "story_id": "alpha-1"}),
    )
    .await;
    assert_eq!(
        hidden["error"]["data"]["kind"], "unknown_project",
        "{hidden}"
    );
    assert_eq!(
        hidden["error"]["data"]["registered"],
        serde_json::json!(["beta"])
    );
}

/// The MCP server of README.md's "Put your MCP server behind the gateway", pinned as the
/// connector's tests pin it (the same install).
const SERVERS: [(&str, &str); 1] = [("@modelcontextprotocol/server-everything", "2026.8.31")];

/// The commands of a README shell block: comments and blank lines left out, a line ending in
/// `\` joined with the next.
fn commands(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in block.lines().map(str::trim) {
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part.trim_end());
                current.push(' ');
            }
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    out
}

/// One command of the walkthrough run to its end by `sh -c` in `dir`, with `path` as PATH: its
/// stdout; it must exit 0 within 120 s.
async fn run_command(command: &str, dir: &Path, path: &str, env: &[(&str, &str)]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new("sh")
            .args(["-c", command])
            .current_dir(dir)
            .env("PATH", path)
            .env_remove("MCP_GATEWAY_TOKEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("`{command}` did not end within 120 s"))
    .unwrap_or_else(|e| panic!("`{command}` cannot run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`{command}` failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The client token of `examples/everything-projects.toml` (`client_tokens = ["…"]`), and its
/// project's uplink token (`token = "…"`).
fn everything_tokens() -> (String, String) {
    let shipped =
        std::fs::read_to_string(root().join("examples/everything-projects.toml")).unwrap();
    let quoted = |prefix: &str| {
        shipped
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|l| l.split('"').next())
            .unwrap_or_else(|| panic!("everything-projects.toml has no {prefix}"))
            .to_owned()
    };
    (quoted("client_tokens = [\""), quoted("token = \""))
}

/// Calls server-everything's `echo` through the gateway at `mcp` with `client_token` until it
/// answers and is listed (within 60 s); `log` says what served it, for the failure.
async fn until_echo_served(mcp: &str, client_token: &str, log: impl Fn() -> String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut c = sled_sim::McpClient::connect(sled_sim::TokioConnect, mcp)
            .await
            .unwrap();
        c.set_bearer_token(Some(client_token.to_owned()));
        c.initialize().await.unwrap();
        let r = c
            .tools_call(
                serde_json::json!(1),
                "echo",
                serde_json::json!({"message": "ready?"}),
            )
            .await
            .unwrap();
        let listed = c.tools_list(serde_json::json!(2), None).await.unwrap();
        let tools = listed["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if r["result"]["content"][0]["text"] == "Echo: ready?"
            && tools.iter().any(|t| t["name"] == "echo")
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server-everything never answered through the gateway: {r}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// README.md's "Put your MCP server behind the gateway", its commands run as the README shows
/// them, in a directory holding a copy of `examples/`, with only the port changed and npx's
/// packages swapped for the pinned installed copies (run by Node 22): `gateway serve` with
/// `examples/everything-projects.toml`, the token file, gateway-sled with server-everything
/// over stdio, and the Inspector CLI with the client token, which lists everything's tools
/// (each with `project`) and calls its echo. `gateway doctor` passes, and everything stops on
/// Ctrl-C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_put_your_server_behind_the_gateway_walkthrough_runs_as_shown() {
    let node = node::node().await;
    let servers = node::packages("servers", &SERVERS).await;
    let entry = servers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let inspector = node.bin("@modelcontextprotocol/inspector", "mcp-inspector");
    let port = processes::free_port();
    let dir = processes::scratch("walkthrough");
    std::fs::create_dir_all(dir.join("examples")).unwrap();
    std::fs::copy(
        root().join("examples/everything-projects.toml"),
        dir.join("examples/everything-projects.toml"),
    )
    .unwrap();

    let block = readme_block("these commands as shown");
    let swaps = [
        ("127.0.0.1:7878", format!("127.0.0.1:{port}")),
        (
            "npx -y @modelcontextprotocol/server-everything@2026.8.31",
            format!("{} {}", node.node.display(), entry.display()),
        ),
        (
            "npx @modelcontextprotocol/inspector@2.12.0",
            format!("{} {}", node.node.display(), inspector.display()),
        ),
    ];
    let mut shown = block.clone();
    for (from, to) in &swaps {
        assert!(block.contains(from), "the walkthrough has no {from:?}");
        shown = shown.replace(from, to);
    }
    let steps = commands(&shown);
    let inspect = format!("{} {} --cli ", node.node.display(), inspector.display());
    let expected = [
        "cp examples/everything-projects.toml ",
        "gateway serve --config ",
        "(umask 077 && printf ",
        "gateway-sled --gateway ",
        &inspect,
        &inspect,
    ];
    assert_eq!(steps.len(), expected.len(), "{steps:#?}");
    for (step, start) in steps.iter().zip(expected) {
        assert!(
            step.starts_with(start),
            "{step:?} does not start with {start:?}"
        );
    }

    // The workspace's gateway and gateway-sled first on PATH; then Node 22 (the Inspector runs
    // `node` itself).
    let bin = processes::workspace_bin("gateway");
    processes::workspace_bin("gateway-sled");
    let path = format!(
        "{}:{}:{}",
        bin.parent().unwrap().display(),
        node.node.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let background = |i: usize, name: &str| {
        let script = dir.join(format!("{name}.sh"));
        std::fs::write(&script, format!("{}\n", steps[i])).unwrap();
        Script::start(&script, &dir, &path, &dir.join(format!("{name}.log")))
    };

    // 1. The gateway.
    run_command(&steps[0], &dir, &path, &[]).await;
    let gateway = background(1, "gateway");
    assert!(
        processes::wait_healthy(port, Duration::from_secs(20)).await,
        "gateway serve did not come up:\n{}",
        gateway.log()
    );
    // 2. The token file (only its owner may read it) and gateway-sled.
    run_command(&steps[2], &dir, &path, &[]).await;
    let token = dir.join("everything.token");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "everything.token is mode {mode:o}");
    }
    let sled = background(3, "gateway-sled");

    // Served through the gateway, with the client token: echo answers and is listed.
    let (client_token, _) = everything_tokens();
    let mcp = format!("http://127.0.0.1:{port}/mcp");
    until_echo_served(&mcp, &client_token, || {
        format!("gateway-sled's log:\n{}", sled.log())
    })
    .await;
    // Without the client token the gateway refuses.
    let mut anonymous = sled_sim::McpClient::connect(sled_sim::TokioConnect, &mcp)
        .await
        .unwrap();
    assert!(
        anonymous.initialize().await.is_err(),
        "no token, yet let in"
    );

    // 3. The Inspector CLI: the list, then the call.
    let listed = run_command(&steps[4], &dir, &path, &[]).await;
    let listed: serde_json::Value =
        serde_json::from_str(&listed).unwrap_or_else(|e| panic!("{e}: {listed}"));
    let echo = listed["tools"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == "echo"))
        .unwrap_or_else(|| panic!("the Inspector lists no echo: {listed}"));
    assert_eq!(
        echo["inputSchema"]["properties"]["project"]["type"],
        "string"
    );
    let called = run_command(&steps[5], &dir, &path, &[]).await;
    let called: serde_json::Value =
        serde_json::from_str(&called).unwrap_or_else(|e| panic!("{e}: {called}"));
    assert_eq!(called["content"][0]["text"], "Echo: hello", "{called}");

    // The README's doctor line after it passes.
    let doctor = commands(&readme_block("checks the project (the tests run it too)"));
    assert_eq!(doctor.len(), 1, "{doctor:?}");
    assert!(doctor[0].contains("gateway doctor --url http://127.0.0.1:7878/mcp"));
    run_command(
        &doctor[0].replace("127.0.0.1:7878", &format!("127.0.0.1:{port}")),
        &dir,
        &path,
        &[],
    )
    .await;

    sled.stop().await;
    gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// README.md's "In the gateway's own process": `gateway serve --connector
/// examples/connector.toml` as the README shows it (only the port changed, and in the copy of
/// `examples/connector.toml` npx's package swapped for the pinned installed copy run by Node
/// 22), beside the walkthrough's projects.toml and token file: the gateway serves
/// server-everything itself (no gateway-sled), echo answers with the client token and is
/// listed, and Ctrl-C stops the gateway and the server it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_connector_toml_is_served_inside_the_gateway_as_shown() {
    let node = node::node().await;
    let servers = node::packages("servers", &SERVERS).await;
    let entry = servers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let port = processes::free_port();
    let dir = processes::scratch("connector-example");
    std::fs::create_dir_all(dir.join("examples")).unwrap();
    let shipped = std::fs::read_to_string(root().join("examples/connector.toml")).unwrap();
    let npx = r#""npx", "-y", "@modelcontextprotocol/server-everything@2026.8.31""#;
    assert!(shipped.contains(npx), "{shipped}");
    let local = format!(
        "{:?}, {:?}",
        node.node.display().to_string(),
        entry.display().to_string()
    );
    std::fs::write(
        dir.join("examples/connector.toml"),
        shipped.replace(npx, &local),
    )
    .unwrap();
    // The walkthrough's projects.toml and token file.
    let projects =
        std::fs::read_to_string(root().join("examples/everything-projects.toml")).unwrap();
    std::fs::write(dir.join("projects.toml"), &projects).unwrap();
    let (client_token, uplink_token) = everything_tokens();
    std::fs::write(dir.join("everything.token"), format!("{uplink_token}\n")).unwrap();

    let block = readme_block("the gateway serves `everything` itself");
    assert!(block.contains("127.0.0.1:7878"), "{block}");
    let steps = commands(&block.replace("127.0.0.1:7878", &format!("127.0.0.1:{port}")));
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert!(
        steps[0].starts_with("gateway serve --config projects.toml "),
        "{steps:?}"
    );
    let bin = processes::workspace_bin("gateway");
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = dir.join("gateway.sh");
    std::fs::write(&script, format!("{}\n", steps[0])).unwrap();
    let gateway = Script::start(&script, &dir, &path, &dir.join("gateway.log"));
    assert!(
        processes::wait_healthy(port, Duration::from_secs(20)).await,
        "gateway serve --connector did not come up:\n{}",
        gateway.log()
    );
    let mcp = format!("http://127.0.0.1:{port}/mcp");
    until_echo_served(&mcp, &client_token, || gateway.log()).await;
    // Its identity key, where the file says (relative to the directory it runs in).
    assert!(dir.join("gateway-sled-state/everything.key").exists());
    let log = gateway.log();
    assert!(log.contains("serving in the gateway's process"), "{log}");
    gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
