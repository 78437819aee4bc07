//! The README's examples as shipped (issue 31): each is a file in `examples/`, the README shows
//! it verbatim, and this test runs it as a user would, with only the ports changed.

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
fn the_readme_shows_examples_projects_toml_as_shipped() {
    let shipped = std::fs::read_to_string(root().join("examples/projects.toml")).unwrap();
    assert_eq!(
        readme_block("`examples/projects.toml`, as shipped"),
        shipped,
        "README.md's projects.toml block differs from examples/projects.toml"
    );
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(processes::workspace_bin("gateway"))
            .args(["doctor", "--url", &format!("{base}/mcp")])
            .env_remove("MCP_GATEWAY_TOKEN")
            .env_remove("MCP_GATEWAY_URL")
            .output()
            .await
            .expect("gateway doctor runs");
        if out.status.success() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gateway doctor failed against examples/projects.toml:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let _ = gateway.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}
