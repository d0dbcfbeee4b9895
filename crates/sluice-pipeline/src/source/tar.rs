//! WebDataset-style tar shards. Members are grouped into samples by key: the member name
//! up to the first `.` of its last path component (`dir/n0142_7.jpg` → key `dir/n0142_7`,
//! extension `jpg`). A sample is the key's `jpg`/`jpeg`/`png` member (any case); an optional
//! `<key>.cls` member holds its integer label as text. Shards are indexed once, in spec
//! order, members in archive order, by reading headers and seeking over data; sample bytes
//! are later read by offset without unpacking.
//!
//! With sidecars on (`sidecars = true` in the spec), a sample's boxes come from its
//! `<key>.json` member, in the format and under the limits of the sidecar folder source
//! ([`super::sidecar`]); with `masks`, the sidecar's `"mask"` names a PNG member of the same
//! shard, relative to the sidecar's folder in the archive (`"mask": "0001.mask.png"`). As
//! for folders, a sidecar that is missing, too large, not JSON or holds bad boxes does not
//! fail indexing: its sample fails when loaded, under `on_error`, naming `shard.tar:member`.
//! A sidecar without an image is not a sample (it is counted and logged). Member names are
//! only keys, never paths: nothing is unpacked, and a mask named with `..` or `/` is refused.
//!
//! The manifest root is the folder the shards share; shard paths are stored relative to it.
//! A shard may be an object (`s3://bucket/key.tar`): it is indexed by ranged reads of its
//! headers (and of the small members indexing reads), never fetched whole, and its samples
//! are later read by byte range. A shard over [`MAX_SHARD_BYTES`] is refused.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use ::tar::Archive;
use sluice_core::{Annotation, FieldTable, Location, Manifest, MaskSource};

use super::sidecar::{self, FieldsRead, SidecarRead, MAX_SIDECAR_BYTES};
use super::{is_image_extension, open_source_file, SourceError};
use crate::storage::{ObjectUrl, Roots};

/// A `.cls` member longer than this is not a label.
const MAX_CLS_BYTES: u64 = 64;

/// The extension of a sample's sidecar member.
const SIDECAR_EXTENSION: &str = "json";

/// Enumerates the samples of `shards`, in order (images and `.cls` labels only).
pub fn enumerate(shards: &[PathBuf]) -> Result<Manifest, SourceError> {
    enumerate_records(shards, Records { sidecars: false, masks: false, fields: None })
}

/// What a tar source reads besides images and labels.
#[derive(Debug, Clone, Copy)]
pub struct Records<'a> {
    /// Each sample's boxes from its `<key>.json` member.
    pub sidecars: bool,
    /// Each sample's mask from the PNG member its sidecar names (needs `sidecars`).
    pub masks: bool,
    /// Each sample's metadata fields from its sidecar (needs `sidecars`).
    pub fields: Option<FieldsRead<'a>>,
}

/// Enumerates the samples of `shards`, in order, with the records `records` asks for.
pub fn enumerate_records(shards: &[PathBuf], records: Records<'_>) -> Result<Manifest, SourceError> {
    enumerate_within(shards, records, None)
}

/// As [`enumerate_records`], each shard opened beneath `roots` when given (an object: under
/// one of their prefixes).
pub fn enumerate_within(
    shards: &[PathBuf],
    records: Records<'_>,
    roots: Option<&Roots>,
) -> Result<Manifest, SourceError> {
    if shards.is_empty() {
        return Err(SourceError::NoSamples { dataset: "tar source".into(), hint: "no shards given" });
    }
    let root = common_folder(shards);
    let mut out = Indexed { fields: records.fields.map(|f| FieldTable::new(f.specs)), ..Indexed::default() };
    for shard in shards {
        let rel = shard.strip_prefix(&root).map(Path::to_path_buf).unwrap_or_else(|_| shard.clone());
        index_shard(shard, &rel, records, roots, &mut out)?;
    }
    if out.items.is_empty() {
        return Err(SourceError::NoSamples {
            dataset: format!("{} tar shard(s) under {}", shards.len(), root.display()),
            hint: if records.sidecars {
                "no .jpg, .jpeg or .png members (each with a .json sidecar)"
            } else {
                "no .jpg, .jpeg or .png members"
            },
        });
    }
    if out.bad_sidecars > 0 {
        tracing::warn!(bad = out.bad_sidecars, root = %root.display(), "tar samples whose sidecar cannot be used; they fail when loaded");
    }
    let manifest = Manifest::new(root, out.items, Vec::new());
    let manifest = match records {
        Records { sidecars: false, .. } => manifest,
        Records { masks: false, .. } => manifest.with_annotations(out.annotations),
        Records { masks: true, .. } => manifest.with_annotations(out.annotations).with_masks(out.masks),
    };
    Ok(match out.fields {
        Some(t) if records.sidecars => manifest.with_fields(t),
        _ => manifest,
    })
}

/// What indexing the shards gathers, one row per sample (annotations and masks only when
/// the records are on).
#[derive(Default)]
struct Indexed {
    items: Vec<(Location, i64, u64)>,
    annotations: Vec<Annotation>,
    masks: Vec<MaskSource>,
    /// The samples' metadata fields, when the spec asks for them.
    fields: Option<FieldTable>,
    bad_sidecars: usize,
}

/// Splits a member name into (key, extension) the way WebDataset does; `None` when the
/// last component has no `.`.
pub fn split_member_name(name: &str) -> Option<(&str, &str)> {
    let base_start = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[base_start..].find('.')? + base_start;
    Some((&name[..dot], &name[dot + 1..]))
}

fn index_shard(
    shard: &Path,
    rel: &Path,
    records: Records<'_>,
    roots: Option<&Roots>,
    out: &mut Indexed,
) -> Result<(), SourceError> {
    if let Some(url) = ObjectUrl::parse(shard) {
        super::check_object("tar shard", &url, roots)?;
        let (file_len, _) = crate::storage::object::head(&url)?;
        check_shard_size(shard, file_len, MAX_SHARD_BYTES)?;
        let reader = RangedShard { url, len: file_len, pos: 0, window: Vec::new(), window_at: 0 };
        return index_archive(reader, file_len, shard, rel, records, out);
    }
    let file = open_source_file("tar shard", shard, roots)?;
    let file_len = file.metadata().map_err(|e| SourceError::io("tar shard", shard, e))?.len();
    check_shard_size(shard, file_len, MAX_SHARD_BYTES)?;
    index_archive(ShardReader { inner: BufReader::new(file), pos: 0 }, file_len, shard, rel, records, out)
}

/// The largest shard indexed: 64 GiB, far past WebDataset's usual 0.1 to a few GiB a
/// shard (a larger object is more likely a mistake than a shard).
pub const MAX_SHARD_BYTES: u64 = 64 << 30;

/// How much of a remote shard one ranged read fetches while indexing: a header, and the
/// small members indexing reads (labels, sidecars), come in windows of this size; the
/// bytes of members larger than it are skipped, not fetched.
const REMOTE_WINDOW: u64 = 16 << 10;

fn check_shard_size(shard: &Path, len: u64, cap: u64) -> Result<(), SourceError> {
    if len > cap {
        return Err(SourceError::ShardTooLarge { shard: shard.to_path_buf(), len, cap });
    }
    Ok(())
}

/// A remote shard read by ranged GETs of [`REMOTE_WINDOW`] bytes as the tar reader asks:
/// indexing fetches the headers and the members it reads, not the whole object.
struct RangedShard {
    url: ObjectUrl,
    len: u64,
    pos: u64,
    /// The last window fetched, from `window_at`.
    window: Vec<u8>,
    window_at: u64,
}

impl Read for RangedShard {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let in_window = self.pos >= self.window_at && self.pos < self.window_at + self.window.len() as u64;
        if !in_window {
            // A read larger than a window (a big sidecar) is fetched in one request.
            let want = (buf.len() as u64).max(REMOTE_WINDOW);
            let end = self.pos.saturating_add(want).min(self.len);
            let bytes = crate::storage::object::fetch_range(&self.url, self.pos..end)
                .map_err(|e| io::Error::other(e.to_string()))?;
            if bytes.is_empty() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} ends early", self.url)));
            }
            self.window.clear();
            self.window.extend_from_slice(&bytes);
            self.window_at = self.pos;
        }
        let from = (self.pos - self.window_at) as usize;
        let n = buf.len().min(self.window.len() - from);
        buf[..n].copy_from_slice(&self.window[from..from + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for RangedShard {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek out of range"))?;
        Ok(self.pos)
    }
}

fn index_archive<R: Read + Seek>(
    reader: R,
    file_len: u64,
    shard: &Path,
    rel: &Path,
    records: Records<'_>,
    out: &mut Indexed,
) -> Result<(), SourceError> {
    let mut archive = Archive::new(reader);
    let corrupt = |offset: u64, e: io::Error| SourceError::CorruptTar {
        shard: shard.to_path_buf(),
        offset,
        message: e.to_string(),
    };
    let entries = archive.entries_with_seek().map_err(|e| corrupt(0, e))?;
    // `shard.tar:member`, as errors name a member.
    let shown = |member: &str| format!("{}:{member}", shard.display());

    let first = out.items.len();
    // key → index in `items` of its image; key → label from its `.cls`.
    let mut samples: HashMap<String, usize> = HashMap::new();
    let mut labels: HashMap<String, i64> = HashMap::new();
    // The key of each image this shard adds, in `items` order.
    let mut keys: Vec<String> = Vec::new();
    // key → (member name, what its sidecar gives); member name → (offset, len), for masks.
    let mut sidecars: HashMap<String, (String, SidecarRead)> = HashMap::new();
    let mut members: HashMap<String, (u64, u64)> = HashMap::new();
    let (mut ignored, mut duplicates) = (0usize, 0usize);
    // Where the next header should start: the offset reported if it turns out corrupt.
    let mut next_header = 0u64;

    for entry in entries {
        let mut entry = entry.map_err(|e| corrupt(next_header, e))?;
        let offset = entry.raw_file_position();
        let len = entry.size();
        next_header = offset.saturating_add(len.saturating_add(511) & !511);
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let end = offset.saturating_add(len);
        if end > file_len {
            return Err(SourceError::TruncatedShard { shard: shard.to_path_buf(), member: name, end, file_len });
        }
        if records.masks {
            members.entry(name.clone()).or_insert((offset, len));
        }
        let Some((key, ext)) = split_member_name(&name) else {
            ignored += 1;
            continue;
        };
        if ext == "cls" {
            let bad =
                |text: String| SourceError::BadClassFile { shard: shard.to_path_buf(), member: name.clone(), text };
            if len > MAX_CLS_BYTES {
                return Err(bad(format!("<{len} bytes>")));
            }
            let mut bytes = Vec::with_capacity(len as usize);
            entry.read_to_end(&mut bytes).map_err(|e| SourceError::io("tar shard", shard, e))?;
            let text = String::from_utf8_lossy(&bytes);
            let label = text.trim().parse::<i64>().map_err(|_| bad(text.trim().to_string()))?;
            labels.insert(key.to_string(), label);
        } else if records.sidecars && ext == SIDECAR_EXTENSION {
            if sidecars.contains_key(key) {
                duplicates += 1;
                continue;
            }
            // The header's size is checked before anything is read: a member declaring
            // gigabytes costs nothing.
            let read = if len > MAX_SIDECAR_BYTES {
                SidecarRead::invalid(sidecar::too_large(&shown(&name)))
            } else {
                let mut bytes = Vec::with_capacity(len as usize);
                entry.read_to_end(&mut bytes).map_err(|e| SourceError::io("tar shard", shard, e))?;
                sidecar::sidecar_from_bytes(&bytes, &shown(&name), records.fields)
            };
            sidecars.insert(key.to_string(), (name, read));
        } else if is_image_extension(ext) {
            if samples.contains_key(key) {
                duplicates += 1;
                continue;
            }
            samples.insert(key.to_string(), out.items.len());
            keys.push(key.to_string());
            let member = name.clone();
            out.items.push((Location::TarMember { shard: rel.to_path_buf(), member, offset, len }, -1, len));
        } else {
            ignored += 1;
        }
    }

    for (key, label) in labels {
        if let Some(&i) = samples.get(&key) {
            out.items[i].1 = label;
        }
    }
    if records.sidecars {
        for (i, key) in (first..).zip(&keys) {
            let Location::TarMember { member: image, .. } = &out.items[i].0 else { continue };
            let (annotation, mask) = match sidecars.remove(key) {
                None => {
                    let why = format!("{} has no sidecar {key}.{SIDECAR_EXTENSION} in its shard", shown(image));
                    if let Some(t) = out.fields.as_mut() {
                        t.push_invalid(why.clone());
                    }
                    (Annotation::Invalid(why.clone()), records.masks.then_some(MaskSource::Invalid(why)))
                }
                Some((member, mut read)) => {
                    if let Some(t) = out.fields.as_mut() {
                        sidecar::push_fields(t, read.fields.take());
                    }
                    if let Some(label) = read.label {
                        out.items[i].1 = label;
                    }
                    let mask =
                        records.masks.then(|| mask_member(&member, read.mask, &read.annotation, rel, &members, &shown));
                    (read.annotation, mask)
                }
            };
            if let Annotation::Invalid(why) = &annotation {
                if out.bad_sidecars == 0 {
                    tracing::warn!(why, "a tar sample's sidecar cannot be used; it fails when loaded");
                }
                out.bad_sidecars += 1;
            }
            out.annotations.push(annotation);
            out.masks.extend(mask);
        }
        if let Some(member) = sidecars.values().map(|(member, _)| member).min() {
            // As in a folder, a sidecar is not a sample: without its image it is unused.
            tracing::warn!(orphans = sidecars.len(), example = %shown(member), "sidecars without an image member; not samples");
        }
    }
    if duplicates > 0 {
        tracing::warn!(shard = %shard.display(), duplicates, "keys with more than one image or sidecar member; kept the first");
    }
    tracing::debug!(shard = %shard.display(), samples = out.items.len() - first, ignored, "indexed tar shard");
    Ok(())
}

/// Where the mask named by the sidecar `member` is: a member of the same shard, its name
/// relative to the sidecar's folder in the archive; or why there is none.
fn mask_member(
    member: &str,
    mask: Option<PathBuf>,
    annotation: &Annotation,
    rel: &Path,
    members: &HashMap<String, (u64, u64)>,
    shown: &dyn Fn(&str) -> String,
) -> MaskSource {
    let name = match sidecar::mask_name(&shown(member), mask, annotation) {
        Ok(m) => m,
        Err(why) => return MaskSource::Invalid(why),
    };
    let folder = member.rfind('/').map_or("", |i| &member[..=i]);
    let wanted = format!("{folder}{}", name.to_string_lossy());
    match members.get(&wanted) {
        Some(&(offset, len)) => {
            MaskSource::Member(Location::TarMember { shard: rel.to_path_buf(), member: wanted, offset, len })
        }
        None => {
            MaskSource::Invalid(format!("sidecar {}: its mask {} is not in the shard", shown(member), shown(&wanted)))
        }
    }
}

/// The folder all shards share (by whole components), or an empty path. Objects share
/// the longest `/`-separated prefix of their URLs (at least their `s3://bucket`).
fn common_folder(shards: &[PathBuf]) -> PathBuf {
    if let Some(urls) = shards.iter().map(|s| ObjectUrl::parse(s)).collect::<Option<Vec<_>>>() {
        if let Some(first) = urls.first().filter(|f| urls.iter().all(|u| u.scheme == f.scheme && u.bucket == f.bucket))
        {
            let parents: Vec<Vec<&str>> = urls
                .iter()
                .map(|u| u.key.split('/').collect::<Vec<_>>())
                .map(|mut c| {
                    c.pop();
                    c
                })
                .collect();
            let mut common = parents[0].clone();
            for p in &parents[1..] {
                let n = common.iter().zip(p).take_while(|(a, b)| a == b).count();
                common.truncate(n);
            }
            let root = first.with_key(common.join("/"));
            return PathBuf::from(root.to_string());
        }
        // Several buckets: no common folder, each shard keeps its whole URL.
        return PathBuf::new();
    }
    let mut common: Option<Vec<Component<'_>>> = None;
    for shard in shards {
        let parent = shard.parent().unwrap_or(Path::new("")).components();
        common = Some(match common {
            None => parent.collect(),
            Some(c) => c.into_iter().zip(parent).take_while(|(a, b)| a == b).map(|(a, _)| a).collect(),
        });
    }
    common.map(|c| c.iter().collect()).unwrap_or_default()
}

/// A buffered shard reader whose relative seeks stay inside the buffer when they can, so
/// stepping over a small member costs no system call. Tracks its own position because
/// the tar reader asks for it after every seek.
struct ShardReader {
    inner: BufReader<File>,
    pos: u64,
}

impl Read for ShardReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for ShardReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        match to {
            SeekFrom::Current(delta) => {
                let pos = self
                    .pos
                    .checked_add_signed(delta)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek out of range"))?;
                self.inner.seek_relative(delta)?;
                self.pos = pos;
            }
            other => self.pos = self.inner.seek(other)?,
        }
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_over_the_cap_is_refused_naming_it() {
        let err = check_shard_size(Path::new("s3://b/huge.tar"), 1 << 41, MAX_SHARD_BYTES).unwrap_err().to_string();
        assert!(err.contains("s3://b/huge.tar") && err.contains("68719476736"), "{err}");
        assert!(check_shard_size(Path::new("a.tar"), MAX_SHARD_BYTES, MAX_SHARD_BYTES).is_ok());
    }

    #[test]
    fn member_names_split_like_webdataset() {
        assert_eq!(split_member_name("a/b/n01_7.jpg"), Some(("a/b/n01_7", "jpg")));
        assert_eq!(split_member_name("x.seg.png"), Some(("x", "seg.png")));
        assert_eq!(split_member_name("dir.v2/x.cls"), Some(("dir.v2/x", "cls")));
        assert_eq!(split_member_name("README"), None);
    }

    #[test]
    fn shards_share_their_common_folder() {
        let shards = vec![PathBuf::from("/d/s/a.tar"), PathBuf::from("/d/s/sub/b.tar")];
        assert_eq!(common_folder(&shards), PathBuf::from("/d/s"));
        assert_eq!(common_folder(&[PathBuf::from("a.tar")]), PathBuf::new());
        assert_eq!(common_folder(&[PathBuf::from("/x/a.tar"), PathBuf::from("/y/b.tar")]), PathBuf::from("/"));
    }
}
