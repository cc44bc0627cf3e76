//! The GPU-only build agrees with the CPU build: the same run, resumed by each, takes the same
//! steps; a checkpoint written by either evaluates and samples alike on both.
//!
//! The GPU side is a separate build, the one the README names for GPUs
//! (`--no-default-features --features wgpu`), run through its binaries; the CPU side is this
//! build's (flex). `.ci/run` builds the GPU binaries, copies them into a folder of their own and
//! runs these tests on Mesa's software Vulkan driver (lavapipe):
//!
//! ```text
//! CINDER_GPU_BINARIES=<folder> CUBECL_WGPU_DEFAULT_DEVICE=Cpu \
//!     cargo test --release -p cinder --test backends -- --ignored
//! ```
//!
//! The README's test command skips them: it has no GPU build to compare with.
#![cfg(any(feature = "flex", feature = "ndarray"))]

mod common;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use cinder::run::metrics;
use cinder::storage::names::LATEST;
use common::{corpus_in, stdout_of, tiny_flags_with};

/// A binary of the GPU-only build, running on the GPU.
fn gpu(bin: &str) -> Command {
    let dir = std::env::var_os("CINDER_GPU_BINARIES").unwrap_or_else(|| {
        panic!(
            "set CINDER_GPU_BINARIES to the folder of the binaries built with \
             `cargo build --profile gpu-check -p cinder --no-default-features --features wgpu`"
        )
    });
    let mut cmd = Command::new(Path::new(&dir).join(bin));
    cmd.args(["--device", "gpu"]);
    cmd
}

/// A binary of this build, running on the CPU.
fn cpu(bin: &str) -> Command {
    let mut cmd = Command::cargo_bin(bin).unwrap();
    cmd.args(["--device", "cpu"]);
    cmd
}

/// Copies the run folder `from` to `to`.
fn copy_run(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_run(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Trains `flags` (which stop at step 10) on the CPU, then resumes that run to step 14 on the CPU (in
/// `dir/cpu`) and on the GPU (in `dir/gpu`), and checks that the two took the same steps: the
/// train losses of steps 11-14 and the last validation loss agree within 1e-3.
///
/// wgpu tunes its kernels by timing them on their first uses, so the GPU's choices differ from
/// run to run; the steps do not (8 runs in 8 agreed with the CPU to 1e-6, each tuning afresh).
/// They did differ, by 0.05, while each OS thread had a CubeCL stream of its own: 3 runs in 10
/// with the same tuned kernels, which the retries this test had then made pass (BENCHMARKS.md,
/// section 31). So one run must agree.
fn cpu_and_gpu_steps_agree(dir: &Path, flags: &[String]) -> [PathBuf; 2] {
    let corpus = corpus_in(dir);
    let on_cpu = dir.join("cpu");
    let on_gpu = dir.join("gpu");
    cpu("train")
        .current_dir(dir)
        .args(flags)
        .args(["--quiet", "--data"])
        .arg(&corpus)
        .arg("--out")
        .arg(&on_cpu)
        .assert()
        .success();
    copy_run(&on_cpu, &on_gpu);
    // Resumes `run` to step 14.
    let resume = |mut train: Command, run: &Path| {
        train
            .current_dir(dir)
            .args(["--max-iters", "14", "--quiet", "--resume"])
            .arg(run)
            .assert()
            .success();
    };
    resume(cpu("train"), &on_cpu);
    resume(gpu("train"), &on_gpu);
    let resumed = |run: &Path| -> Vec<_> {
        let rows = metrics::read(&run.join("metrics.csv")).unwrap();
        let rows = rows.into_iter().filter(|r| r.iter > 10);
        rows.map(|r| (r.iter, r.train_loss, r.val_loss)).collect()
    };
    let (a, b) = (resumed(&on_cpu), resumed(&on_gpu));
    let iters: Vec<u64> = a.iter().map(|r| r.0).collect();
    assert_eq!(iters, [11, 12, 13, 14], "cpu {a:?}");
    assert!(
        a.iter().any(|r| r.2.is_some()),
        "no evaluation after the resume: {a:?}"
    );
    assert_eq!(a.len(), b.len(), "cpu {a:?}\ngpu {b:?}");
    let close = |p: f32, q: f32| (p - q).abs() < 1e-3;
    for (x, y) in a.iter().zip(&b) {
        let same_val =
            x.2.is_some() == y.2.is_some() && x.2.zip(y.2).is_none_or(|(p, q)| close(p, q));
        assert!(
            x.0 == y.0 && close(x.1, y.1) && same_val,
            "iteration {}: cpu {x:?} gpu {y:?}",
            x.0
        );
    }
    [on_cpu, on_gpu]
}

/// The loss `evaluate` prints for `checkpoint`.
fn evaluated(mut evaluate: Command, checkpoint: &Path) -> f64 {
    let out = stdout_of(evaluate.arg("--quiet").arg("--checkpoint").arg(checkpoint));
    out.split_whitespace()
        .nth(1)
        .and_then(|loss| loss.parse().ok())
        .unwrap_or_else(|| panic!("no loss in {out:?}"))
}

/// What `generate` writes greedily (cached decoding) from `checkpoint`.
fn greedy(mut generate: Command, checkpoint: &Path) -> String {
    stdout_of(
        generate
            .args([
                "--quiet",
                "--temperature",
                "0",
                "--max-new-tokens",
                "40",
                "--checkpoint",
            ])
            .arg(checkpoint),
    )
}

#[test]
#[ignore = "needs the GPU-only binaries in CINDER_GPU_BINARIES (see .ci/run)"]
fn same_steps_and_checkpoints_cross_over() {
    let dir = tempfile::tempdir().unwrap();
    // nanoGPT's recipe (AdamW, learned positions, LayerNorm, GELU, tied head), without dropout.
    let runs = cpu_and_gpu_steps_agree(
        dir.path(),
        &tiny_flags_with(&[("--dropout", "0"), ("--max-iters", "10")]),
    );
    // Each checkpoint, written on one backend, evaluates and samples alike on both.
    for run in runs {
        let checkpoint = run.join(LATEST);
        let (x, y) = (
            evaluated(cpu("evaluate"), &checkpoint),
            evaluated(gpu("evaluate"), &checkpoint),
        );
        assert!((x - y).abs() <= 2e-4, "{}: cpu {x} gpu {y}", run.display());
        assert_eq!(
            greedy(cpu("generate"), &checkpoint),
            greedy(gpu("generate"), &checkpoint),
            "{}",
            run.display()
        );
    }
}

#[test]
#[ignore = "needs the GPU-only binaries in CINDER_GPU_BINARIES (see .ci/run)"]
fn the_default_recipe_and_muon_take_the_same_steps() {
    // The default run's recipe (RoPE, RMSNorm, QK-norm, ReLU², an untied zero-initialised head,
    // Muon and the trapezoid) at the tiny config's size: every option is fused on the CPU and
    // composite on wgpu, Muon's update included.
    let dir = tempfile::tempdir().unwrap();
    let size = [
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "32",
        "--block-size",
        "16",
        "--batch-size",
        "4",
        "--max-iters",
        "10",
        "--warmup-iters",
        "5",
        "--eval-interval",
        "5",
        "--eval-iters",
        "2",
        "--checkpoint-interval",
        "5",
        "--log-interval",
        "1",
        "--sample-tokens",
        "0",
    ];
    let flags: Vec<String> = size.iter().map(|s| s.to_string()).collect();
    cpu_and_gpu_steps_agree(dir.path(), &flags);
}

#[test]
#[ignore = "needs the GPU-only binaries in CINDER_GPU_BINARIES (see .ci/run)"]
fn no_adapter_is_an_error_naming_the_vulkan_packages() {
    // Asking wgpu for a 100th discrete GPU leaves it without an adapter on any machine.
    let dir = tempfile::tempdir().unwrap();
    let out = gpu("train")
        .env("CUBECL_WGPU_DEFAULT_DEVICE", "DiscreteGpu(99)")
        .args(["--max-iters", "1", "--out"])
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("no usable graphics adapter")
            && stderr.contains("mesa-vulkan-drivers libvulkan1")
            && stderr.contains("--device cpu"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
