//! A barrier between the learner processes of one job on one machine (`sluice run
//! --barrier DIR`): at each named point a learner creates a file and waits until all
//! `world_size` learners have, as DDP's collectives line ranks up. It gives up after a
//! while rather than hang on a learner that died.
//!
//! The folder outlives a run, so a run first agrees on an id of its own, and its points'
//! files go in `DIR/run-<id>/`: files an earlier run left (finished or crashed) count for
//! nothing. To agree, each learner publishes `DIR/join.<rank>` holding a random id and keeps
//! it locked (`flock`) for as long as it lives; a join file counts once its learner holds
//! that lock, so one a dead learner left does not. Once every rank's file is held, rank 0's
//! id names the run, and rank 0 removes the folders of earlier runs. The join happens at the
//! first point, which no learner passes before every learner has joined, so no learner
//! exits (and lets go of its lock) while another still waits to see it.

use std::fs::{File, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::sampler::Shard;

/// How long a learner waits for the others at one point.
const PATIENCE: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(2);
/// Where the point files of the run with id X go: `DIR/run-X`.
const RUN_PREFIX: &str = "run-";

/// Why a learner could not pass a barrier point.
#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    #[error("barrier {point} in {dir}: {source}")]
    Io { point: String, dir: PathBuf, source: std::io::Error },
    #[error("barrier {point} in {dir}: {arrived} of {world_size} learners arrived within {PATIENCE:?}")]
    Timeout { point: String, dir: PathBuf, arrived: usize, world_size: usize },
}

/// One learner's side of the barrier (see the module docs).
pub struct Barrier {
    dir: PathBuf,
    shard: Shard,
    /// This learner's id, published in its join file.
    id: String,
    /// The run's folder, once every learner has joined.
    run: OnceLock<PathBuf>,
    /// This learner's join file, locked while the learner lives.
    joined: OnceLock<File>,
}

impl Barrier {
    /// The barrier in `dir` for the learner `shard.rank` of `shard.world_size`.
    pub fn new(dir: &Path, shard: Shard) -> Self {
        Self {
            dir: dir.to_path_buf(),
            shard,
            id: format!("{:016x}", random_u64()),
            run: OnceLock::new(),
            joined: OnceLock::new(),
        }
    }

    /// Arrives at `point` and returns once every learner has.
    pub fn wait(&self, point: &str) -> Result<(), BarrierError> {
        let io = |source| BarrierError::Io { point: point.to_string(), dir: self.dir.clone(), source };
        let start = Instant::now();
        let run = match self.run.get() {
            Some(run) => run,
            None => {
                let run = self.join(point, start)?;
                self.run.get_or_init(|| run)
            }
        };
        std::fs::write(run.join(format!("{point}.{}", self.shard.rank)), b"").map_err(io)?;
        self.poll(point, start, |r| Ok(run.join(format!("{point}.{r}")).exists()))
    }

    /// Publishes this learner's join file, waits until every rank's is held by a live
    /// learner, and returns the run's folder (named by rank 0's id).
    fn join(&self, point: &str, start: Instant) -> Result<PathBuf, BarrierError> {
        let io = |source| BarrierError::Io { point: point.to_string(), dir: self.dir.clone(), source };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        // Written and locked under a name of its own, then renamed into place: whoever
        // sees `join.<rank>` sees it whole and locked.
        let tmp = self.dir.join(format!("join.{}.{}.tmp", self.shard.rank, self.id));
        let mut file = File::create(&tmp).map_err(io)?;
        file.lock().map_err(io)?;
        file.write_all(self.id.as_bytes()).map_err(io)?;
        std::fs::rename(&tmp, self.join_file(self.shard.rank)).map_err(io)?;
        let _ = self.joined.set(file);
        self.poll(point, start, |r| Ok(self.live_id(r).map_err(io)?.is_some()))?;
        let leader = self.live_id(0).map_err(io)?.unwrap_or_default();
        let run = self.dir.join(format!("{RUN_PREFIX}{leader}"));
        std::fs::create_dir_all(&run).map_err(io)?;
        if self.shard.rank == 0 {
            self.remove_earlier_runs(&run);
        }
        Ok(run)
    }

    fn join_file(&self, rank: usize) -> PathBuf {
        self.dir.join(format!("join.{rank}"))
    }

    /// The id in `rank`'s join file, if a live learner holds it.
    fn live_id(&self, rank: usize) -> std::io::Result<Option<String>> {
        let mut file = match File::open(self.join_file(rank)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match file.try_lock_shared() {
            // Nobody holds it: its learner is gone (the lock goes with our handle).
            Ok(()) => Ok(None),
            Err(TryLockError::WouldBlock) => {
                let mut id = String::new();
                file.read_to_string(&mut id)?;
                Ok(Some(id))
            }
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// Waits until `arrived(rank)` holds for every rank.
    fn poll(
        &self,
        point: &str,
        start: Instant,
        arrived: impl Fn(usize) -> Result<bool, BarrierError>,
    ) -> Result<(), BarrierError> {
        loop {
            let mut count = 0;
            for r in 0..self.shard.world_size {
                count += usize::from(arrived(r)?);
            }
            if count == self.shard.world_size {
                return Ok(());
            }
            if start.elapsed() > PATIENCE {
                return Err(BarrierError::Timeout {
                    point: point.to_string(),
                    dir: self.dir.clone(),
                    arrived: count,
                    world_size: self.shard.world_size,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Removes the folders earlier runs left, and join files a learner died before
    /// publishing. Best effort: what cannot be removed only takes room.
    fn remove_earlier_runs(&self, current: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(RUN_PREFIX) && path != current {
                let _ = std::fs::remove_dir_all(&path);
            } else if name.starts_with("join.") && name.ends_with(".tmp") {
                if let Ok(f) = File::open(&path) {
                    if f.try_lock().is_ok() {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
        }
    }
}

/// A random id: std's hasher keys come from the OS's entropy, a fresh key per call.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}
