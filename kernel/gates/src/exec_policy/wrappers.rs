//! Wrappers: commands that run another command (`env`, `sudo`, `timeout`, `xargs`, `nice`, ...),
//! seen through so the wrapped command is what gets judged.

use super::*;

impl ExecPolicy {
    /// Steps over wrappers (`sudo`, `env`, `timeout`, `xargs`, ...) that run the rest of their
    /// arguments as a command, offering their own floors; judges wrappers that take a script
    /// (`watch`, `env -S`, `su -c`, `flock -c`) here.
    pub(super) fn skip_wrappers(
        &self,
        cx: &mut Cx,
        words: &[Word],
        idx: usize,
        depth: usize,
        best: &mut Best,
    ) -> Wrapped {
        let mut i = 0;
        let mut xargs = false;
        // Wrappers: commands that run the rest of their arguments as a command.
        while let Some(w) = words.get(i) {
            if !w.is_literal() {
                break;
            }
            let name = program_name(&w.text).0;
            match name {
                "sudo" | "doas" | "pkexec" | "run0" | "runuser" => {
                    offer_privilege(name, best);
                    i = skip_options(
                        words,
                        i + 1,
                        &[
                            "-u",
                            "-g",
                            "-h",
                            "-p",
                            "-r",
                            "-t",
                            "-U",
                            "-C",
                            "-D",
                            "-T",
                            "-R",
                            "--user",
                            "--group",
                            "--host",
                            "--prompt",
                            "--role",
                            "--type",
                            "--other-user",
                            "--close-from",
                            "--chdir",
                            "--chroot",
                            "--command-timeout",
                        ],
                    );
                }
                "su" => {
                    offer_privilege(name, best);
                    let rest = &words[i + 1..];
                    let scripts = exec_rules::opt_values(rest, "c", &["--command"], "");
                    if let Some(s) = scripts.first() {
                        best.offer(Decision::Prompt, || inline_shell_hit("su"));
                        self.eval_nested_text(
                            cx,
                            s,
                            depth,
                            idx,
                            format!("su -c script of segment {idx}"),
                        );
                    } else {
                        best.offer(Decision::Prompt, || Hit {
                            rule: "floor:privilege".to_string(),
                            reason: "`su` starts a shell as another user".to_string(),
                            suggestion: None,
                        });
                    }
                    return Wrapped::Handled(ProgramInfo { shell: true });
                }
                "env" => {
                    let env_at = i;
                    i += 1;
                    while let Some(a) = words.get(i) {
                        let t = a.text.as_str();
                        match t {
                            "-i" | "-0" | "--ignore-environment" | "--null" | "-v" | "--debug" => {
                                i += 1
                            }
                            "-u" | "--unset" | "-C" | "--chdir" => i += 2,
                            "-S" | "--split-string" => {
                                if let Some(s) = words.get(i + 1) {
                                    self.eval_nested_text(
                                        cx,
                                        &s.text,
                                        depth,
                                        idx,
                                        format!("env -S string of segment {idx}"),
                                    );
                                }
                                return Wrapped::Handled(ProgramInfo::default());
                            }
                            "--" => {
                                i += 1;
                                break;
                            }
                            _ if t.starts_with("--split-string=")
                                || (t.starts_with("-S") && t.len() > 2) =>
                            {
                                let s = t.split_once('=').map_or(&t[2..], |(_, v)| v);
                                self.eval_nested_text(
                                    cx,
                                    s,
                                    depth,
                                    idx,
                                    format!("env -S string of segment {idx}"),
                                );
                                return Wrapped::Handled(ProgramInfo::default());
                            }
                            _ if t.starts_with("--unset=") || t.starts_with("--chdir=") => i += 1,
                            _ if shell_split_is_assignment(t) => {
                                offer_assignment(t, best);
                                i += 1;
                            }
                            _ => break,
                        }
                    }
                    if i >= words.len() {
                        i = env_at;
                        break;
                    }
                }
                "nice" => {
                    i += 1;
                    while let Some(a) = words.get(i) {
                        match a.text.as_str() {
                            "-n" | "--adjustment" => i += 2,
                            t if t.starts_with('-') => i += 1,
                            _ => break,
                        }
                    }
                }
                "ionice" => {
                    i = skip_options(
                        words,
                        i + 1,
                        &["-c", "-n", "-p", "-P", "-u", "--class", "--classdata"],
                    )
                }
                "nohup" | "setsid" | "builtin" | "nocorrect" | "noglob" | "unbuffer" | "stdbuf" => {
                    i = skip_options(words, i + 1, &[])
                }
                "time" => i = skip_options(words, i + 1, &["-o", "-f", "--output", "--format"]),
                "timeout" => {
                    i = skip_options(words, i + 1, &["-s", "--signal", "-k", "--kill-after"]);
                    i += 1; // the duration
                }
                "chrt" | "taskset" => {
                    i = skip_options(words, i + 1, &[]);
                    i += 1; // priority or CPU mask
                }
                "command" => {
                    if words
                        .get(i + 1)
                        .is_some_and(|a| matches!(a.text.as_str(), "-v" | "-V"))
                    {
                        break;
                    }
                    i = skip_options(words, i + 1, &[]);
                }
                "exec" => i = skip_options(words, i + 1, &["-a"]),
                "xargs" => {
                    xargs = true;
                    i = skip_options(
                        words,
                        i + 1,
                        &[
                            "-I",
                            "-n",
                            "-L",
                            "-P",
                            "-d",
                            "-E",
                            "-a",
                            "-s",
                            "--max-args",
                            "--max-lines",
                            "--max-procs",
                            "--delimiter",
                            "--eof",
                            "--arg-file",
                            "--max-chars",
                            "--replace",
                        ],
                    );
                    if i >= words.len() {
                        best.offer(Decision::Allow, || Hit {
                            rule: "builtin:xargs".to_string(),
                            reason: "`xargs` without a command runs `echo`".to_string(),
                            suggestion: None,
                        });
                        return Wrapped::Handled(ProgramInfo::default());
                    }
                }
                "watch" => {
                    let start =
                        skip_options(words, i + 1, &["-n", "--interval", "-q", "--equexit"]);
                    let script = words
                        .get(start..)
                        .unwrap_or(&[])
                        .iter()
                        .map(|w| w.text.as_str())
                        .collect::<Vec<_>>()
                        .join(" ");
                    best.offer(Decision::Allow, || Hit {
                        rule: "builtin:watch".to_string(),
                        reason: "`watch` re-runs its command; the command is judged below"
                            .to_string(),
                        suggestion: None,
                    });
                    self.eval_nested_text(
                        cx,
                        &script,
                        depth,
                        idx,
                        format!("watch command of segment {idx}"),
                    );
                    return Wrapped::Handled(ProgramInfo::default());
                }
                "flock" => {
                    let start = skip_options(
                        words,
                        i + 1,
                        &["-w", "--timeout", "-E", "--conflict-exit-code"],
                    );
                    let after_lock = start + 1;
                    if words
                        .get(after_lock)
                        .is_some_and(|a| matches!(a.text.as_str(), "-c" | "--command"))
                    {
                        if let Some(s) = words.get(after_lock + 1) {
                            best.offer(Decision::Prompt, || inline_shell_hit("flock"));
                            self.eval_nested_text(
                                cx,
                                &s.text,
                                depth,
                                idx,
                                format!("flock -c script of segment {idx}"),
                            );
                        }
                        return Wrapped::Handled(ProgramInfo::default());
                    }
                    i = after_lock;
                }
                "busybox" => i += 1,
                _ => break,
            }
        }
        Wrapped::Run { at: i, xargs }
    }
}
