//! `keel mcp`: the MCP servers a session uses (`list`, `add`, `remove`), and keel as an MCP
//! server (`serve`).

mod serve;
mod servers;

use std::process::ExitCode;

use clap::Subcommand;
use keel_kernel::gates::exec_policy::ApprovalMode;

use crate::config::Context;
use crate::settings::approval_parser;

pub use servers::{project_lines, server_status, status_lines};

#[derive(Subcommand)]
pub enum McpCommand {
    /// Start each configured MCP server (in the OS sandbox) and show its state and tools.
    List {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Add a server to your config: `keel mcp add NAME [OPTIONS] -- COMMAND ARGS…` (stdio), or
    /// `keel mcp add NAME --url URL` (Streamable HTTP).
    Add {
        /// The server's name (lowercase letters, digits, `-`); its tools become
        /// `mcp__NAME__TOOL`.
        name: String,
        /// What it runs or where it is, and what it is granted.
        #[command(flatten)]
        added: servers::Added,
    },
    /// Remove a server from your config.
    Remove {
        /// The server's name.
        name: String,
    },
    /// Approve this workspace's `.mcp.json` (its current content) so sessions here start its
    /// servers; a changed file needs approving again. With `--editor`: the MCP servers an
    /// editor passed to `keel acp` in this workspace that are waiting for approval.
    Approve {
        /// Approve without asking (for scripts).
        #[arg(long)]
        yes: bool,
        /// Approve the servers an editor passed (`keel acp`), not the `.mcp.json`.
        #[arg(long)]
        editor: bool,
    },
    /// Serve this session's tools to an MCP client over stdio; every call passes keel's gates.
    Serve {
        /// How calls that need approval are answered: `never` (the default here: there is no
        /// terminal to ask on) refuses them, `auto` approves them (forbidden commands stay
        /// forbidden).
        #[arg(long, value_parser = approval_parser())]
        approval: Option<ApprovalMode>,
    },
}

pub async fn run(ctx: &Context, cmd: McpCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        McpCommand::Serve { approval } => serve::run(ctx, approval).await,
        McpCommand::List { json } => servers::list(ctx, json).await,
        McpCommand::Add { name, added } => servers::add(ctx, &name, added),
        McpCommand::Remove { name } => servers::remove(ctx, &name),
        McpCommand::Approve { yes, editor: false } => servers::approve(ctx, yes),
        McpCommand::Approve { yes, editor: true } => {
            crate::acp::editor_mcp::approve_command(ctx, yes)
        }
    }
}
