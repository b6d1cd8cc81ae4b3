//! The file tools. Each works on a workspace root passed in (in a guest, the preopened
//! `/workspace`), takes the model's JSON input and returns the text the model reads.
//!
//! Every tool module exposes `spec()` (what the registry needs: name, description, JSON Schema,
//! capabilities, parallel safety) and `run(root, input)`.

use std::path::Path;

pub(crate) mod atomic;
pub mod edit_file;
pub mod grep;
pub mod list_dir;
pub mod paths;
pub mod read_file;
pub mod write_file;

pub use paths::{ResolvedPath, resolve_path};

/// A tool as registered, and what it may do: the one tool type of the kernel and the agent
/// (`keel_protocol`), so nothing is lost between them.
pub use keel_protocol::{ToolCapabilities, ToolSpec};

/// Why a tool call failed. The text is read by the model: it says what went wrong, why, and
/// what to send instead.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The input did not fit the tool's schema or its rules.
    #[error("{tool}: invalid input: {message}")]
    InvalidInput {
        /// The tool.
        tool: &'static str,
        /// What was wrong and what to send instead.
        message: String,
    },
    /// The path was refused before touching the file system.
    #[error("{0}")]
    Path(String),
    /// The file or directory does not exist.
    #[error("{path} does not exist{hint}")]
    NotFound {
        /// The workspace-relative path.
        path: String,
        /// A hint with a leading separator, or empty.
        hint: String,
    },
    /// The file is binary and the tool reads only text.
    #[error(
        "{path} looks like a binary file ({size} bytes, contains NUL bytes); {tool} only handles text. Inspect it with exec_shell (e.g. `file {path}` or `xxd {path} | head`) instead."
    )]
    Binary {
        /// The tool.
        tool: &'static str,
        /// The workspace-relative path.
        path: String,
        /// Its size in bytes.
        size: u64,
    },
    /// `edit_file` found `old_string` several times and was not told which to replace.
    #[error("{0}")]
    Ambiguous(String),
    /// `edit_file` did not find `old_string`.
    #[error("{0}")]
    NoMatch(String),
    /// `write_file` or `edit_file` could not write; the file was left as it was.
    #[error("{0}")]
    WriteFailed(String),
    /// An I/O error other than not-found.
    #[error("{op} {path} failed: {source}")]
    Io {
        /// What was being done (`reading`, `writing`, …).
        op: &'static str,
        /// The workspace-relative path.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl ToolError {
    pub(crate) fn invalid(tool: &'static str, message: impl Into<String>) -> ToolError {
        ToolError::InvalidInput {
            tool,
            message: message.into(),
        }
    }

    /// A failed atomic write of `path`: what happened, that the file is as it was (the old
    /// content when it `existed`, else no file), and what to do about a full disk.
    pub(crate) fn write_failed(path: &str, existed: bool, source: &std::io::Error) -> ToolError {
        let kept = if existed {
            format!("{path} was not changed (it still has its old content)")
        } else {
            format!("{path} was not created")
        };
        let advice = match source.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                "; the disk is full: ask the person to free space before writing again"
            }
            _ => "",
        };
        ToolError::WriteFailed(format!("writing {path} failed: {source}; {kept}{advice}"))
    }

    /// Maps an I/O error, turning not-found into [`ToolError::NotFound`].
    pub(crate) fn io(op: &'static str, path: &str, source: std::io::Error) -> ToolError {
        if source.kind() == std::io::ErrorKind::NotFound {
            ToolError::NotFound {
                path: path.to_string(),
                hint: "; check the path with list_dir, or create the file with write_file".into(),
            }
        } else {
            ToolError::Io {
                op,
                path: path.to_string(),
                source,
            }
        }
    }
}

/// Parses a tool's input into its typed form, with a message the model can act on.
pub(crate) fn parse_input<T: serde::de::DeserializeOwned>(
    tool: &'static str,
    input: &serde_json::Value,
    example: &str,
) -> Result<T, ToolError> {
    if !input.is_object() {
        return Err(ToolError::invalid(
            tool,
            format!("the input must be a JSON object, e.g. {example}"),
        ));
    }
    serde_json::from_value(input.clone())
        .map_err(|e| ToolError::invalid(tool, format!("{e}; send e.g. {example}")))
}

/// The specs of all file tools, sorted by name.
pub fn all_specs() -> Vec<ToolSpec> {
    vec![
        edit_file::spec(),
        grep::spec(),
        list_dir::spec(),
        read_file::spec(),
        write_file::spec(),
    ]
}

/// Runs the file tool `name` on `input` within `root`; `None` when no file tool has that name.
pub fn run_tool(
    name: &str,
    root: &Path,
    input: &serde_json::Value,
) -> Option<Result<String, ToolError>> {
    Some(match name {
        read_file::NAME => read_file::run(root, input),
        write_file::NAME => write_file::run(root, input),
        edit_file::NAME => edit_file::run(root, input),
        list_dir::NAME => list_dir::run(root, input),
        grep::NAME => grep::run(root, input),
        _ => return None,
    })
}

/// Whether the first 8 KB of `bytes` contain a NUL byte (the usual binary heuristic).
pub(crate) fn looks_binary(bytes: &[u8]) -> bool {
    bytes.iter().take(8192).any(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_sorted_and_schemas_parse() {
        let specs = all_specs();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        for spec in &specs {
            let def = spec.def();
            assert_eq!(def.input_schema["type"], "object", "{}", spec.name);
            assert_eq!(
                spec.capabilities.writes_files, !spec.parallel_safe,
                "{}",
                spec.name
            );
            assert!(spec.capabilities.reads_files, "{}", spec.name);
        }
    }

    #[test]
    fn run_tool_dispatches_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = run_tool(
            "write_file",
            dir.path(),
            &serde_json::json!({"path": "a.txt", "content": "x\n"}),
        )
        .expect("known tool")
        .expect("writes");
        assert!(out.contains("a.txt"), "{out}");
        assert!(run_tool("nope", dir.path(), &serde_json::json!({})).is_none());
        let err = run_tool("read_file", dir.path(), &serde_json::json!("a.txt"))
            .expect("known tool")
            .expect_err("a string is not an object");
        assert!(err.to_string().contains("JSON object"), "{err}");
    }
}
