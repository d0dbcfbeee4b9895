//! The loader's side of the collaborative cache ([`crate::locality::peer`]): a miss on a
//! sample placed on another learner asks that learner before reading storage, and this
//! learner's server answers peers with the samples placed on it, loading them through to
//! its own cache if it has not yet (so each sample is read from storage once, by its
//! owner). Counters say where the samples of this learner came from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::Serialize;
use sluice_core::{CacheLevel, SampleKey};

use super::sample::resize_image;
use super::Shared;
use crate::cache::CachedData;
use crate::executor::WorkerLocal;
use crate::locality::peer::{PeerError, PeerServer, Serve};

/// Where a learner's cache misses were served from.
#[derive(Debug, Default)]
pub(super) struct Counters {
    from_peers: AtomicU64,
    peer_fallbacks: AtomicU64,
    storage_reads: AtomicU64,
    served_to_peers: AtomicU64,
}

/// A snapshot of [`Counters`], in [`crate::Loader::locality_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LocalityStats {
    /// Samples this learner loaded that a peer sent.
    pub from_peers: u64,
    /// Peer requests that failed (peer gone, slow or without the sample): read from storage.
    pub peer_fallbacks: u64,
    /// Samples this learner read from storage (for itself or for a peer).
    pub storage_reads: u64,
    /// Samples this learner sent to peers.
    pub served_to_peers: u64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> LocalityStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LocalityStats {
            from_peers: get(&self.from_peers),
            peer_fallbacks: get(&self.peer_fallbacks),
            storage_reads: get(&self.storage_reads),
            served_to_peers: get(&self.served_to_peers),
        }
    }

    pub(super) fn storage_read(&self) {
        self.storage_reads.fetch_add(1, Ordering::Relaxed);
    }
}

impl Shared {
    /// The sample at `pos` from the learner it is placed on, if that is another learner
    /// and it answers in time.
    pub(super) fn fetch_from_peer(&self, pos: u32) -> Option<CachedData> {
        let (locality, peers) = (self.peering.locality.as_ref()?, self.peering.peers.as_ref()?);
        let owner = locality.placement.owner(pos).filter(|&o| o != locality.shard.rank)?;
        match peers.fetch(owner, pos) {
            // The peer protocol carries pixels without targets: a sample with boxes or a mask
            // takes only raw bytes from a peer (its boxes come from the manifest, its mask is
            // read again).
            Ok(Some(data))
                if (self.data.manifest.has_boxes() || self.data.manifest.masks.is_some())
                    && !matches!(data, CachedData::Raw(_)) =>
            {
                self.peering.counters.peer_fallbacks.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(Some(data)) => {
                self.peering.counters.from_peers.fetch_add(1, Ordering::Relaxed);
                Some(data)
            }
            Ok(None) => {
                self.peering.counters.peer_fallbacks.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(e) => {
                self.peering.counters.peer_fallbacks.fetch_add(1, Ordering::Relaxed);
                if !matches!(e, PeerError::BackingOff { .. }) {
                    tracing::warn!(error = %e, pos, "peer fetch failed; reading from storage");
                }
                None
            }
        }
    }

    /// A peer's request for `pos`: only samples placed here are served, from the cache or
    /// loaded into it first.
    fn serve_peer(&self, pos: u32) -> Option<Arc<CachedData>> {
        let locality = self.peering.locality.as_ref()?;
        let cache = self.priority.cache.as_ref()?;
        if !locality.caches(pos) {
            return None;
        }
        let entry = self.data.manifest.entry(SampleKey(u64::from(pos)))?;
        let data = match cache.get(entry.key.0) {
            Some(hit) => hit,
            None => {
                let level = cache.level()?;
                let mut local = WorkerLocal::default();
                let read = self.data.storage.read(
                    &self.data.manifest.root,
                    entry.location,
                    self.data.spec.limits.max_file_bytes,
                    &mut local.read_buf,
                );
                self.peering.counters.storage_read();
                if let Err(kind) = read {
                    tracing::warn!(key = entry.key.0, ?kind, "peer request: cannot read the sample");
                    return None;
                }
                let bytes = std::mem::take(&mut local.read_buf);
                let mut times = vec![Duration::ZERO; self.data.steps.prefix.len()];
                let data = match level {
                    CacheLevel::Raw | CacheLevel::Auto => CachedData::Raw(bytes),
                    CacheLevel::Decoded | CacheLevel::Resized => {
                        // Kept with the sample's boxes and mask: this learner's own hits need them.
                        let mut targets = self.source_targets(pos).ok()?;
                        let mut mask = self.sample_mask(pos, &bytes, &mut local.scratch).ok()?;
                        let img = self
                            .data
                            .plan
                            .run_deterministic_prefix(
                                &bytes,
                                &mut local.scratch,
                                &mut times,
                                targets.as_mut(),
                                mask.as_mut(),
                            )
                            .ok()?;
                        match (level, self.data.spec.cache.as_ref().and_then(|c| c.resize)) {
                            (CacheLevel::Resized, Some(side)) => {
                                let max_pixels = self.data.spec.limits.max_pixels;
                                let (t, m) = (targets.as_mut(), mask.as_mut());
                                let img = resize_image(&img, side, &mut local.scratch, t, m, max_pixels).ok()?;
                                CachedData::Resized(img, targets, mask)
                            }
                            _ => CachedData::Decoded(img, targets, mask),
                        }
                    }
                };
                let data = Arc::new(data);
                cache.offer(entry.key.0, data.clone());
                data
            }
        };
        self.peering.counters.served_to_peers.fetch_add(1, Ordering::Relaxed);
        Some(data)
    }
}

/// Starts this learner's peer server on its own address in the spec's `peers`, answering
/// only peers that present the job's token.
pub(super) fn start_server(shared: &Arc<Shared>) -> Result<Option<PeerServer>, PeerError> {
    let (Some(locality), Some(spec)) = (shared.peering.locality.as_ref(), shared.data.spec.locality.as_ref()) else {
        return Ok(None);
    };
    let Some(addr) = spec.peers.get(locality.shard.rank) else {
        return Ok(None);
    };
    // A weak handle: the server must not keep a dropped loader alive.
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let serve: Serve = Arc::new(move |pos| weak.upgrade()?.serve_peer(pos));
    PeerServer::start(addr, crate::locality::peer::token(spec)?, serve).map(Some)
}
