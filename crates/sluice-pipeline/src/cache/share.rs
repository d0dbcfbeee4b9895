//! The key under which cached entries are shared: by the disk tier's folder, by a
//! service worker's jobs, by the loaders of one process. Two pipelines with the same key
//! put the same bytes in an entry of a given sample, whatever else differs between them
//! (seed, sampling order, batch size, the random ops after the cache seam), so their
//! loaders may fill and read one cache: an ensemble or a hyper-parameter search decodes
//! each sample once (Cachew reuses preprocessed data "within and across jobs").

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;
use serde_json::{json, Value};
use sluice_core::{Manifest, PipelineSpec, SourceSpec};
use xxhash_rust::xxh3::Xxh3;

use super::Cache;

/// This process's caches of `cache.share` pipelines, by [`share_key`]: held by their
/// loaders, gone with the last of them.
static IN_PROCESS: LazyLock<Mutex<HashMap<u64, Weak<Cache>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The cache of this process's live loaders with `key`, or a new one from `make`, kept
/// for the loaders with `key` made while one of them lives.
pub fn shared_in_process<E>(key: u64, make: impl FnOnce() -> Result<Arc<Cache>, E>) -> Result<Arc<Cache>, E> {
    let mut caches = IN_PROCESS.lock();
    caches.retain(|_, c| c.strong_count() > 0);
    if let Some(cache) = caches.get(&key).and_then(Weak::upgrade) {
        tracing::info!(key = format!("{key:016x}"), "loader shares the cache of an earlier loader in this process");
        return Ok(cache);
    }
    let cache = make()?;
    caches.insert(key, Arc::downgrade(&cache));
    Ok(cache)
}

/// Everything that decides what a cache entry of a sample holds: the dataset (the
/// manifest's fingerprint), the source's record options (sidecars, masks, columns: a
/// pipeline reading masks never gets an entry cached without them), the decode limits
/// (a sample one pipeline rejects must not be served to it from another's entry), the
/// deterministic ops (those before the first random one, the cache seam) and the cache
/// level and resize. Not in it: seed, sampling, batch, threads, prefetch, the random ops
/// and whatever follows them, the cache's budget and policy.
pub fn share_key(spec: &PipelineSpec, manifest: &Manifest) -> u64 {
    let mut h = Xxh3::new();
    h.update(b"sluice cache share key v2");
    h.update(&manifest.fingerprint.to_le_bytes());
    h.update(record_options(&spec.source).to_string().as_bytes());
    h.update(serde_json::to_string(&spec.limits).unwrap_or_default().as_bytes());
    let det = spec.first_random_op().unwrap_or(spec.ops.len());
    h.update(serde_json::to_string(&spec.ops[..det]).unwrap_or_default().as_bytes());
    if let Some(c) = &spec.cache {
        h.update(serde_json::to_string(&(c.level, c.resize)).unwrap_or_default().as_bytes());
    }
    h.digest()
}

/// The source's options that change what a record holds, without its paths (the
/// manifest's fingerprint stands for the data). Every variant is named, so a new source
/// kind has to say what its options are.
fn record_options(source: &SourceSpec) -> Value {
    match source {
        SourceSpec::ImageFolder { root: _ } => json!({"kind": "image_folder"}),
        SourceSpec::FileList { path: _, root: _ } => json!({"kind": "file_list"}),
        SourceSpec::Tar { shards: _, sidecars, masks } => json!({"kind": "tar", "sidecars": sidecars, "masks": masks}),
        SourceSpec::Mix { sources } => {
            json!({"kind": "mix", "sources": sources.iter().map(|m| record_options(&m.source)).collect::<Vec<_>>()})
        }
        SourceSpec::Parquet { path: _, image_column, label_column } => {
            json!({"kind": "parquet", "image_column": image_column, "label_column": label_column})
        }
        SourceSpec::Coco { annotations: _, images: _, masks } => json!({"kind": "coco", "masks": masks}),
        SourceSpec::Sidecar { root: _, masks } => json!({"kind": "sidecar", "masks": masks}),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::PathBuf;

    use sluice_core::{ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, OpSpec};

    use super::*;

    fn base(source: SourceSpec) -> PipelineSpec {
        let mut s = PipelineSpec::train_default(source, 32, 4);
        s.cache = Some(CacheSpec {
            budget: ByteBudget::Bytes(1 << 20),
            level: CacheLevel::Decoded,
            resize: None,
            policy: CachePolicyKind::Lru,
            disk: None,
            share: false,
        });
        s
    }

    fn tar(sidecars: bool, masks: bool) -> SourceSpec {
        SourceSpec::Tar { shards: vec![PathBuf::from("a.tar")], sidecars, masks }
    }

    #[test]
    fn seed_batch_sampling_random_ops_and_budget_do_not_change_the_key() {
        let m = Manifest::new(PathBuf::from("d"), Vec::new(), Vec::new());
        let a = base(tar(false, false));
        let mut b = a.clone();
        b.seed = 7;
        b.batch.size = 16;
        b.cache.as_mut().unwrap().budget = ByteBudget::Bytes(5);
        b.cache.as_mut().unwrap().policy = CachePolicyKind::Shade;
        let first = b.first_random_op().unwrap();
        b.ops.truncate(first + 1);
        assert_ne!(a.ops, b.ops, "the random suffix differs");
        assert_eq!(share_key(&a, &m), share_key(&b, &m));
    }

    #[test]
    fn record_options_limits_prefix_and_level_change_the_key() {
        let m = Manifest::new(PathBuf::from("d"), Vec::new(), Vec::new());
        let a = base(tar(false, false));
        let key = share_key(&a, &m);
        let mut sidecars = a.clone();
        sidecars.source = tar(true, false);
        let mut masks = a.clone();
        masks.source = tar(true, true);
        let mut limits = a.clone();
        limits.limits.max_pixels /= 2;
        let mut prefix = a.clone();
        prefix.ops.insert(1, OpSpec::resize(40));
        let mut level = a.clone();
        level.cache.as_mut().unwrap().resize = Some(48);
        let mut data = m.clone();
        data.fingerprint ^= 1;
        for (what, s, m) in [
            ("sidecars", &sidecars, &m),
            ("masks", &masks, &m),
            ("limits", &limits, &m),
            ("prefix", &prefix, &m),
            ("cache resize", &level, &m),
            ("dataset", &a, &data),
        ] {
            assert_ne!(share_key(s, m), key, "{what} must change the key");
        }
        assert_ne!(share_key(&sidecars, &m), share_key(&masks, &m));
    }
}
