//! What the page draws (the JSON of `/api/state`): jobs with their task queues, workers
//! with their production and cache, clients with their consumption and stalls. The
//! dispatcher fills it from its state; a local loader from its stats (its threads as the
//! one worker, the trainer as the one client).

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct DispatcherView {
    pub role: &'static str,
    pub jobs: Vec<JobView>,
    pub workers: Vec<WorkerView>,
    pub clients: Vec<ClientView>,
    pub totals: Totals,
}

#[derive(Debug, Serialize)]
pub struct JobView {
    pub id: u64,
    pub name: String,
    pub epoch: u64,
    pub batches_per_epoch: u64,
    pub pending: usize,
    pub leased: usize,
    pub acked: usize,
}

#[derive(Debug, Serialize)]
pub struct WorkerView {
    pub id: u64,
    pub addr: String,
    pub live: bool,
    pub tasks_running: u64,
    pub batches_produced: u64,
    pub cache_hits: u64,
    pub cache_lookups: u64,
}

#[derive(Debug, Serialize)]
pub struct ClientView {
    pub id: String,
    pub job_id: u64,
    pub batches: u64,
    pub elapsed_s: f64,
    pub stall_fraction: f64,
    pub batches_per_second: f64,
    /// Its trainer's accelerator busy fraction over the last few seconds (`None` before a
    /// step), and where it came from: `reported` by the trainer or its `step_timing`.
    pub accelerator_busy: Option<f64>,
    pub accelerator_source: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct Totals {
    pub jobs: usize,
    pub workers_live: usize,
    pub batches_acked: u64,
    /// Batches all workers produced, and all clients consumed (the page plots their rates).
    pub batches_produced: u64,
    pub batches_consumed: u64,
    /// Waited ÷ elapsed over all clients together.
    pub stall_fraction: f64,
    /// Hits ÷ lookups over all workers' caches; `None` before any lookup.
    pub cache_hit_rate: Option<f64>,
}
