//! Shared helpers for the black-box tests (`tests/tests/e2e.rs`) and the deterministic
//! simulation (`tests/tests/simulation.rs`).

pub mod sim;
