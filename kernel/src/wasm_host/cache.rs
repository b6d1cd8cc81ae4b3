//! The on-disk cache of compiled components.
//!
//! An entry is named by its key, `sha256(engine fingerprint ‖ sha256(component bytes))`,
//! where the engine's fingerprint (`keel_engine::fingerprint`) covers the cache format, the
//! wasmtime version and the engine's compatibility hash, so a component compiled under other
//! engine settings or another wasmtime lands in another file. An entry file is:
//!
//! ```text
//! offset  size  field
//!      0     8  magic  b"KEELWC\x00\x02"
//!      8    32  key    (the entry's own key, so a file copied or renamed onto another key is refused)
//!     40     8  payload length, little endian
//!     48    32  HMAC-SHA256(cache key, entry key ‖ payload)
//!     80     n  payload: the output of `Component::serialize`
//! ```
//!
//! Reading verifies all of it before the payload reaches `Component::deserialize` (which must
//! only ever see bytes wasmtime itself produced). The MAC's key is 32 random bytes in
//! `mac.key` inside the cache directory (0600, created once, atomically): a payload that anyone
//! without the key wrote or changed — a plugin granted the directory, say — fails the check and
//! is recompiled, never run. An entry that fails any check is logged, ignored and rewritten.
//! Writes go to a temporary file in the same directory, are synced, then renamed into place, so
//! a reader never sees a half-written entry.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"KEELWC\x00\x02";
const HEADER_LEN: usize = 8 + 32 + 8 + 32;
/// The file holding the MAC key, in the cache directory.
const KEY_FILE: &str = "mac.key";

type Mac = hmac::Hmac<Sha256>;

/// The key of `bytes` compiled by the engine with fingerprint `engine`.
pub(crate) fn key(engine: &[u8; 32], bytes: &[u8]) -> [u8; 32] {
    let content: [u8; 32] = Sha256::digest(bytes).into();
    let mut h = Sha256::new();
    h.update(engine);
    h.update(content);
    h.finalize().into()
}

/// Why an entry was not used.
#[derive(Debug)]
pub(crate) enum Miss {
    /// There is no entry.
    Absent,
    /// There is an entry, but it failed a check; it must be rebuilt.
    Rejected(String),
}

/// A cache directory and the key that authenticates its entries.
pub(crate) struct DiskCache {
    dir: PathBuf,
    mac_key: [u8; 32],
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl DiskCache {
    /// The cache in `dir`, with its MAC key (created on first use).
    pub(crate) fn open(dir: PathBuf) -> std::io::Result<Self> {
        let mac_key = mac_key(&dir)?;
        Ok(DiskCache { dir, mac_key })
    }

    /// The file of the entry under `key`.
    pub(crate) fn path(&self, key: &[u8; 32]) -> PathBuf {
        self.dir.join(format!("{}.cwasm", hex::encode(key)))
    }

    /// The verified payload of the entry under `key`.
    pub(crate) fn read(&self, key: &[u8; 32]) -> Result<Vec<u8>, Miss> {
        let path = self.path(key);
        let data = match fs::read(&path) {
            Ok(data) => data,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Miss::Absent),
            Err(e) => return Err(Miss::Rejected(format!("cannot read it: {e}"))),
        };
        verify(&self.mac_key, key, data).map_err(Miss::Rejected)
    }

    /// Store `payload` under `key`, atomically.
    pub(crate) fn write(&self, key: &[u8; 32], payload: &[u8]) -> std::io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let final_path = self.path(key);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            hex::encode(&key[..8]),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = write_file(&tmp, &encode(&self.mac_key, key, payload)).and_then(|()| {
            fs::rename(&tmp, &final_path)?;
            sync_dir(&self.dir);
            Ok(())
        });
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }
}

fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut file = fs::File::create(path)?;
    file.write_all(data)?;
    file.sync_all()
}

/// Make the rename durable where the platform allows syncing a directory.
fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// The cache's MAC key: read from `dir/mac.key`, or made from the OS's random source and
/// published atomically (a temporary file, synced, then linked into place, so two processes
/// starting at once agree on one key).
fn mac_key(dir: &Path) -> std::io::Result<[u8; 32]> {
    let path = dir.join(KEY_FILE);
    let read = |path: &Path| -> std::io::Result<Option<[u8; 32]>> {
        match fs::read(path) {
            Ok(bytes) => Ok(<[u8; 32]>::try_from(bytes.as_slice()).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    };
    if let Some(key) = read(&path)? {
        return Ok(key);
    }
    fs::create_dir_all(dir)?;
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = dir.join(format!(
        ".mac.{}.{}.tmp",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let written = options.open(&tmp).and_then(|mut f| {
        f.write_all(&key)?;
        f.sync_all()
    });
    let linked = written.and_then(|()| match fs::hard_link(&tmp, &path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(_) => {
            // A damaged key file (wrong length): replace it; entries under it are rewritten.
            fs::rename(&tmp, &path)
        }
        ok => ok,
    });
    let _ = fs::remove_file(&tmp);
    linked?;
    sync_dir(dir);
    read(&path)?.ok_or_else(|| std::io::Error::other("the cache's MAC key file is damaged"))
}

fn mac(mac_key: &[u8; 32], key: &[u8; 32], payload: &[u8]) -> Mac {
    use hmac::Mac as _;
    let mut mac = <Mac as hmac::Mac>::new_from_slice(mac_key).expect("HMAC takes any key length");
    mac.update(key);
    mac.update(payload);
    mac
}

/// An entry's bytes: header then payload.
pub(crate) fn encode(mac_key: &[u8; 32], key: &[u8; 32], payload: &[u8]) -> Vec<u8> {
    use hmac::Mac as _;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(key);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&mac(mac_key, key, payload).finalize().into_bytes());
    out.extend_from_slice(payload);
    out
}

/// Check an entry's header against `key` and its payload against the recorded MAC; return
/// the payload.
pub(crate) fn verify(
    mac_key: &[u8; 32],
    key: &[u8; 32],
    mut data: Vec<u8>,
) -> Result<Vec<u8>, String> {
    if data.len() < HEADER_LEN {
        return Err(format!(
            "it is truncated ({} bytes, shorter than the {HEADER_LEN}-byte header)",
            data.len()
        ));
    }
    if &data[..8] != MAGIC {
        return Err("it is not a keel cache entry (bad magic)".into());
    }
    if &data[8..40] != key {
        return Err("it was written for another component or engine (key mismatch)".into());
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&data[40..48]);
    let len = u64::from_le_bytes(len);
    let actual = (data.len() - HEADER_LEN) as u64;
    if len != actual {
        return Err(format!(
            "its payload is {actual} bytes but the header says {len} (truncated or extended)"
        ));
    }
    use hmac::Mac as _;
    if mac(mac_key, key, &data[HEADER_LEN..])
        .verify_slice(&data[48..80])
        .is_err()
    {
        return Err(
            "its payload does not match its MAC (corrupt, or written by someone without the \
             cache's key)"
                .into(),
        );
    }
    Ok(data.split_off(HEADER_LEN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_every_damage_is_caught() {
        let key = [7u8; 32];
        let mk = [3u8; 32];
        let entry = encode(&mk, &key, b"payload");
        assert_eq!(
            verify(&mk, &key, entry.clone()).ok(),
            Some(b"payload".to_vec())
        );
        // The same entry under another MAC key: refused, as a forged one would be.
        assert!(
            verify(&[4u8; 32], &key, entry.clone())
                .err()
                .unwrap_or_default()
                .contains("MAC")
        );

        let mut flipped = entry.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(
            verify(&mk, &key, flipped)
                .err()
                .unwrap_or_default()
                .contains("MAC")
        );

        let mut truncated = entry.clone();
        truncated.truncate(entry.len() - 2);
        assert!(
            verify(&mk, &key, truncated)
                .err()
                .unwrap_or_default()
                .contains("truncated")
        );

        assert!(
            verify(&mk, &key, entry[..20].to_vec())
                .err()
                .unwrap_or_default()
                .contains("header")
        );
        assert!(
            verify(&mk, &[8u8; 32], entry.clone())
                .err()
                .unwrap_or_default()
                .contains("key")
        );

        let mut foreign = entry;
        foreign[0] = b'X';
        assert!(
            verify(&mk, &key, foreign)
                .err()
                .unwrap_or_default()
                .contains("magic")
        );
    }

    #[test]
    fn the_mac_key_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = DiskCache::open(dir.path().join("c")).expect("open");
        let again = DiskCache::open(dir.path().join("c")).expect("open");
        assert_eq!(first.mac_key, again.mac_key);
        assert_ne!(first.mac_key, [0u8; 32]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = fs::metadata(dir.path().join("c").join(KEY_FILE))
                .expect("key file")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let other = DiskCache::open(dir.path().join("d")).expect("open");
        assert_ne!(first.mac_key, other.mac_key, "each cache has its own key");
    }

    #[test]
    fn keys_depend_on_content_and_engine() {
        assert_ne!(key(&[0; 32], b"a"), key(&[0; 32], b"b"));
        assert_ne!(key(&[0; 32], b"a"), key(&[1; 32], b"a"));
    }
}
