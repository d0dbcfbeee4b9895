//! What the journal holds: one [`Record`] per line, and the types its records are made
//! of. The dispatcher's state (`dispatcher::state`) builds these and replays them; nothing
//! here depends on it.

use serde::{Deserialize, Serialize};

/// A worker's part in a draw's placement: its address and its cache's capacity in entries
/// (0 when it has not said).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub addr: String,
    pub capacity: u64,
}

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
        members: Vec<Member>,
    },
    /// The autoscaler's target became `workers` (its decision or an operator's order). A
    /// restarted dispatcher resumes the last one, so `sluice up` keeps its workers.
    Scale {
        workers: u64,
    },
    /// A compacted journal's picture of one epoch of a job, its current one (or, `ahead`,
    /// the next one, some of whose tasks were leased ahead): it stands for every record that
    /// built it.
    EpochTasks {
        job_id: u64,
        epoch: u64,
        generation: u64,
        #[serde(default, skip_serializing_if = "is_false")]
        ahead: bool,
        tasks: Vec<TaskRecord>,
        /// Pending tasks in the order they are handed out.
        queue: Vec<u64>,
        /// The client requests that got a task (client, request id, task): a retried
        /// request gets the same task back.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        requests: Vec<(String, u64, u64)>,
    },
    /// The next lease id (a compacted journal no longer has every `Assign` that counted it).
    Leases {
        next: u64,
    },
}

/// One task in [`Record::EpochTasks`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub start: u64,
    pub end: u64,
    /// 0 pending, 1 leased (to `holder`), 2 acknowledged.
    pub status: u8,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lease: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub holder: String,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}
