//! Opening a sample's file without trusting what is on disk: a FIFO or device never
//! blocks a thread or gets read (opened non-blocking, refused unless a regular file), and
//! when the operator allowed only some roots (the service), the open resolves beneath one
//! of them (`openat2` with `RESOLVE_BENEATH`, Linux ≥ 5.6), whatever symlink is swapped
//! in after the job's paths were checked. A root may also be an object-storage prefix
//! (`s3://bucket/prefix`, `az://container/prefix`, `gs://bucket/prefix`,
//! `http(s)://host:port/prefix`): then only objects of that store and bucket (or server)
//! whose key lies under the prefix (whole `/` segments) are read.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{open, openat2, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sluice_core::SampleErrorKind;

use super::io_error;
use super::url::ObjectUrl;

/// Read-only, and never waiting: opening a FIFO with no writer returns at once.
const FLAGS: OFlags = OFlags::RDONLY.union(OFlags::CLOEXEC).union(OFlags::NONBLOCK).union(OFlags::NOCTTY);

/// The roots reads are confined to, each held open so that a path is resolved beneath it.
/// An allowed root that reads cannot be confined under (see [`crate::Loader::confine_reads`]).
#[derive(Debug, thiserror::Error)]
#[error("cannot open allowed root {path}: {source}")]
pub struct RootError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

#[derive(Debug)]
pub struct Roots {
    roots: Vec<(PathBuf, OwnedFd)>,
    /// Allowed object-storage prefixes.
    urls: Vec<ObjectUrl>,
}

impl Roots {
    /// Opens each root (resolved once, now, like the checks of the job's paths).
    pub fn open(roots: &[PathBuf]) -> Result<Self, RootError> {
        let mut held = Vec::with_capacity(roots.len());
        let mut urls = Vec::new();
        for root in roots {
            if let Some(url) = ObjectUrl::parse(root) {
                if url.bucket.is_empty() {
                    return Err(RootError {
                        path: root.clone(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            "an object-storage root names no bucket",
                        ),
                    });
                }
                urls.push(url);
                continue;
            }
            let failed = |source| RootError { path: root.clone(), source };
            let canonical = root.canonicalize().map_err(failed)?;
            let fd = open(&canonical, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| failed(e.into()))?;
            held.push((canonical, fd));
        }
        Ok(Self { roots: held, urls })
    }

    pub(crate) fn describe(&self) -> String {
        let paths = self.roots.iter().map(|(r, _)| r.display().to_string());
        paths.chain(self.urls.iter().map(ToString::to_string)).collect::<Vec<_>>().join(", ")
    }

    /// Whether the object at `url` lies under an allowed object-storage prefix.
    pub fn allows_url(&self, url: &ObjectUrl) -> bool {
        self.urls.iter().any(|root| url.is_under(root))
    }

    /// Opens `path` beneath the root it lies under. Usually the path as written already lies
    /// under a root (manifests are built from the roots), and one `openat2` from that root
    /// does it: the kernel resolves beneath the root (`RESOLVE_BENEATH`) and refuses to leave
    /// it, whatever symlink is swapped in. Otherwise, or when the kernel refuses (an absolute
    /// symlink, even one that stays inside), the root and the path under it come from the
    /// path's canonical form.
    fn open_beneath(&self, path: &Path) -> Result<OwnedFd, OpenFailure> {
        let other = |e: std::io::Error| OpenFailure::Other(io_error(e));
        if let Some((root, dir)) = self.roots.iter().find(|(r, _)| path.starts_with(r)) {
            match open_under(dir, path.strip_prefix(root).unwrap_or(path)) {
                Err(Errno::XDEV) => {}
                done => return done.map_err(|e| other(e.into())),
            }
        }
        let canonical = path.canonicalize().map_err(other)?;
        let outside = || {
            OpenFailure::OutsideRoots(format!(
                "{} resolves outside the allowed roots ({})",
                canonical.display(),
                self.describe()
            ))
        };
        let (root, dir) = self.roots.iter().find(|(r, _)| canonical.starts_with(r)).ok_or_else(outside)?;
        let under = canonical.strip_prefix(root).map_err(|_| outside())?;
        open_under(dir, under).map_err(|e| match e {
            Errno::XDEV => OpenFailure::OutsideRoots(format!(
                "a symlink or `..` in {} leads outside the allowed root {}",
                under.display(),
                root.display()
            )),
            e => other(e.into()),
        })
    }
}

/// Why [`open_regular_within`] opened nothing.
#[derive(Debug)]
pub(crate) enum OpenFailure {
    /// The path resolves outside the allowed roots (the message says how, and names them).
    OutsideRoots(String),
    /// Anything else: missing, not a regular file, an I/O error.
    Other(SampleErrorKind),
}

/// Opens `under` (relative) beneath the root directory `dir`, never leaving it.
fn open_under(dir: &OwnedFd, under: &Path) -> Result<OwnedFd, Errno> {
    let under = if under.as_os_str().is_empty() { Path::new(".") } else { under };
    openat2(dir, under, FLAGS, Mode::empty(), ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS)
}

/// Opens the regular file at `path` for reading, beneath `roots` when given; anything else
/// (a FIFO, a device, a socket, a directory) is refused without reading or blocking.
pub(crate) fn open_regular(path: &Path, roots: Option<&Roots>) -> Result<File, SampleErrorKind> {
    open_regular_within(path, roots).map_err(|f| match f {
        OpenFailure::OutsideRoots(why) => SampleErrorKind::Refused(why),
        OpenFailure::Other(kind) => kind,
    })
}

/// As [`open_regular`], telling a path out of the roots (which refuses a whole job when
/// its dataset is enumerated) from every other failure.
pub(crate) fn open_regular_within(path: &Path, roots: Option<&Roots>) -> Result<File, OpenFailure> {
    let fd = match roots {
        Some(roots) => roots.open_beneath(path)?,
        None => open(path, FLAGS, Mode::empty()).map_err(|e| OpenFailure::Other(io_error(e.into())))?,
    };
    let kind = rustix::fs::fstat(&fd).map_err(|e| OpenFailure::Other(io_error(e.into())))?;
    match FileType::from_raw_mode(kind.st_mode) {
        FileType::RegularFile => Ok(File::from(fd)),
        other => {
            Err(OpenFailure::Other(SampleErrorKind::Refused(format!("not a regular file but {}", describe(other)))))
        }
    }
}

fn describe(t: FileType) -> &'static str {
    match t {
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO (named pipe)",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Socket => "a socket",
        _ => "something else",
    }
}
