//! The dispatcher's autoscaler (`--autoscale POLICY`): every window it turns the clients'
//! heartbeats (batches taken, time waited) and the workers' (batches made, busy time) into
//! one [`Window`], lets the policy decide, and holds the worker count that `sluice up`
//! follows (`GetScale`). Consumption and production are read per job (each job's clients,
//! each job's share of every worker's busy time), so the policy matches each job's
//! production to its consumers; production is per busy worker-second, as in local mode.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use sluice_autoscale::{AutoscaleConfig, AutoscaleStats, Autoscaler, ConfigError, Decision, JobRates, Window};

use super::state::State;

/// Windows waited at most for the workers to reach a new target before reading again
/// (a worker that cannot start must not stop the scaling for good).
const MAX_WAIT_WINDOWS: u32 = 10;

/// A client's cumulative counters, as its last heartbeat told.
#[derive(Debug, Clone, Copy)]
struct ClientMark {
    batches: u64,
    stall_s: f64,
    elapsed_s: f64,
}

/// A worker's cumulative counters.
#[derive(Debug, Clone, Copy)]
struct WorkerMark {
    busy_s: f64,
    produced: u64,
}

pub struct ServiceAutoscale {
    autoscaler: Autoscaler,
    clock: Instant,
    last_s: f64,
    clients: HashMap<String, ClientMark>,
    workers: HashMap<u64, WorkerMark>,
    /// Each (worker, job)'s cumulative busy seconds and batches.
    worker_jobs: HashMap<(u64, u64), WorkerMark>,
    /// The latest window read, for an operator's decision.
    latest: Option<Window>,
    /// Windows read since the last change while the workers did not match the target.
    waited: u32,
    /// The next window straddles a change: read it only to set the baselines.
    skip_next: bool,
}

impl ServiceAutoscale {
    /// Starts at the lower bound (`sluice up` starts `--min-workers` workers), or at
    /// `resumed`, the target a restarted dispatcher's journal held last.
    pub fn new(config: AutoscaleConfig, now: Instant, resumed: Option<usize>) -> Result<Self, ConfigError> {
        let min = config.min_units;
        let mut autoscaler = Autoscaler::new(config, min, 0.0)?;
        if let Some(workers) = resumed {
            autoscaler.resume(workers);
            tracing::info!(target = autoscaler.units(), "autoscale: resumed the journal's target");
        }
        Ok(Self {
            autoscaler,
            clock: now,
            last_s: 0.0,
            clients: HashMap::new(),
            workers: HashMap::new(),
            worker_jobs: HashMap::new(),
            latest: None,
            waited: 0,
            skip_next: false,
        })
    }

    pub fn target(&self) -> usize {
        self.autoscaler.units()
    }

    pub fn config(&self) -> &AutoscaleConfig {
        self.autoscaler.config()
    }

    pub fn stats(&self) -> AutoscaleStats {
        self.autoscaler.stats()
    }

    fn now_s(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.clock).as_secs_f64()
    }

    /// An operator's order (`SetScale`).
    pub fn set_target(&mut self, workers: usize, now: Instant) -> Option<Decision> {
        let d = self.autoscaler.set_units(workers, self.latest.as_ref(), self.now_s(now))?;
        self.changed();
        Some(d)
    }

    fn changed(&mut self) {
        self.waited = 0;
        self.skip_next = true;
    }

    /// Closes the window that ends `now` and lets the policy decide on it. No window is
    /// read while no trainer took a batch, nor while the workers taking tasks do not match
    /// the target yet (they start or drain), nor the one straddling a change.
    pub fn tick(&mut self, state: &State, now: Instant) -> Option<Decision> {
        let now_s = self.now_s(now);
        let w = self.read(state, now, now_s);
        self.last_s = now_s;
        let w = w?;
        if std::mem::take(&mut self.skip_next) {
            return None;
        }
        let serving = state.workers.values().filter(|e| e.takes_tasks(now)).count();
        if serving != self.target() && self.waited < MAX_WAIT_WINDOWS {
            self.waited += 1;
            return None;
        }
        self.latest = Some(w.clone());
        let d = self.autoscaler.observe(&w, now_s)?;
        self.changed();
        Some(d)
    }

    /// The window since the last tick, from the counters' growth; the baselines move on.
    /// `None` when no trainer took a batch in it.
    fn read(&mut self, state: &State, now: Instant, now_s: f64) -> Option<Window> {
        // Consumption: each client's batches over its time not waiting, summed, in all and
        // per job (job → consumption, waited, elapsed).
        let (mut batches, mut consumption, mut waited, mut elapsed) = (0u64, 0.0, 0.0, 0.0);
        let mut per_job: BTreeMap<u64, (f64, f64, f64)> = BTreeMap::new();
        let mut clients = HashMap::with_capacity(state.clients.len());
        // The accelerators' busy fractions their trainers reported, of clients that took
        // batches in the window.
        let mut reported_busy = Vec::new();
        for (id, r) in &state.clients {
            let mark = ClientMark { batches: r.batches, stall_s: r.stall_s, elapsed_s: r.elapsed_s };
            if let Some(prev) = self.clients.get(id) {
                let (db, de) = (mark.batches.saturating_sub(prev.batches), mark.elapsed_s - prev.elapsed_s);
                let dw = (mark.stall_s - prev.stall_s).clamp(0.0, de.max(0.0));
                if db > 0 && de > 0.0 {
                    batches += db;
                    // A trainer that waited all along takes batches as fast as they come.
                    let q = db as f64 / (de - dw).max(de * 0.01);
                    consumption += q;
                    waited += dw;
                    elapsed += de;
                    let job = per_job.entry(r.job_id).or_default();
                    (job.0, job.1, job.2) = (job.0 + q, job.1 + dw, job.2 + de);
                    if let Some(b) = r.accelerator_busy.filter(|_| r.accelerator_reported) {
                        reported_busy.push(b);
                    }
                }
            }
            clients.insert(id.clone(), mark);
        }
        self.clients = clients;
        // Production: batches per busy worker-second, each worker apart.
        let (mut busy_s, mut produced, mut unit_rates) = (0.0, 0.0, Vec::new());
        let mut workers = HashMap::with_capacity(state.workers.len());
        for (id, w) in &state.workers {
            let mark = WorkerMark { busy_s: w.busy_s, produced: w.batches_produced };
            if let Some(prev) = self.workers.get(id) {
                let (db, dp) = (mark.busy_s - prev.busy_s, mark.produced.saturating_sub(prev.produced));
                // Busy time goes back when a worker drops an idle job's loader: skip it.
                if db > 1e-3 && w.is_live(now) {
                    busy_s += db;
                    produced += dp as f64;
                    unit_rates.push(dp as f64 / db);
                }
            }
            workers.insert(*id, mark);
        }
        self.workers = workers;
        // Each job's production: its batches per busy worker-second, over all workers.
        let mut job_work: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        let mut worker_jobs = HashMap::with_capacity(self.worker_jobs.len());
        for (id, w) in &state.workers {
            for j in &w.jobs {
                let mark = WorkerMark { busy_s: j.busy_s, produced: j.batches };
                if let Some(prev) = self.worker_jobs.get(&(*id, j.job_id)) {
                    let (db, dp) = (mark.busy_s - prev.busy_s, mark.produced.saturating_sub(prev.produced));
                    if db > 1e-3 && w.is_live(now) {
                        let e = job_work.entry(j.job_id).or_default();
                        (e.0, e.1) = (e.0 + db, e.1 + dp as f64);
                    }
                }
                worker_jobs.insert((*id, j.job_id), mark);
            }
        }
        self.worker_jobs = worker_jobs;
        let jobs = per_job
            .into_iter()
            .map(|(job, (q, dw, de))| JobRates {
                job,
                consumption: q,
                per_unit_rate: job_work.get(&job).map_or(0.0, |&(busy, made)| made / busy),
                stall: if de > 0.0 { (dw / de).clamp(0.0, 1.0) } else { 0.0 },
            })
            .collect();
        if batches == 0 || consumption <= 0.0 {
            return None;
        }
        // One window whose consumption is the clients' summed rate and whose stall is
        // their overall share of time waited.
        let stall = (waited / elapsed).clamp(0.0, 0.99);
        let span = batches as f64 / (consumption * (1.0 - stall));
        Some(Window {
            t_ms: (now_s * 1000.0) as u64,
            units: state.workers.values().filter(|e| e.takes_tasks(now)).count(),
            batches,
            elapsed_s: span,
            wait_s: stall * span,
            busy_s,
            produced,
            queue: 0.0,
            unit_rates,
            jobs,
            // The trainers' mean: the accelerators as a whole.
            accelerator_busy: (!reported_busy.is_empty())
                .then(|| reported_busy.iter().sum::<f64>() / reported_busy.len() as f64),
        })
    }

    /// Seconds the window spans (the tick period).
    pub fn window_ms(&self) -> u64 {
        match self.config().window {
            sluice_autoscale::WindowBy::Millis(ms) => ms,
            // Batches make no sense for a dispatcher serving several trainers; the CLI
            // only builds windows by time, but a library caller might not.
            sluice_autoscale::WindowBy::Batches(_) => 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_autoscale::{PolicyKind, WindowBy};

    use super::*;
    use crate::dispatcher::state::ClientReport;
    use sluice_client::proto::{JobWork, RegisterWorkerRequest};

    /// Second `t`: the trainer took `batches` and waited `wait` s of it; every worker was
    /// busy `busy` s making `made` batches.
    fn second(s: &mut State, t: u64, batches: u64, wait: f64, busy: f64, made: u64) -> Instant {
        let now = Instant::now();
        let prev = s.clients.get("c").cloned().unwrap_or_default();
        let report = ClientReport {
            job_id: 1,
            batches: prev.batches + batches,
            stall_s: prev.stall_s + wait,
            elapsed_s: t as f64,
            ..ClientReport::default()
        };
        s.client_heartbeat(1, "c", report, now).unwrap();
        let ids: Vec<u64> = s.workers.keys().copied().collect();
        for id in ids {
            let (b, p) = s.workers.get(&id).map(|w| (w.busy_s, w.batches_produced)).unwrap_or_default();
            s.worker_heartbeat(id, 0, p + made, now);
            s.worker_busy(id, b + busy, Vec::new());
        }
        now
    }

    #[test]
    fn windows_read_the_heartbeats_growth_and_the_policy_scales_on_them() {
        let mut s = State::new(1);
        let start = Instant::now();
        s.register_worker(&RegisterWorkerRequest { addr: "w".into(), ..Default::default() }, start);
        let config =
            AutoscaleConfig { window: WindowBy::Millis(1000), ..AutoscaleConfig::new(PolicyKind::Fastmatch, 1, 8) };
        let mut a = ServiceAutoscale::new(config, start, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.target(), 1);
        let now = second(&mut s, 1, 10, 0.5, 1.0, 5);
        assert_eq!(a.tick(&s, now), None, "the first heartbeats set the baselines");
        // The trainer takes 10 batches in 0.5 s of work (20/s) and waits 0.5 s; the
        // worker makes 5 batches per busy second. FastMatch wants two readings.
        let now = second(&mut s, 2, 10, 0.5, 1.0, 5);
        assert_eq!(a.tick(&s, now), None);
        let w = a.latest.clone().unwrap_or_default();
        assert!((w.consumption() - 20.0).abs() < 1e-9 && (w.stall() - 0.5).abs() < 1e-9, "{w:?}");
        assert!((w.production() - 5.0).abs() < 1e-9 && w.unit_rates == vec![5.0], "{w:?}");
        let now = second(&mut s, 3, 10, 0.5, 1.0, 5);
        let d = a.tick(&s, now).unwrap_or_else(|| panic!("no decision: {:?}", a.stats()));
        assert_eq!((d.from, d.to), (1, 5), "20 batches/s at 5 per worker, 2% headroom: {d:?}");
        assert!((d.consumption - 20.0).abs() < 1e-9 && (d.stall - 0.5).abs() < 1e-9, "{d:?}");
        // Until 5 workers take tasks, windows are not read.
        let now = second(&mut s, 4, 10, 0.5, 1.0, 5);
        assert_eq!(a.tick(&s, now), None);
        assert_eq!((a.target(), a.waited), (5, 0), "the window after a change is skipped, not waited");
        let now = second(&mut s, 5, 10, 0.5, 1.0, 5);
        assert_eq!(a.tick(&s, now), None);
        assert_eq!(a.waited, 1, "one worker of five: waiting for the rest");
        // An operator's order goes through the same record.
        let d = a.set_target(2, now).unwrap_or_else(|| panic!("no decision"));
        assert_eq!((d.from, d.to), (5, 2));
        assert_eq!(a.stats().decisions.len(), 2);
    }

    /// Second `t` of two jobs on two workers: worker 1 spends its second on job 1 making
    /// 20 batches, worker 2 on job 2 making 1 (a batch of job 2 is 20 times the work).
    /// Job 1's trainer takes 20 batches without waiting; job 2's takes 1 and waits 0.444 s.
    fn two_jobs_second(s: &mut State, t: u64, workers: [u64; 2]) -> Instant {
        let now = Instant::now();
        for (client, job, batches, wait) in [("a", 1, 20, 0.0), ("b", 2, 1, 4.0 / 9.0)] {
            let prev = s.clients.get(client).cloned().unwrap_or_default();
            let report = ClientReport {
                job_id: job,
                batches: prev.batches + batches,
                stall_s: prev.stall_s + wait,
                elapsed_s: t as f64,
                ..ClientReport::default()
            };
            s.client_heartbeat(job, client, report, now).unwrap_or_else(|e| panic!("{e}"));
        }
        for (id, job, made) in [(workers[0], 1, 20), (workers[1], 2, 1)] {
            let (b, p) = s.workers.get(&id).map(|w| (w.busy_s, w.batches_produced)).unwrap_or_default();
            s.worker_heartbeat(id, 0, p + made, now);
            s.worker_busy(id, b + 1.0, vec![JobWork { job_id: job, busy_s: b + 1.0, batches: p + made }]);
        }
        now
    }

    #[test]
    fn each_job_is_matched_apart_so_a_slow_job_is_not_starved_by_the_sum() {
        let mut s = State::new(1);
        let start = Instant::now();
        let workers = ["w1", "w2"]
            .map(|addr| s.register_worker(&RegisterWorkerRequest { addr: addr.into(), ..Default::default() }, start));
        let config =
            AutoscaleConfig { window: WindowBy::Millis(1000), ..AutoscaleConfig::new(PolicyKind::Fastmatch, 1, 8) };
        let mut a = ServiceAutoscale::new(config, start, Some(2)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.target(), 2);
        let now = two_jobs_second(&mut s, 1, workers);
        assert_eq!(a.tick(&s, now), None, "the first heartbeats set the baselines");
        // In sum: 21 batches per 2 busy s (10.5 per worker) against 21.8/s taken, 2.08
        // workers, within tolerance of 2, while job 2 waits 44% of the time. Per job:
        // 20/s at 20 per worker-second (1) + 1.8/s at 1 (1.8) = 2.8 workers.
        let now = two_jobs_second(&mut s, 2, workers);
        assert_eq!(a.tick(&s, now), None, "FastMatch wants two readings");
        let now = two_jobs_second(&mut s, 3, workers);
        let d = a.tick(&s, now);
        assert_eq!(d.as_ref().map(|d| (d.from, d.to)), Some((2, 3)), "{d:?}; {:?}", a.latest);
    }
}
