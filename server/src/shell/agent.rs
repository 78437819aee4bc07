//! The shell's agent identity: the handle `checkin` issues to a caller without a session,
//! kept in a file so that `gateway claim` in one command and `gateway release` in the next are
//! the same holder.
//!
//! The file is `$MCP_GATEWAY_AGENT_FILE`, else `$XDG_STATE_HOME/mcp-gateway/agent-<hash of the
//! URL>`, else `~/.local/state/mcp-gateway/agent-<hash>`: one identity per gateway URL. It is
//! JSON (`{"url", "agent", "handle"}`), readable only by its owner (the handle lets anyone
//! write as the agent); deleting it starts a new identity. The first command that needs an
//! agent checks in (in the command's project) and writes it; a gateway that answers
//! `unknown_agent` (it restarted: handles live as long as the gateway) gets a new one the same
//! way, and the command is repeated once, so the user never sees it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{Conn, Failure, AGENT_FILE_ENV};

/// The `params._meta` key that names a sessionless caller's agent on a project tool call (the
/// gateway's `io.mcp-gateway/agent`, removed before the call reaches the sled).
const AGENT_META: &str = "io.mcp-gateway/agent";

/// The identity file for `url`, and the phrase that says what chose it.
pub(crate) fn default_path(url: &str, env: &dyn Fn(&str) -> Option<String>) -> (PathBuf, String) {
    if let Some(f) = env(AGENT_FILE_ENV) {
        return (PathBuf::from(f), format!("from {AGENT_FILE_ENV}"));
    }
    let file = format!("agent-{}", url_hash(url));
    if let Some(state) = env("XDG_STATE_HOME") {
        let dir = PathBuf::from(state).join("mcp-gateway");
        return (
            dir.join(file),
            format!("in $XDG_STATE_HOME; {AGENT_FILE_ENV} or --agent-file sets another"),
        );
    }
    match env("HOME") {
        Some(home) => (
            PathBuf::from(home)
                .join(".local/state/mcp-gateway")
                .join(file),
            format!("in ~/.local/state; {AGENT_FILE_ENV} or --agent-file sets another"),
        ),
        None => (
            PathBuf::from(format!(".mcp-gateway-{file}")),
            format!("no HOME: in the current directory; set {AGENT_FILE_ENV}"),
        ),
    }
}

/// FNV-1a (64 bits) of the URL in hex: stable across builds and platforms, unlike std's
/// hasher, so the same URL always finds its file.
fn url_hash(url: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in url.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// An agent identity as kept in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The secret handle, passed back as `agent`.
    pub(crate) handle: String,
    /// The public name (`agent-N`) others see.
    pub(crate) agent: String,
}

/// The identity in `path`, if there is a readable one (a damaged file is as good as none: the
/// next command makes a new identity and replaces it).
pub(crate) fn load(path: &Path) -> Option<Identity> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(Identity {
        handle: v["handle"].as_str().filter(|h| !h.is_empty())?.to_owned(),
        agent: v["agent"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Writes the identity to `path` (its directory made if needed; a `.tmp` beside it renamed
/// over it, so a reader never sees half a file), readable only by its owner.
fn save(path: &Path, url: &str, id: &Identity) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let text = json!({ "url": url, "agent": id.agent, "handle": id.handle });
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(&tmp)?;
    writeln!(f, "{text}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The project a command acts in, to check in there when it needs a new identity: its
/// `project`, else the first of its `projects`.
pub(crate) fn project_hint(args: &Map<String, Value>) -> Option<String> {
    args.get("project")
        .and_then(Value::as_str)
        .or_else(|| args.get("projects")?.get(0)?.as_str())
        .map(str::to_owned)
}

fn is_unknown_agent(f: &Failure) -> bool {
    f.kind() == Some("unknown_agent")
}

/// Keeps the identity a `checkin` without `agent` answered with.
fn adopt(conn: &Conn, checkin: &Value) -> Result<Identity, Failure> {
    let s = &conn.settings;
    let Some(handle) = checkin["handle"].as_str() else {
        return Err(Failure::Transport(format!(
            "{} ({}) issued no agent handle at checkin: {checkin}",
            s.url, s.url_from
        )));
    };
    let id = Identity {
        handle: handle.to_owned(),
        agent: checkin["agent"].as_str().unwrap_or_default().to_owned(),
    };
    save(&s.agent_file, &s.url, &id).map_err(|e| {
        Failure::Transport(format!(
            "cannot keep the agent identity in {} ({}): {e}",
            s.agent_file.display(),
            s.agent_file_from
        ))
    })?;
    eprintln!(
        "gateway: checked in as {} at {}; the identity is kept in {}",
        id.agent,
        s.url,
        s.agent_file.display()
    );
    Ok(id)
}

/// A new identity: `checkin` without `agent` (in `project`, else the gateway's default one).
pub(crate) async fn new_agent(conn: &mut Conn, project: Option<&str>) -> Result<Identity, Failure> {
    let mut args = Map::new();
    if let Some(p) = project {
        args.insert("project".into(), json!(p));
    }
    let answer = conn.call("checkin", &args, None, None).await?;
    adopt(conn, &answer)
}

/// The file's identity, or a new one.
pub(crate) async fn identity(conn: &mut Conn, project: Option<&str>) -> Result<Identity, Failure> {
    match load(&conn.settings.agent_file) {
        Some(id) => Ok(id),
        None => new_agent(conn, project).await,
    }
}

/// `gateway checkin …`: as the file's agent; a first one (or one the gateway no longer knows)
/// makes the identity with this very call.
pub(crate) async fn checkin(
    conn: &mut Conn,
    mut args: Map<String, Value>,
) -> Result<Value, Failure> {
    if let Some(id) = load(&conn.settings.agent_file) {
        args.insert("agent".into(), json!(id.handle));
        match conn.call("checkin", &args, None, None).await {
            Err(f) if is_unknown_agent(&f) => {}
            answer => return answer,
        }
        args.remove("agent");
    }
    let answer = conn.call("checkin", &args, None, None).await?;
    adopt(conn, &answer)?;
    Ok(answer)
}

/// A coordination tool as the file's agent (made first if needed; made anew and the call
/// repeated once if the gateway does not know it).
pub(crate) async fn call_as_agent(
    conn: &mut Conn,
    tool: &str,
    mut args: Map<String, Value>,
    project: Option<&str>,
    timeout: Option<Duration>,
) -> Result<Value, Failure> {
    let id = identity(conn, project).await?;
    args.insert("agent".into(), json!(id.handle));
    match conn.call(tool, &args, None, timeout).await {
        Err(f) if is_unknown_agent(&f) => {
            let id = new_agent(conn, project).await?;
            args.insert("agent".into(), json!(id.handle));
            conn.call(tool, &args, None, timeout).await
        }
        answer => answer,
    }
}

/// A project tool, as the file's agent when there is one (so a lease it holds lets its writes
/// through, fenced); without an identity the call is anonymous and none is made for it.
pub(crate) async fn call_project_tool(
    conn: &mut Conn,
    tool: &str,
    args: Map<String, Value>,
    project: Option<&str>,
) -> Result<Value, Failure> {
    let Some(id) = load(&conn.settings.agent_file) else {
        return conn.call(tool, &args, None, None).await;
    };
    let meta = |h: &str| json!({ AGENT_META: h });
    match conn.call(tool, &args, Some(meta(&id.handle)), None).await {
        Err(f) if is_unknown_agent(&f) => {
            let id = new_agent(conn, project).await?;
            conn.call(tool, &args, Some(meta(&id.handle)), None).await
        }
        answer => answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_chosen_by_env_then_xdg_then_home() {
        let url = "http://127.0.0.1:7878/mcp";
        let env = |k: &str| match k {
            AGENT_FILE_ENV => Some("/x/agent".to_owned()),
            "XDG_STATE_HOME" => Some("/state".to_owned()),
            "HOME" => Some("/home/u".to_owned()),
            _ => None,
        };
        assert_eq!(default_path(url, &env).0, PathBuf::from("/x/agent"));
        let env = |k: &str| match k {
            "XDG_STATE_HOME" => Some("/state".to_owned()),
            "HOME" => Some("/home/u".to_owned()),
            _ => None,
        };
        let (p, _) = default_path(url, &env);
        assert_eq!(
            p,
            PathBuf::from(format!("/state/mcp-gateway/agent-{}", url_hash(url)))
        );
        let env = |k: &str| (k == "HOME").then(|| "/home/u".to_owned());
        let (p, _) = default_path(url, &env);
        assert!(p.starts_with("/home/u/.local/state/mcp-gateway"), "{p:?}");
        assert_ne!(url_hash(url), url_hash("http://127.0.0.1:7879/mcp"));
        assert_eq!(url_hash(""), "cbf29ce484222325");
    }

    #[test]
    fn an_identity_round_trips_through_its_file() {
        let dir = std::env::temp_dir().join(format!("gateway-agent-test-{}", std::process::id()));
        let path = dir.join("sub/agent");
        let id = Identity {
            handle: "ah-0123".into(),
            agent: "agent-7".into(),
        };
        save(&path, "http://h:1/mcp", &id).unwrap();
        assert_eq!(load(&path), Some(id));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(load(&path), None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
