//! What the whole-process benchmarks share: medians and ranges, printed one figure a line.
// Each bench compiles this module and may use only part of it.
#![allow(dead_code)]

use std::time::Duration;

/// Median and the range of `values`.
pub fn summary(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[0], values[n - 1])
}

pub fn report(name: &str, unit: &str, values: &mut [f64]) {
    let (median, low, high) = summary(values);
    println!(
        "{name:<44} median {median:>9.1} {unit}   [{low:.1} … {high:.1}]   n = {}",
        values.len()
    );
}

pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `keel` binary measured: this build's, or `KEEL_BENCH_BIN` (another build's, to compare
/// two builds back to back on the same machine).
pub fn keel_binary() -> std::ffi::OsString {
    std::env::var_os("KEEL_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_keel").into())
}
