//! What a write or edit approval shows: the change the tool was asked to make, as a unified
//! diff against the file as it is now, coloured on a terminal. Everything in it came from the
//! model or from a file in the workspace, so it is bounded in lines and bytes and made safe to
//! print (no escape sequence reaches the terminal).

use std::path::Path;
use std::time::Duration;

use keel_kernel::gates::approvals::Preview;
use similar::{ChangeTag, TextDiff};

/// The most diff lines an approval shows; the rest is counted.
const MAX_LINES: usize = 60;
/// A file larger than this is not read to diff against.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// The diff gives up looking for the smallest change after this (it then shows a larger one).
const DIFF_TIMEOUT: Duration = Duration::from_millis(200);

/// `preview` as lines to show under the approval question; `workspace` resolves its path.
pub(crate) fn render(preview: &Preview, workspace: &Path, colour: bool) -> String {
    let (path, before, after, note) = match preview {
        Preview::Write { path, content } => match current(workspace, path) {
            Current::Text(before) => (path, before, content.clone(), None),
            Current::Missing => (path, String::new(), content.clone(), Some("a new file")),
            Current::Unreadable(why) => {
                let lines = content.lines().count();
                return format!(
                    "  the change: {} is replaced whole ({why}); the new content has {lines} \
                     line(s), {} bytes\n",
                    shown_name(path),
                    content.len()
                );
            }
        },
        Preview::Edit {
            path,
            old,
            new,
            all,
        } => (
            path,
            old.clone(),
            new.clone(),
            Some(if *all {
                "every occurrence of the text below"
            } else {
                "the text below, where it occurs once"
            }),
        ),
    };
    let mut out = format!(
        "  the change to {}{}:\n",
        shown_name(path),
        note.map(|n| format!(" ({n})")).unwrap_or_default()
    );
    out.push_str(&diff(&before, &after, colour));
    out
}

enum Current {
    Text(String),
    Missing,
    Unreadable(String),
}

/// The text of the file at `path` as it is now, read as for a preview (only inside the
/// workspace, at most 1 MiB, UTF-8); `None` when it is missing or cannot be shown. An editor's
/// diff (`keel acp`) starts from it.
pub(crate) fn current_text(workspace: &Path, path: &str) -> Option<String> {
    match current(workspace, path) {
        Current::Text(text) => Some(text),
        Current::Missing | Current::Unreadable(_) => None,
    }
}

/// The file at `path` as it is now, read only inside the workspace (the tool itself is confined
/// there; a path leading out is not read for the person either).
fn current(workspace: &Path, path: &str) -> Current {
    let full = workspace.join(path);
    let Ok(resolved) = full.canonicalize() else {
        return if full.symlink_metadata().is_err() {
            Current::Missing
        } else {
            Current::Unreadable("it cannot be resolved".into())
        };
    };
    let inside = workspace
        .canonicalize()
        .is_ok_and(|root| resolved.starts_with(root));
    if !inside {
        return Current::Unreadable("the path leads outside the workspace".into());
    }
    match std::fs::metadata(&resolved) {
        Ok(m) if !m.is_file() => return Current::Unreadable("it is not a regular file".into()),
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            return Current::Unreadable(format!("it is {} bytes, too large to diff here", m.len()));
        }
        Ok(_) => {}
        Err(e) => return Current::Unreadable(e.to_string()),
    }
    match std::fs::read(&resolved) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Current::Text(text),
            Err(_) => Current::Unreadable("it is not UTF-8 text".into()),
        },
        Err(e) => Current::Unreadable(e.to_string()),
    }
}

/// A unified diff of `before` → `after` with two lines of context, at most [`MAX_LINES`].
pub(crate) fn diff(before: &str, after: &str, colour: bool) -> String {
    let paint = |code: &str, line: String| {
        if colour {
            format!("\x1b[{code}m{line}\x1b[0m")
        } else {
            line
        }
    };
    let diff = TextDiff::configure()
        .timeout(DIFF_TIMEOUT)
        .diff_lines(before, after);
    let mut lines = Vec::new();
    for (i, group) in diff.grouped_ops(2).iter().enumerate() {
        if i > 0 {
            lines.push(paint("36", "  ⋮".to_owned()));
        }
        for op in group {
            for change in diff.iter_changes(op) {
                let text = shown(change.value().trim_end_matches(['\n', '\r']));
                lines.push(match change.tag() {
                    ChangeTag::Delete => paint("31", format!("  - {text}")),
                    ChangeTag::Insert => paint("32", format!("  + {text}")),
                    ChangeTag::Equal => format!("    {text}"),
                });
            }
        }
    }
    if lines.is_empty() {
        return "    (no change)\n".to_owned();
    }
    let hidden = lines.len().saturating_sub(MAX_LINES);
    lines.truncate(MAX_LINES);
    if hidden > 0 {
        lines.push(format!("  … {hidden} more line(s) of the change"));
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// Untrusted text made safe for the terminal, cut to a screen line's worth.
fn shown(text: &str) -> String {
    super::output::short(&super::output::terminal_safe(text), 200)
}

/// A path, on one line as the model sees it.
fn shown_name(path: &str) -> String {
    super::output::short(&super::output::terminal_safe_name(path), 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &str, content: &str) -> Preview {
        Preview::Write {
            path: path.into(),
            content: content.into(),
        }
    }

    #[test]
    fn a_write_shows_what_changes_in_the_file() -> std::io::Result<()> {
        let ws = tempfile::tempdir()?;
        std::fs::write(ws.path().join("a.txt"), "one\ntwo\nthree\n")?;
        let shown = render(&write("a.txt", "one\nTWO\nthree\n"), ws.path(), false);
        assert!(shown.contains("the change to a.txt:"), "{shown}");
        assert!(shown.contains("  - two\n  + TWO\n"), "{shown}");
        assert!(shown.contains("    one\n"), "{shown}");
        let coloured = render(&write("a.txt", "one\nTWO\nthree\n"), ws.path(), true);
        assert!(coloured.contains("\x1b[31m  - two\x1b[0m"), "{coloured}");
        assert!(coloured.contains("\x1b[32m  + TWO\x1b[0m"), "{coloured}");
        Ok(())
    }

    #[test]
    fn a_new_file_is_all_additions_and_a_long_change_is_cut() -> std::io::Result<()> {
        let ws = tempfile::tempdir()?;
        let content: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let shown = render(&write("new.txt", &content), ws.path(), false);
        assert!(shown.contains("new.txt (a new file)"), "{shown}");
        assert!(shown.contains("  + line 0\n"), "{shown}");
        assert!(!shown.contains("line 99"), "{shown}");
        assert!(shown.contains("… 40 more line(s) of the change"), "{shown}");
        Ok(())
    }

    #[test]
    fn escape_sequences_in_the_change_do_not_reach_the_terminal() -> std::io::Result<()> {
        let ws = tempfile::tempdir()?;
        let shown = render(
            &write("x\x1b]0;pwned\x07.txt", "ok\n\x1b[2J\x1b[31mred\n"),
            ws.path(),
            false,
        );
        assert!(!shown.contains('\x1b'), "{shown:?}");
        assert!(shown.contains("  + red"), "{shown:?}");
        Ok(())
    }

    #[test]
    fn a_path_out_of_the_workspace_is_not_read() -> std::io::Result<()> {
        let outside = tempfile::tempdir()?;
        std::fs::write(outside.path().join("secret"), "hunter2\n")?;
        let ws = tempfile::tempdir()?;
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("link"))?;
        let shown = render(&write("link", "x\n"), ws.path(), false);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("outside the workspace"), "{shown}");
        Ok(())
    }

    #[test]
    fn an_edit_shows_the_replacement() -> std::io::Result<()> {
        let edit = Preview::Edit {
            path: "src/lib.rs".into(),
            old: "a - b\n".into(),
            new: "a + b\n".into(),
            all: false,
        };
        let shown = render(&edit, Path::new("/nonexistent"), false);
        assert!(shown.contains("  - a - b\n  + a + b\n"), "{shown}");
        assert!(shown.contains("where it occurs once"), "{shown}");
        Ok(())
    }
}
