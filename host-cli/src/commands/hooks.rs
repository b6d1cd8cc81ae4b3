//! `keel hooks`: what runs when (`list`: the person's hooks and the workspace's, approved or
//! not), and the person's approval of a workspace's own hooks (`approve`, listing each command;
//! `revoke`). See `crate::hooks` for where hooks come from and how they run.

use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;

use crate::config::Context;
use crate::hooks::{self, SessionHook, Source};
use crate::session::terminal_safe;

#[derive(Subcommand)]
pub enum HooksCommand {
    /// The hooks a session here runs, by event, and the workspace's that wait for approval.
    List {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run this workspace's own hooks (`.keel/config.toml` `[hooks]`, `.claude/settings.json`
    /// `hooks`) in its sessions, as they are now.
    Approve {
        /// Approve without asking (for scripts).
        #[arg(long)]
        yes: bool,
    },
    /// Stop running this workspace's own hooks.
    Revoke,
}

pub fn run(ctx: &Context, cmd: HooksCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        HooksCommand::List { json } => list(ctx, json),
        HooksCommand::Approve { yes } => approve(ctx, yes),
        HooksCommand::Revoke => {
            hooks::revoke(&ctx.home, &ctx.workspace)?;
            stdoutln!("{}'s own hooks no longer run", ctx.workspace.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// One hook in a line: event, matcher, timeout, network, command.
fn line(h: &SessionHook) -> String {
    // Only tool events have a tool to match.
    let matcher = if !h.event.ends_with("tool-use") {
        String::new()
    } else if h.matcher.is_empty() || h.matcher == "*" {
        "every tool, ".to_owned()
    } else {
        format!("matcher `{}`, ", terminal_safe(&h.matcher))
    };
    let network = if h.network { ", network" } else { "" };
    // The files it runs are approved by content: name each with the start of its digest.
    let files: String = h
        .files
        .iter()
        .map(|f| {
            format!(
                "\n      runs {} (sha256 {})",
                terminal_safe(&f.path),
                f.sha256.get(..16).unwrap_or(&f.sha256)
            )
        })
        .collect();
    format!(
        "{} ({matcher}{} s{network}): {}{files}",
        h.event,
        h.timeout_secs,
        terminal_safe(&h.command)
    )
}

fn list(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    let found = hooks::workspace_hooks(&ctx.workspace);
    let approved = hooks::is_approved(&ctx.home, &ctx.workspace, &found);
    if json {
        stdoutln!(
            "{}",
            serde_json::json!({
                "session_hooks": ctx.config.session_hooks,
                "events_run": hooks::EVENTS,
                "workspace": {
                    "hooks": found.hooks,
                    "approved": approved,
                    "problems": found.problems,
                },
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    let own: Vec<&SessionHook> = ctx
        .config
        .session_hooks
        .iter()
        .filter(|h| h.source == Source::Config)
        .collect();
    stdoutln!("your hooks ({}):", hooks::config_file(&ctx.home).display());
    for h in &own {
        stdoutln!("  {}", line(h));
    }
    if own.is_empty() {
        stdoutln!("  none; add `[[hooks.pre-tool-use]]` with `matcher` and `command`");
    }
    let state = if found.hooks.is_empty() {
        "none"
    } else if approved {
        "approved, they run"
    } else if hooks::approved_before(&ctx.home, &ctx.workspace) {
        "changed since you approved them: they wait for `keel hooks approve`"
    } else {
        "not approved: they wait for `keel hooks approve`"
    };
    stdoutln!("this workspace's hooks ({state}):");
    for h in &found.hooks {
        stdoutln!("  {} [{}]", line(h), hooks::source_words(h.source));
    }
    for p in &found.problems {
        stdoutln!("  left out: {}", terminal_safe(p));
    }
    Ok(ExitCode::SUCCESS)
}

fn approve(ctx: &Context, yes: bool) -> anyhow::Result<ExitCode> {
    let found = hooks::workspace_hooks(&ctx.workspace);
    let Some(shown) = found.digest.clone() else {
        bail!(
            "{} has no hooks in .keel/config.toml or {}; nothing to approve",
            ctx.workspace.display(),
            hooks::CLAUDE_SETTINGS
        );
    };
    stdoutln!(
        "This workspace's hooks, commands its authors wrote, each run in the OS sandbox with \
         the workspace writable and no network (the files they run are approved as they are \
         now: a changed one asks again):"
    );
    for h in &found.hooks {
        stdoutln!("  {} [{}]", line(h), hooks::source_words(h.source));
    }
    for p in &found.problems {
        stdoutln!("  left out: {}", terminal_safe(p));
    }
    if !yes && !crate::commands::confirm("Run these hooks in this workspace's sessions?")? {
        stdoutln!("not approved");
        return Ok(ExitCode::FAILURE);
    }
    // Only what was shown is approved: a change while the person was asked approves nothing.
    if hooks::workspace_hooks(&ctx.workspace).digest.as_deref() != Some(shown.as_str()) {
        bail!("the workspace's hooks changed while you were asked; nothing approved, run it again");
    }
    hooks::approve(&ctx.home, &ctx.workspace, &shown)?;
    stdoutln!(
        "approved: sessions here run these hooks as they are now; a changed or new hook asks \
         again (`keel hooks revoke` stops them)"
    );
    Ok(ExitCode::SUCCESS)
}
