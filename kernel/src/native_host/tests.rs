//! Unit tests of the native host's pieces that need no library: the version check, the JSON
//! protocol, the host callback (against a kernel that has shut down) and the trust checks.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Weak;

use serde_json::{Value, json};

use super::abi::{KeelBuf, check_abi_version};
use super::host_calls::HostDoor;
use super::library::{FileId, remember_loaded, unchanged_since_loaded};
use super::protocol::{HostRequest, PluginRequest, PluginResponse};
use super::{NATIVE_ABI_VERSION, NativeError, open};
use crate::host_api::HostHandle;
use crate::manifest::Manifest;
use crate::types::{Event, Level};

#[test]
fn abi_version_one_is_hosted_and_others_are_refused_naming_both() {
    assert_eq!(NATIVE_ABI_VERSION, 1);
    assert_eq!(
        check_abi_version("echo", Path::new("/p/libecho.so"), 1),
        Ok(())
    );
    for found in [0, 2, u32::MAX] {
        let e = check_abi_version("echo", Path::new("/p/libecho.so"), found);
        let Err(e) = e else {
            panic!("version {found} should be refused");
        };
        assert!(matches!(e, NativeError::AbiMismatch { found: f, supported: 1, .. } if f == found));
        let message = e.to_string();
        for part in [
            "`echo`",
            "/p/libecho.so",
            &format!("version {found}"),
            "hosts version 1",
        ] {
            assert!(message.contains(part), "{message} should mention {part}");
        }
    }
}

#[test]
fn plugin_requests_have_the_documented_shape() -> Result<(), serde_json::Error> {
    let event = Event {
        topic: "a.b".into(),
        source: "keel".into(),
        payload: "p".into(),
    };
    let cases = [
        (
            PluginRequest::Activate { config: "{}" },
            json!({"op":"activate","config":"{}"}),
        ),
        (PluginRequest::Deactivate, json!({"op":"deactivate"})),
        (
            PluginRequest::HandleCall {
                service: "s",
                method: "m",
                payload: "p",
            },
            json!({"op":"handle_call","service":"s","method":"m","payload":"p"}),
        ),
        (
            PluginRequest::InvokeTool {
                name: "t",
                input: "{}",
            },
            json!({"op":"invoke_tool","name":"t","input":"{}"}),
        ),
        (
            PluginRequest::OnEvent { event: &event },
            json!({"op":"on_event","event":{"topic":"a.b","source":"keel","payload":"p"}}),
        ),
    ];
    for (request, expected) in cases {
        assert_eq!(
            serde_json::to_value(&request)?,
            expected,
            "{}",
            request.op()
        );
        assert_eq!(expected["op"], request.op());
    }
    Ok(())
}

#[test]
fn plugin_responses_are_parsed_strictly() {
    let parse = |s: &str| serde_json::from_str::<PluginResponse>(s).ok();
    assert_eq!(parse(r#"{"ok":null}"#), Some(PluginResponse::Ok(None)));
    assert_eq!(
        parse(r#"{"ok":"x"}"#),
        Some(PluginResponse::Ok(Some("x".into())))
    );
    assert_eq!(
        parse(r#"{"err":"no"}"#),
        Some(PluginResponse::Err("no".into()))
    );
    for bad in [
        "",
        "null",
        "{}",
        r#"{"ok":1}"#,
        r#"{"ok":"a","err":"b"}"#,
        r#"{"oops":"a"}"#,
        "\u{0}",
    ] {
        assert_eq!(parse(bad), None, "{bad:?} should be refused");
    }
}

#[test]
fn host_requests_parse_every_op_and_refuse_unknown_fields() -> Result<(), serde_json::Error> {
    let parse = |v: Value| serde_json::from_value::<HostRequest>(v);
    assert_eq!(
        parse(json!({"op":"log","level":"warn","message":"m"}))?,
        HostRequest::Log {
            level: Level::Warn,
            message: "m".into()
        }
    );
    assert_eq!(
        parse(json!({"op":"call","name":"s","method":"m","payload":"p"}))?,
        parse(json!({"op":"call","service":"s","method":"m","payload":"p"}))?
    );
    assert_eq!(
        parse(json!({"op":"state_set","key":"k","value":[104,105]}))?,
        HostRequest::StateSet {
            key: "k".into(),
            value: b"hi".to_vec()
        }
    );
    assert_eq!(parse(json!({"op":"state_keys"}))?, HostRequest::StateKeys);
    let spec = json!({"name":"t","description":"d","input_schema":"{}",
        "capabilities":{"reads_files":true,"writes_files":false,"executes_code":false,"network":false},
        "parallel_safe":false});
    assert!(
        matches!(parse(json!({"op":"register_tool","spec":spec}))?, HostRequest::RegisterTool { spec } if spec.capabilities.reads_files)
    );
    for bad in [
        json!({"op":"provide","name":"s","version":"1.0.0","extra":1}),
        json!({"op":"explode"}),
        json!({"op":"state_set","key":"k","value":[256]}),
        json!({"op":"state_set","key":"k","value":"aGk="}),
        json!({"name":"s"}),
    ] {
        assert!(parse(bad.clone()).is_err(), "{bad} should be refused");
    }
    Ok(())
}

/// Send `request` through the callback table of a door whose kernel has shut down.
fn ask(door: &HostDoor, request: &[u8]) -> Value {
    // SAFETY (test): the table is valid while `door` lives; `request` is valid for the call.
    let api = unsafe { &*door.api() };
    // SAFETY (test): ctx comes from the same table; the request buffer is valid.
    let buf = unsafe { (api.call)(api.ctx, request.as_ptr(), request.len()) };
    assert!(
        !buf.ptr.is_null(),
        "the host never answers with a null buffer"
    );
    // SAFETY (test): the host's answer holds `len` bytes until freed below.
    let bytes = unsafe { std::slice::from_raw_parts(buf.ptr, buf.len) }.to_vec();
    // SAFETY (test): a buffer the host returned, released once.
    unsafe { (api.free)(buf) };
    serde_json::from_slice(&bytes).expect("the host answers with JSON")
}

fn dead_door() -> HostDoor {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime for the test");
    HostDoor::new(
        HostHandle::new(Weak::new(), "echo", 1),
        runtime.handle().clone(),
    )
}

#[test]
fn host_callback_answers_every_request_with_json() {
    let door = dead_door();
    assert_eq!(
        ask(&door, br#"{"op":"log","level":"info","message":"hi"}"#),
        json!({"ok":null})
    );
    assert_eq!(ask(&door, br#"{"op":"state_keys"}"#), json!({"ok":[]}));
    assert_eq!(
        ask(&door, br#"{"op":"state_get","key":"k"}"#),
        json!({"ok":null})
    );
    assert_eq!(
        ask(&door, br#"{"op":"provide","name":"a.b","version":"1.0.0"}"#)["err"]["kind"],
        "unavailable"
    );
    for bad in [&b"not json"[..], b"", br#"{"op":"explode"}"#] {
        let answer = ask(&door, bad);
        assert_eq!(answer["err"]["kind"], "invalid", "{answer}");
        let message = answer["err"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("docs/native-plugins.md"), "{message}");
    }
}

#[test]
fn host_callback_refuses_null_pointers() {
    let door = dead_door();
    // SAFETY (test): the table is valid while `door` lives.
    let api = unsafe { &*door.api() };
    for (ctx, ptr, len) in [
        (std::ptr::null_mut(), b"{}".as_ptr(), 2),
        (api.ctx, std::ptr::null(), 5),
    ] {
        // SAFETY (test): null pointers are exactly what is being checked; nothing is read.
        let buf = unsafe { (api.call)(ctx, ptr, len) };
        // SAFETY (test): the host's answer holds `len` bytes until freed below.
        let bytes = unsafe { std::slice::from_raw_parts(buf.ptr, buf.len) }.to_vec();
        // SAFETY (test): released once.
        unsafe { (api.free)(buf) };
        let answer: Value = serde_json::from_slice(&bytes).expect("JSON");
        assert_eq!(answer["err"]["kind"], "invalid", "{answer}");
    }
    // Freeing a null buffer is a no-op.
    // SAFETY (test): null is documented as ignored.
    unsafe {
        (api.free)(KeelBuf {
            ptr: std::ptr::null_mut(),
            len: 0,
        })
    };
}

#[tokio::test]
async fn a_panic_while_serving_becomes_an_error_answer() {
    // `call` blocks on the runtime; doing that on a runtime thread panics inside the
    // callback. The panic must come back as an answer, not unwind into the plugin.
    let door = HostDoor::new(
        HostHandle::new(Weak::new(), "echo", 1),
        tokio::runtime::Handle::current(),
    );
    let answer = ask(
        &door,
        br#"{"op":"call","service":"a.b","method":"m","payload":""}"#,
    );
    assert_eq!(answer["err"]["kind"], "failed", "{answer}");
    assert!(
        answer["err"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("panicked"),
        "{answer}"
    );
}

fn manifest(kind: &str, extra: &str) -> Manifest {
    let text = format!("name = \"echo\"\nversion = \"0.1.0\"\nkind = \"{kind}\"\n{extra}");
    Manifest::parse(&text, Path::new("echo/keel.toml")).expect("test manifest parses")
}

#[test]
fn untrusted_wasm_and_unenforceable_manifests_are_refused_before_loading() {
    // The file does not exist: each refusal must come before anything is loaded.
    let file = Path::new("/nonexistent/libecho.so");
    let trusted: BTreeSet<String> = ["echo".to_owned()].into();

    let e = open(&manifest("native", ""), file, &BTreeSet::new()).err();
    assert!(matches!(&e, Some(NativeError::Untrusted { .. })), "{e:?}");
    let message = e.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains(
            "native plugin `echo` runs with your full user rights; to trust it add `native = [\"echo\"]` under [trust] in ~/.keel/config.toml"
        ) && message.contains("/nonexistent/libecho.so"),
        "{message}"
    );

    let e = open(&manifest("wasm", ""), file, &trusted).err();
    assert!(matches!(&e, Some(NativeError::NotNative { .. })), "{e:?}");

    let e = open(
        &manifest("native", "[limits]\ncpu-ms = 10\n"),
        file,
        &trusted,
    )
    .err();
    assert!(
        matches!(&e, Some(NativeError::Unenforceable { what, .. }) if what.contains("cpu-ms")),
        "{e:?}"
    );
    let e = open(
        &manifest("native", "[capabilities]\nnetwork = [\"example.com\"]\n"),
        file,
        &trusted,
    )
    .err();
    assert!(
        matches!(&e, Some(NativeError::Unenforceable { what, .. }) if what.contains("network")),
        "{e:?}"
    );

    let e = open(
        &manifest("native", "[capabilities]\nexec = true\n"),
        file,
        &trusted,
    )
    .err();
    assert!(
        matches!(&e, Some(NativeError::Load { .. })),
        "exec is kernel-mediated, so allowed: {e:?}"
    );
    let message = e.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("`echo`") && message.contains("/nonexistent/libecho.so"),
        "{message}"
    );
}

#[test]
fn a_library_path_that_changed_since_it_was_loaded_is_refused() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("libchanging.so");
    std::fs::write(&file, b"first build")?;
    let first = FileId::of(&file)?;
    assert!(
        unchanged_since_loaded(&file, &first),
        "a path never loaded is fine"
    );
    remember_loaded(&file, first.clone());
    assert!(unchanged_since_loaded(&file, &first));

    std::fs::write(&file, b"second, longer build")?;
    let second = FileId::of(&file)?;
    assert_ne!(first, second);
    assert!(
        !unchanged_since_loaded(&file, &second),
        "the loader would hand back the first build"
    );
    // The first record stays: loading the changed file does not make it the reference.
    remember_loaded(&file, second.clone());
    assert!(!unchanged_since_loaded(&file, &second));

    let other = dir.path().join("libother.so");
    std::fs::write(&other, b"x")?;
    assert!(unchanged_since_loaded(&other, &FileId::of(&other)?));
    Ok(())
}
