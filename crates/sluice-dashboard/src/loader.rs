//! The dashboard of a local loader, on request (`sluice run --dashboard ADDR`): the same
//! page as the dispatcher's, drawn from the loader's own stats. The loader's thread pool
//! is the one "worker" (its threads as tasks running, its cache), the trainer the one
//! "client"; `/api/autoscale` has the autoscaler's decisions (404 when the thread count is
//! fixed, which the page shows as "autoscaling off"), `/metrics` the same numbers.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use sluice_pipeline::{Loader, StatsSnapshot};

use sluice_client::runtime::{runtime, Threads};

use crate::metrics::{self, Scrape};
use crate::view::{ClientView, DispatcherView, Totals, WorkerView};
use crate::{page, DashboardError};

/// The page's view of a loader: `threads` running, `stats` so far.
pub(crate) fn loader_view(stats: &StatsSnapshot, threads: usize) -> DispatcherView {
    let (hits, lookups) = stats.cache.as_ref().map_or((0, 0), |c| (c.tier.hits, c.tier.hits + c.tier.misses));
    let stall = stall_fraction(stats);
    let workers = vec![WorkerView {
        id: 0,
        addr: "this loader's threads".into(),
        live: true,
        tasks_running: threads as u64,
        batches_produced: stats.batches,
        cache_hits: hits,
        cache_lookups: lookups,
    }];
    let clients = vec![ClientView {
        id: "trainer".into(),
        job_id: 0,
        batches: stats.batches,
        elapsed_s: stats.elapsed_s,
        stall_fraction: stall,
        batches_per_second: if stats.elapsed_s > 0.0 { stats.batches as f64 / stats.elapsed_s } else { 0.0 },
        accelerator_busy: stats.accelerator.map(|a| a.busy),
        accelerator_source: stats.accelerator.map(|a| a.source.name()),
    }];
    let totals = Totals {
        jobs: 0,
        workers_live: 1,
        batches_acked: stats.batches,
        batches_produced: stats.batches,
        batches_consumed: stats.batches,
        stall_fraction: stall,
        cache_hit_rate: (lookups > 0).then(|| hits as f64 / lookups as f64),
    };
    DispatcherView { role: "loader", jobs: Vec::new(), workers, clients, totals }
}

/// Waited ÷ elapsed, as the dispatcher computes it for its clients.
fn stall_fraction(s: &StatsSnapshot) -> f64 {
    if s.elapsed_s > 0.0 {
        (s.wait_s / s.elapsed_s).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

fn render_metrics(stats: &StatsSnapshot, threads: usize) -> String {
    let mut m = Scrape::default();
    m.counter("sluice_loader_batches", "batches handed to the trainer", stats.batches);
    m.counter("sluice_loader_samples", "samples handed to the trainer", stats.samples);
    m.gauge(
        "sluice_loader_stall_fraction",
        "time the trainer waited for data over time elapsed",
        stall_fraction(stats),
    );
    m.gauge("sluice_loader_threads", "the loader's threads now", threads as i64);
    if let Some(a) = &stats.accelerator {
        m.gauges(
            "sluice_loader_accelerator_busy",
            "the trainer's accelerator busy fraction over the last few seconds, as it reported it \
             (source=\"reported\") or from its step timing",
            [(vec![("source", a.source.name().to_string())], a.busy)],
        );
    }
    if let Some(p) = &stats.prefetch {
        m.gauge("sluice_loader_prefetch_depth", "batches the loader keeps in flight now", p.depth as i64);
    }
    if let Some(c) = &stats.cache {
        m.gauge("sluice_loader_cache_hit_rate", "cache hits over lookups", c.tier.hit_rate);
    }
    if let Some(a) = &stats.autoscale {
        m.counter("sluice_loader_autoscale_ups", "decisions to add threads", a.ups);
        m.counter("sluice_loader_autoscale_downs", "decisions to remove threads", a.downs);
    }
    m.render()
}

/// Where the pages read the loader: live, or the numbers frozen at the end of a run (the
/// elapsed time, and with it the stall fraction, would otherwise keep moving).
struct Source {
    loader: Arc<Loader>,
    frozen: Mutex<Option<(StatsSnapshot, usize)>>,
}

impl Source {
    fn read(&self) -> (StatsSnapshot, usize) {
        if let Some(f) = self.frozen.lock().ok().and_then(|g| g.clone()) {
            return f;
        }
        (self.loader.stats(), self.loader.threads())
    }
}

/// A loader's dashboard being served; dropping it stops the server.
pub struct LoaderDashboard {
    addr: SocketAddr,
    source: Arc<Source>,
    _runtime: tokio::runtime::Runtime,
}

impl LoaderDashboard {
    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shows the loader's numbers as they are now from here on: call it when the run ends.
    pub fn freeze(&self) {
        let now = (self.source.loader.stats(), self.source.loader.threads());
        if let Ok(mut f) = self.source.frozen.lock() {
            *f = Some(now);
        }
    }
}

/// Serves `loader`'s dashboard (`/`), its state (`/api/state`), its autoscaler's
/// decisions (`/api/autoscale`) and its metrics (`/metrics`) at `addr`, on a runtime of
/// its own, until the returned handle is dropped.
pub fn serve_loader(addr: &str, loader: Arc<Loader>) -> Result<LoaderDashboard, DashboardError> {
    let runtime = runtime("dashboard", Threads::Workers(1))?;
    let source = Arc::new(Source { loader, frozen: Mutex::new(None) });
    let (state, render, scaling) = (Arc::clone(&source), Arc::clone(&source), Arc::clone(&source));
    let routes = page::routes(Arc::new(move || {
        let (stats, threads) = state.read();
        serde_json::to_string(&loader_view(&stats, threads)).unwrap_or_default()
    }))
    .merge(page::autoscale_route(
        Arc::new(move || scaling.read().0.autoscale.and_then(|a| serde_json::to_string(&a).ok())),
        "this loader's thread count is fixed\n",
    ));
    let render: metrics::Render = Arc::new(move || {
        let (stats, threads) = render.read();
        render_metrics(&stats, threads)
    });
    let addr = runtime.block_on(metrics::serve_with(addr, render, routes))?;
    tracing::info!(%addr, "loader dashboard at /, metrics at /metrics");
    Ok(LoaderDashboard { addr, source, _runtime: runtime })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn stats(batches: u64, wait_s: f64, elapsed_s: f64) -> StatsSnapshot {
        StatsSnapshot {
            samples: batches * 4,
            batches,
            bytes_read: 0,
            elapsed_s,
            samples_per_s: 0.0,
            wait_s,
            op_seconds: Vec::new(),
            op_percentiles: Vec::new(),
            op_counters: None,
            skipped: Vec::new(),
            importance_reports: Default::default(),
            cache: None,
            entropy_index: None,
            autoscale: None,
            prefetch: None,
            read_ahead: None,
            accelerator: None,
        }
    }

    #[test]
    fn the_loader_is_one_worker_and_the_trainer_one_client() {
        let view = loader_view(&stats(30, 1.5, 6.0), 3);
        assert_eq!(view.role, "loader");
        assert_eq!((view.workers.len(), view.clients.len(), view.jobs.len()), (1, 1, 0));
        assert_eq!(view.workers[0].tasks_running, 3, "threads show as tasks running");
        let t = &view.totals;
        assert_eq!((t.batches_produced, t.batches_consumed, t.workers_live), (30, 30, 1));
        assert_eq!(t.stall_fraction, 0.25);
        assert_eq!(view.clients[0].batches_per_second, 5.0);
        assert_eq!(t.cache_hit_rate, None, "no cache: no hit rate");
        let text = render_metrics(&stats(30, 1.5, 6.0), 3);
        assert!(text.contains("sluice_loader_batches_total 30"), "{text}");
        assert!(text.contains("sluice_loader_stall_fraction 0.25"), "{text}");
        assert!(text.contains("sluice_loader_threads 3"), "{text}");
        assert!(!text.contains("accelerator"), "no step yet: no series\n{text}");

        let busy = sluice_autoscale::AcceleratorBusy { busy: 0.75, source: sluice_autoscale::BusySource::StepTiming };
        let s = StatsSnapshot { accelerator: Some(busy), ..stats(30, 1.5, 6.0) };
        let view = loader_view(&s, 3);
        assert_eq!(
            (view.clients[0].accelerator_busy, view.clients[0].accelerator_source),
            (Some(0.75), Some("step_timing"))
        );
        let text = render_metrics(&s, 3);
        assert!(text.contains("sluice_loader_accelerator_busy{source=\"step_timing\"} 0.75"), "{text}");
    }
}
