//! Stream entries as the broker sends them: a RESP reply to XREADGROUP (mode 0), or the
//! fields of one entry with values of any RESP type (mode 1), through `Entry::parse`.
//! Properties: nothing panics; a parsed sample has a non-empty image and keeps the
//! entry's id; a malformed entry's error names its entry.

#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use redis::streams::{StreamId, StreamReadReply};
use redis::{FromRedisValue, Value};
use sluice_stream::entry::Entry;
use sluice_stream::StreamError;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode % 2 == 0 {
        let Ok(value) = redis::parse_redis_value(rest) else { return };
        let Ok(reply) = StreamReadReply::from_redis_value(&value) else { return };
        for key in &reply.keys {
            for raw in &key.ids {
                check(raw);
            }
        }
    } else {
        check(&fields(rest));
    }
});

/// An entry of `name value` pairs: parts split at 0xFF, each value's first byte picks
/// its RESP type.
fn fields(data: &[u8]) -> StreamId {
    let mut parts = data.split(|&b| b == 0xFF);
    let id = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let mut map = HashMap::new();
    while let (Some(name), Some(value)) = (parts.next(), parts.next()) {
        let (kind, bytes) = value.split_first().map_or((0, &[][..]), |(k, v)| (*k, v));
        let value = match kind % 5 {
            0 => Value::BulkString(bytes.to_vec()),
            1 => Value::SimpleString(String::from_utf8_lossy(bytes).into_owned()),
            2 => Value::Int(bytes.iter().fold(0i64, |n, &b| n.wrapping_mul(31).wrapping_add(i64::from(b)))),
            3 => Value::Nil,
            _ => Value::Array(vec![Value::BulkString(bytes.to_vec())]),
        };
        map.insert(String::from_utf8_lossy(name).into_owned(), value);
    }
    StreamId { id, map }
}

fn check(raw: &StreamId) {
    match Entry::parse("fuzz", raw) {
        Ok(Entry::Sample(s)) => {
            assert!(!s.image.is_empty(), "a sample with an empty image");
            assert_eq!(s.entry, raw.id);
        }
        Ok(e) => assert_eq!(e.entry_id(), raw.id),
        Err(StreamError::MalformedEntry { entry, .. }) => assert_eq!(entry, raw.id),
        Err(e) => panic!("parsing an entry failed with an unexpected error: {e}"),
    }
}
