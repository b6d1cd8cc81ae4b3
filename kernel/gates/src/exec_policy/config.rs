//! The exec policy's configuration: the `[exec]` sections of the user's and the project's
//! config, their rule tables, and the checks that keep a project config from loosening anything.

use super::*;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ExecSection {
    pub(super) approval: Option<String>,
    pub(super) default: Option<String>,
    pub(super) builtin: Option<bool>,
    #[serde(default)]
    pub(super) rules: Vec<RuleConfig>,
    #[serde(default)]
    pub(super) arity: HashMap<String, usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleConfig {
    pub(super) prefix: String,
    pub(super) decision: String,
    pub(super) reason: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) struct ConfRule {
    pub(super) words: Vec<String>,
    pub(super) prefix: String,
    pub(super) decision: Decision,
    pub(super) reason: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct RuleTable {
    pub(super) by_program: FastMap<String, Vec<ConfRule>>,
}

impl RuleTable {
    pub(super) fn insert(&mut self, rule: ConfRule) {
        let program = rule.words.first().cloned().unwrap_or_default();
        self.by_program.entry(program).or_default().push(rule);
    }

    /// The longest rule whose words are a prefix of `key`.
    pub(super) fn best(&self, key: &[&str]) -> Option<&ConfRule> {
        if self.by_program.is_empty() {
            return None;
        }
        let first = key.first()?;
        self.by_program
            .get(*first)?
            .iter()
            .filter(|r| r.words.len() <= key.len() && r.words.iter().zip(key).all(|(a, b)| a == b))
            .max_by_key(|r| r.words.len())
    }

    pub(super) fn len(&self) -> usize {
        self.by_program.values().map(Vec::len).sum()
    }
}

/// The `[exec]` config shape, for documentation:
///
/// ```toml
/// [exec]
/// approval = "ask"        # "auto" | "ask" | "never"
/// default = "prompt"      # decision for commands no rule covers: "prompt" | "forbid"
/// builtin = true          # include the built-in rules (user config only)
/// rules = [
///   { prefix = "git status", decision = "allow" },
///   { prefix = "terraform", decision = "forbid", reason = "never from the agent" },
/// ]
/// [exec.arity]            # user config only: how many positional words form a key
/// mytool = 2
/// ```
pub const CONFIG_EXAMPLE: &str = r#"[exec]
approval = "ask"
default = "prompt"
rules = [
  { prefix = "git status", decision = "allow" },
  { prefix = "terraform", decision = "forbid", reason = "never from the agent" },
]
"#;

impl ExecPolicy {
    /// Builds the policy from the user's config file (the whole file; only `[exec]` is read).
    /// A file without `[exec]` gives the built-in policy. Unknown keys, decisions and approval
    /// policies are errors.
    pub fn from_toml(user: &str) -> Result<Self, PolicyError> {
        let origin = ConfigOrigin::User;
        let section = parse_section(user, origin)?;
        let mut policy = ExecPolicy::builtin();
        if let Some(a) = &section.approval {
            policy.approval =
                ApprovalMode::parse(a).ok_or_else(|| PolicyError::UnknownApproval {
                    origin,
                    value: a.clone(),
                })?;
        }
        if let Some(d) = &section.default {
            policy.default = parse_default(d, origin)?;
        }
        if let Some(b) = section.builtin {
            policy.use_builtin = b;
        }
        for (k, v) in &section.arity {
            let words: Vec<&str> = k.split_whitespace().collect();
            if words.is_empty()
                || words
                    .iter()
                    .any(|w| !is_plain_word(w) || w.starts_with('-'))
            {
                return Err(PolicyError::Invalid {
                    origin,
                    message: format!(
                        "arity key `{k}` must be a program name or a command key such as \"npm run\""
                    ),
                });
            }
            if !(1..=6).contains(v) {
                return Err(PolicyError::Invalid {
                    origin,
                    message: format!("arity for `{k}` is {v}; use a number from 1 to 6"),
                });
            }
            if *v < words.len() {
                return Err(PolicyError::Invalid {
                    origin,
                    message: format!("arity for `{k}` is {v}, shorter than the key itself"),
                });
            }
            policy.arity.insert(words.join(" "), *v);
        }
        let mut seen = HashMap::new();
        for rc in &section.rules {
            let rule = policy.validate_rule(rc, origin)?;
            if let Some(prev) = seen.insert(rule.prefix.clone(), rule.decision) {
                return Err(PolicyError::BadPrefix {
                    origin,
                    prefix: rule.prefix,
                    problem: format!(
                        "it appears twice (first as `{prev}`); keep one rule per prefix"
                    ),
                });
            }
            if rule.decision == Decision::Allow {
                let key: Vec<&str> = rule.words.iter().map(String::as_str).collect();
                if is_network_key(&key) {
                    policy.warnings.push(PolicyWarning {
                        origin,
                        message: format!(
                            "rule `{}` = allow: network commands stay at least `prompt` (approve them per session instead)",
                            rule.prefix
                        ),
                    });
                }
            }
            policy.user.insert(rule);
        }
        Ok(policy)
    }

    /// Adds a project-local config, which may only tighten: its rules can only raise
    /// decisions, its `approval`/`default` only move towards stricter values, and it cannot
    /// change `builtin` or the arity table. Whatever would loosen is ignored and reported in
    /// the returned warnings (also kept in [`ExecPolicy::warnings`]). Invalid input is an error
    /// and leaves the policy unchanged.
    pub fn tighten_with_project(
        &mut self,
        project_toml: &str,
    ) -> Result<Vec<PolicyWarning>, PolicyError> {
        let origin = ConfigOrigin::Project;
        let section = parse_section(project_toml, origin)?;
        let mut warnings = Vec::new();
        let warn = |warnings: &mut Vec<PolicyWarning>, message: String| {
            warnings.push(PolicyWarning { origin, message })
        };
        let mut approval = self.approval;
        if let Some(a) = &section.approval {
            let mode = ApprovalMode::parse(a).ok_or_else(|| PolicyError::UnknownApproval {
                origin,
                value: a.clone(),
            })?;
            if mode < self.approval {
                warn(
                    &mut warnings,
                    format!(
                        "ignored `approval = \"{mode}\"`: a project may only tighten the user's `{}`",
                        self.approval
                    ),
                );
            } else {
                approval = mode;
            }
        }
        let mut default = self.default;
        if let Some(d) = &section.default {
            let d = parse_default(d, origin)?;
            if d < self.default {
                warn(
                    &mut warnings,
                    format!(
                        "ignored `default = \"{d}\"`: a project may only tighten the user's `{}`",
                        self.default
                    ),
                );
            } else {
                default = d;
            }
        }
        if section.builtin.is_some() {
            warn(
                &mut warnings,
                "ignored `builtin`: only the user config chooses whether built-in rules apply"
                    .to_string(),
            );
        }
        if !section.arity.is_empty() {
            warn(&mut warnings, "ignored `[exec.arity]`: only the user config may change how command keys are formed".to_string());
        }
        let mut accepted = Vec::new();
        let mut seen = HashMap::new();
        for rc in &section.rules {
            let rule = self.validate_rule(rc, origin)?;
            if seen.insert(rule.prefix.clone(), rule.decision).is_some() {
                return Err(PolicyError::BadPrefix {
                    origin,
                    prefix: rule.prefix,
                    problem: "it appears twice; keep one rule per prefix".to_string(),
                });
            }
            let current = self.check(&rule.prefix).decision;
            if rule.decision < current {
                warn(
                    &mut warnings,
                    format!(
                        "ignored rule `{}` = {}: the user policy says `{current}` and a project may only tighten it",
                        rule.prefix, rule.decision
                    ),
                );
            } else {
                accepted.push(rule);
            }
        }
        self.approval = approval;
        self.default = default;
        for r in accepted {
            self.project.insert(r);
        }
        self.warnings.extend(warnings.iter().cloned());
        Ok(warnings)
    }

    pub(super) fn validate_rule(
        &self,
        rc: &RuleConfig,
        origin: ConfigOrigin,
    ) -> Result<ConfRule, PolicyError> {
        let prefix = rc.prefix.trim();
        let bad = |problem: String| PolicyError::BadPrefix {
            origin,
            prefix: rc.prefix.clone(),
            problem,
        };
        let decision =
            Decision::parse(rc.decision.trim()).ok_or_else(|| PolicyError::UnknownDecision {
                origin,
                prefix: rc.prefix.clone(),
                value: rc.decision.clone(),
            })?;
        let words: Vec<&str> = prefix.split_whitespace().collect();
        if words.is_empty() {
            return Err(bad(
                "it is empty; write a command key such as \"git status\"".to_string(),
            ));
        }
        if let Some(w) = words.iter().find(|w| !is_plain_word(w)) {
            return Err(bad(format!(
                "`{w}` contains shell syntax; a prefix is plain words such as \"git status\" (compound commands are split and each part is judged on its own)"
            )));
        }
        if let Some(w) = words.iter().find(|w| w.starts_with('-')) {
            let without: Vec<&str> = words
                .iter()
                .copied()
                .filter(|x| !x.starts_with('-'))
                .collect();
            return Err(bad(format!(
                "`{w}` is a flag; flags never form part of a command key, so this rule could never match — write \"{}\"",
                without.join(" ")
            )));
        }
        if words[0].contains('/') {
            return Err(bad(format!(
                "write the program name `{}` rather than a path",
                program_name(words[0]).0
            )));
        }
        // The prefix may not be longer than the key the arity table forms for it.
        let mut arity = self.arity_of(&words[..1]).unwrap_or(1);
        for k in 1..words.len() {
            if k >= arity {
                return Err(bad(format!(
                    "`{}` forms command keys of {arity} word(s), so `{}` is an argument that keys never include; set [exec.arity] \"{}\" = {} in the user config if it is a subcommand",
                    words[..k].join(" "),
                    words[k],
                    words[..k].join(" "),
                    k + 1
                )));
            }
            if let Some(a) = self.arity_of(&words[..=k]) {
                arity = a;
            }
        }
        Ok(ConfRule {
            words: words.iter().map(|w| (*w).to_string()).collect(),
            prefix: words.join(" "),
            decision,
            reason: rc.reason.clone().filter(|r| !r.trim().is_empty()),
        })
    }
}

pub(super) fn parse_section(text: &str, origin: ConfigOrigin) -> Result<ExecSection, PolicyError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| PolicyError::Toml {
        origin,
        message: e.to_string().trim().to_string(),
    })?;
    match table.get("exec") {
        None => Ok(ExecSection::default()),
        Some(v) => v
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| PolicyError::Invalid {
                origin,
                message: e.to_string().trim().to_string(),
            }),
    }
}

pub(super) fn parse_default(d: &str, origin: ConfigOrigin) -> Result<Decision, PolicyError> {
    match Decision::parse(d) {
        Some(Decision::Allow) => Err(PolicyError::Invalid {
            origin,
            message: "`default = \"allow\"` would let every unknown command run; use \"prompt\" or \"forbid\" (or `approval = \"auto\"` to approve prompts automatically)".to_string(),
        }),
        Some(d) => Ok(d),
        None => Err(PolicyError::Invalid { origin, message: format!("unknown `default = \"{d}\"`; expected \"prompt\" or \"forbid\"") }),
    }
}
