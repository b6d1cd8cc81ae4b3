//! Splitting a shell command line into the simple commands the exec policy judges.
//!
//! This is a conservative, bash-flavoured lexer. It never expands or executes anything: it
//! finds the simple commands of a command line (split at `&&`, `||`, `;`, `|`, `|&`, `&`,
//! newlines, subshell parentheses and `{ ...; }` groups), the words of each command with their
//! quoting removed, the redirections, and every nested script (`$(...)`, backticks, `<(...)`,
//! `>(...)`, the interior of `${...}` and `$((...))`, and unquoted here-document bodies), which
//! it splits recursively.
//!
//! Why hand-written rather than a grammar: the policy check must stay in the low microseconds
//! and must never panic on hostile input, so the lexer works on bytes (every syntax character
//! is ASCII, so slicing at them is always on a UTF-8 boundary), nests through an explicit
//! depth limit, and reports what it could not understand as [`SplitIssue`]s instead of failing.
//! Where it cannot follow bash exactly (a `case` pattern's `)`, say), it over-splits and reports
//! an issue: for a policy that only allows a command when every piece is allowed, over-splitting
//! can only make the verdict stricter.

use std::ops::Range;

/// Deepest nesting of substitutions / nested scripts the splitter follows. Deeper input is
/// reported as [`IssueKind::TooDeep`] and left unparsed.
pub const MAX_NESTING: usize = 12;

/// Longest command line the splitter accepts (bytes); longer input is reported as
/// [`IssueKind::TooLong`] and not parsed.
pub const MAX_INPUT_LEN: usize = 256 * 1024;

/// The result of splitting one command line (or one nested script).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedScript {
    /// The simple commands in source order, with groups flattened.
    pub commands: Vec<SimpleCommand>,
    /// What the splitter could not fully understand (syntax errors, unsupported constructs).
    pub issues: Vec<SplitIssue>,
}

/// What kind of thing a [`SimpleCommand`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandKind {
    /// An ordinary command: the first word (after assignments) is the program.
    Simple,
    /// The header of a `for`, `select` or `case` construct; its words are data, not a command.
    Control,
    /// A function definition header (`name()` or `function name`); its words are data.
    FunctionHeader,
    /// An arithmetic command `(( ... ))`.
    Arithmetic,
    /// What follows the end of a group (`)` or `}`): only redirections apply to the group.
    GroupEnd,
}

/// The operator that ended a [`SimpleCommand`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connector {
    /// End of input (or of a nested script).
    End,
    /// `;` (also `;;`, `;&`, `;;&`).
    Sequence,
    /// A newline.
    Newline,
    /// `&&`.
    And,
    /// `||`.
    Or,
    /// `|`: the next command reads this one's output.
    Pipe,
    /// `|&`: the next command reads this one's output and errors.
    PipeAll,
    /// `&`: this command runs in the background.
    Background,
}

impl Connector {
    /// The operator as written in a shell (`""` for [`Connector::End`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Connector::End => "",
            Connector::Sequence | Connector::Newline => ";",
            Connector::And => "&&",
            Connector::Or => "||",
            Connector::Pipe => "|",
            Connector::PipeAll => "|&",
            Connector::Background => "&",
        }
    }

    /// Whether the next command reads this command's output.
    pub fn is_pipe(self) -> bool {
        matches!(self, Connector::Pipe | Connector::PipeAll)
    }
}

/// One simple command: assignments, words, redirections and nested scripts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleCommand {
    /// Byte range of the command in the script it was split from.
    pub span: Range<usize>,
    /// What kind of command this is.
    pub kind: CommandKind,
    /// Leading `NAME=value` assignments (before the program name).
    pub assignments: Vec<Word>,
    /// The words, program first, with quoting removed and reserved words (`if`, `then`, `do`,
    /// `{`, ...) stripped.
    pub words: Vec<Word>,
    /// Redirections in source order.
    pub redirects: Vec<Redirect>,
    /// Every nested script appearing in this command's words, assignments or redirections.
    pub substitutions: Vec<Substitution>,
    /// Whether standard input comes from a pipe (directly, or through an enclosing group).
    pub piped_input: bool,
    /// The operator that ended this command.
    pub connector: Connector,
    /// How many groups (`( )` or `{ }`) enclose this command.
    pub group_depth: usize,
}

/// A shell word after quote removal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Word {
    /// The text with quotes and escapes removed; expansions (`$HOME`, `$(...)`) are kept as
    /// written, and `$'...'` strings are decoded.
    pub text: String,
    /// Byte range of the word in its script.
    pub span: Range<usize>,
    /// Whether any part was quoted or escaped.
    pub quoted: bool,
    /// Whether the word contains a parameter, arithmetic or command expansion.
    pub expansion: bool,
    /// Whether the word contains a command or process substitution.
    pub substitution: bool,
    /// Whether the word contains an unquoted glob or brace expansion.
    pub glob: bool,
}

impl Word {
    /// Whether the shell will pass this word through unchanged (no expansion, no glob).
    pub fn is_literal(&self) -> bool {
        !self.expansion && !self.glob
    }
}

/// A redirection operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirectOp {
    /// `<`
    Read,
    /// `>`
    Write,
    /// `>>`
    Append,
    /// `>|`
    Clobber,
    /// `<>`
    ReadWrite,
    /// `<&`
    DupIn,
    /// `>&` (a file write when the target is not a descriptor number or `-`)
    DupOut,
    /// `&>`
    WriteAll,
    /// `&>>`
    AppendAll,
    /// `<<` or `<<-`
    HereDoc,
    /// `<<<`
    HereString,
}

/// One redirection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// The explicit file descriptor (`2>`), if any.
    pub fd: Option<u32>,
    /// The operator.
    pub op: RedirectOp,
    /// The target word (the here-document delimiter for [`RedirectOp::HereDoc`]).
    pub target: Word,
    /// The here-document body, once read.
    pub body: Option<String>,
}

impl Redirect {
    /// Whether this redirection opens its target for writing.
    pub fn writes_file(&self) -> bool {
        match self.op {
            RedirectOp::Write
            | RedirectOp::Append
            | RedirectOp::Clobber
            | RedirectOp::ReadWrite
            | RedirectOp::WriteAll
            | RedirectOp::AppendAll => true,
            RedirectOp::DupOut => {
                let t = self.target.text.as_str();
                !(t == "-" || (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())))
            }
            _ => false,
        }
    }

    /// Whether this redirection opens its target file for reading (standard input from a file).
    pub fn reads_file(&self) -> bool {
        matches!(self.op, RedirectOp::Read | RedirectOp::ReadWrite)
    }

    /// Whether this redirection feeds inline text (here-document or here-string) to the command.
    pub fn is_inline_input(&self) -> bool {
        matches!(self.op, RedirectOp::HereDoc | RedirectOp::HereString)
    }
}

/// How a nested script is embedded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubstitutionKind {
    /// `$(...)`
    Command,
    /// `` `...` ``
    Backtick,
    /// `<(...)`
    ProcessInput,
    /// `>(...)`
    ProcessOutput,
}

impl SubstitutionKind {
    /// The syntax, for messages.
    pub fn syntax(self) -> &'static str {
        match self {
            SubstitutionKind::Command => "$(...)",
            SubstitutionKind::Backtick => "`...`",
            SubstitutionKind::ProcessInput => "<(...)",
            SubstitutionKind::ProcessOutput => ">(...)",
        }
    }
}

/// A nested script that the shell runs while building the enclosing command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Substitution {
    /// How it is embedded.
    pub kind: SubstitutionKind,
    /// The nested script's text; spans in `script` are relative to it.
    pub source: String,
    /// The nested script, split.
    pub script: ParsedScript,
}

/// Kinds of [`SplitIssue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueKind {
    /// A quote is never closed.
    UnterminatedQuote,
    /// A `$(`, `${`, `` ` `` or `<(` is never closed.
    UnterminatedSubstitution,
    /// A `(`/`{` group is never closed, or a `}` closes nothing.
    UnbalancedGroup,
    /// A redirection operator has no target.
    MissingRedirectTarget,
    /// An operator (`&&`, `|`, ...) has no command before it.
    MissingCommand,
    /// Syntax the splitter does not follow (a `case` pattern, extended globs, ...).
    Unsupported,
    /// Nesting deeper than [`MAX_NESTING`].
    TooDeep,
    /// Input longer than [`MAX_INPUT_LEN`].
    TooLong,
}

impl IssueKind {
    /// Whether the shell itself would reject the input (rather than us not following it).
    pub fn is_syntax_error(self) -> bool {
        matches!(
            self,
            IssueKind::UnterminatedQuote
                | IssueKind::UnterminatedSubstitution
                | IssueKind::UnbalancedGroup
                | IssueKind::MissingRedirectTarget
                | IssueKind::MissingCommand
        )
    }
}

/// Something the splitter could not fully understand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitIssue {
    /// What went wrong.
    pub kind: IssueKind,
    /// Byte offset in the script where it was noticed.
    pub offset: usize,
    /// A human-readable description, saying what to fix.
    pub message: String,
}

/// Splits a command line into simple commands. Never panics; anything not understood is
/// reported in [`ParsedScript::issues`].
pub fn split(source: &str) -> ParsedScript {
    split_at_depth(source, 0)
}

/// Splits a nested script found at nesting `depth` (0 for a top-level command line).
pub fn split_at_depth(source: &str, depth: usize) -> ParsedScript {
    if depth > MAX_NESTING {
        return ParsedScript {
            commands: Vec::new(),
            issues: vec![SplitIssue {
                kind: IssueKind::TooDeep,
                offset: 0,
                message: format!(
                    "commands nested more than {MAX_NESTING} levels deep are not analysed; flatten the command"
                ),
            }],
        };
    }
    if source.len() > MAX_INPUT_LEN {
        return ParsedScript {
            commands: Vec::new(),
            issues: vec![SplitIssue {
                kind: IssueKind::TooLong,
                offset: 0,
                message: format!(
                    "command is {} bytes; commands longer than {MAX_INPUT_LEN} bytes are not analysed — write a script file instead",
                    source.len()
                ),
            }],
        };
    }
    let mut p = Parser::new(source, depth);
    p.run();
    ParsedScript {
        commands: p.out,
        issues: p.issues,
    }
}

/// The texts of the top-level simple commands of `source`, in order (a convenience for
/// messages and tests).
pub fn segment_texts(source: &str) -> Vec<String> {
    split(source)
        .commands
        .iter()
        .map(|c| source.get(c.span.clone()).unwrap_or("").to_string())
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupKind {
    Paren,
    Brace,
}

#[derive(Debug)]
struct Group {
    kind: GroupKind,
    piped: bool,
    offset: usize,
}

#[derive(Debug)]
struct Builder {
    start: Option<usize>,
    end: usize,
    kind: CommandKind,
    assignments: Vec<Word>,
    words: Vec<Word>,
    redirects: Vec<Redirect>,
    substitutions: Vec<Substitution>,
    piped: bool,
    touched: bool,
    dbracket: bool,
    after_time: bool,
}

impl Builder {
    fn new(kind: CommandKind, piped: bool) -> Self {
        Builder {
            start: None,
            end: 0,
            kind,
            assignments: Vec::new(),
            words: Vec::new(),
            redirects: Vec::new(),
            substitutions: Vec::new(),
            piped,
            touched: false,
            dbracket: false,
            after_time: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.assignments.is_empty()
            && self.words.is_empty()
            && self.redirects.is_empty()
            && self.substitutions.is_empty()
            && self.kind != CommandKind::Arithmetic
    }

    fn extend(&mut self, span: &Range<usize>) {
        self.start = Some(self.start.map_or(span.start, |s| s.min(span.start)));
        self.end = self.end.max(span.end);
        self.touched = true;
    }
}

#[derive(Debug)]
struct PendingHeredoc {
    command: usize,
    redirect: usize,
    delimiter: String,
    strip_tabs: bool,
    quoted: bool,
}

struct Parser<'a> {
    src: &'a str,
    b: &'a [u8],
    pos: usize,
    depth: usize,
    out: Vec<SimpleCommand>,
    issues: Vec<SplitIssue>,
    cur: Builder,
    groups: Vec<Group>,
    /// How many open groups read a pipe (kept as a count so deep nesting stays linear).
    piped_groups: usize,
    heredocs: Vec<PendingHeredoc>,
}

/// Flags gathered while lexing one word.
#[derive(Default)]
struct WordFlags {
    quoted: bool,
    expansion: bool,
    substitution: bool,
    glob: bool,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str, depth: usize) -> Self {
        Parser {
            src,
            b: src.as_bytes(),
            pos: 0,
            depth,
            out: Vec::new(),
            issues: Vec::new(),
            cur: Builder::new(CommandKind::Simple, false),
            groups: Vec::new(),
            piped_groups: 0,
            heredocs: Vec::new(),
        }
    }

    fn peek(&self, ahead: usize) -> Option<u8> {
        self.b.get(self.pos + ahead).copied()
    }

    fn slice(&self, r: Range<usize>) -> &'a str {
        self.src.get(r).unwrap_or("")
    }

    fn issue(&mut self, kind: IssueKind, offset: usize, message: impl Into<String>) {
        // One report per kind and place is plenty; hostile input must not grow this without bound.
        if self.issues.len() < 32 {
            self.issues.push(SplitIssue {
                kind,
                offset,
                message: message.into(),
            });
        }
    }

    fn any_group_piped(&self) -> bool {
        self.piped_groups > 0
    }

    fn run(&mut self) {
        while self.pos < self.b.len() {
            let c = self.b[self.pos];
            if self.cur.dbracket && matches!(c, b'&' | b'|' | b'<' | b'>' | b'(' | b')') {
                self.word_token();
                continue;
            }
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\\' if self.peek(1) == Some(b'\n') => self.pos += 2,
                b'\n' => {
                    self.pos += 1;
                    self.finish(Connector::Newline);
                    self.read_heredocs();
                }
                b'#' => {
                    while self.pos < self.b.len() && self.b[self.pos] != b'\n' {
                        self.pos += 1;
                    }
                }
                b';' => {
                    self.pos += 1;
                    while matches!(self.peek(0), Some(b';' | b'&')) {
                        self.pos += 1;
                    }
                    self.finish(Connector::Sequence);
                }
                b'&' => match self.peek(1) {
                    Some(b'&') => {
                        self.pos += 2;
                        self.finish(Connector::And);
                    }
                    Some(b'>') => self.redirect(None, self.pos),
                    _ => {
                        self.pos += 1;
                        self.finish(Connector::Background);
                    }
                },
                b'|' => match self.peek(1) {
                    Some(b'|') => {
                        self.pos += 2;
                        self.finish(Connector::Or);
                    }
                    Some(b'&') => {
                        self.pos += 2;
                        self.finish(Connector::PipeAll);
                    }
                    _ => {
                        self.pos += 1;
                        self.finish(Connector::Pipe);
                    }
                },
                b'(' => self.open_paren(),
                b')' => self.close_paren(),
                b'<' | b'>' => {
                    if self.peek(1) == Some(b'(') {
                        self.word_token();
                    } else {
                        self.redirect(None, self.pos);
                    }
                }
                b'0'..=b'9' => {
                    let start = self.pos;
                    let mut i = self.pos;
                    while i < self.b.len() && self.b[i].is_ascii_digit() {
                        i += 1;
                    }
                    let next = self.b.get(i).copied();
                    let next2 = self.b.get(i + 1).copied();
                    if matches!(next, Some(b'<' | b'>')) && next2 != Some(b'(') {
                        let fd = self.slice(start..i).parse::<u32>().ok();
                        self.pos = i;
                        self.redirect(fd, start);
                    } else {
                        self.word_token();
                    }
                }
                _ => self.word_token(),
            }
        }
        self.finish(Connector::End);
        if let Some(g) = self.groups.last() {
            let (open, close) = match g.kind {
                GroupKind::Paren => ("(", ")"),
                GroupKind::Brace => ("{", "}"),
            };
            let offset = g.offset;
            self.issue(
                IssueKind::UnbalancedGroup,
                offset,
                format!("`{open}` opened here is never closed; add the missing `{close}`"),
            );
        }
    }

    /// Ends the current command with `conn` and starts the next one.
    fn finish(&mut self, conn: Connector) {
        let piped_next = conn.is_pipe();
        let b = std::mem::replace(&mut self.cur, Builder::new(CommandKind::Simple, false));
        if !b.is_empty() {
            let start = b.start.unwrap_or(b.end);
            self.out.push(SimpleCommand {
                span: start..b.end.max(start),
                kind: b.kind,
                assignments: b.assignments,
                words: b.words,
                redirects: b.redirects,
                substitutions: b.substitutions,
                piped_input: b.piped,
                connector: conn,
                group_depth: self.groups.len(),
            });
        } else if !b.touched
            && b.kind == CommandKind::Simple
            && matches!(
                conn,
                Connector::And | Connector::Or | Connector::Pipe | Connector::PipeAll
            )
        {
            let at = self.pos.saturating_sub(1);
            self.issue(
                IssueKind::MissingCommand,
                at,
                format!("`{}` has no command before it", conn.as_str()),
            );
        }
        self.cur = Builder::new(CommandKind::Simple, piped_next || self.any_group_piped());
    }

    fn open_group(&mut self, kind: GroupKind, offset: usize) {
        // The (empty) current builder knows whether this position reads a pipe.
        let piped = self.cur.piped;
        self.groups.push(Group {
            kind,
            piped,
            offset,
        });
        self.piped_groups += usize::from(piped);
        self.cur = Builder::new(CommandKind::Simple, piped || self.any_group_piped());
        self.cur.touched = true;
    }

    fn close_group(&mut self, conn_end: usize) {
        self.finish(Connector::End);
        if self.groups.pop().is_some_and(|g| g.piped) {
            self.piped_groups -= 1;
        }
        self.cur = Builder::new(CommandKind::GroupEnd, self.any_group_piped());
        self.cur.touched = true;
        self.cur.end = conn_end;
    }

    fn open_paren(&mut self) {
        let at = self.pos;
        if self.peek(1) == Some(b'(')
            && (self.cur.words.is_empty() || self.cur.kind == CommandKind::Control)
        {
            // `(( ... ))` arithmetic command, or `for (( ... ))`.
            self.arithmetic_word(at, true);
            return;
        }
        let at_command_start = self.cur.words.is_empty()
            && self.cur.assignments.is_empty()
            && self.cur.redirects.is_empty()
            && self.cur.kind == CommandKind::Simple;
        if at_command_start {
            self.pos += 1;
            self.open_group(GroupKind::Paren, at);
            return;
        }
        if self.cur.words.len() == 1 && self.cur.kind != CommandKind::GroupEnd {
            // `name ()` function definition header?
            let mut i = self.pos + 1;
            while matches!(self.b.get(i), Some(b' ' | b'\t')) {
                i += 1;
            }
            if self.b.get(i) == Some(&b')') {
                self.pos = i + 1;
                self.cur.kind = CommandKind::FunctionHeader;
                self.cur.end = self.pos;
                self.finish(Connector::Sequence);
                return;
            }
        }
        if self.cur.kind == CommandKind::FunctionHeader {
            // `function name () { ... }`
            let mut i = self.pos + 1;
            while matches!(self.b.get(i), Some(b' ' | b'\t')) {
                i += 1;
            }
            if self.b.get(i) == Some(&b')') {
                self.pos = i + 1;
                self.finish(Connector::Sequence);
                return;
            }
        }
        self.issue(
            IssueKind::Unsupported,
            at,
            "`(` in the middle of a command (extended glob or array?) is not analysed; quote it if it is data",
        );
        self.finish(Connector::Sequence);
        self.pos += 1;
        self.open_group(GroupKind::Paren, at);
    }

    fn close_paren(&mut self) {
        let at = self.pos;
        self.pos += 1;
        match self.groups.last().map(|g| g.kind) {
            Some(GroupKind::Paren) => self.close_group(self.pos),
            Some(GroupKind::Brace) => {
                self.issue(
                    IssueKind::UnbalancedGroup,
                    at,
                    "`)` closes a `{` group; close it with `}`",
                );
                self.finish(Connector::Sequence);
            }
            None => {
                self.issue(
                    IssueKind::Unsupported,
                    at,
                    "unmatched `)` (a `case` pattern?) is not analysed; write the command without `case`",
                );
                self.finish(Connector::Sequence);
            }
        }
    }

    /// Lexes an `(( ... ))` starting at `at` (pointing at the first `(`).
    fn arithmetic_word(&mut self, at: usize, command: bool) {
        match scan_to_close(self.b, at) {
            Some(end) => {
                let inner_start = (at + 2).min(end);
                let inner_end = end.saturating_sub(1).max(inner_start);
                let inner = self.slice(inner_start..inner_end);
                let (subs, issues) = scan_expansions(inner, self.depth + 1);
                self.cur.substitutions.extend(subs);
                for i in issues {
                    self.issue(i.kind, at, i.message);
                }
                let span = at..end + 1;
                let word = Word {
                    text: self.slice(span.clone()).to_string(),
                    span: span.clone(),
                    quoted: false,
                    expansion: true,
                    substitution: false,
                    glob: false,
                };
                self.cur.extend(&span);
                self.pos = end + 1;
                if command && self.cur.words.is_empty() {
                    self.cur.kind = CommandKind::Arithmetic;
                } else {
                    self.cur.words.push(word);
                }
            }
            None => {
                self.issue(
                    IssueKind::UnterminatedSubstitution,
                    at,
                    "`((` is never closed; add the missing `))`",
                );
                self.pos = self.b.len();
            }
        }
    }

    fn redirect(&mut self, fd: Option<u32>, start: usize) {
        let rest = &self.b[self.pos..];
        let (op, len) = if rest.starts_with(b"<<<") {
            (RedirectOp::HereString, 3)
        } else if rest.starts_with(b"<<-") {
            (RedirectOp::HereDoc, 3)
        } else if rest.starts_with(b"<<") {
            (RedirectOp::HereDoc, 2)
        } else if rest.starts_with(b"<>") {
            (RedirectOp::ReadWrite, 2)
        } else if rest.starts_with(b"<&") {
            (RedirectOp::DupIn, 2)
        } else if rest.starts_with(b"<") {
            (RedirectOp::Read, 1)
        } else if rest.starts_with(b">>") {
            (RedirectOp::Append, 2)
        } else if rest.starts_with(b">|") {
            (RedirectOp::Clobber, 2)
        } else if rest.starts_with(b">&") {
            (RedirectOp::DupOut, 2)
        } else if rest.starts_with(b">") {
            (RedirectOp::Write, 1)
        } else if rest.starts_with(b"&>>") {
            (RedirectOp::AppendAll, 3)
        } else if rest.starts_with(b"&>") {
            (RedirectOp::WriteAll, 2)
        } else {
            // Not reachable from `run`, but never loop forever on a surprise.
            self.pos += 1;
            return;
        };
        let strip_tabs = rest.starts_with(b"<<-");
        self.pos += len;
        while matches!(self.peek(0), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        let target = match self.peek(0) {
            None | Some(b'\n' | b';' | b'&' | b'|' | b'<' | b'>' | b'(' | b')') => {
                let is_proc =
                    matches!(self.peek(0), Some(b'<' | b'>')) && self.peek(1) == Some(b'(');
                if is_proc { self.lex_word() } else { None }
            }
            _ => self.lex_word(),
        };
        let target = match target {
            Some(w) => w,
            None => {
                self.issue(
                    IssueKind::MissingRedirectTarget,
                    start,
                    "redirection has no target; name the file after the operator",
                );
                Word::default()
            }
        };
        let end = if target.span.end > 0 {
            target.span.end
        } else {
            self.pos
        };
        self.cur.extend(&(start..end));
        if op == RedirectOp::HereDoc {
            self.heredocs.push(PendingHeredoc {
                command: self.out.len(),
                redirect: self.cur.redirects.len(),
                delimiter: target.text.clone(),
                strip_tabs,
                quoted: target.quoted,
            });
        }
        self.cur.redirects.push(Redirect {
            fd,
            op,
            target,
            body: None,
        });
    }

    fn read_heredocs(&mut self) {
        let pending = std::mem::take(&mut self.heredocs);
        for h in pending {
            let mut body = String::new();
            loop {
                if self.pos >= self.b.len() {
                    break;
                }
                let line_end = self.b[self.pos..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(self.b.len(), |p| self.pos + p);
                let line = self.slice(self.pos..line_end);
                let next = (line_end + 1).min(self.b.len());
                let cmp = if h.strip_tabs {
                    line.trim_start_matches('\t')
                } else {
                    line
                };
                self.pos = next;
                if cmp == h.delimiter {
                    break;
                }
                body.push_str(line);
                body.push('\n');
                if line_end >= self.b.len() {
                    break;
                }
            }
            let (subs, issues) = if h.quoted {
                (Vec::new(), Vec::new())
            } else {
                scan_expansions(&body, self.depth + 1)
            };
            for i in issues {
                self.issue(i.kind, self.pos, i.message);
            }
            if let Some(cmd) = self.out.get_mut(h.command) {
                if let Some(r) = cmd.redirects.get_mut(h.redirect) {
                    r.body = Some(body);
                }
                cmd.substitutions.extend(subs);
            }
        }
    }

    /// Lexes a word at the current position and adds it to the current command.
    fn word_token(&mut self) {
        let before = self.pos;
        let Some(w) = self.lex_word() else {
            // Defensive: never spin on a byte the word lexer refuses.
            if self.pos == before {
                self.pos += 1;
            }
            return;
        };
        self.cur.extend(&w.span);
        self.push_word(w);
    }

    fn push_word(&mut self, w: Word) {
        let plain = !w.quoted && !w.expansion;
        if self.cur.dbracket {
            if plain && w.text == "]]" {
                self.cur.dbracket = false;
            }
            self.cur.words.push(w);
            return;
        }
        match self.cur.kind {
            CommandKind::Simple => {}
            CommandKind::GroupEnd => {
                self.issue(
                    IssueKind::Unsupported,
                    w.span.start,
                    "words after the end of a group are not analysed; put a `;` after the group",
                );
                self.cur.kind = CommandKind::Simple;
                self.cur.words.push(w);
                return;
            }
            _ => {
                self.cur.words.push(w);
                return;
            }
        }
        if self.cur.words.is_empty() && plain {
            if self.cur.after_time {
                self.cur.after_time = false;
                if w.text == "-p" {
                    return;
                }
            }
            let offset = w.span.start;
            match w.text.as_str() {
                "{" if self.cur.assignments.is_empty() && self.cur.redirects.is_empty() => {
                    self.open_group(GroupKind::Brace, offset);
                    return;
                }
                "}" if self.cur.assignments.is_empty()
                    && self.cur.redirects.is_empty()
                    && self.groups.last().map(|g| g.kind) == Some(GroupKind::Brace) =>
                {
                    self.close_group(w.span.end);
                    return;
                }
                "if" | "then" | "elif" | "else" | "do" | "while" | "until" | "!" | "fi"
                | "done" | "esac" | "coproc" => return,
                "time" => {
                    self.cur.after_time = true;
                    return;
                }
                "for" | "select" | "case" => {
                    self.cur.kind = CommandKind::Control;
                    self.cur.words.push(w);
                    return;
                }
                "function" => {
                    self.cur.kind = CommandKind::FunctionHeader;
                    self.cur.words.push(w);
                    return;
                }
                "[[" => {
                    self.cur.dbracket = true;
                    self.cur.words.push(w);
                    return;
                }
                _ => {}
            }
        }
        if self.cur.words.is_empty() && is_assignment(self.slice(w.span.clone())) {
            self.cur.assignments.push(w);
            return;
        }
        self.cur.words.push(w);
    }

    /// Lexes one word starting at the current position; `None` if there is no word here.
    fn lex_word(&mut self) -> Option<Word> {
        let start = self.pos;
        let mut text: Vec<u8> = Vec::new();
        let mut f = WordFlags::default();
        let dbracket = self.cur.dbracket;
        while self.pos < self.b.len() {
            let c = self.b[self.pos];
            match c {
                b' ' | b'\t' | b'\n' | b';' => break,
                b'<' | b'>' if self.peek(1) == Some(b'(') && !dbracket => {
                    let kind = if c == b'<' {
                        SubstitutionKind::ProcessInput
                    } else {
                        SubstitutionKind::ProcessOutput
                    };
                    self.paren_substitution(kind, self.pos, self.pos + 1, &mut text, &mut f);
                }
                b'&' | b'|' | b'<' | b'>' | b'(' | b')' => {
                    if dbracket {
                        text.push(c);
                        self.pos += 1;
                    } else {
                        break;
                    }
                }
                b'\\' => match self.peek(1) {
                    Some(b'\n') => self.pos += 2,
                    Some(n) => {
                        text.push(n);
                        f.quoted = true;
                        self.pos += 2;
                    }
                    None => {
                        text.push(b'\\');
                        self.pos += 1;
                    }
                },
                b'\'' => {
                    f.quoted = true;
                    let from = self.pos + 1;
                    match self.b[from..].iter().position(|&x| x == b'\'') {
                        Some(p) => {
                            text.extend_from_slice(&self.b[from..from + p]);
                            self.pos = from + p + 1;
                        }
                        None => {
                            self.issue(
                                IssueKind::UnterminatedQuote,
                                self.pos,
                                "single quote is never closed; add the missing `'`",
                            );
                            text.extend_from_slice(&self.b[from..]);
                            self.pos = self.b.len();
                        }
                    }
                }
                b'"' => self.double_quoted(&mut text, &mut f),
                b'$' => self.dollar(&mut text, &mut f, false),
                b'`' => self.backtick(&mut text, &mut f),
                b'*' | b'?' => {
                    f.glob = true;
                    text.push(c);
                    self.pos += 1;
                }
                b'[' => {
                    // Bounded lookahead keeps long runs of `[` linear.
                    let tail = &self.b[self.pos + 1..];
                    if tail[..tail.len().min(256)]
                        .iter()
                        .take_while(|&&x| !matches!(x, b' ' | b'\t' | b'\n' | b';' | b'|' | b'&'))
                        .any(|&x| x == b']')
                    {
                        f.glob = true;
                    }
                    text.push(c);
                    self.pos += 1;
                }
                b'{' => {
                    // Brace expansion `{a,b}` / `{1..3}` makes the word non-literal.
                    let tail = &self.b[self.pos + 1..];
                    let tail = &tail[..tail.len().min(256)];
                    let close = tail
                        .iter()
                        .take_while(|&&x| !matches!(x, b' ' | b'\t' | b'\n' | b';' | b'|' | b'&'))
                        .position(|&x| x == b'}');
                    if let Some(p) = close {
                        let inner = &tail[..p];
                        if inner.contains(&b',') || inner.windows(2).any(|w| w == b"..") {
                            f.glob = true;
                        }
                    }
                    text.push(c);
                    self.pos += 1;
                }
                _ => {
                    // Copy the whole run of ordinary bytes at once.
                    let run = self.b[self.pos..]
                        .iter()
                        .position(|&x| {
                            matches!(
                                x,
                                b' ' | b'\t'
                                    | b'\n'
                                    | b';'
                                    | b'&'
                                    | b'|'
                                    | b'<'
                                    | b'>'
                                    | b'('
                                    | b')'
                                    | b'\\'
                                    | b'\''
                                    | b'"'
                                    | b'$'
                                    | b'`'
                                    | b'*'
                                    | b'?'
                                    | b'['
                                    | b'{'
                            )
                        })
                        .unwrap_or(self.b.len() - self.pos)
                        .max(1);
                    text.extend_from_slice(&self.b[self.pos..self.pos + run]);
                    self.pos += run;
                }
            }
        }
        if self.pos == start {
            return None;
        }
        Some(Word {
            text: bytes_to_string(text),
            span: start..self.pos,
            quoted: f.quoted,
            expansion: f.expansion,
            substitution: f.substitution,
            glob: f.glob,
        })
    }

    fn double_quoted(&mut self, text: &mut Vec<u8>, f: &mut WordFlags) {
        f.quoted = true;
        let open = self.pos;
        self.pos += 1;
        loop {
            let Some(c) = self.peek(0) else {
                self.issue(
                    IssueKind::UnterminatedQuote,
                    open,
                    "double quote is never closed; add the missing `\"`",
                );
                return;
            };
            match c {
                b'"' => {
                    self.pos += 1;
                    return;
                }
                b'\\' => match self.peek(1) {
                    Some(b'\n') => self.pos += 2,
                    Some(n @ (b'$' | b'`' | b'"' | b'\\')) => {
                        text.push(n);
                        self.pos += 2;
                    }
                    _ => {
                        text.push(b'\\');
                        self.pos += 1;
                    }
                },
                b'$' => self.dollar(text, f, true),
                b'`' => self.backtick(text, f),
                _ => {
                    text.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn dollar(&mut self, text: &mut Vec<u8>, f: &mut WordFlags, in_dquote: bool) {
        let at = self.pos;
        match self.peek(1) {
            Some(b'(') => {
                if self.peek(2) == Some(b'(') && is_arithmetic(self.b, at + 1) {
                    match scan_to_close(self.b, at + 1) {
                        Some(end) => {
                            let inner =
                                self.slice((at + 3).min(end)..end.saturating_sub(1).max(at + 3));
                            let (subs, issues) = scan_expansions(inner, self.depth + 1);
                            if !subs.is_empty() {
                                f.substitution = true;
                            }
                            self.cur.substitutions.extend(subs);
                            for i in issues {
                                self.issue(i.kind, at, i.message);
                            }
                            text.extend_from_slice(&self.b[at..=end]);
                            f.expansion = true;
                            self.pos = end + 1;
                        }
                        None => self.unterminated(at, "`$((`", "`))`"),
                    }
                } else {
                    self.paren_substitution(SubstitutionKind::Command, at, at + 1, text, f);
                }
            }
            Some(b'{') => match scan_to_close(self.b, at + 1) {
                Some(end) => {
                    let inner = self.slice(at + 2..end);
                    let (subs, issues) = scan_expansions(inner, self.depth + 1);
                    if !subs.is_empty() {
                        f.substitution = true;
                    }
                    self.cur.substitutions.extend(subs);
                    for i in issues {
                        self.issue(i.kind, at, i.message);
                    }
                    text.extend_from_slice(&self.b[at..=end]);
                    f.expansion = true;
                    self.pos = end + 1;
                }
                None => self.unterminated(at, "`${`", "`}`"),
            },
            Some(b'\'') if !in_dquote => {
                f.quoted = true;
                self.pos += 2;
                self.ansi_c(text);
            }
            Some(b'"') if !in_dquote => {
                self.pos += 1;
                self.double_quoted(text, f);
            }
            Some(c) if c == b'_' || c.is_ascii_alphabetic() => {
                let mut i = at + 1;
                while i < self.b.len() && (self.b[i] == b'_' || self.b[i].is_ascii_alphanumeric()) {
                    i += 1;
                }
                text.extend_from_slice(&self.b[at..i]);
                f.expansion = true;
                self.pos = i;
            }
            Some(c)
                if c.is_ascii_digit()
                    || matches!(c, b'@' | b'*' | b'#' | b'?' | b'$' | b'!' | b'-') =>
            {
                text.extend_from_slice(&self.b[at..at + 2]);
                f.expansion = true;
                self.pos = at + 2;
            }
            _ => {
                text.push(b'$');
                self.pos += 1;
            }
        }
    }

    fn unterminated(&mut self, at: usize, what: &str, close: &str) {
        self.issue(
            IssueKind::UnterminatedSubstitution,
            at,
            format!("{what} is never closed; add the missing {close}"),
        );
        self.pos = self.b.len();
    }

    /// `$(...)`, `<(...)`, `>(...)`: `at` is the first byte of the syntax, `open` the `(`.
    fn paren_substitution(
        &mut self,
        kind: SubstitutionKind,
        at: usize,
        open: usize,
        text: &mut Vec<u8>,
        f: &mut WordFlags,
    ) {
        match scan_to_close(self.b, open) {
            Some(end) => {
                let inner = self.slice(open + 1..end);
                self.cur.substitutions.push(Substitution {
                    kind,
                    source: inner.to_string(),
                    script: split_at_depth(inner, self.depth + 1),
                });
                text.extend_from_slice(&self.b[at..=end]);
                f.expansion = true;
                f.substitution = true;
                self.pos = end + 1;
            }
            None => {
                let what = format!("`{}`", kind.syntax().trim_end_matches("...)"));
                self.unterminated(at, &what, "`)`");
            }
        }
    }

    fn backtick(&mut self, text: &mut Vec<u8>, f: &mut WordFlags) {
        let at = self.pos;
        let mut i = at + 1;
        let mut inner: Vec<u8> = Vec::new();
        let mut closed = false;
        while i < self.b.len() {
            match self.b[i] {
                b'\\' if matches!(self.b.get(i + 1), Some(b'`' | b'\\' | b'$')) => {
                    inner.push(self.b[i + 1]);
                    i += 2;
                }
                b'`' => {
                    closed = true;
                    break;
                }
                c => {
                    inner.push(c);
                    i += 1;
                }
            }
        }
        if !closed {
            self.issue(
                IssueKind::UnterminatedSubstitution,
                at,
                "backquote substitution is never closed; add the missing backquote (or use `$(...)`)",
            );
        }
        let inner = bytes_to_string(inner);
        let script = split_at_depth(&inner, self.depth + 1);
        self.cur.substitutions.push(Substitution {
            kind: SubstitutionKind::Backtick,
            source: inner,
            script,
        });
        let end = if closed { i + 1 } else { self.b.len() };
        text.extend_from_slice(&self.b[at..end]);
        f.expansion = true;
        f.substitution = true;
        self.pos = end;
    }

    /// Decodes a `$'...'` string; the position is just after the opening quote.
    fn ansi_c(&mut self, text: &mut Vec<u8>) {
        let open = self.pos.saturating_sub(2);
        loop {
            let Some(c) = self.peek(0) else {
                self.issue(
                    IssueKind::UnterminatedQuote,
                    open,
                    "`$'` string is never closed; add the missing `'`",
                );
                return;
            };
            match c {
                b'\'' => {
                    self.pos += 1;
                    return;
                }
                b'\\' => {
                    let Some(e) = self.peek(1) else {
                        text.push(b'\\');
                        self.pos += 1;
                        continue;
                    };
                    self.pos += 2;
                    match e {
                        b'a' => text.push(0x07),
                        b'b' => text.push(0x08),
                        b'e' | b'E' => text.push(0x1b),
                        b'f' => text.push(0x0c),
                        b'n' => text.push(b'\n'),
                        b'r' => text.push(b'\r'),
                        b't' => text.push(b'\t'),
                        b'v' => text.push(0x0b),
                        b'\\' | b'\'' | b'"' | b'?' => text.push(e),
                        b'0'..=b'7' => {
                            let mut v: u32 = u32::from(e - b'0');
                            for _ in 0..2 {
                                match self.peek(0) {
                                    Some(d @ b'0'..=b'7') => {
                                        v = v * 8 + u32::from(d - b'0');
                                        self.pos += 1;
                                    }
                                    _ => break,
                                }
                            }
                            text.push((v & 0xff) as u8);
                        }
                        b'x' => {
                            let v = self.hex_digits(2);
                            match v {
                                Some(v) => text.push((v & 0xff) as u8),
                                None => text.extend_from_slice(b"\\x"),
                            }
                        }
                        b'u' | b'U' => {
                            let n = if e == b'u' { 4 } else { 8 };
                            match self.hex_digits(n).and_then(char::from_u32) {
                                Some(ch) => {
                                    let mut buf = [0u8; 4];
                                    text.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                                }
                                None => {
                                    text.push(b'\\');
                                    text.push(e);
                                }
                            }
                        }
                        b'c' => {
                            if let Some(x) = self.peek(0) {
                                text.push(x & 0x1f);
                                self.pos += 1;
                            }
                        }
                        other => {
                            text.push(b'\\');
                            text.push(other);
                        }
                    }
                }
                _ => {
                    text.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn hex_digits(&mut self, max: usize) -> Option<u32> {
        let mut v: u32 = 0;
        let mut n = 0;
        while n < max {
            match self.peek(0).and_then(|d| (d as char).to_digit(16)) {
                Some(d) => {
                    v = v.wrapping_mul(16).wrapping_add(d);
                    self.pos += 1;
                    n += 1;
                }
                None => break,
            }
        }
        (n > 0).then_some(v)
    }
}

/// Whether `word` (raw source text) starts with `NAME=`, `NAME+=` or `NAME[...]=`.
fn is_assignment(raw: &str) -> bool {
    let b = raw.as_bytes();
    let Some(&first) = b.first() else {
        return false;
    };
    if !(first == b'_' || first.is_ascii_alphabetic()) {
        return false;
    }
    let mut i = 1;
    while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
        i += 1;
    }
    if b.get(i) == Some(&b'[') {
        match b[i..].iter().position(|&c| c == b']') {
            Some(p) => i += p + 1,
            None => return false,
        }
    }
    if b.get(i) == Some(&b'+') {
        i += 1;
    }
    b.get(i) == Some(&b'=')
}

/// Whether the `((` at `open` (pointing at the first `(`) is an arithmetic expansion rather
/// than a command substitution that starts with a subshell: its closing `)` must be
/// immediately preceded by another `)` that closes the inner parenthesis.
fn is_arithmetic(b: &[u8], open: usize) -> bool {
    let Some(inner_end) = scan_to_close(b, open + 1) else {
        return false;
    };
    b.get(inner_end + 1) == Some(&b')')
}

/// Finds the byte that closes the `(` or `{` at `open`, following quotes, escapes, nested
/// substitutions and comments. Iterative, so hostile nesting cannot overflow the stack.
pub(crate) fn scan_to_close(b: &[u8], open: usize) -> Option<usize> {
    #[derive(Clone, Copy, PartialEq)]
    enum Ctx {
        Paren,
        Brace,
        DQuote,
        Backtick,
    }
    let first = match b.get(open) {
        Some(b'(') => Ctx::Paren,
        Some(b'{') => Ctx::Brace,
        _ => return None,
    };
    let mut stack = vec![first];
    let mut i = open + 1;
    while i < b.len() {
        let c = b[i];
        let top = *stack.last()?;
        match top {
            Ctx::DQuote => match c {
                b'\\' => i += 2,
                b'"' => {
                    stack.pop();
                    i += 1;
                }
                b'$' if matches!(b.get(i + 1), Some(b'(')) => {
                    stack.push(Ctx::Paren);
                    i += 2;
                }
                b'$' if matches!(b.get(i + 1), Some(b'{')) => {
                    stack.push(Ctx::Brace);
                    i += 2;
                }
                b'`' => {
                    stack.push(Ctx::Backtick);
                    i += 1;
                }
                _ => i += 1,
            },
            Ctx::Backtick => match c {
                b'\\' => i += 2,
                b'`' => {
                    stack.pop();
                    i += 1;
                }
                _ => i += 1,
            },
            Ctx::Paren | Ctx::Brace => match c {
                b'\\' => i += 2,
                b'\'' => {
                    if top == Ctx::Brace && stack.len() > 1 && stack[stack.len() - 2] == Ctx::DQuote
                    {
                        // Inside "${...}" a single quote is literal.
                        i += 1;
                    } else {
                        let p = b[i + 1..].iter().position(|&x| x == b'\'')?;
                        i += p + 2;
                    }
                }
                b'"' => {
                    stack.push(Ctx::DQuote);
                    i += 1;
                }
                b'`' => {
                    stack.push(Ctx::Backtick);
                    i += 1;
                }
                b'$' if matches!(b.get(i + 1), Some(b'(')) => {
                    stack.push(Ctx::Paren);
                    i += 2;
                }
                b'$' if matches!(b.get(i + 1), Some(b'{')) => {
                    stack.push(Ctx::Brace);
                    i += 2;
                }
                b'(' if top == Ctx::Paren => {
                    stack.push(Ctx::Paren);
                    i += 1;
                }
                b'{' if top == Ctx::Brace => {
                    stack.push(Ctx::Brace);
                    i += 1;
                }
                b')' if top == Ctx::Paren => {
                    stack.pop();
                    if stack.is_empty() {
                        return Some(i);
                    }
                    i += 1;
                }
                b'}' if top == Ctx::Brace => {
                    stack.pop();
                    if stack.is_empty() {
                        return Some(i);
                    }
                    i += 1;
                }
                b'#' if top == Ctx::Paren
                    && (i == 0
                        || matches!(
                            b[i - 1],
                            b' ' | b'\t' | b'\n' | b';' | b'(' | b'&' | b'|'
                        )) =>
                {
                    while i < b.len() && b[i] != b'\n' {
                        i += 1;
                    }
                }
                _ => i += 1,
            },
        }
    }
    None
}

/// Finds the nested scripts in text that the shell expands like the inside of double quotes
/// (here-document bodies, `${...}` and `$((...))` interiors).
pub(crate) fn scan_expansions(text: &str, depth: usize) -> (Vec<Substitution>, Vec<SplitIssue>) {
    let mut subs = Vec::new();
    let mut issues = Vec::new();
    if depth > MAX_NESTING {
        if text.contains("$(") || text.contains('`') || text.contains("${") {
            issues.push(SplitIssue {
                kind: IssueKind::TooDeep,
                offset: 0,
                message: format!(
                    "commands nested more than {MAX_NESTING} levels deep are not analysed; flatten the command"
                ),
            });
        }
        return (subs, issues);
    }
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'$' if matches!(b.get(i + 1), Some(b'(')) => match scan_to_close(b, i + 1) {
                Some(end) => {
                    let arith = b.get(i + 2) == Some(&b'(') && is_arithmetic(b, i + 1);
                    let inner_range = if arith {
                        (i + 3).min(end)..end.saturating_sub(1).max((i + 3).min(end))
                    } else {
                        i + 2..end
                    };
                    let inner = text.get(inner_range).unwrap_or("");
                    if arith {
                        let (s, is) = scan_expansions(inner, depth + 1);
                        subs.extend(s);
                        issues.extend(is);
                    } else {
                        subs.push(Substitution {
                            kind: SubstitutionKind::Command,
                            source: inner.to_string(),
                            script: split_at_depth(inner, depth),
                        });
                    }
                    i = end + 1;
                }
                None => {
                    issues.push(SplitIssue {
                        kind: IssueKind::UnterminatedSubstitution,
                        offset: i,
                        message: "`$(` is never closed; add the missing `)`".to_string(),
                    });
                    break;
                }
            },
            b'$' if matches!(b.get(i + 1), Some(b'{')) => match scan_to_close(b, i + 1) {
                Some(end) => {
                    let inner = text.get(i + 2..end).unwrap_or("");
                    let (s, is) = scan_expansions(inner, depth + 1);
                    subs.extend(s);
                    issues.extend(is);
                    i = end + 1;
                }
                None => {
                    issues.push(SplitIssue {
                        kind: IssueKind::UnterminatedSubstitution,
                        offset: i,
                        message: "`${` is never closed; add the missing `}`".to_string(),
                    });
                    break;
                }
            },
            b'`' => {
                let mut j = i + 1;
                let mut inner = Vec::new();
                while j < b.len() && b[j] != b'`' {
                    if b[j] == b'\\' && matches!(b.get(j + 1), Some(b'`' | b'\\' | b'$')) {
                        inner.push(b[j + 1]);
                        j += 2;
                    } else {
                        inner.push(b[j]);
                        j += 1;
                    }
                }
                if j >= b.len() {
                    issues.push(SplitIssue {
                        kind: IssueKind::UnterminatedSubstitution,
                        offset: i,
                        message:
                            "backquote substitution is never closed; add the missing backquote"
                                .to_string(),
                    });
                }
                let inner = bytes_to_string(inner);
                let script = split_at_depth(&inner, depth);
                subs.push(Substitution {
                    kind: SubstitutionKind::Backtick,
                    source: inner,
                    script,
                });
                i = j + 1;
            }
            _ => i += 1,
        }
    }
    (subs, issues)
}

fn bytes_to_string(v: Vec<u8>) -> String {
    match String::from_utf8(v) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
#[path = "shell_split_tests.rs"]
mod tests;
