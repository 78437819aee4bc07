//! The wait of the file watchers (`reload.rs` for projects.toml, `tls.rs` for the certificate):
//! until SIGHUP, or until the next poll of the files.

use std::time::Duration;

/// SIGHUP, where there is one.
pub(crate) struct Hangup {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    pub(crate) fn new() -> Hangup {
        Hangup {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    /// Waits for SIGHUP (`true`) or `poll` (`false`), whichever comes first.
    pub(crate) async fn next(&mut self, poll: Duration) -> bool {
        #[cfg(unix)]
        if let Some(h) = self.signal.as_mut() {
            return tokio::select! {
                _ = h.recv() => true,
                () = tokio::time::sleep(poll) => false,
            };
        }
        tokio::time::sleep(poll).await;
        false
    }
}
