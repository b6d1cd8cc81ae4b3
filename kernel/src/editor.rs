//! The editor driving a session (`keel acp` with a client that offers `fs/read_text_file`):
//! the kernel's `keel.editor` service, which answers a workspace file as the editor holds it,
//! unsaved changes included, so the file tools read what the person sees.
//!
//! Only the host attaches an editor ([`crate::Kernel::attach_editor`]). A plugin reaches it
//! only when it declared `keel.editor` and is granted the whole workspace (the file tools):
//! through the editor it reads nothing it could not read from the disk. The path is checked
//! here, not by the editor: workspace-relative, no `..`, an existing regular file whose real
//! path lies inside the workspace (a link out of it is refused). The editor's answer is bounded
//! in time and bytes; past either, or when it fails, the file is read from the disk.

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::types::KernelError;

/// What an editor offers: the text of a file, by its absolute path.
pub trait EditorFiles: Send + Sync {
    /// The text of `path` as the editor holds it; `Ok(None)` when it holds none of its own.
    fn read_text_file(&self, path: PathBuf) -> BoxFuture<'static, Result<Option<String>, String>>;
}

/// How long the editor may take to answer.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The most text taken from the editor for one file.
pub(crate) const MAX_TEXT_BYTES: usize = 8 << 20;

/// The session's editor, if the host attached one.
#[derive(Default)]
pub(crate) struct EditorDoor {
    files: Mutex<Option<Arc<dyn EditorFiles>>>,
}

impl EditorDoor {
    pub(crate) fn attach(&self, files: Option<Arc<dyn EditorFiles>>) {
        *self
            .files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = files;
    }

    /// `keel.editor` `read` through its JSON door: [`Self::read_path`] of the payload's path,
    /// as an `EditorText`.
    pub(crate) async fn read(
        &self,
        workspace: Option<&Path>,
        payload: &str,
    ) -> Result<String, KernelError> {
        let request: keel_protocol::EditorRead = serde_json::from_str(payload).map_err(|e| {
            KernelError::Invalid(format!(
                "`{}` `read` takes {{\"path\": \"a workspace-relative path\"}}: {e}",
                keel_protocol::services::EDITOR
            ))
        })?;
        let text = self.read_path(workspace, &request.path).await?;
        serde_json::to_string(&keel_protocol::EditorText { text })
            .map_err(|e| KernelError::Failed(format!("cannot encode the editor's text: {e}")))
    }

    /// `keel.editor` `read` for `workspace` (canonical): the editor's text of the file `rel`
    /// names, or `None` (no editor, no such file, the editor did not answer in time or
    /// answered too much). Both doors end here.
    pub(crate) async fn read_path(
        &self,
        workspace: Option<&Path>,
        rel: &str,
    ) -> Result<Option<String>, KernelError> {
        let files = self
            .files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(match (files, workspace) {
            (Some(files), Some(workspace)) => match inside(workspace, rel)? {
                Some(path) => {
                    let text = ask(files.as_ref(), path.clone()).await;
                    // A name swapped for a link out of the workspace while the editor read:
                    // what it read is not taken.
                    let still = inside(workspace, rel).ok().flatten();
                    text.filter(|_| still.as_ref() == Some(&path))
                }
                None => None,
            },
            _ => None,
        })
    }
}

/// The real path of the existing regular file `rel` names in `workspace`; `None` when there is
/// no such file; an error for a path that is not workspace-relative or leads out of it.
fn inside(workspace: &Path, rel: &str) -> Result<Option<PathBuf>, KernelError> {
    let relative = Path::new(rel);
    if rel.is_empty()
        || !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(KernelError::Invalid(format!(
            "`{}` reads workspace-relative paths without `..`; `{rel}` is not one",
            keel_protocol::services::EDITOR
        )));
    }
    let Ok(real) = workspace.join(relative).canonicalize() else {
        return Ok(None);
    };
    if !real.starts_with(workspace) {
        return Err(KernelError::Denied(format!(
            "`{rel}` leads out of the workspace; the editor is asked for workspace files only"
        )));
    }
    Ok(real.is_file().then_some(real))
}

async fn ask(files: &dyn EditorFiles, path: PathBuf) -> Option<String> {
    let shown = path.display().to_string();
    match tokio::time::timeout(READ_TIMEOUT, files.read_text_file(path)).await {
        Ok(Ok(Some(text))) if text.len() <= MAX_TEXT_BYTES => Some(text),
        Ok(Ok(Some(_))) => {
            tracing::warn!("the editor's text of {shown} is over 8 MiB; read from the disk");
            None
        }
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            tracing::warn!("the editor could not read {shown} ({e}); read from the disk");
            None
        }
        Err(_) => {
            tracing::warn!(
                "the editor did not answer for {shown} within {} s; read from the disk",
                READ_TIMEOUT.as_secs()
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(&'static str);

    impl EditorFiles for Fixed {
        fn read_text_file(
            &self,
            path: PathBuf,
        ) -> BoxFuture<'static, Result<Option<String>, String>> {
            let text = self.0;
            Box::pin(async move { Ok(Some(format!("{text} {}", path.display()))) })
        }
    }

    /// An editor during whose read the file's name was swapped for a link out of the
    /// workspace, as a command running alongside could.
    struct Swapping {
        outside: PathBuf,
    }

    impl EditorFiles for Swapping {
        fn read_text_file(
            &self,
            path: PathBuf,
        ) -> BoxFuture<'static, Result<Option<String>, String>> {
            let outside = self.outside.clone();
            Box::pin(async move {
                std::fs::remove_file(&path).map_err(|e| e.to_string())?;
                std::os::unix::fs::symlink(&outside, &path).map_err(|e| e.to_string())?;
                std::fs::read_to_string(&path)
                    .map(Some)
                    .map_err(|e| e.to_string())
            })
        }
    }

    #[tokio::test]
    async fn a_name_swapped_for_a_link_out_while_the_editor_reads_is_not_taken() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("ws")).expect("ws");
        let ws = dir.path().join("ws").canonicalize().expect("canonical");
        std::fs::write(ws.join("a.txt"), "disk").expect("a");
        let outside = dir.path().join("secret.txt");
        std::fs::write(&outside, "SECRET").expect("secret");
        let door = EditorDoor::default();
        door.attach(Some(Arc::new(Swapping { outside })));
        let answer = door
            .read(Some(&ws), r#"{"path": "a.txt"}"#)
            .await
            .expect("read");
        assert_eq!(answer, r#"{"text":null}"#);
    }

    #[tokio::test]
    async fn only_existing_workspace_files_are_asked_for() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("ws")).expect("ws");
        let ws = dir.path().join("ws").canonicalize().expect("canonical");
        std::fs::write(ws.join("a.txt"), "disk").expect("a");
        std::fs::write(dir.path().join("secret.txt"), "secret").expect("secret");
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), ws.join("link.txt"))
            .expect("link");
        let door = EditorDoor::default();
        let read = |path: &str| {
            let payload = serde_json::json!({ "path": path }).to_string();
            let door = &door;
            let ws = ws.clone();
            async move { door.read(Some(&ws), &payload).await }
        };
        // Without an editor: nothing, and no error.
        assert_eq!(read("a.txt").await.expect("read"), r#"{"text":null}"#);
        door.attach(Some(Arc::new(Fixed("buffer of"))));
        let text: keel_protocol::EditorText =
            serde_json::from_str(&read("a.txt").await.expect("read")).expect("json");
        assert_eq!(
            text.text,
            Some(format!("buffer of {}", ws.join("a.txt").display()))
        );
        // No such file: nothing asked.
        assert_eq!(read("new.txt").await.expect("read"), r#"{"text":null}"#);
        // Out of the workspace, by `..`, by an absolute path or through a link: refused.
        for bad in ["../secret.txt", "/etc/passwd", "link.txt", ""] {
            assert!(read(bad).await.is_err(), "{bad}");
        }
    }
}
