//! A project's `.mcp.json` (the format Claude Code and other clients read): MCP servers a
//! repository would like its agent to start. A cloned repository must never start processes
//! on its own, so keel uses the file only after the person approved it for this workspace —
//! that exact content, by its SHA-256, so a changed file needs approving again
//! (`keel mcp approve`). Its servers get nothing beyond the sandbox's defaults: no directory to
//! write, no host to reach, no secret, and every tool asks before it runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use crate::config::{EnvValue, McpServer, UserConfig};

/// The file's name in the workspace.
pub const FILE: &str = ".mcp.json";

/// Largest `.mcp.json` keel reads.
const MAX_BYTES: u64 = 256 * 1024;

#[derive(Deserialize)]
struct McpJson {
    #[serde(rename = "mcpServers", default)]
    servers: BTreeMap<String, JsonServer>,
}

#[derive(Deserialize)]
struct JsonServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    cwd: Option<String>,
}

/// A project's `.mcp.json`, read and hashed.
pub struct Project {
    /// Where it is.
    pub path: PathBuf,
    /// The SHA-256 of its content, which an approval names.
    pub sha256: String,
    /// Its servers under keel's names (lowercase, `-` for anything else), and what was skipped.
    pub servers: BTreeMap<String, McpServer>,
    /// Servers it lists that keel cannot take, and why.
    pub skipped: Vec<String>,
}

/// The server name `name` becomes: lowercase letters, digits and `-`.
pub(crate) fn keel_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    cleaned.trim_matches('-').to_owned()
}

/// The workspace's `.mcp.json`, if it has one.
pub fn read(workspace: &Path) -> anyhow::Result<Option<Project>> {
    let path = workspace.join(FILE);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("cannot read {}: {e}", path.display()),
    };
    if !meta.is_file() || meta.len() > MAX_BYTES {
        bail!(
            "{} is not a regular file of at most {} KiB; keel does not read it",
            path.display(),
            MAX_BYTES >> 10
        );
    }
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let parsed: McpJson = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not an MCP server list ({{\"mcpServers\": {{…}}}})",
            path.display()
        )
    })?;
    let mut servers = BTreeMap::new();
    let mut skipped = Vec::new();
    for (name, server) in parsed.servers {
        let keel = keel_name(&name);
        let why = if !keel_kernel::is_valid_plugin_name(&keel) {
            Some("its name cannot name a keel server".to_owned())
        } else if server.url.is_some() || server.command.is_none() {
            Some("only stdio servers (`command`) are supported".to_owned())
        } else if servers.contains_key(&keel) {
            Some(format!("another server there is also called `{keel}`"))
        } else {
            None
        };
        if let Some(why) = why {
            skipped.push(format!("`{name}`: {why}"));
            continue;
        }
        servers.insert(
            keel,
            McpServer {
                command: server.command,
                args: server.args,
                env: server
                    .env
                    .into_iter()
                    .map(|(k, v)| (k, EnvValue::Plain(v)))
                    .collect(),
                cwd: server.cwd,
                from_project: true,
                ..McpServer::default()
            },
        );
    }
    Ok(Some(Project {
        path,
        sha256: keel_registry::sha256_hex(&bytes),
        servers,
        skipped,
    }))
}

/// Approvals of `.mcp.json` files, in keel's home (never the workspace).
#[derive(Serialize, Deserialize, Default)]
struct Approvals {
    approved: Vec<Approved>,
}

#[derive(Serialize, Deserialize, PartialEq)]
struct Approved {
    workspace: PathBuf,
    sha256: String,
}

fn approvals_file(home: &Path) -> PathBuf {
    home.join("mcp-approvals.json")
}

fn approvals(home: &Path) -> Approvals {
    std::fs::read(approvals_file(home))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Whether the person approved this content of the workspace's `.mcp.json`.
pub fn is_approved(home: &Path, workspace: &Path, project: &Project) -> bool {
    approvals(home).approved.contains(&Approved {
        workspace: workspace.to_path_buf(),
        sha256: project.sha256.clone(),
    })
}

/// Record the person's approval of this content of the workspace's `.mcp.json` (replacing an
/// approval of an earlier content).
pub fn approve(home: &Path, workspace: &Path, project: &Project) -> anyhow::Result<()> {
    let path = approvals_file(home);
    let _lock = keel_registry::lock_for_update(&path)
        .with_context(|| format!("cannot lock {} for the change", path.display()))?;
    let mut all = approvals(home);
    all.approved.retain(|a| a.workspace != workspace);
    all.approved.push(Approved {
        workspace: workspace.to_path_buf(),
        sha256: project.sha256.clone(),
    });
    keel_registry::atomic_write(&path, &serde_json::to_vec_pretty(&all)?, true)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Add the servers of the workspace's `.mcp.json` to `config` if the person approved it; the
/// user's own servers keep their names.
pub fn add_approved(home: &Path, workspace: &Path, config: &mut UserConfig) -> anyhow::Result<()> {
    // A broken or unapproved file starts nothing; `keel mcp list` says why.
    let Ok(Some(project)) = read(workspace) else {
        return Ok(());
    };
    if !is_approved(home, workspace, &project) {
        return Ok(());
    }
    for (name, server) in project.servers {
        config.mcp.servers.entry(name).or_insert(server);
    }
    Ok(())
}

/// One line for each project file keel found in the workspace and is not using because the
/// person has not approved it (a `.mcp.json`, new or changed since its approval; the project's
/// skill folders), saying how to approve it: `keel run` and `keel exec` say these once, at the
/// start, instead of ignoring the files silently.
pub fn ignored_notices(ctx: &crate::config::Context) -> Vec<String> {
    let mut notices = Vec::new();
    match read(&ctx.workspace) {
        Ok(Some(project)) if !is_approved(&ctx.home, &ctx.workspace, &project) => {
            notices.push(format!(
                "ignored {FILE} ({} server(s)): this content is not approved for this workspace \
                 (a repository's file starts nothing until you approve it); read it, then run \
                 `keel mcp approve` to use it",
                project.servers.len()
            ));
        }
        Err(e) => notices.push(format!(
            "ignored {FILE}: {e:#}; `keel mcp list` shows what keel reads"
        )),
        Ok(_) => {}
    }
    let skills_offered = ctx
        .config
        .config
        .get("skills")
        .and_then(|table| table.get("project"))
        .and_then(toml::Value::as_bool)
        .unwrap_or(false);
    if !skills_offered {
        for dir in crate::commands::skills::PROJECT_DIRS {
            let has_entries = std::fs::read_dir(ctx.workspace.join(dir))
                .is_ok_and(|mut entries| entries.next().is_some());
            if has_entries {
                notices.push(format!(
                    "ignored the project's skills in {dir}: this workspace's skills are not \
                     approved; read them, then run `keel skills approve` to offer them"
                ));
            }
        }
    }
    notices.extend(crate::hooks::ignored_notice(&ctx.home, &ctx.workspace));
    notices
}
