//! `write_file`: create or overwrite a file atomically.

use std::fs;
use std::path::Path;

use serde::Deserialize;
use serde_json::json;

use super::atomic::write_atomic;
use super::{ToolCapabilities, ToolError, ToolSpec, parse_input, resolve_path};

/// The tool's name.
pub const NAME: &str = "write_file";

const EXAMPLE: &str = r#"{"path": "src/lib.rs", "content": "pub fn f() {}\n"}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    #[serde(alias = "file_path", alias = "file")]
    path: String,
    #[serde(alias = "contents", alias = "text")]
    content: String,
}

/// The tool's registration.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: NAME.into(),
        description: format!(
            "Create a file or replace its whole content (parent directories are created; the write is atomic). For a change to part of an existing file use edit_file. Use this instead of heredocs or `echo >` in exec_shell. Example: {EXAMPLE}."
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Workspace-relative path of the file."},
                "content": {"type": "string", "description": "The complete new content."}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        })
        .to_string(),
        capabilities: ToolCapabilities {
            reads_files: true,
            writes_files: true,
            ..ToolCapabilities::empty()
        },
        parallel_safe: false,
    }
}

/// Writes `input.content` to `input.path`.
pub fn run(root: &Path, input: &serde_json::Value) -> Result<String, ToolError> {
    let input: Input = parse_input(NAME, input, EXAMPLE)?;
    let resolved = resolve_path(root, &input.path)?;
    let rel = resolved.rel;
    if rel == "." || resolved.full.is_dir() {
        return Err(ToolError::invalid(
            NAME,
            format!(
                "{rel} is a directory; send the path of a file inside it, e.g. \"{rel}/new.txt\""
            ),
        ));
    }
    if let Some(parent) = resolved.full.parent() {
        fs::create_dir_all(parent).map_err(|e| ToolError::Io {
            op: "creating the parent directories of",
            path: rel.clone(),
            source: e,
        })?;
    }
    let existed = resolved.full.exists();
    write_atomic(&resolved.full, input.content.as_bytes())
        .map_err(|e| ToolError::write_failed(&rel, existed, &e))?;
    let bytes = input.content.len();
    let lines = count_lines(&input.content);
    let verb = if existed { "overwrote" } else { "created" };
    Ok(format!("{verb} {rel}: wrote {bytes} bytes, {lines} lines"))
}

/// Lines as an editor counts them: a final line without a newline still counts.
pub(crate) fn count_lines(text: &str) -> usize {
    let newlines = text.bytes().filter(|&b| b == b'\n').count();
    if text.is_empty() || text.ends_with('\n') {
        newlines
    } else {
        newlines + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_parents_and_reports_bytes_and_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = run(
            dir.path(),
            &json!({"path": "a/b/c.txt", "content": "one\ntwo\n"}),
        )
        .expect("writes");
        assert_eq!(out, "created a/b/c.txt: wrote 8 bytes, 2 lines");
        assert_eq!(
            fs::read_to_string(dir.path().join("a/b/c.txt")).expect("reads"),
            "one\ntwo\n"
        );
        let out = run(
            dir.path(),
            &json!({"path": "/workspace/a/b/c.txt", "content": "x"}),
        )
        .expect("overwrites");
        assert_eq!(out, "overwrote a/b/c.txt: wrote 1 bytes, 1 lines");
    }

    #[test]
    fn refuses_directories_escapes_and_missing_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir(dir.path().join("d")).expect("mkdir");
        let err = run(dir.path(), &json!({"path": "d", "content": ""})).expect_err("dir");
        assert!(err.to_string().contains("directory"), "{err}");
        let err = run(dir.path(), &json!({"path": "../x", "content": ""})).expect_err("escape");
        assert!(err.to_string().contains(".."), "{err}");
        let err = run(dir.path(), &json!({"path": "x"})).expect_err("no content");
        assert!(err.to_string().contains("content"), "{err}");
    }

    #[test]
    fn counts_lines_like_an_editor() {
        assert_eq!(count_lines(""), 0);
        assert_eq!(count_lines("a"), 1);
        assert_eq!(count_lines("a\n"), 1);
        assert_eq!(count_lines("a\nb"), 2);
    }
}
