//! `keel sessions list|show` and `keel verify stats`: reading the session logs and the
//! verdict ledger the plugins wrote. No model call. The logs are read through the `session-log`
//! service of the plugin this config's sessions use, so a replaced session-log plugin is the
//! one asked (as `keel resume` does).

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use keel_kernel::{Kernel, ServiceAnswer, ServiceCall};
use keel_protocol::{
    Block, LogHealth, LogRead, LoggedConversation, Role, SessionEvent, SessionSummary, services,
};

use crate::config::Context;
use crate::runtime::{self, PluginSource, Runtime};
use crate::session::terminal_safe;

/// The session in one line: id, size, how it began (and why its log was not read whole).
fn line(s: &SessionSummary) -> String {
    let mut line = format!(
        "{}  {:>5} entries  {}",
        s.id,
        s.entries,
        terminal_safe(s.preview.as_deref().unwrap_or(""))
    );
    if let Some(error) = &s.error {
        line.push_str(&format!("  [{}]", terminal_safe(error)));
    }
    line
}

/// The sessions the log service of `kernel` lists, a line each, `current` marked with `*`
/// (`/sessions` in a live session).
pub async fn listing(kernel: &keel_kernel::Kernel, current: &str) -> anyhow::Result<Vec<String>> {
    Ok(list(kernel)
        .await?
        .iter()
        .map(|s| {
            let mark = if s.id == current { "*" } else { " " };
            format!("{mark} {}", line(s))
        })
        .collect())
}

/// A kernel holding only the plugin that provides `session-log` in this config's sessions.
async fn session_log(ctx: &Context) -> anyhow::Result<Runtime> {
    let rt = Runtime::new(ctx)?;
    for source in runtime::session_plugins(ctx, &rt.loader)? {
        let mut package = match source {
            PluginSource::Bundled(bundled) => runtime::bundled_package(&rt.loader, bundled)?,
            PluginSource::Path(path) => rt
                .loader
                .from_path(&path)
                .with_context(|| format!("cannot load the plugin at `{}`", path.display()))?,
            PluginSource::Installed(package) => *package,
        };
        if package
            .manifest
            .provides
            .contains_key(services::SESSION_LOG)
        {
            runtime::apply_user_config(&ctx.config.config, &mut package)?;
            rt.kernel.load(package).await?;
            return Ok(rt);
        }
    }
    anyhow::bail!(
        "no plugin of this config's sessions provides `{}`; add `session-log` to [profile] \
         plugins",
        services::SESSION_LOG
    )
}

/// A kernel holding only this config's `session-log` plugin (`keel acp`'s `session/list`).
pub(crate) async fn session_log_kernel(ctx: &Context) -> anyhow::Result<keel_kernel::Kernel> {
    Ok(session_log(ctx).await?.kernel)
}

/// `call` to the session log, through its typed door (a provider of an earlier ABI is asked
/// through its JSON one by the kernel).
async fn ask(kernel: &Kernel, call: ServiceCall) -> anyhow::Result<ServiceAnswer> {
    Ok(kernel.call_service_typed(&call).await?)
}

/// An answer of the session log that is not its method's.
fn misrouted(method: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "the `{}` service answered `{method}` with another method's answer; please report this",
        services::SESSION_LOG
    )
}

/// Every session the session log of `kernel` lists, most recently active first.
pub(crate) async fn list(kernel: &Kernel) -> anyhow::Result<Vec<SessionSummary>> {
    match ask(kernel, ServiceCall::LogList).await? {
        ServiceAnswer::Sessions(sessions) => Ok(sessions),
        _ => Err(misrouted("list")),
    }
}

/// The entries of session `id`'s log.
pub(crate) async fn read(kernel: &Kernel, id: &str) -> anyhow::Result<LogRead> {
    match ask(kernel, ServiceCall::LogRead(id.to_owned())).await? {
        ServiceAnswer::LogRead(read) => Ok(read),
        _ => Err(misrouted("read")),
    }
}

/// The conversation session `id`'s log rebuilds; with `resume`, the repair of the log's end
/// (calls left without a result) is recorded in the log first.
pub(crate) async fn conversation(
    kernel: &Kernel,
    id: &str,
    resume: bool,
) -> anyhow::Result<LoggedConversation> {
    let call = if resume {
        ServiceCall::LogResume(id.to_owned())
    } else {
        ServiceCall::LogConversation(id.to_owned())
    };
    match ask(kernel, call).await? {
        ServiceAnswer::Conversation(c) => Ok(*c),
        _ => Err(misrouted(if resume { "resume" } else { "conversation" })),
    }
}

/// Appends `event` to its session's log.
pub(crate) async fn append(kernel: &Kernel, event: SessionEvent) -> anyhow::Result<()> {
    match ask(kernel, ServiceCall::LogAppend(Box::new(event))).await? {
        ServiceAnswer::Appended(_) => Ok(()),
        _ => Err(misrouted("append")),
    }
}

/// What the session log could not write since it was last asked.
pub(crate) async fn health(kernel: &Kernel) -> anyhow::Result<LogHealth> {
    match ask(kernel, ServiceCall::LogHealth).await? {
        ServiceAnswer::LogHealth(health) => Ok(health),
        _ => Err(misrouted("health")),
    }
}

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

pub async fn run(ctx: &Context, cmd: SessionsCommand) -> anyhow::Result<ExitCode> {
    let rt = session_log(ctx).await?;
    match cmd {
        SessionsCommand::List { json } => {
            let sessions = list(&rt.kernel).await?;
            if sessions.is_empty() && !json {
                stdoutln!("no sessions yet; `keel run` or `keel demo` starts one");
            }
            for s in sessions {
                if json {
                    stdoutln!(
                        "{}",
                        serde_json::json!({
                            "id": s.id, "first_time_ms": s.first_time_ms,
                            "last_time_ms": s.last_time_ms, "entries": s.entries,
                            "preview": s.preview, "error": s.error,
                        })
                    );
                } else {
                    stdoutln!("{}", line(&s));
                }
            }
        }
        SessionsCommand::Show { id, json } => {
            let read = read(&rt.kernel, &id).await.with_context(|| {
                format!("cannot read session `{id}`; `keel sessions list` shows the sessions")
            })?;
            for w in &read.warnings {
                stderrln!("warning: line {}: {}", w.line, terminal_safe(&w.message));
            }
            for line in &read.lines {
                if json {
                    stdoutln!("{}", serde_json::to_string(line)?);
                    continue;
                }
                show(&line.event, "");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One log entry for a person; a child agent's entries are indented under its label.
fn show(event: &SessionEvent, prefix: &str) {
    match event {
        SessionEvent::SessionStarted {
            workspace, model, ..
        } => stdoutln!(
            "── session started in {} with {}",
            terminal_safe(workspace),
            terminal_safe(model)
        ),
        SessionEvent::Message { message, .. } => {
            for block in &message.content {
                match (message.role, block) {
                    (Role::User, Block::Text { text }) => {
                        stdoutln!("{prefix}› {}", terminal_safe(text))
                    }
                    (Role::Assistant, Block::Text { text }) => {
                        stdoutln!("{prefix}{}", terminal_safe(text))
                    }
                    (_, Block::Thinking { text }) => {
                        stdoutln!("{prefix}  (thinking) {}", terminal_safe(text))
                    }
                    (
                        _,
                        Block::ToolCall {
                            name, arguments, ..
                        },
                    ) => stdoutln!(
                        "{prefix}⏺ {} {}",
                        terminal_safe(name),
                        terminal_safe(arguments)
                    ),
                    (
                        _,
                        Block::ToolResult {
                            content, is_error, ..
                        },
                    ) => {
                        let head = content.lines().next().unwrap_or_default();
                        stdoutln!(
                            "  ⎿ {}{}",
                            if *is_error { "error: " } else { "" },
                            terminal_safe(head)
                        );
                    }
                }
            }
        }
        SessionEvent::Verdict { verdict, .. } => {
            stdoutln!(
                "{prefix}✔ verifier: {:?} ({})",
                verdict.status,
                verdict.dimension
            )
        }
        SessionEvent::TurnEnded { end, detail, .. } => {
            stdoutln!("{prefix}── turn ended: {end:?} {}", terminal_safe(detail));
        }
        SessionEvent::Compacted {
            replaced,
            summary,
            reason,
            tokens_before,
            tokens_after,
            ..
        } => {
            stdoutln!(
                "── compacted ({reason}): the {replaced} messages above replaced by this, \
                 {tokens_before} → {tokens_after} tokens (estimated):"
            );
            for line in summary.lines() {
                stdoutln!("{prefix}   {}", terminal_safe(line));
            }
        }
        SessionEvent::Subagent {
            parent_call,
            child,
            label,
            event,
            ..
        } => {
            // The child's own start is said once, at its first entry (its context).
            if matches!(**event, SessionEvent::Context { .. }) {
                stdoutln!(
                    "{prefix}  ↳ subagent `{}` #{child} (call {})",
                    terminal_safe(label),
                    terminal_safe(parent_call)
                );
            }
            show(event, &format!("{prefix}    │ "));
        }
        SessionEvent::Rewound {
            keep,
            turn,
            checkpoint,
            ..
        } => {
            let files = checkpoint.as_deref().map_or(String::new(), |c| {
                format!("; files rewound too, {} undoes that", terminal_safe(c))
            });
            stdoutln!(
                "{prefix}── rewound: the conversation goes on from the start of turn {turn} \
                 ({keep} messages kept){files}"
            );
        }
        SessionEvent::Context { .. }
        | SessionEvent::ToolOutcome { .. }
        | SessionEvent::ToolStarted { .. } => {}
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
        stdoutln!(
            "{}",
            serde_json::json!({
                "verified_pass": stats.verified_pass, "verified_fail": stats.verified_fail,
                "verify_error": stats.verify_error, "unsubstantiated": stats.unsubstantiated,
                "claim_match_rate": rate, "skipped_lines": stats.skipped_lines,
            })
        );
    } else {
        stdoutln!("verified-pass    {}", stats.verified_pass);
        stdoutln!("verified-fail    {}", stats.verified_fail);
        stdoutln!("verify-error     {}", stats.verify_error);
        stdoutln!("unsubstantiated  {}", stats.unsubstantiated);
        match rate {
            Some(r) => stdoutln!(
                "claim-match rate {:.1}% (verified-pass / (verified-pass + verified-fail))",
                r * 100.0
            ),
            None => stdoutln!("claim-match rate n/a (no claim was replayed yet)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
