//! The sealed gates' policies. Nothing here is reachable from a plugin: the WIT interfaces and
//! the native callback table expose no gate state, and every decision is made in the kernel,
//! which holds the gates' session state (approvals granted, the turn ledger) and calls these
//! pure functions. This crate depends on no async runtime, no wasmtime, no HTTP client and
//! nothing of the kernel, so it builds, tests and fuzzes on its own.

pub mod approvals;
pub mod arg_repair;
mod decision;
mod exec_danger;
pub mod exec_policy;
mod exec_rules;
pub mod net_policy;
pub mod properties;
pub mod redact;
pub mod safe_path;
pub mod shell_split;
mod tool_capabilities;

// The output gate's text cleaning lives in the pure `keel-sanitize` crate so guest plugins can
// clean exactly as the kernel does; these paths stay the gates' public API.
pub use keel_sanitize::{markers, prompt_text, sanitize};

pub use decision::Decision;
pub use tool_capabilities::ToolCapabilities;

/// Every seed of the fuzz corpus `fuzz/corpus/<target>`, as (path, text read lossily), sorted;
/// the gates' unit tests replay them with the checks their fuzz targets make.
#[cfg(test)]
pub(crate) fn fuzz_seeds(target: &str) -> Vec<(std::path::PathBuf, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()));
    let mut seeds: Vec<_> = entries
        .map(|entry| {
            let path = entry.expect("readable directory entry").path();
            let bytes = std::fs::read(&path).expect("readable seed file");
            (path, String::from_utf8_lossy(&bytes).into_owned())
        })
        .collect();
    seeds.sort();
    seeds
}

#[cfg(test)]
mod sanitize_seeds {
    #[test]
    fn fuzz_seed_corpus_replays() {
        let seeds = crate::fuzz_seeds("sanitize");
        for (_, text) in &seeds {
            crate::properties::sanitize(text.as_bytes());
        }
        assert!(seeds.len() >= 16, "expected seeds, found {}", seeds.len());
    }
}
