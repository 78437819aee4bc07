//! Task ids (`gateway_core::tasks`): any text a client sends as a `taskId` is opened for any
//! caller. Nothing may panic; an id made for a creator opens for that creator alone, naming
//! what it was made for; any other text opens only if it is exactly an id made for that caller
//! (never here, with a fresh key per run), and records read back from a store never panic.
#![no_main]

use arbitrary::Arbitrary;
use gateway_core::coord::StoredRecord;
use gateway_core::tasks::{Creator, Sealed, TaskKey, Tasks};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    text: String,
    project: String,
    sled_id: String,
    write: bool,
    owner: Option<String>,
    session: Option<String>,
    other_owner: Option<String>,
    other_session: Option<String>,
    key: [u8; 32],
    stored_key: String,
    stored_value: Vec<u8>,
    age_ms: u32,
}

fuzz_target!(|input: Input| {
    let mut tasks = Tasks::new(TaskKey::new([1, 2, 3, 4], input.key), None);
    let creator = Creator {
        owner: input.owner.map(String::into_boxed_str),
        session: input.session.map(String::into_boxed_str),
    };
    let other = Creator {
        owner: input.other_owner.map(String::into_boxed_str),
        session: input.other_session.map(String::into_boxed_str),
    };
    // Arbitrary text opens for nobody (a forgery would need the key).
    assert_eq!(tasks.open(&input.text, &creator), None);
    let sealed = Sealed {
        project: input.project,
        sled_id: input.sled_id,
        right: if input.write { "w" } else { "r" },
    };
    let id = tasks.seal(&sealed, &creator);
    if id.len() <= 1024 {
        assert_eq!(tasks.open(&id, &creator), Some(sealed.clone()));
    }
    if other != creator {
        assert_eq!(tasks.open(&id, &other), None);
    }
    // Whatever a store gives back.
    let now = std::time::Instant::now();
    tasks.restore(
        now,
        vec![StoredRecord {
            key: input.stored_key,
            value: input.stored_value,
            age: std::time::Duration::from_millis(u64::from(input.age_ms)),
        }],
    );
    let _ = tasks.take_changes(now);
});
