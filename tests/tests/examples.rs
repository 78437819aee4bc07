//! The README's examples as shipped (issue 31): each is a file in `examples/`, the README shows
//! it verbatim, and this test runs it as a user would, with only the ports changed.

#[path = "support/nats.rs"]
mod nats;
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
    for file in ["projects.toml", "replicas.sh", "nginx.conf"] {
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
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let out = Command::new(processes::workspace_bin("gateway"))
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
    let log = std::fs::File::create(dir.join("replicas.log")).unwrap();
    let mut script = Command::new("sh")
        .arg(examples.join("replicas.sh"))
        .current_dir(&run)
        .env("PATH", path)
        .env_remove("MCP_GATEWAY_TOKEN")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("sh runs examples/replicas.sh");
    let group = script.id().expect("the script runs");
    let signal = |sig: &str| {
        let _ = std::process::Command::new("kill")
            .args([sig, "--", &format!("-{group}")])
            .stderr(Stdio::null())
            .status();
    };
    let log_text = || std::fs::read_to_string(dir.join("replicas.log")).unwrap_or_default();
    // Doctor through the balancer until both sleds are up, then it must pass.
    let mcp = format!("http://{}/mcp", lb_addr.1);
    if let Err(out) = doctor_passes(&mcp, Duration::from_secs(90)).await {
        signal("-KILL");
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
    // Stopping the script (as Ctrl-C does its terminal's group) stops all it started.
    signal("-INT");
    let ended = tokio::time::timeout(Duration::from_secs(30), script.wait()).await;
    // What it started may take a moment more to stop (a replica gives its claims back).
    let in_group = || {
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
                            == Some(group)
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut leftover = in_group();
    while leftover > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        leftover = in_group();
    }
    signal("-KILL");
    assert!(
        ended.is_ok(),
        "the script did not end on SIGINT:\n{}",
        log_text()
    );
    assert_eq!(
        leftover,
        0,
        "processes of the script outlived it:\n{}",
        log_text()
    );
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
