//! `gateway serve`'s state directory (issue 25): where a single gateway keeps what must
//! outlive it. In this version, its sessions, in the embedded store `DIR/state.redb`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gateway_server::store::redb::RedbStore;

/// The directory's name beside `--config` when `--state-dir` is not given.
pub(crate) const DEFAULT_STATE_DIR: &str = "gateway-state";

/// Where a single gateway keeps its state (`gateway serve`).
#[derive(Debug, clap::Args)]
pub(crate) struct StateFlags {
    /// The state directory: sessions are kept in DIR/state.redb (an embedded database, every
    /// change synced before it is confirmed), so a restart does not end them. Made (mode 0700)
    /// when missing; one gateway at a time. Default: gateway-state in the directory of
    /// --config. Not with --cluster: replicas keep sessions in the cluster's NATS.
    #[arg(long = "state-dir", value_name = "DIR", conflicts_with = "cluster")]
    pub(crate) state_dir: Option<PathBuf>,
}

impl StateFlags {
    /// `--state-dir`, else `gateway-state` beside `config`.
    pub(crate) fn dir(&self, config: &Path) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| config.with_file_name(DEFAULT_STATE_DIR))
    }
}

/// Opens the store in `dir`; the error names the file and says why.
pub(crate) async fn open(dir: &Path) -> Result<Arc<RedbStore>, String> {
    let store = RedbStore::open(dir).await.map_err(|e| e.to_string())?;
    tracing::info!(
        file = store.name(),
        "sessions are kept in the state directory"
    );
    Ok(Arc::new(store))
}
