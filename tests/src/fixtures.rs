//! Hostile and special-purpose plugin fixtures for the kernel's integration tests.
//!
//! The crates under `tests/fixtures/plugins/` are compiled to components by this crate's build
//! script; each comes with its `keel.toml` manifest. Every fixture is documented in its own
//! crate; in short:
//!
//! - `abi-0-3-tool`: built against keel ABI 0.3.0 with wit-bindgen directly (not keel-sdk);
//!   registers `legacy_echo` (returns `text`; with `fail`, fails with `the legacy tool failed:
//!   <fail>`) and `legacy_gone`, which it withdraws through 0.3.0's `tool-list`.
//! - `spin-loop`: service `fixture.spin`; method `spin` never returns, `ping` returns `pong`.
//!   Manifest limit `cpu-ms = 500`.
//! - `memory-bomb`: service `fixture.bomb`; method `allocate` with payload `N` allocates and
//!   touches N MiB (empty payload: 1024) and returns the byte count, or an error when the
//!   allocation fails without trapping; `ping` returns `pong`. Manifest limit
//!   `memory-mib = 64`.
//! - `trap-activate`: registers the tool `trap_tool` and provides `fixture.trap`, then traps
//!   (panics) in `activate`.
//! - `path-escape`: service `fixture.fs` with the capability `dirs = [{ path = ".", guest =
//!   "/workspace", access = "read" }]`; method `read` (payload: a path) returns the file's
//!   text, `write` (payload: `PATH\nCONTENT`) writes it and returns `ok`; failures return the
//!   I/O error's text as the call's error.
//! - `tool-squatter`: registers the tool `echo` (owned by the bundled `echo-tool`); when
//!   refused, activation fails with the kernel error's text.
//! - `unload-effect`: service `fixture.unload` (`ping` → `pong`); in `deactivate` it tries to
//!   register the tool `late_tool` and to provide `fixture.unload` again, then reports
//!   `tool: <ok|error>\nservice: <ok|error>` as a warn log line, in state key
//!   `deactivate-attempts` and as an event on `fixture.unload.attempts`.
//! - `reentrant`: service `fixture.reentrant`; method `call-self` calls its own `ping` through
//!   the kernel and returns the answer or `error: <kernel error>`; `ping` returns `pong`.
//! - `canned-model`: service `model`; `complete` answers with the assistant message (text,
//!   tool calls, stop reason) spelled out as JSON in the request's last message, so tests
//!   drive tool calls through the kernel's gate pipeline without a model.
//! - `secret-thief`: service `fixture.thief`; may use the secret `OPENAI_API_KEY` and reach
//!   `127.0.0.1` on any port; method `send` (payload: a URL) sends `GET` with the key as a
//!   bearer token and returns `status N`, or the kernel's error.
//! - `snooper`: service `fixture.snoop`, declaring nothing else; method `try` calls
//!   `session-log` (list, read, append a forged entry), `model`, `verifier` and emits
//!   `session.event` and `fixture.snooped`, one result line per attempt.
//! - `kernel-mimic`: tries the tools `keel_verdict` and `keel` and the guard
//!   `keel-policy.allow` in `activate` (method `attempts` of `fixture.mimic` lists the kernel's
//!   answers); its tool `mimic` returns output shaped like chat-template tokens, role turns,
//!   tool calls, keel notices and variation selectors.
//! - `flood`: subscribes to `fixture.flood` and handles each event slowly (2 s); registers
//!   tools `flood_<prefix>_<n>` (8 KiB descriptions) and 8 KiB prompt fragments until refused;
//!   tool `flood_<prefix>` stores 1 MiB state values until refused and emits 1 MiB events 300 times
//!   (`prefix` from `[config]`, so several copies can load under different names).
//! - `typed-memory`: provides `memory` through ABI 0.6.0's typed export (one entry, source
//!   `typed door`, text the input; input `refuse` → `invalid("refused by the typed door")`;
//!   input `spin` never returns, under `cpu-ms = 300`)
//!   and through its JSON door (source `json door`); tool `summarize_undeclared` calls the
//!   typed `compaction` without declaring it and returns the answer or `error: <kernel error>`.
//! - `stall`: tools `stall_sleep` (sleeps forever), `stall_spin` (emits
//!   `fixture.stall.started`, then spins forever), `stall_ping` (`pong`); service
//!   `fixture.stall` with `relay` (calls `fixture.spin`'s `spin` forever, ignoring errors),
//!   `sleep` and `ping`.

include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

/// The manifest text and component bytes of the fixture `name`, if there is one.
pub fn fixture(name: &str) -> Option<(&'static str, &'static [u8])> {
    FIXTURES
        .iter()
        .find(|(fixture, _, _)| *fixture == name)
        .map(|&(_, manifest, component)| (manifest, component))
}

/// The name of every fixture, sorted.
pub fn names() -> &'static [&'static str] {
    NAMES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixture_is_a_component_with_its_manifest() {
        let mut sorted = names().to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names(), sorted, "sorted and unique");
        for known in [CANNED_MODEL, SPIN_LOOP, SECRET_THIEF, KERNEL_MIMIC] {
            assert!(names().contains(&known), "{known}");
        }
        // Every fixture is described in this module's documentation.
        let docs = include_str!("fixtures.rs");
        for name in names() {
            assert!(
                docs.contains(&format!("//! - `{name}`")),
                "document fixture `{name}`"
            );
        }
        for name in names() {
            let (manifest, component) = fixture(name).expect("listed fixtures exist");
            assert_eq!(
                component.get(..8),
                Some(&b"\0asm\x0d\x00\x01\x00"[..]),
                "{name}"
            );
            assert!(manifest.contains(&format!("name = \"{name}\"")), "{name}");
        }
        assert!(fixture("no-such-fixture").is_none());
    }

    #[test]
    fn fixture_and_bundled_manifests_parse_with_the_kernel() {
        let bundled = keel_bundled_plugins::all()
            .iter()
            .map(|b| (b.name, b.manifest));
        let fixtures = names().iter().map(|&name| {
            let (manifest, _) = fixture(name).expect("listed fixtures exist");
            (name, manifest)
        });
        for (name, text) in bundled.chain(fixtures) {
            let manifest = keel_kernel::Manifest::parse(text, std::path::Path::new(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(manifest.name, name);
        }
    }
}
