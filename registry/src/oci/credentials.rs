//! Who keel is to an OCI registry: the credentials a person gave for it (a kernel-held secret
//! named in `[registries]`), or those their container tools already use (`docker login`'s
//! `config.json`), or nobody.

use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::RegistryError;

/// Credentials for one registry: a user name and a password or access token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password or token (never printed).
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <hidden>)", self.username)
    }
}

/// The container tools' credentials file: `$DOCKER_CONFIG/config.json`, else
/// `~/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) if !dir.is_empty() => Some(Path::new(&dir).join("config.json")),
        _ => dirs::home_dir().map(|h| h.join(".docker").join("config.json")),
    }
}

/// The credentials `config` holds for `host` (`host[:port]`): an `auths` entry's `auth`
/// (base64 `user:password`) or its `username`/`password`. `Ok(None)` when it has none; keel
/// runs no credential helper, so a host whose credentials one keeps (`credHelpers`) is an
/// error saying how to give keel the credentials instead.
pub fn from_docker_config(config: &Path, host: &str) -> Result<Option<Credentials>, RegistryError> {
    let bytes = match std::fs::read(config) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RegistryError::io(config, e)),
    };
    let corrupt = |reason: String| RegistryError::Corrupt {
        what: config.display().to_string(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
    let entry = value.get("auths").and_then(|a| {
        a.get(host)
            .or_else(|| a.get(format!("https://{host}")))
            .or_else(|| a.get(format!("http://{host}")))
    });
    if let Some(entry) = entry {
        if let Some(auth) = entry
            .get("auth")
            .and_then(|a| a.as_str())
            .filter(|a| !a.is_empty())
        {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|e| corrupt(format!("auths.\"{host}\".auth is not base64: {e}")))?;
            let text = String::from_utf8(decoded)
                .map_err(|_| corrupt(format!("auths.\"{host}\".auth is not UTF-8")))?;
            let (username, password) = text
                .split_once(':')
                .ok_or_else(|| corrupt(format!("auths.\"{host}\".auth is not `user:password`")))?;
            return Ok(Some(Credentials {
                username: username.to_owned(),
                password: password.to_owned(),
            }));
        }
        if let (Some(u), Some(p)) = (
            entry.get("username").and_then(|u| u.as_str()),
            entry.get("password").and_then(|p| p.as_str()),
        ) {
            return Ok(Some(Credentials {
                username: u.to_owned(),
                password: p.to_owned(),
            }));
        }
    }
    // A helper named for this host holds its credentials; a store for every host
    // (`credsStore`) may hold none for it, so then keel goes on without.
    let helper = value
        .get("credHelpers")
        .and_then(|h| h.get(host))
        .and_then(|h| h.as_str());
    match helper {
        Some(helper) => Err(RegistryError::Refused(format!(
            "the credentials for {host} in {} are kept by the credential helper `{helper}`, which keel does not run; give them to keel instead: `[registries.NAME] url = \"oci://{host}/…\"`, `username = \"…\"`, `password-secret = \"SECRET\"` in config.toml, with the password in the environment variable SECRET or in [secrets]",
            config.display()
        ))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_entries_are_read_and_helpers_are_explained() -> Result<(), RegistryError> {
        let dir = tempfile::tempdir().map_err(RegistryError::internal)?;
        let path = dir.path().join("config.json");
        let write = |text: &str| std::fs::write(&path, text).map_err(RegistryError::internal);
        assert_eq!(from_docker_config(&path, "r.example:5000")?, None);
        write(r#"{"auths":{"r.example:5000":{"auth":"Ym9iOnMzOmNyZXQ="}}}"#)?;
        assert_eq!(
            from_docker_config(&path, "r.example:5000")?,
            Some(Credentials {
                username: "bob".into(),
                password: "s3:cret".into()
            })
        );
        assert_eq!(from_docker_config(&path, "other.example")?, None);
        write(r#"{"auths":{"https://r.example":{"username":"u","password":"p"}}}"#)?;
        assert_eq!(
            from_docker_config(&path, "r.example")?.map(|c| c.username),
            Some("u".into())
        );
        write(r#"{"credsStore":"desktop"}"#)?;
        assert_eq!(from_docker_config(&path, "r.example")?, None);
        write(r#"{"credHelpers":{"r.example":"ecr-login"}}"#)?;
        let err = from_docker_config(&path, "r.example").expect_err("helper");
        assert!(err.to_string().contains("password-secret"), "{err}");
        write("{not json")?;
        assert!(from_docker_config(&path, "r.example").is_err());
        Ok(())
    }
}
