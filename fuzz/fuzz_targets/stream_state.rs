//! A streaming loader's checkpoint as a user hands it back: state JSON (up to the first
//! 0 byte) checked against a fixed spec (`StreamState::check`: names, rehearsal policy and
//! capacity, the ledger's ranges and bound), and the rest as the rehearsal buffer file the
//! state names (`Rehearsal::read`). Properties: nothing panics, memory stays bounded
//! (ranges like [[0, 10^11]] are refused before anything is allocated), a ledger that
//! passes holds every id of its ranges and at most the loader's bound, a buffer
//! that reads back holds what the state says.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_stream::loader::ledger_capacity;
use sluice_stream::rehearsal::Rehearsal;
use sluice_stream::{StreamSpec, StreamState};

fn spec() -> &'static StreamSpec {
    static SPEC: OnceLock<StreamSpec> = OnceLock::new();
    SPEC.get_or_init(|| {
        let text = r#"{"url": "redis://127.0.0.1:1/", "stream": "s", "group": "job", "ops": [{"op": "decode"}, {"op": "center_crop", "size": 16}],
            "new_per_batch": 4, "rehearsal_per_batch": 2, "max_unacked": 4096,
            "rehearsal": {"capacity": 64, "policy": "class_balanced", "dir": "/nonexistent"}}"#;
        let spec: StreamSpec = serde_json::from_str(text).expect("the fixed spec parses");
        spec.validate().expect("the fixed spec is valid");
        spec
    })
}

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let (json, file) = (&data[..split], data.get(split + 1..).unwrap_or_default());
    let Ok(state) = serde_json::from_slice::<StreamState>(json) else { return };
    let spec = spec();
    let Ok(ledger) = state.check(spec) else { return };
    assert!(ledger.len() <= ledger_capacity(spec));
    let ids: u64 = state.ledger.ranges.iter().map(|(lo, hi)| hi - lo + 1).sum();
    assert_eq!(ledger.len() as u64, ids, "a ledger that passes holds every id of its ranges");
    if let Some(saved) = &state.rehearsal {
        if let Ok(buffer) = Rehearsal::read(file, saved, 0, 1 << 16) {
            assert_eq!(buffer.len(), saved.len);
            assert!(buffer.len() <= saved.capacity);
        }
    }
});
