//! `keel sessions list|show` and `keel verify stats`: reading the session logs and the
//! verdict ledger the plugins wrote. No model call, no plugin needed.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use keel_agent_kit::session_log;
use keel_protocol::{Block, Role, SessionEvent};

use crate::config::Context;

/// `keel sessions …`
#[derive(Subcommand, Debug)]
pub enum SessionsCommand {
    /// List sessions, most recent first.
    List {
        /// One JSON object per session.
        #[arg(long)]
        json: bool,
    },
    /// Show a session's conversation from its log.
    Show {
        /// The session id (`keel sessions list` shows them).
        id: String,
        /// The log lines as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(ctx: &Context, cmd: SessionsCommand) -> anyhow::Result<ExitCode> {
    let dir = ctx.sessions_dir();
    match cmd {
        SessionsCommand::List { json } => {
            let sessions = if dir.exists() {
                session_log::list(&dir).with_context(|| format!("reading {}", dir.display()))?
            } else {
                Vec::new()
            };
            if sessions.is_empty() && !json {
                println!("no sessions yet; `keel run` or `keel demo` starts one");
            }
            for s in sessions {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "id": s.id, "first_time_ms": s.first_time_ms,
                            "last_time_ms": s.last_time_ms, "entries": s.entries,
                            "preview": s.preview,
                        })
                    );
                } else {
                    println!(
                        "{}  {:>5} entries  {}",
                        s.id,
                        s.entries,
                        s.preview.as_deref().unwrap_or("")
                    );
                }
            }
        }
        SessionsCommand::Show { id, json } => {
            let read = session_log::read_log(&dir, &id).with_context(|| {
                format!("cannot read session `{id}`; `keel sessions list` shows the sessions")
            })?;
            for w in &read.warnings {
                eprintln!("warning: line {}: {}", w.line, w.message);
            }
            for line in &read.lines {
                if json {
                    println!("{}", serde_json::to_string(line)?);
                    continue;
                }
                show(&line.event);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn show(event: &SessionEvent) {
    match event {
        SessionEvent::SessionStarted {
            workspace, model, ..
        } => println!("── session started in {workspace} with {model}"),
        SessionEvent::Message { message, .. } => {
            for block in &message.content {
                match (message.role, block) {
                    (Role::User, Block::Text { text }) => println!("› {text}"),
                    (Role::Assistant, Block::Text { text }) => println!("{text}"),
                    (_, Block::Thinking { text }) => println!("  (thinking) {text}"),
                    (
                        _,
                        Block::ToolCall {
                            name, arguments, ..
                        },
                    ) => println!("⏺ {name} {arguments}"),
                    (
                        _,
                        Block::ToolResult {
                            content, is_error, ..
                        },
                    ) => {
                        let head = content.lines().next().unwrap_or_default();
                        println!("  ⎿ {}{head}", if *is_error { "error: " } else { "" });
                    }
                }
            }
        }
        SessionEvent::Verdict { verdict, .. } => {
            println!("✔ verifier: {:?} ({})", verdict.status, verdict.dimension)
        }
        SessionEvent::TurnEnded { end, detail, .. } => {
            println!("── turn ended: {end:?} {detail}");
        }
        SessionEvent::Context { .. } | SessionEvent::ToolOutcome { .. } => {}
    }
}

/// `keel verify stats`
pub fn verify_stats(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    let path = ctx.verdict_ledger();
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    let stats = keel_agent_kit::claims::stats_from_ledger(&bytes);
    let rate = stats.claim_match_rate();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "verified_pass": stats.verified_pass, "verified_fail": stats.verified_fail,
                "verify_error": stats.verify_error, "unsubstantiated": stats.unsubstantiated,
                "claim_match_rate": rate, "skipped_lines": stats.skipped_lines,
            })
        );
    } else {
        println!("verified-pass    {}", stats.verified_pass);
        println!("verified-fail    {}", stats.verified_fail);
        println!("verify-error     {}", stats.verify_error);
        println!("unsubstantiated  {}", stats.unsubstantiated);
        match rate {
            Some(r) => println!(
                "claim-match rate {:.1}% (verified-pass / (verified-pass + verified-fail))",
                r * 100.0
            ),
            None => println!("claim-match rate n/a (no claim was replayed yet)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
