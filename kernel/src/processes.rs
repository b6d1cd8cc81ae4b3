//! Long-lived processes for plugins (ABI 0.3.0 `processes`): the programs the person listed for
//! a plugin in their config (`[mcp.servers.NAME]` for the `mcp` plugin), started through the
//! kernel's one runner ([`crate::sandbox::runner::start`]) with the entry's grants.
//!
//! A plugin names an entry, never a command line. Each process runs in the OS sandbox (the
//! root and the workspace read-only, the entry's `dirs` writable, keel's home and the deny-read
//! list hidden, the kernel-held secrets out of its environment except those the entry names),
//! with network only to the entry's `hosts` through keel's proxy, in its own process group. Its
//! stdout is read by the kernel into a bounded queue (a process that floods it is simply not
//! read until the plugin catches up), its stderr goes to keel's log a line at a time, and it
//! is killed with its group when the plugin's instance goes (unload, reload, replacement): the
//! start is an effect in the plugin's undo log like every other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::sandbox::pids::ProcessCap;
use crate::sandbox::runner::{self, Containment, Launch};
use crate::sandbox::{Confinement, Program, SandboxMode};
use crate::session_gates::SessionGates;
use crate::types::KernelError;

/// A program the person allowed a plugin to start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessEntry {
    /// The program: a name looked up on `PATH`, or a path.
    pub command: String,
    /// Its arguments, as they are (no shell).
    pub args: Vec<String>,
    /// Environment variables the person wrote.
    pub env: BTreeMap<String, String>,
    /// Environment variables filled from kernel-held secrets: variable → secret name.
    pub secret_env: BTreeMap<String, String>,
    /// Working directory (absolute); the workspace when `None`.
    pub cwd: Option<PathBuf>,
    /// Directories it may write (absolute). Everything else is read-only or hidden.
    pub dirs: Vec<PathBuf>,
    /// Directories it may read where the sandbox hides them (under `/tmp`, say); keel's home
    /// and the deny-read list stay hidden inside them.
    pub read: Vec<PathBuf>,
    /// Hosts it may reach through keel's proxy, as a manifest's `network` list.
    pub hosts: Vec<String>,
    /// Files whose approved content it runs, `(path, keel's copy)`: the copy is bound
    /// read-only over the path (a hook's script, approved by content).
    pub pinned: Vec<(PathBuf, PathBuf)>,
}

/// The topic of the event a plugin gets when one of its processes wrote while no read waited.
pub const OUTPUT_TOPIC: &str = "keel.process.output";

/// Chunks of stdout queued per process (each at most [`CHUNK`] bytes): what a process may
/// write ahead of its plugin before it is made to wait.
const QUEUED_CHUNKS: usize = 16;
const CHUNK: usize = 64 * 1024;
/// Largest write a plugin may hand a process at once.
const MAX_WRITE: usize = 4 << 20;
/// Longest a read or write may wait.
const MAX_WAIT: Duration = Duration::from_secs(600);
/// Processes one plugin may hold at once.
const MAX_PER_PLUGIN: usize = 32;
/// A stderr line longer than this is cut in the log.
const MAX_LOG_LINE: usize = 4096;

/// Whether the process is running or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessStatus {
    /// It runs.
    Running,
    /// It exited with this code; `None` when a signal ended it.
    Exited(Option<i32>),
}

struct Stdout {
    rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
    left: Vec<u8>,
    eof: bool,
}

/// Whether the owner waits in a read, and whether it was already told of waiting output.
#[derive(Default)]
struct Flags {
    reading: AtomicBool,
    notified: AtomicBool,
}

/// A running process; dropping it kills the process and its group.
pub(crate) struct Running {
    owner: String,
    entry: String,
    stdin: tokio::sync::Mutex<Option<tokio::process::ChildStdin>>,
    stdout: tokio::sync::Mutex<Stdout>,
    flags: Arc<Flags>,
    /// How it ended, once it did (`Some(None)`: by a signal), set by the task that waits for it.
    exit: tokio::sync::watch::Receiver<Option<Option<i32>>>,
    pgid: Option<i32>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Its last lines on stderr, said when it ended badly (why a server did not start).
    tail: Arc<Mutex<std::collections::VecDeque<String>>>,
    _cap: Option<ProcessCap>,
}

/// stderr lines kept per process for the message when it fails.
const TAIL_LINES: usize = 12;

impl Drop for Running {
    fn drop(&mut self) {
        let ended = *self.exit.borrow();
        if let Some(code) = ended
            && code != Some(0)
        {
            let tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
            if !tail.is_empty() {
                let how =
                    code.map_or_else(|| "by a signal".to_owned(), |c| format!("exit code {c}"));
                tracing::warn!(
                    plugin = %self.owner,
                    "`{}` ended ({how}); its last words on stderr:\n  {}",
                    self.entry,
                    tail.iter().cloned().collect::<Vec<_>>().join("\n  ")
                );
            }
        }
        // The whole group: a server's own children must not outlive it. (Once the leader was
        // reaped its id may be another's; bubblewrap's PID namespace ended its tree with it.)
        #[cfg(unix)]
        if let Some(pgid) = self.pgid.filter(|_| ended.is_none()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // Aborting the waiter drops the child, which tokio kills (`kill_on_drop`) and reaps.
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The processes of a session, by handle. The table owns them; the environment records which
/// plugin holds which, and a process whose record is gone (the plugin's `kill`, or the inverse
/// in its undo log on unload) is dropped from here by [`ProcessTable::reap`], which kills it.
#[derive(Default)]
pub(crate) struct ProcessTable {
    next: AtomicU32,
    running: Mutex<BTreeMap<u32, Arc<Running>>>,
}

fn not_yours(plugin: &str, id: u32) -> KernelError {
    KernelError::Invalid(format!(
        "plugin `{plugin}` has no process {id}; start one with `processes.start` first (a \
         killed process's handle is released)"
    ))
}

impl ProcessTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Arc<Running>>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, plugin: &str, id: u32) -> Result<Arc<Running>, KernelError> {
        match self.lock().get(&id) {
            Some(r) if r.owner == plugin => Ok(r.clone()),
            _ => Err(not_yours(plugin, id)),
        }
    }

    /// The processes `plugin` holds, as (handle, entry).
    pub(crate) fn held_by(&self, plugin: &str) -> Vec<(u32, String)> {
        self.lock()
            .iter()
            .filter(|(_, r)| r.owner == plugin)
            .map(|(id, r)| (*id, r.entry.clone()))
            .collect()
    }

    /// Hold process `id`, which the environment now records.
    pub(crate) fn insert(&self, id: u32, running: Arc<Running>) {
        self.lock().insert(id, running);
    }

    /// Kill every process of `plugin` the environment no longer records (after an undo or a
    /// `kill`).
    pub(crate) fn reap(&self, plugin: &str, env: &crate::env::Env) {
        let ended: Vec<Arc<Running>> = {
            let mut running = self.lock();
            let gone: Vec<u32> = running
                .iter()
                .filter(|(id, r)| r.owner == plugin && !env.processes().contains_key(id))
                .map(|(id, _)| *id)
                .collect();
            gone.iter().filter_map(|id| running.remove(id)).collect()
        };
        // Dropped outside the lock: each drop signals its process group.
        drop(ended);
    }

    /// Write all of `bytes` to the stdin of process `id`.
    pub(crate) async fn write(
        &self,
        plugin: &str,
        id: u32,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<(), KernelError> {
        if bytes.len() > MAX_WRITE {
            return Err(KernelError::Invalid(format!(
                "a write of {} bytes; at most {MAX_WRITE} at once",
                bytes.len()
            )));
        }
        let r = self.get(plugin, id)?;
        let mut stdin = r.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(KernelError::Unavailable(format!(
                "process {id} (`{}`) no longer takes input",
                r.entry
            )));
        };
        let write = async {
            pipe.write_all(bytes).await?;
            pipe.flush().await
        };
        match tokio::time::timeout(timeout.min(MAX_WAIT), write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                *stdin = None;
                Err(KernelError::Unavailable(format!(
                    "process {id} (`{}`) closed its input: {e}",
                    r.entry
                )))
            }
            Err(_) => Err(KernelError::TimedOut(format!(
                "process {id} (`{}`) did not take its input within {} ms",
                r.entry,
                timeout.as_millis()
            ))),
        }
    }

    /// At most `max` bytes of the stdout of process `id`, waiting up to `timeout` for the
    /// first; `None` at the end of its output.
    pub(crate) async fn read(
        &self,
        plugin: &str,
        id: u32,
        max: usize,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, KernelError> {
        let r = self.get(plugin, id)?;
        let max = max.clamp(1, 1 << 20);
        let mut out = r.stdout.lock().await;
        r.flags.reading.store(true, Ordering::SeqCst);
        r.flags.notified.store(false, Ordering::SeqCst);
        let reading = ReadingGuard(&r.flags);
        if out.left.is_empty() && !out.eof {
            let next = if timeout.is_zero() {
                match out.rx.try_recv() {
                    Ok(chunk) => Some(chunk),
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => None,
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                        return Err(KernelError::TimedOut(format!(
                            "process {id} (`{}`) has written nothing new",
                            r.entry
                        )));
                    }
                }
            } else {
                match tokio::time::timeout(timeout.min(MAX_WAIT), out.rx.recv()).await {
                    Ok(next) => next,
                    Err(_) => {
                        return Err(KernelError::TimedOut(format!(
                            "process {id} (`{}`) wrote nothing within {} ms",
                            r.entry,
                            timeout.as_millis()
                        )));
                    }
                }
            };
            match next {
                Some(chunk) => out.left = chunk,
                None => out.eof = true,
            }
        }
        drop(reading);
        if out.left.is_empty() {
            return Ok(None);
        }
        let take = max.min(out.left.len());
        let rest = out.left.split_off(take);
        Ok(Some(std::mem::replace(&mut out.left, rest)))
    }

    /// Whether process `id` runs.
    pub(crate) fn status(&self, plugin: &str, id: u32) -> Result<ProcessStatus, KernelError> {
        let r = self.get(plugin, id)?;
        let ended = *r.exit.borrow();
        Ok(match ended {
            None => ProcessStatus::Running,
            Some(code) => ProcessStatus::Exited(code),
        })
    }
}

struct ReadingGuard<'a>(&'a Flags);

impl Drop for ReadingGuard<'_> {
    fn drop(&mut self) {
        self.0.reading.store(false, Ordering::SeqCst);
    }
}

/// Where a process entry's confinement comes from: the session's sandbox, with the workspace
/// read-only (the entry's `dirs` are what it may write).
fn containment_for(session: &Containment) -> Result<Containment, KernelError> {
    match &session.confinement {
        Confinement::Bubblewrap(_, network) => Ok(Containment {
            config: crate::sandbox::SandboxConfig {
                mode: SandboxMode::ReadOnly,
                ..session.config.clone()
            },
            confinement: Confinement::Bubblewrap(SandboxMode::ReadOnly, *network),
        }),
        Confinement::Off => Ok(session.clone()),
        Confinement::Unavailable(why) => Err(KernelError::Unavailable(format!(
            "the OS sandbox cannot start here ({why}), and keel does not start a server's \
             process without it; install bubblewrap (see `keel doctor`), or set \
             `[sandbox] mode = \"off\"` to run every process with your full rights"
        ))),
    }
}

/// Check an entry's grants before anything starts: directories must exist; one it may write
/// must neither be nor hold keel's home, one it may read must not lie inside it. Returns the
/// canonical (writable, readable) directories.
fn check_grants(
    entry_name: &str,
    entry: &ProcessEntry,
    keel_home: Option<&Path>,
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), KernelError> {
    let mut readable = Vec::new();
    for dir in &entry.read {
        let canonical = dir.canonicalize().map_err(|e| {
            KernelError::Invalid(format!(
                "server `{entry_name}`: the readable directory {} cannot be used ({e}); remove \
                 it from `read`",
                dir.display()
            ))
        })?;
        if let Some(home) = keel_home
            && canonical.starts_with(home)
        {
            return Err(KernelError::Denied(format!(
                "server `{entry_name}`: {} is inside keel's home, which no process may read",
                canonical.display()
            )));
        }
        readable.push(canonical);
    }
    let mut dirs = Vec::new();
    for dir in &entry.dirs {
        let canonical = dir.canonicalize().map_err(|e| {
            KernelError::Invalid(format!(
                "server `{entry_name}`: the granted directory {} cannot be used ({e}); create it \
                 or remove it from `dirs`",
                dir.display()
            ))
        })?;
        if let Some(home) = keel_home
            && (canonical.starts_with(home) || home.starts_with(&canonical))
        {
            return Err(KernelError::Denied(format!(
                "server `{entry_name}`: the granted directory {} is or holds keel's home, which \
                 no process may write; grant a directory beside it",
                canonical.display()
            )));
        }
        dirs.push(canonical);
    }
    Ok((dirs, readable))
}

/// Start the program of `entry_name` for `plugin`. `notify` is called (once until the next
/// read) when output arrives while no read waits. The caller records the process in the
/// environment and then hands it to the table; dropping it instead kills it.
pub(crate) fn start(
    gates: &Arc<SessionGates>,
    table: &ProcessTable,
    plugin: &str,
    entry_name: &str,
    entry: &ProcessEntry,
    notify: Box<dyn Fn() + Send + Sync>,
) -> Result<(u32, Arc<Running>), KernelError> {
    if table.held_by(plugin).len() >= MAX_PER_PLUGIN {
        return Err(KernelError::Invalid(format!(
            "plugin `{plugin}` already runs {MAX_PER_PLUGIN} processes, the most one plugin may; \
             kill one first"
        )));
    }
    let Some(workspace) = gates.workspace.clone() else {
        return Err(KernelError::Unavailable(
            "this session has no workspace, so no process can start".into(),
        ));
    };
    let containment = containment_for(gates.containment())?;
    if gates.plan_mode() && !containment.confinement.is_confined() {
        return Err(KernelError::Denied(format!(
            "[keel] plan mode: `{entry_name}` did not start: the session is read-only until the \
             person accepts a plan, and without the OS sandbox nothing could hold a process to \
             that"
        )));
    }
    let (dirs, readable) =
        check_grants(entry_name, entry, containment.config.keel_home.as_deref())?;
    let dir = match &entry.cwd {
        Some(cwd) => cwd.canonicalize().map_err(|e| {
            KernelError::Invalid(format!(
                "server `{entry_name}`: its working directory {} cannot be used ({e})",
                cwd.display()
            ))
        })?,
        None => workspace.clone(),
    };
    let mut env: Vec<(String, std::ffi::OsString)> = entry
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.into()))
        .collect();
    for (var, secret) in &entry.secret_env {
        let value = gates.net.secret_value(secret).ok_or_else(|| {
            KernelError::Unavailable(format!(
                "server `{entry_name}` needs the secret `{secret}` (for ${var}), which keel does \
                 not hold; set it in the environment keel starts in or under [secrets]"
            ))
        })?;
        env.push((var.clone(), value.into()));
    }
    // The kernel-held secrets leave the environment, except the ones this entry was given.
    let hidden: Vec<String> = gates
        .secret_names()
        .iter()
        .filter(|name| !entry.secret_env.contains_key(*name))
        .cloned()
        .collect();
    let argv: Vec<String> = std::iter::once(entry.command.clone())
        .chain(entry.args.iter().cloned())
        .collect();
    // Plan mode holds the session read-only, whoever asks: a process started while it is on
    // (a hook, the person's or an approved repository's) writes none of its directories.
    let writable: Vec<&Path> = if gates.plan_mode() {
        Vec::new()
    } else {
        dirs.iter().map(PathBuf::as_path).collect()
    };
    let readable: Vec<&Path> = readable.iter().map(PathBuf::as_path).collect();
    let env_refs: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_os_str()))
        .collect();
    let started = runner::start(
        Launch {
            workspace: &workspace,
            dir: &dir,
            program: Program::Argv(&argv),
            writable: &writable,
            readable: &readable,
            shared: &[],
            env: &env_refs,
            hidden: &hidden,
            network: !entry.hosts.is_empty(),
            pinned: &entry.pinned,
            protected: None,
            stdio: [Stdio::piped(), Stdio::piped(), Stdio::piped()],
        },
        &containment,
    )
    .map_err(|e| {
        KernelError::Unavailable(format!(
            "server `{entry_name}` (`{}`) did not start: {e}",
            entry.command
        ))
    })?;
    let mut child = started.child;
    let pgid = child.id().and_then(|pid| i32::try_from(pid).ok());
    let (tx, rx) = tokio::sync::mpsc::channel(QUEUED_CHUNKS);
    let flags = Arc::new(Flags::default());
    let mut tasks = Vec::new();
    let (exit_tx, exit) = tokio::sync::watch::channel(None);
    if let Some(mut stdout) = child.stdout.take() {
        let flags = flags.clone();
        let mut ended = exit.clone();
        tasks.push(tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).await.is_err() {
                            break;
                        }
                        if !flags.reading.load(Ordering::SeqCst)
                            && !flags.notified.swap(true, Ordering::SeqCst)
                        {
                            notify();
                        }
                    }
                }
            }
            // The end of its output usually means its end: let the reader that sees the end
            // also see how it ended (bounded: a process may close stdout and go on).
            let _ =
                tokio::time::timeout(Duration::from_secs(1), ended.wait_for(Option::is_some)).await;
            drop(tx);
        }));
    }
    let tail: Arc<Mutex<std::collections::VecDeque<String>>> = Arc::default();
    if let Some(stderr) = child.stderr.take() {
        let (plugin, server) = (plugin.to_owned(), entry_name.to_owned());
        let gates = gates.clone();
        let tail = tail.clone();
        tasks.push(tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                // A line without an end is read at most this far; the rest is the next line.
                let mut limited = (&mut lines).take(MAX_LOG_LINE as u64);
                match limited.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        let text = gates.redact_log(text.trim_end());
                        tracing::info!(plugin = %plugin, server = %server, "{text}");
                        if text.trim().is_empty() {
                            continue;
                        }
                        let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                        if tail.len() == TAIL_LINES {
                            tail.pop_front();
                        }
                        tail.push_back(keel_gates::sanitize::sanitize_for_display(&text));
                    }
                }
            }
        }));
    }
    if let Some(listener) = started.proxy {
        let gates = gates.clone();
        let who = format!("{plugin} (server {entry_name})");
        let hosts = entry.hosts.clone();
        tasks.push(tokio::spawn(async move {
            let net = crate::sandbox::proxy::CommandNet::limited(
                &gates.net,
                who,
                hosts,
                gates.approver.clone(),
            );
            crate::sandbox::proxy::serve(listener, &net).await;
        }));
    }
    let stdin = child.stdin.take();
    tasks.push(tokio::spawn(async move {
        let code = child.wait().await.ok().and_then(|s| s.code());
        let _ = exit_tx.send(Some(code));
    }));
    let id = table.next.fetch_add(1, Ordering::SeqCst) + 1;
    let running = Arc::new(Running {
        owner: plugin.to_owned(),
        entry: entry_name.to_owned(),
        stdin: tokio::sync::Mutex::new(stdin),
        stdout: tokio::sync::Mutex::new(Stdout {
            rx,
            left: Vec::new(),
            eof: false,
        }),
        flags,
        exit,
        pgid,
        tasks,
        tail,
        _cap: started.cap,
    });
    Ok((id, running))
}
