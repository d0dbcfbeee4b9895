//! The dispatcher's journal: an append-only file of JSON lines, one [`Record`] each,
//! fsync'd before the RPC that caused it (or any RPC decided after it) is answered. Replaying it rebuilds every job, its
//! epoch, which tasks are acknowledged and which are leased to whom.
//!
//! Writes go through one thread that commits in groups: it takes every record queued
//! while the previous fsync ran and makes them durable with one more, so many concurrent
//! requests cost one fsync, not one each. A failed write stops the journal for good (the
//! torn append cut back) and the dispatcher with it: memory is then ahead of the disk.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::ServiceError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Record {
    Job {
        job_id: u64,
        name: String,
        spec_json: String,
        fingerprint: String,
        manifest_fingerprint: String,
        batches_per_epoch: u64,
        samples_per_epoch: u64,
        task_batches: u64,
        /// Parallel epochs: full passes per epoch (batch and sample counts above are per
        /// pass). Absent (older journals) or 0 means 1.
        #[serde(default, skip_serializing_if = "is_zero")]
        passes: u64,
    },
    /// `epoch` begins; batches in `skip` were delivered before (a resumed checkpoint).
    Epoch {
        job_id: u64,
        epoch: u64,
        skip: Vec<u64>,
    },
    Assign {
        job_id: u64,
        epoch: u64,
        task: u64,
        client: String,
        /// The client's request id (see `GetTaskRequest::request_id`).
        #[serde(default)]
        request: u64,
    },
    /// The task's holder received batches up to `start` before its worker failed; the
    /// task now covers only the rest and is up for grabs again.
    Requeue {
        job_id: u64,
        epoch: u64,
        task: u64,
        start: u64,
    },
    Ack {
        job_id: u64,
        epoch: u64,
        task: u64,
    },
    /// `epoch` (the next one, some of whose tasks were leased ahead) becomes the current
    /// one, keeping those leases. An `Assign` for the epoch after the current one creates it.
    Advance {
        job_id: u64,
        epoch: u64,
    },
    /// Importance values a trainer reported, as checked (unknown keys and invalid values
    /// left out); `kind` is the `ReportKind` number.
    Report {
        job_id: u64,
        keys: Vec<u64>,
        values: Vec<f64>,
        #[serde(default)]
        kind: i32,
    },
    /// The importance-sampled epoch was drawn from the store as the records before it left
    /// it, with the service's cache capacity in entries `hot` (if known) and its samples
    /// placed on `members` (none: cache-blind; see `dispatcher::state::placement`).
    Draw {
        job_id: u64,
        epoch: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hot: Option<u64>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<crate::dispatcher::state::Member>,
    },
    /// The autoscaler's target became `workers` (its decision or an operator's order). A
    /// restarted dispatcher resumes the last one, so `sluice up` keeps its workers.
    Scale {
        workers: u64,
    },
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

struct Pending {
    line: Vec<u8>,
    seq: u64,
}

/// Where the writer stands: the last record on disk, and why it stopped if it did.
#[derive(Debug, Clone, Default)]
struct Progress {
    durable: u64,
    failed: Option<String>,
}

/// A handle that appends records; cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: Option<mpsc::Sender<Pending>>,
    path: PathBuf,
    /// Sequence number of the last record appended (records are numbered from 1).
    appended: Arc<AtomicU64>,
    progress: watch::Receiver<Progress>,
}

/// The file under the writer: appends made durable, and cutting back a torn append.
trait JournalFile: Send + 'static {
    /// Writes `bytes` at the end and makes them durable.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Cuts the file back to `len` bytes, durably.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
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
        Ok(Self { tx: Some(tx), path: path.to_path_buf(), appended: Arc::new(AtomicU64::new(0)), progress })
    }

    /// A journal that keeps nothing (for tests and `--journal` left out).
    pub fn disabled() -> Self {
        let (_, progress) = watch::channel(Progress::default());
        Self { tx: None, path: PathBuf::from("<none>"), appended: Arc::new(AtomicU64::new(0)), progress }
    }

    fn error(&self, message: String) -> ServiceError {
        ServiceError::Journal { path: self.path.clone(), message }
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
        let seq = self.appended.fetch_add(1, Ordering::SeqCst) + 1;
        tx.send(Pending { line, seq }).map_err(|_| self.error("journal writer stopped".into()))
    }

    /// The sequence number of the last record appended: a reply decided now waits for it.
    pub fn appended(&self) -> u64 {
        self.appended.load(Ordering::SeqCst)
    }

    /// Waits until every record up to `seq` is on disk; an error if the journal failed first.
    pub async fn durable(&self, seq: u64) -> Result<(), ServiceError> {
        if self.tx.is_none() || seq == 0 {
            return Ok(());
        }
        let mut rx = self.progress.clone();
        let p = rx
            .wait_for(|p| p.durable >= seq || p.failed.is_some())
            .await
            .map_err(|_| self.error("journal writer stopped".into()))?
            .clone();
        match p.failed {
            Some(why) if p.durable < seq => Err(self.error(why)),
            _ => Ok(()),
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

/// Writes queued records in groups, one fsync each. The first failure stops it for good:
/// the torn append is cut back (so the file stays replayable) and every waiter, now and
/// later, gets the error.
fn writer(
    mut file: impl JournalFile,
    mut len: u64,
    rx: mpsc::Receiver<Pending>,
    progress: watch::Sender<Progress>,
    path: PathBuf,
) {
    let mut buf = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut last = first.seq;
        buf.clear();
        buf.extend_from_slice(&first.line);
        while let Ok(more) = rx.try_recv() {
            buf.extend_from_slice(&more.line);
            last = more.seq;
        }
        match file.append(&buf) {
            Ok(()) => {
                len += buf.len() as u64;
                progress.send_modify(|p| p.durable = last);
            }
            Err(e) => {
                let mut why = format!("write failed: {e}");
                if let Err(t) = file.truncate(len) {
                    why.push_str(&format!("; cutting back to the last good record failed too: {t}"));
                }
                tracing::error!(path = %path.display(), error = %why, "journal write failed; the dispatcher stops");
                progress.send_modify(|p| p.failed = Some(why));
                return;
            }
        }
    }
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

    /// A file whose `fail_at`-th append writes half its bytes and fails (a full disk).
    struct Flaky {
        file: File,
        appends: usize,
        fail_at: usize,
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
            self.file.truncate(len)
        }
    }

    #[tokio::test]
    async fn a_failed_write_stops_the_journal_and_leaves_it_replayable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let file = OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let j = Journal::start(Flaky { file, appends: 0, fail_at: 2 }, 0, &path).unwrap();
        let rec = |task| Record::Ack { job_id: 1, epoch: 0, task };
        j.append(&rec(0)).unwrap();
        j.durable(j.appended()).await.unwrap();
        // The second write tears: its waiter hears of it, and so does the dispatcher.
        j.append(&rec(1)).unwrap();
        let torn = j.appended();
        let e = j.durable(torn).await.unwrap_err().to_string();
        assert!(e.contains("no space left on device"), "{e}");
        let why = tokio::time::timeout(std::time::Duration::from_secs(5), j.failed()).await.unwrap();
        assert!(why.contains("no space left on device"), "{why}");
        // Nothing more is taken, so nothing lands after the torn line.
        assert!(j.append(&rec(2)).is_err(), "a failed journal takes no more records");
        drop(j);
        // A restart replays exactly what was durable.
        let (_, back) = Journal::open(&path).unwrap();
        assert_eq!(back, vec![rec(0)]);
    }
}
