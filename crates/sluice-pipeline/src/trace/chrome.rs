//! Chrome's trace event JSON (`chrome://tracing`, Perfetto's legacy importer): complete
//! (`X`) events in µs, instants, thread names, and a flow from each batch's preprocessing
//! to its hand-over. Larger than the protobuf and size-limited in the UIs: for short runs.

use serde_json::{json, Value};

use super::{flow_id, lanes, TraceData, What, DROPPED_EVENT, MAX_TRACE_EVENTS};

/// Lane pseudo-threads get ids above any real thread id.
const LANE_TID_BASE: u64 = 1 << 32;

pub(super) fn encode(trace: &TraceData) -> Vec<u8> {
    let pid = trace.pid;
    let mut out: Vec<Value> =
        vec![json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": trace.process}})];
    for (tid, name) in &trace.threads {
        out.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}));
    }
    let batches: Vec<_> = trace.events.iter().filter(|e| e.what == What::BatchPreprocessed).collect();
    let lane_of = lanes(&batches.iter().map(|e| (e.start_ns, e.start_ns + e.dur_ns)).collect::<Vec<_>>());
    for lane in 0..lane_of.iter().max().map_or(0, |m| m + 1) {
        let tid = LANE_TID_BASE + lane as u64;
        out.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": format!("batches in flight #{lane}")}}));
    }
    let mut lane_iter = lane_of.into_iter();
    let us = |ns: u64| ns as f64 / 1e3;
    for e in &trace.events {
        let tid = match e.what {
            What::BatchPreprocessed => LANE_TID_BASE + lane_iter.next().unwrap_or(0) as u64,
            _ => u64::from(e.tid),
        };
        let name = e.what.name(&trace.ops);
        let args = if e.what.has_key() {
            json!({"key": e.key, "batch": e.batch, "epoch": e.epoch})
        } else {
            json!({"batch": e.batch, "epoch": e.epoch})
        };
        let flow = flow_id(pid, e.epoch, e.batch);
        if e.dur_ns == 0 {
            out.push(json!({"ph": "i", "s": "t", "name": name, "cat": "sluice", "pid": pid, "tid": tid,
                            "ts": us(e.start_ns), "args": args}));
        } else {
            out.push(json!({"ph": "X", "name": name, "cat": "sluice", "pid": pid, "tid": tid,
                            "ts": us(e.start_ns), "dur": us(e.dur_ns), "args": args}));
        }
        match e.what {
            What::BatchPreprocessed => out.push(json!({"ph": "s", "name": "batch", "cat": "sluice", "id": flow,
                                                       "pid": pid, "tid": tid, "ts": us(e.start_ns)})),
            What::BatchHandedOver => out.push(json!({"ph": "f", "bp": "e", "name": "batch", "cat": "sluice",
                                                     "id": flow, "pid": pid, "tid": tid, "ts": us(e.start_ns)})),
            _ => {}
        }
    }
    if trace.dropped.events > 0 {
        out.push(json!({"ph": "i", "s": "p", "name": DROPPED_EVENT, "cat": "sluice", "pid": pid, "tid": 0,
                        "ts": us(trace.dropped.since_ns),
                        "args": {"dropped": trace.dropped.events, "max_events": MAX_TRACE_EVENTS}}));
    }
    // Serializing a tree of plain values cannot fail.
    serde_json::to_vec(&json!({"traceEvents": out, "displayTimeUnit": "ns"})).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use super::*;
    use crate::trace::{Dropped, Event};

    #[test]
    fn ops_are_complete_events_in_microseconds_with_their_sample_key() {
        let trace = TraceData {
            pid: 7,
            process: "p".into(),
            ops: vec!["read".into()],
            threads: BTreeMap::from([(5, "sluice-worker".to_string())]),
            events: vec![Event {
                start_ns: 2_000,
                dur_ns: 1_500,
                key: 9,
                batch: 1,
                epoch: 0,
                tid: 5,
                what: What::Op(0),
            }],
            dropped: Default::default(),
        };
        let v: Value = serde_json::from_slice(&encode(&trace)).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let read = events.iter().find(|e| e["name"] == "read").unwrap();
        assert_eq!((read["ph"].as_str(), read["ts"].as_f64(), read["dur"].as_f64()), (Some("X"), Some(2.0), Some(1.5)));
        assert_eq!((read["tid"].as_u64(), read["args"]["key"].as_u64()), (Some(5), Some(9)));
        assert!(events.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == "sluice-worker"));
        assert!(events.iter().all(|e| e["name"] != DROPPED_EVENT), "nothing was dropped");

        // A trace that filled up marks where, with the count.
        let full = TraceData { dropped: Dropped { events: 12, since_ns: 5_000 }, ..trace };
        let v: Value = serde_json::from_slice(&encode(&full)).unwrap();
        let mark = v["traceEvents"].as_array().unwrap().iter().find(|e| e["name"] == DROPPED_EVENT).unwrap();
        assert_eq!(
            (mark["ph"].as_str(), mark["ts"].as_f64(), mark["args"]["dropped"].as_u64()),
            (Some("i"), Some(5.0), Some(12))
        );
    }
}
