//! The ids of the samples a learner has handled (trained on, dropped or spilled) lately:
//! the broker delivers at least once, the ledger makes it exactly once. It travels in the
//! state.
//!
//! A redelivery is always of an entry still pending in the broker (a re-read after a
//! restart or a lost connection), and a learner holds at most `max_unacked` entries
//! unacknowledged (plus what it reads ahead), so the ledger only needs its newest ids:
//! it keeps `capacity` of them and forgets the oldest. Memory, and the cost of a state,
//! stay bounded however long the stream.

use std::collections::{BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

/// What the ledger holds when nothing else says: the default `max_unacked` plus the
/// default read-ahead buffer.
pub const DEFAULT_CAPACITY: usize = 65_536 + 1024;

#[derive(Debug, Clone)]
pub struct Ledger {
    /// Sorted, for the state's ranges.
    ids: BTreeSet<u64>,
    /// In the order handled, to forget the oldest first.
    order: VecDeque<u64>,
    capacity: usize,
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl Ledger {
    /// A ledger that remembers the newest `capacity` ids (at least one).
    pub fn new(capacity: usize) -> Self {
        Self { ids: BTreeSet::new(), order: VecDeque::new(), capacity: capacity.max(1) }
    }

    /// Records `id`, forgetting the oldest id beyond the capacity; false if it was there
    /// already.
    pub fn insert(&mut self, id: u64) -> bool {
        if !self.ids.insert(id) {
            return false;
        }
        self.order.push_back(id);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
        true
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

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The ids as sorted, inclusive ranges: a stream's ids are mostly consecutive, so a
    /// checkpoint stays small.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &id in &self.ids {
            match out.last_mut() {
                Some((_, hi)) if hi.checked_add(1) == Some(id) => *hi = id,
                _ => out.push((id, id)),
            }
        }
        out
    }

    /// The ledger a state saved, checked before anything is allocated: the ranges must be
    /// sorted, disjoint and hold at most `capacity` ids. Their order of handling is not
    /// saved: after a restore the lowest ids are forgotten first.
    pub fn from_state(state: &LedgerState, capacity: usize) -> Result<Self, LedgerError> {
        let mut total: u64 = 0;
        let mut previous: Option<u64> = None;
        for (i, &(lo, hi)) in state.ranges.iter().enumerate() {
            if lo > hi {
                return Err(LedgerError::Reversed { index: i, lo, hi });
            }
            if previous.is_some_and(|p| lo <= p) {
                return Err(LedgerError::Unsorted { index: i });
            }
            previous = Some(hi);
            total = total.saturating_add(hi - lo).saturating_add(1);
            if total > capacity as u64 {
                return Err(LedgerError::TooLarge { capacity });
            }
        }
        let mut ledger = Self::new(capacity);
        for &(lo, hi) in &state.ranges {
            for id in lo..=hi {
                ledger.insert(id);
            }
        }
        Ok(ledger)
    }

    pub fn state(&self) -> LedgerState {
        LedgerState { ranges: self.ranges() }
    }
}

/// Why a saved ledger is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger range {index} runs backwards ({lo} > {hi})")]
    Reversed { index: usize, lo: u64, hi: u64 },
    #[error("ledger range {index} is not after the one before it (ranges are sorted and disjoint)")]
    Unsorted { index: usize },
    #[error(
        "the ledger holds more than {capacity} ids, more than this loader keeps (`max_unacked` + `rate.buffer`): \
         raise `max_unacked` to restore it"
    )]
    TooLarge { capacity: usize },
}

/// The ledger as it is saved: sorted inclusive ranges of ids.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerState {
    pub ranges: Vec<(u64, u64)>,
}

#[cfg(test)]
mod tests {
    use sluice_core::{SampleKey, SampleRng};

    use super::*;

    #[test]
    fn ranges_round_trip_and_compress_consecutive_ids() {
        let mut l = Ledger::default();
        for id in [5, 1, 2, 3, 9, 10, 4] {
            assert!(l.insert(id));
        }
        assert!(!l.insert(3), "a second delivery of an id is a duplicate");
        assert_eq!(l.ranges(), vec![(1, 5), (9, 10)]);
        let back = Ledger::from_state(&l.state(), DEFAULT_CAPACITY).map(|b| b.ranges());
        assert_eq!(back, Ok(l.ranges()));
    }

    #[test]
    fn the_ledger_and_its_state_stay_bounded_however_many_ids_pass() {
        // 300,000 ids in a shuffled order (as a shuffled or shared stream delivers them):
        // the ranges do not compress, so only a bound keeps the state small.
        let mut rng = SampleRng::new(1, 0, SampleKey(0), 0);
        let mut l = Ledger::default();
        let mut last = 0;
        for _ in 0..300_000u64 {
            last = rng.next_u64() % 1_000_000_000;
            l.insert(last);
        }
        assert!(l.len() <= DEFAULT_CAPACITY, "the ledger holds {} ids", l.len());
        assert!(l.ranges().len() <= DEFAULT_CAPACITY, "the state holds {} ranges", l.ranges().len());
        assert!(l.contains(last), "the newest id is remembered");
    }

    #[test]
    fn a_saved_ledger_is_checked_before_anything_is_allocated() {
        let state = |ranges: Vec<(u64, u64)>| LedgerState { ranges };
        let huge = Ledger::from_state(&state(vec![(0, 100_000_000_000)]), 1000);
        assert_eq!(huge.err(), Some(LedgerError::TooLarge { capacity: 1000 }));
        let all = Ledger::from_state(&state(vec![(0, u64::MAX)]), 1000);
        assert_eq!(all.err(), Some(LedgerError::TooLarge { capacity: 1000 }));
        let reversed = Ledger::from_state(&state(vec![(5, 1)]), 1000);
        assert_eq!(reversed.err(), Some(LedgerError::Reversed { index: 0, lo: 5, hi: 1 }));
        let overlapping = Ledger::from_state(&state(vec![(1, 5), (5, 9)]), 1000);
        assert_eq!(overlapping.err(), Some(LedgerError::Unsorted { index: 1 }));
        let fits = Ledger::from_state(&state(vec![(1, 5), (7, 9)]), 8).map(|l| l.len());
        assert_eq!(fits, Ok(8));
    }
}
