//! keel plugin `fs-tools`: the file tools of `keel-agent-kit` (`read_file`, `write_file`,
//! `edit_file`, `list_dir`, `grep`) as registered tools.
//!
//! The workspace is the plugin's only preopened directory, seen as `/workspace`; every tool
//! runs against that root, so the sandbox confines them even where the tools' own path checks
//! would not. A tool's failure comes back as `Err(message)`; the kernel turns it into an error
//! result the model reads. `read_file` first asks the kernel's `keel.editor` for the file as the
//! editor driving the session holds it (unsaved changes included); without an editor the
//! kernel answers nothing and the disk is read.

use std::path::Path;

use keel_agent_kit::tools::{self, ToolSpec as KitSpec, paths::WORKSPACE_PREFIX, read_file};
use keel_sdk::{Plugin, ToolCapabilities, ToolSpec, tools as kernel_tools};

/// The plugin instance; it holds nothing itself.
struct FsTools;

/// The ABI registration of a tool (the ABI's record carries capabilities as flags).
fn to_abi(spec: &KitSpec) -> ToolSpec {
    ToolSpec::new(
        spec.name.clone(),
        spec.description.clone(),
        spec.input_schema.clone(),
    )
    .capabilities(ToolCapabilities::from_bits_retain(
        spec.capabilities.abi_bits(),
    ))
    .parallel_safe(spec.parallel_safe)
}

impl Plugin for FsTools {
    fn activate(_config: &str) -> Result<Self, String> {
        for spec in tools::all_specs() {
            kernel_tools::register(to_abi(&spec))
                .map_err(|e| format!("cannot register `{}`: {e}", spec.name))?;
        }
        Ok(FsTools)
    }

    fn invoke_tool(&mut self, name: &str, input: &str) -> Result<String, String> {
        let input: serde_json::Value = serde_json::from_str(input)
            .map_err(|e| format!("{name}: the input is not JSON ({e}); send a JSON object"))?;
        if name == read_file::NAME {
            return read_file::run_with(Path::new(WORKSPACE_PREFIX), &input, editor_text)
                .map_err(|e| e.to_string());
        }
        match tools::run_tool(name, Path::new(WORKSPACE_PREFIX), &input) {
            Some(result) => result.map_err(|e| e.to_string()),
            None => Err(format!("fs-tools has no tool named `{name}`")),
        }
    }
}

/// The text of workspace file `rel` as the editor driving the session holds it; `None` without
/// an editor, or when the kernel could not ask it (the disk is read then).
fn editor_text(rel: &str) -> Option<String> {
    keel_sdk::editor::read(rel).ok().flatten()
}

keel_sdk::export_plugin!(FsTools);
