//! The official Python MCP SDK (PyPI `mcp`), installed on first use into a virtualenv in
//! `target/clients/python/` from the package registry; later runs reuse it.
//!
//! Included by the test files that need it with `#[path = "support/python.rs"] mod python;`.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

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
