//! `inspect`: what each attention head of a checkpoint looks at, over a text.

use std::path::PathBuf;

use anyhow::{Context, bail};
use cinder::cli::exit_on_error;
use cinder::device::{Backend, DeviceChoice};
use cinder::inspect::AttentionMaps;
use cinder::storage::checkpoint;
use cinder::storage::names::READ;
use clap::Parser;

/// Show the attention weights of every layer and head of a checkpoint over a text.
///
/// Writes attention.png (one heatmap per head: rows are layers, columns heads; in each, row i is
/// the query at position i and its colours the weights it gives to the keys at positions <= i)
/// and attention.json (the weights and the tokens: characters, for a character model), and
/// prints, for one position, the tokens each head attends to most.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// A run folder (its best/ checkpoint, else latest/), a checkpoint folder, or a Hugging
    /// Face folder (GPT-2, NanoChat)
    #[arg(long, default_value = cinder::run::start::DEFAULT_RUN)]
    checkpoint: PathBuf,
    /// The text to look at
    #[arg(
        long,
        default_value = "To be, or not to be, that is the question:",
        conflicts_with = "text_file"
    )]
    text: String,
    /// Read the text from this file
    #[arg(long, value_name = "FILE")]
    text_file: Option<PathBuf>,
    /// Folder for attention.png and attention.json
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Replace attention.png and attention.json where --out has them already
    #[arg(long)]
    overwrite: bool,
    /// Position (from 0) whose attention to print [default: the last token]
    #[arg(long)]
    position: Option<usize>,
    /// Tokens to list per head
    #[arg(long, default_value_t = 3)]
    top: usize,
    /// Where to run
    #[arg(long, value_enum, default_value_t)]
    device: DeviceChoice,
}

fn main() {
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> anyhow::Result<()> {
    let png = args.out.join("attention.png");
    let json = args.out.join("attention.json");
    if !args.overwrite
        && let Some(there) = [&png, &json].into_iter().find(|p| p.exists())
    {
        bail!(
            "{} exists: pass --overwrite to replace it, or choose another --out",
            there.display()
        );
    }
    let backend = Backend::select(args.device)?;
    let checkpoint::Loaded {
        dir,
        meta,
        tokenizer,
        model,
    } = checkpoint::load(&args.checkpoint, &READ, &backend.device)?;
    let text = match &args.text_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        None => args.text.clone(),
    };
    let text: String = cinder_data::normalized_chars(&text).collect();
    let mut ids = tokenizer
        .encode(&text)
        .map_err(|e| anyhow::anyhow!("the text does not fit the model: {e}"))?;
    if ids.is_empty() {
        bail!("the text is empty: give at least one character");
    }
    let block = meta.config.block_size;
    let unit = tokenizer.unit();
    if ids.len() > block {
        eprintln!(
            "the text has {} {unit} but the model's context is {block}: inspecting its last {block}",
            ids.len()
        );
        ids.drain(..ids.len() - block);
    }
    let tokens: Vec<String> = ids
        .iter()
        .map(|&id| String::from_utf8_lossy(&tokenizer.token_bytes(id)).into_owned())
        .collect();
    let position = args.position.unwrap_or(ids.len() - 1);
    if position >= ids.len() {
        bail!(
            "--position is {position}, but the text has positions 0 to {}",
            ids.len() - 1
        );
    }

    let maps = AttentionMaps::compute(&model, &ids, tokens.clone(), &backend.device);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let title = format!("attention of {} (iteration {})", dir.display(), meta.iter);
    maps.draw(&title, &png)?;
    std::fs::write(&json, serde_json::to_vec(&maps)?)
        .with_context(|| format!("cannot write {}", json.display()))?;

    println!(
        "position {position} ({:?}): the {unit} each head attends to most",
        tokens[position]
    );
    for f in maps.focus(position, args.top) {
        let items: Vec<String> = f
            .top
            .iter()
            .map(|(j, token, w)| format!("{token:?}@{j} {w:.2}"))
            .collect();
        println!("  layer {} head {}: {}", f.layer, f.head, items.join(", "));
    }
    println!("wrote {} and {}", png.display(), json.display());
    Ok(())
}
