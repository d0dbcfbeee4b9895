//! The ids of the samples a job has handled (trained on, dropped or spilled): the broker
//! delivers at least once, the ledger makes it exactly once. It travels in the state.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    ids: HashSet<u64>,
}

impl Ledger {
    /// Records `id`; false if it was there already.
    pub fn insert(&mut self, id: u64) -> bool {
        self.ids.insert(id)
    }

    pub fn contains(&self, id: u64) -> bool {
        self.ids.contains(&id)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The ids as sorted, inclusive ranges: a stream's ids are mostly consecutive, so a
    /// checkpoint stays small however long the stream.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let mut ids: Vec<u64> = self.ids.iter().copied().collect();
        ids.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for id in ids {
            match out.last_mut() {
                Some((_, hi)) if *hi + 1 == id => *hi = id,
                _ => out.push((id, id)),
            }
        }
        out
    }

    pub fn from_ranges(ranges: &[(u64, u64)]) -> Self {
        Self { ids: ranges.iter().flat_map(|&(lo, hi)| lo..=hi).collect() }
    }
}

/// The ledger as it is saved: sorted inclusive ranges of ids.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerState {
    pub ranges: Vec<(u64, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip_and_compress_consecutive_ids() {
        let mut l = Ledger::default();
        for id in [5, 1, 2, 3, 9, 10, 4] {
            assert!(l.insert(id));
        }
        assert!(!l.insert(3), "a second delivery of an id is a duplicate");
        assert_eq!(l.ranges(), vec![(1, 5), (9, 10)]);
        assert_eq!(Ledger::from_ranges(&l.ranges()), l);
    }
}
