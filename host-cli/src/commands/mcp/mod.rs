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
        /// A directory it may write (relative to the workspace, or `~/…`); repeatable.
        /// Nothing else is writable.
        #[arg(long = "dir")]
        dirs: Vec<String>,
        /// A directory it may read where the sandbox hides it (under `/tmp`); repeatable.
        #[arg(long = "read")]
        read: Vec<String>,
        /// A host it may reach through keel's network gate (`api.example.com`,
        /// `127.0.0.1:8080`); repeatable. None by default.
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// A tool of the server that runs without asking (its own name), or `*` for all;
        /// repeatable.
        #[arg(long)]
        allow: Vec<String>,
        /// An environment variable, `VAR=value`, or `VAR=secret:NAME` for a kernel-held
        /// secret; repeatable.
        #[arg(long = "env")]
        env: Vec<String>,
        /// A Streamable HTTP server's URL, instead of a command.
        #[arg(long, conflicts_with_all = ["command", "dirs", "read", "hosts", "env"])]
        url: Option<String>,
        /// The kernel-held secret an HTTP server gets as its bearer token.
        #[arg(long, requires = "url")]
        bearer_secret: Option<String>,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required_unless_present = "url")]
        command: Vec<String>,
    },
    /// Remove a server from your config.
    Remove {
        /// The server's name.
        name: String,
    },
    /// Approve this workspace's `.mcp.json` (its current content) so sessions here start its
    /// servers; a changed file needs approving again.
    Approve {
        /// Approve without asking (for scripts).
        #[arg(long)]
        yes: bool,
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
        McpCommand::Add {
            name,
            dirs,
            read,
            hosts,
            allow,
            env,
            url,
            bearer_secret,
            command,
        } => servers::add(
            ctx,
            &name,
            servers::Added {
                dirs,
                read,
                hosts,
                allow,
                env,
                url,
                bearer_secret,
                command,
            },
        ),
        McpCommand::Remove { name } => servers::remove(ctx, &name),
        McpCommand::Approve { yes } => servers::approve(ctx, yes),
    }
}
