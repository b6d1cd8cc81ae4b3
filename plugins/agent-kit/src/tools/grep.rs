//! `grep`: regex search over the files under a path.

use std::fs;
use std::io::Read;
use std::path::Path;

use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::json;

use super::{ToolCapabilities, ToolError, ToolSpec, looks_binary, parse_input, resolve_path};

/// The tool's name.
pub const NAME: &str = "grep";
/// Matching lines shown by default; every match is still counted.
pub const DEFAULT_MAX_RESULTS: usize = 200;
/// Chars of a matching line shown before it is cut.
pub const MAX_LINE_CHARS: usize = 300;
/// Files larger than this are skipped.
pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// Directory names never descended into.
pub const SKIPPED_DIRS: [&str; 3] = [".git", "target", "node_modules"];

const EXAMPLE: &str = r#"{"pattern": "fn main", "path": "src", "glob": "*.rs"}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    #[serde(alias = "regex", alias = "query")]
    pattern: String,
    #[serde(default, alias = "dir")]
    path: Option<String>,
    #[serde(default, alias = "include", alias = "file_pattern")]
    glob: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    max_results: Option<u64>,
}

/// The tool's registration.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: NAME.into(),
        description: format!(
            "Search file contents with a regular expression (Rust regex syntax) under a workspace path; prints `path:line: text` for each matching line. Skips .git, target, node_modules and binary files. glob filters files by name (`*.rs`, `*.{{ts,tsx}}`) or by path (`src/**/*.rs`). Every match is counted; at most max_results (default {DEFAULT_MAX_RESULTS}) are shown. Use this instead of grep -r/rg in exec_shell. Example: {EXAMPLE}."
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regular expression to search for."},
                "path": {"type": "string", "description": "Workspace-relative file or directory (default: the workspace root)."},
                "glob": {"type": "string", "description": "Only search files whose name (or path, if it contains `/`) matches."},
                "case_insensitive": {"type": "boolean", "description": "Ignore case (default false)."},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "Matching lines to show (default 200)."}
            },
            "required": ["pattern"],
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

struct Search<'a> {
    re: Regex,
    glob: Option<(Regex, bool)>,
    max: usize,
    shown: Vec<String>,
    matches: usize,
    files_with_matches: usize,
    files_searched: usize,
    skipped_large: usize,
    root_rel: &'a str,
}

/// Runs the search described by `input`.
pub fn run(root: &Path, input: &serde_json::Value) -> Result<String, ToolError> {
    let input: Input = parse_input(NAME, input, EXAMPLE)?;
    let re = RegexBuilder::new(&input.pattern)
        .case_insensitive(input.case_insensitive)
        .size_limit(10 * 1024 * 1024)
        .build()
        .map_err(|e| {
            ToolError::invalid(
                NAME,
                format!("pattern is not a valid regular expression: {e}. Escape special characters such as ( [ {{ . * + ? with a backslash to search for them literally"),
            )
        })?;
    let glob = match input.glob.as_deref().filter(|g| !g.is_empty()) {
        Some(g) => Some((
            glob_to_regex(g).map_err(|e| {
                ToolError::invalid(NAME, format!("glob {g:?} is not usable ({e}); send a pattern such as \"*.rs\" or \"src/**/*.ts\""))
            })?,
            g.contains('/'),
        )),
        None => None,
    };
    let resolved = resolve_path(root, input.path.as_deref().unwrap_or("."))?;
    let rel = resolved.rel.clone();
    let meta = fs::metadata(&resolved.full).map_err(|e| ToolError::io("searching", &rel, e))?;
    let max = input
        .max_results
        .map_or(DEFAULT_MAX_RESULTS, |m| m.clamp(1, 1000) as usize);
    let mut search = Search {
        re,
        glob,
        max,
        shown: Vec::new(),
        matches: 0,
        files_with_matches: 0,
        files_searched: 0,
        skipped_large: 0,
        root_rel: &rel,
    };
    if meta.is_dir() {
        walk(&resolved.full, &rel, &mut search);
    } else {
        search.file(&resolved.full, &rel, true);
    }
    Ok(search.report(&input.pattern))
}

fn walk(dir: &Path, rel: &str, search: &mut Search<'_>) {
    let Ok(read) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<(String, bool, bool)> = read
        .filter_map(Result::ok)
        .filter_map(|e| {
            let ty = e.file_type().ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                ty.is_dir(),
                ty.is_file(),
            ))
        })
        .collect();
    entries.sort();
    for (name, is_dir, is_file) in entries {
        let child_rel = if rel == "." {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if is_dir {
            if !SKIPPED_DIRS.contains(&name.as_str()) {
                walk(&dir.join(&name), &child_rel, search);
            }
        } else if is_file {
            search.file(&dir.join(&name), &child_rel, false);
        }
    }
}

impl Search<'_> {
    fn file(&mut self, full: &Path, rel: &str, explicit: bool) {
        if !explicit && let Some((glob, by_path)) = &self.glob {
            let subject = if *by_path {
                rel
            } else {
                rel.rsplit('/').next().unwrap_or(rel)
            };
            if !glob.is_match(subject) {
                return;
            }
        }
        let Ok(mut file) = fs::File::open(full) else {
            return;
        };
        if file.metadata().is_ok_and(|m| m.len() > MAX_FILE_BYTES) {
            self.skipped_large += 1;
            return;
        }
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() || looks_binary(&bytes) {
            return;
        }
        self.files_searched += 1;
        let text = String::from_utf8_lossy(&bytes);
        let mut any = false;
        for (i, line) in text.lines().enumerate() {
            if !self.re.is_match(line) {
                continue;
            }
            any = true;
            self.matches += 1;
            if self.shown.len() < self.max {
                let count = line.chars().count();
                let shown = if count > MAX_LINE_CHARS {
                    let cut: String = line.chars().take(MAX_LINE_CHARS).collect();
                    format!("{cut}… [{count} chars]")
                } else {
                    line.to_string()
                };
                self.shown.push(format!("{rel}:{}: {shown}", i + 1));
            }
        }
        if any {
            self.files_with_matches += 1;
        }
    }

    fn report(self, pattern: &str) -> String {
        let mut out = String::new();
        let files = plural(self.files_with_matches, "file");
        if self.matches == 0 {
            out.push_str(&format!(
                "no matches for /{pattern}/ under {} ({} searched)",
                self.root_rel,
                plural(self.files_searched, "file")
            ));
        } else {
            out.push_str(&self.shown.join("\n"));
            if self.matches > self.shown.len() {
                out.push_str(&format!(
                    "\n[showing {} of {} matches in {files}; narrow the path or glob, or make the pattern more specific]",
                    self.shown.len(),
                    self.matches
                ));
            } else {
                out.push_str(&format!("\n[{} in {files}]", plural(self.matches, "match")));
            }
        }
        if self.skipped_large > 0 {
            out.push_str(&format!(
                "\n[{} larger than {} MB skipped]",
                plural(self.skipped_large, "file"),
                MAX_FILE_BYTES / (1024 * 1024)
            ));
        }
        out
    }
}

fn plural(n: usize, noun: &str) -> String {
    match (n, noun) {
        (1, _) => format!("1 {noun}"),
        (_, "match") => format!("{n} matches"),
        _ => format!("{n} {noun}s"),
    }
}

/// Translates a glob (`*`, `?`, `**`, `{a,b}`, `[abc]`) to an anchored regex.
fn glob_to_regex(glob: &str) -> Result<Regex, regex::Error> {
    let mut re = String::from("^");
    let chars: Vec<char> = glob.chars().collect();
    let mut i = 0;
    let mut in_braces = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '*' if chars.get(i + 1) == Some(&'*') => {
                if chars.get(i + 2) == Some(&'/') {
                    re.push_str("(?:.*/)?");
                    i += 2;
                } else {
                    re.push_str(".*");
                    i += 1;
                }
            }
            '*' => re.push_str("[^/]*"),
            '?' => re.push_str("[^/]"),
            '{' => {
                in_braces = true;
                re.push_str("(?:");
            }
            '}' if in_braces => {
                in_braces = false;
                re.push(')');
            }
            ',' if in_braces => re.push('|'),
            '[' => {
                let close = chars[i + 1..].iter().position(|&c| c == ']');
                match close {
                    Some(len) => {
                        let class: String = chars[i + 1..i + 1 + len].iter().collect();
                        let class = class
                            .strip_prefix('!')
                            .map_or(class.clone(), |r| format!("^{r}"));
                        re.push('[');
                        re.push_str(&class.replace('\\', "\\\\"));
                        re.push(']');
                        i += len + 1;
                    }
                    None => re.push_str("\\["),
                }
            }
            c => re.push_str(&regex::escape(&c.to_string())),
        }
        i += 1;
    }
    re.push('$');
    Regex::new(&re)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        fs::create_dir_all(p.join("src/sub")).expect("mkdir");
        fs::create_dir_all(p.join("target/debug")).expect("mkdir");
        fs::create_dir_all(p.join(".git")).expect("mkdir");
        fs::write(p.join("src/a.rs"), "fn main() {}\n// TODO one\n").expect("write");
        fs::write(p.join("src/sub/b.rs"), "// todo two\nfn helper() {}\n").expect("write");
        fs::write(p.join("src/c.ts"), "// TODO three\n").expect("write");
        fs::write(p.join("target/debug/x.rs"), "TODO hidden\n").expect("write");
        fs::write(p.join(".git/config"), "TODO hidden\n").expect("write");
        fs::write(p.join("bin.dat"), b"TODO\0binary").expect("write");
        dir
    }

    #[test]
    fn finds_matches_skipping_git_target_and_binaries() {
        let dir = tree();
        let out = run(dir.path(), &json!({"pattern": "TODO"})).expect("searches");
        assert_eq!(
            out,
            "src/a.rs:2: // TODO one\nsrc/c.ts:1: // TODO three\n[2 matches in 2 files]"
        );
        let out = run(
            dir.path(),
            &json!({"pattern": "todo", "case_insensitive": true, "glob": "*.rs"}),
        )
        .expect("searches");
        assert_eq!(
            out,
            "src/a.rs:2: // TODO one\nsrc/sub/b.rs:1: // todo two\n[2 matches in 2 files]"
        );
        let out = run(
            dir.path(),
            &json!({"pattern": "fn", "path": "src", "glob": "src/**/*.rs"}),
        )
        .expect("searches");
        assert!(out.contains("src/sub/b.rs:2: fn helper() {}"), "{out}");
        let out = run(dir.path(), &json!({"pattern": "nothing here"})).expect("searches");
        assert!(
            out.starts_with("no matches for /nothing here/ under . (3 files searched)"),
            "{out}"
        );
    }

    #[test]
    fn counts_every_match_beyond_the_cap() {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in 0..5 {
            let body: String = (0..300).map(|i| format!("hit {i}\n")).collect();
            fs::write(dir.path().join(format!("f{f}.txt")), body).expect("write");
        }
        fs::write(dir.path().join("none.txt"), "miss\n").expect("write");
        let out = run(dir.path(), &json!({"pattern": "^hit"})).expect("searches");
        assert_eq!(out.lines().count(), 201, "200 shown + summary");
        assert!(out.ends_with("[showing 200 of 1500 matches in 5 files; narrow the path or glob, or make the pattern more specific]"), "{}", out.lines().last().unwrap_or_default());
        let out = run(dir.path(), &json!({"pattern": "^hit", "max_results": 3})).expect("searches");
        assert!(out.contains("showing 3 of 1500 matches"), "{out}");
    }

    #[test]
    fn invalid_patterns_say_how_to_escape() {
        let dir = tree();
        let err = run(dir.path(), &json!({"pattern": "fn main("})).expect_err("bad regex");
        assert!(err.to_string().contains("backslash"), "{err}");
    }

    #[test]
    fn globs_translate() {
        let re = glob_to_regex("*.{ts,tsx}").expect("glob");
        assert!(re.is_match("a.ts") && re.is_match("b.tsx") && !re.is_match("c.rs"));
        let re = glob_to_regex("src/**/*.rs").expect("glob");
        assert!(re.is_match("src/a.rs") && re.is_match("src/x/y/a.rs") && !re.is_match("lib/a.rs"));
        let re = glob_to_regex("file?.[ch]").expect("glob");
        assert!(re.is_match("file1.c") && re.is_match("filex.h") && !re.is_match("file12.c"));
    }
}
