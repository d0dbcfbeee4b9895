//! Where an importance-sampled job's samples are cached, and the epoch laid out to match.
//!
//! The workers' caches together hold the job's hot set, each worker a disjoint share of it.
//! Which worker owns a sample is a pure function of the sample's key, the workers
//! (`members`, named by address) and their cache capacities: rendezvous hashing, so a
//! worker that comes or goes moves only its own samples. Hot samples are dealt with a
//! bound per worker (its part of the hot set, in proportion to its capacity), so the
//! shares fit the caches; the rest go to their first choice.
//!
//! With cache-aware assignment the epoch's draw is then regrouped: each owner's samples
//! (in drawn order) are cut into task-sized runs, and the runs of the owners interleaved,
//! so each task is one owner's and goes to it. The multiset of draws and each draw's
//! weight are unchanged; only which samples share a batch is.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A worker's part in a draw's placement: its address and its cache's capacity in entries
/// (0 when it has not said).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub addr: String,
    pub capacity: u64,
}

/// The owner (index into `members`) of every manifest position.
pub fn owners(keys: &[u64], hot: &[bool], members: &[Member]) -> Vec<u32> {
    let m = members.len();
    if m == 0 {
        return vec![0; keys.len()];
    }
    let seeds: Vec<u64> = members.iter().map(|w| xxh3_64_with_seed(w.addr.as_bytes(), 0x51ce)).collect();
    let score = |key: u64, j: usize| xxh3_64_with_seed(&key.to_le_bytes(), seeds[j]);
    let first = |key: u64| (0..m).max_by_key(|&j| (score(key, j), j)).unwrap_or(0) as u32;
    let mut out: Vec<u32> = keys.iter().map(|&k| first(k)).collect();

    // The hot set, dealt with a bound: each member's quota is its share of the capacity
    // (equal shares while capacities are unknown), rounded up so every hot sample fits.
    let hot_positions: Vec<usize> = (0..keys.len()).filter(|&i| hot.get(i).copied().unwrap_or(false)).collect();
    if hot_positions.is_empty() {
        return out;
    }
    let total: u64 = members.iter().map(|w| w.capacity).sum();
    let h = hot_positions.len() as u64;
    let mut quota: Vec<u64> = members
        .iter()
        .map(|w| if total == 0 { h.div_ceil(m as u64) } else { (h * w.capacity).div_ceil(total) })
        .collect();
    // Dealt in an order of their own (not the manifest's), so no member's first choices
    // are favoured by where they lie in the dataset.
    let mut order = hot_positions;
    order.sort_by_key(|&i| (xxh3_64_with_seed(&keys[i].to_le_bytes(), 0x0de7), i));
    for i in order {
        let mut ranked: Vec<usize> = (0..m).collect();
        ranked.sort_by_key(|&j| std::cmp::Reverse((score(keys[i], j), j)));
        // Quotas add up to at least the hot set's size: some member always has room.
        if let Some(&j) = ranked.iter().find(|&&j| quota[j] > 0) {
            quota[j] -= 1;
            out[i] = j as u32;
        }
    }
    out
}

/// Regroups `order[..used]` (and its weights) so that each run of `chunk` draws belongs to
/// one owner where it can: every owner's draws in drawn order, cut into runs of `chunk`,
/// the owners' runs interleaved, then the shorter remainders. Draws past `used` (left out
/// by `drop_last`) stay where they are, so the epoch's multiset is unchanged.
pub fn regroup(order: &mut [u32], weights: Option<&mut [f32]>, owners: &[u32], used: usize, chunk: usize) {
    let used = used.min(order.len());
    let chunk = chunk.max(1);
    let members = owners.iter().copied().max().map_or(0, |m| m as usize + 1);
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); members];
    for (slot, &p) in order[..used].iter().enumerate() {
        if let Some(g) = owners.get(p as usize).and_then(|&o| groups.get_mut(o as usize)) {
            g.push(slot);
        }
    }
    let mut layout: Vec<usize> = Vec::with_capacity(used);
    let mut next = vec![0usize; members];
    loop {
        let mut any = false;
        for (g, at) in groups.iter().zip(next.iter_mut()) {
            if g.len() - *at >= chunk {
                layout.extend_from_slice(&g[*at..*at + chunk]);
                *at += chunk;
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    for (g, at) in groups.iter().zip(&next) {
        layout.extend_from_slice(&g[*at..]);
    }
    let original: Vec<u32> = order[..used].to_vec();
    for (slot, &from) in layout.iter().enumerate() {
        order[slot] = original[from];
    }
    if let Some(w) = weights {
        let original: Vec<f32> = w[..used.min(w.len())].to_vec();
        for (slot, &from) in layout.iter().enumerate() {
            if let (Some(dst), Some(&src)) = (w.get_mut(slot), original.get(from)) {
                *dst = src;
            }
        }
    }
}

/// The owner of each batch of `order` (`batch` draws each): the one owning most of its
/// draws (the lowest index on a tie).
pub fn batch_owners(order: &[u32], owners: &[u32], batch: usize, members: usize) -> Vec<u32> {
    order
        .chunks(batch.max(1))
        .map(|b| {
            let mut count = vec![0usize; members.max(1)];
            for &p in b {
                if let Some(c) = owners.get(p as usize).and_then(|&o| count.get_mut(o as usize)) {
                    *c += 1;
                }
            }
            (0..count.len()).max_by_key(|&j| (count[j], std::cmp::Reverse(j))).unwrap_or(0) as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<Member> {
        (0..n).map(|i| Member { addr: format!("127.0.0.1:{}", 7000 + i), capacity: 50 }).collect()
    }

    #[test]
    fn the_hot_set_is_dealt_to_fit_the_caches_and_moves_little_when_a_worker_goes() {
        let keys: Vec<u64> = (0..1000).map(|i| i * 7919).collect();
        let hot: Vec<bool> = (0..1000).map(|i| i % 10 == 0).collect();
        let three = owners(&keys, &hot, &members(3));
        let per = |o: &[u32], j: u32| (0..1000).filter(|&i| hot[i] && o[i] == j).count();
        // 100 hot samples over 3 equal caches: quotas of 34, and every hot sample placed.
        assert!((0..3).all(|j| per(&three, j) <= 34), "{:?}", (0..3).map(|j| per(&three, j)).collect::<Vec<_>>());
        assert_eq!((0..3).map(|j| per(&three, j)).sum::<usize>(), 100);
        // Cold samples: roughly a third each.
        let cold = |j: u32| (0..1000).filter(|&i| !hot[i] && three[i] == j).count();
        assert!((0..3).all(|j| (200..400).contains(&cold(j))));
        // The same inputs give the same placement.
        assert_eq!(owners(&keys, &hot, &members(3)), three);
        // Worker 2 goes: the cold samples of workers 0 and 1 stay where they were.
        let two = owners(&keys, &hot, &members(2));
        assert!((0..1000).filter(|&i| !hot[i] && three[i] != 2).all(|i| two[i] == three[i]));
        assert_eq!((0..2).map(|j| per(&two, j)).collect::<Vec<_>>(), vec![50, 50]);
    }

    #[test]
    fn regrouping_keeps_the_multiset_and_the_weights_and_makes_whole_runs_one_owners() {
        let owners: Vec<u32> = (0..20).map(|p| p % 2).collect();
        let mut order: Vec<u32> = vec![3, 3, 0, 5, 2, 7, 4, 9, 11, 6, 13, 8, 1, 10, 15, 12, 17, 14, 19, 16];
        let mut weights: Vec<f32> = order.iter().map(|&p| p as f32 / 10.0).collect();
        let before = order.clone();
        // The last 2 draws are dropped by `drop_last`: they stay put.
        regroup(&mut order, Some(&mut weights), &owners, 18, 4);
        assert_eq!(&order[18..], &before[18..]);
        let mut a = order.clone();
        let mut b = before.clone();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "the same draws");
        assert!(order.iter().zip(&weights).all(|(&p, &w)| w == p as f32 / 10.0), "each weight stays with its draw");
        let bo = batch_owners(&order[..16], &owners, 4, 2);
        for (i, run) in order[..16].chunks(4).enumerate() {
            assert!(run.iter().all(|&p| owners[p as usize] == bo[i]), "run {i} {run:?} is one owner's");
        }
        assert_eq!(bo, vec![0, 1, 0, 1], "owners' runs interleaved");
    }
}
