//! Plugins written in Python. keel's ABI is WIT, so any toolchain that builds a component
//! against it can write a plugin; for Python that is componentize-py (from PyPI), which
//! embeds CPython in the component. `keel plugin new NAME --lang python` starts from the
//! example `plugins/py-words`, and `keel plugin build` builds a directory with an `app.py` and
//! no `Cargo.toml` against the world `tool-plugin` (no network, commands or agent imports),
//! then records the manifest's version in the component as keel-sdk does for Rust plugins.
//! WASI is stubbed out (`--stub-wasi`): such a plugin imports nothing but keel's interfaces,
//! and Python code that reaches for files, clocks or sockets traps instead.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};
use clap::ValueEnum;
use keel_kernel::Manifest;

use super::plugin_sdk::{WIT_PACKAGES, wit_files};
use super::plugin_template::Kind;

/// The language a new plugin is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Rust, with keel-sdk.
    Rust,
    /// Python, with componentize-py.
    Python,
}

/// The Python module componentize-py builds.
pub const APP: &str = "app.py";

/// The componentize-py release keel's Python example is built and tested with.
pub const COMPONENTIZE_PY: &str = "0.25.1";

/// The WIT world Python plugins are built against: the newest ABI's `tool-plugin`, whose
/// exports answer with typed errors (`ToolError_InvalidInput`, …, in Python).
const WORLD: &str = "keel:plugin/tool-plugin@0.4.0";

/// The example, as `keel plugin new --lang python` writes it (its names replaced).
const EXAMPLE: &[(&str, &str)] = &[
    (APP, include_str!("../../../plugins/py-words/app.py")),
    (
        "logic.py",
        include_str!("../../../plugins/py-words/logic.py"),
    ),
    (
        "test_logic.py",
        include_str!("../../../plugins/py-words/test_logic.py"),
    ),
    (
        "keel.toml",
        include_str!("../../../plugins/py-words/keel.toml"),
    ),
    (
        "keel-test.toml",
        include_str!("../../../plugins/py-words/keel-test.toml"),
    ),
    (
        "README.md",
        include_str!("../../../plugins/py-words/README.md"),
    ),
    (
        ".gitignore",
        include_str!("../../../plugins/py-words/.gitignore"),
    ),
];

/// The files of a new Python plugin `name`: the example with its plugin and tool names
/// replaced, and the WIT it is built against.
pub fn template(name: &str, kind: Kind) -> anyhow::Result<Vec<(String, String)>> {
    if kind != Kind::Tool {
        bail!("the Python exemplar is a tool plugin; use `--kind tool` with `--lang python`");
    }
    let tool = name.replace('-', "_");
    let mut files: Vec<(String, String)> = EXAMPLE
        .iter()
        .map(|(path, text)| {
            let text = text
                .replace("py_words", &tool)
                .replace("plugins/py-words", ".")
                .replace("py-words", name);
            ((*path).to_owned(), text)
        })
        .collect();
    files.extend(wit_files());
    Ok(files)
}

/// Build the Python plugin in `dir` to `component`.
pub fn build(dir: &Path, manifest: &Manifest, component: &Path) -> anyhow::Result<()> {
    // componentize-py runs in `dir` (it imports `app` from there): every path absolute.
    let dir = &dir
        .canonicalize()
        .with_context(|| format!("cannot find `{}`", dir.display()))?;
    let component = &std::path::absolute(component)
        .with_context(|| format!("cannot resolve `{}`", component.display()))?;
    // Every version's package: the world of the newest reuses the older ones' interfaces.
    let mut packages = Vec::new();
    for (package, _) in WIT_PACKAGES {
        let wit = dir.join("wit").join(package);
        if !wit.is_dir() {
            bail!(
                "`{}` is missing; it holds the plugin ABI (`keel plugin new NAME --lang python` \
                 writes it; copy `wit/` from a new one to update an older plugin)",
                wit.display()
            );
        }
        packages.push(wit);
    }
    let module = APP.trim_end_matches(".py");
    let status = Command::new("componentize-py")
        .current_dir(dir)
        .args(
            packages
                .iter()
                .flat_map(|wit| [std::ffi::OsStr::new("-d"), wit.as_os_str()]),
        )
        // `--stub-wasi`: no WASI import at all (CPython would import sockets, files and
        // clocks); the plugin reaches only keel's own interfaces.
        .args(["-w", WORLD, "componentize", module, "--stub-wasi", "-o"])
        .arg(component)
        .status()
        .with_context(|| {
            format!(
                "cannot run componentize-py, which builds Python plugins; install it with \
                 `pip install componentize-py=={COMPONENTIZE_PY}`"
            )
        })?;
    if !status.success() {
        bail!("componentize-py failed ({status}); fix the errors above and build again");
    }
    let mut bytes = std::fs::read(component)
        .with_context(|| format!("componentize-py wrote no `{}`", component.display()))?;
    append_custom_section(
        &mut bytes,
        keel_registry::VERSION_SECTION,
        manifest.version.to_string().as_bytes(),
    );
    std::fs::write(component, bytes)
        .with_context(|| format!("cannot write `{}`", component.display()))
}

/// Append a custom section `name` holding `data` to the component (or module) `bytes`: id 0,
/// the section's size, the name's size and the name, then the data, sizes as unsigned LEB128.
fn append_custom_section(bytes: &mut Vec<u8>, name: &str, data: &[u8]) {
    fn leb128(out: &mut Vec<u8>, mut n: usize) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut body = Vec::new();
    leb128(&mut body, name.len());
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    bytes.push(0);
    leb128(bytes, body.len());
    bytes.extend_from_slice(&body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_section_appended_is_read_back_as_the_version() {
        // The smallest component: its preamble alone.
        let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
        append_custom_section(&mut bytes, keel_registry::VERSION_SECTION, b"1.2.3");
        assert_eq!(
            keel_registry::component_version(&bytes),
            Ok(Some(semver::Version::new(1, 2, 3)))
        );
        // A long name or payload needs a multi-byte size.
        let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
        append_custom_section(&mut bytes, "x", &[b'a'; 300]);
        assert_eq!(keel_registry::component_version(&bytes), Ok(None));
    }

    #[test]
    fn the_template_names_the_new_plugin_and_its_tool() -> anyhow::Result<()> {
        let files = template("tiny-count", Kind::Tool)?;
        let get = |path: &str| {
            files
                .iter()
                .find(|(p, _)| p == path)
                .map(|(_, text)| text.clone())
                .unwrap_or_default()
        };
        assert!(get("keel.toml").contains("name = \"tiny-count\""));
        assert!(get("keel.toml").contains("component = \"tiny-count.wasm\""));
        assert!(get("logic.py").contains("TOOL = \"tiny_count\""));
        assert!(get("keel-test.toml").contains("tool = \"tiny_count\""));
        assert!(get("README.md").contains("keel plugin build ."));
        assert!(template("x", Kind::Service).is_err());
        Ok(())
    }

    /// The Python example's logic has a native unit test (`python3 -m unittest`, no
    /// componentize-py): it passes in the example and in a new plugin made from it.
    #[test]
    fn the_python_logic_passes_its_unit_tests_natively() -> anyhow::Result<()> {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/py-words");
        let made = tempfile::tempdir()?;
        for (path, text) in template("tiny-count", Kind::Tool)? {
            let path = made.path().join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, text)?;
        }
        for dir in [example.as_path(), made.path()] {
            let out = Command::new("python3")
                .current_dir(dir)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .args(["-m", "unittest", "-v"])
                .output()
                .context("python3 runs the unit tests")?;
            let report = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{}: {report}", dir.display());
            assert!(
                report.contains("Ran 7 tests") && report.contains("\nOK"),
                "{report}"
            );
            assert!(
                report.contains("test_a_text_that_is_not_a_string_is_invalid_input ("),
                "{report}"
            );
        }
        Ok(())
    }
}
