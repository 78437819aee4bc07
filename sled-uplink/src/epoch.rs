//! The sled's epoch fence (issue 15): in a cluster, the replica that welcomes an uplink sends
//! the epoch of its claim on the project ([`gateway_core::uplink::Control::Welcome`]'s
//! `epoch`), and the sled serves calls only on the uplink welcomed with the highest epoch it
//! has seen, so a replica that lost its claim cannot act for the project even if it still
//! believes it owns it.
//!
//! An [`EpochFence`] is that high-water mark. One lives for the life of an uplink loop
//! ([`crate::uplink::run_uplink_with`]: it survives reconnects, and every hello reports it as
//! `epoch_seen`); uplink loops that share one ([`crate::uplink::run_uplink_fenced`]) are one
//! sled with several connections: a welcome with a higher epoch on one closes the others with
//! [`gateway_core::uplink::CloseCode::Superseded`]. A welcome without an epoch (a gateway not
//! in a cluster) neither reads nor moves the fence.

use std::sync::Arc;

use tokio::sync::watch;

/// The highest epoch a sled has been welcomed with; cheap to clone (one fence).
#[derive(Debug, Clone)]
pub struct EpochFence {
    newest: Arc<watch::Sender<Option<u64>>>,
}

impl Default for EpochFence {
    fn default() -> Self {
        EpochFence {
            newest: Arc::new(watch::channel(None).0),
        }
    }
}

impl EpochFence {
    /// The highest epoch accepted, for the hello's `epoch_seen`; `None` before any.
    pub fn seen(&self) -> Option<u64> {
        *self.newest.borrow()
    }

    /// A welcome with `epoch`: accepted (and now the newest) when it is above every epoch seen
    /// before; refused (a stale claim) when it is not.
    pub fn welcome(&self, epoch: u64) -> bool {
        self.newest.send_if_modified(|newest| {
            let newer = newest.is_none_or(|n| epoch > n);
            if newer {
                *newest = Some(epoch);
            }
            newer
        })
    }

    /// Whether an uplink welcomed with `epoch` may still serve calls.
    pub fn is_newest(&self, epoch: u64) -> bool {
        self.seen() == Some(epoch)
    }

    /// Sees each newer epoch as it is accepted.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<u64>> {
        self.newest.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_higher_epoch_is_accepted_and_it_supersedes_the_rest() {
        let fence = EpochFence::default();
        assert_eq!(fence.seen(), None);
        assert!(!fence.is_newest(1));
        let mut changes = fence.subscribe();
        assert!(fence.welcome(5));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        assert!(fence.is_newest(5));
        assert!(!fence.welcome(5), "an epoch is welcomed once");
        assert!(!fence.welcome(4), "epochs never go back");
        assert!(!changes.has_changed().unwrap());
        let other = fence.clone();
        assert!(other.welcome(9));
        assert!(!fence.is_newest(5));
        assert!(fence.is_newest(9));
        assert_eq!(fence.seen(), Some(9));
    }
}
