//! A text file listing one sample per line: `path` or `path <label>` (label an integer,
//! separated by spaces or a tab; the path may contain spaces when a label follows it).
//! Blank lines and lines starting with `#` are skipped. Relative paths are resolved
//! against `root` (default: the list's own folder) and kept relative in the manifest.
//!
//! Listed files that do not exist do not fail enumeration: they get size 0 and are
//! reported per sample at read time (as `Missing`), under the run's skip/fail policy.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::Path;

use sluice_core::{LocationRef, Manifest, ManifestBuilder};

use super::{open_source_file, SourceError};
use crate::storage::Roots;

/// Enumerates the samples of the list file at `list`.
pub fn enumerate(list: &Path, root: Option<&Path>) -> Result<Manifest, SourceError> {
    enumerate_within(list, root, None)
}

/// As [`enumerate`], the list opened beneath `roots` when given (the files it names are
/// only `stat`ed here; they are read, confined, when loaded).
pub fn enumerate_within(list: &Path, root: Option<&Path>, roots: Option<&Roots>) -> Result<Manifest, SourceError> {
    let mut text = String::new();
    open_source_file("file list", list, roots)?
        .read_to_string(&mut text)
        .map_err(|e| SourceError::io("file list", list, e))?;
    let root = match root {
        Some(r) => r.to_path_buf(),
        None => list.parent().map(Path::to_path_buf).unwrap_or_default(),
    };

    // Each line's path (an index into `paths`, where a path listed again is written once)
    // and label: a list of millions naming the same files often costs one `stat` a file.
    let mut paths: Vec<&str> = Vec::new();
    let mut first_line: Vec<usize> = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut listed: Vec<(usize, i64)> = Vec::new();
    // Editors on Windows may start the file with a byte-order mark.
    let body = text.strip_prefix('\u{feff}').unwrap_or(&text);
    for (index, raw) in body.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (path, label) = parse_line(line).map_err(|text| SourceError::BadLabel {
            path: list.to_path_buf(),
            line: index + 1,
            text,
        })?;
        let id = *seen.entry(path).or_insert_with(|| {
            paths.push(path);
            first_line.push(index + 1);
            paths.len() - 1
        });
        listed.push((id, label));
    }
    drop(seen);
    let mut missing = 0usize;
    let sizes = sizes(&root, &paths);
    for (id, size) in sizes.iter().enumerate() {
        if let Err(e) = size {
            if missing == 0 {
                tracing::warn!(
                    path = %root.join(paths[id]).display(),
                    list = %list.display(),
                    line = first_line[id],
                    error = %e,
                    "listed file cannot be found; it will fail at read time"
                );
            }
            missing += 1;
        }
    }
    if missing > 1 {
        tracing::warn!(missing, list = %list.display(), "listed files cannot be found");
    }
    if listed.is_empty() {
        return Err(SourceError::NoSamples {
            dataset: list.display().to_string(),
            hint: "the list has no sample lines (only blanks and # comments)",
        });
    }
    let mut manifest = ManifestBuilder::new(root, listed.len());
    for (id, label) in listed {
        manifest.push(LocationRef::File { path: Path::new(paths[id]) }, label, *sizes[id].as_ref().unwrap_or(&0));
    }
    Ok(manifest.finish(Vec::new()))
}

/// Each path's size, `stat`ed on every core: a list of millions spends most of its
/// indexing in the kernel's path lookups, which run in parallel.
fn sizes(root: &Path, paths: &[&str]) -> Vec<std::io::Result<u64>> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from).min(16);
    let chunk = paths.len().div_ceil(threads).max(4096);
    std::thread::scope(|scope| {
        let parts: Vec<_> = paths
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter().map(|path| fs::metadata(root.join(path)).map(|m| m.len())).collect::<Vec<_>>()
                })
            })
            .collect();
        parts.into_iter().flat_map(|p| p.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// Splits `path [label]`; a line with whitespace must end in an integer label. On error,
/// returns the text that should have been the label.
fn parse_line(line: &str) -> Result<(&str, i64), String> {
    match line.rfind(char::is_whitespace) {
        None => Ok((line, -1)),
        Some(at) => {
            let (path, label) = (line[..at].trim_end(), line[at..].trim());
            label.parse::<i64>().map(|l| (path, l)).map_err(|_| label.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_line;

    #[test]
    fn lines_split_into_path_and_label() {
        assert_eq!(parse_line("a/b.jpg"), Ok(("a/b.jpg", -1)));
        assert_eq!(parse_line("a/b.jpg\t3"), Ok(("a/b.jpg", 3)));
        assert_eq!(parse_line("my photo.jpg   12"), Ok(("my photo.jpg", 12)));
        assert_eq!(parse_line("x.png -1"), Ok(("x.png", -1)));
        assert_eq!(parse_line("x.png cat"), Err("cat".to_string()));
        assert_eq!(parse_line("x.png 1.5"), Err("1.5".to_string()));
    }
}
