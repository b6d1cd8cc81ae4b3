//! How quickly the kernel stops a guest that would never return, as the person feels it:
//! from Ctrl-C to the tool call's error result while the guest spins in a loop, and from the
//! start of a tool call whose guest sleeps forever to its error result at a 200 ms deadline.
//! Every iteration also replaces the stopped instance before the next call (not timed).

use std::time::{Duration, Instant};

use criterion::Criterion;
use keel_kernel::{Deadlines, GateConfig, KernelConfig};
use keel_tests::Harness;

const DEADLINE: Duration = Duration::from_millis(200);

fn call_bounds(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let h = rt.block_on(async {
        let h = Harness::with_kernel(
            dir.path(),
            None,
            None,
            KernelConfig {
                deadlines: Deadlines {
                    tool: DEADLINE,
                    ..Deadlines::default()
                },
                ..KernelConfig::default()
            },
            GateConfig::locked_down(),
        )
        .expect("harness");
        h.load_fixture("stall").await.expect("stall");
        h
    });
    let mut group = c.benchmark_group("stop_a_guest");
    group.sample_size(20);
    group.bench_function("ctrl_c_to_result_spinning_tool", |b| {
        b.iter_custom(|iterations| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    h.kernel.begin_turn();
                    let mut bus = h.kernel.events();
                    let kernel = h.kernel.clone();
                    let call =
                        tokio::spawn(async move { kernel.call_tool("stall_spin", "{}").await });
                    while bus.recv().await.expect("bus").topic != "fixture.stall.started" {}
                    let pressed = Instant::now();
                    h.kernel.cancel_turn();
                    let outcome = call.await.expect("call");
                    total += pressed.elapsed();
                    assert!(outcome.contains("cancelled the turn"), "{outcome}");
                }
                total
            })
        })
    });
    group.bench_function("sleeping_tool_to_result_at_200ms_deadline", |b| {
        b.iter_custom(|iterations| {
            rt.block_on(async {
                h.kernel.begin_turn();
                let started = Instant::now();
                for _ in 0..iterations {
                    let outcome = h.kernel.call_tool("stall_sleep", "{}").await;
                    assert!(outcome.contains("did not finish"), "{outcome}");
                }
                started.elapsed()
            })
        })
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    call_bounds(&mut c);
    c.final_summary();
}
