//! What a worker grants one job: the operator's bounds on the resources a client's spec
//! asks for (threads, prefetch, cache memory, image size), how many job loaders it keeps
//! and for how long. A spec asking for more is refused with the field and the limit, not
//! clamped: the client learns why, and its pipeline does not silently change.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_core::{ByteBudget, PipelineSpec};

use crate::error::ServiceError;

/// The `[limits]` table of a service config file: its keys are the `sluice worker` flags'
/// names (`max_cache_bytes`, `job_idle_secs`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerLimits {
    /// Most decode threads a job's spec may ask for (`threads`).
    pub max_threads: usize,
    /// Most batches a job's spec may prepare ahead (`prefetch`).
    pub max_prefetch: usize,
    /// Most memory a job's cache may take (`cache.budget`).
    #[serde(rename = "max_cache_bytes")]
    pub max_cache: ByteBudget,
    /// Largest image (width × height) a job's spec may allow (`limits.max_pixels`).
    pub max_pixels: u64,
    /// Job loaders kept at most; past it the least recently used goes.
    pub max_jobs: usize,
    /// A job loader without a task this long is dropped (rebuilt if the job comes back).
    #[serde(rename = "job_idle_secs", with = "whole_seconds")]
    pub job_idle: Duration,
    /// Python children (jobs' `map` ops, ~30 MB each) this worker runs at most, over all
    /// its jobs; past it an idle child of another job is ended first, else the call waits.
    pub max_python_children: usize,
}

/// A [`Duration`] written as whole seconds.
mod whole_seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

impl Default for WorkerLimits {
    fn default() -> Self {
        Self {
            max_threads: 128,
            max_prefetch: 64,
            max_cache: ByteBudget::RamFraction(0.5),
            max_pixels: 256 << 20,
            max_jobs: 64,
            job_idle: Duration::from_secs(600),
            max_python_children: 32,
        }
    }
}

impl WorkerLimits {
    /// Refuses `spec` if it asks for more than these limits grant; `ram` (bytes) resolves
    /// budgets given as a fraction of memory.
    pub fn check(&self, spec: &PipelineSpec, ram: u64) -> Result<(), ServiceError> {
        let over = |field: &'static str, asked: String, limit: String, flag: &'static str| {
            Err(ServiceError::OverLimit { field, asked, limit, flag })
        };
        if spec.threads.count().is_some_and(|n| n > self.max_threads) {
            return over("threads", spec.threads.to_string(), self.max_threads.to_string(), "--max-threads");
        }
        // `"auto"` may grow to what its memory bound holds.
        let prefetch = spec.prefetch_max_depth(spec.batch_bytes().unwrap_or(1));
        if prefetch > self.max_prefetch {
            let asked =
                if spec.prefetch_is_auto() { format!("auto (up to {prefetch} batches)") } else { prefetch.to_string() };
            return over("prefetch", asked, self.max_prefetch.to_string(), "--max-prefetch");
        }
        if spec.limits.max_pixels > self.max_pixels {
            return over(
                "limits.max_pixels",
                spec.limits.max_pixels.to_string(),
                self.max_pixels.to_string(),
                "--max-pixels",
            );
        }
        if let Some(cache) = &spec.cache {
            let (asked, limit) = (cache.budget.resolve(ram), self.max_cache.resolve(ram));
            if asked > limit {
                return over("cache.budget", format!("{asked} bytes"), format!("{limit} bytes"), "--max-cache-bytes");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::SourceSpec;

    #[test]
    fn a_spec_over_any_limit_is_refused_naming_the_field_and_the_limit() {
        let limits = WorkerLimits {
            max_threads: 2,
            max_prefetch: 3,
            max_cache: ByteBudget::Bytes(1000),
            max_pixels: 5000,
            ..WorkerLimits::default()
        };
        let mut ok = PipelineSpec::train_default(SourceSpec::ImageFolder { root: "/data".into() }, 32, 4);
        (ok.threads, ok.prefetch, ok.limits.max_pixels) = (2.into(), 3, 5000);
        ok.cache = serde_json::from_value(serde_json::json!({ "budget": 1000 })).unwrap();
        limits.check(&ok, 1 << 30).unwrap();

        let refused = |s: PipelineSpec| limits.check(&s, 1 << 30).unwrap_err().to_string();
        let mut s = ok.clone();
        s.threads = 1_000_000_000.into();
        assert_eq!(
            refused(s),
            "spec field `threads` asks for 1000000000, over this worker's limit of 2 (--max-threads)"
        );
        let mut s = ok.clone();
        s.prefetch = 4;
        assert!(refused(s).contains("`prefetch` asks for 4, over this worker's limit of 3 (--max-prefetch)"));
        // `"auto"` may grow to what its memory bound holds: 1 GiB of 12 KiB batches, 64.
        let mut s = ok.clone();
        s.prefetch = sluice_core::spec::PREFETCH_AUTO;
        let e = limits.check(&s, 1 << 30).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("`prefetch` asks for auto (up to 64 batches), over this worker's limit of 3"), "{e:?}");
        s.prefetch_max_bytes = Some(3 * 4 * 32 * 32 * 3);
        limits.check(&s, 1 << 30).unwrap();
        let mut s = ok.clone();
        s.limits.max_pixels = u64::MAX;
        assert!(refused(s).contains("`limits.max_pixels`"));
        let mut s = ok.clone();
        s.cache = serde_json::from_value(serde_json::json!({ "budget": "1%" })).unwrap();
        let e = refused(s);
        assert!(e.contains("`cache.budget` asks for 10737418 bytes") && e.contains("--max-cache-bytes"), "{e}");
    }
}
