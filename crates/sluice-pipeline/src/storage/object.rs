//! Object storage: `s3://`, `az://`, `gs://` and `http(s)://` roots, shards and samples
//! ([`super::url`]), read through the `object_store` crate (arrow-rs). For S3, credentials,
//! region and endpoint come from the standard
//! `AWS_*` environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` for S3-compatible stores, and the
//! container/web-identity variables the crate reads), then the AWS profile files
//! ([`super::profile`]); for Azure from the `AZURE_*` environment; for GCS from
//! `GOOGLE_SERVICE_ACCOUNT` (a service-account file) or `GOOGLE_APPLICATION_CREDENTIALS`
//! (application default credentials), else the instance metadata server; a web server
//! takes no credentials. Requests are retried with
//! exponential back-off, time out, and at most `SLUICE_OBJECT_MAX_REQUESTS` run at once.
//!
//! The loader's worker threads are plain threads: one process-wide tokio runtime, made on
//! first use, runs the crate's async calls (`block_on` from the calling thread, no runtime
//! per read), and one client per bucket is kept.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::client::{HttpClient, HttpConnector};
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::limit::LimitStore;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};
use parking_lot::Mutex;
use sluice_core::{LocationRef, SampleErrorKind};

use super::confine::Roots;
use super::read_ahead::{ReadAhead, ReadAheadStats, Wanted};
use super::row_groups::RowGroupCache;
pub use super::url::{ObjectUrl, Scheme};
use super::{check_size, Storage};

/// Requests in flight at once, per bucket, unless `SLUICE_OBJECT_MAX_REQUESTS` says otherwise.
pub const DEFAULT_MAX_REQUESTS: usize = 64;
/// Retries of a failed request (5xx, timeouts, connection errors), unless
/// `SLUICE_OBJECT_RETRIES` says otherwise.
pub const DEFAULT_RETRIES: usize = 5;
/// Seconds one request may take, unless `SLUICE_OBJECT_TIMEOUT_S` says otherwise.
pub const DEFAULT_TIMEOUT_S: f64 = 30.0;

/// The key of `url` as the object store takes it.
fn object_path(url: &ObjectUrl) -> Result<ObjectPath, ObjectError> {
    ObjectPath::parse(&url.key)
        .map_err(|e| ObjectError { url: url.to_string(), message: format!("not a valid object key: {e}") })
}

/// A failed object-storage call, naming the object (or prefix) it was about.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{url}: {message}")]
pub struct ObjectError {
    pub url: String,
    pub message: String,
}

/// The process-wide runtime and one client per bucket.
pub(crate) struct Remote {
    runtime: tokio::runtime::Runtime,
    stores: Mutex<HashMap<(Scheme, String), Arc<dyn ObjectStore>>>,
}

static REMOTE: OnceLock<Result<Remote, String>> = OnceLock::new();

/// The shared runtime and clients, made on first use.
pub(crate) fn remote() -> Result<&'static Remote, String> {
    REMOTE
        .get_or_init(|| {
            // reqwest is built without a TLS provider of its own: rustls's ring provider
            // (already linked for the service's TLS) serves it. Another may be installed.
            let _ = rustls::crypto::ring::default_provider().install_default();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("sluice-object")
                .enable_all()
                .build()
                .map(|runtime| Remote { runtime, stores: Mutex::new(HashMap::new()) })
                .map_err(|e| format!("cannot start the object-storage runtime: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn env_text(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The S3 client of `bucket`: the `AWS_*` environment, then the AWS profile files.
fn s3_client(
    bucket: &str,
    retry: RetryConfig,
    options: ClientOptions,
    failed: &dyn Fn(String) -> ObjectError,
) -> Result<object_store::aws::AmazonS3, ObjectError> {
    let profile = super::profile::from_env()
        .map_err(|e| failed(format!("cannot configure the client of the bucket {bucket}: {e}")))?
        .unwrap_or_default();
    let mut builder =
        AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(retry).with_client_options(options);
    if let (Some(key), Some(secret)) = (profile.access_key_id, profile.secret_access_key) {
        builder = builder.with_access_key_id(key).with_secret_access_key(secret);
        if let Some(token) = profile.session_token {
            builder = builder.with_token(token);
        }
    }
    if let (None, None, Some(region)) = (env_text("AWS_REGION"), env_text("AWS_DEFAULT_REGION"), profile.region) {
        builder = builder.with_region(region);
    }
    // An S3-compatible store on plain HTTP (a local SeaweedFS or MinIO) needs no more
    // than its endpoint; path-style addressing works with all of them.
    if let Some(endpoint) = endpoint(Scheme::S3) {
        builder = builder.with_endpoint(&endpoint).with_allow_http(endpoint.starts_with("http://"));
    }
    builder.build().map_err(|e| failed(format!("cannot configure the S3 client (check the AWS_* environment): {e}")))
}

/// The client of `url`'s bucket (or web server), at most `max_requests` requests at once.
fn client(
    url: &ObjectUrl,
    retry: RetryConfig,
    timeouts: Timeouts,
    failed: &dyn Fn(String) -> ObjectError,
    max_requests: usize,
) -> Result<Arc<dyn ObjectStore>, ObjectError> {
    let options = ClientOptions::new().with_timeout(timeouts.request).with_connect_timeout(timeouts.connect);
    fn limited<S: ObjectStore>(store: S, max_requests: usize) -> Arc<dyn ObjectStore> {
        Arc::new(LimitStore::new(store, max_requests))
    }
    let bucket = url.bucket.as_str();
    Ok(match url.scheme {
        Scheme::S3 => limited(s3_client(bucket, retry, options, failed)?, max_requests),
        Scheme::Azure => limited(
            MicrosoftAzureBuilder::from_env()
                .with_container_name(bucket)
                .with_retry(retry)
                .with_client_options(options)
                .build()
                .map_err(|e| {
                    failed(format!("cannot configure the Azure client (check the AZURE_* environment): {e}"))
                })?,
            max_requests,
        ),
        Scheme::Gcs => limited(
            GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_client_options(options.with_allow_http(gcs_base_url().is_some_and(|u| u.starts_with("http://"))))
                .build()
                .map_err(|e| {
                    failed(format!(
                        "cannot configure the GCS client of the bucket {bucket} (check GOOGLE_SERVICE_ACCOUNT \
                         or GOOGLE_APPLICATION_CREDENTIALS): {e}"
                    ))
                })?,
            max_requests,
        ),
        Scheme::Http | Scheme::Https => limited(
            HttpBuilder::new()
                .with_url(format!("{}{bucket}", url.scheme.prefix()))
                .with_retry(retry)
                .with_http_connector(NoRedirects { timeouts, https_only: url.scheme == Scheme::Https })
                .build()
                .map_err(|e| failed(format!("cannot configure the HTTP client: {e}")))?,
            max_requests,
        ),
    })
}

/// How long a request, and its connection, may take.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    request: Duration,
    connect: Duration,
}

/// The web-server client: reqwest as the crate makes it, except that a redirect is not
/// followed (the crate then fails the request with the redirect's status). The URL, the one
/// checked against the allowed roots, is the only server read from.
#[derive(Debug)]
struct NoRedirects {
    timeouts: Timeouts,
    https_only: bool,
}

impl HttpConnector for NoRedirects {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(self.timeouts.request)
            .connect_timeout(self.timeouts.connect)
            .https_only(self.https_only)
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
            .build()
            .map(HttpClient::new)
            .map_err(|e| object_store::Error::Generic { store: "HTTP", source: Box::new(e) })
    }
}

/// The GCS endpoint a service-account file names (`gcs_base_url`, for emulators and
/// XML-API-compatible stores), from `GOOGLE_SERVICE_ACCOUNT` (or `GOOGLE_SERVICE_ACCOUNT_PATH`,
/// `SERVICE_ACCOUNT`) or the key itself in `GOOGLE_SERVICE_ACCOUNT_KEY`, as the crate reads them.
fn gcs_base_url() -> Option<String> {
    let key = match env_text("GOOGLE_SERVICE_ACCOUNT_KEY") {
        Some(key) => key,
        None => {
            let path = ["GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "SERVICE_ACCOUNT"]
                .into_iter()
                .find_map(env_text)?;
            std::fs::read_to_string(path).ok()?
        }
    };
    let account: serde_json::Value = serde_json::from_str(&key).ok()?;
    account.get("gcs_base_url")?.as_str().map(str::to_string)
}

/// Where requests to `scheme` go, when not to the cloud itself: for S3, `AWS_ENDPOINT_URL`
/// (or `AWS_ENDPOINT`), else the AWS profile's `endpoint_url`; for Azure, the Azurite
/// emulator's URL when `AZURE_STORAGE_USE_EMULATOR` is set, else the account's name; for
/// GCS, the service account's `gcs_base_url`. An HTTP URL names its server itself.
pub(crate) fn endpoint(scheme: Scheme) -> Option<String> {
    match scheme {
        Scheme::S3 => env_text("AWS_ENDPOINT_URL")
            .or_else(|| env_text("AWS_ENDPOINT"))
            .or_else(|| super::profile::from_env().ok().flatten().and_then(|p| p.endpoint_url)),
        Scheme::Azure => match env_text("AZURE_STORAGE_USE_EMULATOR").is_some_and(|v| v == "true" || v == "1") {
            true => Some(env_text("AZURITE_BLOB_STORAGE_URL").unwrap_or_else(|| "http://127.0.0.1:10000".into())),
            false => env_text("AZURE_STORAGE_ACCOUNT_NAME").map(|a| format!("azure:{a}")),
        },
        Scheme::Gcs => gcs_base_url(),
        Scheme::Http | Scheme::Https => None,
    }
}

pub(super) fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

impl Remote {
    /// Runs `fut` on the shared runtime from a plain (non-runtime) thread.
    pub(crate) fn block_on<F: std::future::Future>(&self, fut: F) -> F::Output {
        self.runtime.block_on(fut)
    }

    /// The client of `url`'s bucket, configured from the environment on first use.
    pub(crate) fn store(&self, url: &ObjectUrl) -> Result<Arc<dyn ObjectStore>, ObjectError> {
        let mut stores = self.stores.lock();
        let id = (url.scheme, url.bucket.clone());
        if let Some(s) = stores.get(&id) {
            return Ok(Arc::clone(s));
        }
        let timeout = env_number("SLUICE_OBJECT_TIMEOUT_S", DEFAULT_TIMEOUT_S).max(0.001);
        let retries = env_number("SLUICE_OBJECT_RETRIES", DEFAULT_RETRIES);
        let max_requests = env_number("SLUICE_OBJECT_MAX_REQUESTS", DEFAULT_MAX_REQUESTS).max(1);
        let timeout = Duration::from_secs_f64(timeout);
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: retries,
            retry_timeout: timeout.saturating_mul(u32::try_from(retries).unwrap_or(u32::MAX).saturating_add(1)),
        };
        let timeouts = Timeouts { request: timeout, connect: timeout.min(Duration::from_secs(10)) };
        let bucket = url.with_key("");
        let failed = |message: String| ObjectError { url: bucket.to_string(), message };
        let store = client(url, retry, timeouts, &failed, max_requests)?;
        stores.insert(id, Arc::clone(&store));
        Ok(store)
    }

    /// The read of a sample's bytes, to run on the shared runtime: the whole object at
    /// `wanted.url`, refused before its body is read when over `max_bytes`, or its byte
    /// range (a tar member), refused when the object ends early.
    fn fetch(&self, wanted: &Wanted, max_bytes: u64) -> impl Future<Output = Result<Bytes, SampleErrorKind>> + 'static {
        let url = wanted.url.clone();
        let range = wanted.range;
        let client = self.store(&url).and_then(|store| Ok((store, object_path(&url)?)));
        async move {
            let (store, path) = client.map_err(|e| SampleErrorKind::Io(e.to_string()))?;
            let Some((offset, len)) = range else {
                let got = store.get(&path).await.map_err(|e| sample_error(&url, &e))?;
                check_size(got.meta.size, max_bytes)?;
                return got.bytes().await.map_err(|e| sample_error(&url, &e));
            };
            check_size(len, max_bytes)?;
            let end =
                offset.checked_add(len).ok_or_else(|| SampleErrorKind::Io(format!("{url}: member range overflows")))?;
            let bytes = store.get_range(&path, offset..end).await.map_err(|e| sample_error(&url, &e))?;
            if (bytes.len() as u64) < len {
                return Err(SampleErrorKind::Io(format!(
                    "{url}: short read: {} of bytes {offset}..{end} (the object ends early: truncated?)",
                    bytes.len(),
                )));
            }
            Ok(bytes)
        }
    }
}

fn copy_into(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.clear();
    buf.extend_from_slice(bytes);
}

/// The error with the causes its message leaves out (the crate says "error sending
/// request"; its sources say a certificate was refused or a connection reset).
fn described(e: &object_store::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

fn sample_error(url: &ObjectUrl, e: &object_store::Error) -> SampleErrorKind {
    match e {
        object_store::Error::NotFound { .. } => SampleErrorKind::Io(format!("{url}: object not found")),
        e => SampleErrorKind::Io(format!("{url}: {}", described(e))),
    }
}

/// Routes each read: object URLs to object storage, everything else to the local storage
/// it wraps. When reads are confined, an object outside the allowed object-storage roots is
/// refused before any request is made.
pub struct ObjectAware {
    local: Arc<dyn Storage>,
    roots: Option<Arc<Roots>>,
    /// Parquet rows, local or in object storage, are read through this.
    row_groups: RowGroupCache,
    /// Reads started before the worker threads ask for them.
    read_ahead: ReadAhead,
}

impl std::fmt::Debug for ObjectAware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectAware").field("local", &self.local.name()).field("roots", &self.roots).finish()
    }
}

impl ObjectAware {
    pub fn new(local: Arc<dyn Storage>, roots: Option<Arc<Roots>>) -> Self {
        let row_groups = RowGroupCache::from_env(roots.clone());
        Self { local, roots, row_groups, read_ahead: ReadAhead::from_env() }
    }

    fn check_allowed(&self, url: &ObjectUrl) -> Result<(), SampleErrorKind> {
        match &self.roots {
            Some(roots) if !roots.allows_url(url) => {
                Err(SampleErrorKind::Refused(format!("{url} is outside the allowed roots ({})", roots.describe())))
            }
            _ => Ok(()),
        }
    }

    /// What a read of `location` under `root` asks object storage for: `None` for local
    /// files and Parquet rows (which the row-group cache reads).
    fn wanted(root: &Path, location: LocationRef<'_>) -> Option<Wanted> {
        let (rel, range) = match location {
            LocationRef::File { path } => (path, None),
            LocationRef::TarMember { shard, offset, len, .. } => (shard, Some((offset, len))),
            LocationRef::ParquetRow { .. } => return None,
        };
        Some(Wanted { url: ObjectUrl::parse(&root.join(rel))?, range })
    }
}

/// Whether any sample of `manifest` is read from object storage (what the read-ahead is
/// for): a loader asks once, so a local dataset names nothing per batch.
pub fn any_remote(manifest: &sluice_core::Manifest) -> bool {
    // A local root makes every sample local (a path joined onto it is never a URL): the
    // answer without a pass over millions of samples.
    let root = &manifest.root;
    if !root.as_os_str().is_empty() && ObjectUrl::parse(root).is_none() {
        return false;
    }
    manifest.entries().any(|e| ObjectAware::wanted(root, e.location).is_some())
}

impl Storage for ObjectAware {
    fn read(&self, root: &Path, loc: LocationRef<'_>, max: u64, buf: &mut Vec<u8>) -> Result<(), SampleErrorKind> {
        if let LocationRef::ParquetRow { file, row_group, row, column } = loc {
            return self.row_groups.read(&root.join(file), row_group, row, column, max, buf);
        }
        let Some(wanted) = Self::wanted(root, loc) else {
            return self.local.read(root, loc, max, buf);
        };
        self.check_allowed(&wanted.url)?;
        let remote = remote().map_err(SampleErrorKind::Io)?;
        // A read started ahead is this read (its checks and errors are the same); one that
        // was given up meanwhile is made again.
        let ahead = match self.read_ahead.take(&wanted) {
            Some(task) => remote.block_on(task).ok(),
            None => None,
        };
        let bytes = match ahead {
            Some(got) => {
                self.read_ahead.served(got.is_ok());
                got?
            }
            None => remote.block_on(remote.fetch(&wanted, max))?,
        };
        copy_into(buf, &bytes);
        Ok(())
    }

    fn name(&self) -> &str {
        self.local.name()
    }

    fn read_ahead(&self, root: &Path, wanted: &[(LocationRef<'_>, u64)], max_bytes: u64) {
        if self.read_ahead.is_off() {
            return;
        }
        let Ok(remote) = remote() else { return };
        let objects = wanted.iter().filter_map(|(location, size)| {
            let wanted = Self::wanted(root, *location)?;
            let fits = wanted.range.is_none_or(|(offset, len)| offset.checked_add(len).is_some() && len <= max_bytes);
            (fits && self.check_allowed(&wanted.url).is_ok()).then_some((wanted, *size))
        });
        self.read_ahead.name(objects, |w| remote.runtime.spawn(remote.fetch(w, max_bytes)));
    }

    fn read_ahead_stats(&self) -> Option<ReadAheadStats> {
        Some(self.read_ahead.stats())
    }
}

/// The objects under `prefix` as (key relative to the prefix, size, etag, last-modified
/// seconds), in key order: one LIST (paginated by the crate).
pub(crate) fn list(prefix: &ObjectUrl) -> Result<Vec<ListedObject>, ObjectError> {
    use futures::TryStreamExt;
    let failed = |message: String| ObjectError { url: prefix.to_string(), message };
    let remote = remote().map_err(failed)?;
    let store = remote.store(prefix)?;
    let path = object_path(prefix)?;
    let metas = remote
        .block_on(store.list(if prefix.key.is_empty() { None } else { Some(&path) }).try_collect::<Vec<_>>())
        .map_err(|e| match prefix.scheme {
            Scheme::Http | Scheme::Https => failed(format!(
                "cannot list the server {}: {} (listing a web server needs WebDAV PROPFIND; on a plain \
                 one, name the objects themselves)",
                prefix.bucket,
                described(&e)
            )),
            _ => failed(format!("cannot list the bucket {}: {}", prefix.bucket, described(&e))),
        })?;
    let base = if prefix.key.is_empty() { String::new() } else { format!("{}/", prefix.key) };
    let mut out: Vec<ListedObject> = metas
        .into_iter()
        .filter_map(|m| {
            let key = m.location.as_ref().strip_prefix(&base)?.to_string();
            Some(ListedObject {
                key,
                size: m.size,
                etag: m.e_tag.unwrap_or_default(),
                modified: m.last_modified.timestamp(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

thread_local! {
    /// Bytes this thread has fetched with [`fetch`] and [`fetch_range`].
    static FETCHED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many bytes of objects the calling thread has fetched outside the sample reads
/// (indexing: tar headers and members, Parquet footers and chunks), since it started: what
/// enumerating a remote dataset cost.
pub fn bytes_fetched_by_this_thread() -> u64 {
    FETCHED.with(std::cell::Cell::get)
}

fn fetched(bytes: bytes::Bytes) -> bytes::Bytes {
    FETCHED.with(|f| f.set(f.get() + bytes.len() as u64));
    bytes
}

/// Bytes `range` of an object (a Parquet footer or column chunk, a window of a tar shard).
pub(crate) fn fetch_range(url: &ObjectUrl, range: Range<u64>) -> Result<bytes::Bytes, ObjectError> {
    let failed = |message: String| ObjectError { url: url.to_string(), message };
    let remote = remote().map_err(failed)?;
    let store = remote.store(url)?;
    let path = object_path(url)?;
    remote.block_on(store.get_range(&path, range)).map(fetched).map_err(|e| failed(described(&e)))
}

/// An object's size and ETag (one `HEAD`).
pub(crate) fn head(url: &ObjectUrl) -> Result<(u64, String), ObjectError> {
    let failed = |message: String| ObjectError { url: url.to_string(), message };
    let remote = remote().map_err(failed)?;
    let store = remote.store(url)?;
    let path = object_path(url)?;
    let meta = remote.block_on(store.head(&path)).map_err(|e| failed(described(&e)))?;
    Ok((meta.size, meta.e_tag.unwrap_or_default()))
}

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListedObject {
    /// The key relative to the listed prefix.
    pub key: String,
    pub size: u64,
    pub etag: String,
    /// Last modification, seconds since the Unix epoch.
    pub modified: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Location, Manifest};
    use std::path::PathBuf;

    fn manifest(root: &str, paths: &[&str]) -> Manifest {
        let items = paths.iter().map(|p| (Location::File { path: PathBuf::from(p) }, 0, 1)).collect();
        Manifest::new(PathBuf::from(root), items, Vec::new())
    }

    #[test]
    fn a_manifest_is_remote_when_any_sample_is_an_object() {
        assert!(!any_remote(&manifest("/data", &["a.jpg", "b/c.jpg"])));
        assert!(any_remote(&manifest("s3://bucket/train", &["a.jpg"])));
        assert!(any_remote(&manifest("", &["/local/a.jpg", "az://acct/c/b.jpg"])), "one URL among local paths");
        let row = Location::ParquetRow { file: PathBuf::from("p.parquet"), row_group: 0, row: 0, column: 0 };
        let rows = Manifest::new(PathBuf::from("s3://bucket"), vec![(row, 0, 1)], Vec::new());
        assert!(!any_remote(&rows), "Parquet rows are read by the row-group cache, not ahead");
    }

    #[test]
    fn a_key_climbing_out_of_its_prefix_is_refused_before_any_request() {
        // `is_under` compares segments as written; the key is refused when made a request.
        for url in ["http://127.0.0.1:1/data/train/../secret", "gs://b/train/../x", "s3://b/train/../x"] {
            let url = ObjectUrl::parse(Path::new(url)).unwrap();
            let e = object_path(&url).unwrap_err().to_string();
            assert!(e.contains(&url.to_string()) && e.contains("not a valid object key"), "{e}");
        }
    }
}
