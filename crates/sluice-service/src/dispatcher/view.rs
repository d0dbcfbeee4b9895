//! The dispatcher's state as the dashboard shows it: jobs with their task queues, workers
//! with their production and cache, clients with their consumption and stalls. Rates and
//! fractions come from the same functions as the metrics, so the page and `/metrics` agree.

use std::time::Instant;

use sluice_dashboard::view::{ClientView, DispatcherView, JobView, Totals, WorkerView};

use crate::dispatcher::state::State;

/// The dashboard's view of the dispatcher's `state` at `now`.
pub(crate) fn dispatcher_view(state: &State, batches_acked: u64, now: Instant) -> DispatcherView {
    {
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
                accelerator_busy: r.accelerator_busy,
                accelerator_source: r.accelerator_busy.map(|_| r.accelerator_source()),
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
        DispatcherView { role: "dispatcher", jobs, workers, clients, totals }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::dispatcher::state::ClientReport;
    use sluice_client::proto::RegisterWorkerRequest;

    fn register(state: &mut State, addr: &str, now: Instant) -> u64 {
        state.register_worker(&RegisterWorkerRequest { addr: addr.into(), ..Default::default() }, now)
    }

    #[test]
    fn totals_add_up_workers_and_clients() {
        let now = Instant::now();
        let mut state = State::new(1);
        let view = dispatcher_view(&state, 0, now);
        assert_eq!(view.totals.cache_hit_rate, None, "no lookup yet: no hit rate");
        assert_eq!(view.totals.stall_fraction, 0.0);

        let (a, b) = (register(&mut state, "a:1", now), register(&mut state, "b:1", now));
        state.worker_heartbeat(a, 2, 30, now);
        state.worker_heartbeat(b, 1, 10, now);
        state.worker_cache(a, 30, 40);
        state.worker_cache(b, 0, 10);
        let report =
            |batches, stall_s, elapsed_s| ClientReport { job_id: 1, batches, stall_s, elapsed_s, ..Default::default() };
        state.client_heartbeat(1, "c2", report(20, 1.0, 4.0), now).unwrap();
        state.client_heartbeat(1, "c1", report(10, 3.0, 6.0), now).unwrap();

        let view = dispatcher_view(&state, 25, now);
        let t = &view.totals;
        assert_eq!((t.workers_live, t.batches_acked, t.batches_produced, t.batches_consumed), (2, 25, 40, 30));
        assert_eq!(t.cache_hit_rate, Some(30.0 / 50.0), "hits over lookups of both workers");
        assert_eq!(t.stall_fraction, 4.0 / 10.0, "waited over elapsed of both clients");
        let ids: Vec<&str> = view.clients.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["c1", "c2"], "clients in a stable order");
        assert_eq!((view.clients[0].stall_fraction, view.clients[0].batches_per_second), (0.5, 10.0 / 6.0));
        let json = serde_json::to_string(&view).unwrap();
        assert!(json.starts_with("{\"role\":\"dispatcher\",\"jobs\":[],\"workers\":[{"), "{json}");
    }
}
