//! Resident memory across many load/unload cycles of the kernel.
//!
//! One cycle loads the bundled `greeter` and `greeter-client` (both become active), runs the
//! tool `greet` once (host → client → kernel → greeter and back) and unloads both. The cycles
//! run twice: with packages made from the compiled-component cache each cycle
//! (`PluginLoader::from_component`: verify + deserialize + link), and from components already
//! compiled in memory. Each phase warms up for 50 cycles, reads the resident set size from
//! `/proc/self/statm`, runs 1,000 cycles and reads it again; it prints the growth and the time
//! per cycle. Linux only.
//!
//! Run with `cargo bench -p keel-tests --bench load_cycles` (`-- <cycles>` to change the 1,000;
//! under `cargo test --benches` it only runs a few cycles as a smoke test).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use keel_kernel::{Manifest, PluginPackage, PluginState, WasmComponent};
use keel_tests::Harness;

const WARM_UP: usize = 50;
const DEFAULT_CYCLES: usize = 1_000;
/// Cycles of a run outside `cargo bench` (a smoke test, not a measurement).
const SMOKE_CYCLES: usize = 5;
const PAGE: u64 = 4096;
const MIB: f64 = 1024.0 * 1024.0;
/// Loaded in this order, unloaded in the reverse one.
const PLUGINS: [&str; 2] = ["greeter", "greeter-client"];

/// Resident set size in bytes (resident pages × 4 KiB).
fn rss() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .context("/proc/self/statm has no resident field")?
        .parse()
        .context("/proc/self/statm's resident field is not a number")?;
    Ok(pages * PAGE)
}

/// Where the packages of one cycle come from.
enum Source {
    /// `PluginLoader::from_component` on the bundled bytes: a cache hit every cycle.
    Cache(Vec<(Manifest, Vec<u8>)>),
    /// Components compiled once, kept in memory.
    Memory(Vec<(Manifest, WasmComponent)>),
}

impl Source {
    fn label(&self) -> &'static str {
        match self {
            Source::Cache(_) => "from the compiled-component cache",
            Source::Memory(_) => "from components compiled in memory",
        }
    }

    fn packages(&self, h: &Harness) -> anyhow::Result<Vec<PluginPackage>> {
        match self {
            Source::Cache(plugins) => plugins
                .iter()
                .map(|(m, bytes)| Ok(h.loader.from_component(m.clone(), bytes)?))
                .collect(),
            Source::Memory(plugins) => plugins
                .iter()
                .map(|(m, component)| {
                    Ok(PluginPackage {
                        source: h.loader.wasm().source(component, h.loader.grants(m)?),
                        manifest: m.clone(),
                    })
                })
                .collect(),
        }
    }
}

async fn cycle(h: &Harness, source: &Source) -> anyhow::Result<()> {
    for package in source.packages(h)? {
        let name = package.manifest.name.clone();
        let status = h.kernel.load(package).await?;
        if status.state != PluginState::Active {
            bail!("`{name}` is not active after loading: {:?}", status.state);
        }
    }
    let reply = h.kernel.invoke_tool("greet", r#"{"name":"Ada"}"#).await?;
    if reply != "Hello, Ada!" {
        bail!("unexpected reply {reply:?}");
    }
    for name in PLUGINS.iter().rev() {
        h.kernel.unload(name).await?;
    }
    if !h.kernel.list().is_empty() || !h.kernel.tools().is_empty() {
        bail!("something is left after unloading");
    }
    Ok(())
}

async fn phase(h: &Harness, source: &Source, cycles: usize) -> anyhow::Result<()> {
    for _ in 0..WARM_UP {
        cycle(h, source).await?;
    }
    let before = rss()?;
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    for _ in 0..cycles {
        let t = Instant::now();
        cycle(h, source).await?;
        slowest = slowest.max(t.elapsed());
    }
    let elapsed = start.elapsed();
    let after = rss()?;
    let growth = after as f64 - before as f64;
    println!("{} cycles {}:", cycles, source.label());
    println!(
        "  RSS after {WARM_UP} warm-up cycles: {:.2} MiB; after {cycles} more: {:.2} MiB; \
         growth {:.2} MiB ({:.0} bytes/cycle)",
        before as f64 / MIB,
        after as f64 / MIB,
        growth / MIB,
        growth / cycles as f64,
    );
    println!(
        "  time per cycle (load 2 + activate + greet + unload 2): mean {:.3} ms, slowest {:.3} ms, \
         total {:.2} s",
        elapsed.as_secs_f64() * 1e3 / cycles as f64,
        slowest.as_secs_f64() * 1e3,
        elapsed.as_secs_f64(),
    );
    Ok(())
}

fn bundled(name: &str) -> anyhow::Result<(Manifest, Vec<u8>)> {
    let b = keel_bundled_plugins::get(name).with_context(|| format!("no bundled `{name}`"))?;
    let manifest = Manifest::parse(
        b.manifest,
        Path::new(&format!("<bundled {name}>/keel.toml")),
    )?;
    Ok((manifest, b.component()))
}

async fn run(cycles: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let h = Harness::new(dir.path(), Some(dir.path().join("cache")))?;
    let plugins = PLUGINS
        .iter()
        .map(|name| bundled(name))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let compiled = plugins
        .iter()
        .map(|(m, bytes)| Ok((m.clone(), h.loader.wasm().compile(&m.name, bytes)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    println!(
        "RSS at start (cache warmed): {:.2} MiB",
        rss()? as f64 / MIB
    );
    phase(&h, &Source::Cache(plugins), cycles).await?;
    phase(&h, &Source::Memory(compiled), cycles).await?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`) only a smoke run of
    // a few cycles. A bare number sets the cycle count.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    let cycles = args
        .iter()
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(if bench { DEFAULT_CYCLES } else { SMOKE_CYCLES });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(cycles))
}
