//! cinder: train a GPT on a text file, sample from it, resume exactly.
//!
//! The model lives in `cinder-model`, the data pipeline in `cinder-data`; this crate holds the
//! program, by concern:
//!
//! - [`config`] and [`cli`]: the run configuration, and the flags that change it;
//! - [`data`]: a run's text or prepared token files, and its tokenizer;
//! - [`device`]: the backend;
//! - [`run`]: starting, resuming and running training, and what it reports;
//! - [`storage`]: file names, checkpoints, Hugging Face folders;
//! - [`sampling`]: generating text;
//! - [`inspect`]: attention maps;
//! - [`memory`]: whether this machine can hold a run at all;
//! - [`faults`]: test-only hooks (a stall, a full disk, injected speeds), compiled in only with
//!   the `fault-injection` feature.
//!
//! The binaries in `src/bin` only parse arguments and report.

pub mod cli;
pub mod config;
pub mod data;
pub mod device;
pub mod faults;
pub mod inspect;
pub mod memory;
pub mod run;
pub mod sampling;
pub mod storage;

/// Burn allocates and frees a buffer for every tensor operation. glibc's allocator hands large
/// freed buffers back to the kernel and takes page faults to get them again; mimalloc keeps them
/// for reuse. Measured in BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tells the allocator to keep freed memory instead of handing it back to the kernel after
/// 10 ms. A training step frees and reallocates the same large buffers (Burn's optimizer makes
/// new parameter and moment tensors every step); handing them back made the kernel zero fresh
/// pages on every step, 12% of the 6-layer step's time (BENCHMARKS.md). Peak memory is the
/// same order: the buffers are reused, not accumulated.
pub fn keep_freed_memory() {
    // mimalloc v3's `mi_option_purge_delay` (mimalloc.h); -1: never purge.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: setting an option is allowed at any time; it only changes when memory is purged.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// Turns Linux's transparent huge pages off for this process (and what it starts), so that a
/// long-running server's memory follows what it holds: the allocator asks for huge pages, and
/// the kernel then keeps each 2 MiB region it touched resident whole, so `serve`'s memory rose
/// in 2 MiB steps over a soak while the bytes it held stayed the same (BENCHMARKS.md section
/// 34). Training keeps them. An error (a Linux older than 3.15) leaves them on; elsewhere than
/// Linux this does nothing.
pub fn without_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let (set, zero): (libc::c_ulong, libc::c_ulong) = (1, 0);
        // SAFETY: PR_SET_THP_DISABLE reads its second argument (1: disable) and requires the
        // other three to be zero; it touches no memory of ours and changes only whether the
        // kernel backs this process's memory with huge pages from now on.
        if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, set, zero, zero, zero) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
