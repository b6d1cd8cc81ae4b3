//! `keel run`, `keel exec`, `keel resume` and `keel demo`: agent sessions.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use keel_protocol::TurnEnd;

use crate::config::Context;
use keel_kernel::gates::exec_policy::ApprovalMode;

use crate::session::{Display, Reply, Session, SessionOptions, terminal_safe};
use crate::settings::approval_parser;

/// Options every session command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct SessionArgs {
    /// How approvals are answered: `ask` on a terminal (deny without one), `never` refuses
    /// what needs approval, `auto` approves it (forbidden commands stay forbidden).
    #[arg(long, value_parser = approval_parser())]
    pub approval: Option<ApprovalMode>,
    /// Load the plugin in DIR for this session only (its capabilities are shown first).
    #[arg(long = "plugin", value_name = "DIR")]
    pub plugins: Vec<PathBuf>,
    /// Start in plan mode: the model only reads (files, searches, read-only commands in a
    /// read-only sandbox) and ends with a plan, which you accept or keep refining. `/plan`
    /// or Shift-Tab switches it during a session.
    #[arg(long)]
    pub plan: bool,
    /// Serve this session on a local web page too (its URL is the first line on stdout): the
    /// plugin graph live, the timeline as it happens, and its approval questions, answered
    /// there or here. `/web` starts it during a session.
    #[arg(long)]
    pub web: bool,
    /// The page's port on 127.0.0.1 (with --web; any free one by default).
    #[arg(long, value_name = "N", requires = "web")]
    pub web_port: Option<u16>,
}

impl SessionArgs {
    /// Who answers approval questions in place of the terminal: the page, under `--web`
    /// when there is no terminal to ask on.
    pub(crate) fn asker(
        &self,
        ctx: &Context,
    ) -> Option<std::sync::Arc<dyn keel_kernel::gates::approvals::Approver>> {
        use std::io::IsTerminal as _;
        (self.web && !std::io::stdin().is_terminal()).then(|| {
            std::sync::Arc::new(crate::session::PageApprover {
                workspace: ctx.workspace.clone(),
            }) as _
        })
    }

    /// Under `--web`, serve the session's page and put its URL on stdout.
    pub(crate) async fn serve_page(&self, session: &Session) -> anyhow::Result<()> {
        if self.web {
            say_page(session, self.web_port.unwrap_or(0)).await?;
        }
        Ok(())
    }
}

/// Serve `session`'s page on `port` (or say where it is already): the URL on stdout, where a
/// script reads it, and flushed at once.
async fn say_page(session: &Session, port: u16) -> anyhow::Result<()> {
    let url = session
        .open_page(&crate::web::Options { port, open: true })
        .await?;
    stdoutln!("{url}");
    std::io::stdout().flush()?;
    stderrln!("the session's page: {url} (it lives as long as this session)");
    Ok(())
}

/// keel's exit statuses, the same for `run`, `exec`, `resume` and `demo` (README: "Exit
/// codes").
pub mod exit {
    /// The turn completed.
    pub const COMPLETED: u8 = 0;
    /// keel could not do what was asked: bad config, a plugin that does not load, a session
    /// that does not exist.
    pub const ERROR: u8 = 1;
    /// The command line was wrong (clap's own status for usage errors).
    pub const USAGE: u8 = 2;
    /// The turn ended without completing: interrupted stream, cancelled, step limit, loop guard.
    pub const NOT_COMPLETED: u8 = 3;
    /// The model could not be reached or refused the request (a rejected key included).
    pub const MODEL_FAILED: u8 = 4;
}

fn exit_for(end: TurnEnd) -> ExitCode {
    ExitCode::from(match end {
        TurnEnd::Completed => exit::COMPLETED,
        TurnEnd::ModelError => exit::MODEL_FAILED,
        TurnEnd::Interrupted | TurnEnd::Cancelled | TurnEnd::StepLimit | TurnEnd::LoopGuard => {
            exit::NOT_COMPLETED
        }
    })
}

/// Refuse at once, naming the variable to set, when the configured provider needs an API key
/// that is not held: otherwise the first turn retries the provider several times before
/// saying the same. A configured endpoint (`base_url`, a local server) may need no key.
fn require_model_key(ctx: &Context) -> anyhow::Result<()> {
    let choice = crate::settings::ModelChoice::from(ctx);
    let Some(name) = choice.secret_name() else {
        return Ok(());
    };
    if choice.base_url.is_some() || crate::settings::secrets(ctx).contains(name) {
        return Ok(());
    }
    anyhow::bail!(
        "no API key for the model provider `{}`: set {name} (`export {name}=…`, or add it under          [secrets] in {}); `keel demo` runs without one",
        choice.provider,
        ctx.home.join("config.toml").display()
    )
}

/// `keel run [PROMPT]`: one turn, or an interactive session.
pub async fn run(
    ctx: &Context,
    args: SessionArgs,
    prompt: Option<String>,
    resume: Option<String>,
) -> anyhow::Result<ExitCode> {
    // An interactive session has other things to do first (`/load`, `/sessions`).
    if prompt.is_some() {
        require_model_key(ctx)?;
    }
    crate::session::handle_stop_signals();
    let session = Session::start_asking(
        ctx,
        SessionOptions {
            approval: args.approval,
            extra_plugins: args.plugins.clone(),
            display: Display::Human,
            resume,
            overrides: Vec::new(),
        },
        args.asker(ctx),
    )
    .await?;
    args.serve_page(&session).await?;
    session.kernel.set_plan_mode(args.plan);
    say_session(&session);
    say_ignored(ctx);
    let code = match prompt {
        Some(p) => one_turn(&session, &p)
            .await
            .map(|report| exit_for(report.end)),
        None => interactive(ctx, &session, &|| "› ".to_owned())
            .await
            .map(|()| ExitCode::SUCCESS),
    };
    session.close().await;
    say_resume(&session);
    leave_if_signalled();
    code
}

/// After SIGTERM or SIGHUP, once the session is closed (its turn ended and recorded): leave
/// now with 128 + the signal's number, without waiting for a terminal read still pending.
pub(crate) fn leave_if_signalled() {
    if let Some(status) = crate::session::signal_exit_status() {
        crate::std_streams::flush(crate::std_streams::Stream::Stdout);
        std::process::exit(i32::from(status));
    }
}

/// `keel run PROMPT`: the turn, and in plan mode the offer to carry out its plan (on a
/// terminal); the report of the last turn run.
async fn one_turn(session: &Session, prompt: &str) -> anyhow::Result<keel_protocol::TurnReport> {
    use std::io::IsTerminal as _;
    let report = session.turn(prompt).await?;
    if !std::io::stdin().is_terminal() {
        return Ok(report);
    }
    Ok(offer_plan(session, &report).await?.unwrap_or(report))
}

/// The session's header: its id, workspace, the confinement of its commands, and plan mode
/// when it is on.
pub(crate) fn say_session(session: &Session) {
    stderrln!(
        "session {} in {}\n{}",
        session.id(),
        session.workspace().display(),
        session.kernel.confinement().describe()
    );
    if session.kernel.plan_mode() {
        stderrln!("{PLAN_ON}");
    }
}

/// What the person is told when plan mode comes on (the header, `/plan`, Shift-Tab).
const PLAN_ON: &str = "plan mode: on — the model only reads (files, searches, read-only \
                       commands in a read-only sandbox without network) and ends with a plan \
                       for you to accept; /plan or Shift-Tab leaves it";
/// … and when it goes off.
const PLAN_OFF: &str = "plan mode: off — tools and commands as the session allows, through \
                        the usual approvals";

/// The mode's name in `--json` output.
fn mode_name(session: &Session) -> &'static str {
    if session.kernel.plan_mode() {
        "plan"
    } else {
        "default"
    }
}

/// The request that carries out an accepted plan, as the next turn's input.
pub(crate) fn carry_out(plan: &str) -> String {
    format!(
        "The plan below is accepted and plan mode is off. Carry out this plan now, step by \
         step:\n\n{}",
        plan.trim()
    )
}

/// After a turn in plan mode that ended with a plan (its final text, already shown): ask the
/// person to accept it — plan mode goes off and the next turn carries it out — or to keep
/// planning (the mode stays on and they type more). The report of the turn that carried
/// the plan out, when it was accepted.
async fn offer_plan(
    session: &Session,
    report: &keel_protocol::TurnReport,
) -> anyhow::Result<Option<keel_protocol::TurnReport>> {
    if !session.kernel.plan_mode()
        || report.end != TurnEnd::Completed
        || report.text.trim().is_empty()
    {
        return Ok(None);
    }
    stderrln!(
        "[plan mode] the plan is above.\n  [y] accept: leave plan mode and carry it out\n  \
         [n] keep planning: stay in plan mode and say what to change"
    );
    let accepted = matches!(
        crate::session::answer("accept the plan? [y/N] "),
        Reply::Line(line) if matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes")
    );
    if !accepted {
        stderrln!("[still in plan mode: say what to change, or /plan to leave it]");
        return Ok(None);
    }
    session.kernel.set_plan_mode(false);
    stderrln!("[plan accepted; {PLAN_OFF}]");
    session.turn(&carry_out(&report.text)).await.map(Some)
}

/// Switch plan mode and say so.
fn switch_plan_mode(session: &Session) {
    let on = !session.kernel.plan_mode();
    session.kernel.set_plan_mode(on);
    stderrln!("{}", if on { PLAN_ON } else { PLAN_OFF });
}

/// The project files keel is not using until the person approves them, once, on stderr.
pub(crate) fn say_ignored(ctx: &Context) {
    for notice in crate::project_mcp::ignored_notices(ctx) {
        stderrln!(
            "[keel] {}",
            keel_kernel::gates::sanitize::sanitize_for_display(&notice)
        );
    }
}

/// On the way out: how to come back.
pub(crate) fn say_resume(session: &Session) {
    stderrln!(
        "session {id} is in its log; continue it with `keel resume {id}`",
        id = session.id()
    );
}

/// `keel exec PROMPT [--json]`: one turn, non-interactive.
pub async fn exec(
    ctx: &Context,
    args: SessionArgs,
    prompt: String,
    display: Display,
    raw: bool,
) -> anyhow::Result<ExitCode> {
    let json = !display.is_human();
    if args.web {
        anyhow::bail!(
            "`keel exec` ends with its turn, so it serves no page; `keel run --web` does, and              `keel web` shows the sessions afterwards"
        );
    }
    require_model_key(ctx)?;
    crate::session::handle_stop_signals();
    let mut session = Session::start(
        ctx,
        SessionOptions {
            approval: args.approval,
            extra_plugins: args.plugins,
            display,
            resume: None,
            overrides: Vec::new(),
        },
    )
    .await?;
    session.print_exact_answer(raw);
    // `keel exec --plan`: a read-only one-shot; its answer is the plan.
    session.kernel.set_plan_mode(args.plan);
    let sandbox = session.kernel.confinement().describe();
    if !json {
        stderrln!("{sandbox}");
        if args.plan {
            stderrln!("plan mode: on — the model only reads and answers with a plan");
        }
    }
    say_ignored(ctx);
    let report = match session.turn(&prompt).await {
        Ok(report) => report,
        Err(e) => {
            session.close().await;
            leave_if_signalled();
            return Err(e);
        }
    };
    if json {
        stdoutln!(
            "{}",
            serde_json::json!({
                "version": crate::session::JSON_VERSION,
                "topic": "turn.report",
                "session": session.id(),
                "sandbox": sandbox,
                "mode": mode_name(&session),
                "report": report,
            })
        );
    }
    session.close().await;
    leave_if_signalled();
    Ok(exit_for(report.end))
}

const HELP: &str = "commands: /plugins, /sessions, /expand, /approvals [revoke N|all], /mcp, \
                    /compact [FOCUS], /clear, /rewind [N|N.M|cK], /plan [REQUEST] (or \
                    Shift-Tab), /load NAME|DIR, /unload NAME, /reload NAME, /web, /help, /exit";

/// `/approvals`: the answers that still stand, numbered; `/approvals revoke N|all` withdraws
/// them, so keel asks again.
fn approvals(session: &Session, arg: &str) -> anyhow::Result<Option<String>> {
    use keel_kernel::StandingAnswer;
    let answers = session.kernel.standing_answers();
    // The keys, calls, plugins and hosts came through the model or a plugin.
    let words = |answer: &StandingAnswer| match answer {
        StandingAnswer::Session(key) => {
            format!("yes for this session: any `{} …`", terminal_safe(key))
        }
        StandingAnswer::Always(key) => format!(
            "yes always, in this workspace: any `{} …` (remembered across sessions)",
            terminal_safe(key)
        ),
        StandingAnswer::Denied(call) => format!(
            "no: `{}` (refused again without asking)",
            terminal_safe(call)
        ),
        StandingAnswer::Host { plugin, host } => format!(
            "network: `{}` may reach {} for this session",
            terminal_safe(plugin),
            terminal_safe(host)
        ),
    };
    let chosen: Vec<&StandingAnswer> = match arg.split_whitespace().collect::<Vec<_>>()[..] {
        [] => {
            if answers.is_empty() {
                return Ok(Some(
                    "no answers stand: whatever needs approval will be asked about".into(),
                ));
            }
            let mut lines =
                vec!["answers that stand (`/approvals revoke N` withdraws one):".to_owned()];
            for (i, answer) in answers.iter().enumerate() {
                lines.push(format!("  {}. {}", i + 1, words(answer)));
            }
            return Ok(Some(lines.join("\n")));
        }
        ["revoke", "all"] => answers.iter().collect(),
        ["revoke", n] => {
            let index = n
                .parse::<usize>()
                .ok()
                .and_then(|n| n.checked_sub(1))
                .filter(|i| *i < answers.len())
                .with_context(|| {
                    format!(
                        "no answer numbered `{n}`; `/approvals` lists {} answer(s)",
                        answers.len()
                    )
                })?;
            vec![&answers[index]]
        }
        _ => anyhow::bail!(
            "`/approvals` lists the answers that stand; `/approvals revoke N|all` withdraws them"
        ),
    };
    let mut done = Vec::new();
    for answer in chosen {
        session.kernel.withdraw(answer)?;
        done.push(format!("withdrawn: {}", words(answer)));
    }
    if done.is_empty() {
        done.push("no answers stand".into());
    }
    Ok(Some(done.join("\n")))
}

/// The interactive loop: requests and slash commands until `/exit`, end of input or a second
/// Ctrl-C; `label` is the prompt, asked for afresh each time.
pub(crate) async fn interactive(
    ctx: &Context,
    session: &Session,
    label: &(dyn Fn() -> String + Sync),
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    stderrln!("type a request, or {HELP}; a line ending in `\\` continues on the next");
    // Plugin names for Tab completion: the bundled ones, the installed ones and whatever is
    // loaded.
    let installed = crate::runtime::installed_names(&ctx.home);
    let names = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
        crate::session::use_line_editor(ctx.history_file(), names.clone());
    }
    // The line being waited for survives a Ctrl-C at the prompt, so no typed line is lost.
    let mut pending: Option<tokio::task::JoinHandle<Reply>> = None;
    let mut interrupts = 0;
    // What was typed before Shift-Tab switched plan mode, offered again at the next prompt.
    let mut typed = String::new();
    loop {
        let waiting = match &mut pending {
            Some(waiting) => waiting,
            None => {
                let mut known: Vec<String> = keel_bundled_plugins::all()
                    .iter()
                    .map(|b| b.name.to_owned())
                    .chain(installed.iter().cloned())
                    .chain(session.kernel.list().into_iter().map(|s| s.name))
                    .collect();
                known.sort();
                known.dedup();
                *names
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = known;
                // The mode is in the prompt, so it is never a surprise.
                let label = if session.kernel.plan_mode() {
                    format!("[plan] {}", label())
                } else {
                    label()
                };
                let initial = std::mem::take(&mut typed);
                pending.insert(tokio::task::spawn_blocking(move || {
                    crate::session::prompt_from(&label, &initial)
                }))
            }
        };
        let reply = tokio::select! {
            reply = waiting => reply.unwrap_or(Reply::End),
            // A plain terminal or pipe: Ctrl-C is a signal. (The line editor reads raw and
            // answers `Interrupted` instead.)
            _ = tokio::signal::ctrl_c() => Reply::Interrupted,
            // SIGTERM or SIGHUP: leave, as after `/exit`.
            () = crate::session::terminated() => Reply::End,
        };
        let line = match reply {
            Reply::Line(line) => line,
            Reply::PlanKey(line) => {
                pending = None;
                switch_plan_mode(session);
                typed = line;
                continue;
            }
            Reply::End => return Ok(()),
            Reply::Interrupted | Reply::Cancelled => {
                if pending.as_ref().is_none_or(|p| p.is_finished()) {
                    pending = None;
                }
                interrupts += 1;
                if interrupts > 1 {
                    stderrln!();
                    return Ok(());
                }
                stderrln!("\n(Ctrl-C again or /exit to leave)");
                if pending.is_some() {
                    stderr!("› ");
                    crate::std_streams::flush(crate::std_streams::Stream::Stderr);
                }
                continue;
            }
        };
        pending = None;
        interrupts = 0;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(command) = line.strip_prefix('/') {
            let (name, arg) = command.split_once(' ').unwrap_or((command, ""));
            let arg = arg.trim();
            let result = match name {
                "exit" | "quit" => return Ok(()),
                "help" => {
                    stderrln!("{HELP}");
                    Ok(None)
                }
                "plugins" => {
                    for s in session.kernel.list() {
                        let provides = if s.provides.is_empty() {
                            String::new()
                        } else {
                            format!("  provides {}", s.provides.join(", "))
                        };
                        stderrln!("  {:<16} {:<8} {:?}{provides}", s.name, s.version, s.state);
                    }
                    Ok(None)
                }
                "expand" => {
                    match session.last_result() {
                        Some((tool, content)) => stderrln!(
                            "⎿ {}, in full:\n{}",
                            terminal_safe(&tool),
                            terminal_safe(&content)
                        ),
                        None => stderrln!("no tool has run in this session yet"),
                    }
                    Ok(None)
                }
                "sessions" => {
                    session.kernel.settle_events().await;
                    crate::commands::sessions::listing(&session.kernel, &session.id())
                        .await
                        .map(|lines| {
                            for line in lines {
                                stderrln!("{line}");
                            }
                            None
                        })
                }
                "load" => session.load_mid_session(arg).await.map(Some),
                "web" => say_page(session, 0).await.map(|()| None),
                "approvals" => approvals(session, arg),
                "mcp" => match session.kernel.call_service("mcp", "status", "").await {
                    Ok(status) => {
                        let status: serde_json::Value = serde_json::from_str(&status)?;
                        for line in crate::commands::mcp::status_lines(&status) {
                            stderrln!("{line}");
                        }
                        Ok(None)
                    }
                    Err(e) => Err(anyhow::anyhow!(
                        "no MCP servers in this session ({e}); add one with `keel mcp add NAME \
                         -- COMMAND ARGS…` and start a new session"
                    )),
                },
                "compact" => session.compact(arg).await.map(Some),
                "plan" if arg.is_empty() => {
                    switch_plan_mode(session);
                    Ok(None)
                }
                // `/plan REQUEST`: plan mode on, and the request asked in it.
                "plan" => {
                    if !session.kernel.plan_mode() {
                        switch_plan_mode(session);
                    }
                    match session.turn(arg).await {
                        Ok(report) => offer_plan(session, &report).await.map(|_| None),
                        Err(e) => Err(e),
                    }
                }
                "rewind" => session.rewind(ctx, arg).await,
                "clear" => {
                    let old = session.clear();
                    Ok(Some(format!(
                        "cleared: a new conversation, session {}; the one before is kept \
                         (`keel resume {old}`)",
                        session.id()
                    )))
                }
                "unload" | "reload" if arg.is_empty() => Err(anyhow::anyhow!(
                    "say which plugin: `/{name} NAME`; `/plugins` lists them"
                )),
                "unload" => session
                    .kernel
                    .unload(arg)
                    .await
                    .map(|()| Some(format!("unloaded {arg}; what it changed is undone")))
                    .map_err(Into::into),
                "reload" => session
                    .reload(arg, true)
                    .await
                    .map(|()| Some(format!("reloaded {arg}"))),
                other => Err(anyhow::anyhow!("unknown command `/{other}`; {HELP}")),
            };
            match result {
                Ok(Some(done)) => stderrln!("{done}"),
                Ok(None) => {}
                // Failures can carry a plugin's own words.
                Err(e) => stderrln!("error: {}", terminal_safe(&format!("{e:#}"))),
            }
            continue;
        }
        if !session.has_agent() {
            stderrln!(
                "no agent loop is loaded, so nothing can answer: `/load agent-loop` brings the \
                 bundled one back (the conversation goes on from the session log)"
            );
            continue;
        }
        let done = match session.turn(line).await {
            Ok(report) => offer_plan(session, &report).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            stderrln!("error: {}", terminal_safe(&format!("{e:#}")));
        }
    }
}

/// The demo project: a tiny crate whose test fails.
const DEMO_CARGO: &str =
    "[package]\nname = \"calc\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n";
const DEMO_LIB: &str = "/// Adds two numbers.\npub fn add(a: i64, b: i64) -> i64 {\n    a - b\n}\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n\n    #[test]\n    fn adds() {\n        assert_eq!(add(2, 3), 5);\n    }\n}\n";
const DEMO_SCRIPT: &str = include_str!("../../demo/script.toml");

/// `keel demo`: the scripted model fixes a failing test in a temporary project.
pub async fn demo(ctx: &Context, keep: bool) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new()
        .prefix("keel-demo-")
        .tempdir()
        .context("cannot create the demo workspace")?;
    let ws = dir.path().canonicalize()?;
    std::fs::create_dir_all(ws.join("src"))?;
    std::fs::write(ws.join("Cargo.toml"), DEMO_CARGO)?;
    std::fs::write(ws.join("src/lib.rs"), DEMO_LIB)?;
    let demo_ctx = ctx.for_demo(&ws);
    stderrln!(
        "keel demo: a scripted model (no API key, no network) works in {}\n",
        ws.display()
    );
    let session = Session::start(
        &demo_ctx,
        SessionOptions {
            approval: Some(ApprovalMode::Auto),
            extra_plugins: Vec::new(),
            display: Display::Human,
            resume: None,
            overrides: vec![("model-scripted".into(), "script".into(), DEMO_SCRIPT.into())],
        },
    )
    .await?;
    stderrln!("{}", session.kernel.confinement().describe());
    let report = session
        .turn("The tests of this project fail. Find the bug and fix it.")
        .await?;
    session.close().await;
    stderrln!(
        "\nsession {} ended: {:?} after {} model calls and {} tool calls; `keel --home {} sessions show {}` replays it",
        session.id(),
        report.end,
        report.steps,
        report.tool_calls,
        demo_ctx.home.display(),
        session.id()
    );
    if keep {
        let kept = dir.keep();
        stderrln!("workspace kept at {}", kept.display());
    }
    Ok(exit_for(report.end))
}
