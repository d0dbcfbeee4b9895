//! How JPEGs are decoded: the entropy index that lets a crop of an ordinary JPEG decode
//! only the crop's MCUs (docs/entropy-index.md).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::SpecError;

/// Largest `decode.index_spacing` (MCUs between index points): past this the window's
/// edges waste more than the index saves.
pub const MAX_INDEX_SPACING: u32 = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeSpec {
    /// Index each baseline JPEG the first time a crop of it is decoded, and cut later crops
    /// down to their own MCUs (the pixels are the same either way). Off by default: on 2
    /// cores the indexing epoch costs ~2x an ordinary one and later epochs gain under 5%
    /// so far (BENCHMARKS.md, "Entropy index").
    #[serde(default = "default_entropy_index")]
    pub entropy_index: bool,
    /// Memory the indexes may take, in MiB; files met once it is full decode the ordinary
    /// way (counted in the stats).
    #[serde(default = "default_index_budget_mb")]
    pub index_budget_mb: u64,
    /// MCUs between index points: fewer points make the index smaller, more cut the
    /// window closer to the crop.
    #[serde(default = "default_index_spacing")]
    pub index_spacing: u32,
    /// A folder the indexes are also kept in (relative to the spec file's folder), shared
    /// by every process that names it: later runs, ranks and service workers start from
    /// them, and `sluice index` makes them ahead. Without it, a disk cache tier's folder
    /// keeps them (`<cache.disk.dir>/entropy-index`); with neither, memory only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_dir: Option<PathBuf>,
}

fn default_entropy_index() -> bool {
    false
}

fn default_index_budget_mb() -> u64 {
    256
}

fn default_index_spacing() -> u32 {
    2
}

impl Default for DecodeSpec {
    fn default() -> Self {
        Self {
            entropy_index: default_entropy_index(),
            index_budget_mb: default_index_budget_mb(),
            index_spacing: default_index_spacing(),
            index_dir: None,
        }
    }
}

impl DecodeSpec {
    pub fn validate(&self) -> Result<(), SpecError> {
        if !(1..=MAX_INDEX_SPACING).contains(&self.index_spacing) {
            return Err(SpecError::new(
                "decode.index_spacing",
                format!("must be 1 to {MAX_INDEX_SPACING} MCUs, not {}", self.index_spacing),
            ));
        }
        if self.index_budget_mb > 1 << 20 {
            return Err(SpecError::new(
                "decode.index_budget_mb",
                format!("{} MiB is more memory than any machine has", self.index_budget_mb),
            ));
        }
        Ok(())
    }

    /// The index budget in bytes.
    pub fn index_budget_bytes(&self) -> usize {
        usize::try_from(self.index_budget_mb << 20).unwrap_or(usize::MAX)
    }
}
