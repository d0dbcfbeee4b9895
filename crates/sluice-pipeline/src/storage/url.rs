//! Object URLs as spec paths hold them (`s3://bucket/key`, `az://container/key`,
//! `gs://bucket/key`, `http(s)://host[:port]/path`): parsing, and which lie under which.

use std::path::Path;

/// The object store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Amazon S3 and S3-compatible stores: `s3://` (or `s3a://`).
    S3,
    /// Azure Blob Storage: `az://` (or `azure://`), a container of the account the
    /// environment names.
    Azure,
    /// Google Cloud Storage: `gs://`, through its XML API.
    Gcs,
    /// A plain web server: `http://host[:port]/path`; listing a prefix needs WebDAV.
    Http,
    /// The same over TLS: `https://`.
    Https,
}

impl Scheme {
    /// The prefix a URL of this store is written with.
    pub fn prefix(self) -> &'static str {
        match self {
            Scheme::S3 => "s3://",
            Scheme::Azure => "az://",
            Scheme::Gcs => "gs://",
            Scheme::Http => "http://",
            Scheme::Https => "https://",
        }
    }
}

/// An object URL (see the module docs), parsed from a spec path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    pub scheme: Scheme,
    /// The bucket (S3, GCS), container (Azure) or server, `host[:port]` (HTTP): what one
    /// client serves.
    pub bucket: String,
    /// The key (or key prefix), without a leading or trailing `/`; may be empty. For HTTP,
    /// the path, unescaped (the client escapes it).
    pub key: String,
}

impl ObjectUrl {
    /// The URL a spec path holds, if it is one (`s3://`, `s3a://`, `az://`, `azure://`,
    /// `gs://`, `http://`, `https://`). Local paths give `None`.
    pub fn parse(path: &Path) -> Option<Self> {
        let s = path.to_str()?;
        let schemes = [
            ("s3://", Scheme::S3),
            ("s3a://", Scheme::S3),
            ("az://", Scheme::Azure),
            ("azure://", Scheme::Azure),
            ("gs://", Scheme::Gcs),
            ("http://", Scheme::Http),
            ("https://", Scheme::Https),
        ];
        let (scheme, rest) = schemes.iter().find_map(|(p, scheme)| Some((*scheme, s.strip_prefix(p)?)))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let key = key.split('/').filter(|c| !c.is_empty() && *c != ".").collect::<Vec<_>>().join("/");
        Some(Self { scheme, bucket: bucket.to_string(), key })
    }

    /// Whether `path` names object storage rather than a local file.
    pub fn is_url(path: &Path) -> bool {
        Self::parse(path).is_some()
    }

    /// The object `key` of the same bucket.
    pub fn with_key(&self, key: impl Into<String>) -> Self {
        Self { scheme: self.scheme, bucket: self.bucket.clone(), key: key.into() }
    }

    /// Whether this URL lies under `root` (same store and bucket, key equal to or below its
    /// prefix).
    pub fn is_under(&self, root: &ObjectUrl) -> bool {
        self.scheme == root.scheme
            && self.bucket == root.bucket
            && (root.key.is_empty()
                || self.key == root.key
                || self.key.strip_prefix(&root.key).is_some_and(|rest| rest.starts_with('/')))
    }
}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = self.scheme.prefix();
        if self.key.is_empty() {
            write!(f, "{scheme}{}", self.bucket)
        } else {
            write!(f, "{scheme}{}/{}", self.bucket, self.key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_each_store_parse_and_lie_only_under_their_own_store() {
        let s3 = ObjectUrl::parse(Path::new("s3a://b//train/./x.jpg")).unwrap();
        assert_eq!((s3.scheme, s3.bucket.as_str(), s3.key.as_str()), (Scheme::S3, "b", "train/x.jpg"));
        assert_eq!(s3.to_string(), "s3://b/train/x.jpg");
        let az = ObjectUrl::parse(Path::new("azure://b/train/x.jpg")).unwrap();
        assert_eq!((az.scheme, az.to_string().as_str()), (Scheme::Azure, "az://b/train/x.jpg"));
        let az_root = ObjectUrl::parse(Path::new("az://b/train")).unwrap();
        assert!(az.is_under(&az_root));
        assert!(!s3.is_under(&az_root), "same bucket and key, another store");
        let gs = ObjectUrl::parse(Path::new("gs://b/train/x.jpg")).unwrap();
        assert_eq!((gs.scheme, gs.to_string().as_str()), (Scheme::Gcs, "gs://b/train/x.jpg"));
        assert!(!gs.is_under(&az_root), "same bucket and key, another store");
        let web = ObjectUrl::parse(Path::new("http://127.0.0.1:8080/data//train/x.jpg")).unwrap();
        assert_eq!(
            (web.scheme, web.bucket.as_str(), web.key.as_str()),
            (Scheme::Http, "127.0.0.1:8080", "data/train/x.jpg")
        );
        let web_root = ObjectUrl::parse(Path::new("http://127.0.0.1:8080/data")).unwrap();
        assert!(web.is_under(&web_root));
        let tls_root = ObjectUrl::parse(Path::new("https://127.0.0.1:8080/data")).unwrap();
        assert!(!web.is_under(&tls_root), "http is not under an https root");
        let other_port = ObjectUrl::parse(Path::new("http://127.0.0.1:8081/data")).unwrap();
        assert!(!web.is_under(&other_port), "another port is another server");
        assert!(ObjectUrl::parse(Path::new("ftp://b/x")).is_none());
        assert!(ObjectUrl::parse(Path::new("/data/s3://x")).is_none());
    }
}
