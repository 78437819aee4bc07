//! The official Python MCP SDK (PyPI `mcp`), installed on first use into a virtualenv in
//! `target/clients/python/` from the package registry; later runs reuse it.
//!
//! Included by the test files that need it with `#[path = "support/python.rs"] mod python;`.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// The Python SDK version the checks were written against.
pub const PYTHON_SDK: &str = "mcp==2.3.0";

fn clients_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("clients")
}

/// A Python with the SDK installed, in a virtualenv of its own.
pub async fn python_with_sdk() -> PathBuf {
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

/// Runs the check script `tests/clients/<script>` with `args` under `python` (at most 120 s),
/// prints its output, and asserts it exited 0 after "N passed, 0 failed"; returns its stdout.
pub async fn run_checks(python: &Path, script: &str, args: &[&str]) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("clients")
        .join(script);
    let run = Command::new(python)
        .arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the Python client finished within 120 s")
        .expect("the Python client ran");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the Python SDK checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    stdout
}
