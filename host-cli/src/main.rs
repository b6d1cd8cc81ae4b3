//! The `keel` command line.

// keel writes to its standard streams only through `std_streams`, whose writes never panic.
#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
mod std_streams;

mod acp;
mod commands;
mod config;
mod home_locks;
mod home_modes;
mod hooks;
mod project_approvals;
mod project_mcp;
mod runtime;
mod session;
mod settings;
mod sweep;
mod telemetry;
mod web;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::session::Display;

/// keel: an agent runtime in which everything is a plugin.
#[derive(Parser)]
#[command(name = "keel", version, about, propagate_version = true)]
struct Cli {
    /// keel's home directory (config, caches, state).
    #[arg(long, global = true, env = "KEEL_HOME", value_name = "DIR")]
    home: Option<PathBuf>,
    /// Workspace that relative directory capabilities resolve against.
    #[arg(long, global = true, value_name = "DIR", default_value = ".")]
    workspace: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect and check plugins.
    #[command(subcommand)]
    Plugin(commands::plugin::PluginCommand),
    /// Ask the exec policy about a command.
    #[command(subcommand)]
    Policy(commands::policy::PolicyCommand),
    /// Publish, install and browse registry plugins; keys and trust.
    #[command(flatten)]
    Registry(commands::registry::RegistryCommand),
    /// Call the tools of the loaded plugins.
    #[command(subcommand)]
    Tool(commands::tool::ToolCommand),
    /// keel and MCP: serve this session's tools to an MCP client over stdio.
    #[command(subcommand)]
    Mcp(commands::mcp::McpCommand),
    /// Memory across sessions: `consolidate` tidies the indexes (offline, by you), `approve`
    /// offers a workspace's own memory to its sessions.
    #[command(subcommand)]
    Memory(commands::memory::MemoryCommand),
    /// Experience review: file the recurring failures of your sessions (loop-guard trips,
    /// refused commands, failed verifications, …) and work through them.
    Review(commands::review::ReviewArgs),
    /// Skills: folders with a SKILL.md, offered to the model by name and read on demand.
    #[command(subcommand)]
    Skills(commands::skills::SkillsCommand),
    /// Hooks: commands run before and after tool calls; `list` shows what runs when, `approve`
    /// runs a workspace's own.
    #[command(subcommand)]
    Hooks(commands::hooks::HooksCommand),
    /// Run an agent session: one turn with PROMPT, or an interactive session without.
    Run {
        /// What to ask the agent.
        prompt: Option<String>,
        /// Develop the plugin crate in DIR in this session, as `keel dev DIR` does.
        #[arg(long, value_name = "DIR", conflicts_with = "prompt")]
        dev: Option<std::path::PathBuf>,
        #[command(flatten)]
        args: commands::run::SessionArgs,
    },
    /// Develop a plugin live: build the crate in DIR, start an interactive session with it
    /// loaded, and rebuild and swap it in (its kernel-held state kept) on every save.
    Dev {
        /// The plugin crate (with Cargo.toml and keel.toml).
        #[arg(default_value = ".")]
        dir: std::path::PathBuf,
        #[command(flatten)]
        args: commands::run::SessionArgs,
    },
    /// Run one turn non-interactively: the answer alone on stdout, the transcript on stderr;
    /// the exit status says how the turn ended (0 completed, 1 error, 2 usage, 3 not completed,
    /// 4 the model failed).
    Exec {
        /// What to ask the agent.
        prompt: String,
        /// One JSON event per line on stdout (each with `"version"`).
        #[arg(long)]
        json: bool,
        /// With --json: show the model's context (system prompt and tool schemas) in full
        /// instead of its size and the tool names.
        #[arg(long, requires = "json")]
        json_requests: bool,
        /// Print the answer's exact bytes when stdout is a pipe or a file, escape sequences
        /// included; by default they are removed, as on a terminal.
        #[arg(long, conflicts_with = "json")]
        raw: bool,
        #[command(flatten)]
        args: commands::run::SessionArgs,
    },
    /// Continue a session from its log.
    Resume {
        /// The session id (`keel sessions list`).
        id: String,
        /// Run one turn with PROMPT instead of going interactive.
        prompt: Option<String>,
        #[command(flatten)]
        args: commands::run::SessionArgs,
    },
    /// The workspace checkpoints a session recorded (`list`).
    #[command(subcommand)]
    Checkpoints(commands::checkpoints::CheckpointsCommand),
    /// Go back to the state before a turn or a tool call: the workspace's files, the
    /// conversation, or both (the default). A safety checkpoint taken first undoes it.
    Rewind(commands::checkpoints::RewindArgs),
    /// List and show sessions from their logs.
    #[command(subcommand)]
    Sessions(commands::sessions::SessionsCommand),
    /// The claim verifier's ledger.
    #[command(subcommand)]
    Verify(VerifyCommand),
    /// A scripted session in a temporary project: no API key, no network.
    Demo {
        /// Keep the temporary project afterwards.
        #[arg(long)]
        keep: bool,
    },
    /// Check the config, keys, the model endpoint and the sandbox.
    Doctor(commands::doctor::DoctorArgs),
    /// Serve an editor over the Agent Client Protocol on stdin/stdout (Zed, JetBrains,
    /// Neovim …): each of its sessions is a keel session with this config's gates.
    Acp(acp::AcpArgs),
    /// A local web page: the plugin graph live, the sessions and their timelines
    /// (`keel run --web` serves a live session, with its approval questions).
    Web(commands::web::WebArgs),
}

#[derive(Subcommand)]
enum VerifyCommand {
    /// Verdict counts and the claim-match rate.
    Stats {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Whether keel's log lines on stderr may carry colour: `CLICOLOR_FORCE` (not `0`) forces it,
/// `NO_COLOR` (any value) turns it off, and otherwise only a terminal gets it, so a pipe or a
/// file never holds escape codes.
pub(crate) fn colour_on_stderr() -> bool {
    use std::io::IsTerminal as _;
    if std::env::var_os("CLICOLOR_FORCE").is_some_and(|v| v != "0") {
        return true;
    }
    std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
}

/// The exit status of a command whose output is gone: its reader closed the pipe (`keel
/// sessions list | head -1`) or the disk is full; what a shell reports for a program ended by
/// SIGPIPE, as other command-line tools end.
const CLOSED_OUTPUT: u8 = 128 + 13;

/// EPIPE and EIO, on Linux and macOS alike.
const EPIPE: i32 = 32;
const EIO: i32 = 5;

/// Whether `message` is the standard library's panic for a `print!` to a closed pipe or to a
/// terminal that hung up.
fn is_lost_output_panic(message: &str) -> bool {
    let lost = [EPIPE, EIO].map(|code| std::io::Error::from_raw_os_error(code).to_string());
    (message.starts_with("failed printing to stdout")
        || message.starts_with("failed printing to stderr"))
        && lost.iter().any(|end| message.ends_with(end.as_str()))
}

/// keel's own writes go through `std_streams` and never panic, but a dependency's `print!` to a
/// closed pipe or a hung-up terminal still would. That panic is not reported (there is nowhere
/// to report it): the stream is handed to /dev/null and the session told, as `std_streams`
/// does, so the turn still ends recorded; every other panic is reported as before.
fn quiet_on_lost_output() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Some(message) = info.payload_as_str().filter(|m| is_lost_output_panic(m)) {
            let stream = if message.starts_with("failed printing to stdout") {
                std_streams::Stream::Stdout
            } else {
                std_streams::Stream::Stderr
            };
            let code = if message.ends_with(&std::io::Error::from_raw_os_error(EIO).to_string()) {
                EIO
            } else {
                EPIPE
            };
            std_streams::failed(stream, &std::io::Error::from_raw_os_error(code));
            return;
        }
        report(info)
    }));
}

/// Whether `error` came from writing to a closed pipe.
fn is_closed_output_error(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() -> ExitCode {
    quiet_on_lost_output();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` print and succeed; anything else is a usage error.
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(commands::run::exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // The command runs on a worker (below), with the main thread's stack size.
        .thread_stack_size(8 << 20)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            stderrln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // The command runs as a task on a worker thread rather than on the main thread: the HTTP
    // client's connection tasks, the kernel's I/O and the plugin calls waiting on them then
    // take turns on one worker instead of waking another thread at every hand-over, a few
    // tenths of a millisecond in each step of a turn.
    let command = rt.spawn(async move {
        let ctx = config::Context::new(cli.home, cli.workspace)?;
        match cli.command {
            Command::Plugin(cmd) => commands::plugin::run(&ctx, cmd).await,
            Command::Policy(cmd) => commands::policy::run(&ctx, cmd),
            Command::Run {
                prompt,
                dev: Some(dir),
                args,
            } => {
                debug_assert!(prompt.is_none());
                commands::dev::dev(&ctx, args, dir).await
            }
            Command::Run {
                prompt,
                dev: None,
                args,
            } => commands::run::run(&ctx, args, prompt, None).await,
            Command::Dev { dir, args } => commands::dev::dev(&ctx, args, dir).await,
            Command::Exec {
                prompt,
                json,
                json_requests,
                raw,
                args,
            } => {
                let display = if json {
                    Display::Json {
                        requests: json_requests,
                    }
                } else {
                    Display::Answer
                };
                commands::run::exec(&ctx, args, prompt, display, raw).await
            }
            Command::Resume { id, prompt, args } => {
                commands::run::run(&ctx, args, prompt, Some(id)).await
            }
            Command::Sessions(cmd) => commands::sessions::run(&ctx, cmd).await,
            Command::Checkpoints(cmd) => commands::checkpoints::run(&ctx, cmd),
            Command::Rewind(args) => commands::checkpoints::rewind_command(&ctx, args),
            Command::Verify(VerifyCommand::Stats { json }) => {
                commands::sessions::verify_stats(&ctx, json)
            }
            Command::Demo { keep } => commands::run::demo(&ctx, keep).await,
            Command::Doctor(args) => commands::doctor::run(&ctx, args).await,
            Command::Acp(args) => acp::serve(&ctx, args).await,
            Command::Web(args) => commands::web::run(&ctx, args).await,
            Command::Registry(cmd) => commands::registry::run(&ctx, cmd).await,
            Command::Tool(cmd) => commands::tool::run(&ctx, cmd).await,
            Command::Mcp(cmd) => commands::mcp::run(&ctx, cmd).await,
            Command::Memory(cmd) => commands::memory::run(&ctx, cmd).await,
            Command::Review(args) => commands::review::run(&ctx, args).await,
            Command::Skills(cmd) => commands::skills::run(&ctx, cmd),
            Command::Hooks(cmd) => commands::hooks::run(&ctx, cmd),
        }
    });
    let result = match rt.block_on(command) {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(anyhow::anyhow!("the command was stopped: {e}")),
    };
    // For root: the cgroup made ahead for a next command is not needed any more.
    keel_kernel::sandbox::release();
    match result {
        // Output lost on the way (a closed pipe, a terminal gone): its status, not success.
        Ok(code) => session::signal_exit_status().map_or(code, ExitCode::from),
        Err(e) if is_closed_output_error(&e) => ExitCode::from(CLOSED_OUTPUT),
        Err(e) => {
            stderrln!("error: {e:#}");
            ExitCode::from(commands::run::exit::ERROR)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_lost_output_panics_are_quiet() {
        let epipe = std::io::Error::from_raw_os_error(EPIPE);
        assert_eq!(epipe.kind(), std::io::ErrorKind::BrokenPipe);
        assert!(is_lost_output_panic(&format!(
            "failed printing to stdout: {epipe}"
        )));
        let eio = std::io::Error::from_raw_os_error(EIO);
        assert!(is_lost_output_panic(&format!(
            "failed printing to stderr: {eio}"
        )));
        let other = std::io::Error::from_raw_os_error(EPIPE - 4);
        assert!(!is_lost_output_panic(&format!(
            "failed printing to stdout: {other}"
        )));
        assert!(!is_lost_output_panic("index out of bounds"));
    }
}
