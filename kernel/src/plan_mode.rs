//! Plan mode: a session the person has made read-only until they accept a plan.
//!
//! The switch is part of the sealed gate state ([`crate::session_gates::SessionGates`]); only
//! the host flips it (`Kernel::set_plan_mode`), between turns. No import a plugin can call
//! reads or changes it, and it only ever narrows what the session already allows: while it is
//! on,
//!
//! - the model is offered only the tools judged here ([`judge_tool`]): those that neither
//!   write files nor reach the network, served by plugins that cannot act outside their
//!   sandbox, plus command tools, whose every command is judged on its own;
//! - the dispatcher refuses any other call before guards and approval, with a reason the
//!   model reads ("plan mode: …"), in the main agent and in every child agent alike;
//! - a command runs only when the built-in exec policy knows it to only read
//!   ([`judge_command`]) — the person's own rules can raise it to "ask first" but never make a
//!   writing command pass — and then inside the read-only sandbox with no network, never
//!   offered a run outside it;
//! - the model is told, as a prompt fragment of the kernel's, to investigate and end with a
//!   plan in Markdown.

use std::sync::OnceLock;

use crate::gates::exec_policy::{Decision, ExecPolicy};
use crate::types::ToolSpec;

/// The kernel's prompt fragment while plan mode is on, after every plugin's.
pub(crate) const PROMPT: &str = "# Plan mode\n\
The person switched this session to plan mode: it is read-only until they accept a plan. \
Investigate with the tools you are offered (reading files, searching, listing, and commands \
that only read, which run in a read-only sandbox without network). Do not try to change \
anything: writes and commands that change files are refused. When you know enough, end your \
turn with the plan as your final message, in Markdown: the goal, the steps in order (the \
files and commands each touches), and how to check the result. The person then accepts it \
(the session leaves plan mode and you carry it out) or asks for changes.";

/// Where a tool stands in plan mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlanTool {
    /// It only reads: offered and run as usual.
    Reads,
    /// It runs commands: offered, each command judged by [`judge_command`] and run in the
    /// read-only sandbox.
    Commands,
    /// Not in plan mode, and why.
    Refused(&'static str),
}

/// How plan mode treats `spec`, served by a plugin that `reaches_out` (may reach the network
/// or start programs of its own, beyond the exec gate) or not, and that `writes_own_dirs`
/// (holds a directory it may write, which no gate sees it write) or not.
///
/// A tool that declares no effect at all, served by a plugin holding a writable directory,
/// is refused: declaring nothing is not declaring that it only reads (`remember` declares
/// nothing and appends to the memory folders, which the next session recalls). A tool of such
/// a plugin that declares it reads (`read_file` of the file tools, granted the workspace
/// read-write for its writing tools) stays.
pub(crate) fn judge_tool(spec: &ToolSpec, reaches_out: bool, writes_own_dirs: bool) -> PlanTool {
    let c = &spec.capabilities;
    if c.writes_files {
        PlanTool::Refused("it writes files")
    } else if c.network {
        PlanTool::Refused("it reaches the network")
    } else if reaches_out {
        PlanTool::Refused("its plugin reaches the network or starts programs of its own")
    } else if writes_own_dirs && !c.reads_files && !c.executes_code {
        PlanTool::Refused(
            "its plugin writes folders of its own (memory, say) and the tool does not declare \
             that it only reads",
        )
    } else if c.executes_code {
        PlanTool::Commands
    } else {
        PlanTool::Reads
    }
}

/// Whether `line` may run in plan mode: only when the built-in exec policy allows it as a
/// command that only reads (the person's or a project's rules are not consulted here, so no
/// rule can let a writing command through; the session's own policy still judges it after).
pub(crate) fn judge_command(line: &str) -> Result<(), String> {
    static BUILTIN: OnceLock<ExecPolicy> = OnceLock::new();
    let verdict = BUILTIN.get_or_init(ExecPolicy::builtin).check(line);
    if verdict.decision == Decision::Allow {
        return Ok(());
    }
    Err(format!(
        "`{line}` is not a command keel knows to only read ({}); only commands such as `ls`, \
         `cat`, `grep`, `git status` or `git diff` run in plan mode. Read with those, or put \
         the step in your plan",
        verdict.reason
    ))
}

/// The words every refusal in plan mode starts with, so the model and the person see why.
pub(crate) fn refusal(tool: &str, why: &str) -> String {
    format!(
        "[keel] plan mode: `{tool}` did not run: {why}. The session is read-only until the \
         person accepts a plan; investigate with the read-only tools and end your turn with \
         the plan in Markdown"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolCapabilities;

    fn spec(caps: ToolCapabilities) -> ToolSpec {
        ToolSpec {
            name: "t".into(),
            description: String::new(),
            input_schema: "{}".into(),
            capabilities: caps,
            parallel_safe: true,
        }
    }

    #[test]
    fn only_reading_tools_and_command_tools_stay() {
        assert_eq!(
            judge_tool(&spec(ToolCapabilities::READS_FILES), false, false),
            PlanTool::Reads
        );
        assert_eq!(
            judge_tool(&spec(ToolCapabilities::EXECUTES_CODE), false, false),
            PlanTool::Commands
        );
        for caps in [
            ToolCapabilities::WRITES_FILES,
            ToolCapabilities::NETWORK,
            ToolCapabilities::NETWORK | ToolCapabilities::EXECUTES_CODE,
            ToolCapabilities::WRITES_FILES | ToolCapabilities::READS_FILES,
        ] {
            assert!(
                matches!(judge_tool(&spec(caps), false, false), PlanTool::Refused(_)),
                "{caps:?}"
            );
        }
        // A tool that says it only reads, from a plugin that can reach the network.
        assert!(matches!(
            judge_tool(&spec(ToolCapabilities::READS_FILES), true, false),
            PlanTool::Refused(_)
        ));
    }

    #[test]
    fn only_commands_that_read_pass() {
        for ok in [
            "ls -la",
            "cat src/lib.rs",
            "git status",
            "grep -rn foo .",
            "git diff HEAD",
        ] {
            assert!(judge_command(ok).is_ok(), "{ok}");
        }
        for refused in [
            "touch x",
            "rm -rf src",
            "echo hi > out.txt",
            "sed -i s/a/b/ f",
            "curl https://example.com",
            "git commit -m x",
            "cargo fmt",
            "python3 -c 'open(\"x\",\"w\")'",
            "ls && touch x",
        ] {
            let why = judge_command(refused).expect_err(refused);
            assert!(why.contains("only read"), "{why}");
        }
    }
}
