//! The manifest's samples, stored so that a sample costs a few machine words: a label, a
//! size and an 8-byte place per sample, with every path written once (interned) in one
//! buffer, tar members and Parquet rows in tables of their own. A file list of 10^7
//! samples over a few files holds 24 bytes per sample; with a distinct 30-byte path per
//! sample, ~62 (issue 28 asks for at most 64).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use hashbrown::HashTable;
use xxhash_rust::xxh3::xxh3_64;

use super::LocationRef;

/// Byte strings one after another in one buffer; string `i` ends at `ends[i]`.
#[derive(Debug, Clone, Default)]
struct Strings {
    bytes: Vec<u8>,
    ends: Vec<u64>,
}

impl Strings {
    fn push(&mut self, s: &[u8]) -> u64 {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len() as u64);
        self.ends.len() as u64 - 1
    }

    fn get(&self, i: u64) -> &[u8] {
        let i = i as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

/// What a sample's place points into, in the top two bits of [`Place`].
const FILE: u64 = 0;
const TAR: u64 = 1;
const PARQUET: u64 = 2;
const KIND_SHIFT: u32 = 62;
const INDEX_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// A sample's place: its kind and an index into that kind's table (a path for a file, a
/// member for a tar member, a row for a Parquet row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place(u64);

impl Place {
    fn new(kind: u64, index: u64) -> Self {
        Self((kind << KIND_SHIFT) | index)
    }

    fn kind(self) -> u64 {
        self.0 >> KIND_SHIFT
    }

    fn index(self) -> usize {
        (self.0 & INDEX_MASK) as usize
    }
}

#[derive(Debug, Clone, Copy)]
struct Member {
    shard: u64,
    name_end: u64,
    offset: u64,
    len: u64,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    file: u64,
    row_group: u32,
    row: u32,
}

/// A Parquet file's path and the leaf column its images are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ParquetFile {
    path: u64,
    column: u32,
}

/// The samples of a manifest, in key order.
#[derive(Debug, Clone, Default)]
pub(super) struct Entries {
    labels: Vec<i64>,
    sizes: Vec<u64>,
    places: Vec<Place>,
    /// Every distinct path (files, shards, Parquet files), once.
    paths: Strings,
    members: Vec<Member>,
    names: String,
    rows: Vec<Row>,
    parquet_files: Vec<ParquetFile>,
}

impl Entries {
    pub(super) fn len(&self) -> usize {
        self.places.len()
    }

    /// The heap bytes the samples take.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        use std::mem::size_of;
        self.labels.capacity() * size_of::<i64>()
            + self.sizes.capacity() * size_of::<u64>()
            + self.places.capacity() * size_of::<Place>()
            + self.paths.bytes.capacity()
            + self.paths.ends.capacity() * size_of::<u64>()
            + self.members.capacity() * size_of::<Member>()
            + self.names.capacity()
            + self.rows.capacity() * size_of::<Row>()
            + self.parquet_files.capacity() * size_of::<ParquetFile>()
    }

    pub(super) fn labels(&self) -> &[i64] {
        &self.labels
    }

    pub(super) fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    fn path(&self, i: u64) -> &Path {
        Path::new(OsStr::from_bytes(self.paths.get(i)))
    }

    /// Where sample `pos` lives; `pos` must be below `len()`.
    pub(super) fn location(&self, pos: usize) -> LocationRef<'_> {
        let place = self.places[pos];
        let i = place.index();
        match place.kind() {
            TAR => {
                let m = self.members[i];
                let start = if i == 0 { 0 } else { self.members[i - 1].name_end as usize };
                LocationRef::TarMember {
                    shard: self.path(m.shard),
                    member: &self.names[start..m.name_end as usize],
                    offset: m.offset,
                    len: m.len,
                }
            }
            PARQUET => {
                let r = self.rows[i];
                let file = self.parquet_files[r.file as usize];
                LocationRef::ParquetRow {
                    file: self.path(file.path),
                    row_group: r.row_group,
                    row: r.row,
                    column: file.column,
                }
            }
            _ => LocationRef::File { path: self.path(i as u64) },
        }
    }
}

/// Builds [`Entries`] sample by sample, writing each distinct path once.
#[derive(Default)]
pub(super) struct Builder {
    entries: Entries,
    /// Path ids by their bytes' hash, to find a path already written.
    seen_paths: HashTable<u64>,
    seen_files: std::collections::HashMap<ParquetFile, u64>,
}

impl Builder {
    pub(super) fn with_capacity(n: usize) -> Self {
        let mut b = Self::default();
        b.entries.labels.reserve_exact(n);
        b.entries.sizes.reserve_exact(n);
        b.entries.places.reserve_exact(n);
        b
    }

    fn intern(&mut self, path: &Path) -> u64 {
        let bytes = path.as_os_str().as_bytes();
        let hash = xxh3_64(bytes);
        let paths = &self.entries.paths;
        let found = self.seen_paths.find(hash, |&id| paths.get(id) == bytes).copied();
        match found {
            Some(id) => id,
            None => {
                let id = self.entries.paths.push(bytes);
                let paths = &self.entries.paths;
                self.seen_paths.insert_unique(hash, id, |&id| xxh3_64(paths.get(id)));
                id
            }
        }
    }

    pub(super) fn push(&mut self, location: LocationRef<'_>, label: i64, size: u64) {
        let place = match location {
            LocationRef::File { path } => Place::new(FILE, self.intern(path)),
            LocationRef::TarMember { shard, member, offset, len } => {
                let shard = self.intern(shard);
                let e = &mut self.entries;
                e.names.push_str(member);
                e.members.push(Member { shard, name_end: e.names.len() as u64, offset, len });
                Place::new(TAR, e.members.len() as u64 - 1)
            }
            LocationRef::ParquetRow { file, row_group, row, column } => {
                let file = ParquetFile { path: self.intern(file), column };
                let files = &mut self.entries.parquet_files;
                let file = *self.seen_files.entry(file).or_insert_with(|| {
                    files.push(file);
                    files.len() as u64 - 1
                });
                self.entries.rows.push(Row { file, row_group, row });
                Place::new(PARQUET, self.entries.rows.len() as u64 - 1)
            }
        };
        let e = &mut self.entries;
        e.places.push(place);
        e.labels.push(label);
        e.sizes.push(size);
    }

    pub(super) fn finish(self) -> Entries {
        let mut e = self.entries;
        e.labels.shrink_to_fit();
        e.sizes.shrink_to_fit();
        e.places.shrink_to_fit();
        e.paths.shrink_to_fit();
        e.members.shrink_to_fit();
        e.names.shrink_to_fit();
        e.rows.shrink_to_fit();
        e.parquet_files.shrink_to_fit();
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_written_once_however_many_samples_name_it() {
        let mut b = Builder::with_capacity(4);
        for i in 0..1000 {
            b.push(LocationRef::File { path: Path::new(["a.jpg", "b.jpg"][i % 2]) }, 0, 1);
        }
        b.push(LocationRef::TarMember { shard: Path::new("a.jpg"), member: "m", offset: 3, len: 4 }, 1, 4);
        let e = b.finish();
        assert_eq!(e.paths.ends.len(), 2, "two distinct paths");
        assert_eq!(e.len(), 1001);
        assert_eq!(e.location(1), LocationRef::File { path: Path::new("b.jpg") });
        assert_eq!(
            e.location(1000),
            LocationRef::TarMember { shard: Path::new("a.jpg"), member: "m", offset: 3, len: 4 }
        );
    }

    #[test]
    fn every_kind_reads_back_as_it_was_pushed() {
        let pushed = [
            LocationRef::TarMember { shard: Path::new("s0.tar"), member: "x/1.jpg", offset: 512, len: 10 },
            LocationRef::ParquetRow { file: Path::new("d.parquet"), row_group: 2, row: 7, column: 1 },
            LocationRef::File { path: Path::new("") },
            LocationRef::TarMember { shard: Path::new("s0.tar"), member: "", offset: 1024, len: 0 },
            LocationRef::ParquetRow { file: Path::new("d.parquet"), row_group: 0, row: 0, column: 3 },
            LocationRef::File { path: Path::new("dir/ünï.jpg") },
        ];
        let mut b = Builder::with_capacity(0);
        for (i, l) in pushed.iter().enumerate() {
            b.push(*l, i as i64 - 1, i as u64 * 10);
        }
        let e = b.finish();
        for (i, l) in pushed.iter().enumerate() {
            assert_eq!(e.location(i), *l);
            assert_eq!((e.labels()[i], e.sizes()[i]), (i as i64 - 1, i as u64 * 10));
        }
        assert_eq!(e.parquet_files.len(), 2, "one Parquet file, two columns");
    }
}
