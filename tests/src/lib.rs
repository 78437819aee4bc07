//! Shared helpers for the black-box tests (`tests/tests/e2e.rs`) and the deterministic
//! simulation (`tests/tests/simulation.rs`).

pub mod sim;

/// Logs to the test's captured output, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}
