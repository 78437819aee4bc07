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
