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

/// The control directory a workspace-relative path names by its words.
fn named_control_dir(relative: &Path) -> Option<&'static str> {
    let words: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_ascii_lowercase())
        .collect();
    PROTECTED_IN_WORKSPACE.iter().copied().find(|dir| {
        let dir_words: Vec<&str> = dir.split('/').collect();
        words.len() >= dir_words.len() && words.iter().zip(&dir_words).all(|(w, d)| w == d)
    })
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
