//! `root/<class>/<image>` datasets with torchvision `ImageFolder` semantics: classes are the
//! sub-folders of `root` (symlinks followed) sorted by name, a class's label is its index,
//! and each class folder is walked recursively, folders in path order and files sorted
//! within each folder. Only `.jpg`, `.jpeg` and `.png` files (any case) are samples.
//! Paths in the manifest are relative to `root`, so a moved dataset keeps its fingerprint.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{self, DirEntry};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sluice_core::{Location, Manifest};

use super::{has_image_extension, SourceError};

/// Enumerates an image-folder dataset.
pub fn enumerate(root: &Path) -> Result<Manifest, SourceError> {
    let meta = fs::metadata(root).map_err(|e| SourceError::io("dataset root", root, e))?;
    if !meta.is_dir() {
        return Err(SourceError::NotADirectory { path: root.to_path_buf() });
    }

    let mut class_dirs: Vec<OsString> = Vec::new();
    for entry in read_dir(root)? {
        let entry = entry.map_err(|e| SourceError::io("dataset root", root, e))?;
        if follow(&entry).is_ok_and(|m| m.is_dir()) {
            class_dirs.push(entry.file_name());
        }
    }
    class_dirs.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
    if class_dirs.is_empty() {
        return Err(SourceError::NoClasses { root: root.to_path_buf() });
    }

    let mut items = Vec::new();
    let mut stats = WalkStats::default();
    for (label, class) in class_dirs.iter().enumerate() {
        let before = items.len();
        walk_class(root, Path::new(class), label as i64, &mut items, &mut stats)?;
        if items.len() == before {
            tracing::warn!(class = %class.to_string_lossy(), root = %root.display(), "class folder has no images");
        }
    }
    if stats.ignored > 0 {
        tracing::debug!(ignored = stats.ignored, root = %root.display(), "ignored files without a jpg/jpeg/png extension");
    }
    if stats.broken_links > 0 {
        tracing::warn!(
            broken_links = stats.broken_links,
            root = %root.display(),
            "image entries whose symlink target is missing; they will fail at read time"
        );
    }
    if items.is_empty() {
        return Err(SourceError::NoSamples {
            dataset: root.display().to_string(),
            hint: "no .jpg, .jpeg or .png files under any class folder",
        });
    }
    let classes = class_dirs.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    Ok(Manifest::new(root.to_path_buf(), items, classes))
}

#[derive(Default)]
pub(super) struct WalkStats {
    pub(super) ignored: usize,
    pub(super) broken_links: usize,
}

/// A folder's image files as (name, size), to be sorted.
struct Folder {
    rel: PathBuf,
    files: Vec<(OsString, u64)>,
}

/// Walks one class folder. Folders are visited in the order of their root-relative path
/// bytes (what Python's `sorted(os.walk(...))` gives), files sorted within each folder.
pub(super) fn walk_class(
    root: &Path,
    class: &Path,
    label: i64,
    items: &mut Vec<(Location, i64, u64)>,
    stats: &mut WalkStats,
) -> Result<(), SourceError> {
    let mut folders: Vec<Folder> = Vec::new();
    // (dev, inode) of folders seen, so a symlink cycle cannot loop forever.
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut pending = vec![class.to_path_buf()];
    if let Ok(m) = fs::metadata(root.join(class)) {
        seen.insert((m.dev(), m.ino()));
    }

    while let Some(rel) = pending.pop() {
        let abs = root.join(&rel);
        let mut files = Vec::new();
        for entry in read_dir(&abs)? {
            let entry = entry.map_err(|e| SourceError::io("folder", &abs, e))?;
            let name = entry.file_name();
            let is_image = has_image_extension(Path::new(&name));
            // The file type comes with the directory listing: skip other files without a stat.
            if entry.file_type().is_ok_and(|t| t.is_file()) && !is_image {
                stats.ignored += 1;
                continue;
            }
            let meta = match follow(&entry) {
                Ok(m) => m,
                Err(_) => {
                    // A dangling symlink (or an entry removed since the listing): like
                    // torchvision, keep it if it looks like an image and let the read report it.
                    if is_image {
                        stats.broken_links += 1;
                        files.push((name, 0));
                    }
                    continue;
                }
            };
            if meta.is_dir() {
                if seen.insert((meta.dev(), meta.ino())) {
                    pending.push(rel.join(&name));
                } else {
                    tracing::warn!(path = %entry.path().display(), "folder already visited (symlink loop?), skipped");
                }
            } else if is_image {
                files.push((name, meta.len()));
            } else {
                stats.ignored += 1;
            }
        }
        folders.push(Folder { rel, files });
    }

    folders.sort_by(|a, b| a.rel.as_os_str().as_encoded_bytes().cmp(b.rel.as_os_str().as_encoded_bytes()));
    for mut folder in folders {
        folder.files.sort_by(|a, b| a.0.as_encoded_bytes().cmp(b.0.as_encoded_bytes()));
        for (name, size) in folder.files {
            items.push((Location::File { path: folder.rel.join(name) }, label, size));
        }
    }
    Ok(())
}

fn read_dir(dir: &Path) -> Result<fs::ReadDir, SourceError> {
    fs::read_dir(dir).map_err(|e| SourceError::io("folder", dir, e))
}

/// Metadata of the entry, following a symlink. Costs no extra call for plain entries
/// beyond the `statx` that `DirEntry::metadata` does.
fn follow(entry: &DirEntry) -> std::io::Result<fs::Metadata> {
    let meta = entry.metadata()?;
    if meta.file_type().is_symlink() {
        fs::metadata(entry.path())
    } else {
        Ok(meta)
    }
}
