use super::*;
use keel_protocol::ExecRecord;
use serde_json::json;

/// `(sentence, tests claim phrase, build claim phrase)`.
const CLAIM_TABLE: &[(&str, Option<&str>, Option<&str>)] = &[
    // Claims.
    ("All tests pass.", Some("All tests pass"), None),
    (
        "I fixed the parser and all tests pass now.",
        Some("all tests pass"),
        None,
    ),
    (
        "The tests are passing.",
        Some("The tests are passing"),
        None,
    ),
    (
        "The test suite passes.",
        Some("The test suite passes"),
        None,
    ),
    (
        "After the fix, the tests now pass.",
        Some("the tests now pass"),
        None,
    ),
    ("✅ tests", Some("✅ tests"), None),
    (
        "Result: all 42 tests passed",
        Some("all 42 tests passed"),
        None,
    ),
    (
        "Ran `cargo test`: 17 tests passed",
        Some("17 tests passed"),
        None,
    ),
    (
        "Everything compiles cleanly and all tests pass.",
        Some("all tests pass"),
        Some("Everything compiles cleanly"),
    ),
    ("The build succeeds.", None, Some("The build succeeds")),
    (
        "cargo build succeeded, and the build is green.",
        None,
        Some("build succeeded"),
    ),
    (
        "The crate builds successfully on stable.",
        None,
        Some("builds successfully"),
    ),
    (
        "It now compiles without errors.",
        None,
        Some("It now compiles without errors"),
    ),
    (
        "I can confirm all tests pass.",
        Some("all tests pass"),
        None,
    ),
    (
        "I didn't touch the docs, and all tests pass.",
        Some("all tests pass"),
        None,
    ),
    (
        "The new test passes, and the build succeeded.",
        Some("The new test passes"),
        Some("the build succeeded"),
    ),
    (
        "I haven’t run the tests, but the build succeeds.",
        None,
        Some("the build succeeds"),
    ),
    (
        "When I ran them, all tests passed.",
        Some("all tests passed"),
        None,
    ),
    ("All\n tests   pass", Some("All tests pass"), None),
    // Negations.
    ("The tests do not pass yet.", None, None),
    ("Not all tests pass.", None, None),
    ("The tests still fail.", None, None),
    ("I could not verify the tests pass.", None, None),
    ("I haven't run the tests.", None, None),
    ("I'm unsure whether all tests pass.", None, None),
    ("The build failed; tests fail too.", None, None),
    ("It doesn't compile cleanly yet.", None, None),
    ("I have not verified that the build succeeds.", None, None),
    ("The build never succeeds on CI.", None, None),
    // Hedges, plans, conditionals and questions.
    ("The tests should pass now.", None, None),
    ("Once you run the tests, all tests pass.", None, None),
    ("All tests pass once you run the migrations.", None, None),
    ("I changed the fixture to make the tests pass.", None, None),
    ("Please verify that all tests pass.", None, None),
    ("If you rebuild, the build succeeds.", None, None),
    ("Do all tests pass?", None, None),
    ("Hopefully the build succeeds.", None, None),
    ("Let me make sure all tests pass.", None, None),
    ("All tests pass except test_io.", None, None),
    ("We need the build succeeds check in CI.", None, None),
    ("I attested the passes were fine.", None, None),
];

#[test]
fn claim_table() {
    assert!(CLAIM_TABLE.len() >= 30);
    let mut wrong = Vec::new();
    for &(sentence, tests, build) in CLAIM_TABLE {
        let claims = detect_claims(sentence);
        let get = |d: Dimension| {
            claims
                .iter()
                .find(|c| c.dimension == d)
                .map(|c| c.phrase.as_str())
        };
        let got = (get(Dimension::Tests), get(Dimension::Build));
        if got != (tests, build) {
            wrong.push(format!(
                "{sentence:?}: got {got:?}, want {:?}",
                (tests, build)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_first_affirmative_phrase_wins() {
    let claims = detect_claims("Not all tests pass at first. After the fix all tests pass.");
    assert_eq!(
        claims,
        [Claim {
            dimension: Dimension::Tests,
            phrase: "all tests pass".into()
        }]
    );
}

#[test]
fn splits_compound_commands_quote_aware() {
    let segs = split_commands("cd crate && cargo test -- --nocapture; echo 'a && b' | tee x\nmake");
    let texts: Vec<&str> = segs.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "cd crate",
            "cargo test -- --nocapture",
            "echo 'a && b'",
            "tee x",
            "make"
        ]
    );
    let segs = split_commands("cargo test 2>&1 | head; npm run dev & cargo build &> log || true");
    let shown: Vec<(&str, bool)> = segs
        .iter()
        .map(|s| (s.text.as_str(), s.background))
        .collect();
    assert_eq!(
        shown,
        [
            ("cargo test 2>&1", false),
            ("head", false),
            ("npm run dev", true),
            ("cargo build &> log", false),
            ("true", false)
        ]
    );
}

#[test]
fn verification_commands() {
    use Dimension::{Build, Tests};
    let table: &[(&str, &[Dimension])] = &[
        ("cargo test", &[Tests]),
        ("cargo +nightly test --workspace", &[Tests]),
        ("cargo nextest run", &[Tests]),
        ("RUST_BACKTRACE=1 cargo test", &[Tests]),
        ("FOO=1 BAR='a b' cargo test -p x", &[Tests]),
        ("env RUST_LOG=debug cargo test", &[Tests]),
        ("cd crate && cargo test", &[Tests]),
        ("cargo build && cargo test", &[Build, Tests]),
        ("cargo check 2>&1 | tail -20", &[Build]),
        ("cargo test &", &[]),
        ("cargo clippy", &[]),
        ("cargo install ripgrep", &[]),
        ("echo cargo test", &[]),
        ("echo 'cargo test && x'", &[]),
        ("npm test", &[Tests]),
        ("npm run test:unit", &[Tests]),
        ("npm run build", &[Build]),
        ("npm run dev", &[]),
        ("pnpm build", &[Build]),
        ("yarn test", &[Tests]),
        ("pytest -q tests/", &[Tests]),
        ("python3 -m pytest", &[Tests]),
        ("uv run pytest -x", &[Tests]),
        ("python script.py", &[]),
        ("go test ./...", &[Tests]),
        ("go build ./cmd/x", &[Build]),
        ("go run .", &[]),
        ("make", &[Build]),
        ("make -j4", &[Build]),
        ("make -C sub test", &[Tests]),
        ("make install", &[]),
        ("make clean", &[]),
        ("mvn -q test", &[Tests]),
        ("./mvnw package", &[Build]),
        ("./gradlew build", &[Build]),
        ("gradle test", &[Tests]),
        ("ctest --output-on-failure", &[Tests]),
        ("tox -e py311", &[Tests]),
        ("npx jest", &[Tests]),
        ("time cargo build --release", &[Build]),
        ("cmake --build build", &[Build]),
    ];
    for &(command, expected) in table {
        assert_eq!(command_dimensions(command), expected, "{command}");
    }
    assert!(is_verification("cd a && cargo test", Tests));
    assert!(!is_verification("cd a && cargo test", Build));
}

fn call(id: &str, tool: &str, input: serde_json::Value, status: OutcomeStatus) -> TurnCall {
    TurnCall {
        call_id: id.into(),
        tool: tool.into(),
        input,
        outcome: ToolOutcome {
            call_id: id.into(),
            tool: tool.into(),
            status,
            content: String::new(),
            exec: vec![],
            spill: None,
        },
    }
}

#[test]
fn find_replay_takes_the_last_eligible_call() {
    let calls = vec![
        call(
            "c1",
            "exec_shell",
            json!({"command": "cargo test"}),
            OutcomeStatus::Error,
        ),
        call(
            "c2",
            "exec_shell",
            json!({"command": "cargo build"}),
            OutcomeStatus::Ok,
        ),
        call(
            "c3",
            "exec_shell",
            json!({"command": "cargo test -p a"}),
            OutcomeStatus::Ok,
        ),
        call(
            "c4",
            "read_file",
            json!({"command": "cargo test"}),
            OutcomeStatus::Ok,
        ),
        call(
            "c5",
            "exec_shell",
            json!({"command": "cargo test", "background": true}),
            OutcomeStatus::Ok,
        ),
        call(
            "c6",
            "exec_shell",
            json!({"command": "cargo te"}),
            OutcomeStatus::NotExecuted,
        ),
        call(
            "c7",
            "exec_shell",
            json!({"command": "cargo test"}),
            OutcomeStatus::NotExecuted,
        ),
        call(
            "c8",
            "exec_shell",
            json!({"command": "ls"}),
            OutcomeStatus::Ok,
        ),
    ];
    let found = |d| find_replay(&calls, d).map(|c| c.call_id.as_str());
    assert_eq!(found(Dimension::Tests), Some("c3"));
    assert_eq!(found(Dimension::Build), Some("c2"));
    assert_eq!(find_replay(&calls[3..], Dimension::Tests), None);
}

fn outcome(
    status: OutcomeStatus,
    exit: Option<i32>,
    timed_out: bool,
    content: &str,
) -> ToolOutcome {
    ToolOutcome {
        call_id: "r1".into(),
        tool: "exec_shell".into(),
        status,
        content: content.into(),
        exec: vec![ExecRecord {
            command: "cargo test".into(),
            exit_code: exit,
            timed_out,
            sandbox: None,
        }],
        spill: None,
    }
}

#[test]
fn verdicts_from_replays() {
    let claim = Claim {
        dimension: Dimension::Tests,
        phrase: "all tests pass".into(),
    };
    let original = call(
        "c7",
        "exec_shell",
        json!({"command": "cargo test"}),
        OutcomeStatus::Ok,
    );

    let pass = judge(
        &claim,
        &original,
        &outcome(OutcomeStatus::Ok, Some(0), false, "ok"),
    );
    assert_eq!(pass.status, VerdictStatus::VerifiedPass);
    assert_eq!(pass.failure_type, None);
    assert_eq!(pass.command.as_deref(), Some("cargo test"));
    assert_eq!(pass.call_id.as_deref(), Some("c7"));

    let fail = judge(
        &claim,
        &original,
        &outcome(
            OutcomeStatus::Error,
            Some(101),
            false,
            "test a ... FAILED\nfailures: a",
        ),
    );
    assert_eq!(fail.status, VerdictStatus::VerifiedFail);
    assert_eq!(fail.exit_code, Some(101));
    assert_eq!(fail.failure_type.as_deref(), Some("test-failure"));
    let notice = verdict_notice(&fail);
    assert!(
        notice.starts_with(
            "[keel verifier] Your claim \"all tests pass\" was checked by re-running `cargo test` (call c7): exit 101 — FAILED (test-failure)."
        ),
        "{notice}"
    );
    assert!(
        notice.contains("Output head:\ntest a ... FAILED"),
        "{notice}"
    );

    let compile = judge(
        &claim,
        &original,
        &outcome(
            OutcomeStatus::Error,
            Some(101),
            false,
            "error[E0308]: mismatched types",
        ),
    );
    assert_eq!(compile.failure_type.as_deref(), Some("build-failure"));

    let timeout = judge(
        &claim,
        &original,
        &outcome(OutcomeStatus::Error, None, true, ""),
    );
    assert_eq!(timeout.status, VerdictStatus::VerifyError);
    assert_eq!(timeout.failure_type.as_deref(), Some("timeout"));
    assert!(verdict_notice(&timeout).contains("could not be verified"));

    let mut refused = outcome(OutcomeStatus::Refused, None, false, "denied");
    refused.exec.clear();
    let refused = judge(&claim, &original, &refused);
    assert_eq!(refused.status, VerdictStatus::VerifyError);
    assert_eq!(refused.failure_type.as_deref(), Some("refused"));

    let none = unsubstantiated(&claim);
    assert_eq!(none.status, VerdictStatus::Unsubstantiated);
    assert_eq!(none.command, None);
    let notice = verdict_notice(&none);
    assert!(notice.contains("unsubstantiated"), "{notice}");
    assert!(notice.contains("cargo test"), "{notice}");
}

#[test]
fn evidence_is_bounded() {
    let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
    let e = evidence(&long);
    assert_eq!(e.lines().count(), EVIDENCE_LINES + 1);
    assert!(e.ends_with("\n…"));
    let wide = "é".repeat(5000);
    let e = evidence(&wide);
    assert!(e.len() <= EVIDENCE_BYTES + 4, "{}", e.len());
    assert_eq!(evidence("short"), "short");
}

fn verdict(status: VerdictStatus) -> Verdict {
    Verdict {
        status,
        dimension: "tests".into(),
        claim: "all tests pass".into(),
        command: Some("cargo test".into()),
        call_id: Some("c1".into()),
        exit_code: Some(0),
        evidence: String::new(),
        failure_type: None,
    }
}

#[test]
fn ledger_appends_and_stats_tolerate_a_torn_last_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("evolution/verdicts.jsonl");
    for (i, status) in [
        VerdictStatus::VerifiedPass,
        VerdictStatus::VerifiedPass,
        VerdictStatus::VerifiedPass,
        VerdictStatus::VerifiedFail,
        VerdictStatus::VerifyError,
        VerdictStatus::Unsubstantiated,
        VerdictStatus::Unsubstantiated,
    ]
    .into_iter()
    .enumerate()
    {
        append_verdict(&path, i as u64, "s1", &verdict(status)).expect("appends");
    }
    let mut bytes = fs::read(&path).expect("reads");
    let (entries, skipped) = parse_ledger(&bytes);
    assert_eq!((entries.len(), skipped), (7, 0));
    assert_eq!(entries[3].session, "s1");
    assert_eq!(entries[3].time_ms, 3);
    assert_eq!(entries[3].verdict.status, VerdictStatus::VerifiedFail);

    bytes.extend_from_slice(br#"{"time_ms":9,"session":"s1","status":"verified-pa"#);
    fs::write(&path, &bytes).expect("tears");
    let s = stats_from_ledger(&fs::read(&path).expect("reads"));
    assert_eq!(
        (
            s.verified_pass,
            s.verified_fail,
            s.verify_error,
            s.unsubstantiated,
            s.skipped_lines
        ),
        (3, 1, 1, 2, 1)
    );
    assert_eq!(s.total(), 7);
    assert_eq!(s.claim_match_rate(), Some(0.75));

    // The next append closes the torn line off instead of gluing onto it.
    append_verdict(&path, 10, "s2", &verdict(VerdictStatus::VerifiedFail)).expect("appends");
    let s = stats_from_ledger(&fs::read(&path).expect("reads"));
    assert_eq!((s.verified_fail, s.skipped_lines), (2, 1));
    assert_eq!(s.claim_match_rate(), Some(0.6));
}

#[test]
fn claim_match_rate_is_none_without_checked_claims() {
    let s = VerdictStats {
        unsubstantiated: 4,
        verify_error: 2,
        ..VerdictStats::default()
    };
    assert_eq!(s.claim_match_rate(), None);
    assert_eq!(stats(&[]).claim_match_rate(), None);
}
