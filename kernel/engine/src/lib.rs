//! The kernel's WebAssembly engine: its settings and a fingerprint of them.
//!
//! Two programs compile keel's components: the kernel, at run time, and the build script of
//! `keel-bundled-plugins`, which compiles the bundled plugins ahead of time so a first run does
//! not. Machine code from one is only usable by the other when both engines agree on every
//! setting that shapes it (wasmtime version, wasm features, Cranelift flags, the CPU features
//! it may use). Both build their engine from [`config`] here, and each artifact travels with
//! the [`fingerprint`] of the engine that made it: a mismatch (another CPU, another wasmtime)
//! means compiling again, never running code an engine did not make for itself.

use std::hash::Hasher;

use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, OptLevel};

/// The wasmtime keel is built against (kept in step with Cargo.toml / Cargo.lock).
pub const WASMTIME_VERSION: &str = "48.0.8";

/// Names the layout of everything keyed by [`fingerprint`]; bump it when that layout changes.
const FORMAT: &str = "keel-wasm-cache-2";

/// The engine settings: the component model, epoch interruption (the kernel's CPU bound), and
/// Cranelift optimizing for speed. The kernel's tests may tweak a copy (e.g. no optimization);
/// what they compile then has another fingerprint.
pub fn config() -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .cranelift_opt_level(OptLevel::Speed);
    config
}

/// Feeds `Hash` output into SHA-256, so the engine's compatibility hash becomes stable bytes.
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        // Only `write` is used; the digest is read from the inner hasher.
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// What machine code `engine` makes and can run, as 32 bytes: equal fingerprints mean an
/// artifact one engine serialized the other may deserialize (wasmtime checks its own header
/// and the CPU's features again when it does).
pub fn fingerprint(engine: &Engine) -> [u8; 32] {
    let mut hasher = ShaHasher(Sha256::new());
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
    let mut outer = Sha256::new();
    outer.update(FORMAT.as_bytes());
    outer.update([0]);
    outer.update(WASMTIME_VERSION.as_bytes());
    outer.update([0]);
    outer.update(hasher.0.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_follows_the_settings() {
        let engine = |config: &Config| Engine::new(config).expect("engine");
        let keel = fingerprint(&engine(&config()));
        assert_eq!(
            keel,
            fingerprint(&engine(&config())),
            "stable across engines"
        );
        let mut unoptimized = config();
        unoptimized.cranelift_opt_level(OptLevel::None);
        assert_ne!(keel, fingerprint(&engine(&unoptimized)));
        let mut no_epochs = config();
        no_epochs.epoch_interruption(false);
        assert_ne!(keel, fingerprint(&engine(&no_epochs)));
    }
}
