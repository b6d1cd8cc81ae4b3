//! Planning how a turn's tool calls run: consecutive parallel-safe calls form one concurrent
//! batch, every other call runs alone in a serial batch, batches run in order, and results are
//! put back in call order whatever order they complete in.

use std::ops::Range;

/// How a batch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMode {
    /// Its calls may run at the same time.
    Concurrent,
    /// Its single call runs alone.
    Serial,
}

/// A run of consecutive calls, by index into the turn's calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// How it runs.
    pub mode: BatchMode,
    /// The calls, as indices into the turn's call list.
    pub calls: Range<usize>,
}

/// Groups calls given each call's parallel-safe flag, in order.
pub fn plan(parallel_safe: &[bool]) -> Vec<Batch> {
    let mut batches: Vec<Batch> = Vec::new();
    for (i, &safe) in parallel_safe.iter().enumerate() {
        match batches.last_mut() {
            Some(last) if safe && last.mode == BatchMode::Concurrent => last.calls.end = i + 1,
            _ => batches.push(Batch {
                mode: if safe {
                    BatchMode::Concurrent
                } else {
                    BatchMode::Serial
                },
                calls: i..i + 1,
            }),
        }
    }
    batches
}

/// A result slot that was filled twice or not at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReassembleError {
    /// No result arrived for the call at this index.
    #[error("no result for call {0}; every call must get a result (an error result if it failed)")]
    Missing(usize),
    /// Two results arrived for the call at this index.
    #[error("two results for call {0}")]
    Duplicate(usize),
    /// A result named an index past the last call.
    #[error("result for call {index}, but the turn has only {len} calls")]
    OutOfRange {
        /// The index given.
        index: usize,
        /// The number of calls.
        len: usize,
    },
}

/// Puts `(call index, result)` pairs, in any order, back into call order.
pub fn reassemble<R>(
    len: usize,
    results: impl IntoIterator<Item = (usize, R)>,
) -> Result<Vec<R>, ReassembleError> {
    let mut slots: Vec<Option<R>> = (0..len).map(|_| None).collect();
    for (index, result) in results {
        let slot = slots
            .get_mut(index)
            .ok_or(ReassembleError::OutOfRange { index, len })?;
        if slot.replace(result).is_some() {
            return Err(ReassembleError::Duplicate(index));
        }
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, slot)| slot.ok_or(ReassembleError::Missing(i)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shape(batches: &[Batch]) -> Vec<(char, usize, usize)> {
        batches
            .iter()
            .map(|b| {
                let mode = match b.mode {
                    BatchMode::Concurrent => 'C',
                    BatchMode::Serial => 'S',
                };
                (mode, b.calls.start, b.calls.end)
            })
            .collect()
    }

    #[test]
    fn groups_consecutive_safe_calls_and_isolates_the_rest() {
        // read read write grep list edit edit read
        let flags = [true, true, false, true, true, false, false, true];
        assert_eq!(
            shape(&plan(&flags)),
            [
                ('C', 0, 2),
                ('S', 2, 3),
                ('C', 3, 5),
                ('S', 5, 6),
                ('S', 6, 7),
                ('C', 7, 8)
            ]
        );
        assert!(plan(&[]).is_empty());
        assert_eq!(shape(&plan(&[false])), [('S', 0, 1)]);
    }

    #[test]
    fn reassembles_in_call_order() {
        let out = reassemble(3, [(2, "c"), (0, "a"), (1, "b")]).expect("complete");
        assert_eq!(out, ["a", "b", "c"]);
        assert_eq!(reassemble(2, [(0, 1)]), Err(ReassembleError::Missing(1)));
        assert_eq!(
            reassemble(1, [(0, 1), (0, 2)]),
            Err(ReassembleError::Duplicate(0))
        );
        assert_eq!(
            reassemble(1, [(3, 1)]),
            Err(ReassembleError::OutOfRange { index: 3, len: 1 })
        );
    }

    proptest! {
        #[test]
        fn batches_cover_every_call_once_in_order(flags in proptest::collection::vec(any::<bool>(), 0..40)) {
            let batches = plan(&flags);
            let mut next = 0;
            for (i, b) in batches.iter().enumerate() {
                prop_assert_eq!(b.calls.start, next);
                prop_assert!(!b.calls.is_empty());
                next = b.calls.end;
                let all_safe = flags[b.calls.clone()].iter().all(|&s| s);
                match b.mode {
                    BatchMode::Concurrent => {
                        prop_assert!(all_safe);
                        if let Some(prev) = i.checked_sub(1).map(|p| &batches[p]) {
                            prop_assert_ne!(prev.mode, BatchMode::Concurrent);
                        }
                    }
                    BatchMode::Serial => {
                        prop_assert_eq!(b.calls.len(), 1);
                        prop_assert!(!flags[b.calls.start]);
                    }
                }
            }
            prop_assert_eq!(next, flags.len());
        }
    }
}
