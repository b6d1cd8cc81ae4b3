//! However hard plugins push, what the kernel holds for them stays bounded: five copies of the
//! `flood` fixture fill every kernel-side structure they can reach (tools, prompt fragments,
//! kept state, event queues to slow subscribers, the host's display ring) until refused, and
//! the host's peak RSS grows by less than the stated ceiling.
//!
//! RSS is a property of the whole process, and the other tests of this binary run beside this
//! one, so the flood runs in a child process of its own: this binary again, with only the
//! ignored test `flood_child` selected.

use keel_tests::Harness;

/// The most the host may grow while plugins flood it, in MiB: the kernel-side totals
/// (64 MiB of queued events, 64 MiB of state, the display ring's 256 events of at most
/// 256 KiB, 4.5 MiB of tools and fragments) and the flooders' own guest memory.
const CEILING_MIB: u64 = 320;

const COPIES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// `VmRSS` or `VmHWM` of this process, in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[test]
#[ignore = "run by `flooding_plugins_cannot_grow_the_host_past_its_ceiling` in a process of its own"]
fn flood_child() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let h = Harness::new(dir.path(), None)?;
        // The host keeps a receiver, as a session's display does, and never reads it.
        let _display = h.kernel.events();
        for prefix in COPIES {
            let mut package = h.fixture("flood")?;
            package.manifest.name = format!("flood-{prefix}");
            package.manifest.config = serde_json::json!({ "prefix": prefix });
            h.kernel.load(package).await?;
        }
        let before = status_kib("VmRSS:");
        let mut answers = Vec::new();
        for prefix in COPIES {
            answers.push(h.kernel.call_tool(&format!("flood_{prefix}"), "{}").await);
        }
        let peak = status_kib("VmHWM:");
        for answer in &answers {
            println!("ANSWER {answer}");
        }
        println!("TOOLS {}", h.kernel.tools().len());
        println!("GROWTH_KIB {}", peak.saturating_sub(before));
        anyhow::Ok(())
    })
}

#[test]
fn flooding_plugins_cannot_grow_the_host_past_its_ceiling() -> anyhow::Result<()> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args([
            "memory_bounds::flood_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = |key: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in:\n{stdout}"))
    };
    let growth_mib = value("GROWTH_KIB") / 1024;
    println!("peak RSS growth under the flood: {growth_mib} MiB (ceiling {CEILING_MIB} MiB)");
    // Every flooder was refused somewhere, with the kernel's words.
    let answers: Vec<&str> = stdout.lines().filter(|l| l.contains("ANSWER")).collect();
    assert_eq!(answers.len(), COPIES.len(), "{stdout}");
    for answer in &answers {
        assert!(answer.contains("refusals:"), "{answer}");
    }
    // Each total across plugins was reached, not only each plugin's own share.
    assert!(
        stdout.contains("all subscribers' queues together hold 64 MiB"),
        "the total of queued events was never reached:\n{stdout}"
    );
    assert!(
        stdout.contains("bytes of plugins' state"),
        "the total of kept state was never reached:\n{stdout}"
    );
    // 4 MiB of 8 KiB tool descriptions across all copies is about 500; 512 KiB of 8 KiB
    // fragments, 64 (five copies would add 80 without the total).
    assert!(value("TOOLS") < 520, "{stdout}");
    let fragments: u64 = answers
        .iter()
        .filter_map(|a| {
            a.split("fragments ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(
        (1..=64).contains(&fragments),
        "{fragments} fragments:\n{stdout}"
    );
    assert!(
        growth_mib < CEILING_MIB,
        "the host grew by {growth_mib} MiB:\n{stdout}"
    );
    Ok(())
}
