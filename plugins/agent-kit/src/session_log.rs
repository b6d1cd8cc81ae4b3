//! The session log's file logic: one append-only JSONL file per session,
//! `<dir>/<session-id>.jsonl`, one [`LogLine`] per line.
//!
//! Reading is never fatal over content: a torn last line (no trailing newline, or unparsable),
//! malformed lines in the middle and lines over [`MAX_LINE_BYTES`] are skipped and reported as
//! [`LogWarning`]s, and a log is read a buffer at a time. Appending first repairs a torn last
//! line ([`LogWriter::open`]); rebuilding a conversation repairs what an interrupted writer
//! left ([`Rebuild`]).

use std::fs::{self, File};
use std::io::{self, BufRead, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use keel_protocol::{Block, LogLine, Message, Role, SessionEvent, ToolDef};

use crate::append::Appender;
use serde::Serialize;

/// The longest session id.
pub const MAX_SESSION_ID_LEN: usize = 64;
/// The file extension of session logs.
pub const LOG_EXTENSION: &str = "jsonl";
/// Chars of the first user message kept in a [`SessionSummary`].
pub const PREVIEW_CHARS: usize = 80;

/// Why a session-log operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The id is not a safe path component.
    #[error(
        "session id {id:?} is not valid: use 1 to 64 of the characters A-Z a-z 0-9 _ - (for example \"20261202-120501-3f9a\")"
    )]
    InvalidSessionId {
        /// The rejected id.
        id: String,
    },
    /// Reading or writing the log file failed.
    #[error("{op} session log {path} failed: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An event could not be serialized (a non-finite number in a tool input, for example).
    #[error("the session event could not be serialized as JSON: {0}")]
    Serialize(#[from] serde_json::Error),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LogError + 'a {
    move |source| LogError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that `id` is 1 to 64 of `[A-Za-z0-9_-]`, so it is safe as a file name.
pub fn validate_session_id(id: &str) -> Result<(), LogError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_SESSION_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LogError::InvalidSessionId { id: id.to_string() })
    }
}

/// A new session id from the current time (ms since the Unix epoch, UTC) and a random value:
/// `YYYYMMDD-HHMMSS-xxxx` with the low 16 bits of `random` in hex.
pub fn new_session_id(time_ms: u64, random: u32) -> String {
    let secs = time_ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}-{:04x}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        random & 0xffff
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The log file of session `id` in `dir`, after validating the id.
pub fn log_path(dir: &Path, id: &str) -> Result<PathBuf, LogError> {
    validate_session_id(id)?;
    Ok(dir.join(format!("{id}.{LOG_EXTENSION}")))
}

/// Borrowing twin of [`LogLine`], so appending does not clone the event.
#[derive(Serialize)]
struct LogLineRef<'a> {
    seq: u64,
    time_ms: u64,
    #[serde(flatten)]
    event: &'a SessionEvent,
}

/// Appends events to one session's log.
#[derive(Debug)]
pub struct LogWriter {
    file: Appender,
    path: PathBuf,
    next_seq: u64,
    buf: Vec<u8>,
}

impl LogWriter {
    /// Opens (creating `dir` and the file as needed) the log of session `id` for appending.
    /// Sequence numbers continue after the last complete entry. A torn last line (an
    /// interrupted writer, a full disk) is repaired before anything is appended: completed
    /// with a newline when it parses as a whole entry, cut off otherwise, so every line
    /// before the end of the file is whole and nothing is ever written after a torn line.
    pub fn open(dir: &Path, id: &str) -> Result<LogWriter, LogError> {
        let path = log_path(dir, id)?;
        fs::create_dir_all(dir).map_err(io_err("creating the directory of", dir))?;
        let mut file = Appender::open(&path).map_err(io_err("opening", &path))?;
        // Scanned through a read-only handle: reading through an append-mode handle sees
        // nothing inside a WASI guest.
        let mut reader = File::open(&path).map_err(io_err("opening", &path))?;
        let tail = scan_tail(&mut reader).map_err(io_err("reading", &path))?;
        let mut next_seq = match (&tail.torn, tail.last_seq) {
            (Some(Torn::Whole(line)), _) => Some(line.seq + 1),
            (_, Some(seq)) => Some(seq + 1),
            (_, None) => None,
        };
        match &tail.torn {
            None => {}
            Some(Torn::Whole(_)) => file.append(b"\n").map_err(io_err("repairing", &path))?,
            Some(Torn::Partial { keep }) => file
                .truncate(*keep)
                .map_err(io_err("cutting the torn last line of", &path))?,
        }
        if next_seq.is_none() && tail.size > 0 && !tail.whole_file {
            // Nothing parsable in the tail window: count through the whole file.
            let mut last = None;
            let file = File::open(&path).map_err(io_err("opening", &path))?;
            scan_entries(file, |item| {
                if let Item::Entry(line) = item {
                    last = Some(line.seq);
                }
            })
            .map_err(io_err("reading", &path))?;
            next_seq = last.map(|seq| seq + 1);
        }
        Ok(LogWriter {
            file,
            path,
            next_seq: next_seq.unwrap_or(0),
            buf: Vec::with_capacity(1024),
        })
    }

    /// The sequence number the next entry gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event stamped `time_ms` (ms since the Unix epoch) as one line, written with
    /// a single write and flushed; returns its sequence number.
    pub fn append(&mut self, time_ms: u64, event: &SessionEvent) -> Result<u64, LogError> {
        self.buf.clear();
        let seq = self.encode(time_ms, event)?;
        self.file
            .append(&self.buf)
            .map_err(io_err("appending to", &self.path))?;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Puts what was appended on the disk (`fdatasync`): called where a turn ends, so a power
    /// loss costs at most the turn in flight.
    pub fn sync(&mut self) -> Result<(), LogError> {
        self.file.sync().map_err(io_err("syncing", &self.path))
    }

    /// Appends several events with one write; returns the first one's sequence number.
    pub fn append_all<'a>(
        &mut self,
        time_ms: u64,
        events: impl IntoIterator<Item = &'a SessionEvent>,
    ) -> Result<u64, LogError> {
        self.buf.clear();
        let first = self.next_seq;
        let mut count = 0;
        for event in events {
            self.encode_at(first + count, time_ms, event)?;
            count += 1;
        }
        self.file
            .append(&self.buf)
            .map_err(io_err("appending to", &self.path))?;
        self.next_seq += count;
        Ok(first)
    }

    fn encode(&mut self, time_ms: u64, event: &SessionEvent) -> Result<u64, LogError> {
        let seq = self.next_seq;
        self.encode_at(seq, time_ms, event)?;
        Ok(seq)
    }

    fn encode_at(&mut self, seq: u64, time_ms: u64, event: &SessionEvent) -> Result<(), LogError> {
        let line = LogLineRef {
            seq,
            time_ms,
            event,
        };
        serde_json::to_writer(&mut self.buf, &line)?;
        self.buf.push(b'\n');
        Ok(())
    }
}

/// What follows the file's last newline.
enum Torn {
    /// A whole entry that only lacks its newline.
    Whole(LogLine),
    /// Part of a line: the file is cut back to `keep` bytes (just after the last newline).
    Partial { keep: u64 },
}

struct Tail {
    size: u64,
    /// The last complete line's seq within the scanned window.
    last_seq: Option<u64>,
    torn: Option<Torn>,
    whole_file: bool,
}

const TAIL_WINDOW: u64 = 256 * 1024;

fn scan_tail(file: &mut File) -> io::Result<Tail> {
    let size = file.metadata()?.len();
    let start = size.saturating_sub(TAIL_WINDOW);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::with_capacity((size - start) as usize);
    file.read_to_end(&mut bytes)?;
    let mut complete: &[u8] = &bytes;
    let mut torn = None;
    if bytes.last().is_some_and(|&b| b != b'\n') {
        let keep = match bytes.iter().rposition(|&b| b == b'\n') {
            Some(i) => Some(start + i as u64 + 1),
            None if start == 0 => Some(0),
            // A torn line longer than the window: find where it began.
            None => last_newline_before(file, start)?.map(|i| i + 1).or(Some(0)),
        };
        let cut = keep.map_or(0, |k| k.saturating_sub(start) as usize);
        torn = Some(match serde_json::from_slice::<LogLine>(&bytes[cut..]) {
            Ok(line) if keep.is_some_and(|k| k >= start) => Torn::Whole(line),
            _ => Torn::Partial {
                keep: keep.unwrap_or(0),
            },
        });
        complete = &bytes[..cut];
    }
    // The first line of a window that starts mid-file may be partial: it just fails to parse.
    let last_seq = complete
        .split(|&b| b == b'\n')
        .rev()
        .filter(|l| !l.is_empty())
        .find_map(|l| serde_json::from_slice::<LogLine>(l).ok())
        .map(|l| l.seq);
    Ok(Tail {
        size,
        last_seq,
        torn,
        whole_file: start == 0,
    })
}

/// The offset of the last newline before `end`, reading backwards a window at a time.
fn last_newline_before(file: &mut File, mut end: u64) -> io::Result<Option<u64>> {
    let mut buf = vec![0u8; TAIL_WINDOW as usize];
    while end > 0 {
        let start = end.saturating_sub(TAIL_WINDOW);
        let len = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..len])?;
        if let Some(i) = buf[..len].iter().rposition(|&b| b == b'\n') {
            return Ok(Some(start + i as u64));
        }
        end = start;
    }
    Ok(None)
}

pub use keel_protocol::{LogRead, LogWarning, SessionSummary};

/// The longest line read back. A longer one is skipped with a warning and never held in
/// memory whole, so one huge line (a runaway tool output, a corrupted file) cannot make a
/// log, or the listing of every log, unreadable.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// How much of a log a scan reads at a time.
const SCAN_BUFFER: usize = 1 << 20;

/// One line of a log as a scan meets it.
#[derive(Debug)]
pub(crate) enum Item {
    /// An entry that parsed.
    Entry(LogLine),
    /// A line that was skipped, and why.
    Skipped(LogWarning),
}

/// Reads a log from `reader` a buffer at a time, handing each entry or skipped line to
/// `each`; memory stays within [`MAX_LINE_BYTES`] and a buffer whatever the file holds.
pub(crate) fn scan_entries(reader: impl Read, each: impl FnMut(Item)) -> io::Result<()> {
    scan_entries_bounded(reader, MAX_LINE_BYTES, each)
}

fn scan_entries_bounded(
    reader: impl Read,
    max_line: usize,
    mut each: impl FnMut(Item),
) -> io::Result<()> {
    let mut scan = Scan {
        line: Vec::new(),
        oversized: None,
        number: 0,
        unparsed: None,
        max_line,
    };
    // A large buffer and `memchr`: a giant line (1 GiB of a runaway output) is skipped in a
    // few thousand reads, a word at a time, within a guest's CPU bound.
    let mut reader = io::BufReader::with_capacity(SCAN_BUFFER, reader);
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        let (piece, used, ends) = match memchr::memchr(b'\n', buf) {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        scan.take(piece);
        reader.consume(used);
        if ends {
            scan.end_line(&mut each);
        }
    }
    scan.finish(&mut each);
    Ok(())
}

/// The state of [`scan_entries`] between buffers.
struct Scan {
    /// The current line so far (empty once it is known to be over the bound).
    line: Vec<u8>,
    /// The current line's length, once it passed the bound.
    oversized: Option<u64>,
    /// 1-based number of the current line.
    number: usize,
    /// A line that did not parse: malformed if anything follows it, torn if it was the last.
    unparsed: Option<(usize, String)>,
    max_line: usize,
}

impl Scan {
    fn take(&mut self, piece: &[u8]) {
        if let Some(len) = &mut self.oversized {
            *len += piece.len() as u64;
        } else if self.line.len() + piece.len() > self.max_line {
            self.oversized = Some((self.line.len() + piece.len()) as u64);
            self.line = Vec::new();
        } else {
            self.line.extend_from_slice(piece);
        }
    }

    /// The previous unparsable line was not the last one.
    fn flush_unparsed(&mut self, each: &mut impl FnMut(Item)) {
        if let Some((line, error)) = self.unparsed.take() {
            each(Item::Skipped(LogWarning {
                line,
                message: format!("malformed line skipped: {error}"),
            }));
        }
    }

    fn end_line(&mut self, each: &mut impl FnMut(Item)) {
        self.number += 1;
        let line = std::mem::take(&mut self.line);
        if let Some(len) = self.oversized.take() {
            self.flush_unparsed(each);
            each(Item::Skipped(LogWarning {
                line: self.number,
                message: format!(
                    "line of {len} bytes skipped: it is longer than the {} bytes a log line \
                     may be",
                    self.max_line
                ),
            }));
            return;
        }
        let text = line.strip_suffix(b"\r").unwrap_or(&line);
        if text.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        self.flush_unparsed(each);
        match serde_json::from_slice::<LogLine>(text) {
            Ok(entry) => each(Item::Entry(entry)),
            Err(e) => self.unparsed = Some((self.number, e.to_string())),
        }
        self.line = line;
        self.line.clear();
    }

    fn finish(mut self, each: &mut impl FnMut(Item)) {
        let len = match self.oversized {
            Some(len) => Some(len),
            None if self.line.iter().all(u8::is_ascii_whitespace) => None,
            // A whole entry that only lacks its newline is kept, as the writer keeps it.
            None => match serde_json::from_slice::<LogLine>(&self.line) {
                Ok(entry) => {
                    self.flush_unparsed(each);
                    each(Item::Entry(entry));
                    None
                }
                Err(_) => Some(self.line.len() as u64),
            },
        };
        match len {
            Some(len) => {
                self.flush_unparsed(each);
                each(Item::Skipped(LogWarning {
                    line: self.number + 1,
                    message: format!(
                        "torn last line ({len} bytes without a trailing newline) skipped; the \
                         writer was probably interrupted"
                    ),
                }));
            }
            None => {
                if let Some((line, error)) = self.unparsed.take() {
                    each(Item::Skipped(LogWarning {
                        line,
                        message: format!("torn last line skipped: {error}"),
                    }));
                }
            }
        }
    }
}

/// Parses the content of a log file.
pub fn parse_log(bytes: &[u8]) -> LogRead {
    let mut read = LogRead::default();
    // Reading from a slice cannot fail.
    let _ = scan_entries(bytes, |item| add(&mut read, item));
    read
}

/// Files `item` in `read`.
fn add(read: &mut LogRead, item: Item) {
    match item {
        Item::Entry(line) => read.lines.push(line),
        Item::Skipped(warning) => read.warnings.push(warning),
    }
}

/// Reads and parses the log file at `path`, a line at a time.
pub fn read_log_file(path: &Path) -> Result<LogRead, LogError> {
    let file = File::open(path).map_err(io_err("reading", path))?;
    let mut read = LogRead::default();
    scan_entries(file, |item| add(&mut read, item)).map_err(io_err("reading", path))?;
    Ok(read)
}

/// Reads and parses the log of session `id` in `dir`.
pub fn read_log(dir: &Path, id: &str) -> Result<LogRead, LogError> {
    read_log_file(&log_path(dir, id)?)
}

/// Rebuilds the conversation of session `id` in `dir` as the log is read, without keeping
/// its entries; the warnings of lines skipped.
pub fn read_conversation(
    dir: &Path,
    id: &str,
) -> Result<(Conversation, Vec<LogWarning>), LogError> {
    let path = log_path(dir, id)?;
    let file = File::open(&path).map_err(io_err("reading", &path))?;
    let mut rebuild = Rebuild::default();
    let mut warnings = Vec::new();
    scan_entries(file, |item| match item {
        Item::Entry(line) => rebuild.push(&line),
        Item::Skipped(warning) => warnings.push(warning),
    })
    .map_err(io_err("reading", &path))?;
    Ok((rebuild.finish(), warnings))
}

/// The most of one log `list` reads from its start; past it, only the last [`TAIL_WINDOW`]
/// is read too (for the latest activity), so one huge log costs the listing little.
pub const LIST_SCAN_BYTES: u64 = 32 << 20;

/// The summary of the log at `path`, read a line at a time: its first [`LIST_SCAN_BYTES`]
/// and, for a longer log, its tail.
fn summarize(id: &str, path: &Path) -> SessionSummary {
    let mut summary = SessionSummary {
        id: id.to_owned(),
        first_time_ms: None,
        last_time_ms: None,
        entries: 0,
        preview: None,
        workspace: None,
        warnings: 0,
        error: None,
    };
    let take = |item: Item, summary: &mut SessionSummary| match item {
        Item::Entry(line) => {
            summary.entries += 1;
            summary.first_time_ms.get_or_insert(line.time_ms);
            summary.last_time_ms = summary.last_time_ms.max(Some(line.time_ms));
            if summary.workspace.is_none()
                && let SessionEvent::SessionStarted { workspace, .. } = &line.event
            {
                summary.workspace = Some(workspace.clone());
            }
            if summary.preview.is_none() {
                summary.preview = first_user_text(std::slice::from_ref(&line))
                    .map(|t| crate::text::preview(&t, PREVIEW_CHARS));
            }
        }
        Item::Skipped(_) => summary.warnings += 1,
    };
    let scanned = File::open(path).and_then(|mut file| {
        let size = file.metadata()?.len();
        scan_entries((&mut file).take(LIST_SCAN_BYTES), |item| {
            take(item, &mut summary)
        })?;
        if size > LIST_SCAN_BYTES {
            // The window's first line is likely partial: only whole entries count.
            let start = size.saturating_sub(TAIL_WINDOW).max(LIST_SCAN_BYTES);
            file.seek(SeekFrom::Start(start))?;
            scan_entries(file, |item| {
                if let Item::Entry(_) = item {
                    take(item, &mut summary);
                }
            })?;
            summary.error = Some(format!(
                "only the first {} MiB and the last {} KiB of this {} MiB log were read for \
                 the listing",
                LIST_SCAN_BYTES >> 20,
                TAIL_WINDOW >> 10,
                size >> 20
            ));
        }
        Ok(())
    });
    if let Err(e) = scanned {
        summary.error = Some(io_err("reading", path)(e).to_string());
    }
    summary
}

/// The sessions logged in `dir`, most recently active first. Files whose name is not a valid
/// session id are ignored; a missing directory is an empty list; a log that cannot be read is
/// listed with its error, never hiding the others.
pub fn list(dir: &Path) -> Result<Vec<SessionSummary>, LogError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("listing", dir)(e)),
    };
    let mut sessions = Vec::new();
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_suffix(&format!(".{LOG_EXTENSION}")) else {
            continue;
        };
        if validate_session_id(id).is_err() {
            continue;
        }
        sessions.push(summarize(id, &entry.path()));
    }
    sessions.sort_by(|a, b| {
        b.last_time_ms
            .cmp(&a.last_time_ms)
            .then_with(|| a.id.cmp(&b.id))
    });
    Ok(sessions)
}

fn first_user_text(lines: &[LogLine]) -> Option<String> {
    lines.iter().find_map(|l| match &l.event {
        SessionEvent::Message { message, .. } if message.role == Role::User => {
            let text = message.text();
            (!text.trim().is_empty()).then_some(text)
        }
        _ => None,
    })
}

/// The system prompt and tools of the latest `Context` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextSnapshot {
    /// The system prompt.
    pub system: String,
    /// The tools offered.
    pub tools: Vec<ToolDef>,
}

/// What the next model request would carry, rebuilt from a log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    /// The messages, oldest first; every tool call is followed by its result in the next
    /// message, and every result follows its call (see [`Rebuild`]).
    pub messages: Vec<Message>,
    /// The latest context, if any was logged.
    pub context: Option<ContextSnapshot>,
    /// The context window a provider's refusal showed, as the latest compaction that knew one
    /// recorded it.
    pub context_window: Option<u64>,
    /// What the rebuild had to mend, in words (empty for a log written whole).
    pub repairs: Vec<String>,
    /// The results made up for calls at the log's end that have none (keel stopped between a
    /// model's answer and its results): already the last message of `messages`. A resume
    /// appends it to the log, so the log itself then holds a valid conversation.
    pub tail_repair: Option<Message>,
}

/// The result of a tool call that keel stopped before it could record: the log records that
/// it started (or is from a keel that did not record starts).
pub const INTERRUPTED_CALL: &str = "[keel] interrupted: keel stopped (it was killed, crashed or \
    could not write its log) after the model asked for this call and before its result was \
    recorded. It may have run, in whole or in part: check its effects before running it again.";

/// The result of a tool call the log shows was never started: the agent loop records a start
/// (`tool_started`, written before the call runs) and this call has none.
pub const NOT_STARTED_CALL: &str = "[keel] not executed: keel stopped after the model asked for \
    this call and before it started; the call did not run.";

/// The result of a call from an answer cut at the output limit, which the kernel never runs.
pub const CUT_OFF_CALL: &str = "[keel] not executed: the answer asking for this call was cut \
    at the output limit, and keel stopped before recording a result; the call did not run.";

/// Rebuilds a conversation entry by entry, repairing what an interrupted writer left so the
/// result is always a request both wire formats accept:
/// - a tool call whose result is missing (keel was killed between the model's answer and the
///   results, or the results' line was torn) gets one: the outcome the log recorded for it if
///   there is one, otherwise [`INTERRUPTED_CALL`] when it may have run, [`NOT_STARTED_CALL`]
///   when the log records starts and none for it (or [`CUT_OFF_CALL`] when the kernel cannot
///   have run it), in the message right after the call, before any text there;
/// - a tool result whose call is not in the message before it (that message was lost) becomes
///   text, since providers refuse a result without its call.
///
/// Repairs happen where the entry stands, before a later `Compacted` entry is applied, so the
/// counts that entry carries still line up.
#[derive(Debug, Default)]
pub struct Rebuild {
    conversation: Conversation,
    /// The calls of the last message, when it is the model's and has calls, in order.
    pending: Vec<String>,
    /// Whether that message was cut at the output limit.
    pending_cut_off: bool,
    /// Outcomes the log recorded for pending calls.
    outcomes: Vec<keel_protocol::ToolOutcome>,
    /// Whether the log records the start of calls (`tool_started`): then a call without one
    /// never started.
    records_starts: bool,
    /// Pending calls the log records as started.
    started: Vec<String>,
    /// Calls recorded as started before the message asking for them (the start is written at
    /// once, the message may still have been queued for the log).
    started_ahead: Vec<String>,
}

impl Rebuild {
    /// Takes in one entry.
    pub fn push(&mut self, line: &LogLine) {
        match &line.event {
            SessionEvent::Message {
                message,
                stop_reason,
                ..
            } => {
                let message = if self.pending.is_empty() {
                    self.without_orphans(message.clone(), line.seq)
                } else if message.role == Role::User {
                    self.answer_pending(message.clone(), line.seq)
                } else {
                    self.close_pending(line.seq);
                    message.clone()
                };
                if message.role == Role::Assistant {
                    self.pending = message
                        .tool_calls()
                        .map(|(id, _, _)| id.to_owned())
                        .collect();
                    let ahead = std::mem::take(&mut self.started_ahead);
                    self.started = ahead
                        .into_iter()
                        .filter(|id| self.pending.contains(id))
                        .collect();
                    self.pending_cut_off =
                        *stop_reason == Some(keel_protocol::StopReason::MaxTokens);
                }
                self.conversation.messages.push(message);
            }
            SessionEvent::ToolOutcome { outcome, .. }
                if self.pending.contains(&outcome.call_id) =>
            {
                self.outcomes.push(outcome.clone());
            }
            SessionEvent::ToolStarted { calls, .. } => {
                self.records_starts = true;
                for id in calls {
                    if self.pending.contains(id) {
                        self.started.push(id.clone());
                    } else {
                        self.started_ahead.push(id.clone());
                    }
                }
            }
            // Where the agent loop compacted, the conversation it went on with.
            SessionEvent::Compacted {
                replaced,
                summary,
                context_window,
                ..
            } => {
                self.close_pending(line.seq);
                if context_window.is_some() {
                    self.conversation.context_window = *context_window;
                }
                self.conversation.messages =
                    crate::compaction::apply(&self.conversation.messages, *replaced, summary);
            }
            // Where the person rewound the conversation, the start it went on from.
            SessionEvent::Rewound { keep, .. } => {
                self.close_pending(line.seq);
                self.outcomes.clear();
                self.started.clear();
                self.started_ahead.clear();
                self.conversation.messages.truncate(*keep);
                self.conversation.tail_repair = None;
            }
            SessionEvent::Context { system, tools, .. } => {
                self.conversation.context = Some(ContextSnapshot {
                    system: system.clone(),
                    tools: tools.clone(),
                });
            }
            _ => {}
        }
    }

    /// How many messages the conversation rebuilt so far holds.
    pub fn messages(&self) -> usize {
        self.conversation.messages.len()
    }

    /// The conversation, its last calls answered.
    pub fn finish(mut self) -> Conversation {
        if !self.pending.is_empty() {
            self.close_pending(u64::MAX);
            self.conversation.tail_repair = self.conversation.messages.last().cloned();
        }
        self.conversation
    }

    /// The result block for pending call `id`, which has none in the log's messages.
    fn made_up_result(&mut self, id: &str) -> Block {
        if let Some(outcome) = self.outcomes.iter().find(|o| o.call_id == id) {
            return Block::ToolResult {
                call_id: id.to_owned(),
                content: outcome.content.clone(),
                is_error: outcome.is_error(),
            };
        }
        Block::ToolResult {
            call_id: id.to_owned(),
            content: if self.pending_cut_off {
                CUT_OFF_CALL
            } else if self.records_starts && !self.started.iter().any(|s| s == id) {
                NOT_STARTED_CALL
            } else {
                INTERRUPTED_CALL
            }
            .to_owned(),
            is_error: true,
        }
    }

    /// The pending calls get their results in a message of their own (the next message is
    /// the model's, or there is none).
    fn close_pending(&mut self, seq: u64) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let content: Vec<Block> = pending.iter().map(|id| self.made_up_result(id)).collect();
        self.note(seq, &pending, &content);
        self.outcomes.clear();
        self.started.clear();
        self.conversation.messages.push(Message {
            role: Role::User,
            content,
        });
    }

    /// `message` (the person's side, after the model's calls) with a result for each call:
    /// its own where it has one, made up otherwise, all before its other blocks.
    fn answer_pending(&mut self, message: Message, seq: u64) -> Message {
        let pending = std::mem::take(&mut self.pending);
        let answered = |id: &str| {
            message
                .content
                .iter()
                .any(|b| matches!(b, Block::ToolResult { call_id, .. } if call_id == id))
        };
        let missing: Vec<String> = pending.iter().filter(|id| !answered(id)).cloned().collect();
        let orphans = message
            .content
            .iter()
            .any(|b| matches!(b, Block::ToolResult { call_id, .. } if !pending.contains(call_id)));
        let in_order = message
            .content
            .iter()
            .take_while(|b| matches!(b, Block::ToolResult { .. }))
            .count()
            == message
                .content
                .iter()
                .filter(|b| matches!(b, Block::ToolResult { .. }))
                .count();
        if missing.is_empty() && !orphans && in_order {
            self.outcomes.clear();
            self.started.clear();
            return message;
        }
        let mut results = Vec::new();
        let mut rest = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for block in message.content {
            match block {
                Block::ToolResult { ref call_id, .. }
                    if pending.contains(call_id) && !seen.contains(call_id) =>
                {
                    seen.push(call_id.clone());
                    results.push(block);
                }
                Block::ToolResult {
                    call_id, content, ..
                } => rest.push(orphan_text(&call_id, &content)),
                other => rest.push(other),
            }
        }
        let made: Vec<Block> = missing.iter().map(|id| self.made_up_result(id)).collect();
        self.note(seq, &missing, &made);
        self.outcomes.clear();
        self.started.clear();
        results.extend(made);
        results.extend(rest);
        Message {
            role: message.role,
            content: results,
        }
    }

    /// `message` with any tool result (no call precedes it here) turned into text.
    fn without_orphans(&mut self, message: Message, seq: u64) -> Message {
        if !message
            .content
            .iter()
            .any(|b| matches!(b, Block::ToolResult { .. }))
        {
            return message;
        }
        self.conversation.repairs.push(format!(
            "entry {seq}: tool results without their call (its entry was lost) kept as text"
        ));
        Message {
            role: message.role,
            content: message
                .content
                .into_iter()
                .map(|b| match b {
                    Block::ToolResult {
                        call_id, content, ..
                    } => orphan_text(&call_id, &content),
                    other => other,
                })
                .collect(),
        }
    }

    fn note(&mut self, seq: u64, ids: &[String], made: &[Block]) {
        if ids.is_empty() {
            return;
        }
        let recorded = made
            .iter()
            .filter(|b| {
                matches!(b, Block::ToolResult { content, .. }
                    if content != INTERRUPTED_CALL
                        && content != CUT_OFF_CALL
                        && content != NOT_STARTED_CALL)
            })
            .count();
        let at = if seq == u64::MAX {
            "at the end of the log".to_owned()
        } else {
            format!("before entry {seq}")
        };
        self.conversation.repairs.push(format!(
            "{at}: {} tool call(s) without a result in the conversation ({}); {recorded} \
             answered with the outcome the log recorded, the others marked not started or \
             interrupted",
            ids.len(),
            ids.join(", ")
        ));
    }
}

/// A tool result whose call is lost, as text.
fn orphan_text(call_id: &str, content: &str) -> Block {
    Block::Text {
        text: format!(
            "[keel] the result of tool call {call_id}, whose request is lost from the log:\n{content}"
        ),
    }
}

/// Rebuilds the conversation from `Message` entries (and `Compacted` ones, where they stand),
/// and takes the latest `Context`; repaired as [`Rebuild`] says.
pub fn conversation(lines: &[LogLine]) -> Conversation {
    let mut rebuild = Rebuild::default();
    for line in lines {
        rebuild.push(line);
    }
    rebuild.finish()
}

#[cfg(test)]
#[path = "session_log_tests.rs"]
mod tests;
