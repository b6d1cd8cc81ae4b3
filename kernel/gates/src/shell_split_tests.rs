//! Unit tests of `kernel/gates/src/shell_split.rs`.

use super::*;

fn texts(s: &str) -> Vec<String> {
    segment_texts(s)
}

fn words(s: &str) -> Vec<Vec<String>> {
    split(s)
        .commands
        .iter()
        .map(|c| c.words.iter().map(|w| w.text.clone()).collect())
        .collect()
}

#[test]
fn splits_on_every_operator() {
    assert_eq!(
        texts("a && b || c; d | e |& f & g\nh"),
        ["a", "b", "c", "d", "e", "f", "g", "h"]
    );
}

#[test]
fn quotes_hide_operators() {
    assert_eq!(
        words(r#"echo 'a && b' "c | d" e\;f"#),
        [["echo", "a && b", "c | d", "e;f"]]
    );
}

#[test]
fn pipe_marks_next_command() {
    let p = split("curl x | sh");
    assert!(!p.commands[0].piped_input);
    assert!(p.commands[1].piped_input);
    assert!(p.commands[0].connector.is_pipe());
}

#[test]
fn groups_are_flattened_and_inherit_pipes() {
    let p = split("curl x | { cd /tmp; sh; }");
    let w: Vec<_> = p
        .commands
        .iter()
        .map(|c| (c.words.first().map(|w| w.text.clone()), c.piped_input))
        .collect();
    assert_eq!(
        w,
        [
            (Some("curl".into()), false),
            (Some("cd".into()), true),
            (Some("sh".into()), true)
        ]
    );
    assert!(p.issues.is_empty(), "{:?}", p.issues);
    let p = split("(cd /tmp && ls) > out.txt");
    assert_eq!(p.commands.len(), 3);
    assert_eq!(p.commands[2].kind, CommandKind::GroupEnd);
    assert!(p.commands[2].redirects[0].writes_file());
}

#[test]
fn substitutions_are_nested_scripts() {
    let p = split("echo $(rm -rf /tmp/x) `id` <(ls)");
    let c = &p.commands[0];
    assert_eq!(c.substitutions.len(), 3);
    assert_eq!(c.substitutions[0].source, "rm -rf /tmp/x");
    assert_eq!(c.substitutions[0].script.commands[0].words[0].text, "rm");
    assert_eq!(c.substitutions[1].kind, SubstitutionKind::Backtick);
    assert_eq!(c.substitutions[2].kind, SubstitutionKind::ProcessInput);
    assert!(c.words[1].substitution);
}

#[test]
fn nested_substitution_in_double_quotes() {
    let p = split(r#"echo "a $(echo "b $(whoami)") c""#);
    assert!(p.issues.is_empty(), "{:?}", p.issues);
    let inner = &p.commands[0].substitutions[0].script;
    assert_eq!(inner.commands[0].substitutions[0].source, "whoami");
}

#[test]
fn arithmetic_is_not_a_command() {
    let p = split("echo $((1 + 2)) && (( i++ ))");
    assert!(p.commands[0].substitutions.is_empty());
    assert_eq!(p.commands[1].kind, CommandKind::Arithmetic);
    assert!(p.issues.is_empty(), "{:?}", p.issues);
}

#[test]
fn redirects_and_fds() {
    let p = split("cargo test 2>&1 >>log.txt <in");
    let r = &p.commands[0].redirects;
    assert_eq!(r.len(), 3);
    assert_eq!(
        (r[0].fd, r[0].op, r[0].writes_file()),
        (Some(2), RedirectOp::DupOut, false)
    );
    assert_eq!(
        (r[1].op, r[1].target.text.as_str()),
        (RedirectOp::Append, "log.txt")
    );
    assert!(r[2].reads_file());
    assert_eq!(words("cargo test 2>&1"), [["cargo", "test"]]);
}

#[test]
fn heredoc_body_is_read_and_scanned() {
    let p = split("bash <<EOF\nrm -rf $(pwd)\nEOF\necho done");
    assert_eq!(p.commands.len(), 2);
    let r = &p.commands[0].redirects[0];
    assert_eq!(r.body.as_deref(), Some("rm -rf $(pwd)\n"));
    assert_eq!(p.commands[0].substitutions[0].source, "pwd");
    let q = split("cat <<'EOF'\n$(id)\nEOF");
    assert!(q.commands[0].substitutions.is_empty());
}

#[test]
fn assignments_and_keywords() {
    let p = split("FOO=1 BAR+=x env; if true; then ls; fi; for f in $(ls); do cat $f; done");
    assert_eq!(p.commands[0].assignments.len(), 2);
    let w = words("if true; then ls -l; fi");
    assert_eq!(
        w,
        vec![
            vec!["true".to_string()],
            vec!["ls".to_string(), "-l".to_string()]
        ]
    );
    assert_eq!(
        p.commands
            .iter()
            .filter(|c| c.kind == CommandKind::Control)
            .count(),
        1
    );
}

#[test]
fn fork_bomb_structure_is_split() {
    let p = split(":(){ :|:& };:");
    assert!(
        p.commands
            .iter()
            .any(|c| c.kind == CommandKind::FunctionHeader)
    );
    assert!(p.issues.is_empty(), "{:?}", p.issues);
}

#[test]
fn ansi_c_strings_decode() {
    assert_eq!(words(r"$'\x72\x6d' -rf $'\101'"), [["rm", "-rf", "A"]]);
}

#[test]
fn issues_are_reported_not_panicked() {
    for s in [
        "echo 'abc",
        "echo \"abc",
        "echo $(ls",
        "echo `ls",
        "( ls",
        "ls >",
        "&& ls",
        "a ) b",
    ] {
        let p = split(s);
        assert!(!p.issues.is_empty(), "{s}");
    }
    let deep = "$(".repeat(50) + &")".repeat(50);
    let p = split(&deep);
    fn has_deep(p: &ParsedScript) -> bool {
        p.issues.iter().any(|i| i.kind == IssueKind::TooDeep)
            || p.commands
                .iter()
                .any(|c| c.substitutions.iter().any(|s| has_deep(&s.script)))
    }
    assert!(has_deep(&p));
}

#[test]
fn dbracket_operators_are_words() {
    assert_eq!(
        words("[[ a < b && -f c ]] && ls"),
        [vec!["[[", "a", "<", "b", "&&", "-f", "c", "]]"], vec!["ls"]]
    );
}

#[test]
fn spans_index_the_source() {
    let s = "  git status -s &&  cargo test ";
    let p = split(s);
    assert_eq!(&s[p.commands[0].span.clone()], "git status -s");
    assert_eq!(&s[p.commands[1].span.clone()], "cargo test");
}
