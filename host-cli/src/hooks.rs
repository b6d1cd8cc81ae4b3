//! Hooks: the commands a session runs at its points (`pre-tool-use`, `post-tool-use`, …), from
//! the person's `[[hooks.EVENT]]` and, once approved, from the workspace: its
//! `.keel/config.toml` `[hooks]` and Claude Code's `.claude/settings.json` `hooks`.
//!
//! A workspace's hooks are commands whoever wrote the repository chose, so a session runs them
//! only after the person approved them (`keel hooks approve`, which lists each command), as
//! `.mcp.json` servers are: the approval names the SHA-256 of the workspace's hooks as keel read
//! them (event, matcher, command, timeout), so a changed, added or removed hook asks again.
//! They only tighten: a workspace hook gets no network whatever it says, and what any hook
//! answers is combined with the exec policy by maximum.
//!
//! Each hook becomes a process entry of the bundled `hooks` plugin (`GateConfig.processes`):
//! `sh -c` of a small [`wrapper`], run by the kernel in the OS sandbox with the workspace
//! writable and no network unless the person's hook says `network = true`. The plugin names the entry, never
//! a command line. The list is read once, when the context is made, so the plugin's config and
//! the entries the kernel may start are the same hooks (a file changed in between changes
//! neither).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use crate::config::{HookSetting, HookSettings, UserConfig};
use crate::project_approvals;

/// A hook's timeout when it names none, in seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 10;
/// Claude Code's default timeout for a command hook, in seconds.
const CLAUDE_DEFAULT_TIMEOUT_SECS: u64 = 60;
/// The longest a hook may run (the kernel's longest wait on a process).
const MAX_TIMEOUT_SECS: u64 = 600;
/// Largest `.claude/settings.json` keel reads.
const MAX_SETTINGS_BYTES: u64 = 1024 * 1024;
/// Claude Code's project settings, relative to the workspace.
pub const CLAUDE_SETTINGS: &str = ".claude/settings.json";
/// The events keel runs hooks at (every event a hook may name).
pub const EVENTS: &[&str] = &[
    "session-start",
    "pre-tool-use",
    "post-tool-use",
    "user-prompt-submit",
    "pre-compact",
    "stop",
    "subagent-stop",
];

/// The script each hook's process runs (`sh -c WRAPPER keel-hook COMMAND`). The plugin writes
/// `MARK LEN` and the event's JSON line (`plugins/hooks/src/logic.rs`, `wrapper_input`): a
/// line of up to 4 KiB is read with the shell's own `read`, a longer one with `head`, into a
/// file that becomes the hook's stdin, so the hook sees its input end. The hook's stdout passes
/// straight through; then `MARK CODE` and, when there is any, the first 64 KiB of its stderr
/// (`Framed::parse`). A process start is most of what a hook costs: for a short event and a
/// hook that writes no stderr, none is started besides the hook's own `sh`.
///
/// `sandboxed`: the files live in the sandbox's `/tmp`, a tmpfs of this process alone that goes
/// with it. Without the sandbox (`[sandbox] mode = "off"`) `/tmp` is the machine's, so they go
/// into a directory of `mktemp`'s making, removed after.
pub fn wrapper(sandboxed: bool) -> String {
    let (begin, input, errors, end) = if sandboxed {
        ("", "/tmp/keel-hook-in", "/tmp/keel-hook-err", "")
    } else {
        (
            "d=$(mktemp -d) || exit 125\n",
            r#""$d/i""#,
            r#""$d/e""#,
            "rm -rf \"$d\"\n",
        )
    };
    format!(
        r#"{begin}read -r k n || exit 125
if [ "$n" -le 4096 ] 2>/dev/null; then IFS= read -r l; printf '%s\n' "$l" > {input}
else head -n 1 > {input}; fi
sh -c "$1" < {input} 2> {errors}
printf '\n%s %s\n' "$k" "$?"
if [ -s {errors} ]; then head -c 65536 {errors}; fi
{end}"#
    )
}

/// Where a hook comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The person's `config.toml`.
    Config,
    /// The workspace's `.keel/config.toml`.
    Workspace,
    /// The workspace's `.claude/settings.json`.
    Claude,
}

impl Source {
    fn words(self) -> &'static str {
        match self {
            Source::Config => "your config",
            Source::Workspace => ".keel/config.toml",
            Source::Claude => CLAUDE_SETTINGS,
        }
    }
}

/// One hook as a session runs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionHook {
    pub source: Source,
    /// keel's event name.
    pub event: &'static str,
    pub matcher: String,
    pub command: String,
    pub timeout_secs: u64,
    pub network: bool,
    /// The workspace files its command names (the script, an interpreter's script argument),
    /// by content: part of what an approval covers. Left out when there are none, so the
    /// digest of a hook that runs no workspace file is what it was before files were counted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<HookFile>,
    /// Each file's approved content kept in keel's home, bound read-only over the file for
    /// the hook's process: what runs is what was read here, whatever the workspace holds
    /// later in the session. Filled by [`session_hooks`].
    #[serde(skip)]
    pub pinned: Vec<(PathBuf, PathBuf)>,
}

/// A workspace file a hook's command runs, by content.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HookFile {
    /// Where it is, relative to the workspace (links resolved).
    pub path: String,
    /// The SHA-256 of its content.
    pub sha256: String,
    /// Its content, as hashed (not part of the digest: the hash is).
    #[serde(skip)]
    content: Vec<u8>,
}

impl SessionHook {
    fn from_setting(source: Source, event: &'static str, h: &HookSetting) -> SessionHook {
        SessionHook {
            source,
            event,
            matcher: h.matcher.clone(),
            command: h.command.clone(),
            timeout_secs: h
                .timeout_secs
                .unwrap_or(DEFAULT_TIMEOUT_SECS)
                .clamp(1, MAX_TIMEOUT_SECS),
            // Only the person's own hooks may reach the network.
            network: h.network && source == Source::Config,
            files: Vec::new(),
            pinned: Vec::new(),
        }
    }
}

/// Largest workspace file a hook may run (a script; a bigger one is not a hook's script).
const MAX_HOOK_FILE_BYTES: u64 = 4 << 20;
/// Most workspace files one hook's command may name.
const MAX_HOOK_FILES: usize = 16;

/// The workspace files `command` names, read once: every word of it (split at blanks and the
/// shell's operators, quotes dropped, `$CLAUDE_PROJECT_DIR` and `$KEEL_WORKSPACE` expanded)
/// that is a regular file inside the workspace, links followed only within it. Counting too
/// many words as files costs nothing but a digest; missing one would let it change unseen.
/// An error when such a file cannot be read whole, so the hook is not run.
fn files_run_by(workspace: &Path, command: &str) -> anyhow::Result<Vec<HookFile>> {
    use std::io::Read as _;
    let ws = workspace.to_string_lossy();
    let mut expanded = command.to_owned();
    for var in ["CLAUDE_PROJECT_DIR", "KEEL_WORKSPACE"] {
        expanded = expanded
            .replace(&format!("${{{var}}}"), &ws)
            .replace(&format!("${var}"), &ws);
    }
    let Ok(root) = workspace.canonicalize() else {
        return Ok(Vec::new());
    };
    let mut files: Vec<HookFile> = Vec::new();
    let words = expanded
        .split(|c: char| c.is_whitespace() || ";|&()<>=`".contains(c))
        .map(|w| w.trim_matches(|c| c == '\'' || c == '"'))
        .filter(|w| !w.is_empty() && !w.starts_with('-') && !w.starts_with('~'));
    for word in words {
        let candidate = if Path::new(word).is_absolute() {
            PathBuf::from(word)
        } else {
            root.join(word)
        };
        let Ok(real) = candidate.canonicalize() else {
            continue;
        };
        if !real.starts_with(&root) || !real.is_file() {
            continue;
        }
        let path = real
            .strip_prefix(&root)
            .unwrap_or(&real)
            .to_string_lossy()
            .into_owned();
        if files.iter().any(|f| f.path == path) {
            continue;
        }
        if files.len() == MAX_HOOK_FILES {
            bail!("`{command}` names more than {MAX_HOOK_FILES} workspace files");
        }
        let mut content = Vec::new();
        std::fs::File::open(&real)
            .and_then(|f| f.take(MAX_HOOK_FILE_BYTES + 1).read_to_end(&mut content))
            .with_context(|| format!("{}: cannot read the file the hook runs", real.display()))?;
        if content.len() as u64 > MAX_HOOK_FILE_BYTES {
            bail!(
                "{}: larger than {} MiB; keel does not run it as a hook",
                real.display(),
                MAX_HOOK_FILE_BYTES >> 20
            );
        }
        files.push(HookFile {
            sha256: keel_registry::sha256_hex(&content),
            path,
            content,
        });
    }
    Ok(files)
}

/// Give each hook the workspace files its command runs, by content; a hook whose files
/// cannot be read is left out, with why in `problems`.
fn with_files(
    workspace: &Path,
    hooks: Vec<SessionHook>,
    problems: &mut Vec<String>,
) -> Vec<SessionHook> {
    hooks
        .into_iter()
        .filter_map(|mut h| match files_run_by(workspace, &h.command) {
            Ok(files) => {
                h.files = files;
                Some(h)
            }
            Err(e) => {
                problems.push(format!("the {} hook `{}`: {e:#}", h.event, h.command));
                None
            }
        })
        .collect()
}

/// Keep each hook's files as read in keel's home (`hook-files/<sha256>`, written whole before
/// it is named), and name them for the hook's process; a hook whose files cannot be kept is
/// left out with a warning (it would otherwise run whatever the file holds when it runs).
fn pin(home: &Path, workspace: &Path, hooks: Vec<SessionHook>) -> Vec<SessionHook> {
    let Ok(root) = workspace.canonicalize() else {
        return hooks;
    };
    let dir = home.join("hook-files");
    hooks
        .into_iter()
        .filter_map(|mut h| {
            let mut pinned = Vec::new();
            for f in &h.files {
                let copy = dir.join(&f.sha256);
                let kept = std::fs::read(&copy)
                    .is_ok_and(|held| keel_registry::sha256_hex(&held) == f.sha256)
                    || keel_registry::atomic_write(&copy, &f.content, true).is_ok();
                if !kept {
                    tracing::warn!(
                        "the {} hook `{}` does not run: keel cannot keep the content of {} in                          {} (check that keel's home is writable)",
                        h.event,
                        h.command,
                        f.path,
                        dir.display()
                    );
                    return None;
                }
                pinned.push((root.join(&f.path), copy));
            }
            h.pinned = pinned;
            Some(h)
        })
        .collect()
}

/// The workspace's own hooks as read now, and their digest.
pub struct WorkspaceHooks {
    pub hooks: Vec<SessionHook>,
    /// The SHA-256 an approval names; `None` when the workspace has no hooks.
    pub digest: Option<String>,
    /// What could not be read, and why (those files' hooks are not used).
    pub problems: Vec<String>,
}

/// `[hooks]` of the workspace's `.keel/config.toml`, read as the person's own is.
#[derive(Deserialize)]
struct ProjectFile {
    #[serde(default)]
    hooks: HookSettings,
}

/// Claude Code's settings: only `hooks` is read.
#[derive(Deserialize)]
struct ClaudeSettings {
    #[serde(default)]
    hooks: BTreeMap<String, Vec<ClaudeMatcher>>,
}

#[derive(Deserialize)]
struct ClaudeMatcher {
    #[serde(default)]
    matcher: String,
    #[serde(default)]
    hooks: Vec<ClaudeHook>,
}

#[derive(Deserialize)]
struct ClaudeHook {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    command: String,
    timeout: Option<f64>,
}

/// keel's name for a Claude Code event.
fn keel_event(claude: &str) -> Option<&'static str> {
    Some(match claude {
        "SessionStart" => "session-start",
        "UserPromptSubmit" => "user-prompt-submit",
        "PreToolUse" => "pre-tool-use",
        "PostToolUse" => "post-tool-use",
        "PreCompact" => "pre-compact",
        "Stop" => "stop",
        "SubagentStop" => "subagent-stop",
        _ => return None,
    })
}

/// The hooks of Claude Code's `settings.json` text, and what was left out.
fn claude_hooks(text: &str) -> anyhow::Result<(Vec<SessionHook>, Vec<String>)> {
    let settings: ClaudeSettings = serde_json::from_str(text)
        .context("not Claude Code settings ({\"hooks\": {\"PreToolUse\": [...]}})")?;
    let mut hooks = Vec::new();
    let mut skipped = Vec::new();
    for (event, matchers) in &settings.hooks {
        let Some(keel) = keel_event(event) else {
            skipped.push(format!("`{event}`: keel has no such event"));
            continue;
        };
        for m in matchers {
            for h in &m.hooks {
                if h.kind != "command" || h.command.trim().is_empty() {
                    skipped.push(format!(
                        "a `{event}` hook of type `{}`: only `command` hooks run",
                        h.kind
                    ));
                    continue;
                }
                let timeout = h
                    .timeout
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .map_or(CLAUDE_DEFAULT_TIMEOUT_SECS, |t| t.ceil() as u64);
                hooks.push(SessionHook {
                    source: Source::Claude,
                    event: keel,
                    matcher: m.matcher.clone(),
                    command: h.command.clone(),
                    timeout_secs: timeout.clamp(1, MAX_TIMEOUT_SECS),
                    network: false,
                    files: Vec::new(),
                    pinned: Vec::new(),
                });
            }
        }
    }
    Ok((hooks, skipped))
}

/// A workspace file keel reads for hooks: a regular file inside the workspace, not through a
/// link, bounded.
fn read_workspace_file(workspace: &Path, rel: &str) -> anyhow::Result<Option<String>> {
    use std::io::Read as _;
    let path = workspace.join(rel);
    let file = match project_approvals::open_no_follow(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!(
            "{}: cannot read it ({e}); keel reads it only as a regular file inside the \
             workspace, not through a link",
            path.display()
        ),
    };
    let inside = match (path.canonicalize(), workspace.canonicalize()) {
        (Ok(real), Ok(workspace)) => real.starts_with(workspace),
        _ => false,
    };
    if !inside || !file.metadata().is_ok_and(|m| m.is_file()) {
        bail!(
            "{}: not a regular file inside the workspace; keel does not read it",
            path.display()
        );
    }
    let mut text = String::new();
    file.take(MAX_SETTINGS_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("{}: cannot read it", path.display()))?;
    if text.len() as u64 > MAX_SETTINGS_BYTES {
        bail!(
            "{}: larger than {} KiB; keel does not read it",
            path.display(),
            MAX_SETTINGS_BYTES >> 10
        );
    }
    Ok(Some(text))
}

/// The workspace's hooks: `.keel/config.toml` `[hooks]` and `.claude/settings.json` `hooks`.
pub fn workspace_hooks(workspace: &Path) -> WorkspaceHooks {
    let mut hooks = Vec::new();
    let mut problems = Vec::new();
    match read_workspace_file(workspace, ".keel/config.toml") {
        Ok(Some(text)) => match toml::from_str::<ProjectFile>(&text) {
            Ok(file) => hooks.extend(
                file.hooks
                    .by_event()
                    .into_iter()
                    .map(|(event, h)| SessionHook::from_setting(Source::Workspace, event, h)),
            ),
            Err(e) => problems.push(format!(
                "{}: its [hooks] cannot be read: {}",
                workspace.join(".keel/config.toml").display(),
                e.message()
            )),
        },
        Ok(None) => {}
        Err(e) => problems.push(format!("{e:#}")),
    }
    match read_workspace_file(workspace, CLAUDE_SETTINGS) {
        Ok(Some(text)) => match claude_hooks(&text) {
            Ok((found, skipped)) => {
                hooks.extend(found);
                problems.extend(
                    skipped
                        .into_iter()
                        .map(|s| format!("{CLAUDE_SETTINGS}: {s}")),
                );
            }
            Err(e) => problems.push(format!(
                "{}: {e:#}",
                workspace.join(CLAUDE_SETTINGS).display()
            )),
        },
        Ok(None) => {}
        Err(e) => problems.push(format!("{e:#}")),
    }
    let hooks = with_files(workspace, hooks, &mut problems);
    let digest = (!hooks.is_empty()).then(|| digest(&hooks));
    WorkspaceHooks {
        hooks,
        digest,
        problems,
    }
}

/// The SHA-256 of hooks as a session would run them.
fn digest(hooks: &[SessionHook]) -> String {
    let canonical = serde_json::to_vec(hooks).unwrap_or_default();
    keel_registry::sha256_hex(&canonical)
}

/// The person's approvals of workspaces' hooks, by digest, in keel's sealed home.
fn store(home: &Path) -> project_approvals::Store {
    project_approvals::Store::new(home, "hook-approvals.json")
}

/// Whether the person approved these workspace hooks.
pub fn is_approved(home: &Path, workspace: &Path, found: &WorkspaceHooks) -> bool {
    found
        .digest
        .as_deref()
        .is_some_and(|d| store(home).is_approved(workspace, d))
}

/// Record the approval of the hooks with `digest` for `workspace`.
pub fn approve(home: &Path, workspace: &Path, digest: &str) -> anyhow::Result<()> {
    store(home).set(workspace, Some(digest))
}

/// Withdraw the approval of the workspace's hooks.
pub fn revoke(home: &Path, workspace: &Path) -> anyhow::Result<()> {
    store(home).set(workspace, None)
}

/// Whether an approval of an earlier content of this workspace's hooks exists.
pub fn approved_before(home: &Path, workspace: &Path) -> bool {
    store(home).has_any(workspace)
}

/// The hooks a session in `workspace` runs: the person's, then the workspace's if approved.
/// Read once here; `configure_hooks_plugin` and [`entries`] both use this list.
///
/// The workspace files each hook runs are kept as they are now (the approved content, for a
/// workspace's hook; for the person's own, what the workspace held when the session started)
/// and bound over the files for the hooks' processes, so a script changed during the session
/// — by a command, a file tool or anyone — does not run in the hook's place; a changed script
/// makes the next session ask again, as a changed command does.
pub fn session_hooks(home: &Path, workspace: &Path, config: &UserConfig) -> Vec<SessionHook> {
    let own: Vec<SessionHook> = config
        .hooks
        .by_event()
        .into_iter()
        .map(|(event, h)| SessionHook::from_setting(Source::Config, event, h))
        .collect();
    let mut problems = Vec::new();
    let mut hooks = with_files(workspace, own, &mut problems);
    for p in problems {
        tracing::warn!("one of your hooks does not run: {p}");
    }
    let found = workspace_hooks(workspace);
    if is_approved(home, workspace, &found) {
        hooks.extend(found.hooks);
    }
    pin(home, workspace, hooks)
}

/// The name of the process entry of the `n`th hook.
fn entry_name(n: usize) -> String {
    format!("hook-{}", n + 1)
}

/// The hooks a session runs (those of an event keel knows), with their places in the list.
fn running(hooks: &[SessionHook]) -> impl Iterator<Item = (usize, &SessionHook)> {
    hooks
        .iter()
        .enumerate()
        .filter(|(_, h)| EVENTS.contains(&h.event))
}

/// Lay the session's hooks into the `hooks` plugin's config (`[config.hooks]`).
pub fn configure_hooks_plugin(workspace: &Path, config: &mut UserConfig) {
    let hooks: Vec<toml::Value> = running(&config.session_hooks)
        .map(|(n, h)| {
            let mut t = toml::Table::new();
            t.insert("event".into(), h.event.into());
            t.insert("matcher".into(), h.matcher.clone().into());
            t.insert("entry".into(), entry_name(n).into());
            t.insert("command".into(), h.command.clone().into());
            t.insert(
                "timeout_ms".into(),
                toml::Value::Integer((h.timeout_secs * 1000) as i64),
            );
            let dialect = if h.source == Source::Claude {
                "claude"
            } else {
                "keel"
            };
            t.insert("dialect".into(), dialect.into());
            toml::Value::Table(t)
        })
        .collect();
    if hooks.is_empty() {
        return;
    }
    let table = config.config.entry("hooks".to_owned()).or_default();
    table.insert(
        "workspace".into(),
        workspace.to_string_lossy().into_owned().into(),
    );
    table.insert("hooks".into(), toml::Value::Array(hooks));
}

/// Whether a session loads the `hooks` plugin.
pub fn any_running(config: &UserConfig) -> bool {
    running(&config.session_hooks).next().is_some()
}

/// The process entries the `hooks` plugin may start: one per running hook, its command under
/// [`wrapper`], the workspace writable,
/// network only for the person's hook that asks for it.
pub fn entries(
    workspace: &Path,
    config: &UserConfig,
    sandboxed: bool,
) -> BTreeMap<String, keel_kernel::ProcessEntry> {
    let script = wrapper(sandboxed);
    running(&config.session_hooks)
        .map(|(n, h)| {
            let ws = workspace.to_string_lossy().into_owned();
            let entry = keel_kernel::ProcessEntry {
                command: "sh".into(),
                args: vec![
                    "-c".into(),
                    script.clone(),
                    "keel-hook".into(),
                    h.command.clone(),
                ],
                env: [
                    ("KEEL_WORKSPACE".to_owned(), ws.clone()),
                    ("CLAUDE_PROJECT_DIR".to_owned(), ws),
                ]
                .into_iter()
                .collect(),
                dirs: vec![workspace.to_path_buf()],
                hosts: if h.network {
                    vec!["*".into()]
                } else {
                    Vec::new()
                },
                pinned: h.pinned.clone(),
                ..keel_kernel::ProcessEntry::default()
            };
            (entry_name(n), entry)
        })
        .collect()
}

/// How long the kernel waits for the hooks of one event: every hook of the busiest event in
/// turn, and a margin; never less than the kernel's usual two seconds for a guard.
pub fn guard_timeout(config: &UserConfig) -> std::time::Duration {
    let longest = EVENTS
        .iter()
        .map(|event| {
            running(&config.session_hooks)
                .filter(|(_, h)| h.event == *event)
                .map(|(_, h)| h.timeout_secs)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    std::time::Duration::from_secs((longest + 2).max(2))
}

/// One line for the workspace's hooks when they wait for approval, for the start of `keel run`
/// and `keel exec`.
pub fn ignored_notice(home: &Path, workspace: &Path) -> Option<String> {
    let found = workspace_hooks(workspace);
    if found.hooks.is_empty() || is_approved(home, workspace, &found) {
        return None;
    }
    let changed = if approved_before(home, workspace) {
        " (changed since you approved them)"
    } else {
        ""
    };
    Some(format!(
        "ignored this workspace's {} hook(s){changed}: a repository's commands run only once you \
         approve them; read them with `keel hooks list`, then run `keel hooks approve`",
        found.hooks.len()
    ))
}

/// Where the person's hooks are configured.
pub fn config_file(home: &Path) -> PathBuf {
    home.join("config.toml")
}

/// A hook's source in words, for listings.
pub fn source_words(source: Source) -> &'static str {
    source.words()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unsandboxed_wrapper_frames_a_hooks_answer_and_leaves_no_files() -> anyhow::Result<()> {
        use std::io::Write as _;
        let tmp = tempfile::tempdir()?;
        let run = |line: &str| -> anyhow::Result<String> {
            let mut child = std::process::Command::new("sh")
                .args(["-c", &wrapper(false), "keel-hook"])
                .arg("cat; echo said >&2; exit 3")
                .env("TMPDIR", tmp.path())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()?;
            // The line, then more that the hook must not see: its input ends with the line.
            let mut input = format!("MARK {}\n{line}\n", line.len()).into_bytes();
            input.extend_from_slice(b"more\n");
            child.stdin.take().expect("stdin").write_all(&input)?;
            Ok(String::from_utf8_lossy(&child.wait_with_output()?.stdout).into_owned())
        };
        // A short line (the shell's `read`, backslashes and spaces kept) and a long one (`head`).
        let short = r#"  {"a":"x\\y"}"#;
        assert_eq!(run(short)?, format!("{short}\n\nMARK 3\nsaid\n"));
        let long = format!("{{\"a\":\"{}\"}}", "z".repeat(5000));
        assert_eq!(run(&long)?, format!("{long}\n\nMARK 3\nsaid\n"));
        assert_eq!(std::fs::read_dir(tmp.path())?.count(), 0);
        Ok(())
    }

    #[test]
    fn claude_settings_map_events_fields_and_timeouts() -> anyhow::Result<()> {
        let (hooks, skipped) = claude_hooks(
            r#"{"permissions": {}, "hooks": {
                "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "guard.sh", "timeout": 5}]}],
                "PostToolUse": [{"matcher": "Edit|Write", "hooks": [{"type": "command", "command": "fmt.sh"}, {"type": "prompt", "prompt": "x"}]}],
                "Notification": [{"hooks": [{"type": "command", "command": "n.sh"}]}]
            }}"#,
        )?;
        assert_eq!(hooks.len(), 2);
        assert_eq!(
            (
                hooks[1].event,
                hooks[1].matcher.as_str(),
                hooks[1].timeout_secs
            ),
            ("pre-tool-use", "Bash", 5)
        );
        assert_eq!(
            (
                hooks[0].event,
                hooks[0].command.as_str(),
                hooks[0].timeout_secs
            ),
            ("post-tool-use", "fmt.sh", CLAUDE_DEFAULT_TIMEOUT_SECS)
        );
        assert!(
            hooks
                .iter()
                .all(|h| !h.network && h.source == Source::Claude)
        );
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        Ok(())
    }

    /// A workspace's hooks run only as approved: an edit to a command is a new digest.
    #[test]
    fn a_changed_workspace_hook_is_not_approved() -> anyhow::Result<()> {
        let home = tempfile::tempdir()?;
        let ws = tempfile::tempdir()?;
        std::fs::create_dir_all(ws.path().join(".keel"))?;
        let write = |command: &str| {
            std::fs::write(
                ws.path().join(".keel/config.toml"),
                format!("[[hooks.pre-tool-use]]\ncommand = {command:?}\nnetwork = true\n[exec]\n"),
            )
        };
        write("check.sh")?;
        let found = workspace_hooks(ws.path());
        assert_eq!(found.hooks.len(), 1);
        assert!(!found.hooks[0].network, "a workspace hook gets no network");
        assert!(!is_approved(home.path(), ws.path(), &found));
        approve(
            home.path(),
            ws.path(),
            found.digest.as_deref().expect("digest"),
        )?;
        assert!(is_approved(
            home.path(),
            ws.path(),
            &workspace_hooks(ws.path())
        ));
        write("check.sh; curl evil")?;
        let changed = workspace_hooks(ws.path());
        assert!(!is_approved(home.path(), ws.path(), &changed));
        assert!(ignored_notice(home.path(), ws.path()).is_some_and(|n| n.contains("changed")));
        Ok(())
    }
}
