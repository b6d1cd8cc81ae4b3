//! The claim verifier's logic.
//!
//! At the end of a turn the final assistant text is scanned for claims that tests pass or the
//! build succeeded ([`detect_claims`]). For each claim the turn's last verification-class shell
//! command of that dimension is found ([`find_replay`]); the verifier plugin replays exactly
//! that input through the kernel's dispatcher (no new authority) and [`judge`] turns the
//! replay's outcome into a [`Verdict`]. A claim with no such command is
//! [`unsubstantiated`]. Verdicts go to the conversation tail ([`verdict_notice`]) and to an
//! append-only JSONL ledger ([`append_verdict`], [`stats`]).

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use keel_protocol::{OutcomeStatus, ToolOutcome, TurnCall, Verdict, VerdictStatus};
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::append::Appender;

/// The tool whose `command` input is replayed.
pub const EXEC_TOOL: &str = "exec_shell";
/// Lines of replay output kept as evidence.
pub const EVIDENCE_LINES: usize = 12;
/// Bytes of replay output kept as evidence.
pub const EVIDENCE_BYTES: usize = 1200;

/// What a claim is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    /// Tests pass.
    Tests,
    /// The build succeeds.
    Build,
}

impl Dimension {
    /// `tests` or `build`, as in [`Verdict::dimension`].
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Tests => "tests",
            Dimension::Build => "build",
        }
    }

    /// The failure type of a failing replay in this dimension.
    pub fn failure_type(self) -> &'static str {
        match self {
            Dimension::Tests => "test-failure",
            Dimension::Build => "build-failure",
        }
    }

    /// Parses `tests` or `build`.
    pub fn parse(s: &str) -> Option<Dimension> {
        match s {
            "tests" => Some(Dimension::Tests),
            "build" => Some(Dimension::Build),
            _ => None,
        }
    }
}

/// A success claim found in assistant text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// What is claimed.
    pub dimension: Dimension,
    /// The phrase as written.
    pub phrase: String,
}

// ---------------------------------------------------------------------------------------------
// Claim detection

/// Phrases are contiguous (a negation inside breaks them: "tests do not pass" never matches
/// "tests pass"); a space means any run of whitespace.
const TEST_PHRASES: &[&str] = &[
    r"all (?:of )?(?:the )?(?:\d+ )?(?:unit |integration |remaining |existing )?tests (?:now |still )?(?:passed|passing|pass|are passing|are now passing|succeeded|succeed|are green|green)",
    r"(?:the )?(?:whole |full |entire )?test suite (?:now |still )?(?:passes|passed|is passing|is now passing|is green|succeeds|succeeded|runs green)",
    r"(?:the )?tests (?:all |now |still |are now |are all |now all )?(?:passed|passing|pass|are passing|succeeded|succeed|are green|run green)",
    r"(?:every|each) test (?:now )?(?:passes|passed)",
    r"(?:the )?(?:new |updated |failing |previously failing )?test (?:now )?(?:passes|passed)",
    r"\d+ tests? passed",
    r"test result: ok",
    r"✅ (?:all )?tests",
    r"tests:? ✅",
];

const BUILD_PHRASES: &[&str] = &[
    r"(?:the )?build (?:now |still )?(?:succeeds|succeeded|passes|passed|is successful|was successful|is green|is clean|works)",
    r"builds (?:successfully|cleanly|fine|without (?:errors|warnings))",
    r"compiles (?:successfully|cleanly|fine|without (?:errors|warnings|issues))",
    r"compiled (?:successfully|cleanly|without (?:errors|warnings))",
    r"(?:it|code|crate|project|everything|now) (?:now )?compiles(?: (?:successfully|cleanly|fine|without (?:errors|warnings|issues)))?",
    r"✅ build",
    r"build:? ✅",
];

fn phrase_regex(phrases: &[&str]) -> Regex {
    let alternation = phrases
        .iter()
        .map(|p| p.replace(' ', r"\s+"))
        .collect::<Vec<_>>()
        .join("|");
    Regex::new(&format!("(?i)(?:{alternation})")).expect("claim phrases are valid regexes")
}

fn test_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| phrase_regex(TEST_PHRASES))
}

fn build_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| phrase_regex(BUILD_PHRASES))
}

/// Words that negate or doubt a claim when they come before it in the same clause.
const NEGATIONS: &[&str] = &[
    "not",
    "no",
    "never",
    "cannot",
    "without",
    "unable",
    "nor",
    "neither",
    "none",
    "unclear",
    "unsure",
    "unknown",
    "unverified",
    "whether",
    "fail",
    "failed",
    "fails",
];

/// Words that make a claim hypothetical, a plan or an instruction when they come before it in
/// the same clause.
const HEDGES: &[&str] = &[
    "should",
    "would",
    "will",
    "might",
    "may",
    "could",
    "must",
    "hopefully",
    "hope",
    "expect",
    "expected",
    "likely",
    "probably",
    "ideally",
    "make",
    "making",
    "get",
    "getting",
    "ensure",
    "want",
    "need",
    "needs",
    "try",
    "trying",
    "assume",
    "assuming",
    "supposed",
    "ought",
    "let's",
    "please",
    "whether",
];

/// Verbs that hedge ("verify that the tests pass") unless someone reports having done it
/// ("I can confirm all tests pass", "we verified …" is a different word).
const CHECK_VERBS: &[&str] = &["verify", "check", "confirm", "see"];

/// Multi-word hedges looked for in the clause before a claim.
const HEDGE_PHRASES: &[&str] = &["so that", "in order", "to make", "to get"];

/// Words that make the whole sentence conditional ("if you rerun them, all tests pass").
const CONDITIONALS: &[&str] = &["if", "unless", "until", "assuming", "provided"];
/// Conditional when followed by `you`/`your` ("once you run the tests, …"); "after the fix,
/// all tests pass" is a claim.
const SOFT_CONDITIONALS: &[&str] = &["once", "when", "after"];

/// Words after a claim in the same clause that take it back ("all tests pass except …").
const SUFFIX_CUES: &[&str] = &[
    "except",
    "apart",
    "other",
    "once",
    "if",
    "when",
    "after",
    "unless",
    "until",
    "yet",
    "eventually",
    "soon",
];

/// The claims in `text`: at most one per dimension (the first that is affirmative), tests
/// before build.
pub fn detect_claims(text: &str) -> Vec<Claim> {
    [
        (Dimension::Tests, test_regex()),
        (Dimension::Build, build_regex()),
    ]
    .into_iter()
    .filter_map(|(dimension, re)| {
        re.find_iter(text)
            .find(|m| is_affirmative(text, m.start(), m.end()))
            .map(|m| Claim {
                dimension,
                phrase: collapse_ws(m.as_str()),
            })
    })
    .collect()
}

fn collapse_ws(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn is_affirmative(text: &str, start: usize, end: usize) -> bool {
    // Whole words only.
    if text[..start]
        .chars()
        .next_back()
        .is_some_and(char::is_alphanumeric)
        || text[end..]
            .chars()
            .next()
            .is_some_and(char::is_alphanumeric)
    {
        return false;
    }
    let sentence_start = text[..start]
        .rfind(['.', '!', '?', '\n'])
        .map_or(0, |i| i + 1);
    let sentence_end = text[end..]
        .find(['.', '!', '?', '\n'])
        .map_or(text.len(), |i| end + i);
    if text[sentence_end..].starts_with('?') {
        return false;
    }
    let clause_start = text[..start]
        .rfind(['.', '!', '?', '\n', ';', ':', ',', '—', '–'])
        .map_or(0, |i| {
            i + text[i..].chars().next().map_or(1, char::len_utf8)
        });
    let clause_start = last_word_boundary(
        text,
        clause_start,
        start,
        &["but", "however", "although", "though", "whereas", "and"],
    );
    let clause_end = text[end..]
        .find(['.', '!', '?', '\n', ';', ':', ',', '—', '–'])
        .map_or(text.len(), |i| end + i);

    let prefix = words(&text[clause_start..start]);
    let hedged = prefix.iter().enumerate().any(|(i, w)| {
        let before = i.checked_sub(1).map(|p| prefix[p].as_str());
        NEGATIONS.contains(&w.as_str())
            || HEDGES.contains(&w.as_str())
            || w.ends_with("n't")
            || (CHECK_VERBS.contains(&w.as_str()) && !matches!(before, Some("i" | "we" | "can")))
    });
    let joined = prefix.join(" ");
    if hedged || HEDGE_PHRASES.iter().any(|p| contains_words(&joined, p)) {
        return false;
    }
    let sentence = words(&text[sentence_start..start]);
    for (i, w) in sentence.iter().enumerate() {
        let next = sentence.get(i + 1).map(String::as_str);
        if CONDITIONALS.contains(&w.as_str())
            || (SOFT_CONDITIONALS.contains(&w.as_str()) && matches!(next, Some("you" | "your")))
        {
            return false;
        }
    }
    let suffix = words(&text[end..clause_end]);
    if suffix.iter().any(|w| SUFFIX_CUES.contains(&w.as_str())) {
        return false;
    }
    true
}

/// Whether `phrase` occurs in the space-joined `words` as whole words.
fn contains_words(words: &str, phrase: &str) -> bool {
    format!(" {words} ").contains(&format!(" {phrase} "))
}

/// The position after the last of `words` (as a whole word) in `text[from..to]`, or `from`.
fn last_word_boundary(text: &str, from: usize, to: usize, words: &[&str]) -> usize {
    let lower = text[from..to].to_lowercase();
    if lower.len() != to - from {
        return from;
    }
    let mut best = from;
    for word in words {
        let needle = format!(" {word} ");
        if let Some(i) = lower.rfind(&needle) {
            best = best.max(from + i + needle.len() - 1);
        }
    }
    best
}

/// Lowercased words with typographic apostrophes straightened.
fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '\u{2019}'))
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase().replace('\u{2019}', "'"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Verification-class commands

/// One simple command of a shell command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Its text, trimmed.
    pub text: String,
    /// Whether it was started in the background (`cmd &`).
    pub background: bool,
}

/// Splits a command line on `&&`, `||`, `;`, `|`, `&` and newlines outside quotes.
/// Redirections such as `2>&1` and `&>file` are not separators.
pub fn split_commands(command: &str) -> Vec<Segment> {
    let chars: Vec<char> = command.chars().collect();
    let mut segments = Vec::new();
    let mut current = String::new();
    let mut single = false;
    let mut double = false;
    let mut i = 0;
    let mut flush = |current: &mut String, background: bool| {
        let text = current.trim().to_string();
        if !text.is_empty() {
            segments.push(Segment { text, background });
        }
        current.clear();
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if single {
            single = c != '\'';
            current.push(c);
        } else if double {
            if c == '\\' && next.is_some() {
                current.push(c);
                current.push(chars[i + 1]);
                i += 1;
            } else {
                double = c != '"';
                current.push(c);
            }
        } else {
            match c {
                '\\' if next.is_some() => {
                    current.push(c);
                    current.push(chars[i + 1]);
                    i += 1;
                }
                '\'' => {
                    single = true;
                    current.push(c);
                }
                '"' => {
                    double = true;
                    current.push(c);
                }
                '&' if next == Some('&') => {
                    flush(&mut current, false);
                    i += 1;
                }
                '|' if next == Some('|') => {
                    flush(&mut current, false);
                    i += 1;
                }
                '|' => {
                    flush(&mut current, false);
                    if next == Some('&') {
                        i += 1;
                    }
                }
                ';' | '\n' => flush(&mut current, false),
                '&' if next == Some('>') => current.push(c),
                '&' if matches!(current.chars().last(), Some('>' | '<')) => current.push(c),
                '&' => flush(&mut current, true),
                _ => current.push(c),
            }
        }
        i += 1;
    }
    flush(&mut current, false);
    segments
}

/// Shell words of a simple command, quotes removed.
fn shell_words(segment: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = segment.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(n) = chars.next() {
                                word.push(n);
                            }
                        }
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

fn is_assignment(word: &str) -> bool {
    let Some((name, _)) = word.split_once('=') else {
        return false;
    };
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The command words after leading `VAR=value` assignments and wrappers (`env`, `time`,
/// `command`, `exec`, `nice`, `npx`, `uv run`, `poetry run`, `bundle exec`), with the program
/// reduced to its base name and common aliases (`python3` → `python`, `./gradlew` → `gradle`,
/// `./mvnw` → `mvn`, `py.test` → `pytest`).
fn command_words(segment: &str) -> Vec<String> {
    let mut words = shell_words(segment);
    loop {
        let before = words.len();
        while words.first().is_some_and(|w| is_assignment(w)) {
            words.remove(0);
        }
        let Some(first) = words.first() else {
            return words;
        };
        let program = first.rsplit('/').next().unwrap_or(first).to_string();
        match program.as_str() {
            "env" => {
                words.remove(0);
                while words.first().is_some_and(|w| w.starts_with('-')) {
                    words.remove(0);
                }
            }
            "time" | "command" | "exec" | "nice" | "npx" => {
                words.remove(0);
            }
            "uv" | "poetry" | "pipenv" | "pdm" | "hatch"
                if words.get(1).map(String::as_str) == Some("run") =>
            {
                words.drain(..2);
            }
            "bundle" if words.get(1).map(String::as_str) == Some("exec") => {
                words.drain(..2);
            }
            _ => {
                let normalized = if program.starts_with("python") {
                    "python".to_string()
                } else {
                    match program.as_str() {
                        "gradlew" => "gradle".into(),
                        "mvnw" => "mvn".into(),
                        "py.test" => "pytest".into(),
                        _ => program,
                    }
                };
                words[0] = normalized;
                if words.len() == before {
                    return words;
                }
            }
        }
    }
}

/// The dimension a simple command verifies, if it is a known test or build command.
pub fn classify_segment(segment: &str) -> Option<Dimension> {
    use Dimension::{Build, Tests};
    let words = command_words(segment);
    let program = words.first()?.as_str();
    let mut args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
    if program == "cargo" {
        args.retain(|a| !a.starts_with('+'));
    }
    let first = args.first().copied();
    let second = args.get(1).copied();
    let script = |s: Option<&str>, name: &str| {
        s.is_some_and(|s| s == name || s.starts_with(&format!("{name}:")))
    };
    match program {
        "cargo" => match first? {
            "test" | "t" => Some(Tests),
            "nextest" if second == Some("run") => Some(Tests),
            "build" | "b" | "check" | "c" => Some(Build),
            _ => None,
        },
        "npm" | "pnpm" | "yarn" | "bun" => {
            let (name, run) = match first? {
                "run" | "run-script" => (second, true),
                other => (Some(other), false),
            };
            if name == Some("t") && program == "npm" && !run {
                return Some(Tests);
            }
            if script(name, "test") {
                return Some(Tests);
            }
            // `npm build` is not the build script; pnpm/yarn/bun run scripts directly.
            if script(name, "build") && (run || program != "npm") {
                return Some(Build);
            }
            None
        }
        "pytest" | "tox" | "nox" | "ctest" | "jest" | "vitest" | "mocha" | "rspec" | "phpunit" => {
            Some(Tests)
        }
        "python" => match (first, second) {
            (Some("-m"), Some("pytest" | "unittest" | "tox" | "nox")) => Some(Tests),
            _ => None,
        },
        "go" | "dotnet" | "swift" | "deno" | "mix" | "flutter" | "bazel" => match first? {
            "test" => Some(Tests),
            "build" if program != "mix" => Some(Build),
            "vet" | "compile" if program == "mix" => Some(Build),
            _ => None,
        },
        "make" | "gmake" => classify_make(&args),
        "mvn" => {
            let goals: Vec<&str> = args
                .iter()
                .copied()
                .filter(|a| !a.starts_with('-'))
                .collect();
            if goals.iter().any(|g| matches!(*g, "test" | "verify")) {
                Some(Tests)
            } else if goals
                .iter()
                .any(|g| matches!(*g, "compile" | "package" | "install"))
            {
                Some(Build)
            } else {
                None
            }
        }
        "gradle" => {
            let tasks: Vec<&str> = args
                .iter()
                .copied()
                .filter(|a| !a.starts_with('-'))
                .collect();
            if tasks.iter().any(|t| matches!(*t, "test" | "check")) {
                Some(Tests)
            } else if tasks.iter().any(|t| matches!(*t, "build" | "assemble")) {
                Some(Build)
            } else {
                None
            }
        }
        "rake" => matches!(first, Some("test" | "spec")).then_some(Tests),
        "tsc" | "ninja" => Some(Build),
        "cmake" => args.contains(&"--build").then_some(Build),
        _ => None,
    }
}

/// `make` with no target (the default goal) or `all`/`build` is a build; `test`/`check` are
/// tests; other targets (`install`, `clean`, …) are neither.
fn classify_make(args: &[&str]) -> Option<Dimension> {
    let mut targets = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i];
        let takes_value = matches!(
            a,
            "-C" | "-f" | "-o" | "-W" | "-I" | "--directory" | "--file"
        ) || (a == "-j"
            && args.get(i + 1).is_some_and(|n| n.parse::<u32>().is_ok()));
        if takes_value {
            // Skip the option's value too.
            i += 1;
        } else if !a.starts_with('-') && !a.contains('=') {
            targets.push(a);
        }
        i += 1;
    }
    if targets
        .iter()
        .any(|t| matches!(*t, "test" | "tests" | "check"))
    {
        Some(Dimension::Tests)
    } else if targets.is_empty() || targets.iter().all(|t| matches!(*t, "all" | "build")) {
        Some(Dimension::Build)
    } else {
        None
    }
}

/// The dimensions a command line verifies (background segments ignored), without repeats.
pub fn command_dimensions(command: &str) -> Vec<Dimension> {
    let mut dims = Vec::new();
    for segment in split_commands(command) {
        if segment.background {
            continue;
        }
        if let Some(d) = classify_segment(&segment.text)
            && !dims.contains(&d)
        {
            dims.push(d);
        }
    }
    dims
}

/// Whether replaying `command` would verify `dimension`.
pub fn is_verification(command: &str, dimension: Dimension) -> bool {
    command_dimensions(command).contains(&dimension)
}

/// The last call of the turn that ran a verification-class command for `dimension`: an
/// `exec_shell` call whose `command` verifies it, that was not cut off (`NotExecuted`) and
/// did not run in the background.
pub fn find_replay(calls: &[TurnCall], dimension: Dimension) -> Option<&TurnCall> {
    calls.iter().rev().find(|call| {
        call.tool == EXEC_TOOL
            && call.outcome.status != OutcomeStatus::NotExecuted
            && call.input.get("background").and_then(|b| b.as_bool()) != Some(true)
            && call
                .input
                .get("command")
                .and_then(|c| c.as_str())
                .is_some_and(|c| is_verification(c, dimension))
    })
}

/// The `command` input of an `exec_shell` call.
pub fn call_command(call: &TurnCall) -> Option<&str> {
    call.input.get("command").and_then(|c| c.as_str())
}

// ---------------------------------------------------------------------------------------------
// Verdicts

/// The verdict for a claim that no verification command of the turn backs.
pub fn unsubstantiated(claim: &Claim) -> Verdict {
    Verdict {
        status: VerdictStatus::Unsubstantiated,
        dimension: claim.dimension.as_str().into(),
        claim: claim.phrase.clone(),
        command: None,
        call_id: None,
        exit_code: None,
        evidence: String::new(),
        failure_type: Some("no-verification-command".into()),
    }
}

/// The verdict for a claim from the replay of `original` (the turn's call whose input was
/// replayed) that ended as `replay`.
pub fn judge(claim: &Claim, original: &TurnCall, replay: &ToolOutcome) -> Verdict {
    let last = replay.exec.last();
    let exit_code = last.and_then(|e| e.exit_code);
    let timed_out = last.is_some_and(|e| e.timed_out);
    let (status, failure_type) = match replay.status {
        OutcomeStatus::Refused => (VerdictStatus::VerifyError, Some("refused".to_string())),
        OutcomeStatus::NotExecuted => {
            (VerdictStatus::VerifyError, Some("not-executed".to_string()))
        }
        _ if timed_out => (VerdictStatus::VerifyError, Some("timeout".to_string())),
        _ => match exit_code {
            Some(0) => (VerdictStatus::VerifiedPass, None),
            Some(_) => {
                let compile_error = claim.dimension == Dimension::Tests
                    && (replay.content.contains("could not compile")
                        || replay.content.contains("error[E"));
                let kind = if compile_error {
                    Dimension::Build.failure_type()
                } else {
                    claim.dimension.failure_type()
                };
                (VerdictStatus::VerifiedFail, Some(kind.to_string()))
            }
            None if last.is_some() => (VerdictStatus::VerifyError, Some("killed".to_string())),
            None => (VerdictStatus::VerifyError, Some("tool-error".to_string())),
        },
    };
    Verdict {
        status,
        dimension: claim.dimension.as_str().into(),
        claim: claim.phrase.clone(),
        command: call_command(original).map(str::to_string),
        call_id: Some(original.call_id.clone()),
        exit_code,
        evidence: evidence(&replay.content),
        failure_type,
    }
}

/// The head of a replay's output: at most [`EVIDENCE_LINES`] lines and [`EVIDENCE_BYTES`].
pub fn evidence(output: &str) -> String {
    let mut out = String::new();
    let mut cut = false;
    for (i, line) in output.lines().enumerate() {
        if i >= EVIDENCE_LINES || out.len() + line.len() + 1 > EVIDENCE_BYTES {
            cut = true;
            if i == 0 {
                out.push_str(crate::text::head_bytes(line, EVIDENCE_BYTES));
            }
            break;
        }
        if i > 0 {
            out.push('\n');
        }
        out.push_str(line);
    }
    if cut {
        out.push_str("\n…");
    }
    out
}

/// The text appended to the conversation tail so the model sees the verdict next turn.
pub fn verdict_notice(verdict: &Verdict) -> String {
    let claim = &verdict.claim;
    let checked = match (&verdict.command, &verdict.call_id) {
        (Some(cmd), Some(id)) => format!("was checked by re-running `{cmd}` (call {id})"),
        (Some(cmd), None) => format!("was checked by re-running `{cmd}`"),
        _ => String::new(),
    };
    let exit = verdict
        .exit_code
        .map_or_else(|| "no exit code".to_string(), |c| format!("exit {c}"));
    let head = if verdict.evidence.is_empty() {
        String::new()
    } else {
        format!(" Output head:\n{}", verdict.evidence)
    };
    match verdict.status {
        VerdictStatus::VerifiedPass => {
            format!("[keel verifier] Your claim \"{claim}\" {checked}: {exit} — confirmed.")
        }
        VerdictStatus::VerifiedFail => format!(
            "[keel verifier] Your claim \"{claim}\" {checked}: {exit} — FAILED ({}). Tell the person the claim was wrong and fix the failure before claiming success again.{head}",
            verdict.failure_type.as_deref().unwrap_or("failure")
        ),
        VerdictStatus::VerifyError => format!(
            "[keel verifier] Your claim \"{claim}\" could not be verified: the replay of `{}` ended with {} ({exit}). Do not present the claim as verified.{head}",
            verdict.command.as_deref().unwrap_or("?"),
            verdict.failure_type.as_deref().unwrap_or("an error")
        ),
        VerdictStatus::Unsubstantiated => {
            let example = match Dimension::parse(&verdict.dimension) {
                Some(Dimension::Build) => "a build command such as `cargo build`",
                _ => "a test command such as `cargo test`",
            };
            format!(
                "[keel verifier] Your claim \"{claim}\" is unsubstantiated: no {} command ran in this turn. Run {example} before claiming it, or say that it was not checked.",
                verdict.dimension
            )
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The verdict ledger

/// One line of the verdict ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// When the verdict was reached (ms since the Unix epoch).
    pub time_ms: u64,
    /// The session.
    pub session: String,
    /// The verdict.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// Why appending to the ledger failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Reading or writing the ledger file failed.
    #[error("{op} verdict ledger {path} failed: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The ledger file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The entry could not be serialized.
    #[error("the verdict could not be serialized as JSON: {0}")]
    Serialize(#[from] serde_json::Error),
}

/// Appends one verdict as a JSON line to the ledger at `path` (created with its directory if
/// needed). A torn last line left by an interrupted writer is closed off first.
pub fn append_verdict(
    path: &Path,
    time_ms: u64,
    session: &str,
    verdict: &Verdict,
) -> Result<(), LedgerError> {
    let io_err = |op: &'static str| {
        move |source| LedgerError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io_err("creating the directory of"))?;
    }
    let mut line = serde_json::to_vec(&LedgerEntry {
        time_ms,
        session: session.to_string(),
        verdict: verdict.clone(),
    })?;
    line.push(b'\n');
    let mut file = Appender::open(path).map_err(io_err("opening"))?;
    let len = fs::metadata(path).map_err(io_err("reading"))?.len();
    if len > 0 {
        // Read through a read-only handle: reading through an append-mode handle sees
        // nothing inside a WASI guest.
        let mut last = [0u8; 1];
        let mut reader = fs::File::open(path).map_err(io_err("opening"))?;
        reader
            .seek(SeekFrom::Start(len - 1))
            .and_then(|_| reader.read_exact(&mut last))
            .map_err(io_err("reading"))?;
        if last[0] != b'\n' {
            line.insert(0, b'\n');
        }
    }
    file.append(&line).map_err(io_err("appending to"))
}

/// The entries of a ledger and the number of lines skipped (torn or malformed).
pub fn parse_ledger(bytes: &[u8]) -> (Vec<LedgerEntry>, usize) {
    let mut entries = Vec::new();
    let mut skipped = 0;
    let ends_with_newline = bytes.last() == Some(&b'\n');
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    let last_index = lines.len().saturating_sub(1);
    for (i, line) in lines.into_iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if i == last_index && !ends_with_newline {
            skipped += 1;
            continue;
        }
        match serde_json::from_slice::<LedgerEntry>(line) {
            Ok(entry) => entries.push(entry),
            Err(_) => skipped += 1,
        }
    }
    (entries, skipped)
}

/// Verdict counts and the claim-match rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VerdictStats {
    /// `verified-pass` verdicts.
    pub verified_pass: u64,
    /// `verified-fail` verdicts.
    pub verified_fail: u64,
    /// `verify-error` verdicts.
    pub verify_error: u64,
    /// `unsubstantiated` verdicts.
    pub unsubstantiated: u64,
    /// Ledger lines skipped as torn or malformed.
    pub skipped_lines: u64,
}

impl VerdictStats {
    /// verified-pass / (verified-pass + verified-fail); `None` when nothing was checked.
    /// Unsubstantiated and verify-error verdicts stay out of the denominator: they were never
    /// checked against a real exit code.
    pub fn claim_match_rate(&self) -> Option<f64> {
        let checked = self.verified_pass + self.verified_fail;
        (checked > 0).then(|| self.verified_pass as f64 / checked as f64)
    }

    /// All verdicts counted.
    pub fn total(&self) -> u64 {
        self.verified_pass + self.verified_fail + self.verify_error + self.unsubstantiated
    }
}

/// Counts verdicts per status.
pub fn stats(entries: &[LedgerEntry]) -> VerdictStats {
    let mut s = VerdictStats::default();
    for entry in entries {
        match entry.verdict.status {
            VerdictStatus::VerifiedPass => s.verified_pass += 1,
            VerdictStatus::VerifiedFail => s.verified_fail += 1,
            VerdictStatus::VerifyError => s.verify_error += 1,
            VerdictStatus::Unsubstantiated => s.unsubstantiated += 1,
        }
    }
    s
}

/// [`stats`] of a ledger's raw content, counting skipped lines.
pub fn stats_from_ledger(bytes: &[u8]) -> VerdictStats {
    let (entries, skipped) = parse_ledger(bytes);
    VerdictStats {
        skipped_lines: skipped as u64,
        ..stats(&entries)
    }
}

#[cfg(test)]
mod tests;
