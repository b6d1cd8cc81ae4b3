//! Fuzzes the output gate: sanitizing, the external-content fence and the head/tail cut. The properties are
//! `keel_gates::properties::sanitize`, which the gates' unit tests also check on every seed.
//!
//! Run: `cargo +nightly fuzz run sanitize` from the repository root (or from `fuzz/`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keel_gates::properties::sanitize(data));
