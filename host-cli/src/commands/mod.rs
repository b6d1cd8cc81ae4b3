//! One module per command group.

pub mod checkpoints;
pub mod dev;
pub mod doctor;
pub mod hooks;
pub mod key;
pub mod mcp;
pub mod memory;
pub mod plugin;
mod plugin_python;
mod plugin_sdk;
mod plugin_template;
mod plugin_test;
pub mod policy;
pub mod registry;
pub mod review;
pub mod run;
pub mod sessions;
pub mod skills;
pub mod tool;
pub mod web;

/// Asks `question` on the terminal (`[y/N]`); true only for `y`. Without a terminal to ask on,
/// an error saying to pass `--yes`.
pub fn confirm(question: &str) -> anyhow::Result<bool> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    if !std::io::stdin().is_terminal() {
        anyhow::bail!("no terminal to ask on; pass --yes to approve");
    }
    stdout!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim().eq_ignore_ascii_case("y"))
}
