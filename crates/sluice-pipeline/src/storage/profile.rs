//! AWS shared profile files, the step of the standard credential chain that `object_store`
//! leaves out: after the environment's keys, a profile's. The profile is `AWS_PROFILE`
//! (or `AWS_DEFAULT_PROFILE`, else `default`); its keys come from the credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`, section `[NAME]`), else the
//! config file (`AWS_CONFIG_FILE`, else `~/.aws/config`, section `[profile NAME]`, or
//! `[default]`), which also gives `region` and `endpoint_url`. What the environment sets
//! wins over the profile. A profile named in the environment that no file has, or one
//! without static keys (`credential_process`, SSO and role profiles are not read), is an
//! error naming it and the files; without a named profile, a missing `default`, or one
//! without keys, leaves the crate's chain (container and instance credentials) as it was.

use std::path::{Path, PathBuf};

use ini::Ini;

/// What a profile gives the S3 client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

/// A named profile that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read the AWS {what} file {path}: {message}")]
    Unreadable { what: &'static str, path: PathBuf, message: String },
    #[error("the AWS profile {name:?} (AWS_PROFILE) is in neither {credentials} nor {config}")]
    Missing { name: String, credentials: PathBuf, config: PathBuf },
    #[error(
        "the AWS profile {name:?} has no aws_access_key_id and aws_secret_access_key (credential_process, \
         SSO and role profiles are not read); export its keys, e.g. \
         eval \"$(aws configure export-credentials --profile {name} --format env)\""
    )]
    NoKeys { name: String },
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn home_file(var: &str, rel: &str) -> Option<PathBuf> {
    env(var).map(PathBuf::from).or_else(|| env("HOME").map(|h| Path::new(&h).join(rel)))
}

fn load(what: &'static str, path: &Path) -> Result<Option<Ini>, ProfileError> {
    match Ini::load_from_file(path) {
        Ok(ini) => Ok(Some(ini)),
        Err(ini::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ProfileError::Unreadable { what, path: path.to_path_buf(), message: e.to_string() }),
    }
}

/// The profile the environment selects, read from its files: `None` when it names no
/// profile and there is no `default`. Keys are left out when the environment has its own.
pub fn from_env() -> Result<Option<Profile>, ProfileError> {
    let files = Files {
        credentials: home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials").unwrap_or_default(),
        config: home_file("AWS_CONFIG_FILE", ".aws/config").unwrap_or_default(),
    };
    let named = env("AWS_PROFILE").or_else(|| env("AWS_DEFAULT_PROFILE"));
    read(&files, named, env("AWS_ACCESS_KEY_ID").is_some())
}

/// Where profiles are read from.
pub struct Files {
    pub credentials: PathBuf,
    pub config: PathBuf,
}

/// Profile `named` (else `default`) from `files`; `env_keys`: the environment has keys.
pub fn read(files: &Files, named: Option<String>, env_keys: bool) -> Result<Option<Profile>, ProfileError> {
    let name = named.clone().unwrap_or_else(|| "default".into());
    let credentials = load("credentials", &files.credentials)?;
    let config = load("config", &files.config)?;
    let config_section = if name == "default" { name.clone() } else { format!("profile {name}") };
    let from_credentials = credentials.as_ref().and_then(|i| i.section(Some(name.as_str())));
    let from_config = config.as_ref().and_then(|i| i.section(Some(config_section.as_str())));
    if from_credentials.is_none() && from_config.is_none() {
        return match named {
            Some(name) => Err(ProfileError::Missing {
                name,
                credentials: files.credentials.clone(),
                config: files.config.clone(),
            }),
            None => Ok(None),
        };
    }
    let get = |key: &str| {
        from_credentials.and_then(|s| s.get(key)).or_else(|| from_config.and_then(|s| s.get(key))).map(str::to_string)
    };
    let mut profile = Profile {
        access_key_id: get("aws_access_key_id"),
        secret_access_key: get("aws_secret_access_key"),
        session_token: get("aws_session_token"),
        region: from_config.and_then(|s| s.get("region")).map(str::to_string),
        endpoint_url: from_config.and_then(|s| s.get("endpoint_url")).map(str::to_string),
    };
    let has_keys = profile.access_key_id.is_some() && profile.secret_access_key.is_some();
    if let (Some(name), false, false) = (named, has_keys, env_keys) {
        return Err(ProfileError::NoKeys { name });
    }
    if env_keys || !has_keys {
        profile.access_key_id = None;
        profile.secret_access_key = None;
        profile.session_token = None;
    }
    Ok(Some(profile))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, credentials: &str, config: &str) -> Files {
        let files = Files { credentials: dir.join("credentials"), config: dir.join("config") };
        std::fs::write(&files.credentials, credentials).unwrap();
        std::fs::write(&files.config, config).unwrap();
        files
    }

    #[test]
    fn a_named_profile_takes_keys_from_credentials_and_region_and_endpoint_from_config() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(
            dir.path(),
            "# keys\n[default]\naws_access_key_id = D\naws_secret_access_key = DS\n\n[t]\naws_access_key_id = K\naws_secret_access_key = S\naws_session_token = T\n",
            "[default]\nregion = us-east-2\n; the training store\n[profile t]\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:9000\n",
        );
        let t = read(&f, Some("t".into()), false).unwrap().unwrap();
        assert_eq!(
            t,
            Profile {
                access_key_id: Some("K".into()),
                secret_access_key: Some("S".into()),
                session_token: Some("T".into()),
                region: Some("eu-west-1".into()),
                endpoint_url: Some("http://127.0.0.1:9000".into()),
            }
        );
        let d = read(&f, None, false).unwrap().unwrap();
        assert_eq!((d.access_key_id.as_deref(), d.region.as_deref()), (Some("D"), Some("us-east-2")));
        // The environment's keys win: the profile gives only region and endpoint.
        let e = read(&f, Some("t".into()), true).unwrap().unwrap();
        assert_eq!((e.access_key_id, e.region.as_deref()), (None, Some("eu-west-1")));
    }

    #[test]
    fn a_named_profile_missing_or_without_keys_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path(), "", "[profile sso]\nsso_start_url = https://example.invalid\nregion = eu-west-1\n");
        let e = read(&f, Some("nope".into()), false).unwrap_err().to_string();
        assert!(e.contains("\"nope\"") && e.contains("credentials") && e.contains("config"), "{e}");
        let e = read(&f, Some("sso".into()), false).unwrap_err().to_string();
        assert!(e.contains("\"sso\" has no aws_access_key_id"), "{e}");
        // Unnamed, a missing default is no error: the crate's own chain goes on.
        assert_eq!(read(&f, None, false).unwrap(), None);
        let none = Files { credentials: dir.path().join("absent"), config: dir.path().join("absent2") };
        assert_eq!(read(&none, None, false).unwrap(), None);
    }

    #[test]
    fn a_malformed_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path(), "[unclosed\nkey = v\n", "");
        let e = read(&f, None, false).unwrap_err().to_string();
        assert!(e.contains("credentials file") && e.contains(&f.credentials.display().to_string()), "{e}");
    }
}
