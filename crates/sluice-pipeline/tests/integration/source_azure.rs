//! Azure Blob Storage end to end against Azurite, Microsoft's emulator (npm `azurite`,
//! installed by scripts/setup.sh into `.node/`), on a free loopback port, one per test
//! binary. The loader reaches it through `AZURE_STORAGE_USE_EMULATOR` (the emulator's
//! well-known account and key); blobs are uploaded with `object_store` itself, and the
//! container is made with one signed REST call. Datasets in a container must give the
//! batches the same files give locally, as for S3 (`source_s3.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use sluice_core::{Batch, PipelineSpec, SourceSpec};
use sluice_pipeline::{Loader, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

/// The emulator's account and key (public, the same in every Azurite).
const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

fn azurite_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_AZURITE") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.node/node_modules/.bin/azurite-blob")
}

/// Starts `azurite-blob` once for this process (stopped at exit, its data in the process's
/// folder: `sluice_testing::for_process`) and points the environment at it; its port.
fn server() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = sluice_testing::for_process::process_dir().join("azurite");
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new(azurite_binary());
        cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string(), "--silent", "--skipApiVersionCheck"])
            .arg("--location")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        sluice_testing::for_process::start_for_process(
            cmd,
            "azurite must be installed: scripts/setup.sh puts it in .node/",
        );
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(30), "azurite did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::env::set_var("AZURE_STORAGE_USE_EMULATOR", "true");
        std::env::set_var("AZURITE_BLOB_STORAGE_URL", format!("http://127.0.0.1:{port}"));
        crate::source_s3::cache_root();
        port
    })
}

/// Creates `container` (object_store reads and writes blobs but makes no containers): one
/// `PUT ?restype=container`, signed with the emulator's shared key.
fn create_container(port: u16, container: &str) {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let version = "2021-08-06";
    let to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"
    );
    let key =
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &base64::engine::general_purpose::STANDARD.decode(KEY).unwrap());
    let signature = base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, to_sign.as_bytes()));
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "PUT /{ACCOUNT}/{container}?restype=container HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nx-ms-date: {date}\r\n\
         x-ms-version: {version}\r\nAuthorization: SharedKey {ACCOUNT}:{signature}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 201"), "creating container {container}: {reply}");
}

fn upload_tree(container: &str, prefix: &str, dir: &Path) {
    // reqwest has no TLS provider of its own (Cargo.toml); sluice installs ring's on first
    // use, this client may come first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = MicrosoftAzureBuilder::from_env().with_container_name(container).build().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                pending.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_str().unwrap().to_string();
                let bytes = std::fs::read(&p).unwrap();
                rt.block_on(store.put(&ObjectPath::from(format!("{prefix}/{rel}")), PutPayload::from(bytes))).unwrap();
            }
        }
    }
}

fn spec(root: PathBuf) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(SourceSpec::ImageFolder { root }, 32, 5);
    s.threads = 2.into();
    s.seed = 3;
    s
}

fn collect(spec: PipelineSpec) -> Vec<Batch> {
    Loader::new(spec, Shard::default()).unwrap().iter().map(|b| b.unwrap()).collect()
}

#[test]
fn an_image_folder_in_an_azure_container_gives_the_batches_of_the_same_files_on_disk() {
    let port = server();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    write_dataset(&root, &DatasetOptions { images: 13, classes: 3, texture: 4, ..Default::default() }, &|_| {})
        .unwrap();
    let container = format!("sluice-{}", std::process::id());
    create_container(port, &container);
    upload_tree(&container, "folder/train", &root);

    let local = collect(spec(root));
    let url = format!("az://{container}/folder/train");
    let remote = collect(spec(PathBuf::from(&url)));
    assert_eq!(local.len(), 3, "13 images in batches of 5");
    assert_eq!(remote, local, "the container's batches differ from the local files'");

    // A missing blob fails its sample naming the URL.
    let err = Loader::new(spec(PathBuf::from(format!("az://{container}/nothing-here"))), Shard::default())
        .err()
        .expect("an empty prefix is no dataset")
        .to_string();
    assert!(err.contains(&format!("az://{container}/nothing-here")), "{err}");
}
