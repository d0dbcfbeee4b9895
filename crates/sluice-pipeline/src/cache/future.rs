//! When each key is needed next, from the known order of the coming epoch(s): Belady's
//! rule needs it, and a seeded sampler knows it (NoPFS). Positions count from the first
//! sample not yet consumed; each lookup of a key consumes its earliest position, so worker
//! threads that finish samples slightly out of order still consume the right ones.

use std::collections::{HashMap, VecDeque};

#[derive(Debug, Default)]
pub struct NextUse {
    uses: HashMap<u64, VecDeque<u64>>,
}

impl NextUse {
    /// `keys` in the order they will be looked up.
    pub fn new(keys: impl IntoIterator<Item = u64>) -> Self {
        let mut uses: HashMap<u64, VecDeque<u64>> = HashMap::new();
        for (i, k) in keys.into_iter().enumerate() {
            uses.entry(k).or_default().push_back(i as u64);
        }
        Self { uses }
    }

    /// The position `key` is needed at next; `u64::MAX` when no known order needs it.
    pub fn next(&self, key: u64) -> u64 {
        self.uses.get(&key).and_then(|q| q.front().copied()).unwrap_or(u64::MAX)
    }

    /// A lookup of `key`: its earliest position is used up.
    pub fn consume(&mut self, key: u64) {
        if let Some(q) = self.uses.get_mut(&key) {
            q.pop_front();
            if q.is_empty() {
                self.uses.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lookup_moves_a_key_to_its_next_position() {
        let mut n = NextUse::new([5, 7, 5, 9]);
        assert_eq!((n.next(5), n.next(7), n.next(9), n.next(1)), (0, 1, 3, u64::MAX));
        n.consume(5);
        assert_eq!(n.next(5), 2);
        n.consume(5);
        assert_eq!(n.next(5), u64::MAX);
        n.consume(1);
        assert_eq!(n.next(7), 1);
    }
}
