//! `read_file`: a text file as numbered lines, one page at a time.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Deserialize;
use serde_json::json;

use super::{ToolCapabilities, ToolError, ToolSpec, looks_binary, parse_input, resolve_path};

/// The tool's name.
pub const NAME: &str = "read_file";
/// Lines per page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 200;
/// The most lines one call returns.
pub const MAX_LIMIT: usize = 500;
/// Bytes of numbered output per page; a page stops early when the next line would exceed it.
pub const PAGE_BYTES: usize = 16 * 1024;
/// Chars of a single line shown before it is cut.
pub const MAX_LINE_CHARS: usize = 2000;

const EXAMPLE: &str = r#"{"path": "src/main.rs"} or {"path": "src/main.rs", "offset": 201}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    #[serde(alias = "file_path", alias = "file")]
    path: String,
    #[serde(default, alias = "start_line")]
    offset: Option<u64>,
    #[serde(default, alias = "max_lines")]
    limit: Option<u64>,
}

/// The tool's registration.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: NAME.into(),
        description: format!(
            "Read a text file from the workspace as numbered lines (`  line\\ttext`). Returns {DEFAULT_LIMIT} lines per page by default (at most {MAX_LIMIT}, and at most about 16 KB); a cut page ends with the exact call that reads the next one. Use this instead of cat/head/tail/sed in exec_shell. Examples: {EXAMPLE}."
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Workspace-relative path of the file."},
                "offset": {"type": "integer", "minimum": 1, "description": "1-based line to start at (default 1)."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "description": "Lines to return (default 200, at most 500)."}
            },
            "required": ["path"],
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

/// Reads one page of the file named by `input.path`.
pub fn run(root: &Path, input: &serde_json::Value) -> Result<String, ToolError> {
    run_with(root, input, |_| None)
}

/// [`run`], where `editor` gives the file's text as the editor driving the session holds it
/// (by its workspace-relative path; `None`: read the disk). A page of the editor's text that
/// differs from the disk says so.
pub fn run_with(
    root: &Path,
    input: &serde_json::Value,
    editor: impl FnOnce(&str) -> Option<String>,
) -> Result<String, ToolError> {
    let input: Input = parse_input(NAME, input, EXAMPLE)?;
    let resolved = resolve_path(root, &input.path)?;
    let rel = resolved.rel;
    if resolved.full.is_dir() {
        return Err(ToolError::invalid(
            NAME,
            format!("{rel} is a directory; list it with list_dir {{\"path\": \"{rel}\"}}"),
        ));
    }
    let offset = input.offset.unwrap_or(1).max(1);
    let requested = input.limit.unwrap_or(DEFAULT_LIMIT as u64).max(1);
    let limit = requested.min(MAX_LIMIT as u64) as usize;
    let clamped = requested > MAX_LIMIT as u64;
    if let Some(text) = editor(&rel) {
        let unsaved = std::fs::read(&resolved.full).ok().as_deref() != Some(text.as_bytes());
        let mut out = page(text.as_bytes(), &rel, offset, limit, clamped)
            .map_err(|e| ToolError::io("reading", &rel, e))?;
        if unsaved {
            out.push_str("\n[read from the editor, which holds unsaved changes to this file]");
        }
        return Ok(out);
    }
    let mut file = File::open(&resolved.full).map_err(|e| ToolError::io("reading", &rel, e))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);

    let mut head = Vec::with_capacity(8192);
    (&mut file)
        .take(8192)
        .read_to_end(&mut head)
        .map_err(|e| ToolError::io("reading", &rel, e))?;
    if looks_binary(&head) {
        return Err(ToolError::Binary {
            tool: NAME,
            path: rel,
            size,
        });
    }
    let reader = BufReader::new(std::io::Cursor::new(head).chain(file));
    page(reader, &rel, offset, limit, clamped).map_err(|e| ToolError::io("reading", &rel, e))
}

fn page(
    mut reader: impl BufRead,
    rel: &str,
    offset: u64,
    limit: usize,
    clamped: bool,
) -> std::io::Result<String> {
    let mut out = String::new();
    let mut total: u64 = 0;
    let mut shown: usize = 0;
    let mut budget_hit = false;
    let mut lossy = false;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        total += 1;
        let n = total;
        if n < offset || shown >= limit || budget_hit {
            continue;
        }
        let mut bytes: &[u8] = &buf;
        if let Some(rest) = bytes.strip_suffix(b"\n") {
            bytes = rest;
        }
        if let Some(rest) = bytes.strip_suffix(b"\r") {
            bytes = rest;
        }
        let text = String::from_utf8_lossy(bytes);
        lossy |= matches!(text, std::borrow::Cow::Owned(_));
        let line = format_line(n, &text);
        if shown > 0 && out.len() + line.len() > PAGE_BYTES {
            budget_hit = true;
            continue;
        }
        out.push_str(&line);
        shown += 1;
    }

    if total == 0 {
        return Ok(format!("[empty file: {rel} has 0 lines]"));
    }
    if offset > total {
        return Ok(format!(
            "[no content: the file has {total} lines; offset {offset} is past the end. Read from the start with read_file {{\"path\": \"{rel}\"}}]"
        ));
    }
    let last = offset + shown as u64 - 1;
    let mut notes = Vec::new();
    if clamped {
        notes.push(format!("limit reduced to the maximum of {MAX_LIMIT} lines"));
    }
    if lossy {
        notes.push("invalid UTF-8 bytes were replaced with \u{FFFD}".to_string());
    }
    if last < total {
        let why = if budget_hit {
            format!(" (page stopped at the {} KB budget)", PAGE_BYTES / 1024)
        } else {
            String::new()
        };
        notes.push(format!(
            "showing lines {offset}-{last} of {total}{why}. Next page: read_file {{\"path\": \"{rel}\", \"offset\": {}}}",
            last + 1
        ));
    } else if offset > 1 {
        notes.push(format!(
            "showing lines {offset}-{last} of {total} (end of file)"
        ));
    }
    for note in notes {
        out.push_str(&format!("[{note}]\n"));
    }
    if out.ends_with('\n') {
        out.pop();
    }
    Ok(out)
}

fn format_line(n: u64, text: &str) -> String {
    let count = text.chars().count();
    if count > MAX_LINE_CHARS {
        let cut: String = text.chars().take(MAX_LINE_CHARS).collect();
        format!("{n:>6}\t{cut}… [line cut: {count} chars in total]\n")
    } else {
        format!("{n:>6}\t{text}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn setup(content: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("f.txt"), content).expect("writes");
        dir
    }

    fn lines(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    fn read(dir: &tempfile::TempDir, input: serde_json::Value) -> String {
        run(dir.path(), &input).expect("reads")
    }

    #[test]
    fn the_editors_text_is_read_instead_of_the_disk_and_said_when_unsaved() {
        let dir = setup("on disk\n");
        let asked = std::cell::RefCell::new(Vec::new());
        let out = run_with(dir.path(), &json!({"path": "./f.txt"}), |rel| {
            asked.borrow_mut().push(rel.to_owned());
            Some("in the editor\nline 2\n".to_owned())
        })
        .expect("reads");
        assert_eq!(asked.into_inner(), ["f.txt"]);
        assert!(
            out.starts_with("     1\tin the editor\n     2\tline 2"),
            "{out}"
        );
        assert!(
            out.ends_with("holds unsaved changes to this file]"),
            "{out}"
        );
        // The same text as the disk: nothing to say.
        let same = run_with(dir.path(), &json!({"path": "f.txt"}), |_| {
            Some("on disk\n".to_owned())
        })
        .expect("reads");
        assert_eq!(same, "     1\ton disk");
        // A path out of the workspace is refused before the editor is asked.
        let out = run_with(dir.path(), &json!({"path": "../x"}), |_| {
            panic!("asked the editor for a path out of the workspace")
        });
        assert!(out.is_err());
    }

    #[test]
    fn exactly_200_lines_fit_one_page_without_a_footer() {
        let dir = setup(&lines(200));
        let out = read(&dir, json!({"path": "f.txt"}));
        assert_eq!(out.lines().count(), 200, "{out}");
        assert!(out.starts_with("     1\tline 1\n"), "{out}");
        assert!(out.ends_with("   200\tline 200"), "{out}");
        assert!(!out.contains('['), "{out}");
    }

    #[test]
    fn line_201_is_on_the_next_page_and_the_footer_says_how_to_get_it() {
        let dir = setup(&lines(201));
        let out = read(&dir, json!({"path": "f.txt"}));
        assert_eq!(out.lines().count(), 201, "{out}");
        assert!(!out.contains("line 201\n"), "{out}");
        assert!(
            out.ends_with(
                r#"[showing lines 1-200 of 201. Next page: read_file {"path": "f.txt", "offset": 201}]"#
            ),
            "{out}"
        );
        let next = read(&dir, json!({"path": "f.txt", "offset": 201}));
        assert!(next.starts_with("   201\tline 201\n"), "{next}");
        assert!(next.contains("end of file"), "{next}");
    }

    #[test]
    fn paging_past_the_end_is_an_explicit_marker_not_an_error() {
        let dir = setup(&lines(10));
        let out = read(&dir, json!({"path": "f.txt", "offset": 11}));
        assert!(
            out.starts_with("[no content: the file has 10 lines; offset 11 is past the end"),
            "{out}"
        );
        let empty = setup("");
        assert_eq!(
            read(&empty, json!({"path": "f.txt"})),
            "[empty file: f.txt has 0 lines]"
        );
    }

    #[test]
    fn limit_is_clamped_to_500_with_a_note() {
        let dir = setup(&lines(600));
        let out = read(&dir, json!({"path": "f.txt", "limit": 1000}));
        assert!(out.contains("   500\tline 500\n"), "{out}");
        assert!(!out.contains("line 501\n"), "{out}");
        assert!(out.contains("limit reduced to the maximum of 500"), "{out}");
        let small = read(&dir, json!({"path": "f.txt", "offset": 3, "limit": 2}));
        assert!(
            small.starts_with("     3\tline 3\n     4\tline 4\n["),
            "{small}"
        );
        assert!(small.contains(r#""offset": 5"#), "{small}");
    }

    #[test]
    fn a_page_stops_at_the_byte_budget() {
        // 100 lines of 1000 chars: only 16 fit in 16 KB.
        let content: String = (0..100)
            .map(|_| format!("{}\n", "x".repeat(1000)))
            .collect();
        let dir = setup(&content);
        let out = read(&dir, json!({"path": "f.txt"}));
        let numbered = out.lines().filter(|l| !l.starts_with('[')).count();
        assert_eq!(numbered, 16, "{}", &out[out.len() - 200..]);
        assert!(out.len() <= PAGE_BYTES + 200);
        assert!(out.contains("16 KB budget"), "{}", &out[out.len() - 200..]);
        assert!(
            out.contains(r#""offset": 17"#),
            "{}",
            &out[out.len() - 200..]
        );
    }

    #[test]
    fn very_long_lines_are_cut_with_a_marker() {
        let dir = setup(&format!("short\n{}\nend\n", "é".repeat(5000)));
        let out = read(&dir, json!({"path": "f.txt"}));
        assert!(
            out.contains("… [line cut: 5000 chars in total]"),
            "{}",
            &out[..100]
        );
        assert!(out.contains("     3\tend"), "{out}");
    }

    #[test]
    fn binary_files_and_directories_are_refused_with_a_hint() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("b.bin"), [0x7f, b'E', 0, 1, 2]).expect("writes");
        let err = run(dir.path(), &json!({"path": "b.bin"})).expect_err("binary");
        assert!(err.to_string().contains("binary"), "{err}");
        assert!(err.to_string().contains("exec_shell"), "{err}");
        let err = run(dir.path(), &json!({"path": "."})).expect_err("dir");
        assert!(err.to_string().contains("list_dir"), "{err}");
        let err = run(dir.path(), &json!({"path": "missing.rs"})).expect_err("missing");
        assert!(err.to_string().contains("does not exist"), "{err}");
        let err = run(dir.path(), &json!({"path": "a", "lines": 3})).expect_err("unknown field");
        assert!(err.to_string().contains("lines"), "{err}");
    }

    #[test]
    fn crlf_and_a_missing_final_newline_are_handled() {
        let dir = setup("a\r\nb");
        assert_eq!(read(&dir, json!({"path": "f.txt"})), "     1\ta\n     2\tb");
    }
}
