//! `keel policy check`: what the exec policy decides for a command, and why.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use keel_kernel::gates::exec_policy::{ApprovalMode, Decision, ExecPolicy};

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
        #[arg(long, value_parser = crate::session::approval_parser())]
        approval: Option<ApprovalMode>,
    },
}

/// The user's exec policy, tightened by the project's.
pub fn load_policy(ctx: &Context) -> anyhow::Result<ExecPolicy> {
    let mut policy = ExecPolicy::from_toml(&ctx.config_text)
        .with_context(|| format!("in {}", ctx.home.join("config.toml").display()))?;
    if let Some((path, text)) = ctx.project_config()? {
        let warnings = policy
            .tighten_with_project(&text)
            .with_context(|| format!("in {}", path.display()))?;
        for w in warnings {
            eprintln!("warning: {}: {w}", path.display());
        }
    }
    for w in policy.warnings() {
        eprintln!("warning: {w}");
    }
    Ok(policy)
}

pub fn run(ctx: &Context, cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    let PolicyCommand::Check {
        command,
        json,
        approval,
    } = cmd;
    let policy = load_policy(ctx)?;
    let verdict = match approval {
        None => policy.decide(&command),
        Some(mode) => policy.check(&command).under(mode),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        println!("decision: {}", verdict.decision);
        if let Some(seg) = verdict
            .deciding_segment
            .and_then(|i| verdict.segments.get(i))
        {
            println!("segment:  {}", seg.text);
        }
        if let Some(rule) = &verdict.rule {
            println!("rule:     {rule}");
        }
        println!("reason:   {}", verdict.reason);
        if let Some(s) = &verdict.suggestion {
            println!("instead:  {s}");
        }
    }
    Ok(match verdict.decision {
        Decision::Allow => ExitCode::SUCCESS,
        Decision::Prompt => ExitCode::from(3),
        Decision::Forbid => ExitCode::from(4),
    })
}
