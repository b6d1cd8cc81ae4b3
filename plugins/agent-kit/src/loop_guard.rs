//! The agent loop's guard against repetition and failure spirals, per turn:
//! - the same tool with the same arguments (JSON canonicalised: key order and whitespace do
//!   not matter) is blocked the third time;
//! - after 3 consecutive failing calls the model gets a warning;
//! - after 8 consecutive failures the turn is stopped;
//! - a success resets the consecutive-failure count.
//!
//! A blocked call and a call that was not executed (cut off by the output limit) are
//! interventions, not attempts: the loop does not pass them to [`LoopGuard::record`].

use std::collections::HashMap;

use keel_protocol::OutcomeStatus;

/// The repetition that is blocked: the third identical call.
pub const BLOCK_AT_REPEAT: u32 = 3;
/// Consecutive failures that produce a warning.
pub const WARN_AFTER_FAILURES: u32 = 3;
/// Consecutive failures that stop the turn.
pub const STOP_AFTER_FAILURES: u32 = 8;

/// Whether a call may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallDecision {
    /// Run it.
    Allow,
    /// Do not run it; return `message` to the model as the call's (refused) result.
    Block {
        /// What the model reads.
        message: String,
    },
}

/// What the loop should do after recording an outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureSignal {
    /// Nothing to add.
    None,
    /// Append `message` for the model (after the tool results).
    Warn {
        /// What the model reads.
        message: String,
    },
    /// End the turn with [`TurnEnd::LoopGuard`](keel_protocol::TurnEnd::LoopGuard) and
    /// `reason` as the detail.
    Stop {
        /// Why, for the person and the log.
        reason: String,
    },
}

/// The guard's state for one turn.
#[derive(Debug, Clone, Default)]
pub struct LoopGuard {
    seen: HashMap<(String, String), u32>,
    consecutive_failures: u32,
}

impl LoopGuard {
    /// A guard for a new turn.
    pub fn new() -> LoopGuard {
        LoopGuard::default()
    }

    /// Forgets everything (call at the start of each turn).
    pub fn reset(&mut self) {
        *self = LoopGuard::default();
    }

    /// Consecutive failing calls so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Counts a call of `tool` (the resolved name) with `arguments` and decides whether it
    /// may run.
    pub fn check(&mut self, tool: &str, arguments: &serde_json::Value) -> CallDecision {
        let key = (tool.to_string(), canonical_json(arguments));
        let count = self.seen.entry(key).or_insert(0);
        *count += 1;
        if *count < BLOCK_AT_REPEAT {
            return CallDecision::Allow;
        }
        CallDecision::Block {
            message: format!(
                "blocked by the loop guard: this is call number {count} of `{tool}` with exactly the same arguments in this turn, and repeating it will give the same result. Change approach: use different arguments, try another tool, or re-read what the earlier results said."
            ),
        }
    }

    /// Records how an executed call ended. `NotExecuted` is ignored; `Ok` resets the count;
    /// `Error` and `Refused` count as failures.
    pub fn record(&mut self, status: OutcomeStatus) -> FailureSignal {
        match status {
            OutcomeStatus::NotExecuted => return FailureSignal::None,
            OutcomeStatus::Ok => {
                self.consecutive_failures = 0;
                return FailureSignal::None;
            }
            OutcomeStatus::Error | OutcomeStatus::Refused => self.consecutive_failures += 1,
        }
        let n = self.consecutive_failures;
        if n >= STOP_AFTER_FAILURES {
            FailureSignal::Stop {
                reason: format!(
                    "the loop guard stopped the turn after {n} consecutive failing tool calls"
                ),
            }
        } else if n >= WARN_AFTER_FAILURES {
            FailureSignal::Warn {
                message: format!(
                    "[keel loop guard] {n} tool calls in a row have failed; at {STOP_AFTER_FAILURES} the turn is stopped. Stop retrying the same thing: read the error messages, check your assumptions (paths, names, arguments) with read_file/list_dir/grep, or explain the problem to the person."
                ),
            }
        } else {
            FailureSignal::None
        }
    }
}

/// JSON text with object keys sorted at every level and no whitespace.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(key) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_third_identical_call_is_blocked_regardless_of_key_order() {
        let mut g = LoopGuard::new();
        let a = json!({"path": "a.rs", "offset": 1});
        let a_reordered: serde_json::Value =
            serde_json::from_str(r#"{ "offset" : 1, "path" : "a.rs" }"#).expect("json");
        assert_eq!(g.check("read_file", &a), CallDecision::Allow);
        assert_eq!(
            g.check("read_file", &json!({"path": "b.rs"})),
            CallDecision::Allow
        );
        assert_eq!(g.check("grep", &a), CallDecision::Allow);
        assert_eq!(g.check("read_file", &a_reordered), CallDecision::Allow);
        let CallDecision::Block { message } = g.check("read_file", &a) else {
            panic!("third identical call must be blocked");
        };
        assert!(message.contains("Change approach"), "{message}");
        assert!(matches!(
            g.check("read_file", &a),
            CallDecision::Block { .. }
        ));
        assert_eq!(g.check("grep", &a), CallDecision::Allow);
        g.reset();
        assert_eq!(g.check("read_file", &a), CallDecision::Allow);
    }

    #[test]
    fn failures_warn_at_3_and_stop_at_8_and_success_resets() {
        let mut g = LoopGuard::new();
        assert_eq!(g.record(OutcomeStatus::Error), FailureSignal::None);
        assert_eq!(g.record(OutcomeStatus::Refused), FailureSignal::None);
        assert_eq!(g.record(OutcomeStatus::NotExecuted), FailureSignal::None);
        assert!(
            matches!(g.record(OutcomeStatus::Error), FailureSignal::Warn { message } if message.contains("3 tool calls in a row"))
        );
        assert_eq!(g.record(OutcomeStatus::Ok), FailureSignal::None);
        assert_eq!(g.consecutive_failures(), 0);
        for i in 1..=7 {
            let signal = g.record(OutcomeStatus::Error);
            if i < 3 {
                assert_eq!(signal, FailureSignal::None, "failure {i}");
            } else {
                assert!(matches!(signal, FailureSignal::Warn { .. }), "failure {i}");
            }
        }
        let FailureSignal::Stop { reason } = g.record(OutcomeStatus::Error) else {
            panic!("eighth failure must stop the turn");
        };
        assert!(reason.contains("8 consecutive"), "{reason}");
    }

    #[test]
    fn canonical_json_sorts_nested_keys() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"b": [ {"y":1, "x":"é\n"} ], "a": null}"#).expect("json");
        assert_eq!(canonical_json(&v), r#"{"a":null,"b":[{"x":"é\n","y":1}]}"#);
    }
}
