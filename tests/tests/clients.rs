//! MCP clients nobody here wrote, against the real gateway and fleet over loopback: the
//! official Python SDK (PyPI `mcp`). The client is installed on first use into
//! `target/clients/` from the package registry; later runs reuse it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use gateway_core::{ProjectSpec, Registry};
use gateway_server::{serve, ServerOptions};
use sled_sim::{Fleet, SledOptions};
use tokio::process::Command;

/// The Python SDK version the checks were written against.
const PYTHON_SDK: &str = "mcp==2.3.0";

fn clients_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("clients")
}

/// A Python with the SDK installed, in a virtualenv of its own.
async fn python_with_sdk() -> PathBuf {
    let venv = clients_dir().join("python");
    let python = venv.join("bin/python");
    let marker = venv.join(format!("installed-{PYTHON_SDK}"));
    if marker.exists() {
        return python;
    }
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .await
        .expect("python3 is needed for the client tests (it is on every machine of this kind)");
    assert!(
        status.success(),
        "python3 -m venv {} failed",
        venv.display()
    );
    let out = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            PYTHON_SDK,
        ])
        .output()
        .await
        .expect("pip runs");
    assert!(
        out.status.success(),
        "pip install {PYTHON_SDK} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&marker, "").expect("the marker can be written");
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_lists_calls_switches_hears_list_changed_and_cancels() {
    gateway_tests::init_tracing();
    let python = python_with_sdk().await;
    let names = ["alpha", "beta", "gamma"];
    let specs = names
        .iter()
        .enumerate()
        .map(|(i, p)| ProjectSpec::new(*p, format!("http://127.0.0.1:{}", 9101 + i)))
        .collect();
    let registry = Registry::from_projects(specs, Some("alpha")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        ServerOptions::new(registry, [9; 32]),
        async {
            let _ = stopped.await;
        },
    ));
    let projects: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let opts = SledOptions {
        latency: Duration::from_millis(300),
        ..SledOptions::default()
    };
    let fleet = Fleet::spawn(&format!("http://{addr}"), &projects, opts);
    // Let the sleds connect and report their tools.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/python_client.py");
    let run = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{addr}/mcp"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the Python client finished within 120 s")
        .expect("the Python client ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the Python SDK checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    fleet.shutdown().await;
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
