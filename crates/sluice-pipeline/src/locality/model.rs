//! The loading-time model of a multi-learner epoch (sluice's design: epoch time ≈
//! max(D/(pV), D/R + D/(pU)); Yang & Cong's abstract names an analytical model but gives
//! no formula), refined per tier in
//! sluice's NoPFS-style extension: each sample a learner loads
//! comes from its own cache (free), a peer (network latency + size / link bandwidth) or
//! the shared storage (latency + size / bandwidth shared by all learners). A loader
//! thread fetches a sample and then preprocesses it, so fetch waits add to compute per
//! thread and overlap only across threads; the shared storage link caps the job besides.
//! The share of samples that come from peers is not a formula: it is counted by running
//! the real placement and assignment over a seeded epoch.

use serde::Serialize;
use sluice_core::{Assignment, Owners, ShuffleSpec};

use super::Locality;
use crate::sampler::{epoch_order, Shard};

/// What the model needs to know about a job and its machines.
#[derive(Debug, Clone, Copy)]
pub struct ModelInputs {
    pub samples: usize,
    /// Bytes per sample as read from storage, and as a peer sends it (its cache entry:
    /// file bytes, or decoded pixels).
    pub sample_bytes: f64,
    pub peer_sample_bytes: f64,
    /// Samples each learner caches.
    pub cache_samples: u64,
    pub local_batch: usize,
    /// Shared storage bandwidth (bytes/s) and per-read latency (s).
    pub storage_bytes_per_s: f64,
    pub storage_latency_s: f64,
    /// Each learner's network link (bytes/s) and per-request latency (s).
    pub net_bytes_per_s: f64,
    pub net_latency_s: f64,
    /// Preprocessing time per sample on one thread (s), and threads per learner.
    pub compute_s: f64,
    pub threads: usize,
}

/// The model's answer for one learner count.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Prediction {
    pub learners: usize,
    pub compute_s: f64,
    pub storage_s: f64,
    pub network_s: f64,
    /// Epoch time after the first epoch, locality-aware with the collaborative cache.
    pub epoch_s: f64,
    /// Epoch time of the baseline: every learner reads its slice from storage.
    pub baseline_s: f64,
    /// Share of samples that cross between learners, locality-aware and plain split.
    pub remote_aware: f64,
    pub remote_partitioned: f64,
    pub bottleneck: &'static str,
}

/// Share of an epoch's samples a learner loads but another learner caches.
pub fn remote_share(samples: usize, learners: usize, cache_samples: u64, local_batch: usize, a: Assignment) -> f64 {
    let l = Locality {
        placement: Owners::seeded_runs(samples, 0, &vec![cache_samples; learners]),
        assignment: a,
        shard: Shard { rank: 0, world_size: learners },
        batch: local_batch,
    };
    let global = epoch_order(samples, 0, 1, ShuffleSpec::Global, Shard::default());
    let split = l.split(&global);
    let loaded: usize = split.iter().map(Vec::len).sum();
    let remote: usize = split
        .iter()
        .enumerate()
        .map(|(rank, part)| part.iter().filter(|&&i| l.placement.owner(global[i]).is_some_and(|o| o != rank)).count())
        .sum();
    remote as f64 / loaded.max(1) as f64
}

pub fn predict(m: &ModelInputs, learners: usize) -> Prediction {
    let p = learners.max(1) as f64;
    let n = m.samples as f64;
    let k = m.threads.max(1) as f64;
    let per_learner = n / p;
    let cached = (m.cache_samples as f64 * p).min(n);
    let uncached = n - cached;
    let remote_aware = remote_share(m.samples, learners, m.cache_samples, m.local_batch, Assignment::Aware);
    let remote_partitioned = remote_share(m.samples, learners, m.cache_samples, m.local_batch, Assignment::Partitioned);
    // A learner's threads each fetch a sample, then preprocess it: a thread's fetch waits
    // add to its compute, and only the threads (and learners) overlap each other. The
    // storage link, shared by everyone, caps the whole job besides.
    let storage_read_s = m.storage_latency_s + m.sample_bytes / m.storage_bytes_per_s;
    let compute_s = per_learner * m.compute_s / k;
    let storage_wait_s = uncached / p * storage_read_s / k;
    let link_s = uncached * m.sample_bytes / m.storage_bytes_per_s;
    let from_peers = per_learner * remote_aware;
    let network_s = from_peers * (m.net_latency_s + m.peer_sample_bytes / m.net_bytes_per_s) / k;
    let epoch_s = link_s.max(compute_s + storage_wait_s + network_s);
    let baseline_s = (n * m.sample_bytes / m.storage_bytes_per_s).max(per_learner * (m.compute_s + storage_read_s) / k);
    // Storage is the bottleneck where it makes the epoch over 20% longer than it would be
    // without it (the measured criterion in `sluice-bench locality`).
    let bottleneck = if epoch_s > STORAGE_BOUND * (compute_s + network_s) {
        "storage"
    } else if compute_s >= network_s {
        "compute"
    } else {
        "network"
    };
    Prediction {
        learners,
        compute_s,
        storage_s: link_s.max(storage_wait_s),
        network_s,
        epoch_s,
        baseline_s,
        remote_aware,
        remote_partitioned,
        bottleneck,
    }
}

/// How much longer than its storage-free time an epoch must take for storage to count as
/// its bottleneck.
pub const STORAGE_BOUND: f64 = 1.2;

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(cache_samples: u64) -> ModelInputs {
        ModelInputs {
            samples: 4096,
            sample_bytes: 100e3,
            peer_sample_bytes: 100e3,
            cache_samples,
            local_batch: 32,
            storage_bytes_per_s: 100e6,
            storage_latency_s: 2e-3,
            net_bytes_per_s: 1e9,
            net_latency_s: 1e-4,
            compute_s: 1e-3,
            threads: 1,
        }
    }

    #[test]
    fn storage_stops_being_the_bottleneck_once_the_caches_hold_the_dataset() {
        let m = inputs(1024);
        let small = predict(&m, 2);
        assert_eq!(small.bottleneck, "storage", "{small:?}");
        let four = predict(&m, 4);
        assert_eq!(four.storage_s, 0.0);
        assert_ne!(four.bottleneck, "storage");
        assert!(four.epoch_s * 2.0 <= four.baseline_s, "{four:?}");
        assert!(four.remote_aware <= 0.07 && four.remote_partitioned > 0.7, "{four:?}");
    }
}
