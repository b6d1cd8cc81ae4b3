//! Unit tests of `kernel/gates/src/approvals.rs`.

use super::*;
use crate::exec_policy::ExecPolicy;
use std::sync::Arc;

type R = Result<(), Box<dyn std::error::Error>>;

fn caps(writes: bool, exec: bool) -> ToolCapabilities {
    ToolCapabilities {
        reads_files: true,
        writes_files: writes,
        executes_code: exec,
        network: false,
    }
}

fn verdict(d: Decision, cmd: &str) -> Verdict {
    let mut v = ExecPolicy::builtin().check("true");
    v.decision = d;
    v.command = cmd.to_owned();
    v
}

struct Fixed(Answer, Mutex<Vec<ApprovalRequest>>);

impl Approver for Fixed {
    fn ask(&self, request: &ApprovalRequest) -> Answer {
        lock(&self.1).push(request.clone());
        self.0
    }
}

fn fixed(a: Answer) -> Fixed {
    Fixed(a, Mutex::new(Vec::new()))
}

struct Env {
    _home: tempfile::TempDir,
    ws: tempfile::TempDir,
    store_path: PathBuf,
}

fn env() -> Result<Env, Box<dyn std::error::Error>> {
    let home = tempfile::tempdir()?;
    let ws = tempfile::tempdir()?;
    let store_path = home.path().join(".keel").join("approvals.json");
    Ok(Env {
        _home: home,
        ws,
        store_path,
    })
}

fn open(e: &Env) -> Result<GrantStore, ApprovalError> {
    GrantStore::open(&e.store_path, e.ws.path()).map(|(s, _)| s)
}

#[test]
fn derivation_table() {
    use Approval::*;
    assert_eq!(Approval::from_capabilities(&caps(false, false)), Automatic);
    assert_eq!(Approval::from_capabilities(&caps(true, false)), Suggested);
    assert_eq!(Approval::from_capabilities(&caps(false, true)), Required);
    assert_eq!(Approval::from_capabilities(&caps(true, true)), Required);

    let ask = Requirement::Ask { can_always: false };
    assert_eq!(
        required_approval(&caps(false, false), None),
        Requirement::Proceed
    );
    assert_eq!(required_approval(&caps(true, false), None), ask);
    assert_eq!(required_approval(&caps(false, true), None), ask);
    for c in [caps(false, true), caps(true, true)] {
        let allow = verdict(Decision::Allow, "ls");
        assert_eq!(required_approval(&c, Some(&allow)), Requirement::Proceed);
        let prompt = verdict(Decision::Prompt, "cargo build");
        assert_eq!(
            required_approval(&c, Some(&prompt)),
            Requirement::Ask { can_always: true }
        );
        let forbidden = verdict(Decision::Forbid, "rm -rf /");
        assert!(matches!(
            required_approval(&c, Some(&forbidden)),
            Requirement::Refuse { .. }
        ));
    }
}

#[test]
fn policy_approver_and_deny_all() {
    let req = ApprovalRequest {
        tool: "shell".into(),
        summary: "cargo build".into(),
        key: Some("cargo build".into()),
        reason: "unknown".into(),
        can_always: true,
        preview: None,
        requester: None,
    };
    assert_eq!(PolicyApprover(ApprovalMode::Auto).ask(&req), Answer::Once);
    assert_eq!(PolicyApprover(ApprovalMode::Ask).ask(&req), Answer::Deny);
    assert_eq!(PolicyApprover(ApprovalMode::Never).ask(&req), Answer::Deny);
    assert_eq!(DenyAll.ask(&req), Answer::Deny);
}

#[test]
fn session_keys_cover_flags_rejections_are_exact() {
    let policy = ExecPolicy::builtin();
    let s = SessionApprovals::new();
    let key = policy.approval_key("cargo build").expect("key");
    assert!(s.approve(&key));
    let release = policy.check("cargo build --release");
    let release_key = policy.approval_key("cargo build --release").expect("key");
    assert!(s.is_approved(&release_key, &release));
    let test_key = policy.approval_key("cargo test").expect("key");
    assert!(!s.is_approved(&test_key, &policy.check("cargo test")));

    s.reject("cargo build --release");
    assert!(s.is_rejected("cargo build --release"));
    assert!(!s.is_rejected("cargo build"));
    assert!(!s.is_rejected("cargo build  --release"));
    assert!(!s.is_approved(&release_key, &release));
    assert!(s.is_approved(&key, &policy.check("cargo build")));
    // Forbidden verdicts are never covered, whatever key is passed.
    assert!(!s.is_approved(&key, &verdict(Decision::Forbid, "cargo build")));
}

#[test]
fn forbidden_never_offered_always_nor_auto_approved() -> R {
    let e = env()?;
    let store = open(&e)?;
    store.grant(e.ws.path(), "rm")?;
    let policy = ExecPolicy::builtin();
    let cmd = "rm -rf /";
    let v = policy.decide(cmd);
    assert_eq!(v.decision, Decision::Forbid);
    assert_eq!(policy.approval_key(cmd), None);
    assert!(!store.is_granted(e.ws.path(), "rm", &v));
    let session = SessionApprovals::new();
    session.approve("rm");
    let approver = fixed(Answer::Always);
    let gate = Approvals {
        session: &session,
        grants: Some(&store),
        workspace: e.ws.path(),
        approver: &approver,
    };
    let r = gate.authorize("shell", &caps(true, true), cmd, Some("rm"), Some(&v), None);
    assert!(matches!(r.outcome, Outcome::Refused { .. }));
    assert!(
        lock(&approver.1).is_empty(),
        "a forbidden command is never asked about"
    );
    Ok(())
}

#[test]
fn authorize_flow_session_and_always() -> R {
    let e = env()?;
    let store = open(&e)?;
    let policy =
        ExecPolicy::from_toml("[exec]\nrules = [{ prefix = \"cargo\", decision = \"prompt\" }]")?;
    let session = SessionApprovals::new();
    let cmd = "cargo build";
    let v = policy.decide(cmd);
    assert_eq!(v.decision, Decision::Prompt, "{}", v.reason);
    let key = policy.approval_key(cmd);
    let always = fixed(Answer::Always);
    let gate = Approvals {
        session: &session,
        grants: Some(&store),
        workspace: e.ws.path(),
        approver: &always,
    };
    let r = gate.authorize(
        "shell",
        &caps(false, true),
        cmd,
        key.as_deref(),
        Some(&v),
        None,
    );
    assert_eq!(r.outcome, Outcome::Run);
    assert!(lock(&always.1)[0].can_always);
    assert_eq!(store.list(e.ws.path())?, vec!["cargo build".to_owned()]);

    // A fresh session with a denying approver still runs it: the grant persists.
    let session2 = SessionApprovals::new();
    let gate2 = Approvals {
        session: &session2,
        grants: Some(&store),
        workspace: e.ws.path(),
        approver: &DenyAll,
    };
    let cmd2 = "cargo build --release";
    let key2 = policy.approval_key(cmd2);
    let r = gate2.authorize(
        "shell",
        &caps(false, true),
        cmd2,
        key2.as_deref(),
        Some(&policy.decide(cmd2)),
        None,
    );
    assert_eq!(r.outcome, Outcome::Run);
    // Denied exactly, then refused without asking again.
    let t = "cargo test";
    let r = gate2.authorize(
        "shell",
        &caps(false, true),
        t,
        policy.approval_key(t).as_deref(),
        Some(&policy.decide(t)),
        None,
    );
    assert!(matches!(r.outcome, Outcome::Refused { .. }));
    assert!(session2.is_rejected(t));

    // Non-command writes: never offered "always"; Always is downgraded to Session.
    let write = fixed(Answer::Always);
    let gate3 = Approvals {
        approver: &write,
        ..gate2
    };
    let input = serde_json::json!({"path": "src/main.rs", "content": "fn main() {}\n"});
    let r = gate3.authorize(
        "write_file",
        &caps(true, false),
        "src/main.rs",
        None,
        None,
        Preview::of(&input),
    );
    assert_eq!(r.outcome, Outcome::Run);
    assert!(!lock(&write.1)[0].can_always);
    // The approver is shown what the tool was asked to write.
    assert_eq!(
        lock(&write.1)[0].preview,
        Some(Preview::Write {
            path: "src/main.rs".into(),
            content: "fn main() {}\n".into()
        })
    );
    Ok(())
}

#[cfg(unix)]
#[test]
fn file_mode_is_0600_and_no_temp_files_left() -> R {
    use std::os::unix::fs::PermissionsExt;
    let e = env()?;
    let store = open(&e)?;
    store.grant(e.ws.path(), "cargo build")?;
    store.grant(e.ws.path(), "make")?;
    store.revoke(e.ws.path(), "make")?;
    let mode = fs::metadata(&e.store_path)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let dir = e.store_path.parent().expect("parent");
    let mut names: Vec<String> = fs::read_dir(dir)?
        .map(|d| d.map(|d| d.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    assert_eq!(names, vec!["approvals.json", "approvals.json.lock"]);
    Ok(())
}

#[test]
fn two_stores_merge() -> R {
    let e = env()?;
    let a = open(&e)?;
    let b = open(&e)?;
    a.grant(e.ws.path(), "cargo build")?;
    b.grant(e.ws.path(), "make")?;
    let c = open(&e)?;
    assert_eq!(
        c.list(e.ws.path())?,
        vec!["cargo build".to_owned(), "make".to_owned()]
    );
    Ok(())
}

#[test]
fn revoke_is_not_resurrected_by_stale_writer() -> R {
    let e = env()?;
    let a = open(&e)?;
    a.grant(e.ws.path(), "cargo build")?;
    let b = open(&e)?; // b's view holds the grant
    assert_eq!(b.list(e.ws.path())?, vec!["cargo build".to_owned()]);
    a.revoke(e.ws.path(), "cargo build")?;
    b.grant(e.ws.path(), "make")?; // writes its stale view merged with disk
    let c = open(&e)?;
    assert_eq!(c.list(e.ws.path())?, vec!["make".to_owned()]);
    let v = verdict(Decision::Prompt, "cargo build");
    assert!(!b.is_granted(e.ws.path(), "cargo build", &v));
    // A deliberate re-grant after the revoke is newer and wins.
    b.grant(e.ws.path(), "cargo build")?;
    assert!(a.is_granted(e.ws.path(), "cargo build", &v));
    // A hand deletion of the file is respected: nothing is written back from memory.
    fs::remove_file(&e.store_path)?;
    a.grant(e.ws.path(), "ninja")?;
    assert_eq!(b.list(e.ws.path())?, vec!["ninja".to_owned()]);
    Ok(())
}

#[test]
fn merge_tombstone_beats_older_grant() {
    let entry = |granted, stamp| Entry {
        granted,
        stamp,
        at: 0,
    };
    let doc = |e: Entry| Doc {
        version: DOC_VERSION,
        clock: e.stamp,
        workspaces: BTreeMap::from([("/ws".to_owned(), BTreeMap::from([("make".to_owned(), e)]))]),
    };
    let get = |d: &Doc| d.workspaces["/ws"]["make"].clone();
    // A stale grant merged into a newer tombstone does not resurrect it.
    let mut disk = doc(entry(false, 5));
    disk.merge(&doc(entry(true, 3)));
    assert_eq!(get(&disk), entry(false, 5));
    assert_eq!(disk.clock, 5);
    // On equal stamps the tombstone wins, whichever side it is on.
    let mut d = doc(entry(true, 4));
    d.merge(&doc(entry(false, 4)));
    assert!(!get(&d).granted);
    let mut d = doc(entry(false, 4));
    d.merge(&doc(entry(true, 4)));
    assert!(!get(&d).granted);
    // A newer grant (a deliberate re-grant) wins over an older tombstone.
    let mut d = doc(entry(false, 4));
    d.merge(&doc(entry(true, 6)));
    assert!(get(&d).granted);
}

#[test]
fn corrupt_file_is_empty_with_warning_and_kept() -> R {
    let e = env()?;
    fs::create_dir_all(e.store_path.parent().expect("parent"))?;
    fs::write(&e.store_path, "{ not json")?;
    let (store, warnings) = GrantStore::open(&e.store_path, e.ws.path())?;
    assert_eq!(warnings.len(), 1);
    assert!(store.list(e.ws.path())?.is_empty());
    let w = store.grant(e.ws.path(), "make")?;
    assert!(w.iter().any(|w| w.message.contains("corrupt-")), "{w:?}");
    let dir = e.store_path.parent().expect("parent");
    let kept: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|d| d.path())
        .filter(|p| p.to_string_lossy().contains("approvals.json.corrupt-"))
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(fs::read_to_string(&kept[0])?, "{ not json");
    assert_eq!(store.list(e.ws.path())?, vec!["make".to_owned()]);
    Ok(())
}

#[test]
fn store_inside_workspace_refused() -> R {
    let e = env()?;
    let inside = e.ws.path().join(".keel").join("approvals.json");
    let err = GrantStore::open(&inside, e.ws.path()).expect_err("refused");
    assert!(
        matches!(err, ApprovalError::StoreInsideWorkspace { .. }),
        "{err}"
    );
    assert!(!e.ws.path().join(".keel").exists());
    Ok(())
}

/// `--home ../h` from the workspace: a sibling, not inside, though its unnormalised path
/// starts with the workspace's.
#[test]
fn a_store_beside_the_workspace_named_through_dot_dot_is_accepted() -> R {
    let parent = tempfile::tempdir()?;
    let ws = parent.path().join("ws");
    fs::create_dir(&ws)?;
    let ws = fs::canonicalize(&ws)?;
    let beside = ws.join("..").join("h").join("approvals.json");
    let (store, _) = GrantStore::open(&beside, &ws)?;
    store.grant(&ws, "cargo build")?;
    assert!(parent.path().join("h").join("approvals.json").is_file());
    let inside = ws
        .join("sub")
        .join("..")
        .join(".keel")
        .join("approvals.json");
    assert!(matches!(
        GrantStore::open(&inside, &ws),
        Err(ApprovalError::StoreInsideWorkspace { .. })
    ));
    Ok(())
}

#[test]
fn lexical_normalisation() {
    for (given, want) in [
        ("/a/b/../c", "/a/c"),
        ("/a/./b/", "/a/b"),
        ("/../a", "/a"),
        ("a/../../b", "../b"),
        ("a/..", ""),
    ] {
        assert_eq!(
            normalize_lexically(Path::new(given)),
            PathBuf::from(want),
            "{given}"
        );
    }
}

/// A writer killed between writing its temp file and renaming it leaves `.approvals.json.tmp-…`;
/// the next change (under the lock) removes it.
#[test]
fn a_killed_writers_temp_file_is_removed_by_the_next_change() -> R {
    let e = env()?;
    let store = open(&e)?;
    store.grant(e.ws.path(), "make")?;
    let dir = e.store_path.parent().expect("parent");
    let stale = dir.join(".approvals.json.tmp-999999-0");
    fs::write(&stale, "{\"half")?;
    store.grant(e.ws.path(), "cargo test")?;
    assert!(!stale.exists(), "the stale temp file is removed");
    assert_eq!(store.list(e.ws.path())?.len(), 2);
    Ok(())
}

#[test]
fn grants_are_bound_to_the_workspace() -> R {
    let e = env()?;
    let other = tempfile::tempdir()?;
    let store = open(&e)?;
    store.grant(e.ws.path(), "make")?;
    assert!(store.grant(other.path(), "make").is_err());
    let v = verdict(Decision::Prompt, "make");
    assert!(store.is_granted(e.ws.path(), "make", &v));
    assert!(!store.is_granted(other.path(), "make", &v));
    let never = v.clone().under(ApprovalMode::Never);
    assert!(!store.is_granted(e.ws.path(), "make", &never));
    Ok(())
}

#[test]
fn concurrent_writers_lose_nothing() -> R {
    let e = Arc::new(env()?);
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let e = Arc::clone(&e);
            std::thread::spawn(move || -> Result<(), String> {
                let store = open(&e).map_err(|x| x.to_string())?;
                for i in 0..20 {
                    store
                        .grant(e.ws.path(), &format!("tool{t} job{i}"))
                        .map_err(|x| x.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "writer thread panicked")??;
    }
    let store = open(&e)?;
    assert_eq!(store.list(e.ws.path())?.len(), 160);
    Ok(())
}

/// Says no, and what to do instead.
struct SaysInstead(&'static str);

impl Approver for SaysInstead {
    fn ask(&self, _request: &ApprovalRequest) -> Answer {
        Answer::Deny
    }

    fn ask_why(&self, request: &ApprovalRequest) -> (Answer, Option<String>) {
        (self.ask(request), Some(self.0.to_owned()))
    }
}

#[test]
fn what_the_person_says_with_a_no_reaches_the_refusal_bounded() {
    let policy = ExecPolicy::builtin();
    let cmd = "touch x1.txt";
    let v = policy.decide(cmd);
    let long = "x".repeat(INSTEAD_MAX + 500);
    let long: &'static str = Box::leak(long.into_boxed_str());
    for (said, expect) in [
        (
            "use mkdir -p out instead",
            Some("and said: use mkdir -p out instead"),
        ),
        ("   ", None),
        (long, Some("and said: xxx")),
    ] {
        // A fresh session each time: a no is remembered for the exact command.
        let session = SessionApprovals::new();
        let approver = SaysInstead(said);
        let gate = Approvals {
            session: &session,
            grants: None,
            workspace: std::path::Path::new("/ws"),
            approver: &approver,
        };
        let key = policy.approval_key(cmd);
        let r = gate.authorize(
            "shell",
            &caps(true, true),
            cmd,
            key.as_deref(),
            Some(&v),
            None,
        );
        let Outcome::Refused { reason } = r.outcome else {
            panic!("a no runs nothing: {:?}", r.outcome);
        };
        match expect {
            Some(text) => assert!(reason.contains(text), "{reason}"),
            None => assert_eq!(reason, format!("the user denied `{cmd}`")),
        }
        assert!(
            reason.len() <= INSTEAD_MAX + 100,
            "bounded: {}",
            reason.len()
        );
    }
}

#[test]
fn a_file_call_is_previewed_from_its_arguments() {
    let edit = serde_json::json!({
        "path": "a.rs", "old_string": "x", "new_string": "y", "replace_all": true
    });
    assert_eq!(
        Preview::of(&edit),
        Some(Preview::Edit {
            path: "a.rs".into(),
            old: "x".into(),
            new: "y".into(),
            all: true
        })
    );
    // No path, or neither content nor a replacement: nothing to preview.
    assert_eq!(Preview::of(&serde_json::json!({"content": "x"})), None);
    assert_eq!(Preview::of(&serde_json::json!({"path": "a.rs"})), None);
    assert_eq!(
        Preview::of(&serde_json::json!({"path": 3, "content": "x"})),
        None
    );
}
