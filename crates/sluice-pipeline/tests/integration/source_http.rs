//! Web servers (`http://`) through object_store's HTTP client: an object named by its URL
//! (a tar shard, a Parquet file) is read with ranged GETs from any server, and a prefix (an
//! image folder, a folder of Parquet files) is listed with WebDAV `PROPFIND`. The servers are
//! the SeaweedFS of `source_s3.rs`, which serves the test bucket under `/buckets/<bucket>/`
//! from its WebDAV gateway and from its filer, a plain HTTP server without `PROPFIND`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sluice_core::SourceSpec;
use sluice_pipeline::source::build_manifest;

use crate::object_checks;
use crate::source_s3::{bucket, folder, put, server, store};

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
