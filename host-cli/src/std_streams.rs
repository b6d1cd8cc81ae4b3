//! keel's own writes to its standard output and error, which never panic.
//!
//! `println!` panics when a write fails: after the terminal hung up (EIO), when the reader of
//! a pipe left (`keel exec --json … | head -1`: EPIPE), on a full disk. A panic there ends a
//! turn unrecorded, or kills the task that was to record it. Every write keel makes on its
//! own behalf goes through [`stdoutln!`], [`stdout!`], [`stderrln!`] and [`stderr!`] (or the
//! [`Guarded`] writer) instead: a failed write hands that stream over to
//! `/dev/null`, so nothing later fails or blocks on it, and tells the session that its
//! output is gone ([`crate::session::output_lost`]), which ends the running turn as
//! Ctrl-C does (recorded, its commands killed) and leaves with a documented status.

use std::fmt;
use std::io::{self, Write};
use std::os::fd::AsFd;

/// One of keel's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Why a stream can no longer be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// The terminal is gone (EIO after a hangup): handled as SIGHUP.
    Hangup,
    /// Nobody reads it any more (a closed pipe), or it cannot take more (a full disk).
    Closed,
}

/// What a failed write on `stream` means, and what follows from it.
pub(crate) fn failed(stream: Stream, error: &io::Error) {
    // EIO: a terminal that hung up; ENXIO is what some hung-up terminals answer instead.
    let lost = match error.raw_os_error() {
        Some(5 | 6) => Lost::Hangup,
        _ => Lost::Closed,
    };
    to_dev_null(stream);
    tracing::debug!(
        "{} is lost ({error}); it now goes to /dev/null",
        stream.name()
    );
    crate::session::output_lost(lost);
}

/// Point `stream`'s descriptor at `/dev/null`: whatever is still buffered for it, and every
/// later write, succeeds and goes nowhere.
fn to_dev_null(stream: Stream) {
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    let _ = match stream {
        Stream::Stdout => nix::unistd::dup2_stdout(null.as_fd()),
        Stream::Stderr => nix::unistd::dup2_stderr(null.as_fd()),
    };
}

/// Write `args` to `stream`; a failure is handled by [`failed`], never a panic.
pub(crate) fn write(stream: Stream, args: fmt::Arguments<'_>) {
    // The stream's lock is let go before a failure is handled.
    let written = match stream {
        Stream::Stdout => io::stdout().lock().write_fmt(args),
        Stream::Stderr => io::stderr().lock().write_fmt(args),
    };
    if let Err(e) = written {
        failed(stream, &e);
    }
}

/// Flush `stream`; a failure is handled by [`failed`].
pub(crate) fn flush(stream: Stream) {
    let flushed = match stream {
        Stream::Stdout => io::stdout().flush(),
        Stream::Stderr => io::stderr().flush(),
    };
    if let Err(e) = flushed {
        failed(stream, &e);
    }
}

/// A stream as a writer whose failures are handled by [`failed`] (and then reported as
/// success, so a renderer writing through it goes on to its end instead of stopping half-way).
pub(crate) struct Guarded(pub(crate) Stream);

impl Write for Guarded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = match self.0 {
            Stream::Stdout => io::stdout().write_all(buf),
            Stream::Stderr => io::stderr().write_all(buf),
        };
        if let Err(e) = written {
            failed(self.0, &e);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        flush(self.0);
        Ok(())
    }
}

/// `println!` that never panics (see the module's words).
macro_rules! stdoutln {
    () => {
        $crate::std_streams::write($crate::std_streams::Stream::Stdout, format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::std_streams::write($crate::std_streams::Stream::Stdout, format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that never panics.
macro_rules! stdout {
    ($($arg:tt)*) => {
        $crate::std_streams::write($crate::std_streams::Stream::Stdout, format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics.
macro_rules! stderrln {
    () => {
        $crate::std_streams::write($crate::std_streams::Stream::Stderr, format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::std_streams::write($crate::std_streams::Stream::Stderr, format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprint!` that never panics.
macro_rules! stderr {
    ($($arg:tt)*) => {
        $crate::std_streams::write($crate::std_streams::Stream::Stderr, format_args!($($arg)*))
    };
}
