//! Resolving the paths a model writes to paths inside the workspace.
//!
//! The sandbox enforces confinement anyway; resolving here first gives the model a clear error
//! that says how to write the path instead of a bare permission failure.

use std::path::{Component, Path, PathBuf};

use super::ToolError;

/// The prefix under which the workspace appears to the model (the guest's preopened directory).
pub const WORKSPACE_PREFIX: &str = "/workspace";

/// A model-supplied path resolved against the workspace root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPath {
    /// The path to open: `root` joined with the relative path.
    pub full: PathBuf,
    /// The normalized workspace-relative path, `/`-separated; `.` for the root itself.
    pub rel: String,
}

/// Resolves `path` (relative, or prefixed with `/workspace/`, or absolute under `root`) to a
/// path inside `root`. Refuses other absolute paths and any `..` that climbs above the root.
pub fn resolve_path(root: &Path, path: &str) -> Result<ResolvedPath, ToolError> {
    if path.contains('\0') {
        return Err(ToolError::Path(format!(
            "path {path:?} contains a NUL byte; send a plain workspace-relative path such as \"src/main.rs\""
        )));
    }
    let trimmed = path.trim();
    let relative: &str = if let Some(rest) = strip_dir_prefix(trimmed, WORKSPACE_PREFIX) {
        rest
    } else if let Some(rest) = root
        .to_str()
        .filter(|r| r.len() > 1)
        .and_then(|r| strip_dir_prefix(trimmed, r.trim_end_matches('/')))
    {
        rest
    } else if trimmed.starts_with('/') || trimmed.starts_with('\\') || has_drive_prefix(trimmed) {
        return Err(ToolError::Path(format!(
            "path {trimmed:?} is absolute and outside the workspace; tools only reach files under {WORKSPACE_PREFIX}. Send a workspace-relative path such as \"src/main.rs\" (or \"{WORKSPACE_PREFIX}/src/main.rs\")"
        )));
    } else if trimmed == "~" || trimmed.starts_with("~/") {
        return Err(ToolError::Path(format!(
            "path {trimmed:?} points into a home directory, which is outside the workspace; send a workspace-relative path such as \"src/main.rs\""
        )));
    } else {
        trimmed
    };

    let mut parts: Vec<String> = Vec::new();
    for component in Path::new(relative).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(ToolError::Path(format!(
                        "path {trimmed:?} climbs out of the workspace with `..`; tools only reach files under {WORKSPACE_PREFIX}. Send a path inside the workspace, relative to its root"
                    )));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(ToolError::Path(format!(
                    "path {trimmed:?} is not a plain relative path; send a workspace-relative path such as \"src/main.rs\""
                )));
            }
        }
    }
    let mut full = root.to_path_buf();
    for part in &parts {
        full.push(part);
    }
    let rel = if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    };
    Ok(ResolvedPath { full, rel })
}

/// `path` without the directory prefix `dir` (`dir` itself → empty), or `None`.
fn strip_dir_prefix<'a>(path: &'a str, dir: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(dir)?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

fn has_drive_prefix(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(path: &str) -> Result<String, String> {
        resolve_path(Path::new("/srv/ws"), path)
            .map(|r| r.rel)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn accepts_relative_and_workspace_prefixed_paths() {
        assert_eq!(rel("src/main.rs"), Ok("src/main.rs".into()));
        assert_eq!(rel("./src//main.rs"), Ok("src/main.rs".into()));
        assert_eq!(rel("/workspace/src/main.rs"), Ok("src/main.rs".into()));
        assert_eq!(rel("/workspace"), Ok(".".into()));
        assert_eq!(rel("/srv/ws/a.txt"), Ok("a.txt".into()));
        assert_eq!(rel(""), Ok(".".into()));
        assert_eq!(rel("a/../b"), Ok("b".into()));
        let full = resolve_path(Path::new("/srv/ws"), "src/x.rs")
            .expect("resolves")
            .full;
        assert_eq!(full, PathBuf::from("/srv/ws/src/x.rs"));
    }

    #[test]
    fn refuses_escapes_with_a_way_out() {
        for bad in [
            "/etc/passwd",
            "../secret",
            "a/../../b",
            "/workspacex/a",
            "~/.ssh/id",
            "C:\\x",
        ] {
            let err = rel(bad).expect_err(bad);
            assert!(err.contains("workspace"), "{bad}: {err}");
            assert!(err.contains("send") || err.contains("Send"), "{bad}: {err}");
        }
    }
}
