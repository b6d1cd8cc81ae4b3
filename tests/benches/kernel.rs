//! Criterion benchmarks of the keel kernel with its WebAssembly host.
//!
//! - `load/*`: load + activate of the bundled `echo-tool` from the compiled-component cache
//!   (`PluginLoader::from_component`: hash + read + verify + deserialize + ABI report + link,
//!   then `Kernel::load`: instantiate + activate), and from a component already compiled in
//!   memory (`Kernel::load` alone); unloading is outside the timed part.
//! - `cache_hit/*`: where a cache hit's time goes: the kernel's compile from the cache, its
//!   `inspect_component` (no link), and wasmtime alone deserializing the same component's
//!   serialized code (and linking it).
//! - `compile/cold`: compiling the same component without the cache.
//! - `unload/*`: `Kernel::unload` alone; loading is outside the timed part.
//! - `call_tool_greet/*`: the tool `greet` of `greeter-client`, which calls the service
//!   `example.greeting` of `greeter`: host → client guest → `services.call` → greeter guest and
//!   back, through the kernel and through a bare wasmtime host (below) in the same run.
//! - `call_service_greet/*`: host → greeter guest, `Kernel::call_service` against a bare
//!   `handle-call`.
//!
//! After the run the medians and the kernel/bare ratios are printed, read back from criterion's
//! `estimates.json` files of this run.
//!
//! Run with `cargo bench -p keel-tests --bench kernel -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use criterion::{Criterion, SamplingMode};
use keel_kernel::{CacheStatus, Manifest, PluginPackage, PluginState, inspect_component};
use keel_tests::Harness;
use tokio::runtime::Runtime;

/// The small plugin the load, compile and unload benches use.
const LOAD_PLUGIN: &str = "echo-tool";
/// The input of the `greet` tool.
const GREET_INPUT: &str = r#"{"name":"Ada"}"#;
/// What both `greet` paths return.
const GREETING: &str = "Hello, Ada!";

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("cannot build the tokio runtime")
}

/// The parsed manifest and the component bytes of a bundled plugin.
fn bundled(name: &str) -> (Manifest, &'static [u8]) {
    let b = keel_bundled_plugins::get(name).expect("the plugin is bundled");
    let manifest = Manifest::parse(
        b.manifest,
        Path::new(&format!("<bundled {name}>/keel.toml")),
    )
    .expect("a bundled manifest parses");
    // Unpacked once for the whole bench.
    (manifest, b.component().leak())
}

fn assert_active(state: &PluginState) {
    assert_eq!(*state, PluginState::Active, "the plugin must be active");
}

fn load_benches(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("cannot create a temporary directory");
    let h = Harness::new(dir.path(), Some(dir.path().join("cache"))).expect("harness");
    let (manifest, bytes) = bundled(LOAD_PLUGIN);
    let wasm = h.loader.wasm().clone();

    // Warm the cache: the first compile writes the entry, the second must read it.
    let first = wasm.compile(LOAD_PLUGIN, bytes).expect("first compile");
    assert_ne!(first.cache_status(), CacheStatus::Hit);
    let component = wasm.compile(LOAD_PLUGIN, bytes).expect("cached compile");
    assert_eq!(component.cache_status(), CacheStatus::Hit);
    drop(first);

    let mut group = c.benchmark_group("load");
    group.bench_function("from_cache", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let m = manifest.clone();
                    let start = Instant::now();
                    let package = h.loader.from_component(m, bytes).expect("cache hit");
                    let status = h.kernel.load(package).await.expect("load");
                    timed += start.elapsed();
                    assert_active(&status.state);
                    h.kernel.unload(LOAD_PLUGIN).await.expect("unload");
                }
                timed
            })
        });
    });
    group.bench_function("in_memory", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let m = manifest.clone();
                    let start = Instant::now();
                    let grants = h.loader.grants(&m).expect("grants");
                    let package = PluginPackage {
                        source: wasm.source(&component, grants),
                        manifest: m,
                    };
                    let status = h.kernel.load(package).await.expect("load");
                    timed += start.elapsed();
                    assert_active(&status.state);
                    h.kernel.unload(LOAD_PLUGIN).await.expect("unload");
                }
                timed
            })
        });
    });
    group.finish();

    // Where a cache hit's time goes: the kernel's whole cache hit, the same without linking,
    // and wasmtime alone deserializing (and linking) the same component's serialized code.
    let floor = bare::Floor::new(bytes).expect("bare wasmtime engine");
    let mut group = c.benchmark_group("cache_hit");
    group.bench_function("kernel_compile", |b| {
        b.iter(|| {
            let component = wasm.compile(LOAD_PLUGIN, black_box(bytes)).expect("hit");
            debug_assert_eq!(component.cache_status(), CacheStatus::Hit);
            component
        });
    });
    group.bench_function("kernel_inspect", |b| {
        b.iter(|| inspect_component(&wasm, LOAD_PLUGIN, black_box(bytes)).expect("hit"));
    });
    group.bench_function("bare_deserialize", |b| {
        b.iter(|| floor.deserialize().expect("deserialize"));
    });
    group.bench_function("bare_deserialize_link", |b| {
        b.iter(|| floor.deserialize_and_link().expect("deserialize and link"));
    });
    group.finish();

    let mut group = c.benchmark_group("compile");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    group.bench_function("cold", |b| {
        b.iter(|| {
            wasm.compile_uncached(LOAD_PLUGIN, black_box(bytes))
                .expect("compile")
        });
    });
    group.finish();

    let mut group = c.benchmark_group("unload");
    group.bench_function(LOAD_PLUGIN, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let m = manifest.clone();
                    let grants = h.loader.grants(&m).expect("grants");
                    let package = PluginPackage {
                        source: wasm.source(&component, grants),
                        manifest: m,
                    };
                    let status = h.kernel.load(package).await.expect("load");
                    assert_active(&status.state);
                    let start = Instant::now();
                    h.kernel.unload(LOAD_PLUGIN).await.expect("unload");
                    timed += start.elapsed();
                }
                timed
            })
        });
    });
    group.finish();
}

fn call_benches(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("cannot create a temporary directory");
    let h = Harness::new(dir.path(), None).expect("harness");
    let mut bare = rt.block_on(async {
        h.load_bundled("greeter").await.expect("load greeter");
        let status = h
            .load_bundled("greeter-client")
            .await
            .expect("load greeter-client");
        assert_active(&status.state);
        assert_eq!(
            h.kernel
                .invoke_tool("greet", GREET_INPUT)
                .await
                .expect("kernel greet"),
            GREETING
        );
        let mut bare = bare::Pair::new().await.expect("bare wasmtime host");
        assert_eq!(
            bare.invoke_tool("greet", GREET_INPUT)
                .await
                .expect("bare greet"),
            GREETING
        );
        bare
    });

    let mut group = c.benchmark_group("call_tool_greet");
    group.bench_function("kernel", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(
                        h.kernel
                            .invoke_tool("greet", black_box(GREET_INPUT))
                            .await
                            .expect("greet"),
                    );
                }
                start.elapsed()
            })
        });
    });
    group.bench_function("bare", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(
                        bare.invoke_tool("greet", black_box(GREET_INPUT))
                            .await
                            .expect("greet"),
                    );
                }
                start.elapsed()
            })
        });
    });
    group.finish();

    let mut group = c.benchmark_group("call_service_greet");
    group.bench_function("kernel", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(
                        h.kernel
                            .call_service("example.greeting", "greet", black_box("Ada"))
                            .await
                            .expect("greet"),
                    );
                }
                start.elapsed()
            })
        });
    });
    group.bench_function("bare", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(
                        bare.handle_call("example.greeting", "greet", black_box("Ada"))
                            .await
                            .expect("greet"),
                    );
                }
                start.elapsed()
            })
        });
    });
    group.finish();

    rt.block_on(async { h.kernel.shutdown().await.expect("shutdown") });
}

/// A minimal host of the keel world on plain wasmtime: no kernel, no limits, no mediation.
/// The client's `services.call` import calls the greeter instance's `handle-call` export
/// directly; the greeter's store lives in the client store's data.
///
/// The engine has the kernel's settings (component model, epoch interruption, Cranelift
/// optimizing for speed) so the guest code is the same and only the host side differs; no
/// epoch ticker runs, so the deadline is never reached.
mod bare {
    use std::collections::HashMap;

    use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
    use wasmtime::error::Context as _;
    use wasmtime::{Config, Engine, OptLevel, Store};
    use wasmtime::{Result, format_err};
    use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

    wasmtime::component::bindgen!({
        path: "../wit/keel-plugin-0.2.0",
        world: "keel-plugin",
        imports: { default: async },
        exports: { default: async },
    });

    use keel::plugin::types::{KernelError, Level, ToolSpec};

    /// The data of a bare store.
    pub struct State {
        wasi: WasiCtx,
        table: ResourceTable,
        kv: HashMap<String, Vec<u8>>,
        /// The instance `services.call` reaches (the greeter, in the client's store).
        peer: Option<Box<Instance>>,
    }

    impl WasiView for State {
        fn ctx(&mut self) -> WasiCtxView<'_> {
            WasiCtxView {
                ctx: &mut self.wasi,
                table: &mut self.table,
            }
        }
    }

    impl keel::plugin::types::Host for State {}

    impl keel::plugin::log::Host for State {
        async fn log(&mut self, _level: Level, _message: String) {}
    }

    impl keel::plugin::services::Host for State {
        async fn provide(&mut self, _name: String, _version: String) -> Result<(), KernelError> {
            Ok(())
        }

        async fn call(
            &mut self,
            name: String,
            method: String,
            payload: String,
        ) -> Result<String, KernelError> {
            let Some(peer) = self.peer.as_mut() else {
                return Err(KernelError::Unavailable(format!("no provider of {name}")));
            };
            match peer.handle_call(&name, &method, &payload).await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(message)) => Err(KernelError::Failed(message)),
                Err(trap) => Err(KernelError::Failed(format!("{trap:#}"))),
            }
        }
    }

    impl keel::plugin::tools::Host for State {
        async fn register(&mut self, _spec: ToolSpec) -> Result<(), KernelError> {
            Ok(())
        }

        async fn registered(&mut self) -> Vec<ToolSpec> {
            Vec::new()
        }
    }

    // The bare baseline hosts only what the measured plugins use; the other doors refuse.
    fn not_hosted() -> KernelError {
        KernelError::Unavailable("not hosted by the bare baseline".into())
    }

    impl keel::plugin::guards::Host for State {
        async fn register(&mut self, _name: String) -> Result<(), KernelError> {
            Err(not_hosted())
        }
    }

    impl keel::plugin::http::Host for State {
        async fn send(
            &mut self,
            _req: keel::plugin::http::Request,
        ) -> Result<(u32, keel::plugin::http::ResponseHead), KernelError> {
            Err(not_hosted())
        }

        async fn next_chunk(
            &mut self,
            _body: u32,
            _idle_ms: u32,
        ) -> Result<Option<Vec<u8>>, KernelError> {
            Err(not_hosted())
        }

        async fn close(&mut self, _body: u32) {}
    }

    impl keel::plugin::exec::Host for State {
        async fn run(
            &mut self,
            _cmd: keel::plugin::exec::Command,
        ) -> Result<keel::plugin::exec::Outcome, KernelError> {
            Err(not_hosted())
        }
    }

    impl keel::plugin::agent::Host for State {
        async fn complete(&mut self, _request: String) -> Result<String, KernelError> {
            Err(not_hosted())
        }

        async fn dispatch(&mut self, _call_ids: Vec<String>) -> Vec<String> {
            Vec::new()
        }

        async fn replay(&mut self, _call_id: String) -> Result<String, KernelError> {
            Err(not_hosted())
        }

        async fn cancelled(&mut self) -> bool {
            false
        }
    }

    impl keel::plugin::events::Host for State {
        async fn subscribe(&mut self, _topic: String) -> Result<(), KernelError> {
            Ok(())
        }

        async fn emit(&mut self, _topic: String, _payload: String) -> Result<(), KernelError> {
            Ok(())
        }
    }

    impl keel::plugin::prompt::Host for State {
        async fn add_fragment(&mut self, _id: String, _text: String) -> Result<(), KernelError> {
            Ok(())
        }
    }

    impl keel::plugin::state::Host for State {
        async fn get(&mut self, key: String) -> Option<Vec<u8>> {
            self.kv.get(&key).cloned()
        }

        async fn set(&mut self, key: String, value: Vec<u8>) -> Result<(), KernelError> {
            self.kv.insert(key, value);
            Ok(())
        }

        async fn remove(&mut self, key: String) {
            self.kv.remove(&key);
        }

        async fn keys(&mut self) -> Vec<String> {
            let mut keys: Vec<String> = self.kv.keys().cloned().collect();
            keys.sort();
            keys
        }
    }

    /// One instantiated, activated plugin in its own store.
    pub struct Instance {
        store: Store<State>,
        bindings: KeelPlugin,
    }

    impl Instance {
        async fn new(
            engine: &Engine,
            linker: &Linker<State>,
            name: &str,
            peer: Option<Box<Instance>>,
        ) -> Result<Instance> {
            let bundled =
                keel_bundled_plugins::get(name).with_context(|| format!("no bundled `{name}`"))?;
            let component = Component::new(engine, bundled.component())?;
            let pre = KeelPluginPre::new(linker.instantiate_pre(&component)?)?;
            let mut store = Store::new(
                engine,
                State {
                    wasi: WasiCtx::builder().build(),
                    table: ResourceTable::new(),
                    kv: HashMap::new(),
                    peer,
                },
            );
            store.set_epoch_deadline(u64::from(u32::MAX));
            let bindings = pre.instantiate_async(&mut store).await?;
            bindings
                .keel_plugin_plugin()
                .call_activate(&mut store, "{}")
                .await?
                .map_err(|e| format_err!("{name} refused to activate: {e}"))?;
            Ok(Instance { store, bindings })
        }

        async fn handle_call(
            &mut self,
            service: &str,
            method: &str,
            payload: &str,
        ) -> Result<Result<String, String>> {
            self.bindings
                .keel_plugin_plugin()
                .call_handle_call(&mut self.store, service, method, payload)
                .await
        }
    }

    /// The engine, with the kernel's settings.
    fn engine() -> Result<Engine> {
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .cranelift_opt_level(OptLevel::Speed);
        Engine::new(&config)
    }

    /// A linker with WASI 0.2 and the keel imports.
    fn linker(engine: &Engine) -> Result<Linker<State>> {
        let mut linker = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        KeelPlugin::add_to_linker::<_, HasSelf<State>>(&mut linker, |s| s)?;
        Ok(linker)
    }

    /// wasmtime alone turning a component's serialized code back into a component: the floor
    /// of a cache hit.
    pub struct Floor {
        engine: Engine,
        linker: Linker<State>,
        serialized: Vec<u8>,
    }

    impl Floor {
        pub fn new(bytes: &[u8]) -> Result<Floor> {
            let engine = engine()?;
            let serialized = Component::new(&engine, bytes)?.serialize()?;
            Ok(Floor {
                linker: linker(&engine)?,
                engine,
                serialized,
            })
        }

        pub fn deserialize(&self) -> Result<Component> {
            // SAFETY: the bytes are the output of `Component::serialize` on this very engine,
            // unmodified since.
            #[allow(unsafe_code)]
            unsafe {
                Component::deserialize(&self.engine, &self.serialized)
            }
        }

        pub fn deserialize_and_link(&self) -> Result<KeelPluginPre<State>> {
            let component = self.deserialize()?;
            KeelPluginPre::new(self.linker.instantiate_pre(&component)?)
        }
    }

    /// `greeter-client` wired straight to `greeter`.
    pub struct Pair {
        client: Instance,
    }

    impl Pair {
        pub async fn new() -> Result<Pair> {
            let engine = engine()?;
            let linker = linker(&engine)?;
            let greeter = Instance::new(&engine, &linker, "greeter", None).await?;
            let client =
                Instance::new(&engine, &linker, "greeter-client", Some(Box::new(greeter))).await?;
            Ok(Pair { client })
        }

        /// The client's `invoke-tool` export.
        pub async fn invoke_tool(&mut self, name: &str, input: &str) -> Result<String> {
            let client = &mut self.client;
            client
                .bindings
                .keel_plugin_plugin()
                .call_invoke_tool(&mut client.store, name, input)
                .await?
                .map_err(|e| format_err!("greet failed: {e}"))
        }

        /// The greeter's `handle-call` export, called from the host.
        pub async fn handle_call(
            &mut self,
            service: &str,
            method: &str,
            payload: &str,
        ) -> Result<String> {
            let greeter = self
                .client
                .store
                .data_mut()
                .peer
                .as_mut()
                .context("the greeter is wired to the client")?;
            greeter
                .handle_call(service, method, payload)
                .await?
                .map_err(|e| format_err!("greet failed: {e}"))
        }
    }
}

/// Criterion's output directory, as criterion finds it (`CRITERION_HOME`, `CARGO_TARGET_DIR`,
/// else the workspace's `target`).
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    target.join("criterion")
}

/// The median (point estimate, lower and upper bound, in ns) a benchmark of this run wrote.
fn median(group: &str, function: &str, since: SystemTime) -> Option<(f64, f64, f64)> {
    let file = criterion_dir()
        .join(group)
        .join(function)
        .join("new")
        .join("estimates.json");
    if std::fs::metadata(&file).ok()?.modified().ok()? < since {
        return None; // left from an earlier run (this one filtered it out)
    }
    let estimates: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).ok()?).ok()?;
    let m = &estimates["median"];
    let ci = &m["confidence_interval"];
    Some((
        m["point_estimate"].as_f64()?,
        ci["lower_bound"].as_f64()?,
        ci["upper_bound"].as_f64()?,
    ))
}

/// Every benchmark of this file, as (group, function).
const BENCHES: &[(&str, &str)] = &[
    ("load", "from_cache"),
    ("load", "in_memory"),
    ("cache_hit", "kernel_compile"),
    ("cache_hit", "kernel_inspect"),
    ("cache_hit", "bare_deserialize"),
    ("cache_hit", "bare_deserialize_link"),
    ("compile", "cold"),
    ("unload", LOAD_PLUGIN),
    ("call_tool_greet", "kernel"),
    ("call_tool_greet", "bare"),
    ("call_service_greet", "kernel"),
    ("call_service_greet", "bare"),
];

/// `ns` in a readable unit.
fn show(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} µs", ns / 1e3)
    }
}

/// The medians of this run (with criterion's 95% interval of the median), then the
/// kernel/bare ratios of the call benches.
fn print_summary(since: SystemTime) {
    let rows: Vec<String> = BENCHES
        .iter()
        .filter_map(|(group, function)| {
            let (m, lo, hi) = median(group, function, since)?;
            let id = format!("{group}/{function}");
            Some(format!(
                "  {id:<34} {:>10}  [{} {}]",
                show(m),
                show(lo),
                show(hi)
            ))
        })
        .collect();
    if !rows.is_empty() {
        println!("\nmedians of this run [95% confidence interval]:");
        println!("{}", rows.join("\n"));
    }
    for group in ["call_tool_greet", "call_service_greet"] {
        if let (Some(kernel), Some(bare)) =
            (median(group, "kernel", since), median(group, "bare", since))
        {
            println!(
                "{group}: kernel/bare wasmtime = {} / {} = {:.2}x",
                show(kernel.0),
                show(bare.0),
                kernel.0 / bare.0
            );
        }
    }
}

fn main() {
    let since = SystemTime::now();
    let mut criterion = Criterion::default().configure_from_args();
    load_benches(&mut criterion);
    call_benches(&mut criterion);
    criterion.final_summary();
    print_summary(since);
}
