//! The `keel` command line.

mod commands;
mod config;
mod runtime;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::env::var_os("NO_COLOR").is_none())
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(async {
        let ctx = config::Context::new(cli.home, cli.workspace)?;
        match cli.command {
            Command::Plugin(cmd) => commands::plugin::run(&ctx, cmd).await,
            Command::Policy(cmd) => commands::policy::run(&ctx, cmd),
            Command::Registry(cmd) => commands::registry::run(&ctx, cmd).await,
            Command::Tool(cmd) => commands::tool::run(&ctx, cmd).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
