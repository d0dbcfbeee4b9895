//! `sluice worker --trace-dir DIR`: each job's loader records its events (per sample and
//! op, per batch, as `sluice run --trace` does), and after every task the worker appends
//! what was recorded to `DIR/job-<job id>-worker-<worker id>.pftrace`. Perfetto traces are
//! sequences of packets, so the parts appended one after another are one trace that grows
//! as the job runs, readable at any time.
//!
//! The file's process is the worker's trace id ([`sluice_pipeline::trace::random_pid`]), not
//! its OS pid: the same id its batches carry to the client (`BatchTrace.pid`), which names
//! its track in the client's trace and is how `sluice trace-merge` pairs the two. OS pids
//! would pair every worker with every other, as each container's worker is pid 1.

use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use sluice_pipeline::{Loader, PipelineError, TraceError, TraceFormat};

/// Creates the trace directory when the worker starts, so a bad `--trace-dir` stops it
/// at once rather than failing every job.
pub(super) fn create_dir(dir: &Path) -> Result<(), ServiceError> {
    std::fs::create_dir_all(dir)
        .map_err(|source| PipelineError::from(TraceError::Write { path: dir.to_path_buf(), source }).into())
}

use crate::error::ServiceError;

/// One job's trace file on this worker.
pub(super) struct JobTrace {
    path: PathBuf,
    /// The worker's trace id, and its process's name in the trace.
    pid: u32,
    process: String,
    /// Held while a part is appended, so parts of tasks ending together do not interleave.
    file: Mutex<()>,
}

impl JobTrace {
    /// Starts recording `loader`'s events, for the file of `job_id` in `dir` (an existing
    /// file is appended to).
    /// `pid` is the worker's trace id.
    pub(super) fn start(
        loader: &Loader,
        dir: &Path,
        job_id: u64,
        worker_id: u64,
        pid: u32,
    ) -> Result<Self, ServiceError> {
        let path = dir.join(format!("job-{job_id}-worker-{worker_id}.pftrace"));
        loader.start_trace()?;
        tracing::info!(job_id, path = %path.display(), "tracing the job");
        let process = format!("sluice worker {worker_id} (pid {})", std::process::id());
        Ok(Self { path, pid, process, file: Mutex::new(()) })
    }

    /// Appends the events recorded since the last part. A trace that cannot be written is
    /// logged, never a reason to fail the task.
    pub(super) fn write_part(&self, loader: &Loader) {
        let Some(mut part) = loader.drain_trace() else { return };
        if part.events.is_empty() {
            return;
        }
        if part.dropped.events > 0 {
            tracing::warn!(
                path = %self.path.display(),
                dropped = part.dropped.events,
                max = sluice_pipeline::trace::MAX_TRACE_EVENTS,
                "a task made more trace events than a trace part holds; the rest were dropped"
            );
        }
        part.pid = self.pid;
        part.process.clone_from(&self.process);
        let bytes = part.encode(TraceFormat::Perfetto);
        let _held = self.file.lock();
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(&bytes));
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot write the job's trace");
        }
    }
}
