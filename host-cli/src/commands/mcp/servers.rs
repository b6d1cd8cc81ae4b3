//! `keel mcp list|add|remove`: the `[mcp.servers]` of the user's config, and what each server
//! offers when it is started the way a session starts it (the `mcp` plugin, the OS sandbox,
//! the entry's grants).

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::config::{Context, EnvValue, McpServer};
use crate::runtime;
use crate::session::terminal_safe;

/// Start the configured servers through the `mcp` plugin, as a session would, and return its
/// `status` (`{"servers": [...]}`); `None` when no server is configured.
pub async fn server_status(ctx: &Context) -> anyhow::Result<Option<Value>> {
    if ctx.config.mcp.servers.is_empty() {
        return Ok(None);
    }
    let runtime::Runtime { kernel, loader } = crate::session::KernelBuilder::new(ctx)
        .approval(Some(keel_kernel::gates::exec_policy::ApprovalMode::Never))
        .build()?;
    let bundled = keel_bundled_plugins::get("mcp").context("this keel has no `mcp` plugin")?;
    let mut package = runtime::bundled_package(&loader, bundled)?;
    runtime::apply_user_config(&ctx.config.config, &mut package)?;
    kernel.load(package).await?;
    let status = kernel.call_service("mcp", "status", "").await;
    let _ = kernel.shutdown().await;
    let status: Value = serde_json::from_str(&status?)?;
    Ok(Some(status))
}

/// The servers' state in lines for a person: one per server, then its tools.
pub fn status_lines(status: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    for server in status["servers"].as_array().into_iter().flatten() {
        let text = |v: &Value| terminal_safe(v.as_str().unwrap_or_default());
        let tools = server["tools"].as_array().map_or(&[][..], Vec::as_slice);
        let asking = tools.iter().filter(|t| t["needs_approval"] == true).count();
        lines.push(match server["state"].as_str() {
            Some("running") => format!(
                "{}: running (MCP {}), {} tool(s), {} ask(s) before running",
                text(&server["name"]),
                text(&server["protocol"]),
                tools.len(),
                asking
            ),
            _ => format!(
                "{}: failed: {}",
                text(&server["name"]),
                text(&server["error"])
            ),
        });
        for tool in tools {
            lines.push(format!(
                "  {} ({}){}",
                text(&tool["name"]),
                text(&tool["server_name"]),
                if tool["needs_approval"] == true {
                    ""
                } else {
                    ", allowed without asking"
                }
            ));
        }
        for refused in server["refused"].as_array().into_iter().flatten() {
            lines.push(format!("  not offered: {}", text(refused)));
        }
    }
    lines
}

pub async fn list(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    if !json {
        for line in project_lines(ctx) {
            stdoutln!("{line}");
        }
    }
    let Some(status) = server_status(ctx).await? else {
        if json {
            stdoutln!("{}", json!({"servers": []}));
        } else {
            stdoutln!(
                "no MCP servers are configured; add one with `keel mcp add NAME -- COMMAND ARGS…`"
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let failed = status["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["state"] != "running");
    if json {
        let mut status = status;
        for server in status["servers"].as_array_mut().into_iter().flatten() {
            if let Some(config) = server["name"]
                .as_str()
                .and_then(|n| ctx.config.mcp.servers.get(n))
            {
                server["config"] = serde_json::to_value(config)?;
                server["source"] = json!(if config.from_project {
                    crate::project_mcp::FILE
                } else {
                    "config.toml"
                });
            }
        }
        stdoutln!("{status}");
    } else {
        for line in status_lines(&status) {
            stdoutln!("{line}");
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The user's config file as an editable document (formatting and comments kept), read under
/// its lock: the lock is held until the returned guard is dropped, after [`save`], so
/// `keel mcp add` run several times at once keeps every server.
fn config_document(
    ctx: &Context,
) -> anyhow::Result<(
    std::path::PathBuf,
    toml_edit::DocumentMut,
    keel_registry::UpdateLock,
)> {
    let path = ctx.home.join("config.toml");
    let lock = keel_registry::lock_for_update(&path)
        .with_context(|| format!("cannot lock {} for the change", path.display()))?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => bail!("cannot read {}: {e}", path.display()),
    };
    let doc = text
        .parse::<toml_edit::DocumentMut>()
        .with_context(|| format!("{} is not valid TOML; fix it first", path.display()))?;
    Ok((path, doc, lock))
}

fn save(path: &std::path::Path, doc: &toml_edit::DocumentMut) -> anyhow::Result<()> {
    keel_registry::atomic_write(path, doc.to_string().as_bytes(), true)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// What `keel mcp add` was told besides the name.
#[derive(clap::Args)]
pub struct Added {
    /// A directory it may write (relative to the workspace, or `~/…`); repeatable.
    /// Nothing else is writable.
    #[arg(long = "dir")]
    pub dirs: Vec<String>,
    /// A directory it may read where the sandbox hides it (under `/tmp`); repeatable.
    #[arg(long = "read")]
    pub read: Vec<String>,
    /// A host it may reach through keel's network gate (`api.example.com`,
    /// `127.0.0.1:8080`); repeatable. None by default.
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// A tool of the server that runs without asking (its own name), or `*` for all;
    /// repeatable.
    #[arg(long)]
    pub allow: Vec<String>,
    /// An environment variable, `VAR=value`, or `VAR=secret:NAME` for a kernel-held
    /// secret; repeatable.
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// A Streamable HTTP server's URL, instead of a command.
    #[arg(long, conflicts_with_all = ["command", "dirs", "read", "hosts", "env"])]
    pub url: Option<String>,
    /// The kernel-held secret an HTTP server gets as its bearer token.
    #[arg(long, requires = "url")]
    pub bearer_secret: Option<String>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required_unless_present = "url")]
    pub command: Vec<String>,
}

pub fn add(ctx: &Context, name: &str, added: Added) -> anyhow::Result<ExitCode> {
    if !keel_kernel::is_valid_plugin_name(name) {
        bail!(
            "`{name}` cannot name a server: use lowercase letters, digits and `-` (it becomes \
             part of its tools' names)"
        );
    }
    if ctx.config.mcp.servers.contains_key(name) {
        bail!("a server `{name}` is configured already; `keel mcp remove {name}` first");
    }
    let mut server = McpServer {
        dirs: added.dirs,
        read: added.read,
        hosts: added.hosts,
        allow: added.allow,
        url: added.url,
        bearer_secret: added.bearer_secret,
        ..McpServer::default()
    };
    if server.url.is_none() {
        let Some((program, args)) = added.command.split_first() else {
            bail!("give the server's command after `--`: keel mcp add {name} -- COMMAND ARGS…");
        };
        server.command = Some(program.clone());
        server.args = args.to_vec();
    }
    for pair in &added.env {
        let Some((var, value)) = pair.split_once('=') else {
            bail!("`--env {pair}`: write VAR=value or VAR=secret:NAME");
        };
        let value = match value.strip_prefix("secret:") {
            Some(secret) => EnvValue::Secret {
                secret: secret.to_owned(),
            },
            None => EnvValue::Plain(value.to_owned()),
        };
        server.env.insert(var.to_owned(), value);
    }
    let (path, mut doc, _lock) = config_document(ctx)?;
    // Checked again on the file as it is under the lock: another `keel mcp add` may have
    // added this name since the config was read.
    if doc
        .get("mcp")
        .and_then(|m| m.get("servers"))
        .and_then(|s| s.get(name))
        .is_some()
    {
        bail!("a server `{name}` is configured already; `keel mcp remove {name}` first");
    }
    let entry = toml_edit::ser::to_document(&server)
        .context("cannot write the server's entry")?
        .as_table()
        .clone();
    let mcp = doc
        .entry("mcp")
        .or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()));
    let Some(mcp) = mcp.as_table_mut() else {
        bail!("{}: `mcp` is not a table; fix it first", path.display());
    };
    mcp.set_implicit(true);
    let servers = mcp
        .entry("servers")
        .or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()));
    let Some(servers) = servers.as_table_mut() else {
        bail!(
            "{}: `mcp.servers` is not a table; fix it first",
            path.display()
        );
    };
    servers.set_implicit(true);
    servers.insert(name, toml_edit::Item::Table(entry));
    save(&path, &doc)?;
    stdoutln!(
        "added MCP server `{name}` to {}; `keel mcp list` starts it and shows its tools",
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn remove(ctx: &Context, name: &str) -> anyhow::Result<ExitCode> {
    let (path, mut doc, _lock) = config_document(ctx)?;
    let removed = doc
        .get_mut("mcp")
        .and_then(|m| m.get_mut("servers"))
        .and_then(toml_edit::Item::as_table_like_mut)
        .and_then(|servers| servers.remove(name));
    if removed.is_none() {
        bail!(
            "no MCP server `{name}` in {}; `keel mcp list` shows the configured ones",
            path.display()
        );
    }
    save(&path, &doc)?;
    stdoutln!("removed MCP server `{name}` from {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// What the workspace's `.mcp.json` asks for, in lines for a person (empty without one).
pub fn project_lines(ctx: &Context) -> Vec<String> {
    match crate::project_mcp::read(&ctx.workspace) {
        Ok(None) => Vec::new(),
        Err(e) => vec![format!("{e:#}")],
        Ok(Some(project)) => {
            let approved = crate::project_mcp::is_approved(&ctx.home, &ctx.workspace, &project);
            let mut lines = vec![format!(
                "{}: {} server(s), {}",
                project.path.display(),
                project.servers.len(),
                if approved {
                    "approved for this workspace"
                } else {
                    "NOT approved: its servers do not start until you run `keel mcp approve`"
                }
            )];
            for (name, server) in &project.servers {
                lines.push(format!(
                    "  {}: {} {}",
                    terminal_safe(name),
                    terminal_safe(server.command.as_deref().unwrap_or_default()),
                    terminal_safe(&server.args.join(" "))
                ));
            }
            for skipped in &project.skipped {
                lines.push(format!("  skipped {}", terminal_safe(skipped)));
            }
            lines
        }
    }
}

pub fn approve(ctx: &Context, yes: bool) -> anyhow::Result<ExitCode> {
    let Some(project) = crate::project_mcp::read(&ctx.workspace)? else {
        bail!(
            "{} has no {}; nothing to approve",
            ctx.workspace.display(),
            crate::project_mcp::FILE
        );
    };
    for line in project_lines(ctx) {
        stdoutln!("{line}");
    }
    stdoutln!(
        "Each runs in the OS sandbox with nothing granted: no folder to write, no host to reach, \
         no secret, and every tool asks before it runs."
    );
    if !yes && !crate::commands::confirm("Start these servers in sessions in this workspace?")? {
        stdoutln!("not approved");
        return Ok(ExitCode::FAILURE);
    }
    crate::project_mcp::approve(&ctx.home, &ctx.workspace, &project)?;
    stdoutln!("approved; a change to the file needs approving again");
    Ok(ExitCode::SUCCESS)
}
