//! Profiling: per-sample, per-op and per-batch events, recorded where the work happens and
//! exported apart from the hot path (Perfetto protobuf or Chrome trace JSON).
//!
//! Worker threads write small fixed-size [`Event`]s into a buffer each owns
//! ([`ThreadBuf`], kept in the worker's scratch state): no lock and no allocation per event.
//! A worker hands its buffer's events to the loader's [`Recorder`] once per job (a few
//! samples), before it reports the job done, so every event of a batch the consumer holds
//! is in the recorder. The clock is `CLOCK_MONOTONIC` (the vDSO's, a few tens of ns), the
//! same one `std::time::Instant` reads, so op durations measured with `Instant` and event
//! timestamps line up. Tracing is off until [`TraceSwitch::start`]; when off, the hot path
//! pays one relaxed atomic load per job.

mod chrome;
mod perfetto;
mod recorder;

use std::path::{Path, PathBuf};

/// Perfetto's trace messages (generated from the vendored `perfetto_trace.proto`): for
/// writers of other traces (the service client's) and for readers.
pub use perfetto::pb;
pub use recorder::{CacheUse, Dropped, Recorder, SampleId, ThreadBuf, TraceData, TraceSwitch, MAX_TRACE_EVENTS};

/// The instant a trace shows where it began to drop events (args: `dropped`, `max_events`).
pub const DROPPED_EVENT: &str = "trace_events_dropped";

/// What an event measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// One op on one sample; the index is into [`TraceData::ops`] (`read`, then the plan's
    /// steps, as in the loader's stats).
    Op(u16),
    /// The sample was found in the cache (an instant).
    CacheHit,
    /// The sample was not in the cache (an instant).
    CacheMiss,
    /// Offering the computed sample to the cache.
    CacheFill,
    /// A batch, from its first job submitted to its last sample done (Lotus's
    /// `SBatchPreprocessed`).
    BatchPreprocessed,
    /// The consumer blocked waiting for the batch (`SBatchWait`).
    BatchWait,
    /// The batch handed to the consumer (an instant).
    BatchHandedOver,
    /// The trainer's time with the batch: from handing it over to asking for the next one
    /// (`SBatchConsumed`).
    BatchConsumed,
}

impl What {
    /// The event's name in an exported trace.
    pub fn name<'a>(&self, ops: &'a [String]) -> &'a str {
        match self {
            What::Op(i) => ops.get(usize::from(*i)).map_or("op", String::as_str),
            What::CacheHit => "cache_hit",
            What::CacheMiss => "cache_miss",
            What::CacheFill => "cache_fill",
            What::BatchPreprocessed => "batch_preprocessed",
            What::BatchWait => "batch_wait",
            What::BatchHandedOver => "batch_handed_over",
            What::BatchConsumed => "batch_consumed",
        }
    }

    /// Per-sample events carry a sample key; batch events do not.
    pub fn has_key(&self) -> bool {
        matches!(self, What::Op(_) | What::CacheHit | What::CacheMiss | What::CacheFill)
    }
}

/// One event: 48 bytes, copied, never allocated on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// `CLOCK_MONOTONIC`, ns.
    pub start_ns: u64,
    /// 0 for an instant.
    pub dur_ns: u64,
    /// The sample's key (per-sample events).
    pub key: u64,
    pub batch: u64,
    pub epoch: u64,
    /// The OS thread id of the thread that did the work (for [`What::BatchPreprocessed`],
    /// the consumer's, which assembled the batch).
    pub tid: u32,
    pub what: What,
}

/// `CLOCK_MONOTONIC` in ns: the clock every event is stamped with.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    // The monotonic clock counts from boot: never negative.
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// The calling thread's OS id, cached per thread.
pub fn current_tid() -> u32 {
    thread_local! {
        static TID: u32 = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    }
    TID.with(|t| *t)
}

/// An id to stand for a process's pid in traces merged with other processes' (a service
/// worker's): OS pids do not tell those apart, as every container's first process is pid 1.
/// Random, in `1..=i32::MAX` (Perfetto's pids are `i32`).
pub fn random_pid() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // std seeds its hasher keys from the OS's entropy, a fresh key per `RandomState`.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(now_ns());
    (h.finish() % i32::MAX as u64) as u32 + 1
}

/// What can go wrong with a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// [`TraceSwitch::start`] while a trace is already being recorded.
    #[error("a trace is already being recorded; stop it before starting another")]
    AlreadyTracing,
    /// The trace file could not be written.
    #[error("cannot write the trace to {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    /// A trace file to merge could not be read.
    #[error("cannot read the trace {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// A file to merge is not a Perfetto trace sluice wrote.
    #[error("{path} is not a sluice Perfetto trace: {reason}")]
    Malformed { path: PathBuf, reason: String },
    /// A worker's trace whose worker built none of the batches in the client's trace: its
    /// clock offset is unknown.
    #[error("{path}: its worker (pid {pid}) built none of the batches in the client's trace, so its clock cannot be aligned")]
    Unaligned { path: PathBuf, pid: i32 },
    /// Two worker traces to merge name the same process.
    #[error("{path} and {other} both come from the process with pid {pid}: pass each worker's trace once (traces written before workers had trace ids of their own carry the OS pid, 1 in every container)")]
    SameProcess { path: PathBuf, other: PathBuf, pid: i32 },
}

/// The file format a trace path asks for: Chrome trace JSON for `.json`, Perfetto
/// protobuf otherwise (`.pftrace`, `.perfetto-trace`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    Perfetto,
    ChromeJson,
}

impl TraceFormat {
    pub fn for_path(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("json") => TraceFormat::ChromeJson,
            _ => TraceFormat::Perfetto,
        }
    }
}

impl TraceData {
    /// The trace encoded in `format`.
    pub fn encode(&self, format: TraceFormat) -> Vec<u8> {
        match format {
            TraceFormat::Perfetto => perfetto::encode(self),
            TraceFormat::ChromeJson => chrome::encode(self),
        }
    }

    /// Writes the trace to `path`, in the format its extension names ([`TraceFormat::for_path`]).
    pub fn write(&self, path: &Path) -> Result<(), TraceError> {
        let bytes = self.encode(TraceFormat::for_path(path));
        std::fs::write(path, bytes).map_err(|source| TraceError::Write { path: path.to_path_buf(), source })
    }
}

/// Assigns each batch span to the first lane free at its start, so the spans of batches in
/// flight together (prefetch) sit side by side instead of overlapping on one track.
pub fn lanes(spans: &[(u64, u64)]) -> Vec<usize> {
    let mut lane_ends: Vec<u64> = Vec::new();
    spans
        .iter()
        .map(|&(start, end)| match lane_ends.iter().position(|&e| e <= start) {
            Some(l) => {
                lane_ends[l] = end;
                l
            }
            None => {
                lane_ends.push(end);
                lane_ends.len() - 1
            }
        })
        .collect()
}

/// A flow's id: the same on the batch's preprocessing span and its hand-over.
pub(crate) fn flow_id(pid: u32, epoch: u64, batch: u64) -> u64 {
    xor_mix(u64::from(pid) << 40 ^ epoch << 32 ^ batch)
}

/// A track's (or flow's) id, from what names it.
pub fn track_uuid(parts: &[u64]) -> u64 {
    parts.iter().fold(0x5171_ce00_0000_0001u64, |h, &p| xor_mix(h ^ p))
}

fn xor_mix(mut x: u64) -> u64 {
    // splitmix64's finaliser: distinct inputs give well-spread, distinct-enough ids.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_batch_spans_go_to_separate_lanes_and_reuse_freed_ones() {
        let spans = [(0, 10), (2, 12), (10, 20), (13, 15)];
        assert_eq!(lanes(&spans), vec![0, 1, 0, 1]);
    }

    #[test]
    fn the_trace_format_follows_the_extension() {
        assert_eq!(TraceFormat::for_path(Path::new("a/out.json")), TraceFormat::ChromeJson);
        assert_eq!(TraceFormat::for_path(Path::new("out.pftrace")), TraceFormat::Perfetto);
        assert_eq!(TraceFormat::for_path(Path::new("out")), TraceFormat::Perfetto);
    }

    #[test]
    fn the_clock_is_the_one_instant_reads() {
        let a = now_ns();
        let i = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let d = i.elapsed().as_nanos() as u64;
        let b = now_ns();
        assert!(b - a >= d, "now_ns advanced {} ns while Instant saw {d}", b - a);
        assert!(b - a < d + 2_000_000, "now_ns advanced {} ns while Instant saw {d}", b - a);
    }
}
