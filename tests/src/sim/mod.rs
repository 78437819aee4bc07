//! The deterministic simulation harness (see tests/tests/simulation.rs).
