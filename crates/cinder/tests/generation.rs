//! Sampling with the key/value cache against the full forward pass.

mod common;

use cinder::sampling::SamplingParams;
use cinder::sampling::generate::{Decoder, GenerateOptions, generate};
use cinder_model::{GptConfig, Ops};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The logits of a decoder with the layers of `ops` (and the cache if `use_cache`) against the
/// composite layers' full forward pass over the window, at every step of two random texts grown
/// from 3 tokens to past 2 x block_size.
fn check_against_full_forward(ops: Ops, use_cache: bool) {
    let device = common::backend().device;
    device.seed(3);
    let model = GptConfig::new(13, 8)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(16)
        .init(&device)
        .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    // Two samples with different random prompts of 3 tokens, grown to 3 x block_size.
    let mut texts: Vec<Vec<u32>> = (0..2)
        .map(|_| (0..3).map(|_| rng.random_range(0..13)).collect())
        .collect();
    let (model, reference) = (model.clone().with_ops(ops), model.with_ops(Ops::Composite));
    let mut tested = Decoder::new(&model, use_cache, &device);
    let mut full = Decoder::new(&reference, false, &device);
    for step in 0..21 {
        let a = tested.next_logits(&texts);
        let b = full.next_logits(&texts);
        assert_eq!(a.len(), b.len());
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(
            diff < 1e-4,
            "step {step} (length {}): max difference {diff}",
            texts[0].len()
        );
        for t in &mut texts {
            t.push(rng.random_range(0..13));
        }
    }
}

#[test]
fn cached_logits_equal_full_forward_at_every_step_past_block_size() {
    check_against_full_forward(Ops::Composite, true);
    check_against_full_forward(Ops::Fused, true);
}

#[test]
fn fused_logits_equal_the_composite_full_forward_at_every_step() {
    check_against_full_forward(Ops::Fused, false);
}

#[test]
fn greedy_text_is_the_same_with_and_without_the_cache() {
    let device = common::backend().device;
    device.seed(4);
    let model = GptConfig::new(11, 8)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(16)
        .init(&device)
        .unwrap();
    let opts = |use_cache| GenerateOptions {
        max_new_tokens: 30,
        num_samples: 2,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        },
        seed: 0,
        use_cache,
        tokens: 11,
    };
    let text = |ops, use_cache| {
        let model = model.clone().with_ops(ops);
        generate(&model, &[1, 2], &opts(use_cache), &device, |_, _| {})
    };
    let a = text(Ops::Composite, true);
    assert_eq!(a[0].len(), 30);
    assert_eq!(
        a,
        text(Ops::Composite, false),
        "composite, without the cache"
    );
    assert_eq!(a, text(Ops::Fused, true), "fused, with the cache");
    assert_eq!(a, text(Ops::Fused, false), "fused, without the cache");
}

/// A vocabulary padded beyond the tokenizer's (nanoGPT's 50,304 for GPT-2's 50,257 tokens):
/// sampling never picks an id the tokenizer lacks.
#[test]
fn sampling_never_picks_a_padding_id() {
    let device = common::backend().device;
    device.seed(5);
    let model = GptConfig::new(11, 8)
        .with_n_layer(1)
        .with_n_head(2)
        .with_n_embd(16)
        .init(&device)
        .unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 60,
        num_samples: 2,
        sampling: SamplingParams {
            temperature: 2.0,
            top_k: None,
            top_p: None,
        },
        seed: 3,
        use_cache: true,
        tokens: 3,
    };
    let texts = generate(&model, &[1, 2], &opts, &device, |_, _| {});
    for text in texts {
        assert!(text.iter().all(|&id| id < 3), "{text:?}");
    }
}
