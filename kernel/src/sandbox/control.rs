//! The workspace's control directories ([`super::PROTECTED_IN_WORKSPACE`]) as the dispatch gate
//! sees them: whether a file tool's arguments name a path inside one. Commands and servers are
//! kept out by the sandbox's read-only binds; a tool running as a wasm plugin with the
//! workspace preopened read-write is kept out here, before it runs, whatever the approval
//! policy — so the refusal is the kernel's, not the plugin's goodwill.
//!
//! A path counts as inside a control directory when its words say so (`.git/config`,
//! `/workspace/.keel/x`, `src/../.git/hooks/pre-commit`, any ASCII case: `.GIT` is `.git` on
//! a case-insensitive file system), or when what exists of it, its symlinks followed, lands in
//! one (a `notes.txt` a command made a link to `.git/config`, a directory linked to `.git`).

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::PROTECTED_IN_WORKSPACE;

/// How deep the arguments are searched for paths.
const MAX_DEPTH: usize = 4;

/// Whether `key` names a path argument (`path`, `file_path`, `paths`, `destination`, …).
fn is_path_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    matches!(
        key.as_str(),
        "path"
            | "paths"
            | "file"
            | "files"
            | "filename"
            | "dir"
            | "directory"
            | "dest"
            | "destination"
            | "target"
            | "to"
            | "from"
            | "source"
            | "src"
    ) || ["path", "paths", "_file", "_dir", "_directory"]
        .iter()
        .any(|end| key.ends_with(end))
}

/// The first path argument of a file-writing tool's `input` that lies inside one of
/// `workspace`'s control directories, with the directory: `(path as given, directory)`.
pub(crate) fn control_path_in(workspace: &Path, input: &Value) -> Option<(String, &'static str)> {
    let mut found = None;
    visit(input, false, 0, &mut |text| {
        if found.is_none() {
            found = control_dir_of(workspace, text).map(|dir| (text.to_owned(), dir));
        }
    });
    found
}

fn visit(value: &Value, is_path: bool, depth: usize, each: &mut dyn FnMut(&str)) {
    if depth > MAX_DEPTH {
        return;
    }
    match value {
        Value::String(text) if is_path => each(text),
        Value::Array(items) => {
            for item in items {
                visit(item, is_path, depth + 1, each);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                visit(item, is_path_key(key), depth + 1, each);
            }
        }
        _ => {}
    }
}

/// The control directory `path` (as a tool with the workspace at `/workspace` reads it) lies
/// in, if any.
pub(crate) fn control_dir_of(workspace: &Path, path: &str) -> Option<&'static str> {
    let relative = workspace_relative(workspace, path)?;
    if let Some(dir) = named_control_dir(&relative) {
        return Some(dir);
    }
    // What exists of the path, its links followed, must not land in a control directory
    // either (or in what a linked control directory points to).
    let landed = resolve_existing(workspace, &relative)?;
    for dir in PROTECTED_IN_WORKSPACE {
        let control = workspace.join(dir);
        let canonical = control.canonicalize().unwrap_or(control);
        if landed.starts_with(&canonical) {
            return Some(dir);
        }
    }
    let inside = landed.strip_prefix(workspace).ok()?;
    named_control_dir(inside)
}

/// `path` relative to the workspace, `..` applied; `None` for a path outside it (which a tool
/// confined to the workspace cannot reach anyway).
fn workspace_relative(workspace: &Path, path: &str) -> Option<PathBuf> {
    let trimmed = path.trim();
    let rest = if let Some(rest) = strip_dir(trimmed, "/workspace") {
        rest
    } else if let Some(rest) = workspace.to_str().and_then(|w| strip_dir(trimmed, w)) {
        rest
    } else if trimmed.starts_with('/') || trimmed.starts_with('~') {
        return None;
    } else {
        trimmed
    };
    let mut parts = PathBuf::new();
    for component in Path::new(rest).components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !parts.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts)
}

fn strip_dir<'a>(path: &'a str, dir: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(dir.trim_end_matches('/'))?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

/// The control directory a workspace-relative path names by its words, at the root or below
/// it (`vendor/lib/.git/config`: a nested repository's hooks run as surely as the root's).
fn named_control_dir(relative: &Path) -> Option<&'static str> {
    let words: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_ascii_lowercase())
        .collect();
    PROTECTED_IN_WORKSPACE.iter().copied().find(|dir| {
        let dir_words: Vec<&str> = dir.split('/').collect();
        (0..words.len()).any(|start| {
            let rest = &words[start..];
            rest.len() >= dir_words.len() && rest.iter().zip(&dir_words).all(|(w, d)| w == d)
        })
    })
}

/// How deep below the workspace's root a nested repository's control directory is looked for
/// (`a/b/c/.git` is at depth 3), and how many directories the walk may open: a workspace
/// holding several clones, or a vendored repository, is covered; a tree built to exhaust the
/// walk is not, which `docs/ARCHITECTURE.md`'s threat model states.
const NESTED_DEPTH: usize = 3;
const NESTED_BUDGET: usize = 2048;

/// Directories the walk does not enter: build output and dependency trees, large and never
/// where a person keeps a repository they run git in.
const NOT_ENTERED: &[&str] = &["target", "node_modules"];

/// The control directories of repositories nested in `root` (not `root`'s own, which the caller
/// protects by name): found by a breadth-first walk to [`NESTED_DEPTH`] that opens at most
/// [`NESTED_BUDGET`] directories, never follows a link and never enters hidden directories
/// (whose names it still checks), `target` or `node_modules`.
pub(crate) fn nested_control_dirs(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut level = vec![root.to_path_buf()];
    let mut opened = 0;
    for depth in 0..=NESTED_DEPTH {
        let mut next = Vec::new();
        for dir in &level {
            if opened == NESTED_BUDGET {
                return found;
            }
            opened += 1;
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                // `file_type` does not follow links: a link to a directory is neither
                // entered nor bound.
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let name = entry.file_name();
                let name = name.to_string_lossy();
                let path = entry.path();
                if let Some(protected) = protected_entry(&name, &path) {
                    // The root's own are the caller's (bound by name, existing or not).
                    if depth > 0 {
                        found.push(protected);
                    }
                } else if kind.is_dir()
                    && !name.starts_with('.')
                    && !NOT_ENTERED.contains(&name.as_ref())
                {
                    next.push(path);
                }
            }
        }
        level = next;
    }
    found
}

/// What to protect for an entry named `name` at `path`: itself when it is a control directory
/// ([`PROTECTED_IN_WORKSPACE`]) or a `.git` file naming a repository elsewhere (a worktree or
/// submodule, as much a control file); `.claude/skills` for a `.claude` that holds one.
fn protected_entry(name: &str, path: &Path) -> Option<PathBuf> {
    let name = name.to_ascii_lowercase();
    for dir in PROTECTED_IN_WORKSPACE {
        match dir.split_once('/') {
            None if *dir == name => return Some(path.to_path_buf()),
            Some((first, rest)) if first == name => {
                let inner = path.join(rest);
                if std::fs::symlink_metadata(&inner).is_ok() {
                    return Some(inner);
                }
            }
            _ => {}
        }
    }
    None
}

/// Where the longest existing prefix of `workspace/relative` really is (symlinks followed),
/// with the rest appended.
fn resolve_existing(workspace: &Path, relative: &Path) -> Option<PathBuf> {
    let full = workspace.join(relative);
    let mut existing = full.as_path();
    let mut rest = Vec::new();
    loop {
        if std::fs::symlink_metadata(existing).is_ok() {
            break;
        }
        rest.push(existing.file_name()?.to_owned());
        existing = existing.parent()?;
    }
    // A dangling link resolves nowhere: where it points is what a write would create.
    let mut landed = match existing.canonicalize() {
        Ok(path) => path,
        Err(_) => {
            let target = std::fs::read_link(existing).ok()?;
            let base = existing.parent()?.canonicalize().ok()?;
            let joined = base.join(target);
            let inside = joined
                .strip_prefix(workspace)
                .ok()?
                .to_string_lossy()
                .into_owned();
            workspace.join(workspace_relative(workspace, &inside)?)
        }
    };
    for part in rest.iter().rev() {
        landed.push(part);
    }
    Some(landed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_repositories_are_found_within_the_walks_bounds() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let ws = dir.path().canonicalize()?;
        for d in [
            ".git/hooks",
            "app/.git",
            "libs/vendored/.hg",
            "a/b/deep/.jj",
            "a/b/c/too-deep/.git",
            "app/.claude/skills",
            "target/debug/x/.git",
            "node_modules/pkg/.git",
            ".cache/repo/.git",
        ] {
            std::fs::create_dir_all(ws.join(d))?;
        }
        std::fs::create_dir_all(ws.join("elsewhere/.git"))?;
        std::os::unix::fs::symlink(ws.join("elsewhere"), ws.join("linked"))?;
        let mut found: Vec<String> = nested_control_dirs(&ws)
            .iter()
            .map(|p| p.strip_prefix(&ws).unwrap_or(p).display().to_string())
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                "a/b/deep/.jj",
                "app/.claude/skills",
                "app/.git",
                "elsewhere/.git",
                "libs/vendored/.hg"
            ]
        );
        // The dispatch gate names nested ones by their words wherever they are.
        for path in [
            "app/.git/config",
            "x/y/z/w/.HG/hgrc",
            "p/.claude/skills/s/SKILL.md",
        ] {
            assert!(control_dir_of(&ws, path).is_some(), "{path}");
        }
        assert_eq!(control_dir_of(&ws, "app/git/config"), None);
        Ok(())
    }

    #[test]
    fn control_paths_are_found_by_name_and_through_links() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let ws = dir.path().canonicalize()?;
        std::fs::create_dir_all(ws.join(".git/hooks"))?;
        std::fs::create_dir_all(ws.join("src"))?;
        std::fs::write(ws.join(".git/config"), "[core]\n")?;
        std::os::unix::fs::symlink(ws.join(".git/config"), ws.join("notes.txt"))?;
        std::os::unix::fs::symlink(".git", ws.join("gitlink"))?;
        std::os::unix::fs::symlink(".keel/new", ws.join("dangling"))?;
        for (path, dir) in [
            (".git/config", ".git"),
            ("/workspace/.git/hooks/pre-commit", ".git"),
            ("src/../.git/hooks/pre-commit", ".git"),
            ("./.GIT/config", ".git"),
            (".keel/config.toml", ".keel"),
            (".keel", ".keel"),
            (".claude/skills/x/SKILL.md", ".claude/skills"),
            (".claude/hooks/guard.sh", ".claude/hooks"),
            (".hg/hgrc", ".hg"),
            (".jj/repo/config.toml", ".jj"),
            (".svn/hooks/x", ".svn"),
            ("notes.txt", ".git"),
            ("gitlink/hooks/post-checkout", ".git"),
            ("dangling", ".keel"),
        ] {
            assert_eq!(control_dir_of(&ws, path), Some(dir), "{path}");
        }
        let absolute = format!("{}/.git/config", ws.display());
        assert_eq!(control_dir_of(&ws, &absolute), Some(".git"));
        for path in [
            "src/main.rs",
            ".gitignore",
            ".github/workflows/ci.yml",
            ".claude/settings.json",
            "docs/.git-notes.md",
            "/etc/passwd",
            "../outside/.git/config",
        ] {
            assert_eq!(control_dir_of(&ws, path), None, "{path}");
        }
        let input = serde_json::json!({"path": "src/a.rs", "content": "see .git/config"});
        assert_eq!(control_path_in(&ws, &input), None);
        let input = serde_json::json!({"edits": [{"file_path": ".git/config"}]});
        assert_eq!(
            control_path_in(&ws, &input),
            Some((".git/config".to_owned(), ".git"))
        );
        Ok(())
    }
}
