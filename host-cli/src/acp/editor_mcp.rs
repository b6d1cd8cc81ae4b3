//! MCP servers an editor passes in `session/new`, `session/load` and `session/resume`.
//!
//! An editor's server list is no more trusted than a repository's `.mcp.json`: editors read
//! it from project settings a cloned repository can carry (`.zed/settings.json`, `.vscode/…`),
//! and a client can send anything. So the same consent rule holds: a server starts only after
//! the person approved it for this workspace with `keel mcp approve --editor`, and an approval
//! names that exact server — its name, command, arguments and environment (values included)
//! by their SHA-256 — so a changed server is a new request. An unapproved server is recorded
//! as pending in keel's home (its command, arguments and the *names* of its environment
//! variables, never their values) so the command can show the person what they approve.
//!
//! An approved server runs as a `.mcp.json` server does: through the `mcp` plugin in the OS
//! sandbox, granted nothing (no folder to write, no host to reach, no secret), every tool
//! asking before it runs. A client cannot widen that: nothing it sends becomes a grant, and a
//! name the person's own config uses is refused rather than laid over that server's grants.
//! Only stdio servers are taken (`mcpCapabilities` says `http: false, sse: false`): an HTTP
//! server would need its host opened in the network gate, which only the person's config does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema as acp;
use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::config::{EnvValue, McpServer, UserConfig};

/// The file, in keel's home (never the workspace), holding approvals and pending requests.
const FILE: &str = "mcp-editor-approvals.json";

/// At most this many pending requests are kept (the oldest go first).
const MAX_PENDING: usize = 64;

/// At most this many servers are taken from one request; the rest are refused.
const MAX_SERVERS: usize = 32;

/// The largest server keel takes: its command, arguments and environment together, in bytes.
const MAX_SERVER_BYTES: usize = 64 << 10;

/// A server the editor passed, in keel's terms.
#[derive(Debug, Clone)]
pub struct Offered {
    /// Its keel name (lowercase, `-` for anything else); its tools are `mcp__NAME__TOOL`.
    pub name: String,
    /// What it runs, granted nothing.
    pub server: McpServer,
    /// The SHA-256 an approval names.
    pub sha256: String,
    /// Its environment variables' names (their values are hashed, never stored).
    pub env_names: Vec<String>,
}

/// The servers of `servers` keel can take, and a line for each it cannot.
pub fn offered(servers: &[acp::McpServer]) -> (Vec<Offered>, Vec<String>) {
    let mut taken: Vec<Offered> = Vec::new();
    let mut refused = Vec::new();
    for (at, server) in servers.iter().enumerate() {
        if at == MAX_SERVERS {
            refused.push(format!(
                "{} more: keel takes at most {MAX_SERVERS} servers from an editor",
                servers.len() - MAX_SERVERS
            ));
            break;
        }
        let stdio = match server {
            acp::McpServer::Stdio(stdio) => stdio,
            acp::McpServer::Http(http) => {
                refused.push(format!(
                    "`{}`: keel takes only stdio MCP servers from an editor; add an HTTP server \
                     to keel's own config with `keel mcp add NAME --url URL`",
                    http.name
                ));
                continue;
            }
            acp::McpServer::Sse(sse) => {
                refused.push(format!(
                    "`{}`: keel does not speak MCP over SSE; use the server's stdio or \
                     Streamable HTTP form",
                    sse.name
                ));
                continue;
            }
            _ => {
                refused.push("a server of a transport keel does not know".to_owned());
                continue;
            }
        };
        let name = crate::project_mcp::keel_name(&stdio.name);
        if !keel_kernel::is_valid_plugin_name(&name) {
            refused.push(format!(
                "`{}`: its name cannot name a keel server",
                stdio.name
            ));
            continue;
        }
        if taken.iter().any(|t| t.name == name) {
            refused.push(format!(
                "`{}`: another server the editor passed is also called `{name}`",
                stdio.name
            ));
            continue;
        }
        let Some(command) = stdio.command.to_str().filter(|c| !c.is_empty()) else {
            refused.push(format!(
                "`{}`: its command is empty or not UTF-8",
                stdio.name
            ));
            continue;
        };
        let size = command.len()
            + stdio.args.iter().map(String::len).sum::<usize>()
            + stdio
                .env
                .iter()
                .map(|v| v.name.len() + v.value.len())
                .sum::<usize>();
        if size > MAX_SERVER_BYTES {
            refused.push(format!(
                "`{name}`: its command, arguments and environment exceed {} KiB",
                MAX_SERVER_BYTES >> 10
            ));
            continue;
        }
        let env: BTreeMap<String, String> = stdio
            .env
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect();
        let sha256 = fingerprint(&name, command, &stdio.args, &env);
        taken.push(Offered {
            name,
            env_names: env.keys().cloned().collect(),
            server: McpServer {
                command: Some(command.to_owned()),
                args: stdio.args.clone(),
                env: env
                    .into_iter()
                    .map(|(k, v)| (k, EnvValue::Plain(v)))
                    .collect(),
                // Granted nothing, as a repository's `.mcp.json` server.
                from_project: true,
                ..McpServer::default()
            },
            sha256,
        });
    }
    (taken, refused)
}

/// The SHA-256 of a server's name, command, arguments and environment, in a canonical JSON
/// form (the environment sorted by name).
fn fingerprint(
    name: &str,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> String {
    let canonical = serde_json::json!({
        "name": name,
        "command": command,
        "args": args,
        "env": env,
    });
    keel_registry::sha256_hex(canonical.to_string().as_bytes())
}

#[derive(Serialize, Deserialize, Default)]
struct Approvals {
    #[serde(default)]
    approved: Vec<Approved>,
    #[serde(default)]
    pending: Vec<Pending>,
}

#[derive(Serialize, Deserialize, PartialEq, Clone)]
struct Approved {
    workspace: PathBuf,
    sha256: String,
}

/// A server an editor asked for in a workspace, not approved yet.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Pending {
    pub workspace: PathBuf,
    pub sha256: String,
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env_names: Vec<String>,
}

fn file(home: &Path) -> PathBuf {
    home.join(FILE)
}

fn read(home: &Path) -> Approvals {
    std::fs::read(file(home))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Change the file under its lock, written atomically.
fn update(home: &Path, change: impl FnOnce(&mut Approvals)) -> anyhow::Result<()> {
    let path = file(home);
    let _lock = keel_registry::lock_for_update(&path)
        .with_context(|| format!("cannot lock {} for the change", path.display()))?;
    let mut all = read(home);
    change(&mut all);
    keel_registry::atomic_write(&path, &serde_json::to_vec_pretty(&all)?, true)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Whether the person approved this server for `workspace`.
pub fn is_approved(home: &Path, workspace: &Path, offered: &Offered) -> bool {
    read(home).approved.contains(&Approved {
        workspace: workspace.to_path_buf(),
        sha256: offered.sha256.clone(),
    })
}

/// Record `offered` as waiting for the person's approval in `workspace`.
fn note_pending(home: &Path, workspace: &Path, offered: &[&Offered]) -> anyhow::Result<()> {
    update(home, |all| {
        for o in offered {
            all.pending
                .retain(|p| !(p.workspace == workspace && p.sha256 == o.sha256));
            all.pending.push(Pending {
                workspace: workspace.to_path_buf(),
                sha256: o.sha256.clone(),
                name: o.name.clone(),
                command: o.server.command.clone().unwrap_or_default(),
                args: o.server.args.clone(),
                env_names: o.env_names.clone(),
            });
        }
        let excess = all.pending.len().saturating_sub(MAX_PENDING);
        all.pending.drain(..excess);
    })
}

/// The requests waiting in `workspace`.
pub fn pending(home: &Path, workspace: &Path) -> Vec<Pending> {
    read(home)
        .pending
        .into_iter()
        .filter(|p| p.workspace == workspace)
        .collect()
}

/// Approve the requests `approved` of `workspace`.
pub fn approve(home: &Path, workspace: &Path, approved: &[Pending]) -> anyhow::Result<()> {
    update(home, |all| {
        for p in approved {
            all.pending
                .retain(|q| !(q.workspace == workspace && q.sha256 == p.sha256));
            let entry = Approved {
                workspace: workspace.to_path_buf(),
                sha256: p.sha256.clone(),
            };
            if !all.approved.contains(&entry) {
                all.approved.push(entry);
            }
        }
    })
}

/// Add the approved servers of `servers` to `config`, granted nothing; the lines telling the
/// editor (and stderr) what was not started and how to approve it.
pub fn add_approved(
    home: &Path,
    workspace: &Path,
    servers: &[acp::McpServer],
    config: &mut UserConfig,
) -> Vec<String> {
    if servers.is_empty() {
        return Vec::new();
    }
    let (offered, mut notices) = offered(servers);
    let mut waiting = Vec::new();
    let mut added = false;
    for o in &offered {
        if config.mcp.servers.contains_key(&o.name) {
            notices.push(format!(
                "`{}`: keel's own config has a server of that name, which keeps its grants; \
                 the editor's is not started",
                o.name
            ));
        } else if is_approved(home, workspace, o) {
            config.mcp.servers.insert(o.name.clone(), o.server.clone());
            added = true;
        } else {
            waiting.push(o);
        }
    }
    if added {
        config.configure_mcp_plugin();
    }
    if !waiting.is_empty() {
        if let Err(e) = note_pending(home, workspace, &waiting) {
            notices.push(format!(
                "cannot record the servers waiting for approval: {e:#}"
            ));
        }
        notices.push(format!(
            "not started: {} — the MCP server(s) your editor passed are not approved for this \
             workspace (an editor's server list can come from a repository's settings). Read \
             them, then run `keel mcp approve --editor` in {} and open a new session; they run \
             in keel's sandbox granted nothing, each tool asking before it runs",
            waiting
                .iter()
                .map(|o| format!(
                    "`{}` ({} {})",
                    o.name,
                    o.server.command.as_deref().unwrap_or_default(),
                    o.server.args.join(" ")
                ))
                .collect::<Vec<_>>()
                .join(", "),
            workspace.display()
        ));
    }
    notices
}

/// `keel mcp approve --editor`: show the servers editors asked for in this workspace and
/// approve them.
pub fn approve_command(
    ctx: &crate::config::Context,
    yes: bool,
) -> anyhow::Result<std::process::ExitCode> {
    use crate::session::terminal_safe;
    let waiting = pending(&ctx.home, &ctx.workspace);
    if waiting.is_empty() {
        println!(
            "no MCP server an editor passed is waiting for approval in {}",
            ctx.workspace.display()
        );
        return Ok(std::process::ExitCode::SUCCESS);
    }
    println!(
        "MCP servers an editor passed in {}, not approved:",
        ctx.workspace.display()
    );
    for p in &waiting {
        println!(
            "  {}: {} {}{}",
            terminal_safe(&p.name),
            terminal_safe(&p.command),
            terminal_safe(&p.args.join(" ")),
            if p.env_names.is_empty() {
                String::new()
            } else {
                format!(" (environment: {})", terminal_safe(&p.env_names.join(", ")))
            }
        );
    }
    println!(
        "Each runs in the OS sandbox with nothing granted: no folder to write, no host to reach, \
         no secret, and every tool asks before it runs."
    );
    if !yes && !crate::commands::confirm("Start these servers when an editor passes them here?")? {
        println!("not approved");
        return Ok(std::process::ExitCode::FAILURE);
    }
    approve(&ctx.home, &ctx.workspace, &waiting)?;
    println!(
        "approved; a changed server (command, arguments or environment) needs approving again"
    );
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(name: &str, args: &[&str], env: &[(&str, &str)]) -> acp::McpServer {
        acp::McpServer::Stdio(
            acp::McpServerStdio::new(name, "python3")
                .args(args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
                .env(
                    env.iter()
                        .map(|(k, v)| acp::EnvVariable::new(*k, *v))
                        .collect::<Vec<_>>(),
                ),
        )
    }

    #[test]
    fn a_changed_server_is_a_new_request_and_grants_nothing() {
        let (a, _) = offered(&[stdio("Tools", &["s.py"], &[("K", "1")])]);
        let (b, _) = offered(&[stdio("Tools", &["s.py"], &[("K", "2")])]);
        let (c, _) = offered(&[stdio("Tools", &["s.py", "--x"], &[("K", "1")])]);
        assert_eq!(a[0].name, "tools");
        assert_ne!(
            a[0].sha256, b[0].sha256,
            "an env value is part of the approval"
        );
        assert_ne!(
            a[0].sha256, c[0].sha256,
            "an argument is part of the approval"
        );
        let s = &a[0].server;
        assert!(s.from_project && s.dirs.is_empty() && s.hosts.is_empty());
        assert!(s.read.is_empty() && s.allow.is_empty() && s.url.is_none());
    }

    #[test]
    fn too_many_or_too_large_servers_are_refused() {
        let many: Vec<_> = (0..40).map(|i| stdio(&format!("s{i}"), &[], &[])).collect();
        let (taken, refused) = offered(&many);
        assert_eq!(taken.len(), MAX_SERVERS);
        assert_eq!(refused.len(), 1, "{refused:?}");
        let big = "x".repeat(MAX_SERVER_BYTES);
        let (taken, refused) = offered(&[stdio("big", &[&big], &[])]);
        assert!(taken.is_empty() && refused.len() == 1, "{refused:?}");
    }

    #[test]
    fn http_and_duplicate_servers_are_refused() {
        let http = acp::McpServer::Http(acp::McpServerHttp::new("web", "http://127.0.0.1:1/"));
        let (taken, refused) = offered(&[http, stdio("a", &[], &[]), stdio("A", &[], &[])]);
        assert_eq!(taken.len(), 1);
        assert_eq!(refused.len(), 2, "{refused:?}");
    }
}
