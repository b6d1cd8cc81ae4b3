//! A real OCI registry on loopback for tests: the distribution registry from the
//! distribution's `docker-registry` package (`.ci/setup` installs it), on filesystem storage
//! the test can reach into, anonymous or behind basic authentication (htpasswd, bcrypt), over
//! plain HTTP or TLS with a certificate of its own.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};

/// A running `docker-registry serve`, killed when dropped.
pub struct OciServer {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl OciServer {
    /// Start one anonymous registry.
    pub fn anonymous() -> anyhow::Result<OciServer> {
        OciServer::start(None, false)
    }

    /// Start one that admits only `user` with `password` (HTTP basic authentication).
    pub fn with_user(user: &str, password: &str) -> anyhow::Result<OciServer> {
        OciServer::start(Some((user, password)), false)
    }

    /// Start one speaking TLS only, with a certificate for 127.0.0.1 that no public
    /// authority signed (the test's own authority, [`OciServer::authority`]), made with
    /// `openssl`.
    pub fn with_tls() -> anyhow::Result<OciServer> {
        OciServer::start(None, true)
    }

    /// The certificate (PEM) of the authority that signed the TLS server's.
    pub fn authority(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn start(user: Option<(&str, &str)>, tls: bool) -> anyhow::Result<OciServer> {
        let dir = tempfile::tempdir()?;
        // Distribution cannot report a port it chose, so take a free one and hand it over.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: keel-test-secret\n",
            dir.path().join("storage").display()
        );
        if tls {
            // An authority of the test's own, and a certificate for 127.0.0.1 it signed.
            let d = dir.path().display().to_string();
            std::fs::write(
                dir.path().join("leaf.ext"),
                "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
            )?;
            let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
            for step in [
                format!(
                    "req -x509 {ec} -days 1 -subj /CN=keel-test-authority -keyout {d}/ca.key -out {d}/ca.pem"
                ),
                format!("req {ec} -subj /CN=127.0.0.1 -keyout {d}/key.pem -out {d}/leaf.csr"),
                format!(
                    "x509 -req -in {d}/leaf.csr -CA {d}/ca.pem -CAkey {d}/ca.key -CAcreateserial -days 1 -extfile {d}/leaf.ext -out {d}/cert.pem"
                ),
            ] {
                let status = Command::new("openssl")
                    .args(step.split(' '))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .context("cannot run `openssl` (apt-get install openssl, as .ci/setup does)")?;
                if !status.success() {
                    bail!("openssl {step}: {status}");
                }
            }
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("cert.pem").display(),
                dir.path().join("key.pem").display()
            ));
        }
        if let Some((user, password)) = user {
            let hash = bcrypt::hash(password, 4)?;
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{user}:{hash}\n"))?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: keel-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config)?;
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context(
                "cannot start `docker-registry` (the distribution registry): install it with `apt-get install docker-registry`, as .ci/setup does",
            )?;
        // Ready when it says it listens: its log goes to stderr, read on a thread.
        let stderr = child.stderr.take().context("registry stderr")?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(ready_tx);
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(());
                }
            }
        });
        let mut server = OciServer { dir, port, child };
        if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let status = server.child.try_wait()?;
            bail!("docker-registry did not start listening within 30 s (exit: {status:?})");
        }
        Ok(server)
    }

    /// `oci://127.0.0.1:PORT/PATH`.
    pub fn url(&self, path: &str) -> String {
        format!("oci://127.0.0.1:{}/{path}", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The registry's storage root (`docker/registry/v2/...`).
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage/docker/registry/v2")
    }

    /// The file holding blob `sha256` (hex) in storage.
    pub fn blob_file(&self, sha256: &str) -> PathBuf {
        self.storage()
            .join("blobs/sha256")
            .join(&sha256[..2.min(sha256.len())])
            .join(sha256)
            .join("data")
    }

    /// The folder of `tag` in `repository`.
    pub fn tag_dir(&self, repository: &str, tag: &str) -> PathBuf {
        self.storage()
            .join("repositories")
            .join(repository)
            .join("_manifests/tags")
            .join(tag)
    }

    /// The hex digest `tag` of `repository` points at.
    pub fn tag_digest(&self, repository: &str, tag: &str) -> anyhow::Result<String> {
        let link = self.tag_dir(repository, tag).join("current/link");
        let text = std::fs::read_to_string(&link)
            .with_context(|| format!("reading {}", link.display()))?;
        Ok(text.trim().trim_start_matches("sha256:").to_owned())
    }

    /// Every tag of `repository`, read from storage.
    pub fn tags(&self, repository: &str) -> anyhow::Result<Vec<String>> {
        let dir = self
            .storage()
            .join("repositories")
            .join(repository)
            .join("_manifests/tags");
        let mut tags = Vec::new();
        for entry in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
            tags.push(entry?.file_name().to_string_lossy().into_owned());
        }
        tags.sort();
        Ok(tags)
    }

    /// The temp folder the server lives in (for a test's other files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for OciServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
