//! `keel policy check`: what the exec policy decides for a command, and why.

use std::process::ExitCode;

use clap::Subcommand;
use keel_kernel::gates::exec_policy::{ApprovalMode, Decision};

use crate::config::Context;

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Print the decision for COMMAND (allow, prompt or forbid), the segment and rule that
    /// decided it, the reason, and what to do instead. Exit status: 0 allow, 3 prompt,
    /// 4 forbid.
    Check {
        /// The command line, as one argument.
        command: String,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// Judge under this approval policy instead of the configured one.
        #[arg(long, value_parser = crate::settings::approval_parser())]
        approval: Option<ApprovalMode>,
    },
}

pub fn run(ctx: &Context, cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    let PolicyCommand::Check {
        command,
        json,
        approval,
    } = cmd;
    let policy = crate::settings::load_policy(ctx)?;
    let verdict = match approval {
        None => policy.decide(&command),
        Some(mode) => policy.check(&command).under(mode),
    };
    if json {
        stdoutln!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        stdoutln!("decision: {}", verdict.decision);
        if let Some(seg) = verdict
            .deciding_segment
            .and_then(|i| verdict.segments.get(i))
        {
            stdoutln!("segment:  {}", seg.text);
        }
        if let Some(rule) = &verdict.rule {
            stdoutln!("rule:     {rule}");
        }
        stdoutln!("reason:   {}", verdict.reason);
        if let Some(s) = &verdict.suggestion {
            stdoutln!("instead:  {s}");
        }
    }
    Ok(match verdict.decision {
        Decision::Allow => ExitCode::SUCCESS,
        Decision::Prompt => ExitCode::from(3),
        Decision::Forbid => ExitCode::from(4),
    })
}
