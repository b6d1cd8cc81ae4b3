//! The session's input. One thread reads everything the person types, one request at a time,
//! so the idle prompt, consent questions and approval questions never race for a line, and a
//! question can stop waiting the moment the turn is cancelled (Ctrl-C at an approval denies at
//! once, without waiting for Enter).
//!
//! On a terminal, `keel run`'s interactive session switches the reader to a line editor
//! (rustyline): arrow keys, history kept per workspace, Tab completion of slash commands and
//! plugin names, and multi-line input (a line ending in `\` continues). Anything else reads
//! plain lines.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Editor, Helper, Highlighter, Hinter};

/// Set by Ctrl-C during a turn, cleared when the next turn starts.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// What a read gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A line (multi-line input joined with line breaks), without its final line break.
    Line(String),
    /// The input ended (Ctrl-D, or a closed pipe).
    End,
    /// Ctrl-C while the line editor read (the terminal is raw then, so no signal comes).
    Interrupted,
    /// The turn was cancelled (Ctrl-C as a signal) while a question waited.
    Cancelled,
    /// Shift-Tab at the prompt: switch plan mode. What was typed so far, to be offered again.
    PlanKey(String),
}

enum Request {
    /// Read one line after `prompt`, starting from `initial`; `remember` adds it to the
    /// history (and marks a request, where Shift-Tab switches plan mode).
    Read {
        prompt: String,
        initial: String,
        remember: bool,
        reply: Sender<Reply>,
    },
    /// From now on read with the line editor.
    Edit {
        history: PathBuf,
        names: Arc<Mutex<Vec<String>>>,
    },
}

/// The reader thread's mailbox, started on first use.
fn reader() -> &'static Mutex<Sender<Request>> {
    static READER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    READER.get_or_init(|| {
        let (tx, rx) = channel();
        std::thread::spawn(move || serve(&rx));
        Mutex::new(tx)
    })
}

fn serve(requests: &Receiver<Request>) {
    let mut editor: Option<(Editor<Completion, DefaultHistory>, PathBuf)> = None;
    while let Ok(request) = requests.recv() {
        match request {
            Request::Edit { history, names } => {
                let Ok(mut ed) = Editor::new() else { continue };
                ed.set_helper(Some(Completion { names }));
                ed.bind_sequence(
                    rustyline::KeyEvent(rustyline::KeyCode::BackTab, rustyline::Modifiers::NONE),
                    rustyline::EventHandler::Conditional(Box::new(PlanKey)),
                );
                let _ = ed.load_history(&history);
                editor = Some((ed, history));
            }
            Request::Read {
                prompt,
                initial,
                remember,
                reply,
            } => {
                let answer = match &mut editor {
                    Some((ed, history)) => match edit_line(ed, &prompt, &initial, remember) {
                        Ok(line) if PLAN_KEY.swap(false, Ordering::SeqCst) => Reply::PlanKey(line),
                        Ok(line) => {
                            let line = line.replace("\\\n", "\n");
                            // Leaving is not worth recalling.
                            let kept = !matches!(line.trim(), "" | "/exit" | "/quit");
                            if remember && kept {
                                let _ = ed.add_history_entry(line.as_str());
                                // Requests can hold what no one else should read.
                                if let Some(dir) = history.parent() {
                                    use std::os::unix::fs::DirBuilderExt as _;
                                    let _ = std::fs::DirBuilder::new()
                                        .recursive(true)
                                        .mode(0o700)
                                        .create(dir);
                                }
                                let _ = ed.append_history(history);
                            }
                            Reply::Line(line)
                        }
                        Err(ReadlineError::Interrupted) => Reply::Interrupted,
                        Err(_) => Reply::End,
                    },
                    None => {
                        stderr!("{prompt}");
                        crate::std_streams::flush(crate::std_streams::Stream::Stderr);
                        let mut line = String::new();
                        match std::io::stdin().lock().read_line(&mut line) {
                            Ok(0) | Err(_) => Reply::End,
                            Ok(_) => Reply::Line(line.trim_end_matches(['\n', '\r']).to_owned()),
                        }
                    }
                };
                let _ = reply.send(answer);
            }
        }
    }
}

/// Set while the line editor reads a request (not an answer to a question): only then does
/// Shift-Tab switch plan mode.
static PROMPTING: AtomicBool = AtomicBool::new(false);
/// Set by Shift-Tab at a request; the line read is then [`Reply::PlanKey`].
static PLAN_KEY: AtomicBool = AtomicBool::new(false);

/// Shift-Tab, as in other agents' terminals: at a request it ends the read so the session can
/// switch plan mode (the text typed so far is kept for the next prompt); elsewhere it does
/// what it always did.
struct PlanKey;

impl rustyline::ConditionalEventHandler for PlanKey {
    fn handle(
        &self,
        _event: &rustyline::Event,
        _n: rustyline::RepeatCount,
        _positive: bool,
        _ctx: &rustyline::EventContext<'_>,
    ) -> Option<rustyline::Cmd> {
        if !PROMPTING.load(Ordering::SeqCst) {
            return None;
        }
        PLAN_KEY.store(true, Ordering::SeqCst);
        Some(rustyline::Cmd::AcceptLine)
    }
}

/// One line from the line editor, `initial` already typed; Shift-Tab acts only on a
/// request (`remember`).
fn edit_line(
    ed: &mut Editor<Completion, DefaultHistory>,
    prompt: &str,
    initial: &str,
    remember: bool,
) -> rustyline::Result<String> {
    PROMPTING.store(remember, Ordering::SeqCst);
    let read = ed.readline_with_initial(prompt, (initial, ""));
    PROMPTING.store(false, Ordering::SeqCst);
    read
}

/// Read the rest of the session with the line editor, its history in `history`; Tab
/// completes slash commands and the plugin names in `names`.
pub(crate) fn use_line_editor(history: PathBuf, names: Arc<Mutex<Vec<String>>>) {
    let _ = reader()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send(Request::Edit { history, names });
}

/// A read whose asker stopped waiting (a question cancelled by Ctrl-C's signal): the reader
/// is still reading it, and what it reads goes to the next asker instead of being lost.
static LEFTOVER: Mutex<Option<Receiver<Reply>>> = Mutex::new(None);

fn ask(prompt: &str, remember: bool) -> Receiver<Reply> {
    ask_from(prompt, "", remember)
}

fn ask_from(prompt: &str, initial: &str, remember: bool) -> Receiver<Reply> {
    if let Some(pending) = LEFTOVER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        return pending;
    }
    let (reply, answer) = channel();
    let sent = reader()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send(Request::Read {
            prompt: prompt.to_owned(),
            initial: initial.to_owned(),
            remember,
            reply: reply.clone(),
        });
    if sent.is_err() {
        let _ = reply.send(Reply::End);
    }
    answer
}

/// The person's next request after `prompt`, remembered in the history, with `initial`
/// already typed (on the line editor; a plain read ignores it).
pub(crate) fn prompt_from(prompt: &str, initial: &str) -> Reply {
    ask_from(prompt, initial, true).recv().unwrap_or(Reply::End)
}

/// An answer to a question, after `prompt`.
pub(crate) fn answer(prompt: &str) -> Reply {
    ask(prompt, false).recv().unwrap_or(Reply::End)
}

/// Who answered a question that could be answered in two places.
pub(crate) enum Answered {
    /// The terminal: what was read (or that the turn was cancelled).
    Here(Reply),
    /// The other place (the web page), with the line its answer stands for.
    Elsewhere(String),
}

/// An answer to a question asked during a turn — [`Reply::Cancelled`] as soon as the turn is
/// cancelled (the line being read then goes to nobody) — or the answer `elsewhere` gives
/// first. The line the terminal is still reading then goes to the next asker, as after
/// Ctrl-C.
pub(crate) fn answer_unless_cancelled_or(
    prompt: &str,
    elsewhere: &dyn Fn() -> Option<String>,
) -> Answered {
    let answer = ask(prompt, false);
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) {
            *LEFTOVER.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
            return Answered::Here(Reply::Cancelled);
        }
        if let Some(line) = elsewhere() {
            *LEFTOVER.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
            return Answered::Elsewhere(line);
        }
        // A question is open only while a person reads it; checking every 25 ms answers
        // Ctrl-C (or the page) well within a keystroke's time.
        match answer.recv_timeout(Duration::from_millis(25)) {
            Ok(reply) => return Answered::Here(reply),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Answered::Here(Reply::End),
        }
    }
}

/// The next line from `answers` (a question put to the web page alone), or `None` once the
/// turn is cancelled or nobody can answer any more.
pub(crate) fn wait_unless_cancelled(answers: &Receiver<String>) -> Option<String> {
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) {
            return None;
        }
        match answers.recv_timeout(Duration::from_millis(25)) {
            Ok(line) => return Some(line),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Ctrl-C pressed in the line editor during a turn (its raw terminal sends no signal).
static CANCEL: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Ask the session to cancel the turn, as Ctrl-C's signal would, and wait until it has (at
/// most a second), so that what the caller answers next — a denial — reaches a turn that is
/// already ending.
pub(crate) fn cancel_turn() {
    CANCEL.notify_one();
    for _ in 0..200 {
        if INTERRUPTED.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The turn was cancelled: open questions stop waiting.
pub(crate) fn interrupt() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Resolves when [`cancel_turn`] asks for the turn to be cancelled.
pub(crate) async fn cancel_requested() {
    CANCEL.notified().await;
}

/// A new turn starts: nothing is cancelled, and a request left from the last turn is dropped.
pub(crate) fn clear_interrupt() {
    INTERRUPTED.store(false, Ordering::SeqCst);
    let stale = std::pin::pin!(CANCEL.notified());
    stale.enable();
}

/// The terminal's status line (the spinner) and questions take turns: a question holds this
/// while it wipes the spinner and is shown, and the spinner draws only while no question is
/// open.
static TERMINAL: Mutex<()> = Mutex::new(());
static ASKING: AtomicBool = AtomicBool::new(false);

/// The terminal, for the spinner to draw on, unless a question is open.
pub(crate) fn terminal_unless_asking() -> Option<std::sync::MutexGuard<'static, ()>> {
    let terminal = TERMINAL.lock().unwrap_or_else(PoisonError::into_inner);
    (!ASKING.load(Ordering::SeqCst)).then_some(terminal)
}

/// A question is on the screen until this is dropped: the spinner is wiped and stays away.
pub(crate) struct Asking(());

/// Open a question (see [`Asking`]).
pub(crate) fn asking() -> Asking {
    let _terminal = TERMINAL.lock().unwrap_or_else(PoisonError::into_inner);
    ASKING.store(true, Ordering::SeqCst);
    stderr!("\r\x1b[K");
    Asking(())
}

impl Drop for Asking {
    fn drop(&mut self) {
        ASKING.store(false, Ordering::SeqCst);
    }
}

/// A question for the turn's printer, and where it says it has shown it.
pub(crate) type Question = (String, std::sync::mpsc::Sender<()>);

/// The running turn's printer, which shows questions in order: after everything the turn
/// emitted before asking (the tool call being asked about comes first, never after).
static PRINTER: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Question>>> = Mutex::new(None);

/// Route questions to a turn's printer (`Some`), or show them directly again (`None`).
pub(crate) fn route_questions(printer: Option<tokio::sync::mpsc::UnboundedSender<Question>>) {
    *PRINTER.lock().unwrap_or_else(PoisonError::into_inner) = printer;
}

/// Show `question` on stderr: through the turn's printer when one runs (waiting at most two
/// seconds for it), otherwise at once.
pub(crate) fn show_question(question: &str) {
    let printer = PRINTER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if let Some(printer) = printer {
        let (shown, done) = channel();
        if printer.send((question.to_owned(), shown)).is_ok()
            && done.recv_timeout(Duration::from_secs(2)).is_ok()
        {
            return;
        }
    }
    stderr!("{question}");
    crate::std_streams::flush(crate::std_streams::Stream::Stderr);
}

/// The slash commands, for completion.
const COMMANDS: &[&str] = &[
    "/help",
    "/plugins",
    "/sessions",
    "/expand",
    "/approvals",
    "/mcp",
    "/compact",
    "/clear",
    "/rewind",
    "/plan",
    "/load ",
    "/unload ",
    "/reload ",
    "/exit",
];

/// Tab completion and multi-line input for the line editor.
#[derive(Helper, Highlighter, Hinter)]
struct Completion {
    names: Arc<Mutex<Vec<String>>>,
}

impl Completer for Completion {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &rustyline::Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let line = &line[..pos];
        let pair = |s: &str| Pair {
            display: s.trim_end().to_owned(),
            replacement: s.to_owned(),
        };
        if let Some((command, partial)) = line.split_once(' ')
            && matches!(command, "/load" | "/unload" | "/reload")
        {
            let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
            let found = names
                .iter()
                .filter(|n| n.starts_with(partial))
                .map(|n| pair(n))
                .collect();
            return Ok((command.len() + 1, found));
        }
        if line.starts_with('/') && !line.contains(' ') {
            let found = COMMANDS
                .iter()
                .filter(|c| c.starts_with(line))
                .map(|c| pair(c))
                .collect();
            return Ok((0, found));
        }
        Ok((pos, Vec::new()))
    }
}

impl Validator for Completion {
    /// A line ending in `\` continues on the next.
    fn validate(&self, ctx: &mut ValidationContext<'_>) -> rustyline::Result<ValidationResult> {
        Ok(if ctx.input().ends_with('\\') {
            ValidationResult::Incomplete
        } else {
            ValidationResult::Valid(None)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(line: &str) -> Vec<String> {
        let names = Arc::new(Mutex::new(vec!["fs-tools".to_owned(), "shell".to_owned()]));
        let c = Completion { names };
        let history = DefaultHistory::new();
        let ctx = rustyline::Context::new(&history);
        c.complete(line, line.len(), &ctx)
            .map(|(_, found)| found.into_iter().map(|p| p.replacement).collect())
            .unwrap_or_default()
    }

    #[test]
    fn tab_completes_commands_and_plugin_names() {
        assert_eq!(complete("/lo"), ["/load "]);
        assert_eq!(complete("/re"), ["/rewind", "/reload "]);
        assert_eq!(complete("/rel"), ["/reload "]);
        assert_eq!(complete("/load fs"), ["fs-tools"]);
        assert_eq!(complete("/unload s"), ["shell"]);
        assert!(complete("hello").is_empty());
    }
}
