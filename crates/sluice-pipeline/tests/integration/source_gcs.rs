//! Google Cloud Storage (`gs://`) through object_store's GCS client, which speaks the GCS
//! XML API: S3's requests, with a bearer token instead of a signature. No Google server is
//! reached: the client is pointed at the SeaweedFS S3 server of `source_s3.rs` by a
//! service-account file with `gcs_base_url` and `disable_oauth` (the crate's switches for
//! emulators), so its requests go unsigned, and that server lets unsigned requests read and
//! list the test bucket. This checks sluice's `gs://` paths (listing, ranged reads, errors,
//! confinement) against a real server speaking the XML API, not Google's own service or
//! its authentication.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use crate::object_checks;
use crate::source_s3::{bucket, run_child, server};

/// `gs://<test bucket>`, with `GOOGLE_SERVICE_ACCOUNT` naming the weed server (set once for
/// this process: without explicit credentials the client would ask the metadata server).
fn base() -> String {
    static ACCOUNT: OnceLock<()> = OnceLock::new();
    ACCOUNT.get_or_init(|| {
        let server = server();
        let account = server.dir.join("gcs-service-account.json");
        let json = serde_json::json!({
            "private_key": "unused: disable_oauth",
            "private_key_id": "unused",
            "client_email": "sluice-test@localhost",
            "disable_oauth": true,
            "gcs_base_url": format!("http://127.0.0.1:{}", server.port),
        });
        std::fs::write(&account, json.to_string()).unwrap();
        std::env::set_var("GOOGLE_SERVICE_ACCOUNT", &account);
    });
    format!("gs://{}", bucket())
}

#[test]
fn an_image_folder_in_a_gcs_bucket_gives_the_batches_of_the_same_files_on_disk() {
    object_checks::image_folder(&base(), "gcs/folder/train");
}

#[test]
fn a_tar_shard_in_a_gcs_bucket_gives_the_samples_of_the_same_shard_on_disk() {
    object_checks::tar_shard(&base(), "gcs/tar");
}

#[test]
fn parquet_files_in_a_gcs_bucket_give_the_batches_of_the_same_files_on_disk() {
    object_checks::parquet_files(&base(), "gcs/parquet", true);
}

#[test]
fn missing_gcs_objects_fail_naming_their_url() {
    object_checks::missing_objects(&base(), "gcs/missing/train");
}

#[test]
fn reads_confined_to_a_gcs_prefix_refuse_other_prefixes_buckets_and_stores() {
    let base = base();
    let b = bucket();
    let others = [
        format!("{base}/gcs/confined/tra"),
        format!("gs://other-{b}/gcs/confined/train"),
        format!("s3://{b}/gcs/confined/train"),
    ];
    object_checks::confined(&base, "gcs/confined/train", &others);
}

#[test]
fn an_unreadable_service_account_file_is_an_error_naming_the_bucket_and_the_file() {
    let _ = base();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-account.json");
    let (ok, text, _) = run_child(
        "child_build_fails_naming_the_bucket",
        &[
            ("GOOGLE_SERVICE_ACCOUNT", missing.display().to_string()),
            ("SLUICE_CACHE_DIR", dir.path().join("cache").display().to_string()),
            ("SLUICE_TEST_URL", format!("gs://{}/gcs/creds", bucket())),
            ("SLUICE_TEST_EXPECT", missing.display().to_string()),
        ],
    );
    assert!(ok, "child failed:\n{text}");
}
