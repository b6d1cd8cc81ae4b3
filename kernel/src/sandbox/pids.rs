//! Holding a sandboxed tree to its process limit ([`super::ProcessLimits::processes`]) where
//! `RLIMIT_NPROC` cannot: the kernel never applies that limit to root. For root the tree goes
//! into a `pids` cgroup ([`PidsCgroup`]); where none can be made (a container whose cgroups are
//! mounted read-only, a cgroup v2 tree without the `pids` controller) a [`Watchdog`] counts the
//! tree's PID namespace and kills the whole namespace once it passes the limit. Without either,
//! a fork bomb run as root would take every process slot of the machine, keel's included.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// What holds one sandboxed tree to its process limit for root; dropped after the tree.
pub(crate) enum ProcessCap {
    Cgroup(PidsCgroup),
    Watchdog(Watchdog),
}

impl ProcessCap {
    /// For root, before the tree starts: a cgroup when one can be made. `None` for other users
    /// (`RLIMIT_NPROC` binds them) and when no cgroup can be made ([`ProcessCap::watch`] then).
    pub(crate) fn cgroup(max: u64) -> Option<ProcessCap> {
        if !nix::unistd::Uid::effective().is_root() {
            return None;
        }
        PidsCgroup::for_command(max).map(ProcessCap::Cgroup)
    }

    /// For root without a cgroup, once bubblewrap (`sandbox`, the pid keel started) runs.
    pub(crate) fn watch(sandbox: Option<u32>, max: u64) -> Option<ProcessCap> {
        if !nix::unistd::Uid::effective().is_root() {
            return None;
        }
        Watchdog::start(sandbox?, max).map(ProcessCap::Watchdog)
    }

    /// The cgroup's `cgroup.procs`, for the child to move itself into before bubblewrap runs;
    /// `None` where it is started from inside ([`spawn`]).
    pub(crate) fn procs(&self) -> Option<&std::fs::File> {
        match self {
            ProcessCap::Cgroup(c) if c.spawner.is_none() => Some(&c.procs),
            ProcessCap::Cgroup(_) | ProcessCap::Watchdog(_) => None,
        }
    }

    /// Whether the watchdog killed the tree for passing the limit.
    pub(crate) fn killed_the_tree(&self) -> bool {
        matches!(self, ProcessCap::Watchdog(w) if w.fired.load(Ordering::Acquire))
    }
}

#[cfg(test)]
thread_local! {
    /// Tests of the watchdog turn the cgroup off for the commands their own thread starts.
    pub(crate) static NO_CGROUP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A `pids` cgroup (v1 or v2) for one command, removed when dropped.
pub(crate) struct PidsCgroup {
    pub(crate) dir: PathBuf,
    /// `cgroup.procs`, opened by the parent so the child only writes to it.
    procs: std::fs::File,
    /// cgroup v1: a thread of keel's already inside, which starts the command, so the command
    /// is born there. `None` on v2, where a process's threads share one cgroup: the child then
    /// moves itself through `procs` before bubblewrap runs.
    spawner: Option<Spawner>,
    /// The tree's limit.
    max: u64,
    /// Whether a command was started in it: its end makes the next one ready.
    used: bool,
}

/// The name of every cgroup keel makes begins with this, then the pid of the keel that made it.
const CGROUP_PREFIX: &str = "keel-";

/// The next command's cgroup, made while keel waited for something else. Moving a task into a
/// cgroup makes the kernel wait for a grace period (16 ms measured here, on a cgroup v1 machine
/// idle between commands); a command started from a thread that moved in ahead of time does not
/// wait for it. The next one is made when the sandbox is found to work and after each command
/// ended, not while one starts: a move holds the kernel's cgroup lock, and every fork of a
/// starting command (bubblewrap's, the shell's) would wait on it.
struct Ahead {
    ready: Option<PidsCgroup>,
    /// A thread is making the next one.
    making: bool,
}

static AHEAD: std::sync::Mutex<Ahead> = std::sync::Mutex::new(Ahead {
    ready: None,
    making: false,
});
/// Told when a thread finished making one.
static MADE: std::sync::Condvar = std::sync::Condvar::new();
/// How long a command waits for the one being made rather than making its own alongside.
const WAIT_FOR_READY: Duration = Duration::from_millis(50);

fn ahead() -> std::sync::MutexGuard<'static, Ahead> {
    AHEAD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// For root: make the next command's cgroup in the background, unless one is ready or being
/// made.
pub(crate) fn prepare(max: u64) {
    if !nix::unistd::Uid::effective().is_root() {
        return;
    }
    {
        let mut ahead = ahead();
        if ahead.making || ahead.ready.is_some() {
            return;
        }
        ahead.making = true;
    }
    let made = std::thread::Builder::new()
        .name("keel-pids-prepare".into())
        .spawn(move || {
            let next = PidsCgroup::create(max).filter(|c| c.spawner.is_some());
            let mut ahead = ahead();
            ahead.making = false;
            if ahead.ready.is_none() {
                ahead.ready = next;
            }
            MADE.notify_all();
        });
    if made.is_err() {
        ahead().making = false;
        MADE.notify_all();
    }
}

/// The ready cgroup, waiting up to [`WAIT_FOR_READY`] for one being made.
pub(crate) fn take_ready() -> Option<PidsCgroup> {
    let deadline = std::time::Instant::now() + WAIT_FOR_READY;
    let mut ahead = ahead();
    while ahead.ready.is_none() && ahead.making {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        ahead = MADE
            .wait_timeout(ahead, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
    ahead.ready.take()
}

/// Make `cgroup` the ready one again (a test's way to hold it still).
#[cfg(test)]
pub(crate) fn put_back(cgroup: PidsCgroup) {
    ahead().ready = Some(cgroup);
}

/// Remove the ready cgroup, for a keel about to exit: its spawner thread ends and the empty
/// cgroup goes, instead of waiting for the next keel's sweep. One still being made is left to
/// that sweep: waiting for it would hold up the exit of a keel that answered quickly (measured:
/// a one-shot answer 5–10 ms slower).
pub fn release() {
    let ready = ahead().ready.take();
    let Some(mut cgroup) = ready else {
        return;
    };
    if let Some(spawner) = &mut cgroup.spawner {
        spawner.stop();
    }
    // The ended thread leaves the cgroup a moment after it woke its joiner.
    for _ in 0..50 {
        if std::fs::remove_dir(&cgroup.dir).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Dropping it finds it gone (or tries once more).
    drop(cgroup);
}

impl PidsCgroup {
    /// The ready cgroup when there is one (waiting a moment for one being made), else a new one.
    fn for_command(max: u64) -> Option<PidsCgroup> {
        #[cfg(test)]
        if NO_CGROUP.with(std::cell::Cell::get) {
            return None;
        }
        match take_ready() {
            Some(mut c) => {
                if c.set_max(max) {
                    Some(c)
                } else {
                    Self::create(max)
                }
            }
            None => Self::create(max),
        }
    }

    fn create(max: u64) -> Option<PidsCgroup> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        static SWEEP: std::sync::Once = std::sync::Once::new();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("{CGROUP_PREFIX}{}-{n}", std::process::id());
        for base in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"] {
            let base = Path::new(base);
            if !base.join("cgroup.procs").exists() {
                continue;
            }
            SWEEP.call_once(|| remove_stale_cgroups(base));
            let dir = base.join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let Ok(procs) = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
            else {
                let _ = std::fs::remove_dir(&dir);
                continue;
            };
            let mut cgroup = PidsCgroup {
                dir,
                procs,
                spawner: None,
                max,
                used: false,
            };
            // Only v1 has `tasks`, the file that moves one thread.
            if cgroup.dir.join("tasks").exists() {
                cgroup.spawner = Spawner::start(&cgroup.dir.join("tasks"));
            }
            if cgroup.set_max(max) {
                return Some(cgroup);
            }
            // Dropping it removes it.
        }
        None
    }

    /// Set the tree's limit; the spawner inside counts as one more.
    fn set_max(&mut self, max: u64) -> bool {
        self.max = max;
        let max = max + u64::from(self.spawner.is_some());
        std::fs::write(self.dir.join("pids.max"), max.to_string()).is_ok()
    }
}

/// A thread of keel's inside a cgroup (v1), waiting to start one command there; it lives as
/// long as the command does, because bubblewrap's `--die-with-parent` is told of the death of
/// the thread that started it, not of keel.
pub(crate) struct Spawner {
    job: Option<std::sync::mpsc::SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A command to start, the runtime its child belongs to, and where to say how it went.
type Job = (
    tokio::process::Command,
    tokio::runtime::Handle,
    std::sync::mpsc::SyncSender<std::io::Result<tokio::process::Child>>,
);

impl Spawner {
    /// A thread moved into the cgroup whose `tasks` file is `tasks`; `None` when it could not.
    fn start(tasks: &Path) -> Option<Spawner> {
        let (job, jobs) = std::sync::mpsc::sync_channel::<Job>(1);
        let (joined, inside) = std::sync::mpsc::sync_channel::<bool>(1);
        let tasks = tasks.to_owned();
        let thread = std::thread::Builder::new()
            .name("keel-pids-spawner".into())
            .spawn(move || {
                let tid = nix::unistd::gettid();
                let ok = std::fs::write(&tasks, tid.to_string()).is_ok();
                let _ = joined.send(ok);
                if !ok {
                    return;
                }
                if let Ok((mut command, runtime, reply)) = jobs.recv() {
                    let _runtime = runtime.enter();
                    let _ = reply.send(command.spawn());
                }
                // Until the command ends (the cgroup is dropped); a second job is refused.
                let _ = jobs.recv();
            })
            .ok()?;
        let mut spawner = Spawner {
            job: Some(job),
            thread: Some(thread),
        };
        if inside.recv() == Ok(true) {
            Some(spawner)
        } else {
            spawner.stop();
            None
        }
    }

    /// Start `command` on the thread inside.
    fn spawn(&self, command: tokio::process::Command) -> std::io::Result<tokio::process::Child> {
        let gone = || std::io::Error::other("keel's spawner thread for the command's cgroup ended");
        let runtime = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let job = self.job.as_ref().ok_or_else(gone)?;
        job.send((command, runtime, reply)).map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }

    /// Let the thread end and wait for it.
    fn stop(&mut self) {
        self.job = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Start `command`: from inside the cgroup of `cap` where a thread of keel's waits there, else
/// from here (the child then moves itself, or is watched).
pub(crate) fn spawn(
    cap: Option<&mut ProcessCap>,
    mut command: tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    match cap {
        Some(ProcessCap::Cgroup(cgroup)) => {
            cgroup.used = true;
            match &cgroup.spawner {
                Some(spawner) => spawner.spawn(command),
                None => command.spawn(),
            }
        }
        _ => command.spawn(),
    }
}

/// Remove the empty cgroups that keel processes no longer running left in `base`: a cgroup is
/// removed when its command ends, but one whose killed processes had not left it yet is retried
/// by a thread that dies with its keel. Only those a minute old: a keel in another PID namespace
/// may have just made one (its pid means nothing here) and not yet moved its command in.
fn remove_stale_cgroups(base: &Path) {
    for dir in super::left_by_gone_keels(base, CGROUP_PREFIX, Duration::from_secs(60)) {
        // Fails (EBUSY) while processes are still in it: then it is not stale.
        let _ = std::fs::remove_dir(dir);
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        if let Some(spawner) = &mut self.spawner {
            spawner.stop();
        }
        // The tree is gone by now (killed or exited); a cgroup with members cannot be removed,
        // so kill what is left first. Never keel itself: its spawner thread, just ended, may not
        // have left yet (a thread leaves its cgroup after it wakes whoever joins it), and v1
        // lists a thread's process. (The spawner's end has already told bubblewrap to die.)
        let keel = std::process::id();
        if let Ok(pids) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if pid != keel
                    && let Ok(pid) = i32::try_from(pid)
                {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
        // The command ended: the next one's cgroup is made now, while the model thinks.
        if self.used && self.spawner.is_some() {
            prepare(self.max);
        }
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => return,
            // Removed already ([`release`]).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => {}
        }
        // The killed processes leave the cgroup a moment later; removing it must not hold up
        // the command's result, so a short-lived thread retries.
        let dir = self.dir.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                std::thread::sleep(Duration::from_millis(5));
                if std::fs::remove_dir(&dir).is_ok() {
                    return;
                }
            }
        });
    }
}

/// Counts the processes of one sandbox's PID namespace on a thread of its own, ahead of the
/// tree in the scheduler, and kills every process of the namespace once there are more than the
/// limit. A fork bomb gains a few dozen processes between two looks, far from a machine's
/// thousands of process slots. Stops when dropped.
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
    fired: Arc<AtomicBool>,
}

/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(5);
/// Looks in a second.
const LOOKS_PER_SECOND: u32 = 200;

impl Watchdog {
    fn start(sandbox: u32, max: u64) -> Option<Watchdog> {
        let stop = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicBool::new(false));
        let (stop_, fired_) = (stop.clone(), fired.clone());
        std::thread::Builder::new()
            .name("keel-pids-watchdog".into())
            .spawn(move || watch(sandbox, max, &stop_, &fired_))
            .ok()?;
        Some(Watchdog { stop, fired })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn watch(sandbox: u32, max: u64, stop: &AtomicBool, fired: &AtomicBool) {
    run_ahead();
    let own = std::fs::read_link("/proc/self/ns/pid").ok();
    let mut namespace: Option<PathBuf> = None;
    // The machine's task count (one small read) when the tree was last counted, lowered as
    // other processes end: the whole of /proc is read when it has grown by a quarter of the
    // limit (a tree can grow unseen only by as many tasks as others end meanwhile), and once a
    // second in any case. A long-lived process (a server) is watched for as long as it runs.
    let mut baseline = u64::MAX;
    let mut look = 0u32;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        look = look.wrapping_add(1);
        if namespace.is_none() {
            namespace = first_child(sandbox)
                .and_then(|first| std::fs::read_link(format!("/proc/{first}/ns/pid")).ok())
                .filter(|ns| Some(ns) != own.as_ref());
            if namespace.is_none() {
                if kill(Pid::from_raw(sandbox as i32), None).is_err() {
                    return;
                }
                continue;
            }
        }
        let Some(ns) = &namespace else {
            continue;
        };
        let tasks = machine_tasks().unwrap_or(u64::MAX);
        baseline = baseline.min(tasks);
        if tasks < baseline.saturating_add(max / 4) && !look.is_multiple_of(LOOKS_PER_SECOND) {
            continue;
        }
        baseline = tasks;
        // Counted up to one past the limit.
        let count = in_namespace(ns)
            .take(usize::try_from(max).unwrap_or(usize::MAX).saturating_add(1))
            .count();
        if count == 0 {
            return;
        }
        if count as u64 > max {
            fired.store(true, Ordering::Release);
            kill_namespace(ns);
            return;
        }
    }
}

/// Put this thread ahead of ordinary processes: a fork bomb's thousands of runnable processes
/// would otherwise share the processors with it and outgrow it. Root may (`SCHED_FIFO`, or the
/// highest nice where that is refused); the thread sleeps between looks, and a look is short.
fn run_ahead() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: both calls change only the calling thread's scheduling (pid 0); `param` is a
    // live local.
    #[allow(unsafe_code)]
    unsafe {
        if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, -20);
        }
    }
}

/// Kill every process of the PID namespace `ns`, again and again until none is left (or a
/// second has passed). Killing its first process alone is not enough: that process's exit
/// stops new processes in the namespace, but among thousands of runnable copies of a fork
/// bomb it gets the processor too rarely to get there, while every copy it has not killed
/// yet goes on forking. A copy that was sent SIGKILL can fork no more.
fn kill_namespace(ns: &Path) {
    for _ in 0..200 {
        let mut found = false;
        for (pid, dir) in in_namespace(ns) {
            if !zombie(&dir) && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                found = true;
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(TICK);
    }
}

/// The processes of the PID namespace `ns` (its `/proc/PID/ns/pid` link): pid and `/proc`
/// directory.
fn in_namespace(ns: &Path) -> impl Iterator<Item = (i32, PathBuf)> + '_ {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(move |entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let dir = entry.path();
            (std::fs::read_link(dir.join("ns/pid")).ok()? == ns).then_some((pid, dir))
        })
}

/// Whether the process at `/proc/PID` has ended and waits to be reaped (state `Z`).
fn zombie(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// The first child of `pid` (bubblewrap's, the first process of the new PID namespace): from
/// `/proc/PID/task/PID/children`, or where the kernel lacks that file by the parent pid each
/// process's `stat` names.
fn first_child(pid: u32) -> Option<i32> {
    if let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        return children.split_whitespace().next()?.parse().ok();
    }
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let child: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
}

/// Kernel scheduling entities on the machine (the fourth field of `/proc/loadavg`, `R/T`).
fn machine_tasks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}
