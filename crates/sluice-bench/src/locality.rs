//! `sluice-bench locality` (formerly `sluice bench-locality`): epoch times of p learner
//! processes (`sluice run --rank r --world-size p`) on one shared throttled storage link,
//! locality-aware with the collaborative cache vs the baseline (plain split, no cache,
//! everything from storage), and `sluice model`'s prediction for every point
//! (`docs/locality.md`). Per-sample preprocessing is emulated with the `sleep` op, so two
//! cores can host eight learners.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sluice_pipeline::locality::model::{predict, ModelInputs, STORAGE_BOUND};
use sluice_pipeline::storage::throttled::link_path;

use sluice_profile::median;

use crate::dataset;

use crate::netns::Net;

#[derive(ClapArgs)]
pub struct Args {
    /// Working folder: the dataset (made if missing) and each run's spec and logs.
    #[arg(long, default_value = "data/bench-locality")]
    out: PathBuf,
    /// Samples in the dataset, and their side in pixels (noise JPEGs).
    #[arg(long, default_value_t = 512)]
    samples: usize,
    #[arg(long, default_value_t = 128)]
    side: u32,
    /// Local batch size and threads per learner.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Emulated preprocessing per sample (µs, the `sleep` op).
    #[arg(long, default_value_t = 10_000)]
    compute_us: u32,
    /// Shared storage bandwidths (MB/s) and per-read latency (ms).
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    storage_mb_s: Vec<f64>,
    #[arg(long, default_value_t = 1.0)]
    latency_ms: f64,
    /// Learner counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    learners: Vec<usize>,
    /// Samples each learner caches, as a fraction of the dataset.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.125")]
    cache_fraction: Vec<f64>,
    /// Learner counts at which the baseline also runs (every storage bandwidth).
    #[arg(long, value_delimiter = ',', default_value = "4,8")]
    baseline: Vec<usize>,
    /// The learners' network, for the model (loopback: fast, short); with --netns-mbit the
    /// bandwidth is that of the shaped links.
    #[arg(long, default_value_t = 1000.0)]
    net_mb_s: f64,
    #[arg(long, default_value_t = 0.2)]
    net_latency_ms: f64,
    /// Run every learner in a network namespace of its own, its link shaped to this many
    /// Mbit/s with `tc` (needs root and `ip`); peers then talk over those links.
    #[arg(long)]
    netns_mbit: Option<f64>,
    /// With --netns-mbit: a delay on every link (ms; needs the kernel's netem).
    #[arg(long, default_value_t = 0.0)]
    net_delay_ms: f64,
    /// Runs of every configuration, interleaved; epochs per run (the first fills the caches
    /// and is not counted).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Print the measurements as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Mode {
    /// Locality-aware assignment with the collaborative cache.
    Aware,
    /// The plain split, no cache, every sample from storage every epoch.
    Baseline,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Config {
    mode: Mode,
    learners: usize,
    /// `None`: unthrottled local storage (the storage-free reference).
    storage_mb_s: Option<f64>,
    cache_fraction: f64,
}

/// One configuration's runs.
#[derive(Debug, Serialize)]
struct Point {
    config: Config,
    /// Epoch time after the first (slowest learner), per run.
    epoch_s: Vec<f64>,
    median_s: f64,
    /// The model's inputs and answer (locality-aware, throttled storage): per-sample
    /// preprocessing on one thread, measured on unthrottled storage.
    compute_s: Option<f64>,
    predicted_s: Option<f64>,
    predicted_bottleneck: Option<&'static str>,
    /// Storage reads and samples from peers after the first epoch, per epoch (last run).
    storage_reads: f64,
    from_peers: f64,
    /// With --netns-mbit: bytes sent over the shaped links in the last run.
    link_bytes: Option<u64>,
}

/// A line of a learner's `--epoch-log`.
#[derive(Deserialize)]
struct EpochLine {
    rank: usize,
    epoch: u64,
    seconds: f64,
    locality: Option<Counts>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct Counts {
    from_peers: u64,
    storage_reads: u64,
}

struct Run {
    epoch_s: f64,
    storage_reads: f64,
    from_peers: f64,
    /// With --netns-mbit: bytes all learners sent over their shaped links, the whole run.
    link_bytes: Option<u64>,
}

/// Where each learner's peer server listens inside its namespace.
const PEER_PORT: u16 = 7070;

pub fn main(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.samples > 0 && a.runs > 0 && a.epochs >= 2, "need samples, runs, and at least 2 epochs");
    anyhow::ensure!(a.learners.iter().chain(&a.baseline).all(|&p| p > 0), "learner counts must be at least 1");
    let root = a.out.join("train");
    let sample_bytes = ensure_dataset(&root, a.samples, a.side)?;
    let exe = dataset::sluice_exe()?;
    eprintln!("{} samples of {:.1} kB on average in {}", a.samples, sample_bytes / 1e3, root.display());

    let mut configs = Vec::new();
    for &c in &a.cache_fraction {
        for &p in &a.learners {
            configs.push(Config { mode: Mode::Aware, learners: p, storage_mb_s: None, cache_fraction: c });
            for &r in &a.storage_mb_s {
                configs.push(Config { mode: Mode::Aware, learners: p, storage_mb_s: Some(r), cache_fraction: c });
            }
        }
    }
    for &p in &a.baseline {
        for &r in &a.storage_mb_s {
            configs.push(Config { mode: Mode::Baseline, learners: p, storage_mb_s: Some(r), cache_fraction: 0.0 });
        }
    }
    let mut runs: Vec<Vec<Run>> = configs.iter().map(|_| Vec::new()).collect();
    let mut k = 1;
    for round in 0..a.runs {
        for (cfg, out) in configs.iter().zip(&mut runs) {
            let r = run_once(&a, &exe, &root, *cfg, k)?;
            eprintln!("round {round}: {cfg:?}: {:.3}s", r.epoch_s);
            out.push(r);
            k += 1;
        }
    }
    let mut points: Vec<Point> = configs
        .iter()
        .zip(runs)
        .map(|(cfg, runs)| {
            let epoch_s: Vec<f64> = runs.iter().map(|r| r.epoch_s).collect();
            let last = runs.last();
            Point {
                config: *cfg,
                median_s: median(&mut epoch_s.clone()),
                epoch_s,
                compute_s: None,
                predicted_s: None,
                predicted_bottleneck: None,
                storage_reads: last.map_or(0.0, |r| r.storage_reads),
                from_peers: last.map_or(0.0, |r| r.from_peers),
                link_bytes: last.and_then(|r| r.link_bytes),
            }
        })
        .collect();
    // The model's per-sample preprocessing cost at each (p, cache): measured by the same job
    // on unthrottled storage, since here p learners share the machine's cores.
    let free: Vec<(Config, f64)> =
        points.iter().filter(|x| x.config.storage_mb_s.is_none()).map(|x| (x.config, x.median_s)).collect();
    for x in points.iter_mut().filter(|x| x.config.mode == Mode::Aware && x.config.storage_mb_s.is_some()) {
        let same = |c: &Config| c.learners == x.config.learners && c.cache_fraction == x.config.cache_fraction;
        if let Some((_, t)) = free.iter().find(|(c, _)| same(c)) {
            let compute_s = t * a.threads as f64 / (a.samples / x.config.learners) as f64;
            let p = predict(&inputs(&a, &x.config, sample_bytes, compute_s), x.config.learners);
            (x.compute_s, x.predicted_s, x.predicted_bottleneck) =
                (Some(compute_s), Some(p.epoch_s), Some(p.bottleneck));
        }
    }
    if a.json {
        let out = json!({ "sample_bytes": sample_bytes, "points": points });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_tables(&a, &points);
    }
    Ok(())
}

fn cache_samples(a: &Args, cfg: &Config) -> u64 {
    (a.samples as f64 * cfg.cache_fraction).round() as u64
}

fn inputs(a: &Args, cfg: &Config, sample_bytes: f64, compute_s: f64) -> ModelInputs {
    ModelInputs {
        samples: a.samples,
        sample_bytes,
        // A peer sends the decoded, cropped RGB pixels (the cache's level).
        peer_sample_bytes: f64::from(a.side) * f64::from(a.side) * 3.0,
        cache_samples: cache_samples(a, cfg),
        local_batch: a.batch,
        storage_bytes_per_s: cfg.storage_mb_s.map_or(f64::INFINITY, |r| r * 1e6),
        storage_latency_s: if cfg.storage_mb_s.is_some() { a.latency_ms / 1e3 } else { 0.0 },
        net_bytes_per_s: a.netns_mbit.map_or(a.net_mb_s * 1e6, |mbit| mbit * 1e6 / 8.0),
        net_latency_s: (a.net_latency_ms + a.net_delay_ms) / 1e3,
        compute_s,
        threads: a.threads,
    }
}

/// `n` JPEGs of `side`² noise ([`sluice_synth::noise_jpeg`]) in `root` (made if missing);
/// their mean size in bytes.
fn ensure_dataset(root: &Path, n: usize, side: u32) -> anyhow::Result<f64> {
    let dir = root.join("all");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut total = 0u64;
    for i in 0..n {
        let path = dir.join(format!("img_{i:06}.jpg"));
        if let Ok(meta) = std::fs::metadata(&path) {
            total += meta.len();
            continue;
        }
        let jpeg = sluice_synth::noise_jpeg(i, side)?;
        std::fs::write(&path, &jpeg).with_context(|| format!("writing {}", path.display()))?;
        total += jpeg.len() as u64;
    }
    Ok(total as f64 / n as f64)
}

/// Loopback addresses nobody listens on yet, one per learner.
fn free_addrs(k: usize) -> anyhow::Result<Vec<String>> {
    let ls = (0..k).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>()?;
    ls.iter().map(|l| Ok(l.local_addr()?.to_string())).collect()
}

/// Kills the learners still running when dropped (a failed or timed-out run).
struct Learners(Vec<Child>);

impl Drop for Learners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Removes the run's shared link file whatever happens.
struct LinkFile(PathBuf);

impl Drop for LinkFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run_once(a: &Args, exe: &Path, root: &Path, cfg: Config, k: usize) -> anyhow::Result<Run> {
    let p = cfg.learners;
    let dir = a.out.join("runs").join(format!("{}-{k}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let link = format!("bench-locality-{}-{k}", std::process::id());
    let _link_file = LinkFile(link_path(&link));
    let net = match a.netns_mbit {
        Some(mbit) => Some(Net::create(&format!("{}-{k}", std::process::id()), p, mbit, a.net_delay_ms)?),
        None => None,
    };
    let storage = match cfg.storage_mb_s {
        Some(r) => json!({"kind": "throttled", "latency_ms": a.latency_ms, "bandwidth_mb_s": r, "shared_link": link}),
        None => json!({"kind": "local"}),
    };
    let mut spec = json!({
        "source": {"kind": "image_folder", "root": root},
        "storage": storage,
        "ops": [{"op": "decode"}, {"op": "center_crop", "size": a.side}, {"op": "sleep", "us": a.compute_us}],
        "batch": {"size": a.batch},
        "threads": a.threads,
        "seed": 7,
        "prefetch": 4,
    });
    if cfg.mode == Mode::Aware {
        spec["cache"] = json!({"budget": "4GiB", "level": "decoded"});
        spec["locality"] = json!({
            "assignment": "aware",
            "cache_samples": [cache_samples(a, &cfg)],
            "peers": match &net {
                Some(net) => (0..p).map(|r| format!("{}:{PEER_PORT}", net.addr(r))).collect(),
                None if p > 1 => free_addrs(p)?,
                None => Vec::new(),
            },
            "peer_timeout_ms": 500,
        });
    }
    let spec_path = dir.join("spec.json");
    std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec)?)?;
    let log = dir.join("epochs.jsonl");
    // The learners' peer servers want a shared token: a fresh one per run, in their
    // environment rather than in the spec file.
    let token = peer_token()?;
    let mut learners = Learners(Vec::with_capacity(p));
    for rank in 0..p {
        let stderr = std::fs::File::create(dir.join(format!("learner-{rank}.log")))?;
        let mut command = match &net {
            Some(net) => net.command(rank, exe),
            None => Command::new(exe),
        };
        let child = command
            .arg("run")
            .arg(&spec_path)
            .args(["--epochs", &a.epochs.to_string(), "--rank", &rank.to_string(), "--world-size", &p.to_string()])
            .arg("--barrier")
            .arg(dir.join("barrier"))
            .arg("--epoch-log")
            .arg(&log)
            .env(sluice_pipeline::locality::peer::TOKEN_ENV, &token)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting a learner")?;
        learners.0.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    for (rank, c) in learners.0.iter_mut().enumerate() {
        let status = loop {
            if let Some(s) = c.try_wait()? {
                break s;
            }
            anyhow::ensure!(Instant::now() < deadline, "learner {rank} of {cfg:?} ran past 300 s");
            std::thread::sleep(Duration::from_millis(20));
        };
        anyhow::ensure!(status.success(), "learner {rank} of {cfg:?} failed ({status}): see {}", dir.display());
    }
    let text = std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let lines: Vec<EpochLine> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let last = a.epochs - 1;
    let at = |rank: usize, epoch: u64| lines.iter().find(|l| l.rank == rank && l.epoch == epoch);
    let mut total = 0.0;
    for e in 1..a.epochs {
        let slowest = (0..p).filter_map(|r| at(r, e)).map(|l| l.seconds).fold(0.0, f64::max);
        total += slowest;
    }
    let counts = |epoch| -> Counts {
        (0..p).filter_map(|r| at(r, epoch).and_then(|l| l.locality)).fold(Counts::default(), |s, c| Counts {
            from_peers: s.from_peers + c.from_peers,
            storage_reads: s.storage_reads + c.storage_reads,
        })
    };
    let (first, end) = (counts(0), counts(last));
    drop(learners);
    let link_bytes = net.as_ref().map(Net::sent_bytes).transpose()?;
    let epochs = last as f64;
    std::fs::remove_dir_all(&dir)?;
    Ok(Run {
        epoch_s: total / epochs,
        storage_reads: (end.storage_reads - first.storage_reads) as f64 / epochs,
        from_peers: (end.from_peers - first.from_peers) as f64 / epochs,
        link_bytes,
    })
}

fn print_tables(a: &Args, points: &[Point]) {
    let find = |mode: Mode, p: usize, r: Option<f64>, c: f64| {
        points.iter().find(|x| {
            x.config.mode == mode
                && x.config.learners == p
                && x.config.storage_mb_s == r
                && (mode == Mode::Baseline || x.config.cache_fraction == c)
        })
    };
    println!("Locality-aware vs baseline (epoch after the first, median of {} runs):\n", a.runs);
    println!("| storage MB/s | p | cache/learner | baseline s | aware s | speedup | storage reads/epoch | from peers/epoch |");
    println!("|---|---|---|---|---|---|---|---|");
    for &p in &a.baseline {
        for &r in &a.storage_mb_s {
            let Some(base) = find(Mode::Baseline, p, Some(r), 0.0) else { continue };
            // The cache that, in aggregate, holds the dataset.
            let c = a.cache_fraction.iter().copied().find(|&c| (c * p as f64 - 1.0).abs() < 1e-9);
            let Some(aware) = c.and_then(|c| find(Mode::Aware, p, Some(r), c)) else { continue };
            println!(
                "| {r} | {p} | {:.3} | {:.2} | {:.2} | {:.2}x | {:.0} | {:.0} |",
                aware.config.cache_fraction,
                base.median_s,
                aware.median_s,
                base.median_s / aware.median_s,
                aware.storage_reads,
                aware.from_peers
            );
        }
    }
    println!("\nModel vs measurement (locality-aware, epoch after the first, median of {} runs):\n", a.runs);
    println!("| storage MB/s | p | cache/learner | predicted s | measured s | error | predicted bottleneck | measured: storage-bound? |");
    println!("|---|---|---|---|---|---|---|---|");
    for &c in &a.cache_fraction {
        for &r in &a.storage_mb_s {
            for &p in &a.learners {
                let (Some(x), Some(free)) = (find(Mode::Aware, p, Some(r), c), find(Mode::Aware, p, None, c)) else {
                    continue;
                };
                let predicted = x.predicted_s.unwrap_or(f64::NAN);
                println!(
                    "| {r} | {p} | {c} | {predicted:.2} | {:.2} | {:+.1}% | {} | {} ({:.2}x the storage-free {:.2}s) |",
                    x.median_s,
                    100.0 * (predicted - x.median_s) / x.median_s,
                    x.predicted_bottleneck.unwrap_or("-"),
                    if storage_bound(x, free) { "yes" } else { "no" },
                    x.median_s / free.median_s,
                    free.median_s
                );
            }
        }
    }
    println!("\nWhere storage stops being the bottleneck (first p from which it is not):\n");
    println!("| storage MB/s | cache/learner | predicted | measured |");
    println!("|---|---|---|---|");
    for &c in &a.cache_fraction {
        for &r in &a.storage_mb_s {
            let switch = |bound: &dyn Fn(usize) -> Option<bool>| -> String {
                let mut first = None;
                for &p in &a.learners {
                    match bound(p) {
                        Some(true) => first = None,
                        Some(false) if first.is_none() => first = Some(p),
                        _ => {}
                    }
                }
                first.map_or_else(|| format!("> {}", a.learners.iter().max().unwrap_or(&0)), |p| p.to_string())
            };
            let predicted =
                switch(&|p| find(Mode::Aware, p, Some(r), c).map(|x| x.predicted_bottleneck == Some("storage")));
            let measured = switch(&|p| {
                let free = find(Mode::Aware, p, None, c)?;
                find(Mode::Aware, p, Some(r), c).map(|x| storage_bound(x, free))
            });
            println!("| {r} | {c} | {predicted} | {measured} |");
        }
    }
}

/// Measured: storage is the bottleneck where the epoch takes over 20% longer than the same
/// job on unthrottled storage (the model's criterion too).
fn storage_bound(x: &Point, storage_free: &Point) -> bool {
    x.median_s > STORAGE_BOUND * storage_free.median_s
}

/// 16 random bytes from the kernel, in hex.
fn peer_token() -> anyhow::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for the learners' peer token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
