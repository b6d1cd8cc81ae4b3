//! The session's input: every line the person types is read on one thread for the whole
//! process and handed out in order, so the idle prompt, consent questions and approval
//! questions never race for a line, and a question can stop waiting the moment the turn is
//! cancelled (Ctrl-C at an approval denies at once, without waiting for Enter).

use std::io::BufRead as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// Set by Ctrl-C during a turn, cleared when the next turn starts.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Lines from stdin (`None`: end of input or a read error), read by one thread started on
/// first use.
fn lines() -> &'static Mutex<Receiver<Option<String>>> {
    static LINES: OnceLock<Mutex<Receiver<Option<String>>>> = OnceLock::new();
    LINES.get_or_init(|| {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            loop {
                let mut line = String::new();
                let read = stdin.lock().read_line(&mut line);
                let line = match read {
                    Ok(0) | Err(_) => None,
                    Ok(_) => Some(line),
                };
                let end = line.is_none();
                if tx.send(line).is_err() || end {
                    return;
                }
            }
        });
        Mutex::new(rx)
    })
}

/// The next line (with its line break), or `None` at the end of input.
pub(crate) fn next_line() -> Option<String> {
    lines()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .recv()
        .ok()
        .flatten()
}

/// The turn was cancelled while a question waited for its answer.
pub(crate) struct Cancelled;

/// The next line, or [`Cancelled`] as soon as the turn is cancelled.
pub(crate) fn next_line_unless_cancelled() -> Result<Option<String>, Cancelled> {
    let lines = lines().lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) {
            return Err(Cancelled);
        }
        // A question is open only while a person reads it; checking the flag every 25 ms
        // answers Ctrl-C well within a keystroke's time.
        match lines.recv_timeout(Duration::from_millis(25)) {
            Ok(line) => return Ok(line),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Ok(None),
        }
    }
}

/// The turn was cancelled: open questions stop waiting.
pub(crate) fn interrupt() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// A new turn starts: nothing is cancelled.
pub(crate) fn clear_interrupt() {
    INTERRUPTED.store(false, Ordering::SeqCst);
}
