//! The session log's file logic: one append-only JSONL file per session,
//! `<dir>/<session-id>.jsonl`, one [`LogLine`] per line.
//!
//! Reading is never fatal over content: a torn last line (no trailing newline, or unparsable)
//! and malformed lines in the middle are skipped and reported as [`LogWarning`]s.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use keel_protocol::{LogLine, Message, Role, SessionEvent, ToolDef};

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
    /// Sequence numbers continue after the last complete entry. A torn last line is completed
    /// with a newline: kept as an entry when it parses, otherwise left as a skipped line.
    pub fn open(dir: &Path, id: &str) -> Result<LogWriter, LogError> {
        let path = log_path(dir, id)?;
        fs::create_dir_all(dir).map_err(io_err("creating the directory of", dir))?;
        let mut file = Appender::open(&path).map_err(io_err("opening", &path))?;
        // Scanned through a read-only handle: reading through an append-mode handle sees
        // nothing inside a WASI guest.
        let mut reader = File::open(&path).map_err(io_err("opening", &path))?;
        let tail = scan_tail(&mut reader).map_err(io_err("reading", &path))?;
        let next_seq = match (&tail.torn, tail.last_seq) {
            (Some(line), _) => line.seq + 1,
            (None, Some(seq)) => seq + 1,
            (None, None) if tail.size > 0 && !tail.whole_file => {
                // Nothing parsable in the tail window: count the whole file.
                read_log_file(&path)?.lines.last().map_or(0, |l| l.seq + 1)
            }
            (None, None) => 0,
        };
        if tail.needs_newline {
            file.append(b"\n").map_err(io_err("repairing", &path))?;
        }
        Ok(LogWriter {
            file,
            path,
            next_seq,
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

struct Tail {
    size: u64,
    /// The last complete line's seq within the scanned window.
    last_seq: Option<u64>,
    /// A final line without newline that still parses.
    torn: Option<LogLine>,
    needs_newline: bool,
    whole_file: bool,
}

const TAIL_WINDOW: u64 = 256 * 1024;

fn scan_tail(file: &mut File) -> io::Result<Tail> {
    let size = file.metadata()?.len();
    let start = size.saturating_sub(TAIL_WINDOW);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::with_capacity((size - start) as usize);
    file.read_to_end(&mut bytes)?;
    let needs_newline = bytes.last().is_some_and(|&b| b != b'\n');
    let mut complete: &[u8] = &bytes;
    let mut torn = None;
    if needs_newline {
        let cut = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        torn = serde_json::from_slice::<LogLine>(&bytes[cut..]).ok();
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
        needs_newline,
        whole_file: start == 0,
    })
}

/// A problem found while reading a log; the line was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogWarning {
    /// 1-based line number in the file.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

/// The entries of a log, and what had to be skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogRead {
    /// The entries that parsed, in file order.
    pub lines: Vec<LogLine>,
    /// The lines that were skipped.
    pub warnings: Vec<LogWarning>,
}

/// Parses the content of a log file.
pub fn parse_log(bytes: &[u8]) -> LogRead {
    let mut read = LogRead::default();
    let mut rest = bytes;
    let mut number = 0;
    while !rest.is_empty() {
        number += 1;
        let (line, terminated) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                let line = &rest[..i];
                rest = &rest[i + 1..];
                (line, true)
            }
            None => {
                let line = rest;
                rest = &[];
                (line, false)
            }
        };
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if !terminated {
            read.warnings.push(LogWarning {
                line: number,
                message: format!(
                    "torn last line ({} bytes without a trailing newline) skipped; the writer was probably interrupted",
                    line.len()
                ),
            });
            break;
        }
        match serde_json::from_slice::<LogLine>(line) {
            Ok(entry) => read.lines.push(entry),
            Err(e) => {
                let last = rest.iter().all(u8::is_ascii_whitespace);
                let what = if last {
                    "torn last line"
                } else {
                    "malformed line"
                };
                read.warnings.push(LogWarning {
                    line: number,
                    message: format!("{what} skipped: {e}"),
                });
            }
        }
    }
    read
}

/// Reads and parses the log file at `path`.
pub fn read_log_file(path: &Path) -> Result<LogRead, LogError> {
    let bytes = fs::read(path).map_err(io_err("reading", path))?;
    Ok(parse_log(&bytes))
}

/// Reads and parses the log of session `id` in `dir`.
pub fn read_log(dir: &Path, id: &str) -> Result<LogRead, LogError> {
    read_log_file(&log_path(dir, id)?)
}

/// One session as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionSummary {
    /// The session id.
    pub id: String,
    /// Time of the first entry (ms since the Unix epoch), if any.
    pub first_time_ms: Option<u64>,
    /// Time of the last entry, if any.
    pub last_time_ms: Option<u64>,
    /// Entries that parsed.
    pub entries: usize,
    /// The start of the first user message, flattened to one line.
    pub preview: Option<String>,
    /// Lines skipped while reading.
    pub warnings: usize,
}

/// The sessions logged in `dir`, most recently active first. Files whose name is not a valid
/// session id are ignored; a missing directory is an empty list.
pub fn list(dir: &Path) -> Result<Vec<SessionSummary>, LogError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("listing", dir)(e)),
    };
    let mut sessions = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("listing", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_suffix(&format!(".{LOG_EXTENSION}")) else {
            continue;
        };
        if validate_session_id(id).is_err() {
            continue;
        }
        let read = read_log_file(&entry.path())?;
        sessions.push(SessionSummary {
            id: id.to_string(),
            first_time_ms: read.lines.first().map(|l| l.time_ms),
            last_time_ms: read.lines.iter().map(|l| l.time_ms).max(),
            entries: read.lines.len(),
            preview: first_user_text(&read.lines).map(|t| crate::text::preview(&t, PREVIEW_CHARS)),
            warnings: read.warnings.len(),
        });
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
    /// The messages, oldest first.
    pub messages: Vec<Message>,
    /// The latest context, if any was logged.
    pub context: Option<ContextSnapshot>,
}

/// Rebuilds the conversation from `Message` entries (and `Compacted` ones, where they stand),
/// and takes the latest `Context`.
pub fn conversation(lines: &[LogLine]) -> Conversation {
    let mut conversation = Conversation::default();
    for line in lines {
        match &line.event {
            SessionEvent::Message { message, .. } => conversation.messages.push(message.clone()),
            // Where the agent loop compacted, the conversation it went on with.
            SessionEvent::Compacted {
                replaced, summary, ..
            } => {
                conversation.messages =
                    crate::compaction::apply(&conversation.messages, *replaced, summary);
            }
            SessionEvent::Context { system, tools, .. } => {
                conversation.context = Some(ContextSnapshot {
                    system: system.clone(),
                    tools: tools.clone(),
                });
            }
            _ => {}
        }
    }
    conversation
}

#[cfg(test)]
#[path = "session_log_tests.rs"]
mod tests;
