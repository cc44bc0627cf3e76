//! `export`: writes a checkpoint as a Hugging Face GPT-2 folder.

use std::path::PathBuf;

use cinder::cli::exit_on_error;
use cinder::device::{Backend, DeviceChoice};
use cinder::storage::names::READ;
use cinder::storage::{checkpoint, gpt2};
use clap::Parser;

/// Write a cinder checkpoint as a Hugging Face GPT-2 folder: config.json, model.safetensors,
/// tokenizer.json and tokenizer_config.json.
///
/// `transformers.GPT2LMHeadModel.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)`
/// load it. A character vocabulary becomes a tokenizer with one token per character (the same
/// ids); a model without biases gets zero biases.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// A run folder (its best/ checkpoint, else latest/), a checkpoint folder, or a Hugging
    /// Face GPT-2 folder
    #[arg(long, default_value = cinder::run::start::DEFAULT_RUN)]
    checkpoint: PathBuf,
    /// The folder to write: new, or without any of the four files
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

fn main() {
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> anyhow::Result<()> {
    let backend = Backend::select(DeviceChoice::Cpu)?;
    let checkpoint::Loaded {
        dir,
        meta,
        tokenizer,
        model,
    } = checkpoint::load(&args.checkpoint, &READ, &backend.device)?;
    gpt2::export(&args.out, &model, &meta.config, &tokenizer)?;
    eprintln!(
        "wrote {} (GPT-2, {} layers x {} heads x {} wide, context {}, {} tokens) from {} \
         (iteration {})",
        args.out.display(),
        meta.config.n_layer,
        meta.config.n_head,
        meta.config.n_embd,
        meta.config.block_size,
        model.vocab_size(),
        dir.display(),
        meta.iter
    );
    Ok(())
}
