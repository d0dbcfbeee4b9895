//! Every setting of the service's processes and its default, in one place: the TOML file
//! that `sluice service dispatcher|worker|up --config FILE` read. The command's flags
//! override the file; with neither, the defaults below. docs/service.md lists the same
//! file, and a test checks that its example is these defaults. [`ServiceConfig::dispatcher`]
//! and [`ServiceConfig::worker`] turn the settings into what the servers run.
//!
//! Tokens are secrets: a file holds one only where it is written there; `--token` (then
//! `$SLUICE_TOKEN`) and `--operator-token` (then `$SLUICE_OPERATOR_TOKEN`) come first, and
//! `up` hands tokens to its children through the environment, never in a file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_autoscale::{AutoscaleConfig, PolicyKind, WindowBy};

use crate::{DispatcherConfig, TlsFiles, WorkerConfig, WorkerLimits};

/// A service config file: one table per part.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    pub dispatcher: DispatcherSettings,
    pub worker: WorkerSettings,
    /// What the dispatcher and every worker both take.
    pub serve: ServeSettings,
    pub autoscale: AutoscaleSettings,
    /// What a worker grants each job.
    pub limits: WorkerLimits,
    pub up: UpSettings,
}

/// A config file that cannot be used, with the file and the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: `{key}`: {message}")]
    Invalid { path: PathBuf, key: String, message: String },
    #[error("cannot write the config file {path}: {message}")]
    Write { path: PathBuf, message: String },
    /// No `allow_roots` given, and the current folder (the default) is unknown.
    #[error("no --allow-root given and the current folder is unknown")]
    NoRoot(#[source] std::io::Error),
}

impl ServiceConfig {
    /// The file at `path`, or the defaults when there is none.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let Some(path) = path else { return Ok(Self::default()) };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        Self::parse(&text, path)
    }

    /// `text`, read from `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Self = serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid { path: path.into(), key, message: e.into_inner().message().trim().to_string() }
        })?;
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        if self.serve.tls_cert.is_some() != self.serve.tls_key.is_some() {
            return Err(ConfigError::Invalid {
                path: path.into(),
                key: "serve.tls_cert".into(),
                message: "tls_cert and tls_key go together".into(),
            });
        }
        Ok(())
    }

    /// Writes the settings (no tokens: see the module's note) to `path`.
    pub fn write(&self, path: &Path) -> Result<(), ConfigError> {
        let write = |message: String| ConfigError::Write { path: path.into(), message };
        let text = toml::to_string_pretty(self).map_err(|e| write(e.to_string()))?;
        std::fs::write(path, text).map_err(|e| write(e.to_string()))
    }

    /// What `sluice service dispatcher` runs with these settings.
    pub fn dispatcher(self) -> Result<DispatcherConfig, ConfigError> {
        let d = self.dispatcher;
        if d.journal.is_none() {
            tracing::warn!("no --journal: a restarted dispatcher will not remember its jobs");
        }
        Ok(DispatcherConfig {
            metrics_listen: self.serve.metrics_listen(d.metrics_port),
            tls: self.serve.tls(),
            allow_roots: self.serve.roots()?,
            token: self.serve.token,
            operator_token: d.operator_token,
            autoscale: self.autoscale.config(),
            cache_aware: d.cache_assignment == CacheAssignment::Aware,
            allow_python_modules: self.serve.allow_python_modules,
            listen: d.listen,
            journal: d.journal,
        })
    }

    /// What `sluice service worker` runs with these settings.
    pub fn worker(self) -> Result<WorkerConfig, ConfigError> {
        let w = self.worker;
        Ok(WorkerConfig {
            metrics_listen: self.serve.metrics_listen(w.metrics_port),
            tls: self.serve.tls(),
            allow_roots: self.serve.roots()?,
            token: self.serve.token,
            listen: w.listen,
            advertise: w.advertise,
            data_listen: w.data_listen,
            advertise_data: w.advertise_data,
            dispatcher: w.dispatcher,
            dispatcher_ca: w.tls_ca,
            shared_memory: w.shared_memory,
            threads: w.threads,
            limits: self.limits,
            trace_dir: w.trace_dir,
            name: w.name,
            python: w.python,
            allow_python_modules: self.serve.allow_python_modules,
        })
    }
}

/// `[dispatcher]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatcherSettings {
    /// gRPC address; keep 127.0.0.1 unless the port is protected.
    pub listen: String,
    /// Append-only journal that lets a restarted dispatcher resume every job (none: it
    /// forgets them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal: Option<PathBuf>,
    /// How importance-sampled jobs' tasks go to workers.
    pub cache_assignment: CacheAssignment,
    /// Serve Prometheus metrics on this port (none: no endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_port: Option<u16>,
    /// The operator calls' secret (`SetScale`, `DrainWorker`).
    #[serde(skip_serializing)]
    pub operator_token: Option<String>,
}

impl Default for DispatcherSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7070".into(),
            journal: None,
            cache_assignment: CacheAssignment::Aware,
            metrics_port: None,
            operator_token: None,
        }
    }
}

/// How importance-sampled jobs' tasks go to workers: `aware` places the hot set on the
/// workers' caches and sends each task to the worker caching its samples; `blind` sends it
/// to the least loaded worker (for comparison).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheAssignment {
    Aware,
    Blind,
}

impl CacheAssignment {
    /// The names a flag or file takes.
    pub const NAMES: [&'static str; 2] = ["aware", "blind"];
}

/// A cache assignment other than `aware` or `blind`.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a cache assignment: aware or blind")]
pub struct UnknownCacheAssignment(String);

impl std::str::FromStr for CacheAssignment {
    type Err = UnknownCacheAssignment;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "aware" => Ok(Self::Aware),
            "blind" => Ok(Self::Blind),
            other => Err(UnknownCacheAssignment(other.to_string())),
        }
    }
}

/// `[worker]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSettings {
    /// The dispatcher's address.
    pub dispatcher: String,
    /// gRPC address; port 0 picks a free one.
    pub listen: String,
    /// Address clients should use to reach this worker (none: the bound address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// TCP data-plane address; port 0 picks a free one.
    pub data_listen: String,
    /// Data-plane address clients should use (none: the bound address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_data: Option<String>,
    /// Decode threads per job (0: the spec's `threads`; under `up`, cores / workers).
    pub threads: usize,
    /// CA (PEM) of the dispatcher's certificate: reach it over TLS (none: $SLUICE_TLS_CA).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// Serve clients on this machine through shared memory too, not only TCP.
    pub shared_memory: bool,
    /// Record each job's pipeline events into DIR/job-<job>-worker-<worker>.pftrace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_dir: Option<PathBuf>,
    /// A name to drain this worker by (`DrainWorker`); `up` names its workers.
    pub name: String,
    /// Serve Prometheus metrics on this port (none: no endpoint; under `up`, worker i
    /// gets the dispatcher's port + 1 + i).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_port: Option<u16>,
    /// The Python that runs specs' `map` ops (it needs numpy and the functions' modules,
    /// found through its own path and `PYTHONPATH`; never the worker's current folder).
    pub python: PathBuf,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            dispatcher: "127.0.0.1:7070".into(),
            listen: "127.0.0.1:0".into(),
            advertise: None,
            data_listen: "127.0.0.1:0".into(),
            advertise_data: None,
            threads: 0,
            tls_ca: None,
            shared_memory: true,
            trace_dir: None,
            name: String::new(),
            metrics_port: None,
            python: "python3".into(),
        }
    }
}

/// `[serve]`: what the dispatcher and a worker both take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeSettings {
    /// Folders specs may read from (empty: the current folder).
    pub allow_roots: Vec<PathBuf>,
    /// Interface for the metrics endpoints (0.0.0.0 inside a pod).
    pub metrics_host: String,
    /// Serve over TLS with this certificate chain (PEM), with `tls_key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Shared secret every RPC must carry (none: no check).
    #[serde(skip_serializing)]
    pub token: Option<String>,
    /// Python modules (and their packages' modules) a job's `map` ops may import on the
    /// workers (empty: a job with a `map` op is refused).
    pub allow_python_modules: Vec<String>,
}

impl Default for ServeSettings {
    fn default() -> Self {
        Self {
            allow_roots: Vec::new(),
            metrics_host: "127.0.0.1".into(),
            tls_cert: None,
            tls_key: None,
            token: None,
            allow_python_modules: Vec::new(),
        }
    }
}

impl ServeSettings {
    pub fn tls(&self) -> Option<TlsFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert: cert.clone(), key: key.clone() }),
            _ => None,
        }
    }

    /// Where to serve metrics on `port`.
    pub fn metrics_listen(&self, port: Option<u16>) -> Option<String> {
        port.map(|p| format!("{}:{p}", self.metrics_host))
    }

    /// `allow_roots`, or the current folder when there are none.
    pub fn roots(&self) -> Result<Vec<PathBuf>, ConfigError> {
        if !self.allow_roots.is_empty() {
            return Ok(self.allow_roots.clone());
        }
        let cwd = std::env::current_dir().map_err(ConfigError::NoRoot)?;
        tracing::warn!(root = %cwd.display(), "no --allow-root given: allowing only the current folder");
        Ok(vec![cwd])
    }
}

/// `[autoscale]`: the dispatcher's autoscaler; `up` follows its target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoscaleSettings {
    /// fastmatch, cachew, tfdata, utilisation or fixed (none: no autoscaling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyKind>,
    /// Fewest workers the autoscaler keeps (`up` starts this many).
    pub min_workers: usize,
    /// Most workers the autoscaler asks for.
    pub max_workers: usize,
    /// The autoscaler reads the signals and decides once per this many milliseconds.
    pub window_ms: u64,
}

impl Default for AutoscaleSettings {
    fn default() -> Self {
        Self { policy: None, min_workers: 1, max_workers: 8, window_ms: 1000 }
    }
}

impl AutoscaleSettings {
    pub fn config(&self) -> Option<AutoscaleConfig> {
        self.policy.map(|policy| AutoscaleConfig {
            window: WindowBy::Millis(self.window_ms),
            ..AutoscaleConfig::new(policy, self.min_workers, self.max_workers)
        })
    }
}

/// `[up]`: what only `sluice up` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpSettings {
    /// Worker processes to start (with autoscaling: `autoscale.min_workers`).
    pub workers: usize,
}

impl Default for UpSettings {
    fn default() -> Self {
        Self { workers: 2 }
    }
}

/// Sets `slot` to the flag's value where one was given.
pub fn flag<T>(slot: &mut T, given: Option<T>) {
    if let Some(v) = given {
        *slot = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example in docs/service.md: every setting, each at its default.
    fn documented_example() -> String {
        let doc = include_str!("../../../docs/service.md");
        let start = doc.find("```toml\n# sluice service config").expect("docs/service.md has the example config");
        let body = &doc[start + "```toml\n".len()..];
        body[..body.find("```").expect("the example ends")].to_string()
    }

    #[test]
    fn the_documented_example_is_the_defaults() {
        let example = documented_example();
        let parsed = ServiceConfig::parse(&example, Path::new("docs/service.md")).unwrap();
        assert_eq!(parsed, ServiceConfig::default());
        // The settings without a default value are there too, commented out: with the
        // comment marks taken off, the file still parses (so each is a real key) and sets
        // every one of them.
        let uncommented: String = example
            .lines()
            .map(|l| l.strip_prefix("# ").filter(|l| l.contains(" = ")).unwrap_or(l))
            .fold(String::new(), |mut s, l| {
                s.push_str(l);
                s.push('\n');
                s
            });
        let all = ServiceConfig::parse(&uncommented, Path::new("docs/service.md")).unwrap();
        let d = &all.dispatcher;
        let w = &all.worker;
        let s = &all.serve;
        assert!(d.journal.is_some() && d.metrics_port.is_some() && d.operator_token.is_some());
        assert!(w.advertise.is_some() && w.advertise_data.is_some() && w.tls_ca.is_some());
        assert!(w.trace_dir.is_some() && w.metrics_port.is_some());
        assert!(s.tls_cert.is_some() && s.tls_key.is_some() && s.token.is_some());
        assert!(all.autoscale.policy.is_some());
        // And every key a written file has is in the example.
        let written = toml::to_string_pretty(&all).unwrap();
        for line in written.lines().filter(|l| l.contains(" = ")) {
            let key = line.split(" = ").next().unwrap_or_default();
            assert!(uncommented.lines().any(|l| l.starts_with(&format!("{key} = "))), "`{key}` is not documented");
        }
    }

    #[test]
    fn an_unknown_key_or_a_bad_value_names_the_key_and_the_file() {
        let path = Path::new("svc.toml");
        let e = ServiceConfig::parse("[dispatcher]\nlisten_addr = \"x\"\n", path).unwrap_err().to_string();
        assert!(e.contains("svc.toml") && e.contains("listen_addr"), "{e}");
        let e = ServiceConfig::parse("[limits]\nmax_threads = \"many\"\n", path).unwrap_err().to_string();
        assert!(e.contains("svc.toml") && e.contains("limits.max_threads"), "{e}");
        let e = ServiceConfig::parse("[limits]\nmax_cache_bytes = \"8 parsecs\"\n", path).unwrap_err().to_string();
        assert!(e.contains("limits.max_cache_bytes"), "{e}");
        let e = ServiceConfig::parse("[serve]\ntls_cert = \"c.pem\"\n", path).unwrap_err().to_string();
        assert!(e.contains("tls_key"), "{e}");
    }

    #[test]
    fn a_written_file_reads_back_the_same_settings_but_no_token() {
        let mut c = ServiceConfig::default();
        c.dispatcher.journal = Some("j".into());
        c.autoscale.policy = Some(PolicyKind::Fastmatch);
        c.limits.max_cache = sluice_core::ByteBudget::Bytes(1 << 30);
        c.limits.job_idle = std::time::Duration::from_secs(7);
        c.serve.token = Some("secret".into());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        c.write(&path).unwrap();
        assert!(!std::fs::read_to_string(&path).unwrap().contains("secret"));
        c.serve.token = None;
        assert_eq!(ServiceConfig::load(Some(&path)).unwrap(), c);
    }
}
