//! `/rewind` in `keel run`: this session's turns and tool calls with their checkpoints, the
//! diff a restore would make, then the files, the conversation or both taken back — the
//! files through `keel_checkpoints::rewind` (a safety checkpoint first, changes made outside
//! keel refused unless the person says to overwrite them), the conversation by a `rewound`
//! entry in the log and the agent loop given the conversation rebuilt from it, so the next
//! request goes on from that point in the same process.
//!
//! Everything shown came from the model, a tool or a file: each piece goes through
//! `terminal_safe`, and the diff is bounded in lines and bytes.

use anyhow::Context as _;
use keel_kernel::checkpoints::restore::Change;
use keel_kernel::checkpoints::rewind::{self, Preview, Target};
use keel_kernel::checkpoints::{Checkpoint, Kind, Node, Recorder, Store};
use keel_protocol::{LogLine, Role, SessionEvent};

use super::input::{self, Reply};
use super::output::short;
use super::{Session, terminal_safe, terminal_safe_name};
use crate::config::Context;

/// The most files a preview shows a diff of; the others are named.
const MAX_DIFFED_FILES: usize = 20;
/// The most lines a preview shows in all; the rest is counted.
const MAX_PREVIEW_LINES: usize = 400;
/// A file larger than this is named, not diffed.
const MAX_DIFF_BYTES: u64 = 256 << 10;

/// One turn of the session, as `/rewind` lists it.
#[derive(Debug, Default)]
pub(crate) struct TurnItem {
    /// Its number (1 is the first), as the checkpoints and `keel rewind --turn` count.
    pub(crate) number: u64,
    /// The person's request.
    pub(crate) prompt: String,
    /// The checkpoint before it.
    pub(crate) checkpoint: Option<String>,
    /// Its tool calls.
    pub(crate) calls: Vec<CallItem>,
}

/// One tool call of a turn.
#[derive(Debug)]
pub(crate) struct CallItem {
    pub(crate) id: String,
    pub(crate) tool: String,
    /// A short summary of its input.
    pub(crate) input: String,
    /// The checkpoint before it (calls that change no files have none).
    pub(crate) checkpoint: Option<String>,
}

/// The warnings a turn ends with for what its checkpoints did not record that the checkpoint
/// before it did not leave out already (a file the checkpoint store had no room for, one over
/// the size limit, one that could not be read): a rewind cannot bring those back, so the
/// person hears of it when it happens, not at the rewind.
pub(crate) fn newly_not_recorded(before: Option<&Checkpoint>, after: &Checkpoint) -> Vec<String> {
    let known: std::collections::BTreeSet<(&str, &str)> = before
        .map(|b| {
            b.skipped
                .iter()
                .map(|s| (s.path.as_str(), s.reason.as_str()))
                .collect()
        })
        .unwrap_or_default();
    after
        .skipped
        .iter()
        .filter(|s| !known.contains(&(s.path.as_str(), s.reason.as_str())))
        .map(|s| {
            format!(
                "warning: this turn's checkpoint did not record {}, so a rewind cannot bring \
                 it back: {}",
                terminal_safe_name(&s.path),
                terminal_safe(&s.reason)
            )
        })
        .collect()
}

/// The turns of `session` in its log `lines`, with the checkpoints of its `index`.
pub(crate) fn turns_of(lines: &[LogLine], index: &[Checkpoint]) -> Vec<TurnItem> {
    let mut turns: Vec<TurnItem> = Vec::new();
    let mut number = 1u64;
    for line in lines {
        match &line.event {
            SessionEvent::Message { message, .. } => {
                if turns.last().is_none_or(|t| t.number != number) {
                    turns.push(TurnItem {
                        number,
                        ..TurnItem::default()
                    });
                }
                let Some(turn) = turns.last_mut() else {
                    continue;
                };
                let text = message.text();
                if message.role == Role::User && turn.prompt.is_empty() && !text.is_empty() {
                    turn.prompt = text;
                }
                for (id, tool, arguments) in message.tool_calls() {
                    turn.calls.push(CallItem {
                        id: id.to_owned(),
                        tool: tool.to_owned(),
                        input: input_summary(arguments),
                        checkpoint: None,
                    });
                }
            }
            SessionEvent::TurnEnded { .. } => number += 1,
            _ => {}
        }
    }
    // Turns the checkpoints know and the log does not (a log that could not be read, a
    // replaced session-log plugin): listed from the checkpoints, without their request.
    for c in index.iter().filter(|c| c.kind == Kind::BeforeTurn) {
        if !turns.iter().any(|t| t.number == c.turn) {
            turns.push(TurnItem {
                number: c.turn,
                prompt: "(not in the log)".into(),
                checkpoint: None,
                calls: index
                    .iter()
                    .filter(|k| k.kind == Kind::BeforeCall && k.turn == c.turn)
                    .filter_map(|k| {
                        Some(CallItem {
                            id: k.call.clone()?,
                            tool: k.tool.clone().unwrap_or_default(),
                            input: String::new(),
                            checkpoint: None,
                        })
                    })
                    .collect(),
            });
        }
    }
    turns.sort_by_key(|t| t.number);
    for turn in &mut turns {
        turn.checkpoint = index
            .iter()
            .find(|c| c.kind == Kind::BeforeTurn && c.turn == turn.number)
            .map(|c| c.id.clone());
        for call in &mut turn.calls {
            call.checkpoint = index
                .iter()
                .find(|c| c.kind == Kind::BeforeCall && c.call.as_deref() == Some(&call.id))
                .map(|c| c.id.clone());
        }
    }
    turns
}

/// A tool call's input in a few words: its command or path when it has one.
fn input_summary(arguments: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(arguments).unwrap_or_default();
    let text = ["command", "path", "pattern", "url", "query"]
        .iter()
        .find_map(|k| value[k].as_str().map(str::to_owned))
        .unwrap_or_else(|| arguments.to_owned());
    short(&terminal_safe(&text), 70)
}

/// The list `/rewind` shows.
pub(crate) fn listing(turns: &[TurnItem]) -> Vec<String> {
    let mut out = Vec::new();
    for turn in turns {
        out.push(format!(
            "  {:<6} {:<5} {}",
            turn.number,
            turn.checkpoint.as_deref().unwrap_or("-"),
            short(&terminal_safe(&turn.prompt), 70)
        ));
        for (i, call) in turn.calls.iter().enumerate() {
            out.push(format!(
                "  {:<6} {:<5} ⏺ {} {}",
                format!("{}.{}", turn.number, i + 1),
                call.checkpoint.as_deref().unwrap_or("-"),
                terminal_safe(&call.tool),
                call.input
            ));
        }
    }
    out
}

/// What the person picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pick {
    /// The start of turn N.
    Turn(u64),
    /// Before call M (from 1) of turn N.
    Call(u64, usize),
    /// A checkpoint by id (`c7`), such as a rewind's safety checkpoint.
    Checkpoint(String),
}

/// `N`, `N.M` or `cK`.
pub(crate) fn parse_pick(text: &str) -> Option<Pick> {
    let text = text.trim();
    if let Some(k) = text.strip_prefix('c') {
        return k
            .parse::<u64>()
            .ok()
            .map(|k| Pick::Checkpoint(format!("c{k}")));
    }
    match text.split_once('.') {
        Some((n, m)) => Some(Pick::Call(
            n.parse().ok()?,
            m.parse().ok().filter(|m| *m > 0)?,
        )),
        None => text.parse().ok().filter(|n| *n > 0).map(Pick::Turn),
    }
}

/// The lines that show what restoring `preview` changes: a unified diff per changed text
/// file (what is there now `-`, what comes back `+`), files made and removed named, modes,
/// links and binary files named without content. Bounded: at most [`MAX_DIFFED_FILES`]
/// diffs, files over [`MAX_DIFF_BYTES`] named only, [`MAX_PREVIEW_LINES`] lines in all.
pub(crate) fn describe(store: &Store, preview: &Preview, colour: bool) -> Vec<String> {
    let wanted = store.manifest(&preview.target.manifest).ok();
    let size_of = |node: Option<&Node>| match node {
        Some(Node::File { stat, .. }) => Some(stat.size),
        _ => None,
    };
    let removed: std::collections::BTreeSet<&str> = preview
        .plan
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::Remove(p) | Change::RemoveDir(p) => Some(p.as_str()),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    let mut diffed = 0;
    for change in &preview.plan.changes {
        let now = preview.current.entries.get(change.path());
        let shown = terminal_safe_name(change.path());
        match change {
            Change::Remove(_) => out.push(match now {
                Some(Node::Symlink { .. }) => format!("- {shown} (a link, removed)"),
                Some(Node::File { stat, .. }) => {
                    format!("- {shown} (removed: made since then, {} bytes)", stat.size)
                }
                _ => format!("- {shown} (removed)"),
            }),
            Change::RemoveDir(_) => out.push(format!("- {shown}/ (removed)")),
            Change::MakeDir(_) => out.push(format!("+ {shown}/")),
            Change::DirMode { mode, .. } => {
                if let Some(Node::Dir { mode: was }) = now {
                    out.push(format!("~ {shown}/ mode {was:o} → {mode:o}"));
                }
            }
            Change::Link { target, .. } => {
                out.push(format!("+ {shown} → {} (a link)", terminal_safe(target)))
            }
            Change::Write { path, hash, mode } => {
                let there = now.filter(|_| !removed.contains(path.as_str()));
                let before = match there {
                    Some(Node::File {
                        hash: h, mode: m, ..
                    }) => Some((h.clone(), *m)),
                    _ => None,
                };
                let after_size = wanted
                    .as_ref()
                    .and_then(|w| size_of(w.entries.get(path)))
                    .unwrap_or(u64::MAX);
                match &before {
                    Some((h, m)) if h == hash => {
                        out.push(format!("~ {shown} mode {m:o} → {mode:o}"));
                        continue;
                    }
                    Some((_, m)) if m != mode => {
                        out.push(format!("~ {shown} (mode {m:o} → {mode:o})"));
                    }
                    Some(_) => out.push(format!("~ {shown}")),
                    None => out.push(format!("+ {shown} (brought back)")),
                }
                let before_size = if before.is_some() {
                    size_of(there).unwrap_or(u64::MAX)
                } else {
                    0
                };
                if diffed >= MAX_DIFFED_FILES {
                    continue;
                }
                if before_size.max(after_size) > MAX_DIFF_BYTES {
                    out.push("    (too large to show here)".into());
                    continue;
                }
                let text = |hash: &str| -> Option<String> {
                    let bytes = store.blob(hash).ok()?;
                    String::from_utf8(bytes).ok().filter(|t| !t.contains('\0'))
                };
                let old = match &before {
                    Some((h, _)) => text(h),
                    None => Some(String::new()),
                };
                match (old, text(hash)) {
                    (Some(old), Some(new)) => {
                        diffed += 1;
                        let diff = super::preview::diff(&old, &new, colour);
                        out.extend(diff.lines().map(|l| format!("  {l}")));
                    }
                    _ => out.push(format!(
                        "    (binary, {} bytes)",
                        if after_size == u64::MAX {
                            "?".to_owned()
                        } else {
                            after_size.to_string()
                        }
                    )),
                }
            }
        }
    }
    if out.len() > MAX_PREVIEW_LINES {
        let hidden = out.len() - MAX_PREVIEW_LINES;
        out.truncate(MAX_PREVIEW_LINES);
        out.push(format!(
            "… {hidden} more line(s); `keel rewind --dry-run` lists every change"
        ));
    }
    out
}

/// Ask `question` on the session's input; the answer's line, or `None` when the input ended
/// or the person pressed Ctrl-C.
async fn ask(question: String) -> Option<String> {
    match tokio::task::spawn_blocking(move || input::answer(&question)).await {
        Ok(Reply::Line(line)) => Some(line.trim().to_owned()),
        _ => None,
    }
}

impl Session {
    /// The entries of session `id`'s log, read through the session log's service.
    async fn log_lines(&self, id: &str) -> anyhow::Result<Vec<LogLine>> {
        self.kernel.settle_events().await;
        crate::commands::sessions::read(&self.kernel, id)
            .await
            .map(|read| read.lines)
            .map_err(|e| anyhow::anyhow!("cannot read this session's log: {e:#}"))
    }

    /// `/rewind [N | N.M | cK]`: pick a turn, a call or a checkpoint of this session, see what
    /// would change, and take back the files, the conversation or both.
    pub(crate) async fn rewind(&self, ctx: &Context, arg: &str) -> anyhow::Result<Option<String>> {
        let session = self.id();
        let lines = match self.log_lines(&session).await {
            Ok(lines) => lines,
            Err(e) => {
                stderrln!(
                    "warning: {}; turns are listed from the checkpoints alone, and the \
                     conversation cannot be rewound",
                    terminal_safe(&format!("{e:#}"))
                );
                Vec::new()
            }
        };
        let recorder = if ctx.config.checkpoints.enabled == Some(false) {
            None
        } else {
            Some(Recorder::new(
                ctx.checkpoint_store()?,
                ctx.config.checkpoints.settings(),
            ))
        };
        let index = match &recorder {
            Some(r) => r
                .store()
                .index(&session)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            None => Vec::new(),
        };
        let turns = turns_of(&lines, &index);
        let pick = if arg.is_empty() {
            if turns.is_empty() {
                return Ok(Some(
                    "nothing to rewind: this session has had no turn yet".into(),
                ));
            }
            stderrln!("  turn   checkpoint");
            for line in listing(&turns) {
                stderrln!("{line}");
            }
            let Some(answer) = ask(
                "rewind to (a turn `N`, a call `N.M`, a checkpoint `cK`; Enter cancels): ".into(),
            )
            .await
            .filter(|a| !a.is_empty()) else {
                return Ok(Some("nothing changed".into()));
            };
            answer
        } else {
            arg.to_owned()
        };
        let pick = parse_pick(&pick).with_context(|| {
            format!(
                "`{}` is not a turn (`N`), a call (`N.M`) or a checkpoint (`cK`); `/rewind` \
                 lists them",
                terminal_safe(&pick)
            )
        })?;
        let (target, turn) = match &pick {
            Pick::Turn(n) => (Target::Turn(*n), Some(*n)),
            Pick::Call(n, m) => {
                let call = turns
                    .iter()
                    .find(|t| t.number == *n)
                    .and_then(|t| t.calls.get(m - 1))
                    .with_context(|| format!("turn {n} has no call {m}; `/rewind` lists them"))?;
                (Target::Call(call.id.clone()), Some(*n))
            }
            Pick::Checkpoint(id) => {
                let turn = index.iter().find(|c| &c.id == id).and_then(|c| {
                    matches!(c.kind, Kind::BeforeTurn | Kind::BeforeCall).then_some(c.turn)
                });
                (Target::Checkpoint(id.clone()), turn)
            }
        };

        // The files: what a restore would change.
        let files = match &recorder {
            None => Err("checkpoints are off (`[checkpoints] enabled = false`)".to_owned()),
            Some(r) => rewind::prepare(r, &session, &target).map_err(|e| e.to_string()),
        };
        match (&files, &recorder) {
            (Ok(preview), Some(r)) => {
                stderrln!(
                    "files: back to {} ({}, turn {}){}",
                    preview.target.id,
                    preview.target.kind.label(),
                    preview.target.turn,
                    if preview.plan.is_empty() {
                        " — nothing to change"
                    } else {
                        ":"
                    }
                );
                for line in describe(r.store(), preview, crate::colour_on_stderr()) {
                    stderrln!("  {line}");
                }
                for s in &preview.not_recorded {
                    stderrln!(
                        "  not recorded then, so not brought back: {} ({})",
                        terminal_safe_name(&s.path),
                        terminal_safe(&s.reason)
                    );
                }
            }
            (Err(why), _) => stderrln!("files: cannot be rewound: {}", terminal_safe(why)),
            _ => {}
        }
        let files = files.ok();
        let mut conflicts: Vec<String> = files
            .as_ref()
            .map(|p| p.conflicts.clone())
            .unwrap_or_default();
        for path in &conflicts {
            stderrln!(
                "  changed outside keel since then: {}",
                terminal_safe_name(path)
            );
        }
        // Another session working in this workspace since then: its changes are named too.
        if let (Some(preview), Some(r)) = (&files, &recorder) {
            for (other, paths) in
                crate::commands::checkpoints::other_sessions_changes(r.store(), &session, preview)?
            {
                stderrln!(
                    "  changed by session {} since then: {}",
                    terminal_safe(&other),
                    paths
                        .iter()
                        .map(|p| terminal_safe_name(p))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                conflicts.extend(paths);
            }
            conflicts.sort();
            conflicts.dedup();
        }

        // The conversation: where it stood then.
        let conversation = match turn {
            Some(turn) => {
                crate::commands::checkpoints::conversation_plan_in(&lines, &session, turn, false)
                    .map_err(|e| e.to_string())
            }
            None => Err(format!(
                "{target} is not the start of a turn or a call, so the conversation has no \
                 point to go back to"
            )),
        };
        match &conversation {
            Ok(c) => stderrln!(
                "conversation: back to the start of turn {} ({} of {} messages kept)",
                c.turn,
                c.keep,
                c.of
            ),
            Err(why) => stderrln!("conversation: cannot be rewound: {}", terminal_safe(why)),
        }
        let conversation = conversation.ok();

        let mut choices = Vec::new();
        if files.is_some() {
            choices.push("[f] files");
        }
        if conversation.is_some() {
            choices.push("[c] conversation");
        }
        if files.is_some() && conversation.is_some() {
            choices.push("[b] both");
        }
        if choices.is_empty() {
            return Ok(Some("nothing changed".into()));
        }
        choices.push("[n] cancel");
        let Some(answer) = ask(format!("rewind {}? ", choices.join(", "))).await else {
            return Ok(Some("nothing changed".into()));
        };
        let (do_files, do_conversation) = match answer.to_ascii_lowercase().as_str() {
            "f" | "files" if files.is_some() => (true, false),
            "c" | "conversation" if conversation.is_some() => (false, true),
            "b" | "both" if files.is_some() && conversation.is_some() => (true, true),
            _ => return Ok(Some("nothing changed".into())),
        };
        let mut force = false;
        if do_files && !conflicts.is_empty() {
            stderrln!(
                "{} file(s) above changed outside keel or by another session since the \
                 checkpoint; the rewind would overwrite them (the safety checkpoint keeps what fits its size limit): {}",
                conflicts.len(),
                conflicts
                    .iter()
                    .map(|p| terminal_safe_name(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            match ask("overwrite them? [y/N] ".into()).await {
                Some(a) if a.eq_ignore_ascii_case("y") || a.eq_ignore_ascii_case("yes") => {
                    force = true;
                }
                _ => return Ok(Some("nothing changed".into())),
            }
        }

        let mut said = Vec::new();
        let mut safety = None;
        if do_files && let Some(recorder) = &recorder {
            let report = rewind::rewind(recorder, &session, &target, force)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            said.push(format!(
                "files rewound to {}: {} change(s); safety checkpoint {} undoes this rewind \
                 (`/rewind {}`, or `keel rewind {session} --checkpoint {} --files`)",
                report.preview.target.id,
                report.applied.done,
                report.safety.id,
                report.safety.id,
                report.safety.id
            ));
            for failed in &report.applied.failed {
                said.push(format!("not restored: {}", terminal_safe(failed)));
            }
            safety = Some(report.safety.id);
        }
        if do_conversation && let Some(c) = conversation {
            let entry = SessionEvent::Rewound {
                session: session.clone(),
                keep: c.keep,
                turn: c.turn,
                checkpoint: safety.clone(),
            };
            crate::commands::sessions::append(&self.kernel, entry)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("the rewind could not be recorded in the log: {e:#}")
                })?;
            // The agent loop goes on from the conversation the log now rebuilds.
            let n = self.seed_conversation(&session).await?;
            said.push(format!(
                "conversation rewound to the start of turn {} ({n} messages); the next request \
                 goes on from there",
                c.turn
            ));
        }
        Ok(Some(said.join("\n")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{Block, Message};

    fn line(seq: u64, event: SessionEvent) -> LogLine {
        LogLine {
            seq,
            time_ms: 0,
            event,
        }
    }

    fn message(message: Message) -> SessionEvent {
        SessionEvent::Message {
            session: "s".into(),
            message,
            stop_reason: None,
            usage: None,
        }
    }

    /// The request and the call come from the model and the person: the list shows them
    /// with nothing that could drive the terminal, and numbers turns as the checkpoints do.
    #[test]
    fn the_list_numbers_turns_and_calls_and_cleans_what_it_shows() {
        let lines = vec![
            line(
                0,
                message(Message::user_text("first \x1b]0;pwned\x07request")),
            ),
            line(
                1,
                message(Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolCall {
                        id: "call_1".into(),
                        name: "exec_shell\x1b[2J".into(),
                        arguments: r#"{"command": "rm -rf src\u001b[8m && echo made"}"#.into(),
                    }],
                }),
            ),
            line(
                2,
                SessionEvent::TurnEnded {
                    session: "s".into(),
                    end: keel_protocol::TurnEnd::Completed,
                    detail: String::new(),
                },
            ),
            line(3, message(Message::user_text("second"))),
        ];
        let turns = turns_of(&lines, &[]);
        assert_eq!(turns.len(), 2);
        assert_eq!((turns[0].number, turns[1].number), (1, 2));
        assert_eq!(turns[0].calls[0].id, "call_1");
        let shown = listing(&turns).join("\n");
        assert!(
            !shown.contains('\x1b') && !shown.contains('\x07'),
            "{shown:?}"
        );
        assert!(shown.contains("first"), "{shown}");
        assert!(shown.contains("1.1"), "{shown}");
        assert!(shown.contains("⏺ exec_shell"), "{shown}");
        assert!(shown.contains("rm -rf src"), "{shown}");
    }

    /// A turn the checkpoints know and the log does not is still listed, with its calls.
    #[test]
    fn turns_missing_from_the_log_are_listed_from_the_checkpoints() {
        let checkpoint = |seq: u64, turn: u64, kind: Kind, call: Option<&str>| Checkpoint {
            id: format!("c{seq}"),
            seq,
            session: "s".into(),
            turn,
            kind,
            call: call.map(str::to_owned),
            tool: call.map(|_| "exec_shell".to_owned()),
            time_ms: 0,
            manifest: String::new(),
            files: 0,
            bytes: 0,
            skipped: Vec::new(),
            changed: Vec::new(),
            changed_count: 0,
            outside: false,
            note: None,
            not_covered: Vec::new(),
            walk: None,
        };
        let index = [
            checkpoint(1, 1, Kind::BeforeTurn, None),
            checkpoint(2, 1, Kind::BeforeCall, Some("call_1")),
            checkpoint(3, 1, Kind::AfterTurn, None),
        ];
        let turns = turns_of(&[], &index);
        assert_eq!(turns.len(), 1);
        assert_eq!(turns[0].checkpoint.as_deref(), Some("c1"));
        assert_eq!(turns[0].calls[0].checkpoint.as_deref(), Some("c2"));
        assert!(listing(&turns).join("\n").contains("⏺ exec_shell"));
    }

    /// The preview of a restore: a diff of a changed text file, binary and large files named
    /// without content, a file made since then named; a file's content and name carry escape
    /// sequences, and none reaches the lines shown.
    #[test]
    fn the_preview_diffs_text_names_the_rest_and_drives_no_terminal()
    -> Result<(), Box<dyn std::error::Error>> {
        use keel_kernel::checkpoints::Settings;
        let home = tempfile::tempdir()?;
        let ws = tempfile::tempdir()?;
        let ws = ws.path();
        std::fs::write(ws.join("notes.txt"), "one\ntwo\nthree\n")?;
        std::fs::write(ws.join("bin.dat"), b"\0\x01\x02")?;
        std::fs::write(ws.join("big.txt"), "x\n".repeat(200_000))?;
        let recorder = Recorder::new(Store::open(home.path(), ws)?, Settings::default());
        recorder.before_turn("s1")?;
        std::fs::write(
            ws.join("notes.txt"),
            "one\n\x1b]0;pwned\x07TWO\x1b[2J\nthree\n",
        )?;
        std::fs::write(ws.join("bin.dat"), b"\0\x09")?;
        std::fs::write(ws.join("big.txt"), "y\n")?;
        std::fs::write(ws.join("made\x1b[31m.txt"), "new\n")?;
        let preview = rewind::prepare(&recorder, "s1", &Target::Turn(1))?;
        let shown = describe(recorder.store(), &preview, false).join("\n");
        assert!(
            !shown.contains('\x1b') && !shown.contains('\x07'),
            "{shown:?}"
        );
        for wanted in [
            "~ notes.txt",
            "  + two",
            "TWO",
            "~ bin.dat",
            "(binary, 3 bytes)",
            "~ big.txt",
            "(too large to show here)",
            // A name holding an escape is quoted and escaped, as the model sees it.
            r#"- "made\u001b[31m.txt""#,
        ] {
            assert!(shown.contains(wanted), "`{wanted}` missing:\n{shown}");
        }
        assert!(
            !shown.contains("x\n  + x"),
            "a large file's content was shown"
        );
        Ok(())
    }

    #[test]
    fn picks_are_turns_calls_or_checkpoints() {
        assert_eq!(parse_pick("2"), Some(Pick::Turn(2)));
        assert_eq!(parse_pick(" 2.3 "), Some(Pick::Call(2, 3)));
        assert_eq!(parse_pick("c12"), Some(Pick::Checkpoint("c12".into())));
        for bad in ["0", "2.0", "x", "c", "c1/../x", "-1", ""] {
            assert_eq!(parse_pick(bad), None, "{bad}");
        }
    }
}
