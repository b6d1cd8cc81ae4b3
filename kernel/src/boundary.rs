//! What crosses between the kernel and its plugins, in bytes: every payload a plugin hands the
//! kernel through an import (a service call and its answer, kept state, an event, an HTTP body,
//! a model request and the tool outcomes it gets back) and every one the kernel hands a plugin
//! through an export (a service call, a tool's input and result, a guard's input, an event).
//!
//! It is how a step's cost in copies is measured, not guessed: a long turn whose history
//! crossed the boundary on every door would show several times the history per step. The
//! count is a relaxed atomic add per crossing; the host reads it, and every `agent.complete`
//! (one step of an agent) logs what crossed since the previous one under the `keel::boundary`
//! tracing target, which benches read with `KEEL_LOG=keel::boundary=debug`.

use std::sync::atomic::{AtomicU64, Ordering};

/// The kernel's count of bytes across the plugin boundary.
#[derive(Debug, Default)]
pub(crate) struct BoundaryMeter {
    crossed: AtomicU64,
    /// The count when the last step began.
    at_last_step: AtomicU64,
}

impl BoundaryMeter {
    /// `bytes` crossed, either way.
    pub(crate) fn crossed(&self, bytes: usize) {
        self.crossed.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Every byte that crossed since the kernel was made.
    pub(crate) fn total(&self) -> u64 {
        self.crossed.load(Ordering::Relaxed)
    }

    /// An agent's step begins: log what crossed since the previous one began (the previous
    /// step's model call, its tools, the conversation kept).
    pub(crate) fn step_begins(&self, agent: &str) {
        let now = self.total();
        let before = self.at_last_step.swap(now, Ordering::Relaxed);
        tracing::debug!(
            target: "keel::boundary",
            agent,
            bytes = now.saturating_sub(before),
            "a step's bytes across the plugin boundary"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_counts_what_crossed_since_the_previous_one() {
        let meter = BoundaryMeter::default();
        meter.crossed(10);
        meter.step_begins("a");
        meter.crossed(5);
        meter.crossed(7);
        assert_eq!(meter.total(), 22);
        let before = meter.at_last_step.load(Ordering::Relaxed);
        meter.step_begins("a");
        assert_eq!(meter.total() - before, 12);
    }
}
