//! Each fused layer against its composite version on `Flex` with autodiff: the same values, and
//! the same gradients for its input and its parameters, over several shapes. The kernels'
//! backward passes are checked against finite differences in `cinder-kernels`' tests.

use burn::module::Param;
use burn::nn::{DropoutConfig, EmbeddingConfig, LayerNormConfig, LinearConfig};
use burn::prelude::*;
use cinder_kernels::QkvLayout;
use cinder_kernels::dropout::Mask;
use cinder_testing::max_diff;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

const FUSED: Pass = Pass {
    fused: true,
    dropout: None,
    eps: 1e-5,
};
const COMPOSITE: Pass = Pass {
    fused: false,
    dropout: None,
    eps: 1e-5,
};

fn device() -> Device {
    Device::flex().autodiff()
}

/// Standard normal values drawn from a generator of the test's own (Box-Muller), not from the
/// device's: that one is global to the process, and tests running in parallel would reseed it
/// between one test's two draws of the "same" tensor.
fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<D> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = shape.iter().product::<usize>();
    let normals = (0..n)
        .map(|_| {
            let (u, v): (f32, f32) = (1.0 - rng.random::<f32>(), rng.random());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect::<Vec<_>>();
    Tensor::from_data(TensorData::new(normals, shape), &device())
}

fn values<const D: usize>(t: &Tensor<D>) -> Vec<f32> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap()
}

/// The output of `f` and the gradients of `sum(output * weights)` for `inputs`, with a fixed
/// random `weights` so that every output element matters differently.
fn run<const D: usize, const N: usize>(
    inputs: [Tensor<D>; N],
    f: impl Fn([Tensor<D>; N]) -> Tensor<3>,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let inputs = inputs.map(|t| t.detach().require_grad());
    let out = f(inputs.clone());
    let weights = random(out.dims(), 99);
    let grads = (out.clone() * weights).sum().backward();
    let g = inputs
        .iter()
        .map(|t| values(&t.grad(&grads).expect("a gradient for every input")))
        .collect();
    (values(&out), g)
}

fn assert_close(
    what: &str,
    (a, ga): (Vec<f32>, Vec<Vec<f32>>),
    (b, gb): (Vec<f32>, Vec<Vec<f32>>),
    tol: f32,
) {
    let d = max_diff(&a, &b);
    assert!(d < tol, "{what}: values differ by {d}");
    for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
        let d = max_diff(x, y);
        assert!(d < tol, "{what}: gradient of input {i} differs by {d}");
    }
}

/// The gradients of `sum(out * weights)` (fixed random weights) for a weight and its optional
/// bias, flattened one after the other.
fn param_grads<const D: usize, const W: usize>(
    out: Tensor<D>,
    weight: &Param<Tensor<W>>,
    bias: Option<&Param<Tensor<1>>>,
) -> Vec<f32> {
    let g = (out.clone() * random(out.dims(), 7)).sum().backward();
    let mut v = values(&weight.val().grad(&g).unwrap());
    if let Some(b) = bias {
        v.extend(values(&b.val().grad(&g).unwrap()));
    }
    v
}

/// Parameters of a module replaced by random values (so biases and gains are not trivial).
fn randomise<const D: usize>(p: &Param<Tensor<D>>, seed: u64) -> Param<Tensor<D>> {
    Param::initialized(p.id, random(p.val().dims(), seed).require_grad())
}

#[test]
fn layer_norm_matches_burn() {
    let cases = [
        ([2, 5, 16], true, 1e-5),
        ([3, 70, 24], false, 1e-5),
        ([1, 1, 8], true, 1e-5),
        ([2, 3, 8], true, 0.5), // an epsilon large enough to matter
    ];
    for (shape, bias, eps) in cases {
        let mut ln = LayerNormConfig::new(shape[2])
            .with_bias(bias)
            .with_epsilon(eps)
            .init(&device());
        let (fused, composite) = (
            Pass {
                eps: eps as f32,
                ..FUSED
            },
            Pass {
                eps: eps as f32,
                ..COMPOSITE
            },
        );
        ln.gamma = randomise(&ln.gamma, 1);
        ln.beta = ln.beta.as_ref().map(|b| randomise(b, 2));
        let x = random(shape, 3);
        let case = |pass| run([x.clone()], |[x]| norm(Some(&ln), x, pass));
        assert_close(
            &format!("layer norm {shape:?} bias {bias}"),
            case(fused),
            case(composite),
            1e-4,
        );
        let grad_of = |pass| {
            param_grads(
                norm(Some(&ln), x.clone(), pass),
                &ln.gamma,
                ln.beta.as_ref(),
            )
        };
        let d = max_diff(&grad_of(fused), &grad_of(composite));
        assert!(
            d < 1e-4,
            "layer norm {shape:?}: parameter gradients differ by {d}"
        );
    }
}

#[test]
fn linear_and_its_residual_form_match_burn() {
    for (shape, d_out, bias) in [([2, 5, 16], 48, true), ([3, 9, 24], 24, false)] {
        let mut l = LinearConfig::new(shape[2], d_out)
            .with_bias(bias)
            .init(&device());
        l.weight = randomise(&l.weight, 1);
        l.bias = l.bias.as_ref().map(|b| randomise(b, 2));
        let drop = DropoutConfig::new(0.0).init();
        let x = random(shape, 3);
        let r = random([shape[0], shape[1], d_out], 4);
        let plain = |pass| run([x.clone()], |[x]| linear(&l, x, pass));
        assert_close(
            &format!("linear {shape:?}"),
            plain(FUSED),
            plain(COMPOSITE),
            1e-4,
        );
        let residual = |pass| {
            run([x.clone(), r.clone()], |[x, r]| {
                project_residual(&l, &drop, x, r, pass, (0, Site::MlpOutput))
            })
        };
        assert_close(
            &format!("residual linear {shape:?}"),
            residual(FUSED),
            residual(COMPOSITE),
            1e-4,
        );
        let grad_of = |pass| param_grads(linear(&l, x.clone(), pass), &l.weight, l.bias.as_ref());
        let d = max_diff(&grad_of(FUSED), &grad_of(COMPOSITE));
        assert!(
            d < 1e-3,
            "linear {shape:?}: parameter gradients differ by {d}"
        );
    }
}

#[test]
fn linear_activation_matches_burn() {
    let cases = [
        (true, Activation::Gelu),
        (false, Activation::Gelu),
        (true, Activation::GeluTanh),
        (false, Activation::GeluTanh),
        (true, Activation::Relu2),
        (false, Activation::Relu2),
    ];
    for (bias, activation) in cases {
        let mut l = LinearConfig::new(16, 40).with_bias(bias).init(&device());
        l.weight = randomise(&l.weight, 1);
        l.bias = l.bias.as_ref().map(|b| randomise(b, 2));
        let x = random([2, 7, 16], 5) * 3.0;
        let case = |pass| {
            run([x.clone()], |[x]| {
                linear_activation(&l, activation, x, pass)
            })
        };
        assert_close(
            &format!("{activation:?}, bias {bias}"),
            case(FUSED),
            case(COMPOSITE),
            1e-4,
        );
        let grad_of = |pass| {
            let y = linear_activation(&l, activation, x.clone(), pass);
            param_grads(y, &l.weight, l.bias.as_ref())
        };
        let d = max_diff(&grad_of(FUSED), &grad_of(COMPOSITE));
        assert!(
            d < 1e-3,
            "{activation:?}, bias {bias}: parameter gradients differ by {d}"
        );
        // Inference (no autodiff) has its own fused GELU, in place.
        let (l, x) = (l.valid(), x.inner());
        let infer = |pass| values(&linear_activation(&l, activation, x.clone(), pass));
        let d = max_diff(&infer(FUSED), &infer(COMPOSITE));
        assert!(
            d < 1e-4,
            "{activation:?}, bias {bias}: inference differs by {d}"
        );
    }
}

/// The composite attention of `qkv` `[B, T, W]` (laid out as `layout` says) with the weights
/// multiplied by `mask`'s factors (all 1 without a mask): the definition the fused kernel must
/// follow. Query head `h` reads key/value head `h / group`, picked by index.
fn composite_attention(qkv: Tensor<3>, layout: QkvLayout, mask: Option<Mask>) -> Tensor<3> {
    let [b, t, _] = qkv.dims();
    let (h, hs, device) = (layout.n_head, layout.head_size, qkv.device());
    let heads = |cols: std::ops::Range<usize>, n: usize| {
        let x = qkv
            .clone()
            .narrow(2, cols.start, cols.len())
            .reshape([b, t, n, hs]);
        let pick: Vec<i64> = (0..h).map(|q| (q * n / h) as i64).collect();
        let pick = Tensor::<1, Int>::from_data(TensorData::new(pick, [h]), &device);
        x.select(2, pick).swap_dims(1, 2) // (B, H, T, hs)
    };
    let (q, k, v) = (
        heads(layout.q(), h),
        heads(layout.k(), layout.n_kv_head),
        heads(layout.v(), layout.n_kv_head),
    );
    let scores = q.matmul(k.swap_dims(2, 3)) / (hs as f64).sqrt();
    let future = Tensor::<2, Bool>::tril_mask([t, t], 0, &device).reshape([1, 1, t, t]);
    let mut w = burn::tensor::activation::softmax(scores.mask_fill(future, f32::NEG_INFINITY), 3);
    if let Some(m) = mask {
        let factors: Vec<f32> = (0..(b * h * t * t) as u64).map(|i| m.factor(i)).collect();
        w = w * Tensor::<4>::from_data(TensorData::new(factors, [b, h, t, t]), &device);
    }
    w.matmul(v)
        .swap_dims(1, 2)
        .reshape([b, t, layout.q_width()])
}

#[test]
fn attention_matches_its_composite_version_with_and_without_dropout() {
    // A sequence shorter than a row block, one of exactly one block, and one of several;
    // multi-head, grouped-query and multi-query attention.
    let cases = [
        (2, 5, QkvLayout::new(2, 2, 4)),
        (1, 64, QkvLayout::new(4, 4, 8)),
        (2, 150, QkvLayout::new(3, 3, 8)),
        (2, 70, QkvLayout::new(4, 2, 8)),
        (1, 9, QkvLayout::new(6, 1, 4)),
    ];
    for (b, t, layout) in cases {
        let qkv = random([b, t, layout.width()], 11);
        for mask in [None, Some(Mask { p: 0.3, seed: 42 })] {
            let fused = run([qkv.clone()], |[q]| fused::attention(q, layout, mask));
            let composite = run([qkv.clone()], |[q]| composite_attention(q, layout, mask));
            assert_close(
                &format!("attention {b}x{t}, {layout:?}, {mask:?}"),
                fused,
                composite,
                1e-4,
            );
        }
    }
}

#[test]
fn dropout_applies_its_mask_forward_and_backward() {
    let x = random([3, 10, 16], 2);
    let mask = Mask { p: 0.25, seed: 7 };
    let fused = run([x.clone()], |[x]| fused::dropout(x, None, mask));
    let factors: Vec<f32> = (0..480u64).map(|i| mask.factor(i)).collect();
    let m = Tensor::<3>::from_data(TensorData::new(factors.clone(), [3, 10, 16]), &device());
    let composite = run([x.clone()], |[x]| x * m.clone());
    assert_close("dropout", fused, composite, 1e-6);
    // With a residual: residual + x ⊙ mask, and the residual's gradient passes through.
    let r = random([3, 10, 16], 4);
    let fused = run([x.clone(), r.clone()], |[x, r]| {
        fused::dropout(x, Some(r), mask)
    });
    let composite = run([x.clone(), r], |[x, r]| r + x * m.clone());
    assert_close("dropout with a residual", fused, composite, 1e-6);
    let dropped = factors.iter().filter(|&&f| f == 0.0).count();
    assert!(
        (80..160).contains(&dropped),
        "{dropped} of 480 dropped at p = 0.25"
    );
}

#[test]
fn rms_norm_matches_its_composite_version() {
    for (shape, eps) in [([2, 5, 16], 1e-5), ([3, 70, 24], 1e-5), ([2, 3, 8], 0.5)] {
        let pass = |p: Pass| Pass { eps, ..p };
        let x = random(shape, 11);
        let case = |p| run([x.clone()], |[x]| norm(None, x, pass(p)));
        assert_close(
            &format!("rms norm {shape:?}"),
            case(FUSED),
            case(COMPOSITE),
            1e-4,
        );
    }
}

#[test]
fn qk_norm_and_rope_match_their_composite_version() {
    // (batch, seq, layout), rope, qk_norm, each row's first position
    let mha = |h: usize, c: usize| QkvLayout::multi_head(h, c);
    let cases: [(_, _, _, &[usize]); 6] = [
        ((2, 5, mha(2, 16)), true, false, &[]),
        ((2, 5, mha(2, 16)), false, true, &[]),
        ((3, 7, mha(4, 32)), true, true, &[]),
        ((1, 3, mha(2, 8)), true, true, &[5]), // positions after a cache's
        ((3, 1, mha(2, 8)), true, true, &[4, 0, 9]), // rows decoded together, each at its own
        ((2, 6, QkvLayout::new(4, 2, 8)), true, true, &[]), // grouped-query attention
    ];
    for ((b, t, layout), rope, qk_norm, starts) in cases {
        let qkv = random([b, t, layout.width()], 12);
        let case = |p| {
            run([qkv.clone()], |[x]| {
                rotate_qk(x, layout, starts, rope, qk_norm, p)
            })
        };
        let what =
            format!("rope {rope}, qk_norm {qk_norm}, starts {starts:?}, [{b}, {t}], {layout:?}");
        assert_close(&what, case(FUSED), case(COMPOSITE), 1e-4);
    }
    // Neither: the projection itself.
    let qkv = random([2, 5, 48], 13);
    let same = rotate_qk(qkv.clone(), mha(2, 16), &[], false, false, FUSED);
    assert_eq!(values(&same), values(&qkv));
}

#[test]
fn embedding_and_head_loss_match_burn() {
    let dev = device();
    let (v, block, c) = (13, 12, 16);
    let mut wte = EmbeddingConfig::new(v, c).init(&dev);
    let mut wpe = EmbeddingConfig::new(block, c).init(&dev);
    wte.weight = randomise(&wte.weight, 1);
    wpe.weight = randomise(&wpe.weight, 2);
    let own_head = randomise(&wte.weight, 4);
    let mut ln = LayerNormConfig::new(c).init(&dev);
    ln.gamma = randomise(&ln.gamma, 3);
    let drop = DropoutConfig::new(0.0).init();
    let ids: Vec<i64> = (0..2 * 9).map(|i| (i * 7 % v) as i64).collect();
    let idx = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [2, 9]), &dev);
    let targets: Vec<i64> = ids.iter().map(|i| (i + 3) % v as i64).collect();
    let targets = Tensor::<2, Int>::from_data(TensorData::new(targets, [2, 9]), &dev);
    // GPT-2's (learned positions, LayerNorm, tied head), then the speedrun's (no positions,
    // RMSNorm after the embedding and before the head, an untied head, a soft-cap).
    for modern in [false, true] {
        let case = |pass| {
            let (wpe, ln) = if modern {
                (None, None)
            } else {
                (Some(&wpe), Some(&ln))
            };
            let head = if modern { &own_head } else { &wte.weight };
            let softcap = if modern { 2.0 } else { 0.0 };
            let x = embed(&wte, wpe, modern, &drop, idx.clone(), &[], pass);
            let x = norm(ln, x, pass);
            let loss = head_loss(head.val(), softcap, x, targets.clone(), pass);
            let g = loss.clone().backward();
            let mut v = values(&loss);
            let params = [Some(&wte.weight), wpe.map(|e| &e.weight), Some(head)];
            for p in params.into_iter().flatten() {
                v.extend(values(&p.val().grad(&g).unwrap()));
            }
            if let Some(ln) = ln {
                v.extend(values(&ln.gamma.val().grad(&g).unwrap()));
            }
            v
        };
        let d = max_diff(&case(FUSED), &case(COMPOSITE));
        assert!(
            d < 1e-5,
            "embedding and head (modern {modern}): loss or gradients differ by {d}"
        );
    }
}

/// The fused cached attention takes its cache's tensors by their layouts: buffers that are
/// views of part of larger ones give what copies of them give (the kernel writes whole buffers).
#[test]
fn cached_attention_takes_views_of_buffers_as_their_values() {
    let device = Device::flex();
    let (s, block, layout) = (2, 8, QkvLayout::new(4, 2, 4));
    let kv = layout.kv_width();
    let on_flex = |t: Tensor<3>| Tensor::<3>::from_data(t.into_data(), &device);
    let qkv = on_flex(random([s, 1, layout.width()], 1));
    let (keys, values_) = (
        on_flex(random([s + 2, kv, block], 2)),
        on_flex(random([s + 2, block, kv], 3)),
    );
    let view = |b: &Tensor<3>| b.clone().narrow(0, 1, s);
    let copy = |b: &Tensor<3>| on_flex(view(b));
    let (starts, places) = ([3, 5], [1, 0]);
    let run = |kv| {
        let (y, (k, v)) = fused::cached_attention(qkv.clone(), kv, &starts, &places, layout, true);
        [values(&y), values(&k), values(&v)]
    };
    let from_views = run((view(&keys), view(&values_)));
    let from_copies = run((copy(&keys), copy(&values_)));
    assert_eq!(from_views, from_copies);
}
