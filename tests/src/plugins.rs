//! The agent plugins the tests load (`fs-tools`, `shell`, `tool-registry`, `session-log`,
//! `verifier`, …), taken from the bundled set so they are compiled once.

/// The bundled plugin `name`, if there is one.
pub fn plugin(name: &str) -> Option<&'static keel_bundled_plugins::Bundled> {
    keel_bundled_plugins::get(name)
}

/// The name of every bundled plugin.
pub fn names() -> Vec<&'static str> {
    keel_bundled_plugins::all().iter().map(|b| b.name).collect()
}
