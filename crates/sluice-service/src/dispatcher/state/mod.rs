//! The dispatcher's state machine: jobs, the current epoch of each as a list of tasks
//! ([`job`]), task leases (here), and the workers and clients it knows ([`registry`]).
//! Pure: no I/O, no clock of its own (callers pass `now`), so it is tested directly. Every
//! change that must survive a restart is a journal [`Record`] applied through
//! [`State::apply`], both live and on replay, so the two paths cannot disagree.

mod importance;
mod job;
mod placement;
mod registry;
mod snapshot;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use importance::{Drawn, JobImportance};
use job::LEASE_SCAN;
pub use job::{cut_tasks, EpochState, Job, Task, TaskStatus};
pub use placement::Member;
pub use registry::{ClientReport, WorkerEntry};

use crate::dispatcher::journal::Record;
use crate::error::ServiceError;
use sluice_client::proto::{
    get_task_reply, FailTaskRequest, GetTaskReply, ReportKind, ReportReply, TaskAssignment, TaskRef,
};

/// A task leased to a client goes back to the queue if the client is silent this long.
pub const CLIENT_LEASE: Duration = Duration::from_secs(10);
/// Importance values a job takes per sample of an epoch, all its clients together, while
/// the dispatcher is in that epoch: a trainer reports each sample once (a retried report
/// twice), and one epoch's reports come while the next one starts. Past it reports are
/// refused, so a flood cannot grow the journal faster than the job runs.
pub const REPORT_VALUES_PER_SAMPLE: u64 = 4;

#[derive(Debug)]
pub struct State {
    pub jobs: BTreeMap<u64, Job>,
    pub names: HashMap<String, u64>,
    pub workers: BTreeMap<u64, WorkerEntry>,
    pub clients: HashMap<String, ClientReport>,
    /// Assignments of the current epochs by (client, request id): a client has several
    /// requests in flight, and any of their replies may be lost in a restart.
    assigned_by_request: HashMap<(String, u64), (u64, u64, u64)>,
    /// Each client's last heartbeat.
    client_seen: HashMap<String, Instant>,
    /// Where each client's current stream's request ids start, for clients that restarted
    /// their iteration: GetTask requests below it come from the stream it stopped.
    first_request: HashMap<String, u64>,
    /// When to look for clients to forget next.
    next_client_sweep: Option<Instant>,
    /// When a new client last made a full registry look for clients to forget.
    last_full_sweep: Option<Instant>,
    next_job_id: u64,
    next_worker_id: u64,
    /// The next assignment's lease id: counted by `Assign` records, so replay gives every
    /// lease the id it had.
    next_lease: u64,
    /// Cache-aware assignment: importance-sampled epochs are placed on the workers and
    /// their tasks go to the workers caching them (see [`placement`]). Off: cache-blind.
    pub cache_aware: bool,
}

impl State {
    /// `worker_id_base` seeds worker ids, so ids handed out before a restart are not reused.
    pub fn new(worker_id_base: u64) -> Self {
        Self {
            jobs: BTreeMap::new(),
            names: HashMap::new(),
            workers: BTreeMap::new(),
            clients: HashMap::new(),
            assigned_by_request: HashMap::new(),
            client_seen: HashMap::new(),
            first_request: HashMap::new(),
            next_client_sweep: None,
            last_full_sweep: None,
            next_job_id: 1,
            next_worker_id: worker_id_base.max(1),
            next_lease: 1,
            cache_aware: true,
        }
    }

    /// Applies one journal record. `worker` is the worker of an `Assign` made live; on
    /// replay it is unknown (0) and the client keeps streaming from whoever it had.
    pub fn apply(&mut self, record: &Record, now: Instant, worker: u64) -> Result<(), ServiceError> {
        match record {
            Record::Job {
                job_id,
                name,
                spec_json,
                fingerprint,
                manifest_fingerprint,
                batches_per_epoch,
                samples_per_epoch,
                task_batches,
                passes,
            } => {
                let passes = (*passes).max(1);
                let batches = batches_per_epoch * passes;
                let job = Job {
                    id: *job_id,
                    name: name.clone(),
                    spec_json: spec_json.clone(),
                    fingerprint: fingerprint.clone(),
                    manifest_fingerprint: manifest_fingerprint.clone(),
                    batches_per_epoch: batches,
                    samples_per_epoch: samples_per_epoch * passes,
                    task_batches: *task_batches,
                    pass_batches: *batches_per_epoch,
                    passes,
                    current: EpochState::new(0, 0, batches, *batches_per_epoch, *task_batches, &[]),
                    next: None,
                    load: HashMap::new(),
                    importance: None,
                    reported: None,
                };
                self.names.insert(name.clone(), *job_id);
                self.jobs.insert(*job_id, job);
                self.next_job_id = self.next_job_id.max(job_id + 1);
            }
            Record::Epoch { job_id, epoch, skip } => {
                let job = self.job_mut(*job_id)?;
                let generation = job.current.generation + 1;
                job.current = EpochState::new(
                    *epoch,
                    generation,
                    job.batches_per_epoch,
                    job.pass_batches,
                    job.task_batches,
                    skip,
                );
                // Tasks leased ahead belong to the old order of things: dropped with it.
                job.next = None;
                job.recount_load();
                self.assigned_by_request.retain(|_, (job, _, _)| job != job_id);
            }
            Record::Advance { job_id, epoch } => {
                let job = self.job_mut(*job_id)?;
                match job.next.take() {
                    Some(next) if next.epoch == *epoch => job.current = next,
                    other => {
                        job.next = other;
                        return Err(ServiceError::NotLeasedAhead { job_id: *job_id, epoch: *epoch });
                    }
                }
                job.recount_load();
                let epoch = *epoch;
                self.assigned_by_request.retain(|_, (job, ep, _)| job != job_id || *ep >= epoch);
            }
            Record::Assign { job_id, epoch, task, client, request } => {
                let job = self.job_mut(*job_id)?;
                if job.next.is_none() && *epoch == job.current.epoch + 1 {
                    let generation = job.current.generation + 1;
                    job.next = Some(EpochState::new(
                        *epoch,
                        generation,
                        job.batches_per_epoch,
                        job.pass_batches,
                        job.task_batches,
                        &[],
                    ));
                }
                if *request != 0 {
                    self.assigned_by_request.insert((client.clone(), *request), (*job_id, *epoch, *task));
                }
                let lease = self.next_lease;
                self.next_lease += 1;
                let t = self.task_mut(*job_id, *epoch, *task)?;
                t.status = TaskStatus::Leased { client: client.clone(), worker, deadline: now + CLIENT_LEASE };
                t.lease = lease;
                t.holder = client.clone();
                let queue = &mut self.epoch_state_mut(*job_id, *epoch)?.queue;
                if queue.front() == Some(task) {
                    queue.pop_front();
                } else {
                    queue.retain(|&q| q != *task);
                }
                *self.job_mut(*job_id)?.load.entry(worker).or_default() += 1;
            }
            Record::Requeue { job_id, epoch, task, start } => {
                let released = self.release(*job_id, *epoch, *task)?;
                let t = self.task_mut(*job_id, *epoch, *task)?;
                t.start = (*start).clamp(t.start, t.end);
                t.status = TaskStatus::Pending;
                t.lease = 0;
                t.holder.clear();
                let queue = &mut self.epoch_state_mut(*job_id, *epoch)?.queue;
                if released && !queue.contains(task) {
                    queue.push_front(*task);
                }
            }
            Record::Report { job_id, keys, values, kind } => {
                let kind = ReportKind::try_from(*kind).unwrap_or(ReportKind::Loss);
                self.importance_mut(*job_id)?.apply_report(keys, values, kind);
                let job = self.job_mut(*job_id)?;
                let current = job.current.epoch;
                let taken = job.reported.filter(|&(e, _)| e == current).map_or(0, |(_, n)| n);
                job.reported = Some((current, taken + keys.len() as u64));
            }
            Record::Draw { job_id, epoch, hot, members } => {
                let task_batches = self.job(*job_id)?.task_batches;
                let drawn = self.importance_mut(*job_id)?.apply_draw(*epoch, *hot, members, task_batches);
                if let Some(e) = self.job_mut(*job_id)?.epoch_mut(*epoch) {
                    e.split_at_owners(&drawn.batch_owners);
                }
            }
            Record::Ack { job_id, epoch, task } => {
                self.release(*job_id, *epoch, *task)?;
                let t = self.task_mut(*job_id, *epoch, *task)?;
                if t.status != TaskStatus::Acked {
                    // Only a pending task sits in the queue (scanning it is O(tasks)).
                    let queued = t.status == TaskStatus::Pending;
                    t.status = TaskStatus::Acked;
                    let e = self.epoch_state_mut(*job_id, *epoch)?;
                    e.acked += 1;
                    if queued {
                        e.queue.retain(|&q| q != *task);
                    }
                }
            }
            // The autoscaler's, resumed by the dispatcher: no job's state.
            Record::Scale { .. } => {}
            Record::EpochTasks { job_id, epoch, generation, ahead, tasks, queue, requests } => {
                self.restore_epoch(*job_id, *epoch, *generation, *ahead, tasks, queue, requests, now)?;
            }
            Record::Leases { next } => self.next_lease = self.next_lease.max(*next),
        }
        Ok(())
    }

    /// `client` has every batch of a task in hand: its worker no longer counts it, so the
    /// next task goes to whichever worker has least left to stream (waiting for the ack,
    /// which comes once the trainer has taken the batches, handed a busy worker more while
    /// another idled). Not journaled: it only steers assignment.
    pub fn streamed(&mut self, job_id: u64, client: &str, r: &TaskRef) {
        let Some(job) = self.jobs.get_mut(&job_id) else { return };
        let Some(e) = job.epoch_mut(r.epoch).filter(|e| e.generation == r.generation) else { return };
        let Some(t) = e.tasks.get_mut(r.task_index as usize) else { return };
        if let TaskStatus::Leased { client: holder, worker, .. } = &mut t.status {
            if holder == client {
                let w = *worker;
                // No worker of this number: the ack or a lease running out counts nothing again.
                *worker = 0;
                job.unload(w);
            }
        }
    }

    /// Drops the worker's count of a leased task; true if the task was not acked.
    fn release(&mut self, job_id: u64, epoch: u64, task: u64) -> Result<bool, ServiceError> {
        let t = self.task_mut(job_id, epoch, task)?;
        match &t.status {
            TaskStatus::Leased { worker, .. } => {
                let w = *worker;
                self.job_mut(job_id)?.unload(w);
                Ok(true)
            }
            TaskStatus::Pending => Ok(true),
            TaskStatus::Acked => Ok(false),
        }
    }

    /// Gives an importance-sampled job its store (right after its `Job` record: the store
    /// needs the manifest, which the record does not carry).
    pub fn attach_importance(&mut self, job_id: u64, importance: JobImportance) -> Result<(), ServiceError> {
        self.job_mut(job_id)?.importance = Some(importance);
        Ok(())
    }

    pub fn importance(&self, job_id: u64) -> Result<&JobImportance, ServiceError> {
        self.job(job_id)?.importance.as_ref().ok_or(ServiceError::NotImportanceSampled { job_id })
    }

    fn importance_mut(&mut self, job_id: u64) -> Result<&mut JobImportance, ServiceError> {
        self.job_mut(job_id)?.importance.as_mut().ok_or(ServiceError::NotImportanceSampled { job_id })
    }

    /// Decides a `Report`: the record to journal (none when nothing valid is left), and
    /// the counts to answer (also added to the job's, for the metrics). Reports are taken
    /// for the job's current epoch, the one before (its last batches are reported while the
    /// next epoch starts) and the next one.
    pub fn report(
        &mut self,
        job_id: u64,
        epoch: u64,
        keys: &[u64],
        values: &[f64],
        kind: ReportKind,
    ) -> Result<(Option<Record>, ReportReply), ServiceError> {
        let job = self.job(job_id)?;
        let current = job.current.epoch;
        let checked = self.importance(job_id)?.check_report(job_id, keys, values, kind)?;
        if epoch + 1 < current || epoch > current + 1 {
            return Err(ServiceError::ReportEpoch { job_id, epoch, current });
        }
        let limit = REPORT_VALUES_PER_SAMPLE.saturating_mul(job.samples_per_epoch);
        let taken = job.reported.filter(|&(e, _)| e == current).map_or(0, |(_, n)| n);
        if taken.saturating_add(checked.keys.len() as u64) > limit {
            return Err(ServiceError::ReportBudget {
                job_id,
                epoch: current,
                limit,
                per_sample: REPORT_VALUES_PER_SAMPLE,
            });
        }
        self.importance_mut(job_id)?.count_report(&checked.reply);
        let record = (!checked.keys.is_empty()).then(|| Record::Report {
            job_id,
            keys: checked.keys,
            values: checked.values,
            kind: kind.into(),
        });
        Ok((record, checked.reply))
    }

    /// Decides a `GetDraw`: the draw if made, else the `Draw` record that makes it. Only
    /// the current epoch and drawn ones still kept have a draw: an epoch is drawn once the
    /// one before is done (every task acked, so every report of it is in).
    ///
    /// The draw takes the service's cache capacity (the sum of the live workers', once
    /// every one has told it) and, with cache-aware assignment, places the samples on the
    /// live workers (see [`placement`]).
    pub fn draw(&self, job_id: u64, epoch: u64, now: Instant) -> Result<Result<Arc<Drawn>, Record>, ServiceError> {
        let job = self.job(job_id)?;
        let current = job.current.epoch;
        let importance = self.importance(job_id)?;
        if let Some(d) = importance.drawn(epoch) {
            return Ok(Ok(d));
        }
        let newer_drawn = importance.last_drawn().is_some_and(|d| d > epoch);
        if newer_drawn || epoch != current {
            return Err(ServiceError::NoDraw { job_id, epoch, current });
        }
        let mut members: Vec<Member> = self
            .workers
            .values()
            // A suspect worker (a client saw a task fail on it) still holds its cache.
            .filter(|w| now.duration_since(w.last_seen) < registry::WORKER_TIMEOUT)
            .map(|w| Member {
                addr: w.addr.clone(),
                capacity: w.caches.get(&job.fingerprint).map_or(0, |c| c.capacity_entries),
            })
            .collect();
        members.sort_by(|a, b| a.addr.cmp(&b.addr));
        members.dedup_by(|a, b| a.addr == b.addr);
        let hot = (!members.is_empty() && members.iter().all(|m| m.capacity > 0))
            .then(|| members.iter().map(|m| m.capacity).sum());
        if !self.cache_aware {
            members.clear();
        }
        Ok(Err(Record::Draw { job_id, epoch, hot, members }))
    }

    pub fn job(&self, job_id: u64) -> Result<&Job, ServiceError> {
        self.jobs.get(&job_id).ok_or_else(|| ServiceError::NotFound { what: "job", id: job_id.to_string() })
    }

    fn job_mut(&mut self, job_id: u64) -> Result<&mut Job, ServiceError> {
        self.jobs.get_mut(&job_id).ok_or_else(|| ServiceError::NotFound { what: "job", id: job_id.to_string() })
    }

    fn epoch_state_mut(&mut self, job_id: u64, epoch: u64) -> Result<&mut EpochState, ServiceError> {
        let job = self.job_mut(job_id)?;
        let current = job.current.epoch;
        job.epoch_mut(epoch)
            .ok_or_else(|| ServiceError::InvalidArgument(format!("job {job_id} is in epoch {current}, not {epoch}")))
    }

    fn task_mut(&mut self, job_id: u64, epoch: u64, task: u64) -> Result<&mut Task, ServiceError> {
        let e = self.epoch_state_mut(job_id, epoch)?;
        let n = e.tasks.len();
        e.tasks
            .get_mut(task as usize)
            .ok_or_else(|| ServiceError::InvalidArgument(format!("task {task} is not in 0..{n}")))
    }

    pub fn next_job_id(&self) -> u64 {
        self.next_job_id
    }

    /// Leases that ran out go back to the front of the queue (no record: on replay a lease
    /// is restored with a fresh deadline and runs out again the same way).
    fn expire_leases(&mut self, job_id: u64, now: Instant) {
        let mut expired = Vec::new();
        let client_seen = &self.client_seen;
        let Some(job) = self.jobs.get_mut(&job_id) else { return };
        if job.current.next_scan.is_some_and(|t| now < t) {
            return;
        }
        job.current.next_scan = Some(now + LEASE_SCAN);
        for e in std::iter::once(&mut job.current).chain(job.next.as_mut()) {
            let mut expired_here = Vec::new();
            for (i, t) in e.tasks.iter_mut().enumerate() {
                if let TaskStatus::Leased { deadline, worker, client } = &t.status {
                    // A heartbeat renews every lease of its client at once.
                    let renewed = client_seen.get(client).map(|&seen| seen + CLIENT_LEASE);
                    if (*deadline).max(renewed.unwrap_or(*deadline)) <= now {
                        tracing::warn!(job_id, epoch = e.epoch, task = i, client = %client, "lease ran out; the task goes to another client");
                        expired_here.push(i as u64);
                        expired.push(*worker);
                        t.status = TaskStatus::Pending;
                    }
                }
            }
            for i in expired_here {
                e.queue.push_front(i);
            }
        }
        for w in expired {
            job.unload(w);
        }
    }

    /// Decides a `GetTask`: the reply, and the record to journal before sending it. With
    /// `lookahead`, a request for an epoch with nothing left to hand out gets a task of the
    /// next epoch (see `GetTaskRequest::lookahead`).
    pub fn get_task(
        &mut self,
        job_id: u64,
        client: &str,
        epoch: u64,
        request: u64,
        lookahead: bool,
        now: Instant,
    ) -> Result<(GetTaskReply, Option<Record>, u64), ServiceError> {
        if let Some(&first) = self.first_request.get(client) {
            if request < first {
                return Err(ServiceError::StoppedStream { client: client.to_string(), request, first });
            }
        }
        if request != 0 {
            if let Some(reply) = self.repeat_assignment(job_id, client, epoch, request, now) {
                return Ok((reply, None, 0));
            }
        }
        let wait = GetTaskReply { status: get_task_reply::Status::Wait.into(), task: None };
        let current = self.job(job_id)?.current.epoch;
        if epoch < current {
            return Ok((GetTaskReply { status: get_task_reply::Status::EpochDone.into(), task: None }, None, 0));
        }
        if epoch > current {
            return Ok((wait, None, 0));
        }
        self.expire_leases(job_id, now);
        let job = self.job(job_id)?;
        if job.current.is_done() {
            let record = match &job.next {
                Some(n) if n.epoch == epoch + 1 => Record::Advance { job_id, epoch: epoch + 1 },
                _ => Record::Epoch { job_id, epoch: epoch + 1, skip: Vec::new() },
            };
            return Ok((
                GetTaskReply { status: get_task_reply::Status::EpochDone.into(), task: None },
                Some(record),
                0,
            ));
        }
        // The current epoch's tasks first; the next epoch's only when asked to look ahead.
        let span = |e: &EpochState, task: u64| e.tasks.get(task as usize).map(|t| (t.start, t.end));
        let preferred = self.owned_task(job_id, now);
        let (epoch, task, (start, end), generation) = match job.current.queue.front() {
            Some(&front) => {
                let task = preferred.map_or(front, |p| p.0);
                match span(&job.current, task) {
                    Some(s) => (epoch, task, s, job.current.generation),
                    None => return Ok((wait, None, 0)),
                }
            }
            // An importance-sampled epoch is drawn from every report of the one before:
            // nothing of it is leased before that one is done.
            None if lookahead && job.importance.is_none() => match &job.next {
                Some(n) => match n.queue.front().and_then(|&task| Some((task, span(n, task)?))) {
                    Some((task, s)) => (epoch + 1, task, s, n.generation),
                    None => return Ok((wait, None, 0)),
                },
                // The next epoch's first task: its `Assign` creates the epoch, with the
                // generation it has here.
                None => match cut_tasks(job.batches_per_epoch, job.pass_batches, job.task_batches, &[]).first() {
                    Some(&s) => (epoch + 1, 0, s, job.current.generation + 1),
                    None => return Ok((wait, None, 0)),
                },
            },
            None => return Ok((wait, None, 0)),
        };
        let picked = match preferred {
            Some((_, id)) if epoch == current => self.workers.get(&id).map(|w| (id, w)),
            _ => self.pick_worker(job_id, now),
        };
        let Some((worker_id, worker)) = picked else {
            return Ok((wait, None, 0));
        };
        let assignment = TaskAssignment {
            job_id,
            epoch,
            task_index: task,
            start,
            end,
            worker_id,
            worker_addr: worker.addr.clone(),
            worker_data_addr: worker.data_addr.clone(),
            generation,
            worker_local_data_addr: worker.local_data_addr.clone(),
            // The id its `Assign` gives the lease when applied.
            lease: self.next_lease,
        };
        let record = Record::Assign { job_id, epoch, task, client: client.to_string(), request };
        Ok((
            GetTaskReply { status: get_task_reply::Status::Task.into(), task: Some(assignment) },
            Some(record),
            worker_id,
        ))
    }

    /// The task a retried request got the first time, if the client still holds it. Its
    /// worker is picked again (the first may be gone, or unknown after a restart).
    /// With no worker alive it answers WAIT, and the client retries the same request.
    fn repeat_assignment(
        &mut self,
        job_id: u64,
        client: &str,
        epoch: u64,
        request: u64,
        now: Instant,
    ) -> Option<GetTaskReply> {
        let &(job, ep, task) = self.assigned_by_request.get(&(client.to_string(), request))?;
        // A request for `epoch` may have been given a task of the next one (lookahead).
        if job != job_id || (ep != epoch && ep != epoch + 1) {
            return None;
        }
        let picked = self
            .pick_worker(job_id, now)
            .map(|(id, w)| (id, w.addr.clone(), w.data_addr.clone(), w.local_data_addr.clone()));
        let j = self.jobs.get_mut(&job_id)?;
        let e = j.epoch_mut(ep)?;
        let generation = e.generation;
        let t = e.tasks.get_mut(task as usize)?;
        let TaskStatus::Leased { client: holder, worker, .. } = &mut t.status else { return None };
        if holder != client {
            return None;
        }
        let Some((worker_id, addr, data_addr, local_data_addr)) = picked else {
            return Some(GetTaskReply { status: get_task_reply::Status::Wait.into(), task: None });
        };
        let before = std::mem::replace(worker, worker_id);
        let (start, end, lease) = (t.start, t.end, t.lease);
        j.unload(before);
        *j.load.entry(worker_id).or_default() += 1;
        let assignment = TaskAssignment {
            job_id,
            epoch: ep,
            task_index: task,
            start,
            end,
            worker_id,
            worker_addr: addr,
            worker_data_addr: data_addr,
            generation,
            worker_local_data_addr: local_data_addr,
            lease,
        };
        Some(GetTaskReply { status: get_task_reply::Status::Task.into(), task: Some(assignment) })
    }

    /// Whether a report about `epoch` at `generation` comes from before the job's task list
    /// was rebuilt (an earlier epoch, or a reset since).
    fn stale(&self, job_id: u64, epoch: u64, generation: u64) -> Result<bool, ServiceError> {
        let job = self.job(job_id)?;
        Ok(epoch < job.current.epoch || job.epoch_state(epoch).is_some_and(|e| e.generation != generation))
    }

    /// Whether a report on a task comes from the holder of its latest lease; one from an
    /// older lease (it ran out and the task went to another client, or its holder already
    /// reported a failure) would skip or repeat batches the new holder streams, and one
    /// from another client (naming a lease it never held) would end or cut a task whose
    /// batches it never got.
    fn fenced(t: &Task, job_id: u64, epoch: u64, task: u64, lease: u64, client: &str, what: &str) -> bool {
        if t.lease == lease && lease != 0 && t.holder == client {
            return false;
        }
        tracing::warn!(job_id, epoch, task, lease, current = t.lease, client, holder = %t.holder, "ignoring {what} for a lease that is over or not the client's");
        true
    }

    /// Decides an `AckTask`. Acks for epochs already finished are accepted and ignored, and
    /// so are acks for a lease that is no longer the task's.
    pub fn ack_task(
        &mut self,
        job_id: u64,
        client: &str,
        epoch: u64,
        task: u64,
        generation: u64,
        lease: u64,
    ) -> Result<Option<Record>, ServiceError> {
        if self.stale(job_id, epoch, generation)? {
            return Ok(None);
        }
        let t = self.task_mut(job_id, epoch, task)?;
        if t.status == TaskStatus::Acked || Self::fenced(t, job_id, epoch, task, lease, client, "an ack") {
            return Ok(None);
        }
        Ok(Some(Record::Ack { job_id, epoch, task }))
    }

    /// Decides a `FailTask`: the batches the client got stay delivered; the rest is
    /// queued again, and the worker gets no new task until it proves alive.
    pub fn fail_task(&mut self, req: &FailTaskRequest) -> Result<Option<Record>, ServiceError> {
        let FailTaskRequest {
            job_id,
            ref client_id,
            epoch,
            task_index: task,
            received,
            worker_id: worker,
            generation,
            lease,
            ..
        } = *req;
        if let Some(w) = self.workers.get_mut(&worker) {
            w.suspect = true;
        }
        if self.stale(job_id, epoch, generation)? {
            return Ok(None);
        }
        let t = self.task_mut(job_id, epoch, task)?;
        if t.status == TaskStatus::Acked || Self::fenced(t, job_id, epoch, task, lease, client_id, "a failure report") {
            return Ok(None);
        }
        let start = t.start.saturating_add(received).min(t.end);
        if start == t.end {
            return Ok(Some(Record::Ack { job_id, epoch, task }));
        }
        Ok(Some(Record::Requeue { job_id, epoch, task, start }))
    }

    /// `client` stopped its stream: its requests from now on have ids from `first` up, and
    /// lower ones still in flight lease nothing. Kept for clients the dispatcher knows (a
    /// client heartbeats from its start, and an unknown one's leases run out), and forgotten
    /// with them.
    pub fn stop_stream(&mut self, client: &str, first: u64) {
        if self.client_seen.contains_key(client) {
            let f = self.first_request.entry(client.to_string()).or_default();
            *f = (*f).max(first);
        }
    }

    /// Decides a client's restart of its own iteration (`ResetJobRequest::release_client`):
    /// every task it holds goes back, less the batches of `epoch` it has in `delivered` (a
    /// task's batches reach the trainer in order, so they are a prefix of it); a task it
    /// has all of is done. The job's other clients keep their tasks and their progress.
    pub fn release_client(
        &self,
        job_id: u64,
        epoch: u64,
        client: &str,
        delivered: &[u64],
    ) -> Result<Vec<Record>, ServiceError> {
        let job = self.job(job_id)?;
        let delivered: std::collections::HashSet<u64> = delivered.iter().copied().collect();
        let mut records = Vec::new();
        for e in std::iter::once(&job.current).chain(job.next.as_ref()) {
            for (i, t) in e.tasks.iter().enumerate() {
                let TaskStatus::Leased { client: holder, .. } = &t.status else { continue };
                if holder != client {
                    continue;
                }
                let task = i as u64;
                let start = if e.epoch == epoch {
                    (t.start..t.end).find(|b| !delivered.contains(b)).unwrap_or(t.end)
                } else {
                    t.start
                };
                records.push(if start == t.end {
                    Record::Ack { job_id, epoch: e.epoch, task }
                } else {
                    Record::Requeue { job_id, epoch: e.epoch, task, start }
                });
            }
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_client::proto::RegisterWorkerRequest;

    fn job_record(batches: u64, task_batches: u64) -> Record {
        job_record_with_passes(batches, task_batches, 0)
    }

    /// Job 1's record: `batches` per epoch of 4 samples each, `task_batches` per task.
    pub(super) fn job_record_with_passes(batches: u64, task_batches: u64, passes: u64) -> Record {
        Record::Job {
            job_id: 1,
            name: "j".into(),
            spec_json: "{}".into(),
            fingerprint: "f".into(),
            manifest_fingerprint: "m".into(),
            batches_per_epoch: batches,
            samples_per_epoch: batches * 4,
            task_batches,
            passes,
        }
    }

    /// The failure report of assignment `t` after `received` of its batches.
    fn failed(t: &TaskAssignment, received: u64, client: &str) -> FailTaskRequest {
        FailTaskRequest {
            job_id: t.job_id,
            client_id: client.into(),
            epoch: t.epoch,
            task_index: t.task_index,
            received,
            worker_id: t.worker_id,
            generation: t.generation,
            lease: t.lease,
            ..Default::default()
        }
    }

    fn step(s: &mut State, client: &str, epoch: u64, now: Instant) -> GetTaskReply {
        let (reply, record, worker) = s.get_task(1, client, epoch, 0, false, now).unwrap();
        if let Some(r) = record {
            s.apply(&r, now, worker).unwrap();
        }
        reply
    }

    #[test]
    fn tasks_go_to_the_worker_with_least_left_to_stream() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.apply(&job_record(40, 4), now, 0).unwrap();
        let a = s.register_worker(&RegisterWorkerRequest { addr: "a".into(), ..Default::default() }, now);
        let b = s.register_worker(&RegisterWorkerRequest { addr: "b".into(), ..Default::default() }, now);
        let take = |s: &mut State| step(s, "c", 0, now).task.unwrap();
        let first: Vec<TaskAssignment> = (0..4).map(|_| take(&mut s)).collect();
        let on = |w: u64| first.iter().filter(|t| t.worker_id == w).count();
        assert_eq!((on(a), on(b)), (2, 2), "spread evenly");
        // A task of `b` was streamed to the end but is not acked yet (the trainer has not
        // taken all its batches): `b` has less left to do, so it gets the next task.
        let done = first.iter().find(|t| t.worker_id == b).unwrap();
        s.streamed(1, "c", &TaskRef { epoch: 0, task_index: done.task_index, generation: done.generation });
        assert_eq!(take(&mut s).worker_id, b);
        // The ack that follows counts nothing twice: the workers are even again.
        s.apply(&Record::Ack { job_id: 1, epoch: 0, task: done.task_index }, now, 0).unwrap();
        let next: Vec<u64> = (0..2).map(|_| take(&mut s).worker_id).collect();
        assert!(next.contains(&a) && next.contains(&b), "{next:?}");
        // A hint from another client, or for an older task list, changes nothing.
        let other = first.iter().find(|t| t.worker_id == a).unwrap();
        s.streamed(
            1,
            "someone-else",
            &TaskRef { epoch: 0, task_index: other.task_index, generation: other.generation },
        );
        s.streamed(1, "c", &TaskRef { epoch: 0, task_index: other.task_index, generation: other.generation + 1 });
        let load = &s.job(1).unwrap().load;
        assert_eq!((load[&a], load[&b]), (3, 3));
    }

    #[test]
    fn an_epoch_ends_when_every_task_is_acked_and_failures_requeue_only_the_rest() {
        let now = Instant::now();
        let mut s = State::new(100);
        s.apply(&job_record(10, 4), now, 0).unwrap();
        // No worker: wait.
        assert_eq!(step(&mut s, "a", 0, now).status(), get_task_reply::Status::Wait);
        let w = s.register_worker(&RegisterWorkerRequest { addr: "127.0.0.1:1".into(), ..Default::default() }, now);
        let t0 = step(&mut s, "a", 0, now).task.unwrap();
        let t1 = step(&mut s, "b", 0, now).task.unwrap();
        let t2 = step(&mut s, "a", 0, now).task.unwrap();
        assert_eq!((t0.start, t0.end, t1.start, t2.end, t0.worker_id), (0, 4, 4, 10, w));
        assert_eq!(step(&mut s, "a", 0, now).status(), get_task_reply::Status::Wait);
        // Task 1 failed after 3 of its 4 batches: only batch 7 runs again.
        let r = s.fail_task(&failed(&t1, 3, "b")).unwrap().unwrap();
        s.apply(&r, now, 0).unwrap();
        assert_eq!(step(&mut s, "a", 0, now).status(), get_task_reply::Status::Wait, "suspect worker gets nothing");
        assert!(s.worker_heartbeat(w, 0, 0, now));
        let again = step(&mut s, "a", 0, now).task.unwrap();
        assert_eq!((again.task_index, again.start, again.end), (1, 7, 8));
        for t in [&t0, &again, &t2] {
            if let Some(r) = s.ack_task(1, "a", 0, t.task_index, 0, t.lease).unwrap() {
                s.apply(&r, now, 0).unwrap();
            }
        }
        assert_eq!(s.ack_task(1, "a", 0, 0, 0, t0.lease).unwrap(), None, "acks are idempotent");
        assert_eq!(step(&mut s, "a", 0, now).status(), get_task_reply::Status::EpochDone);
        assert_eq!(s.job(1).unwrap().current.epoch, 1);
        assert_eq!(step(&mut s, "b", 0, now).status(), get_task_reply::Status::EpochDone);
        assert_eq!(step(&mut s, "b", 1, now).task.unwrap().start, 0);
    }

    #[test]
    fn silent_clients_lose_their_leases_and_replay_restores_them() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.apply(&job_record(4, 2), now, 0).unwrap();
        s.register_worker(&RegisterWorkerRequest { addr: "w".into(), ..Default::default() }, now);
        let t = step(&mut s, "a", 0, now).task.unwrap();
        let later = now + CLIENT_LEASE / 2;
        s.client_heartbeat(1, "a", ClientReport::default(), later).unwrap();
        // Still leased at the original deadline thanks to the heartbeat.
        s.worker_heartbeat(t.worker_id, 0, 0, now + CLIENT_LEASE + Duration::from_millis(1));
        let next = step(&mut s, "b", 0, now + CLIENT_LEASE + Duration::from_millis(1)).task.unwrap();
        assert_eq!(next.task_index, 1);
        let much_later = later + CLIENT_LEASE + Duration::from_millis(1);
        s.worker_heartbeat(t.worker_id, 0, 0, much_later);
        let stolen = step(&mut s, "b", 0, much_later).task.unwrap();
        assert_eq!(stolen.task_index, 0);

        // Replay: the same records give the same state.
        let records = vec![
            job_record(4, 2),
            Record::Assign { job_id: 1, epoch: 0, task: 0, client: "a".into(), request: 1 },
            Record::Ack { job_id: 1, epoch: 0, task: 0 },
            Record::Assign { job_id: 1, epoch: 0, task: 1, client: "a".into(), request: 2 },
        ];
        let mut r = State::new(50);
        for rec in &records {
            r.apply(rec, now, 0).unwrap();
        }
        let e = &r.job(1).unwrap().current;
        assert_eq!((e.acked, e.leased(), e.queue.len()), (1, 1, 0));
        // A retried request (its reply was lost in the restart) gets the same task back,
        // WAIT while no worker is there to run it.
        let (wait, _, _) = r.get_task(1, "a", 0, 2, false, now).unwrap();
        assert_eq!(wait.status(), get_task_reply::Status::Wait);
        r.register_worker(&RegisterWorkerRequest { addr: "w2".into(), ..Default::default() }, now);
        let (again, record, _) = r.get_task(1, "a", 0, 2, false, now).unwrap();
        assert_eq!((again.task.unwrap().task_index, record), (1, None));
        let (other, _, _) = r.get_task(1, "a", 0, 3, false, now).unwrap();
        assert_eq!(other.status(), get_task_reply::Status::Wait);

        // A checkpoint rebuilds the task list; acks for the old list no longer count.
        r.apply(&Record::Epoch { job_id: 1, epoch: 0, skip: vec![0] }, now, 0).unwrap();
        assert_eq!(r.job(1).unwrap().current.generation, 1);
        assert_eq!(r.ack_task(1, "a", 0, 0, 0, 1).unwrap(), None, "stale ack ignored");
        let t = r.get_task(1, "a", 0, 9, false, now).unwrap();
        if let (_, Some(rec), w) = &t {
            r.apply(rec, now, *w).unwrap();
        }
        let lease = t.0.task.unwrap().lease;
        assert!(r.ack_task(1, "a", 0, 0, 1, lease).unwrap().is_some());
    }

    #[test]
    fn lookahead_leases_the_next_epoch_only_when_the_current_one_has_nothing_left() {
        let now = Instant::now();
        let mut s = State::new(1);
        let mut journal = vec![job_record(4, 2)];
        s.apply(&journal[0], now, 0).unwrap();
        s.register_worker(&RegisterWorkerRequest { addr: "w".into(), ..Default::default() }, now);
        fn ask(s: &mut State, journal: &mut Vec<Record>, epoch: u64, request: u64, lookahead: bool) -> GetTaskReply {
            let now = Instant::now();
            let (reply, record, worker) = s.get_task(1, "a", epoch, request, lookahead, now).unwrap();
            if let Some(r) = record {
                s.apply(&r, now, worker).unwrap();
                journal.push(r);
            }
            reply
        }
        // Epoch 0 still has a task queued: lookahead does not jump the queue.
        let t0 = ask(&mut s, &mut journal, 0, 1, true).task.unwrap();
        let t1 = ask(&mut s, &mut journal, 0, 2, true).task.unwrap();
        assert_eq!((t0.epoch, t1.epoch, t1.task_index), (0, 0, 1));
        // Nothing left to hand out in epoch 0: without lookahead wait, with it epoch 1.
        assert_eq!(ask(&mut s, &mut journal, 0, 3, false).status(), get_task_reply::Status::Wait);
        let n0 = ask(&mut s, &mut journal, 0, 3, true).task.unwrap();
        assert_eq!((n0.epoch, n0.task_index, n0.start, n0.end, n0.generation), (1, 0, 0, 2, 1));
        // The retried request gets the same task back.
        assert_eq!(ask(&mut s, &mut journal, 0, 3, true).task.unwrap().task_index, 0);
        // Its worker fails mid-task: the rest goes back to epoch 1's queue.
        let r = s
            .fail_task(&FailTaskRequest {
                job_id: 1,
                client_id: "a".into(),
                epoch: 1,
                task_index: 0,
                received: 1,
                worker_id: n0.worker_id,
                generation: 1,
                lease: n0.lease,
                ..Default::default()
            })
            .unwrap()
            .unwrap();
        s.apply(&r, now, 0).unwrap();
        journal.push(r);
        s.worker_heartbeat(n0.worker_id, 0, 0, now);
        let n0b = ask(&mut s, &mut journal, 0, 4, true).task.unwrap();
        assert_eq!((n0b.epoch, n0b.start, n0b.end), (1, 1, 2));
        // Epoch 0 done: the next request advances to epoch 1, keeping its lease.
        for t in [&t0, &t1] {
            let r = s.ack_task(1, "a", 0, t.task_index, 0, t.lease).unwrap().unwrap();
            s.apply(&r, now, 0).unwrap();
            journal.push(r);
        }
        assert_eq!(ask(&mut s, &mut journal, 0, 5, true).status(), get_task_reply::Status::EpochDone);
        let e = &s.job(1).unwrap().current;
        assert_eq!((e.epoch, e.generation, e.leased(), e.queue.len()), (1, 1, 1, 1));
        assert!(s.job(1).unwrap().next.is_none());
        let n1 = ask(&mut s, &mut journal, 1, 6, false).task.unwrap();
        assert_eq!((n1.epoch, n1.task_index), (1, 1));
        // Replaying the journal gives the same epoch, leases and queue.
        let mut r = State::new(1);
        for rec in &journal {
            r.apply(rec, now, 0).unwrap();
        }
        let e = &r.job(1).unwrap().current;
        assert_eq!((e.epoch, e.generation, e.leased(), e.queue.len()), (1, 1, 2, 0));
        // A checkpoint restore drops whatever was leased ahead.
        s.apply(&Record::Epoch { job_id: 1, epoch: 1, skip: vec![] }, now, 0).unwrap();
        assert!(s.job(1).unwrap().next.is_none());
    }

    #[test]
    fn reports_from_a_lease_that_ran_out_are_fenced_off() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.apply(&job_record(8, 4), now, 0).unwrap();
        let w = s.register_worker(&RegisterWorkerRequest { addr: "w".into(), ..Default::default() }, now);
        // `a` takes task 0, then goes silent (a partition): its lease runs out and `b` gets
        // the task with a lease of its own.
        let old = step(&mut s, "a", 0, now).task.unwrap();
        let later = now + CLIENT_LEASE + Duration::from_millis(1);
        s.worker_heartbeat(w, 0, 0, later);
        let new = step(&mut s, "b", 0, later).task.unwrap();
        assert_eq!((new.task_index, new.start), (old.task_index, old.start));
        assert_ne!(new.lease, old.lease);
        // `a` comes back and reports: neither its failure report (which would move the
        // task's start past batches `b` has not delivered) nor its ack (which would end the
        // task under `b`) counts.
        assert_eq!(s.fail_task(&failed(&old, 2, "a")).unwrap(), None);
        s.worker_heartbeat(w, 0, 0, later);
        assert_eq!(s.ack_task(1, "a", 0, old.task_index, old.generation, old.lease).unwrap(), None);
        // `b`'s own reports count, once: a failure report retried after it was applied
        // (its reply lost) does not move the start twice.
        let r = s.fail_task(&failed(&new, 1, "b")).unwrap().unwrap();
        assert_eq!(r, Record::Requeue { job_id: 1, epoch: 0, task: new.task_index, start: 1 });
        s.apply(&r, later, 0).unwrap();
        assert_eq!(s.fail_task(&failed(&new, 1, "b")).unwrap(), None);
        s.worker_heartbeat(w, 0, 0, later);
        let again = step(&mut s, "b", 0, later).task.unwrap();
        assert_eq!((again.task_index, again.start, again.end), (0, 1, 4));
        let ack = s.ack_task(1, "b", 0, again.task_index, again.generation, again.lease).unwrap();
        assert_eq!(ack, Some(Record::Ack { job_id: 1, epoch: 0, task: 0 }));
        // A lease that ran out with nobody else taking the task still counts: its holder
        // is the only one with those batches.
        let t1 = step(&mut s, "a", 0, later).task.unwrap();
        // Another client naming `a`'s lease (its number is easy to guess) changes nothing.
        assert_eq!(s.ack_task(1, "b", 0, t1.task_index, t1.generation, t1.lease).unwrap(), None);
        assert_eq!(s.fail_task(&failed(&t1, 1, "b")).unwrap(), None);
        let much_later = later + CLIENT_LEASE + Duration::from_millis(1);
        s.expire_leases(1, much_later);
        assert!(s.ack_task(1, "a", 0, t1.task_index, t1.generation, t1.lease).unwrap().is_some());
        // Replay gives every lease the id it had.
        let mut r = State::new(1);
        for rec in [
            job_record(8, 4),
            Record::Assign { job_id: 1, epoch: 0, task: 0, client: "a".into(), request: 0 },
            Record::Assign { job_id: 1, epoch: 0, task: 0, client: "b".into(), request: 0 },
        ] {
            r.apply(&rec, now, 0).unwrap();
        }
        assert_eq!(r.job(1).unwrap().current.tasks[0].lease, new.lease);
    }

    #[test]
    fn a_client_restarting_its_epoch_hands_back_only_its_own_tasks() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.apply(&job_record(12, 4), now, 0).unwrap();
        s.register_worker(&RegisterWorkerRequest { addr: "w".into(), ..Default::default() }, now);
        let a0 = step(&mut s, "a", 0, now).task.unwrap();
        let b0 = step(&mut s, "b", 0, now).task.unwrap();
        let a1 = step(&mut s, "a", 0, now).task.unwrap();
        // `a` got batches 0 and 1 of its first task and all of its second.
        let delivered: Vec<u64> = vec![a0.start, a0.start + 1, a1.start, a1.start + 1, a1.start + 2, a1.start + 3];
        let records = s.release_client(1, 0, "a", &delivered).unwrap();
        assert_eq!(
            records,
            vec![
                Record::Requeue { job_id: 1, epoch: 0, task: a0.task_index, start: a0.start + 2 },
                Record::Ack { job_id: 1, epoch: 0, task: a1.task_index },
            ]
        );
        for r in &records {
            s.apply(r, now, 0).unwrap();
        }
        // `b` keeps its task and its lease; `a` gets the rest of its own task back.
        let e = &s.job(1).unwrap().current;
        assert!(matches!(&e.tasks[b0.task_index as usize].status, TaskStatus::Leased { client, .. } if client == "b"));
        let back = step(&mut s, "a", 0, now).task.unwrap();
        assert_eq!((back.task_index, back.start, back.end), (a0.task_index, a0.start + 2, a0.end));
    }

    #[test]
    fn cache_aware_assignment_sends_each_task_to_the_worker_owning_its_samples() {
        let now = Instant::now();
        for aware in [true, false] {
            let mut s = State::new(1);
            s.cache_aware = aware;
            s.apply(&job_record(8, 1), now, 0).unwrap();
            s.attach_importance(1, importance::test_job(32)).unwrap();
            for addr in ["127.0.0.1:1", "127.0.0.1:2"] {
                s.register_worker(&RegisterWorkerRequest { addr: addr.into(), ..Default::default() }, now);
            }
            let Err(record) = s.draw(1, 0, now).unwrap() else { panic!("not drawn yet") };
            let Record::Draw { members, .. } = &record else { panic!("{record:?}") };
            assert_eq!(members.len(), if aware { 2 } else { 0 }, "blind: no placement");
            s.apply(&record, now, 0).unwrap();
            let drawn = s.draw(1, 0, now).unwrap().unwrap();
            if !aware {
                assert!(drawn.owners.is_empty() && drawn.batch_owners.is_empty());
                continue;
            }
            // Every batch that is one owner's goes to that owner while loads stay within the
            // slack; the loads stay balanced.
            let mut to_owner = 0;
            for _ in 0..8 {
                let t = step(&mut s, "c", 0, now).task.unwrap();
                let owner = &drawn.members[drawn.batch_owners[t.start as usize] as usize].addr;
                to_owner += usize::from(*owner == t.worker_addr);
            }
            assert!(to_owner >= 6, "{to_owner} of 8 tasks went to their owner");
            let load = &s.job(1).unwrap().load;
            let loads: Vec<u64> = load.values().copied().collect();
            assert_eq!(loads.iter().sum::<u64>(), 8);
            assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 3, "{loads:?}");
        }
    }

    #[test]
    fn a_cache_aware_draw_cuts_the_epochs_tasks_so_none_mixes_two_owners() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.cache_aware = true;
        // 8 batches of 4 (32 samples) in tasks of 3 batches: the owners' runs of 12 draws
        // leave remainders that a task boundary does not separate.
        s.apply(&job_record(8, 3), now, 0).unwrap();
        s.attach_importance(1, importance::test_job(32)).unwrap();
        for addr in ["127.0.0.1:1", "127.0.0.1:2"] {
            s.register_worker(&RegisterWorkerRequest { addr: addr.into(), ..Default::default() }, now);
        }
        let Err(record) = s.draw(1, 0, now).unwrap() else { panic!("not drawn yet") };
        s.apply(&record, now, 0).unwrap();
        let drawn = s.draw(1, 0, now).unwrap().unwrap();
        let e = &s.job(1).unwrap().current;
        let mut covered = Vec::new();
        for t in &e.tasks {
            let owners: Vec<u32> = (t.start..t.end).map(|b| drawn.batch_owners[b as usize]).collect();
            assert!(owners.windows(2).all(|w| w[0] == w[1]), "task {}..{} mixes owners {owners:?}", t.start, t.end);
            assert!(t.end - t.start <= 3);
            covered.extend(t.start..t.end);
        }
        assert_eq!(covered, (0..8).collect::<Vec<u64>>(), "every batch in one task");
        assert_eq!(e.queue.len(), e.tasks.len());
    }

    #[test]
    fn cache_aware_assignment_gives_a_draining_worker_none_of_its_own_tasks() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.cache_aware = true;
        s.apply(&job_record(8, 1), now, 0).unwrap();
        s.attach_importance(1, importance::test_job(32)).unwrap();
        for (addr, name) in [("127.0.0.1:1", "w0"), ("127.0.0.1:2", "w1")] {
            s.register_worker(
                &RegisterWorkerRequest { addr: addr.into(), name: name.into(), ..Default::default() },
                now,
            );
        }
        let Err(record) = s.draw(1, 0, now).unwrap() else { panic!("not drawn yet") };
        s.apply(&record, now, 0).unwrap();
        // w1 is scaled down after the draw placed half the hot set on it: its share's tasks
        // go to w0 (misses, but w1 can drain).
        assert_eq!(s.drain_worker("w1"), Some(true));
        for _ in 0..8 {
            let t = step(&mut s, "c", 0, now).task.unwrap();
            assert_eq!(t.worker_addr, "127.0.0.1:1", "task {} went to the draining worker", t.task_index);
        }
    }

    #[test]
    fn a_job_takes_a_bounded_number_of_report_values_per_epoch() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.apply(&job_record(4, 1), now, 0).unwrap();
        s.attach_importance(1, importance::test_job(16)).unwrap();
        // A flood of reports in one epoch: past its bound, each is refused and journals nothing.
        let mut taken = 0u64;
        let mut refused = None;
        for i in 0..1000u64 {
            match s.report(1, 0, &[i % 16], &[1.0], ReportKind::Loss) {
                Ok((record, _)) => {
                    s.apply(&record.unwrap(), now, 0).unwrap();
                    taken += 1;
                }
                Err(e) => {
                    refused = Some(e.to_string());
                    break;
                }
            }
        }
        let Some(why) = refused else { panic!("1000 reports of a 16-sample job in one epoch were all journaled") };
        assert_eq!(taken, REPORT_VALUES_PER_SAMPLE * 16, "{why}");
        assert!(why.contains("epoch 0"), "{why}");
        // The next epoch takes reports again.
        s.apply(&Record::Epoch { job_id: 1, epoch: 1, skip: vec![] }, now, 0).unwrap();
        assert!(s.report(1, 1, &[1], &[1.0], ReportKind::Loss).is_ok());
    }

    #[test]
    fn an_importance_job_takes_reports_for_recent_epochs_and_draws_only_its_current_one() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.apply(&job_record(4, 1), now, 0).unwrap();
        assert!(matches!(
            s.report(1, 0, &[1], &[1.0], ReportKind::Loss),
            Err(ServiceError::NotImportanceSampled { job_id: 1 })
        ));
        s.attach_importance(1, importance::test_job(16)).unwrap();
        s.register_worker(&RegisterWorkerRequest { addr: "w".into(), ..Default::default() }, now);
        // Epoch 0 drawn on a worker's first ask, then kept.
        let Err(record) = s.draw(1, 0, now).unwrap() else { panic!("not drawn yet") };
        s.apply(&record, now, 0).unwrap();
        let first = s.draw(1, 0, now).unwrap().unwrap();
        assert_eq!(first.draw.order.len(), 16);
        // Nothing of epoch 1 is leased ahead or drawn while epoch 0 runs.
        for _ in 0..4 {
            let (reply, record, w) = s.get_task(1, "c", 0, 0, true, now).unwrap();
            assert_eq!(reply.task.unwrap().epoch, 0);
            s.apply(&record.unwrap(), now, w).unwrap();
        }
        let (reply, record, _) = s.get_task(1, "c", 0, 0, true, now).unwrap();
        assert_eq!((reply.status(), record), (get_task_reply::Status::Wait, None));
        assert!(matches!(s.draw(1, 1, now), Err(ServiceError::NoDraw { epoch: 1, current: 0, .. })));
        // Reports: the current epoch, the one before and the next are taken; older refused.
        s.apply(&Record::Epoch { job_id: 1, epoch: 3, skip: vec![] }, now, 0).unwrap();
        for epoch in [2, 3, 4] {
            assert!(s.report(1, epoch, &[], &[], ReportKind::Loss).is_ok(), "epoch {epoch}");
        }
        assert!(matches!(
            s.report(1, 1, &[], &[], ReportKind::Loss),
            Err(ServiceError::ReportEpoch { epoch: 1, current: 3, .. })
        ));
        // An empty (or all-invalid) report journals nothing.
        assert_eq!(s.report(1, 3, &[7], &[f64::NAN], ReportKind::Loss).unwrap().0, None);
    }
}
