//! `bench`: times the training step and sampling, for side-by-side comparisons with PyTorch.
//! Prints one JSON line, like `../shared/bench/torch_reference.py`.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::Module;
use burn::prelude::*;
use cinder::cli::{Overrides, RunOn, exit_on_error};
use cinder::config::TrainConfig;
use cinder::data::{TokenizerChoice, TrainingData};
use cinder::device::Backend;
use cinder::run::trainer::Trainer;
use cinder::sampling::SamplingParams;
use cinder::sampling::generate::{GenerateOptions, generate};
use clap::{Parser, Subcommand};

/// Time cinder's training step or its sampling; prints one JSON line.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Run configuration (TOML)
    #[arg(long, default_value = cinder::run::start::DEFAULT_CONFIG)]
    config: PathBuf,
    /// Text to draw batches from
    #[arg(long, default_value = cinder::run::start::DEFAULT_DATA)]
    data: PathBuf,
    #[command(flatten)]
    run_on: RunOn,
    #[command(subcommand)]
    mode: Mode,
    #[command(flatten)]
    overrides: Overrides,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Median time of a training step (forward, backward, the optimizer) after warm-up
    Train {
        /// Untimed steps first
        #[arg(long, default_value_t = 5)]
        warmup_steps: usize,
        /// Timed steps
        #[arg(long, default_value_t = 50,
              value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        steps: usize,
    },
    /// Tokens per second sampling from a freshly initialised model (generate's default
    /// temperature)
    Sample {
        /// Tokens to generate
        #[arg(long, default_value_t = 500)]
        tokens: usize,
        /// Re-run the whole context per token
        #[arg(long)]
        no_cache: bool,
    },
    /// Median time of each phase of the training step (the trainer's own report): batch,
    /// forward and loss, backward, clipping and the optimizer (`clip_adamw_ms`, Muon's update too)
    Breakdown {
        /// Timed steps
        #[arg(long, default_value_t = 30)]
        steps: usize,
    },
    /// Peak matrix-multiply throughput of the backend (GFLOP/s), the reference for MFU
    Peak,
    /// Median time to load a checkpoint or a Hugging Face folder (GPT-2, NanoChat): configuration,
    /// tokenizer and weights (the files' pages warm after the first run)
    Load {
        /// A run folder, checkpoint folder or Hugging Face folder
        #[arg(long)]
        checkpoint: PathBuf,
        /// Timed loads
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
}

fn main() {
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> anyhow::Result<()> {
    let mut config = TrainConfig::load(&args.config)?;
    args.overrides.apply(&mut config);
    config.validate()?;
    let backend = Backend::select(args.run_on.device)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = serde_json::json!({
        "impl": format!("cinder-{}", backend.name),
        "threads": threads,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_embd": config.n_embd,
        "block_size": config.block_size, "batch_size": config.batch_size,
    });
    match args.mode {
        Mode::Train {
            warmup_steps,
            steps,
        } => {
            let mut t = trainer(&args.data, &config, &backend)?.with_ops(args.run_on.ops.into());
            out["ops"] = t.ops().name().into();
            let params = t.model().num_params();
            let matmul_params = matmul_params(t.model());
            for _ in 0..warmup_steps {
                t.step();
            }
            let mut times: Vec<f64> = (0..steps).map(|_| t.step().seconds).collect();
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let tokens = config.tokens_per_iter() as f64;
            let flops = flops_per_iter(&config, matmul_params);
            let peak = peak_gflops(&backend.device);
            out["params"] = params.into();
            out["ms_per_iter"] = round(median * 1e3, 3).into();
            out["tokens_per_s"] = round(tokens / median, 1).into();
            out["model_gflop_per_iter"] = round(flops / 1e9, 3).into();
            out["achieved_gflops"] = round(flops / median / 1e9, 2).into();
            out["peak_gflops"] = round(peak, 2).into();
            out["mfu"] = round(flops / median / 1e9 / peak, 4).into();
        }
        Mode::Sample { tokens, no_cache } => {
            let device = backend.device.clone();
            device.seed(config.seed);
            let model = config
                .model(65)
                .init(&device)?
                .with_ops(args.run_on.ops.into());
            let opts = GenerateOptions {
                max_new_tokens: tokens,
                num_samples: 1,
                sampling: SamplingParams {
                    temperature: cinder::sampling::DEFAULT_TEMPERATURE,
                    top_k: None,
                    ..SamplingParams::default()
                },
                seed: config.seed,
                use_cache: !no_cache,
                tokens: model.vocab_size(),
            };
            let start = Instant::now();
            generate(&model, &[0], &opts, &device, |_| {});
            let secs = start.elapsed().as_secs_f64();
            out["tokens"] = tokens.into();
            out["cache"] = (!no_cache).into();
            out["ops"] = model.ops.on(&device).name().into();
            out["tokens_per_s"] = round(tokens as f64 / secs, 1).into();
        }
        Mode::Breakdown { steps } => {
            let mut t = trainer(&args.data, &config, &backend)?.with_ops(args.run_on.ops.into());
            out["ops"] = t.ops().name().into();
            for _ in 0..3 {
                t.step();
            }
            let reports: Vec<_> = (0..steps.max(1)).map(|_| t.step().phases).collect();
            for (i, (name, _)) in reports[0].named().iter().enumerate() {
                let mut ms: Vec<f64> = reports.iter().map(|p| p.named()[i].1 * 1e3).collect();
                ms.sort_by(f64::total_cmp);
                out[format!("{name}_ms")] = round(ms[ms.len() / 2], 3).into();
            }
        }
        Mode::Peak => {
            out["peak_gflops"] = round(peak_gflops(&backend.device), 2).into();
        }
        Mode::Load { checkpoint, runs } => {
            let mut times = Vec::new();
            for _ in 0..runs.max(1) {
                let start = Instant::now();
                let loaded = cinder::storage::checkpoint::load(
                    &checkpoint,
                    &[cinder::storage::names::BEST, cinder::storage::names::LATEST],
                    &backend.device,
                )?;
                // Weights are read into tensors by now; touch one to be sure nothing is lazy.
                let _ = loaded.model.wte.weight.val().into_data();
                times.push(start.elapsed().as_secs_f64());
                out["params"] = loaded.model.num_params().into();
            }
            times.sort_by(f64::total_cmp);
            out["load_s"] = round(times[times.len() / 2], 3).into();
            out["load_s_all"] = times
                .iter()
                .map(|t| round(*t, 3))
                .collect::<Vec<_>>()
                .into();
        }
    }
    out["peak_rss_mb"] = peak_rss_mb().map(|m| round(m, 1)).into();
    println!("{out}");
    Ok(())
}

/// A new run on `data` that writes nowhere it matters (the benchmarks never checkpoint).
fn trainer(
    data: &std::path::Path,
    config: &TrainConfig,
    backend: &Backend,
) -> anyhow::Result<Trainer> {
    let out = std::env::temp_dir().join(format!("cinder-bench-{}", std::process::id()));
    let d = TrainingData::open(
        &[data.to_path_buf()],
        &TokenizerChoice::of(config),
        config,
        Some(&out),
        &mut |_, _, _| {},
    )?;
    Ok(Trainer::new(config.clone(), backend.clone(), d, out)?)
}

/// Model FLOPs of one training step (forward and backward), as nanoGPT's `estimate_mfu` counts
/// them: 6 per weight that multiplies per token (`params`, from [`matmul_params`]), plus
/// attention's 12 * n_layer * n_embd * block_size.
fn flops_per_iter(c: &TrainConfig, params: usize) -> f64 {
    let per_token = 6.0 * params as f64 + 12.0 * (c.n_layer * c.n_embd * c.block_size) as f64;
    per_token * c.tokens_per_iter() as f64
}

/// The weights that take part in a matrix product: all but the learned positions (a lookup, as
/// nanoGPT's `get_num_params` leaves them out) and, with an untied head, the token embedding
/// (a lookup too; the head is counted as `lm_head`). Tied, the table is counted once, as the head.
fn matmul_params(model: &cinder_model::Gpt) -> usize {
    let table = |w: &burn::module::Param<Tensor<2>>| w.lazy_shape().num_elements();
    let wpe = model.wpe.as_ref().map_or(0, |e| table(&e.weight));
    let untied_table = model
        .lm_head
        .as_ref()
        .map_or(0, |_| table(&model.wte.weight));
    model.num_params() - wpe - untied_table
}

/// Best GFLOP/s of a 1024 x 1024 x 1024 matrix multiply on `device`, over a few runs.
fn peak_gflops(device: &Device) -> f64 {
    let n = 1024;
    let a = Tensor::<2>::random([n, n], burn::tensor::Distribution::Default, device);
    let b = Tensor::<2>::random([n, n], burn::tensor::Distribution::Default, device);
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        let start = Instant::now();
        let _ = a
            .clone()
            .matmul(b.clone())
            .slice([0..1, 0..1])
            .into_scalar::<f32>();
        best = best.min(start.elapsed().as_secs_f64());
    }
    2.0 * (n * n * n) as f64 / best / 1e9
}

/// The process's peak resident memory, from /proc (Linux).
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}
