//! A [`super::RemoteLoader`]'s trace: the trainer's side of every batch (how long it
//! waited, when it got it, how long it kept it) and, for each batch, where and when a
//! worker built it, in one timeline with a flow arrow from the worker's build to the
//! trainer's hand-over.
//!
//! While the client traces, its task requests ask the worker for each batch's times
//! (`RunTaskRequest.trace`); the worker sends them in its own clock with the batch
//! (`BatchTrace`), and the client moves them into its clock with the connection's offset
//! ([`super::clock`]). The worker's per-op events are in its own trace files
//! (`sluice worker --trace-dir`). Off, the client pays one relaxed load per task.

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message;
use serde_json::{json, Value};
use sluice_pipeline::trace::pb::debug_annotation::{NameField, Value as AnnotationValue};
use sluice_pipeline::trace::pb::trace_packet::{Data, OptionalTrustedPacketSequenceId as SeqId, SequenceFlags};
use sluice_pipeline::trace::pb::track_descriptor::StaticOrDynamicName;
use sluice_pipeline::trace::pb::track_event::{NameField as EventName, Type};
use sluice_pipeline::trace::pb::{
    self, DebugAnnotation, ProcessDescriptor, ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent,
};
use sluice_pipeline::trace::{
    current_tid, lanes, now_ns, track_uuid, Dropped, Event, What, DROPPED_EVENT, MAX_TRACE_EVENTS,
};
use sluice_pipeline::{TraceError, TraceFormat};

pub use super::clock::ClockOffset;

/// Where and when a worker built a batch the trainer took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerBuild {
    pub worker_id: u64,
    pub worker_addr: String,
    /// The worker's trace id (`BatchTrace.pid`): its process in traces, the pid of its
    /// own trace files' tracks. Not its OS pid, which is 1 in every container.
    pub worker_pid: u32,
    pub epoch: u64,
    pub batch: u64,
    /// The build span (first job submitted, last sample done), in the client's clock.
    pub built_start_ns: u64,
    pub built_end_ns: u64,
    /// When the client received the batch.
    pub received_ns: u64,
    /// The connection's clock offset the span was moved with.
    pub clock: ClockOffset,
}

/// A batch's build as a fetcher received it (the consumer adds epoch and index).
#[derive(Debug, Clone)]
pub(super) struct Built {
    pub(super) worker_id: u64,
    pub(super) worker_addr: String,
    pub(super) worker_pid: u32,
    /// `None` for a batch whose span the worker did not know (all its samples skipped).
    pub(super) span: Option<(u64, u64)>,
    pub(super) received_ns: u64,
    pub(super) clock: ClockOffset,
}

/// A recorded trace of a remote loader, ready to write.
#[derive(Debug, Clone)]
pub struct RemoteTrace {
    pub pid: u32,
    /// Thread names by OS thread id (the trainer's thread).
    pub threads: BTreeMap<u32, String>,
    /// The trainer's batch events, client clock: `batch_wait`, `batch_handed_over`,
    /// `batch_consumed`.
    pub events: Vec<Event>,
    /// One per batch handed over that a traced task brought.
    pub builds: Vec<WorkerBuild>,
    /// Events and builds left out once the trace held [`MAX_TRACE_EVENTS`] of them.
    pub dropped: Dropped,
}

/// What the loader records while it traces: [`MAX_TRACE_EVENTS`] events and builds at most.
#[derive(Debug)]
pub(super) struct Recording {
    threads: BTreeMap<u32, String>,
    events: Vec<Event>,
    builds: Vec<WorkerBuild>,
    /// The batch last handed over and when: its `batch_consumed` ends at the next ask.
    handed: Option<(u64, u64, u64)>,
    /// How many events and builds it holds at most ([`MAX_TRACE_EVENTS`]), and those it
    /// left out.
    cap: usize,
    dropped: Dropped,
}

impl Default for Recording {
    fn default() -> Self {
        Self {
            threads: BTreeMap::new(),
            events: Vec::new(),
            builds: Vec::new(),
            handed: None,
            cap: MAX_TRACE_EVENTS,
            dropped: Dropped::default(),
        }
    }
}

impl Recording {
    /// Whether `n` more would pass the cap; if so they are counted as dropped.
    fn full(&mut self, n: usize) -> bool {
        if self.events.len() + self.builds.len() + n <= self.cap {
            return false;
        }
        if self.dropped.events == 0 {
            self.dropped.since_ns = now_ns();
        }
        self.dropped.events += n as u64;
        true
    }

    /// The trainer asks for a batch now: the last one's `batch_consumed` ends.
    pub(super) fn asked(&mut self) -> u64 {
        let now = now_ns();
        if let Some((epoch, batch, handed_ns)) = self.handed.take() {
            if !self.full(1) {
                self.push(epoch, batch, handed_ns, now, What::BatchConsumed);
            }
        }
        now
    }

    /// A batch handed to the trainer, asked for at `asked_ns`: all of its events, or
    /// (the trace full) none.
    pub(super) fn handed(&mut self, epoch: u64, batch: u64, asked_ns: u64, built: Option<Box<Built>>) {
        let now = now_ns();
        let build = built.filter(|b| b.span.is_some());
        if self.full(2 + usize::from(build.is_some())) {
            return;
        }
        self.push(epoch, batch, asked_ns, now, What::BatchWait);
        self.push(epoch, batch, now, now, What::BatchHandedOver);
        self.handed = Some((epoch, batch, now));
        if let Some(b) = build {
            if let Some((start, end)) = b.span {
                self.builds.push(WorkerBuild {
                    worker_id: b.worker_id,
                    worker_addr: b.worker_addr,
                    worker_pid: b.worker_pid,
                    epoch,
                    batch,
                    built_start_ns: b.clock.to_client(start),
                    built_end_ns: b.clock.to_client(end),
                    received_ns: b.received_ns,
                    clock: b.clock,
                });
            }
        }
    }

    fn push(&mut self, epoch: u64, batch: u64, start_ns: u64, end_ns: u64, what: What) {
        let tid = current_tid();
        self.threads.entry(tid).or_insert_with(|| std::thread::current().name().unwrap_or("trainer").to_string());
        let dur_ns = end_ns.saturating_sub(start_ns);
        self.events.push(Event { start_ns, dur_ns, key: 0, batch, epoch, tid, what });
    }

    pub(super) fn finish(self) -> RemoteTrace {
        RemoteTrace {
            pid: std::process::id(),
            threads: self.threads,
            events: self.events,
            builds: self.builds,
            dropped: self.dropped,
        }
    }
}

/// Track ids are made from these tags and what names the track.
const CLIENT: u64 = 0xc11e;
const WORKER: u64 = 0x3073;
const RECEIVED: u64 = 0x2ec5;
const FLOW: u64 = 0xf10;

fn flow_of(epoch: u64, batch: u64) -> u64 {
    track_uuid(&[FLOW, epoch, batch])
}

/// Each worker's name and its builds' lanes (overlapping builds side by side).
fn workers(trace: &RemoteTrace) -> (BTreeMap<u32, String>, Vec<usize>) {
    let mut names = BTreeMap::new();
    let mut by_worker: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, b) in trace.builds.iter().enumerate() {
        names.entry(b.worker_pid).or_insert_with(|| format!("sluice worker {} ({})", b.worker_id, b.worker_addr));
        by_worker.entry(b.worker_pid).or_default().push(i);
    }
    let mut lane = vec![0; trace.builds.len()];
    for builds in by_worker.values_mut() {
        builds.sort_by_key(|&i| trace.builds[i].built_start_ns);
        let spans: Vec<_> =
            builds.iter().map(|&i| (trace.builds[i].built_start_ns, trace.builds[i].built_end_ns)).collect();
        for (&i, l) in builds.iter().zip(lanes(&spans)) {
            lane[i] = l;
        }
    }
    (names, lane)
}

impl RemoteTrace {
    /// The trace encoded in `format`.
    pub fn encode(&self, format: TraceFormat) -> Vec<u8> {
        match format {
            TraceFormat::Perfetto => self.perfetto(),
            TraceFormat::ChromeJson => self.chrome(),
        }
    }

    /// Writes the trace to `path`, in the format its extension names ([`TraceFormat::for_path`]).
    pub fn write(&self, path: &Path) -> Result<(), TraceError> {
        let bytes = self.encode(TraceFormat::for_path(path));
        std::fs::write(path, bytes).map_err(|source| TraceError::Write { path: path.to_path_buf(), source })
    }

    fn perfetto(&self) -> Vec<u8> {
        let seq = SeqId::TrustedPacketSequenceId(self.pid.max(1));
        let packet = |timestamp: Option<u64>, data: Data| TracePacket {
            timestamp,
            data: Some(data),
            optional_trusted_packet_sequence_id: Some(seq),
            sequence_flags: None,
        };
        let pid = u64::from(self.pid);
        let client = track_uuid(&[CLIENT, pid]);
        let received = track_uuid(&[CLIENT, pid, RECEIVED]);
        let process = |uuid: u64, pid: u32, name: String| TrackDescriptor {
            uuid: Some(uuid),
            process: Some(ProcessDescriptor { pid: Some(pid as i32), process_name: Some(name) }),
            ..Default::default()
        };
        let child = |uuid: u64, parent: u64, name: String| TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: Some(parent),
            static_or_dynamic_name: Some(StaticOrDynamicName::Name(name)),
            ..Default::default()
        };
        let mut packets = vec![TracePacket {
            sequence_flags: Some(SequenceFlags::SeqIncrementalStateCleared as u32),
            ..packet(None, Data::TrackDescriptor(process(client, self.pid, "sluice client".into())))
        }];
        for (&tid, name) in &self.threads {
            packets.push(packet(
                None,
                Data::TrackDescriptor(TrackDescriptor {
                    uuid: Some(track_uuid(&[CLIENT, pid, u64::from(tid)])),
                    thread: Some(ThreadDescriptor {
                        pid: Some(self.pid as i32),
                        tid: Some(i64::from(tid)),
                        thread_name: Some(name.clone()),
                    }),
                    ..Default::default()
                }),
            ));
        }
        packets.push(packet(None, Data::TrackDescriptor(child(received, client, "batches received".into()))));
        let (names, lane) = workers(self);
        for (&wpid, name) in &names {
            packets.push(packet(
                None,
                Data::TrackDescriptor(process(track_uuid(&[WORKER, u64::from(wpid)]), wpid, name.clone())),
            ));
        }
        let mut lanes_made = std::collections::BTreeSet::new();
        for (b, &l) in self.builds.iter().zip(&lane) {
            if lanes_made.insert((b.worker_pid, l)) {
                let parent = track_uuid(&[WORKER, u64::from(b.worker_pid)]);
                let uuid = track_uuid(&[WORKER, u64::from(b.worker_pid), l as u64]);
                packets.push(packet(None, Data::TrackDescriptor(child(uuid, parent, format!("batches built #{l}")))));
            }
        }

        // (timestamp, order at equal timestamps: ends first, then instants, then begins).
        let mut timed: Vec<(u64, u8, TrackEvent)> = Vec::new();
        let event = |name: &str, track: u64, annotations: Vec<DebugAnnotation>| TrackEvent {
            categories: vec!["sluice".to_string()],
            name_field: Some(EventName::Name(name.to_string())),
            r#type: Some(Type::SliceBegin as i32),
            track_uuid: Some(track),
            debug_annotations: annotations,
            ..Default::default()
        };
        let end = |track: u64| TrackEvent {
            r#type: Some(Type::SliceEnd as i32),
            track_uuid: Some(track),
            ..Default::default()
        };
        for (b, &l) in self.builds.iter().zip(&lane) {
            let track = track_uuid(&[WORKER, u64::from(b.worker_pid), l as u64]);
            let mut begin = event("batch_built", track, batch_annotations(b));
            begin.flow_ids.push(flow_of(b.epoch, b.batch));
            timed.push((b.built_start_ns, 2, begin));
            timed.push((b.built_end_ns, 0, end(track)));
            let mut got = event(
                "batch_received",
                received,
                vec![uint("batch", b.batch), uint("epoch", b.epoch), uint("worker_id", b.worker_id)],
            );
            got.r#type = Some(Type::Instant as i32);
            timed.push((b.received_ns, 1, got));
        }
        let built: std::collections::HashSet<(u64, u64)> = self.builds.iter().map(|b| (b.epoch, b.batch)).collect();
        for e in &self.events {
            let track = track_uuid(&[CLIENT, pid, u64::from(e.tid)]);
            let mut begin = event(e.what.name(&[]), track, vec![uint("batch", e.batch), uint("epoch", e.epoch)]);
            if e.what == What::BatchHandedOver && built.contains(&(e.epoch, e.batch)) {
                begin.terminating_flow_ids.push(flow_of(e.epoch, e.batch));
            }
            if e.dur_ns == 0 {
                begin.r#type = Some(Type::Instant as i32);
                timed.push((e.start_ns, 1, begin));
            } else {
                timed.push((e.start_ns, 2, begin));
                timed.push((e.start_ns + e.dur_ns, 0, end(track)));
            }
        }
        if self.dropped.events > 0 {
            let annotations = vec![uint("dropped", self.dropped.events), uint("max_events", MAX_TRACE_EVENTS as u64)];
            let mut mark = event(DROPPED_EVENT, client, annotations);
            mark.r#type = Some(Type::Instant as i32);
            timed.push((self.dropped.since_ns, 1, mark));
        }
        timed.sort_by_key(|(ts, order, _)| (*ts, *order));
        packets.extend(timed.into_iter().map(|(ts, _, ev)| packet(Some(ts), Data::TrackEvent(ev))));
        pb::Trace { packet: packets }.encode_to_vec()
    }

    fn chrome(&self) -> Vec<u8> {
        let us = |ns: u64| ns as f64 / 1e3;
        let mut out: Vec<Value> =
            vec![json!({"ph": "M", "name": "process_name", "pid": self.pid, "args": {"name": "sluice client"}})];
        for (tid, name) in &self.threads {
            out.push(json!({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid, "args": {"name": name}}));
        }
        let (names, lane) = workers(self);
        for (wpid, name) in &names {
            out.push(json!({"ph": "M", "name": "process_name", "pid": wpid, "args": {"name": name}}));
        }
        for (b, &l) in self.builds.iter().zip(&lane) {
            let flow = flow_of(b.epoch, b.batch);
            let args = json!({"batch": b.batch, "epoch": b.epoch, "worker_id": b.worker_id,
                              "clock_offset_ns": b.clock.offset_ns, "clock_error_ns": b.clock.bound_ns});
            out.push(json!({"ph": "X", "name": "batch_built", "cat": "sluice", "pid": b.worker_pid, "tid": l,
                            "ts": us(b.built_start_ns), "dur": us(b.built_end_ns - b.built_start_ns), "args": args}));
            out.push(json!({"ph": "s", "name": "batch", "cat": "sluice", "id": flow, "pid": b.worker_pid, "tid": l,
                            "ts": us(b.built_start_ns)}));
        }
        let built: std::collections::HashSet<(u64, u64)> = self.builds.iter().map(|b| (b.epoch, b.batch)).collect();
        for e in &self.events {
            let args = json!({"batch": e.batch, "epoch": e.epoch});
            let name = e.what.name(&[]);
            if e.dur_ns == 0 {
                out.push(json!({"ph": "i", "s": "t", "name": name, "cat": "sluice", "pid": self.pid, "tid": e.tid,
                                "ts": us(e.start_ns), "args": args}));
            } else {
                out.push(json!({"ph": "X", "name": name, "cat": "sluice", "pid": self.pid, "tid": e.tid,
                                "ts": us(e.start_ns), "dur": us(e.dur_ns), "args": args}));
            }
            if e.what == What::BatchHandedOver && built.contains(&(e.epoch, e.batch)) {
                out.push(
                    json!({"ph": "f", "bp": "e", "name": "batch", "cat": "sluice", "id": flow_of(e.epoch, e.batch),
                                "pid": self.pid, "tid": e.tid, "ts": us(e.start_ns)}),
                );
            }
        }
        if self.dropped.events > 0 {
            out.push(json!({"ph": "i", "s": "p", "name": DROPPED_EVENT, "cat": "sluice", "pid": self.pid, "tid": 0,
                            "ts": us(self.dropped.since_ns),
                            "args": {"dropped": self.dropped.events, "max_events": MAX_TRACE_EVENTS}}));
        }
        // Serializing a tree of plain values cannot fail.
        serde_json::to_vec(&json!({"traceEvents": out, "displayTimeUnit": "ns"})).unwrap_or_default()
    }
}

fn uint(name: &str, value: u64) -> DebugAnnotation {
    DebugAnnotation {
        name_field: Some(NameField::Name(name.to_string())),
        value: Some(AnnotationValue::UintValue(value)),
    }
}

fn batch_annotations(b: &WorkerBuild) -> Vec<DebugAnnotation> {
    vec![
        uint("batch", b.batch),
        uint("epoch", b.epoch),
        uint("worker_id", b.worker_id),
        DebugAnnotation {
            name_field: Some(NameField::Name("clock_offset_ns".to_string())),
            value: Some(AnnotationValue::IntValue(b.clock.offset_ns)),
        },
        uint("clock_error_ns", b.clock.bound_ns),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_full_recording_keeps_whole_batches_and_counts_what_it_leaves_out() {
        let mut r = Recording { cap: 7, ..Recording::default() };
        for batch in 0..4 {
            let asked = r.asked();
            r.handed(0, batch, asked, None);
        }
        r.asked();
        let t = r.finish();
        // Batches 0 and 1 (a wait and a hand-over each) and their `batch_consumed`: 6.
        // Batch 2's two would pass 7: batches 2 and 3 are left out whole.
        assert_eq!(t.events.len(), 6, "{:?}", t.events);
        assert!(t.events.iter().all(|e| e.batch < 2));
        assert_eq!(t.dropped.events, 4);
        let json: Value = serde_json::from_slice(&t.encode(TraceFormat::ChromeJson)).unwrap();
        let mark = json["traceEvents"].as_array().unwrap().iter().find(|e| e["name"] == DROPPED_EVENT).unwrap();
        assert_eq!(mark["args"]["dropped"], 4);
    }
}
