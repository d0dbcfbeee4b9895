//! The layout of a stream entry. A sample is an entry with the fields `id` (a u64, unique
//! per sample: the ledger's key), `label` (an i64) and `image` (the encoded JPEG or PNG
//! bytes). An entry with the field `end` marks the end of the stream.

use redis::streams::StreamId;
use redis::Value;

use crate::error::StreamError;

pub const FIELD_ID: &str = "id";
pub const FIELD_LABEL: &str = "label";
pub const FIELD_IMAGE: &str = "image";
pub const FIELD_END: &str = "end";

/// One sample as read from the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The broker's entry id (`<ms>-<seq>`), what XACK takes.
    pub entry: String,
    pub id: u64,
    pub label: i64,
    pub image: Vec<u8>,
}

/// What an entry holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Sample(Sample),
    End {
        entry: String,
    },
    /// Claimed or re-read after it was deleted from the stream (trimmed): nothing to train.
    Deleted {
        entry: String,
    },
}

impl Entry {
    /// Parses one entry of `stream`; a malformed one is an error naming the entry and field.
    pub fn parse(stream: &str, raw: &StreamId) -> Result<Entry, StreamError> {
        if raw.map.is_empty() {
            return Ok(Entry::Deleted { entry: raw.id.clone() });
        }
        if raw.map.contains_key(FIELD_END) {
            return Ok(Entry::End { entry: raw.id.clone() });
        }
        let bad = |field: &'static str, problem: String| StreamError::MalformedEntry {
            stream: stream.to_string(),
            entry: raw.id.clone(),
            field,
            problem,
        };
        let text = |field: &'static str| -> Result<String, StreamError> {
            let bytes = bytes_of(raw.map.get(field)).ok_or_else(|| bad(field, "is missing".into()))?;
            String::from_utf8(bytes.to_vec()).map_err(|_| bad(field, "is not UTF-8 text".into()))
        };
        let id_text = text(FIELD_ID)?;
        let id = id_text.trim().parse::<u64>().map_err(|_| bad(FIELD_ID, format!("`{id_text}` is not a u64")))?;
        let label_text = text(FIELD_LABEL)?;
        let label = label_text
            .trim()
            .parse::<i64>()
            .map_err(|_| bad(FIELD_LABEL, format!("`{label_text}` is not an integer")))?;
        let image = bytes_of(raw.map.get(FIELD_IMAGE)).ok_or_else(|| bad(FIELD_IMAGE, "is missing".into()))?;
        if image.is_empty() {
            return Err(bad(FIELD_IMAGE, "is empty".into()));
        }
        Ok(Entry::Sample(Sample { entry: raw.id.clone(), id, label, image: image.to_vec() }))
    }

    pub fn entry_id(&self) -> &str {
        match self {
            Entry::Sample(s) => &s.entry,
            Entry::End { entry } | Entry::Deleted { entry } => entry,
        }
    }
}

fn bytes_of(v: Option<&Value>) -> Option<&[u8]> {
    match v? {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn raw(fields: &[(&str, &[u8])]) -> StreamId {
        let map: HashMap<String, Value> =
            fields.iter().map(|(k, v)| (k.to_string(), Value::BulkString(v.to_vec()))).collect();
        StreamId { id: "17-0".into(), map }
    }

    #[test]
    fn a_sample_entry_parses_and_bad_ones_name_the_entry_and_field() {
        let ok = Entry::parse("s", &raw(&[("id", b"5"), ("label", b"-1"), ("image", b"\xff\xd8")])).ok();
        assert_eq!(ok, Some(Entry::Sample(Sample { entry: "17-0".into(), id: 5, label: -1, image: vec![0xff, 0xd8] })));
        let err = Entry::parse("s", &raw(&[("id", b"x5"), ("label", b"1"), ("image", b"a")])).err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(msg, "stream `s` entry 17-0: field `id` `x5` is not a u64");
        let err = Entry::parse("s", &raw(&[("id", b"1"), ("label", b"1")])).err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(msg, "stream `s` entry 17-0: field `image` is missing");
        assert_eq!(Entry::parse("s", &raw(&[("end", b"1")])).ok(), Some(Entry::End { entry: "17-0".into() }));
    }
}
