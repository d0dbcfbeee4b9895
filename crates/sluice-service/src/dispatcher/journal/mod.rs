//! The dispatcher's journal: an append-only file of JSON lines, one [`Record`] each,
//! fsync'd before the RPC that caused it (or any RPC decided after it) is answered. Replaying it rebuilds every job, its
//! epoch, which tasks are acknowledged and which are leased to whom.
//!
//! Writes go through one thread that commits in groups: it takes every record queued
//! while the previous fsync ran and makes them durable with one more, so many concurrent
//! requests cost one fsync, not one each.
//!
//! A failed write (a full disk) is cut back and written again, with back-off, until the
//! disk takes it: meanwhile the requests waiting on it fail with
//! [`ServiceError::JournalStalled`] (clients retry it) and the dispatcher refuses new
//! changes ([`Journal::ready`]), so it goes on, in order, once the disk has room. Only a
//! torn write that cannot be cut back stops the journal for good, and the dispatcher with
//! it: the file would no longer replay.
//!
//! Compaction: once the records appended since the last compaction pass
//! [`COMPACT_MIN_BYTES`] and four times the last snapshot, the dispatcher hands the writer
//! a snapshot of its state ([`Journal::compact`]), which replaces the file (written aside,
//! then renamed over it): every job, the importance reports and draws of importance-sampled
//! jobs as they were, and each job's epochs as they stand now. Its size follows the state,
//! not the history, and each byte appended is rewritten a bounded number of times.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use tokio::sync::watch;

use crate::error::ServiceError;

mod records;
pub use records::{Member, Record, TaskRecord};

/// Compaction waits for at least this many bytes appended since the last one.
pub const COMPACT_MIN_BYTES: u64 = 64 << 10;

enum Pending {
    Record {
        line: Vec<u8>,
        seq: u64,
    },
    /// Replace the file: `head`, the importance records of the file as it is, then `tail`.
    Compact {
        head: Vec<u8>,
        tail: Vec<u8>,
    },
    /// Everything queued before it is done (written, or compacted).
    Settled(tokio::sync::oneshot::Sender<()>),
}

/// Where the writer stands: the last record on disk, why it stopped if it did, and why
/// its last write failed while it writes it again.
#[derive(Debug, Clone, Default)]
struct Progress {
    durable: u64,
    failed: Option<String>,
    stalled: Option<String>,
}

/// A handle that appends records; cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: Option<mpsc::Sender<Pending>>,
    path: PathBuf,
    /// Sequence number of the last record appended (records are numbered from 1).
    appended: Arc<AtomicU64>,
    /// Bytes appended since the last compaction, and the size of the last snapshot.
    since_compaction: Arc<AtomicU64>,
    snapshot_bytes: Arc<AtomicU64>,
    progress: watch::Receiver<Progress>,
}

/// The file under the writer: appends made durable, and cutting back a torn append.
trait JournalFile: Send + 'static {
    /// Writes `bytes` at the end and makes them durable.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Cuts the file back to `len` bytes, durably.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
    /// Replaces the file at `path` (this one) with `bytes`, durably, and appends to the new
    /// file from then on.
    fn replace(&mut self, path: &Path, bytes: &[u8]) -> std::io::Result<()>;
}

impl JournalFile for File {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write_all(bytes)?;
        self.sync_data()
    }

    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)?;
        self.sync_all()
    }

    fn replace(&mut self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".compact");
        let aside = PathBuf::from(aside);
        let mut f = File::create(&aside)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&aside, path)?;
        // The new file is the journal now: appends go on at its end.
        *self = f;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
                tracing::warn!(path = %path.display(), error = %e, "journal compaction: the folder was not synced");
            }
        }
        Ok(())
    }
}

impl Journal {
    /// Opens (creating) the journal at `path` and returns it with the records already in it.
    /// A torn last line (a crash mid-write) is dropped; a bad line anywhere else is an error.
    pub fn open(path: &Path) -> Result<(Self, Vec<Record>), ServiceError> {
        let jerr = |message: String| ServiceError::Journal { path: path.to_path_buf(), message };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| jerr(format!("cannot create its folder: {e}")))?;
        }
        let mut records = Vec::new();
        let mut valid_len = 0u64;
        if path.exists() {
            let f = File::open(path).map_err(|e| jerr(format!("cannot open: {e}")))?;
            let lines: Vec<String> = BufReader::new(f)
                .split(b'\n')
                .map(|l| l.map(|b| String::from_utf8_lossy(&b).into_owned()))
                .collect::<Result<_, _>>()
                .map_err(|e| jerr(format!("cannot read: {e}")))?;
            let n = lines.len();
            for (i, line) in lines.iter().enumerate() {
                if line.trim().is_empty() {
                    valid_len += line.len() as u64 + 1;
                    continue;
                }
                match serde_json::from_str::<Record>(line) {
                    Ok(r) => {
                        records.push(r);
                        valid_len += line.len() as u64 + 1;
                    }
                    Err(e) if i + 1 == n => {
                        tracing::warn!(path = %path.display(), error = %e, "dropping a torn last journal line");
                    }
                    Err(e) => return Err(jerr(format!("line {}: {e}", i + 1))),
                }
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| jerr(format!("cannot open for append: {e}")))?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        // Cut a torn tail so new records start on a line of their own.
        if len > valid_len {
            file.set_len(valid_len).map_err(|e| jerr(format!("cannot truncate a torn tail: {e}")))?;
        }
        let journal = Self::start(file, len.min(valid_len), path)?;
        // What the file holds counts towards the next compaction.
        journal.since_compaction.store(len.min(valid_len), Ordering::Relaxed);
        Ok((journal, records))
    }

    /// Starts the writer thread over `file`, whose first `len` bytes are good records.
    fn start(file: impl JournalFile, len: u64, path: &Path) -> Result<Self, ServiceError> {
        let (tx, rx) = mpsc::channel::<Pending>();
        let (progress_tx, progress) = watch::channel(Progress::default());
        let p = path.to_path_buf();
        std::thread::Builder::new()
            .name("sluice-journal".into())
            .spawn(move || writer(file, len, rx, progress_tx, p))
            .map_err(|e| ServiceError::Journal {
                path: path.to_path_buf(),
                message: format!("cannot start the writer thread: {e}"),
            })?;
        Ok(Self {
            tx: Some(tx),
            path: path.to_path_buf(),
            appended: Arc::new(AtomicU64::new(0)),
            since_compaction: Arc::new(AtomicU64::new(0)),
            snapshot_bytes: Arc::new(AtomicU64::new(0)),
            progress,
        })
    }

    /// A journal that keeps nothing (for tests and `--journal` left out).
    pub fn disabled() -> Self {
        let (_, progress) = watch::channel(Progress::default());
        Self {
            tx: None,
            path: PathBuf::from("<none>"),
            appended: Arc::new(AtomicU64::new(0)),
            since_compaction: Arc::new(AtomicU64::new(0)),
            snapshot_bytes: Arc::new(AtomicU64::new(0)),
            progress,
        }
    }

    fn error(&self, message: String) -> ServiceError {
        ServiceError::Journal { path: self.path.clone(), message }
    }

    /// Whether a change may be made now (call it before applying one): not while a write
    /// that failed is being written again ([`ServiceError::JournalStalled`]), nor once the
    /// journal has stopped.
    pub fn ready(&self) -> Result<(), ServiceError> {
        let p = self.progress.borrow();
        if let Some(why) = &p.failed {
            return Err(self.error(why.clone()));
        }
        if let Some(why) = &p.stalled {
            return Err(ServiceError::JournalStalled { path: self.path.clone(), message: why.clone() });
        }
        Ok(())
    }

    /// Whether the records appended since the last compaction call for another: past
    /// [`COMPACT_MIN_BYTES`] and four times the last snapshot's size.
    pub fn wants_compaction(&self) -> bool {
        let since = self.since_compaction.load(Ordering::Relaxed);
        self.tx.is_some() && since > COMPACT_MIN_BYTES.max(4 * self.snapshot_bytes.load(Ordering::Relaxed))
    }

    /// Replaces the journal with a snapshot of the state as every record appended so far
    /// left it (call it under the state's lock, like [`Journal::append`]): `head` (every
    /// job) comes first, then the `Report` and `Draw` records the file holds, then `tail`
    /// (each job's epochs, the lease counter, the scale).
    pub fn compact(&self, head: &[Record], tail: &[Record]) -> Result<(), ServiceError> {
        let Some(tx) = &self.tx else { return Ok(()) };
        let lines = |records: &[Record]| -> Result<Vec<u8>, ServiceError> {
            let mut out = Vec::new();
            for r in records {
                serde_json::to_writer(&mut out, r).map_err(|e| self.error(format!("cannot encode record: {e}")))?;
                out.push(b'\n');
            }
            Ok(out)
        };
        let (head, tail) = (lines(head)?, lines(tail)?);
        self.since_compaction.store(0, Ordering::Relaxed);
        self.snapshot_bytes.store((head.len() + tail.len()) as u64, Ordering::Relaxed);
        tx.send(Pending::Compact { head, tail }).map_err(|_| self.error("journal writer stopped".into()))
    }

    /// Queues `record` (call it in the order of decisions, under the state's lock); nothing
    /// that depends on it may leave the dispatcher before [`Journal::durable`] of
    /// [`Journal::appended`] says so. Fails once the journal has failed.
    pub fn append(&self, record: &Record) -> Result<(), ServiceError> {
        let Some(tx) = &self.tx else { return Ok(()) };
        if let Some(why) = self.failure() {
            return Err(self.error(why));
        }
        let mut line = serde_json::to_vec(record).map_err(|e| self.error(format!("cannot encode record: {e}")))?;
        line.push(b'\n');
        self.since_compaction.fetch_add(line.len() as u64, Ordering::Relaxed);
        let seq = self.appended.fetch_add(1, Ordering::SeqCst) + 1;
        tx.send(Pending::Record { line, seq }).map_err(|_| self.error("journal writer stopped".into()))
    }

    /// Waits until the writer has done everything queued so far, compactions included.
    pub async fn settle(&self) {
        let Some(tx) = &self.tx else { return };
        let (done, wait) = tokio::sync::oneshot::channel();
        if tx.send(Pending::Settled(done)).is_ok() {
            let _ = wait.await;
        }
    }

    /// The sequence number of the last record appended: a reply decided now waits for it.
    pub fn appended(&self) -> u64 {
        self.appended.load(Ordering::SeqCst)
    }

    /// Waits until every record up to `seq` is on disk; an error if a write failed first
    /// ([`ServiceError::JournalStalled`] while it is written again).
    pub async fn durable(&self, seq: u64) -> Result<(), ServiceError> {
        if self.tx.is_none() || seq == 0 {
            return Ok(());
        }
        let mut rx = self.progress.clone();
        let p = rx
            .wait_for(|p| p.durable >= seq || p.failed.is_some() || p.stalled.is_some())
            .await
            .map_err(|_| self.error("journal writer stopped".into()))?
            .clone();
        if p.durable >= seq {
            return Ok(());
        }
        match (p.failed, p.stalled) {
            (Some(why), _) => Err(self.error(why)),
            (None, Some(why)) => Err(ServiceError::JournalStalled { path: self.path.clone(), message: why }),
            (None, None) => Ok(()),
        }
    }

    /// Why the journal stopped taking records, if it did.
    pub fn failure(&self) -> Option<String> {
        self.progress.borrow().failed.clone()
    }

    /// Resolves when a write fails: the dispatcher must stop, since what it holds in memory
    /// is ahead of what a restart would replay. Never resolves for a disabled journal.
    pub async fn failed(&self) -> String {
        let mut rx = self.progress.clone();
        if self.tx.is_some() {
            if let Ok(p) = rx.wait_for(|p| p.failed.is_some()).await {
                return p.failed.clone().unwrap_or_default();
            }
        }
        std::future::pending().await
    }
}

/// Writes queued records in groups, one fsync each. A failed write is cut back and written
/// again (with back-off) until it succeeds, meanwhile reported as `stalled`; one that cannot
/// be cut back stops the writer for good, and every waiter, now and later, gets the error.
fn writer(
    mut file: impl JournalFile,
    mut len: u64,
    rx: mpsc::Receiver<Pending>,
    progress: watch::Sender<Progress>,
    path: PathBuf,
) {
    let mut buf = Vec::new();
    let mut compact = None;
    let mut settled = None;
    while let Ok(first) = rx.recv() {
        let mut last = None;
        buf.clear();
        let mut next = Some(first);
        while let Some(p) = next.take() {
            match p {
                Pending::Record { line, seq } => {
                    buf.extend_from_slice(&line);
                    last = Some(seq);
                    next = rx.try_recv().ok();
                }
                // Written after the records before it, before any after it.
                Pending::Compact { head, tail } => compact = Some((head, tail)),
                Pending::Settled(done) => settled = Some(done),
            }
        }
        if let Some(last) = last {
            let mut backoff = std::time::Duration::from_millis(50);
            loop {
                match file.append(&buf) {
                    Ok(()) => {
                        len += buf.len() as u64;
                        progress.send_modify(|p| {
                            p.durable = last;
                            p.stalled = None;
                        });
                        break;
                    }
                    Err(e) => {
                        let why = format!("write failed: {e}");
                        if let Err(t) = file.truncate(len) {
                            let why = format!("{why}; cutting back to the last good record failed too: {t}");
                            tracing::error!(path = %path.display(), error = %why, "journal write failed; the dispatcher stops");
                            progress.send_modify(|p| p.failed = Some(why));
                            return;
                        }
                        tracing::error!(path = %path.display(), error = %why, "journal write failed; writing it again, refusing changes meanwhile");
                        progress.send_modify(|p| p.stalled = Some(why));
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
                    }
                }
            }
        }
        if let Some((head, tail)) = compact.take() {
            match compacted(&path, &head, &tail).and_then(|bytes| file.replace(&path, &bytes).map(|()| bytes.len())) {
                Ok(n) => {
                    tracing::info!(path = %path.display(), from = len, to = n, "journal compacted");
                    len = n as u64;
                }
                // The old file is whole: appends go on there.
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "journal compaction failed; appending to the old file")
                }
            }
        }
        if let Some(done) = settled.take() {
            let _ = done.send(());
        }
    }
}

/// A compacted journal: `head`, the `Report` and `Draw` lines of the file at `path` in
/// their order, then `tail`.
fn compacted(path: &Path, head: &[u8], tail: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = head.to_vec();
    for line in BufReader::new(File::open(path)?).split(b'\n') {
        let line = line?;
        if let Ok(Record::Report { .. } | Record::Draw { .. }) = serde_json::from_slice::<Record>(&line) {
            out.extend_from_slice(&line);
            out.push(b'\n');
        }
    }
    out.extend_from_slice(tail);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_survive_reopen_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j/journal.jsonl");
        let (j, old) = Journal::open(&path).unwrap();
        assert!(old.is_empty());
        let recs = [
            Record::Epoch { job_id: 1, epoch: 0, skip: vec![] },
            Record::Assign { job_id: 1, epoch: 0, task: 2, client: "c".into(), request: 7 },
            Record::Ack { job_id: 1, epoch: 0, task: 2 },
        ];
        for r in &recs {
            j.append(r).unwrap();
            j.durable(j.appended()).await.unwrap();
        }
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"t\":\"ack\",\"job_").unwrap();
        drop(f);
        let (j2, back) = Journal::open(&path).unwrap();
        assert_eq!(back, recs.to_vec());
        j2.append(&Record::Ack { job_id: 1, epoch: 0, task: 3 }).unwrap();
        j2.durable(j2.appended()).await.unwrap();
        drop(j2);
        let (_, again) = Journal::open(&path).unwrap();
        assert_eq!(again.len(), 4);
    }

    /// A file whose `fail_at`-th append writes half its bytes and fails (a full disk), and
    /// whose truncation then fails too with `cannot_cut`.
    struct Flaky {
        file: File,
        appends: usize,
        fail_at: usize,
        cannot_cut: bool,
    }

    impl JournalFile for Flaky {
        fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            self.appends += 1;
            if self.appends == self.fail_at {
                self.file.write_all(&bytes[..bytes.len() / 2])?;
                return Err(std::io::Error::other("no space left on device"));
            }
            self.file.append(bytes)
        }

        fn truncate(&mut self, len: u64) -> std::io::Result<()> {
            if self.cannot_cut {
                return Err(std::io::Error::other("input/output error"));
            }
            self.file.truncate(len)
        }

        fn replace(&mut self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
            self.file.replace(path, bytes)
        }
    }

    fn rec(task: u64) -> Record {
        Record::Ack { job_id: 1, epoch: 0, task }
    }

    /// A journal at `path` on a disk whose second write tears (a full disk), cut back
    /// unless `cannot_cut`: its first record is written, and the request waiting for the
    /// second has heard why that one was not.
    async fn journal_torn_at_the_second_write(path: &Path, cannot_cut: bool) -> Journal {
        let file = OpenOptions::new().create(true).append(true).open(path).unwrap();
        let j = Journal::start(Flaky { file, appends: 0, fail_at: 2, cannot_cut }, 0, path).unwrap();
        j.append(&rec(0)).unwrap();
        j.durable(j.appended()).await.unwrap();
        j.append(&rec(1)).unwrap();
        let e = j.durable(j.appended()).await.unwrap_err().to_string();
        assert!(e.contains("no space left on device"), "{e}");
        j
    }

    #[tokio::test]
    async fn a_failed_write_fails_its_request_and_the_journal_goes_on_once_the_disk_takes_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let j = journal_torn_at_the_second_write(&path, false).await;
        assert!(matches!(j.ready(), Err(ServiceError::JournalStalled { .. })), "changes are taken while it stalls");
        // The disk takes writes again: the journal goes on, the torn record written again
        // in its place, and takes new records.
        let t0 = std::time::Instant::now();
        while let Err(e) = j.ready() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(5), "the journal takes no more records: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        j.append(&rec(2)).unwrap();
        j.durable(j.appended()).await.unwrap();
        assert!(j.failure().is_none());
        drop(j);
        let (_, back) = Journal::open(&path).unwrap();
        assert_eq!(back, vec![rec(0), rec(1), rec(2)]);
    }

    #[tokio::test]
    async fn a_torn_write_that_cannot_be_cut_back_stops_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        // The second write tears and stays torn: its waiter hears of it, and so does the
        // dispatcher, which stops.
        let j = journal_torn_at_the_second_write(&path, true).await;
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), j.failed()).await.unwrap();
        assert!(why.contains("input/output error"), "{why}");
        // Nothing more is taken.
        assert!(j.append(&rec(2)).is_err(), "a failed journal takes no more records");
        assert!(j.ready().is_err());
    }

    #[tokio::test]
    async fn a_compacted_journal_keeps_the_importance_records_between_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let (j, _) = Journal::open(&path).unwrap();
        let job = Record::Job {
            job_id: 1,
            name: "j".into(),
            spec_json: "{}".into(),
            fingerprint: "f".into(),
            manifest_fingerprint: "m".into(),
            batches_per_epoch: 4,
            samples_per_epoch: 16,
            task_batches: 1,
            passes: 0,
        };
        let report = Record::Report { job_id: 1, keys: vec![1], values: vec![0.5], kind: 0 };
        let draw = Record::Draw { job_id: 1, epoch: 0, hot: None, members: vec![] };
        for r in [&job, &report, &Record::Ack { job_id: 1, epoch: 0, task: 0 }, &draw] {
            j.append(r).unwrap();
        }
        let leases = Record::Leases { next: 7 };
        j.compact(std::slice::from_ref(&job), std::slice::from_ref(&leases)).unwrap();
        let after = Record::Ack { job_id: 1, epoch: 0, task: 1 };
        j.append(&after).unwrap();
        j.durable(j.appended()).await.unwrap();
        drop(j);
        let (_, back) = Journal::open(&path).unwrap();
        assert_eq!(back, vec![job, report, draw, leases, after]);
    }
}
