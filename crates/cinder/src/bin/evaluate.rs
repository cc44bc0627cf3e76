//! `evaluate`: loss, perplexity and bits per character of a checkpoint on a text.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, bail};
use cinder::cli::{RunOn, exit_on_error};
use cinder::data::{TokenizerChoice, TrainingData};
use cinder::device::Backend;
use cinder::run::eval::{TextLoss, text_loss, text_surprise};
use cinder::sampling::token_text;
use cinder::storage::checkpoint;
use cinder::storage::names::READ;
use cinder_data::{Corpus, Split, Tokenizer};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

/// Measure a checkpoint on a text: loss, perplexity and bits per character.
///
/// The text is cut into consecutive windows of the model's context length (a shorter text is one
/// window); every token of a window is predicted from the ones before it in the window. A
/// Hugging Face folder (GPT-2, NanoChat) can be measured too (with --data).
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// A run folder (its best/ checkpoint, else latest/), a checkpoint folder, or a Hugging
    /// Face folder (GPT-2, NanoChat)
    #[arg(long, default_value = cinder::run::start::DEFAULT_RUN)]
    checkpoint: PathBuf,
    /// Text to measure on (UTF-8) [default: the run's own split, see --split]
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// Without --data: which part of the run's training text to measure on
    #[arg(long, value_enum, default_value_t = SplitArg::Val, conflicts_with = "data")]
    split: SplitArg,
    /// Windows per batch
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Also write each predicted token's surprise (-log p) to FILE as CSV: position, id, token,
    /// surprise in nats and in bits (the loss printed is their mean). FILE must not exist
    #[arg(long, value_name = "FILE")]
    per_token: Option<PathBuf>,
    /// Print only the numbers line
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    run_on: RunOn,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SplitArg {
    Train,
    Val,
}

fn main() {
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> anyhow::Result<()> {
    if args.batch_size == 0 {
        bail!("--batch-size is 0, but it must be at least 1");
    }
    if let Some(path) = &args.per_token
        && path.exists()
    {
        bail!(
            "{} exists already: --per-token writes a new file (name another, or move it away)",
            path.display()
        );
    }
    let backend = Backend::select(args.run_on.device)?;
    let checkpoint::Loaded {
        dir,
        meta,
        tokenizer,
        model,
    } = checkpoint::load(&args.checkpoint, &READ, &backend.device)?;
    let block = meta.config.block_size;
    let (ids, what) = match &args.data {
        Some(path) => {
            let corpus = Corpus::open(path)?;
            let text: String = corpus.chars()?.collect();
            let ids = tokenizer
                .encode(&text)
                .map_err(|e| anyhow::anyhow!("{} does not fit the model: {e}", path.display()))?;
            (ids, path.display().to_string())
        }
        None => {
            let paths = meta.data_paths();
            if paths.is_empty() {
                bail!(
                    "{} has no training text to split: pass a text with --data",
                    dir.display()
                );
            }
            let data = TrainingData::open(
                &paths,
                &TokenizerChoice::Keep(Box::new(tokenizer.clone())),
                &meta.config,
                None,
                &mut |_, _, _| {},
            )
            .with_context(|| "cannot load the run's training data: pass a text with --data")?;
            let split = match args.split {
                SplitArg::Train => Split::Train,
                SplitArg::Val => Split::Val,
            };
            let ids = data.splits.get(split).to_vec();
            (
                ids,
                format!("the {} split of {}", split.name(), paths[0].display()),
            )
        }
    };
    if ids.len() < 2 {
        bail!(
            "{what} has {} {}, but measuring needs at least 2: give a longer text",
            ids.len(),
            tokenizer.unit(),
        );
    }
    if ids.len() <= block && !args.quiet {
        eprintln!(
            "{what} is shorter than the context ({block} {}): measuring it as one window of {}",
            tokenizer.unit(),
            ids.len() - 1
        );
    }
    if !args.quiet {
        eprintln!(
            "cinder {}: {}; checkpoint {} (iteration {})",
            env!("CARGO_PKG_VERSION"),
            backend.describe(),
            dir.display(),
            meta.iter
        );
    }
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} windows [{elapsed_precise} < {eta_precise}]",
            )
            .expect("valid template"),
        );
        bar
    });
    let progress = |done: usize, total: usize| {
        if let Some(bar) = &bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    };
    let model = model.with_ops(args.run_on.ops.into());
    let result = match &args.per_token {
        None => text_loss(&model, &ids, args.batch_size, &backend.device, progress),
        Some(path) => {
            let surprise = text_surprise(&model, &ids, args.batch_size, &backend.device, progress);
            write_per_token(path, &tokenizer, &ids[1..=surprise.len()], &surprise)?;
            let total: f64 = surprise.iter().map(|&s| f64::from(s)).sum();
            TextLoss {
                loss: total / surprise.len() as f64,
                predicted: surprise.len(),
            }
        }
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // The bytes of normalised UTF-8 text the predicted tokens stand for.
    let bytes: usize = ids[1..=result.predicted]
        .iter()
        .map(|&id| tokenizer.token_bytes(id).len())
        .sum();
    let bits_per_byte = result.bits_per_token() * result.predicted as f64 / bytes.max(1) as f64;
    if !args.quiet {
        // Windows of the context follow one another; what is left after the last whole one
        // is not predicted (text_loss), and is said so.
        let left = match ids.len() - 1 - result.predicted {
            0 => String::new(),
            n => format!(
                "; the last {n} {}, short of a window of {}, not predicted",
                tokenizer.unit(),
                model.block_size()
            ),
        };
        println!(
            "{what}: {} {} predicted ({bytes} bytes){left}",
            result.predicted,
            tokenizer.unit()
        );
    }
    let per = match tokenizer {
        Tokenizer::Char(_) => "char",
        Tokenizer::Bpe(_) => "token",
    };
    println!(
        "loss {:.4} nats/{per}, perplexity {:.3}, {:.4} bits/{per}, {bits_per_byte:.4} bits/byte",
        result.loss,
        result.perplexity(),
        result.bits_per_token()
    );
    Ok(())
}

/// Writes `surprise[i]` of token `ids[i]` (the i-th token predicted) as CSV to `path`, a new file.
fn write_per_token(
    path: &std::path::Path,
    tokenizer: &Tokenizer,
    ids: &[u32],
    surprise: &[f32],
) -> anyhow::Result<()> {
    use std::io::Write;
    let file = std::fs::File::create_new(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let write = |out: &mut std::io::BufWriter<std::fs::File>| -> std::io::Result<()> {
        writeln!(out, "position,id,token,surprise_nats,surprise_bits")?;
        for (i, (&id, &s)) in ids.iter().zip(surprise).enumerate() {
            // CSV quoting: the token in quotes, its quotes doubled.
            let token = token_text(tokenizer, id).replace('"', "\"\"");
            let bits = f64::from(s) / std::f64::consts::LN_2;
            writeln!(out, "{},{id},\"{token}\",{s:.6},{bits:.6}", i + 1)?;
        }
        out.flush()
    };
    write(&mut out).with_context(|| format!("cannot write {}", path.display()))
}
