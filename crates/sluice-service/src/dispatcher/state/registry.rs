//! The workers and clients the dispatcher knows: registration, heartbeats, which workers
//! are live, and forgetting clients that went silent.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::State;
use crate::error::ServiceError;
use sluice_client::proto::{CacheReport, JobWork, RegisterWorkerRequest};

/// A client silent this long is forgotten (its leases ran out long before).
pub const CLIENT_FORGET: Duration = Duration::from_secs(300);
/// Clients remembered at most. Past it a new client is refused (a live client is never
/// forgotten to make room for another).
pub const MAX_CLIENTS: usize = 10_000;
/// With the registry full, how often a new client may make it look for clients to forget
/// (each look is O(clients) under the state's lock).
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Cache-aware assignment sends a task to the worker caching it while that worker has at
/// most this many more of the job's tasks than the least loaded one (a worker runs two at
/// once); past it, the least loaded worker takes another's task.
const AWARE_SLACK: u64 = 2;
/// A worker that has not sent a heartbeat for this long gets no new tasks.
pub const WORKER_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct WorkerEntry {
    pub addr: String,
    pub data_addr: String,
    pub local_data_addr: String,
    pub last_seen: Instant,
    /// A client reported a failure on this worker; cleared by its next heartbeat.
    pub suspect: bool,
    pub tasks_running: u64,
    pub batches_produced: u64,
    /// The worker's cache hits and lookups, as its last heartbeat told.
    pub cache_hits: u64,
    pub cache_lookups: u64,
    /// What its supervisor calls it (`RegisterWorkerRequest.name`), for draining.
    pub name: String,
    /// Seconds it spent producing since it started, as its last heartbeat told.
    pub busy_s: f64,
    /// Each job's busy seconds and batches on it, as its last heartbeat told.
    pub jobs: Vec<JobWork>,
    /// Being drained: it gets no new task and exits once it holds none.
    pub draining: bool,
    /// Each of its caches by fingerprint, as its last heartbeat told.
    pub caches: HashMap<String, CacheReport>,
}

/// What a client last told about its consumption.
#[derive(Debug, Clone, Default)]
pub struct ClientReport {
    pub job_id: u64,
    pub batches: u64,
    pub stall_s: f64,
    pub elapsed_s: f64,
    /// Its trainer's accelerator busy fraction (0..=1) over the last few seconds; `None`
    /// before its first step.
    pub accelerator_busy: Option<f64>,
    /// The trainer reported `accelerator_busy` (a device counter) rather than the client
    /// measuring it from step timing.
    pub accelerator_reported: bool,
}

impl WorkerEntry {
    /// Heard from lately and not suspected: it may get tasks.
    pub fn is_live(&self, now: Instant) -> bool {
        now.duration_since(self.last_seen) < WORKER_TIMEOUT && !self.suspect
    }

    /// Live and not being drained: it may get new tasks.
    pub fn takes_tasks(&self, now: Instant) -> bool {
        self.is_live(now) && !self.draining
    }
}

impl ClientReport {
    /// Share of the client's time its trainer waited for data.
    pub fn stall_fraction(&self) -> f64 {
        self.over_elapsed(self.stall_s)
    }

    /// Where [`ClientReport::accelerator_busy`] came from, as the metrics label it.
    pub fn accelerator_source(&self) -> &'static str {
        if self.accelerator_reported {
            "reported"
        } else {
            "step_timing"
        }
    }

    /// The client's mean consumption rate.
    pub fn batches_per_second(&self) -> f64 {
        self.over_elapsed(self.batches as f64)
    }

    fn over_elapsed(&self, n: f64) -> f64 {
        if self.elapsed_s > 0.0 {
            n / self.elapsed_s
        } else {
            0.0
        }
    }
}

impl State {
    pub fn register_worker(&mut self, req: &RegisterWorkerRequest, now: Instant) -> u64 {
        let addr = req.addr.clone();
        self.workers.retain(|_, w| w.addr != addr);
        let id = self.next_worker_id;
        self.next_worker_id += 1;
        let entry = WorkerEntry {
            addr,
            data_addr: req.data_addr.clone(),
            local_data_addr: req.local_data_addr.clone(),
            last_seen: now,
            suspect: false,
            tasks_running: 0,
            batches_produced: 0,
            cache_hits: 0,
            cache_lookups: 0,
            name: req.name.clone(),
            busy_s: 0.0,
            jobs: Vec::new(),
            draining: false,
            caches: HashMap::new(),
        };
        self.workers.insert(id, entry);
        id
    }

    pub fn worker_heartbeat(&mut self, id: u64, running: u64, produced: u64, now: Instant) -> bool {
        match self.workers.get_mut(&id) {
            Some(w) => {
                w.last_seen = now;
                w.suspect = false;
                w.tasks_running = running;
                w.batches_produced = produced;
                true
            }
            None => false,
        }
    }

    /// What a heartbeat says of the worker's busy time, in all and per job (the
    /// autoscaler's production).
    pub fn worker_busy(&mut self, id: u64, busy_s: f64, jobs: Vec<JobWork>) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.busy_s = if busy_s.is_finite() { busy_s.max(0.0) } else { 0.0 };
            w.jobs = jobs;
        }
    }

    /// Marks the workers named `name` as draining: they get no new task. `None` when no
    /// registered worker has that name; else whether they all hold no task any more.
    pub fn drain_worker(&mut self, name: &str) -> Option<bool> {
        let ids: Vec<u64> = self.workers.iter().filter(|(_, w)| w.name == name).map(|(id, _)| *id).collect();
        if ids.is_empty() {
            return None;
        }
        for id in &ids {
            if let Some(w) = self.workers.get_mut(id) {
                if !w.draining {
                    tracing::info!(worker_id = id, name, "draining: no new tasks for this worker");
                }
                w.draining = true;
            }
        }
        Some(ids.iter().all(|id| self.is_drained(*id)))
    }

    /// Marks the worker `id` draining (it asked, stopping); false if it is not known.
    pub fn drain_worker_id(&mut self, id: u64) -> bool {
        let Some(w) = self.workers.get_mut(&id) else { return false };
        if !w.draining {
            tracing::info!(worker_id = id, name = %w.name, "the worker is stopping: draining it (no new tasks)");
        }
        w.draining = true;
        true
    }

    /// Drained: marked draining, running no task, and no client holds an assignment to it
    /// that it has not streamed yet (a task a client is about to ask it for).
    pub fn is_drained(&self, id: u64) -> bool {
        let Some(w) = self.workers.get(&id) else { return false };
        w.draining && w.tasks_running == 0 && self.jobs.values().all(|j| j.load.get(&id).copied().unwrap_or(0) == 0)
    }

    /// What a heartbeat says of the worker's caches (shown by the dashboard).
    pub fn worker_cache(&mut self, id: u64, hits: u64, lookups: u64) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.cache_hits = hits;
            w.cache_lookups = lookups;
        }
    }

    /// What a heartbeat says of each of the worker's caches (what draws and metrics use).
    pub fn worker_caches(&mut self, id: u64, caches: Vec<CacheReport>) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.caches = caches.into_iter().map(|c| (c.fingerprint.clone(), c)).collect();
        }
    }

    /// A job's caches on every known worker: the job's fingerprint's, summed.
    pub fn job_cache(&self, job_id: u64) -> Option<sluice_client::proto::JobCacheStats> {
        let job = self.jobs.get(&job_id)?;
        let mut out = sluice_client::proto::JobCacheStats::default();
        for c in self.workers.values().filter_map(|w| w.caches.get(&job.fingerprint)) {
            out.hits += c.hits;
            out.misses += c.misses;
            out.entries += c.entries;
            out.hot_held += c.share_held;
            out.workers_off += u64::from(c.off);
        }
        let lookups = out.hits + out.misses;
        out.hit_rate = if lookups > 0 { out.hits as f64 / lookups as f64 } else { 0.0 };
        let last = job.importance.as_ref().and_then(|i| i.drawn(i.last_drawn()?));
        out.hot = last.map_or(0, |d| d.hot.len() as u64);
        Some(out)
    }

    pub fn live_workers(&self, now: Instant) -> usize {
        self.workers.values().filter(|w| w.is_live(now)).count()
    }

    /// Cache-aware assignment: a queued task of the job's current epoch and the worker
    /// caching its samples (see `placement`), the least loaded worker taking tasks (live,
    /// not draining) that has one queued
    /// and is at most [`AWARE_SLACK`] tasks above the least loaded; `None` when none is
    /// (the least loaded worker then takes the queue's front: it steals), or there is no
    /// placement.
    pub(super) fn owned_task(&self, job_id: u64, now: Instant) -> Option<(u64, u64)> {
        let job = self.jobs.get(&job_id)?;
        let drawn = job.importance.as_ref()?.drawn(job.current.epoch)?;
        if drawn.members.is_empty() {
            return None;
        }
        let load = |id: &u64| job.load.get(id).copied().unwrap_or(0);
        let mut live: Vec<(u64, u64, &WorkerEntry)> =
            self.workers.iter().filter(|(_, w)| w.takes_tasks(now)).map(|(id, w)| (load(id), *id, w)).collect();
        live.sort_by_key(|&(l, id, _)| (l, id));
        let least = live.first()?.0;
        let e = &job.current;
        live.iter().take_while(|(l, _, _)| *l <= least + AWARE_SLACK).find_map(|&(_, id, w)| {
            let me = drawn.members.iter().position(|m| m.addr == w.addr)? as u32;
            let task = e.queue.iter().copied().find(|&t| {
                e.tasks.get(t as usize).and_then(|t| drawn.batch_owners.get(t.start as usize)) == Some(&me)
            })?;
            Some((task, id))
        })
    }

    /// The live worker with the fewest of the job's tasks left to stream.
    pub(super) fn pick_worker(&self, job_id: u64, now: Instant) -> Option<(u64, &WorkerEntry)> {
        let load = self.jobs.get(&job_id).map(|j| &j.load);
        self.workers
            .iter()
            .filter(|(_, w)| w.takes_tasks(now))
            .min_by_key(|(id, _)| (load.and_then(|l| l.get(id)).copied().unwrap_or(0), **id))
            .map(|(id, w)| (*id, w))
    }

    /// Renews the leases `client` holds (O(1): expiry checks the client's last heartbeat).
    /// A client not known yet is refused while [`MAX_CLIENTS`] others are remembered and
    /// none of them has been silent for [`CLIENT_FORGET`]; looking for such a one is
    /// O(clients), done at most every [`FULL_SWEEP_EVERY`] (and every `CLIENT_FORGET / 10`
    /// anyway), so a flood of new ids costs O(1) each.
    pub fn client_heartbeat(
        &mut self,
        _job_id: u64,
        client: &str,
        report: ClientReport,
        now: Instant,
    ) -> Result<(), ServiceError> {
        if self.next_client_sweep.is_none_or(|t| now >= t) {
            self.next_client_sweep = Some(now + CLIENT_FORGET / 10);
            self.forget_silent_clients(now);
        }
        if let Some(seen) = self.client_seen.get_mut(client) {
            *seen = now;
            self.clients.insert(client.to_string(), report);
            return Ok(());
        }
        if self.client_seen.len() >= MAX_CLIENTS {
            if self.last_full_sweep.is_none_or(|t| now.saturating_duration_since(t) >= FULL_SWEEP_EVERY) {
                self.last_full_sweep = Some(now);
                self.forget_silent_clients(now);
            }
            if self.client_seen.len() >= MAX_CLIENTS {
                return Err(ServiceError::TooManyClients { max: MAX_CLIENTS });
            }
        }
        self.client_seen.insert(client.to_string(), now);
        self.clients.insert(client.to_string(), report);
        Ok(())
    }

    /// Forgets clients silent for [`CLIENT_FORGET`]: their reports and the assignments they
    /// could have asked again for.
    fn forget_silent_clients(&mut self, now: Instant) {
        let silent: std::collections::HashSet<String> = self
            .client_seen
            .iter()
            .filter(|(_, &seen)| now.saturating_duration_since(seen) >= CLIENT_FORGET)
            .map(|(c, _)| c.clone())
            .collect();
        if silent.is_empty() {
            return;
        }
        for c in &silent {
            self.client_seen.remove(c);
            self.clients.remove(c);
            self.first_request.remove(c);
        }
        self.assigned_by_request.retain(|(c, _), _| !silent.contains(c));
        tracing::debug!(clients = silent.len(), "forgot clients that stopped heartbeating");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_that_stopped_heartbeating_are_forgotten() {
        let mut s = State::new(1);
        let now = Instant::now();
        for i in 0..100 {
            s.client_heartbeat(1, &format!("gone-{i}"), ClientReport::default(), now).unwrap();
        }
        let later = now + Duration::from_secs(3600);
        s.client_heartbeat(1, "alive", ClientReport::default(), later).unwrap();
        let mut known: Vec<_> = s.clients.keys().cloned().collect();
        known.sort();
        assert_eq!(known, vec!["alive".to_string()], "silent clients are still remembered");
        assert_eq!(s.client_seen.len(), 1);
    }

    #[test]
    fn a_full_registry_keeps_its_live_clients() {
        let mut s = State::new(1);
        let now = Instant::now();
        for i in 0..MAX_CLIENTS {
            s.client_heartbeat(1, &format!("live-{i}"), ClientReport::default(), now).unwrap();
        }
        // A flood of new ids while every known client is live: each is refused, and none
        // of the live ones is forgotten.
        for i in 0..100 {
            let e = s.client_heartbeat(1, &format!("new-{i}"), ClientReport::default(), now + Duration::from_secs(1));
            assert!(matches!(e, Err(ServiceError::TooManyClients { max: MAX_CLIENTS })), "{e:?}");
        }
        assert!(s.clients.contains_key("live-0"), "a live client's record was evicted by a new id");
        assert_eq!(s.clients.len(), MAX_CLIENTS);
        // Known clients go on heartbeating.
        s.client_heartbeat(1, "live-0", ClientReport::default(), now + Duration::from_secs(2)).unwrap();
        // Once the others have been silent long enough, a new client takes a free place.
        let later = now + CLIENT_FORGET + Duration::from_secs(1);
        s.client_heartbeat(1, "new-0", ClientReport::default(), later).unwrap();
        assert!(s.clients.contains_key("live-0") && s.clients.contains_key("new-0"));
        assert_eq!(s.clients.len(), 2);
    }

    #[test]
    fn a_draining_worker_gets_no_task_and_is_drained_once_it_holds_none() {
        let mut s = State::new(1);
        let now = Instant::now();
        let reg = |name: &str| RegisterWorkerRequest { addr: name.into(), name: name.into(), ..Default::default() };
        let a = s.register_worker(&reg("a"), now);
        let b = s.register_worker(&reg("b"), now);
        assert_eq!(s.drain_worker("nobody"), None);
        s.worker_heartbeat(a, 1, 0, now);
        assert_eq!(s.drain_worker("a"), Some(false), "a runs a task");
        for _ in 0..4 {
            assert_eq!(s.pick_worker(1, now).map(|(id, _)| id), Some(b), "a drains: only b gets tasks");
        }
        s.worker_heartbeat(a, 0, 0, now);
        assert_eq!(s.drain_worker("a"), Some(true));
        assert!(s.is_drained(a) && !s.is_drained(b));
    }
}
