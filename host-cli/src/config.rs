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
    /// The exec policy, `[exec]`: parsed and validated from the raw text by the kernel's
    /// policy parser, only accepted here.
    #[serde(default, rename = "exec")]
    _exec: Option<serde::de::IgnoredAny>,
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
    /// The text of the user's config file (empty when there is none).
    pub config_text: String,
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
        let (config, config_text) = load_config(&home.join("config.toml"))?;
        Ok(Context {
            home,
            workspace,
            config,
            config_text,
        })
    }

    /// Directory of the compiled-component cache.
    pub fn component_cache(&self) -> PathBuf {
        self.home.join("cache").join("components")
    }
}

fn load_config(path: &Path) -> anyhow::Result<(UserConfig, String)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((UserConfig::default(), String::new()));
        }
        Err(e) => bail!("{}: cannot read your keel config: {e}", path.display()),
    };
    let config = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
            .unwrap_or(0);
        anyhow::anyhow!(
            "{}:{line}: {}; fix or remove that setting",
            path.display(),
            e.message().trim()
        )
    })?;
    Ok((config, text))
}

impl Context {
    /// The project-local config, `<workspace>/.keel/config.toml`, if there is one. It may only
    /// tighten what the user's config allows.
    pub fn project_config(&self) -> anyhow::Result<Option<(PathBuf, String)>> {
        let path = self.workspace.join(".keel").join("config.toml");
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some((path, text))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => bail!("{}: cannot read the project config: {e}", path.display()),
        }
    }
}
