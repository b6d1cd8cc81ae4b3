//! The page's connections: one that has not shown the token (or exchanged a code for it) within
//! [`unauthenticated_timeout`] of being accepted is closed, so idle, token-less connections
//! cannot hold every descriptor keel may open and lock the person out. Once a request on it
//! passes the door, a connection is the page's and lives as long as the browser keeps it.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How long a connection may stay without passing the door.
const DEFAULT_UNAUTHENTICATED_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may stay without passing the door: [`DEFAULT_UNAUTHENTICATED_TIMEOUT`],
/// or, in a debug build only (the tests), `KEEL_WEB_UNAUTHENTICATED_TIMEOUT_MS`.
pub(super) fn unauthenticated_timeout() -> Duration {
    if cfg!(debug_assertions)
        && let Some(ms) = std::env::var("KEEL_WEB_UNAUTHENTICATED_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
    {
        return Duration::from_millis(ms);
    }
    DEFAULT_UNAUTHENTICATED_TIMEOUT
}

/// Raise the soft limit on open descriptors to the hard one, where the system allows it, so
/// the page's connections have room besides the kernel's plugins and files.
pub(super) fn raise_descriptor_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::debug!("the open-file limit stays at {soft}: {e}");
    }
}

/// Whether a request on the connection passed the door; set by the door, read by the stream.
#[derive(Clone, Debug)]
pub struct Passed(Arc<AtomicBool>);

impl Passed {
    /// The connection is the page's from now on.
    pub fn mark(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The page's listener: each connection accepted is a [`Watched`] one.
pub(super) struct WatchedListener {
    listener: TcpListener,
    timeout: Duration,
}

impl WatchedListener {
    pub(super) fn new(listener: TcpListener, timeout: Duration) -> WatchedListener {
        WatchedListener { listener, timeout }
    }
}

impl Listener for WatchedListener {
    type Io = Watched;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Watched, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    return (
                        Watched {
                            stream,
                            passed: Passed(Arc::new(AtomicBool::new(false))),
                            deadline: Box::pin(tokio::time::sleep(self.timeout)),
                        },
                        addr,
                    );
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => {
                    // Out of descriptors (EMFILE, ENFILE): nothing tells when one frees up,
                    // and the watched connections give theirs back within the timeout.
                    tracing::warn!("the page cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A connection of the page: reading from it fails once its deadline passes unless a request
/// on it passed the door, and the server then closes it.
pub struct Watched {
    stream: TcpStream,
    passed: Passed,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Connected<IncomingStream<'_, WatchedListener>> for Passed {
    fn connect_info(stream: IncomingStream<'_, WatchedListener>) -> Passed {
        stream.io().passed.clone()
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.passed.0.load(Ordering::SeqCst) && self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no request with the page's token in time",
            )));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
