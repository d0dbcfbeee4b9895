//! Running one task on a worker: check it against the job, run the job's loader over its
//! batch range on a blocking thread, and hand the batches (with the samples skipped in each)
//! to the connection that asked, over gRPC or a data plane.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use sluice_core::{Batch, DType, Layout, Tensor};
use sluice_pipeline::trace::now_ns;
use sluice_pipeline::PipelineError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{Inner, JobRunner, WorkerService};
use crate::dataplane::TaskBatches;
use crate::error::ServiceError;
use sluice_client::proto::worker_server::Worker;
use sluice_client::proto::*;
use sluice_client::wire::{Compression, Outgoing};

fn to_status(e: PipelineError) -> Status {
    match e {
        PipelineError::Sample(s) => Status::failed_precondition(s.to_string()),
        other => Status::from(ServiceError::from(other)),
    }
}

type BatchStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<BatchMessage, Status>> + Send>>;

impl WorkerService {
    /// Starts one task: checks it, then runs the job's loader over the task's batch range on
    /// a blocking thread. Batches arrive on the returned channel, in order; an error ends it.
    pub(crate) async fn start_task(&self, req: RunTaskRequest) -> Result<TaskBatches, Status> {
        // The client traces: when its request arrived, in this machine's clock.
        let received_ns = req.trace.then(now_ns);
        let compression = Compression::from_wire(req.compression).map_err(|e| {
            self.inner.counters.refused.fetch_add(1, Ordering::Relaxed);
            Status::from(e)
        })?;
        let runner = match self.runner(req.job_id, &req.fingerprint).await {
            Ok(r) => r,
            Err(e) => {
                self.inner.counters.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(job_id = req.job_id, error = %e, "refused a task");
                return Err(e.into());
            }
        };
        let pass_batches = runner.loader.batches_per_epoch();
        let total = pass_batches * runner.passes;
        let pass = req.start.checked_div(pass_batches).unwrap_or(0);
        if req.start >= req.end || req.end > total || req.end > (pass + 1) * pass_batches {
            self.inner.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Status::invalid_argument(format!(
                "task range {}..{} is not a non-empty part of one pass of the epoch's 0..{total} batches",
                req.start, req.end
            )));
        }
        let draw = match &runner.draws {
            Some(draws) => match self.draw(&runner, draws, req.job_id, req.epoch).await {
                Ok(d) => Some(d),
                Err(e) => {
                    self.inner.counters.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(job_id = req.job_id, epoch = req.epoch, error = %e, "no draw for the task's epoch");
                    return Err(e.into());
                }
            },
            None => None,
        };
        let (tx, rx) = mpsc::channel(2);
        let max_batch_bytes = runner.loader.batch_bytes();
        let recycler = runner.clone();
        let recycle: crate::dataplane::Recycle = Arc::new(move |out| recycler.loader.recycle(out.into_batch().images));
        let inner = self.inner.clone();
        inner.counters.tasks_started.fetch_add(1, Ordering::Relaxed);
        inner.counters.tasks_running.fetch_add(1, Ordering::Relaxed);
        // The prefetch window, the channel to the connection, and one or two on their way.
        let in_flight = runner.loader.prefetch_max_depth() + 4;
        let (buffers, memory) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            // The connection says where to build the batches (or drops the sender) first.
            let memory = memory.await.ok();
            // The semaphore is never closed; without a permit the task simply does not run.
            let Ok(permit) = runner.running.clone().acquire_owned().await else { return };
            tokio::task::spawn_blocking(move || {
                run_task(&inner, &runner, &req, draw, compression, memory, received_ns, &tx);
                // The next task need not wait for the trace to be written.
                drop(permit);
                if let Some(trace) = &runner.trace {
                    trace.write_part(&runner.loader);
                }
            });
        });
        Ok(TaskBatches { rx, max_batch_bytes, in_flight, buffers: Some(buffers), recycle: Some(recycle) })
    }
}

/// Runs one task's batches through the job's loader into `tx` (on a blocking thread).
/// `received_ns`: the client traces, and its request arrived then; each batch goes with
/// its [`BatchTrace`].
#[allow(clippy::too_many_arguments)]
fn run_task(
    inner: &Inner,
    runner: &JobRunner,
    req: &RunTaskRequest,
    draw: Option<super::draw::Draw>,
    compression: Compression,
    memory: Option<sluice_pipeline::BufferSource>,
    received_ns: Option<u64>,
    tx: &mpsc::Sender<Result<Outgoing, Status>>,
) {
    let c = &inner.counters;
    let pass_batches = runner.loader.batches_per_epoch();
    let pass = req.start.checked_div(pass_batches).unwrap_or(0);
    let offset = pass * pass_batches;
    let (epoch, start, end) = if runner.passes > 1 {
        (req.epoch * runner.passes + pass, req.start - offset, req.end - offset)
    } else {
        (req.epoch, req.start, req.end)
    };
    if tx.is_closed() {
        // The client gave up while the task waited for its turn: nothing to compute.
        c.tasks_running.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let t0 = Instant::now();
    tracing::debug!(job_id = req.job_id, epoch = req.epoch, start = req.start, end = req.end, "task started");
    let mut batches = match draw {
        Some((order, weights)) => runner.loader.iter_draw(epoch, start, end, order, weights),
        None => runner.loader.iter_range(epoch, start, end),
    };
    if let Some(memory) = memory {
        batches = batches.with_buffers(memory);
    }
    if received_ns.is_some() {
        batches = batches.with_build_spans();
    }
    let pid = inner.trace_pid;
    // The batch's times here, when the client traces (`sent_ns` is stamped as it goes out).
    let trace = |built: Option<(u64, u64)>| {
        received_ns.map(|request_received_ns| {
            let (built_start_ns, built_end_ns) = built.unwrap_or((0, 0));
            BatchTrace { pid, request_received_ns, built_start_ns, built_end_ns, sent_ns: 0 }
        })
    };
    let send = |batch: Batch, skipped: Vec<SkippedSample>, trace: Option<BatchTrace>| -> bool {
        let n = batch.len() as u64;
        let pixel_bytes = batch.images.as_bytes().len() as u64;
        let mut out = Outgoing::new(batch, compression).with_skipped(skipped);
        if let Some(t) = trace {
            out = out.with_trace(t);
        }
        let bytes = out.payload().len() as u64;
        if tx.blocking_send(Ok(out)).is_err() {
            return false;
        }
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.samples.fetch_add(n, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.pixel_bytes.fetch_add(pixel_bytes, Ordering::Relaxed);
        true
    };
    // The loader hands out no batch whose samples were all skipped; the client counts a
    // task's batches by index, so each such batch goes as an empty one, with its skipped
    // samples (each batch carries its own).
    let mut next = start;
    let mut complete = true;
    loop {
        let item = batches.next();
        let mut skipped = batches.take_skipped();
        let upto = match &item {
            Some(Ok(batch)) => batch.index,
            Some(Err(_)) => next,
            None => end,
        };
        let mut of = |index: u64| -> Vec<SkippedSample> {
            let (mine, rest) = std::mem::take(&mut skipped).into_iter().partition(|(b, _)| *b == index);
            skipped = rest;
            mine.into_iter().map(|(_, s)| SkippedSample { key: s.key, path: s.path, error: s.error }).collect()
        };
        for index in next..upto {
            let empty = Batch {
                epoch: req.epoch,
                index: index + offset,
                keys: Vec::new(),
                labels: Vec::new(),
                images: Tensor::zeros(DType::U8, vec![0]),
                layout: Layout::Hwc,
                weights: None,
                boxes: None,
                fields: None,
            };
            if !send(empty, of(index), trace(None)) {
                complete = false;
                break;
            }
        }
        if !complete {
            break;
        }
        match item {
            Some(Ok(mut batch)) => {
                next = batch.index + 1;
                let mine = of(batch.index);
                // Back to the job's numbering: epoch `req.epoch`, index in all passes.
                batch.epoch = req.epoch;
                batch.index += offset;
                if !send(batch, mine, trace(batches.built_span())) {
                    // The client went away; stop working for it.
                    complete = false;
                    break;
                }
            }
            Some(Err(e)) => {
                tracing::warn!(job_id = req.job_id, epoch = req.epoch, error = %e, "task failed");
                let _ = tx.blocking_send(Err(to_status(e)));
                complete = false;
                break;
            }
            None => break,
        }
    }
    if complete {
        c.tasks_done.fetch_add(1, Ordering::Relaxed);
        c.task_time.observe(t0.elapsed());
    }
    tracing::debug!(
        job_id = req.job_id,
        epoch = req.epoch,
        start = req.start,
        complete,
        seconds = t0.elapsed().as_secs_f64(),
        "task ended"
    );
    c.tasks_running.fetch_sub(1, Ordering::Relaxed);
}

#[tonic::async_trait]
impl Worker for WorkerService {
    type RunTaskStream = BatchStream;

    async fn run_task(&self, request: Request<RunTaskRequest>) -> Result<Response<BatchStream>, Status> {
        use tokio_stream::StreamExt;
        let task = self.start_task(request.into_inner()).await?;
        #[allow(clippy::result_large_err)] // tonic's stream item type
        fn to_message(r: Result<Outgoing, Status>) -> Result<BatchMessage, Status> {
            r.map(Outgoing::into_message)
        }
        let stream = ReceiverStream::new(task.rx).map(to_message);
        Ok(Response::new(Box::pin(stream)))
    }
}
