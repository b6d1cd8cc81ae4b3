//! The WASI context of a plugin instance, built only from what the plugin was granted, and the
//! plumbing that turns a plugin's stdout and stderr into `tracing` events.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{FsPerms, WasiCtx};

use super::GrantedDir;

/// Longest line forwarded as one event; longer output is split.
const MAX_LINE: usize = 8 * 1024;

/// A WASI context with the granted directories preopened and nothing else: no arguments, no
/// environment variables, no stdin, no network (every socket address is refused and name
/// lookup is off), stdout and stderr forwarded to `tracing` tagged with the plugin's name.
pub(crate) fn build_ctx(plugin: &str, dirs: &[GrantedDir]) -> Result<WasiCtx, String> {
    let mut builder = WasiCtx::builder();
    // File operations run on the calling thread instead of a `spawn_blocking` hop per
    // operation: a guest call is already synchronous work on this thread (its store is
    // exclusive while it runs), and the hop and its two thread wake-ups cost more than the
    // small local reads and appends plugins make. Set before the preopens: each preopened
    // directory (and every file opened under it) keeps the setting it was created with.
    builder.allow_blocking_current_thread(true);
    for dir in dirs {
        let perms = if dir.read_only {
            FsPerms::ReadOnly
        } else {
            FsPerms::ReadWrite
        };
        builder
            .preopened_dir(&dir.host, &dir.guest, perms)
            .map_err(|e| {
                format!(
                    "plugin `{plugin}`: cannot open its granted directory `{}` (as `{}`): {e}",
                    dir.host.display(),
                    dir.guest
                )
            })?;
    }
    // Explicit even though these are the defaults today: a plugin's network reaches the world
    // only through the kernel's mediated services, never through WASI sockets.
    builder
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .stdout(TracingOutput::new(plugin, "stdout"))
        .stderr(TracingOutput::new(plugin, "stderr"));
    Ok(builder.build())
}

/// A plugin's stdout or stderr: complete lines become `tracing` events.
#[derive(Clone)]
pub(crate) struct TracingOutput {
    plugin: Arc<str>,
    stream: &'static str,
    pending: Arc<Mutex<Vec<u8>>>,
}

impl TracingOutput {
    pub(crate) fn new(plugin: &str, stream: &'static str) -> Self {
        TracingOutput {
            plugin: Arc::from(plugin),
            stream,
            pending: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn emit(&self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches(['\n', '\r']);
        let plugin = &*self.plugin;
        match self.stream {
            "stderr" => tracing::warn!(plugin, stream = "stderr", "{text}"),
            _ => tracing::info!(plugin, stream = "stdout", "{text}"),
        }
    }

    fn write_bytes(&self, bytes: &[u8]) {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        pending.extend_from_slice(bytes);
        loop {
            let cut = match pending.iter().position(|&b| b == b'\n') {
                Some(nl) => nl + 1,
                None if pending.len() >= MAX_LINE => MAX_LINE,
                None => break,
            };
            let line: Vec<u8> = pending.drain(..cut).collect();
            self.emit(&line);
        }
    }

    fn flush_partial(&self) {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !pending.is_empty() {
            let line = std::mem::take(&mut *pending);
            self.emit(&line);
        }
    }
}

impl Drop for TracingOutput {
    fn drop(&mut self) {
        // The last clone out forwards an unterminated final line.
        if Arc::strong_count(&self.pending) == 1 {
            self.flush_partial();
        }
    }
}

impl IsTerminal for TracingOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TracingOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for TracingOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write_bytes(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.flush_partial();
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_split_into_lines() {
        let out = TracingOutput::new("p", "stdout");
        out.write_bytes(b"hello ");
        assert_eq!(out.pending.lock().map(|p| p.len()).unwrap_or(0), 6);
        out.write_bytes(b"world\nsecond");
        assert_eq!(
            out.pending.lock().map(|p| p.clone()).unwrap_or_default(),
            b"second".to_vec()
        );
        out.write_bytes(&vec![b'x'; MAX_LINE + 10]);
        assert_eq!(
            out.pending.lock().map(|p| p.len()).unwrap_or(0),
            "second".len() + 10
        );
    }
}
