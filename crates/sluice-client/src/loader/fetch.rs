//! The fetch machinery behind a [`super::RemoteLoader`]'s stream: `tasks_in_flight`
//! fetchers ask the dispatcher for tasks, stream each from its worker (shared memory, the
//! TCP data plane or gRPC) and hand the batches to the consumer in order, holding tasks of
//! a later epoch until the trainer gets there; a task whose worker fails goes back to the
//! dispatcher, less the batches that arrived.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_core::Batch;
use sluice_pipeline::trace::now_ns;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tonic::{Code, Status};

use super::clock::ConnClock;
use super::conn::{retryable, with_retry, Conn};
use super::options::DataPlane;
use super::trace::Built;
use crate::dataplane::TaskStream;
use crate::error::ClientError;
use crate::proto::*;
use crate::wire::{message_to_received, Received};

/// One assignment of a task: index, generation, lease and first batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct TaskKey {
    pub(super) task: u64,
    pub(super) generation: u64,
    pub(super) lease: u64,
    pub(super) start: u64,
}

impl TaskKey {
    fn of(t: &TaskAssignment) -> Self {
        Self { task: t.task_index, generation: t.generation, lease: t.lease, start: t.start }
    }
}

/// What fetchers hand the consumer.
pub(super) enum Item {
    /// `local`: it came through shared memory.
    Batch {
        task: TaskKey,
        end: u64,
        batch: Batch,
        /// Samples of this batch the worker skipped (`on_error = "skip"`).
        skipped: Vec<crate::proto::SkippedSample>,
        local: bool,
        /// Where and when it was built, when the loader traces.
        built: Option<Box<Built>>,
    },
    /// The dispatcher says every batch of this epoch was delivered (to some client).
    EpochEnd(u64),
    Error(ClientError),
}

/// Where one stream's fetchers stand, shared with the consumer. The stream outlives an
/// epoch: at an epoch's end its fetchers already hold tasks of the next one (lookahead),
/// so workers do not idle while the trainer finishes the epoch and starts the next.
pub(super) struct Flow {
    /// The lowest epoch not known to be done: what fetchers ask for.
    pub(super) floor: AtomicU64,
    /// The epoch the trainer reads. Batches of a later epoch are held by their fetcher
    /// (a whole task each, at most `tasks_in_flight - 1` tasks) until it gets there.
    pub(super) reading: watch::Sender<u64>,
    /// Tasks of a later epoch than `reading` held at once: at most `tasks_in_flight - 1`,
    /// so one fetcher is always free for the current epoch (e.g. a task handed back).
    pub(super) ahead: Arc<Semaphore>,
}

/// Runs `k` fetchers, epoch after epoch, until an error, the consumer goes away, or
/// `stop` fires (or its sender is dropped): then it returns once no fetcher runs, so none
/// sends a request after that.
pub(super) async fn drive(
    conn: Arc<Conn>,
    flow: Arc<Flow>,
    k: usize,
    tx: mpsc::Sender<Item>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut set = JoinSet::new();
    for _ in 0..k {
        set.spawn(fetcher(conn.clone(), flow.clone(), tx.clone()));
    }
    loop {
        let r = tokio::select! {
            r = set.join_next() => match r {
                Some(r) => r,
                None => return,
            },
            _ = &mut stop => {
                set.shutdown().await;
                return;
            }
        };
        let failed = match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(e) => Some(ClientError::Fetcher(e)),
        };
        if let Some(e) = failed {
            let _ = tx.send(Item::Error(e)).await;
            set.shutdown().await;
            return;
        }
    }
}

async fn fetcher(conn: Arc<Conn>, flow: Arc<Flow>, tx: mpsc::Sender<Item>) -> Result<(), ClientError> {
    let mut wait = Duration::from_millis(1);
    let mut reading = flow.reading.subscribe();
    // One id until a task comes back: a WAIT, or a reply lost in a restart, is retried
    // under the same id, so a task assigned to it is never leaked.
    let mut request_id = conn.next_request.fetch_add(1, Ordering::Relaxed);
    // The task this fetcher last streamed to the end, told to the dispatcher with the next
    // request (it balances workers by what they have left to stream).
    let mut streamed: Option<TaskRef> = None;
    loop {
        let epoch = flow.floor.load(Ordering::SeqCst);
        let now_reading = *reading.borrow_and_update();
        // Any task for `epoch` is ahead of the trainer: only with a permit. For the epoch
        // being read, a permit lets the dispatcher hand out the next epoch's tasks instead
        // of making us wait for the last ones to stream.
        let permit: Option<OwnedSemaphorePermit> = if epoch > now_reading {
            tokio::select! {
                p = flow.ahead.clone().acquire_owned() => p.ok(),
                _ = reading.changed() => continue,
            }
        } else {
            flow.ahead.clone().try_acquire_owned().ok()
        };
        let lookahead = permit.is_some() && epoch <= now_reading;
        let req = GetTaskRequest {
            job_id: conn.job_id,
            client_id: conn.client_id.clone(),
            epoch,
            request_id,
            lookahead,
            streamed,
            client_secret: conn.client_secret.clone(),
        };
        let reply = with_retry(&conn, "GetTask", |mut d| {
            let req = req.clone();
            async move { d.get_task(req).await }
        })
        .await?;
        match (reply.status(), reply.task) {
            (get_task_reply::Status::EpochDone, _) => {
                // Whoever moves the floor first tells the consumer, before any batch of
                // a later epoch can reach it (those wait for `reading`).
                if flow.floor.compare_exchange(epoch, epoch + 1, Ordering::SeqCst, Ordering::SeqCst).is_ok()
                    && tx.send(Item::EpochEnd(epoch)).await.is_err()
                {
                    return Ok(());
                }
            }
            (get_task_reply::Status::Task, Some(task)) => {
                wait = Duration::from_millis(1);
                request_id = conn.next_request.fetch_add(1, Ordering::Relaxed);
                let gate = (task.epoch > *reading.borrow()).then(|| (reading.clone(), permit));
                if !run_task(&conn, &task, &tx, gate).await? {
                    return Ok(());
                }
                streamed =
                    Some(TaskRef { epoch: task.epoch, task_index: task.task_index, generation: task.generation });
            }
            _ => {
                drop(permit);
                // The dispatcher already held the request (long poll): ask again soon.
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(20));
            }
        }
    }
}

/// A task of an epoch the trainer has not reached: its batches are held until it does,
/// and the lookahead permit with them.
type Gate = (watch::Receiver<u64>, Option<OwnedSemaphorePermit>);

/// Streams one task's batches into `tx`. On a worker failure, tells the dispatcher how many
/// batches arrived so only the rest runs again. Ok(false) when the consumer has gone.
async fn run_task(
    conn: &Conn,
    task: &TaskAssignment,
    tx: &mpsc::Sender<Item>,
    gate: Option<Gate>,
) -> Result<bool, ClientError> {
    let mut received = 0u64;
    let outcome: Result<(), Status> = async {
        let trace = conn.tracing.load(Ordering::Relaxed);
        let req = RunTaskRequest {
            job_id: task.job_id,
            epoch: task.epoch,
            start: task.start,
            end: task.end,
            compression: conn.compression.to_wire(),
            fingerprint: conn.fingerprint.clone(),
            trace,
            // Masks over the header's 16 MiB travel after the pixels (a gRPC batch ignores it).
            masks_in_body: true,
        };
        // Tracing: when the request went, and this connection's clock offset.
        let sent_ns = trace.then(now_ns);
        let mut clock = ConnClock::default();
        let mut source = if let Some(stream) = open_local(conn, task, &req).await? {
            Source::Tcp(stream)
        } else if conn.data_plane != DataPlane::Grpc && !task.worker_data_addr.is_empty() {
            Source::Tcp(
                TaskStream::open(&task.worker_data_addr, conn.raw_token.as_deref(), &req, conn.tls.as_ref()).await?,
            )
        } else {
            let mut worker = conn.worker(&task.worker_addr).map_err(Status::from)?;
            Source::Grpc(Box::new(worker.run_task(req).await?.into_inner()))
        };
        let local = matches!(&source, Source::Tcp(s) if s.is_local());
        // A task ahead of the trainer is read to the end into `held` first: its worker
        // runs only two tasks of a job at a time, so leaving it blocked on a full socket
        // would stall that job's current-epoch tasks queued behind it (and the epoch with
        // them). Memory: at most `tasks_in_flight - 1` such tasks.
        let mut held: Vec<(Batch, Vec<SkippedSample>, Option<Box<Built>>)> = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(60), source.next())
                .await
                .map_err(|_| Status::unavailable("worker sent nothing for 60 s"))??;
            let received_ns = sent_ns.map(|_| now_ns());
            let Some(Received { batch, skipped, trace }) = next else { break };
            let built = match (sent_ns, received_ns, trace) {
                (Some(t0), Some(t3), Some(t)) => {
                    let offset = clock.observe(t0, t.request_received_ns, t.sent_ns, t3);
                    let span = (t.built_end_ns > 0).then_some((t.built_start_ns, t.built_end_ns));
                    Some(Box::new(Built {
                        worker_id: task.worker_id,
                        worker_addr: task.worker_addr.clone(),
                        worker_pid: t.pid,
                        span,
                        received_ns: t3,
                        clock: offset,
                    }))
                }
                _ => None,
            };
            let expected = task.start + received + held.len() as u64;
            if batch.epoch != task.epoch || batch.index != expected {
                return Err(Status::invalid_argument(format!(
                    "worker sent batch {} of epoch {}, expected batch {expected} of epoch {}",
                    batch.index, batch.epoch, task.epoch
                )));
            }
            if let Some(refused) = missing_masks(&batch, conn.masks, &task.worker_addr) {
                return Err(refused);
            }
            if gate.is_some() {
                held.push((batch, skipped, built));
                continue;
            }
            let item = Item::Batch { task: TaskKey::of(task), end: task.end, batch, skipped, local, built };
            if tx.send(item).await.is_err() {
                return Err(Status::cancelled("consumer gone"));
            }
            received += 1;
        }
        if task.start + received + held.len() as u64 != task.end {
            return Err(Status::unavailable(format!(
                "stream ended after {} of {} batches",
                received + held.len() as u64,
                task.end - task.start
            )));
        }
        if let Some((mut reading, permit)) = gate {
            // The worker is done with it: the batches wait for the trainer on their own
            // (holding the lookahead permit), and this fetcher goes on to the next task.
            let (tx, task) = (tx.clone(), task.clone());
            tokio::spawn(async move {
                if reading.wait_for(|&r| r >= task.epoch).await.is_err() {
                    return;
                }
                drop(permit);
                for (batch, skipped, built) in held {
                    let item = Item::Batch { task: TaskKey::of(&task), end: task.end, batch, skipped, local, built };
                    if tx.send(item).await.is_err() {
                        return;
                    }
                }
            });
        }
        Ok(())
    }
    .await;
    match outcome {
        Ok(()) => Ok(true),
        Err(s) if s.code() == Code::Cancelled && tx.is_closed() => Ok(false),
        Err(s) => {
            tracing::warn!(task = task.task_index, worker = %task.worker_addr, received, error = %s, "task failed; handing the rest back");
            let req = FailTaskRequest {
                job_id: task.job_id,
                client_id: conn.client_id.clone(),
                epoch: task.epoch,
                task_index: task.task_index,
                received,
                worker_id: task.worker_id,
                generation: task.generation,
                lease: task.lease,
                client_secret: conn.client_secret.clone(),
            };
            with_retry(conn, "FailTask", |mut d| {
                let req = req.clone();
                async move { d.fail_task(req).await }
            })
            .await?;
            if retryable(s.code()) || s.code() == Code::Internal {
                Ok(true)
            } else {
                // The worker refused the job (path not allowed, bad data under `fail`...):
                // retrying elsewhere would fail the same way.
                Err(ClientError::rpc("RunTask", s))
            }
        }
    }
}

/// The task's stream over the worker's local data plane (shared memory), when the worker
/// has one and is on this machine; `None` otherwise (its abstract socket name exists only
/// in the worker's network namespace: elsewhere connecting fails at once, and is not tried
/// again for that worker).
#[cfg(target_os = "linux")]
async fn open_local(conn: &Conn, task: &TaskAssignment, req: &RunTaskRequest) -> Result<Option<TaskStream>, Status> {
    let name = &task.worker_local_data_addr;
    if conn.data_plane != DataPlane::Auto || name.is_empty() {
        return Ok(None);
    }
    if conn.unreachable_local.lock().contains(name) {
        return Ok(None);
    }
    match crate::shm::connect_abstract(name) {
        Ok(sock) => TaskStream::open_local(sock, name, conn.raw_token.as_deref(), req, &conn.regions).await.map(Some),
        Err(e) => {
            tracing::debug!(worker = %task.worker_addr, error = %e, "worker not on this machine: TCP data plane");
            conn.unreachable_local.lock().insert(name.clone());
            Ok(None)
        }
    }
}

#[cfg(not(target_os = "linux"))]
async fn open_local(_: &Conn, _: &TaskAssignment, _: &RunTaskRequest) -> Result<Option<TaskStream>, Status> {
    Ok(None)
}

/// Where a task's batches come from.
enum Source {
    Grpc(Box<tonic::Streaming<BatchMessage>>),
    Tcp(TaskStream),
}

impl Source {
    async fn next(&mut self) -> Result<Option<Received>, Status> {
        match self {
            Source::Grpc(s) => match s.message().await? {
                Some(m) => message_to_received(m).map(Some).map_err(Status::from),
                None => Ok(None),
            },
            Source::Tcp(s) => s.next_received().await,
        }
    }
}

/// A batch of a job whose source reads masks must carry them: a worker that predates
/// masks on the wire (`BatchTargets.masks`) sends none, and its batches are refused
/// rather than handed to the trainer without their masks: the status it fails with.
fn missing_masks(batch: &Batch, masks: bool, worker: &str) -> Option<Status> {
    if masks && batch.boxes.as_ref().is_none_or(|b| b.masks.is_none()) {
        return Some(Status::failed_precondition(format!(
            "worker {worker} sent batch {} of epoch {} without masks, and the job's source reads masks \
             (a worker older than masks on the wire? upgrade it)",
            batch.index, batch.epoch
        )));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{BatchBoxes, BoxTargets, DType, Layout, Tensor, TensorData};

    #[test]
    fn a_batch_of_a_masks_job_without_masks_is_refused_naming_it_and_its_worker() {
        let mut boxes = BatchBoxes::pad(&[BoxTargets::default()]);
        let b = Batch {
            boxes: Some(Box::new(boxes.clone())),
            ..crate::wire::test_batch(3, 7, vec![1], vec![0], Tensor::zeros(DType::U8, vec![1, 2, 2, 3]), Layout::Hwc)
        };
        // As an older worker sends it: boxes, no masks; or no targets at all.
        for sent in [b.clone(), Batch { boxes: None, ..b.clone() }] {
            let e = missing_masks(&sent, true, "10.0.0.5:7071").expect("refused");
            assert_eq!(e.code(), Code::FailedPrecondition, "not retried elsewhere: every old worker does it");
            assert!(e.message().contains("worker 10.0.0.5:7071 sent batch 7 of epoch 3 without masks"), "{e}");
        }
        assert!(missing_masks(&b, false, "w").is_none(), "a job without masks expects none");
        boxes.masks = Some(Tensor { shape: vec![1, 2, 2], data: TensorData::U8(vec![0; 4]) });
        assert!(missing_masks(&Batch { boxes: Some(Box::new(boxes)), ..b }, true, "w").is_none());
    }
}
