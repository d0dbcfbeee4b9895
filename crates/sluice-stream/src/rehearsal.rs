//! The rehearsal buffer: a fixed number of past samples (their encoded bytes, so each
//! draw is augmented afresh), kept by reservoir sampling, uniform over the stream so far,
//! or class-balanced reservoir sampling (Chrysakis & Moens, ICML 2020), which gives every
//! class seen an equal share. Its contents go to a file the checkpoint names; with
//! `rehearsal.persist` every offer is also appended to an exemplar file as it happens
//! ([`ExemplarLog`]), so the buffer survives a restart without a checkpoint.

use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_core::{SampleKey, SampleRng};

use crate::entry::Sample;
use crate::error::StreamError;

/// Rehearsal files kept: the newest, and the one the previous checkpoint names. An older
/// state cannot be restored ([`StreamError::RehearsalGone`]).
pub const KEEP_FILES: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RehearsalPolicy {
    /// Every sample seen so far is in the buffer with the same probability.
    #[default]
    Reservoir,
    /// Each class seen gets an equal share of the buffer; within a class, reservoir.
    ClassBalanced,
}

/// A sample kept for rehearsal.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub id: u64,
    pub label: i64,
    pub image: Vec<u8>,
}

/// What the buffer is, besides its contents: saved inside the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RehearsalState {
    pub policy: RehearsalPolicy,
    pub capacity: usize,
    /// Samples offered so far.
    pub seen: u64,
    /// Samples offered so far, per class.
    pub seen_per_class: BTreeMap<i64, u64>,
    /// The file holding the contents.
    pub file: PathBuf,
    /// Samples in the file, to check it against.
    pub len: usize,
}

pub struct Rehearsal {
    policy: RehearsalPolicy,
    capacity: usize,
    seed: u64,
    items: Vec<Arc<Stored>>,
    seen: u64,
    seen_per_class: BTreeMap<i64, u64>,
    /// Where offers are persisted as they happen (`rehearsal.persist`).
    log: Option<ExemplarLog>,
}

impl Rehearsal {
    pub fn new(policy: RehearsalPolicy, capacity: usize, seed: u64) -> Self {
        // Slots grow as samples arrive: a large capacity reserves nothing up front.
        Self { policy, capacity, seed, items: Vec::new(), seen: 0, seen_per_class: BTreeMap::new(), log: None }
    }

    /// The buffer persisted in `path` (`rehearsal.persist`): replayed from the file when
    /// it exists (a restart), empty otherwise; from now on every offer is appended to it.
    pub fn open_persisted(
        policy: RehearsalPolicy,
        capacity: usize,
        seed: u64,
        path: &Path,
        max_image_bytes: u64,
    ) -> Result<Self, StreamError> {
        let mut r = match std::fs::File::open(path) {
            Ok(f) => ExemplarLog::replay(BufReader::new(f), path, policy, capacity, seed, max_image_bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::new(policy, capacity, seed),
            Err(source) => return Err(StreamError::RehearsalFile { path: path.to_path_buf(), source }),
        };
        r.persist_at(path)?;
        Ok(r)
    }

    /// Persists the buffer in `path` from now on: the file is rewritten with the present
    /// contents and counts (through a temporary file and a rename), then appended to.
    pub fn persist_at(&mut self, path: &Path) -> Result<(), StreamError> {
        self.log = None;
        self.log = Some(ExemplarLog::compact(self, path)?);
        Ok(())
    }

    /// Writes what the exemplar file has buffered (a no-op without `persist`), and
    /// compacts it once it holds many more records than the buffer has slots.
    pub fn flush_log(&mut self) -> Result<(), StreamError> {
        let Some(log) = self.log.as_mut() else { return Ok(()) };
        log.flush()?;
        if log.records > 4 * self.capacity as u64 + 1024 {
            let path = log.path.clone();
            self.persist_at(&path)?;
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn items(&self) -> &[Arc<Stored>] {
        &self.items
    }

    /// The draw for the `n`th offer: depends only on the seed, the count and the id.
    fn rng(&self, id: u64) -> SampleRng {
        SampleRng::new(self.seed, self.seen, SampleKey(id), 0x7265_6865)
    }

    /// Offers a sample just trained on (or spilled); returns whether it was kept.
    pub fn offer(&mut self, s: &Sample) -> bool {
        if self.capacity == 0 {
            return false;
        }
        // Saturating: a restored state's counts are data.
        self.seen = self.seen.saturating_add(1);
        let per_class = self.seen_per_class.entry(s.label).or_default();
        *per_class = per_class.saturating_add(1);
        let slot = if self.items.len() < self.capacity {
            Some(self.items.len())
        } else {
            let mut rng = self.rng(s.id);
            match self.policy {
                RehearsalPolicy::Reservoir => {
                    let j = (rng.next_u64() % self.seen) as usize;
                    (j < self.capacity).then_some(j)
                }
                RehearsalPolicy::ClassBalanced => self.class_balanced_slot(s.label, &mut rng),
            }
        };
        if let Some(log) = self.log.as_mut() {
            let kind = if slot.is_some() { Record::OFFERED_KEPT } else { Record::OFFERED };
            log.append(kind, s.id, s.label, slot, &s.image);
        }
        let Some(j) = slot else { return false };
        let stored = Arc::new(Stored { id: s.id, label: s.label, image: s.image.clone() });
        if j == self.items.len() {
            self.items.push(stored);
        } else {
            self.items[j] = stored;
        }
        true
    }

    /// CBRS: a sample of a class that is not among the largest in the buffer replaces a
    /// random member of a largest class; otherwise it replaces a random member of its own
    /// class with probability (its class's share) / (its class's count seen).
    fn class_balanced_slot(&self, label: i64, rng: &mut SampleRng) -> Option<usize> {
        let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
        for it in &self.items {
            *counts.entry(it.label).or_default() += 1;
        }
        let largest = counts.values().copied().max().unwrap_or(0);
        let mine = counts.get(&label).copied().unwrap_or(0);
        let pick_of = |class: i64, rng: &mut SampleRng| {
            let members: Vec<usize> = (0..self.items.len()).filter(|&i| self.items[i].label == class).collect();
            members.get((rng.next_u64() % members.len().max(1) as u64) as usize).copied()
        };
        if mine < largest {
            let biggest: Vec<i64> = counts.iter().filter(|(_, &n)| n == largest).map(|(&c, _)| c).collect();
            let class = biggest[(rng.next_u64() % biggest.len() as u64) as usize];
            return pick_of(class, rng);
        }
        let seen = self.seen_per_class.get(&label).copied().unwrap_or(1);
        let keep = rng.next_f64() < mine as f64 / seen as f64;
        if keep {
            pick_of(label, rng)
        } else {
            None
        }
    }

    /// `n` indices into the buffer for batch `batch`, uniform, without repeats when the
    /// buffer holds enough.
    pub fn draw(&self, n: usize, batch: u64) -> Vec<usize> {
        let len = self.items.len();
        if len == 0 || n == 0 {
            return Vec::new();
        }
        if n >= len {
            return (0..n).map(|i| i % len).collect();
        }
        distinct(len, n, &mut SampleRng::new(self.seed, batch, SampleKey(u64::MAX), 0x6472_6177))
    }

    /// Writes the contents to `file` (through a temporary file and a rename, so a crash
    /// leaves either the old file or the new one) and returns the state naming it.
    pub fn save(&self, file: &Path) -> Result<RehearsalState, StreamError> {
        let io = |source| StreamError::RehearsalWrite { path: file.to_path_buf(), source };
        let tmp = file.with_extension("tmp");
        let mut w = BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        w.write_all(MAGIC).map_err(io)?;
        w.write_all(&(self.items.len() as u64).to_le_bytes()).map_err(io)?;
        for it in &self.items {
            w.write_all(&it.id.to_le_bytes()).map_err(io)?;
            w.write_all(&it.label.to_le_bytes()).map_err(io)?;
            w.write_all(&(it.image.len() as u64).to_le_bytes()).map_err(io)?;
            w.write_all(&it.image).map_err(io)?;
        }
        let f = w.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, file).map_err(io)?;
        Ok(RehearsalState {
            policy: self.policy,
            capacity: self.capacity,
            seen: self.seen,
            seen_per_class: self.seen_per_class.clone(),
            file: file.to_path_buf(),
            len: self.items.len(),
        })
    }

    /// The buffer a state names, its contents read back from the state's file (each
    /// image at most `max_image_bytes`). The state's policy and capacity are the spec's
    /// (`StreamState::check`).
    pub fn load(state: &RehearsalState, seed: u64, max_image_bytes: u64) -> Result<Self, StreamError> {
        let path = &state.file;
        let file = std::fs::File::open(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => StreamError::RehearsalGone { path: path.clone(), kept: KEEP_FILES },
            _ => StreamError::RehearsalFile { path: path.clone(), source },
        })?;
        Self::read(BufReader::new(file), state, seed, max_image_bytes)
    }

    /// The buffer `state` describes, its contents read from `r` (the file's bytes).
    pub fn read(
        mut r: impl Read,
        state: &RehearsalState,
        seed: u64,
        max_image_bytes: u64,
    ) -> Result<Self, StreamError> {
        let path = &state.file;
        let corrupt = |problem: String| StreamError::RehearsalCorrupt { path: path.clone(), problem };
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic).map_err(|e| corrupt(format!("truncated: {e}")))?;
        if &magic != MAGIC {
            return Err(corrupt("not a sluice rehearsal buffer file".into()));
        }
        let mut word = [0u8; 8];
        let mut next = |r: &mut dyn Read| -> Result<u64, StreamError> {
            r.read_exact(&mut word).map_err(|e| corrupt(format!("truncated: {e}")))?;
            Ok(u64::from_le_bytes(word))
        };
        let n = next(&mut r)?;
        if n != state.len as u64 || n > state.capacity as u64 {
            return Err(corrupt(format!(
                "holds {n} samples; the checkpoint says {} (capacity {})",
                state.len, state.capacity
            )));
        }
        let mut items = Vec::new();
        for _ in 0..n {
            let id = next(&mut r)?;
            let label = next(&mut r)? as i64;
            let len = next(&mut r)?;
            if len > max_image_bytes {
                return Err(corrupt(format!(
                    "sample {id} is {len} bytes, over limits.max_file_bytes ({max_image_bytes})"
                )));
            }
            let mut image = Vec::new();
            let got = r.by_ref().take(len).read_to_end(&mut image).map_err(|e| corrupt(format!("unreadable: {e}")))?;
            if got as u64 != len {
                return Err(corrupt(format!("sample {id} is truncated ({got} of {len} bytes)")));
            }
            items.push(Arc::new(Stored { id, label, image }));
        }
        Ok(Self {
            policy: state.policy,
            capacity: state.capacity,
            seed,
            items,
            seen: state.seen,
            seen_per_class: state.seen_per_class.clone(),
            log: None,
        })
    }
}

/// The kinds of record in an exemplar file.
struct Record;

impl Record {
    /// A sample offered and not kept: it only counts as seen.
    const OFFERED: u8 = 0;
    /// A sample offered and kept in `slot`.
    const OFFERED_KEPT: u8 = 1;
    /// A sample in `slot` when the file was compacted (the header holds the counts).
    const PLACED: u8 = 2;
}

/// `rehearsal.persist`: the exemplars in a file of their own, as Liu, Nicolae et al. §4.2
/// propose ("if exemplars are persisted in the storage repository ..."). The file is a
/// header (policy, capacity and the counts of samples seen at its last compaction) and
/// one record per offer since: kind, id, label, slot, image length and bytes. Replaying
/// it gives the buffer, counts included, exactly as the offers left it; a record cut
/// short by a crash ends the replay. Writes are buffered and flushed before each batch.
pub struct ExemplarLog {
    path: PathBuf,
    out: BufWriter<std::fs::File>,
    records: u64,
    /// The first write that failed, reported by the next flush.
    failed: Option<std::io::Error>,
}

impl ExemplarLog {
    fn write_err(&self, source: std::io::Error) -> StreamError {
        StreamError::RehearsalWrite { path: self.path.clone(), source }
    }

    fn append(&mut self, kind: u8, id: u64, label: i64, slot: Option<usize>, image: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        let kept = slot.is_some();
        let image = if kept { image } else { &[][..] };
        let mut head = Vec::with_capacity(33);
        head.push(kind);
        head.extend_from_slice(&id.to_le_bytes());
        head.extend_from_slice(&label.to_le_bytes());
        head.extend_from_slice(&slot.map_or(u64::MAX, |j| j as u64).to_le_bytes());
        head.extend_from_slice(&(image.len() as u64).to_le_bytes());
        if let Err(e) = self.out.write_all(&head).and_then(|()| self.out.write_all(image)) {
            self.failed = Some(e);
        }
        self.records += 1;
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        if let Some(e) = self.failed.take() {
            return Err(self.write_err(e));
        }
        self.out.flush().map_err(|e| self.write_err(e))
    }

    /// Rewrites `path` as the buffer is now: a header with its counts and one placed
    /// record per slot; returns the log, open for appending.
    fn compact(r: &Rehearsal, path: &Path) -> Result<Self, StreamError> {
        let io = |source| StreamError::RehearsalWrite { path: path.to_path_buf(), source };
        let tmp = path.with_extension("exemplars.tmp");
        let mut w = BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        let mut head = Vec::new();
        head.extend_from_slice(LOG_MAGIC);
        head.push(r.policy as u8);
        head.extend_from_slice(&(r.capacity as u64).to_le_bytes());
        head.extend_from_slice(&r.seen.to_le_bytes());
        head.extend_from_slice(&(r.seen_per_class.len() as u64).to_le_bytes());
        for (label, n) in &r.seen_per_class {
            head.extend_from_slice(&label.to_le_bytes());
            head.extend_from_slice(&n.to_le_bytes());
        }
        w.write_all(&head).map_err(io)?;
        let mut log = Self { path: tmp.clone(), out: w, records: 0, failed: None };
        for (j, it) in r.items.iter().enumerate() {
            log.append(Record::PLACED, it.id, it.label, Some(j), &it.image);
        }
        log.flush()?;
        let f = log.out.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        let file = std::fs::OpenOptions::new().append(true).open(path).map_err(io)?;
        Ok(Self { path: path.to_path_buf(), out: BufWriter::new(file), records: 0, failed: None })
    }

    /// The buffer an exemplar file holds. Its policy and capacity must be the spec's.
    fn replay(
        mut r: impl Read,
        path: &Path,
        policy: RehearsalPolicy,
        capacity: usize,
        seed: u64,
        max_image_bytes: u64,
    ) -> Result<Rehearsal, StreamError> {
        let corrupt = |problem: String| StreamError::RehearsalCorrupt { path: path.to_path_buf(), problem };
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic).map_err(|e| corrupt(format!("truncated: {e}")))?;
        if &magic != LOG_MAGIC {
            return Err(corrupt("not a sluice rehearsal exemplar file".into()));
        }
        let mut byte = [0u8; 1];
        r.read_exact(&mut byte).map_err(|e| corrupt(format!("truncated: {e}")))?;
        let mut word = [0u8; 8];
        let mut next = |r: &mut dyn Read| -> std::io::Result<u64> {
            r.read_exact(&mut word)?;
            Ok(u64::from_le_bytes(word))
        };
        let head = |e: std::io::Error| corrupt(format!("truncated header: {e}"));
        let saved_capacity = next(&mut r).map_err(head)?;
        if byte[0] != policy as u8 || saved_capacity != capacity as u64 {
            return Err(corrupt(format!(
                "written for policy {} and capacity {saved_capacity}; the spec says {policy:?} and {capacity}:                  move the file away to start an empty buffer",
                byte[0]
            )));
        }
        let mut out = Rehearsal::new(policy, capacity, seed);
        out.seen = next(&mut r).map_err(head)?;
        let classes = next(&mut r).map_err(head)?;
        for _ in 0..classes.min(1 << 24) {
            let label = next(&mut r).map_err(head)? as i64;
            out.seen_per_class.insert(label, next(&mut r).map_err(head)?);
        }
        loop {
            // A record cut short (a crash while it was written) ends the file.
            if r.read_exact(&mut byte).is_err() {
                break;
            }
            let Ok(id) = next(&mut r) else { break };
            let Ok(label) = next(&mut r).map(|l| l as i64) else { break };
            let Ok(slot) = next(&mut r) else { break };
            let Ok(len) = next(&mut r) else { break };
            if len > max_image_bytes {
                return Err(corrupt(format!(
                    "sample {id} is {len} bytes, over limits.max_file_bytes ({max_image_bytes})"
                )));
            }
            let mut image = Vec::new();
            if r.by_ref().take(len).read_to_end(&mut image).map_or(true, |got| got as u64 != len) {
                break;
            }
            if byte[0] != Record::PLACED {
                out.seen = out.seen.saturating_add(1);
                let n = out.seen_per_class.entry(label).or_default();
                *n = n.saturating_add(1);
            }
            if slot == u64::MAX {
                continue;
            }
            let stored = Arc::new(Stored { id, label, image });
            match usize::try_from(slot) {
                Ok(j) if j < out.items.len() => out.items[j] = stored,
                Ok(j) if j == out.items.len() && j < capacity => out.items.push(stored),
                _ => {
                    return Err(corrupt(format!(
                        "sample {id} goes to slot {slot} of a buffer holding {} (capacity {capacity})",
                        out.items.len()
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// `n` distinct indices below `len` (all of them if `n >= len`), uniform: Floyd's
/// algorithm, without shuffling the whole range.
pub fn distinct(len: usize, n: usize, rng: &mut SampleRng) -> Vec<usize> {
    if n >= len {
        return (0..len).collect();
    }
    let mut picked: Vec<usize> = Vec::with_capacity(n);
    for j in len - n..len {
        let t = (rng.next_u64() % (j as u64 + 1)) as usize;
        picked.push(if picked.contains(&t) { j } else { t });
    }
    picked
}

const MAGIC: &[u8; 8] = b"SLRB\x00\x00\x00\x01";
const LOG_MAGIC: &[u8; 8] = b"SLRX\x00\x00\x00\x01";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sample(id: u64, label: i64) -> Sample {
        Sample { entry: format!("{id}-0"), id, label, image: vec![id as u8; 3] }
    }

    #[test]
    fn reservoir_keeps_a_uniform_sample_of_the_whole_stream() {
        // 10 classes of 1000 in order; a uniform reservoir of 200 holds ~20 of each.
        let mut r = Rehearsal::new(RehearsalPolicy::Reservoir, 200, 3);
        for id in 0..10_000u64 {
            r.offer(&sample(id, (id / 1000) as i64));
        }
        assert_eq!(r.len(), 200);
        let first_half = r.items().iter().filter(|s| s.id < 5000).count();
        assert!((70..=130).contains(&first_half), "{first_half} of 200 from the first half");
    }

    #[test]
    fn class_balanced_gives_each_class_an_equal_share_despite_imbalance() {
        // Class 0 floods the stream (9000), then classes 1..=4 with 250 each.
        let mut r = Rehearsal::new(RehearsalPolicy::ClassBalanced, 100, 1);
        let mut id = 0;
        for (class, n) in [(0, 9000), (1, 250), (2, 250), (3, 250), (4, 250)] {
            for _ in 0..n {
                r.offer(&sample(id, class));
                id += 1;
            }
        }
        for class in 0..5 {
            let n = r.items().iter().filter(|s| s.label == class).count();
            assert_eq!(n, 20, "class {class} holds {n} of 100");
        }
    }

    #[test]
    fn persisted_exemplars_survive_a_restart_and_go_on_as_if_none_happened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.exemplars");
        for policy in [RehearsalPolicy::Reservoir, RehearsalPolicy::ClassBalanced] {
            let _ = std::fs::remove_file(&path);
            // One buffer that never stops, one restarted (dropped, reopened) every 700
            // offers with a flush before: both hold the same samples after 3000.
            let mut straight = Rehearsal::new(policy, 50, 9);
            let mut restarted = Rehearsal::open_persisted(policy, 50, 9, &path, 1 << 20).unwrap();
            for id in 0..3000u64 {
                let s = sample(id, (id % 7) as i64);
                straight.offer(&s);
                restarted.offer(&s);
                if id % 700 == 699 {
                    restarted.flush_log().unwrap();
                    drop(restarted);
                    restarted = Rehearsal::open_persisted(policy, 50, 9, &path, 1 << 20).unwrap();
                }
            }
            restarted.flush_log().unwrap();
            assert_eq!(restarted.items(), straight.items(), "{policy:?}");
            assert_eq!((restarted.seen, &restarted.seen_per_class), (straight.seen, &straight.seen_per_class));
            // The last offers since the last compaction are in the file: a reopen has them.
            let back = Rehearsal::open_persisted(policy, 50, 9, &path, 1 << 20).unwrap();
            assert_eq!(back.items(), straight.items());
        }
    }

    #[test]
    fn an_exemplar_file_cut_short_keeps_what_was_whole_and_a_changed_spec_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.exemplars");
        let mut r = Rehearsal::open_persisted(RehearsalPolicy::Reservoir, 10, 1, &path, 1 << 20).unwrap();
        for id in 0..5 {
            r.offer(&sample(id, 0));
        }
        r.flush_log().unwrap();
        drop(r);
        // A crash in the middle of the sixth record.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[1, 5, 0, 0]);
        std::fs::write(&path, &bytes).unwrap();
        let back = Rehearsal::open_persisted(RehearsalPolicy::Reservoir, 10, 1, &path, 1 << 20).unwrap();
        assert_eq!(back.items().iter().map(|s| s.id).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        drop(back);
        let err = Rehearsal::open_persisted(RehearsalPolicy::Reservoir, 20, 1, &path, 1 << 20)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("capacity 10") && err.contains("s.exemplars"), "{err}");
    }

    #[test]
    fn contents_round_trip_through_the_file_and_draws_are_distinct() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Rehearsal::new(RehearsalPolicy::ClassBalanced, 8, 5);
        for id in 0..30 {
            r.offer(&sample(id, (id % 3) as i64));
        }
        let state = r.save(&dir.path().join("buf.bin")).unwrap();
        let back = Rehearsal::load(&state, 5, 1 << 20).unwrap();
        assert_eq!(back.items(), r.items());
        assert_eq!(back.seen, 30);
        let mut d = r.draw(5, 7);
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 5);
        std::fs::write(&state.file, b"garbage!").unwrap();
        let err = Rehearsal::load(&state, 5, 1 << 20).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("not a sluice rehearsal buffer file"), "{err}");
    }
}
