//! A barrier between the learner processes of one job on one machine (`sluice run
//! --barrier DIR`): at each named point a learner creates `DIR/<point>.<rank>` and waits
//! until all `world_size` learners have, as DDP's collectives line ranks up. It gives up
//! after a while rather than hang on a learner that died.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_pipeline::Shard;

/// How long a learner waits for the others at one point.
const PATIENCE: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(2);

#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    #[error("barrier {point} in {dir}: {source}")]
    Io { point: String, dir: PathBuf, source: std::io::Error },
    #[error("barrier {point} in {dir}: {arrived} of {world_size} learners arrived within {PATIENCE:?}")]
    Timeout { point: String, dir: PathBuf, arrived: usize, world_size: usize },
}

pub struct Barrier {
    dir: PathBuf,
    shard: Shard,
}

impl Barrier {
    pub fn new(dir: &Path, shard: Shard) -> Self {
        Self { dir: dir.to_path_buf(), shard }
    }

    /// Arrives at `point` and returns once every learner has.
    pub fn wait(&self, point: &str) -> Result<(), BarrierError> {
        let io = |source| BarrierError::Io { point: point.to_string(), dir: self.dir.clone(), source };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        std::fs::write(self.dir.join(format!("{point}.{}", self.shard.rank)), b"").map_err(io)?;
        let start = Instant::now();
        loop {
            let arrived = (0..self.shard.world_size).filter(|r| self.dir.join(format!("{point}.{r}")).exists()).count();
            if arrived == self.shard.world_size {
                return Ok(());
            }
            if start.elapsed() > PATIENCE {
                return Err(BarrierError::Timeout {
                    point: point.to_string(),
                    dir: self.dir.clone(),
                    arrived,
                    world_size: self.shard.world_size,
                });
            }
            std::thread::sleep(POLL);
        }
    }
}
