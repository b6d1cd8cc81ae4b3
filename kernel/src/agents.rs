//! Child agents (subagents), as the kernel holds them.
//!
//! A plugin with the `agent` capability that is serving a tool call may open one child agent
//! for that call (`keel.agents` `open`). From then on its `agent.complete` and
//! `agent.dispatch` act as the child: the model sees only the child's tools, the turn ledger
//! keeps the child's calls apart from everyone else's, the dispatcher refuses any other tool,
//! and approvals name the child. The child's tool set is decided here, never by the plugin:
//! at most its parent's, read-only unless the person's `[subagents] allow` names a tool, and
//! no deeper than `[subagents] max-depth`.

use std::collections::BTreeSet;

use crate::types::ToolSpec;

/// The person's settings for child agents (`[subagents]`), part of the sealed gate config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentPolicy {
    /// How deep children may nest: 1 lets the main agent start children and no child start
    /// one; 0 allows none.
    pub max_depth: u32,
    /// Tools a child may be given although they write files, run code or reach the network
    /// (still never more than its parent has, and still through every gate).
    pub allow: BTreeSet<String>,
}

impl Default for SubagentPolicy {
    fn default() -> Self {
        SubagentPolicy {
            max_depth: 1,
            allow: BTreeSet::new(),
        }
    }
}

/// A child agent: which call it serves and what it may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentScope {
    /// The kernel's number for it, unique in the session; its calls are filed under it.
    pub(crate) id: u64,
    /// Its label, cleaned.
    pub(crate) label: String,
    /// 1 for a child of the main agent.
    pub(crate) depth: u32,
    /// The tool call it serves.
    pub(crate) parent_call: String,
    /// The plugin that opened it.
    pub(crate) opener: String,
    /// The tools it may call.
    pub(crate) tools: BTreeSet<String>,
}

impl AgentScope {
    /// How approvals and refusals name it.
    pub(crate) fn name(&self) -> String {
        format!("subagent `{}` #{}", self.label, self.id)
    }
}

/// The longest label kept.
const MAX_LABEL: usize = 40;

/// A label as the person will see it: letters, digits, spaces, `-`, `_` and `.`, at most 40
/// characters; `subagent` when nothing is left.
pub(crate) fn clean_label(label: &str) -> String {
    let kept: String = label
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_' | '.'))
        .take(MAX_LABEL)
        .collect();
    let kept = kept.trim();
    if kept.is_empty() {
        "subagent".to_owned()
    } else {
        kept.to_owned()
    }
}

/// Whether a tool only reads: it neither writes files, runs code nor reaches the network.
fn read_only(spec: &ToolSpec) -> bool {
    let c = &spec.capabilities;
    !c.writes_files && !c.executes_code && !c.network
}

/// The tools a new child gets, and those asked for and withheld (each with why).
///
/// `registered` is every tool now (spec, owner); `parent` the parent's tools (`None`: the main
/// agent, which has them all); `asked` the tools the opener asked for (`None`: every read-only
/// tool). The opener's own tools (the `task` tool itself) are left out at the deepest level,
/// where a grandchild would be refused anyway.
pub(crate) fn narrow<'a>(
    registered: impl IntoIterator<Item = (&'a ToolSpec, &'a str)>,
    parent: Option<&BTreeSet<String>>,
    asked: Option<&[String]>,
    policy: &SubagentPolicy,
    opener: &str,
    depth: u32,
) -> (BTreeSet<String>, Vec<String>) {
    let mut given = BTreeSet::new();
    let mut withheld = Vec::new();
    let registered: Vec<(&ToolSpec, &str)> = registered.into_iter().collect();
    let judge = |spec: &ToolSpec, owner: &str| -> Result<(), String> {
        if parent.is_some_and(|p| !p.contains(&spec.name)) {
            return Err("its parent does not have it".into());
        }
        if owner == opener && depth >= policy.max_depth {
            return Err(format!(
                "children nest at most {} deep ([subagents] max-depth)",
                policy.max_depth
            ));
        }
        if !read_only(spec) && !policy.allow.contains(&spec.name) {
            return Err(
                "it writes files, runs code or reaches the network, and `[subagents] allow` \
                 in the person's config does not name it"
                    .into(),
            );
        }
        Ok(())
    };
    match asked {
        None => {
            for (spec, owner) in &registered {
                if read_only(spec) && judge(spec, owner).is_ok() {
                    given.insert(spec.name.clone());
                }
            }
        }
        Some(names) => {
            for name in names {
                match registered.iter().find(|(s, _)| &s.name == name) {
                    None => withheld.push(format!("`{name}`: no such tool is registered")),
                    Some((spec, owner)) => match judge(spec, owner) {
                        Ok(()) => {
                            given.insert(name.clone());
                        }
                        Err(why) => withheld.push(format!("`{name}`: {why}")),
                    },
                }
            }
        }
    }
    (given, withheld)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolCapabilities;

    fn tool(name: &str, caps: ToolCapabilities) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: "{}".into(),
            capabilities: caps,
            parallel_safe: true,
        }
    }

    fn tools() -> Vec<(ToolSpec, &'static str)> {
        let reads = ToolCapabilities {
            reads_files: true,
            ..ToolCapabilities::default()
        };
        vec![
            (tool("read_file", reads), "fs-tools"),
            (tool("grep", reads), "fs-tools"),
            (
                tool(
                    "write_file",
                    ToolCapabilities {
                        writes_files: true,
                        ..ToolCapabilities::default()
                    },
                ),
                "fs-tools",
            ),
            (
                tool(
                    "exec_shell",
                    ToolCapabilities {
                        executes_code: true,
                        ..ToolCapabilities::default()
                    },
                ),
                "shell",
            ),
            (
                tool(
                    "fetch",
                    ToolCapabilities {
                        network: true,
                        ..ToolCapabilities::default()
                    },
                ),
                "web",
            ),
            (tool("task", ToolCapabilities::default()), "subagents"),
        ]
    }

    fn names(set: &BTreeSet<String>) -> Vec<&str> {
        set.iter().map(String::as_str).collect()
    }

    #[test]
    fn a_child_gets_read_only_tools_unless_the_person_allows_more_and_never_its_parents_lack() {
        let all = tools();
        let reg = || all.iter().map(|(s, o)| (s, *o));
        let policy = SubagentPolicy::default();
        // By default: the read-only tools, without `task` at the deepest level.
        let (given, withheld) = narrow(reg(), None, None, &policy, "subagents", 1);
        assert_eq!(names(&given), ["grep", "read_file"]);
        assert!(withheld.is_empty());
        // Asking for a tool that writes or runs code is not enough…
        let asked = vec![
            "read_file".to_owned(),
            "exec_shell".to_owned(),
            "nope".to_owned(),
        ];
        let (given, withheld) = narrow(reg(), None, Some(&asked), &policy, "subagents", 1);
        assert_eq!(names(&given), ["read_file"]);
        assert_eq!(withheld.len(), 2, "{withheld:?}");
        assert!(withheld[0].contains("`exec_shell`") && withheld[0].contains("[subagents] allow"));
        assert!(withheld[1].contains("no such tool"));
        // …the person's `allow` is.
        let policy = SubagentPolicy {
            max_depth: 2,
            allow: BTreeSet::from(["exec_shell".to_owned()]),
        };
        let (given, _) = narrow(reg(), None, Some(&asked), &policy, "subagents", 1);
        assert_eq!(names(&given), ["exec_shell", "read_file"]);
        // Below max-depth the `task` tool is offered; a grandchild never gets more than its
        // parent, even what `allow` names.
        let parent = BTreeSet::from(["read_file".to_owned(), "task".to_owned()]);
        let (given, withheld) = narrow(reg(), Some(&parent), Some(&asked), &policy, "subagents", 2);
        assert_eq!(names(&given), ["read_file"]);
        assert!(
            withheld[0].contains("its parent does not have it"),
            "{withheld:?}"
        );
        let (given, _) = narrow(reg(), None, None, &policy, "subagents", 1);
        assert_eq!(names(&given), ["grep", "read_file", "task"]);
    }

    #[test]
    fn labels_are_short_and_plain() {
        assert_eq!(clean_label("explore auth"), "explore auth");
        assert_eq!(clean_label("\u{1b}[31mred`\n"), "31mred");
        assert_eq!(clean_label("  "), "subagent");
        assert_eq!(clean_label(&"x".repeat(100)).len(), 40);
    }
}
