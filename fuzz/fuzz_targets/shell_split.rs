//! Fuzzes the shell splitter and the exec policy built on it. The properties are
//! `keel_gates::properties::shell_split`, which the gates' unit tests also check on every seed.
//!
//! Run: `cargo +nightly fuzz run shell_split` from the repository root (or from `fuzz/`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keel_gates::properties::shell_split(&String::from_utf8_lossy(data)));
