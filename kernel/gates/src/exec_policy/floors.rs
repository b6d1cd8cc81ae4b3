//! Floors and rules: the decisions that apply whatever the rules say (catastrophic commands,
//! sensitive writes, credentials, privilege, network), then the built-in, user and project rules.

use super::*;

impl ExecPolicy {
    /// Checks no rule can lower: network use, writes to sensitive places, recursive operations
    /// reaching `/` or a home directory, credential reads, remote shells, `find -exec`
    /// commands, and arguments `xargs` appends unseen.
    pub(super) fn offer_floors(
        &self,
        cx: &mut Cx,
        call: &Call<'_>,
        idx: usize,
        depth: usize,
        best: &mut Best,
    ) {
        let (name, args) = (call.name, call.args);
        // Changes to a repository's control files (git config, remotes, hooks): asked about,
        // and never approved by `auto` (`Verdict::under`), offered first so an equal floor
        // (network) does not hide it.
        if let Some(why) = repository_control_change(call) {
            best.offer(Decision::Prompt, || Hit {
                rule: REPOSITORY_CONTROL_RULE.to_string(),
                reason: format!("`{}` {why}", call.key.joined),
                suggestion: Some(REPOSITORY_CONTROL_SUGGESTION.to_string()),
            });
        }
        // Network.
        if !call.version_only && is_network_key(&call.key.words) {
            best.offer(Decision::Prompt, || Hit {
                rule: NETWORK_RULE.to_string(),
                reason: if exec_rules::NETWORK_PROGRAMS.contains(&name) {
                    format!("`{name}` makes network connections")
                } else {
                    format!("`{}` talks to the network", call.key.joined)
                },
                suggestion: Some(NETWORK_SUGGESTION.to_string()),
            });
        }
        // Writes to sensitive places, credential reads, reverse shells.
        for target in write_targets(name, args) {
            let path = resolve(cx.cwd.as_deref(), target);
            if let Some(why) =
                exec_danger::sensitive_write(&path).or_else(|| exec_danger::sensitive_write(target))
            {
                best.offer(Decision::Forbid, || Hit {
                    rule: "floor:sensitive-write".to_string(),
                    reason: format!("`{name}` would write to `{target}`: {why}"),
                    suggestion: Some(SENSITIVE_SUGGESTION.to_string()),
                });
            }
        }
        if matches!(name, "rm" | "chmod" | "chown" | "chgrp")
            && (exec_rules::short_has(args, if name == "rm" { "rR" } else { "R" })
                || exec_rules::has_opt(args, &["--recursive"]))
        {
            let skip = usize::from(name != "rm");
            if let Some(t) = exec_rules::positionals(args)
                .into_iter()
                .skip(skip)
                .find(|t| exec_danger::is_catastrophic_target(&resolve(cx.cwd.as_deref(), t)))
            {
                let c = exec_danger::Catastrophe {
                    offset: 0,
                    id: if name == "rm" {
                        "rm-recursive-root"
                    } else {
                        "recursive-permissions-root"
                    },
                    description: format!(
                        "recursive `{name}` on `{t}` (from `{}`) reaches the whole filesystem or a home directory",
                        cx.cwd.as_deref().unwrap_or(".")
                    ),
                };
                best.offer_catastrophic(|| catastrophic_hit(c));
            }
        }
        offer_credentials(args, best);
        if matches!(name, "nc" | "ncat" | "netcat")
            && (exec_rules::short_has(args, "ec")
                || exec_rules::has_opt(args, &["--exec", "--sh-exec", "--lua-exec"]))
        {
            best.offer(Decision::Forbid, || Hit {
                rule: "floor:reverse-shell".to_string(),
                reason: format!(
                    "`{name} -e` binds a program to a network connection (a remote shell)"
                ),
                suggestion: Some(
                    "do not expose programs over the network from the agent".to_string(),
                ),
            });
        }
        if name == "socat"
            && args.iter().any(|a| {
                let l = a.text.to_ascii_lowercase();
                l.contains("exec:") || l.contains("system:")
            })
        {
            best.offer(Decision::Forbid, || Hit {
                rule: "floor:reverse-shell".to_string(),
                reason: "`socat ... EXEC:`/`SYSTEM:` binds a program to a network connection"
                    .to_string(),
                suggestion: Some(
                    "do not expose programs over the network from the agent".to_string(),
                ),
            });
        }
        if name == "find" {
            self.eval_find_exec(cx, args, idx, depth);
        }
        if name == "cargo" && exec_rules::has_opt(args, &["--config"]) {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:risky-flag".to_string(),
                reason:
                    "`cargo --config` can name programs cargo runs (rustc-wrapper, linker, runner)"
                        .to_string(),
                suggestion: Some("run cargo without `--config`".to_string()),
            });
        }
        if call.xargs && !call.sink && !exec_rules::XARGS_SAFE.contains(&name) {
            best.offer(Decision::Prompt, || Hit {
                rule: "floor:xargs".to_string(),
                reason: format!("`xargs` appends arguments read from its input to `{name}`; they were not checked"),
                suggestion: Some("run the command on explicit arguments".to_string()),
            });
        }
    }

    /// The rule for the command key: the user's rule if any, else the built-in rule (with its
    /// argument refinement), else the default for unknown commands; then any project rule,
    /// which can only raise the decision.
    pub(super) fn offer_rules(&self, call: &Call<'_>, best: &mut Best) {
        let name = call.name;
        let user = self.user.best(&call.key.words);
        match user {
            Some(r) => {
                best.offer(r.decision, || Hit {
                    rule: format!("user:{}", r.prefix),
                    reason: r
                        .reason
                        .clone()
                        .unwrap_or_else(|| format!("user rule `{}` says {}", r.prefix, r.decision)),
                    suggestion: (r.decision != Decision::Allow).then(|| {
                        format!("the user's config sets `{}` to {}", r.prefix, r.decision)
                    }),
                });
            }
            None if call.sink => {}
            None => {
                let builtin = if self.use_builtin {
                    self.builtin_best(&call.key.words)
                } else {
                    None
                };
                match builtin {
                    Some(_) if call.version_only => {
                        best.offer(Decision::Allow, || Hit {
                            rule: format!("builtin:{name} --version"),
                            reason: "prints version or help".to_string(),
                            suggestion: None,
                        });
                    }
                    Some(b) => {
                        let refined = b.refine.and_then(|f| {
                            f(&Inv {
                                rest: call.args.get(call.key.rest..).unwrap_or(&[]),
                            })
                        });
                        match refined {
                            Some((d, why)) if d > b.decision => best.offer(d, || Hit {
                                rule: format!("builtin:{}", b.prefix),
                                reason: format!("{why} (command key `{}`)", call.key.joined),
                                suggestion: Some(rule_suggestion(&call.key.words)),
                            }),
                            _ => best.offer(b.decision, || Hit {
                                rule: ["builtin:", b.prefix].concat(),
                                reason: [b.reason, " (command key `", &call.key.joined, "`)"]
                                    .concat(),
                                suggestion: (b.decision != Decision::Allow)
                                    .then(|| rule_suggestion(&call.key.words)),
                            }),
                        }
                    }
                    None => best.offer(self.default, || Hit {
                        rule: "default:unknown".to_string(),
                        reason: format!("`{}` is not covered by any rule", call.key.joined),
                        suggestion: Some(rule_suggestion(&call.key.words)),
                    }),
                }
            }
        }
        if let Some(r) = self.project.best(&call.key.words) {
            best.offer(r.decision, || Hit {
                rule: format!("project:{}", r.prefix),
                reason: r.reason.clone().unwrap_or_else(|| {
                    format!(
                        "the project config tightens `{}` to {}",
                        r.prefix, r.decision
                    )
                }),
                suggestion: Some(format!(
                    "the project's config sets `{}` to {}",
                    r.prefix, r.decision
                )),
            });
        }
    }
}

/// The rule name of [`repository_control_change`]'s floor, which `auto` never approves.
pub(super) const REPOSITORY_CONTROL_RULE: &str = "floor:repository-control";
pub(super) const REPOSITORY_CONTROL_SUGGESTION: &str = "a repository's config and hooks name programs git \
    runs later with the person's rights, outside keel's sandbox (where .git is read-only): ask \
    the person to run this themselves";

/// Why `call` changes what a repository's tools run later (git config, remotes, submodules,
/// worktrees, hook installers), if it does. These are the writes to `.git` that matter: the
/// sandbox keeps `.git` read-only, and where there is no sandbox this keeps `auto` from
/// approving them.
fn repository_control_change(call: &Call<'_>) -> Option<&'static str> {
    let words = call.key.words.as_slice();
    let rest = call.args.get(call.key.rest..).unwrap_or(&[]);
    let first = || exec_rules::positionals(rest).first().copied();
    match words {
        ["git", "config", ..] => exec_rules::refine_git_config(&Inv { rest })
            .is_some()
            .then_some("changes git config, which can name programs git runs (core.fsmonitor, core.hooksPath, core.pager)"),
        ["git", "remote", sub] if matches!(
            *sub,
            "add" | "set-url" | "rename" | "remove" | "rm" | "set-head" | "set-branches"
        ) => Some("changes the remotes in the repository's config"),
        ["git", "submodule", sub] if matches!(
            *sub,
            "add" | "init" | "sync" | "set-url" | "set-branch" | "deinit" | "absorbgitdirs"
        ) => Some("changes the submodules in the repository's config"),
        ["git", "worktree", sub] if matches!(*sub, "add" | "move" | "remove" | "repair") => {
            Some("changes the repository's worktrees")
        }
        ["git", "init", ..] => Some("creates a repository, whose config and hooks git runs later"),
        ["git", "maintenance", ..] => {
            Some("registers scheduled git maintenance in the person's config")
        }
        ["git", "lfs", sub] if matches!(*sub, "install" | "update" | "uninstall") => {
            Some("installs or removes git hooks")
        }
        ["pre-commit", ..] if matches!(first(), Some("install" | "install-hooks" | "uninstall")) => {
            Some("installs or removes git hooks")
        }
        ["husky", ..] if matches!(first(), Some("install" | "init")) || first().is_none() => {
            Some("installs git hooks")
        }
        _ => None,
    }
}
