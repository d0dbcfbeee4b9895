//! The dispatcher's journal: an append-only file of JSON lines, one [`Record`] each,
//! fsync'd before the RPC that caused it is answered. Replaying it rebuilds every job, its
//! epoch, which tasks are acknowledged and which are leased to whom.
//!
//! Writes go through one thread that commits in groups: it takes every record queued
//! while the previous fsync ran and makes them durable with one more, so many concurrent
//! requests cost one fsync, not one each.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

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
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

struct Pending {
    line: Vec<u8>,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

/// A handle that appends records; cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: Option<mpsc::Sender<Pending>>,
    path: PathBuf,
}

/// Waits until a record is on disk.
pub struct Durable {
    rx: Option<oneshot::Receiver<Result<(), String>>>,
    path: PathBuf,
}

impl Durable {
    pub async fn wait(self) -> Result<(), ServiceError> {
        let Some(rx) = self.rx else { return Ok(()) };
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(ServiceError::Journal { path: self.path, message }),
            Err(_) => Err(ServiceError::Journal { path: self.path, message: "journal writer stopped".into() }),
        }
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
        // Cut a torn tail so new records start on a line of their own.
        if file.metadata().map(|m| m.len()).unwrap_or(0) > valid_len {
            file.set_len(valid_len).map_err(|e| jerr(format!("cannot truncate a torn tail: {e}")))?;
        }
        let (tx, rx) = mpsc::channel::<Pending>();
        let p = path.to_path_buf();
        std::thread::Builder::new()
            .name("sluice-journal".into())
            .spawn(move || writer(file, rx, p))
            .map_err(|e| jerr(format!("cannot start the writer thread: {e}")))?;
        Ok((Self { tx: Some(tx), path: path.to_path_buf() }, records))
    }

    /// A journal that keeps nothing (for tests and `--journal` left out).
    pub fn disabled() -> Self {
        Self { tx: None, path: PathBuf::from("<none>") }
    }

    /// Queues `record`; await the returned [`Durable`] before acting on it outside.
    pub fn append(&self, record: &Record) -> Durable {
        let Some(tx) = &self.tx else {
            return Durable { rx: None, path: self.path.clone() };
        };
        let (done_tx, done_rx) = oneshot::channel();
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                let _ = done_tx.send(Err(format!("cannot encode record: {e}")));
                return Durable { rx: Some(done_rx), path: self.path.clone() };
            }
        };
        line.push(b'\n');
        let _ = tx.send(Pending { line, done: Some(done_tx) });
        Durable { rx: Some(done_rx), path: self.path.clone() }
    }
}

fn writer(mut file: File, rx: mpsc::Receiver<Pending>, path: PathBuf) {
    let mut buf = Vec::new();
    let mut waiting = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        buf.clear();
        for p in &mut batch {
            buf.extend_from_slice(&p.line);
            waiting.extend(p.done.take());
        }
        let result = file.write_all(&buf).and_then(|()| file.sync_data()).map_err(|e| e.to_string());
        if let Err(e) = &result {
            tracing::error!(path = %path.display(), error = %e, "journal write failed");
        }
        for w in waiting.drain(..) {
            let _ = w.send(result.clone());
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
            j.append(r).wait().await.unwrap();
        }
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"t\":\"ack\",\"job_").unwrap();
        drop(f);
        let (j2, back) = Journal::open(&path).unwrap();
        assert_eq!(back, recs.to_vec());
        j2.append(&Record::Ack { job_id: 1, epoch: 0, task: 3 }).wait().await.unwrap();
        drop(j2);
        let (_, again) = Journal::open(&path).unwrap();
        assert_eq!(again.len(), 4);
    }
}
