//! Sampling with the key/value cache against the full forward pass.

mod common;

use cinder::sampling::SamplingParams;
use cinder::sampling::generate::{Decoder, GenerateOptions, generate};
use cinder_model::{GptConfig, Ops, Position};
use cinder_testing::max_diff;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A small model of `n_layer` blocks with these positions and `n_kv_head` key/value heads for
/// its 2 query heads (0: 2, multi-head; 1: grouped).
fn model(n_layer: usize, position: Position, n_kv_head: usize) -> cinder_model::Gpt {
    let device = common::backend().device;
    let _serial = common::serial();
    device.seed(3);
    GptConfig::new(13, 8)
        .with_n_layer(n_layer)
        .with_n_head(2)
        .with_n_kv_head(n_kv_head)
        .with_n_embd(16)
        .with_position(position)
        .with_qk_norm(position == Position::Rope)
        .init(&device)
        .unwrap()
}

/// The largest difference between the logits of two decoders of `model`, one with the layers
/// and cache switch `tested`, the other `reference`'s, at every step of two random texts grown
/// by 21 tokens from prompts of `prompt` tokens; each step's is checked against `within` while
/// the texts fit in block_size and against `past` after.
fn compare_decoders(
    model: &cinder_model::Gpt,
    (tested, reference): ((Ops, bool), (Ops, bool)),
    prompt: usize,
    within: impl Fn(f32) -> bool,
    past: impl Fn(f32) -> bool,
) {
    let device = common::backend().device;
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut texts: Vec<Vec<u32>> = (0..2)
        .map(|_| (0..prompt).map(|_| rng.random_range(0..13)).collect())
        .collect();
    let with = |(ops, _): (Ops, bool)| model.clone().with_ops(ops);
    let (a_model, b_model) = (with(tested), with(reference));
    let mut a_decoder = Decoder::new(&a_model, tested.1, &device, texts.len());
    let mut b_decoder = Decoder::new(&b_model, reference.1, &device, texts.len());
    a_decoder.join(texts.clone());
    b_decoder.join(texts.clone());
    for step in 0..21 {
        let a = a_decoder.next_logits();
        let b = b_decoder.next_logits();
        let diff = max_diff(&a, &b);
        let len = texts[0].len();
        let expected = if len <= model.block_size() {
            within(diff)
        } else {
            past(diff)
        };
        assert!(
            expected,
            "{tested:?} against {reference:?}, step {step} (length {len}): max difference {diff}"
        );
        for (row, t) in texts.iter_mut().enumerate() {
            let token = rng.random_range(0..13);
            t.push(token);
            a_decoder.push(row, token);
            b_decoder.push(row, token);
        }
    }
}

/// Differences of float rounding only (about 1e-7 here).
fn equal(diff: f32) -> bool {
    diff < 1e-5
}

/// The logits of a decoder with the layers of `ops` (and the cache if `use_cache`) against the
/// composite layers' full forward pass over the window (learned positions), to past
/// 2 x block_size.
fn check_against_full_forward(ops: Ops, use_cache: bool) {
    let model = model(2, Position::Learned, 0);
    let paths = ((ops, use_cache), (Ops::Composite, false));
    compare_decoders(&model, paths, 3, equal, equal);
}

/// Rows that join and leave a decoder at their own times, each at its own length, get the
/// logits each would get decoded alone, on both paths, learned and rotary positions, past
/// block_size, with rows joining after others left: into the places they freed, in a cache
/// made once for the 4 rows there are at most, and kept for a later decoder.
#[test]
fn rows_that_join_and_leave_get_the_logits_they_would_get_alone() {
    let device = common::backend().device;
    for (ops, rope) in [
        (Ops::Fused, false),
        (Ops::Fused, true),
        (Ops::Composite, false),
        (Ops::Composite, true),
    ] {
        let position = if rope {
            Position::Rope
        } else {
            Position::Learned
        };
        let model = model(2, position, 0).with_ops(ops);
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        // Row k joins at step 3k with a prompt of k + 1 tokens (the last, 11: longer than the
        // context of 8) and leaves after 12 steps.
        let prompts: Vec<Vec<u32>> = (0..6)
            .map(|k| {
                let len = if k == 5 { 11 } else { k + 1 };
                (0..len).map(|_| rng.random_range(0..13)).collect()
            })
            .collect();
        let tokens: Vec<Vec<u32>> = (0..6)
            .map(|_| (0..12).map(|_| rng.random_range(0..13)).collect())
            .collect();
        let alone: Vec<Vec<Vec<f32>>> = (0..6)
            .map(|k| {
                let mut d = Decoder::new(&model, true, &device, 1);
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
        let mut together = Decoder::new(&model, true, &device, 4);
        let mut bytes = None; // the cache's, made with it
        let mut rows: Vec<(usize, usize)> = Vec::new(); // (row's text k, steps done)
        for step in 0..30 {
            if step % 3 == 0 && step / 3 < 6 {
                together.join([prompts[step / 3].clone()]);
                rows.push((step / 3, 0));
            }
            if rows.is_empty() {
                continue;
            }
            let logits = together.next_logits();
            let made = *bytes.get_or_insert(together.cache_bytes());
            assert_eq!(together.cache_bytes(), made, "step {step}: the cache grew");
            let v = logits.len() / rows.len();
            for (row, (k, done)) in rows.iter_mut().enumerate() {
                let got = &logits[row * v..(row + 1) * v];
                let diff = max_diff(got, &alone[*k][*done]);
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
        // Later decoders reuse the cache (a server's next batches), whatever rows the one
        // before still held: the same logits, no new buffers.
        let mut cache = together.into_cache().expect("decoding with the cache");
        for _ in 0..2 {
            let mut next = Decoder::with_cache(&model, &device, cache);
            next.join(prompts[2..6].iter().cloned());
            let logits = next.next_logits();
            let v = logits.len() / 4;
            for (row, k) in (2..6).enumerate() {
                let diff = max_diff(&logits[row * v..(row + 1) * v], &alone[k][0]);
                assert!(diff < 1e-5, "{ops:?} rope {rope}: a reused cache: {diff}");
            }
            assert_eq!(next.cache_bytes(), bytes.unwrap(), "a reused cache grew");
            cache = next.into_cache().unwrap();
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

/// With rotary positions the cache slides past block_size. In a model of one block a token's key
/// and value depend only on the token and, through the rotation, its distance to the query: the
/// sliding window then gives exactly the full forward pass's logits over the last window, from
/// a short prompt or from one longer than the context, with multi-head and grouped attention.
#[test]
fn a_sliding_cache_of_one_block_equals_the_full_forward_past_block_size() {
    for n_kv_head in [0, 1] {
        let model = model(1, Position::Rope, n_kv_head);
        for ops in [Ops::Fused, Ops::Composite] {
            for prompt in [3, 20] {
                let paths = ((ops, true), (Ops::Composite, false));
                compare_decoders(&model, paths, prompt, equal, equal);
            }
        }
    }
}

/// With more blocks the sliding cache keeps the keys and values of the later blocks as they were
/// computed (over the tokens before them, some now out of the window): the same logits as the
/// full window's within block_size, others past it; the fused and composite caches slide alike.
#[test]
fn a_sliding_cache_differs_from_exact_windows_only_past_block_size() {
    for n_kv_head in [0, 1] {
        let model = model(2, Position::Rope, n_kv_head);
        let differ = |diff: f32| diff > 1e-4; // 1e-3 and more here
        let sliding = (Ops::Fused, true);
        compare_decoders(&model, (sliding, (Ops::Composite, false)), 3, equal, differ);
        compare_decoders(&model, (sliding, (Ops::Composite, true)), 3, equal, equal);
    }
}

/// Sampling loops started on different threads run on threads of their own: a loop whose
/// callback waits for another thread's whole generation is not stuck in front of it.
#[test]
fn sampling_loops_on_different_threads_do_not_wait_for_each_other() {
    let device = common::backend().device;
    let model = model(1, Position::Rope, 0);
    let opts = GenerateOptions {
        max_new_tokens: 5,
        num_samples: 1,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: None,
            ..SamplingParams::default()
        },
        seed: 0,
        use_cache: true,
        tokens: 13,
    };
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let (model, opts, device) = (&model, &opts, &device);
        let mut first = true;
        generate(model, &[1], opts, device, move |_| {
            if std::mem::take(&mut first) {
                let done = done.clone();
                scope.spawn(move || {
                    generate(model, &[2], opts, device, |_| {});
                    done.send(()).unwrap();
                });
                let waited = finished.recv_timeout(std::time::Duration::from_secs(20));
                assert!(waited.is_ok(), "the other thread's generation never ran");
            }
        });
    });
}

#[test]
fn greedy_text_is_the_same_with_and_without_the_cache() {
    let device = common::backend().device;
    let serial = common::serial();
    device.seed(4);
    let model = GptConfig::new(11, 8)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(16)
        .init(&device)
        .unwrap();
    drop(serial);
    let opts = |use_cache| GenerateOptions {
        max_new_tokens: 30,
        num_samples: 2,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: None,
            ..SamplingParams::default()
        },
        seed: 0,
        use_cache,
        tokens: 11,
    };
    let text = |ops, use_cache| {
        let model = model.clone().with_ops(ops);
        generate(&model, &[1, 2], &opts(use_cache), &device, |_| {})
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
    let serial = common::serial();
    device.seed(5);
    let model = GptConfig::new(11, 8)
        .with_n_layer(1)
        .with_n_head(2)
        .with_n_embd(16)
        .init(&device)
        .unwrap();
    drop(serial);
    let opts = GenerateOptions {
        max_new_tokens: 60,
        num_samples: 2,
        sampling: SamplingParams {
            temperature: 2.0,
            top_k: None,
            ..SamplingParams::default()
        },
        seed: 3,
        use_cache: true,
        tokens: 3,
    };
    let texts = generate(&model, &[1, 2], &opts, &device, |_| {});
    for text in texts {
        assert!(text.iter().all(|&id| id < 3), "{text:?}");
    }
}
