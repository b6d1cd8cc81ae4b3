//! Unit tests of `kernel/gates/src/redact.rs`.

use super::*;
use proptest::prelude::*;

fn r(text: &str) -> String {
    redact(text, &[])
}

#[test]
fn known_secrets_are_replaced_everywhere() {
    let key = "s3cr3t-value-123";
    assert_eq!(
        redact(&format!("a {key} b {key}{key} c"), &[key]),
        "a [REDACTED] b [REDACTED] c"
    );
    assert_eq!(
        redact("prefix-s3cr3t-value-123-suffix", &[key]),
        "prefix-[REDACTED]-suffix"
    );
    // Shorter than eight characters: ignored.
    assert_eq!(
        redact("the cat sat", &["cat", "", "sevench"]),
        "the cat sat"
    );
    // Eight characters count in chars, not bytes.
    assert_eq!(redact("x ключключ y", &["ключключ"]), "x [REDACTED] y");
    assert_eq!(redact("x ключклю y", &["ключклю"]), "x ключклю y");
    // Overlapping occurrences and overlapping secrets are covered whole.
    assert_eq!(redact("aaaaaaaaaaa", &["aaaaaaaa"]), "[REDACTED]");
    assert_eq!(
        redact("x abcdefgh12345678 y", &["abcdefgh", "abcdefgh12345678"]),
        "x [REDACTED] y"
    );
    assert_eq!(
        redact("x ABCDEFGHIJ y", &["CDEFGHIJ", "ABCDEFGH"]),
        "x [REDACTED] y"
    );
    // Case matters for known secrets.
    assert_eq!(redact("ABCDEFGHIJ", &["abcdefghij"]), "ABCDEFGHIJ");
}

#[test]
fn generic_patterns() {
    let cases: &[(&str, &str)] = &[
        (
            "Authorization: Bearer abc.def-ghi_jkl~+/=",
            "Authorization: Bearer [REDACTED]",
        ),
        (
            "authorization: bearer xyz\nnext",
            "authorization: bearer [REDACTED]\nnext",
        ),
        ("BEARER\tTOKEN123 tail", "BEARER\t[REDACTED] tail"),
        (
            "curl -H 'Authorization: Bearer eyJhbGciOi.x.y'",
            "curl -H 'Authorization: Bearer [REDACTED]'",
        ),
        ("Bearer", "Bearer"),
        ("Bearer ", "Bearer "),
        ("NotBearer abc", "NotBearer abc"),
        ("x-api-key: abc123", "x-api-key: [REDACTED]"),
        (
            "X-Api-Key:abc123\r\nHost: x",
            "X-Api-Key:[REDACTED]\r\nHost: x",
        ),
        ("x-goog-api-key: AAA", "x-goog-api-key: [REDACTED]"),
        (
            "https://x.com/v1?api_key=abc123&q=1",
            "https://x.com/v1?api_key=[REDACTED]&q=1",
        ),
        ("?apikey=abc;", "?apikey=[REDACTED];"),
        (
            r#"{"api_key": "abc\"def", "other": 1}"#,
            r#"{"api_key": "[REDACTED]", "other": 1}"#,
        ),
        (r#"{'api-key':'v'}"#, r#"{'api-key':'[REDACTED]'}"#),
        ("OPENAI_API_KEY=hunter22", "OPENAI_API_KEY=[REDACTED]"),
        (
            "access_token=abc&refresh_token=def",
            "access_token=[REDACTED]&refresh_token=[REDACTED]",
        ),
        ("client_secret: \"x y z\"", "client_secret: \"[REDACTED]\""),
        ("api_key_id=123", "api_key_id=123"),
        ("myapikey=123", "myapikey=123"),
        ("api_key is required", "api_key is required"),
        ("api_key=", "api_key="),
        ("api_key: \"\"", "api_key: \"\""),
        // Key shapes.
        ("key sk-abcdefghijklmnopqrst1234 end", "key [REDACTED] end"),
        ("sk-proj-AbCdEfGhIjKlMnOpQrStUv_-12", "[REDACTED]"),
        ("sk-abcdefghijklmnopqrs", "sk-abcdefghijklmnopqrs"),
        ("sk-ant-api03-abc", "[REDACTED]"),
        ("sk-ant-abc", "sk-ant-abc"),
        (
            "task-aaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "task-aaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ),
        (
            "token=ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "token=[REDACTED]",
        ),
        ("ghp_short", "ghp_short"),
        ("github_pat_11ABCDEFG0123456789_abcdefghij", "[REDACTED]"),
        ("id AKIAIOSFODNN7EXAMPLE.", "id [REDACTED]."),
        ("ASIAIOSFODNN7EXAMPLE", "[REDACTED]"),
        ("AKIAIOSFODNN7EXAMPL", "AKIAIOSFODNN7EXAMPL"),
        ("AKIAIOSFODNN7EXAMPLEX", "AKIAIOSFODNN7EXAMPLEX"),
        ("AKIAIOSFODNN7EXAMPLEx", "AKIAIOSFODNN7EXAMPLEx"),
        ("AIzaSyA-0123456789abcdefghijklmnopqrstu", "[REDACTED]"),
        ("xoxb-1234567890-abcdef", "[REDACTED]"),
        (
            "plain text, nothing here: sk- ghp_ AKIA",
            "plain text, nothing here: sk- ghp_ AKIA",
        ),
        ("[REDACTED]", "[REDACTED]"),
        ("", ""),
    ];
    for (input, want) in cases {
        let got = r(input);
        assert_eq!(got, *want, "{input}");
        assert_eq!(r(&got), got, "not idempotent on {input}");
    }
}

#[test]
fn idempotent_in_awkward_cases() {
    // A redaction that exposes a new match is handled in the same call.
    let once = redact("abcdefghsk-AAAAAAAAAAAAAAAAAAAAAAAA", &["abcdefgh"]);
    assert_eq!(once, "[REDACTED][REDACTED]");
    assert_eq!(redact(&once, &["abcdefgh"]), once);
    // Secrets that overlap the marker itself cannot grow the text forever.
    for secret in ["[REDACTED", "REDACTED]", "ED][REDA", "[REDACTED]"] {
        for text in [
            "[REDACTED]",
            "x[REDACTED",
            "REDACTED]]",
            "[REDACTED][REDACTED",
        ] {
            let once = redact(text, &[secret]);
            assert_eq!(redact(&once, &[secret]), once, "{secret} / {text}");
        }
    }
    assert_eq!(redact("x[REDACTED", &["[REDACTED"]), "x[REDACTED]");
}

#[test]
fn non_ascii_text_survives() {
    let text = "ошибка: Bearer токен😀 и api_key=значение😀, sk-ééééééééééééééééééééé";
    let out = r(text);
    assert_eq!(
        out,
        "ошибка: Bearer токен😀 и api_key=[REDACTED], sk-ééééééééééééééééééééé"
    );
    assert_eq!(r(&out), out);
    assert_eq!(
        redact("é\"api_key\": \"😀\\é\"", &[]),
        "é\"api_key\": \"[REDACTED]\""
    );
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::from("Bearer ")),
        Just(String::from("authorization: bearer\t")),
        Just(String::from("x-api-key: ")),
        Just(String::from("\"api_key\": \"")),
        Just(String::from("api_key=")),
        Just(String::from("sk-")),
        Just(String::from("sk-ant-")),
        Just(String::from("ghp_")),
        Just(String::from("AKIA")),
        Just(String::from("[REDACTED]")),
        Just(String::from("[REDACTED")),
        Just(String::from("REDACTED]")),
        Just(String::from("\\\"")),
        "[A-Za-z0-9_-]{0,30}",
        "[ =:\"'&\n]{0,3}",
        any::<String>(),
    ]
}

proptest! {
    #[test]
    fn never_panics_on_arbitrary_text(text in any::<String>(), secret in any::<String>()) {
        let once = redact(&text, &[secret.as_str()]);
        prop_assert_eq!(redact(&once, &[secret.as_str()]), once);
    }

    #[test]
    fn idempotent_on_secret_shaped_text(
        parts in prop::collection::vec(fragment(), 0..12),
        secrets in prop::collection::vec("[A-Za-z0-9_\\[\\]-]{6,12}", 0..3),
    ) {
        let text = parts.concat();
        let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
        let once = redact(&text, &secrets);
        prop_assert_eq!(redact(&once, &secrets), once.clone());
        for s in secrets.iter().filter(|s| s.chars().count() >= MIN_SECRET_CHARS) {
            // No known secret survives outside a marker.
            prop_assert!(!once.split(REDACTED).any(|seg| seg.contains(s)), "{} in {}", s, once);
        }
    }
}

#[test]
fn a_dumped_environment_loses_its_secret_looking_values_in_the_log() {
    let dump = "PATH=/usr/bin HOME=/home/me\nGITHUB_TOKEN=abc123notashape\n\
                AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n\
                PGPASSWORD=hunter22 NPM_AUTH_TOKEN=x LANG=C.UTF-8 MY_KEY_NAME=visible";
    let logged = redact_log(dump, &[]);
    for secret in [
        "abc123notashape",
        "wJalrXUtnFEMI",
        "hunter22",
        "NPM_AUTH_TOKEN=x",
    ] {
        assert!(!logged.contains(secret), "{secret} kept in {logged}");
    }
    for kept in [
        "PATH=/usr/bin",
        "HOME=/home/me",
        "LANG=C.UTF-8",
        "MY_KEY_NAME=visible",
    ] {
        assert!(logged.contains(kept), "{kept} lost in {logged}");
    }
    assert!(logged.contains("GITHUB_TOKEN=[REDACTED]"), "{logged}");
    // Lower-case code is not an environment: only `redact`'s own patterns apply to it.
    assert_eq!(
        redact_log("let token = next();", &[]),
        "let token = next();"
    );
    assert_eq!(
        redact_log("held: s3cr3t-value-123", &["s3cr3t-value-123"]),
        "held: [REDACTED]"
    );
    assert_eq!(redact_log(&logged, &[]), logged, "idempotent");
}
