//! Any text given as projects.toml is parsed or refused with a located error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    match gateway_core::Registry::parse("fuzz.toml", text) {
        Ok(r) => {
            for p in r.projects() {
                assert!(r.get(&p.name).is_some());
            }
        }
        Err(e) => {
            assert!(e.line >= 1 && e.column >= 1);
            let _ = e.to_string();
        }
    }
});
