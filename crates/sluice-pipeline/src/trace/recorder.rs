//! Where events go: each worker's own buffer, the loader's recorder that gathers them, and
//! the switch that turns recording on and off while the loader runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{current_tid, Event, TraceError, What};

/// Events each worker buffers: more than a job's worth (a few samples × a few ops), so a
/// job's events never make the buffer grow.
const THREAD_BUF_EVENTS: usize = 256;

/// Events a trace holds (until it is stopped, or since it was last drained): 48 bytes each,
/// about 100 MB. Past it, events are dropped and counted ([`TraceData::dropped`]), so a long
/// run with a trace on cannot run out of memory.
pub const MAX_TRACE_EVENTS: usize = 1 << 21;

/// One thread's events since it last handed them over. Lives in the worker's scratch
/// state, so writing to it takes no lock.
#[derive(Debug)]
pub struct ThreadBuf {
    events: Vec<Event>,
}

impl Default for ThreadBuf {
    fn default() -> Self {
        Self { events: Vec::with_capacity(THREAD_BUF_EVENTS) }
    }
}

/// Whether the sample went through the cache, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// No cache in the pipeline.
    None,
    Hit,
    /// A miss; the time spent offering the result to the cache.
    Miss {
        fill: Duration,
    },
}

/// Which sample an event is about.
#[derive(Debug, Clone, Copy)]
pub struct SampleId {
    pub key: u64,
    pub batch: u64,
    pub epoch: u64,
}

impl ThreadBuf {
    pub fn push(&mut self, e: Event) {
        self.events.push(e);
    }

    /// One sample's events: the cache lookup at `start_ns`, then one event per op that ran
    /// (`op_times[i]` > 0, op `i` of the loader's op list), laid end to end in op order
    /// (the order they ran in), then the cache fill. Durations are the ones the loader's
    /// stats add up, so a trace's per-op sums equal the stats'.
    pub fn sample(&mut self, start_ns: u64, op_times: &[Duration], cache: CacheUse, id: SampleId) {
        let tid = current_tid();
        let event = |start_ns, dur_ns, what| Event {
            start_ns,
            dur_ns,
            key: id.key,
            batch: id.batch,
            epoch: id.epoch,
            tid,
            what,
        };
        match cache {
            CacheUse::None => {}
            CacheUse::Hit => self.push(event(start_ns, 0, What::CacheHit)),
            CacheUse::Miss { .. } => self.push(event(start_ns, 0, What::CacheMiss)),
        }
        let mut t = start_ns;
        for (i, d) in op_times.iter().enumerate() {
            let dur = d.as_nanos() as u64;
            if dur == 0 {
                continue;
            }
            self.push(event(t, dur, What::Op(i as u16)));
            t += dur;
        }
        if let CacheUse::Miss { fill } = cache {
            self.push(event(t, fill.as_nanos() as u64, What::CacheFill));
        }
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// Gathers the events of one trace from every thread, [`MAX_TRACE_EVENTS`] at most.
#[derive(Debug)]
pub struct Recorder {
    ops: Vec<String>,
    events: Mutex<Events>,
    threads: Mutex<BTreeMap<u32, String>>,
}

/// The events kept, and how many more came once there was no room for them.
#[derive(Debug, Default)]
struct Events {
    kept: Vec<Event>,
    dropped: u64,
    /// When the first dropped event was recorded.
    first_dropped_ns: Option<u64>,
}

impl Events {
    /// Room for `n` more events; the rest of them are counted as dropped.
    fn room(&mut self, n: usize) -> usize {
        let room = MAX_TRACE_EVENTS.saturating_sub(self.kept.len()).min(n);
        if room < n {
            self.dropped += (n - room) as u64;
            self.first_dropped_ns.get_or_insert_with(super::now_ns);
        }
        room
    }
}

impl Recorder {
    fn new(ops: Vec<String>) -> Self {
        Self { ops, events: Mutex::new(Events::default()), threads: Mutex::new(BTreeMap::new()) }
    }

    /// Takes `buf`'s events (keeping its memory for the next ones): one lock per job.
    pub fn flush(&self, buf: &mut ThreadBuf) {
        if buf.events.is_empty() {
            return;
        }
        self.name_thread();
        let mut events = self.events.lock();
        let room = events.room(buf.events.len());
        buf.events.truncate(room);
        events.kept.append(&mut buf.events);
    }

    /// One event from the consumer's thread (a few per batch).
    pub fn record(&self, e: Event) {
        self.name_thread();
        let mut events = self.events.lock();
        if events.room(1) == 1 {
            events.kept.push(e);
        }
    }

    fn name_thread(&self) {
        let tid = current_tid();
        let mut threads = self.threads.lock();
        threads.entry(tid).or_insert_with(|| std::thread::current().name().unwrap_or("thread").to_string());
    }

    fn take(&self) -> TraceData {
        let Events { kept: mut events, dropped, first_dropped_ns } = std::mem::take(&mut *self.events.lock());
        events.sort_by_key(|e| e.start_ns);
        TraceData {
            pid: std::process::id(),
            process: process_name(),
            ops: self.ops.clone(),
            threads: std::mem::take(&mut *self.threads.lock()),
            events,
            dropped: Dropped { events: dropped, since_ns: first_dropped_ns.unwrap_or_default() },
        }
    }
}

fn process_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "sluice".to_string())
}

/// A recorded trace, ready to export.
#[derive(Debug, Clone)]
pub struct TraceData {
    pub pid: u32,
    pub process: String,
    /// Names of [`What::Op`]'s indices.
    pub ops: Vec<String>,
    /// Thread names by OS thread id.
    pub threads: BTreeMap<u32, String>,
    /// By start time.
    pub events: Vec<Event>,
    /// Events left out because the trace already held [`MAX_TRACE_EVENTS`].
    pub dropped: Dropped,
}

/// Events a trace left out once it was full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    pub events: u64,
    /// `CLOCK_MONOTONIC` ns of the first one left out (0 when none was).
    pub since_ns: u64,
}

impl TraceData {
    /// Total time per op over every sample, by op name, in the order of [`TraceData::ops`].
    pub fn op_totals(&self) -> Vec<(String, Duration)> {
        let mut totals = vec![Duration::ZERO; self.ops.len()];
        for e in &self.events {
            if let What::Op(i) = e.what {
                if let Some(t) = totals.get_mut(usize::from(i)) {
                    *t += Duration::from_nanos(e.dur_ns);
                }
            }
        }
        self.ops.iter().cloned().zip(totals).collect()
    }
}

/// Turns recording on and off while the loader runs. Off, asking for the recorder costs
/// one relaxed atomic load.
#[derive(Debug, Default)]
pub struct TraceSwitch {
    on: AtomicBool,
    recorder: Mutex<Option<Arc<Recorder>>>,
}

impl TraceSwitch {
    /// The recorder, while a trace is being recorded.
    pub fn current(&self) -> Option<Arc<Recorder>> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        self.recorder.lock().clone()
    }

    /// Starts recording events, naming ops by `ops`.
    pub fn start(&self, ops: Vec<String>) -> Result<(), TraceError> {
        let mut slot = self.recorder.lock();
        if slot.is_some() {
            return Err(TraceError::AlreadyTracing);
        }
        *slot = Some(Arc::new(Recorder::new(ops)));
        self.on.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Stops recording and returns what was recorded; `None` if nothing was being recorded.
    /// Jobs still running when it stops drop their events.
    pub fn stop(&self) -> Option<TraceData> {
        let recorder = self.recorder.lock().take()?;
        self.on.store(false, Ordering::Relaxed);
        Some(recorder.take())
    }

    /// The events recorded since the start or the last drain, leaving recording on (a
    /// long-running process writes its trace in parts); `None` if nothing is being recorded.
    pub fn drain(&self) -> Option<TraceData> {
        let recorder = self.recorder.lock().clone()?;
        Some(recorder.take())
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_sample_lays_its_ops_end_to_end_and_skips_ops_that_did_not_run() {
        let mut buf = ThreadBuf::default();
        let times = [Duration::from_nanos(100), Duration::ZERO, Duration::from_nanos(50)];
        let id = SampleId { key: 7, batch: 2, epoch: 1 };
        buf.sample(1_000, &times, CacheUse::Miss { fill: Duration::from_nanos(5) }, id);
        let got: Vec<_> = buf.events.iter().map(|e| (e.what, e.start_ns, e.dur_ns, e.key)).collect();
        assert_eq!(
            got,
            vec![
                (What::CacheMiss, 1_000, 0, 7),
                (What::Op(0), 1_000, 100, 7),
                (What::Op(2), 1_100, 50, 7),
                (What::CacheFill, 1_150, 5, 7),
            ]
        );
    }

    #[test]
    fn a_flush_moves_events_to_the_recorder_and_keeps_the_buffer_memory() {
        let switch = TraceSwitch::default();
        assert!(switch.current().is_none(), "tracing is off by default");
        switch.start(vec!["read".into()]).unwrap();
        assert!(matches!(switch.start(vec![]), Err(TraceError::AlreadyTracing)));
        let rec = switch.current().unwrap();
        let mut buf = ThreadBuf::default();
        let cap = buf.events.capacity();
        buf.sample(10, &[Duration::from_nanos(3)], CacheUse::None, SampleId { key: 1, batch: 0, epoch: 0 });
        rec.flush(&mut buf);
        assert!(buf.is_empty());
        assert_eq!(buf.events.capacity(), cap, "the buffer was reallocated");
        let drained = switch.drain().unwrap();
        assert_eq!(drained.events.len(), 1);
        assert!(switch.is_on(), "a drain leaves recording on");
        buf.sample(20, &[Duration::from_nanos(4)], CacheUse::None, SampleId { key: 2, batch: 0, epoch: 0 });
        rec.flush(&mut buf);
        let data = switch.stop().unwrap();
        assert_eq!(data.events.len(), 1, "the drained events are not recorded twice");
        assert_eq!(drained.op_totals(), vec![("read".to_string(), Duration::from_nanos(3))]);
        assert!(drained.threads.contains_key(&current_tid()) && data.threads.contains_key(&current_tid()));
        let whole = TraceData { events: [drained.events, data.events].concat(), ..data };
        assert_eq!(whole.op_totals(), vec![("read".to_string(), Duration::from_nanos(7))]);
        assert!(switch.current().is_none() && switch.stop().is_none());
    }

    #[test]
    fn a_trace_holds_a_bounded_number_of_events_and_counts_the_ones_it_drops() {
        let switch = TraceSwitch::default();
        switch.start(vec!["read".into()]).unwrap();
        let rec = switch.current().unwrap();
        let event = |i| Event { start_ns: i, dur_ns: 1, key: i, batch: 0, epoch: 0, tid: 1, what: What::Op(0) };
        let mut buf = ThreadBuf::default();
        for i in 0..(MAX_TRACE_EVENTS + 1000) as u64 {
            buf.push(event(i));
            if buf.len() == 200 {
                rec.flush(&mut buf);
            }
        }
        rec.flush(&mut buf);
        rec.record(event(0));
        let data = switch.stop().unwrap();
        assert_eq!(data.events.len(), MAX_TRACE_EVENTS, "a trace of {} events", data.events.len());
        assert_eq!(data.events.last().map(|e| e.key), Some(MAX_TRACE_EVENTS as u64 - 1), "the first events are kept");
        assert_eq!(data.dropped.events, 1001, "the events past the cap are counted");
        assert!(data.dropped.since_ns > 0);

        // A drain starts the count over; so does a new trace.
        switch.start(vec![]).unwrap();
        switch.current().unwrap().record(event(1));
        let data = switch.drain().unwrap();
        assert_eq!((data.events.len(), data.dropped), (1, Dropped::default()));
    }
}
