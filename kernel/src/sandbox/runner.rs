//! The kernel's process runner: every process keel starts goes through [`start`], which puts
//! it in the OS sandbox ([`crate::sandbox`]) with its limits, in its own process group, with a
//! scrubbed environment ([`crate::sandbox::PASSED_ENV`], never the kernel-held secrets), and —
//! when it may use the network — in a network
//! namespace of keel's making whose only way out is the proxy listener it hands back.
//!
//! [`run`] is the one-shot form for the exec gate (the policy decision is the caller's, see
//! `dispatch`): the working directory confined to the workspace, a wall-clock limit, stdout and
//! stderr interleaved and capped, the proxy served while the command runs, and where the
//! command left its working directory so a shell tool can carry it to the next call.
//! Long-lived processes with pipes (MCP servers) are meant to use [`start`] the same way.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::sandbox::netns::Handoff;
use crate::sandbox::pids::ProcessCap;
use crate::sandbox::proxy::CommandNet;
use crate::sandbox::{Confinement, Program, SandboxConfig};

/// A command a plugin asks the kernel to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCommand {
    /// The command line, run by `sh -c`.
    pub line: String,
    /// Working directory relative to the workspace root.
    pub cwd: String,
    /// Wall-clock limit.
    pub timeout: Duration,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    /// Exit code; `None` when killed or timed out.
    pub exit_code: Option<i32>,
    /// Interleaved stdout and stderr, capped.
    pub output: String,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// The working directory it ended in, relative to the workspace root.
    pub cwd: String,
    /// What the kernel did about it (truncation, a refused directory change), or empty.
    pub note: String,
}

/// Longest wall-clock limit a plugin may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default limit when a plugin asks for 0.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Output kept in memory per command; the dispatcher spills what it passes on to the model.
const OUTPUT_CAP: usize = 8 << 20;

/// Why a command could not be started at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The working directory is not inside the workspace.
    #[error(
        "working directory `{0}` is outside the workspace; use a path relative to the workspace root"
    )]
    OutsideWorkspace(String),
    /// The working directory does not exist.
    #[error("working directory `{0}` does not exist; create it first or use `.`")]
    MissingCwd(String),
    /// The process could not be spawned.
    #[error("cannot start the process: {0}")]
    Spawn(String),
}

/// Resolve a plugin-supplied working directory against the canonical `workspace`.
pub(crate) fn resolve_cwd(workspace: &Path, cwd: &str) -> Result<PathBuf, ExecError> {
    let trimmed = cwd.trim();
    let relative = trimmed
        .strip_prefix("/workspace")
        .map(|r| r.trim_start_matches('/'))
        .unwrap_or(trimmed);
    let candidate = if relative.is_empty() || relative == "." {
        workspace.to_path_buf()
    } else if Path::new(relative).is_absolute() {
        PathBuf::from(relative)
    } else {
        workspace.join(relative)
    };
    let canonical = candidate
        .canonicalize()
        .map_err(|_| ExecError::MissingCwd(cwd.to_owned()))?;
    if !canonical.starts_with(workspace) {
        return Err(ExecError::OutsideWorkspace(cwd.to_owned()));
    }
    Ok(canonical)
}

fn relative_to(workspace: &Path, dir: &Path) -> String {
    match dir.strip_prefix(workspace) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => ".".to_owned(),
    }
}

/// How a command is confined: the sandbox settings and what the probe found.
#[derive(Debug, Clone)]
pub(crate) struct Containment {
    pub(crate) config: SandboxConfig,
    pub(crate) confinement: Confinement,
}

impl Containment {
    /// Commands run unconfined (runner tests of what is not about the sandbox).
    #[cfg(test)]
    pub(crate) fn none() -> Containment {
        Containment {
            config: SandboxConfig {
                mode: crate::sandbox::SandboxMode::Off,
                ..SandboxConfig::default()
            },
            confinement: Confinement::Off,
        }
    }
}

/// What [`start`] starts: a script or a program in `dir`.
pub(crate) struct Launch<'a> {
    /// The canonical workspace.
    pub(crate) workspace: &'a Path,
    /// The working directory.
    pub(crate) dir: &'a Path,
    /// What runs.
    pub(crate) program: Program<'a>,
    /// Directories it may write besides what the sandbox mode allows (a process entry's grants).
    pub(crate) writable: &'a [&'a Path],
    /// Directories it may read where the sandbox would hide them (a process entry's grants).
    pub(crate) readable: &'a [&'a Path],
    /// Files outside the workspace the process may write (read back by the kernel).
    pub(crate) shared: &'a [&'a Path],
    /// Environment variables set for it.
    pub(crate) env: &'a [(&'a str, &'a std::ffi::OsStr)],
    /// Environment variables removed (the kernel-held secrets).
    pub(crate) hidden: &'a [String],
    /// Whether it may use the network (through keel's proxy, when sandboxed).
    pub(crate) network: bool,
    /// Files whose approved content it runs, `(path inside the workspace, keel's copy)`: the
    /// copy is bound read-only over the path; unconfined, the path must still hold it.
    pub(crate) pinned: &'a [(PathBuf, PathBuf)],
    /// The workspace's control entries as found just before (to be checked after it ends);
    /// found afresh when `None`.
    pub(crate) protected: Option<&'a crate::sandbox::guard::Protected>,
    /// stdin, stdout and stderr.
    pub(crate) stdio: [Stdio; 3],
}

/// A process [`start`] started.
pub(crate) struct Started {
    /// The process, leader of its own process group, killed when dropped.
    pub(crate) child: tokio::process::Child,
    /// The listener of its network namespace, for [`crate::sandbox::proxy::serve`]; `None`
    /// without network or without a sandbox.
    pub(crate) proxy: Option<tokio::net::TcpListener>,
    /// For root: what holds the tree to its process limit, dropped after the tree.
    pub(crate) cap: Option<ProcessCap>,
}

/// Start a process confined as `containment` says.
pub(crate) fn start(launch: Launch<'_>, containment: &Containment) -> Result<Started, ExecError> {
    // A sandboxed process with network gets a namespace of keel's making whose only way out
    // is the proxy; without a sandbox there is nothing to route (it has full rights).
    let handoff = match &containment.confinement {
        Confinement::Bubblewrap(..) if launch.network => {
            Some(Handoff::new().map_err(|e| ExecError::Spawn(format!("network handoff: {e}")))?)
        }
        _ => None,
    };
    let sandboxed = match containment.confinement {
        Confinement::Bubblewrap(mode, _) => {
            let config = SandboxConfig {
                mode,
                ..containment.config.clone()
            };
            crate::sandbox::command_line(&config, &launch, handoff.is_some())
        }
        Confinement::Off | Confinement::Unavailable(_) => {
            // Nothing can be bound without a sandbox: a file whose approved content changed
            // does not run at all.
            if let Some((inside, _)) = launch
                .pinned
                .iter()
                .find(|(inside, copy)| std::fs::read(inside).ok() != std::fs::read(copy).ok())
            {
                return Err(ExecError::Spawn(format!(
                    "{} changed since it was approved; it does not run (start a new session \
                     to be asked about it again)",
                    inside.display()
                )));
            }
            None
        }
    };
    let mut cap = None;
    let sandboxed_tree = sandboxed.is_some();
    let mut command = match sandboxed {
        Some((bwrap, args)) => {
            let mut command = tokio::process::Command::new(bwrap);
            command.args(args);
            cap = ProcessCap::cgroup(containment.config.limits.processes);
            #[cfg(unix)]
            crate::sandbox::apply_limits(
                &mut command,
                containment.config.limits,
                cap.as_ref().and_then(ProcessCap::procs),
                handoff.as_ref().map(Handoff::child_side),
            );
            if handoff.is_some() {
                let proxy = crate::sandbox::netns::proxy_url();
                for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                    command.env(name, &proxy);
                }
                for name in ["NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"] {
                    command.env_remove(name);
                }
            }
            command
        }
        None => match launch.program {
            Program::Script(script) => {
                let mut command = tokio::process::Command::new("sh");
                command.arg("-c").arg(script);
                command
            }
            Program::Argv(argv) => {
                let Some((program, args)) = argv.split_first() else {
                    return Err(ExecError::Spawn("no program to start".into()));
                };
                let mut command = tokio::process::Command::new(program);
                command.args(args);
                command
            }
        },
    };
    let [stdin, stdout, stderr] = launch.stdio;
    command
        .current_dir(launch.dir)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(true);
    // A scrubbed environment, not keel's: the tokens keel was started with stay with keel.
    // The proxy variables set above for a sandboxed command with network are kept.
    let proxy_vars: Vec<(String, std::ffi::OsString)> = command
        .as_std()
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_owned())))
        .collect();
    command.env_clear();
    command.envs(crate::sandbox::passed_env(&containment.config.pass_env));
    command.envs(proxy_vars);
    for (name, value) in launch.env {
        command.env(name, value);
    }
    for name in launch.hidden {
        command.env_remove(name);
    }
    #[cfg(unix)]
    command.process_group(0);
    let child = crate::sandbox::pids::spawn(cap.as_mut(), command).map_err(|e| match &handoff {
        Some(_) => ExecError::Spawn(format!(
            "cannot give the sandboxed command keel's network proxy ({e}); user namespaces \
             may be restricted here. Run the command without network"
        )),
        None => ExecError::Spawn(e.to_string()),
    })?;
    let proxy = match handoff {
        Some(handoff) => Some(
            handoff
                .receive()
                .and_then(|l| {
                    l.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(l)
                })
                .map_err(|e| ExecError::Spawn(format!("keel's network proxy: {e}")))?,
        ),
        None => None,
    };
    if cap.is_none() && sandboxed_tree {
        cap = ProcessCap::watch(child.id(), containment.config.limits.processes);
    }
    Ok(Started { child, proxy, cap })
}

/// The name the file a command's final directory is written to begins with, in the system's
/// temporary directory, followed by the pid of the keel that made it.
const MARKER_PREFIX: &str = "keel-cwd-";

/// A new marker file; the first time in a process, after removing the markers that killed
/// keel processes left behind (a marker is removed when its command ends, which a process
/// killed with SIGKILL never reaches). The marker is `flock`ed for its life, a lock the OS lets
/// go of however keel ends: the host's sweep removes only a marker no keel holds, whatever
/// its pid means where the sweep runs.
fn marker_file() -> std::io::Result<tempfile::NamedTempFile> {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| remove_stale_markers(&std::env::temp_dir()));
    let marker = tempfile::Builder::new()
        .prefix(&format!("{MARKER_PREFIX}{}-", std::process::id()))
        .tempfile()?;
    marker.as_file().lock()?;
    Ok(marker)
}

/// Remove the markers in `dir` whose keel no longer runs and that are older than the longest
/// a command may run (so a keel in another PID namespace sharing the directory keeps its own).
fn remove_stale_markers(dir: &Path) {
    for marker in crate::sandbox::left_by_gone_keels(dir, MARKER_PREFIX, MAX_TIMEOUT) {
        let _ = std::fs::remove_file(marker);
    }
}

/// Run `cmd` in `workspace` (canonical), confined as `containment` says. Environment variables
/// named in `hidden` (the kernel-held secrets) are removed from the child's environment. With
/// `network` (the command may use the network) a sandboxed command reaches it only through
/// keel's proxy, which serves while the command runs. When `cancel` resolves first (the person
/// pressed Ctrl-C), the process group is killed and the output so far kept.
pub(crate) async fn run(
    workspace: &Path,
    cmd: &ExecCommand,
    hidden: &[String],
    containment: &Containment,
    network: Option<&CommandNet<'_>>,
    cancel: impl Future<Output = ()>,
) -> Result<ExecOutcome, ExecError> {
    let dir = resolve_cwd(workspace, &cmd.cwd)?;
    let timeout = match cmd.timeout {
        Duration::ZERO => DEFAULT_TIMEOUT,
        t => t.min(MAX_TIMEOUT),
    };
    let marker = marker_file().map_err(|e| ExecError::Spawn(e.to_string()))?;
    // The control entries as the command finds them, checked again once it has ended (a
    // command that can write the workspace could create one, or replace a link leading to
    // one; see `sandbox::guard`).
    let guarded = match containment.confinement {
        Confinement::Bubblewrap(crate::sandbox::SandboxMode::WorkspaceWrite, _) => {
            Some(crate::sandbox::guard::Protected::find(workspace, true))
        }
        _ => None,
    };
    // stderr joins stdout for the whole script, so the model sees both in the order they
    // happened; the final directory goes to a private file, not into the output.
    let script = format!(
        "exec 2>&1\n{}\n__keel_status=$?\npwd -P >\"$KEEL_CWD_FILE\" 2>/dev/null\nexit $__keel_status\n",
        cmd.line
    );
    let started = start(
        Launch {
            workspace,
            dir: &dir,
            program: Program::Script(&script),
            writable: &[],
            readable: &[],
            shared: &[marker.path()],
            env: &[("KEEL_CWD_FILE", marker.path().as_os_str())],
            hidden,
            network: network.is_some(),
            pinned: &[],
            protected: guarded.as_ref(),
            stdio: [Stdio::null(), Stdio::piped(), Stdio::null()],
        },
        containment,
    )?;
    let (mut child, cap) = (started.child, started.cap);
    let proxy = started
        .proxy
        .zip(network)
        .map(|(listener, gate)| crate::sandbox::proxy::serve(listener, gate));
    let mut stdout = child.stdout.take();
    let mut output = Vec::new();
    let mut dropped = 0usize;
    let run = async {
        let mut buf = vec![0u8; 64 * 1024];
        if let Some(out) = stdout.as_mut() {
            loop {
                match out.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let room = OUTPUT_CAP.saturating_sub(output.len());
                        let take = n.min(room);
                        output.extend_from_slice(&buf[..take]);
                        dropped += n - take;
                    }
                }
            }
        }
        child.wait().await
    };
    // The proxy serves until the command ends (it never ends by itself).
    let serve_proxy = async {
        match proxy {
            Some(serving) => serving.await,
            None => std::future::pending().await,
        }
    };
    let status = tokio::select! {
        status = tokio::time::timeout(timeout, run) => Some(status),
        () = cancel => None,
        () = serve_proxy => None,
    };
    let mut note = Vec::new();
    let (exit_code, timed_out) = match status {
        Some(Ok(Ok(status))) => (status.code(), false),
        Some(Ok(Err(e))) => {
            note.push(format!("waiting for the command failed: {e}"));
            (None, false)
        }
        Some(Err(_)) => {
            kill_group(&mut child).await;
            note.push(format!(
                "the command did not finish within {} s and was killed with its process group; \
                 the output so far is above. Run long commands in smaller steps or raise the timeout",
                timeout.as_secs()
            ));
            (None, true)
        }
        None => {
            kill_group(&mut child).await;
            note.push(
                "the person cancelled the turn (Ctrl-C); the command was killed with its process \
                 group and the output so far is above"
                    .to_owned(),
            );
            (None, false)
        }
    };
    if dropped > 0 {
        note.push(format!(
            "output was cut at {} MiB; {dropped} more bytes were discarded",
            OUTPUT_CAP >> 20
        ));
    }
    if cap.as_ref().is_some_and(ProcessCap::killed_the_tree) {
        note.push(format!(
            "the command started more than {} processes at once and was killed with everything \
             it started; the output so far is above. Start fewer processes",
            containment.config.limits.processes
        ));
    }
    drop(cap);
    // The sandbox is gone with its command (its PID namespace ended): nothing of it writes
    // any more while the control entries are checked.
    if let Some(guarded) = &guarded {
        note.extend(guarded.settle());
    }
    let mut cwd = relative_to(workspace, &dir);
    if !timed_out
        && let Ok(text) = std::fs::read_to_string(marker.path())
        && !text.trim().is_empty()
    {
        let ended = PathBuf::from(text.trim());
        match ended.canonicalize() {
            Ok(c) if c.starts_with(workspace) => cwd = relative_to(workspace, &c),
            _ => note.push(format!(
                "the command changed directory to `{}`, outside the workspace; the next command \
                 runs in `{cwd}` instead",
                text.trim()
            )),
        }
    }
    let output = String::from_utf8_lossy(&output).into_owned();
    let refused = network.map(CommandNet::refusals).unwrap_or_default();
    if !refused.is_empty() {
        note.push(format!(
            "keel's network gate refused what the command tried to reach (its only way out is \
             keel's proxy): {}",
            refused.join("; ")
        ));
    } else if exit_code != Some(0)
        && let Confinement::Bubblewrap(mode, _) = containment.confinement
        && let Some(why) = crate::sandbox::refusal_hint(mode, &output, network.is_some())
    {
        note.push(why);
    }
    Ok(ExecOutcome {
        exit_code,
        output,
        timed_out,
        cwd,
        note: note.join("; "),
    })
}

/// Kill the child's whole process group, so a command's own children do not outlive it.
async fn kill_group(child: &mut tokio::process::Child) {
    #[cfg(unix)]
    if let Some(pid) = child.id()
        && let Ok(pid) = i32::try_from(pid)
    {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.kill().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_of_keel_processes_gone_for_long_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = std::time::SystemTime::now() - MAX_TIMEOUT - Duration::from_secs(60);
        let mark = |name: &str, aged: bool| {
            let path = dir.path().join(name);
            let file = std::fs::File::create(&path).expect("create");
            if aged {
                file.set_modified(old).expect("age");
            }
            path
        };
        // No process has pid 0x3fff_fff0 (above Linux's pid_max).
        let dead_old = mark("keel-cwd-1073741808-abc", true);
        let dead_new = mark("keel-cwd-1073741808-def", false);
        let alive_old = mark(&format!("keel-cwd-{}-ghi", std::process::id()), true);
        let other = mark(".tmp1073741808", true);
        remove_stale_markers(dir.path());
        assert!(!dead_old.exists(), "a dead keel's old marker is removed");
        assert!(
            dead_new.exists(),
            "a recent one may belong to another PID namespace"
        );
        assert!(alive_old.exists(), "a running keel's marker is kept");
        assert!(other.exists(), "files that are not keel's are left alone");
    }

    fn ws() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let canonical = dir.path().canonicalize().expect("canonical");
        (dir, canonical)
    }

    /// `run` of a turn nobody cancels.
    async fn run_plain(
        ws: &Path,
        cmd: &ExecCommand,
        hidden: &[String],
    ) -> Result<ExecOutcome, ExecError> {
        run(
            ws,
            cmd,
            hidden,
            &Containment::none(),
            None,
            std::future::pending(),
        )
        .await
    }

    fn cmd(line: &str, cwd: &str, ms: u64) -> ExecCommand {
        ExecCommand {
            line: line.to_owned(),
            cwd: cwd.to_owned(),
            timeout: Duration::from_millis(ms),
        }
    }

    #[tokio::test]
    async fn output_is_interleaved_and_the_exit_code_kept() {
        let (_d, ws) = ws();
        let out = run_plain(
            &ws,
            &cmd("echo out; echo err >&2; exit 3", ".", 10_000),
            &[],
        )
        .await
        .expect("runs");
        assert_eq!(out.exit_code, Some(3));
        assert_eq!(out.output, "out\nerr\n");
        assert!(!out.timed_out);
    }

    #[tokio::test]
    async fn the_working_directory_is_carried_but_never_leaves_the_workspace() {
        let (_d, ws) = ws();
        std::fs::create_dir(ws.join("sub")).expect("mkdir");
        let out = run_plain(&ws, &cmd("cd sub", ".", 10_000), &[])
            .await
            .expect("runs");
        assert_eq!(out.cwd, "sub");
        let out = run_plain(&ws, &cmd("pwd", &out.cwd, 10_000), &[])
            .await
            .expect("runs");
        assert!(out.output.trim().ends_with("/sub"), "{}", out.output);
        let out = run_plain(&ws, &cmd("cd /", "sub", 10_000), &[])
            .await
            .expect("runs");
        assert_eq!(out.cwd, "sub");
        assert!(out.note.contains("outside the workspace"), "{}", out.note);
        let err = run_plain(&ws, &cmd("true", "../..", 10_000), &[])
            .await
            .expect_err("refused");
        assert!(matches!(err, ExecError::OutsideWorkspace(_)), "{err}");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_group_and_keeps_the_output_so_far() {
        let (_d, ws) = ws();
        let out = run_plain(
            &ws,
            &cmd("echo started; sleep 30 & sleep 30; echo never", ".", 300),
            &[],
        )
        .await
        .expect("runs");
        assert!(out.timed_out);
        assert_eq!(out.exit_code, None);
        assert_eq!(out.output, "started\n");
        assert!(out.note.contains("killed"), "{}", out.note);
    }

    #[tokio::test]
    async fn a_cancel_kills_the_group_at_once_and_keeps_the_output_so_far() {
        let (_d, ws) = ws();
        let marker = ws.join("survivor");
        // The background child would create the marker after 2 s if the group outlived
        // the cancel.
        let line = format!(
            "echo started; (sleep 2; touch {}) & sleep 60; echo never",
            marker.display()
        );
        let out = run(
            &ws,
            &cmd(&line, ".", 120_000),
            &[],
            &Containment::none(),
            None,
            tokio::time::sleep(Duration::from_millis(300)),
        )
        .await
        .expect("runs");
        assert!(!out.timed_out);
        assert_eq!(out.exit_code, None);
        assert_eq!(out.output, "started\n");
        assert!(out.note.contains("cancelled"), "{}", out.note);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(
            !marker.exists(),
            "a child of the cancelled command outlived it"
        );
    }

    #[tokio::test]
    async fn hidden_variables_do_not_reach_the_command() {
        let (_d, ws) = ws();
        // SAFETY-free: the variable is set on the child only, through the parent's view.
        let out = run_plain(
            &ws,
            &cmd("echo \"[$HOME]\"", ".", 10_000),
            &["HOME".to_owned()],
        )
        .await
        .expect("runs");
        assert_eq!(out.output.trim(), "[]");
    }
}
