//! What a session shows: bus events rendered for a person (streamed text, one line per tool
//! call and result) or as JSON lines for scripts.

use keel_kernel::Event;
use std::io::Write;

use keel_protocol::{Message, SessionEvent, StreamDelta, TurnEnd, topics};

/// The version of the `--json` lines (every line carries it as `"version"`); raised when a
/// line changes in a way a script could trip over.
pub const JSON_VERSION: u32 = 1;

/// How a session shows what happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// Streamed text and tool lines for a person, on stdout (`keel run`).
    Human,
    /// The same transcript on stderr, and only the turn's final answer on stdout (`keel exec`),
    /// so a script reads the answer alone.
    Answer,
    /// One JSON event per line on stdout; the model's context (system prompt and tool schemas)
    /// summarised unless `requests`.
    Json {
        /// Show each context in full.
        requests: bool,
    },
}

impl Display {
    /// Whether a person reads the transcript (as opposed to a script reading JSON).
    pub fn is_human(self) -> bool {
        !matches!(self, Display::Json { .. })
    }
}

/// How a turn's end reads for a person.
pub fn end_words(end: TurnEnd) -> &'static str {
    match end {
        TurnEnd::Completed => "completed",
        TurnEnd::Interrupted => "interrupted",
        TurnEnd::StepLimit => "stopped at the step limit",
        TurnEnd::LoopGuard => "stopped by the loop guard",
        TurnEnd::Cancelled => "cancelled",
        TurnEnd::ModelError => "the model call failed",
    }
}

/// The last tool result a turn showed, in full, with its tool's name.
pub(crate) type LastResult = std::sync::Arc<std::sync::Mutex<Option<(String, String)>>>;

/// Renders bus events.
pub(crate) struct Printer {
    /// Where the last tool result is kept whole.
    last_result: LastResult,
    /// How many of a result's last lines are shown.
    result_lines: usize,
    in_text: bool,
    /// What the turn waits for now, for the spinner, and since when.
    waiting_for: String,
    since: std::time::Instant,
    /// The last output, so the spinner shows only after a quiet moment.
    last_output: std::time::Instant,
    /// Characters of the model's text in this step, for a rough token count.
    step_chars: usize,
    frame: usize,
    spinner_shown: bool,
    /// Markdown rendering of the model's text, when stdout is a terminal.
    markdown: Option<Markdown>,
    /// A compaction is running: the model's text is its summary, not an answer to show.
    compacting: bool,
    /// `task` calls running: the model's text meanwhile is a subagent's, shown as its steps.
    tasks_running: usize,
}

/// The model's text rendered as Markdown line by line as it streams: headings, emphasis,
/// lists and quotes through termimad, fenced code blocks set apart and coloured by their
/// language's syntax; plain without colour when `NO_COLOR` is set.
struct Markdown {
    skin: termimad::MadSkin,
    colour: bool,
    /// The line being streamed, shown once complete.
    line: String,
    in_fence: bool,
    /// The syntax of the open code block, when its language is known and colour is on.
    code: Option<super::syntax::Highlighter>,
}

impl Markdown {
    fn new() -> Markdown {
        let colour = std::env::var_os("NO_COLOR").is_none();
        let skin = if colour {
            termimad::MadSkin::default()
        } else {
            termimad::MadSkin::no_style()
        };
        Markdown {
            skin,
            colour,
            line: String::new(),
            in_fence: false,
            code: None,
        }
    }

    /// Take `text` in; show every line it completes.
    fn push(&mut self, out: &mut dyn Write, text: &str) {
        for piece in text.split_inclusive('\n') {
            self.line.push_str(piece);
            if self.line.ends_with('\n') {
                self.show_line(out);
            }
        }
    }

    /// Show the line taken in so far (the end of a message).
    fn flush(&mut self, out: &mut dyn Write) {
        if !self.line.is_empty() {
            self.line.push('\n');
            self.show_line(out);
        }
    }

    fn show_line(&mut self, out: &mut dyn Write) {
        let line = std::mem::take(&mut self.line);
        let line = line.trim_end_matches(['\n', '\r']);
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            // A fence: a corner opening the block (with its language), or closing it.
            self.in_fence = !self.in_fence;
            let lang = lang.trim();
            self.code = (self.in_fence && self.colour)
                .then(|| super::syntax::Highlighter::for_language(lang))
                .flatten();
            let corner = if self.in_fence { "┌" } else { "└" };
            let _ = writeln!(out, "  {corner} {lang}");
        } else if self.in_fence {
            match &mut self.code {
                Some(code) => {
                    let _ = writeln!(out, "  │ {}", code.line(line));
                }
                None => {
                    let code = self.skin.inline_code.apply_to(line);
                    let _ = writeln!(out, "  │ {code}");
                }
            }
        } else if line.trim().is_empty() {
            let _ = writeln!(out);
        } else if let Some(item) = ["- ", "* ", "+ "]
            .iter()
            .find_map(|m| line.trim_start().strip_prefix(m))
        {
            let indent = line.len() - line.trim_start().len();
            let _ = writeln!(out, "{}• {}", " ".repeat(indent), self.skin.inline(item));
        } else {
            let _ = write!(out, "{}", self.skin.term_text(line));
        }
        let _ = out.flush();
    }
}

impl Default for Printer {
    fn default() -> Self {
        let now = std::time::Instant::now();
        Printer {
            in_text: false,
            waiting_for: "waiting for the model".into(),
            since: now,
            last_output: now,
            step_chars: 0,
            frame: 0,
            spinner_shown: false,
            markdown: None,
            compacting: false,
            tasks_running: 0,
            last_result: LastResult::default(),
            result_lines: RESULT_LINES,
        }
    }
}

/// A spinner's frames.
const FRAMES: &[&str] = &["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

impl Printer {
    /// A printer for `display`: Markdown is rendered for a person reading stdout on a terminal.
    pub(crate) fn new(display: Display, last_result: LastResult, result_lines: usize) -> Printer {
        use std::io::IsTerminal as _;
        Printer {
            last_result,
            result_lines,
            markdown: (display == Display::Human && std::io::stdout().is_terminal())
                .then(Markdown::new),
            ..Printer::default()
        }
    }

    /// Draw the spinner on stderr if nothing was shown for a moment, no text is mid-line and
    /// no question is open.
    pub(crate) fn spin(&mut self) {
        if self.in_text || self.last_output.elapsed() < std::time::Duration::from_millis(300) {
            return;
        }
        let Some(_terminal) = super::input::terminal_unless_asking() else {
            return;
        };
        self.frame = (self.frame + 1) % FRAMES.len();
        let tokens = if self.step_chars > 0 {
            format!(" · ~{} tokens", self.step_chars.div_ceil(4))
        } else {
            String::new()
        };
        stderr!(
            "\r{} {} · {:.1} s{tokens}\x1b[K",
            FRAMES[self.frame],
            self.waiting_for,
            self.since.elapsed().as_secs_f64()
        );
        crate::std_streams::flush(crate::std_streams::Stream::Stderr);
        self.spinner_shown = true;
    }

    /// Take the spinner off the screen before anything else is shown.
    pub(crate) fn clear_spinner(&mut self) {
        if self.spinner_shown {
            stderr!("\r\x1b[K");
            crate::std_streams::flush(crate::std_streams::Stream::Stderr);
            self.spinner_shown = false;
        }
    }

    /// The turn now waits for `what`.
    fn wait_for(&mut self, what: String) {
        self.waiting_for = what;
        self.since = std::time::Instant::now();
    }

    pub(crate) fn show(&mut self, display: Display, event: &Event) {
        self.last_output = std::time::Instant::now();
        match display {
            Display::Json { requests } => stdoutln!("{}", json_line(event, requests)),
            Display::Human => self.human(
                &mut crate::std_streams::Guarded(crate::std_streams::Stream::Stdout),
                event,
            ),
            Display::Answer => self.human(
                &mut crate::std_streams::Guarded(crate::std_streams::Stream::Stderr),
                event,
            ),
        }
    }

    pub(crate) fn human(&mut self, out: &mut dyn Write, event: &Event) {
        if event.topic == topics::COMPACTION_STATUS {
            let status: serde_json::Value =
                serde_json::from_str(&event.payload).unwrap_or_default();
            let detail = terminal_safe(status["detail"].as_str().unwrap_or_default());
            self.end_text(out);
            if status["state"] == "started" {
                self.compacting = true;
                let _ = writeln!(out, "⏺ compacting the conversation: {detail}");
                self.wait_for("compacting".into());
            } else {
                self.compacting = false;
                let _ = writeln!(out, "  ⎿ {detail}");
            }
            return;
        }
        if event.topic == topics::MODEL_DELTA && (self.compacting || self.tasks_running > 0) {
            return;
        }
        if event.topic == topics::SUBAGENT_EVENT {
            self.subagent(out, &event.payload);
            return;
        }
        if event.topic == topics::MODEL_DELTA {
            match serde_json::from_str::<StreamDelta>(&event.payload) {
                Ok(StreamDelta::Text { text }) => {
                    let text = terminal_safe(&text);
                    self.in_text = true;
                    self.step_chars += text.chars().count();
                    match &mut self.markdown {
                        Some(markdown) => markdown.push(out, &text),
                        None => {
                            let _ = write!(out, "{text}");
                            let _ = out.flush();
                        }
                    }
                }
                Ok(StreamDelta::Retry { attempt, reason }) => {
                    stderrln!("[model: retry {attempt}: {}]", terminal_safe(&reason));
                }
                _ => {}
            }
            return;
        }
        if event.topic == "mcp.progress" {
            self.mcp_progress(out, &event.payload);
            return;
        }
        if event.topic != topics::SESSION_EVENT {
            return;
        }
        let Ok(entry) = serde_json::from_str::<SessionEvent>(&event.payload) else {
            return;
        };
        match entry {
            SessionEvent::Message {
                message:
                    Message {
                        role: keel_protocol::Role::Assistant,
                        content,
                    },
                ..
            } => {
                for (_, name, args) in (Message {
                    role: keel_protocol::Role::Assistant,
                    content,
                })
                .tool_calls()
                {
                    self.end_text(out);
                    if name == "task" {
                        self.tasks_running += 1;
                    }
                    let _ = writeln!(
                        out,
                        "⏺ {} {}",
                        terminal_safe(name),
                        short(&terminal_safe(args), 160)
                    );
                    self.wait_for(format!("running {name}"));
                }
                self.step_chars = 0;
            }
            SessionEvent::ToolOutcome { outcome, .. } => {
                if outcome.tool == "task" {
                    self.tasks_running = self.tasks_running.saturating_sub(1);
                }
                self.wait_for("waiting for the model".into());
                *self
                    .last_result
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((outcome.tool.clone(), outcome.content.clone()));
                let _ = writeln!(out, "  ⎿ {}", outcome_label(&outcome));
                let lines: Vec<&str> = outcome
                    .content
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .collect();
                let hidden = lines.len().saturating_sub(self.result_lines);
                if hidden > 0 {
                    let _ = writeln!(out, "    … {hidden} line(s) above");
                }
                for line in &lines[hidden..] {
                    let _ = writeln!(out, "    {}", short(&terminal_safe(line), 200));
                }
            }
            SessionEvent::Compacted {
                replaced,
                reason,
                tokens_before,
                tokens_after,
                ..
            } => {
                self.compacting = false;
                if reason != "trimmed" {
                    let _ = writeln!(
                        out,
                        "  ⎿ compacted: {replaced} messages replaced by a summary \
                         (about {tokens_before} → {tokens_after} tokens)"
                    );
                }
                self.wait_for("waiting for the model".into());
            }
            SessionEvent::Verdict { verdict, .. } => {
                self.end_text(out);
                let _ = writeln!(
                    out,
                    "✔ verifier: {:?} ({}) {}",
                    verdict.status,
                    terminal_safe(&verdict.dimension),
                    terminal_safe(&verdict.command.unwrap_or_default())
                );
            }
            _ => {}
        }
    }

    /// A subagent's step, one line under its label: its tool calls, their outcomes, its end.
    fn subagent(&mut self, out: &mut dyn Write, payload: &str) {
        let Ok(entry) = serde_json::from_str::<keel_protocol::SubagentEvent>(payload) else {
            return;
        };
        let who = format!("  │ [{} #{}]", terminal_safe(&entry.label), entry.child);
        match &entry.event {
            SessionEvent::Message { message, .. } => {
                for (_, name, args) in message.tool_calls() {
                    self.end_text(out);
                    let _ = writeln!(
                        out,
                        "{who} ⏺ {} {}",
                        terminal_safe(name),
                        short(&terminal_safe(args), 120)
                    );
                }
            }
            SessionEvent::ToolOutcome { outcome, .. } => {
                let _ = writeln!(out, "{who}   ⎿ {}", outcome_label(outcome));
            }
            SessionEvent::TurnEnded { end, .. } => {
                let _ = writeln!(out, "{who} finished ({end:?})");
            }
            _ => {}
        }
    }

    /// End streamed text with a line break before something else is shown.
    fn end_text(&mut self, out: &mut dyn Write) {
        if self.in_text {
            match &mut self.markdown {
                Some(markdown) => markdown.flush(out),
                None => {
                    let _ = writeln!(out);
                }
            }
            self.in_text = false;
        }
    }

    /// A progress notification of an MCP server's tool call: `  ⋯ server/tool 2/5 message`.
    fn mcp_progress(&mut self, out: &mut dyn Write, payload: &str) {
        let Ok(p) = serde_json::from_str::<serde_json::Value>(payload) else {
            return;
        };
        let text = |key: &str| p[key].as_str().map(terminal_safe).unwrap_or_default();
        let number = |key: &str| p[key].as_f64().map(|n| format!("{n}"));
        let amount = match (number("progress"), number("total")) {
            (Some(done), Some(total)) => format!("{done}/{total}"),
            (Some(done), None) => done,
            _ => String::new(),
        };
        self.end_text(out);
        let _ = writeln!(
            out,
            "  ⋯ {}/{} {amount} {}",
            text("server"),
            text("tool"),
            short(&text("message"), 120)
        );
    }

    /// The turn is over: show what is left of its text.
    pub(crate) fn finish(&mut self) {
        if let Some(markdown) = &mut self.markdown {
            markdown.flush(&mut crate::std_streams::Guarded(
                crate::std_streams::Stream::Stdout,
            ));
        }
    }
}

/// `event` as one `--json` line. A context entry (the system prompt and every tool's schema,
/// several KB, logged whenever it changes) is summarised to its size and tool names unless
/// `requests`.
fn json_line(event: &Event, requests: bool) -> serde_json::Value {
    let mut payload: serde_json::Value =
        serde_json::from_str(&event.payload).unwrap_or(serde_json::Value::Null);
    if !requests && event.topic == topics::SESSION_EVENT && payload["kind"] == "context" {
        let system_bytes = payload["system"].as_str().map_or(0, str::len);
        let tools: Vec<serde_json::Value> = payload["tools"]
            .as_array()
            .map(|tools| tools.iter().map(|t| t["name"].clone()).collect())
            .unwrap_or_default();
        payload = serde_json::json!({
            "kind": "context",
            "session": payload["session"],
            "system_bytes": system_bytes,
            "tools": tools,
        });
    }
    serde_json::json!({
        "version": JSON_VERSION,
        "topic": event.topic,
        "source": event.source,
        "event": payload,
    })
}

/// How many of a tool result's last lines the transcript shows unless `[display]
/// result-lines` says otherwise (the model gets all of it; `keel sessions show` replays it).
pub(crate) const RESULT_LINES: usize = 4;

/// What happened to a tool call, in words: a command killed at its timeout or by Ctrl-C, or
/// one that exited non-zero, is not labelled as a plain success.
pub(crate) fn outcome_label(outcome: &keel_protocol::ToolOutcome) -> String {
    use keel_protocol::OutcomeStatus;
    let base = match outcome.status {
        OutcomeStatus::Ok => "ok",
        OutcomeStatus::Error => "failed",
        OutcomeStatus::Refused => "refused",
        OutcomeStatus::NotExecuted => "not run (its arguments were cut off)",
    };
    let Some(last) = outcome.exec.last() else {
        return base.to_owned();
    };
    match (last.timed_out, last.exit_code) {
        (true, _) => "timed out: the command was killed at its timeout".to_owned(),
        (false, None) => "killed: the command did not exit by itself".to_owned(),
        (false, Some(0)) => base.to_owned(),
        // The tool ran; the command it ran failed.
        (false, Some(code)) if outcome.status == OutcomeStatus::Ok => format!("exit code {code}"),
        (false, Some(code)) => format!("{base}: exit code {code}"),
    }
}

/// Text from outside keel (the model, a tool, a plugin's words, a file) made safe to print on
/// a terminal: escape sequences, control characters and invisible characters are removed as
/// the gate that cleans tool output for the model removes them (without its normalising), so
/// nothing shown can move the cursor, retitle the window, hide text or rewrite what was shown.
pub(crate) fn terminal_safe(text: &str) -> String {
    keel_kernel::gates::sanitize::sanitize_for_display(text)
}

/// A file name (or path) from outside keel, made safe to print and kept on one line: escaped as
/// the model sees it in a listing (a newline in a name would make one entry read as two).
pub(crate) fn terminal_safe_name(name: &str) -> String {
    match keel_kernel::gates::sanitize::one_line_name(name) {
        Some(escaped) => terminal_safe(&escaped),
        None => terminal_safe(name),
    }
}

pub(crate) fn short(s: &str, max: usize) -> String {
    let flat = s.replace('\n', " ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{ExecRecord, OutcomeStatus, ToolOutcome};

    fn outcome(status: OutcomeStatus, exec: Option<(Option<i32>, bool)>) -> ToolOutcome {
        ToolOutcome {
            call_id: "c".into(),
            tool: "exec_shell".into(),
            status,
            content: String::new(),
            exec: exec
                .map(|(exit_code, timed_out)| ExecRecord {
                    command: "sleep 9".into(),
                    exit_code,
                    timed_out,
                    sandbox: None,
                })
                .into_iter()
                .collect(),
            spill: None,
        }
    }

    #[test]
    fn a_name_is_shown_on_one_line_as_the_model_sees_it() {
        assert_eq!(terminal_safe_name("src/main.rs"), "src/main.rs");
        assert_eq!(terminal_safe_name("a\nb.txt"), "\"a\\nb.txt\"");
        assert_eq!(terminal_safe_name("x\u{1b}[31my"), "\"x\\u001b[31my\"");
        assert!(!terminal_safe_name("one\rtwo").contains('\r'));
    }

    #[test]
    fn a_result_is_labelled_as_what_happened() {
        let label = |status, exec| outcome_label(&outcome(status, exec));
        assert_eq!(label(OutcomeStatus::Ok, None), "ok");
        assert_eq!(label(OutcomeStatus::Ok, Some((Some(0), false))), "ok");
        assert_eq!(
            label(OutcomeStatus::Ok, Some((Some(2), false))),
            "exit code 2"
        );
        assert!(label(OutcomeStatus::Ok, Some((None, true))).starts_with("timed out"));
        assert!(label(OutcomeStatus::Ok, Some((None, false))).starts_with("killed"));
        assert!(label(OutcomeStatus::Error, Some((None, false))).starts_with("killed"));
        assert_eq!(label(OutcomeStatus::Refused, None), "refused");
        assert_eq!(label(OutcomeStatus::Error, None), "failed");
    }
}
