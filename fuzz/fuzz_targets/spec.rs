//! Spec text (TOML or JSON) → `PipelineSpec` → `validate` → a codec `Plan`, run on a small
//! image when its output is small. Properties: nothing panics; a spec that validates has a
//! countable batch within the bound, serialises and parses back to itself (the service
//! ships specs as JSON), and its plan runs on a real image or refuses it for its size.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_codec::{encode_jpeg, CodecError, Plan, Scratch};
use sluice_core::spec::MAX_BATCH_BYTES;
use sluice_core::{OpSpec, PipelineSpec, SampleKey, SampleRng};

fn image() -> &'static [u8] {
    static JPEG: OnceLock<Vec<u8>> = OnceLock::new();
    JPEG.get_or_init(|| {
        let rgb: Vec<u8> = (0..64 * 48 * 3).map(|i| (i * 7 % 251) as u8).collect();
        encode_jpeg(&rgb, 64, 48, 90).expect("encoding the fixture")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for parsed in [PipelineSpec::from_toml_str(text), PipelineSpec::from_json_str(text)] {
        if let Ok(spec) = parsed {
            check(&spec);
        }
    }
});

fn check(spec: &PipelineSpec) {
    let json = spec.to_json_string().expect("a valid spec serialises to JSON");
    let back = PipelineSpec::from_json_str(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    assert_eq!(&back, spec, "JSON round trip changed the spec:\n{json}");
    // TOML cannot hold every value (u64 past i64::MAX); what it writes must read back.
    if let Ok(toml) = spec.to_toml_string() {
        let back = PipelineSpec::from_toml_str(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        assert_eq!(&back, spec, "TOML round trip changed the spec:\n{toml}");
    }

    let bytes = spec.batch_bytes().expect("a valid spec's batch bytes are countable");
    assert!(bytes <= MAX_BATCH_BYTES);
    let plan = Plan::compile(&spec.ops, spec.limits);
    assert!(plan.output_bytes() > 0);
    assert_eq!(plan.output_bytes() as u64 * spec.batch.size as u64, bytes);

    let small_resizes = spec.ops.iter().all(|op| !matches!(op, OpSpec::Resize { size, .. } if *size > 1024));
    if plan.output_bytes() > 1 << 20 || !small_resizes {
        return; // valid, but too slow to run on every input
    }
    let mut scratch = Scratch::new();
    let mut out = vec![0u8; plan.output_bytes()];
    let mut rng = SampleRng::new(spec.seed, 0, SampleKey(1), 0);
    let full = plan.run(image(), &mut rng, &mut scratch, &mut out, &mut []);
    let split = plan
        .run_deterministic_prefix(image(), &mut scratch, &mut [], None, None)
        .and_then(|cached| plan.run_from_image(&cached, &mut rng, &mut scratch, &mut out, &mut [], None, None));
    for result in [full, split] {
        match result {
            // A `map` op's function is registered by the program that runs the spec.
            Ok(()) | Err(CodecError::TooLarge { .. } | CodecError::ResizeTooLarge { .. } | CodecError::UnknownUserOp(_)) => {}
            Err(e) => panic!("a valid plan failed on a valid image: {e}\n{json}"),
        }
    }
}
