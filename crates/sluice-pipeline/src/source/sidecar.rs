//! A folder of images with a JSON sidecar each (WebDataset's convention: `0001.jpg` next
//! to `0001.json`). The sidecar holds the sample's boxes, XYXY in pixels of the image:
//! `{"boxes": [[x1, y1, x2, y2], ...], "labels": [l1, ...]}`, and optionally `"label"`, the
//! sample's own integer label (-1 without). The folder is walked recursively in the order
//! ImageFolder uses; only `.jpg`, `.jpeg` and `.png` files are samples. With `masks`, a
//! sidecar names the sample's mask, a single-channel PNG beside it: `"mask": "0001.mask.png"`
//! (a relative path under the sidecar's folder; no `..`).
//!
//! A sidecar that is missing, too large, not JSON, or whose boxes are not boxes (a NaN, `x2 <
//! x1`, a count that does not match the labels) does not fail enumeration: its sample fails
//! when loaded, under `on_error`, with the reason and the sample's path.
//!
//! The tar source reads the same sidecars from shard members (`sidecars = true`), through
//! `sidecar_from_bytes` and `mask_name` here.

use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use sluice_core::fields::FieldValue;
use sluice_core::spec::MAX_BOXES;
use sluice_core::{Annotation, BoxTargets, FieldSpec, FieldTable, Location, Manifest, MaskSource};

use super::image_folder::{walk_class, WalkStats};
use super::{open_source_file, SourceError};
use crate::storage::Roots;

/// A file whose name ends so is a mask, never a sample.
pub const MASK_SUFFIX: &str = ".mask.png";

/// Sidecars larger than this are refused (their sample fails): 16 MiB holds some 300 000
/// boxes, far past any real sample.
pub const MAX_SIDECAR_BYTES: u64 = 16 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sidecar {
    #[serde(default)]
    boxes: Vec<[f32; 4]>,
    #[serde(default)]
    labels: Vec<i64>,
    #[serde(default)]
    label: Option<i64>,
    #[serde(default)]
    mask: Option<PathBuf>,
}

/// The metadata fields a spec asks the sidecars for (top-level keys of each sidecar).
#[derive(Debug, Clone, Copy)]
pub struct FieldsRead<'a> {
    pub specs: &'a [FieldSpec],
    /// `limits.max_field_bytes`: the longest text or JSON value.
    pub max_bytes: u64,
}

/// One sample's fields as read from its sidecar: a value per field, or why there are none.
pub(super) type SidecarFields = Result<Vec<FieldValue>, String>;

/// What one sidecar gives its sample.
pub(super) struct SidecarRead {
    pub(super) annotation: Annotation,
    pub(super) label: Option<i64>,
    pub(super) mask: Option<PathBuf>,
    /// The fields the spec asks for (`None` when it asks for none).
    pub(super) fields: Option<SidecarFields>,
}

impl SidecarRead {
    /// A sidecar that cannot be used: its sample fails with `why` when loaded.
    pub(super) fn invalid(why: String) -> Self {
        SidecarRead { annotation: Annotation::Invalid(why.clone()), label: None, mask: None, fields: Some(Err(why)) }
    }
}

/// Appends one sample's fields to `table`.
pub(super) fn push_fields(table: &mut FieldTable, fields: Option<SidecarFields>) {
    table.push(fields.unwrap_or_else(|| Err("the sample has no sidecar".into())));
}

/// Enumerates a folder of images with sidecars; with `masks`, where each sample's mask is.
pub fn enumerate(root: &Path, masks: bool) -> Result<Manifest, SourceError> {
    enumerate_with_fields(root, masks, None)
}

/// As [`enumerate`], also reading the metadata fields `fields` names from each sidecar.
pub fn enumerate_with_fields(
    root: &Path,
    masks: bool,
    fields: Option<FieldsRead<'_>>,
) -> Result<Manifest, SourceError> {
    enumerate_within(root, masks, fields, None)
}

/// As [`enumerate_with_fields`], each sidecar opened beneath `roots` when given: one that
/// resolves outside them (a symlink out) fails the enumeration, naming it.
pub fn enumerate_within(
    root: &Path,
    masks: bool,
    fields: Option<FieldsRead<'_>>,
    roots: Option<&Roots>,
) -> Result<Manifest, SourceError> {
    let meta = fs::metadata(root).map_err(|e| SourceError::io("dataset root", root, e))?;
    if !meta.is_dir() {
        return Err(SourceError::NotADirectory { path: root.to_path_buf() });
    }
    let mut items = Vec::new();
    walk_class(root, Path::new(""), -1, &mut items, &mut WalkStats::default())?;
    // Masks beside their images (`0001.mask.png`) are not samples.
    items.retain(|(location, _, _)| {
        !matches!(location, Location::File { path } if path.to_string_lossy().ends_with(MASK_SUFFIX))
    });
    if items.is_empty() {
        return Err(SourceError::NoSamples {
            dataset: root.display().to_string(),
            hint: "no .jpg, .jpeg or .png files (each with a .json sidecar) under the folder",
        });
    }
    let mut annotations = Vec::with_capacity(items.len());
    let mut mask_sources = Vec::with_capacity(items.len());
    let mut table = fields.map(|f| FieldTable::new(f.specs));
    let mut bad = 0usize;
    for (location, label, _) in &mut items {
        let Location::File { path } = location else { continue };
        let sidecar = root.join(path.with_extension("json"));
        let SidecarRead { annotation, label: own_label, mask, fields: read } = read_sidecar(&sidecar, fields, roots)?;
        if let Some(t) = table.as_mut() {
            push_fields(t, read);
        }
        if masks {
            mask_sources.push(mask_source(path, &sidecar, mask, &annotation));
        }
        if let Annotation::Invalid(why) = &annotation {
            if bad == 0 {
                tracing::warn!(sidecar = %sidecar.display(), why, "a sample's sidecar cannot be read; it fails when loaded");
            }
            bad += 1;
        }
        *label = own_label.unwrap_or(-1);
        annotations.push(annotation);
    }
    if bad > 1 {
        tracing::warn!(bad, root = %root.display(), "samples whose sidecar cannot be read");
    }
    let manifest = Manifest::new(root.to_path_buf(), items, Vec::new()).with_annotations(annotations);
    let manifest = if masks { manifest.with_masks(mask_sources) } else { manifest };
    Ok(match table {
        Some(t) => manifest.with_fields(t),
        None => manifest,
    })
}

/// Where the mask of the image at `image` (relative to the root) is: the sidecar's `mask`,
/// relative to the image's folder, or why there is none.
fn mask_source(image: &Path, sidecar: &Path, mask: Option<PathBuf>, annotation: &Annotation) -> MaskSource {
    match mask_name(&sidecar.display().to_string(), mask, annotation) {
        Ok(m) => MaskSource::File(image.parent().unwrap_or(Path::new("")).join(m)),
        Err(why) => MaskSource::Invalid(why),
    }
}

/// The mask a sidecar (`shown` in errors) names, a path relative to the sidecar's folder,
/// or why it names none that may be used: the sidecar cannot be read, has no `mask`, or
/// names one outside its folder (absolute, or with `..`).
pub(super) fn mask_name(shown: &str, mask: Option<PathBuf>, annotation: &Annotation) -> Result<PathBuf, String> {
    match mask {
        _ if matches!(annotation, Annotation::Invalid(_)) => {
            Err(format!("sidecar {shown} cannot be read (see its boxes' error)"))
        }
        None => Err(format!("sidecar {shown} names no `mask`")),
        Some(m) if m.components().all(|c| matches!(c, Component::Normal(_))) => Ok(m),
        Some(m) => Err(format!("sidecar {shown}: mask {} must be a relative path without `..`", m.display())),
    }
}

/// Reads and checks one sidecar: its boxes (or why they cannot be used), its label and mask.
/// A sidecar out of `roots` is an error (the job is refused); any other failure fails only
/// its sample.
fn read_sidecar(
    path: &Path,
    fields: Option<FieldsRead<'_>>,
    roots: Option<&Roots>,
) -> Result<SidecarRead, SourceError> {
    let mut bytes = Vec::new();
    let invalid = SidecarRead::invalid;
    // A regular file only, opened without blocking (a FIFO would hang indexing), as samples are.
    let file = match open_source_file("sidecar", path, roots) {
        Ok(f) => f,
        Err(e @ SourceError::OutsideRoots { .. }) => return Err(e),
        Err(SourceError::NotFound { .. }) => return Ok(invalid(format!("sidecar {}: file not found", path.display()))),
        Err(SourceError::Io { source, .. }) => return Ok(invalid(format!("sidecar {}: {source}", path.display()))),
        Err(e) => return Ok(invalid(e.to_string())),
    };
    Ok(match file.take(MAX_SIDECAR_BYTES + 1).read_to_end(&mut bytes) {
        Err(e) => invalid(format!("sidecar {}: {e}", path.display())),
        Ok(_) => sidecar_from_bytes(&bytes, &path.display().to_string(), fields),
    })
}

/// Checks a sidecar's bytes, read up to one past [`MAX_SIDECAR_BYTES`]; `shown` names the
/// sidecar in what is wrong (a path, or `shard.tar:member`).
pub(super) fn sidecar_from_bytes(bytes: &[u8], shown: &str, fields: Option<FieldsRead<'_>>) -> SidecarRead {
    if bytes.len() as u64 > MAX_SIDECAR_BYTES {
        return SidecarRead::invalid(too_large(shown));
    }
    let parsed = match fields {
        None => parse_sidecar_full(bytes).map(|s| (s, None)),
        Some(f) => parse_sidecar_with_fields(bytes, f),
    };
    match parsed {
        Err(why) => SidecarRead::invalid(format!("sidecar {shown}: {why}")),
        Ok(((t, label, mask), fields)) => SidecarRead {
            annotation: Annotation::Boxes(t),
            label,
            mask,
            fields: fields.map(|r: SidecarFields| r.map_err(|why| format!("sidecar {shown}: {why}"))),
        },
    }
}

/// As [`parse_sidecar_full`], taking the fields `fields` names out of the sidecar's
/// top-level keys first (a missing or mistyped field fails only its sample's fields; the
/// rest of the sidecar must still be a boxes sidecar).
#[allow(clippy::type_complexity)]
fn parse_sidecar_with_fields(
    bytes: &[u8],
    fields: FieldsRead<'_>,
) -> Result<((BoxTargets, Option<i64>, Option<PathBuf>), Option<SidecarFields>), String> {
    // serde_json refuses nesting past 128 levels: a hostile deep sidecar is an error here.
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(bytes).map_err(|e| format!("not a boxes sidecar: {e}"))?;
    let values: Vec<_> = fields.specs.iter().map(|f| (f, object.remove(&f.name))).collect();
    let read = values.iter().map(|(f, v)| f.read(v.as_ref(), fields.max_bytes)).collect();
    let s: Sidecar =
        serde_json::from_value(serde_json::Value::Object(object)).map_err(|e| format!("not a boxes sidecar: {e}"))?;
    let targets = BoxTargets::checked(s.boxes, s.labels, MAX_BOXES as usize)?;
    Ok(((targets, s.label, s.mask), Some(read)))
}

/// Why a sidecar over [`MAX_SIDECAR_BYTES`] is refused.
pub(super) fn too_large(shown: &str) -> String {
    format!("sidecar {shown} is over {} MiB", MAX_SIDECAR_BYTES >> 20)
}

/// Parses a sidecar's bytes into checked boxes and the optional sample label.
#[cfg(test)]
pub(crate) fn parse_sidecar(bytes: &[u8]) -> Result<(BoxTargets, Option<i64>), String> {
    parse_sidecar_full(bytes).map(|(t, label, _)| (t, label))
}

/// Parses a sidecar's bytes into checked boxes, the optional sample label and mask.
fn parse_sidecar_full(bytes: &[u8]) -> Result<(BoxTargets, Option<i64>, Option<PathBuf>), String> {
    let s: Sidecar = serde_json::from_slice(bytes).map_err(|e| format!("not a boxes sidecar: {e}"))?;
    let targets = BoxTargets::checked(s.boxes, s.labels, MAX_BOXES as usize)?;
    Ok((targets, s.label, s.mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_named_like_a_sidecar_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let fifo = dir.path().join("0001.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap_or_else(|e| panic!("{e}"));
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read_sidecar(&fifo, None, None).map(|r| r.annotation));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(5)) {
            Ok(Ok(Annotation::Invalid(why))) => assert!(why.contains("0001.json"), "{why}"),
            Ok(other) => panic!("a FIFO gave boxes: {other:?}"),
            Err(_) => panic!("reading a FIFO sidecar blocked for 5 s"),
        }
    }

    #[test]
    fn masks_are_named_by_the_sidecar_and_never_samples() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let sub = dir.path().join("s");
        fs::create_dir_all(&sub).unwrap_or_else(|e| panic!("{e}"));
        for (name, json) in
            [("a", r#"{"mask": "a.mask.png"}"#), ("b", r#"{"boxes": []}"#), ("c", r#"{"mask": "../c.mask.png"}"#)]
        {
            fs::write(sub.join(format!("{name}.png")), b"x").unwrap_or_else(|e| panic!("{e}"));
            fs::write(sub.join(format!("{name}.mask.png")), b"x").unwrap_or_else(|e| panic!("{e}"));
            fs::write(sub.join(format!("{name}.json")), json).unwrap_or_else(|e| panic!("{e}"));
        }
        let m = enumerate(dir.path(), true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.len(), 3, "the .mask.png files are not samples");
        assert_eq!(m.mask_source(0), Some(&MaskSource::File(PathBuf::from("s/a.mask.png"))));
        let Some(MaskSource::Invalid(why)) = m.mask_source(1) else { panic!("{:?}", m.mask_source(1)) };
        assert!(why.contains("b.json") && why.contains("names no `mask`"), "{why}");
        let Some(MaskSource::Invalid(why)) = m.mask_source(2) else { panic!("{:?}", m.mask_source(2)) };
        assert!(why.contains("without `..`"), "{why}");
        assert!(enumerate(dir.path(), false).unwrap_or_else(|e| panic!("{e}")).masks.is_none());
    }

    #[test]
    fn sidecars_parse_or_say_what_is_wrong() {
        let ok = parse_sidecar(br#"{"boxes": [[1, 2, 30, 40.5]], "labels": [7], "label": 2}"#);
        assert_eq!(ok, Ok((BoxTargets { boxes: vec![[1.0, 2.0, 30.0, 40.5]], labels: vec![7] }, Some(2))));
        assert_eq!(parse_sidecar(b"{}"), Ok((BoxTargets::default(), None)));
        for (bad, want) in [
            (&br#"{"boxes": [[1, 2, 3]], "labels": [1]}"#[..], "not a boxes sidecar"),
            (br#"{"boxes": [[1, 2, 3, 4]]"#, "EOF"),
            (br#"{"boxes": [[1, 2, 3, 4]], "labels": []}"#, "1 boxes but 0 labels"),
            (br#"{"boxes": [[1, 2, 1e39, 4]], "labels": [0]}"#, "finite"),
            (br#"{"boxes": [[5, 2, 1, 4]], "labels": [0]}"#, "x2 < x1"),
            (br#"{"bxoes": []}"#, "unknown field"),
        ] {
            match parse_sidecar(bad) {
                Err(e) => assert!(e.contains(want), "{e} should say {want}"),
                Ok(t) => panic!("{} parsed as {t:?}", String::from_utf8_lossy(bad)),
            }
        }
    }
}
