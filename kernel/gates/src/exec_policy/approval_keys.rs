//! Approval keys: the arity-aware key an approval "for this session" covers, so approving
//! `git status` never approves `git push`.

use super::*;

impl ExecPolicy {
    /// The arity-aware approval key of a command line, for remembering approvals: each
    /// segment's command key (`cargo build --release` → `cargo build`), joined by its
    /// operators (`cd && cargo test`), with file-writing redirections kept literally.
    /// `None` when the command must never be remembered: anything Forbidden, anything with
    /// command substitution, code execution (`sh -c`, `eval`, interpreters), privilege
    /// escalation, suspicious assignments, computed program names, or syntax issues.
    pub fn approval_key(&self, command: &str) -> Option<String> {
        let parsed = shell_split::split(command);
        if !parsed.issues.is_empty()
            || parsed.commands.is_empty()
            || exec_danger::scan_raw(command).is_some()
        {
            return None;
        }
        if self.check(command).decision == Decision::Forbid {
            return None;
        }
        let mut out = String::new();
        for (n, cmd) in parsed.commands.iter().enumerate() {
            if !cmd.substitutions.is_empty()
                || cmd
                    .assignments
                    .iter()
                    .any(|a| assignment_is_suspicious(&a.text))
            {
                return None;
            }
            let piece = match cmd.kind {
                CommandKind::Simple if !cmd.words.is_empty() => self.key_piece(&cmd.words)?,
                CommandKind::GroupEnd | CommandKind::Simple => String::new(),
                _ => return None,
            };
            let mut piece = piece;
            for r in &cmd.redirects {
                if r.writes_file() {
                    if !r.target.is_literal() {
                        return None;
                    }
                    piece.push_str(&format!(" > {}", r.target.text));
                }
                if r.is_inline_input() {
                    return None;
                }
            }
            if piece.is_empty() {
                continue;
            }
            if !out.is_empty() {
                let prev = parsed
                    .commands
                    .get(n.wrapping_sub(1))
                    .map_or(";", |c| c.connector.as_str());
                out.push(' ');
                out.push_str(if prev.is_empty() { ";" } else { prev });
                out.push(' ');
            }
            out.push_str(piece.trim_start());
        }
        (!out.is_empty()).then_some(out)
    }

    pub(super) fn key_piece(&self, words: &[Word]) -> Option<String> {
        let mut i = 0;
        let mut prefix = String::new();
        while let Some(w) = words.get(i) {
            if !w.is_literal() {
                return None;
            }
            match program_name(&w.text).0 {
                "sudo" | "doas" | "su" | "pkexec" | "run0" | "runuser" | "eval" | "source"
                | "." | "exec" | "watch" | "flock" | "busybox" => return None,
                "env" => {
                    i += 1;
                    while words
                        .get(i)
                        .is_some_and(|w| w.text.starts_with('-') || w.text.contains('='))
                    {
                        if words[i].text.contains('=') && assignment_is_suspicious(&words[i].text) {
                            return None;
                        }
                        if words[i].text.starts_with("-S")
                            || words[i].text.starts_with("--split-string")
                        {
                            return None;
                        }
                        i += 1;
                    }
                }
                "nohup" | "nice" | "time" | "timeout" | "stdbuf" | "setsid" | "ionice" => {
                    i += 1;
                    while words.get(i).is_some_and(|w| w.text.starts_with('-')) {
                        i += 1;
                    }
                    if program_name(&w.text).0 == "timeout" {
                        i += 1;
                    }
                }
                "xargs" => {
                    prefix.push_str("xargs ");
                    i += 1;
                    while let Some(w) = words.get(i) {
                        if matches!(
                            w.text.as_str(),
                            "-I" | "-n" | "-L" | "-P" | "-d" | "-E" | "-a" | "-s"
                        ) {
                            i += 2;
                        } else if w.text.starts_with('-') {
                            i += 1;
                        } else {
                            break;
                        }
                    }
                }
                _ => break,
            }
        }
        let prog = words.get(i)?;
        let (name, trusted) = program_name(&prog.text);
        if !trusted
            || exec_rules::SHELLS.contains(&name)
            || exec_rules::interpreter(name).is_some()
            || matches!(name, "eval" | "source" | "." | "trap" | "alias")
        {
            return None;
        }
        let key = self.command_key(name, &words[i + 1..]);
        if key.dynamic.is_some() || key.risky.is_some() {
            return None;
        }
        Some(format!("{prefix}{}", key.joined))
    }
}
