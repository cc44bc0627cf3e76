//! Each kernel against a plain, obviously correct implementation (loops over the definitions),
//! on small random inputs.

use cinder_kernels::attention::{self, Shape};
use cinder_kernels::layernorm::Norm;
use cinder_kernels::{gelu, layernorm};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Causal attention straight from its definition, for one sequence and one head at a time.
fn naive_attention(qkv: &[f32], s: Shape) -> Vec<f32> {
    let (t, c) = (s.seq, s.n_embd);
    let hs = c / s.n_head;
    let mut y = vec![0.0; s.batch * t * c];
    for b in 0..s.batch {
        for h in 0..s.n_head {
            let at =
                |i: usize, part: usize, d: usize| qkv[(b * t + i) * 3 * c + part * c + h * hs + d];
            for i in 0..t {
                let scores: Vec<f32> = (0..=i)
                    .map(|j| {
                        (0..hs).map(|d| at(i, 0, d) * at(j, 1, d)).sum::<f32>() / (hs as f32).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|x| (x - m).exp()).collect();
                let total: f32 = e.iter().sum();
                for d in 0..hs {
                    y[(b * t + i) * c + h * hs + d] =
                        (0..=i).map(|j| e[j] / total * at(j, 2, d)).sum();
                }
            }
        }
    }
    y
}

#[test]
fn attention_matches_its_definition_across_row_blocks() {
    // 150 positions: three blocks of queries, the last one partial.
    let s = Shape {
        batch: 2,
        seq: 150,
        n_head: 3,
        n_embd: 24,
    };
    let qkv = random(s.batch * s.seq * 3 * s.n_embd, 1);
    let mut att = vec![0.0; s.batch * s.n_head * s.seq * s.seq];
    let mut y = vec![0.0; s.batch * s.seq * s.n_embd];
    attention::forward(&qkv, s, None, &mut att, &mut y);
    let diff = max_diff(&y, &naive_attention(&qkv, s));
    assert!(diff < 1e-5, "max difference {diff}");
    // The weights: rows sum to 1, nothing above the diagonal.
    for row in 0..s.batch * s.n_head * s.seq {
        let i = row % s.seq;
        let w = &att[row * s.seq..(row + 1) * s.seq];
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert!(w[i + 1..].iter().all(|&x| x == 0.0));
    }
}

#[test]
fn attention_backward_matches_finite_differences() {
    let s = Shape {
        batch: 1,
        seq: 70,
        n_head: 2,
        n_embd: 8,
    };
    let qkv = random(s.seq * 3 * s.n_embd, 2);
    let r = random(s.seq * s.n_embd, 3); // loss = sum(y * r)
    let loss = |qkv: &[f32]| -> f64 {
        let y = naive_attention(qkv, s);
        y.iter().zip(&r).map(|(a, b)| f64::from(a * b)).sum()
    };
    let mut att = vec![0.0; s.n_head * s.seq * s.seq];
    let mut y = vec![0.0; s.seq * s.n_embd];
    attention::forward(&qkv, s, None, &mut att, &mut y);
    let mut dqkv = vec![0.0; qkv.len()];
    attention::backward(&r, &qkv, &att, s, None, &mut dqkv);
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for _ in 0..40 {
        let i = rng.random_range(0..qkv.len());
        let eps = 1e-2;
        let (mut up, mut down) = (qkv.clone(), qkv.clone());
        up[i] += eps;
        down[i] -= eps;
        let numeric = (loss(&up) - loss(&down)) / (2.0 * f64::from(eps));
        let analytic = f64::from(dqkv[i]);
        assert!(
            (numeric - analytic).abs() < 2e-3 * (1.0 + numeric.abs()),
            "element {i}: finite differences {numeric}, backward {analytic}"
        );
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
        eps: layernorm::EPS,
    };
    let naive = |x: &[f32]| -> Vec<f32> {
        x.chunks(c)
            .flat_map(|row| {
                let m = row.iter().sum::<f32>() / c as f32;
                let v = row.iter().map(|a| (a - m) * (a - m)).sum::<f32>() / c as f32;
                let rstd = 1.0 / (v + layernorm::EPS).sqrt();
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
    let loss = |x: &[f32]| -> f64 { naive(x).iter().zip(&r).map(|(a, b)| f64::from(a * b)).sum() };
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
    for i in (0..n * c).step_by(7) {
        let eps = 1e-2;
        let (mut up, mut down) = (x.clone(), x.clone());
        up[i] += eps;
        down[i] -= eps;
        let numeric = (loss(&up) - loss(&down)) / (2.0 * f64::from(eps));
        assert!(
            (numeric - f64::from(dx[i])).abs() < 2e-3 * (1.0 + numeric.abs()),
            "x[{i}]: finite differences {numeric}, backward {}",
            dx[i]
        );
    }
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
    let kinds: [(gelu::Kind, &dyn Fn(f64) -> f64); 2] =
        [(gelu::Kind::Erf, &exact), (gelu::Kind::Tanh, &tanh)];
    for (kind, f) in kinds {
        let mut derivative = x.clone();
        let mut out = vec![0.0; x.len()];
        gelu::forward_keep_derivative(kind, &mut derivative, None, &mut out);
        let want: Vec<f32> = x.iter().map(|&v| f(f64::from(v)) as f32).collect();
        assert!(max_diff(&out, &want) < 2e-6, "{kind:?}");
        // Inference gives the same values, in place, and a bias is added to each row.
        let bias = [0.5f32, -1.0, 0.25];
        let mut in_place = x.clone();
        gelu::forward_in_place(kind, &mut in_place, Some(&bias));
        for (i, (&v, &g)) in x.iter().zip(&in_place).enumerate() {
            let want = f(f64::from(v + bias[i % 3])) as f32;
            assert!((g - want).abs() < 2e-6, "{kind:?} at {v}: {g} vs {want}");
        }
        let mut d = vec![1.0; x.len()];
        gelu::backward_from_derivative(&derivative, &mut d);
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
        n_head: 2,
        n_embd: 4,
    };
    let (bt, c, t) = (s.batch * s.seq, s.n_embd, s.seq);
    let qkv = random(bt * 3 * c, 2);
    let mut att = vec![0.0; s.batch * s.n_head * t * t];
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
