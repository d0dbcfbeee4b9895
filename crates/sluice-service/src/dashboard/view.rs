//! The dispatcher's state as the dashboard shows it: jobs with their task queues, workers
//! with their production and cache, clients with their consumption and stalls. Rates and
//! fractions come from the same functions as the metrics, so the page and `/metrics` agree.

use std::time::Instant;

use serde::Serialize;

use crate::dispatcher::state::State;

#[derive(Debug, Serialize)]
pub(crate) struct DispatcherView {
    pub role: &'static str,
    pub jobs: Vec<JobView>,
    pub workers: Vec<WorkerView>,
    pub clients: Vec<ClientView>,
    pub totals: Totals,
}

#[derive(Debug, Serialize)]
pub(crate) struct JobView {
    pub id: u64,
    pub name: String,
    pub epoch: u64,
    pub batches_per_epoch: u64,
    pub pending: usize,
    pub leased: usize,
    pub acked: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct WorkerView {
    pub id: u64,
    pub addr: String,
    pub live: bool,
    pub tasks_running: u64,
    pub batches_produced: u64,
    pub cache_hits: u64,
    pub cache_lookups: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct ClientView {
    pub id: String,
    pub job_id: u64,
    pub batches: u64,
    pub elapsed_s: f64,
    pub stall_fraction: f64,
    pub batches_per_second: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Totals {
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

impl DispatcherView {
    pub(crate) fn new(state: &State, batches_acked: u64, now: Instant) -> Self {
        let jobs = state
            .jobs
            .values()
            .map(|j| JobView {
                id: j.id,
                name: j.name.clone(),
                epoch: j.current.epoch,
                batches_per_epoch: j.batches_per_epoch,
                pending: j.current.queue.len(),
                leased: j.current.leased(),
                acked: j.current.acked,
            })
            .collect();
        let workers: Vec<WorkerView> = state
            .workers
            .iter()
            .map(|(id, w)| WorkerView {
                id: *id,
                addr: w.addr.clone(),
                live: w.is_live(now),
                tasks_running: w.tasks_running,
                batches_produced: w.batches_produced,
                cache_hits: w.cache_hits,
                cache_lookups: w.cache_lookups,
            })
            .collect();
        let mut clients: Vec<ClientView> = state
            .clients
            .iter()
            .map(|(id, r)| ClientView {
                id: id.clone(),
                job_id: r.job_id,
                batches: r.batches,
                elapsed_s: r.elapsed_s,
                stall_fraction: r.stall_fraction(),
                batches_per_second: r.batches_per_second(),
            })
            .collect();
        clients.sort_by(|a, b| a.id.cmp(&b.id));
        let (stall_s, elapsed_s) =
            state.clients.values().fold((0.0, 0.0), |(s, e), r| (s + r.stall_s, e + r.elapsed_s));
        let (hits, lookups) = workers.iter().fold((0, 0), |(h, n), w| (h + w.cache_hits, n + w.cache_lookups));
        let totals = Totals {
            jobs: state.jobs.len(),
            workers_live: state.live_workers(now),
            batches_acked,
            batches_produced: workers.iter().map(|w| w.batches_produced).sum(),
            batches_consumed: clients.iter().map(|c| c.batches).sum(),
            stall_fraction: if elapsed_s > 0.0 { stall_s / elapsed_s } else { 0.0 },
            cache_hit_rate: (lookups > 0).then(|| hits as f64 / lookups as f64),
        };
        Self { role: "dispatcher", jobs, workers, clients, totals }
    }
}
