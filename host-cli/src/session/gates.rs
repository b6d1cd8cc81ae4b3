//! The gates of a session wired from its settings: the exec policy under `--approval`, the
//! approver (the terminal, or the policy when there is none), the stored grants, the network
//! gate with its audit log, and the sandbox.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_kernel::gates::approvals::{
    Answer, ApprovalRequest, Approver, GrantStore, PolicyApprover, Preview,
};
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::{GateConfig, NetConfig};

use super::input::{self, Reply};
use super::{preview, terminal_safe};
use crate::config::Context;
use crate::settings::{self, ModelChoice};

/// The sealed gates of a session of `ctx`, `approval` overriding the config's. `asker`, when
/// given, is who answers the questions of `ask` in place of the terminal (an editor over ACP);
/// under `auto` and `never` the policy answers as it always does.
pub(crate) fn gate_config(
    ctx: &Context,
    choice: &ModelChoice,
    approval: Option<ApprovalMode>,
    asker: Option<Arc<dyn Approver>>,
) -> anyhow::Result<GateConfig> {
    let mut policy = settings::load_policy(ctx)?;
    if let Some(mode) = approval {
        policy = policy.with_approval(mode);
    }
    let approver = match asker {
        Some(asker) if policy.approval() == ApprovalMode::Ask => asker,
        _ => approver_for(policy.approval(), &ctx.workspace),
    };
    let grants = match GrantStore::open_in_home(&ctx.grants_file(), &ctx.workspace, Some(&ctx.home))
    {
        Ok((store, warnings)) => {
            for w in warnings {
                stderrln!("warning: {w}");
            }
            Some(store)
        }
        Err(e) => {
            stderrln!("warning: approvals will not be remembered across sessions: {e}");
            None
        }
    };
    let sandbox = settings::sandbox_config(ctx)?;
    Ok(GateConfig {
        workspace: Some(ctx.workspace.clone()),
        exec_policy: policy,
        approver,
        grants,
        network: NetConfig {
            policy: settings::network_policy(ctx, choice)?,
            secrets: settings::secrets(ctx),
            audit_log: Some(ctx.audit_log()),
        },
        // Two seconds, or long enough for the hooks of one event to run in turn.
        guard_timeout: crate::hooks::guard_timeout(&ctx.config),
        processes: [
            ("mcp".to_owned(), settings::mcp_entries(ctx)?),
            (
                "hooks".to_owned(),
                crate::hooks::entries(
                    &ctx.workspace,
                    &ctx.config,
                    sandbox.mode != keel_kernel::sandbox::SandboxMode::Off,
                ),
            ),
        ]
        .into_iter()
        .filter(|(_, entries)| !entries.is_empty())
        .collect(),
        subagents: ctx.config.subagents.policy(),
        checkpoints: ctx.checkpoint_recorder(),
        sandbox,
    })
}

/// Asks on the terminal: once, for the session, always, or deny. Ctrl-C while it waits denies
/// at once (the turn is being cancelled).
struct TerminalApprover {
    /// Where a write's or edit's path is resolved, to show its diff.
    workspace: PathBuf,
}

/// The question for `request`, each answer saying in words what it lets run; a file change is
/// shown as a diff against `workspace`'s file. Every word from the request passed through a
/// plugin or the model, so it is made safe to print.
pub(crate) fn approval_question(
    request: &ApprovalRequest,
    workspace: &Path,
    colour: bool,
) -> String {
    let safe = |text: &str| terminal_safe(text);
    let change = request
        .preview
        .as_ref()
        .map(|p| preview::render(p, workspace, colour))
        .unwrap_or_default();
    // A file change is said as one, its path from the preview; anything else by its summary.
    let wants = match &request.preview {
        Some(Preview::Write { path, .. }) => format!("wants to write {}", safe(path)),
        Some(Preview::Edit { path, .. }) => format!("wants to edit {}", safe(path)),
        None => format!("wants to run: {}", safe(&request.summary)),
    };
    let mut question = format!(
        "\n? {}{} {wants}\n{change}  why: {}\n",
        whose(request),
        safe(&request.tool),
        safe(&request.reason)
    );
    for choice in offered(request) {
        question.push_str(&format!("  [{}] {}\n", choice.key, choice.label));
    }
    question.push_str(
        "  [n] no — or type what to do instead, and the model is told\n  (Ctrl-C: no, and cancel \
         the turn)\n",
    );
    question
}

/// A subagent's call says whose it is: the person approves a child's step, not the main
/// agent's.
fn whose(request: &ApprovalRequest) -> String {
    request
        .requester
        .as_ref()
        .map(|r| format!("{} → ", terminal_safe(r)))
        .unwrap_or_default()
}

/// The yes answers `request` offers, each saying what it lets run. A call without an approval
/// key (a file write, a rerun outside the sandbox) cannot be remembered, so only "this once".
fn offered(request: &ApprovalRequest) -> Vec<crate::web::inbox::Choice> {
    use crate::web::inbox::Choice;
    let mut choices = vec![Choice {
        key: "y",
        label: "yes, this once".into(),
    }];
    if let Some(key) = &request.key {
        let covers = format!("any `{} …` in this workspace", terminal_safe(key));
        choices.push(Choice {
            key: "s",
            label: format!("yes, and for the rest of this session: {covers}"),
        });
        if request.can_always {
            choices.push(Choice {
                key: "a",
                label: format!("yes, and always (remembered across sessions): {covers}"),
            });
        }
    }
    choices
}

/// What a typed answer means: a key offered by `request`, or (two words or more) "no, and
/// do this instead"; a key not offered is a no.
fn read_answer(line: &str, request: &ApprovalRequest) -> (Answer, Option<String>) {
    let said = line.trim();
    let can_session = request.key.is_some();
    let can_always = can_session && request.can_always;
    match said.to_ascii_lowercase().as_str() {
        "y" | "yes" => (Answer::Once, None),
        "s" | "session" if can_session => (Answer::Session, None),
        "a" | "always" if can_always => (Answer::Always, None),
        _ if said.contains(char::is_whitespace) => (Answer::Deny, Some(said.to_owned())),
        _ => (Answer::Deny, None),
    }
}

impl Approver for TerminalApprover {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        self.ask_why(request).0
    }

    fn ask_why(&self, request: &ApprovalRequest) -> (Answer, Option<String>) {
        let _asking = input::asking();
        let mut err = crate::std_streams::Guarded(crate::std_streams::Stream::Stderr);
        let colour = crate::colour_on_stderr();
        input::show_question(&approval_question(request, &self.workspace, colour));
        // With a live page open the question is put there too; the first answer wins.
        let inbox = crate::web::inbox::inbox();
        let ticket = inbox
            .served()
            .then(|| inbox.ask(web_question(request, &self.workspace)))
            .flatten();
        let elsewhere = || ticket.as_ref().and_then(|t| t.answers.try_recv().ok());
        let line = match input::answer_unless_cancelled_or("  answer: ", &elsewhere) {
            input::Answered::Elsewhere(line) => {
                let said = read_answer(&line, request);
                let words = answer_words(&said);
                let _ = writeln!(err, "\n[answered on the web page: {words}]");
                if let Some(t) = ticket {
                    t.settle("page", &words);
                }
                return said;
            }
            input::Answered::Here(reply) => reply,
        };
        let said = self.typed(line, request, &mut err);
        if let Some(t) = ticket {
            t.settle("terminal", &answer_words(&said));
        }
        said
    }
}

impl TerminalApprover {
    /// What the person's reply at the terminal means.
    fn typed(
        &self,
        reply: Reply,
        request: &ApprovalRequest,
        err: &mut crate::std_streams::Guarded,
    ) -> (Answer, Option<String>) {
        let line = match reply {
            // Shift-Tab switches plan mode only at a request; an answer is read as typed.
            Reply::Line(line) | Reply::PlanKey(line) => line,
            Reply::End => return (Answer::Deny, None),
            Reply::Cancelled => {
                let _ = writeln!(err, "\n[denied: the turn is being cancelled]");
                return (Answer::Deny, None);
            }
            Reply::Interrupted => {
                // Ctrl-C in the line editor, whose raw terminal sent no signal: cancel the
                // turn as the signal would have.
                input::cancel_turn();
                let _ = writeln!(err, "[denied: the turn is being cancelled]");
                return (Answer::Deny, None);
            }
        };
        read_answer(&line, request)
    }
}

/// Answers on the live page alone: `keel run --web` with no terminal to ask on. Ctrl-C (the
/// turn cancelled) denies at once, as at the terminal.
pub(crate) struct PageApprover {
    pub(crate) workspace: PathBuf,
}

impl Approver for PageApprover {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        self.ask_why(request).0
    }

    fn ask_why(&self, request: &ApprovalRequest) -> (Answer, Option<String>) {
        let inbox = crate::web::inbox::inbox();
        let Some(ticket) = inbox.ask(web_question(request, &self.workspace)) else {
            stderrln!("[denied: too many questions wait on the page]");
            return (Answer::Deny, None);
        };
        stderrln!(
            "{}\n  (waiting for an answer on the web page)",
            approval_question(request, &self.workspace, false)
        );
        match input::wait_unless_cancelled(&ticket.answers) {
            Some(line) => {
                let said = read_answer(&line, request);
                let words = answer_words(&said);
                stderrln!("[answered on the web page: {words}]");
                ticket.settle("page", &words);
                said
            }
            None => {
                stderrln!("[denied: the turn is being cancelled]");
                (Answer::Deny, None)
            }
        }
    }
}

/// An answer in the words the terminal offered it with.
fn answer_words((answer, instead): &(Answer, Option<String>)) -> String {
    match (answer, instead) {
        (Answer::Once, _) => "yes, this once".to_owned(),
        (Answer::Session, _) => "yes, for the rest of this session".to_owned(),
        (Answer::Always, _) => "yes, always".to_owned(),
        (_, Some(instead)) => format!("no — {}", terminal_safe(instead)),
        _ => "no".to_owned(),
    }
}

/// The question for the page: the terminal's wording (no colour) and its parts.
fn web_question(request: &ApprovalRequest, workspace: &Path) -> crate::web::inbox::Question {
    let safe = |text: &str| terminal_safe(text);
    let mut choices = offered(request);
    choices.push(crate::web::inbox::Choice {
        key: "n",
        label: "no".into(),
    });
    let (subject, diff) = match &request.preview {
        Some(p @ (Preview::Write { path, .. } | Preview::Edit { path, .. })) => {
            (safe(path), Some(preview::render(p, workspace, false)))
        }
        None => (safe(&request.summary), None),
    };
    crate::web::inbox::Question {
        id: 0,
        tool: format!("{}{}", whose(request), safe(&request.tool)),
        subject,
        diff,
        reason: safe(&request.reason),
        wording: approval_question(request, workspace, false)
            .trim()
            .to_owned(),
        choices,
    }
}

fn approver_for(mode: ApprovalMode, workspace: &Path) -> Arc<dyn Approver> {
    match mode {
        ApprovalMode::Ask if std::io::stdin().is_terminal() => Arc::new(TerminalApprover {
            workspace: workspace.to_owned(),
        }),
        other => Arc::new(PolicyApprover(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: Option<&str>, can_always: bool) -> ApprovalRequest {
        ApprovalRequest {
            tool: "exec_shell".into(),
            summary: "touch x1.txt".into(),
            key: key.map(str::to_owned),
            reason: "it writes files".into(),
            can_always,
            preview: None,
            requester: None,
        }
    }

    #[test]
    fn each_answer_says_what_it_lets_run() {
        let ws = Path::new("/nonexistent");
        let q = approval_question(&request(Some("touch"), true), ws, false);
        assert!(q.contains("wants to run: touch x1.txt"), "{q}");
        assert!(
            q.contains(
                "[s] yes, and for the rest of this session: any `touch …` in this workspace"
            ),
            "{q}"
        );
        assert!(
            q.contains("[a] yes, and always (remembered across sessions): any `touch …`"),
            "{q}"
        );
        let q = approval_question(&request(Some("touch"), false), ws, false);
        assert!(q.contains("[s]") && !q.contains("[a]"), "{q}");
        // Nothing to remember by: only this once.
        let q = approval_question(&request(None, true), ws, false);
        assert!(q.contains("[y] yes, this once"), "{q}");
        assert!(!q.contains("[s]") && !q.contains("[a]"), "{q}");
    }

    #[test]
    fn a_typed_answer_is_a_key_or_what_to_do_instead() {
        let full = request(Some("touch"), true);
        assert_eq!(read_answer("y\n", &full), (Answer::Once, None));
        assert_eq!(read_answer(" S ", &full), (Answer::Session, None));
        assert_eq!(read_answer("a", &full), (Answer::Always, None));
        assert_eq!(read_answer("n", &full), (Answer::Deny, None));
        assert_eq!(read_answer("", &full), (Answer::Deny, None));
        assert_eq!(
            read_answer("use mkdir -p out instead\n", &full),
            (Answer::Deny, Some("use mkdir -p out instead".into()))
        );
        // A key that was not offered is a no.
        assert_eq!(
            read_answer("a", &request(Some("touch"), false)),
            (Answer::Deny, None)
        );
        let keyless = request(None, true);
        assert_eq!(read_answer("s", &keyless), (Answer::Deny, None));
        assert_eq!(read_answer("a", &keyless), (Answer::Deny, None));
        assert_eq!(read_answer("y", &keyless), (Answer::Once, None));
    }
}
