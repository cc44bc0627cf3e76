//! Test-only hooks, driven by environment variables, so that the crash and disk-full tests
//! (`tests/soak.rs`) hit the moments they aim at every time, and `--time`'s planned runs
//! (`tests/time_budget.rs`) choose the same plan on any machine. Compiled in only with the
//! `fault-injection` feature (the tests that need it declare it); without it the hooks do
//! nothing, and no binary reads these variables.
//!
//! - `CINDER_TEST_STALL=<point>:<n>`: the `n`-th time the program reaches `point` (1 for the
//!   first), it prints `cinder-test: stalled at <point> #<n>` on stderr and waits there until it
//!   is killed. The points are named where [`reached`] is called: `step`, `eval`, and the three
//!   moments of a checkpoint write (`checkpoint-written`, `checkpoint-swapped`,
//!   `checkpoint-installed`; see [`crate::storage::checkpoint`]).
//! - `CINDER_TEST_WRITE_BUDGET=<bytes>`: checkpoint files may write this many bytes in all; the
//!   write that goes past it fails with "No space left on device" (ENOSPC), as on a full disk.
//! - `CINDER_TEST_SPEEDS=<json>`: `--time` takes these speeds instead of measuring the machine,
//!   so that its plan is the same on any machine (see [`crate::run::plan`]).

#[cfg(feature = "fault-injection")]
pub use hooks::*;

/// Without the feature: the program is never stalled, and writes never fail on purpose.
#[cfg(not(feature = "fault-injection"))]
mod off {
    /// Does nothing.
    #[inline(always)]
    pub fn reached(_point: &str) {}

    /// All `bytes` fit.
    #[inline(always)]
    pub fn take_write_budget(bytes: usize) -> Result<usize, (usize, std::io::Error)> {
        Ok(bytes)
    }

    /// The machine is measured.
    #[inline(always)]
    pub fn injected_speeds() -> Option<String> {
        None
    }
}
#[cfg(not(feature = "fault-injection"))]
pub use off::*;

#[cfg(feature = "fault-injection")]
mod hooks {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};

    const STALL: &str = "CINDER_TEST_STALL";
    const WRITE_BUDGET: &str = "CINDER_TEST_WRITE_BUDGET";
    const SPEEDS: &str = "CINDER_TEST_SPEEDS";

    /// The speeds `--time` takes instead of measuring, as `CINDER_TEST_SPEEDS` gives them.
    pub fn injected_speeds() -> Option<String> {
        std::env::var(SPEEDS).ok()
    }

    /// ENOSPC on Linux and macOS.
    const NO_SPACE: i32 = 28;

    fn stall_at() -> Option<&'static (String, u64)> {
        static AT: OnceLock<Option<(String, u64)>> = OnceLock::new();
        AT.get_or_init(|| {
            let value = std::env::var(STALL).ok()?;
            let (point, n) = value.rsplit_once(':')?;
            Some((point.to_string(), n.parse().ok()?))
        })
        .as_ref()
    }

    /// Called each time the program reaches `point`; stalls there if `CINDER_TEST_STALL` says so.
    pub fn reached(point: &str) {
        let Some((at, n)) = stall_at() else {
            return;
        };
        if at != point {
            return;
        }
        static COUNTS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);
        let count = {
            let mut counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
            let c = counts
                .get_or_insert_with(HashMap::new)
                .entry(point.to_string())
                .or_insert(0);
            *c += 1;
            *c
        };
        if count == *n {
            eprintln!("cinder-test: stalled at {point} #{n}");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }

    /// Takes `bytes` from the checkpoint write budget: `Ok(bytes)` when they fit, or the number of
    /// bytes that still fit and the error a full disk gives.
    pub fn take_write_budget(bytes: usize) -> Result<usize, (usize, std::io::Error)> {
        static LEFT: OnceLock<Option<AtomicU64>> = OnceLock::new();
        let Some(left) = LEFT.get_or_init(|| {
            let budget = std::env::var(WRITE_BUDGET).ok()?.parse().ok()?;
            Some(AtomicU64::new(budget))
        }) else {
            return Ok(bytes);
        };
        let had = left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                Some(l.saturating_sub(bytes as u64))
            })
            .unwrap_or(0);
        if had >= bytes as u64 {
            Ok(bytes)
        } else {
            Err((had as usize, std::io::Error::from_raw_os_error(NO_SPACE)))
        }
    }
}
