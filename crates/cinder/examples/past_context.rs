//! How well a model predicts text past its context, under the two policies of the sampler
//! ([`Decoder`]): the sliding key/value cache (rotary positions) and exact windows (the uncached
//! path, each token predicted from a fresh pass over the last `block_size` tokens).
//!
//! It feeds `--segments` stretches of the validation split (the text's last tenth), each
//! `--length` tokens long, token by token through both decoders (teacher forcing) and prints the
//! mean loss of the tokens within the context and past it. BENCHMARKS.md section 20 quotes it.
//!
//! ```sh
//! cargo run --release --example past_context -- --checkpoint checkpoints/tiny_cpu \
//!     --data ../shared/data/tinyshakespeare.txt
//! ```

use std::path::PathBuf;

use anyhow::Context;
use cinder::device::{Backend, DeviceChoice};
use cinder::sampling::generate::Decoder;
use cinder::storage::checkpoint;
use cinder::storage::names::READ;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// A run folder or checkpoint
    #[arg(long)]
    checkpoint: PathBuf,
    /// The text the model was trained on
    #[arg(long)]
    data: PathBuf,
    /// Stretches of the validation split, decoded together as rows
    #[arg(long, default_value_t = 32)]
    segments: usize,
    /// Tokens per stretch
    #[arg(long, default_value_t = 320)]
    length: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let backend = Backend::select(DeviceChoice::Cpu)?;
    let device = backend.device;
    let loaded = checkpoint::load(&args.checkpoint, &READ, &device)?;
    let text = std::fs::read_to_string(&args.data)
        .with_context(|| format!("cannot read {}", args.data.display()))?;
    let text: String = cinder_data::normalized_chars(&text).collect();
    let ids = loaded
        .tokenizer
        .encode(&text)
        .map_err(|e| anyhow::anyhow!("the text does not fit the model: {e}"))?;
    let val = &ids[ids.len() * 9 / 10..];
    let (n, len, block) = (args.segments, args.length, loaded.model.block_size());
    anyhow::ensure!(n > 0, "--segments must be at least 1");
    anyhow::ensure!(
        len > block + 1,
        "--length must exceed the context ({block} tokens) by 2 or more"
    );
    anyhow::ensure!(
        n * len <= val.len(),
        "the validation split holds {} tokens",
        val.len()
    );
    // Stretches spread evenly over the split.
    let segments: Vec<&[u32]> = (0..n)
        .map(|s| &val[s * (val.len() - len) / (n - 1).max(1)..][..len])
        .collect();
    println!(
        "{}: block_size {block}, {n} stretches of {len} tokens, cache slides: {}",
        args.checkpoint.display(),
        loaded.model.cache_slides()
    );
    for (name, use_cache) in [("sliding cache", true), ("exact windows", false)] {
        let started = std::time::Instant::now();
        let mut decoder = Decoder::new(&loaded.model, use_cache, &device, n);
        decoder.join(segments.iter().map(|s| s[..1].to_vec()));
        // Loss sums and counts: within the context (a token predicted from at most block_size
        // tokens: the whole text so far) and past it.
        let (mut within, mut past) = ((0.0f64, 0usize), (0.0f64, 0usize));
        for i in 1..len {
            let logits = decoder.next_logits();
            let v = logits.len() / n;
            for (row, segment) in segments.iter().enumerate() {
                let row_logits = &logits[row * v..(row + 1) * v];
                let max = row_logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let log_sum = row_logits
                    .iter()
                    .map(|&l| ((l - max) as f64).exp())
                    .sum::<f64>()
                    .ln();
                let loss = log_sum - (row_logits[segment[i] as usize] - max) as f64;
                let bucket = if i <= block { &mut within } else { &mut past };
                bucket.0 += loss;
                bucket.1 += 1;
                decoder.push(row, segment[i]);
            }
        }
        println!(
            "{name}: loss within the context {:.4} ({} tokens), past it {:.4} ({} tokens); {:.1} s",
            within.0 / within.1 as f64,
            within.1,
            past.0 / past.1.max(1) as f64,
            past.1,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
