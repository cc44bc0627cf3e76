//! Each kernel against a plain, obviously correct implementation (loops over the definitions),
//! and each backward pass against central differences of its forward, on small random inputs.

use cinder_kernels::attention::{self, Shape};
use cinder_kernels::layernorm::Norm;
use cinder_kernels::linear::{self, Linear};
use cinder_kernels::matmul::Mat;
use cinder_kernels::{QkvLayout, activation, dropout, embedding, layernorm, loss, rmsnorm, rotary};
use cinder_testing::max_diff;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The LayerNorm tests' epsilon.
const EPS: f32 = 1e-5;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
}

/// `Σ y ⊙ r` in f64: the scalar objective whose gradient with respect to `y` is `r`.
fn weighted_sum(y: &[f32], r: &[f32]) -> f64 {
    assert_eq!(y.len(), r.len());
    y.iter()
        .zip(r)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

/// Asserts that `grad` (a backward pass's output) is the gradient of `f` at `x`, element by
/// element for the elements `at`: each is moved by ±1e-2 and the central difference of `f`
/// (divided by the step f32 actually took) must agree to 2e-3, relative above 1.
fn check_gradient(
    what: &str,
    f: impl Fn(&[f32]) -> f64,
    x: &[f32],
    grad: &[f32],
    at: impl IntoIterator<Item = usize>,
) {
    assert_eq!(x.len(), grad.len(), "{what}: not the shape of its input");
    let eps = 1e-2f32;
    let mut moved = x.to_vec();
    for i in at {
        let (up, down) = (x[i] + eps, x[i] - eps);
        moved[i] = up;
        let f_up = f(&moved);
        moved[i] = down;
        let f_down = f(&moved);
        moved[i] = x[i];
        let numeric = (f_up - f_down) / (f64::from(up) - f64::from(down));
        let analytic = f64::from(grad[i]);
        assert!(
            (numeric - analytic).abs() < 2e-3 * (1.0 + numeric.abs()),
            "{what}[{i}]: finite differences {numeric}, backward {analytic}"
        );
    }
}

/// Causal attention straight from its definition, for one sequence and one query head at a
/// time: query head `h` with key/value head `h / (n_head / n_kv_head)`.
fn naive_attention(qkv: &[f32], s: Shape) -> Vec<f32> {
    let (t, l) = (s.seq, s.layout);
    let (c, w, hs) = (l.n_head * l.head_size, l.width(), l.head_size);
    let mut y = vec![0.0; s.batch * t * c];
    for b in 0..s.batch {
        for h in 0..l.n_head {
            let g = h * l.n_kv_head / l.n_head;
            let q = |i: usize, d: usize| qkv[(b * t + i) * w + h * hs + d];
            let k = |j: usize, d: usize| qkv[(b * t + j) * w + c + g * hs + d];
            let v = |j: usize, d: usize| qkv[(b * t + j) * w + c + l.kv_width() + g * hs + d];
            for i in 0..t {
                let scores: Vec<f32> = (0..=i)
                    .map(|j| (0..hs).map(|d| q(i, d) * k(j, d)).sum::<f32>() / (hs as f32).sqrt())
                    .collect();
                let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|x| (x - m).exp()).collect();
                let total: f32 = e.iter().sum();
                for d in 0..hs {
                    y[(b * t + i) * c + h * hs + d] = (0..=i).map(|j| e[j] / total * v(j, d)).sum();
                }
            }
        }
    }
    y
}

#[test]
fn attention_matches_its_definition_across_row_blocks() {
    // 150 positions: three blocks of queries, the last one partial. Multi-head, grouped-query
    // and multi-query attention.
    for layout in [
        QkvLayout::new(3, 3, 8),
        QkvLayout::new(6, 2, 4),
        QkvLayout::new(4, 1, 6),
    ] {
        let s = Shape {
            batch: 2,
            seq: 150,
            layout,
        };
        let qkv = random(s.batch * s.seq * layout.width(), 1);
        let mut att = vec![0.0; s.batch * layout.n_head * s.seq * s.seq];
        let mut y = vec![0.0; s.batch * s.seq * layout.q_width()];
        attention::forward(&qkv, s, None, &mut att, &mut y);
        let diff = max_diff(&y, &naive_attention(&qkv, s));
        assert!(diff < 1e-5, "{layout:?}: max difference {diff}");
        // The weights: rows sum to 1, nothing above the diagonal.
        for row in 0..s.batch * layout.n_head * s.seq {
            let i = row % s.seq;
            let w = &att[row * s.seq..(row + 1) * s.seq];
            assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            assert!(w[i + 1..].iter().all(|&x| x == 0.0));
        }
    }
}

#[test]
fn attention_backward_matches_finite_differences() {
    // Grouped heads sum their gradients into the keys and values they share.
    for (layout, seed) in [(QkvLayout::new(2, 2, 4), 2), (QkvLayout::new(4, 2, 4), 12)] {
        let s = Shape {
            batch: 1,
            seq: 70,
            layout,
        };
        let qkv = random(s.seq * layout.width(), seed);
        let r = random(s.seq * layout.q_width(), seed + 1); // loss = sum(y * r)
        let loss = |qkv: &[f32]| weighted_sum(&naive_attention(qkv, s), &r);
        let mut att = vec![0.0; layout.n_head * s.seq * s.seq];
        let mut y = vec![0.0; s.seq * layout.q_width()];
        attention::forward(&qkv, s, None, &mut att, &mut y);
        let mut dqkv = vec![0.0; qkv.len()];
        attention::backward(&r, &qkv, &att, s, None, &mut dqkv);
        let mut rng = ChaCha8Rng::seed_from_u64(seed + 2);
        // Every part: queries, keys and values.
        let at: Vec<usize> = (0..60).map(|_| rng.random_range(0..qkv.len())).collect();
        check_gradient(&format!("dqkv {layout:?}"), loss, &qkv, &dqkv, at);
    }
}

#[test]
fn layernorm_matches_its_definition_and_its_backward_finite_differences() {
    let (n, c) = (5, 37);
    let x = random(n * c, 5);
    let (gamma, beta) = (random(c, 6), random(c, 7));
    let p = Norm {
        gamma: &gamma,
        beta: Some(&beta),
        eps: EPS,
    };
    let naive = |x: &[f32]| -> Vec<f32> {
        x.chunks(c)
            .flat_map(|row| {
                let m = row.iter().sum::<f32>() / c as f32;
                let v = row.iter().map(|a| (a - m) * (a - m)).sum::<f32>() / c as f32;
                let rstd = 1.0 / (v + EPS).sqrt();
                row.iter()
                    .enumerate()
                    .map(|(j, a)| (a - m) * rstd * p.gamma[j] + beta[j])
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    layernorm::forward(&x, p, &mut out, &mut mean, &mut rstd);
    assert!(max_diff(&out, &naive(&x)) < 1e-5);

    let r = random(n * c, 8); // loss = sum(out * r)
    let loss = |x: &[f32]| weighted_sum(&naive(x), &r);
    let (mut dgamma, mut dbeta) = (vec![0.0; c], vec![0.0; c]);
    let mut dx = vec![0.0; n * c];
    layernorm::backward(
        &r,
        &x,
        &mean,
        &rstd,
        &gamma,
        &mut dgamma,
        Some(&mut dbeta),
        &mut dx,
    );
    check_gradient("dx", loss, &x, &dx, (0..n * c).step_by(7));
    // dbeta is the column sum of the upstream gradient.
    let col: Vec<f32> = (0..c).map(|j| (0..n).map(|i| r[i * c + j]).sum()).collect();
    assert!(max_diff(&dbeta, &col) < 1e-5);
}

#[test]
fn gelu_matches_its_definition_and_derivative() {
    let x: Vec<f32> = (-600..600).map(|i| i as f32 * 0.01).collect(); // rows of 3
    let exact = |v: f64| 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2));
    let tanh = |v: f64| {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
        0.5 * v * (1.0 + u.tanh())
    };
    let relu2 = |v: f64| v.max(0.0) * v.max(0.0);
    let kinds: [(activation::Kind, &dyn Fn(f64) -> f64); 3] = [
        (activation::Kind::Erf, &exact),
        (activation::Kind::Tanh, &tanh),
        (activation::Kind::Relu2, &relu2),
    ];
    for (kind, f) in kinds {
        let mut derivative = x.clone();
        let mut out = vec![0.0; x.len()];
        activation::forward_keep_derivative(kind, &mut derivative, None, &mut out);
        let want: Vec<f32> = x.iter().map(|&v| f(f64::from(v)) as f32).collect();
        assert!(max_diff(&out, &want) < 2e-6, "{kind:?}");
        // Inference gives the same values, in place, and a bias is added to each row.
        let bias = [0.5f32, -1.0, 0.25];
        let mut in_place = x.clone();
        activation::forward_in_place(kind, &mut in_place, Some(&bias));
        for (i, (&v, &g)) in x.iter().zip(&in_place).enumerate() {
            let want = f(f64::from(v + bias[i % 3])) as f32;
            assert!((g - want).abs() < 2e-6, "{kind:?} at {v}: {g} vs {want}");
        }
        let mut d = vec![1.0; x.len()];
        activation::backward_from_derivative(&derivative, &mut d);
        for (i, &v) in x.iter().enumerate().step_by(13) {
            let h = 1e-3f64;
            let numeric = (f(f64::from(v) + h) - f(f64::from(v) - h)) / (2.0 * h);
            assert!(
                (numeric - f64::from(d[i])).abs() < 1e-5,
                "{kind:?}, x = {v}: {numeric} vs {}",
                d[i]
            );
        }
    }
}

/// The backward pass refuses buffers of another shape, as the forward does, instead of reading
/// past a sequence or leaving part of `dqkv` unwritten.
#[test]
fn attention_backward_checks_every_buffer_length() {
    let s = Shape {
        batch: 1,
        seq: 4,
        layout: QkvLayout::new(2, 2, 2),
    };
    let (bt, c, t) = (s.batch * s.seq, s.layout.q_width(), s.seq);
    let qkv = random(bt * s.layout.width(), 2);
    let mut att = vec![0.0; s.batch * s.layout.n_head * t * t];
    let mut y = vec![0.0; bt * c];
    attention::forward(&qkv, s, None, &mut att, &mut y);
    let good = |dy: &[f32], att: &[f32]| {
        let mut dqkv = vec![0.0; qkv.len()];
        attention::backward(dy, &qkv, att, s, None, &mut dqkv);
    };
    good(&y, &att);
    let too_long_dy = [y.clone(), vec![0.0; c]].concat();
    let too_long_att = [att.clone(), vec![0.0; t * t]].concat();
    for (dy, att) in [(&too_long_dy, &att), (&y, &too_long_att)] {
        let (dy, att) = (dy.clone(), att.clone());
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| good(&dy, &att)));
        assert!(result.is_err(), "a wrong length must be refused");
    }
}

#[test]
fn linear_matches_its_definition_and_its_backward_finite_differences() {
    // More rows than one block of the bias gradient's sum over rows (256).
    let (n, d_in, d_out) = (260, 3, 5);
    let x = random(n * d_in, 10);
    let (weight, bias) = (random(d_in * d_out, 11), random(d_out, 12));
    let r = random(n * d_out, 13); // loss = sum(y * r)
    let forward =
        |x: &[f32], w: &[f32], b: &[f32]| linear::forward(x, Linear::new(w, Some(b), d_out));
    let naive: Vec<f32> = (0..n * d_out)
        .map(|k| {
            let (i, j) = (k / d_out, k % d_out);
            bias[j]
                + (0..d_in)
                    .map(|m| x[i * d_in + m] * weight[m * d_out + j])
                    .sum::<f32>()
        })
        .collect();
    assert!(max_diff(&forward(&x, &weight, &bias), &naive) < 1e-5);

    let loss = |x: &[f32], w: &[f32], b: &[f32]| weighted_sum(&forward(x, w, b), &r);
    let l = Linear::new(&weight, Some(&bias), d_out);
    let g = linear::backward(&r, &x, l, [true; 3]);
    let (dx, dw, db) = (g.dx.unwrap(), g.dw.unwrap(), g.db.unwrap());
    check_gradient("dx", |x| loss(x, &weight, &bias), &x, &dx, 0..x.len());
    check_gradient("dw", |w| loss(&x, w, &bias), &weight, &dw, 0..dw.len());
    check_gradient("db", |b| loss(&x, &weight, b), &bias, &db, 0..d_out);
}

/// `residual + x W + b` has the layer's gradients for x, W and b, and `dy` for the residual.
#[test]
fn linear_residual_forward_has_the_linear_backward() {
    let (n, d_in, d_out) = (7, 4, 6);
    let (x, weight, bias) = (
        random(n * d_in, 14),
        random(d_in * d_out, 15),
        random(d_out, 16),
    );
    let (residual, r) = (random(n * d_out, 17), random(n * d_out, 18));
    for bias in [Some(&bias[..]), None] {
        let loss = |x: &[f32], w: &[f32], b: Option<&[f32]>, res: &[f32]| {
            let out = linear::forward_residual(x, Linear::new(w, b, d_out), res);
            weighted_sum(&out, &r)
        };
        let l = Linear::new(&weight, bias, d_out);
        let g = linear::backward(&r, &x, l, [true, true, bias.is_some()]);
        assert_eq!(g.db.is_some(), bias.is_some());
        let (dx, dw, db) = (g.dx.unwrap(), g.dw.unwrap(), g.db.unwrap_or_default());
        check_gradient(
            "dx",
            |x| loss(x, &weight, bias, &residual),
            &x,
            &dx,
            0..x.len(),
        );
        check_gradient(
            "dw",
            |w| loss(&x, w, bias, &residual),
            &weight,
            &dw,
            0..dw.len(),
        );
        if let Some(b) = bias {
            check_gradient(
                "db",
                |b| loss(&x, &weight, Some(b), &residual),
                b,
                &db,
                0..d_out,
            );
        }
        let all = 0..residual.len();
        check_gradient(
            "dresidual",
            |res| loss(&x, &weight, bias, res),
            &residual,
            &r,
            all,
        );
    }
}

#[test]
fn embedding_backward_matches_finite_differences() {
    // Fewer tokens than rows, so most tokens' rows gather several rows' gradients; positions
    // past `seq` get none.
    let (batch, seq, vocab, block_size, c) = (3, 5, 4, 7, 6);
    let mut rng = ChaCha8Rng::seed_from_u64(20);
    let ids: Vec<u32> = (0..batch * seq)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    let (wte, wpe) = (random(vocab * c, 21), random(block_size * c, 22));
    let r = random(batch * seq * c, 23); // loss = sum(out * r)
    let loss = |wte: &[f32], wpe: &[f32]| {
        let mut out = vec![0.0; batch * seq * c];
        embedding::forward(&ids, seq, &[], wte, wpe, &mut out);
        weighted_sum(&out, &r)
    };
    // The backward adds to its buffers: start them at 0.5 and take it off after.
    let (mut dwte, mut dwpe) = (vec![0.5; wte.len()], vec![0.5; wpe.len()]);
    embedding::backward(&r, &ids, seq, &mut dwte, &mut dwpe);
    dwte.iter_mut().chain(&mut dwpe).for_each(|g| *g -= 0.5);
    check_gradient("dwte", |wte| loss(wte, &wpe), &wte, &dwte, 0..wte.len());
    check_gradient("dwpe", |wpe| loss(&wte, wpe), &wpe, &dwpe, 0..wpe.len());

    // Without learned positions (rotary embeddings), the token embedding alone.
    let mut out = vec![0.0; batch * seq * c];
    embedding::forward(&ids, seq, &[], &wte, &[], &mut out);
    for (row, &tok) in out.chunks(c).zip(&ids) {
        assert_eq!(row, &wte[tok as usize * c..(tok as usize + 1) * c]);
    }
    let mut dwte_alone = vec![0.0; wte.len()];
    embedding::backward(&r, &ids, seq, &mut dwte_alone, &mut []);
    assert_eq!(dwte_alone, dwte);
}

/// Given the head laid out `[C, V]`, a row's logits are the same bits alone and among other
/// rows, and agree with the head taken transposed as strides (whose rows do not keep their
/// bits: BENCHMARKS.md section 37).
#[test]
fn a_rows_logits_do_not_depend_on_the_rows_beside_it() {
    for (c, v) in [(128, 65), (128, 11), (384, 700), (20, 3)] {
        let (x, w) = (random(70 * c, 40), random(v * c, 41));
        let mut columns = vec![0.0; c * v]; // w transposed: [C, V]
        for (j, row) in w.chunks_exact(c).enumerate() {
            for (k, &value) in row.iter().enumerate() {
                columns[k * v + j] = value;
            }
        }
        let head = Mat::new(&columns, c, v);
        let logits = |rows: &[f32], head: Mat| {
            let mut out = vec![0.0; rows.len() / c * v];
            loss::logits(rows, head, 0.0, &mut out); // no cap: it would hide last bits
            out
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for n in [2, 3, 8, 24, 70] {
            let many = logits(&x[..n * c], head);
            let strided = logits(&x[..n * c], Mat::new(&w, v, c).t());
            assert!(max_diff(&many, &strided) < 1e-4, "{c}x{v}, {n} rows"); // logits near 20
            for r in [0, n / 2, n - 1] {
                let alone = logits(&x[r * c..(r + 1) * c], head);
                let row = &many[r * v..(r + 1) * v];
                assert_eq!(bits(row), bits(&alone), "{c}x{v}, row {r} of {n}");
            }
        }
    }
}

#[test]
fn loss_backward_matches_finite_differences_with_and_without_the_soft_cap() {
    let (n, c, v) = (4, 6, 11);
    let (x, wte) = (random(n * c, 30), random(v * c, 31));
    let targets = [3u32, 0, 10, 3];
    let scale = 0.75; // as for a loss divided over gradient-accumulation steps
    for cap in [0.0f32, 1.5] {
        let slopes_len = if cap > 0.0 { n * v } else { 0 };
        let loss = |x: &[f32], wte: &[f32]| {
            let (mut probs, mut slopes) = (vec![0.0; n * v], vec![0.0; slopes_len]);
            let l = loss::forward(x, wte, &targets, cap, &mut probs, &mut slopes);
            f64::from(scale) * f64::from(l)
        };
        // The loss from its definition: the capped logits' log-softmax at the targets.
        let mut logits = vec![0.0; n * v];
        loss::logits(&x, Mat::new(&wte, v, c).t(), cap, &mut logits);
        let naive: f64 = (0..n)
            .map(|i| {
                let z: Vec<f64> = (0..v)
                    .map(|j| {
                        let d: f64 = (0..c)
                            .map(|k| f64::from(x[i * c + k]) * f64::from(wte[j * c + k]))
                            .sum();
                        if cap > 0.0 {
                            f64::from(cap) * (d / f64::from(cap)).tanh()
                        } else {
                            d
                        }
                    })
                    .collect();
                assert!((z[3] - f64::from(logits[i * v + 3])).abs() < 1e-5);
                let lse = z.iter().map(|a| a.exp()).sum::<f64>().ln();
                lse - z[targets[i] as usize]
            })
            .sum::<f64>()
            / n as f64;
        assert!(
            (loss(&x, &wte) / f64::from(scale) - naive).abs() < 1e-5,
            "cap {cap}"
        );
        if cap > 0.0 {
            assert!(
                logits.iter().all(|z| z.abs() < cap),
                "capped logits stay below the cap"
            );
        }
        let (mut probs, mut slopes) = (vec![0.0; n * v], vec![0.0; slopes_len]);
        loss::forward(&x, &wte, &targets, cap, &mut probs, &mut slopes);
        // Stale values in the buffers: the backward writes its gradients, it does not add to them.
        let (mut dx, mut dwte) = (vec![9.0; x.len()], vec![9.0; wte.len()]);
        loss::backward(
            &x, &wte, &targets, scale, &slopes, &mut probs, &mut dx, &mut dwte,
        );
        check_gradient("dx", |x| loss(x, &wte), &x, &dx, 0..x.len());
        check_gradient("dwte", |wte| loss(&x, wte), &wte, &dwte, 0..wte.len());
    }
}

#[test]
fn rmsnorm_matches_its_definition_and_its_backward_finite_differences() {
    let (n, c) = (5, 37);
    let x = random(n * c, 50);
    let naive = |x: &[f32]| -> Vec<f32> {
        x.chunks(c)
            .flat_map(|row| {
                let ms = row.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>() / c as f64;
                let r = 1.0 / (ms + f64::from(EPS)).sqrt();
                row.iter().map(move |a| (f64::from(*a) * r) as f32)
            })
            .collect()
    };
    let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
    rmsnorm::forward(&x, c, EPS, &mut out, &mut rstd);
    assert!(max_diff(&out, &naive(&x)) < 1e-5);
    let r = random(n * c, 51);
    let mut dx = vec![9.0; n * c];
    rmsnorm::backward(&r, &out, &rstd, c, &mut dx);
    check_gradient("dx", |x| weighted_sum(&naive(x), &r), &x, &dx, 0..n * c);
}

/// QK-norm and RoPE from their definitions, one head at a time: the queries and keys of each
/// head RMS-normalised (when `norm`), then element `i` and `i + hs/2` turned by
/// `pos · 10000^(-i / (hs/2))` (when `rope`).
fn naive_qk(qkv: &[f32], s: &rotary::Qk) -> Vec<f32> {
    let (w, hs) = (s.layout.width(), s.layout.head_size);
    let half = hs / 2;
    let mut out = qkv.to_vec();
    for (row, o) in out.chunks_mut(w).enumerate() {
        let pos = (cinder_kernels::start_of(&s.starts, row / s.seq) + row % s.seq) as f64;
        for head in o[..s.layout.v().start].chunks_mut(hs) {
            if let Some(eps) = s.norm_eps {
                let ms = head.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>() / hs as f64;
                let r = 1.0 / (ms + f64::from(eps)).sqrt();
                head.iter_mut()
                    .for_each(|a| *a = (f64::from(*a) * r) as f32);
            }
            if s.rope {
                for i in 0..half {
                    let angle = pos * 10000f64.powf(-(i as f64) / half as f64);
                    let (a, b) = (f64::from(head[i]), f64::from(head[i + half]));
                    head[i] = (a * angle.cos() - b * angle.sin()) as f32;
                    head[i + half] = (a * angle.sin() + b * angle.cos()) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn rotary_and_qk_norm_match_their_definitions_and_backward_finite_differences() {
    let (b, t) = (2, 5);
    // Both sequences from 0, or each from its own position (texts decoded together); keys of
    // their own per head, or shared.
    for (rope, norm_eps, starts, layout) in [
        (true, None, vec![], QkvLayout::new(2, 2, 4)),
        (false, Some(EPS), vec![], QkvLayout::new(2, 2, 4)),
        (true, Some(EPS), vec![3, 7], QkvLayout::new(2, 2, 4)),
        (true, Some(EPS), vec![3, 7], QkvLayout::new(4, 2, 4)),
    ] {
        let w = layout.width();
        let qkv = random(b * t * w, 60);
        let r = random(qkv.len(), 61);
        let s = rotary::Qk {
            layout,
            seq: t,
            starts: starts.clone(),
            rope,
            norm_eps,
        };
        let what = format!("rope {rope}, norm {norm_eps:?}, starts {starts:?}, {layout:?}");
        let (mut out, mut rstd) = (vec![0.0; qkv.len()], vec![0.0; b * t * s.heads()]);
        rotary::forward(&qkv, &s, &mut out, &mut rstd);
        assert!(max_diff(&out, &naive_qk(&qkv, &s)) < 1e-5, "{what}");
        // Values pass unchanged.
        for (o, x) in out.chunks(w).zip(qkv.chunks(w)) {
            assert_eq!(o[layout.v()], x[layout.v()], "{what}");
        }
        let mut dqkv = vec![9.0; qkv.len()];
        rotary::backward(&r, &out, &rstd, &s, &mut dqkv);
        let loss = |x: &[f32]| weighted_sum(&naive_qk(x, &s), &r);
        check_gradient(&what, loss, &qkv, &dqkv, 0..qkv.len());
    }
}

/// The backward pass (`apply` of `dy` without a residual) recomputes the forward's mask from
/// the same seed.
#[test]
fn dropout_backward_matches_finite_differences_under_the_same_mask() {
    // Past one rayon chunk (32 Ki elements): the second chunk's elements are numbered on.
    let n = 40_000;
    let mask = dropout::Mask {
        p: 0.3,
        seed: dropout::site_seed(7, &[3, 1]),
    };
    let (x, residual, r) = (random(n, 40), random(n, 41), random(n, 42)); // loss = sum(out * r)
    let loss = |x: &[f32], residual: Option<&[f32]>| {
        let mut out = vec![0.0; n];
        dropout::apply(x, residual, mask, &mut out);
        weighted_sum(&out, &r)
    };
    let backward = |mask| {
        let mut dx = vec![0.0; n];
        dropout::apply(&r, None, mask, &mut dx);
        dx
    };
    let dx = backward(mask);
    let dropped = dx.iter().filter(|&&g| g == 0.0).count();
    assert!(
        (n / 4..n * 7 / 20).contains(&dropped),
        "{dropped} of {n} dropped at p = 0.3"
    );
    // Another seed drops other elements.
    let other = backward(dropout::Mask {
        seed: mask.seed + 1,
        ..mask
    });
    assert!(dx.iter().zip(&other).filter(|(a, b)| a != b).count() > n / 4);

    // Without a residual the forward runs the backward's own code, so a mask the backward
    // gets wrong is caught by the forward with a residual.
    let at: Vec<usize> = (0..n).step_by(97).chain(32_760..32_780).collect();
    for res in [None, Some(&residual[..])] {
        check_gradient("dx", |x| loss(x, res), &x, &dx, at.iter().copied());
    }
    check_gradient("dresidual", |res| loss(&x, Some(res)), &residual, &r, at);
}

/// Muon's orthogonalisation as torch_recipe.py writes it, naively in f64, on one `[rows, cols]`
/// matrix: transposed when tall, normalised, five iterations, scaled by `sqrt(max(1, cols /
/// rows))` (Burn's `[in, out]` layout: `cols` is the fan-out).
fn naive_orthogonalise(u: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let (a, b, c) = (3.4445, -4.7750, 2.0315);
    let tall = rows > cols;
    let (m, n) = if tall { (cols, rows) } else { (rows, cols) };
    let mut x: Vec<f64> = (0..m * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            f64::from(if tall {
                u[j * cols + i]
            } else {
                u[i * cols + j]
            })
        })
        .collect();
    let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt() + 1e-7;
    x.iter_mut().for_each(|v| *v /= norm);
    let mul = |p: &[f64], q: &[f64], (r, k, s): (usize, usize, usize), qt: bool| {
        let mut out = vec![0.0; r * s];
        for i in 0..r {
            for j in 0..s {
                out[i * s + j] = (0..k)
                    .map(|t| p[i * k + t] * if qt { q[j * k + t] } else { q[t * s + j] })
                    .sum();
            }
        }
        out
    };
    for _ in 0..5 {
        let gram = mul(&x, &x, (m, n, m), true);
        let sq = mul(&gram, &gram, (m, m, m), false);
        let poly: Vec<f64> = gram.iter().zip(&sq).map(|(g, s)| b * g + c * s).collect();
        let px = mul(&poly, &x, (m, m, n), false);
        x = x.iter().zip(&px).map(|(v, p)| a * v + p).collect();
    }
    let scale = (cols as f64 / rows as f64).max(1.0).sqrt();
    (0..rows * cols)
        .map(|e| {
            let (i, j) = (e / cols, e % cols);
            scale * if tall { x[j * n + i] } else { x[i * n + j] }
        })
        .collect()
}

#[test]
fn muon_orthogonalisation_matches_its_definition_on_any_thread_count() {
    use cinder_kernels::muon::orthogonalise;
    // Wide, tall, square, q/k/v's three matrices side by side, and grouped-query attention's
    // narrower keys and values; sizes past a row share.
    let cases: [(usize, &[usize]); 6] = [
        (8, &[32]),
        (32, &[8]),
        (16, &[16]),
        (8, &[8, 8, 8]),
        (130, &[130, 130, 130]),
        (16, &[16, 4, 4]),
    ];
    for (rows, widths) in cases {
        let cols: usize = widths.iter().sum();
        let u = random(rows * cols, rows as u64 * 7 + cols as u64);
        let got = orthogonalise(&u, rows, widths);
        let mut first = 0;
        for (s, &width) in widths.iter().enumerate() {
            let part: Vec<f32> = (0..rows * width)
                .map(|e| u[(e / width) * cols + first + e % width])
                .collect();
            let expected = naive_orthogonalise(&part, rows, width);
            for (e, want) in expected.iter().enumerate() {
                let have = got[(e / width) * cols + first + e % width];
                let d = (f64::from(have) - want).abs();
                assert!(
                    d < 2e-4,
                    "{rows}x{cols} as {widths:?}: matrix {s}, element {e}: {have} vs {want}"
                );
            }
            first += width;
        }
        let on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| orthogonalise(&u, rows, widths))
        };
        assert!(
            on(1) == on(2) && on(1) == on(3),
            "{rows}x{cols}: thread counts differ"
        );
    }
}

#[test]
fn muon_orthogonalises_many_updates_at_once_as_one_at_a_time() {
    use cinder_kernels::muon::{orthogonalise, orthogonalise_all};
    // A block's updates in Burn's [in, out] layout: q/k/v as three matrices, the projection,
    // the MLP's up and down; then one past a row share.
    let updates: Vec<(usize, usize, Vec<usize>)> = vec![
        (16, 48, vec![16, 16, 16]),
        (16, 16, vec![]),
        (16, 64, vec![]),
        (64, 16, vec![]),
        (130, 20, vec![]),
    ];
    let u: Vec<Vec<f32>> = updates
        .iter()
        .enumerate()
        .map(|(i, (rows, cols, _))| random(rows * cols, 11 + i as u64))
        .collect();
    let alone: Vec<f32> = updates
        .iter()
        .zip(&u)
        .flat_map(|((rows, cols, widths), u)| {
            orthogonalise(u, *rows, &cinder_kernels::muon::matrices(widths, *cols))
        })
        .collect();
    let on = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| orthogonalise_all(&u.concat(), &updates))
    };
    for threads in [1, 2, 3] {
        assert!(
            on(threads) == alone,
            "{threads} threads differ from one at a time"
        );
    }
}
