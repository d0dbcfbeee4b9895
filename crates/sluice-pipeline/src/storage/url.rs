//! `s3://bucket/key` URLs as spec paths hold them: parsing, and which lie under which.

use std::path::Path;

/// `s3://bucket/key`, parsed from a spec path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    pub bucket: String,
    /// The key (or key prefix), without a leading or trailing `/`; may be empty.
    pub key: String,
}

impl ObjectUrl {
    /// The URL a spec path holds, if it is one (`s3://` or `s3a://`). Local paths give `None`.
    pub fn parse(path: &Path) -> Option<Self> {
        let s = path.to_str()?;
        let rest = s.strip_prefix("s3://").or_else(|| s.strip_prefix("s3a://"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let key = key.split('/').filter(|c| !c.is_empty() && *c != ".").collect::<Vec<_>>().join("/");
        Some(Self { bucket: bucket.to_string(), key })
    }

    /// Whether `path` names object storage rather than a local file.
    pub fn is_url(path: &Path) -> bool {
        Self::parse(path).is_some()
    }

    /// Whether this URL lies under `root` (same bucket, key equal to or below its prefix).
    pub fn is_under(&self, root: &ObjectUrl) -> bool {
        self.bucket == root.bucket
            && (root.key.is_empty()
                || self.key == root.key
                || self.key.strip_prefix(&root.key).is_some_and(|rest| rest.starts_with('/')))
    }
}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.key)
        }
    }
}
