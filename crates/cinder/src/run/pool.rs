//! The thread pool a training step and an evaluation run in, entered here and nowhere else in
//! cinder.
//!
//! On the CPU backend the kernels split their loops over rayon's global pool. A loop started from
//! a thread outside the pool is a hand-off to the pool and a wait for it to come back, for every
//! operation; one started from a pool thread starts at once, and a loop too small to split runs in
//! place (BENCHMARKS.md, "Hand-offs"). So a whole training step, backward pass and optimizer
//! included, and each evaluation pass run on a pool thread. (`Gpt::forward` and the cached passes
//! of sampling choose their pool themselves, inside `cinder-model`; `Gpt::loss` and the backward
//! pass leave it to the caller: to this.) The results are the same on any thread.

/// Runs `f` on one of rayon's threads and returns what it returns.
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}
