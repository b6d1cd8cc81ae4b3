//! Fuzzes the argument gate: strict parsing, repair, look-alike stripping and the truncation notice. The properties are
//! `keel_gates::properties::arg_repair`, which the gates' unit tests also check on every seed.
//!
//! Run: `cargo +nightly fuzz run arg_repair` from the repository root (or from `fuzz/`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keel_gates::properties::arg_repair(&String::from_utf8_lossy(data)));
