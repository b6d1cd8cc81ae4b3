//! Loading a session's plugins: bundled, from a directory (its capabilities shown first when
//! the person named it), mid-session with the conversation handed to a new agent loop, and
//! reloading one from where it came from; each with the user's and the session's config laid
//! over its defaults.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Context as _, bail};
use keel_kernel::PluginPackage;
use keel_protocol::services;

use super::Session;
use crate::runtime::{self, Origin};

/// Show what a plugin loaded with `--plugin` asks for, and require a yes.
pub(crate) fn confirm_capabilities(package: &PluginPackage) -> anyhow::Result<()> {
    let m = &package.manifest;
    let mut lines = vec![format!("plugin `{}` {} asks for:", m.name, m.version)];
    lines.extend(
        keel_kernel::consent::capability_lines(m)
            .into_iter()
            .map(|line| format!("  {line}")),
    );
    stderrln!("{}", lines.join("\n"));
    if std::env::var("KEEL_YES").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "refusing to load `{}` without confirmation: no terminal to ask on; set KEEL_YES=1 \
             to accept the capabilities above",
            m.name
        );
    }
    let answer = super::input::answer("load it? [y/N] ");
    if matches!(answer, super::input::Reply::Line(line) if line.trim().eq_ignore_ascii_case("y")) {
        Ok(())
    } else {
        bail!("not loading `{}`", m.name)
    }
}

impl Session {
    /// Load the plugin directory `path`; with `confirm`, show its capabilities first.
    pub async fn load_path(&self, path: &Path, confirm: bool) -> anyhow::Result<()> {
        let package = self
            .loader
            .from_path(path)
            .with_context(|| format!("cannot load the plugin at `{}`", path.display()))?;
        if confirm {
            confirm_capabilities(&package)?;
        }
        self.load_package(package, Origin::Path(path.to_path_buf()))
            .await
    }

    /// `/load NAME|DIR` in a running session: a bundled plugin by name, an installed one by
    /// name (re-hashed against the lockfile; its capabilities were consented to at install),
    /// or a plugin directory (its capabilities shown for consent first); answers what was
    /// loaded. A plugin that
    /// takes over the agent service (one loaded after `/unload agent-loop`, say) starts with
    /// no conversation, so it is given this session's, read back from the log: the session
    /// goes on rather than starting over.
    pub async fn load_mid_session(&self, what: &str) -> anyhow::Result<String> {
        let names = || {
            keel_bundled_plugins::all()
                .iter()
                .map(|b| b.name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if what.is_empty() {
            bail!(
                "say what to load: `/load NAME` for a bundled plugin ({}) or an installed one, \
                 or `/load DIR` for a plugin directory",
                names()
            );
        }
        let by_name = !what.contains('/');
        let bundled = keel_bundled_plugins::get(what).filter(|_| by_name);
        let installed = match bundled {
            None if by_name => runtime::find_installed(&self.home, &self.loader, what)?,
            _ => None,
        };
        let (package, origin) = match (bundled, installed) {
            (Some(b), _) => (
                runtime::bundled_package(&self.loader, b)?,
                Origin::Bundled(b),
            ),
            (None, Some(package)) => {
                let name = package.manifest.name.clone();
                (package, Origin::Installed(name))
            }
            (None, None) => {
                let path = Path::new(what);
                let package = self.loader.from_path(path).with_context(|| {
                    format!(
                        "cannot load `{what}`: it is neither a bundled plugin ({}), nor an \
                         installed one (`keel plugin list` shows them), nor a plugin directory",
                        names()
                    )
                })?;
                confirm_capabilities(&package)?;
                (package, Origin::Path(path.to_path_buf()))
            }
        };
        let loaded = format!(
            "loaded {} {}",
            package.manifest.name, package.manifest.version
        );
        let agent = package.manifest.provides.contains_key(services::AGENT);
        self.load_package(package, origin).await?;
        if !agent {
            return Ok(loaded);
        }
        // What the last turn emitted may still be on its way to the log.
        self.kernel.settle_events().await;
        // Nothing logged yet (no turn so far, or no session log loaded): nothing to carry.
        let id = self.id();
        if !self.is_logged(&id).await {
            return Ok(loaded);
        }
        let n = self
            .seed_conversation(&id)
            .await
            .context("the agent plugin is loaded but starts without this session's conversation")?;
        Ok(format!(
            "{loaded}; it continues this session ({n} messages)"
        ))
    }

    /// The session's overrides (model choice, demo script), then the user's
    /// `[config.<name>]`, over the manifest's defaults.
    pub(crate) fn configure(&self, package: &mut PluginPackage) -> anyhow::Result<()> {
        let name = package.manifest.name.clone();
        runtime::overlay_config(
            package,
            self.overrides
                .iter()
                .filter(|(plugin, _, _)| *plugin == name)
                .map(|(_, key, value)| (key.clone(), value.clone())),
        );
        crate::home_locks::serve_memory_locked(
            package,
            &self.ctx_workspace,
            &self.home.join("data"),
        );
        runtime::apply_user_config(&self.user_config, package)
    }

    pub(crate) async fn load_package(
        &self,
        mut package: PluginPackage,
        origin: Origin,
    ) -> anyhow::Result<()> {
        self.configure(&mut package)?;
        let name = package.manifest.name.clone();
        let agreed = keel_kernel::consent::capability_lines(&package.manifest);
        let status = self.kernel.load(package).await?;
        if let keel_kernel::PluginState::Failed { reason } = &status.state {
            bail!("plugin `{name}` failed to activate: {reason}");
        }
        let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        origins.retain(|(n, _, _)| *n != name);
        origins.push((name, origin, agreed));
        Ok(())
    }

    /// `/reload NAME` (and `keel dev`'s swap): load the plugin again from where it came from.
    /// A new version whose manifest asks for anything the loaded one was not agreed to with
    /// (a file in a plugin directory can change under a live session) is shown and asked
    /// about when `ask`, and refused otherwise; the running version stays.
    pub async fn reload(&self, name: &str, ask: bool) -> anyhow::Result<()> {
        let loaded = self
            .origins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, o, agreed)| (o.clone(), agreed.clone()));
        let (origin, agreed) = match loaded {
            Some((origin, agreed)) => (Some(origin), agreed),
            None => (None, Vec::new()),
        };
        let mut package = match origin {
            Some(Origin::Bundled(b)) => runtime::bundled_package(&self.loader, b)?,
            Some(Origin::Path(p)) => self.loader.from_path(&p)?,
            Some(Origin::Installed(installed)) => runtime::find_installed(
                &self.home,
                &self.loader,
                &installed,
            )?
            .with_context(|| {
                format!(
                    "plugin `{installed}` is no longer installed; `keel plugin list` shows what is"
                )
            })?,
            None => bail!("plugin `{name}` was not loaded by this session; `/plugins` lists them"),
        };
        let asked = keel_kernel::consent::capability_lines(&package.manifest);
        if !asked.iter().all(|line| agreed.contains(line)) {
            if !ask {
                bail!(
                    "the new version of `{name}` asks for more than was agreed to when it was \
                     loaded ({}); the running version stays — load it again (`/reload {name}` \
                     or a new session) to be asked",
                    asked.join("; ")
                );
            }
            confirm_capabilities(&package)?;
        }
        self.configure(&mut package)?;
        self.kernel.reload(package).await?;
        if let Some(entry) = self
            .origins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter_mut()
            .find(|(n, _, _)| n == name)
        {
            entry.2 = asked;
        }
        Ok(())
    }

    /// Whether a plugin provides the agent service, so a turn can run.
    pub fn has_agent(&self) -> bool {
        self.kernel.env().services().contains_key(services::AGENT)
    }

    /// The plugin that provides the agent service, which runs the turns (`agent-loop` when
    /// none does: the name the person would add).
    pub(crate) fn agent_plugin(&self) -> String {
        self.kernel
            .env()
            .services()
            .get(services::AGENT)
            .map_or_else(|| "agent-loop".to_owned(), |entry| entry.provider.clone())
    }

    /// Every plugin the session needs is active, or say what is missing and how to fix it.
    pub(crate) fn check_ready(&self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        for status in self.kernel.list() {
            match &status.state {
                keel_kernel::PluginState::Active => {}
                other => problems.push(format!("plugin `{}` is {other:?}", status.name)),
            }
        }
        if !self.has_agent() {
            bail!(
                "no plugin provides the `agent` service ({}); add `agent-loop` to [profile] plugins",
                if problems.is_empty() {
                    "nothing failed".to_owned()
                } else {
                    problems.join("; ")
                }
            );
        }
        for p in problems {
            stderrln!("warning: {p}");
        }
        Ok(())
    }
}
