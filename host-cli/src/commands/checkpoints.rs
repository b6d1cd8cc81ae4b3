//! `keel checkpoints list` and `keel rewind`: the workspace states a session's checkpoints
//! recorded (`keel_kernel::checkpoints`), and going back to one — the files, the conversation,
//! or both. A rewind of the files takes a safety checkpoint first, so it can itself be undone;
//! a rewind of the conversation appends a `rewound` entry to the session log, which stays
//! append-only, and the next `keel resume` goes on from there.

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{ArgGroup, Subcommand};
use keel_agent_kit::session_log::{self, LogWriter, Rebuild};
use keel_kernel::checkpoints::rewind::{self, Target};
use keel_kernel::checkpoints::{Checkpoint, Kind, Recorder};
use keel_protocol::{LogLine, SessionEvent};

use crate::config::Context;
use crate::session::{running, terminal_safe, terminal_safe_name};

/// `keel checkpoints …`
#[derive(Subcommand)]
pub enum CheckpointsCommand {
    /// The checkpoints a session recorded in this workspace, oldest first.
    List {
        /// The session id (`keel sessions list`).
        session: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drop old checkpoints of this workspace's sessions and delete the stored content no
    /// kept checkpoint names (each session's last checkpoint always stays), by the retention
    /// of `[checkpoints]` in keel's config unless told otherwise.
    Gc {
        /// Drop checkpoints older than this many days (default: `max-age-days`, 30).
        #[arg(long)]
        days: Option<u64>,
        /// Keep at most this many checkpoints per session, the newest (default:
        /// `max-per-session`, 1000).
        #[arg(long)]
        keep: Option<usize>,
    },
}

/// `keel rewind SESSION (--turn N | --call ID | --checkpoint ID)`
#[derive(clap::Args)]
#[command(group(ArgGroup::new("to").required(true).args(["turn", "call", "checkpoint"])))]
#[command(group(ArgGroup::new("what").args(["files", "conversation", "both"])))]
pub struct RewindArgs {
    /// The session id (`keel sessions list`).
    session: String,
    /// Back to the state before turn N (1 is the first).
    #[arg(long, value_name = "N")]
    turn: Option<u64>,
    /// Back to the state before tool call ID (the files; the conversation goes back to the
    /// start of that call's turn).
    #[arg(long, value_name = "ID")]
    call: Option<String>,
    /// Back to checkpoint ID (`keel checkpoints list`), such as a rewind's safety checkpoint.
    #[arg(long, value_name = "ID")]
    checkpoint: Option<String>,
    /// Rewind the workspace's files only.
    #[arg(long)]
    files: bool,
    /// Rewind the conversation only.
    #[arg(long)]
    conversation: bool,
    /// Rewind both (the default).
    #[arg(long)]
    both: bool,
    /// Show what would change, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Do it without asking.
    #[arg(long)]
    yes: bool,
    /// Overwrite files changed outside keel since the checkpoint.
    #[arg(long)]
    force: bool,
    /// Rewind the conversation into a new session (a copy of the log up to that point),
    /// leaving this one as it is.
    #[arg(long, conflicts_with = "files")]
    fork: bool,
}

/// `keel rewind`'s subcommand entry.
pub fn run(ctx: &Context, cmd: CheckpointsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CheckpointsCommand::List { session, json } => list(ctx, &session, json),
        CheckpointsCommand::Gc { days, keep } => {
            let store = ctx.checkpoint_store()?;
            let configured = ctx.config.checkpoints.retention();
            let done = store
                .collect_garbage(&keel_kernel::checkpoints::Retention {
                    max_age: days.map_or(configured.max_age, |d| {
                        std::time::Duration::from_secs(d.saturating_mul(24 * 3600))
                    }),
                    per_session: keep.unwrap_or(configured.per_session),
                    ..configured
                })
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            stdoutln!(
                "dropped {} checkpoint(s); deleted {} stored object(s), {}",
                done.checkpoints,
                done.objects,
                size(done.bytes)
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The `keel doctor` line of the checkpoint stores: what this workspace's store and all of
/// them hold on disk, and the retention that bounds them (applied as every session starts and
/// ends).
pub(crate) fn store_usage_line(ctx: &Context) -> String {
    use keel_kernel::checkpoints::store::{usage, workspace_key};
    if ctx.config.checkpoints.enabled == Some(false) {
        return "checkpoints are off (`[checkpoints] enabled = false`)".to_owned();
    }
    let all = ctx.checkpoints_dir();
    let here = usage(&all.join(workspace_key(&ctx.workspace)));
    let total = usage(&all);
    let stores = std::fs::read_dir(&all).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .count()
    });
    let kept = ctx.config.checkpoints.retention();
    format!(
        "checkpoints: {} in {} file(s) for this workspace, {} in {} file(s) for all {stores} \
         workspace(s) ({}); kept: {} days, {} a session, {} a workspace, applied as each \
         session starts and ends (`[checkpoints] max-age-days`, `max-per-session`, \
         `max-total-mib`)",
        size(here.bytes),
        here.files,
        size(total.bytes),
        total.files,
        all.display(),
        kept.max_age.as_secs() / (24 * 3600),
        kept.per_session,
        size(kept.max_total_bytes),
    )
}

fn recorder(ctx: &Context) -> anyhow::Result<Recorder> {
    Ok(Recorder::new(
        ctx.checkpoint_store()?,
        ctx.config.checkpoints.settings(),
    ))
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// One checkpoint in a line.
fn line(c: &Checkpoint) -> String {
    let mut line = format!("{:<5} turn {:<3} {:<22}", c.id, c.turn, c.kind.label());
    if let (Some(call), Some(tool)) = (&c.call, &c.tool) {
        line.push_str(&format!(
            " {} ({})",
            terminal_safe(tool),
            terminal_safe(call)
        ));
    }
    line.push_str(&format!("  {} files, {}", c.files, size(c.bytes)));
    if c.changed_count > 0 {
        line.push_str(&format!(
            ", {} changed{}",
            c.changed_count,
            if c.outside { " outside keel" } else { "" }
        ));
    }
    if !c.skipped.is_empty() {
        line.push_str(&format!(", {} not recorded", c.skipped.len()));
    }
    line
}

fn list(ctx: &Context, session: &str, json: bool) -> anyhow::Result<ExitCode> {
    let recorder = recorder(ctx)?;
    let index = recorder
        .store()
        .index(session)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Checkpoints whose stored state is missing or damaged (the machine stopped before the
    // last ones reached the disk): said, and a rewind to them is refused.
    let unrestorable = recorder.store().unrestorable(&index);
    if json {
        let mut lines = Vec::with_capacity(index.len());
        for c in &index {
            let mut line = serde_json::to_value(c)?;
            if let (Some(why), Some(fields)) = (unrestorable.get(&c.id), line.as_object_mut()) {
                fields.insert("unrestorable".into(), why.clone().into());
            }
            lines.push(line);
        }
        stdoutln!("{}", serde_json::to_string_pretty(&lines)?);
        return Ok(ExitCode::SUCCESS);
    }
    if index.is_empty() {
        stdoutln!(
            "session {} has no checkpoints in {} (checkpoints are kept per workspace)",
            terminal_safe(session),
            ctx.workspace.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    // A rewind of this session stopped part way (killed): said, with the two ways out.
    if let Some(unfinished) = rewind::unfinished(recorder.store(), session) {
        stdoutln!(
            "a rewind to {} was stopped before it was done: `keel rewind {s} --checkpoint {} \
             --files` finishes it, `keel rewind {s} --checkpoint {} --files` undoes it (what \
             it changed is known as keel's, so neither needs --force)",
            terminal_safe(&unfinished.target),
            terminal_safe(&unfinished.target),
            terminal_safe(&unfinished.safety),
            s = terminal_safe(session),
        );
    }
    let mut not_covered: &[String] = &[];
    for c in &index {
        stdoutln!("{}", line(c));
        if let Some(why) = unrestorable.get(&c.id) {
            stdoutln!("        cannot be restored: {}", terminal_safe(why));
        }
        // What the session could change outside the workspace, when it first differs: the
        // same for every checkpoint of a session but for a resume under another config.
        if c.not_covered != not_covered {
            not_covered = &c.not_covered;
            for place in not_covered {
                stdoutln!(
                    "        not covered by any checkpoint (a rewind does not bring it \
                     back): {}",
                    terminal_safe(place)
                );
            }
        }
        if c.outside {
            for path in &c.changed {
                stdoutln!("        changed outside keel: {}", terminal_safe_name(path));
            }
        }
        for s in &c.skipped {
            stdoutln!(
                "        not recorded: {} ({})",
                terminal_safe_name(&s.path),
                terminal_safe(&s.reason)
            );
        }
        if let Some(note) = &c.note {
            stdoutln!("        {}", terminal_safe(note));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How a rewind leaves the conversation: keep its first `keep` messages of `of`.
pub(crate) struct ConversationPlan {
    pub(crate) turn: u64,
    pub(crate) keep: usize,
    pub(crate) of: usize,
}

/// Where the conversation of `session` stood when turn `turn` began, read from its log.
fn conversation_plan(
    ctx: &Context,
    session: &str,
    turn: u64,
    forking: bool,
) -> anyhow::Result<ConversationPlan> {
    let dir = ctx.data_dir().join("sessions");
    let read = session_log::read_log(&dir, session).map_err(|e| {
        anyhow::anyhow!("cannot read the log of session `{session}`: {e}; `keel sessions list` shows the sessions")
    })?;
    conversation_plan_in(&read.lines, session, turn, forking)
}

/// Where the conversation in `lines` (a session's log) stood when turn `turn` began: after
/// the log's `turn - 1`th turn end. Refused where a compaction came after that point (the
/// kept count would no longer line up), unless `forking` (a fork copies the log up to that
/// point, so what came after does not matter).
pub(crate) fn conversation_plan_in(
    lines: &[LogLine],
    session: &str,
    turn: u64,
    forking: bool,
) -> anyhow::Result<ConversationPlan> {
    if turn == 0 {
        bail!("turns count from 1; `keel checkpoints list {session}` shows them");
    }
    let Some(start) = turn_start(lines, turn) else {
        let ended = lines
            .iter()
            .filter(|l| matches!(l.event, SessionEvent::TurnEnded { .. }))
            .count();
        bail!(
            "session `{session}` has {ended} ended turn(s) in its log, so no turn {turn} to go \
             back to the start of"
        );
    };
    let compacted_after = lines[start..]
        .iter()
        .any(|l| matches!(l.event, SessionEvent::Compacted { .. }));
    if compacted_after && !forking {
        bail!(
            "the conversation of session `{session}` was compacted after turn {turn} began, so \
             it cannot be rewound there; rewind the files alone"
        );
    }
    let rebuilt = |lines: &[LogLine]| {
        let mut rebuild = Rebuild::default();
        for line in lines {
            rebuild.push(line);
        }
        rebuild
    };
    let keep = rebuilt(&lines[..start]).messages();
    Ok(ConversationPlan {
        turn,
        keep,
        of: rebuilt(lines).finish().messages.len(),
    })
}

/// Where turn `turn` of the log `lines` begins: the first message after the log's
/// `turn - 1`th turn end (so a `rewound` entry standing between two turns counts as before
/// the next one), or the log's end when no message follows. `None` when the log has fewer
/// turn ends.
fn turn_start(lines: &[LogLine], turn: u64) -> Option<usize> {
    let mut ended = 0u64;
    for (i, line) in lines.iter().enumerate() {
        match &line.event {
            SessionEvent::Message { .. } if ended + 1 >= turn => return Some(i),
            SessionEvent::TurnEnded { .. } => ended += 1,
            _ => {}
        }
    }
    (ended + 1 >= turn).then_some(lines.len())
}

/// `keel rewind`
pub fn rewind_command(ctx: &Context, args: RewindArgs) -> anyhow::Result<ExitCode> {
    let session = args.session.as_str();
    // Never under a session still working in the workspace and writing its log: the lock is
    // held until this rewind is done, so the session cannot be resumed meanwhile either.
    let _running = if args.dry_run {
        None
    } else {
        match running::take(&ctx.home, session) {
            Ok(held) => Some(held),
            Err(running::NotTaken::Held) => bail!(
                "not rewound: {}; finish its turn and leave it (`/exit`) first, or use \
                 `/rewind` inside it (--force does not change this)",
                running::held_words(session)
            ),
            Err(running::NotTaken::Failed(why)) => {
                bail!("not rewound: cannot tell whether session `{session}` is running: {why}")
            }
        }
    };
    let recorder = recorder(ctx)?;
    let target = match (&args.turn, &args.call, &args.checkpoint) {
        (Some(n), _, _) => Target::Turn(*n),
        (_, Some(id), _) => Target::Call(id.clone()),
        (_, _, Some(id)) => Target::Checkpoint(id.clone()),
        _ => bail!("say where to rewind to: --turn N, --call ID or --checkpoint ID"),
    };
    let files = !args.conversation;
    let mut conversation = !args.files;
    let preview = rewind::prepare(&recorder, session, &target).map_err(|e| anyhow::anyhow!("{e}"));
    // The conversation alone needs no checkpoint for --turn.
    let preview = match preview {
        Ok(p) => Some(p),
        Err(e) if !files => {
            if args.turn.is_none() {
                return Err(e);
            }
            None
        }
        Err(e) => return Err(e),
    };
    let turn = match (&preview, args.turn) {
        (_, Some(n)) => Some(n),
        (Some(p), None) => match p.target.kind {
            Kind::BeforeTurn | Kind::BeforeCall => Some(p.target.turn),
            _ => None,
        },
        (None, None) => None,
    };
    let mut notes = Vec::new();
    let conversation_plan = match (conversation, turn) {
        (true, Some(turn)) => Some(conversation_plan(ctx, session, turn, args.fork)?),
        (true, None) => {
            if args.conversation || args.both {
                bail!(
                    "{target} is not the start of a turn or a call, so the conversation has no \
                     point to go back to; pass --files, or --turn N"
                );
            }
            notes.push(format!(
                "the conversation is left as it is: {target} is not the start of a turn or a call"
            ));
            conversation = false;
            None
        }
        (false, _) => None,
    };
    // What will happen.
    if files && let Some(p) = &preview {
        stdoutln!(
            "files: back to {} ({}, turn {}){}",
            p.target.id,
            p.target.kind.label(),
            p.target.turn,
            if p.plan.is_empty() {
                " — nothing to change".to_owned()
            } else {
                String::new()
            }
        );
        for line in p.lines() {
            stdoutln!("  {}", terminal_safe(&line));
        }
        for s in &p.not_recorded {
            stdoutln!(
                "  not recorded then, so not brought back: {} ({})",
                terminal_safe_name(&s.path),
                terminal_safe(&s.reason)
            );
        }
        for path in &p.conflicts {
            stdoutln!(
                "  changed outside keel since then: {}",
                terminal_safe_name(path)
            );
        }
    }
    let others = match (&preview, files) {
        (Some(p), true) => other_sessions_changes(recorder.store(), session, p)?,
        _ => Vec::new(),
    };
    for (other, paths) in &others {
        stdoutln!(
            "  changed by session {} since then: {}",
            terminal_safe(other),
            paths
                .iter()
                .map(|p| terminal_safe_name(p))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(c) = &conversation_plan {
        stdoutln!(
            "conversation: {} the start of turn {} ({} of {} messages kept)",
            if args.fork {
                "into a new session from"
            } else {
                "back to"
            },
            c.turn,
            c.keep,
            c.of
        );
    }
    for note in &notes {
        stdoutln!("{note}");
    }
    if files && !others.is_empty() && !args.force {
        bail!(
            "not rewound: it would undo what {} did to the file(s) above since the checkpoint; \
             pass --force to overwrite them, or rewind that session first",
            others
                .iter()
                .map(|(o, _)| format!("session {}", terminal_safe(o)))
                .collect::<Vec<_>>()
                .join(" and ")
        );
    }
    let conflicts = preview.as_ref().map_or(0, |p| p.conflicts.len());
    if files && conflicts > 0 && !args.force {
        bail!(
            "not rewound: {conflicts} file(s) above changed outside keel since the checkpoint \
             and would be overwritten; pass --force to overwrite them, or save them elsewhere \
             first"
        );
    }
    if args.dry_run {
        stdoutln!("(dry run: nothing changed)");
        return Ok(ExitCode::SUCCESS);
    }
    if !args.yes && !super::confirm("rewind?")? {
        stdoutln!("nothing changed");
        return Ok(ExitCode::SUCCESS);
    }
    let mut safety = None;
    let mut failed = Vec::new();
    if files && preview.is_some() {
        let report = rewind::rewind(&recorder, session, &target, args.force)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        stdoutln!(
            "files rewound to {}: {} change(s); {} undoes this rewind (`keel rewind {} \
             --checkpoint {} --files`)",
            report.preview.target.id,
            report.applied.done,
            report.safety.id,
            terminal_safe(session),
            report.safety.id
        );
        failed = report.applied.failed.clone();
        safety = Some(report.safety.id);
    }
    if conversation
        && args.fork
        && let Some(c) = &conversation_plan
    {
        let new = fork(ctx, session, c.turn)?;
        // The fork's checkpoints start as the original's before the turn it branches at, so
        // its files can be rewound to any turn it has.
        if let Err(e) = recorder
            .store()
            .fork_index(session, &new, |checkpoint| checkpoint.turn < c.turn)
        {
            stderrln!("warning: the forked session has no checkpoints of the turns before it: {e}");
        }
        stdoutln!(
            "forked: session {new} goes on from the start of turn {} of session {} ({} \
             messages); `keel resume {new}` continues it, and session {} is as it was",
            c.turn,
            terminal_safe(session),
            c.keep,
            terminal_safe(session)
        );
    } else if conversation && let Some(c) = conversation_plan {
        let dir = ctx.data_dir().join("sessions");
        let mut log = LogWriter::open(&dir, session)
            .with_context(|| format!("opening the log of session `{session}`"))?;
        log.append(
            crate::session::now_ms(),
            &SessionEvent::Rewound {
                session: session.to_owned(),
                keep: c.keep,
                turn: c.turn,
                checkpoint: safety.clone(),
            },
        )
        .and_then(|_| log.sync())
        .with_context(|| format!("recording the rewind in the log of session `{session}`"))?;
        stdoutln!(
            "conversation rewound to the start of turn {}; `keel resume {}` goes on from there",
            c.turn,
            terminal_safe(session)
        );
    }
    if !failed.is_empty() {
        for f in &failed {
            stderrln!("not restored: {}", terminal_safe_name(f));
        }
        bail!(
            "{} change(s) of the rewind could not be made (above); the rest were",
            failed.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Copy the log of `session` up to the start of turn `turn` into a new session: every entry
/// before that point, renamed to the new session and numbered afresh, then a `rewound` entry
/// saying where it branched. Both the first entry and that one carry `forked_from` (the
/// session) and `forked_at_turn`, extra fields readers of the log ignore. The new log is
/// written whole to a temp file, synced and renamed into place; the original is only read.
/// The new session's id.
fn fork(ctx: &Context, session: &str, turn: u64) -> anyhow::Result<String> {
    let dir = ctx.data_dir().join("sessions");
    let read = session_log::read_log(&dir, session)
        .map_err(|e| anyhow::anyhow!("cannot read the log of session `{session}`: {e}"))?;
    let cut = turn_start(&read.lines, turn)
        .with_context(|| format!("session `{session}` has no turn {turn} to fork at"))?;
    let copied = &read.lines[..cut];
    let mut rebuild = Rebuild::default();
    for line in copied {
        rebuild.push(line);
    }
    let keep = rebuild.messages();
    let new = session_log::new_session_id(crate::session::now_ms(), std::process::id());
    let mut text = Vec::new();
    let mut seq = 0u64;
    let mut add = |value: &mut serde_json::Value, note: bool| -> anyhow::Result<()> {
        value["seq"] = seq.into();
        value["session"] = new.clone().into();
        if note {
            value["forked_from"] = session.into();
            value["forked_at_turn"] = turn.into();
        }
        serde_json::to_writer(&mut text, value)?;
        text.push(b'\n');
        seq += 1;
        Ok(())
    };
    for (i, line) in copied.iter().enumerate() {
        add(&mut serde_json::to_value(line)?, i == 0)?;
    }
    let branch = LogLine {
        seq: 0,
        time_ms: crate::session::now_ms(),
        event: SessionEvent::Rewound {
            session: new.clone(),
            keep,
            turn,
            checkpoint: None,
        },
    };
    add(&mut serde_json::to_value(&branch)?, true)?;
    let path = dir.join(format!("{new}.jsonl"));
    let tmp = dir.join(format!(".{new}.jsonl.tmp"));
    let written = (|| -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&text)?;
        file.sync_all()?;
        if path.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a session with the new id exists",
            ));
        }
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        bail!(
            "cannot write the forked session's log {}: {e}",
            path.display()
        );
    }
    Ok(new)
}

/// What other sessions of this workspace recorded as their own changes (made by their turns,
/// not outside keel) since the checkpoint `preview` restores, among the paths the restore
/// would change: each such session with those paths. A rewind of one session's files would
/// undo them, so they are named and asked about like changes made outside keel.
pub(crate) fn other_sessions_changes(
    store: &keel_kernel::checkpoints::Store,
    session: &str,
    preview: &rewind::Preview,
) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let touched = preview.plan.paths();
    let mut found = Vec::new();
    for other in store.sessions().map_err(|e| anyhow::anyhow!("{e}"))? {
        if other == session {
            continue;
        }
        let index = store.index(&other).map_err(|e| anyhow::anyhow!("{e}"))?;
        let paths: std::collections::BTreeSet<String> = index
            .iter()
            .filter(|c| c.time_ms >= preview.target.time_ms && !c.outside)
            .flat_map(|c| c.changed.iter())
            .filter(|p| touched.contains(*p))
            .cloned()
            .collect();
        if !paths.is_empty() {
            found.push((other, paths.into_iter().collect()));
        }
    }
    Ok(found)
}
