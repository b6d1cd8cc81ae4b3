//! Evaluation: a command line's simple commands, each judged by program, nested scripts
//! (substitutions, `sh -c`, interpreters, `find -exec`) evaluated recursively, the verdict the
//! maximum over every segment.

use super::*;

impl ExecPolicy {
    pub(super) fn arity_of(&self, words: &[&str]) -> Option<usize> {
        if words.len() == 1 {
            return self.arity.get(words[0]).copied();
        }
        self.arity.get(&words.join(" ")).copied()
    }

    /// The arity-aware key of `name args...`.
    pub(super) fn command_key<'a>(&self, name: &'a str, args: &'a [Word]) -> Key<'a> {
        let mut key = Key {
            words: vec![name],
            joined: String::with_capacity(32),
            rest: args.len(),
            dynamic: None,
            risky: None,
        };
        key.joined.push_str(name);
        let mut arity = self.arity.get(name).copied().unwrap_or(1);
        let value_flags: &[&str] = exec_rules::VALUE_FLAGS
            .iter()
            .find(|(p, _)| *p == name)
            .map_or(&[], |(_, f)| f);
        let risky: Option<&(&str, &[&str], &str)> = exec_rules::RISKY_GLOBAL_FLAGS
            .iter()
            .find(|(p, _, _)| *p == name);
        let mut i = 0;
        let mut dashes = false;
        while key.words.len() < arity && i < args.len() {
            let w = &args[i];
            let t = w.text.as_str();
            if !dashes && t == "--" {
                dashes = true;
                i += 1;
                continue;
            }
            if !dashes && t.starts_with('-') && t.len() > 1 {
                if let Some((_, flags, why)) = risky
                    && flags.iter().any(|f| {
                        t == *f
                            || (t.starts_with(f) && (f.len() == 2 || t[f.len()..].starts_with('=')))
                    })
                {
                    key.risky = Some((t, why));
                }
                i += if value_flags.contains(&t) { 2 } else { 1 };
                continue;
            }
            if !dashes && key.words.len() == 1 && name == "cargo" && t.starts_with('+') {
                i += 1;
                continue;
            }
            if name == "make" && t.contains('=') {
                i += 1;
                continue;
            }
            if !w.is_literal() {
                key.dynamic = Some(t);
                break;
            }
            key.words.push(t);
            key.joined.push(' ');
            key.joined.push_str(t);
            i += 1;
            if let Some(a) = self.arity.get(key.joined.as_str()) {
                arity = *a;
            }
        }
        key.rest = i.min(args.len());
        key
    }

    pub(super) fn builtin_best(&self, key: &[&str]) -> Option<&'static Builtin> {
        let by_second = self.builtin.get(key.first()?)?;
        let one_word = by_second.get("").into_iter().flatten();
        let longer = key
            .get(1)
            .and_then(|w| by_second.get(w))
            .into_iter()
            .flatten();
        one_word
            .chain(longer)
            .filter(|(words, r)| {
                words.len() <= key.len()
                    && words.iter().zip(key).all(|(a, b)| a == b)
                    && (!r.exact || words.len() == key.len())
            })
            .max_by_key(|(words, r)| (words.len(), r.exact))
            .map(|(_, r)| *r)
    }

    // -----------------------------------------------------------------------------------------
    // Evaluation.

    pub(super) fn eval_script(
        &self,
        cx: &mut Cx,
        script: &ParsedScript,
        source: &str,
        depth: usize,
        parent: Option<usize>,
        context: Option<&str>,
    ) {
        if depth > MAX_EVAL_DEPTH {
            let idx = cx.push(source.trim(), depth, parent, context, None);
            cx.segs[idx].best.offer(Decision::Forbid, || Hit {
                rule: "limit:nesting".to_string(),
                reason: format!(
                    "commands nested more than {MAX_EVAL_DEPTH} levels deep are not analysed"
                ),
                suggestion: Some("flatten the command: run the inner command directly".to_string()),
            });
            return;
        }
        for issue in &script.issues {
            let idx = cx.push(
                snippet_at(source, issue.offset),
                depth,
                parent,
                context,
                None,
            );
            let d = if issue.kind.is_syntax_error()
                || matches!(issue.kind, IssueKind::TooDeep | IssueKind::TooLong)
            {
                Decision::Forbid
            } else {
                Decision::Prompt
            };
            cx.segs[idx].best.offer(d, || Hit {
                rule: "syntax".to_string(),
                reason: issue.message.clone(),
                suggestion: Some(if d == Decision::Forbid {
                    "fix the command's syntax as described; the shell would not run it as written"
                        .to_string()
                } else {
                    "write the command without this construct, or ask the user to approve it"
                        .to_string()
                }),
            });
        }
        let mut pipe_source: Option<&str> = None;
        for cmd in &script.commands {
            let text = source.get(cmd.span.clone()).unwrap_or("").trim();
            let view = View {
                words: &cmd.words,
                assignments: &cmd.assignments,
                redirects: &cmd.redirects,
                substitutions: &cmd.substitutions,
                piped_input: cmd.piped_input || cx.stdin_piped,
                kind: cmd.kind,
                upstream: if cmd.piped_input { pipe_source } else { None },
            };
            let span = (depth == 0).then(|| cmd.span.clone());
            self.eval_command(cx, &view, text, depth, parent, context, span);
            if cmd.connector.is_pipe() {
                pipe_source = Some(text);
            } else if !cmd.piped_input {
                pipe_source = None;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn eval_command(
        &self,
        cx: &mut Cx,
        v: &View<'_>,
        text: &str,
        depth: usize,
        parent: Option<usize>,
        context: Option<&str>,
        span: Option<Range<usize>>,
    ) -> usize {
        let idx = cx.push(text, depth, parent, context, span);
        let mut best = Best::default();
        for s in v.substitutions {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:substitution".to_string(),
                reason: format!(
                    "`{}` runs `{}` and splices its output into the command, so the command cannot be checked before it runs",
                    s.kind.syntax(),
                    short(&s.source)
                ),
                suggestion: Some("run the inner command on its own first, then pass its output literally".to_string()),
            });
        }
        for s in v.substitutions {
            let ctx = format!("inside {} of segment {idx}", s.kind.syntax());
            // `>(cmd)` reads what the outer command writes: its commands are piped into.
            let piped = cx.stdin_piped;
            cx.stdin_piped = piped || s.kind == SubstitutionKind::ProcessOutput;
            self.eval_script(cx, &s.script, &s.source, depth + 1, Some(idx), Some(&ctx));
            cx.stdin_piped = piped;
        }
        for a in v.assignments {
            offer_assignment(&a.text, &mut best);
        }
        for w in v.words.iter().chain(v.redirects.iter().map(|r| &r.target)) {
            if w.expansion
                && let Some(var) = secret_variable(&w.text)
            {
                best.offer(Decision::Prompt, || Hit {
                        rule: "floor:secret-variable".to_string(),
                        reason: format!("expands `${var}`, which looks like a secret; its value would reach the output"),
                        suggestion: Some("do not print or send secrets; ask the user if the value is really needed".to_string()),
                    });
            }
        }
        let info = match v.kind {
            CommandKind::Simple if !v.words.is_empty() => {
                self.eval_program(cx, v, idx, depth, &mut best)
            }
            kind => {
                let reason = match kind {
                    CommandKind::Control => "loop or case header: its words are data",
                    CommandKind::FunctionHeader => {
                        "function definition: its body is judged as if it ran"
                    }
                    CommandKind::Arithmetic => "shell arithmetic",
                    CommandKind::GroupEnd => "end of a group",
                    CommandKind::Simple if !v.assignments.is_empty() => "only sets shell variables",
                    CommandKind::Simple => "no command",
                };
                best.offer(Decision::Allow, || Hit {
                    rule: "syntax".to_string(),
                    reason: reason.to_string(),
                    suggestion: None,
                });
                ProgramInfo::default()
            }
        };
        for r in v.redirects {
            check_redirect(r, &info, cx.cwd.as_deref(), &mut best);
        }
        // Words that were quoted, escaped or `$'...'`-decoded can differ from the raw tokens the
        // independent scan sees; re-scan those commands' decoded words.
        if v.words.len() > 1 && v.words.iter().any(|w| w.quoted) {
            let ws: Vec<&str> = v.words.iter().map(|w| w.text.as_str()).collect();
            if let Some(c) = exec_danger::scan_words(&ws) {
                best.offer_catastrophic(|| catastrophic_hit(c));
            }
        }
        cx.segs[idx].best = best;
        idx
    }

    pub(super) fn eval_nested_text(
        &self,
        cx: &mut Cx,
        text: &str,
        depth: usize,
        parent: usize,
        context: String,
    ) {
        let parsed = shell_split::split_at_depth(text, depth + 1);
        self.eval_script(cx, &parsed, text, depth + 1, Some(parent), Some(&context));
    }

    pub(super) fn eval_program(
        &self,
        cx: &mut Cx,
        v: &View<'_>,
        idx: usize,
        depth: usize,
        best: &mut Best,
    ) -> ProgramInfo {
        let words = v.words;
        let (i, xargs) = match self.skip_wrappers(cx, words, idx, depth, best) {
            Wrapped::Run { at, xargs } => (at, xargs),
            Wrapped::Handled(info) => return info,
        };
        let Some(prog) = words.get(i) else {
            best.offer(Decision::Allow, || Hit {
                rule: "syntax".to_string(),
                reason: "no command after the wrapper".to_string(),
                suggestion: None,
            });
            return ProgramInfo::default();
        };
        let args = words.get(i + 1..).unwrap_or(&[]);
        if !prog.is_literal() {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:dynamic-program".to_string(),
                reason: format!(
                    "the program name `{}` is computed at run time, so no rule can vouch for it",
                    prog.text
                ),
                suggestion: Some("name the program literally".to_string()),
            });
            return ProgramInfo::default();
        }
        let (mut name, trusted) = program_name(&prog.text);
        if !trusted {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:program-path".to_string(),
                reason: format!("`{}` is run by path; only programs found on PATH or in system directories match rules", prog.text),
                suggestion: Some("approve it, or add the program's directory to PATH and name it".to_string()),
            });
        }
        let info = ProgramInfo {
            shell: exec_rules::SHELLS.contains(&name) || exec_rules::interpreter(name).is_some(),
        };
        let version_only = args.len() == 1
            && matches!(
                args[0].text.as_str(),
                "--version" | "-V" | "--help" | "-h" | "version" | "help" | "-version"
            );
        let mut args = args;
        let mut sink = false;
        if exec_rules::SHELLS.contains(&name) {
            self.eval_shell(cx, v, name, args, xargs, version_only, idx, depth, best);
            sink = true;
        } else if let Some(interp) = exec_rules::interpreter(name) {
            match self.eval_interpreter(v, name, interp, args, xargs, version_only, best) {
                Some((module, rest)) => {
                    name = module;
                    args = rest;
                }
                None => sink = true,
            }
        }
        match name {
            "eval" => {
                sink = true;
                best.offer(Decision::Prompt, || Hit {
                    rule: "floor:eval".to_string(),
                    reason: "`eval` runs its arguments as shell code; the code is judged below"
                        .to_string(),
                    suggestion: Some(
                        "run the command directly instead of through eval".to_string(),
                    ),
                });
                if args.iter().any(|a| a.substitution) {
                    best.offer(Decision::Forbid, || Hit {
                        rule: "floor:eval-substitution".to_string(),
                        reason: "`eval` of a command's output runs code nobody has seen".to_string(),
                        suggestion: Some("run the producing command first, inspect its output, then run what you mean literally".to_string()),
                    });
                }
                let script = args
                    .iter()
                    .map(|a| a.text.as_str())
                    .collect::<Vec<_>>()
                    .join(" ");
                self.eval_nested_text(
                    cx,
                    &script,
                    depth,
                    idx,
                    format!("eval code of segment {idx}"),
                );
            }
            "source" | "."
                if v.piped_input && args.first().is_some_and(|a| is_stdin_path(&a.text)) =>
            {
                best.offer(Decision::Forbid, || Hit {
                    rule: "floor:pipe-to-shell".to_string(),
                    reason: format!(
                        "sourcing standard input runs whatever `{}` produces as shell code",
                        v.upstream
                            .map_or_else(|| "the left side".to_string(), short)
                    ),
                    suggestion: Some(
                        "save the script to a file, inspect it, then source the file".to_string(),
                    ),
                });
            }
            "source" | "." if args.first().is_some_and(|a| a.substitution) => {
                best.offer(Decision::Forbid, || Hit {
                    rule: "floor:source-substitution".to_string(),
                    reason:
                        "sources a script produced by a command, which runs code nobody has seen"
                            .to_string(),
                    suggestion: Some(
                        "save the script to a file, inspect it, then source the file".to_string(),
                    ),
                });
            }
            "trap" => {
                if let Some(handler) = exec_rules::positionals(args).first() {
                    let h = (*handler).to_string();
                    self.eval_nested_text(
                        cx,
                        &h,
                        depth,
                        idx,
                        format!("trap handler of segment {idx}"),
                    );
                }
                best.offer(Decision::Allow, || Hit {
                    rule: "builtin:trap".to_string(),
                    reason: "sets a signal handler; the handler is judged below".to_string(),
                    suggestion: None,
                });
                return info;
            }
            "alias" => {
                for a in args {
                    if let Some((_, value)) = a.text.split_once('=') {
                        let value = value.to_string();
                        self.eval_nested_text(
                            cx,
                            &value,
                            depth,
                            idx,
                            format!("alias body of segment {idx}"),
                        );
                    }
                }
            }
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                for a in args {
                    if shell_split_is_assignment(&a.text) {
                        offer_assignment(&a.text, best);
                    }
                }
            }
            "cd" | "pushd" if depth == 0 => {
                cx.cwd = match exec_rules::positionals(args).first() {
                    None => Some("~".to_string()),
                    Some(p) if args.iter().all(Word::is_literal) && *p != "-" => {
                        Some(resolve(cx.cwd.as_deref(), p))
                    }
                    Some(_) => None,
                };
            }
            _ => {}
        }
        let key = self.command_key(name, args);
        if let Some((flag, why)) = key.risky {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:risky-flag".to_string(),
                reason: format!("`{name} {flag}` {why}"),
                suggestion: Some(format!("run `{name}` without `{flag}`")),
            });
        }
        if let Some(d) = key.dynamic {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:dynamic-subcommand".to_string(),
                reason: format!(
                    "the subcommand `{d}` is computed at run time, so no rule can vouch for it"
                ),
                suggestion: Some("write the subcommand literally".to_string()),
            });
        }
        let call = Call {
            name,
            args,
            key,
            version_only,
            sink,
            xargs,
        };
        self.offer_floors(cx, &call, idx, depth, best);
        self.offer_rules(&call, best);
        info
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn eval_shell(
        &self,
        cx: &mut Cx,
        v: &View<'_>,
        name: &str,
        args: &[Word],
        xargs: bool,
        version_only: bool,
        idx: usize,
        depth: usize,
        best: &mut Best,
    ) {
        if v.piped_input || xargs {
            best.offer(Decision::Forbid, || Hit {
                rule: "floor:pipe-to-shell".to_string(),
                reason: match (xargs, v.upstream) {
                    (true, _) => format!("`xargs {name}` runs a shell on arguments read from its input"),
                    (false, Some(up)) => format!("a pipe into `{name}` runs whatever `{}` produces as shell code, whatever stands on the left", short(up)),
                    (false, None) => format!("a pipe into `{name}` runs whatever the left side produces as shell code"),
                },
                suggestion: Some("save the script to a file, inspect it, then run it as its own command".to_string()),
            });
        }
        if version_only {
            best.offer(Decision::Allow, || Hit {
                rule: format!("builtin:{name} --version"),
                reason: "prints version or help".to_string(),
                suggestion: None,
            });
            return;
        }
        let powershell = matches!(name, "pwsh" | "powershell");
        let mut inline = false;
        let mut inline_text: Option<(&str, bool)> = None;
        let mut file: Option<&Word> = None;
        let mut encoded = false;
        let mut i = 0;
        while let Some(a) = args.get(i) {
            let t = a.text.as_str();
            if t == "--" || t == "-" {
                if t == "--"
                    && let Some(n) = args.get(i + 1)
                {
                    if inline {
                        inline_text = Some((n.text.as_str(), n.substitution));
                    } else {
                        file = Some(n);
                    }
                }
                break;
            }
            if powershell && t.starts_with('-') {
                let l = t.to_ascii_lowercase();
                match l.as_str() {
                    "-c" | "-command" => inline = true,
                    "-e" | "-ec" | "-enc" | "-encodedcommand" => encoded = true,
                    "-f" | "-file" => {
                        file = args.get(i + 1);
                        break;
                    }
                    _ => {}
                }
                i += 1;
                continue;
            }
            if let Some(long) = t.strip_prefix("--") {
                if long == "command" {
                    inline = true;
                } else if let Some(s) = long.strip_prefix("command=") {
                    inline_text = Some((s, a.substitution));
                    inline = true;
                    break;
                } else if matches!(long, "rcfile" | "init-file" | "init-command") {
                    i += 1;
                }
                i += 1;
                continue;
            }
            if (t.starts_with('-') || t.starts_with('+')) && t.len() > 1 {
                let body = &t[1..];
                if body.contains('c') {
                    inline = true;
                }
                if body.contains('o') || body.contains('O') {
                    i += 1;
                }
                i += 1;
                continue;
            }
            if inline {
                inline_text = Some((t, a.substitution));
            } else {
                file = Some(a);
            }
            break;
        }
        if encoded {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:inline-shell".to_string(),
                reason: format!("`{name}` runs an encoded command that cannot be checked"),
                suggestion: Some("send the command in plain text".to_string()),
            });
        }
        for r in v.redirects {
            if r.target.text.starts_with("/dev/tcp/") || r.target.text.starts_with("/dev/udp/") {
                best.offer(Decision::Forbid, || Hit {
                    rule: "floor:reverse-shell".to_string(),
                    reason: format!(
                        "`{name}` with its input or output on `{}` is a remote shell",
                        r.target.text
                    ),
                    suggestion: Some(
                        "do not connect shells to network sockets from the agent".to_string(),
                    ),
                });
            }
        }
        if inline {
            match inline_text {
                None => best.offer(Decision::Prompt, || Hit {
                    rule: "floor:inline-shell".to_string(),
                    reason: format!("`{name} -c` without a script to check"),
                    suggestion: Some("pass the script as the next argument".to_string()),
                }),
                Some((script, substituted)) => {
                    best.offer(Decision::Prompt, || inline_shell_hit(name));
                    if substituted {
                        best.offer(Decision::Forbid, || Hit {
                            rule: "floor:run-output".to_string(),
                            reason: format!("`{name} -c` runs the output of a command as shell code, which nobody has seen"),
                            suggestion: Some("save the script to a file, inspect it, then run it as its own command".to_string()),
                        });
                    }
                    self.eval_nested_text(
                        cx,
                        script,
                        depth,
                        idx,
                        format!("{name} -c script of segment {idx}"),
                    );
                }
            }
            return;
        }
        if let Some(f) = file {
            if (v.piped_input || xargs) && is_stdin_path(&f.text) {
                // Already forbidden above as a pipe into a shell.
                return;
            }
            if f.substitution {
                best.offer(Decision::Forbid, || Hit {
                    rule: "floor:run-output".to_string(),
                    reason: format!(
                        "`{name} {}` runs a script produced by a command, which nobody has seen",
                        f.text
                    ),
                    suggestion: Some(
                        "save the script to a file, inspect it, then run it".to_string(),
                    ),
                });
            }
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:script".to_string(),
                reason: format!(
                    "runs the shell script `{}`, whose contents were not checked",
                    f.text
                ),
                suggestion: Some(
                    "ask the user to approve the script, or run its commands directly".to_string(),
                ),
            });
            return;
        }
        // The script comes from standard input.
        if let Some(r) = v.redirects.iter().find(|r| r.is_inline_input()) {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:inline-shell".to_string(),
                reason: format!(
                    "feeds an inline script to `{name}`; its commands are judged below"
                ),
                suggestion: Some("run the commands directly".to_string()),
            });
            if r.op == RedirectOp::HereString && r.target.substitution {
                best.offer(Decision::Forbid, || Hit {
                    rule: "floor:run-output".to_string(),
                    reason: format!("feeds the output of a command to `{name}` as code"),
                    suggestion: Some(
                        "save the script to a file, inspect it, then run it".to_string(),
                    ),
                });
            }
            let body = r.body.clone().unwrap_or_else(|| r.target.text.clone());
            self.eval_nested_text(
                cx,
                &body,
                depth,
                idx,
                format!("script fed to {name} in segment {idx}"),
            );
        } else if let Some(r) = v.redirects.iter().find(|r| r.reads_file()) {
            if r.target.substitution {
                best.offer(Decision::Forbid, || Hit {
                    rule: "floor:run-output".to_string(),
                    reason: format!("`{name}` reads its script from the output of a command"),
                    suggestion: Some(
                        "save the script to a file, inspect it, then run it".to_string(),
                    ),
                });
            }
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:script".to_string(),
                reason: format!(
                    "`{name}` runs shell commands read from `{}`, which were not checked",
                    r.target.text
                ),
                suggestion: Some("ask the user to approve the script".to_string()),
            });
        } else {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:interactive-shell".to_string(),
                reason: format!("starts an interactive `{name}` shell"),
                suggestion: Some("run the commands directly".to_string()),
            });
        }
    }

    /// Returns `Some((module, args))` for `python -m module args...` so the module is judged
    /// by its own rules; `None` when the interpreter invocation has been judged here.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn eval_interpreter<'w>(
        &self,
        v: &View<'_>,
        name: &str,
        interp: exec_rules::Interpreter,
        args: &'w [Word],
        xargs: bool,
        version_only: bool,
        best: &mut Best,
    ) -> Option<(&'w str, &'w [Word])> {
        let (base, inline_shorts, inline_longs) = interp;
        if version_only {
            best.offer(Decision::Allow, || Hit {
                rule: format!("builtin:{name} --version"),
                reason: "prints version or help".to_string(),
                suggestion: None,
            });
            return None;
        }
        let python = base.starts_with("python") || base.starts_with("pypy");
        let mut inline: Option<Option<&Word>> = None;
        let mut script: Option<&Word> = None;
        let mut i = 0;
        while let Some(a) = args.get(i) {
            let t = a.text.as_str();
            if t == "-" {
                break; // the program comes from standard input
            }
            if t == "--" {
                script = args.get(i + 1);
                break;
            }
            if t.starts_with("--") {
                if inline_longs.contains(&t) {
                    inline = Some(args.get(i + 1));
                    break;
                }
                if inline_longs
                    .iter()
                    .any(|l| t.strip_prefix(l).is_some_and(|r| r.starts_with('=')))
                {
                    inline = Some(Some(a));
                    break;
                }
                i += 1;
                continue;
            }
            if exec_rules::is_short_cluster(t) {
                let body = &t[1..];
                if python && let Some(p) = body.find('m') {
                    let tail = &body[p + 1..];
                    let (module, rest_from) = if tail.is_empty() {
                        (args.get(i + 1).map(|w| w.text.as_str()), i + 2)
                    } else {
                        (Some(tail), i + 1)
                    };
                    let Some(module) = module else {
                        best.offer(Decision::Prompt, || Hit {
                            rule: "floor:inline-code".to_string(),
                            reason: format!("`{name} -m` without a module"),
                            suggestion: None,
                        });
                        return None;
                    };
                    if exec_rules::PYTHON_MODULES.contains(&module) {
                        return Some((module, args.get(rest_from..).unwrap_or(&[])));
                    }
                    best.offer(Decision::Prompt, || Hit {
                        rule: "floor:python-module".to_string(),
                        reason: format!("runs the Python module `{module}`, which no rule covers"),
                        suggestion: Some(rule_suggestion(&[module])),
                    });
                    return None;
                }
                if let Some(p) = body.find(|c: char| inline_shorts.contains(c)) {
                    let tail = &body[p + 1..];
                    // `-c CODE`, or the code attached to the option (`-eCODE`).
                    inline = Some(if tail.is_empty() {
                        args.get(i + 1)
                    } else {
                        Some(a)
                    });
                    break;
                }
                if python && (body.ends_with('W') || body.ends_with('X')) {
                    i += 1;
                }
                i += 1;
                continue;
            }
            script = Some(a);
            break;
        }
        match (inline, script) {
            (Some(code), _) => {
                best.offer(Decision::Prompt, || Hit {
                    rule: "floor:inline-code".to_string(),
                    reason: format!("runs inline {base} code, which the policy cannot check"),
                    suggestion: Some("write the code to a file in the workspace and ask the user to approve running it".to_string()),
                });
                if code.is_some_and(|c| c.substitution) {
                    best.offer(Decision::Forbid, || Hit {
                        rule: "floor:run-output".to_string(),
                        reason: format!(
                            "runs {base} code produced by a command, which nobody has seen"
                        ),
                        suggestion: Some(
                            "save the code to a file, inspect it, then run it".to_string(),
                        ),
                    });
                }
            }
            (None, Some(s)) => {
                if (v.piped_input || xargs) && is_stdin_path(&s.text) {
                    best.offer(Decision::Forbid, || Hit {
                        rule: "floor:pipe-to-shell".to_string(),
                        reason: format!(
                            "`{name} {}` runs whatever `{}` produces as code",
                            s.text,
                            v.upstream
                                .map_or_else(|| "the left side".to_string(), short)
                        ),
                        suggestion: Some(
                            "save the code to a file, inspect it, then run it as its own command"
                                .to_string(),
                        ),
                    });
                }
                if s.substitution {
                    best.offer(Decision::Forbid, || Hit {
                        rule: "floor:run-output".to_string(),
                        reason: format!("`{name} {}` runs a script produced by a command, which nobody has seen", s.text),
                        suggestion: Some("save the script to a file, inspect it, then run it".to_string()),
                    });
                }
                best.offer(Decision::Prompt, || Hit {
                    rule: "floor:script".to_string(),
                    reason: format!(
                        "runs the {base} script `{}`, whose contents were not checked",
                        s.text
                    ),
                    suggestion: Some("ask the user to approve running the script".to_string()),
                });
            }
            (None, None) => {
                if v.piped_input || xargs {
                    best.offer(Decision::Forbid, || Hit {
                        rule: "floor:pipe-to-shell".to_string(),
                        reason: match v.upstream {
                            Some(up) => format!("a pipe into `{name}` runs whatever `{}` produces as code", short(up)),
                            None => format!("`{name}` reading its program from a pipe runs whatever the left side produces as code"),
                        },
                        suggestion: Some("save the code to a file, inspect it, then run it as its own command".to_string()),
                    });
                } else if let Some(r) = v
                    .redirects
                    .iter()
                    .find(|r| r.is_inline_input() || r.reads_file())
                {
                    if r.target.substitution {
                        best.offer(Decision::Forbid, || Hit {
                            rule: "floor:run-output".to_string(),
                            reason: format!("feeds the output of a command to `{name}` as code"),
                            suggestion: Some(
                                "save the code to a file, inspect it, then run it".to_string(),
                            ),
                        });
                    }
                    best.offer(Decision::Prompt, || Hit {
                        rule: "floor:inline-code".to_string(),
                        reason: format!(
                            "runs {base} code from redirected input, which the policy cannot check"
                        ),
                        suggestion: Some(
                            "write the code to a file and ask the user to approve running it"
                                .to_string(),
                        ),
                    });
                } else {
                    best.offer(Decision::Prompt, || Hit {
                        rule: "floor:inline-code".to_string(),
                        reason: format!("starts an interactive `{name}` interpreter"),
                        suggestion: None,
                    });
                }
            }
        }
        None
    }

    pub(super) fn eval_find_exec(&self, cx: &mut Cx, args: &[Word], idx: usize, depth: usize) {
        let mut i = 0;
        while i < args.len() {
            if matches!(
                args[i].text.as_str(),
                "-exec" | "-execdir" | "-ok" | "-okdir"
            ) {
                let start = i + 1;
                let mut end = start;
                while end < args.len() && !matches!(args[end].text.as_str(), ";" | "+") {
                    end += 1;
                }
                let inner = &args[start..end];
                if !inner.is_empty() {
                    let text = inner
                        .iter()
                        .map(|w| w.text.as_str())
                        .collect::<Vec<_>>()
                        .join(" ");
                    let view = View {
                        words: inner,
                        assignments: &[],
                        redirects: &[],
                        substitutions: &[],
                        piped_input: false,
                        kind: CommandKind::Simple,
                        upstream: None,
                    };
                    let ctx = format!("find {} command of segment {idx}", args[i].text);
                    if depth < MAX_EVAL_DEPTH {
                        self.eval_command(cx, &view, &text, depth + 1, Some(idx), Some(&ctx), None);
                    }
                }
                i = end + 1;
            } else {
                i += 1;
            }
        }
    }
}
