//! How a failed turn is told to the person: what happened and what to do next, in keel's
//! words. The kernel's errors say what happened to which plugin; the door a call was routed
//! through goes to the log only.

use keel_kernel::KernelError;

/// The sentence after "the turn failed: " for `error`, a failure of the `turn` call of the
/// agent plugin `agent` in session `session`.
pub(crate) fn turn_failure(error: &KernelError, agent: &str, session: &str) -> String {
    let text = match error {
        KernelError::Invalid(t)
        | KernelError::Conflict(t)
        | KernelError::Denied(t)
        | KernelError::Unavailable(t)
        | KernelError::Failed(t)
        | KernelError::TimedOut(t) => t.as_str(),
    };
    let resume = format!("the conversation so far is kept: `keel resume {session}` continues it");
    if text.contains("cancelled the turn (Ctrl-C)") {
        return "it was cancelled (Ctrl-C)".into();
    }
    if text.contains("the turn deadline") {
        return format!(
            "it ran past the turn deadline you set ([timeouts] turn-secs in keel's config) and \
             was stopped; {resume}, or raise the deadline"
        );
    }
    if text.contains("exceeded its cpu limit") || text.contains("of guest CPU, over its limit") {
        return format!(
            "the agent plugin `{agent}` kept the CPU busy past its limit for one step{} without \
             asking the model or a tool anything, and was stopped (a runaway loop in the \
             plugin, not something your task did); {resume}. If `{agent}` is a plugin you are \
             developing and the work is expected, raise [limits.{agent}] cpu-ms in keel's \
             config",
            limit_of(text)
                .map(|l| format!(" ({l})"))
                .unwrap_or_default()
        );
    }
    if text.contains("exceeded its memory limit") {
        return format!(
            "the agent plugin `{agent}` needed more memory than it is allowed{} and was \
             stopped; {resume}, or raise [limits.{agent}] memory-mib in keel's config",
            limit_of(text)
                .map(|l| format!(" ({l})"))
                .unwrap_or_default()
        );
    }
    match error {
        KernelError::Unavailable(_) => {
            format!("no agent is running: {text}; `keel doctor` shows the plugins a session loads")
        }
        KernelError::TimedOut(_) => format!("it took too long: {text}; {resume}"),
        _ => format!("the agent plugin `{agent}` stopped with an error: {text}; {resume}"),
    }
}

/// "2 s" out of "… (limit 2 s, …", "… (limit 2 s)" or "… over its limit of 2 s".
fn limit_of(text: &str) -> Option<String> {
    let rest = match text.find("(limit ") {
        Some(at) => &text[at + "(limit ".len()..],
        None => &text[text.find("over its limit of ")? + "over its limit of ".len()..],
    };
    let end = rest.find([',', ')', ';']).unwrap_or(rest.len());
    Some(format!("limit {}", rest[..end].trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No routing in anything the person reads.
    fn plain(s: &str) -> bool {
        !s.contains("(service `") && !s.contains("method `") && !s.contains(" → ")
    }

    #[test]
    fn a_turn_stopped_by_the_cpu_bound_says_what_happened_and_what_to_do() {
        for e in [
            KernelError::Failed(
                "plugin `agent-loop` exceeded its cpu limit: it ran 2.01 s of guest CPU in one \
                 call (limit 2 s); the person running keel can raise [limits.agent-loop] cpu-ms"
                    .into(),
            ),
            KernelError::Failed(
                "plugin `agent-loop` was not called for the turn: the work it is part of \
                 already used 2.10 s of guest CPU, over its limit of 2 s"
                    .into(),
            ),
        ] {
            let m = turn_failure(&e, "agent-loop", "s-1");
            assert!(plain(&m), "{m}");
            assert!(m.contains("`agent-loop`") && m.contains("limit 2 s"), "{m}");
            assert!(m.contains("keel resume s-1"), "{m}");
            assert!(m.contains("[limits.agent-loop] cpu-ms"), "{m}");
        }
    }

    #[test]
    fn every_kind_of_failure_says_what_happened_and_names_the_agent() {
        let cases = [
            (
                KernelError::Denied(
                    "plugin `agent-loop` was stopped in the turn: the person cancelled the turn \
                     (Ctrl-C)"
                        .into(),
                ),
                "cancelled (Ctrl-C)",
            ),
            (
                KernelError::TimedOut(
                    "plugin `agent-loop` did not finish the turn within 60 s, the turn deadline; \
                     it was stopped and starts afresh for its next call (the person running keel \
                     can raise [timeouts] turn-secs in keel's config)"
                        .into(),
                ),
                "turn-secs",
            ),
            (
                KernelError::Failed(
                    "plugin `agent-loop` exceeded its memory limit: it tried to grow its memory \
                     to 130 MiB (limit 128 MiB)"
                        .into(),
                ),
                "[limits.agent-loop] memory-mib",
            ),
            (
                KernelError::Unavailable("no plugin provides service `agent`".into()),
                "keel doctor",
            ),
        ];
        for (e, says) in cases {
            let m = turn_failure(&e, "agent-loop", "s-2");
            assert!(plain(&m) && m.contains(says), "{e}\n→ {m}");
        }
        // A plugin's own failure is said in its words, under its name.
        let m = turn_failure(
            &KernelError::Failed("the model said no".into()),
            "my-agent",
            "s",
        );
        assert!(
            m.contains("`my-agent`") && m.contains("the model said no"),
            "{m}"
        );
    }
}
