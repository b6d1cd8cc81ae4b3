//! Fuzzes the network policy's URL, address and redirect handling. The properties are
//! `keel_gates::properties::net_policy`, which the gates' unit tests also check on every seed.
//!
//! Run: `cargo +nightly fuzz run net_policy` from the repository root (or from `fuzz/`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| keel_gates::properties::net_policy(data));
