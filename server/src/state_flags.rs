//! `gateway serve`'s state directory (issue 25): where a single gateway keeps what must
//! outlive it: its sessions and its coordination state, in the embedded store
//! `DIR/state.redb`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gateway_server::store::redb::RedbStore;

/// The directory's name beside `--config` when `--state-dir` is not given.
pub(crate) const DEFAULT_STATE_DIR: &str = "gateway-state";

/// Where a single gateway keeps its state (`gateway serve`).
#[derive(Debug, clap::Args)]
pub(crate) struct StateFlags {
    /// The state directory: sessions, leases, messages and the board are kept in
    /// DIR/state.redb (an embedded database, every change synced before it is confirmed), so
    /// a restart does not lose them. Made (mode 0700) when missing; one gateway at a time.
    /// Default: gateway-state in the directory of --config. Not with --cluster: replicas keep
    /// sessions in the cluster's NATS.
    #[arg(long = "state-dir", value_name = "DIR", conflicts_with = "cluster")]
    pub(crate) state_dir: Option<PathBuf>,
    /// Start with an empty state: the state file is moved aside first (to
    /// state.redb.reset-<seconds since 1970>, in the same directory; nothing is deleted). For a
    /// state file the gateway refuses to open, when losing what it held is meant.
    #[arg(long = "reset-state", conflicts_with = "cluster")]
    pub(crate) reset_state: bool,
}

impl StateFlags {
    /// `--state-dir`, else `gateway-state` beside `config`.
    pub(crate) fn dir(&self, config: &Path) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| config.with_file_name(DEFAULT_STATE_DIR))
    }
}

/// Opens the store in `dir` (after moving its file aside, with `reset`); the error names the
/// file and says why.
pub(crate) async fn open(dir: &Path, reset: bool) -> Result<Arc<RedbStore>, String> {
    let file = dir.join(gateway_server::store::redb::STATE_FILE);
    if reset && file.exists() {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let aside = file.with_extension(format!("redb.reset-{secs}"));
        std::fs::rename(&file, &aside)
            .map_err(|e| format!("--reset-state: cannot move {} aside: {e}", file.display()))?;
        tracing::warn!(
            file = %file.display(),
            moved_to = %aside.display(),
            "--reset-state: the state file was moved aside; starting with an empty state"
        );
    }
    let store = RedbStore::open(dir).await.map_err(|e| {
        format!("{e} (to start with an empty state instead, moving this file aside: --reset-state)")
    })?;
    tracing::info!(
        file = store.name(),
        "sessions and coordination state are kept in the state directory"
    );
    Ok(Arc::new(store))
}

/// The gateway secret's file in the state directory.
pub(crate) const SECRET_FILE: &str = "gateway.secret";

/// The single gateway's secret (where-the-issues-meet §1): 32 random bytes, kept as 64 hex
/// digits in `DIR/gateway.secret` (mode 0600), made on first start and kept from then on.
/// Subkeys derive from it (agent handles today), so what was signed under it before a restart
/// is recognised after it. A file that others may read, or that does not hold a secret, is
/// refused, naming the file. The secret is never logged: only its key id.
pub(crate) fn gateway_secret(dir: &Path) -> Result<gateway_core::keys::GatewaySecret, String> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = dir.join(SECRET_FILE);
    match std::fs::metadata(&path) {
        Ok(meta) => {
            let mode = meta.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(format!(
                    "{}: the gateway secret may be read by others (mode {:o}); make it the owner's alone: chmod 600 {}",
                    path.display(),
                    mode & 0o777,
                    path.display()
                ));
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("{}: cannot read the gateway secret: {e}", path.display()))?;
            let secret = gateway_core::keys::GatewaySecret::parse(&text)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            tracing::info!(file = %path.display(), key_id = %secret.key_id(), "gateway secret read");
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let secret = gateway_core::keys::GatewaySecret::new(rand::random());
            // Written whole, then synced, before it is used: a handle signed under it must
            // still verify after a crash.
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("{}: cannot make the gateway secret: {e}", path.display()))?;
            file.write_all(format!("{}\n", secret.to_hex()).as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("{}: cannot write the gateway secret: {e}", path.display()))?;
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
            tracing::info!(file = %path.display(), key_id = %secret.key_id(),
                "made a gateway secret (keep it with the state directory)");
            Ok(secret)
        }
        Err(e) => Err(format!(
            "{}: cannot read the gateway secret: {e}",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_secret_is_made_once_kept_private_and_refused_when_others_may_read_it() {
        let dir = std::env::temp_dir().join(format!("gateway-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let made = gateway_secret(&dir).unwrap();
        let path = dir.join(SECRET_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(gateway_secret(&dir).unwrap(), made, "kept across starts");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = gateway_secret(&dir).unwrap_err();
        assert!(refused.contains("chmod 600"), "{refused}");
        assert!(!refused.contains(&made.to_hex()), "the secret is not shown");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not a secret").unwrap();
        let refused = gateway_secret(&dir).unwrap_err();
        assert!(refused.contains("gateway.secret"), "{refused}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
