//! `keel tool call`: invoke a tool of the loaded plugins (bundled, configured and installed).

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Subcommand;

use crate::config::Context;
use crate::runtime::Runtime;
use crate::session::terminal_safe;

#[derive(Subcommand)]
pub enum ToolCommand {
    /// Call the tool NAME with the JSON input INPUT and print its result.
    Call {
        /// The tool's name.
        name: String,
        /// Its input, a JSON object as one argument, e.g. '{"text":"hi"}'.
        #[arg(default_value = "{}")]
        input: String,
    },
}

pub async fn run(ctx: &Context, cmd: ToolCommand) -> anyhow::Result<ExitCode> {
    let ToolCommand::Call { name, input } = cmd;
    if let Err(e) = serde_json::from_str::<serde_json::Value>(&input) {
        anyhow::bail!(
            "the input is not JSON ({e}); pass one JSON object, e.g. '{{\"text\":\"hi\"}}'"
        );
    }
    let rt = Runtime::with_plugins(ctx, &[]).await?;
    if !rt.kernel.tools().iter().any(|t| t.name == name) {
        let mut names: Vec<String> = rt.kernel.tools().into_iter().map(|t| t.name).collect();
        names.sort();
        anyhow::bail!(
            "no tool named `{name}` is registered; the loaded plugins offer: {}",
            names.join(", ")
        );
    }
    // The same gate pipeline as a model's call: schema, guards, policy, approval.
    let outcome = rt.kernel.call_tool(&name, &input).await;
    rt.kernel.shutdown().await?;
    let outcome: keel_protocol::ToolOutcome = serde_json::from_str(&outcome)
        .map_err(|e| anyhow::anyhow!("the kernel answered malformed data: {e}"))?;
    // The tool's words are outside text: cleaned for a terminal, as a session shows them.
    if outcome.is_error() {
        let what = match outcome.status {
            keel_protocol::OutcomeStatus::Refused => "was refused",
            keel_protocol::OutcomeStatus::NotExecuted => "did not run",
            _ => "failed",
        };
        stderrln!(
            "error: tool `{name}` {what}: {}",
            terminal_safe(&outcome.content)
        );
        Ok(ExitCode::from(1))
    } else {
        if std::io::stdout().is_terminal() {
            stdoutln!("{}", terminal_safe(&outcome.content));
        } else {
            stdoutln!("{}", outcome.content);
        }
        Ok(ExitCode::SUCCESS)
    }
}
