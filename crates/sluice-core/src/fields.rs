//! Metadata fields: the named values a sample carries besides its image, label, boxes and
//! mask (a float score, an integer id, a multi-label vector, a caption, any JSON). The spec
//! names each field and its kind ([`FieldSpec`]); a source reads them once, at
//! enumeration, into the manifest's [`FieldTable`] (one column per field, so a spec without
//! fields pays nothing), and the loader copies each batch's rows out of it by sample
//! position ([`BatchFields`]). Fields do not change under the ops, so they pass through
//! neither the ops nor the cache.
//!
//! A value that is missing or of the wrong kind fails its sample when loaded (under
//! `on_error`), naming the field and what was found.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

/// Most classes a `multi_label` field may have: a multi-hot row is `classes` f32s.
pub const MAX_FIELD_CLASSES: u64 = 1 << 20;
/// Most fields one spec may ask for.
pub const MAX_FIELDS: usize = 256;
/// Names a field may not take: the batch's own entries.
pub const RESERVED_FIELD_NAMES: [&str; 8] =
    ["image", "label", "key", "weight", "boxes", "box_labels", "box_count", "masks"];

/// What a field holds, and so how a batch carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldKindName {
    /// A number, carried as f32 `[n]`.
    Float,
    /// An integer, carried as i64 `[n]`.
    Int,
    /// A list of class indices in `0..classes`, carried multi-hot as f32 `[n, classes]`
    /// (1.0 where the sample has the class: the target `BCEWithLogitsLoss` takes).
    MultiLabel,
    /// A string (a caption, an id), carried as a list of strings.
    Text,
    /// Any JSON value, carried as a list of its compact JSON texts.
    Json,
}

/// One field a spec asks for: `{ name = "tags", kind = "multi_label", classes = 80 }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    pub name: String,
    pub kind: FieldKindName,
    /// The number of classes of a `multi_label` field (and of no other kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<u64>,
}

impl FieldSpec {
    /// Checks one field (the `at`th of the spec's `fields`): a usable name, classes where
    /// (and only where) the kind takes them. Returns the field path and what is wrong.
    pub fn check(&self, at: usize) -> Result<(), (String, String)> {
        let path = |what: &str| format!("fields[{at}].{what}");
        let ok_name = (1..=64).contains(&self.name.len())
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !self.name.starts_with(|c: char| c.is_ascii_digit());
        if !ok_name {
            return Err((
                path("name"),
                format!("{:?}: a name is 1 to 64 letters, digits or `_`, not starting with a digit", self.name),
            ));
        }
        if RESERVED_FIELD_NAMES.contains(&self.name.as_str()) {
            return Err((path("name"), format!("`{}` is a batch entry of its own; choose another name", self.name)));
        }
        match (self.kind, self.classes) {
            (FieldKindName::MultiLabel, None) => {
                Err((path("classes"), "a multi_label field needs `classes` (how many there are)".into()))
            }
            (FieldKindName::MultiLabel, Some(c)) if c == 0 || c > MAX_FIELD_CLASSES => {
                Err((path("classes"), format!("must be in 1..={MAX_FIELD_CLASSES}; got {c}")))
            }
            (FieldKindName::MultiLabel, Some(_)) | (_, None) => Ok(()),
            (_, Some(_)) => Err((path("classes"), "only a multi_label field has classes".into())),
        }
    }

    /// Reads this field's value out of a sample's JSON (`None`: the key is absent), within
    /// `max_bytes` for text and JSON; on error, says what was found.
    pub fn read(&self, value: Option<&Value>, max_bytes: u64) -> Result<FieldValue, String> {
        let name = &self.name;
        let value = match value {
            None | Some(Value::Null) => return Err(format!("field `{name}` is missing")),
            Some(v) => v,
        };
        let wrong = |want: &str| format!("field `{name}`: expected {want}, found {}", describe(value));
        let too_long =
            |len: usize| format!("field `{name}`: {len} bytes, over the limit of {max_bytes} (limits.max_field_bytes)");
        match self.kind {
            FieldKindName::Float => match value.as_f64() {
                Some(v) if v.is_finite() && (v as f32).is_finite() => Ok(FieldValue::Float(v as f32)),
                Some(_) => Err(wrong("a finite float32 number")),
                None => Err(wrong("a number")),
            },
            FieldKindName::Int => value.as_i64().map(FieldValue::Int).ok_or_else(|| wrong("an integer (int64)")),
            FieldKindName::MultiLabel => {
                let classes = self.classes.unwrap_or(0);
                let Some(items) = value.as_array() else { return Err(wrong("a list of class indices")) };
                let mut out = Vec::with_capacity(items.len().min(classes as usize));
                for (i, item) in items.iter().enumerate() {
                    match item.as_u64() {
                        Some(c) if c < classes => out.push(c as u32),
                        Some(c) => {
                            return Err(format!("field `{name}`: class {c} (item {i}) is not in 0..{classes}"));
                        }
                        None => {
                            return Err(format!("field `{name}`: item {i} is {}, not a class index", describe(item)))
                        }
                    }
                }
                out.sort_unstable();
                out.dedup();
                Ok(FieldValue::Classes(out))
            }
            FieldKindName::Text => match value.as_str() {
                Some(s) if s.len() as u64 > max_bytes => Err(too_long(s.len())),
                Some(s) => Ok(FieldValue::Text(s.to_string())),
                None => Err(wrong("a string")),
            },
            FieldKindName::Json => {
                let text = value.to_string();
                if text.len() as u64 > max_bytes {
                    return Err(too_long(text.len()));
                }
                Ok(FieldValue::Text(text))
            }
        }
    }
}

/// What a value is, for an error: its JSON type and a short excerpt.
fn describe(v: &Value) -> String {
    let kind = match v {
        Value::Null => return "null".into(),
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    let mut text = v.to_string();
    if text.len() > 40 {
        let mut cut = 40;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    format!("{kind} {text}")
}

/// One sample's value of one field, as read.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Float(f32),
    Int(i64),
    /// A multi-label field's classes, sorted and without repeats.
    Classes(Vec<u32>),
    /// A text field's string, or a JSON field's compact text.
    Text(String),
}

/// One field's values over the whole manifest (a column).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FieldColumn {
    Float(Vec<f32>),
    Int(Vec<i64>),
    /// Row `i`'s classes are `classes[offsets[i]..offsets[i + 1]]`.
    Classes {
        offsets: Vec<u64>,
        classes: Vec<u32>,
    },
    Text(Vec<String>),
}

impl FieldColumn {
    fn new(kind: FieldKindName) -> Self {
        match kind {
            FieldKindName::Float => Self::Float(Vec::new()),
            FieldKindName::Int => Self::Int(Vec::new()),
            FieldKindName::MultiLabel => Self::Classes { offsets: vec![0], classes: Vec::new() },
            FieldKindName::Text | FieldKindName::Json => Self::Text(Vec::new()),
        }
    }

    /// Appends a row; a value of another kind (or none) appends the column's empty value.
    fn push(&mut self, value: Option<FieldValue>) {
        match (self, value) {
            (Self::Float(c), v) => c.push(if let Some(FieldValue::Float(x)) = v { x } else { 0.0 }),
            (Self::Int(c), v) => c.push(if let Some(FieldValue::Int(x)) = v { x } else { 0 }),
            (Self::Classes { offsets, classes }, v) => {
                if let Some(FieldValue::Classes(x)) = v {
                    classes.extend(x);
                }
                offsets.push(classes.len() as u64);
            }
            (Self::Text(c), v) => c.push(if let Some(FieldValue::Text(x)) = v { x } else { String::new() }),
        }
    }

    fn hash_into(&self, h: &mut Xxh3) {
        match self {
            Self::Float(c) => c.iter().for_each(|v| h.update(&v.to_le_bytes())),
            Self::Int(c) => c.iter().for_each(|v| h.update(&v.to_le_bytes())),
            Self::Classes { offsets, classes } => {
                offsets.iter().for_each(|v| h.update(&v.to_le_bytes()));
                classes.iter().for_each(|v| h.update(&v.to_le_bytes()));
            }
            Self::Text(c) => c.iter().for_each(|s| {
                h.update(&(s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }),
        }
    }
}

/// Every sample's fields, column by column, as a source read them; a sample whose fields
/// could not be read has empty values and its reason in `invalid`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldTable {
    pub specs: Vec<FieldSpec>,
    pub columns: Vec<FieldColumn>,
    /// Why a sample's fields cannot be used, by position (sorted).
    pub invalid: Vec<(u64, String)>,
    rows: u64,
}

impl FieldTable {
    /// An empty table of the fields `specs` names.
    pub fn new(specs: &[FieldSpec]) -> Self {
        Self {
            specs: specs.to_vec(),
            columns: specs.iter().map(|s| FieldColumn::new(s.kind)).collect(),
            invalid: Vec::new(),
            rows: 0,
        }
    }

    /// Appends the next sample's fields read from `object` (a sidecar's top-level keys),
    /// or records why they cannot be (a missing or mistyped value: the first one found).
    pub fn push_json(&mut self, object: Option<&serde_json::Map<String, Value>>, max_bytes: u64) {
        let read: Result<Vec<FieldValue>, String> =
            self.specs.iter().map(|s| s.read(object.and_then(|o| o.get(&s.name)), max_bytes)).collect();
        self.push(read);
    }

    /// Appends the next sample's values (one per field, in spec order), or why it has none.
    pub fn push(&mut self, read: Result<Vec<FieldValue>, String>) {
        match read {
            Ok(values) => {
                let mut values = values.into_iter();
                for c in &mut self.columns {
                    c.push(values.next());
                }
            }
            Err(why) => {
                self.invalid.push((self.rows, why));
                for c in &mut self.columns {
                    c.push(None);
                }
            }
        }
        self.rows += 1;
    }

    /// Appends a sample that has no fields at all for `why` (its sidecar is unreadable).
    pub fn push_invalid(&mut self, why: String) {
        self.push(Err(why));
    }

    /// Appends the rows of `other`, a table of the same fields (a mix's next source), after
    /// this one's; its invalid positions move with them.
    pub fn append(&mut self, other: FieldTable) {
        let (base, rows) = (self.rows, other.rows);
        for (mine, theirs) in self.columns.iter_mut().zip(other.columns) {
            match (mine, theirs) {
                (FieldColumn::Float(a), FieldColumn::Float(b)) => a.extend(b),
                (FieldColumn::Int(a), FieldColumn::Int(b)) => a.extend(b),
                (FieldColumn::Text(a), FieldColumn::Text(b)) => a.extend(b),
                (FieldColumn::Classes { offsets, classes }, FieldColumn::Classes { offsets: more, classes: extra }) => {
                    let shift = classes.len() as u64;
                    classes.extend(extra);
                    offsets.extend(more.iter().skip(1).map(|o| o + shift));
                }
                // Another kind (not a table of the same fields): empty values, row for row.
                (mine, _) => (0..rows).for_each(|_| mine.push(None)),
            }
        }
        self.invalid.extend(other.invalid.into_iter().map(|(p, why)| (p + base, why)));
        self.rows += rows;
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Why the sample at `pos` has no usable fields, if it has none.
    pub fn invalid(&self, pos: u64) -> Option<&str> {
        self.invalid.binary_search_by_key(&pos, |(p, _)| *p).ok().map(|i| self.invalid[i].1.as_str())
    }

    /// The rows at positions `rows`, in that order, as a batch carries them.
    pub fn gather(&self, rows: &[u64]) -> BatchFields {
        let fields = self
            .specs
            .iter()
            .zip(&self.columns)
            .map(|(spec, column)| {
                let at = |p: u64| usize::try_from(p).unwrap_or(usize::MAX);
                let values = match column {
                    FieldColumn::Float(c) => {
                        FieldValues::Float(rows.iter().map(|&p| c.get(at(p)).copied().unwrap_or(0.0)).collect())
                    }
                    FieldColumn::Int(c) => {
                        FieldValues::Int(rows.iter().map(|&p| c.get(at(p)).copied().unwrap_or(0)).collect())
                    }
                    FieldColumn::Classes { offsets, classes } => {
                        let n = spec.classes.unwrap_or(0) as usize;
                        let mut hot = vec![0f32; rows.len() * n];
                        for (i, &p) in rows.iter().enumerate() {
                            let (Some(&a), Some(&b)) = (offsets.get(at(p)), offsets.get(at(p).saturating_add(1)))
                            else {
                                continue;
                            };
                            for &c in classes.get(at(a)..at(b)).unwrap_or(&[]) {
                                if let Some(x) = hot.get_mut(i * n + c as usize) {
                                    *x = 1.0;
                                }
                            }
                        }
                        FieldValues::MultiHot { classes: n, values: hot }
                    }
                    FieldColumn::Text(c) => {
                        let texts = rows.iter().map(|&p| c.get(at(p)).cloned().unwrap_or_default()).collect();
                        match spec.kind {
                            FieldKindName::Json => FieldValues::Json(texts),
                            _ => FieldValues::Text(texts),
                        }
                    }
                };
                BatchField { name: spec.name.clone(), values }
            })
            .collect();
        BatchFields { fields }
    }

    /// Feeds the table to a hash (the manifest's fingerprint).
    pub(crate) fn hash_into(&self, h: &mut Xxh3) {
        h.update(b"fields");
        // serde_json of these plain types cannot fail; an empty hash input is still a hash.
        h.update(serde_json::to_string(&self.specs).unwrap_or_default().as_bytes());
        for c in &self.columns {
            c.hash_into(h);
        }
        for (p, why) in &self.invalid {
            h.update(&p.to_le_bytes());
            h.update(why.as_bytes());
        }
    }
}

/// One field of a batch: its name and a value per sample.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchField {
    pub name: String,
    pub values: FieldValues,
}

/// A batch's values of one field.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValues {
    /// f32 `[n]`.
    Float(Vec<f32>),
    /// i64 `[n]`.
    Int(Vec<i64>),
    /// Multi-hot f32 `[n, classes]`, row-major.
    MultiHot { classes: usize, values: Vec<f32> },
    /// A string per sample.
    Text(Vec<String>),
    /// A compact JSON text per sample.
    Json(Vec<String>),
}

/// A batch's fields, in the spec's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchFields {
    pub fields: Vec<BatchField>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test fixtures: a failed setup is a failed test

    use super::*;

    fn spec(name: &str, kind: FieldKindName, classes: Option<u64>) -> FieldSpec {
        FieldSpec { name: name.into(), kind, classes }
    }

    #[test]
    fn values_read_by_kind_or_say_what_was_found() {
        let v: Value = serde_json::json!({"s": 0.5, "i": 7, "t": [3, 1, 3], "c": "a cat", "j": {"a": [1]}});
        let o = v.as_object().unwrap();
        assert_eq!(spec("s", FieldKindName::Float, None).read(o.get("s"), 10), Ok(FieldValue::Float(0.5)));
        assert_eq!(spec("i", FieldKindName::Int, None).read(o.get("i"), 10), Ok(FieldValue::Int(7)));
        let tags = spec("t", FieldKindName::MultiLabel, Some(4));
        assert_eq!(tags.read(o.get("t"), 10), Ok(FieldValue::Classes(vec![1, 3])));
        assert_eq!(spec("c", FieldKindName::Text, None).read(o.get("c"), 10), Ok(FieldValue::Text("a cat".into())));
        let j = spec("j", FieldKindName::Json, None).read(o.get("j"), 100);
        assert_eq!(j, Ok(FieldValue::Text(r#"{"a":[1]}"#.into())));

        let e = spec("c", FieldKindName::Float, None).read(o.get("c"), 10).unwrap_err();
        assert_eq!(e, "field `c`: expected a number, found a string \"a cat\"");
        let e = spec("s", FieldKindName::Int, None).read(o.get("s"), 10).unwrap_err();
        assert!(e.contains("expected an integer") && e.contains("0.5"), "{e}");
        assert!(spec("t", FieldKindName::MultiLabel, Some(3)).read(o.get("t"), 10).unwrap_err().contains("class 3"));
        assert!(spec("x", FieldKindName::Int, None).read(None, 10).unwrap_err().contains("`x` is missing"));
        let e = spec("c", FieldKindName::Text, None).read(o.get("c"), 3).unwrap_err();
        assert!(e.contains("limits.max_field_bytes"), "{e}");
        let big = Value::from(1e300);
        assert!(spec("s", FieldKindName::Float, None).read(Some(&big), 10).unwrap_err().contains("finite"));
    }

    #[test]
    fn specs_refuse_absurd_names_and_classes_naming_the_path() {
        assert!(spec("tags", FieldKindName::MultiLabel, Some(80)).check(0).is_ok());
        for (bad, path) in [
            (spec("tags", FieldKindName::MultiLabel, Some(0)), "fields[2].classes"),
            (spec("tags", FieldKindName::MultiLabel, Some(1_000_000_000)), "fields[2].classes"),
            (spec("tags", FieldKindName::MultiLabel, None), "fields[2].classes"),
            (spec("score", FieldKindName::Float, Some(3)), "fields[2].classes"),
            (spec("boxes", FieldKindName::Json, None), "fields[2].name"),
            (spec("", FieldKindName::Json, None), "fields[2].name"),
            (spec("a b", FieldKindName::Json, None), "fields[2].name"),
        ] {
            assert_eq!(bad.check(2).unwrap_err().0, path, "{bad:?}");
        }
    }

    #[test]
    fn gather_copies_rows_by_position_and_a_bad_row_is_named() {
        let specs = [spec("s", FieldKindName::Float, None), spec("t", FieldKindName::MultiLabel, Some(3))];
        let mut t = FieldTable::new(&specs);
        t.push(Ok(vec![FieldValue::Float(1.0), FieldValue::Classes(vec![0, 2])]));
        t.push_invalid("field `s` is missing".into());
        t.push(Ok(vec![FieldValue::Float(3.0), FieldValue::Classes(vec![1])]));
        assert_eq!(t.invalid(1), Some("field `s` is missing"));
        assert_eq!(t.invalid(0), None);
        let b = t.gather(&[2, 0]);
        assert_eq!(b.fields[0].values, FieldValues::Float(vec![3.0, 1.0]));
        assert_eq!(b.fields[1].values, FieldValues::MultiHot { classes: 3, values: vec![0., 1., 0., 1., 0., 1.] });

        // Appended after itself (a mix of two sources): rows and bad positions move along.
        let mut joined = t.clone();
        joined.append(t);
        assert_eq!(joined.rows(), 6);
        assert_eq!(joined.invalid(4), Some("field `s` is missing"));
        let b = joined.gather(&[5, 3]);
        assert_eq!(b.fields[0].values, FieldValues::Float(vec![3.0, 1.0]));
        assert_eq!(b.fields[1].values, FieldValues::MultiHot { classes: 3, values: vec![0., 1., 0., 1., 0., 1.] });
    }
}
