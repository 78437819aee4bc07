//! Reloading projects.toml: on SIGHUP, and when the file's contents change (checked every
//! two seconds). A file that does not parse is refused with its file:line:field error and the
//! registry in force stays; one that parses goes to the core, which adds and removes projects
//! without dropping sessions or healthy uplinks.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::driver::Command;

/// How often the file is read to see whether it changed.
const POLL: Duration = Duration::from_secs(2);

/// Watches `path` until the driver goes away. `loaded` is the text the gateway started with.
/// `[oauth]` of a new file goes to `oauth` at once, whether client authentication is on to
/// `metrics` (where `/metrics` is served), the rest to the core.
pub(crate) async fn watch(
    path: PathBuf,
    loaded: Option<String>,
    cmd: mpsc::Sender<Command>,
    oauth: std::sync::Arc<crate::oauth::ResourceServer>,
    metrics: std::sync::Arc<crate::ops::MetricsPlacement>,
    admission: std::sync::Arc<crate::admission::Admission>,
) {
    let mut last = loaded;
    let mut hup = crate::hangup::Hangup::new();
    loop {
        let forced = hup.next(POLL).await;
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(t) => t,
            Err(e) => {
                if forced {
                    tracing::error!(path = %path.display(), "cannot read projects.toml ({e}); the registry in force stays");
                }
                continue;
            }
        };
        if !forced && last.as_deref() == Some(text.as_str()) {
            continue;
        }
        let shown = path.display().to_string();
        match gateway_core::Registry::parse(&shown, &text) {
            Ok(registry) => {
                tracing::info!(path = %shown, projects = registry.len(), "projects.toml reloaded");
                oauth.reconfigure(registry.oauth());
                metrics.follow(&registry);
                admission.follow(&registry);
                if cmd.send(Command::Reload(Box::new(registry))).await.is_err() {
                    return;
                }
            }
            Err(e) => tracing::error!("projects.toml refused: {e}; the registry in force stays"),
        }
        last = Some(text);
        if cmd.is_closed() {
            return;
        }
    }
}
