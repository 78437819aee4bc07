//! sled-sim
