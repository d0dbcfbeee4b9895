//! Who loads which sample of one global batch. The baseline gives rank r the positions
//! r, r + p, r + 2p, ... of the batch. Locality-aware assignment (Yang & Cong's abstract
//! names locality-aware loading; the balancing here is sluice's design) lets each
//! learner take the samples it caches, fills the learners left short with the samples no
//! one caches, then moves the rest from surplus to deficit with two max-heaps (largest
//! surplus to largest deficit), at most p − 1 moves. Both split the same multiset into p
//! equal parts, and both are deterministic, so all learners agree without messages.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use sluice_core::Owners;

/// The positions (indices into `batch`) each of `p` learners loads; `batch.len()` must be
/// a multiple of `p`. Each learner's positions are in batch order.
pub fn partitioned(len: usize, p: usize) -> Vec<Vec<usize>> {
    let mut parts = vec![Vec::with_capacity(len / p); p];
    for i in 0..len {
        parts[i % p].push(i);
    }
    parts
}

/// The locality-aware split of `batch` (manifest positions) among `p` learners.
pub fn locality_aware(batch: &[u32], placement: &Owners, p: usize) -> Vec<Vec<usize>> {
    balanced(batch, placement, p).0
}

/// [`locality_aware`], with the number of surplus-to-deficit moves it made.
fn balanced(batch: &[u32], placement: &Owners, p: usize) -> (Vec<Vec<usize>>, usize) {
    let target = batch.len() / p;
    let mut parts: Vec<Vec<usize>> = vec![Vec::with_capacity(target); p];
    let mut uncached = Vec::new();
    for (i, &pos) in batch.iter().enumerate() {
        match placement.owner(pos).filter(|&r| r < p) {
            Some(r) => parts[r].push(i),
            None => uncached.push(i),
        }
    }
    // Samples cached nowhere cost a storage read wherever they go: give them to the
    // learners short of `target` first, so fewer cached samples have to move.
    let mut uncached = uncached.into_iter();
    for part in parts.iter_mut() {
        while part.len() < target {
            match uncached.next() {
                Some(i) => part.push(i),
                None => break,
            }
        }
    }
    // Now either every learner has at least `target` (all uncached samples placed), or
    // none is left: what remains short is exactly the surplus, which moves by two heaps.
    let mut surplus: BinaryHeap<(usize, Reverse<usize>)> = BinaryHeap::new();
    let mut deficit: BinaryHeap<(usize, Reverse<usize>)> = BinaryHeap::new();
    for (r, part) in parts.iter().enumerate() {
        if part.len() > target {
            surplus.push((part.len() - target, Reverse(r)));
        } else if part.len() < target {
            deficit.push((target - part.len(), Reverse(r)));
        }
    }
    let mut moves = 0;
    while let (Some((s, Reverse(from))), Some((d, Reverse(to)))) = (surplus.pop(), deficit.pop()) {
        moves += 1;
        let k = s.min(d);
        let keep = parts[from].len() - k;
        let moved: Vec<usize> = parts[from].drain(keep..).collect();
        parts[to].extend(moved);
        if s > k {
            surplus.push((s - k, Reverse(from)));
        }
        if d > k {
            deficit.push((d - k, Reverse(to)));
        }
    }
    for part in &mut parts {
        part.sort_unstable();
    }
    (parts, moves)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted_positions(batch: &[u32], parts: &[Vec<usize>]) -> Vec<u32> {
        let mut v: Vec<u32> = parts.iter().flatten().map(|&i| batch[i]).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn each_learner_keeps_what_it_caches_up_to_its_share() {
        // 8 samples, 2 learners: learner 0 caches 6 of them, learner 1 none.
        let placement = Owners::seeded_runs(8, 3, &[6, 0]);
        let batch: Vec<u32> = (0..8).collect();
        let parts = locality_aware(&batch, &placement, 2);
        assert_eq!(parts[0].len(), 4);
        assert_eq!(parts[1].len(), 4);
        assert!(parts[0].iter().all(|&i| placement.owner(batch[i]) == Some(0)));
        // Learner 1 got both uncached samples and two of learner 0's surplus.
        let from_0 = parts[1].iter().filter(|&&i| placement.owner(batch[i]) == Some(0)).count();
        assert_eq!(from_0, 2);
        assert_eq!(sorted_positions(&batch, &parts), batch);
    }

    #[test]
    fn surplus_reaches_deficit_in_at_most_p_minus_one_moves() {
        for p in [2, 3, 4, 8] {
            // Uneven caches that together hold everything: every learner is off target.
            let budgets: Vec<u64> = (0..p as u64).map(|r| 64 * (r + 1)).collect();
            let n: u64 = budgets.iter().sum();
            let placement = Owners::seeded_runs(n as usize, 9, &budgets);
            for start in (0..n as u32).step_by(8 * p) {
                let batch: Vec<u32> = (start..(start + 8 * p as u32).min(n as u32)).collect();
                let batch = &batch[..batch.len() / p * p];
                let (parts, moves) = balanced(batch, &placement, p);
                assert!(moves < p, "p = {p}: {moves} moves");
                assert!(parts.iter().all(|x| x.len() == batch.len() / p));
                assert_eq!(sorted_positions(batch, &parts), batch);
            }
        }
    }

    #[test]
    fn the_baseline_is_the_strided_split() {
        assert_eq!(partitioned(6, 3), vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
    }
}
