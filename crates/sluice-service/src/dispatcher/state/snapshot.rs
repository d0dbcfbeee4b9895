//! The state as a compacted journal holds it (see `journal`): every job's `Job` record,
//! and each job's epochs as they stand ([`Record::EpochTasks`]), instead of every record
//! that led there. Importance reports and draws are carried over by the journal itself.

use std::time::Instant;

use super::{EpochState, Job, State, Task, TaskStatus, CLIENT_LEASE};
use crate::dispatcher::journal::{Record, TaskRecord};
use crate::error::ServiceError;

const PENDING: u8 = 0;
const LEASED: u8 = 1;
const ACKED: u8 = 2;

impl State {
    /// The records a compacted journal replays into this state: `head` (every job), to go
    /// before the importance records, and `tail` (every job's epochs, the lease counter,
    /// and `scale`, the autoscaler's target).
    pub fn snapshot(&self, scale: Option<u64>) -> (Vec<Record>, Vec<Record>) {
        let head = self.jobs.values().map(job_record).collect();
        let mut tail = Vec::new();
        for job in self.jobs.values() {
            tail.push(self.epoch_record(job, &job.current, false));
            if let Some(next) = &job.next {
                tail.push(self.epoch_record(job, next, true));
            }
        }
        tail.push(Record::Leases { next: self.next_lease });
        if let Some(workers) = scale {
            tail.push(Record::Scale { workers });
        }
        (head, tail)
    }

    fn epoch_record(&self, job: &Job, e: &EpochState, ahead: bool) -> Record {
        let tasks = e
            .tasks
            .iter()
            .map(|t| TaskRecord {
                start: t.start,
                end: t.end,
                status: match t.status {
                    TaskStatus::Pending => PENDING,
                    TaskStatus::Leased { .. } => LEASED,
                    TaskStatus::Acked => ACKED,
                },
                lease: t.lease,
                holder: t.holder.clone(),
            })
            .collect();
        let mut requests: Vec<(String, u64, u64)> = self
            .assigned_by_request
            .iter()
            .filter(|(_, &(j, ep, _))| j == job.id && ep == e.epoch)
            .map(|((client, request), &(_, _, task))| (client.clone(), *request, task))
            .collect();
        requests.sort_unstable();
        Record::EpochTasks {
            job_id: job.id,
            epoch: e.epoch,
            generation: e.generation,
            ahead,
            tasks,
            queue: e.queue.iter().copied().collect(),
            requests,
        }
    }

    /// Applies a [`Record::EpochTasks`]: the job's epoch becomes what it describes. A leased
    /// task's lease runs from `now` (as an `Assign` replayed does), its worker unknown.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn restore_epoch(
        &mut self,
        job_id: u64,
        epoch: u64,
        generation: u64,
        ahead: bool,
        tasks: &[TaskRecord],
        queue: &[u64],
        requests: &[(String, u64, u64)],
        now: Instant,
    ) -> Result<(), ServiceError> {
        let n = tasks.len() as u64;
        if let Some(bad) = queue.iter().chain(requests.iter().map(|r| &r.2)).find(|&&t| t >= n) {
            return Err(ServiceError::InvalidArgument(format!(
                "journal: job {job_id} epoch {epoch} names task {bad} of {n}"
            )));
        }
        let tasks: Vec<Task> = tasks
            .iter()
            .map(|t| Task {
                start: t.start,
                end: t.end,
                status: match t.status {
                    LEASED => TaskStatus::Leased { client: t.holder.clone(), worker: 0, deadline: now + CLIENT_LEASE },
                    ACKED => TaskStatus::Acked,
                    _ => TaskStatus::Pending,
                },
                lease: t.lease,
                holder: t.holder.clone(),
            })
            .collect();
        let acked = tasks.iter().filter(|t| t.status == TaskStatus::Acked).count();
        let state =
            EpochState { epoch, tasks, queue: queue.iter().copied().collect(), acked, generation, next_scan: None };
        let job = self.job_mut(job_id)?;
        if ahead {
            job.next = Some(state);
        } else {
            job.current = state;
        }
        job.recount_load();
        for (client, request, task) in requests {
            self.assigned_by_request.insert((client.clone(), *request), (job_id, epoch, *task));
        }
        Ok(())
    }
}

/// The `Job` record that created `job`.
fn job_record(job: &Job) -> Record {
    let passes = job.passes.max(1);
    Record::Job {
        job_id: job.id,
        name: job.name.clone(),
        spec_json: job.spec_json.clone(),
        fingerprint: job.fingerprint.clone(),
        manifest_fingerprint: job.manifest_fingerprint.clone(),
        batches_per_epoch: job.pass_batches,
        samples_per_epoch: job.samples_per_epoch / passes,
        task_batches: job.task_batches,
        passes: if passes > 1 { passes } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::job_record_with_passes as job_record;
    use super::*;
    use sluice_client::proto::RegisterWorkerRequest;

    /// What replay must give back: every job's epochs, tasks, leases and queues.
    fn picture(s: &State) -> String {
        let mut out = format!("next_lease {} next_job {}\n", s.next_lease, s.next_job_id);
        for j in s.jobs.values() {
            for e in std::iter::once(&j.current).chain(j.next.as_ref()) {
                out.push_str(&format!(
                    "job {} epoch {} gen {} acked {} queue {:?}\n",
                    j.id, e.epoch, e.generation, e.acked, e.queue
                ));
                for t in &e.tasks {
                    let status = match &t.status {
                        TaskStatus::Leased { client, .. } => format!("leased {client}"),
                        other => format!("{other:?}"),
                    };
                    out.push_str(&format!("  {}..{} {status} lease {} holder {}\n", t.start, t.end, t.lease, t.holder));
                }
            }
        }
        let mut requests: Vec<_> = s.assigned_by_request.iter().collect();
        requests.sort();
        out.push_str(&format!("{requests:?}"));
        out
    }

    #[test]
    fn a_snapshot_replays_to_the_state_it_was_taken_from() {
        let now = Instant::now();
        let mut s = State::new(1);
        let mut log = vec![job_record(10, 2, 0), job_record(3, 1, 2)];
        if let Record::Job { job_id, name, .. } = &mut log[1] {
            *job_id = 2;
            *name = "k".into();
        }
        for r in &log {
            s.apply(r, now, 0).unwrap();
        }
        s.register_worker(&RegisterWorkerRequest { addr: "w".into(), ..Default::default() }, now);
        let mut request = 0;
        let mut ask = |s: &mut State, log: &mut Vec<Record>, job: u64, client: &str, epoch: u64| {
            request += 1;
            let (reply, record, w) = s.get_task(job, client, epoch, request, true, now).unwrap();
            if let Some(r) = record {
                s.apply(&r, now, w).unwrap();
                log.push(r);
            }
            reply.task
        };
        // Job 1: epoch 0 run through, epoch 1 half acked, a failure, one task of epoch 2
        // leased ahead; job 2 (parallel passes) reset to epoch 3 with a batch skipped.
        for _ in 0..5 {
            let t = ask(&mut s, &mut log, 1, "a", 0).unwrap();
            let r = s.ack_task(1, "a", t.epoch, t.task_index, t.generation, t.lease).unwrap().unwrap();
            s.apply(&r, now, 0).unwrap();
            log.push(r);
        }
        assert!(ask(&mut s, &mut log, 1, "a", 0).is_none());
        let mut held = Vec::new();
        for client in ["a", "b", "a", "b", "a"] {
            held.push((client, ask(&mut s, &mut log, 1, client, 1).unwrap()));
        }
        for (client, t) in &held[..2] {
            let r = s.ack_task(1, client, t.epoch, t.task_index, t.generation, t.lease).unwrap().unwrap();
            s.apply(&r, now, 0).unwrap();
            log.push(r);
        }
        let (client, t) = &held[2];
        let fail = sluice_client::proto::FailTaskRequest {
            job_id: 1,
            client_id: client.to_string(),
            epoch: t.epoch,
            task_index: t.task_index,
            received: 1,
            generation: t.generation,
            lease: t.lease,
            ..Default::default()
        };
        let r = s.fail_task(&fail).unwrap().unwrap();
        s.apply(&r, now, 0).unwrap();
        log.push(r);
        let w = s.workers.keys().next().copied().unwrap();
        s.worker_heartbeat(w, 0, 0, now);
        let again = ask(&mut s, &mut log, 1, "b", 1).unwrap();
        assert_eq!(again.start, t.start + 1);
        assert_eq!(ask(&mut s, &mut log, 1, "a", 1).unwrap().epoch, 2, "leased ahead");
        let reset = Record::Epoch { job_id: 2, epoch: 3, skip: vec![1] };
        s.apply(&reset, now, 0).unwrap();
        log.push(reset);
        ask(&mut s, &mut log, 2, "c", 3).unwrap();

        // Replaying the whole log and replaying the snapshot give the same state.
        let mut full = State::new(1);
        for r in &log {
            full.apply(r, now, 0).unwrap();
        }
        let (head, tail) = s.snapshot(Some(3));
        assert_eq!(tail.last(), Some(&Record::Scale { workers: 3 }));
        let mut compact = State::new(1);
        for r in head.iter().chain(&tail) {
            // Through the journal's own encoding.
            let line = serde_json::to_string(r).unwrap();
            compact.apply(&serde_json::from_str(&line).unwrap(), now, 0).unwrap();
        }
        assert_eq!(picture(&compact), picture(&full));
        assert_eq!(picture(&compact), picture(&s));
        // Both go on alike.
        for state in [&mut full, &mut compact] {
            state.register_worker(&RegisterWorkerRequest { addr: "w".into(), ..Default::default() }, now);
        }
        let a = full.get_task(1, "a", 1, 99, false, now).unwrap();
        let b = compact.get_task(1, "a", 1, 99, false, now).unwrap();
        assert_eq!(format!("{:?}", (&a.0, &a.1)), format!("{:?}", (&b.0, &b.1)));
    }
}
