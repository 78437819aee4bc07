//! Where a call names the resources it writes (`gateway_core::lease_spot`): a tool's listing
//! comes from a sled, a call's arguments from a client and a call's fences from the gateway,
//! all arbitrary here. Nothing may panic; a call names at most `MAX_LEASED_RESOURCES`
//! resources, each once and each of the spot's kind; a spot marked in a listing is found
//! there again (behind `$ref`s and compositions too); fences read back are distinct and as many as the limit allows.
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use gateway_core::lease_spot::{fences_from_meta, LeaseSpot, MAX_LEASED_RESOURCES};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[derive(Arbitrary, Debug)]
struct Input {
    /// A tool as a sled lists it (JSON text).
    tool: String,
    /// A path and kind as gateway-sled's config writes them.
    path: String,
    kind: String,
    /// A call's argument at the spot (JSON text).
    argument: String,
    /// A call's `_meta` (JSON text).
    meta: String,
}

fuzz_target!(|input: Input| {
    let tool: Option<Value> = serde_json::from_str(&input.tool).ok();
    let argument: Option<Value> = serde_json::from_str(&input.argument).ok();
    let mut spots: Vec<LeaseSpot> = Vec::new();
    if let Some(t) = &tool {
        spots.extend(LeaseSpot::in_tool(t));
    }
    if let Ok(spot) = LeaseSpot::parse(&input.path, &input.kind) {
        // What the connector writes, the gateway reads: printed, it parses back the same.
        assert_eq!(LeaseSpot::parse(&spot.to_string(), &spot.kind), Ok(spot.clone()));
        if let Some(mut t) = tool.clone() {
            let unmarked = LeaseSpot::in_tool(&t).is_none();
            if spot.mark(&mut t) && unmarked {
                // Found (a definition shared through `$ref` may be found by another argument
                // that names it first).
                let found = LeaseSpot::in_tool(&t);
                assert!(found.is_some_and(|f| f.kind == spot.kind), "marked, then not found");
            }
        }
        spots.push(spot);
    }
    for spot in &spots {
        if let Ok(resources) = spot.resources(argument.as_ref()) {
            assert!(resources.len() <= MAX_LEASED_RESOURCES);
            let distinct: BTreeSet<&String> = resources.iter().collect();
            assert_eq!(distinct.len(), resources.len(), "a resource named twice");
            let prefix = format!("{}:", spot.kind);
            assert!(resources.iter().all(|r| r.starts_with(&prefix)));
        }
    }
    let meta: Option<serde_json::Map<String, Value>> = serde_json::from_str(&input.meta).ok();
    if let Ok(fences) = fences_from_meta(meta.as_ref()) {
        assert!(fences.len() <= MAX_LEASED_RESOURCES);
        let distinct: BTreeSet<&String> = fences.iter().map(|(r, _)| r).collect();
        assert_eq!(distinct.len(), fences.len());
    }
});
