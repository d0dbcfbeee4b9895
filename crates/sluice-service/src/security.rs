//! What a client may make the service read, and who may call it.
//!
//! * [`AllowedRoots`]: every path a spec names, every file its source opens to enumerate
//!   (sidecars, file lists, COCO annotation files, tar shards, Parquet files: opened
//!   beneath the roots by the kernel, [`AllowedRoots::manifest`]), and every file its
//!   manifest lists (samples and mask files) must resolve (after `..` and symlinks) under
//!   a root the operator allowed; one that does not refuses the job, naming the file.
//!   An allowed root may be an object-storage prefix, `s3://bucket/prefix` (or `az://`,
//!   `gs://`, `http(s)://host:port/prefix`): then a URL the spec or manifest names must lie
//!   in that store and bucket (or scheme, host and port), under that prefix by whole segments.
//!   That check runs once per job; the job's loader then reads through
//!   [`AllowedRoots::confine`], which opens every file beneath its root, so a file swapped
//!   for a symlink later is refused when it is read.
//! * [`TokenCheck`]: a shared secret in the `authorization: Bearer <token>` header of
//!   every RPC, checked by an interceptor before any handler runs; the operator token, a
//!   second one, is what operator calls (`SetScale`, `DrainWorker`) need
//!   ([`require_operator`]).
//! * [`check_client`]: a call on a client's leases must carry the secret its (public) id
//!   was made from (`sluice_client::ClientSecret`).

use std::path::{Path, PathBuf};

use sluice_core::{Manifest, MaskSource, PipelineSpec, SourceSpec};
use sluice_pipeline::source::SourceError;
use sluice_pipeline::storage::{ObjectUrl, Roots};
use sluice_pipeline::{Loader, PipelineError};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use sluice_client::security::{constant_time_eq, secret_digest};

use crate::error::ServiceError;

#[derive(Debug, Clone)]
pub struct AllowedRoots {
    roots: Vec<PathBuf>,
}

impl AllowedRoots {
    /// Canonicalizes each root; a root that does not exist is an error (a typo would
    /// otherwise silently refuse everything).
    pub fn new(roots: &[PathBuf]) -> Result<Self, ServiceError> {
        let mut canon = Vec::with_capacity(roots.len());
        for r in roots {
            if ObjectUrl::parse(r).is_some_and(|u| !u.bucket.is_empty()) {
                canon.push(r.clone());
                continue;
            }
            let c = r.canonicalize().map_err(|e| {
                ServiceError::InvalidArgument(format!("allowed root {} cannot be resolved: {e}", r.display()))
            })?;
            canon.push(c);
        }
        Ok(Self { roots: canon })
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    fn describe(&self) -> String {
        if self.roots.is_empty() {
            return "none".into();
        }
        self.roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Refuses `path` unless it resolves under an allowed root. A path that does not exist
    /// is judged by its nearest existing ancestor, so the error names the real problem.
    pub fn check(&self, path: &Path) -> Result<(), ServiceError> {
        let allowed = match ObjectUrl::parse(path) {
            Some(url) => self.roots.iter().filter_map(|r| ObjectUrl::parse(r)).any(|root| url.is_under(&root)),
            None => {
                let resolved = resolve(path);
                self.roots.iter().any(|r| resolved.starts_with(r))
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(ServiceError::PathNotAllowed { path: path.to_path_buf(), allowed: self.describe() })
        }
    }

    /// Makes `loader` read only beneath these roots, checked again at every open.
    pub fn confine(&self, loader: Loader) -> Result<Loader, ServiceError> {
        Ok(loader.confine_reads(&self.roots)?)
    }

    /// Checks the paths a source spec names, before anything is enumerated.
    pub fn check_source(&self, source: &SourceSpec) -> Result<(), ServiceError> {
        match source {
            SourceSpec::ImageFolder { root } => self.check(root),
            SourceSpec::FileList { path, root } => {
                self.check(path)?;
                root.as_deref().map_or(Ok(()), |r| self.check(r))
            }
            SourceSpec::Tar { shards, .. } => shards.iter().try_for_each(|s| self.check(s)),
            SourceSpec::Mix { sources } => sources.iter().try_for_each(|s| self.check_source(&s.source)),
            SourceSpec::Parquet { path, .. } => self.check(path),
            SourceSpec::Coco { annotations, images, .. } => {
                self.check(annotations)?;
                self.check(images)
            }
            SourceSpec::Sidecar { root, .. } => self.check(root),
        }
    }

    /// The job's dataset, enumerated within these roots: the spec's paths checked
    /// ([`Self::check_source`]), every file the source opens to enumerate opened beneath the
    /// roots (a sidecar symlinked out refuses the job, naming it), and every file the
    /// manifest lists checked ([`Self::check_manifest`]).
    pub fn manifest(&self, spec: &PipelineSpec) -> Result<Manifest, ServiceError> {
        self.check_source(&spec.source)?;
        let roots = Roots::open(&self.roots).map_err(PipelineError::from)?;
        let manifest =
            sluice_pipeline::source::build_pipeline_manifest_within(spec, Some(&roots)).map_err(|e| match e {
                SourceError::OutsideRoots { what, path, why } => ServiceError::ReadNotAllowed { what, path, why },
                e => PipelineError::from(e).into(),
            })?;
        self.check_manifest(&manifest)?;
        Ok(manifest)
    }

    /// Checks every file a manifest lists, its samples' and their masks': a file list may
    /// name absolute paths, `..`, or symlinks that lead elsewhere, and so may a sidecar's
    /// mask.
    pub fn check_manifest(&self, manifest: &Manifest) -> Result<(), ServiceError> {
        // Samples of one shard (or one file listed again) follow each other: check it once.
        let mut checked: Option<&Path> = None;
        for e in manifest.entries() {
            let file = e.location.file();
            if checked != Some(file) {
                self.check(&manifest.root.join(file))?;
                checked = Some(file);
            }
        }
        for mask in manifest.masks.iter().flatten() {
            if let MaskSource::File(file) = mask {
                self.check(&manifest.root.join(file))?;
            }
        }
        Ok(())
    }
}

/// `canonicalize`, or for a missing path its deepest existing ancestor's canonical form
/// joined with the rest (so `allowed/../../etc` still resolves to `/etc`).
fn resolve(path: &Path) -> PathBuf {
    if let Ok(c) = path.canonicalize() {
        return c;
    }
    let mut rest = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        if let Ok(c) = cur.canonicalize() {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            // Lexically fold what is left; `..` of a missing folder is still a step up.
            return fold(&out);
        }
        match (cur.file_name().map(|f| f.to_os_string()), cur.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                cur = parent.to_path_buf();
            }
            _ => return fold(path),
        }
    }
}

fn fold(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Who made a call, as [`TokenCheck`] found it (in the request's extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The clients' (and workers') token, or no token where none is asked.
    Client,
    /// The operator token; or any call where the service asks for no token at all.
    Operator,
}

/// The server side of the tokens: refuses any RPC whose `authorization` header is not
/// `Bearer <token>` or `Bearer <operator token>`, and tells the handler which it was
/// ([`Caller`]). With no token configured every call passes; with neither token
/// configured, every caller is the operator (an open service has nothing to tell apart).
#[derive(Clone)]
pub struct TokenCheck {
    expected: Option<Vec<u8>>,
    operator: Option<Vec<u8>>,
}

impl TokenCheck {
    pub fn new(token: Option<&str>) -> Self {
        Self { expected: bearer(token), operator: None }
    }

    /// Also takes `operator` (when given), for the operator's calls.
    pub fn with_operator(mut self, operator: Option<&str>) -> Self {
        self.operator = bearer(operator);
        self
    }

    fn caller(&self, given: &[u8]) -> Option<Caller> {
        if self.operator.as_deref().is_some_and(|op| constant_time_eq(given, op)) {
            return Some(Caller::Operator);
        }
        match (&self.expected, &self.operator) {
            (None, None) => Some(Caller::Operator),
            (None, Some(_)) => Some(Caller::Client),
            (Some(expected), _) => constant_time_eq(given, expected).then_some(Caller::Client),
        }
    }
}

fn bearer(token: Option<&str>) -> Option<Vec<u8>> {
    token.filter(|t| !t.is_empty()).map(|t| format!("Bearer {t}").into_bytes())
}

impl Interceptor for TokenCheck {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let given = req.metadata().get("authorization").map(|v| v.as_bytes()).unwrap_or_default();
        match self.caller(given) {
            Some(caller) => {
                req.extensions_mut().insert(caller);
                Ok(req)
            }
            None => Err(Status::unauthenticated(
                "missing or wrong token (set --token or SLUICE_TOKEN to the service's token)",
            )),
        }
    }
}

/// Refuses an operator call (`what`) unless [`TokenCheck`] found the operator token on it.
pub fn require_operator<T>(req: &Request<T>, what: &'static str) -> Result<(), ServiceError> {
    match req.extensions().get::<Caller>() {
        Some(Caller::Operator) => Ok(()),
        _ => Err(ServiceError::OperatorOnly { what }),
    }
}

/// Checks a call made in `client`'s name with `secret`. An id that carries a digest
/// (`LABEL#` and 32 hex digits, what `sluice_client::ClientSecret` makes) needs the secret it came from.
/// An id without one (a client older than lease secrets) needs none, and has no
/// protection: anyone who reads it can act in its name.
pub fn check_client(client: &str, secret: &str) -> Result<(), ServiceError> {
    let refuse = |why| Err(ServiceError::ClientSecret { client: client.to_string(), why });
    let digest = client
        .rsplit_once('#')
        .map(|(_, d)| d)
        .filter(|d| d.len() == 32 && d.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    match digest {
        Some(_) if secret.is_empty() => refuse("the call does not carry the client's secret (`client_secret`)"),
        Some(d) if !constant_time_eq(secret_digest(secret).as_bytes(), d.as_bytes()) => {
            refuse("the secret the call carries is not this client's")
        }
        Some(_) => Ok(()),
        None if !secret.is_empty() => {
            refuse("a secret was given, but the id does not end in its digest (`#` and 32 hex digits)")
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_client::ClientSecret;

    #[test]
    fn paths_outside_roots_are_refused_even_through_dotdot_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("data");
        let outside = dir.path().join("secret");
        std::fs::create_dir_all(allowed.join("a")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let roots = AllowedRoots::new(std::slice::from_ref(&allowed)).unwrap();
        assert!(roots.check(&allowed.join("a")).is_ok());
        assert!(roots.check(&allowed.join("missing/file.jpg")).is_ok());
        assert!(roots.check(&allowed.join("../secret")).is_err());
        assert!(roots.check(&allowed.join("missing/../../secret/x")).is_err());
        assert!(roots.check(&outside).is_err());
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&outside, allowed.join("link")).unwrap();
            let err = roots.check(&allowed.join("link")).unwrap_err().to_string();
            assert!(err.contains("outside the allowed roots"), "{err}");
        }
        assert!(AllowedRoots::new(&[]).unwrap().check(&allowed).is_err());
    }

    #[test]
    fn s3_roots_allow_their_bucket_and_prefix_only() {
        let dir = tempfile::tempdir().unwrap();
        let roots = AllowedRoots::new(&[PathBuf::from("s3://data/train"), dir.path().to_path_buf()]).unwrap();
        for ok in ["s3://data/train", "s3://data/train/cat/x.jpg", "s3://data//train/x.tar"] {
            assert!(roots.check(Path::new(ok)).is_ok(), "{ok} is under s3://data/train");
        }
        for refused in [
            "s3://data/training/x.jpg",
            "s3://data/x.jpg",
            "s3://other/train/x.jpg",
            "s3://data",
            "az://data/train/x.jpg",
        ] {
            let err = roots.check(Path::new(refused)).unwrap_err().to_string();
            assert!(err.contains(refused) && err.contains("s3://data/train"), "{err}");
        }
        assert!(roots.check(&dir.path().join("a.jpg")).is_ok(), "local roots still work");
        assert!(AllowedRoots::new(&[dir.path().to_path_buf()]).unwrap().check(Path::new("s3://data/train/x")).is_err());
    }

    #[test]
    fn gs_and_web_roots_allow_their_own_scheme_server_and_prefix_only() {
        let roots =
            AllowedRoots::new(&[PathBuf::from("gs://data/train"), PathBuf::from("http://127.0.0.1:8080/d/train")])
                .unwrap();
        for ok in ["gs://data/train/cat/x.jpg", "http://127.0.0.1:8080/d/train/x.tar"] {
            assert!(roots.check(Path::new(ok)).is_ok(), "{ok} is under an allowed root");
        }
        for refused in [
            "s3://data/train/x.jpg",
            "gs://data/training/x.jpg",
            "https://127.0.0.1:8080/d/train/x.tar",
            "http://127.0.0.1:8081/d/train/x.tar",
            "http://localhost:8080/d/train/x.tar",
            "http://127.0.0.1:8080/d/x.tar",
        ] {
            let err = roots.check(Path::new(refused)).unwrap_err().to_string();
            assert!(err.contains(refused), "{err}");
        }
    }

    #[test]
    fn a_file_swapped_for_a_symlink_after_the_jobs_check_is_refused_when_read() {
        use sluice_core::{ErrorPolicy, PipelineSpec, ShuffleSpec, SourceSpec};
        use sluice_pipeline::{source::build_manifest, Shard};
        use sluice_synth::{write_dataset, DatasetOptions};

        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("data");
        let outside = dir.path().join("secret");
        let options = DatasetOptions { images: 4, classes: 1, ..Default::default() };
        write_dataset(&allowed, &options, &|_| {}).unwrap();
        write_dataset(&outside, &options, &|_| {}).unwrap();
        let roots = AllowedRoots::new(std::slice::from_ref(&allowed)).unwrap();
        let mut spec = PipelineSpec::train_default(SourceSpec::ImageFolder { root: allowed.clone() }, 16, 4);
        spec.on_error = ErrorPolicy::Skip;
        spec.shuffle = ShuffleSpec::None;
        spec.threads = 1.into();
        roots.check_source(&spec.source).unwrap();
        let manifest = build_manifest(&spec.source).unwrap();
        roots.check_manifest(&manifest).unwrap();
        let loader = roots.confine(Loader::with_manifest(spec, manifest, Shard::default()).unwrap()).unwrap();

        // After the check: one image becomes a symlink to a file outside the roots.
        let swapped = allowed.join("class_000/img_0000001.jpg");
        std::fs::remove_file(&swapped).unwrap();
        std::os::unix::fs::symlink(outside.join("class_000/img_0000001.jpg"), &swapped).unwrap();

        let delivered: Vec<u64> = loader.iter().flat_map(|b| b.unwrap().keys).collect();
        assert_eq!(delivered, vec![0, 2, 3], "the swapped file was read from outside the roots");
        let skipped = loader.stats().skipped;
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].error.contains("outside the allowed roots"), "{}", skipped[0].error);
    }

    #[test]
    fn token_check_wants_the_exact_bearer_token() {
        let mut check = TokenCheck::new(Some("s3cret"));
        let mut with = |v: Option<&str>| {
            let mut r = Request::new(());
            if let Some(v) = v {
                r.metadata_mut().insert("authorization", v.parse().unwrap());
            }
            check.call(r).map(|_| ()).map_err(|s| s.code())
        };
        assert_eq!(with(Some("Bearer s3cret")), Ok(()));
        assert_eq!(with(Some("Bearer s3creT")), Err(tonic::Code::Unauthenticated));
        assert_eq!(with(None), Err(tonic::Code::Unauthenticated));
        assert!(TokenCheck::new(None).call(Request::new(())).is_ok());
    }

    #[test]
    fn only_the_holder_of_a_clients_secret_acts_in_its_name() {
        let a = ClientSecret::generate("host-1").unwrap();
        let b = ClientSecret::generate("host-1").unwrap();
        assert!(a.id().starts_with("host-1#") && a.id() != b.id());
        assert!(!a.id().contains(a.secret()));
        assert!(check_client(a.id(), a.secret()).is_ok());
        assert!(check_client(a.id(), "").is_err(), "the public id alone");
        assert!(check_client(a.id(), b.secret()).is_err(), "another client's secret");
        // Older clients: an id without a digest, and no secret.
        assert!(check_client("host-1-2-3f", "").is_ok());
        assert!(check_client("host-1-2-3f", a.secret()).is_err());
    }

    #[test]
    fn only_the_operator_token_makes_an_operator() {
        let caller = |check: &mut TokenCheck, v: Option<&str>| {
            let mut r = Request::new(());
            if let Some(v) = v {
                r.metadata_mut().insert("authorization", v.parse().unwrap());
            }
            check.call(r).map(|r| r.extensions().get::<Caller>().copied()).map_err(|s| s.code())
        };
        let mut both = TokenCheck::new(Some("client")).with_operator(Some("op"));
        assert_eq!(caller(&mut both, Some("Bearer op")), Ok(Some(Caller::Operator)));
        assert_eq!(caller(&mut both, Some("Bearer client")), Ok(Some(Caller::Client)));
        assert_eq!(caller(&mut both, Some("Bearer nope")), Err(tonic::Code::Unauthenticated));
        let mut clients_only = TokenCheck::new(Some("client"));
        assert_eq!(caller(&mut clients_only, Some("Bearer client")), Ok(Some(Caller::Client)));
        let mut operator_only = TokenCheck::new(None).with_operator(Some("op"));
        assert_eq!(caller(&mut operator_only, None), Ok(Some(Caller::Client)));
        assert_eq!(caller(&mut operator_only, Some("Bearer op")), Ok(Some(Caller::Operator)));
        assert_eq!(caller(&mut TokenCheck::new(None), None), Ok(Some(Caller::Operator)));
        let refused = require_operator(&Request::new(()), "SetScale").unwrap_err().to_string();
        assert!(refused.contains("--operator-token"), "{refused}");
    }
}
