//! The exec policy gate: decides whether a shell command may run (Allow), needs the user's
//! approval (Prompt), or must not run at all (Forbidden).
//!
//! How a command is judged:
//!
//! 1. It is split into simple commands (`shell_split`): at `&&`, `||`, `;`, `|`, `&`,
//!    newlines and groups, with quoting honoured. Every nested script — `$(...)`, backticks,
//!    `<(...)`, `sh -c '...'`, `eval ...`, `find -exec ...`, here-documents fed to a shell — is
//!    judged too, as its own segment.
//! 2. Each segment gets the maximum of its *floors* (checks no rule can lower: a pipe into a
//!    shell, writes to sensitive paths, network use, code execution, command substitution,
//!    privilege escalation, suspicious `PATH=`/`LD_PRELOAD=` assignments, ...) and its *rule*:
//!    the user's rule for the command key if any, else the built-in rule (with argument
//!    refinements such as `sed -i`), else the default for unknown commands (Prompt). A
//!    project-local rule can only raise the result.
//! 3. Independently, the raw text is scanned for catastrophic shapes (`exec_danger`), which
//!    are Forbidden wherever they are nested.
//! 4. The command's decision is the maximum over all segments (Allow < Prompt < Forbidden): it
//!    is allowed only if every segment is, forbidden if any segment is.
//!
//! Command keys are arity-aware (see the arity table in `exec_rules`): flags never count
//! toward a key, positional words do, so an allow rule for `git status` covers `git status -s`
//! and never `git push`. A user rule covers its key and every longer key (`git` covers all of
//! git).

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::exec_danger;
use super::exec_rules::{self, Builtin, Inv};
use super::shell_split::{
    self, CommandKind, IssueKind, ParsedScript, Redirect, RedirectOp, Substitution,
    SubstitutionKind, Word,
};

/// FNV-1a: the rule tables are looked up several times per command with short keys, where
/// SipHash's setup cost dominates. Only trusted keys (built-in and config rules) are inserted,
/// so hostile lookups cannot degrade the tables.
#[derive(Default, Clone, Copy)]
struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Fnv>>;

/// Built-in rules by program, then by second word (`""` for one-word rules), with the
/// prefix split into words.
type BuiltinIndex =
    FastMap<&'static str, FastMap<&'static str, Vec<(Vec<&'static str>, &'static Builtin)>>>;

/// How deep nested scripts (`sh -c` inside `$(...)` inside `eval` ...) are followed; deeper
/// nesting is Forbidden rather than guessed at.
pub const MAX_EVAL_DEPTH: usize = 8;

pub use crate::Decision;

impl Decision {
    /// The decision once the approval policy is applied: under `never` a Prompt becomes
    /// Forbid (there is nobody to ask); under `auto` a Prompt is approved (Allow); Forbid stays
    /// Forbid under every policy.
    pub fn under(self, mode: ApprovalMode) -> Decision {
        match (self, mode) {
            (Decision::Prompt, ApprovalMode::Never) => Decision::Forbid,
            (Decision::Prompt, ApprovalMode::Auto) => Decision::Allow,
            (d, _) => d,
        }
    }
}

/// The approval policy: what happens to a Prompt decision. Ordered by tightness
/// (`auto < ask < never`); a project config may only move it to the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    /// Prompts are approved automatically.
    Auto,
    /// Prompts go to the user (the default).
    #[default]
    Ask,
    /// There is no approver: prompts are refused.
    Never,
}

impl ApprovalMode {
    /// The lowercase name used in config files and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::Auto => "auto",
            ApprovalMode::Ask => "ask",
            ApprovalMode::Never => "never",
        }
    }

    /// Parses `auto`, `ask` or `never`.
    pub fn parse(s: &str) -> Option<ApprovalMode> {
        match s {
            "auto" => Some(ApprovalMode::Auto),
            "ask" => Some(ApprovalMode::Ask),
            "never" => Some(ApprovalMode::Never),
            _ => None,
        }
    }
}

impl fmt::Display for ApprovalMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which config file a rule, warning or error comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigOrigin {
    /// The user's own config (trusted; defines the policy).
    User,
    /// A project-local config (untrusted; may only tighten).
    Project,
}

impl fmt::Display for ConfigOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigOrigin::User => "user",
            ConfigOrigin::Project => "project",
        })
    }
}

/// Why an exec policy config was refused. Loading fails closed: an unknown value is an error,
/// never silently ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The file is not TOML.
    #[error("{origin} config is not valid TOML: {message}")]
    Toml {
        /// Which config.
        origin: ConfigOrigin,
        /// The parser's message.
        message: String,
    },
    /// The `[exec]` table has the wrong shape (unknown key, wrong type, ...).
    #[error("{origin} config: [exec] {message}")]
    Invalid {
        /// Which config.
        origin: ConfigOrigin,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A rule names a decision that does not exist.
    #[error(
        "{origin} config: rule `{prefix}` has unknown decision `{value}`; expected one of `allow`, `prompt`, `forbid` (`forbidden` is read as `forbid`)"
    )]
    UnknownDecision {
        /// Which config.
        origin: ConfigOrigin,
        /// The rule's prefix.
        prefix: String,
        /// The unknown value.
        value: String,
    },
    /// `approval` names a policy that does not exist.
    #[error(
        "{origin} config: unknown approval policy `{value}`; expected one of `auto`, `ask`, `never`"
    )]
    UnknownApproval {
        /// Which config.
        origin: ConfigOrigin,
        /// The unknown value.
        value: String,
    },
    /// A rule prefix is not a command key.
    #[error("{origin} config: rule prefix `{prefix}` is not valid: {problem}")]
    BadPrefix {
        /// Which config.
        origin: ConfigOrigin,
        /// The prefix as written.
        prefix: String,
        /// What is wrong and what to write instead.
        problem: String,
    },
}

/// Something in a config that was accepted but has no (or less) effect than written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyWarning {
    /// Which config.
    pub origin: ConfigOrigin,
    /// What was ignored or limited, and why.
    pub message: String,
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} config: {}", self.origin, self.message)
    }
}

/// The verdict for one segment (one simple command, possibly nested in another).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentVerdict {
    /// Position in [`Verdict::segments`].
    pub index: usize,
    /// The segment's text.
    pub text: String,
    /// The segment's decision, including what is nested inside it.
    pub decision: Decision,
    /// The rule or check that decided it (`builtin:git status`, `user:git`,
    /// `floor:pipe-to-shell`, `catastrophic:rm-recursive-root`, `default:unknown`, ...).
    pub rule: Option<String>,
    /// Why.
    pub reason: String,
    /// Nesting depth (0 for the command line's own segments).
    pub depth: usize,
    /// The segment this one is nested in.
    pub parent: Option<usize>,
    /// Where it is nested (`inside $(...) of segment 0`, `sh -c script of segment 2`, ...).
    pub context: Option<String>,
}

/// The exec policy's verdict on a command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The command as given.
    pub command: String,
    /// The decision: the maximum over all segments.
    pub decision: Decision,
    /// Why, naming the deciding segment.
    pub reason: String,
    /// The rule or check that decided it.
    pub rule: Option<String>,
    /// Index into `segments` of the segment that decided it (none when everything is allowed).
    pub deciding_segment: Option<usize>,
    /// What to do instead (for the user and for the model).
    pub suggestion: Option<String>,
    /// Every segment, in source order, nested ones after their parent.
    pub segments: Vec<SegmentVerdict>,
    /// The approval policy applied to `decision`, if one was ([`Verdict::under`]).
    pub approval: Option<ApprovalMode>,
}

impl Verdict {
    /// Applies an approval policy: under `never` a Prompt becomes Forbidden, under `auto` it
    /// is approved; the reason and suggestion say so.
    pub fn under(mut self, mode: ApprovalMode) -> Verdict {
        // What would change a repository's control files is never approved automatically: it
        // names programs that run later outside the sandbox, with the person's rights.
        if mode == ApprovalMode::Auto
            && self.decision == Decision::Prompt
            && let Some(seg) = self
                .segments
                .iter()
                .find(|s| s.rule.as_deref() == Some(floors::REPOSITORY_CONTROL_RULE))
        {
            self.approval = Some(mode);
            self.decision = Decision::Forbid;
            self.rule = seg.rule.clone();
            self.reason = format!(
                "{}; approval policy `auto` never approves a change to a repository's control \
                 files",
                seg.reason
            );
            self.suggestion = Some(floors::REPOSITORY_CONTROL_SUGGESTION.to_owned());
            return self;
        }
        let before = self.decision;
        let after = before.under(mode);
        self.approval = Some(mode);
        if after != before {
            self.decision = after;
            match mode {
                ApprovalMode::Never => {
                    self.reason = format!(
                        "{}; approval policy is `never`, so a command that needs approval is refused",
                        self.reason
                    );
                    self.suggestion = Some(format!(
                        "{}use a command the policy allows, or ask the user to change `approval` in their config",
                        self.suggestion
                            .as_deref()
                            .map(|s| format!("{s}; or "))
                            .unwrap_or_default()
                    ));
                }
                ApprovalMode::Auto => {
                    self.reason = format!(
                        "{}; approved automatically (approval policy `auto`)",
                        self.reason
                    );
                }
                ApprovalMode::Ask => {}
            }
        }
        self
    }
}

mod approval_keys;
mod config;
mod evaluation;
mod floors;
mod wrappers;

pub use config::CONFIG_EXAMPLE;
use config::RuleTable;

/// The exec policy: built-in rules and arity table, the user's rules, and any project rules
/// (which only tighten). Build it with [`ExecPolicy::builtin`] or [`ExecPolicy::from_toml`].
#[derive(Clone)]
pub struct ExecPolicy {
    approval: ApprovalMode,
    default: Decision,
    use_builtin: bool,
    user: RuleTable,
    project: RuleTable,
    arity: FastMap<String, usize>,
    /// Built-in rules by program, then by second word (`""` for one-word rules).
    builtin: BuiltinIndex,
    warnings: Vec<PolicyWarning>,
}

impl fmt::Debug for ExecPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecPolicy")
            .field("approval", &self.approval)
            .field("default", &self.default)
            .field("builtin_rules", &self.use_builtin)
            .field("user_rules", &self.user.len())
            .field("project_rules", &self.project.len())
            .field("warnings", &self.warnings)
            .finish()
    }
}

impl Default for ExecPolicy {
    fn default() -> Self {
        Self::builtin()
    }
}

impl ExecPolicy {
    /// The built-in policy: built-in rules, approval `ask`, unknown commands Prompt.
    pub fn builtin() -> Self {
        let mut builtin: BuiltinIndex = FastMap::default();
        for r in exec_rules::BUILTIN_RULES {
            let words: Vec<&'static str> = r.prefix.split(' ').collect();
            let program = words.first().copied().unwrap_or("");
            let second = words.get(1).copied().unwrap_or("");
            builtin
                .entry(program)
                .or_default()
                .entry(second)
                .or_default()
                .push((words, r));
        }
        ExecPolicy {
            approval: ApprovalMode::Ask,
            default: Decision::Prompt,
            use_builtin: true,
            user: RuleTable::default(),
            project: RuleTable::default(),
            arity: exec_rules::ARITY
                .iter()
                .map(|(k, v)| ((*k).to_string(), *v))
                .collect(),
            builtin,
            warnings: Vec::new(),
        }
    }

    /// Warnings collected while loading configs.
    pub fn warnings(&self) -> &[PolicyWarning] {
        &self.warnings
    }

    /// The configured approval policy.
    pub fn approval(&self) -> ApprovalMode {
        self.approval
    }

    /// The same rules under approval policy `mode` (the `--approval` flag of a session).
    pub fn with_approval(mut self, mode: ApprovalMode) -> Self {
        self.approval = mode;
        self
    }

    /// Judges a command line under the policy's rules, without applying the approval policy.
    pub fn check(&self, command: &str) -> Verdict {
        let mut cx = Cx::default();
        let parsed = shell_split::split(command);
        self.eval_script(&mut cx, &parsed, command, 0, None, None);
        if let Some(c) = exec_danger::scan_raw(command) {
            let target = cx
                .segs
                .iter()
                .position(|s| s.span.as_ref().is_some_and(|r| r.contains(&c.offset)))
                .or_else(|| cx.segs.iter().position(|s| s.depth == 0));
            let idx = match target {
                Some(i) => i,
                None => cx.push(command.trim(), 0, None, None, Some(0..command.len())),
            };
            cx.segs[idx].best.offer_catastrophic(|| catastrophic_hit(c));
        }
        cx.into_verdict(command)
    }

    /// Judges a command line and applies the configured approval policy (`never` turns Prompt
    /// into Forbidden, `auto` approves it).
    pub fn decide(&self, command: &str) -> Verdict {
        self.check(command).under(self.approval)
    }
}

/// The arity-aware approval key of `command` under the built-in policy; see
/// [`ExecPolicy::approval_key`].
pub fn approval_key(command: &str) -> Option<String> {
    static POLICY: OnceLock<ExecPolicy> = OnceLock::new();
    POLICY
        .get_or_init(ExecPolicy::builtin)
        .approval_key(command)
}

// ---------------------------------------------------------------------------------------------
// Evaluation helpers.

const NETWORK_SUGGESTION: &str =
    "use the agent's fetch tool for downloads, or ask the user to approve the network access";
const SENSITIVE_SUGGESTION: &str = "write inside the workspace instead; system files, shell startup files, credentials, git hooks and keel's config are never written by the agent";

struct Hit {
    rule: String,
    reason: String,
    suggestion: Option<String>,
}

/// The strongest contribution seen so far for one segment; the first of equal strength wins,
/// so more specific checks are offered first.
#[derive(Default)]
struct Best(Option<(Decision, Hit)>);

impl Best {
    fn decision(&self) -> Decision {
        self.0.as_ref().map_or(Decision::Allow, |(d, _)| *d)
    }

    fn offer(&mut self, decision: Decision, make: impl FnOnce() -> Hit) {
        if self.0.as_ref().is_none_or(|(d, _)| decision > *d) {
            self.0 = Some((decision, make()));
        }
    }

    /// Like `offer`, but also wins a tie unless a catastrophic hit is already recorded: the
    /// catastrophic reason is the most useful one to show.
    fn offer_catastrophic(&mut self, make: impl FnOnce() -> Hit) {
        let replace = match &self.0 {
            None => true,
            Some((Decision::Forbid, h)) => !h.rule.starts_with("catastrophic:"),
            Some(_) => true,
        };
        if replace {
            self.0 = Some((Decision::Forbid, make()));
        }
    }
}

fn catastrophic_hit(c: exec_danger::Catastrophe) -> Hit {
    let suggestion = match c.id {
        "rm-recursive-root" | "xargs-rm-root" | "mv-root" => {
            "this can destroy the system or the user's data and is never run; to clean up, delete a specific path inside the workspace (e.g. `rm -r ./build`)"
        }
        "find-delete-root" => {
            "restrict find to a directory inside the workspace (e.g. `find ./logs -name '*.log' -delete`), which is asked for approval"
        }
        "recursive-permissions-root" => {
            "change permissions of specific paths inside the workspace instead"
        }
        "fork-bomb" => "this exhausts the machine's processes and is never run",
        "kill-all" => "signal specific process ids instead",
        _ => "this overwrites a disk or the running system and is never run",
    };
    Hit {
        rule: format!("catastrophic:{}", c.id),
        reason: c.description,
        suggestion: Some(suggestion.to_string()),
    }
}

struct Seg {
    text: String,
    depth: usize,
    parent: Option<usize>,
    context: Option<String>,
    span: Option<Range<usize>>,
    best: Best,
}

#[derive(Default)]
struct Cx {
    segs: Vec<Seg>,
    /// The working directory after a literal `cd`, for resolving relative paths.
    cwd: Option<String>,
    /// Set while judging a `>(...)` script, whose standard input is the outer command's output.
    stdin_piped: bool,
}

impl Cx {
    fn push(
        &mut self,
        text: &str,
        depth: usize,
        parent: Option<usize>,
        context: Option<&str>,
        span: Option<Range<usize>>,
    ) -> usize {
        self.segs.push(Seg {
            text: text.to_string(),
            depth,
            parent,
            context: context.map(str::to_string),
            span,
            best: Best::default(),
        });
        self.segs.len() - 1
    }

    fn into_verdict(self, command: &str) -> Verdict {
        let n = self.segs.len();
        let own: Vec<Decision> = self.segs.iter().map(|s| s.best.decision()).collect();
        let mut combined = own.clone();
        for i in (0..n).rev() {
            if let Some(p) = self.segs[i].parent
                && p < i
            {
                combined[p] = combined[p].max(combined[i]);
            }
        }
        let decision = own.iter().copied().max().unwrap_or(Decision::Allow);
        let deciding = (decision != Decision::Allow)
            .then(|| own.iter().position(|d| *d == decision))
            .flatten();
        let mut segments = Vec::with_capacity(n);
        let mut top = (None, String::new(), None);
        for (i, s) in self.segs.into_iter().enumerate() {
            let (rule, reason, suggestion) = match s.best.0 {
                Some((_, h)) => (Some(h.rule), h.reason, h.suggestion),
                None => (None, "allowed".to_string(), None),
            };
            let reason = if combined[i] > own[i] {
                let child = (i + 1..n).find(|&k| own[k] == combined[i]).unwrap_or(i);
                format!(
                    "contains a {} segment (segment {child}); on its own: {reason}",
                    combined[i]
                )
            } else {
                reason
            };
            if Some(i) == deciding {
                top = (rule.clone(), reason.clone(), suggestion);
            }
            segments.push(SegmentVerdict {
                index: i,
                text: s.text,
                decision: combined[i],
                rule,
                reason,
                depth: s.depth,
                parent: s.parent,
                context: s.context,
            });
        }
        let (rule, reason, suggestion) = top;
        let reason = match deciding {
            Some(i) => {
                let seg = &segments[i];
                let place = match &seg.context {
                    Some(c) => format!("segment {i} `{}` ({c})", short(&seg.text)),
                    None => format!("segment {i} `{}`", short(&seg.text)),
                };
                format!("{decision}: {place}: {reason}")
            }
            None if segments.is_empty() => "allow: empty command, nothing runs".to_string(),
            None => format!("allow: all {} segment(s) are allowed", segments.len()),
        };
        Verdict {
            command: command.to_string(),
            decision,
            reason,
            rule,
            deciding_segment: deciding,
            suggestion,
            segments,
            approval: None,
        }
    }
}

struct View<'a> {
    words: &'a [Word],
    assignments: &'a [Word],
    redirects: &'a [Redirect],
    substitutions: &'a [Substitution],
    piped_input: bool,
    kind: CommandKind,
    upstream: Option<&'a str>,
}

/// What `skip_wrappers` found.
enum Wrapped {
    /// The command to judge starts at word `at`; `xargs` if it runs under xargs.
    Run { at: usize, xargs: bool },
    /// The wrapper was judged completely (it carried a script, or had no command).
    Handled(ProgramInfo),
}

/// The program being judged, after wrappers.
struct Call<'a> {
    name: &'a str,
    args: &'a [Word],
    key: Key<'a>,
    version_only: bool,
    /// A code-execution sink (shell, interpreter, eval) already judged its code.
    sink: bool,
    xargs: bool,
}

#[derive(Default)]
struct ProgramInfo {
    shell: bool,
}

struct Key<'a> {
    words: Vec<&'a str>,
    /// `words` joined by spaces (built once; arity lookups use it as it grows).
    joined: String,
    /// Index into the arguments just after the key.
    rest: usize,
    dynamic: Option<&'a str>,
    risky: Option<(&'a str, &'static str)>,
}

/// `(basename, trusted)`: the name rules match on, and whether the path (if any) is a system
/// directory, so `/usr/bin/git` is `git` but `./tools/git` is not trusted.
fn program_name(p: &str) -> (&str, bool) {
    match p.rsplit_once('/') {
        None => (p, true),
        Some((dir, base)) => (base, exec_rules::TRUSTED_BIN_DIRS.contains(&dir)),
    }
}

/// Paths that name the process's own standard input.
fn is_stdin_path(p: &str) -> bool {
    matches!(p, "-" | "/dev/stdin" | "/dev/fd/0" | "/proc/self/fd/0")
}

fn is_plain_word(w: &str) -> bool {
    if matches!(w, "[" | "[[") {
        return true;
    }
    !w.is_empty()
        && !w
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "&|;<>()$`'\"\\*?[]{}#!~".contains(c))
}

fn shell_split_is_assignment(t: &str) -> bool {
    let Some((name, _)) = t.split_once('=') else {
        return false;
    };
    let name = name.strip_suffix('+').unwrap_or(name);
    let name = name.split('[').next().unwrap_or(name);
    !name.is_empty()
        && name
            .chars()
            .next()
            .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn assignment_name(t: &str) -> &str {
    let name = t.split_once('=').map_or(t, |(n, _)| n);
    let name = name.strip_suffix('+').unwrap_or(name);
    name.split('[').next().unwrap_or(name)
}

fn assignment_is_suspicious(t: &str) -> bool {
    exec_rules::suspicious_variable(assignment_name(t)).is_some()
}

fn offer_assignment(t: &str, best: &mut Best) {
    let name = assignment_name(t);
    if let Some(why) = exec_rules::suspicious_variable(name) {
        best.offer(Decision::Prompt, || Hit {
            rule: "floor:environment".to_string(),
            reason: format!("setting `{name}` {why}"),
            suggestion: Some(format!("run the command without setting `{name}`")),
        });
    }
}

/// The first `$NAME` / `${NAME...}` in `text` whose name looks like a secret
/// (`OPENAI_API_KEY`, `GITHUB_TOKEN`, `DB_PASSWORD`, ...).
fn secret_variable(text: &str) -> Option<&str> {
    const MARKERS: &[&str] = &[
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "PRIVATE",
        "COOKIE",
        "SESSION",
    ];
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' {
            let start = if b.get(i + 1) == Some(&b'{') {
                i + 2
            } else {
                i + 1
            };
            let mut end = start;
            while end < b.len() && (b[end] == b'_' || b[end].is_ascii_alphanumeric()) {
                end += 1;
            }
            if let Some(name) = text.get(start..end) {
                let upper = name.to_ascii_uppercase();
                if !name.is_empty() && MARKERS.iter().any(|m| upper.contains(m)) {
                    return Some(name);
                }
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    None
}

fn offer_privilege(name: &str, best: &mut Best) {
    best.offer(Decision::Prompt, || Hit {
        rule: "floor:privilege".to_string(),
        reason: format!("`{name}` runs the command with elevated privileges"),
        suggestion: Some(
            "run it without elevated privileges, or ask the user to run it".to_string(),
        ),
    });
}

fn inline_shell_hit(name: &str) -> Hit {
    Hit {
        rule: "floor:inline-shell".to_string(),
        reason: format!("`{name}` runs an inline shell script; its commands are judged one by one"),
        suggestion: Some("run the commands directly instead of through a nested shell".to_string()),
    }
}

fn offer_credentials(args: &[Word], best: &mut Best) {
    for a in args {
        let t = a.text.as_str();
        let after_eq = t.split_once('=').map(|(_, v)| v);
        for candidate in [Some(t), after_eq].into_iter().flatten() {
            if let Some(why) = exec_danger::credential_path(candidate) {
                best.offer(Decision::Prompt, || Hit {
                    rule: "floor:credentials".to_string(),
                    reason: format!("touches `{candidate}`: {why}"),
                    suggestion: Some(
                        "secrets must not enter the model's context; ask the user to do this"
                            .to_string(),
                    ),
                });
                return;
            }
        }
    }
}

fn check_redirect(r: &Redirect, info: &ProgramInfo, cwd: Option<&str>, best: &mut Best) {
    let t = &r.target;
    if r.writes_file() {
        if t.substitution {
            return; // `> >(cmd)`: the nested command is judged as a substitution.
        }
        let text = t.text.as_str();
        if text.starts_with("/dev/tcp/") || text.starts_with("/dev/udp/") {
            if info.shell {
                return; // judged as a remote shell in eval_shell
            }
            best.offer(Decision::Prompt, || Hit {
                rule: NETWORK_RULE.to_string(),
                reason: format!("writes to the network socket `{text}`"),
                suggestion: Some(NETWORK_SUGGESTION.to_string()),
            });
            return;
        }
        let path = resolve(cwd, text);
        if let Some(why) =
            exec_danger::sensitive_write(&path).or_else(|| exec_danger::sensitive_write(text))
        {
            best.offer(Decision::Forbid, || Hit {
                rule: "floor:sensitive-write".to_string(),
                reason: format!("redirects output into `{text}`: {why}"),
                suggestion: Some(SENSITIVE_SUGGESTION.to_string()),
            });
            return;
        }
        let harmless = matches!(
            exec_danger::normalize_path(text).as_str(),
            "/dev/null" | "/dev/stdout" | "/dev/stderr" | "/dev/tty"
        ) || text.starts_with("/dev/fd/");
        if !harmless {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:redirect-write".to_string(),
                reason: if t.is_literal() {
                    format!("writes to the file `{text}`")
                } else {
                    format!("writes to `{text}`, a file name computed at run time")
                },
                suggestion: Some(
                    "use the agent's file tools to write files, or ask the user to approve"
                        .to_string(),
                ),
            });
        }
    } else if r.reads_file() || r.op == RedirectOp::DupIn {
        let text = t.text.as_str();
        if (text.starts_with("/dev/tcp/") || text.starts_with("/dev/udp/")) && !info.shell {
            best.offer(Decision::Prompt, || Hit {
                rule: NETWORK_RULE.to_string(),
                reason: format!("reads from the network socket `{text}`"),
                suggestion: Some(NETWORK_SUGGESTION.to_string()),
            });
        }
        if let Some(why) = exec_danger::credential_path(text) {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:credentials".to_string(),
                reason: format!("reads `{text}`: {why}"),
                suggestion: Some(
                    "secrets must not enter the model's context; ask the user to do this"
                        .to_string(),
                ),
            });
        }
    }
}

/// Skips options (and the values of those in `with_value`) starting at `i`.
fn skip_options(words: &[Word], mut i: usize, with_value: &[&str]) -> usize {
    while let Some(w) = words.get(i) {
        let t = w.text.as_str();
        if t == "--" {
            return i + 1;
        }
        if !t.starts_with('-') || t == "-" {
            break;
        }
        i += if with_value.contains(&t) { 2 } else { 1 };
    }
    i
}

/// The files a known writer writes to, from its arguments.
fn write_targets<'a>(name: &str, args: &'a [Word]) -> Vec<&'a str> {
    use exec_rules::{has_opt, opt_values, positionals, short_has};
    match name {
        "tee" | "truncate" | "touch" | "rm" | "rmdir" | "unlink" | "shred" | "mkdir" | "chattr"
        | "mkfifo" => positionals(args),
        "chmod" | "chown" | "chgrp" => {
            let p = positionals(args);
            if has_opt(args, &["--reference"]) {
                p
            } else {
                p.into_iter().skip(1).collect()
            }
        }
        "cp" | "install" | "ln" | "rsync" | "scp" => {
            let mut t = opt_values(args, "t", &["--target-directory"], "");
            if t.is_empty() {
                let p = positionals(args);
                if p.len() >= 2
                    && let Some(last) = p.last()
                    && !(matches!(name, "rsync" | "scp")
                        && last.split('/').next().is_some_and(|h| h.contains(':')))
                {
                    t.push(last);
                }
            }
            t
        }
        "mv" => {
            let mut t = opt_values(args, "t", &["--target-directory"], "");
            t.extend(positionals(args));
            t
        }
        "dd" => args
            .iter()
            .filter_map(|a| a.text.strip_prefix("of="))
            .collect(),
        "curl" => opt_values(
            args,
            "oDc",
            &[
                "--output",
                "--output-dir",
                "--cookie-jar",
                "--dump-header",
                "--trace",
                "--trace-ascii",
                "--stderr",
                "--etag-save",
                "--hsts",
                "--alt-svc",
            ],
            "AbCdeEFHKmPQrtTuUwxXyYz",
        ),
        "wget" => opt_values(
            args,
            "OoaP",
            &[
                "--output-document",
                "--output-file",
                "--append-output",
                "--directory-prefix",
            ],
            "eQtTwUBilDIXRA",
        ),
        "sort" => opt_values(args, "o", &["--output"], "kt"),
        "sed" | "perl" | "ruby" if short_has(args, "i") || has_opt(args, &["--in-place"]) => {
            positionals(args).into_iter().skip(1).collect()
        }
        "tar" => opt_values(args, "C", &["--directory"], "fbT"),
        "unzip" => opt_values(args, "d", &[], ""),
        "git" => opt_values(args, "", &["--output"], ""),
        _ => Vec::new(),
    }
}

fn resolve(cwd: Option<&str>, path: &str) -> String {
    if path.starts_with('/')
        || path.starts_with('~')
        || path.starts_with("$HOME")
        || path.starts_with("${HOME}")
    {
        return exec_danger::normalize_path(path);
    }
    match cwd {
        Some(c) => exec_danger::normalize_path(&format!("{c}/{path}")),
        None => exec_danger::normalize_path(path),
    }
}

/// The rule of a segment that talks to the network (a network program, `/dev/tcp`): a command
/// approved with it may use the network, through keel's proxy only.
pub const NETWORK_RULE: &str = "floor:network";

/// Whether a command key is (or starts with) a network program or network subcommand.
fn is_network_key(key: &[&str]) -> bool {
    /// Network subcommands by program, split into words once.
    static TABLE: OnceLock<FastMap<&'static str, Vec<Vec<&'static str>>>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t: FastMap<&'static str, Vec<Vec<&'static str>>> = FastMap::default();
        for n in exec_rules::NETWORK_SUBCOMMANDS {
            let words: Vec<&'static str> = n.split(' ').collect();
            t.entry(words[0]).or_default().push(words);
        }
        for p in exec_rules::NETWORK_PROGRAMS {
            t.entry(p).or_default().push(vec![p]);
        }
        t
    });
    let Some(first) = key.first() else {
        return false;
    };
    table.get(first).is_some_and(|entries| {
        entries
            .iter()
            .any(|e| e.len() <= key.len() && e.iter().zip(key).all(|(a, b)| a == b))
    })
}

fn rule_suggestion(key: &[&str]) -> String {
    format!(
        "ask the user to approve it; to allow it always, the user can add {{ prefix = \"{}\", decision = \"allow\" }} to [exec] rules in their config",
        key.join(" ")
    )
}

fn short(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= 80 {
        s.to_string()
    } else {
        let cut: String = s.chars().take(77).collect();
        format!("{cut}...")
    }
}

fn snippet_at(source: &str, offset: usize) -> &str {
    let mut start = offset.min(source.len());
    while start > 0 && !source.is_char_boundary(start) {
        start -= 1;
    }
    let rest = source.get(start..).unwrap_or("");
    let end = rest.char_indices().nth(40).map_or(rest.len(), |(i, _)| i);
    let snip = rest.get(..end).unwrap_or("").trim();
    if snip.is_empty() { source.trim() } else { snip }
}

#[cfg(test)]
mod tests;
