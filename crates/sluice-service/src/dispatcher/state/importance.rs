//! A job's importance, held by the dispatcher (the controller): the importance store that
//! every client of the job reports into, and the epochs drawn from it with the same
//! sampler code as local mode. Changed only through journal records (`Report`, `Draw`),
//! so a restarted dispatcher replays them into the same store and redraws the same epochs.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use sluice_core::{Manifest, PipelineSpec, SamplingSpec};
use sluice_pipeline::cache::epoch_priorities;
use sluice_pipeline::importance::{DrawInputs, ImportanceStore, ReportedValue};
use sluice_pipeline::{EpochDraw, Shard};

use super::placement::{batch_owners, owners, regroup, routes, Member, Previous};
use crate::error::ServiceError;
use sluice_client::proto::{ReportKind, ReportReply};
use sluice_client::ReportLengths;

/// Draws kept for workers to fetch: the current epoch's, the next one's (leased ahead),
/// and a couple more for clients that restart an epoch.
const DRAWS_KEPT: usize = 4;

/// A report checked against the job: what goes into the store, and the counts to answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct CheckedReport {
    pub keys: Vec<u64>,
    pub values: Vec<f64>,
    pub reply: ReportReply,
}

#[derive(Debug)]
pub struct JobImportance {
    store: ImportanceStore,
    manifest: Manifest,
    /// Every key of the dataset (reports for any other key are ignored).
    keys: HashMap<u64, u32>,
    seed: u64,
    spec: PipelineSpec,
    /// What the job's reports are (set by the first one; a job mixing losses and gradient
    /// norms would rank samples by incomparable numbers).
    kind: Option<ReportKind>,
    draws: VecDeque<(u64, Arc<Drawn>)>,
    /// Values refused (NaN, infinite, negative) and clamped (above `MAX_IMPORTANCE`), in
    /// reports answered since the dispatcher started and in journal records replayed.
    refused: u64,
    clamped: u64,
}

/// An epoch as drawn, with what the workers' caches follow in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    /// The draw, regrouped by owner when there is a placement (see [`super::placement`]).
    pub draw: EpochDraw,
    /// Manifest positions in the cache's hot set (empty before there is one).
    pub hot: Vec<u32>,
    /// The workers the samples are placed on (empty: no placement, cache-blind).
    pub members: Vec<Member>,
    /// The owner (index into `members`) of every manifest position; empty without members.
    pub owners: Vec<u32>,
    /// The owner of each batch of the epoch; empty without members.
    pub batch_owners: Vec<u32>,
    /// Per position, what the job's cache policy ranks entries by this epoch (`None` for
    /// policies that rank by what they see).
    pub priorities: Option<Vec<f64>>,
}

impl JobImportance {
    /// `None` for a uniformly sampled job (it has no store).
    pub fn for_job(spec: &PipelineSpec, manifest: Manifest) -> Option<Self> {
        if spec.sampling == SamplingSpec::Uniform {
            return None;
        }
        let keys = manifest.entries().enumerate().map(|(i, e)| (e.key.0, i as u32)).collect();
        Some(Self {
            store: ImportanceStore::new(spec.importance.ema),
            manifest,
            keys,
            seed: spec.seed,
            spec: spec.clone(),
            kind: None,
            draws: VecDeque::new(),
            refused: 0,
            clamped: 0,
        })
    }

    /// Checks a report (nothing changes): lengths must match and the kind must be the
    /// job's; unknown keys are counted and left out, and values pass the local loader's
    /// rule ([`ReportedValue::check`]): NaN, infinite or negative ones are counted in
    /// `invalid` and left out, finite ones above `MAX_IMPORTANCE` counted in `clamped` and
    /// taken as `MAX_IMPORTANCE`. So nothing absurd reaches the journal.
    pub(super) fn check_report(
        &self,
        job_id: u64,
        keys: &[u64],
        values: &[f64],
        kind: ReportKind,
    ) -> Result<CheckedReport, ServiceError> {
        if keys.len() != values.len() {
            return Err(ReportLengths { job_id, keys: keys.len(), values: values.len() }.into());
        }
        if let Some(k) = self.kind.filter(|&k| k != kind) {
            return Err(ServiceError::ReportKind {
                job_id,
                job: k.as_str_name().to_string(),
                reported: kind.as_str_name().to_string(),
            });
        }
        let mut out = CheckedReport { keys: Vec::new(), values: Vec::new(), reply: ReportReply::default() };
        for (&k, &v) in keys.iter().zip(values) {
            if !self.keys.contains_key(&k) {
                out.reply.unknown += 1;
                continue;
            }
            let v = match ReportedValue::check(v) {
                ReportedValue::Accepted(v) => v,
                ReportedValue::Clamped(v) => {
                    out.reply.clamped += 1;
                    v
                }
                ReportedValue::Refused => {
                    out.reply.invalid += 1;
                    continue;
                }
            };
            out.keys.push(k);
            out.values.push(v);
        }
        out.reply.accepted = out.keys.len() as u64;
        Ok(out)
    }

    /// Counts what a report answered with `reply` refused and clamped (for the metrics).
    pub(super) fn count_report(&mut self, reply: &ReportReply) {
        self.refused += reply.invalid;
        self.clamped += reply.clamped;
    }

    /// Values refused (NaN, infinite, negative) since the dispatcher started.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Values clamped to `MAX_IMPORTANCE` since the dispatcher started.
    pub fn clamped(&self) -> u64 {
        self.clamped
    }

    /// Folds a checked report into the store (a `Report` record, live or replayed). The
    /// store applies the same rule again: a journal written before the rule held absurd
    /// values, which are refused or clamped on replay (and counted) as a live report's are.
    pub fn apply_report(&mut self, keys: &[u64], values: &[f64], kind: ReportKind) {
        self.kind = Some(kind);
        let counts = self.store.report(keys, values);
        if counts.refused + counts.clamped > 0 {
            tracing::warn!(
                refused = counts.refused,
                clamped = counts.clamped,
                "importance report from the journal: refused NaN, infinite or negative values, clamped huge ones"
            );
        }
        self.refused += counts.refused;
        self.clamped += counts.clamped;
    }

    /// Draws `epoch` (a `Draw` record): the reports so far shape it, and the ones after it
    /// shape the next. `hot`: the service's cache capacity in entries, if known (fixed the
    /// first time it is); `members`: the workers to place samples on (none: cache-blind);
    /// `task_batches`: batches per task. Drawing an epoch already drawn gives the same draw.
    pub fn apply_draw(&mut self, epoch: u64, hot: Option<u64>, members: &[Member], task_batches: u64) -> Arc<Drawn> {
        if let Some(d) = self.drawn(epoch) {
            return d;
        }
        let inputs = DrawInputs {
            manifest: &self.manifest,
            seed: self.seed,
            shuffle: self.spec.shuffle,
            sampling: self.spec.sampling,
            shard: Shard::default(),
            locality: None,
        };
        let mut draw = self.store.draw(epoch, hot, &inputs);
        let priorities =
            self.spec.cache.as_ref().and_then(|c| epoch_priorities(c.policy, &draw, &self.store, &self.manifest));
        let hot_keys = self.store.hot_keys();
        let hot_mask: Vec<bool> = self.manifest.entries().map(|e| hot_keys.contains(&e.key.0)).collect();
        let hot: Vec<u32> = (0..hot_mask.len() as u32).filter(|&i| hot_mask[i as usize]).collect();
        let (owners, batch_owners) = if members.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let keys: Vec<u64> = self.manifest.entries().map(|e| e.key.0).collect();
            // The draw before, if it was placed: the caches hold its placement.
            let before = epoch.checked_sub(1).and_then(|e| self.drawn(e)).filter(|d| !d.members.is_empty());
            let mut before_hot = vec![false; if before.is_some() { keys.len() } else { 0 }];
            for &p in before.as_ref().map_or(&[][..], |d| d.hot.as_slice()) {
                if let Some(x) = before_hot.get_mut(p as usize) {
                    *x = true;
                }
            }
            let previous = before.as_ref().map(|d| Previous {
                members: &d.members,
                owners: &d.owners,
                hot: &before_hot,
                order: &d.draw.order,
            });
            let owners = owners(&keys, &hot_mask, members, previous);
            let b = self.spec.batch.size.max(1);
            let n = draw.order.len();
            let used = if self.spec.batch.drop_last { n - n % b } else { n };
            let chunk = usize::try_from(task_batches).unwrap_or(usize::MAX).saturating_mul(b);
            let routes = routes(&owners, &hot_mask);
            regroup(&mut draw.order, draw.weights.as_deref_mut(), &routes, used, b, chunk);
            let by_batch = batch_owners(&draw.order, &routes, b, members.len());
            (owners, by_batch)
        };
        let drawn = Arc::new(Drawn { draw, hot, members: members.to_vec(), owners, batch_owners, priorities });
        if self.draws.len() == DRAWS_KEPT {
            self.draws.pop_front();
        }
        self.draws.push_back((epoch, drawn.clone()));
        drawn
    }

    /// The draw of `epoch`, if it was made and is still kept.
    pub fn drawn(&self, epoch: u64) -> Option<Arc<Drawn>> {
        self.draws.iter().find(|d| d.0 == epoch).map(|d| d.1.clone())
    }

    /// The newest epoch drawn.
    pub fn last_drawn(&self) -> Option<u64> {
        self.draws.back().map(|d| d.0)
    }
}

/// An importance-sampled job over `n` made-up samples, for tests.
#[cfg(test)]
pub(super) fn test_job(n: u64) -> JobImportance {
    use sluice_core::Location;
    use std::path::PathBuf;
    let items = (0..n).map(|i| (Location::File { path: PathBuf::from(format!("{i}")) }, 0, 10)).collect();
    let manifest = Manifest::new(PathBuf::from("/t"), items, Vec::new());
    let mut spec =
        PipelineSpec::train_default(sluice_core::SourceSpec::ImageFolder { root: PathBuf::from("/t") }, 8, 4);
    spec.sampling = SamplingSpec::Importance { floor: 0.05, coverage_epochs: 40, miss_discount: 0.1, max_draws: 4.0 };
    JobImportance::for_job(&spec, manifest).unwrap_or_else(|| panic!("importance sampled"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_checked_and_only_valid_values_of_known_keys_reach_the_store() {
        let mut j = test_job(8);
        let keys: Vec<u64> = j.manifest.entries().map(|e| e.key.0).collect();
        let r = j
            .check_report(1, &[keys[0], 12345, keys[1], keys[2]], &[1.0, 2.0, f64::NAN, -1.0], ReportKind::Loss)
            .unwrap();
        assert_eq!((r.reply.accepted, r.reply.unknown, r.reply.invalid), (1, 1, 2));
        assert_eq!((r.keys, r.values), (vec![keys[0]], vec![1.0]));
        let e = j.check_report(1, &keys[..2], &[1.0], ReportKind::Loss).unwrap_err();
        assert!(e.to_string().contains("2 keys and 1 values"), "{e}");
        j.apply_report(&[keys[0]], &[1.0], ReportKind::Loss);
        let e = j.check_report(1, &keys[..1], &[1.0], ReportKind::GradNorm).unwrap_err();
        assert!(e.to_string().contains("REPORT_KIND_LOSS"), "{e}");
    }

    #[test]
    fn huge_values_are_clamped_at_the_door_and_in_an_old_journal_on_replay() {
        use sluice_pipeline::importance::MAX_IMPORTANCE;
        let fresh = test_job(64);
        let keys: Vec<u64> = fresh.manifest.entries().map(|e| e.key.0).collect();
        let losses: Vec<f64> = (0..64).map(|i| 1.0 + (i % 5) as f64).collect();
        let mut huge = losses.clone();
        huge[..4].fill(1e308);
        let r = fresh.check_report(1, &keys, &huge, ReportKind::Loss).unwrap();
        assert_eq!((r.reply.accepted, r.reply.clamped, r.reply.invalid), (64, 4, 0));
        assert_eq!((&r.values[..4], &r.values[4..]), (&[MAX_IMPORTANCE; 4][..], &losses[4..]));
        // Epoch 1 drawn after `values` went into the store as a `Report` record.
        let draw = |values: &[f64]| {
            let mut j = test_job(64);
            j.apply_draw(0, None, &[], 8);
            j.apply_report(&keys, values, ReportKind::Loss);
            (j.apply_draw(1, None, &[], 8).draw.clone(), j.clamped())
        };
        // A journal written before the rule holds the 1e308s: replayed, they are the bound's.
        let (replayed, clamped) = draw(&huge);
        let (checked, none) = draw(&r.values);
        assert_eq!((clamped, none), (4, 0));
        assert_eq!(replayed, checked);
        let weights = checked.weights.unwrap_or_default();
        assert!(weights.iter().all(|w| w.is_finite() && *w > 0.0), "{weights:?}");
        assert!(weights.iter().any(|&w| w != weights[0]), "the 4 outliers are drawn more: {weights:?}");
    }

    #[test]
    fn the_same_reports_and_draws_replayed_give_the_same_epochs() {
        let run = || {
            let mut j = test_job(64);
            let keys: Vec<u64> = j.manifest.entries().map(|e| e.key.0).collect();
            let first = j.apply_draw(0, None, &[], 8).draw.clone();
            let losses: Vec<f64> = (0..64).map(|i| if i < 8 { 10.0 } else { 0.1 }).collect();
            j.apply_report(&keys, &losses, ReportKind::Loss);
            let second = j.apply_draw(1, None, &[], 8).draw.clone();
            (first, second)
        };
        let (a0, a1) = run();
        let (b0, b1) = run();
        assert_eq!((&a0, &a1), (&b0, &b1));
        assert!(a1.weights.is_some());
        // The hard samples (positions 0..8) are drawn far more than their share.
        let hard = a1.order.iter().filter(|&&p| p < 8).count();
        assert!(hard > 20, "{hard} of 64 draws are of the 8 hard samples");
        assert_eq!(a1.order.len(), 64);
    }
}
