//! Resource limits of a plugin instance: the guest-CPU bound per call, the memory cap, and the
//! engine's single epoch ticker.
//!
//! # Why epochs plus a meter, not fuel
//!
//! The bound has to count *guest execution*, not the time a call spends waiting on the kernel
//! (a `services.call` awaiting another plugin, a model stream, an approval prompt). Fuel would
//! count exactly that, but it costs a counter update in every basic block of every plugin (a
//! measurable slowdown on hot guest code), its unit is instructions rather than time, and a
//! budget of "1 s" has no honest translation into instructions. Epoch interruption costs one
//! load and compare at function entries and loop back-edges.
//!
//! So each store carries a [`CpuMeter`], a small stopwatch that runs only while guest code runs:
//!
//! * it starts when an export call (or instantiation) starts and stops when it ends;
//! * every keel host import pauses it for its whole duration ([`CpuMeter::host_call`]), so a
//!   nested call into another plugin, which runs inside this call's poll, is charged to that
//!   plugin and not to this one;
//! * [`Metered`] wraps the call's future and pauses the meter whenever the future returns
//!   `Pending` (a WASI import waiting on a clock or a file, or a yield), resuming it on the next
//!   poll — time the task spends parked is not guest time either.
//!
//! Guest time is also charged to the call chain's [`CpuAccount`], shared by every plugin a
//! call passes through from the door the kernel opened it at (a tool call, a model call, ...),
//! and held to the limit of the first plugin that ran for it: a guest that loops calling
//! another plugin spends the account down even though its own meter barely moves.
//!
//! One ticker thread per engine increments the epoch every [`TICK`]. Each call arms a deadline of
//! one tick; when it passes, the store's epoch callback reads the meter: over the limit, the call
//! traps (and the meter remembers why, so the error says "cpu" rather than "trap"); under it,
//! the callback yields to the async executor (so a spinning guest never starves the other
//! plugins sharing the runtime) and re-arms one tick. A guest spinning in a loop is therefore
//! stopped within one tick (10 ms) of reaching its limit.
//!
//! The meter measures wall time while the guest's future is being polled, so time the OS
//! spends running other threads during a poll is charged to the guest. On a loaded machine a
//! plugin can reach its limit somewhat early; it can never run longer than the limit.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::{Engine, ResourceLimiter};

use crate::call_chain::CpuAccount;

/// Interval of the engine's epoch ticker; also the granularity of the CPU bound.
pub(crate) const TICK: Duration = Duration::from_millis(10);

/// Most core instances one plugin may create (a Rust guest component creates a handful).
const MAX_INSTANCES: usize = 256;
/// Most tables one plugin may create.
const MAX_TABLES: usize = 256;
/// Most linear memories one plugin may create.
const MAX_MEMORIES: usize = 64;
/// Most elements one table may grow to (function tables of large guests stay far below).
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

const MIB: u64 = 1024 * 1024;

/// The single epoch ticker of an engine. Dropping it stops and joins the thread.
pub(crate) struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Start incrementing `engine`'s epoch every [`TICK`].
    pub(crate) fn start(engine: Engine) -> std::io::Result<Ticker> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("keel-wasm-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(Ticker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            // The loop checks the flag after at most one tick; joining keeps the thread from
            // outliving the host that owns it.
            let _ = thread.join();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No call is running.
    Idle,
    /// Guest code is running since this instant.
    Guest(Instant),
    /// The call's future returned `Pending` while guest code was running; it resumes on the
    /// next poll.
    Parked,
    /// A keel host import is running; it resumes the meter when it returns.
    Host,
}

/// Which bound a call ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overrun {
    /// This plugin's own limit for one call: the guest time it used.
    Call(Duration),
    /// The call chain's account: the guest time the chain used, and the account's limit.
    Chain { spent: Duration, limit: Duration },
}

#[derive(Debug)]
struct MeterState {
    phase: Phase,
    spent: Duration,
    limit: Duration,
    /// The account of the running call's chain.
    account: Option<Arc<CpuAccount>>,
    /// Which bound was found exceeded.
    exceeded: Option<Overrun>,
}

impl MeterState {
    fn stop_clock(&mut self, now: Instant, next: Phase) {
        if let Phase::Guest(since) = self.phase {
            let ran = now.saturating_duration_since(since);
            self.spent += ran;
            if let Some(account) = &self.account {
                account.charge(ran);
            }
        }
        self.phase = next;
    }

    /// Guest time running since the clock last stopped.
    fn running(&self, now: Instant) -> Duration {
        match self.phase {
            Phase::Guest(since) => now.saturating_duration_since(since),
            _ => Duration::ZERO,
        }
    }
}

/// Guest-CPU stopwatch of one store. Cheap to clone; clones share the same state (the store
/// data, the epoch callback and the [`Metered`] wrapper all hold one).
#[derive(Debug, Clone)]
pub(crate) struct CpuMeter(Arc<Mutex<MeterState>>);

/// What the epoch callback should do.
pub(crate) enum Verdict {
    /// Guest time is within the limit: yield and re-arm.
    Continue,
    /// A bound is exceeded: trap.
    Exceeded(Overrun),
}

impl CpuMeter {
    pub(crate) fn new(limit: Duration) -> Self {
        CpuMeter(Arc::new(Mutex::new(MeterState {
            phase: Phase::Idle,
            spent: Duration::ZERO,
            limit,
            account: None,
            exceeded: None,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, MeterState> {
        // The state is plain data updated in single assignments, so it is consistent even if
        // a holder panicked.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Start metering a new call from zero, charging `account` too.
    pub(crate) fn start_call(&self, account: Arc<CpuAccount>) {
        let mut s = self.lock();
        s.spent = Duration::ZERO;
        s.exceeded = None;
        s.account = Some(account);
        s.phase = Phase::Guest(Instant::now());
    }

    /// Stop metering; returns the guest time of the call.
    pub(crate) fn end_call(&self) -> Duration {
        let mut s = self.lock();
        s.stop_clock(Instant::now(), Phase::Idle);
        s.account = None;
        s.spent
    }

    /// Start the running call's own count afresh: the agent it runs asks the model for its next
    /// step, and its bound is per step (see [`crate::call_chain`]).
    pub(crate) fn renew_step(&self) {
        let mut s = self.lock();
        let now = Instant::now();
        let next = s.phase;
        s.stop_clock(now, next);
        if let Phase::Guest(_) = next {
            s.phase = Phase::Guest(now);
        }
        s.spent = Duration::ZERO;
    }

    /// The bound found exceeded in the current (or last) call.
    pub(crate) fn exceeded(&self) -> Option<Overrun> {
        self.lock().exceeded
    }

    /// The configured limit.
    pub(crate) fn limit(&self) -> Duration {
        self.lock().limit
    }

    /// Called by the epoch callback: is the current call still within its limit and its
    /// chain's?
    pub(crate) fn check(&self) -> Verdict {
        let mut s = self.lock();
        let running = s.running(Instant::now());
        let spent = s.spent + running;
        let overrun = if spent > s.limit {
            Some(Overrun::Call(spent))
        } else {
            s.account.as_ref().and_then(|account| {
                let limit = account.limit_or(s.limit);
                let spent = account.spent() + running;
                (spent > limit).then_some(Overrun::Chain { spent, limit })
            })
        };
        match overrun {
            Some(overrun) => {
                s.exceeded = Some(overrun);
                Verdict::Exceeded(overrun)
            }
            None => Verdict::Continue,
        }
    }

    /// Pause the meter while a host import runs; it resumes when the guard drops.
    pub(crate) fn host_call(&self) -> HostCall {
        let mut s = self.lock();
        let was_running = matches!(s.phase, Phase::Guest(_));
        if was_running {
            s.stop_clock(Instant::now(), Phase::Host);
        }
        HostCall {
            meter: self.clone(),
            resume: was_running,
        }
    }

    fn park(&self) {
        let mut s = self.lock();
        if matches!(s.phase, Phase::Guest(_)) {
            s.stop_clock(Instant::now(), Phase::Parked);
        }
    }

    fn unpark(&self) {
        let mut s = self.lock();
        if s.phase == Phase::Parked {
            s.phase = Phase::Guest(Instant::now());
        }
    }
}

/// Guard returned by [`CpuMeter::host_call`].
pub(crate) struct HostCall {
    meter: CpuMeter,
    resume: bool,
}

impl Drop for HostCall {
    fn drop(&mut self) {
        if self.resume {
            let mut s = self.meter.lock();
            if s.phase == Phase::Host {
                s.phase = Phase::Guest(Instant::now());
            }
        }
    }
}

/// A future that stops its meter while it is parked (between returning `Pending` and its next
/// poll), so that waiting is never charged as guest time.
pub(crate) struct Metered<F> {
    meter: CpuMeter,
    inner: Pin<Box<F>>,
}

impl<F: Future> Metered<F> {
    pub(crate) fn new(meter: CpuMeter, inner: F) -> Self {
        Metered {
            meter,
            inner: Box::pin(inner),
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.meter.unpark();
        let out = self.inner.as_mut().poll(cx);
        if out.is_pending() {
            self.meter.park();
        }
        out
    }
}

/// Memory refusal recorded by [`MemoryLimiter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryRefusal {
    /// Total linear memory the instance asked for, in bytes.
    pub(crate) wanted: u64,
}

/// The store's resource limiter: caps the *total* linear memory of all memories of the
/// instance (a component may contain several core modules, each with a memory), plus the
/// number of instances, tables and memories, and records a refusal so the resulting trap is
/// reported as the memory limit rather than as whatever the guest's allocator did next.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    limit: u64,
    total: u64,
    refused: Option<MemoryRefusal>,
}

impl MemoryLimiter {
    pub(crate) fn new(limit: u64) -> Self {
        MemoryLimiter {
            limit,
            total: 0,
            refused: None,
        }
    }

    /// The refusal, if a grow was refused since the store was created.
    pub(crate) fn refused(&self) -> Option<MemoryRefusal> {
        self.refused
    }

    /// The configured cap in bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            // The module's own declared maximum: ordinary `memory.grow` failure (-1).
            return Ok(false);
        }
        let wanted = self
            .total
            .saturating_sub(current as u64)
            .saturating_add(desired as u64);
        if wanted > self.limit {
            self.refused = Some(MemoryRefusal { wanted });
            wasmtime::bail!(
                "linear memory would grow to {wanted} bytes, over the limit of {} bytes",
                self.limit
            );
        }
        self.total = wanted;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context("growing linear memory failed"))
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS && maximum.is_none_or(|max| desired <= max))
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

/// "1 s", "1.5 s" or "250 ms": how a limit is written in messages.
pub(crate) fn format_limit(limit: Duration) -> String {
    let ms = limit.as_millis();
    if ms >= 1000 && ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else if ms >= 1000 {
        format!("{} s", limit.as_secs_f64())
    } else {
        format!("{ms} ms")
    }
}

/// "64 MiB" or "1.5 MiB".
pub(crate) fn format_mib(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meter_counts_guest_time_only() {
        let meter = CpuMeter::new(Duration::from_millis(50));
        meter.start_call(Arc::default());
        {
            let _host = meter.host_call();
            std::thread::sleep(Duration::from_millis(80));
        }
        assert!(matches!(meter.check(), Verdict::Continue));
        meter.park();
        std::thread::sleep(Duration::from_millis(80));
        meter.unpark();
        assert!(matches!(meter.check(), Verdict::Continue));
        std::thread::sleep(Duration::from_millis(60));
        assert!(matches!(meter.check(), Verdict::Exceeded(_)));
        assert!(meter.exceeded().is_some());
        let spent = meter.end_call();
        assert!(spent >= Duration::from_millis(60) && spent < Duration::from_millis(150));
    }

    #[test]
    fn guest_time_of_every_call_on_a_chain_counts_against_its_account() {
        // Two plugins, each far under its own limit per call, share one account of 100 ms.
        let account = Arc::new(CpuAccount::default());
        assert_eq!(
            account.limit_or(Duration::from_millis(100)),
            Duration::from_millis(100)
        );
        let caller = CpuMeter::new(Duration::from_secs(1));
        let callee = CpuMeter::new(Duration::from_secs(1));
        caller.start_call(account.clone());
        std::thread::sleep(Duration::from_millis(20));
        let nested = caller.host_call();
        callee.start_call(account.clone());
        std::thread::sleep(Duration::from_millis(30));
        assert!(matches!(callee.check(), Verdict::Continue));
        callee.end_call();
        drop(nested);
        assert!(account.spent() >= Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(60));
        match caller.check() {
            Verdict::Exceeded(Overrun::Chain { spent, limit }) => {
                assert!(spent > limit && limit == Duration::from_millis(100));
            }
            _ => panic!("the chain's account is spent"),
        }
    }

    #[test]
    fn host_call_inside_parked_phase_does_not_resume() {
        let meter = CpuMeter::new(Duration::from_secs(1));
        meter.start_call(Arc::default());
        meter.park();
        drop(meter.host_call());
        assert_eq!(meter.lock().phase, Phase::Parked);
    }

    #[test]
    fn limiter_caps_the_total_of_all_memories() {
        let mut limiter = MemoryLimiter::new(10 * MIB);
        assert!(matches!(
            limiter.memory_growing(0, 6 * MIB as usize, None),
            Ok(true)
        ));
        assert!(limiter.memory_growing(0, 6 * MIB as usize, None).is_err());
        assert_eq!(limiter.refused(), Some(MemoryRefusal { wanted: 12 * MIB }));
        // Growing the first memory counts the growth only.
        assert!(matches!(
            limiter.memory_growing(6 * MIB as usize, 9 * MIB as usize, Some(1 << 30)),
            Ok(true)
        ));
        assert!(
            limiter
                .memory_growing(9 * MIB as usize, 11 * MIB as usize, None)
                .is_err()
        );
        // A module's own maximum is not the store's limit.
        let mut fresh = MemoryLimiter::new(10 * MIB);
        assert!(matches!(fresh.memory_growing(0, 2, Some(1)), Ok(false)));
        assert_eq!(fresh.refused(), None);
    }

    #[test]
    fn limits_are_written_for_humans() {
        assert_eq!(format_limit(Duration::from_secs(1)), "1 s");
        assert_eq!(format_limit(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(format_limit(Duration::from_millis(250)), "250 ms");
        assert_eq!(format_mib(64 * MIB), "64 MiB");
        assert_eq!(format_mib(MIB + MIB / 2), "1.5 MiB");
    }
}
