//! Datasets in object storage. An image folder at `s3://bucket/prefix` (or `az://`, `gs://`,
//! or `http(s)://` from a WebDAV server) is one LIST of the prefix: a key `prefix/<class>/.../<image>` is a sample of `<class>` (the first path
//! component below the root, as for folders), classes sorted by name, folders in path
//! order and files sorted within each folder, as [`super::image_folder`] orders them, so
//! the same files give the same manifest (and the same batches) locally and in a bucket.
//!
//! The listing is cached: written once, as JSON, under the listing cache folder (below),
//! keyed by the endpoint and the prefix, and holding every object's size, ETag and
//! modification time. A later job (a restart, another rank) reads it instead of listing
//! again; delete the file (its path is logged) to list afresh after the bucket changed.
//! The folder is `$SLUICE_CACHE_DIR/listings`, else `$XDG_CACHE_HOME/sluice/listings`,
//! else `~/.cache/sluice/listings`.

use std::path::{Path, PathBuf};

use sluice_core::{Location, Manifest};

use super::{has_image_extension, SourceError};
use crate::storage::object::{list, ListedObject, ObjectError, ObjectUrl, Scheme};

/// The folder listings are cached in (see the module docs); `None` without a home.
pub fn listing_cache_dir() -> Option<PathBuf> {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("SLUICE_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("sluice")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("sluice")))
        .map(|d| d.join("listings"))
}

/// The endpoint listings of `url` are keyed by: the compatible store's or emulator's, or
/// the cloud itself.
fn endpoint(url: &ObjectUrl) -> String {
    let cloud = match url.scheme {
        Scheme::S3 => "aws",
        Scheme::Azure => "azure",
        Scheme::Gcs => "gcs",
        Scheme::Http | Scheme::Https => "web",
    };
    crate::storage::object::endpoint(url.scheme).unwrap_or_else(|| cloud.into())
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct CachedListing {
    endpoint: String,
    url: String,
    objects: Vec<ListedObject>,
}

/// The cache file of `url` at `endpoint`: a readable stem and a hash of the full key.
fn cache_file(dir: &Path, endpoint: &str, url: &ObjectUrl) -> PathBuf {
    // FNV-1a: stable across builds, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in endpoint.bytes().chain([0]).chain(url.to_string().bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let readable: String = format!("{}_{}", url.bucket, url.key)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
        .take(80)
        .collect();
    dir.join(format!("{readable}-{h:016x}.json"))
}

/// The objects under `url`: from the listing cache when it holds them, else one LIST
/// (then cached).
pub fn listing(url: &ObjectUrl) -> Result<Vec<ListedObject>, ObjectError> {
    let endpoint = endpoint(url);
    let file = listing_cache_dir().map(|d| cache_file(&d, &endpoint, url));
    if let Some(file) = &file {
        if let Ok(text) = std::fs::read_to_string(file) {
            match serde_json::from_str::<CachedListing>(&text) {
                Ok(c) if c.endpoint == endpoint && c.url == url.to_string() => {
                    tracing::info!(url = %url, objects = c.objects.len(), cache = %file.display(), "listing from cache");
                    return Ok(c.objects);
                }
                Ok(_) => tracing::warn!(cache = %file.display(), "cached listing is for another prefix; listing again"),
                Err(e) => {
                    tracing::warn!(cache = %file.display(), error = %e, "cached listing unreadable; listing again")
                }
            }
        }
    }
    let objects = list(url)?;
    tracing::info!(url = %url, objects = objects.len(), "listed prefix");
    if let Some(file) = &file {
        let cached = CachedListing { endpoint, url: url.to_string(), objects };
        if let Err(e) = write_atomically(file, &cached) {
            tracing::warn!(cache = %file.display(), error = %e, "cannot cache the listing; the next job lists again");
        }
        return Ok(cached.objects);
    }
    Ok(objects)
}

/// Write-then-rename, so a crash never leaves a half-written listing to be read back.
fn write_atomically(file: &Path, listing: &CachedListing) -> std::io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        file.file_name().and_then(|n| n.to_str()).unwrap_or("listing"),
        std::process::id()
    ));
    let json = serde_json::to_vec(listing).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, file)
}

/// Enumerates an image folder under `url` (see the module docs).
pub fn enumerate_image_folder(url: &ObjectUrl) -> Result<Manifest, SourceError> {
    let objects = listing(url)?;
    // (class, parent folder below the root, file name, size) of every image.
    let mut classes: Vec<&str> = Vec::new();
    let mut images: Vec<(&str, &str, &str, u64)> = Vec::new();
    let mut ignored = 0usize;
    for o in &objects {
        let Some((class, _)) = o.key.split_once('/') else {
            ignored += 1;
            continue;
        };
        classes.push(class);
        let (parent, name) = o.key.rsplit_once('/').unwrap_or(("", &o.key));
        if has_image_extension(Path::new(name)) {
            images.push((class, parent, name, o.size));
        } else {
            ignored += 1;
        }
    }
    classes.sort_unstable();
    classes.dedup();
    let root = PathBuf::from(url.to_string());
    if classes.is_empty() {
        return Err(SourceError::NoClasses { root });
    }
    if ignored > 0 {
        tracing::debug!(ignored, root = %url, "ignored objects that are not <class>/.../<jpg|jpeg|png>");
    }
    let label = |class: &str| classes.binary_search(&class).map_or(-1, |i| i as i64);
    images.sort_by(|a, b| {
        (label(a.0), a.1.as_bytes(), a.2.as_bytes()).cmp(&(label(b.0), b.1.as_bytes(), b.2.as_bytes()))
    });
    let items: Vec<(Location, i64, u64)> = images
        .iter()
        .map(|(class, parent, name, size)| (Location::File { path: Path::new(parent).join(name) }, label(class), *size))
        .collect();
    if items.is_empty() {
        return Err(SourceError::NoSamples {
            dataset: url.to_string(),
            hint: "no .jpg, .jpeg or .png objects under any <class>/ prefix",
        });
    }
    let classes = classes.iter().map(|c| (*c).to_string()).collect();
    Ok(Manifest::new(root, items, classes))
}
