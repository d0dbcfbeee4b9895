//! The multi-learner part of a pipeline spec: how each global batch is split among the
//! job's learners (DDP ranks), how many samples each learner caches, and where its peers
//! listen for the collaborative cache. The rank itself is per process, so it is not here:
//! it is the loader's `rank` argument (the spec is the same for every learner).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::check_count;
use crate::error::SpecError;

/// Largest `locality.peer_timeout_ms`: a peer slower than this is as good as gone.
pub const MAX_PEER_TIMEOUT_MS: u64 = 60_000;
/// Most learners a locality-aware job may have.
pub const MAX_LEARNERS: usize = 1 << 16;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalitySpec {
    /// How each global batch is split among the learners.
    #[serde(default)]
    pub assignment: Assignment,
    /// Samples each learner caches: one number for every learner, or one per rank.
    /// Which samples those are follows from the seed alone (see `docs/locality.md`).
    pub cache_samples: Vec<u64>,
    /// `host:port` of every learner's peer server, by rank (loopback or a private
    /// network); empty: no collaborative cache, a sample cached elsewhere is read from
    /// storage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
    /// How long a learner waits for a peer before reading the sample from storage.
    #[serde(default = "default_peer_timeout_ms")]
    pub peer_timeout_ms: u64,
    /// The job's shared secret, the same on every learner: a peer server answers only
    /// connections that present it. Without it here, the learner takes the environment
    /// variable `SLUICE_PEER_TOKEN`; with `peers` and neither, the loader refuses to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<PeerToken>,
}

/// A shared secret in a spec: (de)serialized as a plain string, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PeerToken(String);

impl PeerToken {
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The secret itself, for the transport that presents or checks it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PeerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerToken(<redacted>)")
    }
}

fn default_peer_timeout_ms() -> u64 {
    500
}

/// Which learner loads which sample of a global batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Assignment {
    /// Yang & Cong's locality-aware assignment: each learner takes the samples it caches,
    /// and the surplus is balanced onto the learners short of a full local batch.
    #[default]
    Aware,
    /// The plain split (rank r takes positions r, r + p, ...), whatever is cached where.
    Partitioned,
}

impl LocalitySpec {
    pub(super) fn validate(&self) -> Result<(), SpecError> {
        check_count("locality.cache_samples", self.cache_samples.len() as u64, 1, MAX_LEARNERS as u64)?;
        check_count("locality.peer_timeout_ms", self.peer_timeout_ms, 1, MAX_PEER_TIMEOUT_MS)?;
        if self.token.as_ref().is_some_and(|t| t.0.is_empty()) {
            return Err(SpecError::new("locality.token", "is empty: give the job's shared secret, or leave it out"));
        }
        if !self.peers.is_empty() && self.cache_samples.len() > 1 && self.peers.len() != self.cache_samples.len() {
            return Err(SpecError::new(
                "locality.peers",
                format!(
                    "{} peers for {} per-rank cache sizes: give one address per rank",
                    self.peers.len(),
                    self.cache_samples.len()
                ),
            ));
        }
        Ok(())
    }

    /// Checks the spec against the job's learner count, and gives each rank's cache size.
    pub fn cache_samples_for(&self, world_size: usize) -> Result<Vec<u64>, SpecError> {
        let budgets = match self.cache_samples.len() {
            1 => vec![self.cache_samples[0]; world_size],
            n if n == world_size => self.cache_samples.clone(),
            n => {
                return Err(SpecError::new(
                    "locality.cache_samples",
                    format!("{n} per-rank sizes for {world_size} learners: give one number, or one per rank"),
                ))
            }
        };
        if !self.peers.is_empty() && self.peers.len() != world_size {
            return Err(SpecError::new(
                "locality.peers",
                format!("{} peers for {world_size} learners: give one address per rank", self.peers.len()),
            ));
        }
        Ok(budgets)
    }
}
