//! `list_dir`: a directory's entries as a small tree.

use std::ffi::OsString;
use std::fs;
use std::path::Path;

use serde::Deserialize;
use serde_json::json;

use super::{ToolCapabilities, ToolError, ToolSpec, parse_input, resolve_path};

/// The tool's name.
pub const NAME: &str = "list_dir";
/// The deepest listing one call returns.
pub const MAX_DEPTH: u64 = 3;
/// Entries shown before the rest is summarised as "N more".
pub const MAX_ENTRIES: usize = 400;

const EXAMPLE: &str = r#"{"path": "src"} or {"path": ".", "depth": 2}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    #[serde(default, alias = "dir", alias = "directory")]
    path: Option<String>,
    #[serde(default)]
    depth: Option<u64>,
}

/// The tool's registration.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: NAME.into(),
        description: format!(
            "List a workspace directory: entries sorted by name, directories end with `/`, files show their size. depth 1 (default) to {MAX_DEPTH} descends into subdirectories; the contents of .git are not listed. Use this instead of ls/find in exec_shell. Examples: {EXAMPLE}."
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Workspace-relative directory (default: the workspace root)."},
                "depth": {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH, "description": "How many levels to list (default 1)."}
            },
            "additionalProperties": false
        })
        .to_string(),
        capabilities: ToolCapabilities {
            reads_files: true,
            writes_files: false,
            ..ToolCapabilities::empty()
        },
        parallel_safe: true,
    }
}

struct Listing {
    lines: Vec<String>,
    hidden: usize,
    /// Some name was shown as a JSON string.
    quoted: bool,
}

/// Lists the directory named by `input.path`.
pub fn run(root: &Path, input: &serde_json::Value) -> Result<String, ToolError> {
    let input: Input = parse_input(NAME, input, EXAMPLE)?;
    let resolved = resolve_path(root, input.path.as_deref().unwrap_or("."))?;
    let rel = resolved.rel;
    let meta = fs::metadata(&resolved.full).map_err(|e| ToolError::io("listing", &rel, e))?;
    if !meta.is_dir() {
        return Err(ToolError::invalid(
            NAME,
            format!(
                "{rel} is a file, not a directory; read it with read_file {{\"path\": \"{rel}\"}}"
            ),
        ));
    }
    let requested = input.depth.unwrap_or(1).max(1);
    let depth = requested.min(MAX_DEPTH) as usize;
    let mut listing = Listing {
        lines: Vec::new(),
        hidden: 0,
        quoted: false,
    };
    walk(&resolved.full, &rel, 0, depth, &mut listing)?;

    let title = if rel == "." {
        "./".to_string()
    } else {
        format!("{rel}/")
    };
    let mut out = title;
    if listing.lines.is_empty() {
        out.push_str("\n(empty directory)");
    }
    for line in &listing.lines {
        out.push('\n');
        out.push_str(line);
    }
    if listing.hidden > 0 {
        out.push_str(&format!(
            "\n[{} more entries not shown; list a subdirectory or use a smaller depth]",
            listing.hidden
        ));
    }
    if listing.quoted {
        out.push_str(
            "\n[a name in double quotes is a JSON string: it holds control characters (such as a \
             newline), shown escaped; pass it as that JSON string]",
        );
    }
    if requested > MAX_DEPTH {
        out.push_str(&format!("\n[depth reduced to the maximum of {MAX_DEPTH}]"));
    }
    Ok(out)
}

fn walk(
    dir: &Path,
    rel: &str,
    level: usize,
    depth: usize,
    listing: &mut Listing,
) -> Result<(), ToolError> {
    let read = fs::read_dir(dir).map_err(|e| ToolError::io("listing", rel, e))?;
    let mut entries: Vec<(OsString, fs::Metadata)> = read
        .filter_map(Result::ok)
        .filter_map(|e| {
            let meta = e.path().symlink_metadata().ok()?;
            Some((e.file_name(), meta))
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let indent = "  ".repeat(level);
    for (os_name, meta) in entries {
        let is_git = os_name == ".git";
        if listing.lines.len() >= MAX_ENTRIES {
            listing.hidden += 1;
            if meta.is_dir() && level + 1 < depth && !is_git {
                listing.hidden += count_entries(&dir.join(&os_name), level + 1, depth);
            }
            continue;
        }
        let name = shown_name(&os_name.to_string_lossy(), &mut listing.quoted);
        if meta.is_dir() {
            let skipped = is_git && level + 1 < depth;
            let note = if skipped {
                "  (contents not listed)"
            } else {
                ""
            };
            listing.lines.push(format!("{indent}{name}/{note}"));
            if level + 1 < depth && !skipped {
                let child_rel = format!("{rel}/{name}");
                walk(&dir.join(&os_name), &child_rel, level + 1, depth, listing)?;
            }
        } else if meta.file_type().is_symlink() {
            let target = fs::read_link(dir.join(&os_name))
                .map(|t| shown_name(&t.to_string_lossy(), &mut listing.quoted))
                .unwrap_or_else(|_| "?".into());
            listing.lines.push(format!("{indent}{name}@ -> {target}"));
        } else {
            listing
                .lines
                .push(format!("{indent}{name}  {}", human_size(meta.len())));
        }
    }
    Ok(())
}

/// A name as the listing shows it ([`keel_sanitize::sanitize::one_line_name`]); `quoted` is
/// set when it was quoted, so the listing explains it.
fn shown_name(name: &str, quoted: &mut bool) -> String {
    match keel_sanitize::sanitize::one_line_name(name) {
        Some(escaped) => {
            *quoted = true;
            escaped
        }
        None => name.to_owned(),
    }
}

fn count_entries(dir: &Path, level: usize, depth: usize) -> usize {
    let Ok(read) = fs::read_dir(dir) else {
        return 0;
    };
    read.filter_map(Result::ok)
        .map(|e| {
            let is_dir = e.path().symlink_metadata().is_ok_and(|m| m.is_dir());
            if is_dir && level + 1 < depth && e.file_name() != ".git" {
                1 + count_entries(&e.path(), level + 1, depth)
            } else {
                1
            }
        })
        .sum()
}

fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        fs::create_dir_all(p.join("src/nested")).expect("mkdir");
        fs::create_dir_all(p.join(".git/objects")).expect("mkdir");
        fs::write(p.join("b.txt"), "hello").expect("write");
        fs::write(p.join("a.txt"), vec![b'x'; 2048]).expect("write");
        fs::write(p.join("src/main.rs"), "fn main() {}\n").expect("write");
        fs::write(p.join("src/nested/deep.rs"), "").expect("write");
        fs::write(p.join(".git/HEAD"), "ref").expect("write");
        dir
    }

    #[test]
    fn lists_sorted_with_dirs_marked_and_sizes() {
        let dir = tree();
        let out = run(dir.path(), &json!({})).expect("lists");
        assert_eq!(out, "./\n.git/\na.txt  2.0 KB\nb.txt  5 B\nsrc/", "{out}");
    }

    #[test]
    fn depth_descends_but_skips_git_contents() {
        let dir = tree();
        let out = run(dir.path(), &json!({"depth": 3})).expect("lists");
        assert!(out.contains(".git/  (contents not listed)"), "{out}");
        assert!(!out.contains("HEAD"), "{out}");
        assert!(out.contains("\n  main.rs  13 B"), "{out}");
        assert!(out.contains("\n    deep.rs  0 B"), "{out}");
        let out = run(dir.path(), &json!({"path": "src", "depth": 9})).expect("lists");
        assert!(out.starts_with("src/\n"), "{out}");
        assert!(out.contains("depth reduced to the maximum of 3"), "{out}");
    }

    #[test]
    fn caps_the_entry_count_with_a_more_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        for i in 0..(MAX_ENTRIES + 7) {
            fs::write(dir.path().join(format!("f{i:04}")), "").expect("write");
        }
        let out = run(dir.path(), &json!({"path": "."})).expect("lists");
        assert_eq!(
            out.lines().count(),
            MAX_ENTRIES + 2,
            "header + entries + more line"
        );
        assert!(
            out.ends_with("[7 more entries not shown; list a subdirectory or use a smaller depth]"),
            "{out}"
        );
    }

    /// A newline in a name would otherwise show one entry as two (`evil` and `b.txt  5 B`).
    #[test]
    fn names_with_control_characters_are_shown_escaped_on_one_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("evil\nb.txt  5 B"), "x").expect("write");
        fs::write(dir.path().join("tab\there"), "").expect("write");
        fs::write(dir.path().join("plain.txt"), "").expect("write");
        let out = run(dir.path(), &json!({})).expect("lists");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 5, "header, three entries, the note: {out}");
        assert!(lines.contains(&r#""evil\nb.txt  5 B"  1 B"#), "{out}");
        assert!(lines.contains(&r#""tab\there"  0 B"#), "{out}");
        assert!(lines.contains(&"plain.txt  0 B"), "{out}");
        assert!(out.contains("JSON string"), "{out}");
        let plain = run(tempfile::tempdir().expect("tempdir").path(), &json!({})).expect("lists");
        assert!(!plain.contains("JSON string"), "{plain}");
    }

    #[test]
    fn files_and_missing_paths_are_refused_helpfully() {
        let dir = tree();
        let err = run(dir.path(), &json!({"path": "b.txt"})).expect_err("file");
        assert!(err.to_string().contains("read_file"), "{err}");
        let err = run(dir.path(), &json!({"path": "nope"})).expect_err("missing");
        assert!(err.to_string().contains("does not exist"), "{err}");
    }
}
