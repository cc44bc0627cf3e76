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
    tested.join(texts.clone());
    full.join(texts.clone());
    for step in 0..21 {
        let a = tested.next_logits();
        let b = full.next_logits();
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
        for (row, t) in texts.iter_mut().enumerate() {
            let token = rng.random_range(0..13);
            t.push(token);
            tested.push(row, token);
            full.push(row, token);
        }
    }
}

/// Rows that join and leave a decoder at their own times, each at its own length, get the
/// logits each would get decoded alone, on both paths, learned and rotary positions, past
/// block_size.
#[test]
fn rows_that_join_and_leave_get_the_logits_they_would_get_alone() {
    let device = common::backend().device;
    for (ops, rope) in [
        (Ops::Fused, false),
        (Ops::Fused, true),
        (Ops::Composite, false),
        (Ops::Composite, true),
    ] {
        device.seed(5);
        let mut config = GptConfig::new(13, 8)
            .with_n_layer(2)
            .with_n_head(2)
            .with_n_embd(16);
        if rope {
            config = config.with_position(cinder_model::Position::Rope);
        }
        let model = config.init(&device).unwrap().with_ops(ops);
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        // Row k joins at step 3k with a prompt of k + 1 tokens and leaves after 12 steps.
        let prompts: Vec<Vec<u32>> = (0..4)
            .map(|k| (0..=k).map(|_| rng.random_range(0..13)).collect())
            .collect();
        let tokens: Vec<Vec<u32>> = (0..4)
            .map(|_| (0..12).map(|_| rng.random_range(0..13)).collect())
            .collect();
        let alone: Vec<Vec<Vec<f32>>> = (0..4)
            .map(|k| {
                let mut d = Decoder::new(&model, true, &device);
                d.join([prompts[k].clone()]);
                (0..12)
                    .map(|i| {
                        let l = d.next_logits();
                        d.push(0, tokens[k][i]);
                        l
                    })
                    .collect()
            })
            .collect();
        let mut together = Decoder::new(&model, true, &device);
        let mut rows: Vec<(usize, usize)> = Vec::new(); // (row's text k, steps done)
        for step in 0..30 {
            if step % 3 == 0 && step / 3 < 4 {
                together.join([prompts[step / 3].clone()]);
                rows.push((step / 3, 0));
            }
            if rows.is_empty() {
                continue;
            }
            let logits = together.next_logits();
            let v = logits.len() / rows.len();
            for (row, (k, done)) in rows.iter_mut().enumerate() {
                let got = &logits[row * v..(row + 1) * v];
                let diff = got
                    .iter()
                    .zip(&alone[*k][*done])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    diff < 1e-5,
                    "{ops:?} rope {rope}: text {k} step {done}: {diff}"
                );
                together.push(row, tokens[*k][*done]);
                *done += 1;
            }
            // A text leaves after 12 tokens; the rows after it move up.
            while let Some(row) = rows.iter().position(|&(_, done)| done == 12) {
                together.leave(row..row + 1);
                rows.remove(row);
            }
        }
        assert!(rows.is_empty() && together.rows() == 0);
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
