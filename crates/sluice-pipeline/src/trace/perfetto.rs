//! Perfetto's protobuf trace format: one track per thread (and one per lane of batches in
//! flight), each event a begin/end pair of `TrackEvent`s with its sample key, batch and
//! epoch attached, and a flow from each batch's preprocessing to its hand-over. Opens in
//! the Perfetto UI (ui.perfetto.dev) with no size limit to speak of.

use prost::Message;

use super::{flow_id, lanes, track_uuid, TraceData, What, DROPPED_EVENT, MAX_TRACE_EVENTS};

/// The messages, generated from the vendored `proto/perfetto_trace.proto`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}

use pb::debug_annotation::{NameField, Value};
use pb::trace_packet::{Data, OptionalTrustedPacketSequenceId as SeqId};
use pb::track_event::{NameField as EventName, Type};
use pb::{DebugAnnotation, ProcessDescriptor, ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent};

/// Lane tracks are named by this tag, the pid and the lane.
const LANE_TAG: u64 = 0xba7c;

pub(super) fn encode(trace: &TraceData) -> Vec<u8> {
    let seq = SeqId::TrustedPacketSequenceId(trace.pid.max(1));
    let process_uuid = track_uuid(&[u64::from(trace.pid)]);
    let packet = |timestamp: Option<u64>, data: Data| TracePacket {
        timestamp,
        data: Some(data),
        optional_trusted_packet_sequence_id: Some(seq),
        sequence_flags: None,
    };
    let mut packets = vec![TracePacket {
        sequence_flags: Some(pb::trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32),
        ..packet(
            None,
            Data::TrackDescriptor(TrackDescriptor {
                uuid: Some(process_uuid),
                process: Some(ProcessDescriptor {
                    pid: Some(trace.pid as i32),
                    process_name: Some(trace.process.clone()),
                }),
                ..Default::default()
            }),
        )
    }];
    for (&tid, name) in &trace.threads {
        packets.push(packet(
            None,
            Data::TrackDescriptor(TrackDescriptor {
                uuid: Some(track_uuid(&[u64::from(trace.pid), u64::from(tid)])),
                thread: Some(ThreadDescriptor {
                    pid: Some(trace.pid as i32),
                    tid: Some(i64::from(tid)),
                    thread_name: Some(name.clone()),
                }),
                ..Default::default()
            }),
        ));
    }
    let batches: Vec<_> = trace.events.iter().filter(|e| e.what == What::BatchPreprocessed).collect();
    let lane_of = lanes(&batches.iter().map(|e| (e.start_ns, e.start_ns + e.dur_ns)).collect::<Vec<_>>());
    let lane_uuid = |lane: usize| track_uuid(&[u64::from(trace.pid), LANE_TAG, lane as u64]);
    for lane in 0..lane_of.iter().max().map_or(0, |m| m + 1) {
        packets.push(packet(
            None,
            Data::TrackDescriptor(TrackDescriptor {
                uuid: Some(lane_uuid(lane)),
                parent_uuid: Some(process_uuid),
                static_or_dynamic_name: Some(pb::track_descriptor::StaticOrDynamicName::Name(format!(
                    "batches in flight #{lane}"
                ))),
                ..Default::default()
            }),
        ));
    }

    // (timestamp, order at equal timestamps: ends first, then instants, then begins).
    let mut timed: Vec<(u64, u8, TrackEvent)> = Vec::with_capacity(trace.events.len() * 2);
    let mut lane_iter = lane_of.into_iter();
    for e in &trace.events {
        let track = match e.what {
            What::BatchPreprocessed => lane_uuid(lane_iter.next().unwrap_or(0)),
            _ => track_uuid(&[u64::from(trace.pid), u64::from(e.tid)]),
        };
        let mut annotations = Vec::with_capacity(3);
        if e.what.has_key() {
            annotations.push(uint_annotation("key", e.key));
        }
        annotations.push(uint_annotation("batch", e.batch));
        annotations.push(uint_annotation("epoch", e.epoch));
        let flow = flow_id(trace.pid, e.epoch, e.batch);
        let mut begin = TrackEvent {
            categories: vec!["sluice".to_string()],
            name_field: Some(EventName::Name(e.what.name(&trace.ops).to_string())),
            r#type: Some(Type::SliceBegin as i32),
            track_uuid: Some(track),
            debug_annotations: annotations,
            ..Default::default()
        };
        match e.what {
            What::BatchPreprocessed => begin.flow_ids.push(flow),
            What::BatchHandedOver => begin.terminating_flow_ids.push(flow),
            _ => {}
        }
        if e.dur_ns == 0 {
            begin.r#type = Some(Type::Instant as i32);
            timed.push((e.start_ns, 1, begin));
            continue;
        }
        let end = TrackEvent { r#type: Some(Type::SliceEnd as i32), track_uuid: Some(track), ..Default::default() };
        timed.push((e.start_ns, 2, begin));
        timed.push((e.start_ns + e.dur_ns, 0, end));
    }
    if trace.dropped.events > 0 {
        // Where the trace stops holding every event, on the process's track.
        timed.push((
            trace.dropped.since_ns,
            1,
            TrackEvent {
                categories: vec!["sluice".to_string()],
                name_field: Some(EventName::Name(DROPPED_EVENT.to_string())),
                r#type: Some(Type::Instant as i32),
                track_uuid: Some(process_uuid),
                debug_annotations: vec![
                    uint_annotation("dropped", trace.dropped.events),
                    uint_annotation("max_events", MAX_TRACE_EVENTS as u64),
                ],
                ..Default::default()
            },
        ));
    }
    timed.sort_by_key(|(ts, order, _)| (*ts, *order));
    packets.extend(timed.into_iter().map(|(ts, _, ev)| packet(Some(ts), Data::TrackEvent(ev))));
    pb::Trace { packet: packets }.encode_to_vec()
}

fn uint_annotation(name: &str, value: u64) -> DebugAnnotation {
    DebugAnnotation { name_field: Some(NameField::Name(name.to_string())), value: Some(Value::UintValue(value)) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use super::*;
    use crate::trace::{Dropped, Event};

    fn event(what: What, start_ns: u64, dur_ns: u64, tid: u32) -> Event {
        Event { start_ns, dur_ns, key: 42, batch: 3, epoch: 1, tid, what }
    }

    #[test]
    fn events_become_begin_end_pairs_on_their_threads_track_with_a_flow_per_batch() {
        let trace = TraceData {
            pid: 99,
            process: "p".into(),
            ops: vec!["read".into(), "decode".into()],
            threads: BTreeMap::from([(5, "sluice-worker".to_string()), (6, "main".to_string())]),
            events: vec![
                event(What::BatchPreprocessed, 100, 500, 6),
                event(What::Op(0), 100, 40, 5),
                event(What::Op(1), 140, 60, 5),
                event(What::BatchHandedOver, 600, 0, 6),
            ],
            dropped: Default::default(),
        };
        let decoded = pb::Trace::decode(encode(&trace).as_slice()).unwrap();
        let events: Vec<(u64, TrackEvent)> = decoded
            .packet
            .iter()
            .filter_map(|p| match &p.data {
                Some(Data::TrackEvent(e)) => Some((p.timestamp.unwrap(), e.clone())),
                _ => None,
            })
            .collect();
        let kinds: Vec<(u64, i32)> = events.iter().map(|(t, e)| (*t, e.r#type.unwrap())).collect();
        let (b, e, i) = (Type::SliceBegin as i32, Type::SliceEnd as i32, Type::Instant as i32);
        assert_eq!(kinds, vec![(100, b), (100, b), (140, e), (140, b), (200, e), (600, e), (600, i)]);
        let worker = track_uuid(&[99, 5]);
        let decode = events.iter().find(|(_, e)| e.name_field == Some(EventName::Name("decode".into()))).unwrap();
        assert_eq!(decode.1.track_uuid, Some(worker));
        assert!(decode.1.debug_annotations.contains(&uint_annotation("key", 42)));
        let starts = events.iter().find(|(_, e)| !e.flow_ids.is_empty()).unwrap();
        let ends = events.iter().find(|(_, e)| !e.terminating_flow_ids.is_empty()).unwrap();
        assert_eq!(starts.1.flow_ids, ends.1.terminating_flow_ids);
        assert_ne!(starts.1.track_uuid, ends.1.track_uuid, "the batch span sits on its own lane track");

        // A trace that filled up marks where, on the process's track.
        let full = TraceData { dropped: Dropped { events: 12, since_ns: 150 }, ..trace };
        let decoded = pb::Trace::decode(encode(&full).as_slice()).unwrap();
        let mark = decoded
            .packet
            .iter()
            .find_map(|p| match &p.data {
                Some(Data::TrackEvent(e)) if e.name_field == Some(EventName::Name(DROPPED_EVENT.into())) => {
                    Some((p.timestamp, e.clone()))
                }
                _ => None,
            })
            .unwrap();
        assert_eq!((mark.0, mark.1.track_uuid), (Some(150), Some(track_uuid(&[99]))));
        assert!(mark.1.debug_annotations.contains(&uint_annotation("dropped", 12)));
    }
}
