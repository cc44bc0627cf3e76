//! `inspect`: what each attention head of a checkpoint looks at, over a text.

use std::path::PathBuf;

use anyhow::{Context, bail};
use cinder::checkpoint;
use cinder::cli::exit_on_error;
use cinder::device::{Backend, DeviceChoice};
use cinder::inspect::AttentionMaps;
use cinder::train::{BEST, LATEST};
use clap::Parser;

/// Show the attention weights of every layer and head of a checkpoint over a text.
///
/// Writes attention.png (one heatmap per head: rows are layers, columns heads; in each, row i is
/// the query at position i and its colours the weights it gives to the keys at positions <= i)
/// and attention.json (the weights and the characters), and prints, for one position, the
/// characters each head attends to most.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// A run folder (its best/ checkpoint, else latest/) or a checkpoint folder
    #[arg(long, default_value = "checkpoints/tiny_cpu")]
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
    /// Position (from 0) whose attention to print [default: the last character]
    #[arg(long)]
    position: Option<usize>,
    /// Characters to list per head
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
    let backend = Backend::select(args.device)?;
    let checkpoint::Loaded {
        dir,
        meta,
        tokenizer,
        model,
    } = checkpoint::load(&args.checkpoint, &[BEST, LATEST], &backend.device)?;
    let cinder_data::Tokenizer::Char(vocab) = tokenizer else {
        bail!(
            "{} has a {} tokenizer: inspect labels positions with characters, and reads \
             character models only",
            dir.display(),
            tokenizer.name()
        );
    };
    let text = match &args.text_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        None => args.text.clone(),
    };
    let mut chars: Vec<char> = cinder_data::normalized_chars(&text).collect();
    if chars.is_empty() {
        bail!("the text is empty: give at least one character");
    }
    let block = meta.config.block_size;
    if chars.len() > block {
        eprintln!(
            "the text has {} characters but the model's context is {block}: inspecting its last {block}",
            chars.len()
        );
        chars.drain(..chars.len() - block);
    }
    let ids = vocab
        .encode(chars.iter().copied())
        .map_err(|e| anyhow::anyhow!("the text does not fit the model: {e}"))?;
    let position = args.position.unwrap_or(chars.len() - 1);
    if position >= chars.len() {
        bail!(
            "--position is {position}, but the text has positions 0 to {}",
            chars.len() - 1
        );
    }

    let maps = AttentionMaps::compute(&model, &ids, chars.clone(), &backend.device);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let png = args.out.join("attention.png");
    let json = args.out.join("attention.json");
    let title = format!("attention of {} (iteration {})", dir.display(), meta.iter);
    maps.draw(&title, &png)?;
    std::fs::write(&json, serde_json::to_vec(&maps)?)
        .with_context(|| format!("cannot write {}", json.display()))?;

    let show = |c: char| match c {
        '\n' => "\\n".to_string(),
        c => c.to_string(),
    };
    println!(
        "position {position} ({:?}): the characters each head attends to most",
        show(chars[position])
    );
    for f in maps.focus(position, args.top) {
        let items: Vec<String> = f
            .top
            .iter()
            .map(|(j, c, w)| format!("{:?}@{j} {w:.2}", show(*c)))
            .collect();
        println!("  layer {} head {}: {}", f.layer, f.head, items.join(", "));
    }
    println!("wrote {} and {}", png.display(), json.display());
    Ok(())
}
