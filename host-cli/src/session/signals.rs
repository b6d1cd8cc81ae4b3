//! SIGTERM and SIGHUP (a service manager stopping keel, a closed terminal) are handled as
//! Ctrl-C is: the running turn is cancelled (its commands' process groups killed), the agent
//! ends it and the session log records it, the session closes, and keel leaves with the
//! conventional status 128 + the signal's number. A second signal leaves at once, and so does
//! the first if the way out takes longer than [`GRACE`], so keel is always gone well within
//! the 10 s a service manager waits before it kills.

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

/// Start listening for SIGTERM and SIGHUP, once per process; from then on they no longer end
/// keel at once. Must run inside the async runtime.
pub(crate) fn install() {
    WATCH.get_or_init(|| {
        let (tx, rx) = watch::channel(0);
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
                Err(e) => eprintln!("warning: cannot handle signal {number}: {e}"),
            }
        }
        rx
    });
}

fn name(number: i32) -> &'static str {
    if number == 1 { "SIGHUP" } else { "SIGTERM" }
}

fn arrived(number: i32, tx: &watch::Sender<i32>) {
    if let Err(first) = RECEIVED.compare_exchange(0, number, Ordering::SeqCst, Ordering::SeqCst) {
        eprintln!("\n[{}: leaving now]", name(number));
        std::process::exit(128 + first);
    }
    eprintln!(
        "\n[{}: ending the turn, recording it, then leaving; a second signal leaves at once]",
        name(number)
    );
    let _ = tx.send(number);
    // Whatever the way out waits for, it may not wait longer than this.
    std::thread::spawn(move || {
        std::thread::sleep(GRACE);
        eprintln!(
            "[{}: the session did not close in time; leaving now]",
            name(number)
        );
        std::process::exit(128 + number);
    });
}

/// The status to leave with once SIGTERM or SIGHUP arrived: 128 + its number.
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
