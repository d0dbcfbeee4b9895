//! The dispatcher's `/metrics`: the Prometheus exposition of its counters, jobs, workers
//! and clients, built fresh from the state on every scrape.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sluice_client::proto::JobCacheStats;

use super::state::{ClientReport, JobImportance};
use super::DispatcherService;
use sluice_dashboard::metrics::{Labels, Scrape};

impl DispatcherService {
    /// The Prometheus exposition of the dispatcher.
    pub fn render_metrics(&self) -> String {
        let c = &self.inner.counters;
        let count = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut m = Scrape::default();
        m.counter("sluice_dispatcher_requests", "RPCs answered", count(&c.requests));
        m.counter("sluice_dispatcher_request_errors", "RPCs refused", count(&c.errors));
        m.counter("sluice_dispatcher_tasks_assigned", "tasks handed to clients", count(&c.assigned));
        m.counter("sluice_dispatcher_tasks_acked", "tasks acknowledged", count(&c.acked));
        m.counter(
            "sluice_dispatcher_batches_acked",
            "batches in acknowledged tasks (throughput)",
            count(&c.batches_acked),
        );
        m.counter("sluice_dispatcher_tasks_failed", "tasks whose worker failed", count(&c.failed));
        m.counter(
            "sluice_dispatcher_importance_reported",
            "importance values taken into a job's store",
            count(&c.reported),
        );
        m.counter(
            "sluice_dispatcher_importance_ignored",
            "importance values ignored (unknown keys, NaN, infinite or negative)",
            count(&c.reports_ignored),
        );
        m.histogram(
            "sluice_dispatcher_get_task_seconds",
            "time to answer GetTask, journal fsync included",
            &c.get_task,
        );
        if let Some(a) = &self.inner.autoscale {
            let s = a.lock().stats();
            m.gauge("sluice_autoscale_target_workers", "workers the autoscaler wants running", s.units as i64);
            m.counter("sluice_autoscale_windows", "windows the autoscaler read", s.windows);
            m.counters(
                "sluice_autoscale_decisions",
                "scaling decisions by direction",
                [("up", s.ups), ("down", s.downs)].map(|(d, n)| (vec![("direction", d.to_string())], n)),
            );
        }
        let state = self.inner.state.lock();
        m.gauge(
            "sluice_dispatcher_workers_live",
            "workers with a recent heartbeat",
            state.live_workers(Instant::now()) as i64,
        );
        m.gauge("sluice_dispatcher_jobs", "jobs known", state.jobs.len() as i64);
        let job = |name: &str| vec![("job", name.to_string())];
        m.gauges(
            "sluice_job_tasks",
            "queue depth: tasks of the current epoch by state",
            state.jobs.values().flat_map(|j| {
                let e = &j.current;
                [("pending", e.queue.len()), ("leased", e.leased()), ("acked", e.acked)].map(|(st, n)| {
                    let mut labels = job(&j.name);
                    labels.push(("state", st.to_string()));
                    (labels, n as i64)
                })
            }),
        );
        m.gauges(
            "sluice_job_epoch",
            "the epoch each job is in",
            state.jobs.values().map(|j| (job(&j.name), j.current.epoch as i64)),
        );
        let importance: Vec<(Labels, &JobImportance)> =
            state.jobs.values().filter_map(|j| Some((job(&j.name), j.importance.as_ref()?))).collect();
        m.counters(
            "sluice_job_importance_refused",
            "importance values the job's store refused (NaN, infinite or negative)",
            importance.iter().map(|(l, i)| (l.clone(), i.refused())),
        );
        m.counters(
            "sluice_job_importance_clamped",
            "importance values clamped to the largest the job's store keeps (docs/importance-sampling.md)",
            importance.iter().map(|(l, i)| (l.clone(), i.clamped())),
        );
        let caches: Vec<(Labels, JobCacheStats)> =
            state.jobs.values().filter_map(|j| Some((job(&j.name), state.job_cache(j.id)?))).collect();
        let each = |value: fn(&JobCacheStats) -> u64| caches.iter().map(move |(l, c)| (l.clone(), value(c)));
        m.counters(
            "sluice_cache_hits",
            "the job's cache hits on all workers (its fingerprint's caches)",
            each(|c| c.hits),
        );
        m.counters("sluice_cache_misses", "the job's cache misses on all workers", each(|c| c.misses));
        m.gauges(
            "sluice_cache_hit_rate",
            "the job's cache hits / lookups on all workers since they started",
            caches.iter().map(|(l, c)| (l.clone(), c.hit_rate)),
        );
        m.gauges("sluice_cache_entries", "entries the job's caches hold on all workers", each(|c| c.entries));
        m.gauges("sluice_cache_hot", "samples in the job's hot set", each(|c| c.hot));
        m.gauges("sluice_cache_hot_held", "samples of the hot set held in their owner's cache", each(|c| c.hot_held));
        m.gauges(
            "sluice_cache_workers_off",
            "workers whose auto cache for the job stores nothing: caching would save under 5% of the pipeline",
            each(|c| c.workers_off),
        );
        let worker_caches: Vec<(Labels, &sluice_client::proto::CacheReport)> = state
            .jobs
            .values()
            .flat_map(|j| {
                state.workers.values().filter_map(move |w| {
                    let c = w.caches.get(&j.fingerprint)?;
                    Some((vec![("job", j.name.clone()), ("worker", w.addr.clone())], c))
                })
            })
            .collect();
        m.gauges(
            "sluice_worker_cache_entries",
            "entries a worker's cache for the job holds",
            worker_caches.iter().map(|(l, c)| (l.clone(), c.entries)),
        );
        m.gauges(
            "sluice_worker_cache_share",
            "samples of the job's hot set placed on the worker",
            worker_caches.iter().map(|(l, c)| (l.clone(), c.share)),
        );
        m.gauges(
            "sluice_worker_cache_share_held",
            "samples of its share of the hot set the worker's cache holds",
            worker_caches.iter().map(|(l, c)| (l.clone(), c.share_held)),
        );
        let client = |id: &str, r: &ClientReport| vec![("client", id.to_string()), ("job_id", r.job_id.to_string())];
        m.counters(
            "sluice_client_batches",
            "batches the client handed to its trainer",
            state.clients.iter().map(|(id, r)| (client(id, r), r.batches)),
        );
        m.gauges(
            "sluice_client_stall_fraction",
            "share of the client's time its trainer waited for data",
            state.clients.iter().map(|(id, r)| (client(id, r), r.stall_fraction())),
        );
        m.gauges(
            "sluice_client_accelerator_busy",
            "the busy fraction of the client's accelerator over the last few seconds: as its trainer \
             reported it (source=\"reported\", a device counter) or from its step timing (compute \
             between next() calls over compute + wait)",
            state.clients.iter().filter_map(|(id, r)| {
                let mut labels = client(id, r);
                labels.push(("source", r.accelerator_source().to_string()));
                Some((labels, r.accelerator_busy?))
            }),
        );
        m.gauges(
            "sluice_client_batches_per_second",
            "the client's mean consumption rate",
            state.clients.iter().map(|(id, r)| (client(id, r), r.batches_per_second())),
        );
        m.render()
    }
}
