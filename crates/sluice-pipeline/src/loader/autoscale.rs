//! The local actuator: an [`Autoscaler`] fed from the loader's own signals, turning the
//! worker pool's thread count. The consumer side reports each batch it hands out (with
//! the time it waited for it) and each chunk of work that came back (with the wall time
//! a thread spent on it); when a window closes the policy decides and the pool resizes.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_autoscale::{AutoscaleConfig, AutoscaleStats, Autoscaler, ConfigError, PolicyKind, Window, WindowBy};

use crate::executor::Pool;

/// `threads = "auto"`: FastMatch between one thread and one per core, deciding on
/// one-second windows.
pub fn auto_threads_config() -> AutoscaleConfig {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    AutoscaleConfig {
        window: WindowBy::Millis(1000),
        settle_batches: 2,
        ..AutoscaleConfig::new(PolicyKind::Fastmatch, 1, cores)
    }
}

/// Changes a window's readings before the policy sees them (a benchmark's injected noise).
pub type Perturb = Box<dyn FnMut(&mut Window) + Send>;

struct Running {
    autoscaler: Autoscaler,
    perturb: Option<Perturb>,
}

/// The autoscaler of one loader, when it has one.
pub(super) struct LocalAutoscale {
    clock: Instant,
    batch_size: f64,
    inner: Mutex<Option<Running>>,
}

impl LocalAutoscale {
    pub(super) fn new(batch_size: usize) -> Self {
        Self { clock: Instant::now(), batch_size: batch_size.max(1) as f64, inner: Mutex::new(None) }
    }

    fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// Starts (or replaces) autoscaling of `pool` by `config`, from its current size.
    pub(super) fn enable(
        &self,
        config: AutoscaleConfig,
        pool: &Pool,
        perturb: Option<Perturb>,
    ) -> Result<(), ConfigError> {
        let a = Autoscaler::new(config, pool.threads(), self.now())?;
        pool.set_threads(a.units());
        tracing::info!(policy = %a.config().policy, threads = a.units(), "autoscaling the loader's threads");
        *self.inner.lock() = Some(Running { autoscaler: a, perturb });
        Ok(())
    }

    /// A thread spent `busy` on `samples` samples.
    pub(super) fn on_work(&self, busy: Duration, samples: usize) {
        if let Some(r) = self.inner.lock().as_mut() {
            r.autoscaler.record_work(busy.as_secs_f64(), samples as f64 / self.batch_size);
        }
    }

    /// A batch went to the consumer after it waited `wait`; `ready` batches wait behind it;
    /// the trainer last reported its accelerator `accelerator_busy`. Resizes `pool` when the
    /// policy decides.
    pub(super) fn on_batch(&self, wait: Duration, ready: usize, pool: &Pool, accelerator_busy: Option<f64>) {
        let mut guard = self.inner.lock();
        let Some(r) = guard.as_mut() else { return };
        let now = self.now();
        r.autoscaler.record_batch(now, wait.as_secs_f64());
        let Some(mut w) = r.autoscaler.close_window(now, ready as f64) else { return };
        w.accelerator_busy = accelerator_busy;
        if let Some(perturb) = r.perturb.as_mut() {
            perturb(&mut w);
        }
        if let Some(d) = r.autoscaler.observe(&w, now) {
            pool.set_threads(d.to);
        }
    }

    pub(super) fn stats(&self) -> Option<AutoscaleStats> {
        self.inner.lock().as_ref().map(|r| r.autoscaler.stats())
    }
}
