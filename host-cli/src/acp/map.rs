//! keel's vocabulary in ACP's words and back: the turn's events as `session/update`s, a logged
//! conversation replayed as the updates that made it, an approval question as
//! `session/request_permission` and its answer as one of keel's, how a turn ended as a stop
//! reason. Pure functions over the `agent-client-protocol` schema types, so the crate's churn
//! meets keel here and in `mod.rs` only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema as acp;
use keel_kernel::gates::approvals::{Answer, ApprovalRequest, Preview};
use keel_kernel::gates::exec_policy::ApprovalMode;
use keel_kernel::sandbox::SandboxMode;
use keel_protocol::{
    Block, Message, OutcomeStatus, Role, SessionEvent, StopReason, StreamDelta, ToolOutcome,
    TurnEnd, TurnReport, topics,
};

/// The prefix under which the model sees the workspace (`keel_agent_kit::tools::paths`).
const WORKSPACE_PREFIX: &str = "/workspace";

/// One part of a prompt: the person's own words, or what the editor attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptPart {
    /// Text the person typed: their request, as it is.
    Said(String),
    /// A resource the editor attached (an `@file`'s text, a link's name): untrusted content,
    /// as a file read by `read_file` is, so it must be cleaned and fenced as data under
    /// `source` before it joins the person's words.
    Attached { source: String, text: String },
}

/// A prompt's content as the parts of keel's turn: text as it is, an embedded text resource
/// and a link to a resource as attached content, each under its URI. What keel cannot take
/// (images, audio, binary resources: the capabilities say so) is an error naming it.
pub fn prompt_parts(blocks: &[acp::ContentBlock]) -> Result<Vec<PromptPart>, String> {
    let mut parts = Vec::new();
    for block in blocks {
        match block {
            acp::ContentBlock::Text(text) => parts.push(PromptPart::Said(text.text.clone())),
            acp::ContentBlock::ResourceLink(link) => parts.push(PromptPart::Attached {
                source: format!("editor:{}", link.uri),
                text: format!("a resource the editor linked: {}", link.name),
            }),
            acp::ContentBlock::Resource(resource) => match &resource.resource {
                acp::EmbeddedResourceResource::TextResourceContents(text) => {
                    parts.push(PromptPart::Attached {
                        source: format!("editor:{}", text.uri),
                        text: text.text.clone(),
                    });
                }
                _ => return Err("keel takes text resources only, not binary ones".into()),
            },
            acp::ContentBlock::Image(_) => {
                return Err(
                    "keel does not take images in a prompt (see `promptCapabilities`)".into(),
                );
            }
            acp::ContentBlock::Audio(_) => {
                return Err(
                    "keel does not take audio in a prompt (see `promptCapabilities`)".into(),
                );
            }
            _ => return Err("a content block keel does not know".into()),
        }
    }
    if parts.is_empty() {
        return Err("the prompt is empty".into());
    }
    Ok(parts)
}

/// How a turn ended, as ACP's stop reason: the model's own stop (output limit, refusal) of its
/// last message when the turn ended there, the step limit as `max_turn_requests`. A model
/// that could not be reached is an error, not a stop reason (`None`).
pub fn stop_reason(report: &TurnReport, last_stop: Option<StopReason>) -> Option<acp::StopReason> {
    Some(match report.end {
        TurnEnd::Cancelled => acp::StopReason::Cancelled,
        TurnEnd::StepLimit | TurnEnd::LoopGuard => acp::StopReason::MaxTurnRequests,
        TurnEnd::ModelError => return None,
        TurnEnd::Completed | TurnEnd::Interrupted => match last_stop {
            Some(StopReason::MaxTokens) => acp::StopReason::MaxTokens,
            Some(StopReason::Refusal) => acp::StopReason::Refusal,
            _ => acp::StopReason::EndTurn,
        },
    })
}

/// A path the model wrote, as the file it names in `workspace` (the model sees the workspace
/// as `/workspace`); `None` for a path leading elsewhere, which the tools refuse anyway.
pub fn workspace_path(workspace: &Path, path: &str) -> Option<(PathBuf, String)> {
    let relative = match path.strip_prefix(WORKSPACE_PREFIX) {
        Some("") => ".",
        Some(rest) if rest.starts_with('/') => rest.trim_start_matches('/'),
        Some(_) => return None,
        None if path.starts_with('/') => return None,
        None => path,
    };
    if Path::new(relative)
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return None;
    }
    Some((workspace.join(relative), relative.to_owned()))
}

/// What a tool call is, for the editor: its kind, a title, the files it touches and, for a
/// write or edit, the change as a diff.
struct Described {
    kind: acp::ToolKind,
    title: String,
    locations: Vec<acp::ToolCallLocation>,
    content: Vec<acp::ToolCallContent>,
}

fn describe(workspace: &Path, name: &str, arguments: &serde_json::Value) -> Described {
    let arg = |key: &str| arguments[key].as_str().map(str::to_owned);
    let path = arg("path")
        .or_else(|| arg("file_path"))
        .or_else(|| arg("file"));
    let located = path.as_deref().and_then(|p| workspace_path(workspace, p));
    let locations = located
        .iter()
        .map(|(full, _)| acp::ToolCallLocation::new(full.clone()))
        .collect();
    let shown_path = path.clone().unwrap_or_default();
    let mut content = Vec::new();
    let (kind, title) = match name {
        "exec_shell" => {
            let command = arg("command").unwrap_or_default();
            content.push(text_content(format!("$ {command}")));
            (acp::ToolKind::Execute, format!("Run `{command}`"))
        }
        "read_file" => (acp::ToolKind::Read, format!("Read {shown_path}")),
        "list_dir" => (acp::ToolKind::Read, format!("List {shown_path}")),
        "grep" => (
            acp::ToolKind::Search,
            format!("grep {}", arg("pattern").unwrap_or_default()),
        ),
        "task" => (acp::ToolKind::Think, "Subagent task".to_owned()),
        _ => match Preview::of(arguments) {
            Some(_) => (acp::ToolKind::Edit, format!("{name} {shown_path}")),
            None => (acp::ToolKind::Other, name.to_owned()),
        },
    };
    let (kind, title) = match (Preview::of(arguments), &located) {
        (Some(Preview::Write { content: new, .. }), Some((full, relative))) => {
            let old = crate::session::preview::current_text(workspace, relative);
            content.push(acp::ToolCallContent::Diff(
                acp::Diff::new(full.clone(), new).old_text(old),
            ));
            (acp::ToolKind::Edit, format!("Write {shown_path}"))
        }
        (
            Some(Preview::Edit {
                old, new, all: _, ..
            }),
            Some((full, _)),
        ) => {
            content.push(acp::ToolCallContent::Diff(
                acp::Diff::new(full.clone(), new).old_text(old),
            ));
            (acp::ToolKind::Edit, format!("Edit {shown_path}"))
        }
        _ => (kind, title),
    };
    Described {
        kind,
        title,
        locations,
        content,
    }
}

fn text_content(text: String) -> acp::ToolCallContent {
    acp::ToolCallContent::Content(acp::Content::new(acp::ContentBlock::Text(
        acp::TextContent::new(text),
    )))
}

/// The tool call the model made, announced before it runs (`pending`; `in_progress` once the
/// editor approves it, as nothing on the bus says when an unasked call starts).
pub fn tool_call(workspace: &Path, id: &str, name: &str, arguments: &str) -> acp::ToolCall {
    let input: serde_json::Value = serde_json::from_str(arguments).unwrap_or_default();
    let described = describe(workspace, name, &input);
    acp::ToolCall::new(id.to_owned(), described.title)
        .kind(described.kind)
        .status(acp::ToolCallStatus::Pending)
        .locations(described.locations)
        .content(described.content)
        .raw_input(input)
}

/// How a call ended: its status, the commands it ran with their exit codes and what the model
/// reads of its output (sanitized and bounded by the kernel), after any diff it showed.
pub fn tool_outcome(outcome: &ToolOutcome, before: &[acp::ToolCallContent]) -> acp::ToolCallUpdate {
    // A command that was killed (a cancel, Ctrl-C) or timed out did not complete, whatever
    // the tool made of it: the editor shows the call failed.
    let cut_short = outcome
        .exec
        .iter()
        .any(|run| run.timed_out || run.exit_code.is_none());
    let status = match outcome.status {
        OutcomeStatus::Ok if !cut_short => acp::ToolCallStatus::Completed,
        _ => acp::ToolCallStatus::Failed,
    };
    let mut content: Vec<acp::ToolCallContent> = before
        .iter()
        .filter(|c| matches!(c, acp::ToolCallContent::Diff(_)))
        .cloned()
        .collect();
    for run in &outcome.exec {
        let ended = match (run.timed_out, run.exit_code) {
            (true, _) => "timed out".to_owned(),
            (false, Some(code)) => format!("exit code {code}"),
            (false, None) => "killed".to_owned(),
        };
        content.push(text_content(format!("$ {}\n[{ended}]", run.command)));
    }
    if !outcome.content.is_empty() {
        content.push(text_content(outcome.content.clone()));
    }
    let raw_output = serde_json::json!({
        "status": outcome.status,
        "exec": outcome.exec,
        "spill": outcome.spill,
    });
    acp::ToolCallUpdate::new(
        outcome.call_id.clone(),
        acp::ToolCallUpdateFields::new()
            .status(status)
            .content(content)
            .raw_output(raw_output),
    )
}

fn chunk(text: String) -> acp::ContentChunk {
    acp::ContentChunk::new(acp::ContentBlock::Text(acp::TextContent::new(text)))
}

/// How full the model's context is after a model call, as ACP's usage update: the tokens the
/// call read (its whole prompt: keel's `input_tokens` counts cached tokens too) and wrote,
/// against the window. `None` when the window is unknown or the call reported nothing.
pub fn context_usage(usage: &keel_protocol::Usage, window: u64) -> Option<acp::SessionUpdate> {
    let used = usage.input_tokens.saturating_add(usage.output_tokens);
    (window > 0 && used > 0)
        .then(|| acp::SessionUpdate::UsageUpdate(acp::UsageUpdate::new(used.min(window), window)))
}

/// What a turn has shown so far: the calls announced and not yet ended (with what they
/// showed, so their end keeps the diff), the last model stop, whether a compaction or a
/// subagent is speaking (its text is not the answer).
#[derive(Default)]
pub struct TurnView {
    pub open_calls: Vec<(String, String, Vec<acp::ToolCallContent>)>,
    pub last_stop: Option<StopReason>,
    /// The model's context window in tokens (0: unknown, and no usage is shown: ACP's usage
    /// update needs the window's size).
    pub window: u64,
    compacting: bool,
    tasks_running: usize,
    asked: Vec<String>,
}

impl TurnView {
    /// The updates one bus event makes.
    pub fn updates(
        &mut self,
        workspace: &Path,
        topic: &str,
        payload: &str,
    ) -> Vec<acp::SessionUpdate> {
        if topic == topics::COMPACTION_STATUS {
            let status: serde_json::Value = serde_json::from_str(payload).unwrap_or_default();
            self.compacting = status["state"] == "started";
            return Vec::new();
        }
        if topic == topics::MODEL_DELTA {
            if self.compacting || self.tasks_running > 0 {
                return Vec::new();
            }
            return match serde_json::from_str::<StreamDelta>(payload) {
                Ok(StreamDelta::Text { text }) => {
                    vec![acp::SessionUpdate::AgentMessageChunk(chunk(text))]
                }
                Ok(StreamDelta::Thinking { text }) => {
                    vec![acp::SessionUpdate::AgentThoughtChunk(chunk(text))]
                }
                _ => Vec::new(),
            };
        }
        if topic != topics::SESSION_EVENT {
            return Vec::new();
        }
        let Ok(event) = serde_json::from_str::<SessionEvent>(payload) else {
            return Vec::new();
        };
        match event {
            SessionEvent::Message {
                message,
                stop_reason,
                usage,
                ..
            } if message.role == Role::Assistant => {
                self.last_stop = stop_reason;
                let mut updates = Vec::new();
                // Only the session's own calls (a subagent's or a compaction's are not its
                // context), as with their text.
                if !self.compacting
                    && self.tasks_running == 0
                    && let Some(update) = usage.and_then(|u| context_usage(&u, self.window))
                {
                    updates.push(update);
                }
                for block in &message.content {
                    if let Block::ToolCall {
                        id,
                        name,
                        arguments,
                    } = block
                    {
                        let call = tool_call(workspace, id, name, arguments);
                        if name == "task" {
                            self.tasks_running += 1;
                        }
                        self.open_calls
                            .push((id.clone(), name.clone(), call.content.clone()));
                        updates.push(acp::SessionUpdate::ToolCall(call));
                    }
                }
                updates
            }
            SessionEvent::ToolOutcome { outcome, .. } => {
                let before = match self.open_calls.iter().position(|c| c.0 == outcome.call_id) {
                    Some(at) => {
                        let (_, name, before) = self.open_calls.remove(at);
                        if name == "task" {
                            self.tasks_running = self.tasks_running.saturating_sub(1);
                        }
                        before
                    }
                    None => Vec::new(),
                };
                vec![acp::SessionUpdate::ToolCallUpdate(tool_outcome(
                    &outcome, &before,
                ))]
            }
            _ => Vec::new(),
        }
    }

    /// The open call an approval question is about: the first not yet asked about whose tool
    /// is the one asking (the kernel's question names the tool, not the call), else any not
    /// yet asked about; `None` when there is none (a rerun outside the sandbox, asked after
    /// its call).
    pub fn call_asked_about(&mut self, request: &ApprovalRequest) -> Option<String> {
        let open = |name: Option<&str>| {
            self.open_calls
                .iter()
                .find(|(id, tool, _)| !self.asked.contains(id) && name.is_none_or(|n| n == tool))
                .map(|(id, _, _)| id.clone())
        };
        let id = open(Some(&request.tool)).or_else(|| open(None))?;
        self.asked.push(id.clone());
        Some(id)
    }
}

/// A conversation read back from keel's log as the updates that showed it: the person's
/// words, the model's words and thoughts, each tool call and its result.
pub fn replay(workspace: &Path, messages: &[Message]) -> Vec<acp::SessionUpdate> {
    let mut updates = Vec::new();
    let mut kinds: HashMap<String, Vec<acp::ToolCallContent>> = HashMap::new();
    for message in messages {
        for block in &message.content {
            match (message.role, block) {
                (Role::User, Block::Text { text }) => {
                    updates.push(acp::SessionUpdate::UserMessageChunk(chunk(text.clone())));
                }
                (Role::Assistant, Block::Text { text }) => {
                    updates.push(acp::SessionUpdate::AgentMessageChunk(chunk(text.clone())));
                }
                (_, Block::Thinking { text }) => {
                    updates.push(acp::SessionUpdate::AgentThoughtChunk(chunk(text.clone())));
                }
                (
                    _,
                    Block::ToolCall {
                        id,
                        name,
                        arguments,
                    },
                ) => {
                    // Replayed as it was asked: no file is read for a past change.
                    let input: serde_json::Value =
                        serde_json::from_str(arguments).unwrap_or_default();
                    let mut described = describe(Path::new("/nonexistent-replay"), name, &input);
                    described.locations = input["path"]
                        .as_str()
                        .and_then(|p| workspace_path(workspace, p))
                        .map(|(full, _)| vec![acp::ToolCallLocation::new(full)])
                        .unwrap_or_default();
                    for c in &mut described.content {
                        if let acp::ToolCallContent::Diff(diff) = c
                            && let Some((full, _)) = input["path"]
                                .as_str()
                                .and_then(|p| workspace_path(workspace, p))
                        {
                            diff.path = full;
                        }
                    }
                    kinds.insert(id.clone(), described.content.clone());
                    updates.push(acp::SessionUpdate::ToolCall(
                        acp::ToolCall::new(id.clone(), described.title)
                            .kind(described.kind)
                            .status(acp::ToolCallStatus::Pending)
                            .locations(described.locations)
                            .content(described.content)
                            .raw_input(input),
                    ));
                }
                (
                    _,
                    Block::ToolResult {
                        call_id,
                        content,
                        is_error,
                    },
                ) => {
                    let mut shown: Vec<acp::ToolCallContent> = kinds
                        .remove(call_id)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| matches!(c, acp::ToolCallContent::Diff(_)))
                        .collect();
                    shown.push(text_content(content.clone()));
                    let status = if *is_error {
                        acp::ToolCallStatus::Failed
                    } else {
                        acp::ToolCallStatus::Completed
                    };
                    updates.push(acp::SessionUpdate::ToolCallUpdate(
                        acp::ToolCallUpdate::new(
                            call_id.clone(),
                            acp::ToolCallUpdateFields::new()
                                .status(status)
                                .content(shown),
                        ),
                    ));
                }
            }
        }
    }
    updates
}

/// The answers offered for `request`, each saying what it lets run, as the terminal's
/// question does: once always; for the session and always only when the call has an approval
/// key (and always only when the gates allow remembering it); no, and no for the rest of the
/// session.
pub fn permission_options(request: &ApprovalRequest) -> Vec<acp::PermissionOption> {
    let mut options = vec![acp::PermissionOption::new(
        OPTION_ONCE,
        "Yes, this once",
        acp::PermissionOptionKind::AllowOnce,
    )];
    if let Some(key) = &request.key {
        let covers = format!("any `{key} …` in this workspace");
        options.push(acp::PermissionOption::new(
            OPTION_SESSION,
            format!("Yes, and for the rest of this session: {covers}"),
            acp::PermissionOptionKind::AllowAlways,
        ));
        if request.can_always {
            options.push(acp::PermissionOption::new(
                OPTION_ALWAYS,
                format!("Yes, and always (remembered across sessions): {covers}"),
                acp::PermissionOptionKind::AllowAlways,
            ));
        }
    }
    options.push(acp::PermissionOption::new(
        OPTION_NO,
        "No",
        acp::PermissionOptionKind::RejectOnce,
    ));
    if let Some(key) = &request.key {
        options.push(acp::PermissionOption::new(
            OPTION_NEVER,
            format!("No, and refuse any `{key} …` for the rest of this session without asking"),
            acp::PermissionOptionKind::RejectAlways,
        ));
    }
    options
}

const OPTION_ONCE: &str = "allow-once";
const OPTION_SESSION: &str = "allow-session";
const OPTION_ALWAYS: &str = "allow-always";
const OPTION_NO: &str = "reject-once";
const OPTION_NEVER: &str = "reject-session";

/// What the client's choice means, checked against what was offered: an option keel did not
/// offer for this request (an "always" where only "once" was offered, an invented id) is a
/// no, so a client can never answer more than it was asked. The second value says to refuse
/// the request's key without asking for the rest of the session.
pub fn answer(
    request: &ApprovalRequest,
    outcome: &acp::RequestPermissionOutcome,
) -> (Answer, bool) {
    let acp::RequestPermissionOutcome::Selected(selected) = outcome else {
        return (Answer::Deny, false);
    };
    let chosen = selected.option_id.0.as_ref();
    let offered = permission_options(request)
        .iter()
        .any(|o| o.option_id.0.as_ref() == chosen);
    if !offered {
        return (Answer::Deny, false);
    }
    match chosen {
        OPTION_ONCE => (Answer::Once, false),
        OPTION_SESSION => (Answer::Session, false),
        OPTION_ALWAYS => (Answer::Always, false),
        OPTION_NEVER => (Answer::Deny, true),
        _ => (Answer::Deny, false),
    }
}

/// The question's tool call as the permission request shows it: the call the editor already
/// shows when there is one, with the question's words (who asks, why) and the exact command
/// or the diff.
pub fn permission_call(
    workspace: &Path,
    call_id: Option<String>,
    request: &ApprovalRequest,
) -> acp::ToolCallUpdate {
    let who = request
        .requester
        .as_ref()
        .map(|r| format!("{r} → "))
        .unwrap_or_default();
    let wants = match &request.preview {
        Some(Preview::Write { path, .. }) => format!("wants to write {path}"),
        Some(Preview::Edit { path, .. }) => format!("wants to edit {path}"),
        None => format!("wants to run: {}", request.summary),
    };
    let title = format!("{who}{} {wants}", request.tool);
    let mut content = vec![text_content(format!("why: {}", request.reason))];
    match &request.preview {
        Some(Preview::Write { path, content: new }) => {
            if let Some((full, relative)) = workspace_path(workspace, path) {
                let old = crate::session::preview::current_text(workspace, &relative);
                content.push(acp::ToolCallContent::Diff(
                    acp::Diff::new(full, new.clone()).old_text(old),
                ));
            }
        }
        Some(Preview::Edit { path, old, new, .. }) => {
            if let Some((full, _)) = workspace_path(workspace, path) {
                content.push(acp::ToolCallContent::Diff(
                    acp::Diff::new(full, new.clone()).old_text(old.clone()),
                ));
            }
        }
        None => content.push(text_content(format!("$ {}", request.summary))),
    }
    let id = call_id.unwrap_or_else(|| format!("keel-approval-{}", crate::session::now_ms()));
    acp::ToolCallUpdate::new(
        id,
        acp::ToolCallUpdateFields::new()
            .title(title)
            .content(content),
    )
}

/// The id of the approval setting, as a config option.
pub const APPROVAL_OPTION: &str = "approval";

/// The approval modes an editor may choose for a session: never one more permissive than
/// the mode keel runs with (`[exec] approval` or `--approval`). Under `ask` the editor may
/// also choose `never` (questions refused without asking); under `auto` or `never` there is
/// nothing to choose, as the kernel answers without the editor.
pub fn approval_modes(configured: ApprovalMode) -> Vec<(&'static str, &'static str, &'static str)> {
    const ASK: (&str, &str, &str) = ("ask", "Ask", "each approval question goes to the editor");
    const NEVER: (&str, &str, &str) = (
        "never",
        "Never",
        "what needs approval is refused without asking",
    );
    const AUTO: (&str, &str, &str) = (
        "auto",
        "Auto",
        "what needs approval runs without asking; forbidden commands stay forbidden",
    );
    match configured {
        ApprovalMode::Ask => vec![ASK, NEVER],
        ApprovalMode::Never => vec![NEVER],
        ApprovalMode::Auto => vec![AUTO],
    }
}

/// The id of plan mode among the session modes.
pub const PLAN_MODE: &str = "plan";
/// What plan mode does, as the editor shows it.
const PLAN_ABOUT: &str = "read-only until you accept a plan: the model reads (files, searches, \
                          read-only commands) and ends its turn with a plan";

/// The session's approval mode and plan mode as ACP's (legacy) session modes: choosing an
/// approval mode leaves plan mode.
pub fn mode_state(configured: ApprovalMode, current: &str) -> acp::SessionModeState {
    let mut modes: Vec<acp::SessionMode> = approval_modes(configured)
        .into_iter()
        .map(|(id, name, about)| acp::SessionMode::new(id, name).description(about))
        .collect();
    modes.push(acp::SessionMode::new(PLAN_MODE, "Plan").description(PLAN_ABOUT));
    acp::SessionModeState::new(current.to_owned(), modes)
}

/// The id of the plan-mode config option (`off`, `on`).
pub const PLAN_OPTION: &str = "plan";

/// A plan in Markdown as ACP plan entries: its outermost list items (`-`, `*`, `+`, `1.`,
/// `1)`; nested ones are details of theirs), or its first line when it has none; at most 50,
/// each cut at 500 bytes.
pub fn plan_entries(plan: &str) -> Vec<acp::PlanEntry> {
    let item = |line: &str| -> Option<(usize, String)> {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let line = line.trim_start();
        let rest = ["- ", "* ", "+ "]
            .iter()
            .find_map(|bullet| line.strip_prefix(bullet))
            .or_else(|| {
                let digits =
                    line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                (digits > 0)
                    .then(|| &line[digits..])
                    .and_then(|r| r.strip_prefix(". ").or_else(|| r.strip_prefix(") ")))
            })?;
        let rest = rest.trim();
        (!rest.is_empty()).then(|| (indent, rest.to_owned()))
    };
    let all: Vec<(usize, String)> = plan.lines().filter_map(item).collect();
    let outermost = all.iter().map(|(indent, _)| *indent).min().unwrap_or(0);
    let mut items: Vec<String> = all
        .into_iter()
        .filter(|(indent, _)| *indent <= outermost + 1)
        .map(|(_, text)| text)
        .take(50)
        .collect();
    if items.is_empty()
        && let Some(first) = plan
            .lines()
            .map(|l| l.trim().trim_start_matches('#').trim())
            .find(|l| !l.is_empty())
    {
        items.push(first.to_owned());
    }
    items
        .into_iter()
        .map(|content| {
            let mut end = content.len().min(500);
            while !content.is_char_boundary(end) {
                end -= 1;
            }
            acp::PlanEntry::new(
                &content[..end],
                acp::PlanEntryPriority::Medium,
                acp::PlanEntryStatus::Pending,
            )
        })
        .collect()
}

/// The id of the option that accepts a plan, and of the one that keeps planning.
pub const PLAN_ACCEPT: &str = "accept-plan";
const PLAN_KEEP: &str = "keep-planning";

/// The question that ends a plan turn: leave plan mode and carry the plan out, or keep
/// planning; shown as a mode switch carrying the plan.
pub fn plan_question(id: String, plan: &str) -> (acp::ToolCallUpdate, Vec<acp::PermissionOption>) {
    let call = acp::ToolCallUpdate::new(
        id,
        acp::ToolCallUpdateFields::new()
            .kind(acp::ToolKind::SwitchMode)
            .status(acp::ToolCallStatus::Pending)
            .title("Leave plan mode and carry out this plan?")
            .content(vec![text_content(plan.to_owned())]),
    );
    let options = vec![
        acp::PermissionOption::new(
            PLAN_ACCEPT,
            "Yes: leave plan mode and carry it out (changes still ask as the session's \
             approvals say)",
            acp::PermissionOptionKind::AllowOnce,
        ),
        acp::PermissionOption::new(
            PLAN_KEEP,
            "No, keep planning",
            acp::PermissionOptionKind::RejectOnce,
        ),
    ];
    (call, options)
}

/// The id of the sandbox config option.
pub const SANDBOX_OPTION: &str = "sandbox";

/// The sandboxes an editor may choose for a session's commands: the one keel runs with
/// (`[sandbox] mode`) and those stricter than it, never a looser one.
pub fn sandbox_modes(configured: SandboxMode) -> Vec<(SandboxMode, &'static str, &'static str)> {
    const READ_ONLY: (SandboxMode, &str, &str) = (
        SandboxMode::ReadOnly,
        "Read-only",
        "commands may write nothing (but a private /tmp)",
    );
    const WORKSPACE_WRITE: (SandboxMode, &str, &str) = (
        SandboxMode::WorkspaceWrite,
        "Workspace write",
        "commands may write the workspace (not its control folders)",
    );
    const OFF: (SandboxMode, &str, &str) = (
        SandboxMode::Off,
        "Off",
        "commands run unconfined, as keel's config chose",
    );
    match configured {
        SandboxMode::ReadOnly => vec![READ_ONLY],
        SandboxMode::WorkspaceWrite => vec![WORKSPACE_WRITE, READ_ONLY],
        SandboxMode::Off => vec![OFF, WORKSPACE_WRITE, READ_ONLY],
    }
}

/// The session's approval mode, plan mode and sandbox as config options.
pub fn config_options(
    configured: ApprovalMode,
    current: &str,
    plan: bool,
    sandbox_configured: SandboxMode,
    sandbox: SandboxMode,
) -> Vec<acp::SessionConfigOption> {
    let choices: Vec<acp::SessionConfigSelectOption> = approval_modes(configured)
        .into_iter()
        .map(|(id, name, about)| acp::SessionConfigSelectOption::new(id, name).description(about))
        .collect();
    let sandboxes: Vec<acp::SessionConfigSelectOption> = sandbox_modes(sandbox_configured)
        .into_iter()
        .map(|(mode, name, about)| {
            acp::SessionConfigSelectOption::new(mode.as_str(), name).description(about)
        })
        .collect();
    vec![
        acp::SessionConfigOption::select(APPROVAL_OPTION, "Approvals", current.to_owned(), choices)
            .description("how keel's approval questions are answered in this session")
            .category(acp::SessionConfigOptionCategory::Mode),
        acp::SessionConfigOption::select(
            PLAN_OPTION,
            "Plan mode",
            if plan { "on" } else { "off" },
            vec![
                acp::SessionConfigSelectOption::new("off", "Off")
                    .description("tools and commands as the session allows"),
                acp::SessionConfigSelectOption::new("on", "On").description(PLAN_ABOUT),
            ],
        )
        .description(PLAN_ABOUT),
        acp::SessionConfigOption::select(
            SANDBOX_OPTION,
            "Sandbox",
            sandbox.as_str().to_owned(),
            sandboxes,
        )
        .description(
            "what this session's commands may write; chosen before its first prompt (the \
             sandbox is sealed into the session's kernel)",
        ),
    ]
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

    fn chose(id: &str) -> acp::RequestPermissionOutcome {
        acp::RequestPermissionOutcome::Selected(acp::SelectedPermissionOutcome::new(id.to_owned()))
    }

    #[test]
    fn a_plans_list_items_are_its_entries() {
        let entries = |plan: &str| -> Vec<String> {
            plan_entries(plan).into_iter().map(|e| e.content).collect()
        };
        assert_eq!(
            entries("## Plan\n\n1. Read the code\n   - a detail\n2) Fix it\n- Test it\n"),
            ["Read the code", "Fix it", "Test it"]
        );
        assert_eq!(entries("# Just do it\nsome words"), ["Just do it"]);
        assert!(entries("").is_empty());
        assert_eq!(plan_entries(&"- x\n".repeat(80)).len(), 50);
        let long = format!("- {}", "é".repeat(400));
        assert!(plan_entries(&long)[0].content.len() <= 500);
    }

    #[test]
    fn a_client_cannot_answer_more_than_it_was_offered() {
        let full = request(Some("touch"), true);
        assert_eq!(answer(&full, &chose("allow-once")), (Answer::Once, false));
        assert_eq!(
            answer(&full, &chose("allow-session")),
            (Answer::Session, false)
        );
        assert_eq!(
            answer(&full, &chose("allow-always")),
            (Answer::Always, false)
        );
        assert_eq!(answer(&full, &chose("reject-once")), (Answer::Deny, false));
        assert_eq!(
            answer(&full, &chose("reject-session")),
            (Answer::Deny, true)
        );
        // Not offered: "always" for a key the gates will not remember, any remembering for
        // a call without a key, an invented id.
        let session_only = request(Some("touch"), false);
        assert_eq!(
            answer(&session_only, &chose("allow-always")),
            (Answer::Deny, false)
        );
        let keyless = request(None, true);
        assert_eq!(
            answer(&keyless, &chose("allow-session")),
            (Answer::Deny, false)
        );
        assert_eq!(
            answer(&keyless, &chose("allow-always")),
            (Answer::Deny, false)
        );
        assert_eq!(answer(&full, &chose("yes")), (Answer::Deny, false));
        assert_eq!(
            answer(&full, &acp::RequestPermissionOutcome::Cancelled),
            (Answer::Deny, false)
        );
    }

    #[test]
    fn an_editor_never_chooses_a_looser_approval_mode() {
        let ids = |m| approval_modes(m).iter().map(|o| o.0).collect::<Vec<_>>();
        assert_eq!(ids(ApprovalMode::Ask), ["ask", "never"]);
        assert_eq!(ids(ApprovalMode::Never), ["never"]);
        assert_eq!(ids(ApprovalMode::Auto), ["auto"]);
    }

    #[test]
    fn model_paths_name_files_in_the_workspace_only() {
        let ws = Path::new("/w");
        assert_eq!(
            workspace_path(ws, "/workspace/a/b.txt").map(|p| p.0),
            Some(PathBuf::from("/w/a/b.txt"))
        );
        assert_eq!(
            workspace_path(ws, "a.txt").map(|p| p.0),
            Some(PathBuf::from("/w/a.txt"))
        );
        assert!(workspace_path(ws, "/etc/passwd").is_none());
        assert!(workspace_path(ws, "/workspacex/a").is_none());
        assert!(workspace_path(ws, "../outside").is_none());
        assert!(workspace_path(ws, "/workspace/../etc").is_none());
    }
}
