//! Behaviour of the transformer that could break: causality, attention against a naive
//! reference, weight tying, and the key/value cache against the full forward pass.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Distribution;
use cinder_model::ops::fused;
use cinder_model::{Activation, CausalSelfAttention, Gpt, GptConfig, KvCache, Norm, Ops, Position};
use cinder_testing::max_diff;

fn device() -> Device {
    Device::flex()
}

/// `f` run right after seeding the device's generator with `seed`, while no other test of this
/// file uses it: the generator is the device's, shared by the tests running in parallel, so
/// every draw of this file goes through here.
fn seeded<R>(device: &Device, seed: u64, f: impl FnOnce() -> R) -> R {
    static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _only_us = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    device.seed(seed);
    f()
}

fn tiny(device: &Device) -> (GptConfig, Gpt) {
    let config = GptConfig::new(11, 8)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(16);
    let model = seeded(device, 42, || config.init(device).unwrap());
    (config, model)
}

/// The tiny model with every option of the nanoGPT speedrun's recipe: rotary embeddings,
/// RMSNorm, QK-norm, ReLU², an untied head and a soft-cap (random initialisation, so that every
/// part matters).
fn modern(device: &Device) -> (GptConfig, Gpt) {
    let config = tiny(device)
        .0
        .with_position(Position::Rope)
        .with_norm(Norm::Rmsnorm)
        .with_qk_norm(true)
        .with_activation(Activation::Relu2)
        .with_tie_embeddings(false)
        .with_logit_softcap(3.0);
    let model = seeded(device, 43, || config.init(device).unwrap());
    (config, model)
}

fn ids(rows: &[&[i64]], device: &Device) -> Tensor<2, Int> {
    let t = rows[0].len();
    let flat: Vec<i64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), t]), device)
}

fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

#[test]
fn future_tokens_do_not_change_past_logits() {
    let device = device();
    let (_, model) = tiny(&device);
    let a = model.forward(ids(&[&[1, 2, 3, 4, 5, 6, 7, 8]], &device));
    for t in 0..7 {
        // Change every token after position t.
        let mut row = vec![1, 2, 3, 4, 5, 6, 7, 8];
        for x in &mut row[t + 1..] {
            *x = (*x + 3) % 11;
        }
        let b = model.forward(ids(&[&row], &device));
        let past_a = to_vec(a.clone().slice(s![.., 0..=t, ..]));
        let past_b = to_vec(b.clone().slice(s![.., 0..=t, ..]));
        assert_eq!(past_a, past_b, "positions <= {t} changed");
        let next_a = to_vec(a.clone().slice(s![.., t + 1, ..]));
        let next_b = to_vec(b.slice(s![.., t + 1, ..]));
        assert!(
            max_diff(&next_a, &next_b) > 1e-4,
            "position {} must see token {}",
            t + 1,
            t + 1
        );
    }
}

/// Attention written out head by head, query by query, with plain loops over host floats.
fn naive_attention(attn: &CausalSelfAttention, x: &Tensor<3>) -> Vec<f32> {
    let [b, t, c] = x.dims();
    let h = attn.layout.n_head;
    let hs = c / h;
    let qkv = to_vec(attn.c_attn.forward(x.clone())); // (B, T, 3C)
    let at = |bi: usize, ti: usize, part: usize, hi: usize, d: usize| {
        qkv[(bi * t + ti) * 3 * c + part * c + hi * hs + d]
    };
    let mut y = vec![0f32; b * t * c]; // heads concatenated
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let scores: Vec<f32> = (0..=i)
                    .map(|j| {
                        (0..hs)
                            .map(|d| at(bi, i, 0, hi, d) * at(bi, j, 1, hi, d))
                            .sum::<f32>()
                            / (hs as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                for d in 0..hs {
                    y[(bi * t + i) * c + hi * hs + d] =
                        (0..=i).map(|j| exps[j] / sum * at(bi, j, 2, hi, d)).sum();
                }
            }
        }
    }
    let y = Tensor::<3>::from_data(TensorData::new(y, [b, t, c]), &x.device());
    to_vec(attn.c_proj.forward(y))
}

/// Both versions of the layer against the naive loop: the composite one (`forward`) and the
/// fused kernel that `Ops::Fused` runs on Flex, between the layer's own projections; over more
/// than the 64 queries of one of the kernel's blocks too.
#[test]
fn attention_agrees_with_naive_per_head_loop() {
    let device = device();
    assert!(Ops::Fused.fused_on(&device), "the fused layers run here");
    let (_, model) = tiny(&device);
    let attn = &model.blocks[0].attn;
    for (seed, shape) in [(1, [3, 8, 16]), (2, [1, 70, 16])] {
        // Inputs of std 20: at the initial weights' scale (0.02) a standard normal input gives
        // almost uniform attention weights, under which a wrong split into heads, a wrong scale
        // or a leaky mask changes the output by less than the tolerance.
        let x = seeded(&device, seed, || {
            Tensor::<3>::random(shape, Distribution::Normal(0.0, 20.0), &device)
        });
        let slow = naive_attention(attn, &x);
        let composite = to_vec(attn.forward(x.clone()));
        let qkv = attn.c_attn.forward(x);
        let fused = to_vec(
            attn.c_proj
                .forward(fused::attention(qkv, attn.layout, None)),
        );
        for (path, fast) in [("composite", composite), ("fused", fused)] {
            let diff = max_diff(&fast, &slow);
            assert!(diff < 1e-5, "{path}, {shape:?}: max difference {diff}");
        }
    }
}

#[test]
fn head_is_the_token_embedding() {
    let device = device();
    let (config, model) = tiny(&device);
    // Only one parameter has the shape of the vocabulary table.
    struct Shapes(Vec<Vec<usize>>);
    impl ModuleVisitor for Shapes {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.0.push(p.val().dims().to_vec());
        }
    }
    let mut shapes = Shapes(Vec::new());
    model.visit(&mut shapes);
    let tables = shapes
        .0
        .iter()
        .filter(|s| **s == [config.vocab_size, config.n_embd])
        .count();
    assert_eq!(tables, 1);

    // Changing one row of the token embedding changes the logit of that token everywhere,
    // even at positions whose input is another token: the head reads the same weights.
    let input = ids(&[&[0, 1, 2, 3]], &device);
    let before = model.forward(input.clone());
    let mut changed = model.clone();
    let w = changed.wte.weight.val();
    let bump = Tensor::<2>::zeros([11, 16], &device).slice_assign(
        s![9..10, ..],
        seeded(&device, 2, || {
            Tensor::random([1, 16], Distribution::Normal(0.0, 1.0), &device)
        }),
    );
    changed.wte.weight = Param::initialized(changed.wte.weight.id, w + bump);
    let after = changed.forward(input);
    let logit9 = |t: Tensor<3>| to_vec(t.slice(s![.., .., 9..10]));
    let other = |t: Tensor<3>| to_vec(t.slice(s![.., .., 0..9]));
    assert!(max_diff(&logit9(before.clone()), &logit9(after.clone())) > 1e-3);
    assert_eq!(
        other(before),
        other(after),
        "token 9 is not in the input: other logits are unchanged"
    );
}

#[test]
fn cached_logits_equal_full_forward() {
    let device = device();
    // Heads of 8, and of 32 and 64 (the cached attention's own loops for them), multi-head and
    // grouped.
    let wide = |n_embd, n_head, n_kv_head| {
        let config = modern(&device)
            .0
            .with_n_embd(n_embd)
            .with_n_head(n_head)
            .with_n_kv_head(n_kv_head);
        seeded(&device, 45, || config.init(&device).unwrap())
    };
    let models = [
        ("tiny", tiny(&device).1),
        ("modern", modern(&device).1),
        ("heads of 32", wide(64, 2, 2)),
        ("heads of 64", wide(128, 2, 2)),
        ("grouped heads of 32", wide(128, 4, 2)),
    ];
    for (ops, (name, model)) in [Ops::Fused, Ops::Composite]
        .into_iter()
        .flat_map(|ops| models.iter().map(move |m| (ops, m)))
    {
        let ops_and = format!("{ops:?}, {name}");
        let model = model.clone().with_ops(ops);
        let tokens: Vec<i64> = vec![3, 1, 4, 1, 5, 9, 2, 6];
        let other: Vec<i64> = tokens.iter().rev().copied().collect();
        let full = model.forward(ids(&[&tokens, &other], &device)); // (2, 8, V)
        let at = |t: usize| to_vec(full.clone().slice(s![.., t..=t, ..]));
        // Room for one text, grown as three join; the second leaves, and the two rows sit in
        // places 2 and 0: not side by side, not in order.
        let mut cache = model.new_cache(1);
        let (a, gone, b) = (cache.claim(), cache.claim(), cache.claim());
        cache.release(gone);
        let places = [b, a];
        assert_eq!((cache.places(), places), (4, [2, 0]));
        // Prompt of 3 tokens at once, then one token at a time, the rows of every other pass
        // in the other order (places 0 and 2: in order, not side by side).
        let prompt = ids(&[&tokens[..3], &other[..3]], &device);
        let mut cached = vec![to_vec(model.forward_cached(prompt, &mut cache, &places))];
        let mut full_rows = vec![at(2)];
        // Three more texts join: the cache grows with keys and values already written.
        (0..3).for_each(|_| _ = cache.claim());
        assert_eq!(cache.places(), 8);
        for t in 3..8 {
            let step = if t % 2 == 0 {
                let next = ids(&[&tokens[t..=t], &other[t..=t]], &device);
                to_vec(model.forward_cached(next, &mut cache, &places))
            } else {
                let next = ids(&[&other[t..=t], &tokens[t..=t]], &device);
                let swapped = to_vec(model.forward_cached(next, &mut cache, &[a, b]));
                let v = swapped.len() / 2;
                [&swapped[v..], &swapped[..v]].concat()
            };
            cached.push(step);
            full_rows.push(at(t));
        }
        assert_eq!(places.map(|p| cache.len(p)), [Some(8), Some(8)]);
        assert_eq!(cache.len(gone), Some(0), "taken again, not fed");
        assert_eq!(
            cache.bytes(),
            model.cache_bytes(8),
            "{ops_and}: grown to 8 places"
        );
        let diff = max_diff(&full_rows.concat(), &cached.concat());
        assert!(diff < 1e-4, "{ops_and}: max difference {diff}");
        // A cleared cache starts again from position 0, in places side by side.
        cache.clear();
        let places = [cache.claim(), cache.claim()];
        assert_eq!(places, [0, 1]);
        let prompt = ids(&[&tokens[..3], &other[..3]], &device);
        let again = to_vec(model.forward_cached(prompt, &mut cache, &places));
        assert!(
            max_diff(&again, &cached[0]) < 1e-6,
            "{ops_and}: after clear"
        );
    }
}

/// The largest difference, pass by pass, between the logits of `texts` fed together into
/// `cache` (text `r` in place `places[r]`), the tokens `from..to` of each of `steps` at a time,
/// the rows of every other pass reversed, and the logits of each text fed alone into a cache
/// of its own.
fn together_against_alone(
    model: &Gpt,
    texts: &[Vec<i64>],
    cache: &mut KvCache,
    places: &[usize],
    steps: &[(usize, usize)],
) -> Vec<f32> {
    let device = device();
    let mut alone: Vec<KvCache> = (0..texts.len())
        .map(|_| {
            let mut cache = model.new_cache_in_parts(1, 1);
            assert_eq!(cache.claim(), 0);
            cache
        })
        .collect();
    let mut diffs = Vec::new();
    for &(from, to) in steps {
        let mut rows: Vec<usize> = (0..texts.len()).collect();
        if from % 2 == 1 {
            rows.reverse();
        }
        let tokens: Vec<&[i64]> = rows.iter().map(|&r| &texts[r][from..to]).collect();
        let at: Vec<usize> = rows.iter().map(|&r| places[r]).collect();
        let together = model.forward_cached(ids(&tokens, &device), cache, &at);
        let each: Vec<Vec<f32>> = (rows.iter())
            .map(|&r| {
                let idx = ids(&[&texts[r][from..to]], &device);
                to_vec(model.forward_cached(idx, &mut alone[r], &[0]))
            })
            .collect();
        diffs.push(max_diff(&to_vec(together), &each.concat()));
    }
    diffs
}

#[test]
fn texts_in_several_parts_of_a_cache_get_the_logits_they_get_alone() {
    let device = device();
    // Twelve texts in three parts: the first part takes eight (growing from its four places),
    // then the second the next, the one with fewer texts of the two until they hold 32; place
    // p is place p / 3 of part p % 3.
    let model = modern(&device).1;
    let mut parted = model.new_cache_in_parts(12, 3);
    let places: Vec<usize> = (0..12).map(|_| parted.claim()).collect();
    assert_eq!(places, [0, 3, 6, 9, 12, 15, 18, 21, 1, 4, 7, 10]);
    assert_eq!((parted.parts(), parted.places()), (3, 16));
    // Sixty-four texts in four parts: one more part opens for each 16 texts past 32.
    let mut four = model.new_cache_in_parts(64, 4);
    let mut held = [0; 4];
    for n in 1..=64 {
        held[four.claim() % 4] += 1;
        match n {
            8 => assert_eq!(held, [8, 0, 0, 0]),
            32 => assert_eq!(held, [16, 16, 0, 0]),
            48 => assert_eq!(held, [16, 16, 16, 0]),
            _ => {}
        }
    }
    assert_eq!((held, four.places()), ([16; 4], 64));
    // A text leaves and another joins: the open part with the fewest texts, its first free
    // place.
    parted.release(4);
    assert_eq!(parted.claim(), 4);
    let texts: Vec<Vec<i64>> = (0..64)
        .map(|r| {
            (0..7)
                .map(|t| ((r * 5 + t * 3 + r * t) % 11) as i64)
                .collect()
        })
        .collect();
    // Sixty-four texts in four parts of 16, more parts than threads on up to 3 cores (each
    // thread takes the next part as it finishes one); nine in parts of 8 and 1 (a part of one
    // text: gemm takes another path for one row, at this width, which adds to a bias
    // otherwise); forty in
    // one part. Each against the text alone (the head's product took a row among 24 or more
    // texts in other last bits than alone, at this vocabulary, until the cache kept a copy of
    // the head laid out for it: BENCHMARKS.md section 37). The model has biases, drawn: they
    // start at zero.
    let config = modern(&device).0.with_n_embd(128).with_n_head(4);
    let mut model = seeded(&device, 48, || config.init(&device).unwrap());
    for block in &mut model.blocks {
        let bias = block.attn.c_attn.bias.take().expect("a model with biases");
        let drawn = seeded(&device, 49, || {
            Tensor::random(bias.dims(), Distribution::Normal(0.0, 0.5), &device)
        });
        block.attn.c_attn.bias = Some(Param::initialized(bias.id, drawn));
    }
    for ((n, parts), ops) in [(64, 4), (9, 2), (40, 1)]
        .into_iter()
        .flat_map(|c| [Ops::Fused, Ops::Composite].map(|ops| (c, ops)))
    {
        let model = model.clone().with_ops(ops);
        let mut parted = model.new_cache_in_parts(64, parts);
        let parted_places: Vec<usize> = (0..n).map(|_| parted.claim()).collect();
        // A prompt of 3 tokens, then one token at a time.
        let steps = [(0, 3), (3, 4), (4, 5), (5, 6), (6, 7)];
        let diffs =
            together_against_alone(&model, &texts[..n], &mut parted, &parted_places, &steps);
        // The fused layers give each text the same values whatever texts run beside it.
        let most = diffs.iter().copied().fold(0.0f32, f32::max);
        let tolerance = if ops == Ops::Fused { 0.0 } else { 1e-5 };
        assert!(
            most <= tolerance,
            "{ops:?}, {n} texts: differences {diffs:?}"
        );
        assert!(parted_places.iter().all(|&p| parted.len(p) == Some(7)));
    }
}

#[test]
fn a_wide_models_texts_get_the_logits_they_get_alone() {
    // A width of 384: the MLP's output layer sums an inner dimension of 1,536, which products
    // take in partial products (longer than 512). Nine texts' prompts of 60 tokens in one pass
    // (540 rows: more than a product sums alike, so the pass runs them in groups), then one
    // token at a time, every other pass reversed; each text against itself alone, whose passes
    // have one row; and the same prompts without a cache. Fused, bit for bit.
    let device = device();
    let mut config = modern(&device).0.with_n_embd(384).with_n_head(6);
    config.block_size = 64;
    let model = seeded(&device, 50, || config.init(&device).unwrap());
    let texts: Vec<Vec<i64>> = (0..9)
        .map(|r| {
            (0..63)
                .map(|t| ((r * 7 + t * 5 + r * t) % 11) as i64)
                .collect()
        })
        .collect();
    for ops in [Ops::Fused, Ops::Composite] {
        let model = model.clone().with_ops(ops);
        let mut together = model.new_cache_in_parts(9, 1);
        let places: Vec<usize> = (0..9).map(|_| together.claim()).collect();
        let steps = [(0, 60), (60, 61), (61, 62), (62, 63)];
        let mut diffs = together_against_alone(&model, &texts, &mut together, &places, &steps);
        // Without a cache: the nine texts' first 60 tokens in one pass, against each alone.
        let prompts: Vec<&[i64]> = texts.iter().map(|t| &t[..60]).collect();
        let all = to_vec(model.forward(ids(&prompts, &device)));
        let each: Vec<Vec<f32>> = (prompts.iter())
            .map(|p| to_vec(model.forward(ids(&[p], &device))))
            .collect();
        diffs.push(max_diff(&all, &each.concat()));
        let most = diffs.iter().copied().fold(0.0f32, f32::max);
        let tolerance = if ops == Ops::Fused { 0.0 } else { 1e-5 };
        assert!(most <= tolerance, "{ops:?}: differences {diffs:?}");
        assert!(places.iter().all(|&p| together.len(p) == Some(63)));
    }
}

#[test]
fn a_small_models_cache_has_parts_of_16_whatever_the_cores_and_a_large_ones_one() {
    let device = device();
    let small = modern(&device).1;
    assert_eq!(small.new_cache(32).parts(), 2);
    assert_eq!(small.new_cache(48).parts(), 3);
    assert_eq!(small.new_cache(64).parts(), 4);
    assert_eq!(small.new_cache(256).parts(), 4, "four parts at most");
    let cache = small.new_cache(64);
    assert_eq!(cache.bytes(), small.cache_bytes(64), "allocated when made");
    assert_eq!(small.new_cache(31).parts(), 1, "fewer than 16 texts a part");
    assert_eq!(
        small.clone().with_ops(Ops::Composite).new_cache(32).parts(),
        1
    );
    // 3.2 M weights: 8 texts' pass would share the cores.
    let config = modern(&device).0.with_n_embd(256).with_n_layer(4);
    let large = seeded(&device, 47, || config.init(&device).unwrap());
    assert_eq!(large.new_cache(32).parts(), 1);
}

#[test]
fn a_pass_of_several_tokens_continues_texts_of_different_lengths() {
    let device = device();
    let grouped = {
        let config = modern(&device)
            .0
            .with_n_embd(128)
            .with_n_head(4)
            .with_n_kv_head(2);
        seeded(&device, 46, || config.init(&device).unwrap())
    };
    let models = [
        ("tiny", tiny(&device).1),
        ("modern", modern(&device).1),
        ("grouped heads of 32", grouped),
    ];
    for ops in [Ops::Fused, Ops::Composite] {
        for (name, model) in &models {
            let model = model.clone().with_ops(ops);
            let (a, b): (Vec<i64>, Vec<i64>) = (vec![3, 1, 4, 1, 5, 9], vec![2, 7, 1, 8]);
            let mut cache = model.new_cache(2);
            let places = [cache.claim(), cache.claim()];
            // Text a has 3 tokens cached and text b 1; then 2 more each in one pass, from
            // positions 3 and 1.
            model.forward_cached(ids(&[&a[..3]], &device), &mut cache, &places[..1]);
            model.forward_cached(ids(&[&b[..1]], &device), &mut cache, &places[1..]);
            let both = ids(&[&a[3..5], &b[1..3]], &device);
            let cached = to_vec(model.forward_cached(both, &mut cache, &places));
            assert_eq!(places.map(|p| cache.len(p)), [Some(5), Some(3)]);
            let last = |text: &[i64]| {
                let t = text.len() - 1;
                to_vec(
                    model
                        .forward(ids(&[text], &device))
                        .slice(s![.., t..=t, ..]),
                )
            };
            let full = [last(&a[..5]), last(&b[..3])].concat();
            let diff = max_diff(&full, &cached);
            assert!(diff < 1e-4, "{ops:?}, {name}: max difference {diff}");
        }
    }
}

#[test]
fn attention_weights_are_causal_rows_that_reproduce_the_output() {
    let device = device();
    let (_, model) = tiny(&device);
    let input = ids(
        &[&[1, 2, 3, 4, 5, 6, 7, 8], &[8, 7, 6, 5, 4, 3, 2, 1]],
        &device,
    );
    // The weights are recorded on the composite layers; the model's own forward runs the fused
    // ones here, and gives the same logits.
    let (logits, weights) = model.forward_with_attention(input.clone());
    assert!(Ops::Fused.fused_on(&device), "the fused layers run here");
    let fused = model.clone().with_ops(Ops::Fused).forward(input);
    let diff = max_diff(&to_vec(logits), &to_vec(fused));
    assert!(
        diff < 1e-5,
        "logits differ from the fused forward by {diff}"
    );
    assert_eq!(weights.len(), 2);
    for w in &weights {
        assert_eq!(w.dims(), [2, 2, 8, 8]);
        let v = to_vec(w.clone());
        for row in v.chunks(8).enumerate() {
            let (r, row) = row;
            let i = r % 8;
            let sum: f32 = row.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "row sums to {sum}");
            assert!(
                row[i + 1..].iter().all(|&x| x == 0.0),
                "row {i} sees the future"
            );
        }
    }
    // The weights of layer 0, applied to its values, give the layer's attention output.
    let x0 = model
        .wte
        .forward(ids(&[&[1, 2, 3, 4, 5, 6, 7, 8]], &device))
        + model
            .wpe
            .as_ref()
            .unwrap()
            .forward(ids(&[&[0, 1, 2, 3, 4, 5, 6, 7]], &device));
    let block = &model.blocks[0];
    let xn = block.ln_1.as_ref().unwrap().forward(x0);
    let qkv = block.attn.c_attn.forward(xn.clone()); // (1, 8, 48)
    let v = qkv.narrow(2, 32, 16).reshape([1, 8, 2, 8]).swap_dims(1, 2); // (1, 2, 8, 8)
    let w0 = weights[0].clone().slice(s![0..1, .., .., ..]);
    let y = w0.matmul(v).swap_dims(1, 2).reshape([1, 8, 16]);
    let mixed = to_vec(block.attn.c_proj.forward(y));
    let direct = to_vec(block.attn.forward(xn));
    assert!(max_diff(&mixed, &direct) < 1e-5);
}

/// A model cropped to a shorter context keeps its first positions: on sequences that fit, it
/// gives the logits of the whole model, and on the autodiff device its positions still train.
#[test]
fn a_cropped_model_keeps_its_first_positions() {
    let device = device();
    let (_, model) = tiny(&device);
    let idx = ids(&[&[1, 2, 3, 4, 5]], &device);
    let want = to_vec(model.forward(idx.clone()));
    let cropped = model.clone().crop_block_size(5);
    assert_eq!(cropped.block_size(), 5);
    assert_eq!(to_vec(cropped.forward(idx.clone())), want);

    let device = Device::flex().autodiff();
    let (_, model) = tiny(&device);
    let cropped = model.crop_block_size(6);
    let loss = cropped.loss(idx.clone().to_device(&device), idx.to_device(&device), None);
    let grads = loss.backward();
    assert!(
        cropped.wpe.as_ref().unwrap().weight.grad(&grads).is_some(),
        "wpe has a gradient"
    );
}

/// The options change the model as they say: no position table with RoPE, no norm weights with
/// RMSNorm, a head of its own when untied, and zero output projections and head with
/// `zero_init`; the fused and composite layers agree on the whole model's loss and gradients.
#[test]
fn the_speedrun_options_build_what_they_say_and_both_paths_agree() {
    let device = device();
    let (config, model) = modern(&device);
    assert!(model.wpe.is_none() && model.ln_f.is_none() && model.blocks[0].ln_1.is_none());
    assert_eq!(
        model.block_size(),
        config.block_size,
        "the context is stored, not a table's"
    );
    let head = model.lm_head.as_ref().expect("an untied head");
    assert_eq!(head.val().dims(), [config.vocab_size, config.n_embd]);
    assert_eq!(
        model.clone().crop_block_size(5).block_size(),
        5,
        "crops without a position table"
    );

    let zero = seeded(&device, 3, || {
        config.clone().with_zero_init(true).init(&device).unwrap()
    });
    let all_zero = |t: Tensor<2>| to_vec(t).iter().all(|&v| v == 0.0);
    assert!(all_zero(zero.lm_head.as_ref().unwrap().val()));
    for b in &zero.blocks {
        assert!(all_zero(b.attn.c_proj.weight.val()) && all_zero(b.mlp.c_proj.weight.val()));
        assert!(!all_zero(b.attn.c_attn.weight.val()) && !all_zero(b.mlp.c_fc.weight.val()));
    }

    let device = Device::flex().autodiff();
    for model in [tiny(&device).1, modern(&device).1] {
        let input = ids(&[&[1, 2, 3, 4, 5, 6], &[6, 5, 4, 3, 2, 1]], &device);
        let target = ids(&[&[2, 3, 4, 5, 6, 7], &[5, 4, 3, 2, 1, 0]], &device);
        let run = |ops| {
            let model = model.clone().with_ops(ops);
            let key = cinder_model::DropoutKey { seed: 1, draw: 0 };
            let loss = model.loss(input.clone(), target.clone(), Some(key));
            let grads = loss.clone().backward();
            struct Grads<'a>(&'a burn::tensor::Gradients, Vec<f32>);
            impl ModuleVisitor for Grads<'_> {
                fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                    self.1
                        .extend(to_vec(p.val().grad(self.0).expect("every weight trains")));
                }
            }
            let mut g = Grads(&grads, to_vec(loss));
            model.visit(&mut g);
            g.1
        };
        let diff = max_diff(&run(Ops::Fused), &run(Ops::Composite));
        assert!(diff < 1e-4, "loss or gradients differ by {diff}");
    }
}

/// A model's weights are drawn when it is built, from the generator as seeded then: what the
/// device's generator does afterwards (a training step reseeds it) cannot change them, and the
/// fused and composite layers, which read the weights in different orders, see the same model.
#[test]
fn weights_are_drawn_when_the_model_is_built() {
    let device = device();
    let built = |reseed_after: Option<u64>| {
        let (_, model) = tiny(&device);
        if let Some(seed) = reseed_after {
            seeded(&device, seed, || ());
        }
        let mut all = Vec::new();
        struct Collect<'a>(&'a mut Vec<f32>);
        impl ModuleVisitor for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                self.0.extend(to_vec(p.val()));
            }
        }
        model.visit(&mut Collect(&mut all));
        all
    };
    assert_eq!(built(None), built(Some(7)));
}

/// Grouped-query attention: four query heads on two key/value heads, and on one (multi-query),
/// with the speedrun's options. The fused and composite layers agree, the cache gives the full
/// forward's logits, and it holds `n_head / n_kv_head` times fewer keys and values.
#[test]
fn grouped_query_attention_agrees_across_layers_and_its_cache_is_smaller() {
    let device = device();
    let modern = modern(&device).0.with_n_head(4);
    let tokens: Vec<i64> = vec![3, 1, 4, 1, 5, 9, 2, 6];
    let mut cache_bytes = Vec::new();
    for n_kv_head in [4, 2, 1] {
        let config = modern.clone().with_n_kv_head(n_kv_head);
        let model = seeded(&device, 44, || config.init(&device).unwrap());
        let input = ids(
            &[
                &tokens,
                &tokens[..].iter().rev().copied().collect::<Vec<_>>(),
            ],
            &device,
        );
        let fused = to_vec(model.clone().with_ops(Ops::Fused).forward(input.clone()));
        let composite = to_vec(
            model
                .clone()
                .with_ops(Ops::Composite)
                .forward(input.clone()),
        );
        let diff = max_diff(&fused, &composite);
        assert!(
            diff < 1e-4,
            "{n_kv_head} key/value heads: fused and composite differ by {diff}"
        );
        for ops in [Ops::Fused, Ops::Composite] {
            let model = model.clone().with_ops(ops);
            let mut cache = model.new_cache(1);
            let place = [cache.claim()];
            let prompt = ids(&[&tokens[..5]], &device);
            let mut cached = to_vec(model.forward_cached(prompt, &mut cache, &place));
            for t in 5..8 {
                let next = ids(&[&tokens[t..=t]], &device);
                cached = to_vec(model.forward_cached(next, &mut cache, &place));
            }
            let full = model.forward(ids(&[&tokens], &device));
            let last = to_vec(full.slice(s![.., 7..=7, ..]));
            let diff = max_diff(&cached, &last);
            assert!(
                diff < 1e-4,
                "{n_kv_head} key/value heads, {ops:?}: cache differs by {diff}"
            );
            assert_eq!(
                cache.bytes(),
                model.cache_bytes(1),
                "what the model says it takes"
            );
            if ops == Ops::Fused {
                cache_bytes.push(cache.bytes());
            }
        }
    }
    // One row, 2 layers, 8 positions, keys and values of 4, 2 and 1 heads of 4.
    assert_eq!(
        cache_bytes,
        [4 * 2 * 2 * 8 * 16, 4 * 2 * 2 * 8 * 8, 4 * 2 * 2 * 8 * 4]
    );
}
