//! The fleet: sled identity pins, health (heartbeats, HTTP probes, relay staleness) and the
//! fan-out of `aggregate_pipeline_status`.

use super::*;
use crate::identity::Pins;

impl Gateway {
    /// Loads the pins kept from an earlier run (the pin file). Call before the first event.
    pub fn load_pins(&mut self, pins: Pins) {
        self.pins = pins;
    }

    pub(super) fn on_probe_done(&mut self, _now: Instant, _probe: ProbeId, _outcome: ProbeOutcome) {}
}
