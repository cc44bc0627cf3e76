//! `generate`: samples text from a trained checkpoint.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use cinder::cli::{RunOn, exit_on_error};
use cinder::device::Backend;
use cinder::sampling::generate::{GenerateOptions, generate};
use cinder::sampling::{
    DEFAULT_PROMPT, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, PromptError, SamplingParams, prompt_ids,
};
use cinder::storage::checkpoint;
use cinder::storage::names::READ;
use cinder_data::TextStream;
use clap::Parser;

/// Sample text from a trained cinder checkpoint.
///
/// Streams each sample to stdout as it is generated; a summary with the speed goes to stderr.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// A run folder (its best/ checkpoint, else latest/), a checkpoint folder, or a Hugging
    /// Face folder (GPT-2, NanoChat)
    #[arg(long, default_value = cinder::run::start::DEFAULT_RUN)]
    checkpoint: PathBuf,
    /// Text to continue
    #[arg(long, default_value = DEFAULT_PROMPT, conflicts_with = "prompt_file")]
    prompt: String,
    /// Read the text to continue from this file
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// Drop prompt characters the vocabulary lacks (they are listed) instead of failing
    #[arg(long)]
    drop_unknown: bool,
    /// Tokens to generate per sample
    #[arg(long, default_value_t = 500)]
    max_new_tokens: usize,
    /// Softmax temperature; 0 always picks the most likely token (greedy)
    #[arg(long, default_value_t = DEFAULT_TEMPERATURE, allow_negative_numbers = true)]
    temperature: f32,
    /// Sample only among the k most likely tokens
    #[arg(long, default_value_t = DEFAULT_TOP_K)]
    top_k: usize,
    /// Sample only among the most likely tokens whose probabilities reach p, in (0, 1]
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Number of samples, generated together as one batch
    #[arg(long, default_value_t = 1)]
    num_samples: usize,
    /// Seed of the sampling; the same seed and options give the same text
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Re-run the whole window for every token instead of using the key/value cache (past the
    /// context: exact windows, also with RoPE, whose cache slides)
    #[arg(long)]
    no_cache: bool,
    /// Print only the generated text (no prompt echo, separators or summary)
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    run_on: RunOn,
}

fn main() {
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> anyhow::Result<()> {
    check_flags(&args)?;
    let backend = Backend::select(args.run_on.device)?;
    let checkpoint::Loaded {
        dir,
        meta,
        tokenizer,
        model,
    } = checkpoint::load(&args.checkpoint, &READ, &backend.device)?;
    if !args.quiet {
        eprintln!(
            "cinder {}: {}; checkpoint {} (iteration {}, val loss {})",
            env!("CARGO_PKG_VERSION"),
            backend.describe(),
            dir.display(),
            meta.iter,
            meta.val_loss.map_or("-".into(), |v| format!("{v:.4}"))
        );
    }

    let prompt_text = match &args.prompt_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read prompt file {}", path.display()))?,
        None => args.prompt.clone(),
    };
    let prompt = match prompt_ids(&tokenizer, &prompt_text, false) {
        Err(PromptError::DoesNotFit(e)) if args.drop_unknown => {
            eprintln!("dropping prompt characters the vocabulary lacks: {e}");
            prompt_ids(&tokenizer, &prompt_text, true)?
        }
        Err(PromptError::DoesNotFit(e)) => {
            bail!("the prompt does not fit the model: {e}. Remove them, or pass --drop-unknown")
        }
        other => other?,
    };

    let opts = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        num_samples: args.num_samples,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: Some(args.top_k),
            top_p: args.top_p,
        },
        seed: args.seed,
        use_cache: !args.no_cache,
        tokens: tokenizer.vocab_size(),
    };
    let prompt_str = tokenizer.decode(&prompt);
    // Not locked: the samples are written from the sampling thread (cinder_model::sampling).
    let mut out = std::io::stdout();
    let separator = "\n---------------\n";
    if !args.quiet {
        write!(out, "{prompt_str}")?;
        out.flush()?;
    }
    let started = Instant::now();
    // The first sample streams as it is generated; the others print when the batch is done.
    // A token may end inside a character: the stream holds such bytes back until they decode.
    let mut stream = TextStream::new(&tokenizer);
    let model = model.with_ops(args.run_on.ops.into());
    let samples = generate(&model, &prompt, &opts, &backend.device, |sample, token| {
        if sample == 0 {
            let _ = write!(out, "{}", stream.push(token));
            let _ = out.flush();
        }
    });
    write!(out, "{}", stream.finish())?;
    let seconds = started.elapsed().as_secs_f64();
    for sample in &samples[1..] {
        write!(out, "{separator}")?;
        if !args.quiet {
            write!(out, "{prompt_str}")?;
        }
        write!(out, "{}", tokenizer.decode(sample))?;
    }
    writeln!(out)?;
    out.flush()?;
    if !args.quiet {
        let tokens = args.max_new_tokens * args.num_samples;
        let unit = tokenizer.unit();
        eprintln!(
            "generated {tokens} {unit} in {seconds:.2} s ({:.0} {unit}/s{})",
            tokens as f64 / seconds.max(1e-9),
            if args.no_cache { ", no cache" } else { "" }
        );
    }
    Ok(())
}

/// Refuses flag values that can't mean anything, naming the flag.
fn check_flags(a: &Args) -> anyhow::Result<()> {
    let bad = |flag: &str, value: String, allowed: &str| {
        bail!("--{flag} is {value}, but it must be {allowed}")
    };
    if a.max_new_tokens == 0 {
        return bad("max-new-tokens", "0".into(), "at least 1");
    }
    if a.num_samples == 0 {
        return bad("num-samples", "0".into(), "at least 1");
    }
    if !(a.temperature >= 0.0 && a.temperature.is_finite()) {
        return bad(
            "temperature",
            a.temperature.to_string(),
            "0 (greedy) or more",
        );
    }
    if a.top_k == 0 {
        return bad("top-k", "0".into(), "at least 1");
    }
    if let Some(p) = a.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return bad("top-p", p.to_string(), "in (0, 1]");
    }
    Ok(())
}
