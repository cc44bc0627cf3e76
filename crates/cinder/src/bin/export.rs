//! `export`: writes a checkpoint as a Hugging Face folder (GPT-2 or NanoChat).

use std::path::PathBuf;

use cinder::cli::exit_on_error;
use cinder::device::{Backend, DeviceChoice};
use cinder::storage::hf::{self, Architecture};
use cinder::storage::{checkpoint, names::READ};
use clap::Parser;
use clap::builder::TypedValueParser;

/// Write a cinder checkpoint as a Hugging Face folder: config.json, model.safetensors,
/// tokenizer.json, tokenizer_config.json and generation_config.json.
///
/// The architecture is the one the model fits: GPT-2 (`GPT2LMHeadModel`) for nanoGPT's recipe
/// (learned positions, LayerNorm), NanoChat (`NanoChatForCausalLM`) for the default recipe
/// (RoPE, RMSNorm, QK-norm, ReLU², no biases). `transformers`' `AutoModelForCausalLM` and
/// `AutoTokenizer` load either with no remote code. A character vocabulary becomes a tokenizer
/// with one token per character (the same ids).
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// A run folder (its best/ checkpoint, else latest/), a checkpoint folder, or a Hugging
    /// Face folder
    #[arg(long, default_value = cinder::run::start::DEFAULT_RUN)]
    checkpoint: PathBuf,
    /// The folder to write: new, or without any of the five files
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The architecture to write; by default, the one the model fits
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(
        Architecture::ALL.iter().map(|a| a.name())
    ).map(|s| s.parse::<Architecture>().expect("a listed name")))]
    architecture: Option<Architecture>,
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
    let architecture = hf::export(
        &args.out,
        &model,
        &meta.config,
        &tokenizer,
        args.architecture,
    )?;
    eprintln!(
        "wrote {} ({}, {} layers x {} heads x {} wide, context {}, {} tokens) from {} \
         (iteration {})",
        args.out.display(),
        architecture.class(),
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
