//! Merges the workers' own traces (`sluice worker --trace-dir`: every sample's ops) into a
//! client's trace (`RemoteLoader` with `trace=`: the trainer's events and each batch's
//! build on its worker), so one Perfetto timeline holds all of it. The client's trace
//! knows each worker's clock offset: its `batch_built` slices carry the offset of their
//! connection and its error bound. Every timestamp of a worker's file is moved into the
//! client's clock by that worker's offset with the least bound.
//!
//! A worker is known by its trace id (the pid of its process tracks, `BatchTrace.pid`), not
//! its OS pid, which is 1 in every container. Each file's packets get a packet sequence of
//! their own in the merged trace (Perfetto keeps a sequence's state apart from others').

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prost::Message;
use sluice_pipeline::trace::pb;
use sluice_pipeline::trace::pb::debug_annotation::{NameField, Value};
use sluice_pipeline::trace::pb::trace_packet::{Data, OptionalTrustedPacketSequenceId as SeqId};
use sluice_pipeline::trace::pb::track_event::NameField as EventName;
use sluice_pipeline::TraceError;

use sluice_client::ClockOffset;

/// One worker's file as merged: its process, the offset it was moved by, its packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedWorker {
    pub path: PathBuf,
    pub pid: i32,
    pub clock: ClockOffset,
    pub packets: usize,
}

/// Writes to `out` the client's trace with every worker file's packets moved into the
/// client's clock. Each worker must have built at least one of the client's batches.
pub fn merge_traces(client: &Path, workers: &[PathBuf], out: &Path) -> Result<Vec<MergedWorker>, TraceError> {
    let mut trace = read(client)?;
    let offsets = worker_offsets(&trace);
    for p in &mut trace.packet {
        p.optional_trusted_packet_sequence_id = Some(SeqId::TrustedPacketSequenceId(1));
    }
    let mut merged: Vec<MergedWorker> = Vec::with_capacity(workers.len());
    for (seq, path) in (2..).zip(workers) {
        let worker = read(path)?;
        let pid = process_pid(&worker)
            .ok_or_else(|| TraceError::Malformed { path: path.clone(), reason: "it has no process track".into() })?;
        if let Some(other) = merged.iter().find(|m| m.pid == pid) {
            return Err(TraceError::SameProcess { path: path.clone(), other: other.path.clone(), pid });
        }
        let clock = *offsets.get(&pid).ok_or_else(|| TraceError::Unaligned { path: path.clone(), pid })?;
        let packets = worker.packet.len();
        trace.packet.extend(worker.packet.into_iter().map(|mut p| {
            p.timestamp = p.timestamp.map(|ts| clock.to_client(ts));
            p.optional_trusted_packet_sequence_id = Some(SeqId::TrustedPacketSequenceId(seq));
            p
        }));
        merged.push(MergedWorker { path: path.clone(), pid, clock, packets });
    }
    std::fs::write(out, trace.encode_to_vec())
        .map_err(|source| TraceError::Write { path: out.to_path_buf(), source })?;
    Ok(merged)
}

fn read(path: &Path) -> Result<pb::Trace, TraceError> {
    let bytes = std::fs::read(path).map_err(|source| TraceError::Read { path: path.to_path_buf(), source })?;
    pb::Trace::decode(bytes.as_slice())
        .map_err(|e| TraceError::Malformed { path: path.to_path_buf(), reason: e.to_string() })
}

/// The pid of the first process track.
fn process_pid(trace: &pb::Trace) -> Option<i32> {
    trace.packet.iter().find_map(|p| match &p.data {
        Some(Data::TrackDescriptor(t)) => t.process.as_ref()?.pid,
        _ => None,
    })
}

/// Per worker (trace id), the offset with the least error bound among its `batch_built`
/// slices.
fn worker_offsets(trace: &pb::Trace) -> BTreeMap<i32, ClockOffset> {
    let (mut pid_of, mut parent) = (BTreeMap::new(), BTreeMap::new());
    let mut best: BTreeMap<i32, ClockOffset> = BTreeMap::new();
    for p in &trace.packet {
        match &p.data {
            Some(Data::TrackDescriptor(t)) => {
                if let (Some(uuid), Some(pid)) = (t.uuid, t.process.as_ref().and_then(|p| p.pid)) {
                    pid_of.insert(uuid, pid);
                }
                if let (Some(uuid), Some(up)) = (t.uuid, t.parent_uuid) {
                    parent.insert(uuid, up);
                }
            }
            Some(Data::TrackEvent(e)) if matches!(&e.name_field, Some(EventName::Name(n)) if n == "batch_built") => {
                let track = e.track_uuid.unwrap_or_default();
                let Some(&pid) = pid_of.get(parent.get(&track).unwrap_or(&track)) else { continue };
                let (mut offset_ns, mut bound_ns) = (None, None);
                for a in &e.debug_annotations {
                    match (&a.name_field, &a.value) {
                        (Some(NameField::Name(n)), Some(Value::IntValue(v))) if n == "clock_offset_ns" => {
                            offset_ns = Some(*v)
                        }
                        (Some(NameField::Name(n)), Some(Value::UintValue(v))) if n == "clock_error_ns" => {
                            bound_ns = Some(*v)
                        }
                        _ => {}
                    }
                }
                if let (Some(offset_ns), Some(bound_ns)) = (offset_ns, bound_ns) {
                    let clock = ClockOffset { offset_ns, bound_ns };
                    best.entry(pid)
                        .and_modify(|b| *b = if clock.bound_ns < b.bound_ns { clock } else { *b })
                        .or_insert(clock);
                }
            }
            _ => {}
        }
    }
    best
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pb::trace_packet::OptionalTrustedPacketSequenceId as SeqId;
    use pb::{DebugAnnotation, ProcessDescriptor, TracePacket, TrackDescriptor, TrackEvent};

    fn packet(timestamp: Option<u64>, seq: u32, data: Data) -> TracePacket {
        TracePacket {
            timestamp,
            data: Some(data),
            optional_trusted_packet_sequence_id: Some(SeqId::TrustedPacketSequenceId(seq)),
            sequence_flags: None,
        }
    }

    fn process(uuid: u64, pid: i32) -> Data {
        Data::TrackDescriptor(TrackDescriptor {
            uuid: Some(uuid),
            process: Some(ProcessDescriptor { pid: Some(pid), process_name: None }),
            ..Default::default()
        })
    }

    fn built(offset_ns: i64, bound_ns: u64) -> Data {
        let name = |n: &str| Some(NameField::Name(n.to_string()));
        Data::TrackEvent(TrackEvent {
            name_field: Some(EventName::Name("batch_built".into())),
            track_uuid: Some(3),
            debug_annotations: vec![
                DebugAnnotation { name_field: name("clock_offset_ns"), value: Some(Value::IntValue(offset_ns)) },
                DebugAnnotation { name_field: name("clock_error_ns"), value: Some(Value::UintValue(bound_ns)) },
            ],
            ..Default::default()
        })
    }

    fn write(path: &Path, packets: Vec<TracePacket>) {
        std::fs::write(path, pb::Trace { packet: packets }.encode_to_vec()).unwrap();
    }

    #[test]
    fn a_workers_events_move_into_the_clients_clock_by_its_least_uncertain_offset() {
        let dir = tempfile::tempdir().unwrap();
        let client = dir.path().join("client.pftrace");
        let lane = Data::TrackDescriptor(TrackDescriptor { uuid: Some(3), parent_uuid: Some(2), ..Default::default() });
        write(
            &client,
            vec![
                packet(None, 100, process(1, 100)),
                packet(None, 100, process(2, 200)),
                packet(None, 100, lane),
                packet(Some(10), 100, built(5_000_000_900, 1_000)),
                packet(Some(20), 100, built(5_000_000_300, 500)),
                packet(Some(30), 100, built(5_000_000_000, 800)),
            ],
        );
        let worker = dir.path().join("worker.pftrace");
        let op = Data::TrackEvent(TrackEvent { track_uuid: Some(7), ..Default::default() });
        write(&worker, vec![packet(None, 200, process(7, 200)), packet(Some(6_000_000_000), 200, op)]);
        let out = dir.path().join("merged.pftrace");

        let merged = merge_traces(&client, std::slice::from_ref(&worker), &out).unwrap();
        let clock = ClockOffset { offset_ns: 5_000_000_300, bound_ns: 500 };
        assert_eq!(merged, vec![MergedWorker { path: worker, pid: 200, clock, packets: 2 }]);
        let trace = read(&out).unwrap();
        assert_eq!(trace.packet.len(), 8, "the client's 6 packets, then the worker's 2");
        assert_eq!(trace.packet[7].timestamp, Some(999_999_700), "6 s in the worker's clock, less its offset");
        assert_eq!(trace.packet[3].timestamp, Some(10), "the client's own events stay put");
    }

    #[test]
    fn two_worker_files_of_one_process_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let client = dir.path().join("client.pftrace");
        let lane = Data::TrackDescriptor(TrackDescriptor { uuid: Some(3), parent_uuid: Some(2), ..Default::default() });
        write(&client, vec![packet(None, 1, process(2, 1)), packet(None, 1, lane), packet(Some(5), 1, built(0, 10))]);
        let (a, b) = (dir.path().join("a.pftrace"), dir.path().join("b.pftrace"));
        for w in [&a, &b] {
            write(w, vec![packet(None, 1, process(7, 1))]);
        }
        let out = dir.path().join("merged.pftrace");

        let e = merge_traces(&client, &[a, b], &out).unwrap_err();
        assert!(matches!(e, TraceError::SameProcess { pid: 1, .. }), "{e}");
        assert!(e.to_string().contains("a.pftrace") && e.to_string().contains("b.pftrace"), "{e}");
        assert!(!out.exists(), "nothing written on a failed merge");
    }

    #[test]
    fn a_worker_that_built_none_of_the_batches_or_a_file_that_is_no_trace_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let client = dir.path().join("client.pftrace");
        write(&client, vec![packet(None, 100, process(1, 100))]);
        let stranger = dir.path().join("stranger.pftrace");
        write(&stranger, vec![packet(None, 300, process(9, 300))]);
        let garbage = dir.path().join("garbage.pftrace");
        std::fs::write(&garbage, [0xff; 16]).unwrap();
        let out = dir.path().join("merged.pftrace");

        let e = merge_traces(&client, &[stranger], &out).unwrap_err();
        assert!(matches!(e, TraceError::Unaligned { pid: 300, .. }), "{e}");
        assert!(e.to_string().contains("stranger.pftrace"), "{e}");
        let e = merge_traces(&client, &[garbage], &out).unwrap_err();
        assert!(matches!(e, TraceError::Malformed { .. }) && e.to_string().contains("garbage.pftrace"), "{e}");
        let e = merge_traces(&dir.path().join("missing.pftrace"), &[], &out).unwrap_err();
        assert!(matches!(e, TraceError::Read { .. }), "{e}");
        assert!(!out.exists(), "nothing written on a failed merge");
    }
}
