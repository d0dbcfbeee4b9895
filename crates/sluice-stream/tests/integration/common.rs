//! What the streaming tests share: a small generated dataset pushed into a stream, and
//! specs; the `redis-server`, the watchdog and the checks come from `sluice-testing`.

#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use sluice_core::{Manifest, OpSpec, Size, SourceSpec};
use sluice_stream::{PushOptions, PushOrder, RateSpec, RehearsalPolicy, RehearsalSpec, StreamSpec};
pub use sluice_testing::assert_each_once as assert_exactly_once;
pub use sluice_testing::net::free_addr;
pub use sluice_testing::process::die_with_parent;
pub use sluice_testing::redis::Redis;
pub use sluice_testing::watchdog::watchdog;

/// `images` small (32×24) JPEGs in `classes` classes, enumerated. Small, so that a test
/// spends its time streaming, not making and decoding images (in a debug build).
pub fn dataset(dir: &Path, images: usize, classes: usize) -> Manifest {
    let root = dir.join("data");
    for i in 0..images {
        let class_dir = root.join(format!("class_{:03}", i % classes));
        std::fs::create_dir_all(&class_dir).unwrap();
        let rgb: Vec<u8> = (0..32 * 24 * 3).map(|p| (p * 7 + i * 13 + (i % classes) * 50) as u8).collect();
        let jpeg = sluice_codec::encode_jpeg(&rgb, 32, 24, 85).unwrap();
        std::fs::write(class_dir.join(format!("img_{i:07}.jpg")), jpeg).unwrap();
    }
    sluice_pipeline::source::build_manifest(&SourceSpec::ImageFolder { root }).unwrap()
}

pub fn push_options(url: &str, stream: &str, rate: f64) -> PushOptions {
    PushOptions {
        url: url.to_string(),
        stream: stream.to_string(),
        rate,
        order: PushOrder::ClassIncremental,
        classes_per_task: 2,
        seed: 1,
        limit: None,
        end: true,
        reconnect_ms: 20_000,
    }
}

pub fn stream_spec(url: &str, stream: &str, group: &str, r: usize, b: usize, dir: Option<&Path>) -> StreamSpec {
    StreamSpec {
        url: url.to_string(),
        stream: stream.to_string(),
        group: group.to_string(),
        consumer: "learner-0".into(),
        ops: vec![
            OpSpec::Decode,
            OpSpec::resize(20),
            OpSpec::CenterCrop { size: Size::square(16) },
            OpSpec::RandomHorizontalFlip { p: 0.5 },
        ],
        new_per_batch: r,
        rehearsal_per_batch: b,
        rehearsal: dir.map(|d| RehearsalSpec {
            capacity: 16,
            policy: RehearsalPolicy::Reservoir,
            dir: d.to_path_buf(),
            peers: Vec::new(),
            rank: 0,
            token: None,
            persist: false,
        }),
        rate: RateSpec::default(),
        seed: 7,
        threads: 1.into(),
        on_error: Default::default(),
        limits: Default::default(),
        claim_idle_ms: 30_000,
        max_unacked: 65_536,
        reconnect_ms: 20_000,
    }
}
