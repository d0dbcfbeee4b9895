//! Checkpoints: where a loader stands ([`LoaderState`]: epoch, batch, importance state
//! and the spec fields that fix the order, locality included), and restoring it, refused
//! when the dataset, seed, shard or order-deciding spec differ from the loader's. A
//! checkpoint of another world size resumes at the same global batch when the global batch
//! (`batch.size × world_size`) is the same (elastic resume, `docs/sharding.md`).

use serde::{Deserialize, Serialize};
use sluice_core::{Assignment, BatchSpec, ImportanceSpec, PipelineSpec, SamplingSpec, ShuffleSpec};

use super::{batches_for, Loader};
use crate::error::PipelineError;
use crate::importance::ImportanceState;
use crate::sampler::MixPlan;

/// Where a loader stands: enough to resume to exactly the batches an uninterrupted run
/// would have produced next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoaderState {
    pub epoch: u64,
    /// Batches of `epoch` already handed out.
    pub batch: u64,
    pub seed: u64,
    pub fingerprint: String,
    pub rank: usize,
    pub world_size: usize,
    /// Reported importance, smoothed scores and coverage bookkeeping: the epoch order is
    /// drawn from it, so resuming needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub importance: Option<ImportanceState>,
    /// The parts of the spec that decide which samples batch `batch` holds; `None` in
    /// states saved before they were carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<OrderSpec>,
}

/// What, besides dataset, seed and shard, fixes the samples behind a batch index: a
/// checkpoint restored under a different one would repeat or skip samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderSpec {
    pub batch: BatchSpec,
    pub shuffle: ShuffleSpec,
    pub sampling: SamplingSpec,
    /// The smoothing of reported importance, from which importance-driven orders are drawn.
    pub importance: ImportanceSpec,
    /// How each global batch was split among the learners; `None` without a `locality`
    /// section (and in states saved before it was carried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<LocalityOrder>,
    /// A mixed source's weights for the checkpoint's epoch. Unlike the rest, they may
    /// differ on restore: the epoch is finished with these, the next ones use the spec's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<Vec<f64>>,
}

/// The parts of a `locality` section that decide which samples of each global batch a
/// learner loads: the assignment, and the cache budgets the placement follows from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalityOrder {
    pub assignment: Assignment,
    /// One budget per rank (a single number in the spec is spelt out for every rank).
    pub cache_samples: Vec<u64>,
}

impl OrderSpec {
    pub(super) fn of(spec: &PipelineSpec, world_size: usize) -> Self {
        let locality = spec.locality.as_ref().map(|l| LocalityOrder {
            assignment: l.assignment,
            // The loader checked the budgets against the learner count when it was built.
            cache_samples: l.cache_samples_for(world_size).unwrap_or_else(|_| l.cache_samples.clone()),
        });
        Self {
            batch: spec.batch,
            shuffle: spec.shuffle,
            sampling: spec.sampling,
            importance: spec.importance,
            locality,
            mix: None,
        }
    }

    /// The first difference between a checkpoint's (`self`) and this loader's, as
    /// (what, theirs, ours). Across world sizes (an elastic resume, `worlds` = theirs,
    /// ours) the global batch (`batch.size × world_size`) must match rather than the batch
    /// size.
    fn difference(&self, ours: &Self, worlds: (usize, usize)) -> Option<(&'static str, String, String)> {
        let differs = |what, theirs: String, ours: String| (theirs != ours).then_some((what, theirs, ours));
        let batch = if worlds.0 == worlds.1 {
            differs("batch size", self.batch.size.to_string(), ours.batch.size.to_string())
        } else {
            let global = |size: usize, world: usize| format!("{size} × {world} = {}", size.saturating_mul(world));
            let (theirs, mine) = (self.batch.size.saturating_mul(worlds.0), ours.batch.size.saturating_mul(worlds.1));
            (theirs != mine).then(|| {
                (
                    "global batch (batch.size × world_size)",
                    global(self.batch.size, worlds.0),
                    global(ours.batch.size, worlds.1),
                )
            })
        };
        batch
            .or_else(|| differs("batch.drop_last", self.batch.drop_last.to_string(), ours.batch.drop_last.to_string()))
            .or_else(|| differs("shuffle", format!("{:?}", self.shuffle), format!("{:?}", ours.shuffle)))
            .or_else(|| differs("sampling", format!("{:?}", self.sampling), format!("{:?}", ours.sampling)))
            .or_else(|| differs("importance.ema", self.importance.ema.to_string(), ours.importance.ema.to_string()))
            .or_else(|| match (&self.locality, &ours.locality) {
                (Some(t), Some(o)) => {
                    differs("locality.assignment", format!("{:?}", t.assignment), format!("{:?}", o.assignment))
                        .or_else(|| {
                            differs(
                                "locality.cache_samples",
                                format!("{:?}", t.cache_samples),
                                format!("{:?}", o.cache_samples),
                            )
                        })
                }
                (t, o) => {
                    let section =
                        |l: &Option<LocalityOrder>| if l.is_some() { "a section" } else { "none" }.to_string();
                    differs("locality", section(t), section(o))
                }
            })
    }
}

impl Loader {
    pub fn state(&self) -> LoaderState {
        let p = self.shared.position.progress.lock();
        let mut order = OrderSpec::of(&self.shared.data.spec, self.shared.data.shard.world_size);
        order.mix = self.mix_plan(p.epoch).map(|plan| plan.weights);
        LoaderState {
            epoch: p.epoch,
            batch: p.batch,
            seed: self.shared.data.spec.seed,
            fingerprint: self.shared.data.manifest.fingerprint_hex(),
            rank: self.shared.data.shard.rank,
            world_size: self.shared.data.shard.world_size,
            importance: Some(self.shared.priority.importance.lock().state()),
            order: Some(order),
        }
    }

    /// Makes the next [`Loader::iter`] continue exactly where `state` was taken. A state
    /// of another world size (any of its ranks') continues at the same global batch, which
    /// holds the same samples on any number of ranks (see [`crate::sampler::epoch_order`]).
    pub fn load_state(&self, state: &LoaderState) -> Result<(), PipelineError> {
        let me = self.state();
        let mismatch = |what: &str, theirs: String, ours: String| {
            Err(PipelineError::State(format!("{what} differs: checkpoint has {theirs}, this loader has {ours}")))
        };
        if state.fingerprint != me.fingerprint {
            return mismatch("dataset fingerprint", state.fingerprint.clone(), me.fingerprint);
        }
        if state.seed != me.seed {
            return mismatch("seed", state.seed.to_string(), me.seed.to_string());
        }
        let elastic = state.world_size != me.world_size;
        if !elastic && state.rank != me.rank {
            return mismatch(
                "rank/world_size",
                format!("{}/{}", state.rank, state.world_size),
                format!("{}/{}", me.rank, me.world_size),
            );
        }
        match (&state.order, &me.order) {
            (Some(theirs), Some(ours)) => {
                if elastic {
                    check_elastic(theirs, state.world_size, ours, me.world_size)?;
                }
                if let Some((what, theirs, ours)) = theirs.difference(ours, (state.world_size, me.world_size)) {
                    return mismatch(what, theirs, ours);
                }
            }
            _ if elastic => {
                return Err(PipelineError::State(format!(
                    "the checkpoint was taken with {} ranks and this loader is one of {}, but the checkpoint predates \
                     sluice recording its batch size, so its global batches cannot be matched",
                    state.world_size, me.world_size
                )))
            }
            _ => tracing::warn!(
                "this checkpoint predates sluice recording batch size, shuffle and sampling in it: \
                 they cannot be checked, make sure they are the ones it was taken with"
            ),
        }
        if state.epoch == u64::MAX {
            return Err(PipelineError::State(format!("epoch {} leaves no epoch after it", state.epoch)));
        }
        // Global batch g holds the same samples whatever the world size (see
        // `sampler::epoch_order`), so a checkpoint's batch index is every world size's.
        let their_mix = self.their_mix(state)?;
        let theirs_per_epoch = match (&state.order, &their_mix) {
            (Some(o), Some(plan)) => plan.batches(o.batch.size.saturating_mul(state.world_size)) as u64,
            (Some(o), None) => batches_for_spec(self.manifest().len() / state.world_size.max(1), o.batch),
            (None, _) => self.batches_per_epoch(),
        };
        if state.batch > theirs_per_epoch {
            return Err(PipelineError::State(format!(
                "batch {} is past the end of the epoch ({} batches)",
                state.batch, theirs_per_epoch
            )));
        }
        // A mix: the checkpoint's epoch is finished with its weights; one taken at an
        // epoch's start (or under the same weights) goes on with the spec's.
        *self.shared.position.mix_weights.lock() = match their_mix {
            Some(plan)
                if state.batch > 0 && Some(&plan.weights) != self.shared.data.mix.as_ref().map(|m| &m.weights) =>
            {
                Some((state.epoch, plan.weights))
            }
            _ => None,
        };
        // Without drop_last the epoch's short last global batch is cut to a multiple of the
        // world size: resumed past where this world size's epoch ends, the epoch is over.
        let batch = state.batch.min(match &self.mix_plan(state.epoch) {
            Some(plan) => plan.batches(self.global_batch()) as u64,
            None => self.batches_per_epoch(),
        });
        if let Some(imp) = &state.importance {
            self.shared.priority.importance.lock().restore(imp);
            self.shared.position.task_draws.lock().clear();
        }
        let mut p = self.shared.position.progress.lock();
        p.epoch = state.epoch;
        p.batch = batch;
        p.generation += 1;
        Ok(())
    }
}

impl Loader {
    /// The mix (sources and the checkpoint's weights) `state` was taken under, for a loader
    /// of a mixed source; refused when the checkpoint names another number of sources.
    fn their_mix(&self, state: &LoaderState) -> Result<Option<MixPlan>, PipelineError> {
        let Some(ours) = &self.shared.data.mix else { return Ok(None) };
        let weights = match state.order.as_ref().and_then(|o| o.mix.clone()) {
            Some(w) => w,
            None => {
                return Err(PipelineError::State("the checkpoint has no mix weights; this loader mixes sources".into()))
            }
        };
        if weights.len() != ours.sizes.len() || !weights.iter().all(|w| *w > 0.0 && w.is_finite()) {
            return Err(PipelineError::State(format!(
                "the checkpoint's mix weights {weights:?} are not positive weights of this loader's {} sources",
                ours.sizes.len()
            )));
        }
        Ok(Some(MixPlan { sizes: ours.sizes.clone(), weights }))
    }
}

fn batches_for_spec(samples: usize, batch: BatchSpec) -> u64 {
    batches_for(samples, batch.size, batch.drop_last) as u64
}

/// Whether a checkpoint of `theirs_world` ranks can resume on `ours_world`: the global
/// batch must split into equal shares on both, and each learner's share of a global batch
/// must not follow from the world size (no `locality` section).
fn check_elastic(
    theirs: &OrderSpec,
    theirs_world: usize,
    ours: &OrderSpec,
    ours_world: usize,
) -> Result<(), PipelineError> {
    let global = theirs.batch.size.saturating_mul(theirs_world);
    if !global.is_multiple_of(ours_world) {
        return Err(PipelineError::State(format!(
            "a checkpoint of {theirs_world} ranks × batch.size {} resumes on {ours_world} ranks only with the same \
             global batch of {global} samples, and {global} does not split into {ours_world} equal shares: resume on \
             a number of ranks that divides {global}",
            theirs.batch.size
        )));
    }
    if ours.batch.size.saturating_mul(ours_world) != global {
        return Err(PipelineError::State(format!(
            "a checkpoint of {theirs_world} ranks × batch.size {} resumes on {ours_world} ranks only with the same \
             global batch of {global} samples: set batch.size = {} on each of the {ours_world} ranks (it is {})",
            theirs.batch.size,
            global / ours_world,
            ours.batch.size
        )));
    }
    if theirs.locality.is_some() || ours.locality.is_some() {
        return Err(PipelineError::State(format!(
            "a job with a locality section places samples on its {theirs_world} learners by their cache budgets; it \
             cannot resume on {ours_world} learners"
        )));
    }
    Ok(())
}
