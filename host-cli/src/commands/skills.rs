//! `keel skills`: the skills a session here offers (`list`), and the person's approval of a
//! workspace's own skills (`approve`, `revoke`). A cloned repository's `.keel/skills/` and
//! `.claude/skills/` are instructions someone else wrote, so the `skills` plugin offers them
//! only in a workspace the person approved, and only as they were approved: an approval names
//! the SHA-256 of the skill folders' content (`project_approvals`), so an edited `SKILL.md`, a
//! new file or a new skill folder asks again. The approvals live in keel's sealed home
//! (`skill-approvals.json`), out of every plugin's and command's reach.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;
use keel_agent_kit::skills;
use serde::Serialize;

use crate::config::{Context, UserConfig};
use crate::project_approvals;
use crate::session::terminal_safe;

/// Where a project keeps its skills, relative to the workspace.
pub const PROJECT_DIRS: &[&str] = &[".keel/skills", ".claude/skills"];

#[derive(Subcommand)]
pub enum SkillsCommand {
    /// The skills a session in this workspace offers, and the project's that wait for approval.
    List {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Offer this workspace's own skills (`.keel/skills/`, `.claude/skills/`) in its sessions.
    Approve {
        /// Approve without asking (for scripts).
        #[arg(long)]
        yes: bool,
    },
    /// Stop offering this workspace's own skills.
    Revoke,
}

/// The person's approvals of a workspace's skills, by the digest of its skill folders.
fn store(home: &Path) -> project_approvals::Store {
    project_approvals::Store::new(home, "skill-approvals.json")
}

/// The digest of this workspace's skill folders, `None` when it has no skills there.
fn skills_digest(workspace: &Path) -> Option<String> {
    project_approvals::digest(workspace, PROJECT_DIRS)
}

/// Whether the person approved this workspace's skills as they are now: an edited `SKILL.md`,
/// a file added to a skill or a new skill folder asks again.
pub fn is_approved(home: &Path, workspace: &Path) -> bool {
    skills_digest(workspace).is_some_and(|d| store(home).is_approved(workspace, &d))
}

/// Tell the `skills` plugin whether this workspace's skills are approved (`[config.skills]
/// project`); the person's own `project = true` there approves every workspace.
pub fn configure_skills_plugin(home: &Path, workspace: &Path, config: &mut UserConfig) {
    if is_approved(home, workspace) {
        config
            .config
            .entry("skills".to_owned())
            .or_default()
            .insert("project".into(), toml::Value::Boolean(true));
    }
}

/// One skill found on disk.
#[derive(Serialize)]
struct Found {
    name: String,
    description: String,
    origin: &'static str,
    path: PathBuf,
    offered: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
}

fn scan(root: &Path, origin: &'static str, offered: bool, out: &mut Vec<Found>) {
    for (dir, head) in skills::scan(root) {
        let path = dir.join(skills::SKILL_FILE);
        let taken = |name: &str| out.iter().any(|f| f.name == name && f.problem.is_none());
        let found = match head {
            Ok(head) => {
                let problem = taken(&head.name)
                    .then(|| "the name is taken by another skill; left out".to_owned());
                Found {
                    offered: offered && problem.is_none(),
                    name: head.name,
                    description: head.description,
                    origin,
                    path,
                    problem,
                }
            }
            Err(e) => Found {
                name: dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                description: String::new(),
                origin,
                path,
                offered: false,
                problem: Some(e),
            },
        };
        out.push(found);
    }
}

pub fn run(ctx: &Context, cmd: SkillsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SkillsCommand::List { json } => list(ctx, json),
        SkillsCommand::Approve { yes } => approve(ctx, yes),
        SkillsCommand::Revoke => {
            store(&ctx.home).set(&ctx.workspace, None)?;
            stdoutln!(
                "{}'s own skills are no longer offered",
                ctx.workspace.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn list(ctx: &Context, json: bool) -> anyhow::Result<ExitCode> {
    let user_dir = ctx.data_dir().join("skills");
    let approved = ctx
        .config
        .config
        .get("skills")
        .and_then(|c| c.get("project"))
        == Some(&toml::Value::Boolean(true));
    let mut found = Vec::new();
    scan(&user_dir, "user", true, &mut found);
    for dir in PROJECT_DIRS {
        scan(&ctx.workspace.join(dir), "project", approved, &mut found);
    }
    if json {
        stdoutln!(
            "{}",
            serde_json::json!({
                "user_dir": user_dir,
                "project_approved": approved,
                "skills": found,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    let changed = !approved && store(&ctx.home).has_any(&ctx.workspace);
    stdoutln!("your skills: {}", user_dir.display());
    for f in &found {
        let state = match (&f.problem, f.offered) {
            (Some(p), _) => format!("left out: {p}"),
            (None, true) => "offered".into(),
            (None, false) if changed => {
                "changed since you approved this workspace's skills: waits for `keel skills \
                 approve`"
                    .into()
            }
            (None, false) => "waits for `keel skills approve`".into(),
        };
        stdoutln!(
            "  {} ({}, {state}): {}",
            terminal_safe(&f.name),
            f.origin,
            terminal_safe(&f.description)
        );
        stdoutln!("    {}", f.path.display());
    }
    if found.is_empty() {
        stdoutln!(
            "  none; a skill is a folder with a SKILL.md (front matter `name:` and `description:`)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn approve(ctx: &Context, yes: bool) -> anyhow::Result<ExitCode> {
    let shown = skills_digest(&ctx.workspace).unwrap_or_default();
    let mut found = Vec::new();
    for dir in PROJECT_DIRS {
        scan(&ctx.workspace.join(dir), "project", false, &mut found);
    }
    if found.is_empty() {
        bail!(
            "{} has no skills in {}; nothing to approve",
            ctx.workspace.display(),
            PROJECT_DIRS.join(" or ")
        );
    }
    stdoutln!("This workspace's skills, instructions its authors wrote for the agent:");
    for f in &found {
        stdoutln!(
            "  {}: {}",
            terminal_safe(&f.name),
            terminal_safe(&f.description)
        );
    }
    if !yes && !crate::commands::confirm("Offer this workspace's skills in its sessions?")? {
        stdoutln!("not approved");
        return Ok(ExitCode::FAILURE);
    }
    // Only what was shown is approved: a change while the person was asked approves nothing.
    if skills_digest(&ctx.workspace).as_deref() != Some(shown.as_str()) {
        bail!(
            "the workspace's skills changed while you were asked; nothing approved, run it again"
        );
    }
    let digest = shown;
    store(&ctx.home).set(&ctx.workspace, Some(&digest))?;
    stdoutln!(
        "approved: sessions here offer these skills as they are now; a changed or new skill \
         asks again (`keel skills revoke` stops it)"
    );
    Ok(ExitCode::SUCCESS)
}
