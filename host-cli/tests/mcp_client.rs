//! keel as an MCP client: the servers of `[mcp.servers]` run in the OS sandbox and their tools
//! reach the model through keel's gates, driven by the scripted model through
//! `keel exec --json`.
//!
//! - The reference servers from npm (`@modelcontextprotocol/server-everything` and
//!   `server-filesystem`, installed by `.ci/setup` into `tests/mcp-servers`): tools listed,
//!   called, their results in the next request, progress shown, a tool the person did not
//!   allow refused without a terminal to ask on.
//! - A hostile server written with the official Python SDK (`tests/fixtures/mcp_misbehaving.py`):
//!   it never answers, crashes, floods its output, floods keel with requests while it stops
//!   reading its input, writes what is not JSON-RPC, changes its tool list, and from inside its
//!   sandbox tries to read keel's keys, write outside its granted folder and reach a host its
//!   entry does not list. Each is refused or bounded, and the session goes on.
//! - A project's `.mcp.json` (approval by content), the `keel mcp` commands, and Streamable HTTP
//!   servers (the reference server's HTTP mode; one written here that checks the bearer token
//!   and never finishes a stream).
//!
//! Homes and outside folders live under the target directory, not `/tmp`: the sandbox gives
//! every process a private `/tmp`, which would hide them for the wrong reason.

use std::path::{Path, PathBuf};

use serde_json::Value;

type R = Result<(), Box<dyn std::error::Error>>;

/// Where `.ci/setup` installed the reference servers.
fn reference_server(package: &str) -> Result<PathBuf, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/mcp-servers/node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js");
    path.canonicalize().map_err(|e| {
        format!(
            "{} is missing ({e}); `.ci/setup` installs the reference MCP servers",
            path.display()
        )
    })
}

fn hostile_server() -> Result<PathBuf, std::io::Error> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/mcp_misbehaving.py")
        .canonicalize()
}

/// `read = [...]` granting the test servers' folder: a checkout under `/tmp` is hidden by the
/// sandbox's private `/tmp` otherwise.
fn read_grant() -> Result<String, std::io::Error> {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests")
        .canonicalize()?;
    Ok(format!("read = [{:?}]\n", tests.display().to_string()))
}

/// A directory outside `/tmp`.
fn outside_tmp() -> std::io::Result<tempfile::TempDir> {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
}

/// Run `keel ARGS` with this home and workspace.
fn keel_in(home: &Path, ws: &Path, args: &[&str]) -> Result<std::process::Output, String> {
    assert_cmd::Command::cargo_bin("keel")
        .map_err(|e| e.to_string())?
        .arg("--home")
        .arg(home)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .map_err(|e| e.to_string())
}

/// Run one `keel exec --json` turn; every JSON line it printed.
fn exec(home: &Path, ws: &Path, envs: &[(&str, &str)]) -> Result<Vec<Value>, String> {
    let out = assert_cmd::Command::cargo_bin("keel")
        .map_err(|e| e.to_string())?
        .arg("--home")
        .arg(home)
        .arg("--workspace")
        .arg(ws)
        .args(["exec", "--json", "go"])
        .envs(envs.iter().copied())
        .env("NO_COLOR", "1")
        .timeout(std::time::Duration::from_secs(180))
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if lines.is_empty() {
        return Err(format!(
            "keel printed nothing: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(lines)
}

/// The tool outcomes of the session, in order: (tool, status, content).
fn outcomes(lines: &[Value]) -> Vec<(String, String, String)> {
    lines
        .iter()
        .filter(|l| l["topic"] == "session.event" && l["event"]["kind"] == "tool_outcome")
        .map(|l| {
            let o = &l["event"]["outcome"];
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (s(&o["tool"]), s(&o["status"]), s(&o["content"]))
        })
        .collect()
}

/// The tool names offered in each model request, in order.
fn offered(lines: &[Value]) -> Vec<Vec<String>> {
    lines
        .iter()
        .filter(|l| l["topic"] == "session.event" && l["event"]["kind"] == "context")
        .map(|l| {
            l["event"]["tools"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|n| n.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The texts of the tool results each request after a call carried to the model.
fn results_sent(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["topic"] == "session.event" && l["event"]["kind"] == "message")
        .filter(|l| l["event"]["message"]["role"] == "user")
        .flat_map(|l| {
            l["event"]["message"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn write_config(home: &Path, script: &str, rest: &str) -> std::io::Result<()> {
    let file = home.join("script.toml");
    std::fs::write(&file, script)?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[model]\nprovider = \"scripted\"\nscript = {:?}\n\n{rest}",
            file.display().to_string()
        ),
    )
}

/// One scripted step calling `tool` with `arguments` (TOML inline table).
fn call(tool: &str, arguments: &str) -> String {
    format!("[[step]]\n[[step.tool_calls]]\nname = \"{tool}\"\narguments = {arguments}\n\n")
}

#[test]
fn the_reference_servers_tools_are_listed_called_and_shown_with_progress() -> R {
    let everything = reference_server("server-everything")?;
    let filesystem = reference_server("server-filesystem")?;
    let home = outside_tmp()?;
    let ws = outside_tmp()?;
    let ws_path = ws.path().canonicalize()?;
    let notes = ws_path.join("notes.txt");
    let script = [
        call("mcp__everything__get_sum", "{ a = 2, b = 40 }"),
        call(
            "mcp__everything__trigger_long_running_operation",
            "{ duration = 1, steps = 3 }",
        ),
        call(
            "mcp__files__write_file",
            &format!(
                "{{ path = {:?}, content = \"written through MCP\" }}",
                notes.display().to_string()
            ),
        ),
        call(
            "mcp__files__read_text_file",
            &format!("{{ path = {:?} }}", notes.display().to_string()),
        ),
        // Not allowed in the config: it needs approval, and there is no terminal to ask on.
        call(
            "mcp__files__create_directory",
            &format!(
                "{{ path = {:?} }}",
                ws_path.join("made").display().to_string()
            ),
        ),
        "[[step]]\ntext = \"Done.\"\n".to_owned(),
    ]
    .concat();
    write_config(
        home.path(),
        &script,
        &format!(
            "[mcp.servers.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\nallow = [\"*\"]\n{read}\n\
             [mcp.servers.files]\ncommand = \"node\"\nargs = [{:?}, {:?}]\ndirs = [\".\"]\n\
             allow = [\"write_file\", \"read_text_file\"]\n{read}",
            everything.display().to_string(),
            filesystem.display().to_string(),
            ws_path.display().to_string(),
            read = read_grant()?
        ),
    )?;
    let lines = exec(home.path(), ws.path(), &[])?;
    let first = offered(&lines).into_iter().next().unwrap_or_default();
    for tool in [
        "mcp__everything__get_sum",
        "mcp__everything__trigger_long_running_operation",
        "mcp__files__read_text_file",
        "read_file",
    ] {
        assert!(first.iter().any(|t| t == tool), "{tool} offered: {first:?}");
    }
    let done = outcomes(&lines);
    assert_eq!(done.len(), 5, "{done:?}");
    // A server's result is fenced as outside content, and reaches the next request.
    let (tool, status, sum) = &done[0];
    assert_eq!(
        (tool.as_str(), status.as_str()),
        ("mcp__everything__get_sum", "ok")
    );
    assert!(
        sum.contains("<external_content") && sum.contains("42"),
        "{sum}"
    );
    let sent = results_sent(&lines);
    assert!(sent[0].contains("42"), "{sent:?}");
    // Progress notifications reach the person as events.
    let progress: Vec<&Value> = lines
        .iter()
        .filter(|l| l["topic"] == "mcp.progress")
        .collect();
    assert!(progress.len() >= 2, "progress events: {progress:?}");
    assert_eq!(progress[0]["event"]["server"], "everything");
    assert_eq!(done[1].1, "ok", "{:?}", done[1]);
    // The filesystem server writes inside its granted folder and reads back.
    assert_eq!(done[2].1, "ok", "{:?}", done[2]);
    assert_eq!(std::fs::read_to_string(&notes)?, "written through MCP");
    assert!(done[3].2.contains("written through MCP"), "{:?}", done[3]);
    // A tool the config did not allow needs approval; with nobody to ask it does not run.
    assert_eq!(done[4].1, "refused", "{:?}", done[4]);
    assert!(!ws_path.join("made").exists());
    Ok(())
}

/// A loopback HTTP server answering every request with `body`; its port.
fn http_server(body: &'static str) -> std::io::Result<u16> {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(port)
}

#[test]
fn a_hostile_server_is_bounded_restarted_and_confined() -> R {
    let server = hostile_server()?;
    let home = outside_tmp()?;
    let ws = outside_tmp()?;
    let outside = outside_tmp()?;
    let ws_path = ws.path().canonicalize()?;
    std::fs::create_dir(ws_path.join("granted"))?;
    // What keel keeps in its home: the server must not read it.
    let keys = home.path().join("keys");
    std::fs::create_dir(&keys)?;
    std::fs::write(keys.join("signing.key"), "SECRET-SIGNING-KEY")?;
    let listed = http_server("listed host answered")?;
    let unlisted = http_server("unlisted host answered")?;
    let outside_file = outside.path().join("escaped.txt");
    let script = [
        call("mcp__bad__echo", "{ text = \"one\" }"),
        call("mcp__bad__hang", "{}"),
        call("mcp__bad__echo", "{ text = \"after the hang\" }"),
        call("mcp__bad__crash", "{}"),
        call("mcp__bad__echo", "{ text = \"after the crash\" }"),
        call("mcp__bad__flood", "{}"),
        call("mcp__bad__echo", "{ text = \"after the flood\" }"),
        call("mcp__bad__garbage", "{}"),
        call("mcp__bad__echo", "{ text = \"after the garbage\" }"),
        call("mcp__bad__grow", "{}"),
        call("mcp__bad__extra", "{}"),
        call(
            "mcp__bad__steal",
            &format!(
                "{{ path = {:?} }}",
                keys.join("signing.key").display().to_string()
            ),
        ),
        call(
            "mcp__bad__write",
            &format!("{{ path = {:?} }}", outside_file.display().to_string()),
        ),
        call(
            "mcp__bad__write",
            &format!(
                "{{ path = {:?} }}",
                ws_path.join("not-granted.txt").display().to_string()
            ),
        ),
        call(
            "mcp__bad__write",
            &format!(
                "{{ path = {:?} }}",
                ws_path.join("granted/ok.txt").display().to_string()
            ),
        ),
        call(
            "mcp__bad__reach",
            &format!("{{ url = \"http://127.0.0.1:{listed}/\" }}"),
        ),
        call(
            "mcp__bad__reach",
            &format!("{{ url = \"http://127.0.0.1:{unlisted}/\" }}"),
        ),
        call("mcp__bad__secret_env", "{}"),
        "[[step]]\ntext = \"Done.\"\n".to_owned(),
    ]
    .concat();
    write_config(
        home.path(),
        &script,
        &format!(
            "[network]\nrules = [{{ host = \"127.0.0.1\", decision = \"allow\" }}]\n\
             allow_private = [\"127.0.0.1:{listed}\", \"127.0.0.1:{unlisted}\"]\n\n\
             [secrets]\nSERVER_TOKEN = \"token-for-the-server\"\n\n\
             [mcp.servers.bad]\ncommand = \"python3\"\nargs = [{:?}]\ndirs = [\"granted\"]\n\
             hosts = [\"127.0.0.1:{listed}\"]\nallow = [\"*\"]\ntimeout-ms = 2000\n\
             env = {{ SERVER_TOKEN = {{ secret = \"SERVER_TOKEN\" }} }}\n{}",
            server.display().to_string(),
            read_grant()?
        ),
    )?;
    let lines = exec(
        home.path(),
        ws.path(),
        &[("OPENAI_API_KEY", "sk-kernel-held-not-for-servers")],
    )?;
    let done = outcomes(&lines);
    let text: Vec<&str> = done.iter().map(|(_, _, c)| c.as_str()).collect();
    assert_eq!(done.len(), 18, "{done:#?}");
    assert!(text[0].contains("echo: one"), "{}", text[0]);
    // Never answers: the call's deadline ends it, the server is restarted for the next call.
    assert_eq!(done[1].1, "error", "{:?}", done[1]);
    assert!(
        text[1].contains("did not answer within 2.0 s"),
        "{}",
        text[1]
    );
    assert!(text[2].contains("echo: after the hang"), "{}", text[2]);
    // Crashes mid-call: one error result, then a fresh server.
    assert!(text[3].contains("exited (exit code 3)"), "{}", text[3]);
    assert!(text[4].contains("echo: after the crash"), "{}", text[4]);
    // Floods its output: cut off at the bound.
    assert!(
        text[5].contains("more than 4 MiB without a line end"),
        "{}",
        text[5]
    );
    assert!(text[6].contains("echo: after the flood"), "{}", text[6]);
    // Speaks something that is not JSON-RPC: given up after a bounded number of lines.
    assert!(text[7].contains("does not speak JSON-RPC"), "{}", text[7]);
    assert!(text[8].contains("echo: after the garbage"), "{}", text[8]);
    // Changes its tool list: the next request offers the new tool and not the removed one.
    assert!(text[9].contains("the tool list changed"), "{}", text[9]);
    // (A request's tool list is logged when it changes: first at the start, then after `grow`.)
    let requests = offered(&lines);
    assert_eq!(requests.len(), 2, "{requests:?}");
    let (before, after) = (&requests[0], &requests[1]);
    assert!(
        before.iter().any(|t| t == "mcp__bad__shrinkme")
            && !before.iter().any(|t| t == "mcp__bad__extra"),
        "{before:?}"
    );
    assert!(
        after.iter().any(|t| t == "mcp__bad__extra")
            && !after.iter().any(|t| t == "mcp__bad__shrinkme"),
        "{after:?}"
    );
    assert!(text[10].contains("extra tool answered"), "{}", text[10]);
    // Inside its sandbox: keel's home is empty, only the granted folder is writable, only the
    // listed host is reachable (through keel's gate), and the only secret it holds is its own.
    assert!(
        text[11].contains("refused") && !text[11].contains("SECRET-SIGNING-KEY"),
        "{}",
        text[11]
    );
    assert!(text[12].contains("refused"), "{}", text[12]);
    assert!(!outside_file.exists());
    assert!(text[13].contains("refused"), "{}", text[13]);
    assert!(!ws_path.join("not-granted.txt").exists());
    assert!(text[14].contains("WROTE"), "{}", text[14]);
    assert!(ws_path.join("granted/ok.txt").exists());
    assert!(
        text[15].contains("REACHED 200: listed host answered"),
        "{}",
        text[15]
    );
    assert!(
        text[16].contains("refused") && !text[16].contains("unlisted host answered"),
        "{}",
        text[16]
    );
    assert!(text[17].contains("SERVER_TOKEN="), "{}", text[17]);
    assert!(
        !text[17].contains("OPENAI_API_KEY") && !text[17].contains("sk-kernel-held"),
        "{}",
        text[17]
    );
    let audit = std::fs::read_to_string(home.path().join("audit.log"))?;
    assert!(
        audit.lines().any(|l| l.contains("mcp (server bad)")
            && l.contains("\"decision\":\"forbid\"")
            && l.contains("does not declare the host")),
        "the refused connection is audited: {audit}"
    );
    Ok(())
}

/// A server that stops reading its input and floods keel with requests of its own (each of
/// keel's refusals then waits on a full pipe) is held to its own `timeout-ms`, not to the
/// kernel's tool deadline; it is restarted for the next call.
#[test]
fn a_server_flooding_requests_it_never_reads_the_answers_to_is_held_to_its_deadline() -> R {
    let server = hostile_server()?;
    let home = outside_tmp()?;
    let ws = outside_tmp()?;
    let script = [
        call("mcp__bad__request_flood", "{}"),
        call("mcp__bad__echo", "{ text = \"after the request flood\" }"),
        "[[step]]\ntext = \"Done.\"\n".to_owned(),
    ]
    .concat();
    // The kernel's tool deadline is far above the server's: the call must end at the latter.
    write_config(
        home.path(),
        &script,
        &format!(
            "[timeouts]\ntool-secs = 60\n\n\
             [mcp.servers.bad]\ncommand = \"python3\"\nargs = [{:?}]\nallow = [\"*\"]\n\
             timeout-ms = 2000\n{}",
            server.display().to_string(),
            read_grant()?
        ),
    )?;
    let lines = exec(home.path(), ws.path(), &[])?;
    let done = outcomes(&lines);
    assert_eq!(done.len(), 2, "{done:#?}");
    assert_eq!(done[0].1, "error", "{:?}", done[0]);
    assert!(
        done[0].2.contains("stopped reading its input")
            && done[0].2.contains("did not answer within 2.0 s"),
        "{}",
        done[0].2
    );
    assert!(
        done[1].2.contains("echo: after the request flood"),
        "{}",
        done[1].2
    );
    Ok(())
}

/// A cloned repository's `.mcp.json` starts nothing until the person approves that content for
/// that workspace; approved, its server runs with nothing granted (every tool asks, so under
/// `auto` it runs); a changed file is not approved any more.
#[test]
fn a_projects_mcp_json_starts_nothing_until_approved() -> R {
    let server = hostile_server()?;
    let home = outside_tmp()?;
    let ws = outside_tmp()?;
    let ws_path = ws.path().canonicalize()?;
    // The repository carries its server (a project's server is granted nothing, so it must
    // lie where the sandbox lets it read: the workspace).
    std::fs::copy(&server, ws_path.join("server.py"))?;
    let project = |extra: &str| {
        format!(
            "{{\"mcpServers\": {{\"Repo_Tools\": {{\"command\": \"python3\", \"args\": [{:?}{extra}]}}}}}}",
            ws_path.join("server.py").display().to_string()
        )
    };
    std::fs::write(ws_path.join(".mcp.json"), project(""))?;
    let script = [
        call("mcp__repo_tools__echo", "{ text = \"from the project\" }"),
        call(
            "mcp__repo_tools__write",
            &format!(
                "{{ path = {:?} }}",
                ws_path.join("w.txt").display().to_string()
            ),
        ),
        "[[step]]\ntext = \"Done.\"\n".to_owned(),
    ]
    .concat();
    write_config(home.path(), &script, "[exec]\napproval = \"auto\"\n")?;
    let keel = |args: &[&str]| keel_in(home.path(), &ws_path, args);
    let offered_tools = |lines: &[Value]| offered(lines).concat();
    // Not approved: its servers do not start, and `keel mcp list` says so.
    let lines = exec(home.path(), &ws_path, &[])?;
    assert!(
        !offered_tools(&lines).iter().any(|t| t.starts_with("mcp__")),
        "{:?}",
        offered(&lines)
    );
    let list = keel(&["mcp", "list"])?;
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("NOT approved"), "{text}");
    // Approving needs a terminal or --yes.
    let refused = keel(&["mcp", "approve"])?;
    assert!(!refused.status.success());
    assert!(keel(&["mcp", "approve", "--yes"])?.status.success());
    let lines = exec(home.path(), &ws_path, &[])?;
    let done = outcomes(&lines);
    assert!(done[0].2.contains("echo: from the project"), "{done:?}");
    // It was granted no folder: the workspace is read-only to it.
    assert!(done[1].2.contains("refused"), "{done:?}");
    assert!(!ws_path.join("w.txt").exists());
    // A changed file is a new request.
    std::fs::write(ws_path.join(".mcp.json"), project(", \"--changed\""))?;
    let lines = exec(home.path(), &ws_path, &[])?;
    assert!(
        !offered_tools(&lines).iter().any(|t| t.starts_with("mcp__")),
        "{:?}",
        offered(&lines)
    );
    Ok(())
}

/// A Streamable HTTP server (the reference server in its `streamableHttp` mode, started by the
/// test on loopback): reached through the kernel's HTTP client and network gate (an audit
/// line per request), its answers and progress arriving as server-sent events.
#[test]
fn a_streamable_http_server_is_reached_through_keels_network_gate() -> R {
    use std::io::BufRead as _;
    let everything = reference_server("server-everything")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut server = std::process::Command::new("node")
        .arg(&everything)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = server.stderr.take().ok_or("stderr")?;
    let _server = Kill(server);
    // It says when it listens.
    let mut lines = std::io::BufReader::new(stderr).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("listening on port") => break,
            Some(Ok(_)) => {}
            _ => return Err("the HTTP server did not start".into()),
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let home = outside_tmp()?;
    let ws = outside_tmp()?;
    let script = [
        call("mcp__remote__get_sum", "{ a = 1, b = 2 }"),
        call(
            "mcp__remote__trigger_long_running_operation",
            "{ duration = 1, steps = 2 }",
        ),
        "[[step]]\ntext = \"Done.\"\n".to_owned(),
    ]
    .concat();
    write_config(
        home.path(),
        &script,
        &format!(
            "[secrets]\nREMOTE_TOKEN = \"token-for-the-remote\"\n\n\
             [mcp.servers.remote]\nurl = \"http://127.0.0.1:{port}/mcp\"\nallow = [\"*\"]\n\
             bearer-secret = \"REMOTE_TOKEN\"\n"
        ),
    )?;
    let lines = exec(home.path(), ws.path(), &[])?;
    let done = outcomes(&lines);
    assert_eq!(done.len(), 2, "{done:?}");
    assert_eq!(done[0].1, "ok", "{done:?}");
    assert!(done[0].2.contains("The sum of 1 and 2 is 3"), "{done:?}");
    assert_eq!(done[1].1, "ok", "{done:?}");
    assert!(
        lines.iter().any(|l| l["topic"] == "mcp.progress"),
        "progress over server-sent events"
    );
    let audit = std::fs::read_to_string(home.path().join("audit.log"))?;
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"plugin\":\"mcp\"") && l.contains("\"decision\":\"allow\"")),
        "{audit}"
    );
    assert!(!audit.contains("token-for-the-remote"), "{audit}");
    Ok(())
}

/// `keel mcp add` writes the entry (keeping the rest of the config), `keel mcp list --json`
/// starts the server and shows its tools, `keel doctor` checks it starts, `/mcp` shows it in a
/// live session until the plugin is unloaded, `keel mcp remove` takes it out again.
#[test]
fn servers_are_added_listed_checked_and_removed_from_the_command_line() -> R {
    let server = hostile_server()?;
    let home = outside_tmp()?;
    let ws = outside_tmp()?;
    write_config(
        home.path(),
        "[[step]]\ntext = \"unused\"\n",
        "# my own comment\n",
    )?;
    let keel = |args: &[&str]| keel_in(home.path(), ws.path(), args);
    let server_arg = server.display().to_string();
    let tests_dir = server
        .parent()
        .and_then(Path::parent)
        .ok_or("the tests folder")?
        .display()
        .to_string();
    let added = keel(&[
        "mcp",
        "add",
        "bad",
        "--allow",
        "echo",
        "--dir",
        "out",
        "--read",
        &tests_dir,
        "--",
        "python3",
        &server_arg,
    ])?;
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let config = std::fs::read_to_string(home.path().join("config.toml"))?;
    assert!(config.contains("# my own comment"), "{config}");
    assert!(config.contains("[mcp.servers.bad]"), "{config}");
    let again = keel(&["mcp", "add", "bad", "--", "true"])?;
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("configured already"));
    std::fs::create_dir(ws.path().join("out"))?;
    let listed = keel(&["mcp", "list", "--json"])?;
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let listed: Value = serde_json::from_slice(&listed.stdout)?;
    let bad = &listed["servers"][0];
    assert_eq!(bad["name"], "bad", "{listed}");
    assert_eq!(bad["state"], "running", "{listed}");
    assert_eq!(bad["config"]["allow"][0], "echo", "{listed}");
    let tools = bad["tools"].as_array().ok_or("tools")?;
    let echo = tools
        .iter()
        .find(|t| t["name"] == "mcp__bad__echo")
        .ok_or(format!("{listed}"))?;
    assert_eq!(echo["needs_approval"], false);
    assert!(
        tools
            .iter()
            .any(|t| t["name"] == "mcp__bad__crash" && t["needs_approval"] == true)
    );
    let doctor = keel(&["doctor"])?;
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        report.contains("MCP server `bad` starts in the sandbox and offers"),
        "{report}"
    );
    // In a live session, `/mcp` shows the same; unloading the plugin ends its server.
    let session = assert_cmd::Command::cargo_bin("keel")?
        .arg("--home")
        .arg(home.path())
        .arg("--workspace")
        .arg(ws.path())
        .arg("run")
        .write_stdin("/mcp\n/unload mcp\n/mcp\n/exit\n")
        .timeout(std::time::Duration::from_secs(120))
        .output()?;
    let stderr = String::from_utf8_lossy(&session.stderr);
    assert!(stderr.contains("bad: running (MCP 2025-11-25)"), "{stderr}");
    assert!(
        stderr.contains("mcp__bad__echo (echo), allowed without asking"),
        "{stderr}"
    );
    assert!(stderr.contains("unloaded mcp"), "{stderr}");
    assert!(
        stderr.contains("no MCP servers in this session"),
        "{stderr}"
    );
    let removed = keel(&["mcp", "remove", "bad"])?;
    assert!(removed.status.success());
    let config = std::fs::read_to_string(home.path().join("config.toml"))?;
    assert!(
        !config.contains("mcp.servers.bad") && config.contains("# my own comment"),
        "{config}"
    );
    let listed = keel(&["mcp", "list"])?;
    assert!(String::from_utf8_lossy(&listed.stdout).contains("no MCP servers are configured"));
    Ok(())
}

/// A loopback Streamable HTTP MCP server written here: it records each request's
/// `Authorization` header, answers `initialize`, `tools/list` and `tools/call` of `whoami` with
/// JSON, and answers a call of `hang` with an event stream that never carries the answer.
/// (The ACP tests pass it as an editor's server.)
pub(crate) fn recording_http_server()
-> std::io::Result<(u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>)> {
    use std::io::{BufRead as _, Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let record = record.clone();
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(stream);
                let (mut length, mut auth) = (0usize, String::new());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':') {
                        match name.to_ascii_lowercase().as_str() {
                            "content-length" => length = value.trim().parse().unwrap_or(0),
                            "authorization" => auth = value.trim().to_owned(),
                            _ => {}
                        }
                    }
                }
                let mut body = vec![0u8; length];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                record.lock().unwrap_or_else(|e| e.into_inner()).push(auth);
                let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let mut stream = reader.into_inner();
                let Some(id) = message.get("id").cloned() else {
                    let _ = stream.write_all(
                        b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    );
                    return;
                };
                let result = match message["method"].as_str() {
                    Some("initialize") => serde_json::json!({"protocolVersion": "2025-06-18",
                        "capabilities": {"tools": {}}, "serverInfo": {"name": "rec", "version": "1"}}),
                    Some("tools/list") => serde_json::json!({"tools": [
                        {"name": "whoami", "inputSchema": {"type": "object"}},
                        {"name": "hang", "inputSchema": {"type": "object"}}]}),
                    Some("tools/call") if message["params"]["name"] == "hang" => {
                        let _ = stream.write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n",
                        );
                        // Keep-alives, never the answer.
                        while stream.write_all(b": still working\n\n").is_ok() {
                            std::thread::sleep(std::time::Duration::from_millis(100));
                        }
                        return;
                    }
                    Some("tools/call") => {
                        serde_json::json!({"content": [{"type": "text", "text": "you are keel"}]})
                    }
                    _ => serde_json::json!({}),
                };
                let reply =
                    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nmcp-session-id: s-1\r\nconnection: close\r\n\r\n{reply}",
                    reply.len()
                );
            });
        }
    });
    Ok((port, seen))
}

/// The bearer token is the kernel-held secret, on every request and only to that server; a
/// server whose event stream never carries the answer costs the call its deadline.
#[test]
fn an_http_servers_token_comes_from_the_kernel_and_a_silent_stream_ends_at_the_deadline() -> R {
    let (port, seen) = recording_http_server()?;
    let home = outside_tmp()?;
    let ws = outside_tmp()?;
    let script = [
        call("mcp__rec__whoami", "{}"),
        call("mcp__rec__hang", "{}"),
        call("mcp__rec__whoami", "{}"),
        "[[step]]\ntext = \"Done.\"\n".to_owned(),
    ]
    .concat();
    write_config(
        home.path(),
        &script,
        &format!(
            "[mcp.servers.rec]\nurl = \"http://127.0.0.1:{port}/mcp\"\nallow = [\"*\"]\n\
             bearer-secret = \"REC_TOKEN\"\ntimeout-ms = 1500\n"
        ),
    )?;
    let lines = exec(home.path(), ws.path(), &[("REC_TOKEN", "tok-held-by-keel")])?;
    let done = outcomes(&lines);
    assert_eq!(done.len(), 3, "{done:?}");
    assert!(done[0].2.contains("you are keel"), "{done:?}");
    assert_eq!(done[1].1, "error", "{done:?}");
    assert!(done[1].2.contains("did not answer within"), "{done:?}");
    assert!(done[2].2.contains("you are keel"), "{done:?}");
    let seen = seen.lock().map_err(|e| e.to_string())?.clone();
    assert!(seen.len() >= 5, "{seen:?}");
    assert!(
        seen.iter().all(|a| a == "Bearer tok-held-by-keel"),
        "every request carries the kernel's secret: {seen:?}"
    );
    let stdout: String = lines.iter().map(Value::to_string).collect();
    assert!(!stdout.contains("tok-held-by-keel"));
    Ok(())
}

/// An unapproved `.mcp.json` and a project's unapproved skills are not ignored silently: `keel
/// exec` says once what it left out and how to approve it, and stops saying it once approved.
#[test]
fn ignored_project_files_are_named_once_with_how_to_approve_them() -> R {
    let home = outside_tmp()?;
    let ws = outside_tmp()?;
    let ws_path = ws.path().canonicalize()?;
    crate::common::use_scripted_model(home.path(), "[[step]]\ntext = \"Done.\"\n")?;
    std::fs::write(
        ws_path.join(".mcp.json"),
        "{\"mcpServers\": {\"repo\": {\"command\": \"python3\", \"args\": [\"server.py\"]}}}",
    )?;
    std::fs::create_dir_all(ws_path.join(".claude/skills/deploy"))?;
    std::fs::write(
        ws_path.join(".claude/skills/deploy/SKILL.md"),
        "---\nname: deploy\ndescription: d\n---\n",
    )?;
    let run = || -> Result<String, Box<dyn std::error::Error>> {
        let out = keel_in(home.path(), &ws_path, &["exec", "go"])?;
        assert!(out.status.success(), "{out:?}");
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let stderr = run()?;
    let mcp: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("ignored .mcp.json"))
        .collect();
    assert_eq!(mcp.len(), 1, "{stderr}");
    assert!(mcp[0].contains("`keel mcp approve`"), "{stderr}");
    assert!(
        stderr.contains("ignored the project's skills in .claude/skills")
            && stderr.contains("`keel skills approve`"),
        "{stderr}"
    );
    assert!(
        keel_in(home.path(), &ws_path, &["mcp", "approve", "--yes"])?
            .status
            .success()
    );
    let stderr = run()?;
    assert!(!stderr.contains("ignored .mcp.json"), "{stderr}");
    Ok(())
}
