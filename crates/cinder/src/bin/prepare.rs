//! `prepare`: encodes texts once into token files that `train --data FOLDER` memory-maps.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use cinder::cli::exit_on_error;
use cinder::config::{TokenizerKind, TrainConfig};
use cinder::data::TokenizerChoice;
use cinder_data::Sources;
use cinder_data::prepared::{self, TRAIN_BIN, VAL_BIN};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

/// Encode texts once into a prepared dataset: train.bin and val.bin (token ids), the tokenizer
/// and meta.json. `train --data FOLDER` then memory-maps the token files, so a text larger than
/// memory trains. The text is streamed: neither it nor its ids are held whole in memory.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// UTF-8 text files, or folders of .txt files (one document each, in name order)
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    data: Vec<PathBuf>,
    /// The folder to write (created; one that holds a prepared dataset is refused)
    #[arg(long)]
    out: PathBuf,
    /// char, bpe (a byte-level BPE trained on the training part), or the path of a Hugging
    /// Face tokenizer.json
    #[arg(long, default_value = cinder_data::tokenizer::CHAR)]
    tokenizer: String,
    /// Tokens of the BPE that --tokenizer bpe trains [default: 2048]
    #[arg(long)]
    vocab_size: Option<usize>,
    /// Leading fraction of the text (in characters) for training; the rest validates
    #[arg(long, default_value_t = 0.9)]
    train_fraction: f64,
    /// Print only the summary
    #[arg(long, short)]
    quiet: bool,
}

fn main() {
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> anyhow::Result<()> {
    let config = TrainConfig {
        tokenizer: args.tokenizer.clone(),
        vocab_size: args.vocab_size.unwrap_or(0),
        train_fraction: args.train_fraction,
        ..TrainConfig::default()
    };
    config.validate()?;
    let started = Instant::now();
    // Before a BPE is trained (minutes, on a large text): a folder prepare cannot write into.
    prepared::check_new(&args.out, None)?;
    let sources = Sources::open(&args.data)?;
    let show = !args.quiet && std::io::stderr().is_terminal();
    let bar = |what: &str| {
        let bar = ProgressBar::hidden();
        if show {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_style(
            ProgressStyle::with_template(&format!(
                "{what} {{bar:30}} {{percent}}% [{{elapsed_precise}} < {{eta_precise}}]"
            ))
            .expect("valid template"),
        );
        bar
    };
    let choice = TokenizerChoice::of(&config);
    if let (TokenizerChoice::New(TokenizerKind::Bpe(vocab_size)), false) = (&choice, args.quiet) {
        eprintln!("training a byte-level BPE of {vocab_size} tokens on the training part");
    }
    let training = bar("training the BPE tokenizer");
    let tokenizer = choice.make(&sources, args.train_fraction, &mut |_, done, total| {
        training.set_length(total);
        training.set_position(done);
    })?;
    training.finish_and_clear();
    let encoding = bar("encoding");
    let meta = prepared::prepare(
        &sources,
        &tokenizer,
        args.train_fraction,
        &args.out,
        &mut |done, total| {
            encoding.set_length(total);
            encoding.set_position(done);
        },
    )
    .with_context(|| format!("cannot prepare {}", args.out.display()))?;
    encoding.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let bytes = meta.train.bytes + meta.val.bytes;
    println!(
        "prepared {}: {} tokenizer of {} tokens, {}-bit ids; train {} tokens ({} bytes), val {} \
         tokens ({} bytes); {:.1} MB of text in {seconds:.1} s ({:.1} MB/s)",
        args.out.display(),
        tokenizer.name(),
        tokenizer.vocab_size(),
        meta.token_bytes * 8,
        meta.train.tokens,
        meta.train.bytes,
        meta.val.tokens,
        meta.val.bytes,
        bytes as f64 / 1e6,
        bytes as f64 / 1e6 / seconds.max(1e-9),
    );
    if !args.quiet {
        println!(
            "train on it with: train --data {} (files {TRAIN_BIN}, {VAL_BIN})",
            args.out.display()
        );
    }
    Ok(())
}
