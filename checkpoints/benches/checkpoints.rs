//! What checkpoints cost a session: the first checkpoint of a workspace of 10,000 files
//! (100 MB), one after a turn changed ten of them, and one before a tool call that changed
//! nothing (the time added to every file-changing call) or one file. Aims: 2 s, 50 ms, 5 ms.
//! After the first, the change journal names what changed; no walk of the whole tree.
//!
//! Run in release: `cargo bench --workspace --bench checkpoints`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use criterion::{BatchSize, Criterion};
use keel_checkpoints::{Recorder, Settings, Store};

const FILES: usize = 10_000;
const FILE_BYTES: usize = 10_000;

/// A workspace of `FILES` files of `FILE_BYTES` bytes each in 100 directories, every file
/// different, modified an hour ago.
fn workspace(dir: &Path) -> PathBuf {
    let ws = dir.join("ws");
    let old = SystemTime::now() - Duration::from_secs(3600);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..FILES {
        let sub = ws.join(format!("d{:02}", i % 100));
        if i < 100 {
            std::fs::create_dir_all(&sub).expect("dir");
        }
        let mut bytes = vec![0u8; FILE_BYTES];
        for chunk in bytes.chunks_mut(8) {
            // xorshift: contents that do not compress to nothing, as source and data files.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        let path = sub.join(format!("f{i:05}.dat"));
        std::fs::write(&path, &bytes).expect("file");
        let f = std::fs::File::options()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_modified(old).expect("mtime");
    }
    ws.canonicalize().expect("canonical")
}

fn recorder(home: &Path, ws: &Path) -> Recorder {
    let store = Store::open(&home.join("checkpoints"), ws).expect("store");
    Recorder::new(store, Settings::default())
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let dir = tempfile::tempdir().expect("temp");
    let ws = workspace(dir.path());
    // Files changed within two seconds of a checkpoint are read again by the next one (a
    // write in the same clock tick could leave their stat unchanged); a session's files are
    // older than that.
    std::thread::sleep(Duration::from_millis(2100));
    let mut group = c.benchmark_group("checkpoints");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("first_10k_files_100mb", |b| {
        b.iter_batched(
            || tempfile::tempdir().expect("home"),
            |home| {
                recorder(home.path(), &ws)
                    .before_turn("bench")
                    .expect("checkpoint");
                home
            },
            BatchSize::PerIteration,
        )
    });
    let home = tempfile::tempdir().expect("home");
    let rec = recorder(home.path(), &ws);
    rec.before_turn("bench").expect("first");
    std::thread::sleep(Duration::from_millis(2100));
    rec.before_call("warm", "bench").expect("second");
    let mut round = 0u64;
    group.bench_function("after_ten_files_changed", |b| {
        b.iter_batched(
            || {
                round += 1;
                for i in 0..10 {
                    let path = ws.join(format!("d{:02}/f{:05}.dat", i % 100, i * 7));
                    std::fs::write(&path, format!("round {round} file {i}")).expect("write");
                }
            },
            |()| rec.after_turn().expect("checkpoint"),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("before_a_call_nothing_changed", |b| {
        b.iter(|| rec.before_call("call", "exec_shell").expect("checkpoint"))
    });
    // The call before wrote one file (as a file tool does): the journal names it, and only
    // it is read again.
    group.bench_function("before_a_call_one_file_changed", |b| {
        b.iter_batched(
            || {
                round += 1;
                std::fs::write(ws.join("d05/f00505.dat"), format!("round {round}")).expect("write");
            },
            |()| rec.before_call("call", "write_file").expect("checkpoint"),
            BatchSize::PerIteration,
        )
    });
    group.finish();
    c.final_summary();
}
