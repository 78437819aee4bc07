//! The fleet: sled identity pins (story 1206), health (heartbeats, HTTP probes of projects
//! without an uplink, relay staleness) and the fan-out of `aggregate_pipeline_status`.
//!
//! Everything here is a decision on the `now` it is given: the driver carries out
//! [`Output::Probe`] and [`Output::SavePins`], and reports probes back with
//! [`Input::ProbeDone`].

//! By concern: `pins.rs` (identity challenges, pins, `fleet_identity`), `health.rs` (relay events,
//! HTTP probes, `gateway_health`), `pipeline.rs` (the `aggregate_pipeline_status` fan-out).
use std::collections::BTreeMap;

use super::*;
use crate::identity::{Pin, Pins};

mod health;
mod pins;
mod pipeline;

pub(super) use pins::Identity;
pub(super) use pipeline::{Fanout, PIPELINE_TOOL};

/// A refused identity: the latest attempt for a project, kept for `fleet_identity`.
#[derive(Debug, Clone)]
pub(super) struct Refusal {
    /// The key presented (None: none was).
    pub(super) key: Option<String>,
    pub(super) sled: String,
    pub(super) reason: String,
    pub(super) at: Instant,
    /// Attempts in a row with this key.
    pub(super) attempts: u64,
}

/// A finished HTTP probe.
#[derive(Debug, Clone)]
pub(super) struct ProbeRecord {
    pub(super) at: Instant,
    pub(super) took: Duration,
    pub(super) outcome: ProbeOutcome,
}

impl ProbeRecord {
    /// An HTTP answer below 500 means the project's server is there.
    fn ok(&self) -> bool {
        matches!(self.outcome, ProbeOutcome::Status(s) if s < 500)
    }
}

/// What the gateway knows of a project's health beyond its uplink.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// When its current uplink went live.
    pub(super) connected_at: Option<Instant>,
    /// The last frame from its last uplink, kept when the uplink goes.
    pub(super) last_seen: Option<Instant>,
    /// The newest relay event.
    pub(super) last_event: Option<Instant>,
    pub(super) last_event_kind: Option<String>,
    pub(super) events: u64,
    /// A probe in flight.
    pub(super) probing: Option<ProbeId>,
    /// The last probe since the project last lost its uplink.
    pub(super) probe: Option<ProbeRecord>,
    /// The latest refused identity.
    pub(super) refused: Option<Refusal>,
}

/// An HTTP probe in flight.
#[derive(Debug)]
pub(super) struct Probe {
    project: String,
    sent: Instant,
    deadline: Instant,
}

/// Whole milliseconds, for JSON.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
