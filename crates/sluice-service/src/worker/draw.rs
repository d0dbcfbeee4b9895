//! The epochs of an importance-sampled job: the dispatcher draws them (it holds the job's
//! importance store), and a worker fetches each epoch's draw once, in chunks that each fit
//! a control message, checks it against its dataset and keeps the last few for the
//! epoch's tasks.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::{JobRunner, WorkerService};
use crate::error::ServiceError;
use sluice_client::proto::{EpochDrawReply, GetDrawRequest};
use sluice_client::ClientError;

/// Manifest positions in epoch order, and their weights.
pub(super) type Draw = (Arc<Vec<u32>>, Option<Arc<Vec<f32>>>);

/// Draws kept per job: the current epoch's and the next one's (read ahead), and one more.
const KEPT: usize = 3;

/// The draws a worker holds for one job, by epoch.
#[derive(Default)]
pub(super) struct Draws(parking_lot::Mutex<VecDeque<(u64, Draw)>>);

impl Draws {
    fn get(&self, epoch: u64) -> Option<Draw> {
        self.0.lock().iter().find(|d| d.0 == epoch).map(|d| d.1.clone())
    }

    fn keep(&self, epoch: u64, draw: Draw) {
        let mut d = self.0.lock();
        if d.iter().any(|e| e.0 == epoch) {
            return;
        }
        if d.len() == KEPT {
            d.pop_front();
        }
        d.push_back((epoch, draw));
    }
}

impl WorkerService {
    /// The draw of `epoch` for an importance-sampled job: kept, or fetched and checked.
    pub(super) async fn draw(
        &self,
        runner: &JobRunner,
        draws: &Draws,
        job_id: u64,
        epoch: u64,
    ) -> Result<Draw, ServiceError> {
        if let Some(d) = draws.get(epoch) {
            return Ok(d);
        }
        let n = runner.loader.samples_per_epoch();
        let bad = |why: String| ServiceError::InvalidArgument(format!("job {job_id}, epoch {epoch}: the draw {why}"));
        let reply = self.fetch_draw(job_id, epoch, n).await?;
        if reply.epoch != epoch {
            return Err(bad(format!("is for epoch {}", reply.epoch)));
        }
        if reply.order.len() != n {
            return Err(bad(format!("has {} positions, the dataset {n} samples", reply.order.len())));
        }
        if let Some(p) = reply.order.iter().find(|&&p| p as usize >= n) {
            return Err(bad(format!("names position {p}, past the dataset's {n} samples")));
        }
        if let Some(p) = reply.hot.iter().find(|&&p| p as usize >= n) {
            return Err(bad(format!("has position {p} in the hot set, past the dataset's {n} samples")));
        }
        if !reply.members.is_empty() && reply.owners.len() != n {
            return Err(bad(format!("places {} positions, the dataset has {n}", reply.owners.len())));
        }
        if let Some(o) = reply.owners.iter().find(|&&o| o as usize >= reply.members.len()) {
            return Err(bad(format!("names owner {o} of {} workers", reply.members.len())));
        }
        if !reply.priorities.is_empty() && reply.priorities.len() != n {
            return Err(bad(format!("has {} cache priorities for {n} positions", reply.priorities.len())));
        }
        self.follow(runner, &reply);
        let weights = match reply.weights.len() {
            0 => None,
            w if w == n => Some(Arc::new(reply.weights)),
            w => return Err(bad(format!("has {w} weights for {n} positions"))),
        };
        let draw = (Arc::new(reply.order), weights);
        draws.keep(epoch, draw.clone());
        Ok(draw)
    }
}

impl WorkerService {
    /// The whole draw of `epoch`, chunk by chunk: each chunk's lists are appended to the
    /// first's until the order holds its `total` positions (at most `n`, the dataset's
    /// samples: a dispatcher that claims more is refused before any is fetched).
    async fn fetch_draw(&self, job_id: u64, epoch: u64, n: usize) -> Result<EpochDrawReply, ServiceError> {
        let mut dispatcher = self.inner.dispatcher.clone();
        let mut get = async |first: usize| {
            let request = GetDrawRequest { job_id, epoch, first: first as u64 };
            Ok::<_, ServiceError>(
                dispatcher.get_draw(request).await.map_err(|s| ClientError::rpc("GetDraw", s))?.into_inner(),
            )
        };
        let mut whole = get(0).await?;
        let bad = |why: String| ServiceError::InvalidArgument(format!("job {job_id}, epoch {epoch}: the draw {why}"));
        if whole.total != n as u64 || whole.hot_total > whole.total {
            return Err(bad(format!(
                "has {} positions ({} hot), the dataset {n} samples",
                whole.total, whole.hot_total
            )));
        }
        while whole.order.len() < n {
            let chunk = get(whole.order.len()).await?;
            if chunk.order.is_empty()
                || (chunk.epoch, chunk.total, chunk.hot_total) != (epoch, whole.total, whole.hot_total)
            {
                return Err(bad(format!("changed or stopped at position {}", whole.order.len())));
            }
            whole.order.extend(chunk.order);
            whole.weights.extend(chunk.weights);
            whole.hot.extend(chunk.hot);
            whole.owners.extend(chunk.owners);
            whole.priorities.extend(chunk.priorities);
        }
        if whole.hot.len() as u64 != whole.hot_total {
            return Err(bad(format!("sent {} hot positions of {}", whole.hot.len(), whole.hot_total)));
        }
        Ok(whole)
    }

    /// Points the job's cache at the epoch's draw (checked): with a placement, at this
    /// worker's share of the hot set (every sample it owns, before there is a hot set) and
    /// nothing else; without one, at the policy's priorities over the whole dataset.
    fn follow(&self, runner: &JobRunner, reply: &EpochDrawReply) {
        let Some(cache) = runner.loader.cache() else { return };
        let samples = runner.loader.manifest().len();
        let priority = |p: usize| reply.priorities.get(p).map_or(1.0, |&x| f64::from(x));
        if reply.members.is_empty() {
            cache.unshare();
            if !reply.priorities.is_empty() {
                cache.set_epoch_priorities((0..samples).map(|p| (p as u64, priority(p))).collect());
            }
            self.inner.shares.lock().remove(&runner.fingerprint);
            return;
        }
        // A worker that joined after the draw owns nothing in it (its tasks are steals).
        let me = self.inner.addr.get().and_then(|a| reply.members.iter().position(|m| m == a));
        let mine = |p: usize| me.is_some_and(|me| reply.owners.get(p).is_some_and(|&o| o as usize == me));
        let positions: Vec<usize> = if reply.hot.is_empty() {
            (0..samples).filter(|&p| mine(p)).collect()
        } else {
            reply.hot.iter().map(|&p| p as usize).filter(|&p| mine(p)).collect()
        };
        let keys: Vec<u64> = positions.iter().filter(|&&p| p < samples).map(|&p| p as u64).collect();
        let priorities: HashMap<u64, f64> = positions.iter().zip(&keys).map(|(&p, &k)| (k, priority(p))).collect();
        let share: HashSet<u64> = keys.iter().copied().collect();
        cache.set_epoch_share(if reply.priorities.is_empty() { HashMap::new() } else { priorities }, share);
        tracing::debug!(
            epoch = reply.epoch,
            share = keys.len(),
            hot = reply.hot.len(),
            "cache follows the draw's placement"
        );
        self.inner.shares.lock().insert(runner.fingerprint.clone(), keys);
    }
}
