//! The importance-driven samplers, each drawing an epoch from the scores the trainer
//! reported:
//!
//! * [`importance_draw`], sluice's own: a coverage sweep that visits every sample once in
//!   every `coverage_epochs` epochs, the rest of the epoch drawn ∝ smoothed score with a
//!   uniform floor, and weights that keep the loss unbiased over each coverage cycle
//!   (design: docs/importance-sampling.md);
//! * [`fastmatch_draw`], FastMatch's Algorithm 1 as published (a baseline);
//! * [`shade_draw`], SHADE's sampler as published: n draws with replacement ∝ rank score.

use sluice_core::SampleRng;

use super::{permutation, EpochDraw, COVERAGE_STREAM, EPOCH_KEY, FASTMATCH_STREAM, IMPORTANCE_STREAM, SHADE_STREAM};

/// The knobs of [`importance_draw`] (see `SamplingSpec::Importance`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImportanceParams {
    pub floor: f64,
    pub coverage_epochs: u32,
    pub miss_discount: f64,
    pub max_draws: f64,
}

/// What the importance samplers know about each manifest position at the start of an epoch.
#[derive(Debug, Clone, Copy)]
pub struct ImportanceView<'a> {
    /// Smoothed score per position (loss or gradient norm, ≥ 0); `None` if never reported.
    pub scores: &'a [Option<f64>],
    /// Which positions are in the cache's hot set (see [`hot_set`]), if there is a cache.
    pub hot: Option<&'a [bool]>,
}

/// sluice's importance sampler: a coverage sweep (every sample once in every
/// `coverage_epochs` epochs), the rest drawn ∝ smoothed score with a floor, a ceiling and a
/// miss discount outside the hot set, and weights `1/E[draws per epoch]` averaged over the
/// coverage cycle. Design and derivation: `docs/importance-sampling.md`.
pub fn importance_draw(
    n: usize,
    seed: u64,
    epoch: u64,
    params: ImportanceParams,
    view: ImportanceView<'_>,
) -> EpochDraw {
    let ImportanceParams { floor, coverage_epochs, miss_discount, max_draws } = params;
    let Some(mut a) = filled_scores(view.scores, n) else {
        return uniform_draw(n, seed, epoch);
    };
    let in_hot: Vec<bool> = match view.hot.filter(|h| h.len() == n) {
        Some(h) => h.to_vec(),
        None => vec![true; n],
    };
    for (x, &h) in a.iter_mut().zip(&in_hot) {
        if !h {
            *x *= miss_discount;
        }
    }
    let total: f64 = a.iter().sum();
    let floor = floor.clamp(f64::MIN_POSITIVE, 1.0);
    let mut q: Vec<f64> = if total > 0.0 {
        a.iter().map(|&x| (1.0 - floor) * x / total + floor / n as f64).collect()
    } else {
        // Every scored sample is outside the hot set and discounted to nothing.
        vec![1.0 / n as f64; n]
    };
    cap_probabilities(&mut q, max_draws / n as f64, &in_hot);

    finish_draw(n, seed, epoch, coverage_epochs, q)
}

/// The coverage sweep, the draws and the weights, from the final per-draw probabilities `q`.
///
/// Every sample has a fixed phase in `0..k` (its rank in a permutation of the seed, mod k):
/// epoch `e` visits the samples of phase `e mod k` once each, so every sample is seen once
/// in every k consecutive epochs whatever its score. The other `r` slots are draws with
/// replacement from `q`. Over a cycle of k epochs sample i then expects `1 + k·r̄·q_i`
/// appearances (`r̄ = n − n/k`, the mean of `r`), i.e. `c_i = 1/k + r̄·q_i` per epoch, and
/// every appearance carries the weight `1/c_i`: the weighted loss summed over a cycle is an
/// unbiased estimate of k uniform epochs' loss, and no weight exceeds k.
fn finish_draw(n: usize, seed: u64, epoch: u64, coverage_epochs: u32, q: Vec<f64>) -> EpochDraw {
    let k = coverage_epochs.max(1) as usize;
    let phase_now = (epoch % k as u64) as usize;
    let mut order: Vec<u32> = permutation_with(n, seed, COVERAGE_STREAM)
        .into_iter()
        .enumerate()
        .filter(|&(rank, _)| rank % k == phase_now)
        .map(|(_, i)| i)
        .collect();
    let r = n - order.len();

    let mut rng = SampleRng::new(seed, epoch, EPOCH_KEY, IMPORTANCE_STREAM);
    order.extend(draw_with_replacement(&q, r, &mut rng));
    shuffle(&mut order, &mut rng);

    let k = k as f64;
    let mean_draws = n as f64 - n as f64 / k;
    let expected: Vec<f64> = q.iter().map(|&qi| 1.0 / k + mean_draws * qi).collect();
    let weights = order.iter().map(|&i| (1.0 / expected[i as usize]) as f32).collect();
    EpochDraw { order, weights: Some(weights), expected }
}

/// A permutation of 0..n fixed by the seed alone (one per `stream`), the same every epoch.
fn permutation_with(n: usize, seed: u64, stream: u64) -> Vec<u32> {
    let mut rng = SampleRng::new(seed, 0, EPOCH_KEY, stream);
    let mut order: Vec<u32> = (0..n as u32).collect();
    shuffle(&mut order, &mut rng);
    order
}

/// Every position's score for the samplers: the reported score where there is a valid
/// one, the mean of the valid ones elsewhere (unseen is not unimportant). `None` while no
/// sample has a positive score (the samplers are uniform then).
///
/// The samplers use the scores only relative to each other, so huge ones are first scaled
/// down by a power of two (exactly, see [`power_of_two_scale`]): no sum over them overflows.
fn filled_scores(scores: &[Option<f64>], n: usize) -> Option<Vec<f64>> {
    let valid = |s: Option<f64>| s.filter(|s| s.is_finite() && *s >= 0.0);
    let scale = power_of_two_scale(scores.iter().copied().filter_map(valid).fold(0.0, f64::max));
    let valid = |s: Option<f64>| valid(s).map(|s| s * scale);
    let known: Vec<f64> = scores.iter().copied().filter_map(valid).collect();
    let mean = known.iter().sum::<f64>() / known.len().max(1) as f64;
    if known.is_empty() || mean <= 0.0 || n == 0 {
        return None;
    }
    Some((0..n).map(|i| valid(scores.get(i).copied().flatten()).unwrap_or(mean)).collect())
}

/// Largest value a score may have before the samplers scale the scores down: a sum of up to
/// 2⁶⁴ such values stays finite.
const SCALE_ABOVE: f64 = 1e280;

/// A power of two that brings `max` (a finite, non-negative largest score) down to [2, 4)
/// when it is above [`SCALE_ABOVE`], else 1. Multiplying by a power of two is exact (but
/// for values so small next to `max` that they count for nothing), so proportions, and so
/// every draw, are those of the unscaled scores.
fn power_of_two_scale(max: f64) -> f64 {
    if max > SCALE_ABOVE && max.is_finite() {
        // max = m·2^e, m in [1, 2) (it is normal); 2^(1−e) has the biased exponent 1024 − e,
        // at least 1: a normal number, built exactly.
        let e = ((max.to_bits() >> 52) & 0x7ff) as i64 - 1023;
        f64::from_bits(((1024 - e) as u64) << 52)
    } else {
        1.0
    }
}

/// How many times an outsider's score must exceed an insider's before it takes the
/// insider's place in the hot set (see [`hot_set`]).
pub const HOT_SET_MARGIN: f64 = 2.0;

/// An outsider joins the hot set only if score-proportional sampling would give it at
/// least this many times the floor's share of the draws (see [`hot_set`]).
pub const PROMOTION_OVER_FLOOR: f64 = 4.0;

/// The cache's hot set for the next epoch: the `size` highest scores, with hysteresis: an
/// outsider replaces an insider only while its score is over `margin` times the insider's
/// and over [`PROMOTION_OVER_FLOOR`] times the floor's share. Why: `docs/importance-sampling.md`.
pub fn hot_set(scores: &[Option<f64>], size: usize, previous: Option<&[bool]>, margin: f64, floor: f64) -> Vec<bool> {
    let n = scores.len();
    let a = filled_scores(scores, n).unwrap_or_else(|| vec![0.0; n]);
    let floor = floor.clamp(0.0, 0.999);
    let significant = PROMOTION_OVER_FLOOR * floor / (1.0 - floor) * a.iter().sum::<f64>() / n.max(1) as f64;
    let by_score = |mut v: Vec<usize>, descending: bool| {
        v.sort_by(|&x, &y| {
            let c = a[x].total_cmp(&a[y]).then(y.cmp(&x));
            if descending {
                c.reverse()
            } else {
                c
            }
        });
        v
    };
    let mut hot = vec![false; n];
    let previous = previous.filter(|p| p.len() == n && p.iter().filter(|&&h| h).count() == size.min(n));
    let Some(prev) = previous else {
        for i in by_score((0..n).collect(), true).into_iter().take(size) {
            hot[i] = true;
        }
        return hot;
    };
    hot.copy_from_slice(prev);
    let insiders = by_score((0..n).filter(|&i| prev[i]).collect(), false);
    let outsiders = by_score((0..n).filter(|&i| !prev[i]).collect(), true);
    for (&o, &i) in outsiders.iter().zip(&insiders) {
        if a[o] <= margin * a[i] || a[o] <= significant {
            break;
        }
        hot[o] = true;
        hot[i] = false;
    }
    hot
}

/// Caps every probability at `cap` and water-fills the excess into the uncapped samples of
/// the hot set (`receives`), then into the rest; the sum stays 1. Why the hot set first:
/// `docs/importance-sampling.md`.
fn cap_probabilities(q: &mut [f64], cap: f64, receives: &[bool]) {
    if cap * q.len() as f64 <= 1.0 {
        // Only the uniform distribution keeps every sample at or under a cap of 1/n (the
        // tightest `max_draws` allows, 1): the ceiling is at its strictest, not off.
        q.fill(1.0 / q.len() as f64);
        return;
    }
    let (hot, rest): (Vec<usize>, Vec<usize>) = (0..q.len()).partition(|&i| receives.get(i).copied().unwrap_or(true));
    let mut rest_mass = 0.0;
    for &i in &rest {
        q[i] = q[i].min(cap);
        rest_mass += q[i];
    }
    let hot_target = 1.0 - rest_mass;
    if hot_target <= hot.len() as f64 * cap {
        water_fill(q, &hot, hot_target, cap);
    } else {
        hot.iter().for_each(|&i| q[i] = cap);
        water_fill(q, &rest, 1.0 - hot.len() as f64 * cap, cap);
    }
}

/// Scales the probabilities of `members` so that they sum to `target` with none above
/// `cap`: the largest are set to `cap`, the others multiplied by one common factor
/// (exact water-filling, O(m log m)).
fn water_fill(q: &mut [f64], members: &[usize], target: f64, cap: f64) {
    let mut by_p: Vec<usize> = members.to_vec();
    by_p.sort_by(|&x, &y| q[y].total_cmp(&q[x]).then(x.cmp(&y)));
    let mut rest: f64 = by_p.iter().map(|&i| q[i]).sum();
    for (j, &i) in by_p.iter().enumerate() {
        let scale = (target - j as f64 * cap) / rest;
        if rest > 0.0 && scale * q[i] <= cap {
            by_p[..j].iter().for_each(|&k| q[k] = cap);
            by_p[j..].iter().for_each(|&k| q[k] *= scale);
            return;
        }
        rest -= q[i];
    }
    by_p.iter().for_each(|&k| q[k] = cap);
}

/// FastMatch's Algorithm 1, faithfully: scores normalised `(g − median)/IQR`, a Gaussian
/// centred on `max(V)` with σ the RMS distance to it, normalised, then a softmax over
/// those probabilities, then n draws with replacement (sluice's reading of line 7, which
/// gives neither the count nor the replacement). No weights (the paper has none).
///
/// Two guards keep it defined where the paper is not: an IQR of 0 normalises by 1, and
/// σ = 0 (all scores equal) draws uniformly. Uniform permutation until scores exist.
/// The Gaussian depends only on each distance over σ, so the distances are taken halved and
/// over the largest one: the same probabilities, and no overflow whatever the scores.
pub fn fastmatch_draw(n: usize, seed: u64, epoch: u64, scores: &[Option<f64>]) -> EpochDraw {
    if n == 0 || scores.iter().all(Option::is_none) {
        return uniform_draw(n, seed, epoch);
    }
    let v = fastmatch_normalise(scores);
    let mu = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // Halved distances to the maximum: at most f64::MAX, so finite.
    let d: Vec<f64> = v.iter().map(|x| mu / 2.0 - x / 2.0).collect();
    let longest = d.iter().copied().fold(0.0, f64::max);
    let p: Vec<f64> = if longest > 0.0 {
        // r in [0, 1] with at least one 1: σ_r ≥ 1/√n, never 0.
        let r: Vec<f64> = d.iter().map(|x| x / longest).collect();
        let sigma = (r.iter().map(|x| x * x).sum::<f64>() / n as f64).sqrt();
        // The Gaussian's constant 1/(σ√2π) cancels in the normalisation just after.
        let g: Vec<f64> = r.iter().map(|x| (-(x * x) / (2.0 * sigma * sigma)).exp()).collect();
        // The maximum's own term is exp(0) = 1: the sum is at least 1.
        let sum: f64 = g.iter().sum();
        let normalised: Vec<f64> = g.iter().map(|x| x / sum).collect();
        softmax(&normalised)
    } else {
        vec![1.0 / n as f64; n]
    };
    let mut rng = SampleRng::new(seed, epoch, EPOCH_KEY, FASTMATCH_STREAM);
    let order = draw_with_replacement(&p, n, &mut rng);
    let expected = p.iter().map(|x| x * n as f64).collect();
    EpochDraw { order, weights: None, expected }
}

/// FastMatch's score normalisation `(g − median)/IQR` over the known scores; unknown
/// positions get 0 (the median). An IQR of 0 divides by 1. Computed on halves (exact), so
/// no difference overflows; a quotient past `f64::MAX` (a tiny IQR) is held at ±`f64::MAX`.
pub fn fastmatch_normalise(scores: &[Option<f64>]) -> Vec<f64> {
    let mut known: Vec<f64> = scores.iter().flatten().copied().filter(|x| x.is_finite()).map(|x| x / 2.0).collect();
    known.sort_by(f64::total_cmp);
    let q = |f: f64| -> f64 {
        if known.is_empty() {
            return 0.0;
        }
        let pos = f * (known.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        known[lo] + (known[hi] - known[lo]) * (pos - lo as f64)
    };
    let median = q(0.5);
    let iqr = q(0.75) - q(0.25);
    let iqr = if iqr > 0.0 { iqr } else { 0.5 };
    scores
        .iter()
        .map(|s| s.filter(|x| x.is_finite()).map_or(0.0, |x| ((x / 2.0 - median) / iqr).clamp(-f64::MAX, f64::MAX)))
        .collect()
}

fn softmax(p: &[f64]) -> Vec<f64> {
    let max = p.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = p.iter().map(|x| (x - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

/// SHADE's sampler as published: n draws with replacement, probability ∝ the rank score
/// (unscored samples get the mean). No coverage, no weights.
pub fn shade_draw(n: usize, seed: u64, epoch: u64, rank_scores: &[Option<f64>]) -> EpochDraw {
    let known: Vec<f64> = rank_scores.iter().flatten().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    if n == 0 || known.is_empty() {
        return uniform_draw(n, seed, epoch);
    }
    let scale = power_of_two_scale(known.iter().copied().fold(0.0, f64::max));
    let mean = known.iter().map(|x| x * scale).sum::<f64>() / known.len() as f64;
    let a: Vec<f64> = (0..n)
        .map(|i| {
            rank_scores.get(i).copied().flatten().filter(|x| x.is_finite() && *x > 0.0).map_or(mean, |x| x * scale)
        })
        .collect();
    let total: f64 = a.iter().sum();
    let p: Vec<f64> = a.iter().map(|x| x / total).collect();
    let mut rng = SampleRng::new(seed, epoch, EPOCH_KEY, SHADE_STREAM);
    let order = draw_with_replacement(&p, n, &mut rng);
    let expected = p.iter().map(|x| x * n as f64).collect();
    EpochDraw { order, weights: None, expected }
}

/// A permutation with unit weights: what every importance sampler does before it has scores.
fn uniform_draw(n: usize, seed: u64, epoch: u64) -> EpochDraw {
    EpochDraw { order: permutation(n, seed, epoch), weights: Some(vec![1.0; n]), expected: vec![1.0; n] }
}

/// `count` independent draws from the distribution `p` (sums to ~1), by inverting its CDF.
fn draw_with_replacement(p: &[f64], count: usize, rng: &mut SampleRng) -> Vec<u32> {
    let mut cdf = Vec::with_capacity(p.len());
    let mut acc = 0.0;
    for &x in p {
        acc += x;
        cdf.push(acc);
    }
    let total = acc;
    (0..count)
        .map(|_| {
            let u = rng.next_f64() * total;
            cdf.partition_point(|&c| c <= u).min(p.len() - 1) as u32
        })
        .collect()
}

fn shuffle(v: &mut [u32], rng: &mut SampleRng) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::ShuffleSpec;

    use super::*;
    use crate::sampler::{epoch_order, Shard};

    fn p(floor: f64, coverage_epochs: u32, miss_discount: f64) -> ImportanceParams {
        ImportanceParams { floor, coverage_epochs, miss_discount, max_draws: 1e9 }
    }

    /// `n·q_i`, each sample's expected draws from the proposal alone (no coverage sweep),
    /// recovered from a draw's cycle-averaged `expected` (`1/k + (n − n/k)·q_i`).
    fn proposal_draws(d: &EpochDraw, k: u32) -> Vec<f64> {
        let inv = 1.0 / f64::from(k);
        d.expected.iter().map(|e| (e - inv) / (1.0 - inv)).collect()
    }

    #[test]
    fn the_ceiling_caps_expected_draws_and_keeps_the_weights_unbiased() {
        let n = 100;
        let mut scores = vec![Some(0.01); n];
        scores[3] = Some(1000.0);
        scores[7] = Some(500.0);
        let view = ImportanceView { scores: &scores, hot: None };
        let params = ImportanceParams { floor: 0.02, coverage_epochs: 100, miss_discount: 1.0, max_draws: 4.0 };
        let d = importance_draw(n, 1, 1, params, view);
        assert!(d.expected.iter().all(|&e| e <= 4.0 + 1e-9), "{:?}", &d.expected[..8]);
        let nq = proposal_draws(&d, 100);
        assert!((nq[3] - 4.0).abs() < 1e-9 && (nq[7] - 4.0).abs() < 1e-9);
        assert!((d.expected.iter().sum::<f64>() - n as f64).abs() < 1e-6);
        let uncapped = importance_draw(n, 1, 1, ImportanceParams { max_draws: 1e9, ..params }, view);
        assert!(proposal_draws(&uncapped, 100)[3] > 50.0, "without the ceiling one outlier takes half the epoch");
    }

    #[test]
    fn a_ceiling_of_one_draw_holds_and_makes_the_draw_uniform() {
        // max_draws = 1 is the tightest ceiling validation allows; it used to switch the
        // ceiling off (the cap was treated as unreachable), letting one outlier take the epoch.
        let n = 100;
        let mut scores = vec![Some(0.01); n];
        scores[3] = Some(1000.0);
        for hot in [None, Some((0..n).map(|i| i < 50).collect::<Vec<bool>>())] {
            let view = ImportanceView { scores: &scores, hot: hot.as_deref() };
            let params = ImportanceParams { floor: 0.05, coverage_epochs: 100, miss_discount: 0.5, max_draws: 1.0 };
            let d = importance_draw(n, 1, 1, params, view);
            assert!(d.expected.iter().all(|&e| (e - 1.0).abs() < 1e-9), "sample 3 expects {} draws", d.expected[3]);
            assert!(d.weights.unwrap_or_default().iter().all(|&w| (w - 1.0).abs() < 1e-6));
        }
    }

    #[test]
    fn the_ceilings_excess_goes_to_the_hot_set_not_to_samples_outside_the_cache() {
        let n = 100;
        let mut scores = vec![Some(0.01); n];
        scores[3] = Some(1000.0);
        scores[7] = Some(500.0);
        let hot: Vec<bool> = (0..n).map(|i| i < 50).collect();
        let view = ImportanceView { scores: &scores, hot: Some(&hot) };
        let (floor, disc) = (0.05, 0.1);
        let params = ImportanceParams { floor, coverage_epochs: 100, miss_discount: disc, max_draws: 4.0 };
        let d = importance_draw(n, 1, 1, params, view);
        let nq = proposal_draws(&d, 100);
        // Outside the hot set: exactly the pre-ceiling probability (floor + discounted score).
        let total = 1000.0 + 500.0 + 48.0 * 0.01 + 50.0 * 0.01 * disc;
        let cold = n as f64 * ((1.0 - floor) * 0.01 * disc / total + floor / n as f64);
        for (i, x) in nq.iter().enumerate().skip(50) {
            assert!((x - cold).abs() < 1e-9, "sample {i}: {x} vs {cold}");
        }
        // The hot set absorbs the rest: capped outliers, every other hot sample raised alike.
        assert!((nq[3] - 4.0).abs() < 1e-9 && (nq[7] - 4.0).abs() < 1e-9);
        let hot_rest = (n as f64 - 8.0 - 50.0 * cold) / 48.0;
        assert!((0..50).filter(|i| ![3, 7].contains(i)).all(|i| (nq[i] - hot_rest).abs() < 1e-9));
        assert!(hot_rest > 10.0 * cold, "hot {hot_rest} cold {cold}");
        assert!((d.expected.iter().sum::<f64>() - n as f64).abs() < 1e-6);
        assert!(d.weights.unwrap_or_default().iter().all(|&w| w <= (1.0 / floor) as f32 + 1e-3));
    }

    #[test]
    fn the_hot_set_keeps_near_ties_and_admits_clearly_higher_significant_scores() {
        let n = 10;
        // Mean score 0.69: with floor 0.05 an outsider must score above 4·0.05/0.95·0.69 ≈ 0.145.
        let base = [3.0, 2.0, 1.0, 0.5, 0.1, 0.09, 0.08, 0.07, 0.06, 0.0];
        let scores: Vec<Option<f64>> = base.iter().map(|&x| Some(x)).collect();
        let top = hot_set(&scores, 4, None, HOT_SET_MARGIN, 0.05);
        assert_eq!(top, (0..n).map(|i| i < 4).collect::<Vec<_>>(), "no previous set: the top 4");
        // Previous set {0, 1, 2, 5}: 3 (0.5) vs the lowest insider 5 (0.09): > 2× and
        // significant, so it is swapped in.
        let prev: Vec<bool> = (0..n).map(|i| [0, 1, 2, 5].contains(&i)).collect();
        assert_eq!(hot_set(&scores, 4, Some(&prev), HOT_SET_MARGIN, 0.05), top);
        // Previous set {0, 1, 3, 4} with 2 (1.0) outside: 1.0 > 2·0.1, so 2 replaces 4.
        let prev: Vec<bool> = (0..n).map(|i| [0, 1, 3, 4].contains(&i)).collect();
        assert_eq!(hot_set(&scores, 4, Some(&prev), HOT_SET_MARGIN, 0.05), top);
        // A near tie stays: set {0, 1, 2, 4}; outsider 3 (0.5) is more than 2× 4 (0.1)...
        let prev: Vec<bool> = (0..n).map(|i| [0, 1, 2, 4].contains(&i)).collect();
        assert_eq!(hot_set(&scores, 4, Some(&prev), HOT_SET_MARGIN, 0.05), top);
        // ...but with 4 at 0.3 it is not: no swap.
        let mut tie = base;
        tie[4] = 0.3;
        let tie: Vec<Option<f64>> = tie.iter().map(|&x| Some(x)).collect();
        assert_eq!(hot_set(&tie, 4, Some(&prev), HOT_SET_MARGIN, 0.05), prev);
        // Insignificant outsiders do not churn the set, however large the ratio: set
        // {0, 1, 2, 9} keeps 9 (score 0) against 4 (0.1, below the threshold, now ≈ 0.135).
        let prev: Vec<bool> = (0..n).map(|i| [0, 1, 2, 9].contains(&i)).collect();
        let mut low = base;
        low[3] = 0.0;
        let low: Vec<Option<f64>> = low.iter().map(|&x| Some(x)).collect();
        assert_eq!(hot_set(&low, 4, Some(&prev), HOT_SET_MARGIN, 0.05), prev);
        // A previous set of another size is ignored.
        assert_eq!(hot_set(&scores, 3, Some(&prev), HOT_SET_MARGIN, 0.05).iter().filter(|&&h| h).count(), 3);
    }

    fn heavy_tailed(n: usize) -> Vec<Option<f64>> {
        (0..n).map(|i| Some(if i % 10 == 0 { 5.0 } else { 0.01 + (i % 7) as f64 * 0.01 })).collect()
    }

    #[test]
    fn importance_is_uniform_until_scores_exist() {
        let n = 50;
        let none = vec![None; n];
        let d = importance_draw(n, 1, 0, p(0.02, 5, 0.3), ImportanceView { scores: &none, hot: None });
        assert_eq!(d.order, epoch_order(n, 1, 0, ShuffleSpec::Global, Shard::default()));
        assert!(d.weights.unwrap().iter().all(|&w| w == 1.0));
    }

    #[test]
    fn importance_floor_keeps_every_sample_reachable_and_bounds_weights() {
        let n = 200;
        let mut scores = vec![Some(0.0); n];
        scores[0] = Some(1000.0);
        let floor = 0.1;
        let d = importance_draw(n, 3, 1, p(floor, 100, 1.0), ImportanceView { scores: &scores, hot: None });
        // Every sample keeps probability ≥ floor/n per draw, so expects ≥ floor draws per epoch.
        for (i, e) in d.expected.iter().enumerate() {
            assert!(*e >= floor * (1.0 - 1e-9), "sample {i} expects {e} draws");
        }
        assert!(d.weights.unwrap().iter().all(|&w| w <= (1.0 / floor) as f32 + 1e-3));
        // Over many epochs each zero-score sample does get drawn.
        let mut drawn = vec![false; n];
        for e in 1..150 {
            for &i in &importance_draw(n, 3, e, p(floor, 100, 1.0), ImportanceView { scores: &scores, hot: None }).order
            {
                drawn[i as usize] = true;
            }
        }
        assert!(drawn.iter().all(|&d| d), "floor left a sample unreachable");
    }

    #[test]
    fn importance_coverage_visits_every_sample_in_every_k_consecutive_epochs() {
        let n = 100;
        let scores = heavy_tailed(n);
        let k = 4u32;
        let mut seen_in: Vec<Vec<bool>> = Vec::new();
        for e in 0..20u64 {
            let d = importance_draw(
                n,
                9,
                e,
                p(0.001, k, 0.3),
                ImportanceView { scores: &scores, hot: Some(&hot_set(&scores, 20, None, HOT_SET_MARGIN, 0.001)) },
            );
            assert_eq!(d.order.len(), n);
            let mut seen = vec![false; n];
            for &i in &d.order {
                seen[i as usize] = true;
            }
            seen_in.push(seen);
        }
        for start in 0..=(20 - k as usize) {
            let window = &seen_in[start..start + k as usize];
            let unseen: Vec<usize> = (0..n).filter(|&i| !window.iter().any(|s| s[i])).collect();
            assert!(unseen.is_empty(), "samples {unseen:?} unseen in epochs {start}..{}", start + k as usize);
        }
    }

    #[test]
    fn importance_weights_make_the_weighted_mean_unbiased() {
        let n = 300;
        let scores = heavy_tailed(n);
        let losses: Vec<f64> = (0..n).map(|i| scores[i].unwrap_or(0.0) * 0.8 + (i % 3) as f64 * 0.05).collect();
        let uniform_mean = losses.iter().sum::<f64>() / n as f64;
        let hot60 = hot_set(&scores, 60, None, HOT_SET_MARGIN, 0.05);
        let view = ImportanceView { scores: &scores, hot: Some(&hot60) };
        // Exactly, in expectation: Σ_i c_i · w_i · L_i / n equals the uniform mean.
        let d = importance_draw(n, 5, 7, p(0.05, 4, 0.3), view);
        let exact: f64 = (0..n).map(|i| d.expected[i] * (1.0 / d.expected[i]) * losses[i]).sum::<f64>() / n as f64;
        assert!((exact - uniform_mean).abs() < 1e-9);
        assert!((d.expected.iter().sum::<f64>() - n as f64).abs() < 1e-6, "an epoch has n slots");
        // And empirically, averaged over many epochs' draws (seeds vary, state fixed).
        let mut est = 0.0;
        let trials = 400;
        for seed in 0..trials {
            let d = importance_draw(n, seed, 7, p(0.05, 4, 0.3), view);
            let w = d.weights.unwrap();
            est += d.order.iter().zip(&w).map(|(&i, &w)| f64::from(w) * losses[i as usize]).sum::<f64>() / n as f64;
        }
        est /= trials as f64;
        assert!((est - uniform_mean).abs() < 0.01 * uniform_mean, "weighted {est} vs uniform {uniform_mean}");
        // The sampler does concentrate: high scorers are drawn far more often than low ones.
        assert!(d.expected[10] > 5.0 * d.expected[4], "{} vs {}", d.expected[10], d.expected[4]);
    }

    #[test]
    fn over_a_coverage_cycle_the_weighted_loss_is_exactly_unbiased() {
        let n = 301;
        let k = 3u32;
        let scores = heavy_tailed(n);
        let losses: Vec<f64> = (0..n).map(|i| scores[i].unwrap_or(0.0) * 0.8 + (i % 3) as f64 * 0.05).collect();
        let hot = hot_set(&scores, n / 2, None, HOT_SET_MARGIN, 0.05);
        let view = ImportanceView { scores: &scores, hot: Some(&hot) };
        let params = ImportanceParams { floor: 0.05, coverage_epochs: k, miss_discount: 0.1, max_draws: 4.0 };
        // The sweeps of one cycle visit every sample exactly once; with the draws' expected
        // counts the cycle's weighted loss is exactly k uniform epochs' loss.
        let mut sweeps = vec![0u32; n];
        let mut exact = 0.0;
        for e in 6..6 + u64::from(k) {
            let d = importance_draw(n, 4, e, params, view);
            let w = d.weights.clone().unwrap_or_default();
            assert!(
                w.iter().all(|&w| w <= k as f32 * (1.0 + 1e-6)),
                "a weight above k: {:?}",
                w.iter().copied().fold(0.0, f32::max)
            );
            let phase: Vec<u32> = permutation_with(n, 4, COVERAGE_STREAM)
                .into_iter()
                .enumerate()
                .filter(|&(rank, _)| rank as u64 % u64::from(k) == e % u64::from(k))
                .map(|(_, i)| i)
                .collect();
            let r = (n - phase.len()) as f64;
            phase.iter().for_each(|&i| sweeps[i as usize] += 1);
            let q: Vec<f64> = proposal_draws(&d, k).iter().map(|x| x / n as f64).collect();
            exact += (0..n)
                .map(|i| (f64::from(u8::from(phase.contains(&(i as u32)))) + r * q[i]) / d.expected[i] * losses[i])
                .sum::<f64>();
        }
        assert!(sweeps.iter().all(|&c| c == 1), "the sweeps of a cycle must partition the samples");
        let uniform: f64 = losses.iter().sum::<f64>() * f64::from(k);
        assert!((exact - uniform).abs() < 1e-9 * uniform, "cycle {exact} vs k uniform epochs {uniform}");
    }

    #[test]
    fn importance_is_a_pure_function_of_seed_epoch_and_state() {
        let n = 64;
        let scores = heavy_tailed(n);
        let hot10 = hot_set(&scores, 10, None, HOT_SET_MARGIN, 0.02);
        let v = ImportanceView { scores: &scores, hot: Some(&hot10) };
        assert_eq!(importance_draw(n, 1, 2, p(0.02, 5, 0.3), v), importance_draw(n, 1, 2, p(0.02, 5, 0.3), v));
        assert_ne!(
            importance_draw(n, 1, 2, p(0.02, 5, 0.3), v).order,
            importance_draw(n, 1, 3, p(0.02, 5, 0.3), v).order
        );
    }

    #[test]
    fn fastmatch_is_faithful_including_its_flattening_softmax() {
        let n = 1000;
        let scores: Vec<Option<f64>> = (0..n).map(|i| Some(i as f64)).collect();
        let d = fastmatch_draw(n, 1, 0, &scores);
        assert_eq!(d.order.len(), n);
        assert!(d.weights.is_none());
        // Softmax over probabilities that sum to 1: max/min of the final p is at most e.
        let p: Vec<f64> = d.expected.iter().map(|e| e / n as f64).collect();
        let (max, min) = p.iter().fold((0.0f64, 1.0f64), |(a, b), &x| (a.max(x), b.min(x)));
        assert!(max / min <= std::f64::consts::E + 1e-9 && max / min > 1.0, "ratio {}", max / min);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        // σ = 0 (all scores equal) does not produce NaN: uniform.
        let flat = vec![Some(2.0); 10];
        let d = fastmatch_draw(10, 1, 0, &flat);
        assert!(d.expected.iter().all(|e| (e - 1.0).abs() < 1e-12));
        assert_eq!(
            fastmatch_normalise(&[Some(1.0), Some(2.0), Some(3.0), Some(4.0), Some(5.0)]),
            vec![-1.0, -0.5, 0.0, 0.5, 1.0]
        );
    }

    /// Issue 25 item 5: why FastMatch's Algorithm 1 reaches a hit rate ≈ the cache fraction in
    /// sluice's harness where the paper reports 96% at "a cache size of 50".
    #[test]
    fn fastmatch_hit_rate_is_the_cache_fraction_unless_the_cache_holds_every_distinct_sample() {
        let n = 1000;
        let epochs = 10u64;
        // Gradient-norm-like scores: log-normal-ish, heavy right tail.
        let scores: Vec<Option<f64>> = (0..n).map(|i| Some((4.0 * ((i * 7919) % n) as f64 / n as f64).exp())).collect();
        let by_score = |c: f64| -> Vec<bool> {
            let v = fastmatch_normalise(&scores);
            let mut idx: Vec<usize> = (0..n).collect();
            idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
            let mut top = vec![false; n];
            idx[..(c * n as f64) as usize].iter().for_each(|&i| top[i] = true);
            top
        };
        // Setup A (sluice's harness): the cache holds the fraction c with the highest scores
        // (what the `fastmatch` policy keeps); every draw of Algorithm 1 is a lookup. Line 6's
        // softmax over probabilities summing to 1 leaves the draws nearly uniform: hit ≈ c.
        for c in [0.25, 0.5] {
            let top = by_score(c);
            let (mut hits, mut draws) = (0usize, 0usize);
            for epoch in 1..=epochs {
                let d = fastmatch_draw(n, 3, epoch, &scores);
                hits += d.order.iter().filter(|&&i| top[i as usize]).count();
                draws += d.order.len();
            }
            let hit = hits as f64 / draws as f64;
            eprintln!("setup A, cache {c}: fastmatch {hit:.3}");
            assert!((hit - c).abs() < 0.02, "setup A, cache {c}: hit rate {hit}");
        }
        // Even without line 6 (lines 2–5 alone), a Gaussian with σ the RMS distance to the
        // maximum puts at most c / (c + (1−c)·e^(−1/(2(1−c)))) of its mass on any fraction c
        // of the samples (Jensen on the rest): 0.731 at c = 0.5, whatever the scores.
        let gaussian_top_half = |v: &[f64]| -> f64 {
            let mu = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s2 = v.iter().map(|x| (x - mu) * (x - mu)).sum::<f64>() / v.len() as f64;
            let mut g: Vec<f64> = v.iter().map(|x| (-(x - mu) * (x - mu) / (2.0 * s2)).exp()).collect();
            g.sort_by(|a, b| b.total_cmp(a));
            g[..v.len() / 2].iter().sum::<f64>() / g.iter().sum::<f64>()
        };
        let bound = 0.5 / (0.5 + 0.5 * (-1.0f64).exp());
        let two_point: Vec<f64> = (0..n).map(|i| if i < n / 2 { 1.0 } else { 0.0 }).collect();
        let grads: Vec<f64> = fastmatch_normalise(&scores);
        for v in [&two_point, &grads] {
            let top = gaussian_top_half(v);
            assert!(top <= bound + 1e-9 && top < 0.96, "lines 2-5 put {top} on the top half (bound {bound})");
        }
        assert!((gaussian_top_half(&two_point) - bound).abs() < 1e-9, "the bound is tight");
        // Setup B (the paper's, §VI-A: "we pre-randomized and duplicated the dataset"): 2n
        // keys, copy j of sample j % n. A cache of 50% of that volume holds n entries. FastMatch
        // caches by sample, so it holds every distinct sample and only first touches miss;
        // LRU, which "does not support data duplication", caches the 2n copies as distinct
        // entries and sees each copy once per pre-randomised epoch.
        let dup_scores: Vec<Option<f64>> = (0..2 * n).map(|k| scores[k % n]).collect();
        let mut cached = vec![false; n];
        let (mut hits, mut draws) = (0usize, 0usize);
        for epoch in 0..epochs {
            for &k in &fastmatch_draw(2 * n, 3, epoch, &dup_scores).order {
                let sample = k as usize % n;
                hits += usize::from(cached[sample]);
                cached[sample] = true;
                draws += 1;
            }
        }
        let fm_hit = hits as f64 / draws as f64;
        let mut lru: std::collections::VecDeque<u32> = std::collections::VecDeque::with_capacity(n);
        let (mut hits, mut draws) = (0usize, 0usize);
        for epoch in 0..epochs {
            for &k in &uniform_draw(2 * n, 3, epoch).order {
                if let Some(at) = lru.iter().position(|&e| e == k) {
                    hits += 1;
                    lru.remove(at);
                } else if lru.len() == n {
                    lru.pop_front();
                }
                lru.push_back(k);
                draws += 1;
            }
        }
        let lru_hit = hits as f64 / draws as f64;
        eprintln!("setup B ({epochs} epochs): fastmatch {fm_hit:.3}, lru {lru_hit:.3}");
        assert!(fm_hit > 0.9, "setup B: fastmatch hit rate {fm_hit}");
        assert!(lru_hit < 0.6 && fm_hit > 1.6 * lru_hit, "setup B: lru {lru_hit} vs fastmatch {fm_hit}");
    }

    #[test]
    fn no_finite_scores_however_large_or_small_make_a_nan() {
        let n = 64;
        let range = [f64::MAX, 1e308, 1e30, 3.0, 1e-300, 5e-324, 0.0];
        let cases: Vec<Vec<Option<f64>>> = vec![
            vec![Some(f64::MAX); n],
            (0..n).map(|i| Some(range[i % range.len()])).collect(),
            (0..n).map(|i| (i < 2).then_some(1e308)).collect(),
            (0..n).map(|i| Some(if i % 2 == 1 { f64::MAX } else { 0.0 })).collect(),
        ];
        let even: Vec<bool> = (0..n).map(|i| i % 2 == 0).collect();
        for (c, scores) in cases.iter().enumerate() {
            let finite = |what: &str, d: &EpochDraw| {
                assert!(d.expected.iter().all(|e| e.is_finite() && *e >= 0.0), "case {c}, {what}: {:?}", d.expected);
                assert!((d.expected.iter().sum::<f64>() - n as f64).abs() < 1e-6, "case {c}, {what}");
                assert!(d.weights.iter().flatten().all(|w| w.is_finite()), "case {c}, {what}");
                assert_eq!(d.order.len(), n);
            };
            // With a hot set of the even positions and a miss discount of 0, case 3 has
            // every scored sample outside the hot set, discounted to nothing.
            for (hot, disc) in [(None, 0.3), (Some(&even[..]), 0.3), (Some(&even[..]), 0.0)] {
                let view = ImportanceView { scores, hot };
                let params = ImportanceParams { floor: 0.1, coverage_epochs: 100, miss_discount: disc, max_draws: 4.0 };
                let d = importance_draw(n, 1, 1, params, view);
                finite("importance", &d);
                assert!(d.expected.iter().all(|&e| e <= 4.0 + 1e-9), "case {c}: {:?}", d.expected);
            }
            finite("fastmatch", &fastmatch_draw(n, 1, 1, scores));
            finite("shade", &shade_draw(n, 1, 1, scores));
            assert_eq!(hot_set(scores, 8, None, HOT_SET_MARGIN, 0.1).iter().filter(|&&h| h).count(), 8);
        }
        // FastMatch's normaliser over the whole finite range, negatives and a tiny IQR included.
        let wide = [Some(-f64::MAX), Some(f64::MAX), Some(0.0), Some(1.0), Some(1.0), Some(1.0), None];
        let tiny_iqr = [Some(0.0), Some(5e-324), Some(5e-324), Some(5e-324), Some(f64::MAX)];
        for scores in [&wide[..], &tiny_iqr[..]] {
            let v = fastmatch_normalise(scores);
            assert!(v.iter().all(|x| x.is_finite()), "{v:?}");
            let d = fastmatch_draw(scores.len(), 1, 1, scores);
            assert!(d.expected.iter().all(|e| e.is_finite()), "{:?}", d.expected);
        }
    }

    #[test]
    fn shade_draws_with_replacement_and_leaves_samples_unseen() {
        let n = 2000;
        let scores = vec![Some(1.0); n];
        let d = shade_draw(n, 4, 1, &scores);
        let mut seen = vec![false; n];
        d.order.iter().for_each(|&i| seen[i as usize] = true);
        let unseen = seen.iter().filter(|s| !**s).count() as f64 / n as f64;
        // (1 − 1/n)^n ≈ e^-1 ≈ 0.37.
        assert!((unseen - 0.368).abs() < 0.03, "unseen share {unseen}");
    }
}
