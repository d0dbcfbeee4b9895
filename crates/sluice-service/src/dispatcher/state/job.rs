//! A job and its epochs: each epoch cut into tasks (runs of batches), with each task's
//! status and lease, the queue of tasks to hand out, and each worker's share of the job.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use sluice_client::proto::JobInfo;

#[derive(Debug, Clone, PartialEq)]
pub enum TaskStatus {
    Pending,
    Leased { client: String, worker: u64, deadline: Instant },
    Acked,
}

#[derive(Debug, Clone)]
pub struct Task {
    pub start: u64,
    pub end: u64,
    pub status: TaskStatus,
    /// The lease whose holder may report on the task (see `TaskAssignment::lease`): set by
    /// each assignment, kept when the lease runs out (its holder still has the batches it
    /// got, and nobody else has), cleared (0) by a failure report.
    pub lease: u64,
    /// The client holding `lease` (empty with none): only it may report on the task.
    pub holder: String,
}

#[derive(Debug)]
pub struct EpochState {
    pub epoch: u64,
    pub tasks: Vec<Task>,
    pub queue: VecDeque<u64>,
    pub acked: usize,
    /// How many times this job's task list was rebuilt (see `TaskAssignment::generation`).
    pub generation: u64,
    /// Leases are scanned for expiry at most every [`LEASE_SCAN`], not on every request.
    pub(super) next_scan: Option<Instant>,
}

/// How often a job's leases are checked for expiry (leases last [`super::CLIENT_LEASE`]).
pub(super) const LEASE_SCAN: Duration = Duration::from_millis(100);

impl EpochState {
    /// `batches` in all, in passes of `pass` batches (no task spans two passes).
    pub(super) fn new(epoch: u64, generation: u64, batches: u64, pass: u64, task_batches: u64, skip: &[u64]) -> Self {
        let tasks: Vec<Task> = cut_tasks(batches, pass, task_batches, skip)
            .into_iter()
            .map(|(start, end)| Task { start, end, status: TaskStatus::Pending, lease: 0, holder: String::new() })
            .collect();
        let queue = (0..tasks.len() as u64).collect();
        Self { epoch, tasks, queue, acked: 0, generation, next_scan: None }
    }

    /// Cuts the tasks again where the batches' owner changes (`owners`: each batch's, from
    /// a cache-aware draw), so that no task mixes two workers' cached samples: the epoch's
    /// last tasks hold the owners' shorter remainders side by side. Only while none of the
    /// epoch's tasks was handed out (a drawn importance epoch, before its first lease).
    pub(super) fn split_at_owners(&mut self, owners: &[u32]) {
        if owners.is_empty() || self.acked > 0 || self.queue.len() != self.tasks.len() {
            return;
        }
        let owner = |b: u64| owners.get(b as usize);
        let mut tasks = Vec::with_capacity(self.tasks.len() + 2);
        for t in &self.tasks {
            let mut start = t.start;
            for b in t.start + 1..t.end {
                if owner(b) != owner(b - 1) {
                    tasks.push(Task { start, end: b, status: TaskStatus::Pending, lease: 0, holder: String::new() });
                    start = b;
                }
            }
            tasks.push(Task { start, end: t.end, status: TaskStatus::Pending, lease: 0, holder: String::new() });
        }
        self.queue = (0..tasks.len() as u64).collect();
        self.tasks = tasks;
    }

    pub fn is_done(&self) -> bool {
        self.acked == self.tasks.len()
    }

    pub fn leased(&self) -> usize {
        self.tasks.len() - self.acked - self.queue.len()
    }
}

/// Splits batches `0..batches`, minus `skip`, into runs of at most `task_batches` that do
/// not cross a multiple of `pass` (parallel epochs: a task belongs to one pass).
pub fn cut_tasks(batches: u64, pass: u64, task_batches: u64, skip: &[u64]) -> Vec<(u64, u64)> {
    let task_batches = task_batches.max(1);
    let pass = pass.max(1);
    let mut skip: Vec<u64> = skip.to_vec();
    skip.sort_unstable();
    let mut out = Vec::new();
    let mut start: Option<u64> = None;
    for b in 0..batches {
        let skipped = skip.binary_search(&b).is_ok();
        match (start, skipped) {
            (Some(s), true) => {
                out.push((s, b));
                start = None;
            }
            (Some(s), false) if b - s == task_batches || b % pass == 0 => {
                out.push((s, b));
                start = Some(b);
            }
            (None, false) => start = Some(b),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, batches));
    }
    out
}

#[derive(Debug)]
pub struct Job {
    pub id: u64,
    pub name: String,
    pub spec_json: String,
    pub fingerprint: String,
    pub manifest_fingerprint: String,
    pub batches_per_epoch: u64,
    pub samples_per_epoch: u64,
    pub task_batches: u64,
    /// Batches per pass: `batches_per_epoch` / passes (all of it in distributed mode).
    pub pass_batches: u64,
    /// Full passes per epoch: 1 in distributed mode, N with parallel epochs.
    pub passes: u64,
    pub current: EpochState,
    /// The epoch after `current`, once some of its tasks were leased ahead.
    pub next: Option<EpochState>,
    /// Tasks of this job assigned to each worker and not yet streamed to the end: what
    /// assignment balances (a worker runs a few of a job's tasks at once and queues the
    /// rest, so one handed more than its share idles the others at the epoch's end).
    pub load: HashMap<u64, u64>,
    /// The importance store and draws of an importance-sampled job.
    pub importance: Option<super::importance::JobImportance>,
    /// Report values taken while the job was in an epoch: (that epoch, how many); see
    /// `REPORT_VALUES_PER_SAMPLE`. Counted anew after a restart.
    pub reported: Option<(u64, u64)>,
}

impl Job {
    /// The worker of a leased task no longer counts it (streamed, acked, failed or expired).
    pub(super) fn unload(&mut self, worker: u64) {
        if let Some(n) = self.load.get_mut(&worker) {
            *n = n.saturating_sub(1);
        }
    }

    /// Counts the load afresh from the leased tasks (after an epoch's tasks were replaced).
    pub(super) fn recount_load(&mut self) {
        self.load.clear();
        for e in std::iter::once(&self.current).chain(self.next.as_ref()) {
            for t in &e.tasks {
                if let TaskStatus::Leased { worker, .. } = t.status {
                    *self.load.entry(worker).or_default() += 1;
                }
            }
        }
    }

    /// The current or the next epoch's state.
    pub(super) fn epoch_mut(&mut self, epoch: u64) -> Option<&mut EpochState> {
        if self.current.epoch == epoch {
            return Some(&mut self.current);
        }
        self.next.as_mut().filter(|n| n.epoch == epoch)
    }

    pub(super) fn epoch_state(&self, epoch: u64) -> Option<&EpochState> {
        if self.current.epoch == epoch {
            return Some(&self.current);
        }
        self.next.as_ref().filter(|n| n.epoch == epoch)
    }
}

impl Job {
    pub fn info(&self) -> JobInfo {
        JobInfo {
            job_id: self.id,
            job_name: self.name.clone(),
            fingerprint: self.fingerprint.clone(),
            batches_per_epoch: self.batches_per_epoch,
            samples_per_epoch: self.samples_per_epoch,
            epoch: self.current.epoch,
            task_batches: self.task_batches,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_cover_the_epoch_minus_skipped_batches() {
        assert_eq!(cut_tasks(10, 10, 4, &[]), vec![(0, 4), (4, 8), (8, 10)]);
        assert_eq!(cut_tasks(10, 10, 4, &[1, 2, 9]), vec![(0, 1), (3, 7), (7, 9)]);
        assert_eq!(cut_tasks(3, 3, 4, &[0, 1, 2]), vec![]);
        // Parallel epochs: two passes of 5 batches; no task spans both.
        assert_eq!(cut_tasks(10, 5, 4, &[]), vec![(0, 4), (4, 5), (5, 9), (9, 10)]);
        assert_eq!(cut_tasks(10, 5, 4, &[5]), vec![(0, 4), (4, 5), (6, 10)]);
    }
}
