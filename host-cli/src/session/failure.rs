//! How a failed turn is told to the person: what happened and what to do next, in keel's
//! words. The kernel's errors name its routing (``plugin `agent-loop` (service `agent`, method
//! `turn`)``, `chain keel → agent-loop`), which is for the log, not for the person.

use keel_kernel::KernelError;
use keel_protocol::call_failure;

/// The sentence after "the turn failed: " for `error`, a failure of the agent's `turn` call in
/// session `session`.
pub(crate) fn turn_failure(error: &KernelError, session: &str) -> String {
    let text = match error {
        KernelError::Invalid(t)
        | KernelError::Conflict(t)
        | KernelError::Denied(t)
        | KernelError::Unavailable(t)
        | KernelError::Failed(t)
        | KernelError::TimedOut(t) => t.as_str(),
    };
    let agent = plugin_named(text).unwrap_or("agent-loop");
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
    if text.contains("exceeded its cpu limit") {
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
    let own = without_routing(call_failure::failure_message(text));
    match error {
        KernelError::Unavailable(_) => {
            format!("no agent is running: {own}; `keel doctor` shows the plugins a session loads")
        }
        KernelError::TimedOut(_) => format!("it took too long: {own}; {resume}"),
        _ => format!("the agent plugin `{agent}` stopped with an error: {own}; {resume}"),
    }
}

/// The plugin a kernel error names first (``plugin `NAME` …``).
fn plugin_named(text: &str) -> Option<&str> {
    let rest = &text[text.find("plugin `")? + "plugin `".len()..];
    rest.split_once('`').map(|(name, _)| name)
}

/// "2 s" out of "… (limit 2 s, …" or "… (limit 2 s)".
fn limit_of(text: &str) -> Option<String> {
    let rest = &text[text.find("(limit ")? + "(limit ".len()..];
    let end = rest.find([',', ')', ';']).unwrap_or(rest.len());
    Some(format!("limit {}", rest[..end].trim()))
}

/// `text` with the kernel's routing left out: a leading ``plugin `NAME` (…) `` and any
/// ``chain A → B`` it names.
fn without_routing(text: &str) -> String {
    let mut out = text.to_owned();
    if let Some(rest) = out.strip_prefix("plugin `")
        && let Some((_, after)) = rest.split_once(") ")
    {
        out = after.to_owned();
    }
    while let Some(at) = out.find("on chain ") {
        let tail = &out[at + "on chain ".len()..];
        let end = tail
            .find([' ', ','])
            .map(|i| {
                // The chain's names are joined by " → ": skip across them.
                let mut end = i;
                let mut rest = &tail[i..];
                while let Some(more) = rest.strip_prefix(" → ") {
                    let next = more.find([' ', ',']).unwrap_or(more.len());
                    end += " → ".len() + next;
                    rest = &more[next..];
                }
                end
            })
            .unwrap_or(tail.len());
        out = format!("{}together{}", &out[..at], &tail[end..]);
    }
    out
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
        let e = KernelError::Failed(
            "plugin `agent-loop` (service `agent`, method `turn`): exceeded its cpu limit: the \
             calls on chain keel → agent-loop used 2.01 s of guest CPU together (limit 2 s, set \
             by the first plugin on it); `agent-loop` was running when the limit was reached"
                .into(),
        );
        let m = turn_failure(&e, "s-1");
        assert!(plain(&m), "{m}");
        assert!(m.contains("`agent-loop`") && m.contains("limit 2 s"), "{m}");
        assert!(m.contains("keel resume s-1"), "{m}");
        assert!(m.contains("[limits.agent-loop] cpu-ms"), "{m}");
    }

    #[test]
    fn every_kind_of_failure_reads_without_the_kernels_routing() {
        let cases = [
            KernelError::Denied(
                "plugin `agent-loop` (service `agent`, method `turn`) was stopped: the person \
                 cancelled the turn (Ctrl-C)"
                    .into(),
            ),
            KernelError::TimedOut(
                "plugin `agent-loop` (service `agent`, method `turn`) did not finish within 60 \
                 s, the turn deadline; it was stopped and starts afresh for its next call (the \
                 person running keel can raise [timeouts] turn-secs in keel's config)"
                    .into(),
            ),
            KernelError::Failed(
                "plugin `agent-loop` (service `agent`, method `turn`): exceeded its memory \
                 limit: plugin `agent-loop` tried to grow its memory to 130 MiB (limit 128 MiB)"
                    .into(),
            ),
            KernelError::Failed(
                "plugin `agent-loop` (service `agent`, method `turn`) was not called: the calls \
                 on chain keel → agent-loop already used 2.10 s of guest CPU, over their limit \
                 of 2 s"
                    .into(),
            ),
            KernelError::Failed(
                "plugin `my-agent` (service `agent`, method `turn`): the model said no".into(),
            ),
            KernelError::Unavailable("no plugin provides service `agent`".into()),
        ];
        for e in cases {
            let m = turn_failure(&e, "s-2");
            assert!(plain(&m), "{e}\n→ {m}");
        }
        let m = turn_failure(
            &KernelError::Failed(
                "plugin `my-agent` (service `agent`, method `turn`): the model said no".into(),
            ),
            "s",
        );
        assert!(
            m.contains("`my-agent`") && m.contains("the model said no"),
            "{m}"
        );
    }
}
