//! Sampling with the key/value cache against the full forward pass.

mod common;

use cinder::generate::{Decoder, GenerateOptions, generate};
use cinder::sampling::SamplingParams;
use cinder_model::{Gpt, GptConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The logits of `decoder` against Burn's full forward pass over the window, at every step of
/// two random texts grown from 3 tokens to past 2 x block_size.
fn check_against_full_forward(make: impl for<'a> Fn(&'a Gpt) -> Decoder<'a>) {
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
    let mut tested = make(&model);
    let mut full = Decoder::new(&model, false, &device);
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
    let device = common::backend().device;
    check_against_full_forward(|m| Decoder::new(m, true, &device));
}

#[test]
fn kernel_logits_equal_burn_full_forward_at_every_step_past_block_size() {
    check_against_full_forward(|m| Decoder::kernels(m, true, 2));
    check_against_full_forward(|m| Decoder::kernels(m, false, 2));
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
    let opts = |use_cache, kernels| GenerateOptions {
        max_new_tokens: 30,
        num_samples: 2,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        },
        seed: 0,
        use_cache,
        kernels,
    };
    let text = |use_cache, kernels| {
        generate(
            &model,
            &[1, 2],
            &opts(use_cache, kernels),
            &device,
            |_, _| {},
        )
    };
    let a = text(true, false);
    assert_eq!(a[0].len(), 30);
    assert_eq!(a, text(false, false), "Burn, without the cache");
    assert_eq!(a, text(true, true), "kernels, with the cache");
    assert_eq!(a, text(false, true), "kernels, without the cache");
}
