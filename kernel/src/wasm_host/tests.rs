//! Tests of the WebAssembly host with components written as WAT.

use std::sync::Weak;
use std::time::{Duration, Instant};

use super::*;
use crate::call_chain::CallChain;
use crate::host_api::HostHandle;
use crate::instance::{InstanceError, PluginError, PluginInstance};
use wasmtime::OptLevel;

/// A keel plugin whose `activate` does what its config says (its first byte, or `x` in a
/// kernel's `{"op":"x"}`): `s` spin forever, `m` grow memory until refused, `t` trap, `w` wait
/// 600 ms on a WASI clock, `p` provide `slow.svc` 1.0.0, `c` call `slow.svc` method `m` with
/// payload `w`, `b` the same with payload `b` (both returning a kernel error as their own error),
/// `e` return an error, anything else succeed. It logs through the keel `log` import first.
/// `handle-call` echoes the payload, after waiting 600 ms when it starts with `w`, after running
/// 150 ms of guest code when it starts with `b`;
/// `invoke-tool` echoes the input.
const PLUGIN_WAT: &str = r#"
(component $C
  (import "keel:plugin/log@0.2.0" (instance $log
    (type $lvl' (enum "trace" "debug" "info" "warn" "error"))
    (export "level" (type $lvl (eq $lvl')))
    (export "log" (func (param "level" $lvl) (param "message" string)))
  ))
  (import "keel:plugin/services@0.2.0" (instance $services
    (type $ke' (variant (case "invalid" string) (case "conflict" string) (case "denied" string)
      (case "unavailable" string) (case "failed" string) (case "timed-out" string)))
    (export "kernel-error" (type $ke (eq $ke')))
    (export "provide" (func (param "name" string) (param "version" string)
      (result (result (error $ke)))))
    (export "call" (func (param "name" string) (param "method" string) (param "payload" string)
      (result (result string (error $ke)))))
  ))
  (import "wasi:io/poll@0.2.0" (instance $poll
    (export "pollable" (type $p (sub resource)))
    (export "[method]pollable.block" (func (param "self" (borrow $p))))
  ))
  (alias export $poll "pollable" (type $pollable))
  (import "wasi:clocks/monotonic-clock@0.2.0" (instance $clock
    (alias outer $C $pollable (type $p'))
    (export "pollable" (type $p (eq $p')))
    (export "now" (func (result u64)))
    (export "subscribe-duration" (func (param "when" u64) (result (own $p))))
  ))

  (core module $Mem
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 4096))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $r i32)
      (local.set $r (global.get $heap))
      (global.set $heap
        (i32.add (global.get $heap)
          (i32.and (i32.add (local.get 3) (i32.const 15)) (i32.const -8))))
      (local.get $r))
  )
  (core instance $mem (instantiate $Mem))
  (alias core export $mem "memory" (core memory $memory))
  (alias core export $mem "realloc" (core func $realloc))

  (core func $log_lower (canon lower (func $log "log") (memory $memory)))
  (core func $provide_lower
    (canon lower (func $services "provide") (memory $memory) (realloc $realloc)))
  (core func $call_lower (canon lower (func $services "call") (memory $memory) (realloc $realloc)))
  (core func $now (canon lower (func $clock "now")))
  (core func $subscribe (canon lower (func $clock "subscribe-duration")))
  (core func $block (canon lower (func $poll "[method]pollable.block")))
  (core func $drop (canon resource.drop $pollable))

  (core module $Main
    (import "env" "memory" (memory 1))
    (import "host" "log" (func $log (param i32 i32 i32)))
    (import "host" "provide" (func $provide (param i32 i32 i32 i32 i32)))
    (import "host" "call" (func $call (param i32 i32 i32 i32 i32 i32 i32)))
    (import "host" "now" (func $now (result i64)))
    (import "host" "subscribe" (func $subscribe (param i64) (result i32)))
    (import "host" "block" (func $block (param i32)))
    (import "host" "drop" (func $drop (param i32)))
    (data (i32.const 100) "nope")
    (data (i32.const 200) "activating")
    (data (i32.const 300) "slow.svc")
    (data (i32.const 310) "m")
    (data (i32.const 312) "w")
    (data (i32.const 313) "b")
    ;; Run guest code for `ns` nanoseconds of wall time.
    (func $busy (param $ns i64)
      (local $end i64)
      (local.set $end (i64.add (call $now) (local.get $ns)))
      (loop $l (br_if $l (i64.lt_u (call $now) (local.get $end)))))
    (data (i32.const 320) "1.0.0")
    (func $wait
      (local $h i32)
      (local.set $h (call $subscribe (i64.const 600000000)))
      (call $block (local.get $h))
      (call $drop (local.get $h)))
    ;; Turn the `kernel-error` at 32 (a result<_, kernel-error> or result<string, ...>
    ;; written by the host) into this export's Err(message) at 16.
    (func $fail_with_kernel_error (result i32)
      (i32.store8 (i32.const 16) (i32.const 1))
      (i32.store (i32.const 20) (i32.load (i32.const 40)))
      (i32.store (i32.const 24) (i32.load (i32.const 44)))
      (i32.const 16))
    (func (export "activate") (param $ptr i32) (param $len i32) (result i32)
      (local $op i32)
      (if (local.get $len) (then (local.set $op (i32.load8_u (local.get $ptr)))))
      ;; JSON config from a kernel, `{"op":"x"}`: the op is the third byte from the end.
      (if (i32.and (i32.eq (local.get $op) (i32.const 123)) (i32.ge_u (local.get $len) (i32.const 3)))
        (then (local.set $op
          (i32.load8_u (i32.sub (i32.add (local.get $ptr) (local.get $len)) (i32.const 3))))))
      (call $log (i32.const 2) (i32.const 200) (i32.const 10))
      (if (i32.eq (local.get $op) (i32.const 115))
        (then (loop $spin (br $spin))))
      (if (i32.eq (local.get $op) (i32.const 109))
        (then
          (loop $grow
            (br_if $grow (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
          unreachable))
      (if (i32.eq (local.get $op) (i32.const 116))
        (then unreachable))
      (if (i32.eq (local.get $op) (i32.const 119))
        (then (call $wait)))
      (if (i32.eq (local.get $op) (i32.const 112))
        (then
          (call $provide (i32.const 300) (i32.const 8) (i32.const 320) (i32.const 5) (i32.const 32))
          (if (i32.load8_u (i32.const 32)) (then (return (call $fail_with_kernel_error))))))
      (if (i32.eq (local.get $op) (i32.const 99))
        (then
          (call $call (i32.const 300) (i32.const 8) (i32.const 310) (i32.const 1)
            (i32.const 312) (i32.const 1) (i32.const 32))
          (if (i32.load8_u (i32.const 32)) (then (return (call $fail_with_kernel_error))))))
      (if (i32.eq (local.get $op) (i32.const 98))
        (then
          (call $call (i32.const 300) (i32.const 8) (i32.const 310) (i32.const 1)
            (i32.const 313) (i32.const 1) (i32.const 32))
          (if (i32.load8_u (i32.const 32)) (then (return (call $fail_with_kernel_error))))))
      (if (i32.eq (local.get $op) (i32.const 101))
        (then
          (i32.store8 (i32.const 16) (i32.const 1))
          (i32.store (i32.const 20) (i32.const 100))
          (i32.store (i32.const 24) (i32.const 4))
          (return (i32.const 16))))
      (i32.store8 (i32.const 16) (i32.const 0))
      (i32.const 16))
    (func (export "deactivate"))
    (func (export "handle-call") (param i32 i32 i32 i32 i32 i32) (result i32)
      (if (local.get 5)
        (then
          (if (i32.eq (i32.load8_u (local.get 4)) (i32.const 119)) (then (call $wait)))
          (if (i32.eq (i32.load8_u (local.get 4)) (i32.const 98))
            (then (call $busy (i64.const 150000000))))))
      (i32.store8 (i32.const 16) (i32.const 0))
      (i32.store (i32.const 20) (local.get 4))
      (i32.store (i32.const 24) (local.get 5))
      (i32.const 16))
    (func (export "invoke-tool") (param i32 i32 i32 i32) (result i32)
      (i32.store8 (i32.const 16) (i32.const 0))
      (i32.store (i32.const 20) (local.get 2))
      (i32.store (i32.const 24) (local.get 3))
      (i32.const 16))
    (func (export "on-event") (param i32 i32 i32 i32 i32 i32))
    (func (export "check-tool-call") (param i32 i32 i32 i32 i32 i32) (result i32)
      (i32.store8 (i32.const 16) (i32.const 0))
      (i32.store (i32.const 20) (i32.const 0))
      (i32.store (i32.const 24) (i32.const 0))
      (i32.const 16))
  )
  (core instance $main (instantiate $Main
    (with "env" (instance $mem))
    (with "host" (instance
      (export "log" (func $log_lower))
      (export "provide" (func $provide_lower))
      (export "call" (func $call_lower))
      (export "now" (func $now))
      (export "subscribe" (func $subscribe))
      (export "block" (func $block))
      (export "drop" (func $drop))))))

  (type $event' (record (field "topic" string) (field "source" string) (field "payload" string)))
  (export $event "event" (type $event'))
  (func $activate (param "config" string) (result (result (error string)))
    (canon lift (core func $main "activate") (memory $memory) (realloc $realloc)))
  (func $deactivate (canon lift (core func $main "deactivate")))
  (func $handle_call (param "service" string) (param "method" string) (param "payload" string)
    (result (result string (error string)))
    (canon lift (core func $main "handle-call") (memory $memory) (realloc $realloc)))
  (func $invoke_tool (param "name" string) (param "input" string)
    (result (result string (error string)))
    (canon lift (core func $main "invoke-tool") (memory $memory) (realloc $realloc)))
  (func $on_event (param "event" $event)
    (canon lift (core func $main "on-event") (memory $memory) (realloc $realloc)))
  (type $decision' (enum "allow" "prompt" "forbid"))
  (export $decision "guard-decision" (type $decision'))
  (type $verdict' (record (field "decision" $decision) (field "reason" string)))
  (export $verdict "guard-verdict" (type $verdict'))
  (func $check_tool_call (param "guard" string) (param "tool" string) (param "input" string)
    (result $verdict)
    (canon lift (core func $main "check-tool-call") (memory $memory) (realloc $realloc)))
  (instance $plugin
    (export "event" (type $event))
    (export "guard-decision" (type $decision))
    (export "guard-verdict" (type $verdict))
    (export "activate" (func $activate))
    (export "deactivate" (func $deactivate))
    (export "handle-call" (func $handle_call))
    (export "invoke-tool" (func $invoke_tool))
    (export "on-event" (func $on_event))
    (export "check-tool-call" (func $check_tool_call)))
  (export "keel:plugin/plugin@0.2.0" (instance $plugin))
)
"#;

/// A component exporting the plugin interface of `version` (just one function).
fn plugin_of_version(version: &str) -> Vec<u8> {
    wat(&format!(
        r#"(component
             (core module $m (func (export "f")))
             (core instance $i (instantiate $m))
             (func $f (canon lift (core func $i "f")))
             (instance $p (export "deactivate" (func $f)))
             (export "keel:plugin/plugin@{version}" (instance $p)))"#
    ))
}

fn wat(text: &str) -> Vec<u8> {
    match wat::parse_str(text) {
        Ok(bytes) => bytes,
        Err(e) => panic!("test WAT does not parse: {e}"),
    }
}

fn host() -> WasmHost {
    WasmHost::new(WasmHostConfig::default()).expect("engine")
}

fn cached_host(dir: &std::path::Path) -> WasmHost {
    WasmHost::new(WasmHostConfig {
        cache_dir: Some(dir.to_path_buf()),
        ..WasmHostConfig::default()
    })
    .expect("engine")
}

fn handle(plugin: &str) -> HostHandle {
    HostHandle::new(Weak::new(), plugin, 1)
}

async fn instance(plugin: &str, limits: WasmLimits) -> Box<dyn PluginInstance> {
    let host = host();
    let component = host.compile(plugin, &wat(PLUGIN_WAT)).expect("compile");
    let source = host.source(
        &component,
        WasmGrants {
            dirs: Vec::new(),
            limits,
            hidden: Vec::new(),
        },
    );
    source
        .instantiate(handle(plugin))
        .await
        .expect("instantiate")
}

fn chain(plugin: &str) -> CallChain {
    CallChain::starting_at(plugin)
}

#[test]
fn abi_mismatch_names_both_versions() {
    let err = host()
        .compile("future", &plugin_of_version("0.9.0"))
        .expect_err("must be refused");
    assert_eq!(
        err,
        WasmError::AbiMismatch {
            plugin: "future".into(),
            found: "0.9.0".into(),
            supported: "0.2.0, 0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0 and 0.8.0".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "plugin `future` was built against keel ABI 0.9.0; this keel hosts ABI 0.2.0, 0.3.0, \
         0.4.0, 0.5.0, 0.6.0, 0.7.0 and 0.8.0; rebuild it against this keel's keel-sdk and WIT (`keel \
         plugin new` vendors both)"
    );
    // 0.5.0 to 0.8.0 add other interfaces only: a `plugin` export at any of them is no ABI
    // keel hosts.
    for version in ["0.5.0", "0.6.0", "0.7.0", "0.8.0"] {
        let err = host()
            .compile("odd", &plugin_of_version(version))
            .expect_err("must be refused");
        assert!(matches!(err, WasmError::AbiMismatch { .. }), "{err}");
    }
    // 0.3.0 defines only what it adds: a `plugin` export at 0.3.0 is no ABI keel hosts.
    let err = host()
        .compile("odd", &plugin_of_version("0.3.0"))
        .expect_err("must be refused");
    assert!(matches!(err, WasmError::AbiMismatch { .. }), "{err}");
}

/// A keel plugin of ABI 0.4.0 whose every answer is decided by the first byte of its input
/// (`invoke-tool`), payload (`handle-call`) or config (`activate`): a digit `n` below 5 is the
/// error case `n` of the export's variant with the whole text as its message; anything else
/// succeeds, echoing the text. `check-tool-call` forbids.
const PLUGIN_0_4_WAT: &str = r#"
(component
  (core module $M
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 4096))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $r i32)
      (local.set $r (global.get $heap))
      (global.set $heap
        (i32.add (global.get $heap)
          (i32.and (i32.add (local.get 3) (i32.const 15)) (i32.const -8))))
      (local.get $r))
    ;; result<string, variant { case0(string) … }> at address 0: [0] ok/err, then the string
    ;; at 4 (ok), or the case at 4 and the string at 8 (err).
    (func $answer (param $p i32) (param $l i32) (result i32)
      (local $c i32)
      (local.set $c (i32.sub (i32.load8_u (local.get $p)) (i32.const 48)))
      (if (i32.lt_u (local.get $c) (i32.const 5))
        (then
          (i32.store8 (i32.const 0) (i32.const 1))
          (i32.store8 (i32.const 4) (local.get $c))
          (i32.store (i32.const 8) (local.get $p))
          (i32.store (i32.const 12) (local.get $l)))
        (else
          (i32.store8 (i32.const 0) (i32.const 0))
          (i32.store (i32.const 4) (local.get $p))
          (i32.store (i32.const 8) (local.get $l))))
      (i32.const 0))
    (func (export "activate") (param i32 i32) (result i32)
      (call $answer (local.get 0) (local.get 1)))
    (func (export "deactivate"))
    (func (export "handle-call") (param i32 i32 i32 i32 i32 i32) (result i32)
      (call $answer (local.get 4) (local.get 5)))
    (func (export "invoke-tool") (param i32 i32 i32 i32) (result i32)
      (call $answer (local.get 2) (local.get 3)))
    (func (export "on-event") (param i32 i32 i32 i32 i32 i32))
    (func (export "check-tool-call") (param i32 i32 i32 i32 i32 i32) (result i32)
      (i32.store8 (i32.const 16) (i32.const 2))
      (i32.store (i32.const 20) (i32.const 0))
      (i32.store (i32.const 24) (i32.const 0))
      (i32.const 16))
  )
  (core instance $m (instantiate $M))
  (alias core export $m "memory" (core memory $memory))
  (alias core export $m "realloc" (core func $realloc))
  (type $event' (record (field "topic" string) (field "source" string) (field "payload" string)))
  (export $event "event" (type $event'))
  (type $decision' (enum "allow" "prompt" "forbid"))
  (export $decision "guard-decision" (type $decision'))
  (type $verdict' (record (field "decision" $decision) (field "reason" string)))
  (export $verdict "guard-verdict" (type $verdict'))
  (type $ae' (variant (case "invalid-config" string) (case "unavailable" string)
    (case "failed" string)))
  (export $ae "activate-error" (type $ae'))
  (type $ce' (variant (case "unknown-method" string) (case "invalid-input" string)
    (case "denied" string) (case "unavailable" string) (case "failed" string)))
  (export $ce "call-error" (type $ce'))
  (type $te' (variant (case "invalid-input" string) (case "unknown-tool" string)
    (case "denied" string) (case "unavailable" string) (case "failed" string)))
  (export $te "tool-error" (type $te'))
  (func $activate (param "config" string) (result (result (error $ae)))
    (canon lift (core func $m "activate") (memory $memory) (realloc $realloc)))
  (func $deactivate (canon lift (core func $m "deactivate")))
  (func $handle_call (param "service" string) (param "method" string) (param "payload" string)
    (result (result string (error $ce)))
    (canon lift (core func $m "handle-call") (memory $memory) (realloc $realloc)))
  (func $invoke_tool (param "name" string) (param "input" string)
    (result (result string (error $te)))
    (canon lift (core func $m "invoke-tool") (memory $memory) (realloc $realloc)))
  (func $on_event (param "event" $event)
    (canon lift (core func $m "on-event") (memory $memory) (realloc $realloc)))
  (func $check_tool_call (param "guard" string) (param "tool" string) (param "input" string)
    (result $verdict)
    (canon lift (core func $m "check-tool-call") (memory $memory) (realloc $realloc)))
  (instance $plugin
    (export "event" (type $event))
    (export "guard-decision" (type $decision))
    (export "guard-verdict" (type $verdict))
    (export "activate-error" (type $ae))
    (export "call-error" (type $ce))
    (export "tool-error" (type $te))
    (export "activate" (func $activate))
    (export "deactivate" (func $deactivate))
    (export "handle-call" (func $handle_call))
    (export "invoke-tool" (func $invoke_tool))
    (export "on-event" (func $on_event))
    (export "check-tool-call" (func $check_tool_call)))
  (export "keel:plugin/plugin@0.4.0" (instance $plugin))
)
"#;

/// ABI 0.4.0's typed errors reach the kernel with their kind: each case of `tool-error`,
/// `call-error` and `activate-error` is its own [`PluginError`].
#[tokio::test]
async fn a_0_4_plugin_answers_with_typed_errors() {
    let host = host();
    let component = host
        .compile("typed", &wat(PLUGIN_0_4_WAT))
        .expect("compile");
    assert_eq!(
        component.report().abi_version,
        semver::Version::new(0, 4, 0)
    );
    let mut plugin = host
        .source(&component, WasmGrants::default())
        .instantiate(handle("typed"))
        .await
        .expect("instantiate");
    let c = chain("typed");
    assert_eq!(
        plugin.activate(&c, "0 no key `x`").await,
        Err(InstanceError::Returned(PluginError::InvalidConfig(
            "0 no key `x`".into()
        )))
    );
    assert_eq!(
        plugin.activate(&c, "1").await,
        Err(InstanceError::Returned(PluginError::Unavailable(
            "1".into()
        )))
    );
    plugin.activate(&c, "{}").await.expect("activate");

    let cases = [
        ("0 bad", PluginError::InvalidInput("0 bad".into())),
        ("1 which", PluginError::Unknown("1 which".into())),
        ("2 outside", PluginError::Denied("2 outside".into())),
        ("3 later", PluginError::Unavailable("3 later".into())),
        ("4 broke", PluginError::Failed("4 broke".into())),
    ];
    for (input, expected) in cases {
        assert_eq!(
            plugin.invoke_tool(&c, "t", input).await,
            Err(InstanceError::Returned(expected)),
            "tool input {input:?}"
        );
    }
    assert_eq!(plugin.invoke_tool(&c, "t", "ok ✓").await, Ok("ok ✓".into()));
    // What the model reads says the kind.
    let text = plugin
        .invoke_tool(&c, "t", "0 `text` must be a string")
        .await
        .expect_err("refused")
        .to_string();
    assert_eq!(text, "invalid input: 0 `text` must be a string");

    assert_eq!(
        plugin.handle_call(&c, "svc", "m", "0 nope").await,
        Err(InstanceError::Returned(PluginError::Unknown(
            "0 nope".into()
        )))
    );
    assert_eq!(
        plugin.handle_call(&c, "svc", "m", "1 nope").await,
        Err(InstanceError::Returned(PluginError::InvalidInput(
            "1 nope".into()
        )))
    );
    assert_eq!(
        plugin.handle_call(&c, "svc", "m", "{}").await,
        Ok("{}".into())
    );
    let verdict = plugin
        .check_tool_call(&c, "g", "t", "{}")
        .await
        .expect("verdict");
    assert_eq!(verdict.decision, crate::types::GuardDecision::Forbid);
    // Returned errors do not poison the instance.
    plugin.deactivate(&c).await.expect("deactivate");
}

#[test]
fn a_component_without_the_plugin_export_is_not_a_plugin() {
    let bytes = wat(r#"(component
        (core module $m (func (export "f")))
        (core instance $i (instantiate $m))
        (func $f (canon lift (core func $i "f")))
        (export "run" (func $f)))"#);
    let err = host().compile("lib", &bytes).expect_err("must be refused");
    assert!(matches!(err, WasmError::NotAPlugin { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("not a keel plugin"), "{text}");
    assert!(text.contains("`run`"), "{text}");
}

#[test]
fn garbage_empty_and_core_modules_are_refused_by_name() {
    let host = host();
    for (bytes, what) in [
        (Vec::new(), "empty"),
        (b"#!/bin/sh\necho hi\n".to_vec(), "not WebAssembly"),
        (wat("(module)"), "core WebAssembly module"),
    ] {
        let err = host.compile("odd", &bytes).expect_err("must be refused");
        let text = err.to_string();
        assert!(
            text.contains("plugin `odd`") && text.contains(what),
            "{text}"
        );
    }
    // A component header followed by garbage reaches the compiler, which refuses it.
    let mut broken = plugin_of_version("0.2.0");
    broken.truncate(20);
    let err = host.compile("odd", &broken).expect_err("must be refused");
    assert!(matches!(err, WasmError::Compile { .. }), "{err}");
}

#[test]
fn the_report_lists_names_and_the_abi() {
    let host = host();
    let report = inspect_component(&host, "p", &wat(PLUGIN_WAT)).expect("inspect");
    assert_eq!(report.abi_version, semver::Version::new(0, 2, 0));
    assert!(report.imports.contains(&"keel:plugin/log@0.2.0".to_owned()));
    assert!(report.imports.contains(&"wasi:io/poll@0.2.0".to_owned()));
    assert!(
        report
            .exports
            .contains(&"keel:plugin/plugin@0.2.0".to_owned())
    );
    assert!(check_imports(&report, &crate::manifest::Capabilities::default()).is_empty());
}

/// `keel plugin check` links as a load links: an import the kernel lacks, or a function a
/// known interface does not have, is a problem of the check, not a surprise at load.
#[test]
fn the_check_links_like_a_load() {
    let host = host();
    let log_import = r#"(import "keel:plugin/log@0.2.0" (instance $log"#;
    for (extra, what) in [
        (
            r#"(import "keel:plugin/backdoor@0.2.0" (instance $bd (export "open" (func (result u32)))))"#,
            "keel:plugin/backdoor@0.2.0",
        ),
        (
            r#"(import "keel:plugin/exec@0.2.0" (instance $ex (export "run-as-root" (func (result u32)))))"#,
            "run-as-root",
        ),
    ] {
        let source = PLUGIN_WAT.replacen(log_import, &format!("{extra}\n  {log_import}"), 1);
        let report = inspect_component(&host, "p", &wat(&source)).expect("inspect");
        let problems = check_imports(
            &report,
            &crate::manifest::Capabilities {
                exec: true,
                ..Default::default()
            },
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("does not link") && p.contains(what)),
            "{problems:?}"
        );
        assert!(
            host.compile("p", &wat(&source)).is_err(),
            "a load fails too"
        );
    }
}

#[test]
fn a_second_compile_is_a_cache_hit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = wat(PLUGIN_WAT);
    let host = cached_host(dir.path());
    assert_eq!(
        host.compile("p", &bytes).expect("compile").cache_status(),
        CacheStatus::Miss
    );
    assert_eq!(
        host.compile("p", &bytes).expect("compile").cache_status(),
        CacheStatus::Hit
    );
    // Another host (another process) with the same settings shares the entry.
    assert_eq!(
        cached_host(dir.path())
            .compile("p", &bytes)
            .expect("compile")
            .cache_status(),
        CacheStatus::Hit
    );
    // Bypassing the cache neither reads nor writes it.
    assert_eq!(
        host.compile_uncached("p", &bytes)
            .expect("compile")
            .cache_status(),
        CacheStatus::Disabled
    );
    only_entry(dir.path());
}

fn only_entry(dir: &std::path::Path) -> std::path::PathBuf {
    let entries: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].clone()
}

#[test]
fn a_corrupt_or_truncated_entry_is_rebuilt_not_trusted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = wat(PLUGIN_WAT);
    let host = cached_host(dir.path());
    host.compile("p", &bytes).expect("compile");
    let entry = only_entry(dir.path());

    let mut data = std::fs::read(&entry).expect("read");
    let middle = data.len() / 2;
    data[middle] ^= 0x5a;
    std::fs::write(&entry, &data).expect("write");
    assert_eq!(
        host.compile("p", &bytes).expect("compile").cache_status(),
        CacheStatus::Replaced
    );
    assert_eq!(
        host.compile("p", &bytes).expect("compile").cache_status(),
        CacheStatus::Hit
    );

    let data = std::fs::read(&entry).expect("read");
    std::fs::write(&entry, &data[..data.len() - 100]).expect("write");
    assert_eq!(
        host.compile("p", &bytes).expect("compile").cache_status(),
        CacheStatus::Replaced
    );
    std::fs::write(&entry, b"KEEL").expect("write");
    assert_eq!(
        host.compile("p", &bytes).expect("compile").cache_status(),
        CacheStatus::Replaced
    );
    assert_eq!(
        host.compile("p", &bytes).expect("compile").cache_status(),
        CacheStatus::Hit
    );
}

/// Someone who can write the cache directory (a plugin granted it, say) puts another
/// component's compiled code under this component's entry, with the header fixed up the way an
/// unkeyed checksum would allow: the MAC refuses it and the component is recompiled, so the
/// other code never runs under this plugin's name.
#[test]
fn a_forged_entry_is_recompiled_never_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = wat(PLUGIN_WAT);
    let other = wat(&PLUGIN_WAT.replacen("(i32.const 4096)", "(i32.const 8192)", 1));
    assert_ne!(victim, other);
    let host = cached_host(dir.path());
    host.compile("victim", &victim).expect("compile");
    let victim_entry = only_entry(dir.path());
    let header = std::fs::read(&victim_entry).expect("read")[..80].to_vec();
    std::fs::remove_file(&victim_entry).expect("remove");
    host.compile("other", &other).expect("compile");
    let other_entry = only_entry(dir.path());
    let other_payload = std::fs::read(&other_entry).expect("read")[80..].to_vec();
    // The forged entry: the victim's magic and key, the other payload, its length and its
    // plain SHA-256 where the MAC goes.
    let mut forged = header[..40].to_vec();
    forged.extend_from_slice(&(other_payload.len() as u64).to_le_bytes());
    forged.extend_from_slice(&<sha2::Sha256 as sha2::Digest>::digest(&other_payload));
    forged.extend_from_slice(&other_payload);
    std::fs::write(&victim_entry, &forged).expect("write");
    assert_eq!(
        host.compile("victim", &victim)
            .expect("compile")
            .cache_status(),
        CacheStatus::Replaced
    );
    assert_ne!(
        std::fs::read(&victim_entry).expect("read")[80..],
        other_payload[..],
        "the victim's entry was rewritten with its own code"
    );
}

#[test]
fn an_entry_of_other_engine_settings_is_not_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = wat(PLUGIN_WAT);
    let speed = cached_host(dir.path());
    speed.compile("p", &bytes).expect("compile");
    let speed_entry = only_entry(dir.path());

    let config = WasmHostConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..WasmHostConfig::default()
    };
    let unoptimized = WasmHost::with_engine_config(config, |c| {
        c.cranelift_opt_level(OptLevel::None);
    })
    .expect("engine");
    // Other settings, other key: a miss, never the other engine's code.
    assert_eq!(
        unoptimized
            .compile("p", &bytes)
            .expect("compile")
            .cache_status(),
        CacheStatus::Miss
    );
    let entries = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .count();
    assert_eq!(entries, 2);

    // Even copied onto this engine's file name, the other engine's entry is refused.
    let own_entry = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| *p != speed_entry)
        .expect("second entry");
    std::fs::copy(&speed_entry, &own_entry).expect("copy");
    assert_eq!(
        unoptimized
            .compile("p", &bytes)
            .expect("compile")
            .cache_status(),
        CacheStatus::Replaced
    );
}

#[tokio::test]
async fn calls_reach_the_guest_and_errors_are_returned() {
    let mut plugin = instance("echo", WasmLimits::default()).await;
    plugin
        .activate(&chain("echo"), "ok")
        .await
        .expect("activate");
    assert_eq!(
        plugin
            .handle_call(&chain("echo"), "svc", "m", "payload ✓")
            .await
            .expect("call"),
        "payload ✓"
    );
    assert_eq!(
        plugin
            .invoke_tool(&chain("echo"), "tool", "{\"a\":1}")
            .await
            .expect("tool"),
        "{\"a\":1}"
    );
    let event = crate::types::Event {
        topic: "t".into(),
        source: "keel".into(),
        payload: "{}".into(),
    };
    plugin
        .on_event(&chain("echo"), &event)
        .await
        .expect("event");
    assert_eq!(
        plugin.activate(&chain("echo"), "e").await,
        Err(InstanceError::Returned(PluginError::Failed("nope".into()))),
        "a 0.2.0 plugin's error string is adapted to a failure"
    );
    // A returned error does not poison the instance.
    plugin.deactivate(&chain("echo")).await.expect("deactivate");
}

#[tokio::test]
async fn a_spinning_guest_hits_the_cpu_limit() {
    let limits = WasmLimits {
        cpu: Duration::from_millis(200),
        ..WasmLimits::default()
    };
    let mut plugin = instance("spin-loop", limits).await;
    let started = Instant::now();
    let err = plugin
        .activate(&chain("spin-loop"), "s")
        .await
        .expect_err("must be stopped");
    let elapsed = started.elapsed();
    let InstanceError::Limit { limit, detail } = &err else {
        panic!("expected the cpu limit, got {err:?}");
    };
    assert_eq!(*limit, "cpu");
    assert!(
        detail.starts_with("it ran 0.2") && detail.contains("(limit 200 ms)"),
        "{detail}"
    );
    assert!(
        detail.contains("[limits.spin-loop] cpu-ms in keel's config"),
        "{detail}"
    );
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");

    // The instance is poisoned now.
    let again = plugin.activate(&chain("spin-loop"), "ok").await;
    assert!(
        matches!(&again, Err(InstanceError::Trap(m)) if m.contains("poisoned")),
        "{again:?}"
    );
}

#[tokio::test]
async fn waiting_is_not_guest_cpu() {
    let limits = WasmLimits {
        cpu: Duration::from_millis(200),
        ..WasmLimits::default()
    };
    let mut plugin = instance("sleeper", limits).await;
    let started = Instant::now();
    plugin
        .activate(&chain("sleeper"), "w")
        .await
        .expect("a 600 ms wait must not trip a 200 ms CPU bound");
    assert!(started.elapsed() >= Duration::from_millis(600));
}

#[tokio::test]
async fn host_imports_reach_the_handle_and_their_errors_reach_the_guest() {
    let limits = WasmLimits {
        cpu: Duration::from_millis(200),
        ..WasmLimits::default()
    };
    let mut plugin = instance("caller", limits).await;
    let started = Instant::now();
    // The handle's kernel is gone, so the kernel error travels back through the WIT variant.
    let result = plugin.activate(&chain("caller"), "c").await;
    eprintln!("services.call round trip took {:?}", started.elapsed());
    assert!(
        matches!(&result, Err(InstanceError::Returned(m)) if m.to_string().contains("kernel has shut down")),
        "{result:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_spinning_guest_does_not_starve_the_executor() {
    let limits = WasmLimits {
        cpu: Duration::from_millis(300),
        ..WasmLimits::default()
    };
    let mut plugin = instance("spin-loop", limits).await;
    let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = ticks.clone();
    let ticker = tokio::spawn(async move {
        loop {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let _ = plugin.activate(&chain("spin-loop"), "s").await;
    ticker.abort();
    // On a single-threaded runtime the other task ran only because the guest yielded.
    assert!(ticks.load(std::sync::atomic::Ordering::Relaxed) >= 5);
}

#[tokio::test]
async fn a_memory_bomb_hits_the_memory_limit() {
    let limits = WasmLimits {
        memory_bytes: 4 * 1024 * 1024,
        ..WasmLimits::default()
    };
    let mut plugin = instance("memory-bomb", limits).await;
    let err = plugin
        .activate(&chain("memory-bomb"), "m")
        .await
        .expect_err("must be stopped");
    let InstanceError::Limit { limit, detail } = &err else {
        panic!("expected the memory limit, got {err:?}");
    };
    assert_eq!(*limit, "memory");
    assert!(detail.contains("(limit 4 MiB)"), "{detail}");
    assert!(
        detail.contains("[limits.memory-bomb] memory-mib in keel's config"),
        "{detail}"
    );
}

#[tokio::test]
async fn a_trap_names_plugin_and_export_and_poisons_the_instance() {
    let mut plugin = instance("trap-activate", WasmLimits::default()).await;
    let err = plugin
        .activate(&chain("trap-activate"), "t")
        .await
        .expect_err("must trap");
    let InstanceError::Trap(message) = &err else {
        panic!("expected a trap, got {err:?}");
    };
    assert!(
        message.starts_with("plugin `trap-activate` trapped in `activate`: "),
        "{message}"
    );
    assert!(message.contains("unreachable"), "{message}");
    let again = plugin.deactivate(&chain("trap-activate")).await;
    assert!(
        matches!(&again, Err(InstanceError::Trap(m)) if m.contains("poisoned")),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_missing_granted_directory_is_a_clear_error() {
    let host = host();
    let component = host.compile("fs", &wat(PLUGIN_WAT)).expect("compile");
    let source = host.source(
        &component,
        WasmGrants {
            dirs: vec![GrantedDir {
                host: "/definitely/not/here".into(),
                guest: "/workspace".into(),
                read_only: true,
            }],
            limits: WasmLimits::default(),
            hidden: Vec::new(),
        },
    );
    let err = match source.instantiate(handle("fs")).await {
        Ok(_) => panic!("must fail"),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(
        text.contains("plugin `fs`") && text.contains("/definitely/not/here"),
        "{text}"
    );
}

#[test]
fn manifest_limits_override_the_defaults() {
    let limits = WasmLimits::default().with_manifest(&crate::manifest::Limits {
        memory_mib: Some(128),
        cpu_ms: None,
        instances: None,
    });
    assert_eq!(limits.memory_bytes, 128 * MIB);
    assert_eq!(limits.cpu, Duration::from_secs(1));
}

fn manifest(text: &str) -> crate::manifest::Manifest {
    match crate::manifest::Manifest::parse(text, std::path::Path::new("keel.toml")) {
        Ok(m) => m,
        Err(e) => panic!("test manifest: {e}"),
    }
}

fn package(
    host: &WasmHost,
    component: &WasmComponent,
    name: &str,
    op: &str,
    cpu_ms: u64,
    extra: &str,
) -> crate::PluginPackage {
    let manifest = manifest(&format!(
        "name = \"{name}\"\nversion = \"1.0.0\"\nkind = \"wasm\"\n{extra}\n\
         [limits]\ncpu-ms = {cpu_ms}\n[config]\nop = \"{op}\"\n"
    ));
    let limits = host.limits_for(&manifest.limits);
    crate::PluginPackage {
        manifest,
        source: host.source(
            component,
            WasmGrants {
                dirs: Vec::new(),
                limits,
                hidden: Vec::new(),
            },
        ),
    }
}

#[tokio::test]
async fn a_call_into_another_plugin_is_charged_to_the_chain_it_serves() {
    let host = host();
    let component = host.compile("fixture", &wat(PLUGIN_WAT)).expect("compile");
    let kernel = crate::Kernel::new(crate::KernelConfig::default());
    let needs = "[requires]\n\"slow.svc\" = \"^1\"";
    kernel
        .load(package(
            &host,
            &component,
            "slow-provider",
            "p",
            1000,
            "[provides]\n\"slow.svc\" = \"1.0.0\"",
        ))
        .await
        .expect("load provider");

    // The waiter's activate calls the provider, whose handle-call waits 600 ms on a clock:
    // a wait is nobody's guest CPU, so both stay far under their bounds.
    let started = Instant::now();
    let waiter = kernel
        .load(package(&host, &component, "waiter", "c", 100, needs))
        .await
        .expect("load waiter");
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(waiter.state.name(), "active", "{waiter:?}");

    // The burner's activate calls the provider, whose handle-call runs 150 ms of guest code:
    // well inside the provider's own limit (1 s), but charged to the chain the burner started,
    // whose account has the burner's limit (100 ms). Delegating work does not escape a bound.
    let burner = kernel
        .load(package(&host, &component, "burner", "b", 100, needs))
        .await
        .expect("load burner");
    let crate::PluginState::Failed { reason } = &burner.state else {
        panic!("the chain's CPU bound must stop the burner: {burner:?}");
    };
    assert!(
        reason.contains("used") && reason.contains("limit 100 ms") && reason.contains("burner"),
        "{reason}"
    );

    // The provider ran into the chain's bound, not a fault of its own: it is replaced by a
    // fresh instance and keeps serving.
    assert_eq!(
        kernel
            .call_service("slow.svc", "m", "hello")
            .await
            .as_deref(),
        Ok("hello")
    );
    assert_eq!(
        kernel.status("slow-provider").map(|s| s.state.name()),
        Some("active")
    );
}

#[test]
fn a_host_can_tell_whether_a_load_will_compile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = wat(PLUGIN_WAT);
    assert!(!host().is_compiled(&bytes), "no cache: every load compiles");
    let cached = cached_host(dir.path());
    assert!(!cached.is_compiled(&bytes));
    cached.compile("p", &bytes).expect("compile");
    assert!(cached.is_compiled(&bytes));
    assert!(!cached.is_compiled(&plugin_of_version("0.3.0")));
}

/// Machine code made by `engine` for `bytes`, packed as keel's build packs it.
fn shipped_code(engine: &Engine, bytes: &[u8]) -> Vec<u8> {
    let code = engine.precompile_component(bytes).expect("precompile");
    zstd::bulk::compress(&code, 3).expect("compress")
}

#[test]
fn shipped_machine_code_is_used_only_by_the_engine_that_made_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = wat(PLUGIN_WAT);
    let host = cached_host(dir.path());
    let own = shipped_code(&host.inner.engine, &bytes);
    let fingerprint = keel_engine::fingerprint(&host.inner.engine);
    // SAFETY (test): `own` is this host's engine's artifact for `bytes`.
    #[allow(unsafe_code)]
    let code = unsafe { Precompiled::new(fingerprint, &own) };
    assert!(host.runs(&code));
    let packed = zstd::bulk::compress(&bytes, 3).expect("compress");
    let ship = |code| Shipped {
        packed: &packed,
        code,
        dictionary: None,
    };
    assert!(!host.compiles(&ship(Some(code))));
    let shipped = host.compile_shipped("p", ship(Some(code))).expect("load");
    assert_eq!(shipped.cache_status(), CacheStatus::Shipped);
    assert!(
        std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .all(|e| e.path().extension().is_none_or(|x| x != "cwasm")),
        "shipped code is neither read from nor written to the cache"
    );

    // Code from an engine with other settings — here without the epoch checks that bound a
    // plugin's CPU — is never handed to this one: it compiles.
    let unbounded = WasmHost::with_engine_config(WasmHostConfig::default(), |c| {
        c.epoch_interruption(false);
    })
    .expect("engine");
    let other = shipped_code(&unbounded.inner.engine, &bytes);
    #[allow(unsafe_code)]
    let foreign =
        unsafe { Precompiled::new(keel_engine::fingerprint(&unbounded.inner.engine), &other) };
    assert!(!host.runs(&foreign));
    assert!(host.compiles(&ship(Some(foreign))));
    assert_eq!(
        host.compile_shipped("p", ship(Some(foreign)))
            .expect("compile")
            .cache_status(),
        CacheStatus::Miss
    );
    // Even claiming this engine's fingerprint, the other engine's code is refused (by
    // wasmtime's own check of its settings), and so is a damaged artifact: both compile (from
    // the cache written above).
    let damaged = {
        let mut packed = own.clone();
        packed.truncate(packed.len() / 2);
        packed
    };
    for packed in [&other, &damaged] {
        #[allow(unsafe_code)]
        let lying = unsafe { Precompiled::new(fingerprint, packed) };
        assert_eq!(
            host.compile_shipped("p", ship(Some(lying)))
                .expect("compile")
                .cache_status(),
            CacheStatus::Hit
        );
    }
    // Without machine code it is unpacked and compiled like any component.
    assert_eq!(
        host.compile_shipped("p", ship(None))
            .expect("compile")
            .cache_status(),
        CacheStatus::Hit
    );
}

/// A component exporting ABI 0.6.0's `memory` with other types than the WIT's never starts:
/// its instance is refused, naming the export, so the kernel never routes a typed call to a
/// function of another shape (and a load fails at activation, before it provides anything).
#[tokio::test]
async fn a_typed_service_export_of_another_shape_never_starts() {
    let at = PLUGIN_WAT.rfind(')').expect("the WAT ends its component");
    let text = format!(
        "{}  (func $bad_recall (canon lift (core func $main \"deactivate\")))\n  \
         (instance $memory (export \"recall\" (func $bad_recall)))\n  \
         (export \"keel:plugin/memory@0.6.0\" (instance $memory))\n)",
        &PLUGIN_WAT[..at]
    );
    let host = host();
    let grants = || WasmGrants {
        dirs: Vec::new(),
        limits: WasmLimits::default(),
        hidden: Vec::new(),
    };
    let bad = host.compile("bad-memory", &wat(&text)).expect("compile");
    let err = host
        .source(&bad, grants())
        .instantiate(handle("bad-memory"))
        .await
        .err()
        .expect("must be refused");
    let message = err.to_string();
    assert!(
        message.contains("keel:plugin/memory@0.6.0") && message.contains("type mismatch"),
        "{message}"
    );
    // The same component without the export starts: the refusal is the export's shape.
    let good = host.compile("good", &wat(PLUGIN_WAT)).expect("compile");
    assert!(
        host.source(&good, grants())
            .instantiate(handle("good"))
            .await
            .is_ok()
    );
}

/// No plugin can call the person's hooks through ABI 0.7.0's typed `hooks`: keel serves no
/// import of it, so a component importing it does not link (a load fails before anything
/// runs), whatever the types it asks for.
#[test]
fn a_component_importing_the_persons_hooks_does_not_link() {
    let text = PLUGIN_WAT.replacen(
        "(component $C\n",
        "(component $C\n  (import \"keel:plugin/hooks@0.7.0\" (instance $hooks\n    \
         (export \"post-tool-use\" (func (param \"tool\" string) (result string)))\n  ))\n",
        1,
    );
    assert_ne!(text, PLUGIN_WAT, "the import was added");
    let host = host();
    let err = host
        .compile("hooked", &wat(&text))
        .expect_err("must not link");
    let message = err.to_string();
    // Missing, not of another type: keel has no host side for it at all.
    assert!(
        message.contains("keel:plugin/hooks@0.7.0")
            && message.contains("function implementation is missing"),
        "{message}"
    );
    let report = inspect_component(&host, "hooked", &wat(&text)).expect("inspected");
    let link = report.link_error.unwrap_or_default();
    assert!(link.contains("keel:plugin/hooks@0.7.0"), "{link}");
}

/// A typed service export of another shape than keel's WIT has every function name, so it
/// links and `inspect_component` passes it; an instance refuses it, as it loads the export's
/// functions. `check_instantiation` (what `keel plugin check` runs) finds it before a load
/// does; the same plugin with its export right passes.
#[tokio::test]
async fn a_typed_export_of_another_shape_is_found_by_the_check() {
    let exporting = |ty: &str| {
        let with_export = format!(
            "  (func $wrong {ty} (canon lift (core func $main \"deactivate\")))\n  \
             (instance $hooks\n    (export \"session-start\" (func $wrong))\n    \
             (export \"post-tool-use\" (func $wrong))\n    \
             (export \"user-prompt-submit\" (func $wrong))\n    \
             (export \"stop\" (func $wrong)))\n  \
             (export \"keel:plugin/hooks@0.7.0\" (instance $hooks))\n)\n"
        );
        let end = PLUGIN_WAT.rfind(')').expect("the component closes");
        format!("{}{with_export}", &PLUGIN_WAT[..end])
    };
    let host = host();
    // Each function takes nothing and answers nothing, where keel's WIT has records.
    let wrong = wat(&exporting(""));
    let report = inspect_component(&host, "hooked", &wrong).expect("inspected");
    assert_eq!(report.link_error, None, "the names are all there: it links");
    assert!(
        report
            .exports
            .contains(&"keel:plugin/hooks@0.7.0".to_owned())
    );
    let refused = check_instantiation(&host, "hooked", &wrong)
        .await
        .expect_err("an instance refuses the export");
    assert!(
        refused.contains("keel:plugin/hooks@0.7.0")
            && refused.contains("does not have the functions and types of keel's WIT"),
        "{refused}"
    );
    // The control: the plugin without the export instantiates.
    assert_eq!(
        check_instantiation(&host, "plain", &wat(PLUGIN_WAT)).await,
        Ok(())
    );
}

/// What the check runs of a component (its start functions) is bounded as a load bounds it:
/// a start function that never returns is stopped by the CPU bound, and the check says so.
#[tokio::test]
async fn the_check_stops_a_start_function_that_never_returns() {
    let spinning = PLUGIN_WAT.replacen(
        "    (func (export \"deactivate\"))",
        "    (func $spin (loop $l (br $l)))\n    (start $spin)\n    (func (export \"deactivate\"))",
        1,
    );
    assert_ne!(spinning, PLUGIN_WAT, "the start function was added");
    let host = WasmHost::new(WasmHostConfig {
        default_limits: WasmLimits {
            cpu: Duration::from_millis(100),
            ..WasmLimits::default()
        },
        ..WasmHostConfig::default()
    })
    .expect("engine");
    let checked = tokio::time::timeout(
        Duration::from_secs(30),
        check_instantiation(&host, "spinner", &wat(&spinning)),
    )
    .await
    .expect("the check ends");
    let refused = checked.expect_err("an endless start function is refused");
    assert!(refused.contains("CPU"), "{refused}");
}
