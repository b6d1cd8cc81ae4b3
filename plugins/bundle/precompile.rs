//! Packs the bundled plugins for the binary: each component compressed, and compiled to
//! machine code ahead of time so that no run — a first run on a fresh home included — spends
//! seconds in Cranelift before its first request.
//!
//! The engine is the kernel's own (`keel_engine::config`), running on the machine that builds
//! keel — the machine `cargo install` or `cargo build` runs it on. Each artifact is the output
//! of `Engine::precompile_component`; the engine's fingerprint travels with them, and the
//! kernel uses them only when its own engine has the same one (another CPU, say, means
//! compiling as before). Both the components and the machine code are compressed with zstd,
//! which keeps the binary under 40 MB (the machine code is about 2.5× the size of the wasm).

use std::path::{Path, PathBuf};

use keel_guest_build::BuiltComponent;
use wasmtime::Engine;

/// About 3.7× smaller for components, 3.2× for machine code; unpacking is as fast at any level.
const ZSTD_LEVEL: i32 = 19;

/// The dictionary every artifact is compressed with, trained on all of them: the plugins share
/// most of their code (the standard library, serde, the SDK, the agent kit), which one
/// dictionary holds once instead of every plugin carrying its own copy (about 1 MB less).
const DICTIONARY_BYTES: usize = 512 * 1024;

/// One bundled plugin, packed.
pub struct Packed {
    /// The compressed component.
    pub component: PathBuf,
    /// The compressed machine code, or `None` (a cross build).
    pub code: Option<PathBuf>,
}

/// What the build packed: each plugin in `built`'s order, the fingerprint of the engine
/// that compiled the machine code (`None`: no machine code), and the dictionary (itself
/// compressed, without one).
pub struct Bundle {
    pub plugins: Vec<Packed>,
    pub engine: Option<[u8; 32]>,
    pub dictionary: PathBuf,
}

/// A plugin's artifacts before compression.
struct Raw {
    wasm: Vec<u8>,
    code: Option<Vec<u8>>,
}

/// Pack every component in `built` into `out_dir`, on every core; machine code only for the
/// plugins `ahead` names.
pub fn all(built: &[BuiltComponent], out_dir: &Path, ahead: impl Fn(&str) -> bool) -> Bundle {
    // The engine here makes code for the machine running this script; for another target it
    // would be unusable, so a cross build bundles no machine code.
    let engine = if std::env::var("TARGET").ok() == std::env::var("HOST").ok() {
        Engine::new(&keel_engine::config())
            .map_err(|e| {
                println!("cargo:warning=no machine code bundled: the engine fails: {e:#}");
            })
            .ok()
    } else {
        println!("cargo:warning=cross build: the bundled plugins compile on their first run");
        None
    };
    let raws: Vec<Raw> = std::thread::scope(|scope| {
        let jobs: Vec<_> = built
            .iter()
            .map(|component| {
                let engine = engine.as_ref().filter(|_| ahead(&component.name));
                scope.spawn(move || compile(engine, component))
            })
            .collect();
        jobs.into_iter()
            .map(|job| job.join().expect("compiling a plugin panicked"))
            .collect()
    });
    let samples: Vec<&[u8]> = raws
        .iter()
        .flat_map(|r| std::iter::once(r.wasm.as_slice()).chain(r.code.as_deref()))
        .collect();
    let dictionary = zstd::dict::from_samples(&samples, DICTIONARY_BYTES)
        .unwrap_or_else(|e| panic!("cannot train the bundle's zstd dictionary: {e}"));
    let dictionary_path = out_dir.join("bundle.dict.zst");
    std::fs::write(
        &dictionary_path,
        zstd::bulk::compress(&dictionary, ZSTD_LEVEL).expect("compress the dictionary"),
    )
    .expect("write the dictionary");
    let plugins = std::thread::scope(|scope| {
        let jobs: Vec<_> = built
            .iter()
            .zip(raws)
            .map(|(component, raw)| {
                let dictionary = &dictionary;
                scope.spawn(move || pack(component, raw, dictionary, out_dir))
            })
            .collect();
        jobs.into_iter()
            .map(|job| job.join().expect("packing a plugin panicked"))
            .collect()
    });
    Bundle {
        plugins,
        engine: engine.as_ref().map(keel_engine::fingerprint),
        dictionary: dictionary_path,
    }
}

fn compile(engine: Option<&Engine>, component: &BuiltComponent) -> Raw {
    let wasm = std::fs::read(&component.wasm_path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", component.wasm_path.display()));
    let code = engine.map(|engine| {
        engine
            .precompile_component(&wasm)
            .unwrap_or_else(|e| panic!("cannot compile {}: {e:#}", component.name))
    });
    Raw { wasm, code }
}

fn pack(component: &BuiltComponent, raw: Raw, dictionary: &[u8], out_dir: &Path) -> Packed {
    let mut compressor = zstd::bulk::Compressor::with_dictionary(ZSTD_LEVEL, dictionary)
        .unwrap_or_else(|e| panic!("cannot load the dictionary: {e}"));
    let mut write = |suffix: &str, bytes: &[u8]| {
        let packed = compressor
            .compress(bytes)
            .unwrap_or_else(|e| panic!("cannot compress {}: {e}", component.name));
        let path = out_dir.join(format!("{}.{suffix}.zst", component.name));
        std::fs::write(&path, packed)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    };
    Packed {
        component: write("wasm", &raw.wasm),
        code: raw.code.map(|code| write("cwasm", &code)),
    }
}
