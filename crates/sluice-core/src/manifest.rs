//! A manifest lists a dataset's samples once, in a stable order. Its [`SampleKey`]s (not
//! paths) drive shuffling, caching, importance, checkpoints and metrics; its fingerprint
//! names the dataset so caches and checkpoints can tell whether they still apply.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::record::Annotation;

mod arena;

use arena::{Builder, Entries};

/// The stable name of a sample: its position in the manifest. Stable for as long as the
/// manifest's fingerprint is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SampleKey(pub u64);

impl fmt::Display for SampleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Where a sample's bytes live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Location {
    /// A whole file; the path is relative to the manifest root unless absolute.
    File { path: PathBuf },
    /// A member of a tar shard, read by offset without unpacking the tar.
    TarMember { shard: PathBuf, member: String, offset: u64, len: u64 },
    /// A row of a Parquet file: row `row` of row group `row_group` (counted within it),
    /// its image in leaf column `column` of the file's schema.
    ParquetRow { file: PathBuf, row_group: u32, row: u32, column: u32 },
}

impl Location {
    /// The same location, borrowed.
    pub fn view(&self) -> LocationRef<'_> {
        match self {
            Location::File { path } => LocationRef::File { path },
            Location::TarMember { shard, member, offset, len } => {
                LocationRef::TarMember { shard, member, offset: *offset, len: *len }
            }
            Location::ParquetRow { file, row_group, row, column } => {
                LocationRef::ParquetRow { file, row_group: *row_group, row: *row, column: *column }
            }
        }
    }
}

/// A [`Location`] borrowed from where it is stored (a manifest keeps its paths in one
/// buffer, so it lends its locations rather than holding one `Location` per sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationRef<'a> {
    File { path: &'a Path },
    TarMember { shard: &'a Path, member: &'a str, offset: u64, len: u64 },
    ParquetRow { file: &'a Path, row_group: u32, row: u32, column: u32 },
}

impl<'a> LocationRef<'a> {
    /// The same location, owned.
    pub fn owned(self) -> Location {
        match self {
            LocationRef::File { path } => Location::File { path: path.to_path_buf() },
            LocationRef::TarMember { shard, member, offset, len } => {
                Location::TarMember { shard: shard.to_path_buf(), member: member.to_string(), offset, len }
            }
            LocationRef::ParquetRow { file, row_group, row, column } => {
                Location::ParquetRow { file: file.to_path_buf(), row_group, row, column }
            }
        }
    }

    /// The file that holds the sample's bytes: the file itself, the tar shard or the
    /// Parquet file.
    pub fn file(self) -> &'a Path {
        match self {
            LocationRef::File { path } => path,
            LocationRef::TarMember { shard, .. } => shard,
            LocationRef::ParquetRow { file, .. } => file,
        }
    }

    /// A path to show the user: the file, or `shard.tar:member`.
    pub fn display_path(self, root: &Path) -> PathBuf {
        match self {
            LocationRef::File { path } => root.join(path),
            LocationRef::TarMember { shard, member, .. } => {
                PathBuf::from(format!("{}:{member}", root.join(shard).display()))
            }
            LocationRef::ParquetRow { file, row_group, row, .. } => {
                PathBuf::from(format!("{}:row_group={row_group}:row={row}", root.join(file).display()))
            }
        }
    }

    /// The location with `root` joined onto its path (a relative path made whole).
    fn joined(self, root: &Path) -> Location {
        match self {
            LocationRef::File { path } => Location::File { path: root.join(path) },
            LocationRef::TarMember { shard, member, offset, len } => {
                Location::TarMember { shard: root.join(shard), member: member.to_string(), offset, len }
            }
            LocationRef::ParquetRow { file, row_group, row, column } => {
                Location::ParquetRow { file: root.join(file), row_group, row, column }
            }
        }
    }
}

impl PartialEq<Location> for LocationRef<'_> {
    fn eq(&self, other: &Location) -> bool {
        *self == other.view()
    }
}

/// One sample of a manifest, as the manifest lends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    pub key: SampleKey,
    pub location: LocationRef<'a>,
    /// Class index; -1 when the source has no label for this sample.
    pub label: i64,
    /// Size in bytes as enumerated (part of the fingerprint).
    pub size: u64,
}

#[derive(Debug, Clone)]
pub struct Manifest {
    pub root: PathBuf,
    entries: Entries,
    /// Class names by label, where the source names classes (ImageFolder).
    pub classes: Vec<String>,
    pub fingerprint: u64,
    /// The sizes of the manifests [`Manifest::join`] joined, in order (a mixed source's
    /// sources); empty for one source.
    pub parts: Vec<usize>,
    /// Each sample's boxes, by key, where the source carries them (COCO, sidecars);
    /// `None` for image + label sources, which then pay nothing for records.
    pub annotations: Option<Vec<Annotation>>,
    /// Where each sample's segmentation mask comes from, where the spec asks for masks.
    pub masks: Option<Vec<crate::record::MaskSource>>,
    /// Each sample's metadata fields, where the spec asks for fields.
    pub fields: Option<crate::fields::FieldTable>,
}

/// Builds a manifest one sample at a time, in its stable order (keys 0..n), so that a
/// source of millions of samples never holds one [`Location`] per sample.
pub struct ManifestBuilder {
    root: PathBuf,
    entries: Builder,
}

impl ManifestBuilder {
    pub fn new(root: PathBuf, capacity: usize) -> Self {
        Self { root, entries: Builder::with_capacity(capacity) }
    }

    pub fn push(&mut self, location: LocationRef<'_>, label: i64, size: u64) {
        self.entries.push(location, label, size);
    }

    pub fn finish(self, classes: Vec<String>) -> Manifest {
        let entries = self.entries.finish();
        let fingerprint = fingerprint(&entries, &classes);
        Manifest {
            root: self.root,
            entries,
            classes,
            fingerprint,
            parts: Vec::new(),
            annotations: None,
            masks: None,
            fields: None,
        }
    }
}

impl Manifest {
    /// Builds a manifest from locations in their stable order; keys are assigned 0..n.
    pub fn new(root: PathBuf, items: Vec<(Location, i64, u64)>, classes: Vec<String>) -> Self {
        let mut b = ManifestBuilder::new(root, items.len());
        for (location, label, size) in &items {
            b.push(location.view(), *label, *size);
        }
        b.finish(classes)
    }

    /// One manifest over several, in order (a mixed source): keys run on through the
    /// parts, locations are made whole (each part's root joined on, the joined root is
    /// empty), labels are kept, and the class names are kept where every part that names
    /// classes names the same ones. The fingerprint is made of the parts' fingerprints, so
    /// it stays put where theirs do.
    pub fn join(parts: Vec<Manifest>) -> Self {
        let mut h = Xxh3::new();
        let sizes: Vec<usize> = parts.iter().map(Manifest::len).collect();
        let mut named = parts.iter().map(|p| &p.classes).filter(|c| !c.is_empty());
        let classes = match named.next() {
            Some(first) if named.all(|c| c == first) => first.clone(),
            _ => Vec::new(),
        };
        let mut entries = Builder::with_capacity(sizes.iter().sum());
        for part in &parts {
            h.update(&part.fingerprint.to_le_bytes());
            h.update(&(part.len() as u64).to_le_bytes());
            for e in part.entries() {
                entries.push(e.location.joined(&part.root).view(), e.label, e.size);
            }
        }
        Self {
            root: PathBuf::new(),
            entries: entries.finish(),
            classes,
            fingerprint: h.digest(),
            parts: sizes,
            annotations: None,
            masks: None,
            fields: None,
        }
    }

    /// Attaches each sample's boxes (`annotations[i]` is entry `i`'s); they join the
    /// fingerprint, so a checkpoint or cache of other boxes no longer applies.
    pub fn with_annotations(mut self, annotations: Vec<Annotation>) -> Self {
        let mut h = Xxh3::new();
        h.update(&self.fingerprint.to_le_bytes());
        for a in &annotations {
            match a {
                Annotation::Boxes(b) => {
                    h.update(b"B");
                    b.hash_into(&mut h);
                }
                Annotation::Invalid(m) => {
                    h.update(b"I");
                    h.update(m.as_bytes());
                }
            }
        }
        self.fingerprint = h.digest();
        self.annotations = Some(annotations);
        self
    }

    /// Attaches where each sample's mask comes from (`masks[i]` is entry `i`'s); they join
    /// the fingerprint.
    pub fn with_masks(mut self, masks: Vec<crate::record::MaskSource>) -> Self {
        let mut h = Xxh3::new();
        h.update(&self.fingerprint.to_le_bytes());
        h.update(b"masks");
        for m in &masks {
            m.hash_into(&mut h);
        }
        self.fingerprint = h.digest();
        self.masks = Some(masks);
        self
    }

    /// Attaches each sample's fields (row `i` is entry `i`'s); they join the fingerprint.
    pub fn with_fields(mut self, fields: crate::fields::FieldTable) -> Self {
        let mut h = Xxh3::new();
        h.update(&self.fingerprint.to_le_bytes());
        fields.hash_into(&mut h);
        self.fingerprint = h.digest();
        self.fields = Some(fields);
        self
    }

    /// Where the mask of the sample at position `pos` comes from; `None` without masks.
    pub fn mask_source(&self, pos: usize) -> Option<&crate::record::MaskSource> {
        self.masks.as_ref().and_then(|m| m.get(pos))
    }

    /// Whether samples carry boxes.
    pub fn has_boxes(&self) -> bool {
        self.annotations.is_some()
    }

    /// The boxes of the sample at position `pos`: `None` when the source has none,
    /// `Some(Err)` when they could not be read.
    pub fn annotation(&self, pos: usize) -> Option<&Annotation> {
        self.annotations.as_ref().and_then(|a| a.get(pos))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }

    /// The sample named `key`; `None` past the end.
    pub fn entry(&self, key: SampleKey) -> Option<Entry<'_>> {
        usize::try_from(key.0).ok().filter(|&pos| pos < self.len()).map(|pos| self.at(pos))
    }

    /// The sample at position `pos`, which must be below `len()` (as a slice's index).
    pub fn at(&self, pos: usize) -> Entry<'_> {
        Entry {
            key: SampleKey(pos as u64),
            location: self.entries.location(pos),
            label: self.entries.labels()[pos],
            size: self.entries.sizes()[pos],
        }
    }

    /// Every sample, in key order.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = Entry<'_>> + '_ {
        (0..self.len()).map(|pos| self.at(pos))
    }

    /// Every sample's label, in key order (-1 where the source has none).
    pub fn labels(&self) -> &[i64] {
        self.entries.labels()
    }

    /// The path to show for a sample in messages.
    pub fn display_path(&self, key: SampleKey) -> PathBuf {
        self.entry(key).map(|e| e.location.display_path(&self.root)).unwrap_or_default()
    }

    /// Fingerprint as the 16-hex-digit string used in names and checkpoints.
    pub fn fingerprint_hex(&self) -> String {
        format!("{:016x}", self.fingerprint)
    }
}

/// Hash of what identifies the dataset: locations (relative), labels, sizes and class names.
/// The root is left out so a dataset moved elsewhere keeps its fingerprint.
fn fingerprint(entries: &Entries, classes: &[String]) -> u64 {
    let mut h = Xxh3::new();
    for c in classes {
        h.update(c.as_bytes());
        h.update(&[0]);
    }
    for pos in 0..entries.len() {
        match entries.location(pos) {
            LocationRef::File { path } => {
                h.update(b"F");
                h.update(path.as_os_str().as_encoded_bytes());
            }
            LocationRef::TarMember { shard, member, offset, len } => {
                h.update(b"T");
                h.update(shard.as_os_str().as_encoded_bytes());
                h.update(member.as_bytes());
                h.update(&offset.to_le_bytes());
                h.update(&len.to_le_bytes());
            }
            LocationRef::ParquetRow { file, row_group, row, column } => {
                h.update(b"P");
                h.update(file.as_os_str().as_encoded_bytes());
                h.update(&row_group.to_le_bytes());
                h.update(&row.to_le_bytes());
                h.update(&column.to_le_bytes());
            }
        }
        h.update(&[0]);
        h.update(&entries.labels()[pos].to_le_bytes());
        h.update(&entries.sizes()[pos].to_le_bytes());
    }
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(p: &str) -> Location {
        Location::File { path: PathBuf::from(p) }
    }

    /// A manifest keeps 24 bytes per sample (label, size, place) besides its paths, each
    /// written once: issue 28 item 6 asks for <= 64 bytes per sample at 10^7 samples.
    #[test]
    fn a_sample_costs_three_words_besides_its_paths() {
        let n = 100_000;
        let items = (0..n).map(|i| (file(["a/1.jpg", "b/2.jpg"][i % 2]), 0, 10)).collect();
        let m = Manifest::new("/x".into(), items, vec![]);
        assert_eq!(m.entries.bytes(), n * 24 + "a/1.jpgb/2.jpg".len() + 2 * 8);
    }

    /// Checkpoints and caches name their dataset by fingerprint: storing the samples
    /// otherwise must not change it (the value is the one the manifest of `Location`s gave).
    #[test]
    fn the_fingerprint_is_the_one_checkpoints_already_hold() {
        let items = vec![
            (file("a/1.jpg"), 3, 10),
            (Location::TarMember { shard: "s.tar".into(), member: "m.jpg".into(), offset: 512, len: 9 }, -1, 9),
            (Location::ParquetRow { file: "d.parquet".into(), row_group: 1, row: 2, column: 0 }, 5, 7),
        ];
        let m = Manifest::new("/x".into(), items, vec!["c".into()]);
        assert_eq!(m.fingerprint_hex(), "d3fca1380aab7b9a");
    }

    #[test]
    fn a_joined_manifest_makes_every_location_whole_parquet_rows_included() {
        let a = Manifest::new("/a".into(), vec![(file("1.jpg"), 0, 10)], vec![]);
        let row = |file: &str| Location::ParquetRow { file: PathBuf::from(file), row_group: 1, row: 5, column: 0 };
        let p = Manifest::new("/p".into(), vec![(row("d.parquet"), 2, 30)], vec![]);
        let joined = Manifest::join(vec![a, p]);
        assert_eq!(joined.parts, vec![1, 1]);
        assert_eq!(joined.at(0).location.owned(), file("/a/1.jpg"));
        assert_eq!(joined.at(1).key, SampleKey(1));
        assert_eq!(joined.at(1).location.owned(), row("/p/d.parquet"));
        assert_eq!(joined.display_path(SampleKey(1)), PathBuf::from("/p/d.parquet:row_group=1:row=5"));
    }

    #[test]
    fn keys_are_positions_and_fingerprint_tracks_content_not_root() {
        let items = || vec![(file("a/1.jpg"), 0, 10), (file("b/2.jpg"), 1, 20)];
        let m1 = Manifest::new("/x".into(), items(), vec!["a".into(), "b".into()]);
        let m2 = Manifest::new("/elsewhere".into(), items(), vec!["a".into(), "b".into()]);
        assert_eq!(m1.at(1).key, SampleKey(1));
        assert_eq!(m1.fingerprint, m2.fingerprint);

        let mut changed = items();
        changed[1].2 = 21;
        let m3 = Manifest::new("/x".into(), changed, vec!["a".into(), "b".into()]);
        assert_ne!(m1.fingerprint, m3.fingerprint);
        assert_eq!(m1.display_path(SampleKey(1)), PathBuf::from("/x/b/2.jpg"));
    }
}
