//! Catastrophic command shapes and sensitive paths, for the exec policy.
//!
//! The catastrophic check is deliberately independent of the splitter and of the rule table:
//! [`scan_raw`] works on the raw text with quotes and escapes dropped and every shell operator
//! treated as a boundary, so a shape like `rm -rf /` is found wherever it is nested — inside
//! `sh -c '...'`, `$(...)`, `eval "..."`, a `find -exec`, a here-document or a Python string.
//! The list is short on purpose (restraint, as in the seed's five literals plus the disk and
//! permission wipes the issue names): everything merely risky is left to the Prompt tier, where
//! the user can veto it, because an ever-growing blocklist breeds approval fatigue.
//! The price of bluntness is that quoting a catastrophic shape as data (`echo "rm -rf /"`) is
//! refused too; that false positive is accepted.

use std::borrow::Cow;

/// A catastrophic shape found in a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catastrophe {
    /// Byte offset in the scanned text where the shape starts (0 for word scans).
    pub offset: usize,
    /// Stable identifier of the shape, e.g. `rm-recursive-root`.
    pub id: &'static str,
    /// What the shape does, for the verdict.
    pub description: String,
}

/// Top-level directories whose recursive deletion, move or permission change wrecks the system.
const SYSTEM_DIRS: &[&str] = &[
    "bin",
    "boot",
    "dev",
    "etc",
    "home",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "opt",
    "proc",
    "root",
    "sbin",
    "srv",
    "sys",
    "usr",
    "var",
    "Users",
    "System",
    "Library",
    "Applications",
    "private",
];

/// How many words after a program name the checks look at. Real commands stay far below; the
/// bound keeps hostile input (thousands of `rm` tokens in one window) linear. A target hidden
/// further out is still caught by the policy's structural checks on each parsed command.
const MAX_ARGS_SCANNED: usize = 256;

/// How far the fork-bomb search looks around each `(){`.
const FORK_BOMB_WINDOW: usize = 256;

/// Scans raw command text for catastrophic shapes, independently of the shell grammar.
pub fn scan_raw(text: &str) -> Option<Catastrophe> {
    if let Some(offset) = fork_bomb(text) {
        return Some(Catastrophe {
            offset,
            id: "fork-bomb",
            description: "a fork bomb: a function that pipes into itself in the background until the machine runs out of processes".to_string(),
        });
    }
    let items = raw_items(text);
    let mut window: Vec<(&str, usize)> = Vec::with_capacity(items.len());
    // Command windows: split at every operator, pipes included.
    let mut start = 0;
    for (i, item) in items.iter().enumerate() {
        if !matches!(item, Item::Word(..)) {
            words_of(&items[start..i], &mut window);
            if let Some(c) = check_window(&window) {
                return Some(c);
            }
            start = i + 1;
        }
    }
    words_of(&items[start..], &mut window);
    if let Some(c) = check_window(&window) {
        return Some(c);
    }
    // Pipeline windows: pipes do not end them (`find / | xargs rm -rf`).
    let mut start = 0;
    for (i, item) in items.iter().enumerate() {
        if matches!(item, Item::Hard) {
            words_of(&items[start..i], &mut window);
            if let Some(c) = check_pipeline(&window) {
                return Some(c);
            }
            start = i + 1;
        }
    }
    words_of(&items[start..], &mut window);
    check_pipeline(&window)
}

/// Scans the decoded words of one simple command (quote removal and `$'...'` decoding already
/// done by the splitter), catching shapes that only appear after decoding.
pub fn scan_words(words: &[&str]) -> Option<Catastrophe> {
    let w: Vec<(&str, usize)> = words.iter().map(|w| (*w, 0)).collect();
    check_window(&w).or_else(|| check_pipeline(&w))
}

enum Item<'a> {
    Word(Cow<'a, str>, usize),
    /// `|`: ends a command but not a pipeline.
    Soft,
    /// Any other operator or grouping character.
    Hard,
}

/// Fills `out` with the words of `items` (reusing its allocation).
fn words_of<'s>(items: &'s [Item<'_>], out: &mut Vec<(&'s str, usize)>) {
    out.clear();
    out.extend(items.iter().filter_map(|i| match i {
        Item::Word(w, o) => Some((w.as_ref(), *o)),
        _ => None,
    }));
}

/// Tokenizes raw text: quotes and backslashes are dropped (so `r"m" -rf '/'` reads `rm -rf /`),
/// `$IFS` counts as a space, operators and grouping characters are boundaries.
fn raw_items<'a>(text: &'a str) -> Vec<Item<'a>> {
    /// The token being read: borrowed from `text` until a quote or backslash forces a copy.
    struct Tok {
        start: usize,
        end: usize,
        owned: Option<Vec<u8>>,
    }
    let b = text.as_bytes();
    let mut items = Vec::with_capacity(text.len() / 4 + 4);
    let mut tok: Option<Tok> = None;
    let mut brace_depth = 0usize;
    let flush = |items: &mut Vec<Item<'a>>, tok: &mut Option<Tok>| {
        if let Some(t) = tok.take() {
            let w = match t.owned {
                Some(bytes) if bytes.is_empty() => return,
                Some(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
                None if t.end == t.start => return,
                None => Cow::Borrowed(text.get(t.start..t.end).unwrap_or("")),
            };
            items.push(Item::Word(w, t.start));
        }
    };
    // Appends byte `i` (a literal character) to the token.
    let push = |tok: &mut Option<Tok>, i: usize, byte: u8| match tok {
        None => {
            *tok = Some(Tok {
                start: i,
                end: i + 1,
                owned: None,
            })
        }
        Some(t) => match &mut t.owned {
            Some(v) => v.push(byte),
            None if t.end == i => t.end = i + 1,
            None => {
                let mut v = b[t.start..t.end].to_vec();
                v.push(byte);
                t.owned = Some(v);
            }
        },
    };
    // Marks the token as no longer a contiguous slice of the text (a character was dropped).
    let detach = |tok: &mut Option<Tok>, i: usize| match tok {
        None => {
            *tok = Some(Tok {
                start: i,
                end: i,
                owned: Some(Vec::new()),
            })
        }
        Some(t) => {
            if t.owned.is_none() {
                t.owned = Some(b[t.start..t.end].to_vec());
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\r' => {
                flush(&mut items, &mut tok);
                i += 1;
            }
            b'\n' | b';' | b'&' | b'(' | b')' | b'`' => {
                if c == b'(' {
                    // `$(`: drop the `$`.
                    if let Some(t) = &mut tok {
                        match &mut t.owned {
                            Some(v) if v.last() == Some(&b'$') => {
                                v.pop();
                            }
                            None if t.end > t.start && b[t.end - 1] == b'$' => t.end -= 1,
                            _ => {}
                        }
                    }
                }
                flush(&mut items, &mut tok);
                items.push(Item::Hard);
                i += 1;
            }
            b'|' => {
                flush(&mut items, &mut tok);
                if b.get(i + 1) == Some(&b'|') {
                    items.push(Item::Hard);
                    i += 2;
                } else {
                    items.push(Item::Soft);
                    i += 1;
                }
            }
            b'{' if i > 0 && b[i - 1] == b'$' && tok.is_some() => {
                if text.get(i..).is_some_and(|t| t.starts_with("{IFS}")) {
                    // `${IFS}` is a space.
                    if let Some(t) = &mut tok {
                        match &mut t.owned {
                            Some(v) => {
                                v.pop();
                            }
                            None => t.end -= 1,
                        }
                    }
                    flush(&mut items, &mut tok);
                    i += 5;
                } else {
                    brace_depth += 1;
                    push(&mut tok, i, c);
                    i += 1;
                }
            }
            b'}' if brace_depth > 0 => {
                brace_depth -= 1;
                push(&mut tok, i, c);
                i += 1;
            }
            b'{' | b'}' => {
                flush(&mut items, &mut tok);
                items.push(Item::Hard);
                i += 1;
            }
            b'\'' | b'"' => {
                detach(&mut tok, i);
                i += 1;
            }
            b'\\' => {
                detach(&mut tok, i);
                if let Some(&n) = b.get(i + 1) {
                    if n != b'\n' {
                        push(&mut tok, i + 1, n);
                    }
                    i += 2;
                } else {
                    i += 1;
                }
            }
            b'$' if text.get(i..).is_some_and(|t| t.starts_with("$IFS")) => {
                flush(&mut items, &mut tok);
                i += 4;
            }
            _ => {
                push(&mut tok, i, c);
                i += 1;
            }
        }
    }
    flush(&mut items, &mut tok);
    items
}

fn basename(w: &str) -> &str {
    match w.as_bytes().iter().rposition(|&b| b == b'/') {
        // `/` is ASCII, so the byte after it starts a character.
        Some(i) => w.get(i + 1..).unwrap_or(""),
        None => w,
    }
}

/// Cheap pre-filter: could `word` be one of the programs `check_window` looks at?
fn may_matter(word: &str) -> bool {
    let b = basename(word).as_bytes();
    matches!(
        b.first(),
        Some(b'r' | b'm' | b'd' | b't' | b's' | b'c' | b'i' | b'p' | b'k' | b'w' | b'f' | b'x')
    )
}

fn is_short_flag(a: &str) -> bool {
    a.len() > 1 && a.starts_with('-') && !a.starts_with("--")
}

/// Checks one command-sized window of words.
fn check_window(w: &[(&str, usize)]) -> Option<Catastrophe> {
    for (j, &(word, off)) in w.iter().enumerate() {
        let has_gt = word.as_bytes().contains(&b'>');
        if !has_gt && !may_matter(word) {
            continue;
        }
        let rest = &w[j + 1..(j + 1 + MAX_ARGS_SCANNED).min(w.len())];
        let hit = |id: &'static str, description: String| {
            Some(Catastrophe {
                offset: off,
                id,
                description,
            })
        };
        match basename(word) {
            "rm" => {
                if let Some(d) = rm_catastrophe(rest.iter().map(|x| x.0)) {
                    return hit("rm-recursive-root", d);
                }
            }
            n if n.starts_with("mkfs")
                || matches!(n, "mke2fs" | "mkswap" | "wipefs" | "mkntfs") =>
            {
                if let Some(dev) = rest.iter().find(|x| is_block_device(x.0)) {
                    return hit(
                        "format-disk",
                        format!("`{n}` on `{}` destroys the filesystem on that disk", dev.0),
                    );
                }
            }
            "dd" => {
                for (a, _) in rest {
                    if let Some(of) = a.strip_prefix("of=")
                        && is_block_device(of)
                    {
                        return hit(
                            "dd-to-disk",
                            format!("`dd of={of}` overwrites a raw disk device"),
                        );
                    }
                }
            }
            "tee" | "shred" => {
                if let Some(dev) = rest.iter().find(|x| is_block_device(x.0)) {
                    return hit(
                        "write-disk",
                        format!(
                            "`{}` writes over the raw disk device `{}`",
                            basename(word),
                            dev.0
                        ),
                    );
                }
            }
            "cp" | "install" | "mv" | "pv" => {
                let pos: Vec<&str> = rest
                    .iter()
                    .map(|x| x.0)
                    .filter(|a| !a.starts_with('-'))
                    .collect();
                if let Some(last) = pos.last()
                    && is_block_device(last)
                    && pos.len() >= 2
                {
                    return hit(
                        "write-disk",
                        format!("copying onto the raw disk device `{last}` destroys it"),
                    );
                }
                if basename(word) == "mv"
                    && pos.len() >= 2
                    && let Some(src) = pos[..pos.len() - 1]
                        .iter()
                        .find(|p| is_catastrophic_target(p))
                {
                    return hit(
                        "mv-root",
                        format!(
                            "`mv {src} ...` moves away a directory the system or the user depends on"
                        ),
                    );
                }
            }
            "chmod" | "chown" | "chgrp" => {
                let recursive = rest
                    .iter()
                    .any(|(a, _)| *a == "--recursive" || (is_short_flag(a) && a.contains('R')));
                if recursive
                    && let Some(t) = rest
                        .iter()
                        .find(|(a, _)| !a.starts_with('-') && is_catastrophic_target(a))
                {
                    return hit(
                        "recursive-permissions-root",
                        format!(
                            "recursive `{}` on `{}` rewrites permissions or owners of the whole system or home",
                            basename(word),
                            t.0
                        ),
                    );
                }
            }
            "kill" | "pkill" if rest.iter().skip(1).any(|(a, _)| *a == "-1") => {
                return hit(
                    "kill-all",
                    "`kill ... -1` signals every process the user can reach".to_string(),
                );
            }
            _ => {}
        }
        // Redirections onto a disk device (`> /dev/sda`, `>/dev/nvme0n1`).
        if !has_gt {
            continue;
        }
        if let Some(gt) = word.rfind('>') {
            let target = &word[gt + 1..];
            let target = if target.is_empty() {
                rest.first().map_or("", |x| x.0)
            } else {
                target
            };
            if is_block_device(target) || normalize_path(target) == "/proc/sysrq-trigger" {
                return hit(
                    "redirect-to-disk",
                    format!("redirecting output onto `{target}` overwrites a raw device"),
                );
            }
        }
    }
    None
}

/// Checks a pipeline-sized window (pipes do not split it).
fn check_pipeline(w: &[(&str, usize)]) -> Option<Catastrophe> {
    let is_deleter = |a: &str| matches!(basename(a), "rm" | "unlink" | "shred" | "rmdir");
    for (j, &(word, off)) in w.iter().enumerate() {
        if !may_matter(word) {
            continue;
        }
        let rest = &w[j + 1..(j + 1 + MAX_ARGS_SCANNED).min(w.len())];
        match basename(word) {
            "find" => {
                let Some(root) = rest
                    .iter()
                    .map(|x| x.0)
                    .take_while(|a| !a.starts_with('-') && *a != "!" && *a != "(")
                    .find(|s| is_catastrophic_target(s))
                else {
                    continue;
                };
                // One pass: `-delete`, or a deleting program after `-exec`/`-ok`/`xargs`.
                let mut runner_seen = false;
                let deletes = rest.iter().any(|(a, _)| {
                    if matches!(*a, "-exec" | "-execdir" | "-ok" | "-okdir" | "xargs") {
                        runner_seen = true;
                    }
                    *a == "-delete" || (runner_seen && is_deleter(a))
                });
                if deletes {
                    return Some(Catastrophe {
                        offset: off,
                        id: "find-delete-root",
                        description: format!(
                            "`find {root} ...` deleting what it finds removes files across `{root}`"
                        ),
                    });
                }
            }
            "xargs" => {
                let Some(k) = rest.iter().position(|(a, _)| basename(a) == "rm") else {
                    continue;
                };
                let recursive = rest[k + 1..].iter().any(|(a, _)| {
                    *a == "--recursive"
                        || (is_short_flag(a) && (a.contains('r') || a.contains('R')))
                });
                if !recursive {
                    continue;
                }
                let before = &w[j.saturating_sub(MAX_ARGS_SCANNED)..j];
                if let Some(t) = before.iter().find(|(a, _)| is_catastrophic_target(a)) {
                    return Some(Catastrophe {
                        offset: off,
                        id: "xargs-rm-root",
                        description: format!(
                            "`xargs rm -r` fed from a listing of `{}` deletes across it",
                            t.0
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether the arguments following `rm` make it catastrophic; returns a description.
fn rm_catastrophe<'a>(args: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut recursive = false;
    let mut no_preserve = false;
    let mut after_dashes = false;
    let mut targets = Vec::new();
    for a in args {
        if !after_dashes && a == "--" {
            after_dashes = true;
            continue;
        }
        if !after_dashes && a.starts_with("--") {
            match a {
                "--recursive" => recursive = true,
                "--no-preserve-root" => no_preserve = true,
                _ => {}
            }
            continue;
        }
        if !after_dashes && is_short_flag(a) {
            if a.contains('r') || a.contains('R') {
                recursive = true;
            }
            continue;
        }
        targets.push(a);
    }
    if no_preserve {
        return Some(
            "`rm --no-preserve-root` exists only to delete the whole filesystem".to_string(),
        );
    }
    if recursive && let Some(t) = targets.iter().find(|t| is_catastrophic_target(t)) {
        return Some(format!(
            "`rm -r {t}` deletes the whole filesystem or a home directory"
        ));
    }
    None
}

/// Finds a fork bomb (`:(){ :|:& };:` and renamed variants); returns its offset.
fn fork_bomb(text: &str) -> Option<usize> {
    if !text.contains('(') && !text.contains("function") {
        return None;
    }
    let first = text.find("(){").or_else(|| text.find('(')).unwrap_or(0);
    let s: String = text
        .chars()
        .filter(|c| !c.is_whitespace() && !matches!(c, '\'' | '"' | '\\'))
        .collect();
    let delims = |c: char| matches!(c, ';' | '&' | '|' | '(' | ')' | '{' | '}');
    // The body after `{`, up to its `}` (bounded so hostile input stays linear).
    let body_at = |from: usize| -> &str {
        let body = prefix(s.get(from..).unwrap_or(""), FORK_BOMB_WINDOW);
        &body[..body.find('}').unwrap_or(body.len())]
    };
    let is_bomb = |name: &str, body: &str| {
        !name.is_empty()
            && body.contains('&')
            && body.match_indices(name).any(|(i, _)| {
                body[i + name.len()..]
                    .strip_prefix('|')
                    .is_some_and(|r| r.starts_with(name))
            })
    };
    let mut search = 0;
    while let Some(rel) = s.get(search..).and_then(|t| t.find("(){")) {
        let at = search + rel;
        let mut look = at.saturating_sub(FORK_BOMB_WINDOW);
        while !s.is_char_boundary(look) {
            look -= 1;
        }
        let head = &s[look..at];
        let mut name = &head[head.rfind(delims).map_or(0, |p| p + 1)..];
        if let Some(n) = name.strip_prefix("function")
            && !n.is_empty()
        {
            name = n;
        }
        if is_bomb(name, body_at(at + 3)) {
            return Some(first);
        }
        search = at + 3;
    }
    // `function name { name | name & }`
    let mut search = 0;
    while let Some(rel) = s.get(search..).and_then(|t| t.find("function")) {
        let at = search + rel + "function".len();
        let window = prefix(s.get(at..).unwrap_or(""), FORK_BOMB_WINDOW);
        if let Some(brace) = window.find('{') {
            let name = window[..brace].trim_end_matches("()");
            if is_bomb(name, body_at(at + brace + 1)) {
                return Some(first);
            }
        }
        search = at;
    }
    None
}

/// The first `n` bytes of `s`, shortened to a character boundary.
fn prefix(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Normalizes a path lexically: `$HOME`/`${HOME}` become `~`, `//` and `.` collapse, `..` is
/// resolved (never above `/`; above `~` counts as `/`), a trailing `/` is dropped.
pub fn normalize_path(p: &str) -> String {
    let p = p.trim();
    let (prefix, rest) = if let Some(r) = p.strip_prefix("${HOME}") {
        ("~", r)
    } else if let Some(r) = p
        .strip_prefix("$HOME")
        .filter(|r| r.is_empty() || r.starts_with('/'))
    {
        ("~", r)
    } else if p == "~" || p.starts_with("~/") {
        ("~", &p[1..])
    } else if p.starts_with('/') {
        ("/", p)
    } else {
        ("", p)
    };
    if prefix == "~" && !(rest.is_empty() || rest.starts_with('/')) {
        return p.to_string();
    }
    let mut parts: Vec<&str> = Vec::new();
    let mut escaped_home = false;
    for c in rest.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if prefix == "~" {
                    escaped_home = true;
                } else if prefix.is_empty() {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    if escaped_home {
        // `~/..` is above the home directory: treat as the root, the conservative reading.
        return format!("/{}", parts.join("/"));
    }
    match prefix {
        "~" if parts.is_empty() => "~".to_string(),
        "~" => format!("~/{}", parts.join("/")),
        "/" => format!("/{}", parts.join("/")),
        _ if parts.is_empty() => ".".to_string(),
        _ => parts.join("/"),
    }
}

/// Whether `p` names the filesystem root, a home directory, or a top-level system directory
/// (optionally with a trailing `/*`): the targets whose recursive deletion is catastrophic.
pub fn is_catastrophic_target(p: &str) -> bool {
    // Every catastrophic target names `/`, a home (`~`, `$HOME`) or is a brace expansion.
    if !matches!(p.as_bytes().first(), Some(b'/' | b'~' | b'$' | b'{')) {
        return false;
    }
    // `/{bin,etc}` is two targets to the shell.
    if let Some(alternatives) = expand_braces(p) {
        return alternatives.iter().any(|a| is_catastrophic_target(a));
    }
    let n = normalize_path(p);
    if glob_reaches_top_level(&n) {
        return true;
    }
    let n = n.as_str();
    if matches!(n, "/" | "/*" | "~" | "~/*" | "/.*" | "~/.*") {
        return true;
    }
    if let Some(user) = n.strip_prefix('~') {
        // `~bob`, `~bob/*`: another user's home.
        let user = user.strip_suffix("/*").unwrap_or(user);
        if !user.is_empty() && !user.contains('/') {
            return true;
        }
    }
    if let Some(rest) = n.strip_prefix('/') {
        let rest = rest.strip_suffix("/*").unwrap_or(rest);
        if !rest.contains('/') && SYSTEM_DIRS.contains(&rest) {
            return true;
        }
        for homes in ["home/", "Users/"] {
            if let Some(user) = rest.strip_prefix(homes)
                && !user.is_empty()
                && !user.contains('/')
            {
                return true;
            }
        }
        if let Some(sub) = rest.strip_prefix("usr/")
            && matches!(
                sub,
                "bin" | "lib" | "lib64" | "sbin" | "share" | "local" | "include"
            )
        {
            return true;
        }
    }
    false
}

/// Expands the first unquoted `{a,b,...}` group (one level, at most 16 alternatives), or
/// `None` if there is none.
fn expand_braces(p: &str) -> Option<Vec<String>> {
    let open = p.find('{')?;
    if open > 0 && p.as_bytes()[open - 1] == b'$' {
        return None; // `${VAR}`
    }
    let close = open + p[open..].find('}')?;
    let inner = &p[open + 1..close];
    if !inner.contains(',') || inner.contains('{') {
        return None;
    }
    let parts: Vec<&str> = inner.split(',').take(16).collect();
    Some(
        parts
            .iter()
            .map(|part| format!("{}{part}{}", &p[..open], &p[close + 1..]))
            .collect(),
    )
}

/// Whether a glob in the first component under `/` or `~` could match a system directory or
/// everything in a home directory (`/e*`, `/???`, `/[eu]*`, `~/.*`).
fn glob_reaches_top_level(n: &str) -> bool {
    let Some(first) = n
        .strip_prefix('/')
        .map(|r| r.split('/').next().unwrap_or(r))
    else {
        return false;
    };
    if !first.contains(['*', '?', '[']) {
        return false;
    }
    SYSTEM_DIRS
        .iter()
        .any(|d| glob_match(first.as_bytes(), d.as_bytes()))
}

/// A small shell-glob matcher (`*`, `?`, `[...]`), iterative, for one path component.
fn glob_match(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pat.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
                continue;
            }
            Some(b'?') => {
                p += 1;
                n += 1;
                continue;
            }
            Some(b'[') => {
                if let Some(len) = pat[p..].iter().position(|&c| c == b']') {
                    let set = &pat[p + 1..p + len];
                    let (negate, set) = match set.first() {
                        Some(b'!' | b'^') => (true, &set[1..]),
                        _ => (false, set),
                    };
                    if class_contains(set, name[n]) != negate {
                        p += len + 1;
                        n += 1;
                        continue;
                    }
                } else if name[n] == b'[' {
                    p += 1;
                    n += 1;
                    continue;
                }
            }
            Some(&c) if c == name[n] => {
                p += 1;
                n += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((sp, sn)) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// Whether a glob character class body (`a-z0`) contains `c`.
fn class_contains(set: &[u8], c: u8) -> bool {
    let mut i = 0;
    while i < set.len() {
        if i + 2 < set.len() && set[i + 1] == b'-' {
            if (set[i]..=set[i + 2]).contains(&c) {
                return true;
            }
            i += 3;
        } else {
            if set[i] == c {
                return true;
            }
            i += 1;
        }
    }
    false
}

/// Whether `p` is a raw disk or memory device (`/dev/sda`, `/dev/nvme0n1`, `/dev/mem`, ...).
pub fn is_block_device(p: &str) -> bool {
    if !p.contains("dev") {
        return false;
    }
    let n = normalize_path(p);
    let Some(dev) = n.strip_prefix("/dev/") else {
        return false;
    };
    const PREFIXES: &[&str] = &[
        "sd", "hd", "vd", "xvd", "nvme", "mmcblk", "disk", "rdisk", "dm-", "md", "mapper/", "nbd",
        "sr",
    ];
    PREFIXES.iter().any(|p| dev.starts_with(p)) || matches!(dev, "mem" | "kmem" | "port")
}

/// Paths under the home directory (relative to it) that must never be written by the agent:
/// shell startup files and credential stores (persistence and secret theft), and keel's own
/// configuration (the agent must not loosen its own policy).
const HOME_SENSITIVE: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".config/fish",
    ".ssh",
    ".gnupg",
    ".aws",
    ".kube",
    ".docker",
    ".gitconfig",
    ".git-credentials",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".cargo/config",
    ".cargo/config.toml",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".config/autostart",
    ".config/systemd",
    ".local/bin",
    ".keel",
    ".config/keel",
    ".config/gh",
    ".pam_environment",
    ".xprofile",
    ".xinitrc",
    ".config/git",
];

/// System locations that must never be written by the agent.
const SYSTEM_SENSITIVE: &[(&str, &str)] = &[
    ("/etc", "system configuration under /etc"),
    ("/boot", "the boot loader and kernel under /boot"),
    ("/bin", "system programs under /bin"),
    ("/sbin", "system programs under /sbin"),
    ("/lib", "system libraries under /lib"),
    ("/lib32", "system libraries under /lib32"),
    ("/lib64", "system libraries under /lib64"),
    ("/usr", "system files under /usr"),
    ("/sys", "kernel settings under /sys"),
    ("/proc", "kernel settings under /proc"),
    ("/root", "the root user's home"),
    ("/var/spool/cron", "scheduled jobs"),
    ("/var/lib", "system state under /var/lib"),
    ("/System", "system files under /System"),
    ("/Library", "system files under /Library"),
];

/// The path relative to a home directory (`~/x`, `/home/u/x`, `/Users/u/x`), if it is in one.
fn home_relative(n: &str) -> Option<&str> {
    if let Some(r) = n.strip_prefix("~/") {
        return Some(r);
    }
    for homes in ["/home/", "/Users/"] {
        if let Some(r) = n.strip_prefix(homes) {
            return r.split_once('/').map(|(_, rest)| rest);
        }
    }
    None
}

fn under(path: &str, dir: &str) -> bool {
    path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// Why writing to `p` is forbidden, if it is a sensitive target (system files, raw devices,
/// shell startup files, credential stores, git hooks and config, keel's own config).
pub fn sensitive_write(p: &str) -> Option<&'static str> {
    let n = normalize_path(p);
    if is_block_device(&n) {
        return Some("a raw disk or memory device");
    }
    if n == "/" || n == "/*" {
        return Some("the filesystem root");
    }
    if let Some(dev) = n.strip_prefix("/dev/") {
        let harmless = matches!(
            dev,
            "null" | "zero" | "full" | "random" | "urandom" | "stdout" | "stderr" | "stdin" | "tty"
        ) || ["fd/", "shm/", "pts/", "tcp/", "udp/"]
            .iter()
            .any(|p| dev.starts_with(p));
        return (!harmless).then_some("a device file");
    }
    if n == "/proc/sysrq-trigger" {
        return Some("the kernel's emergency control file");
    }
    for (dir, why) in SYSTEM_SENSITIVE {
        if under(&n, dir) {
            return Some(why);
        }
    }
    if let Some(rel) = home_relative(&n)
        && HOME_SENSITIVE.iter().any(|s| under(rel, s))
    {
        return Some(
            "a shell startup file, credential store or keel's own config in the home directory",
        );
    }
    if n.contains(".git/hooks/") || n.ends_with(".git/hooks") {
        return Some("a git hook, which runs on the next git command");
    }
    if n.ends_with(".git/config") || n == ".git/config" {
        return Some("the repository's git config, which can name commands git runs");
    }
    None
}

/// Why reading `p` exposes secrets, if it is a credential file.
pub fn credential_path(p: &str) -> Option<&'static str> {
    let p = p.trim_start_matches('@');
    if p.is_empty() {
        return None;
    }
    // Cheap pre-filters: every credential path below contains `.`, `/` or `_`, and one of HINTS.
    if !p.bytes().any(|b| matches!(b, b'.' | b'/' | b'_')) {
        return None;
    }
    const HINTS: &[&str] = &[
        "ssh",
        "aws",
        "env",
        "shadow",
        "sudoers",
        "netrc",
        "credential",
        "docker",
        "kube",
        "npmrc",
        "pypirc",
        "gnupg",
        "hosts.yml",
        "password",
        "vault",
        "pgpass",
        "my.cnf",
        "gcloud",
        "azure",
        "id_",
        ".pem",
        ".key",
        ".p12",
        ".pfx",
    ];
    if !HINTS.iter().any(|h| p.contains(h)) {
        return None;
    }
    let n = normalize_path(p);
    if matches!(
        n.as_str(),
        "/etc/shadow" | "/etc/gshadow" | "/etc/sudoers" | "/etc/master.passwd"
    ) || under(&n, "/etc/sudoers.d")
        || n.starts_with("/etc/ssh/ssh_host_")
    {
        return Some("system password or key file");
    }
    if let Some(rel) = home_relative(&n) {
        const HOME_SECRETS: &[&str] = &[
            ".ssh",
            ".aws",
            ".netrc",
            ".git-credentials",
            ".docker/config.json",
            ".kube/config",
            ".npmrc",
            ".pypirc",
            ".gnupg",
            ".cargo/credentials",
            ".cargo/credentials.toml",
            ".config/gh/hosts.yml",
            ".password-store",
            ".vault-token",
            ".pgpass",
            ".my.cnf",
            ".config/gcloud",
            ".azure",
        ];
        if HOME_SECRETS.iter().any(|s| under(rel, s)) {
            return Some("a credential store in the home directory");
        }
    }
    let base = n.rsplit('/').next().unwrap_or(&n);
    if matches!(base, "id_rsa" | "id_dsa" | "id_ecdsa" | "id_ed25519") {
        return Some("an SSH private key");
    }
    if base == ".env"
        || (base.starts_with(".env.")
            && !matches!(
                base,
                ".env.example" | ".env.sample" | ".env.template" | ".env.dist"
            ))
    {
        return Some("an environment file, which usually holds secrets");
    }
    if [".pem", ".key", ".p12", ".pfx"]
        .iter()
        .any(|e| base.ends_with(e))
    {
        return Some("key material");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_scan_finds_nested_shapes() {
        for s in [
            "rm -rf /",
            "rm -rf /*",
            "rm -rf ~",
            "rm -rf $HOME",
            "rm -fr /",
            "rm -r -f /",
            "rm -Rf ~/",
            "sudo rm -rf --no-preserve-root /",
            "rm --recursive --force /",
            "cd /tmp && rm -rf /",
            "sh -c 'rm -rf /'",
            "echo $(rm -rf ~)",
            "eval \"rm -rf /\"",
            "r\\m -rf '/'",
            "rm${IFS}-rf${IFS}/",
            "find / -exec rm -rf {} \\;",
            "find / -name '*.log' -exec rm {} \\;",
            "find ~ -type f -delete",
            "find / | xargs rm -rf",
            ":(){ :|:& };:",
            "bomb() { bomb | bomb & }; bomb",
            "mkfs.ext4 /dev/sda1",
            "dd if=/dev/zero of=/dev/sda bs=1M",
            "echo x > /dev/sda",
            "cat img >/dev/nvme0n1",
            "chmod -R 777 /",
            "chown -R nobody /etc",
            "mv ~ /dev/null",
            "kill -9 -1",
            "python3 -c \"import os; os.system('rm -rf /')\"",
            "rm -rf /tmp/../",
            "rm -rf /usr",
            "rm -rf /{bin,etc}",
            "rm -rf /e*",
            "rm -rf /???",
            "rm -rf /[e]tc",
            "rm -rf ~root",
            "rm -rf $HOME/..",
            "rm -rf /[a-f]*",
        ] {
            assert!(scan_raw(s).is_some(), "{s}");
        }
    }

    #[test]
    fn raw_scan_leaves_ordinary_commands_alone() {
        for s in [
            "rm -rf ./build",
            "rm -rf target/debug",
            "rm /tmp/x",
            "rm -f /",
            "find . -name '*.o' -delete",
            "find / -name '*.log'",
            "chmod -R 755 ./dist",
            "chmod 644 /tmp/x",
            "dd if=/dev/zero of=disk.img bs=1M count=10",
            "echo hi > /dev/null",
            "git status -s && cargo test --release 2>&1 | tail -n 20",
            "kill -9 1234",
            "mv a.txt ~",
            "man mkfs",
            "echo ${HOME}",
            "rm -rf ./{a,b}",
            "rm -rf /tmp/x*",
            "rm -rf build/*",
        ] {
            assert!(scan_raw(s).is_none(), "{s}: {:?}", scan_raw(s));
        }
    }

    #[test]
    fn paths_normalize() {
        assert_eq!(normalize_path("/etc//./passwd"), "/etc/passwd");
        assert_eq!(normalize_path("${HOME}/.ssh/"), "~/.ssh");
        assert_eq!(normalize_path("$HOME"), "~");
        assert_eq!(normalize_path("/a/b/../../.."), "/");
        assert_eq!(normalize_path("~/.."), "/");
        assert_eq!(normalize_path("../x"), "../x");
        assert_eq!(normalize_path("$HOMEDIR/x"), "$HOMEDIR/x");
    }

    #[test]
    fn sensitive_paths() {
        assert!(sensitive_write("/etc/crontab").is_some());
        assert!(sensitive_write("~/.bashrc").is_some());
        assert!(sensitive_write("/home/alice/.ssh/authorized_keys").is_some());
        assert!(sensitive_write(".git/hooks/pre-commit").is_some());
        assert!(sensitive_write("/dev/sda").is_some());
        assert!(sensitive_write("/dev/null").is_none());
        assert!(sensitive_write("./out.txt").is_none());
        assert!(sensitive_write("/tmp/x").is_none());
        assert!(credential_path("~/.ssh/id_rsa").is_some());
        assert!(credential_path("@/etc/shadow").is_some());
        assert!(credential_path(".env").is_some());
        assert!(credential_path(".env.example").is_none());
        assert!(credential_path("src/main.rs").is_none());
    }
}
