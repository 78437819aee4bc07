//! Child processes (gateway, sled-sim, nginx) that are always stopped, and what /proc says
//! about them.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process that is stopped when this is dropped: SIGTERM, up to `grace` to exit (a
/// gateway under callgrind needs a while to write its profile), then SIGKILL.
pub(crate) struct Proc {
    pub(crate) name: String,
    child: Child,
    grace: Duration,
}

impl Proc {
    /// Starts `argv` with stdout discarded and stderr to `log`.
    pub(crate) fn spawn(
        name: &str,
        argv: &[String],
        log: &Path,
        env: &[(&str, &str)],
        grace: Duration,
    ) -> Result<Proc, String> {
        let (prog, args) = argv.split_first().ok_or("empty command")?;
        let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name} ({prog}): {e}"))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
            grace,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`, and waits for it to be gone.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Fails if the process has already exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited: {status}", self.name)),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let until = Instant::now() + self.grace;
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory removed on drop (unless asked to keep it).
pub(crate) struct TempDir {
    pub(crate) path: PathBuf,
    pub(crate) keep: bool,
}

impl TempDir {
    pub(crate) fn new(keep: bool) -> Result<TempDir, String> {
        let path = std::env::temp_dir().join(format!("gateway-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(TempDir { path, keep })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A loopback port nobody listens on right now.
pub(crate) fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// A base port P such that P..P+n are all free on loopback.
pub(crate) fn free_port_range(n: u16) -> Result<u16, String> {
    let start = 20_000 + (std::process::id() % 200) as u16 * 100;
    let mut base = start;
    while base.checked_add(n).is_some_and(|end| end < 60_000) {
        let all: Vec<_> = (0..n)
            .map_while(|i| TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if all.len() == usize::from(n) {
            return Ok(base);
        }
        base += n + 7;
    }
    Err(format!("no {n} consecutive free ports"))
}

/// Waits until something accepts connections on `addr`.
pub(crate) fn wait_listening(addr: SocketAddr, limit: Duration) -> Result<(), String> {
    let until = Instant::now() + limit;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!("nothing listens on {addr} after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn clk_tck() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// (ppid, user + system CPU seconds) of a process, from /proc/<pid>/stat.
fn stat(pid: &str) -> Option<(u32, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state(0) ppid(1) ... utime(11) stime(12).
    let ppid = f.get(1)?.parse().ok()?;
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some((ppid, ticks / clk_tck()))
}

/// CPU seconds used so far by `pid` (all its threads).
pub(crate) fn cpu_secs(pid: u32) -> f64 {
    stat(&pid.to_string()).map_or(0.0, |(_, s)| s)
}

/// CPU seconds of this process.
pub(crate) fn self_cpu_secs() -> f64 {
    stat("self").map_or(0.0, |(_, s)| s)
}

/// CPU seconds used by `pid` and its direct children (nginx's master and workers).
pub(crate) fn cpu_secs_tree(pid: u32) -> f64 {
    let mut total = cpu_secs(pid);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            if let Some((ppid, secs)) = stat(name) {
                if ppid == pid {
                    total += secs;
                }
            }
        }
    }
    total
}

/// Context switches (voluntary and involuntary) of every thread of `pid` so far, from
/// /proc/<pid>/task/*/status (threads that have exited are not counted).
pub(crate) fn ctx_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    let mut total = 0;
    for t in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        total += text
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

/// A `Vm*` field of /proc/<pid>/status, in KiB.
pub(crate) fn vm_kib(pid: u32, field: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
