//! Where an importance-sampled job's samples are cached, and the epoch laid out to match.
//!
//! The workers' caches together hold the job's hot set, each worker a disjoint share of it.
//! Which worker owns a sample is a pure function of the sample's key, the workers
//! (`members`, named by address) and their cache capacities: rendezvous hashing
//! ([`Rendezvous`], sluice-core's placement rule), so a worker that comes or goes moves only
//! its own samples. Hot samples are dealt with a
//! bound per worker (its part of the hot set, in proportion to its capacity), so the
//! shares fit the caches; the rest go to their first choice.
//!
//! With cache-aware assignment the epoch's draw is then regrouped: each owner's hot
//! samples (in drawn order) are cut into task-sized runs, and the runs of the owners
//! interleaved, so each task is one owner's and goes to it. Draws of samples outside the
//! hot set, which no worker caches, fill the batches the owners' last runs leave short, and
//! the rest of them are mixed evenly into the owners' runs, so every batch holds about the
//! epoch's share of them, as the local loader's batches do. The multiset of draws and each
//! draw's weight are unchanged; only which samples share a batch is.

use sluice_core::placement::NOBODY;
use sluice_core::{Owners, Rendezvous};
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use crate::dispatcher::journal::Member;

/// The draw before the one being placed: where the workers' caches are.
#[derive(Debug, Clone, Copy)]
pub struct Previous<'a> {
    pub members: &'a [Member],
    /// Its owner of every manifest position (index into its `members`).
    pub owners: &'a [u32],
    /// Its hot set, per position (all false: it had none).
    pub hot: &'a [bool],
    /// Its order: the manifest positions in the order the workers met them.
    pub order: &'a [u32],
}

/// The owner (index into `members`) of every manifest position. With the draw before
/// (`previous`), the hot set is dealt so that what the caches hold stays put: see the
/// comments below.
pub fn owners(keys: &[u64], hot: &[bool], members: &[Member], previous: Option<Previous<'_>>) -> Vec<u32> {
    let m = members.len();
    if m == 0 {
        return vec![0; keys.len()];
    }
    let rule = Rendezvous::new(members.iter().map(|w| w.addr.as_str()));
    let mut out: Vec<u32> = keys.iter().map(|&k| rule.owner(k).unwrap_or(0) as u32).collect();

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
    if let Some(p) = previous {
        // A sample the draw before placed in a member's share of its hot set is in that
        // member's cache: it stays there while the member has room.
        let now: Vec<Option<usize>> =
            p.members.iter().map(|pm| members.iter().position(|w| w.addr == pm.addr)).collect();
        order.retain(|&i| {
            let was = p.hot.get(i).copied().unwrap_or(false);
            let at = p.owners.get(i).and_then(|&o| now.get(o as usize).copied().flatten());
            match at {
                Some(j) if was && quota[j] > 0 => {
                    quota[j] -= 1;
                    out[i] = j as u32;
                    false
                }
                _ => true,
            }
        });
        // The rest are dealt in the order the draw before met them: before there is a hot
        // set a member's cache holds the first samples of its share that it met, so where
        // a member's first choices overflow its quota, the ones it met last move.
        let mut met = vec![u32::MAX; keys.len()];
        for (at, &pos) in p.order.iter().enumerate() {
            if let Some(x) = met.get_mut(pos as usize) {
                *x = (*x).min(at as u32);
            }
        }
        order.sort_by_key(|&i| met[i]);
    }
    for i in order {
        let ranked = rule.ranked(keys[i]);
        // Quotas add up to at least the hot set's size: some member always has room.
        if let Some(&j) = ranked.iter().find(|&&j| quota[j] > 0) {
            quota[j] -= 1;
            out[i] = j as u32;
        }
    }
    out
}

/// Where each position's draws should go: its owner while it is in the hot set (every
/// position while there is no hot set: then every owner caches what it owns), else nobody
/// (a sample outside the hot set, which no worker caches: any worker may take its draws).
pub fn routes(owners: &[u32], hot: &[bool]) -> Owners {
    if !hot.iter().any(|&h| h) {
        return Owners::new(owners.to_vec());
    }
    Owners::new(owners.iter().zip(hot).map(|(&o, &h)| if h { o } else { NOBODY }).collect())
}

/// Regroups `order[..used]` (and its weights) by where its draws go (`routes`, see
/// [`routes`]) so that each run of `chunk` draws (a task) belongs to one owner where it
/// can, and each `batch` where that can't be: every owner's hot draws in drawn order, with
/// a share of the draws any worker may take (the cold ones) mixed in evenly, cut into runs
/// of `chunk`, the owners' runs interleaved; then what is left of each owner in whole
/// batches; then the rest, shorter than a batch each, longest first (so that as few draws
/// as can be share a batch with another owner's). Draws past `used` (left out by
/// `drop_last`) stay where they are, so the epoch's multiset is unchanged.
///
/// Each owner takes first the cold draws that fill its last batch, then whole batches of
/// them while its share of the cold draws is below its share of the hot ones, so every
/// batch holds about the epoch's share of cold draws, as a batch of the local loader does.
/// The cold draws are the least likely samples, with the largest weights: batches of them
/// alone (or none) would make the size of SGD's steps swing from batch to batch.
pub fn regroup(
    order: &mut [u32],
    weights: Option<&mut [f32]>,
    routes: &Owners,
    used: usize,
    batch: usize,
    chunk: usize,
) {
    let used = used.min(order.len());
    let batch = batch.max(1);
    let chunk = chunk.max(1);
    let members = routes.as_slice().iter().copied().filter(|&r| r != NOBODY).max().map_or(0, |m| m as usize + 1);
    let mut hot: Vec<Vec<usize>> = vec![Vec::new(); members];
    let mut anyone: Vec<usize> = Vec::new();
    for (slot, &p) in order[..used].iter().enumerate() {
        match routes.owner(p) {
            Some(r) => hot[r].push(slot),
            None => anyone.push(slot),
        }
    }
    let hot_draws: usize = hot.iter().map(Vec::len).sum();
    if hot_draws == 0 {
        // No owner has a draw: nothing to group by.
        return;
    }
    let cold = cold_shares(&hot, anyone.len(), batch);
    // Each owner's draws: its hot ones in drawn order, its cold ones spaced evenly among
    // them (the k-th where k·cold/len passes a whole number), also in drawn order.
    let mut groups: Vec<Vec<usize>> = Vec::with_capacity(members);
    let mut next_cold = anyone.iter().copied();
    for (h, &c) in hot.iter().zip(&cold) {
        let len = h.len() + c;
        let mut hot_left = h.iter().copied();
        let mut placed = 0;
        let mut g = Vec::with_capacity(len);
        for i in 0..len {
            let take_cold = (i + 1) * c / len > placed;
            let next = if take_cold { next_cold.next() } else { hot_left.next() };
            placed += usize::from(take_cold);
            g.extend(next);
        }
        groups.push(g);
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
    for (g, at) in groups.iter().zip(next.iter_mut()) {
        let whole = (g.len() - *at) / batch * batch;
        layout.extend_from_slice(&g[*at..*at + whole]);
        *at += whole;
    }
    // What is left of each owner, longest first.
    let mut rest: Vec<&[usize]> = groups.iter().zip(&next).map(|(g, &at)| &g[at..]).filter(|r| !r.is_empty()).collect();
    rest.sort_by_key(|r| std::cmp::Reverse(r.len()));
    for r in rest {
        layout.extend_from_slice(r);
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

/// How many of the `cold` draws (which any worker may take) each owner takes, given its hot
/// draws `hot`: first what fills its last batch (the longest tails first, while there are
/// enough), then whole batches, each to the owner furthest below its share (`cold` in
/// proportion to its hot draws), and what is left (less than a batch) to the one furthest
/// below then. The counts add up to `cold`.
fn cold_shares(hot: &[Vec<usize>], cold: usize, batch: usize) -> Vec<usize> {
    let members = hot.len();
    let hot_draws: usize = hot.iter().map(Vec::len).sum();
    let mut out = vec![0usize; members];
    if members == 0 || hot_draws == 0 {
        return out;
    }
    let tail = |j: usize| hot[j].len() % batch;
    let mut by_tail: Vec<usize> = (0..members).filter(|&j| tail(j) > 0).collect();
    by_tail.sort_by_key(|&j| std::cmp::Reverse(tail(j)));
    let mut left = cold;
    for &j in &by_tail {
        let need = batch - tail(j);
        if need <= left {
            left -= need;
            out[j] = need;
        }
    }
    // Below its share by this much (the lowest index first on a tie).
    let neediest = |out: &[usize]| {
        let below = |j: usize| (cold as f64 * hot[j].len() as f64 / hot_draws as f64) - out[j] as f64;
        (0..members).max_by(|&a, &b| below(a).total_cmp(&below(b)).then(b.cmp(&a))).unwrap_or(0)
    };
    while left > 0 {
        let take = if left >= batch { batch } else { left };
        let j = neediest(&out);
        out[j] += take;
        left -= take;
    }
    out
}

/// The owner of each batch of `order` (`batch` draws each): the one most of its draws go
/// to by `routes` (the lowest index on a tie); a batch of draws any worker may take goes
/// round the members by its index.
pub fn batch_owners(order: &[u32], routes: &Owners, batch: usize, members: usize) -> Vec<u32> {
    let members = members.max(1);
    order
        .chunks(batch.max(1))
        .enumerate()
        .map(|(i, b)| {
            let mut count = vec![0usize; members];
            for &p in b {
                if let Some(c) = routes.owner(p).and_then(|o| count.get_mut(o)) {
                    *c += 1;
                }
            }
            if count.iter().all(|&c| c == 0) {
                return (i % members) as u32;
            }
            (0..members).max_by_key(|&j| (count[j], std::cmp::Reverse(j))).unwrap_or(0) as u32
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
        let three = owners(&keys, &hot, &members(3), None);
        let per = |o: &[u32], j: u32| (0..1000).filter(|&i| hot[i] && o[i] == j).count();
        // 100 hot samples over 3 equal caches: quotas of 34, and every hot sample placed.
        assert!((0..3).all(|j| per(&three, j) <= 34), "{:?}", (0..3).map(|j| per(&three, j)).collect::<Vec<_>>());
        assert_eq!((0..3).map(|j| per(&three, j)).sum::<usize>(), 100);
        // Cold samples: roughly a third each.
        let cold = |j: u32| (0..1000).filter(|&i| !hot[i] && three[i] == j).count();
        assert!((0..3).all(|j| (200..400).contains(&cold(j))));
        // The same inputs give the same placement.
        assert_eq!(owners(&keys, &hot, &members(3), None), three);
        // Worker 2 goes: the cold samples of workers 0 and 1 stay where they were.
        let two = owners(&keys, &hot, &members(2), None);
        assert!((0..1000).filter(|&i| !hot[i] && three[i] != 2).all(|i| two[i] == three[i]));
        assert_eq!((0..2).map(|j| per(&two, j)).collect::<Vec<_>>(), vec![50, 50]);
    }

    #[test]
    fn a_hot_sample_stays_where_the_draw_before_placed_it_while_its_worker_has_room() {
        let keys: Vec<u64> = (0..1000).map(|i| i * 7919).collect();
        let m = members(2);
        let hot1: Vec<bool> = (0..1000).map(|i| i % 10 == 0).collect();
        let order: Vec<u32> = (0..1000).collect();
        let first = owners(&keys, &hot1, &m, None);
        // The hot set moves a little: 10 samples leave it, 10 others join.
        let hot2: Vec<bool> = (0..1000).map(|i| (i % 10 == 0 && i >= 100) || (i % 10 == 5 && i < 100)).collect();
        let before = Previous { members: &m, owners: &first, hot: &hot1, order: &order };
        let second = owners(&keys, &hot2, &m, Some(before));
        let moved = (0..1000).filter(|&i| hot1[i] && hot2[i] && first[i] != second[i]).count();
        assert_eq!(moved, 0, "a hot sample that stays hot stays on its worker");
        for j in 0..2 {
            assert_eq!((0..1000).filter(|&i| hot2[i] && second[i] == j).count(), 50, "worker {j}'s quota");
        }
    }

    #[test]
    fn the_first_hot_set_keeps_on_each_worker_the_samples_it_met_first() {
        // The draw before had no hot set: each worker cached the first samples of its share
        // it met. Where a worker's first choices overflow its quota, the ones it met last
        // are the ones that move.
        let keys: Vec<u64> = (0..1000).map(|i| i * 104_729).collect();
        let m = members(2);
        let none = vec![false; 1000];
        let first = owners(&keys, &none, &m, None);
        let order: Vec<u32> = (0..1000).rev().collect();
        let met = |i: usize| 999 - i;
        // The hot set: the 100 samples met first, which overflow someone's quota of 50.
        let hot: Vec<bool> = (0..1000).map(|i| met(i) < 100).collect();
        let prefer = |j: u32| (0..1000).filter(|&i| hot[i] && first[i] == j).count();
        assert_ne!(prefer(0), 50, "the test needs a worker whose first choices overflow");
        let before = Previous { members: &m, owners: &first, hot: &none, order: &order };
        let placed = owners(&keys, &hot, &m, Some(before));
        for j in 0..2u32 {
            let kept = (0..1000).filter(|&i| hot[i] && first[i] == j && placed[i] == j).map(met).max();
            let moved = (0..1000).filter(|&i| hot[i] && first[i] == j && placed[i] != j).map(met).min();
            if let (Some(kept), Some(moved)) = (kept, moved) {
                assert!(kept < moved, "worker {j} kept a sample met at {kept} but gave away one met at {moved}");
            }
        }
    }

    /// Draws that go to a batch another worker owns (and so miss its cache).
    fn misplaced(order: &[u32], owners: &[u32], batch: usize) -> usize {
        let bo = batch_owners(order, &Owners::new(owners.to_vec()), batch, 2);
        order.chunks(batch).zip(&bo).map(|(b, &o)| b.iter().filter(|&&p| owners[p as usize] != o).count()).sum()
    }

    #[test]
    fn what_is_left_after_whole_tasks_and_batches_is_laid_out_to_mix_as_few_draws_as_can_be() {
        // Owner 0 draws 14 times, owner 1 11 times; tasks of 2 batches of 4. After one whole
        // task each, owner 0 has 6 left (a whole batch and 2) and owner 1 has 3: the 5 draws
        // of the tails fill a batch and 1, and the fewest that must share a batch with the
        // other owner's is 1 (3 of one owner's and 1 of the other's, then 1 alone).
        let owners: Vec<u32> = (0..40).map(|p| p % 2).collect();
        let zeros = (0..14).map(|i| 2 * i);
        let ones = (0..11).map(|i| 2 * i + 1);
        let mut order: Vec<u32> = zeros
            .zip(ones.chain(std::iter::repeat(u32::MAX)))
            .flat_map(|(a, b)| [a, b])
            .filter(|&p| p != u32::MAX)
            .collect();
        assert_eq!(order.len(), 25);
        regroup(&mut order, None, &Owners::new(owners.clone()), 25, 4, 8);
        assert_eq!(misplaced(&order, &owners, 4), 1, "{order:?}");
    }

    #[test]
    fn draws_outside_the_hot_set_fill_the_batches_the_owners_tails_leave_so_no_hot_draw_misses() {
        // As above, but positions 30.. are outside the hot set (cached by no one): 5 of
        // their draws go anywhere. The 2 hot tails (2 and 3 draws after whole batches) are
        // filled up to whole batches with them, and no hot draw lands in a batch another
        // worker owns; the weights stay with their draws.
        let placed: Vec<u32> = (0..40).map(|p| p % 2).collect();
        let hot: Vec<bool> = (0..40).map(|p| p < 30).collect();
        let route = routes(&placed, &hot);
        assert!((30..40).all(|p| route.owner(p).is_none()) && route.as_slice()[..30] == placed[..30]);
        let zeros = (0..7).flat_map(|i| [2 * i, 2 * i]);
        let ones = (0..5).map(|i| 2 * i + 1).chain([1]);
        let cold = 30..35;
        let mut order: Vec<u32> = zeros.chain(ones).chain(cold).collect();
        assert_eq!(order.len(), 25);
        let mut weights: Vec<f32> = order.iter().map(|&p| p as f32).collect();
        let mut before = order.clone();
        regroup(&mut order, Some(&mut weights), &route, 25, 4, 8);
        let bo = batch_owners(&order, &route, 4, 2);
        for (i, b) in order.chunks(4).enumerate() {
            assert!(
                b.iter().all(|&p| route.owner(p).is_none_or(|o| o as u32 == bo[i])),
                "batch {i} {b:?} of {order:?}"
            );
        }
        assert!(order.iter().zip(&weights).all(|(&p, &w)| w == p as f32), "each weight stays with its draw");
        let mut after = order.clone();
        before.sort_unstable();
        after.sort_unstable();
        assert_eq!(before, after, "the same draws");
    }

    #[test]
    fn draws_outside_the_hot_set_not_needed_to_fill_tails_stay_spread_over_the_epoch() {
        // 32 hot draws (16 per owner: whole tasks, no tails) and 16 of cold samples, drawn
        // among them: none is needed to fill a tail, so they ride in the owners' runs instead
        // of making the epoch's last batches all cold (and all heavily weighted).
        let placed: Vec<u32> = (0..64).map(|p| p % 2).collect();
        let hot: Vec<bool> = (0..64).map(|p| p < 32).collect();
        let route = routes(&placed, &hot);
        let mut order: Vec<u32> = (0..16).flat_map(|k| [2 * k, 2 * k + 1, 32 + k]).collect();
        regroup(&mut order, None, &route, 48, 4, 8);
        let last_hot = order.iter().rposition(|&p| p < 32).unwrap();
        let cold_before = order[..last_hot].iter().filter(|&&p| p >= 32).count();
        assert!(cold_before >= 8, "{cold_before} of 16 cold draws among the hot ones: {order:?}");
        let bo = batch_owners(&order, &route, 4, 2);
        for (i, b) in order.chunks(4).enumerate() {
            assert!(b.iter().all(|&p| route.owner(p).is_none_or(|o| o as u32 == bo[i])), "batch {i} {b:?}");
        }
    }

    #[test]
    fn every_batch_holds_about_the_epochs_share_of_cold_draws_as_a_local_batch_does() {
        // An epoch as the coverage sweep draws one on digits with half the dataset cached:
        // 1,257 draws in batches of 64 (the last of 41), tasks of 4 batches, 2 owners, about
        // a quarter of the draws cold (outside the hot set: weights near 2, against ~0.7 for
        // hot ones). Dealt in blocks of a batch, some batches had no cold draw, others 40%,
        // and the last ones were all cold: SGD's steps swung ~3x in size from batch to batch.
        let n = 1257usize;
        let hash = |i: usize, seed: u64| xxh3_64_with_seed(&(i as u64).to_le_bytes(), seed);
        let placed: Vec<u32> = (0..n).map(|p| (hash(p, 1) % 2) as u32).collect();
        let hot: Vec<bool> = (0..n).map(|p| hash(p, 2) % 2 == 0).collect();
        let (hot_at, cold_at): (Vec<usize>, Vec<usize>) = (0..n).partition(|&p| hot[p]);
        let route = routes(&placed, &hot);
        let mut order: Vec<u32> = (0..n)
            .map(|i| {
                let r = hash(i, 3);
                let pool = if r % 100 < 26 { &cold_at } else { &hot_at };
                pool[(r / 100) as usize % pool.len()] as u32
            })
            .collect();
        let mut weights: Vec<f32> = order.iter().map(|&p| if hot[p as usize] { 0.7 } else { 1.9 }).collect();
        let share = order.iter().filter(|&&p| !hot[p as usize]).count() as f64 / n as f64;
        regroup(&mut order, Some(&mut weights), &route, n, 64, 256);
        let bo = batch_owners(&order, &route, 64, 2);
        for (i, (b, w)) in order.chunks(64).zip(weights.chunks(64)).enumerate() {
            let cold = b.iter().filter(|&&p| !hot[p as usize]).count() as f64 / b.len() as f64;
            assert!((cold - share).abs() <= 0.08, "batch {i}: {cold:.2} of its draws cold, the epoch {share:.2}");
            assert!(b.iter().all(|&p| route.owner(p).is_none_or(|o| o as u32 == bo[i])), "batch {i} mixes owners");
            let mean = w.iter().sum::<f32>() / w.len() as f32;
            assert!((0.9..1.2).contains(&mean), "batch {i}: mean weight {mean:.2}");
        }
    }

    #[test]
    fn regrouping_keeps_the_multiset_and_the_weights_and_makes_whole_runs_one_owners() {
        let owners: Vec<u32> = (0..20).map(|p| p % 2).collect();
        let mut order: Vec<u32> = vec![3, 3, 0, 5, 2, 7, 4, 9, 11, 6, 13, 8, 1, 10, 15, 12, 17, 14, 19, 16];
        let mut weights: Vec<f32> = order.iter().map(|&p| p as f32 / 10.0).collect();
        let before = order.clone();
        // The last 2 draws are dropped by `drop_last`: they stay put.
        let owners = Owners::new(owners);
        regroup(&mut order, Some(&mut weights), &owners, 18, 4, 4);
        assert_eq!(&order[18..], &before[18..]);
        let mut a = order.clone();
        let mut b = before.clone();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "the same draws");
        assert!(order.iter().zip(&weights).all(|(&p, &w)| w == p as f32 / 10.0), "each weight stays with its draw");
        let bo = batch_owners(&order[..16], &owners, 4, 2);
        for (i, run) in order[..16].chunks(4).enumerate() {
            assert!(run.iter().all(|&p| owners.owner(p) == Some(bo[i] as usize)), "run {i} {run:?} is one owner's");
        }
        assert_eq!(bo, vec![0, 1, 0, 1], "owners' runs interleaved");
    }
}
