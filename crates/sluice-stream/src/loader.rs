//! The streaming loader: reads entries through the job's consumer group into a bounded
//! read-ahead buffer, decodes and augments them with the job's op plan, and hands out
//! batches of new samples mixed with rehearsal samples.
//!
//! Acknowledgements follow checkpoints: an entry is acknowledged (XACK) only once the
//! trainer has taken its batch, taken a state (`state()`) that covers it and asked for the
//! next batch, i.e. once a checkpoint that lists its id in the ledger exists. Whatever was
//! not acknowledged is still pending in the broker; a restarted trainer resuming from its
//! last state reads its pending entries back and skips those its ledger already holds,
//! so every entry is trained on exactly once across the restart. A trainer that holds
//! more than `max_unacked` entries without a state has its oldest acknowledged anyway, so
//! the broker's pending list stays bounded.
//!
//! Several learners of a job share its consumer group. Each keeps a liveness key alive
//! (`liveness`); only a learner whose key expired is dead, and only a dead learner's
//! pending entries are claimed by the others. Since a live learner's entries stay its
//! own, it takes from the group (reads and claims) no more than `rate.read_ahead` batches
//! ahead of its trainer: a slow learner does not hold a backlog that the others would
//! train sooner.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_autoscale::RateMeter;
use sluice_codec::Plan;
use sluice_core::{Batch, ErrorPolicy, SampleKey, SampleRng};
use sluice_pipeline::loader::{BatchRunner, BytesJob, Engine, PendingBatch, RanBatch};

use crate::broker::Broker;
use crate::entry::{Entry, Sample};
use crate::error::StreamError;
use crate::ledger::Ledger;
use crate::liveness::{alive_key, Heartbeat};
use crate::monitor::{StreamLoaderStats, StreamMonitor};
use crate::rate::{Counters, StreamStats, RATE_WINDOW_S};
use crate::rehearsal::{Rehearsal, RehearsalState, Stored, KEEP_FILES};
use crate::shards::{PeerFetcher, Shard, ShardServer};
use crate::spec::{Overflow, StreamSpec, Underflow};

/// How long one blocking read waits, so a waiting trainer still answers interrupts.
const POLL: Duration = Duration::from_millis(50);
/// How often the arrival rate and backlog are sampled from the broker.
const RATE_EVERY: Duration = Duration::from_millis(200);
/// Entries read per recovery or claim round trip.
const RECOVER_COUNT: usize = 256;

/// A batch, and which of its samples came from the rehearsal buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamBatch {
    pub batch: Batch,
    /// Per sample: true for a rehearsal sample, false for a new one. New ones come first.
    pub rehearsal: Vec<bool>,
}

/// Where a streaming job stands: enough to resume it exactly once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamState {
    pub stream: String,
    pub group: String,
    pub consumer: String,
    pub batches: u64,
    /// The end marker was read.
    pub ended: bool,
    pub ledger: crate::ledger::LedgerState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rehearsal: Option<RehearsalState>,
    pub counters: Counters,
}

pub struct StreamLoader {
    spec: StreamSpec,
    broker: Broker,
    /// Decodes and augments each batch's samples on the pipeline's engine.
    runner: BatchRunner,
    ahead: VecDeque<Sample>,
    ahead_ids: HashSet<u64>,
    ledger: Ledger,
    /// Keeps this learner's liveness key alive (the consumer name may change on restore).
    heartbeat: Option<Heartbeat>,
    /// This learner's rehearsal buffer (its shard of the global one when distributed).
    rehearsal: Option<Shard>,
    /// Serves the shard to the peers (distributed buffer only).
    _server: Option<ShardServer>,
    /// Prefetches the peers' samples (distributed buffer only).
    fetcher: Option<PeerFetcher>,
    /// The next batch's `rehearsal_per_batch` rehearsal samples, drawn and decoding on the
    /// engine while the trainer trains on the current batch.
    next_rehearsal: Option<Prepared>,
    ended: bool,
    /// While re-reading this consumer's own pending entries: the last entry id read.
    recovering: Option<String>,
    /// The last entry read as new (`>`): after a connection lost during a read, the
    /// entries it may have delivered unseen are this consumer's pending ones after it.
    last_new: Option<String>,
    last_claim: Option<Instant>,
    /// Entries handled without being trained on (duplicates, drops, markers...) since the
    /// last batch: acknowledged with that batch.
    handled: Vec<String>,
    /// Entry ids of each batch handed out, by batch number, until acknowledged.
    unacked: VecDeque<(u64, Vec<String>)>,
    /// Entries in `unacked`.
    unacked_len: usize,
    /// Whether acknowledging beyond `max_unacked` without a state was logged.
    warned_unacked: bool,
    /// The batch count the last `state()` covered.
    checkpointed: Option<u64>,
    counters: Counters,
    /// (stream length, trained) over time since `rate_clock`.
    rates: RateMeter<2>,
    rate_clock: Instant,
    backlog_in_broker: u64,
    files: VecDeque<PathBuf>,
    /// Its stats, published for other threads at every step of a wait and every batch.
    monitor: StreamMonitor,
}

impl StreamLoader {
    /// Connects, creates the job's consumer group if needed, and prepares the op plan.
    pub fn new(spec: StreamSpec) -> Result<Self, StreamError> {
        spec.validate()?;
        let mut broker = Broker::open(&spec.url, Duration::from_millis(spec.reconnect_ms))?;
        broker.ensure_group(&spec.stream, &spec.group)?;
        let batch_size = spec.new_per_batch + spec.rehearsal_per_batch;
        let runner = BatchRunner::new(Plan::compile(&spec.ops, spec.limits), spec.threads, batch_size)
            .map_err(|e| StreamError::Config { field: "threads", problem: e.to_string() })?;
        let rehearsal: Option<Shard> = match &spec.rehearsal {
            Some(r) if r.persist => {
                std::fs::create_dir_all(&r.dir)
                    .map_err(|source| StreamError::RehearsalWrite { path: r.dir.clone(), source })?;
                let path = exemplar_path(&spec, &spec.consumer);
                let buffer =
                    Rehearsal::open_persisted(r.policy, r.capacity, spec.seed, &path, spec.limits.max_file_bytes)?;
                tracing::info!(path = %path.display(), samples = buffer.len(), "rehearsal exemplars persisted here");
                Some(Arc::new(parking_lot::Mutex::new(buffer)))
            }
            Some(r) => Some(Arc::new(parking_lot::Mutex::new(Rehearsal::new(r.policy, r.capacity, spec.seed)))),
            None => None,
        };
        let rehearsal_shard = rehearsal.clone();
        let (mut server, mut fetcher) = (None, None);
        if let (Some(r), Some(shard)) = (&spec.rehearsal, &rehearsal) {
            std::fs::create_dir_all(&r.dir)
                .map_err(|source| StreamError::RehearsalWrite { path: r.dir.clone(), source })?;
            if let Some(addr) = r.peers.get(r.rank) {
                let token = crate::shards::token(r)?;
                server = Some(ShardServer::start(addr, token.clone(), Arc::clone(shard), spec.seed ^ r.rank as u64)?);
                let want = 2 * (spec.rehearsal_per_batch + spec.new_per_batch);
                fetcher = Some(PeerFetcher::start(&r.peers, r.rank, token, want, spec.limits.max_file_bytes)?);
            }
        }
        let heartbeat = Some(Heartbeat::start(
            &spec.url,
            alive_key(&spec.stream, &spec.group, &spec.consumer),
            Duration::from_millis(spec.claim_idle_ms),
            Duration::from_millis(spec.reconnect_ms),
        )?);
        Ok(Self {
            broker,
            heartbeat,
            runner,
            ahead: VecDeque::new(),
            ahead_ids: HashSet::new(),
            ledger: Ledger::new(ledger_capacity(&spec)),
            rehearsal,
            _server: server,
            fetcher,
            next_rehearsal: None,
            ended: false,
            // A reader that starts under a name the group knows first takes back what it
            // left unacknowledged.
            recovering: Some("0".into()),
            last_new: None,
            last_claim: None,
            handled: Vec::new(),
            unacked: VecDeque::new(),
            unacked_len: 0,
            warned_unacked: false,
            checkpointed: None,
            counters: Counters::default(),
            rates: RateMeter::new(RATE_WINDOW_S),
            rate_clock: Instant::now(),
            backlog_in_broker: 0,
            files: VecDeque::new(),
            monitor: StreamMonitor::new(rehearsal_shard),
            spec,
        })
    }

    pub fn spec(&self) -> &StreamSpec {
        &self.spec
    }

    /// The samples in the rehearsal buffer, by id.
    pub fn rehearsal_ids(&self) -> Vec<u64> {
        self.rehearsal.as_ref().map(|r| r.lock().items().iter().map(|s| s.id).collect()).unwrap_or_default()
    }

    /// A handle on this loader's stats and rehearsal buffer that another thread reads while
    /// this one waits in [`StreamLoader::next_batch`].
    pub fn monitor(&self) -> StreamMonitor {
        self.monitor.clone()
    }

    /// The engine its batches are built on: threads, trace, CPU counters, autoscaling.
    pub fn engine(&self) -> &Engine {
        self.runner.engine()
    }

    fn publish(&self) {
        self.monitor.publish(self.stats());
    }

    /// The stream's stats and the engine's (per-op times and percentiles, threads).
    pub fn stats(&self) -> StreamLoaderStats {
        let engine = self.runner.engine();
        let e = engine.stats();
        StreamLoaderStats {
            stream: self.stream_stats(),
            threads: engine.threads(),
            wait_s: e.wait_s,
            op_seconds: e.op_seconds,
            op_percentiles: e.op_percentiles,
            op_counters: e.op_counters,
            autoscale: e.autoscale,
        }
    }

    fn stream_stats(&self) -> StreamStats {
        let [arrival_rate, consumption_rate] = self.rates.rates();
        StreamStats {
            arrival_rate,
            consumption_rate,
            backlog: self.backlog_in_broker + self.ahead.len() as u64,
            read_ahead: self.ahead.len() as u64,
            rehearsal_len: self.rehearsal.as_ref().map_or(0, |r| r.lock().len() as u64),
            peer_ready: self.fetcher.as_ref().map_or(0, PeerFetcher::ready),
            peer_errors: self.fetcher.as_ref().map_or(0, PeerFetcher::errors),
            ledger_len: self.ledger.len() as u64,
            counters: self.counters,
        }
    }

    /// The next batch; `None` once the stream's end marker was read and every sample
    /// before it was handed out.
    pub fn next_batch(&mut self) -> Result<Option<StreamBatch>, StreamError> {
        self.next_batch_interruptible(&mut || false)
    }

    /// As [`StreamLoader::next_batch`], asking `interrupted` every 50 ms while it waits
    /// for the stream; an interrupt returns `Ok(None)` with nothing lost.
    pub fn next_batch_interruptible(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Option<StreamBatch>, StreamError> {
        let next = self.next_batch_waiting(interrupted);
        self.publish();
        next
    }

    fn next_batch_waiting(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Option<StreamBatch>, StreamError> {
        self.ack_committed()?;
        if let Some(b) = &self.rehearsal {
            // The last batch's offers reach the exemplar file (`rehearsal.persist`).
            b.lock().flush_log()?;
        }
        let r = self.spec.new_per_batch;
        let started = Instant::now();
        // Read what has arrived (the overflow policy applies), then wait for what is missing.
        self.fill(Duration::ZERO)?;
        loop {
            self.sample_rates()?;
            if self.ahead.len() >= r {
                break;
            }
            // Pending entries still to re-read may hold new samples: read them all first.
            let recovered = self.recovering.is_none();
            if self.ended && recovered {
                break;
            }
            if recovered
                && self.spec.rate.underflow == Underflow::Rehearsal
                && self.rehearsal.as_ref().is_some_and(|b| !b.lock().is_empty())
                && started.elapsed() >= Duration::from_millis(self.spec.rate.fill_after_ms)
            {
                break;
            }
            self.publish();
            if interrupted() {
                return Ok(None);
            }
            let block = match self.spec.rate.underflow {
                Underflow::Wait => POLL,
                Underflow::Rehearsal => {
                    Duration::from_millis(self.spec.rate.fill_after_ms).saturating_sub(started.elapsed()).min(POLL)
                }
            };
            self.fill(block.max(Duration::from_millis(1)))?;
        }
        let take = r.min(self.ahead.len());
        if take == 0 && self.ended {
            // The backlog is sampled every RATE_EVERY; a stream drained between two samples
            // would leave stats() with the last one's.
            self.backlog_in_broker = self.broker.lag(&self.spec.stream, &self.spec.group)?.unwrap_or(0);
            return Ok(None);
        }
        let new: Vec<Arc<Sample>> = self.ahead.drain(..take).map(Arc::new).collect();
        let fill = if self.ended { 0 } else { r - take };
        // The `rehearsal_per_batch` samples were prepared while the trainer trained on the
        // last batch; fills (and the first batch's samples) are drawn now.
        let prepared = self.next_rehearsal.take();
        let now = match &prepared {
            Some(_) => fill,
            None => self.spec.rehearsal_per_batch + fill,
        };
        let draws = self.draw_rehearsal(now, u64::from(prepared.is_some()));
        let (pending, prepared_draws) = match prepared {
            Some(p) => (Some(p.pending), p.draws),
            None => (None, Draws::default()),
        };
        let built = self.build(&new, &draws.samples, &prepared_draws.samples, pending);
        // Every job is done and dropped: the samples have no other owner.
        let new: Vec<Sample> = new.into_iter().map(|s| Arc::try_unwrap(s).unwrap_or_else(|s| (*s).clone())).collect();
        let batch = match built {
            Ok(batch) => batch,
            Err(failed) => {
                let (failed, e) = *failed;
                self.unbuilt(new, failed);
                return Err(e);
            }
        };
        self.counters.filled += fill.min(draws.samples.len()) as u64;
        let mut entries = std::mem::take(&mut self.handled);
        for s in &new {
            self.ahead_ids.remove(&s.id);
            self.ledger.insert(s.id);
            if let Some(b) = &self.rehearsal {
                b.lock().offer(s);
            }
            entries.push(s.entry.clone());
        }
        self.counters.trained += new.len() as u64;
        for d in [&draws, &prepared_draws] {
            self.counters.rehearsed += d.samples.len() as u64;
            self.counters.rehearsed_remote += d.remote;
            self.counters.remote_missed += d.missed;
        }
        self.counters.batches += 1;
        self.unacked_len += entries.len();
        self.unacked.push_back((self.counters.batches, entries));
        self.prepare_next_rehearsal();
        Ok(Some(batch))
    }

    /// A batch that failed to build (a new sample that does not decode, under
    /// `on_error = "fail"`): the sample that failed is handled (in the ledger, counted as
    /// malformed, acknowledged with the next batch), the others go back to the front of
    /// the read-ahead buffer, so a caller that goes on trains them in the next batch.
    fn unbuilt(&mut self, new: Vec<Sample>, failed: Option<usize>) {
        for (i, s) in new.into_iter().enumerate().rev() {
            if Some(i) == failed {
                self.ahead_ids.remove(&s.id);
                self.ledger.insert(s.id);
                self.counters.malformed += 1;
                self.handled.push(s.entry);
            } else {
                self.ahead.push_front(s);
            }
        }
    }

    /// Draws the next batch's `rehearsal_per_batch` samples now and starts decoding them on
    /// the engine, so that work overlaps the trainer's step.
    fn prepare_next_rehearsal(&mut self) {
        let b = self.spec.rehearsal_per_batch;
        // Once the end marker was read, a batch follows only while samples are read ahead.
        if b == 0 || (self.ended && self.ahead.is_empty()) || self.rehearsal.is_none() {
            return;
        }
        let draws = self.draw_rehearsal(b, 0);
        let (seed, round) = (self.spec.seed, self.counters.batches + 1);
        let jobs = draws.samples.iter().map(|s| rehearsal_job(s, seed, round)).collect();
        let pending = self.runner.submit(self.counters.batches, jobs, draws.samples.len());
        self.next_rehearsal = Some(Prepared { draws, pending });
    }

    /// `n` rehearsal samples, uniform over the buffer; over the global buffer when it is
    /// distributed: each draw falls on a shard in proportion to its length, a peer's draws
    /// are taken from what was prefetched from it, and those that find nothing there yet
    /// are drawn locally instead (`remote_missed`).
    /// `part` separates the draws of one round (prepared ahead, and fills) so they differ.
    /// Counted by the caller when the samples are handed out.
    fn draw_rehearsal(&mut self, n: usize, part: u64) -> Draws {
        let Some(shard) = &self.rehearsal else { return Draws::default() };
        let round = self.counters.batches | (part << 63);
        let mut missed_all = 0;
        let mut local_n = n;
        let mut remote: Vec<Arc<Stored>> = Vec::new();
        if let Some(fetcher) = &self.fetcher {
            let lens = fetcher.lens();
            let local_len = shard.lock().len() as u64;
            let total = local_len + lens.iter().sum::<u64>();
            let mut per_peer = vec![0usize; lens.len()];
            let mut rng = SampleRng::new(self.spec.seed, round, SampleKey(u64::MAX), 0x676c_6f62);
            local_n = 0;
            for _ in 0..n {
                let mut x = if total == 0 { 0 } else { rng.next_u64() % total };
                if x < local_len {
                    local_n += 1;
                    continue;
                }
                x -= local_len;
                for (i, &len) in lens.iter().enumerate() {
                    if x < len {
                        per_peer[i] += 1;
                        break;
                    }
                    x -= len;
                }
            }
            for (i, k) in per_peer.into_iter().enumerate().filter(|(_, k)| *k > 0) {
                let got = fetcher.take(i, k);
                let missed = k - got.len();
                missed_all += missed as u64;
                local_n += missed;
                remote.extend(got.into_iter().map(Arc::new));
            }
        }
        let shard = shard.lock();
        let mut out: Vec<Arc<Stored>> =
            shard.draw(local_n, round).into_iter().map(|i| Arc::clone(&shard.items()[i])).collect();
        let remote_n = remote.len() as u64;
        out.extend(remote);
        Draws { samples: out, remote: remote_n, missed: missed_all }
    }

    /// Decodes and augments the new samples and the rehearsal samples drawn now into one
    /// batch on the engine, with the prepared rehearsal samples (decoding since the last
    /// batch, `pending`) at the end. On failure (`on_error = "fail"`), says which new
    /// sample failed (none: a rehearsal sample).
    fn build(
        &mut self,
        new: &[Arc<Sample>],
        draws: &[Arc<Stored>],
        later: &[Arc<Stored>],
        pending: Option<PendingBatch>,
    ) -> Result<StreamBatch, Box<(Option<usize>, StreamError)>> {
        let seed = self.spec.seed;
        let index = self.counters.batches;
        let draw_round = index + 1;
        let mut jobs: Vec<BytesJob> = new
            .iter()
            .map(|s| BytesJob {
                key: s.id,
                bytes: Arc::new(Image::New(Arc::clone(s))),
                rng: SampleRng::new(seed, 0, SampleKey(s.id), 0),
            })
            .collect();
        jobs.extend(draws.iter().map(|s| rehearsal_job(s, seed, draw_round)));
        let now = jobs.len();
        let rows = now + later.len();
        let ran = self.runner.submit(index, jobs, rows).wait();
        let RanBatch { mut images, mut results, mut waited } = ran;
        let slot = self.runner.plan().output_bytes();
        if let Some(p) = pending {
            let prepared = p.wait();
            waited += prepared.waited;
            images.as_bytes_mut()[now * slot..].copy_from_slice(prepared.images.as_bytes());
            results.extend(prepared.results);
            self.runner.engine().recycle(prepared.images);
        }
        // Who each row is: (id, label, entry, rehearsal).
        let who = |i: usize| -> (u64, i64, &str, bool) {
            match i.checked_sub(new.len()) {
                None => (new[i].id, new[i].label, new[i].entry.as_str(), false),
                Some(j) => {
                    let s = draws.get(j).or_else(|| later.get(j - draws.len()));
                    s.map_or((0, 0, "rehearsal", true), |s| (s.id, s.label, "rehearsal", true))
                }
            }
        };
        let mut failed = Vec::new();
        for (i, result) in results.into_iter().enumerate() {
            if let Err(source) = result {
                let (id, _, entry, _) = who(i);
                let err =
                    StreamError::Decode { stream: self.spec.stream.clone(), entry: entry.to_string(), id, source };
                if self.spec.on_error == ErrorPolicy::Fail {
                    // Which of the new samples failed (none: a rehearsal sample).
                    return Err(Box::new(((i < new.len()).then_some(i), err)));
                }
                tracing::warn!(error = %err, "skipping a sample that does not decode");
                self.counters.malformed += 1;
                failed.push(i);
            }
        }
        let kept: Vec<usize> = (0..rows).filter(|i| !failed.contains(i)).collect();
        if !failed.is_empty() {
            let bytes = images.as_bytes_mut();
            for (to, &from) in kept.iter().enumerate() {
                if to != from {
                    bytes.copy_within(from * slot..(from + 1) * slot, to * slot);
                }
            }
            images.truncate_rows(kept.len());
        }
        self.runner.engine().batch_done(kept.len(), waited, 0);
        let batch = Batch {
            epoch: 0,
            index,
            keys: kept.iter().map(|&i| who(i).0).collect(),
            labels: kept.iter().map(|&i| who(i).1).collect(),
            images,
            layout: self.runner.plan().output_layout(),
            weights: None,
            boxes: None,
            fields: None,
        };
        Ok(StreamBatch { batch, rehearsal: kept.iter().map(|&i| who(i).3).collect() })
    }

    /// Reads from the broker: first this consumer's own pending entries (after a start, a
    /// restore or a read lost with its connection), then dead learners' (claimed), then new
    /// ones, claims and new ones together as many as [`StreamLoader::room`] lets in,
    /// waiting up to `block` for them.
    fn fill(&mut self, block: Duration) -> Result<(), StreamError> {
        // A connection lost by a command that delivers nothing (an ack, a length) loses nothing.
        self.broker.take_lost_connection();
        if self.heartbeat.as_ref().is_some_and(Heartbeat::take_lapse) {
            // Other learners may have taken this one for dead and claimed what it read
            // ahead: keep only what is still pending under its name.
            tracing::warn!(
                consumer = %self.spec.consumer,
                "this learner's liveness key was not refreshed for claim_idle_ms; re-reading what it still holds"
            );
            self.ahead.clear();
            self.ahead_ids.clear();
            self.recovering = Some("0".into());
        }
        let (stream, group, consumer) = (self.spec.stream.clone(), self.spec.group.clone(), self.spec.consumer.clone());
        if let Some(after) = self.recovering.clone() {
            let got =
                self.broker.read_group(&stream, &group, &consumer, Some(&after), RECOVER_COUNT, Duration::ZERO)?;
            match got.last() {
                None => self.recovering = None,
                Some(last) => self.recovering = Some(last.id.clone()),
            }
            for raw in &got {
                self.admit(raw)?;
            }
            if self.recovering.is_some() {
                return Ok(());
            }
        }
        let claim_every = Duration::from_millis(self.spec.claim_idle_ms / 2);
        let want = self.room().min(RECOVER_COUNT);
        if want > 0 && self.last_claim.is_none_or(|t| t.elapsed() >= claim_every) {
            self.last_claim = Some(Instant::now());
            let idle = Duration::from_millis(self.spec.claim_idle_ms);
            let alive = |c: &str| alive_key(&stream, &group, c);
            let got = self.broker.claim_from_dead(&stream, &group, &consumer, &alive, idle, want)?;
            if self.broker.take_lost_connection() {
                // A claim lost with its connection may have moved entries to this consumer.
                self.recovering = Some("0".into());
            }
            if got.len() >= want {
                // The dead may hold more: claim again at the next read, not a period later.
                self.last_claim = None;
            }
            self.counters.claimed += got.len() as u64;
            for raw in &got {
                self.admit(raw)?;
            }
        }
        let room = self.room();
        if room == 0 || self.ended {
            return Ok(());
        }
        let got = self.broker.read_group(&stream, &group, &consumer, None, room, block)?;
        if self.broker.take_lost_connection() && self.recovering.is_none() {
            // The read was retried on a new connection: an attempt before may have
            // delivered entries that never arrived. They are pending for this consumer,
            // after the last new entry that did arrive.
            self.recovering = Some(self.last_new.clone().unwrap_or_else(|| "0".into()));
        }
        if let Some(last) = got.last() {
            self.last_new = Some(last.id.clone());
        }
        for raw in &got {
            self.admit(raw)?;
        }
        Ok(())
    }

    /// Entries the next read or claim may take from the group. Under backpressure, what
    /// is missing from `rate.read_ahead` batches (within `rate.buffer`): a learner holds
    /// no more than it trains soon, and the group's other learners get the rest. Under the
    /// dropping policies, a whole buffer: reading what arrives is how the surplus is seen
    /// and dropped or spilled.
    fn room(&self) -> usize {
        match self.spec.rate.overflow {
            Overflow::Backpressure => {
                self.spec.rate.read_ahead_samples(self.spec.new_per_batch).saturating_sub(self.ahead.len())
            }
            Overflow::DropOldest | Overflow::DropRandom | Overflow::Spill => self.spec.rate.buffer,
        }
    }

    /// Takes one entry in: a new sample joins the read-ahead buffer (the overflow policy
    /// makes room), anything else is noted to be acknowledged with the next batch.
    fn admit(&mut self, raw: &redis::streams::StreamId) -> Result<(), StreamError> {
        let entry = match Entry::parse(&self.spec.stream, raw) {
            Ok(e) => e,
            Err(e) if self.spec.on_error == ErrorPolicy::Skip => {
                tracing::warn!(error = %e, "skipping a malformed stream entry");
                self.counters.malformed += 1;
                self.handled.push(raw.id.clone());
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let s = match entry {
            Entry::End { entry } => {
                self.ended = true;
                self.handled.push(entry);
                return Ok(());
            }
            Entry::Deleted { entry } => {
                self.handled.push(entry);
                return Ok(());
            }
            Entry::Sample(s) => s,
        };
        if self.ledger.contains(s.id) {
            self.counters.duplicates += 1;
            self.handled.push(s.entry);
            return Ok(());
        }
        if !self.ahead_ids.insert(s.id) {
            // Already read ahead (a re-read of our own pending entry): it is acknowledged
            // with the batch it goes into.
            return Ok(());
        }
        let arrived = s.id;
        self.ahead.push_back(s);
        while self.ahead.len() > self.spec.rate.buffer && self.spec.rate.overflow != Overflow::Backpressure {
            let victim = match self.spec.rate.overflow {
                Overflow::DropRandom => {
                    drop_random_slot(self.spec.seed, self.counters.dropped, arrived, self.ahead.len())
                }
                _ => 0,
            };
            let Some(old) = self.ahead.remove(victim) else { break };
            self.ahead_ids.remove(&old.id);
            self.ledger.insert(old.id);
            match self.spec.rate.overflow {
                Overflow::Spill => {
                    self.counters.spilled += 1;
                    if let Some(b) = &self.rehearsal {
                        b.lock().offer(&old);
                    }
                }
                _ => self.counters.dropped += 1,
            }
            self.handled.push(old.entry);
        }
        Ok(())
    }

    fn sample_rates(&mut self) -> Result<(), StreamError> {
        if !self.rates.due(self.rate_clock.elapsed().as_secs_f64(), RATE_EVERY.as_secs_f64()) {
            return Ok(());
        }
        let len = self.broker.len(&self.spec.stream)?;
        self.backlog_in_broker = self.broker.lag(&self.spec.stream, &self.spec.group)?.unwrap_or(0);
        self.rates.record(self.rate_clock.elapsed().as_secs_f64(), [len, self.counters.trained]);
        Ok(())
    }

    /// Acknowledges the entries of batches a taken state covers, and the oldest beyond
    /// `max_unacked` whether a state covers them or not.
    fn ack_committed(&mut self) -> Result<(), StreamError> {
        let upto = self.checkpointed.unwrap_or(0);
        let mut ids = Vec::new();
        let mut uncovered = 0;
        while let Some((batch, _)) = self.unacked.front() {
            let covered = *batch <= upto && self.checkpointed.is_some();
            if !covered && self.unacked_len <= self.spec.max_unacked {
                break;
            }
            if let Some((_, e)) = self.unacked.pop_front() {
                self.unacked_len -= e.len();
                uncovered += if covered { 0 } else { e.len() };
                ids.extend(e);
            }
        }
        if uncovered > 0 && !self.warned_unacked {
            self.warned_unacked = true;
            tracing::warn!(
                max_unacked = self.spec.max_unacked,
                "more than max_unacked entries were handed out since the last state(): acknowledging the \
                 oldest without one (a restore from an older state will not train them again); take a \
                 state() more often"
            );
        }
        self.broker.ack(&self.spec.stream, &self.spec.group, &ids)
    }

    /// Where the job stands, with the rehearsal buffer's contents written to a file the
    /// state names. Take it after training on a batch and save it with the model: the
    /// batch's entries are acknowledged at the next [`StreamLoader::next_batch`]. The
    /// rehearsal files of the [`KEEP_FILES`] newest states are kept; older ones are deleted.
    pub fn state(&mut self) -> Result<StreamState, StreamError> {
        let rehearsal = match (&self.rehearsal, &self.spec.rehearsal) {
            (Some(buffer), Some(spec)) => {
                let name = format!(
                    "{}-{}-{}-{:08}.rehearsal",
                    file_safe(&self.spec.stream),
                    file_safe(&self.spec.group),
                    file_safe(&self.spec.consumer),
                    self.counters.batches
                );
                let path = spec.dir.join(name);
                let state = {
                    let mut buffer = buffer.lock();
                    buffer.flush_log()?;
                    buffer.save(&path)?
                };
                if self.files.back() != Some(&path) {
                    self.files.push_back(path);
                }
                while self.files.len() > KEEP_FILES {
                    if let Some(old) = self.files.pop_front() {
                        let _ = std::fs::remove_file(old);
                    }
                }
                Some(state)
            }
            _ => None,
        };
        self.checkpointed = Some(self.counters.batches);
        Ok(StreamState {
            stream: self.spec.stream.clone(),
            group: self.spec.group.clone(),
            consumer: self.spec.consumer.clone(),
            batches: self.counters.batches,
            ended: self.ended,
            ledger: self.ledger.state(),
            rehearsal,
            counters: self.counters,
        })
    }

    /// Resumes from `state` (call it before the first batch): the ledger, the counters and
    /// the rehearsal buffer come back, the consumer name is the state's, and the entries
    /// that consumer left unacknowledged are read again (those in the ledger are skipped).
    /// Nothing changes unless the whole state is accepted.
    pub fn restore(&mut self, state: &StreamState) -> Result<(), StreamError> {
        if self.counters.batches > 0 {
            return Err(StreamError::Config {
                field: "state",
                problem: "restore a state before the first batch".into(),
            });
        }
        let ledger = state.check(&self.spec)?;
        let mut restored = match (&state.rehearsal, &self.spec.rehearsal) {
            (Some(saved), Some(_)) => Some(Rehearsal::load(saved, self.spec.seed, self.spec.limits.max_file_bytes)?),
            (None, Some(r)) => Some(Rehearsal::new(r.policy, r.capacity, self.spec.seed)),
            (_, None) => None,
        };
        if let (Some(buffer), Some(true)) = (restored.as_mut(), self.spec.rehearsal.as_ref().map(|r| r.persist)) {
            // The checkpoint's buffer wins over the exemplar file, which goes on from it.
            buffer.persist_at(&exemplar_path(&self.spec, &state.consumer))?;
        }
        if state.consumer != self.spec.consumer {
            // Alive under the state's name before reading anything under it.
            self.heartbeat = None;
            self.heartbeat = Some(Heartbeat::start(
                &self.spec.url,
                alive_key(&self.spec.stream, &self.spec.group, &state.consumer),
                Duration::from_millis(self.spec.claim_idle_ms),
                Duration::from_millis(self.spec.reconnect_ms),
            )?);
        }
        if let (Some(shard), Some(restored)) = (&self.rehearsal, restored) {
            *shard.lock() = restored;
        }
        if let Some(saved) = &state.rehearsal {
            self.files.push_back(saved.file.clone());
        }
        // What this loader read ahead under its own name stays pending for that name and
        // is claimed once its liveness key expires; it is read back under the state's name
        // from now on.
        self.ahead.clear();
        self.ahead_ids.clear();
        self.spec.consumer = state.consumer.clone();
        self.ledger = ledger;
        self.counters = state.counters;
        self.ended = state.ended;
        self.checkpointed = Some(state.batches);
        self.recovering = Some("0".into());
        self.last_new = None;
        Ok(())
    }

    /// Acknowledges what the last state covers; what it does not stays pending.
    pub fn close(mut self) -> Result<(), StreamError> {
        self.ack_committed()
    }
}

impl StreamState {
    /// Checks that this state fits a loader of `spec` (same stream and group, a rehearsal
    /// buffer of the same policy and capacity, a ledger within the loader's bound) and
    /// returns its ledger. Reads no file and allocates nothing the spec does not bound.
    pub fn check(&self, spec: &StreamSpec) -> Result<Ledger, StreamError> {
        let mismatch = |what, theirs: String, ours: String| Err(StreamError::StateMismatch { what, theirs, ours });
        if self.stream != spec.stream {
            return mismatch("stream", self.stream.clone(), spec.stream.clone());
        }
        if self.group != spec.group {
            return mismatch("group", self.group.clone(), spec.group.clone());
        }
        if self.consumer.is_empty() {
            return mismatch("consumer", String::new(), spec.consumer.clone());
        }
        match (&self.rehearsal, &spec.rehearsal) {
            (Some(saved), Some(r)) => {
                if saved.capacity != r.capacity {
                    return mismatch("rehearsal.capacity", saved.capacity.to_string(), r.capacity.to_string());
                }
                if saved.policy != r.policy {
                    return mismatch("rehearsal.policy", format!("{:?}", saved.policy), format!("{:?}", r.policy));
                }
                if saved.len > saved.capacity {
                    return mismatch("rehearsal length", saved.len.to_string(), format!("at most {}", r.capacity));
                }
            }
            (Some(_), None) => return mismatch("rehearsal buffer", "one".into(), "none".into()),
            _ => {}
        }
        Ok(Ledger::from_state(&self.ledger, ledger_capacity(spec))?)
    }
}

impl Drop for StreamLoader {
    fn drop(&mut self) {
        if let Err(e) = self.ack_committed() {
            tracing::warn!(error = %e, "could not acknowledge the last checkpointed entries");
        }
    }
}

/// The ids the ledger keeps: every entry a learner may hold unacknowledged (`max_unacked`,
/// one batch more, and what it reads ahead), so that a redelivery of any of them is known.
pub fn ledger_capacity(spec: &StreamSpec) -> usize {
    spec.max_unacked.saturating_add(spec.rate.buffer).saturating_add(spec.new_per_batch)
}

fn file_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// A sample's encoded bytes, for the engine: a new one's or a rehearsal one's.
enum Image {
    New(Arc<Sample>),
    Stored(Arc<Stored>),
}

impl AsRef<[u8]> for Image {
    fn as_ref(&self) -> &[u8] {
        match self {
            Image::New(s) => &s.image,
            Image::Stored(s) => &s.image,
        }
    }
}

/// A rehearsal sample drawn for batch `round`: a fresh generator per draw, so it is
/// augmented anew each time.
/// The exemplar file of `rehearsal.persist`, per stream, group and consumer.
fn exemplar_path(spec: &StreamSpec, consumer: &str) -> PathBuf {
    let dir = spec.rehearsal.as_ref().map_or_else(PathBuf::new, |r| r.dir.clone());
    dir.join(format!("{}-{}-{}.exemplars", file_safe(&spec.stream), file_safe(&spec.group), file_safe(consumer)))
}

/// Which of `len` samples read ahead `overflow = "drop_random"` drops: uniform, and a pure
/// function of the seed, the drops so far and the sample whose arrival overflowed.
pub(crate) fn drop_random_slot(seed: u64, dropped: u64, arrived: u64, len: usize) -> usize {
    let mut rng = SampleRng::new(seed, dropped, SampleKey(arrived), 0x6472_6f70);
    (rng.next_u64() % len.max(1) as u64) as usize
}

fn rehearsal_job(s: &Arc<Stored>, seed: u64, round: u64) -> BytesJob {
    BytesJob {
        key: s.id,
        bytes: Arc::new(Image::Stored(Arc::clone(s))),
        rng: SampleRng::new(seed, round, SampleKey(s.id), 1),
    }
}

/// Rehearsal samples drawn for a batch, and how many came from peers or missed them.
#[derive(Default)]
struct Draws {
    samples: Vec<Arc<Stored>>,
    remote: u64,
    missed: u64,
}

/// The next batch's rehearsal samples, decoding on the engine.
struct Prepared {
    draws: Draws,
    pending: PendingBatch,
}

#[cfg(test)]
mod tests {
    use super::drop_random_slot;

    #[test]
    fn drop_random_picks_uniformly_and_only_from_the_seed_and_counts() {
        let picks = |seed| (0..4000u64).map(|n| drop_random_slot(seed, n, 1000 + n, 8)).collect::<Vec<_>>();
        assert_eq!(picks(7), picks(7), "the same seed drops the same samples");
        assert_ne!(picks(7), picks(8), "another seed, other samples");
        let mut per_slot = [0usize; 8];
        for p in picks(7) {
            per_slot[p] += 1;
        }
        // 500 expected per slot; not the oldest (slot 0) every time as drop_oldest.
        assert!(per_slot.iter().all(|&n| (400..=600).contains(&n)), "{per_slot:?}");
        assert_eq!(drop_random_slot(1, 0, 0, 0), 0, "an empty buffer reads slot 0, not a division by 0");
    }
}
