//! SIGTERM and SIGHUP (a service manager stopping keel, a closed terminal) are handled as
//! Ctrl-C is: the running turn is cancelled (its commands' process groups killed), the agent
//! ends it and the session log records it, the session closes, and keel leaves with the
//! conventional status 128 + the signal's number. A second signal leaves at once, and so does
//! the first if the way out takes longer than [`GRACE`], so keel is always gone well within
//! the 10 s a service manager waits before it kills.
//!
//! Output that is gone is a stop of the same kind: a terminal that hung up before its SIGHUP
//! arrived (a write fails with EIO) ends the turn as SIGHUP does, and a closed stdout (its
//! reader left, `keel exec --json … | head -1`, or a full disk) as a signal numbered 13
//! (SIGPIPE, which keel ignores): the turn ends recorded, and keel leaves with 141. The
//! stream itself has been handed to /dev/null by then (`std_streams`), so the way out never
//! fails or blocks on it. A pipe's reader leaving is noticed at once, not only at keel's next
//! write to it ([`watch_stdout_reader`]).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// The most the way out may take after the first signal: the agent's own turn call gets 2 s
/// to end the turn and record it, then the session closes.
const GRACE: Duration = Duration::from_secs(6);

/// The signal received first (0: none yet).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// Tells whoever waits that a signal arrived.
static WATCH: OnceLock<watch::Receiver<i32>> = OnceLock::new();
/// The sending side of [`WATCH`], for a stop that is not a signal (lost output).
static WATCH_SENDER: OnceLock<watch::Sender<i32>> = OnceLock::new();

/// Start listening for SIGTERM and SIGHUP, once per process; from then on they no longer end
/// keel at once. Must run inside the async runtime.
pub(crate) fn install() {
    WATCH.get_or_init(|| {
        let (tx, rx) = watch::channel(0);
        let _ = WATCH_SENDER.set(tx.clone());
        for (kind, number) in [(SignalKind::terminate(), 15), (SignalKind::hangup(), 1)] {
            match signal(kind) {
                Ok(mut stream) => {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        while stream.recv().await.is_some() {
                            arrived(number, &tx);
                        }
                    });
                }
                Err(e) => stderrln!("warning: cannot handle signal {number}: {e}"),
            }
        }
        watch_stdout_reader();
        rx
    });
}

/// The number a closed stdout stops keel with (SIGPIPE's).
const CLOSED_OUTPUT: i32 = 13;

fn name(number: i32) -> &'static str {
    match number {
        1 => "SIGHUP",
        CLOSED_OUTPUT => "output closed",
        _ => "SIGTERM",
    }
}

/// keel's stdout or stderr can no longer be written (`std_streams` has already sent it to
/// /dev/null): the running turn ends as for the signal it stands for. Once a stop has begun,
/// a lost stream changes nothing: a hung-up terminal fails stdout and stderr alike, and that
/// is not a second signal.
pub(crate) fn output_lost(lost: crate::std_streams::Lost) {
    let number = match lost {
        crate::std_streams::Lost::Hangup => 1,
        crate::std_streams::Lost::Closed => CLOSED_OUTPUT,
    };
    if RECEIVED.load(Ordering::SeqCst) != 0 {
        return;
    }
    match WATCH_SENDER.get() {
        Some(tx) => arrived(number, tx),
        // Outside a session (no stop handling installed): nothing runs that a stop would
        // end; the command finishes and leaves with the status of the lost output.
        None => {
            let _ = RECEIVED.compare_exchange(0, number, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

/// Wakes when stdout is a pipe or socket and its reader has gone (poll reports POLLERR or
/// POLLHUP without being asked for anything), so a turn whose output nobody reads ends then,
/// not at keel's next write. A thread of its own, blocked in `poll` for the process's life;
/// stdout of any other kind (a terminal, a file) is not watched.
fn watch_stdout_reader() {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::stat::{SFlag, fstat};
    use std::os::fd::AsFd;
    let watched = fstat(std::io::stdout().as_fd()).is_ok_and(|st| {
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        kind == SFlag::S_IFIFO || kind == SFlag::S_IFSOCK
    });
    if !watched {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("keel-stdout-reader".into())
        .stack_size(64 << 10)
        .spawn(|| {
            let stdout = std::io::stdout();
            loop {
                let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {
                        let gone = fds[0]
                            .revents()
                            .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP));
                        if gone {
                            crate::std_streams::failed(
                                crate::std_streams::Stream::Stdout,
                                &std::io::Error::from_raw_os_error(32),
                            );
                            return;
                        }
                    }
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => return,
                }
            }
        });
    if let Err(e) = spawned {
        tracing::debug!("stdout's reader is not watched: {e}");
    }
}

fn arrived(number: i32, tx: &watch::Sender<i32>) {
    if let Err(first) = RECEIVED.compare_exchange(0, number, Ordering::SeqCst, Ordering::SeqCst) {
        stderrln!("\n[{}: leaving now]", name(number));
        std::process::exit(128 + first);
    }
    stderrln!(
        "\n[{}: ending the turn, recording it, then leaving; a second signal leaves at once]",
        name(number)
    );
    let _ = tx.send(number);
    // Whatever the way out waits for, it may not wait longer than this.
    std::thread::spawn(move || {
        std::thread::sleep(GRACE);
        stderrln!(
            "[{}: the session did not close in time; leaving now]",
            name(number)
        );
        std::process::exit(128 + number);
    });
}

/// The status to leave with once SIGTERM or SIGHUP arrived, or the output was lost: 128 + its
/// number.
pub(crate) fn exit_status() -> Option<u8> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        n => u8::try_from(128 + n).ok(),
    }
}

/// Resolves once SIGTERM or SIGHUP arrived (at once if one already has); never before
/// [`install`].
pub(crate) async fn terminated() {
    let Some(rx) = WATCH.get() else {
        return std::future::pending().await;
    };
    let mut rx = rx.clone();
    if rx.wait_for(|n| *n != 0).await.is_err() {
        std::future::pending::<()>().await;
    }
}
