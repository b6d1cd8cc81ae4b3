//! keel plugin `shell`: the `exec_shell` tool.
//!
//! A call's `command` is handed to the kernel's exec gate (`exec.run`) exactly as the model
//! wrote it: the kernel judged that very string at dispatch (policy and approval), and only
//! the approved string gets through, so the plugin never wraps or rewrites it. The working
//! directory is carried from call to call in kernel-held state (it survives a reload of the
//! plugin); the kernel confines it to the workspace and says so in its note when a command
//! tried to leave.

use keel_sdk::exec::{self, Command, Outcome};
use keel_sdk::{KernelError, Plugin, ToolCapabilities, ToolSpec, state, tools};
use serde::Deserialize;

/// The tool's name.
const NAME: &str = "exec_shell";
/// State key of the carried working directory (workspace-relative).
const CWD_KEY: &str = "cwd";

const EXAMPLE: &str = r#"{"command": "cargo test", "timeout_ms": 300000}"#;

/// The plugin's configuration.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_timeout")]
    default_timeout_ms: u32,
    #[serde(default = "max_timeout")]
    max_timeout_ms: u32,
}

fn default_timeout() -> u32 {
    120_000
}

fn max_timeout() -> u32 {
    1_800_000
}

/// A call's input.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    command: String,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    workdir: Option<String>,
}

/// The plugin instance.
struct Shell {
    config: Config,
}

fn schema() -> String {
    serde_json::json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "The command line, run by sh -c in the working directory."
            },
            "timeout_ms": {
                "type": "integer",
                "minimum": 1,
                "description": "Wall-clock limit in milliseconds (default 120000); the command and its children are killed when it passes."
            },
            "workdir": {
                "type": "string",
                "description": "Directory to run in, relative to the workspace root (default: where the previous command ended)."
            }
        },
        "required": ["command"],
        "additionalProperties": false
    })
    .to_string()
}

impl Plugin for Shell {
    fn activate(config: &str) -> Result<Self, String> {
        let config: Config = if config.trim().is_empty() {
            serde_json::from_str("{}")
        } else {
            serde_json::from_str(config)
        }
        .map_err(|e| format!("invalid shell configuration: {e}"))?;
        if config.default_timeout_ms == 0 || config.max_timeout_ms < config.default_timeout_ms {
            return Err(
                "invalid shell configuration: need 0 < default_timeout_ms <= max_timeout_ms".into(),
            );
        }
        tools::register(
            ToolSpec::new(
                NAME,
                format!(
                    "Run a shell command in the workspace and return its exit code and output (stdout and stderr interleaved). The working directory carries over between calls (a `cd` persists) and never leaves the workspace. Commands are checked by keel's exec policy; some need the person's approval and some are refused. Prefer read_file, edit_file, list_dir and grep for files. Example: {EXAMPLE}."
                ),
                schema(),
            )
            .capabilities(ToolCapabilities::EXECUTES_CODE)
            .parallel_safe(false),
        )?;
        Ok(Shell { config })
    }

    fn invoke_tool(&mut self, name: &str, input: &str) -> Result<String, String> {
        if name != NAME {
            return Err(format!("the shell plugin has no tool named `{name}`"));
        }
        let input: Input = serde_json::from_str(input)
            .map_err(|e| format!("{NAME}: invalid input: {e}; send e.g. {EXAMPLE}"))?;
        self.run(input)
    }
}

impl Shell {
    fn run(&self, input: Input) -> Result<String, String> {
        let timeout_ms = match input.timeout_ms {
            None => self.config.default_timeout_ms,
            Some(0) => {
                return Err(format!(
                    "{NAME}: timeout_ms must be at least 1; leave it out for the default of {} ms",
                    self.config.default_timeout_ms
                ));
            }
            Some(ms) => u32::try_from(ms)
                .unwrap_or(u32::MAX)
                .min(self.config.max_timeout_ms),
        };
        let carried = carried_cwd();
        let explicit = input.workdir.is_some();
        let cwd = input.workdir.unwrap_or_else(|| carried.clone());
        let outcome = match exec::run(&Command {
            line: input.command.clone(),
            cwd: cwd.clone(),
            timeout_ms,
        }) {
            Ok(outcome) => outcome,
            Err(e) => return Err(self.refusal(&e, &cwd, explicit)),
        };
        // Where the command ended is where the next one starts (the kernel already kept it
        // inside the workspace). A failure to store it only loses the carry-over.
        let _ = state::set(CWD_KEY, outcome.cwd.as_bytes());
        let text = render(&outcome, timeout_ms);
        if outcome.timed_out {
            Err(text)
        } else {
            Ok(text)
        }
    }

    /// The model-facing text of a command the kernel would not start.
    fn refusal(&self, e: &KernelError, cwd: &str, explicit: bool) -> String {
        let missing = e.message().contains("does not exist");
        if missing && !explicit && cwd != "." {
            // The carried directory vanished (removed by an earlier command): start over at
            // the root rather than failing every later call.
            state::remove(CWD_KEY);
            return format!(
                "{NAME}: the working directory `{cwd}` carried from the previous command no longer exists, so nothing ran; the working directory is reset to the workspace root. Resend the command (with workdir if it must run elsewhere). Kernel: {e}"
            );
        }
        format!("{NAME}: the command did not run: {e}")
    }
}

/// The carried working directory, `.` (the workspace root) when none is stored.
fn carried_cwd() -> String {
    state::get(CWD_KEY)
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| ".".to_string())
}

/// The result text: status line, working directory, output, the kernel's note.
fn render(outcome: &Outcome, timeout_ms: u32) -> String {
    let mut text = match (outcome.timed_out, outcome.exit_code) {
        (true, _) => format!(
            "timed out: the command did not finish within {timeout_ms} ms and was killed (no exit code)\ncwd: {}\noutput so far:\n",
            outcome.cwd
        ),
        (false, Some(code)) => format!("exit code: {code}\ncwd: {}\noutput:\n", outcome.cwd),
        (false, None) => format!(
            "exit code: none (killed by a signal)\ncwd: {}\noutput:\n",
            outcome.cwd
        ),
    };
    if outcome.output.is_empty() {
        text.push_str("(no output)\n");
    } else {
        text.push_str(&outcome.output);
        if !outcome.output.ends_with('\n') {
            text.push('\n');
        }
    }
    if !outcome.note.is_empty() {
        text.push_str(&format!("[keel: {}]\n", outcome.note));
    }
    text
}

keel_sdk::export_plugin!(Shell);
