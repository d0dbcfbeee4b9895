//! The importance store: per-key scores reported by the trainer (losses or per-sample
//! gradient norms), smoothed across epochs, and the epoch draws made from them.
//!
//! Reports arriving during epoch `e` go to `pending`; they are folded into the smoothed
//! scores (an EMA, `ema` the weight of the newest epoch) only when the loader moves on to
//! the next epoch. So the state an epoch's order was drawn from stays untouched while the
//! epoch runs: a checkpoint taken mid-epoch restores that state plus the pending reports,
//! and the resumed loader redraws exactly the same order.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use sluice_core::{Manifest, SamplingSpec, ShuffleSpec};

use crate::locality::Locality;
use crate::sampler::{
    epoch_order, fastmatch_draw, hot_set, importance_draw, shade_draw, EpochDraw, ImportanceParams, ImportanceView,
    Shard, HOT_SET_MARGIN,
};

/// The serialisable importance state, carried in [`crate::LoaderState`]. Maps are written
/// as key-sorted lists so the JSON is stable.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImportanceState {
    /// The epoch whose order was drawn last (from the state below); `None` before any.
    pub drawn_epoch: Option<u64>,
    /// Smoothed score per key, as of the start of `drawn_epoch`.
    pub scores: Vec<(u64, f64)>,
    /// SHADE rank scores per key (`ln(rank + 10)` within the reporting batch).
    pub rank_scores: Vec<(u64, f64)>,
    /// Reports received during `drawn_epoch`, not yet folded in: key → (sum, count).
    pub pending: Vec<(u64, f64, u32)>,
    /// Cache entries the sampler treats as its hot set (fixed once known).
    pub hot: Option<u64>,
    /// The keys of the hot set `drawn_epoch` was drawn with (empty before there is one).
    /// Carried because the set has hysteresis: it depends on the sets before it.
    #[serde(default)]
    pub hot_set: Vec<u64>,
}

/// The importance store itself: a local loader holds one, and so does the service's
/// dispatcher for each importance-sampled job (fed by all its clients).
#[derive(Debug, Default)]
pub struct ImportanceStore {
    ema: f64,
    drawn_epoch: Option<u64>,
    scores: HashMap<u64, f64>,
    rank_scores: HashMap<u64, f64>,
    pending: HashMap<u64, (f64, u32)>,
    hot: Option<u64>,
    hot_set: HashSet<u64>,
    reports: u64,
}

fn sorted<V: Copy>(m: &HashMap<u64, V>) -> Vec<(u64, V)> {
    let mut v: Vec<(u64, V)> = m.iter().map(|(k, v)| (*k, *v)).collect();
    v.sort_unstable_by_key(|e| e.0);
    v
}

/// The largest importance value a store keeps: a finite report above it is clamped to it.
/// No loss or gradient norm a trainer means comes near it, and with every score at most
/// this, every sum the store and the samplers make (over at most 2³² samples, and 2³²
/// reports of one key) stays finite. The rule: `docs/importance-sampling.md` ("Scores").
pub const MAX_IMPORTANCE: f64 = 1e30;

/// What one reported value becomes (see [`MAX_IMPORTANCE`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReportedValue {
    /// Taken as it is.
    Accepted(f64),
    /// Finite but above [`MAX_IMPORTANCE`]: taken as [`MAX_IMPORTANCE`].
    Clamped(f64),
    /// NaN, infinite or negative: left out.
    Refused,
}

impl ReportedValue {
    /// The rule every importance report passes, locally and at the dispatcher.
    pub fn check(v: f64) -> Self {
        if !(v.is_finite() && v >= 0.0) {
            Self::Refused
        } else if v > MAX_IMPORTANCE {
            Self::Clamped(MAX_IMPORTANCE)
        } else {
            // -0.0 is taken as 0.
            Self::Accepted(v + 0.0)
        }
    }
}

/// What became of a report's values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReportCounts {
    /// Taken into the store, the clamped ones included.
    pub accepted: u64,
    /// Taken as [`MAX_IMPORTANCE`].
    pub clamped: u64,
    /// Left out: NaN, infinite or negative.
    pub refused: u64,
}

impl ReportCounts {
    pub fn add(&mut self, other: ReportCounts) {
        self.accepted += other.accepted;
        self.clamped += other.clamped;
        self.refused += other.refused;
    }
}

/// A report under the rule of [`ReportedValue::check`]: the keys and values to keep
/// (clamped values at [`MAX_IMPORTANCE`], refused ones left out), and the counts.
pub fn checked_report(keys: &[u64], values: &[f64]) -> (Vec<u64>, Vec<f64>, ReportCounts) {
    let mut counts = ReportCounts::default();
    let (mut kept_keys, mut kept) = (Vec::with_capacity(keys.len()), Vec::with_capacity(values.len()));
    for (&k, &v) in keys.iter().zip(values) {
        let v = match ReportedValue::check(v) {
            ReportedValue::Accepted(v) => {
                counts.accepted += 1;
                v
            }
            ReportedValue::Clamped(v) => {
                counts.accepted += 1;
                counts.clamped += 1;
                v
            }
            ReportedValue::Refused => {
                counts.refused += 1;
                continue;
            }
        };
        kept_keys.push(k);
        kept.push(v);
    }
    (kept_keys, kept, counts)
}

/// A score carried in a state (a checkpoint, or the store of an older version) under
/// today's rule: `None` where it would be refused, clamped to [`MAX_IMPORTANCE`] else.
fn bounded(v: f64) -> Option<f64> {
    match ReportedValue::check(v) {
        ReportedValue::Accepted(v) | ReportedValue::Clamped(v) => Some(v),
        ReportedValue::Refused => None,
    }
}

/// SHADE's rank score for position `rank` (1 = lowest loss) within a batch.
pub fn shade_rank_score(rank: usize) -> f64 {
    (rank as f64 + 10.0).ln()
}

/// The per-batch SHADE rank scores of `values`: sorted ascending, the i-th smallest gets
/// `ln(i + 10)` (i from 1), written back to *its own* key. (SHADE's reference code writes
/// the sorted scores to the wrong positions; this does not copy that.)
pub fn shade_rank_scores(values: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[a].total_cmp(&values[b]).then(a.cmp(&b)));
    let mut out = vec![0.0; values.len()];
    for (rank0, &i) in idx.iter().enumerate() {
        out[i] = shade_rank_score(rank0 + 1);
    }
    out
}

/// What an epoch needs from the store.
pub struct DrawInputs<'a> {
    pub manifest: &'a Manifest,
    pub seed: u64,
    pub shuffle: ShuffleSpec,
    pub sampling: SamplingSpec,
    pub shard: Shard,
    /// Splits each global batch by locality instead of striding it.
    pub locality: Option<&'a Locality>,
}

impl DrawInputs<'_> {
    /// This rank's share of the job's draw.
    fn share(&self, draw: EpochDraw) -> EpochDraw {
        match self.locality {
            Some(l) => l.share(draw),
            None => draw.shard(self.shard),
        }
    }
}

impl ImportanceStore {
    pub fn new(ema: f64) -> Self {
        Self { ema, ..Default::default() }
    }

    /// Records the trainer's per-sample values (losses or gradient norms) for `keys`, under
    /// the rule of [`ReportedValue::check`]: NaN, infinite or negative values are refused,
    /// finite ones above [`MAX_IMPORTANCE`] clamped to it. Returns the counts.
    pub fn report(&mut self, keys: &[u64], values: &[f64]) -> ReportCounts {
        let (keys, values, counts) = checked_report(keys, values);
        for (k, v) in keys.iter().zip(&values) {
            let e = self.pending.entry(*k).or_insert((0.0, 0));
            e.0 += v;
            e.1 = e.1.saturating_add(1);
        }
        for (k, r) in keys.iter().zip(shade_rank_scores(&values)) {
            self.rank_scores.insert(*k, r);
        }
        self.reports += 1;
        counts
    }

    /// The keys of the cache's hot set the last epoch was drawn with (empty before there is one).
    pub fn hot_keys(&self) -> &HashSet<u64> {
        &self.hot_set
    }

    pub fn has_scores(&self) -> bool {
        !self.scores.is_empty()
    }

    /// Folds the epoch's reports into the smoothed scores (EMA), first scaling every old
    /// score by the median `new / old` ratio of this epoch's reports, so stale scores do not
    /// overstate rarely drawn samples (`docs/importance-sampling.md`).
    fn fold_pending(&mut self) {
        let mut ratios: Vec<f64> = self
            .pending
            .iter()
            .filter_map(|(k, (sum, count))| {
                let old = *self.scores.get(k)?;
                (old > 0.0).then(|| sum / f64::from((*count).max(1)) / old)
            })
            .filter(|r| r.is_finite())
            .collect();
        ratios.sort_by(f64::total_cmp);
        let drift = match ratios.len() {
            0 => 1.0,
            // Halves: the sum of two huge ratios would overflow.
            n if n % 2 == 0 => ratios[n / 2 - 1] / 2.0 + ratios[n / 2] / 2.0,
            n => ratios[n / 2],
        }
        .clamp(1e-3, 1e3);
        // Every score stays within [0, MAX_IMPORTANCE]: drift applied epoch after epoch to a
        // stale score could otherwise grow it without bound.
        if drift != 1.0 {
            self.scores.values_mut().for_each(|s| *s = (*s * drift).min(MAX_IMPORTANCE));
        }
        for (k, (sum, count)) in self.pending.drain() {
            let v = (sum / f64::from(count.max(1))).min(MAX_IMPORTANCE);
            let s = match self.scores.get(&k) {
                Some(old) => (1.0 - self.ema) * old + self.ema * v,
                None => v,
            };
            self.scores.insert(k, s.min(MAX_IMPORTANCE));
        }
    }

    fn per_position<V: Copy>(map: &HashMap<u64, V>, manifest: &Manifest) -> Vec<Option<V>> {
        manifest.entries().map(|e| map.get(&e.key.0).copied()).collect()
    }

    /// The smoothed score of every manifest position (`None` where never reported).
    pub(crate) fn scores_by_position(&self, manifest: &Manifest) -> Vec<Option<f64>> {
        Self::per_position(&self.scores, manifest)
    }

    /// The hot set as a per-position mask: the carried set, or (before there is one, e.g.
    /// right after restoring an older checkpoint) the `hot` highest scores.
    fn hot_mask(&self, scores: &[Option<f64>], manifest: &Manifest) -> Option<Vec<bool>> {
        let size = usize::try_from(self.hot?).ok()?;
        if self.hot_set.is_empty() {
            return Some(hot_set(scores, size, None, HOT_SET_MARGIN, 0.0));
        }
        Some(manifest.entries().map(|e| self.hot_set.contains(&e.key.0)).collect())
    }

    /// Moves the hot set on to the scores just folded in (hysteresis: see [`hot_set`]).
    fn update_hot_set(&mut self, manifest: &Manifest, floor: f64) {
        let Some(size) = self.hot.and_then(|h| usize::try_from(h).ok()) else {
            return;
        };
        if self.scores.is_empty() {
            return;
        }
        let scores = self.scores_by_position(manifest);
        let previous: Option<Vec<bool>> =
            (!self.hot_set.is_empty()).then(|| manifest.entries().map(|e| self.hot_set.contains(&e.key.0)).collect());
        let mask = hot_set(&scores, size, previous.as_deref(), HOT_SET_MARGIN, floor);
        self.hot_set = manifest.entries().zip(&mask).filter(|(_, &h)| h).map(|(e, _)| e.key.0).collect();
    }

    /// The job's whole draw for `epoch`, the same on every rank.
    fn draw_global(&self, epoch: u64, d: &DrawInputs<'_>) -> EpochDraw {
        let n = d.manifest.len();
        let global = match d.sampling {
            SamplingSpec::Uniform => {
                let order = epoch_order(n, d.seed, epoch, d.shuffle, Shard::default());
                EpochDraw { order, weights: None, expected: vec![1.0; n] }
            }
            SamplingSpec::Importance { floor, coverage_epochs, miss_discount, max_draws } => {
                let scores = self.scores_by_position(d.manifest);
                let hot = self.hot_mask(&scores, d.manifest);
                let view = ImportanceView { scores: &scores, hot: hot.as_deref() };
                importance_draw(
                    n,
                    d.seed,
                    epoch,
                    ImportanceParams { floor, coverage_epochs, miss_discount, max_draws },
                    view,
                )
            }
            SamplingSpec::Fastmatch => fastmatch_draw(n, d.seed, epoch, &self.scores_by_position(d.manifest)),
            SamplingSpec::Shade => shade_draw(n, d.seed, epoch, &Self::per_position(&self.rank_scores, d.manifest)),
        };
        global
    }

    /// The draw for `epoch`. Moving to a new epoch first closes the last drawn one: its
    /// reports are folded into the scores; `hot` (the cache's capacity in entries) is taken
    /// the first time it is known.
    ///
    /// With several ranks, each rank's store must be fed the same reports (every rank's,
    /// in the same order: see [`crate::Loader::report`]); then every rank draws the same
    /// global order and takes its own disjoint share of it.
    pub fn draw(&mut self, epoch: u64, hot: Option<u64>, d: &DrawInputs<'_>) -> EpochDraw {
        if self.drawn_epoch == Some(epoch) {
            return d.share(self.draw_global(epoch, d));
        }
        self.fold_pending();
        // Fixed the first time the cache can say (after a full epoch at a fixed level, from
        // every sample's entry size), then carried in the state: recomputing it after a
        // resume, from a cold cache, could change the order.
        if self.hot.is_none() {
            self.hot = hot.map(|h| h.min(d.manifest.len() as u64));
        }
        if let SamplingSpec::Importance { floor, .. } = d.sampling {
            self.update_hot_set(d.manifest, floor);
        }
        self.drawn_epoch = Some(epoch);
        let draw = self.draw_global(epoch, d);
        tracing::debug!(epoch, scored = self.scores.len(), hot = ?self.hot, "drew epoch order");
        d.share(draw)
    }

    pub fn state(&self) -> ImportanceState {
        let mut pending: Vec<(u64, f64, u32)> = self.pending.iter().map(|(k, (s, c))| (*k, *s, *c)).collect();
        pending.sort_unstable_by_key(|e| e.0);
        ImportanceState {
            drawn_epoch: self.drawn_epoch,
            scores: sorted(&self.scores),
            rank_scores: sorted(&self.rank_scores),
            pending,
            hot: self.hot,
            hot_set: {
                let mut v: Vec<u64> = self.hot_set.iter().copied().collect();
                v.sort_unstable();
                v
            },
        }
    }

    /// Takes `s` as the store's state. Values today's rule would not take (a state saved by
    /// an older version, or edited by hand) are dropped or clamped as a report's would be,
    /// so no state can bring a NaN into a draw; a state this version saved is unchanged.
    pub fn restore(&mut self, s: &ImportanceState) {
        self.drawn_epoch = s.drawn_epoch;
        self.scores = s.scores.iter().filter_map(|&(k, v)| Some((k, bounded(v)?))).collect();
        self.rank_scores = s.rank_scores.iter().filter_map(|&(k, v)| Some((k, bounded(v)?))).collect();
        self.pending = s
            .pending
            .iter()
            .filter(|(_, sum, _)| sum.is_finite() && *sum >= 0.0)
            .map(|&(k, sum, c)| (k, (sum.min(f64::from(c.max(1)) * MAX_IMPORTANCE), c)))
            .collect();
        self.hot = s.hot;
        self.hot_set = s.hot_set.iter().copied().collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shade_rank_scores_go_to_their_own_keys() {
        let r = shade_rank_scores(&[0.5, 0.1, 0.9]);
        assert_eq!(r, vec![shade_rank_score(2), shade_rank_score(1), shade_rank_score(3)]);
        assert!((shade_rank_score(1) - 11f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn reports_fold_into_an_ema_only_at_the_next_epoch_and_state_round_trips() {
        let mut s = ImportanceStore::new(0.5);
        assert_eq!(s.report(&[1, 2, 3], &[4.0, f64::NAN, -1.0]), ReportCounts { accepted: 1, clamped: 0, refused: 2 });
        s.report(&[1], &[2.0]);
        assert!(!s.has_scores(), "nothing folds mid-epoch");
        s.drawn_epoch = Some(0);
        s.fold_pending();
        assert_eq!(s.scores.get(&1), Some(&3.0), "mean of the epoch's reports");
        s.report(&[2], &[8.0]);
        s.fold_pending();
        // Losses halved overall (key 1: 3 -> 1.5 fresh): stale key 2 is scaled down too.
        s.report(&[1], &[1.5]);
        s.fold_pending();
        assert_eq!(s.scores.get(&1), Some(&1.5), "0.5·(3·0.5) + 0.5·1.5");
        assert_eq!(s.scores.get(&2), Some(&4.0), "unreported: 8 scaled by the drift 0.5");
        s.report(&[7], &[9.0]);
        s.hot = Some(2);
        s.hot_set = [1, 2].into_iter().collect();
        let st = s.state();
        assert_eq!(st.hot_set, vec![1, 2]);
        let mut t = ImportanceStore::new(0.5);
        t.restore(&st);
        assert_eq!(t.state(), st);
        let json = serde_json::to_string(&st).unwrap_or_default();
        assert_eq!(serde_json::from_str::<ImportanceState>(&json).ok(), Some(st));
        // A state saved before the hot set was carried still loads (empty set).
        let old = json.replace(",\"hot_set\":[1,2]", "");
        assert!(!old.contains("hot_set"));
        assert_eq!(serde_json::from_str::<ImportanceState>(&old).map(|s| s.hot_set).ok(), Some(vec![]));
    }

    fn manifest(n: u64) -> Manifest {
        use sluice_core::Location;
        use std::path::PathBuf;
        let items = (0..n).map(|i| (Location::File { path: PathBuf::from(format!("{i}")) }, 0, 10)).collect();
        Manifest::new(PathBuf::from("/t"), items, Vec::new())
    }

    /// Epoch 1's draw after epoch 0 took `reports` (ema 0.5, no cache).
    fn next_epoch(manifest: &Manifest, reports: &[(&[u64], &[f64])]) -> EpochDraw {
        let sampling = SamplingSpec::Importance { floor: 0.1, coverage_epochs: 40, miss_discount: 1.0, max_draws: 4.0 };
        let d = DrawInputs {
            manifest,
            seed: 5,
            shuffle: ShuffleSpec::Global,
            sampling,
            shard: Shard::default(),
            locality: None,
        };
        let mut s = ImportanceStore::new(0.5);
        s.draw(0, None, &d);
        for (keys, values) in reports {
            s.report(keys, values);
        }
        s.draw(1, None, &d)
    }

    #[test]
    fn a_report_of_1e308_leaves_the_weights_those_of_a_sane_report() {
        let n = 64;
        let manifest = manifest(n);
        let keys: Vec<u64> = manifest.entries().map(|e| e.key.0).collect();
        // Issue 29's case: two keys at 1e308, every other key at their mean: all alike, so
        // the epoch is uniform with weights 1, as after the same report of 100.
        let absurd = next_epoch(&manifest, &[(&keys[..2], &[1e308, 1e308])]);
        let weights = absurd.weights.clone().unwrap_or_default();
        assert!(weights.iter().all(|&w| w == 1.0), "weights after a 1e308 report: {:?}", &weights[..8]);
        let sane = next_epoch(&manifest, &[(&keys[..2], &[100.0, 100.0])]);
        assert_eq!((&absurd.order, &absurd.weights), (&sane.order, &sane.weights));
        // One outlier among sane losses, reported twice: it counts as the bound, takes the
        // ceiling's draws (4), and every other sample keeps a finite, unbiasing weight.
        let losses: Vec<f64> = (0..n).map(|i| 1.0 + (i % 5) as f64).collect();
        let (mut huge, mut bound) = (losses.clone(), losses.clone());
        (huge[3], bound[3]) = (1e308, MAX_IMPORTANCE);
        let absurd = next_epoch(&manifest, &[(&keys, &huge), (&keys, &huge)]);
        assert_eq!(absurd, next_epoch(&manifest, &[(&keys, &bound), (&keys, &bound)]));
        // Its proposal's 4 draws, over the 39 of 40 epochs' slots the coverage sweep leaves,
        // plus the sweep's one visit in 40 epochs.
        let ceiling = 1.0 / 40.0 + 39.0 / 40.0 * 4.0;
        assert!((absurd.expected[3] - ceiling).abs() < 1e-9, "the outlier expects {} draws", absurd.expected[3]);
        assert!(absurd.expected.iter().all(|e| e.is_finite() && *e > 0.1));
        assert!((absurd.expected.iter().sum::<f64>() - n as f64).abs() < 1e-6, "an epoch has n slots");
        assert!(absurd.weights.unwrap_or_default().iter().all(|&w| w.is_finite() && w > 0.0 && w <= 10.0));
    }

    #[test]
    fn reports_are_refused_or_clamped_and_scores_stay_within_the_bound() {
        let mut s = ImportanceStore::new(0.5);
        let c = s.report(&[1, 2, 3, 4, 5, 6], &[1e308, f64::MAX, f64::NAN, f64::NEG_INFINITY, -1e-9, -0.0]);
        assert_eq!(c, ReportCounts { accepted: 3, clamped: 2, refused: 3 });
        // One key reported at the bound many times within an epoch: its mean is the bound.
        for _ in 0..1000 {
            s.report(&[1], &[1e300]);
        }
        s.drawn_epoch = Some(0);
        s.fold_pending();
        let near_bound =
            |k: u64| s.scores.get(&k).is_some_and(|v| (MAX_IMPORTANCE * 0.999..=MAX_IMPORTANCE).contains(v));
        assert!(near_bound(1) && near_bound(2), "{:?}", s.scores);
        assert_eq!(s.scores.get(&6), Some(&0.0));
        // Drift (×1000 each epoch: key 7's losses grow) never takes a stale score past it.
        s.report(&[7], &[1e-30]);
        s.fold_pending();
        for e in 0..40 {
            s.report(&[7], &[1e-30 * 1e3f64.powi(e + 1)]);
            s.fold_pending();
        }
        assert!(s.scores.values().all(|&v| (0.0..=MAX_IMPORTANCE).contains(&v)), "{:?}", s.scores);
        // A state from an older version (or edited by hand) with absurd values is taken
        // under today's rule; a state this version saved is taken unchanged.
        let old = ImportanceState {
            scores: vec![(1, f64::INFINITY), (2, 1e308), (3, -1.0), (4, 2.0)],
            rank_scores: vec![(1, f64::NAN), (2, 3.0)],
            pending: vec![(1, f64::INFINITY, 1), (2, 1e308, 2), (4, 3.0, 1)],
            ..Default::default()
        };
        let mut t = ImportanceStore::new(0.5);
        t.restore(&old);
        let st = t.state();
        assert_eq!(st.scores, vec![(2, MAX_IMPORTANCE), (4, 2.0)]);
        assert_eq!(st.rank_scores, vec![(2, 3.0)]);
        assert_eq!(st.pending, vec![(2, 2.0 * MAX_IMPORTANCE, 2), (4, 3.0, 1)]);
        let mut u = ImportanceStore::new(0.5);
        u.restore(&s.state());
        assert_eq!(u.state(), s.state());
    }

    #[test]
    fn the_hot_set_is_carried_from_epoch_to_epoch_with_hysteresis() {
        use sluice_core::Location;
        use std::path::PathBuf;
        let n = 8u64;
        let items = (0..n).map(|i| (Location::File { path: PathBuf::from(format!("{i}")) }, 0, 10)).collect();
        let manifest = Manifest::new(PathBuf::from("/t"), items, Vec::new());
        let keys: Vec<u64> = manifest.entries().map(|e| e.key.0).collect();
        let sampling =
            SamplingSpec::Importance { floor: 0.05, coverage_epochs: 40, miss_discount: 0.1, max_draws: 4.0 };
        let d = DrawInputs {
            manifest: &manifest,
            seed: 1,
            shuffle: ShuffleSpec::Global,
            sampling,
            shard: Shard::default(),
            locality: None,
        };
        let mut s = ImportanceStore::new(1.0);
        s.draw(0, Some(2), &d);
        // Epoch 0's losses: positions 0 and 1 hardest -> the hot set for epoch 1.
        s.report(&keys, &[5.0, 4.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1]);
        s.draw(1, Some(2), &d);
        let hot =
            |s: &ImportanceStore| -> Vec<usize> { (0..n as usize).filter(|&i| s.hot_set.contains(&keys[i])).collect() };
        assert_eq!(hot(&s), vec![0, 1]);
        // Position 2 now slightly above 1 (a near tie): the set stays. (ema 1: scores = latest.)
        s.report(&keys, &[5.0, 1.0, 1.5, 1.0, 0.1, 0.1, 0.1, 0.1]);
        s.draw(2, Some(2), &d);
        assert_eq!(hot(&s), vec![0, 1]);
        // Position 3 clearly above 1: it takes 1's place.
        s.report(&keys, &[5.0, 1.0, 1.5, 4.0, 0.1, 0.1, 0.1, 0.1]);
        let draw = s.draw(3, Some(2), &d);
        assert_eq!(hot(&s), vec![0, 3]);
        // Redrawing the epoch (a resumed loader) gives the same order from the same state.
        let mut t = ImportanceStore::new(1.0);
        t.restore(&s.state());
        assert_eq!(t.draw(3, Some(2), &d), draw);
    }
}
