//! The epochs of an importance-sampled job: the dispatcher draws them (it holds the job's
//! importance store), and a worker fetches each epoch's draw once, checks it against its
//! dataset and keeps the last few for the epoch's tasks.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{JobRunner, WorkerService};
use crate::error::ServiceError;
use crate::proto::GetDrawRequest;

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
        let reply = self
            .inner
            .dispatcher
            .clone()
            .get_draw(GetDrawRequest { job_id, epoch })
            .await
            .map_err(|s| ServiceError::rpc("GetDraw", s))?
            .into_inner();
        let n = runner.loader.samples_per_epoch();
        let bad = |why: String| ServiceError::InvalidArgument(format!("job {job_id}, epoch {epoch}: the draw {why}"));
        if reply.epoch != epoch {
            return Err(bad(format!("is for epoch {}", reply.epoch)));
        }
        if reply.order.len() != n {
            return Err(bad(format!("has {} positions, the dataset {n} samples", reply.order.len())));
        }
        if let Some(p) = reply.order.iter().find(|&&p| p as usize >= n) {
            return Err(bad(format!("names position {p}, past the dataset's {n} samples")));
        }
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
