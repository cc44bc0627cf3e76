//! The GPU backend (wgpu) agrees with the CPU backend. Built only with `--features wgpu`; in CI it
//! runs on Mesa's software Vulkan driver (lavapipe) with `CUBECL_WGPU_DEFAULT_DEVICE=Cpu`.
#![cfg(all(feature = "wgpu", any(feature = "flex", feature = "ndarray")))]

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use burn::prelude::*;
use cinder::config::{OptimizerKind, TrainConfig};
use cinder::data::ids_tensor;
use cinder::device::Backend;
use cinder::run::trainer::Trainer;
use cinder::sampling::SamplingParams;
use cinder::sampling::generate::{Decoder, GenerateOptions, generate};
use cinder::storage::checkpoint;
use cinder::storage::names::LATEST;
use common::{corpus_in, tiny_config};

fn gpu() -> Backend {
    Backend::gpu()
        .expect("wgpu needs a Vulkan driver: apt-get install mesa-vulkan-drivers libvulkan1")
}

/// The tiny config without dropout (nanoGPT's recipe: AdamW).
fn config() -> TrainConfig {
    TrainConfig {
        dropout: 0.0,
        ..tiny_config()
    }
}

/// A trainer on `backend` resumed from the checkpoint `from`, or a new one written to `out`.
fn trainer(backend: Backend, dir: &Path, from: Option<&Path>, out: &str) -> Trainer {
    trainer_with(config(), backend, dir, from, out)
}

fn trainer_with(
    config: TrainConfig,
    backend: Backend,
    dir: &Path,
    from: Option<&Path>,
    out: &str,
) -> Trainer {
    let data_path = corpus_in(dir);
    let data = common::training_data(&data_path, &config);
    match from {
        None => Trainer::new(config, backend, data, dir.join(out)).unwrap(),
        Some(ckpt) => {
            let meta = checkpoint::load_meta(ckpt).unwrap();
            Trainer::resume(ckpt, &meta, config, backend, data, dir.join(out)).unwrap()
        }
    }
}

/// A few throwaway steps on the GPU from the checkpoint `ckpt`: wgpu's kernels are fused and
/// autotuned on their first uses, and on lavapipe a step taken while that happens was seen to
/// differ (2 runs in 15 of the agreement test, by 0.017 at its third step). Compared steps then
/// run on settled kernels.
fn settle_kernels(config: TrainConfig, gpu: &Backend, dir: &Path, ckpt: &Path) {
    let mut warm_up = trainer_with(config, gpu.clone(), dir, Some(ckpt), "warm-up");
    for _ in 0..4 {
        warm_up.step();
    }
}

/// Four steps of both trainers, from identical weights and batches, give the same losses.
fn four_steps_agree(on_cpu: &mut Trainer, on_gpu: &mut Trainer) {
    for _ in 0..4 {
        let (a, b) = (on_cpu.step(), on_gpu.step());
        assert!(
            (a.loss - b.loss).abs() < 1e-3,
            "iteration {}: cpu {} gpu {}",
            a.iter,
            a.loss,
            b.loss
        );
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn same_weights_same_logits_same_losses_and_checkpoints_cross_over() {
    let dir = tempfile::tempdir().unwrap();
    let (cpu, gpu) = (common::backend(), gpu());
    // Identical weights on both: written by the CPU, loaded by the GPU.
    let mut on_cpu = trainer(cpu.clone(), dir.path(), None, "cpu");
    on_cpu.run(&mut (), &AtomicBool::new(true)).unwrap();
    let ckpt = dir.path().join("cpu").join(LATEST);
    settle_kernels(config(), &gpu, dir.path(), &ckpt);
    let mut on_gpu = trainer(gpu.clone(), dir.path(), Some(&ckpt), "gpu");

    // Forward pass.
    let ids: Vec<u32> = (0..32).map(|i| (i * 7 % 30) as u32).collect();
    let logits = |t: &mut Trainer, b: &Backend| -> Vec<f32> {
        let model = t.model().valid();
        let x = ids_tensor(&ids, [2, 16], &b.device);
        model
            .forward(x)
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap()
    };
    let diff = max_diff(&logits(&mut on_cpu, &cpu), &logits(&mut on_gpu, &gpu));
    assert!(diff < 1e-4, "logits differ by {diff}");

    // A few training steps from identical weights and batches.
    four_steps_agree(&mut on_cpu, &mut on_gpu);

    // A checkpoint written on the GPU loads and samples on the CPU, and the other way round.
    on_gpu.run(&mut (), &AtomicBool::new(true)).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 20,
        num_samples: 1,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        },
        seed: 1,
        use_cache: true,
        tokens: 1000, // more than the vocabulary: every id may come
    };
    // Each checkpoint samples on both backends: the greedy text written on one backend, fed
    // back through the other's cached decoding, gives the same next-token logits.
    for written in ["gpu", "cpu"] {
        let ckpt = dir.path().join(written).join(LATEST);
        let meta = checkpoint::load_meta(&ckpt).unwrap();
        let model_on = |b: &Backend| checkpoint::load_model(&ckpt, &meta, &b.device).unwrap();
        let (on_cpu, on_gpu) = (model_on(&cpu), model_on(&gpu));
        let text = generate(&on_gpu, &[1], &opts, &gpu.device, |_, _| {});
        assert_eq!(text[0].len(), 20);
        let next = |model: &cinder_model::Gpt, b: &Backend| {
            Decoder::new(model, true, &b.device).next_logits(&text)
        };
        let diff = max_diff(&next(&on_cpu, &cpu), &next(&on_gpu, &gpu));
        assert!(
            diff < 1e-3,
            "{written} checkpoint: cached logits differ by {diff}"
        );
    }
}

/// The default run's recipe (RoPE, RMSNorm, QK-norm, ReLU², an untied zero-initialised head,
/// Muon and the trapezoid) at the tiny config's size.
fn recipe() -> TrainConfig {
    let t = tiny_config();
    TrainConfig {
        n_layer: t.n_layer,
        n_head: t.n_head,
        n_embd: t.n_embd,
        block_size: t.block_size,
        batch_size: t.batch_size,
        max_iters: t.max_iters,
        warmup_iters: t.warmup_iters,
        lr_decay_iters: t.lr_decay_iters,
        eval_interval: t.eval_interval,
        eval_iters: t.eval_iters,
        checkpoint_interval: t.checkpoint_interval,
        ..TrainConfig::default_run()
    }
}

#[test]
fn the_default_recipe_and_muon_steps_agree_across_backends() {
    // Every option is fused on the CPU and composite on wgpu, Muon's update included.
    let dir = tempfile::tempdir().unwrap();
    let (cpu, gpu) = (common::backend(), gpu());
    let c = recipe();
    assert_eq!(c.optimizer, OptimizerKind::Muon);
    let mut on_cpu = trainer_with(c.clone(), cpu, dir.path(), None, "cpu");
    on_cpu.run(&mut (), &AtomicBool::new(true)).unwrap();
    let ckpt = dir.path().join("cpu").join(LATEST);
    settle_kernels(c.clone(), &gpu, dir.path(), &ckpt);
    let mut on_gpu = trainer_with(c, gpu, dir.path(), Some(&ckpt), "gpu");
    four_steps_agree(&mut on_cpu, &mut on_gpu);
}

#[test]
fn no_adapter_is_an_error_naming_the_vulkan_packages() {
    // Asking wgpu for a 100th discrete GPU leaves it without an adapter on any machine.
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::cargo_bin("train")
        .unwrap()
        .env("CUBECL_WGPU_DEFAULT_DEVICE", "DiscreteGpu(99)")
        .args(["--device", "gpu", "--max-iters", "1", "--out"])
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
