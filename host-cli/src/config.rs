//! The user's configuration (`$KEEL_HOME/config.toml`) and the paths keel uses.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Deserialize;

/// The user's config file. Unknown keys are refused: a misspelt setting must not be ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// What the user trusts.
    #[serde(default)]
    pub trust: Trust,
    /// Plugins loaded in addition to the bundled ones.
    #[serde(default)]
    pub plugins: Plugins,
    /// Per-plugin settings, `[config.<plugin>]`, laid over the manifest's `[config]` defaults.
    #[serde(default)]
    pub config: std::collections::BTreeMap<String, toml::Table>,
}

/// `[trust]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trust {
    /// Native plugins allowed to load, by name. They run with the user's full rights.
    #[serde(default)]
    pub native: BTreeSet<String>,
}

/// `[plugins]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plugins {
    /// Plugin directories (or manifests) to load.
    #[serde(default)]
    pub paths: Vec<PathBuf>,
}

/// Where keel keeps things, and the user's settings.
pub struct Context {
    /// keel's home directory.
    pub home: PathBuf,
    /// The workspace directory, canonical.
    pub workspace: PathBuf,
    /// The user's settings.
    pub config: UserConfig,
}

impl Context {
    pub fn new(home: Option<PathBuf>, workspace: PathBuf) -> anyhow::Result<Context> {
        let home = match home {
            Some(h) => h,
            None => match dirs::home_dir() {
                Some(h) => h.join(".keel"),
                None => bail!("cannot find your home directory; pass --home DIR or set KEEL_HOME"),
            },
        };
        let workspace = workspace.canonicalize().with_context(|| {
            format!(
                "workspace `{}` does not exist; pass --workspace DIR",
                workspace.display()
            )
        })?;
        let config = load_config(&home.join("config.toml"))?;
        Ok(Context {
            home,
            workspace,
            config,
        })
    }

    /// Directory of the compiled-component cache.
    pub fn component_cache(&self) -> PathBuf {
        self.home.join("cache").join("components")
    }
}

fn load_config(path: &Path) -> anyhow::Result<UserConfig> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(UserConfig::default()),
        Err(e) => bail!("{}: cannot read your keel config: {e}", path.display()),
    };
    toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
            .unwrap_or(0);
        anyhow::anyhow!(
            "{}:{line}: {}; fix or remove that setting",
            path.display(),
            e.message().trim()
        )
    })
}
