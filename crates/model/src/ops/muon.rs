//! Muon's update of one weight matrix as a Burn [`Optimizer`] (Keller Jordan's Muon, as
//! `../shared/bench/torch_recipe.py` and KellerJordan/Muon's `muon.py` write it): Nesterov
//! momentum, then the update orthogonalised by five Newton-Schulz iterations, scaled by the
//! matrix's shape, after decoupled weight decay. The orthogonalisation is all matrix products:
//! fused on Flex (the kernels' matmul), Burn's tensor operations elsewhere.
//!
//! With `beta2 > 0` it is NorMuon (Li et al. 2025, arXiv 2510.05491, as the modded-nanogpt
//! speedrun's `train_gpt.py` writes it): each orthogonalised matrix's neurons normalised by a
//! running mean of their squared updates, the matrix's norm kept ([`normalised`]).
//!
//! Burn's own `burn::optim::Muon` is not used: it scales by `[in, out]`'s `in / out` (Burn
//! stores a linear layer's weight `[in, out]`, PyTorch `[out, in]`, so the MLP's up- and
//! down-projections would swap their factors), and it cannot treat attention's fused q/k/v
//! weight as three matrices.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use burn::optim::{LearningRate, Optimizer, RecordState, StateSink, StateSource};
use burn::prelude::*;

use cinder_kernels::muon::{self, COEFFICIENTS, EPSILON, STEPS};

#[cfg(feature = "flex")]
use super::fused;
use super::{fused_or, has_fused};

/// Muon's update of one weight matrix `[in, out]` (Burn's layout), seen as matrices of `widths`
/// columns side by side along `out` (attention's q/k/v weight: its queries, keys and values,
/// [`cinder_kernels::QkvLayout::widths`]; none, else: one matrix).
#[derive(Clone)]
pub struct TensorMuon {
    /// β of the momentum buffer.
    pub momentum: f32,
    /// Decoupled weight decay, multiplied by the learning rate.
    pub weight_decay: f32,
    /// This group's learning rate over the one the step is given (the run's base rate): the
    /// schedule applies to both alike.
    pub lr_scale: f64,
    /// The widths of the matrices side by side along the columns (none: one matrix).
    pub widths: Vec<usize>,
    /// The factor the gradients of the current step are multiplied by, as f32 bits (global
    /// clipping, shared with the run's other parameter groups).
    pub grad_scale: Arc<AtomicU32>,
    /// NorMuon's β₂, the decay of the running mean of each neuron's squared update; 0: Muon.
    pub beta2: f32,
    /// The step's matrices orthogonalised together, shared by a run's Muon groups.
    pub batch: Arc<Mutex<MuonBatch>>,
}

/// Muon's matrices orthogonalised together. Burn's optimizer updates a model's parameters one
/// at a time, and one matrix's orthogonalisation is too small to keep the threads busy (they
/// spend much of it handing its products over: BENCHMARKS.md, section 26). So a run's step
/// passes over Muon's matrices twice:
/// 1. [`MuonBatch::collect`]: each matrix's step queues its momentum and its update, and leaves
///    the weight and its state as they are;
/// 2. [`MuonBatch::orthogonalise`] orthogonalises the queued updates all at once (on Flex, one
///    to a thread), the same bits as one at a time;
/// 3. the step proper: each matrix takes its own from the queue, in the order they were queued
///    (Burn visits a model's parameters in one order).
///
/// A step with nothing queued orthogonalises its matrix itself.
#[derive(Default)]
pub struct MuonBatch {
    collecting: bool,
    queued: VecDeque<Queued>,
}

/// A matrix's momentum buffer and update, queued by [`MuonBatch::collect`].
struct Queued {
    momentum: Tensor<2>,
    update: Tensor<2>,
    widths: Vec<usize>,
}

impl MuonBatch {
    /// A new batch to share between a run's Muon groups.
    pub fn shared() -> Arc<Mutex<MuonBatch>> {
        Arc::new(Mutex::new(MuonBatch::default()))
    }

    /// From now until [`MuonBatch::orthogonalise`], steps queue their matrices.
    pub fn collect(&mut self) {
        assert!(self.queued.is_empty(), "a Muon step left matrices queued");
        self.collecting = true;
    }

    /// The queued updates orthogonalised, all at once, for the step proper to take. Returns
    /// how many there are.
    pub fn orthogonalise(&mut self) -> usize {
        self.collecting = false;
        let queued = std::mem::take(&mut self.queued);
        let updates = queued
            .iter()
            .map(|q| (q.update.clone(), q.widths.clone()))
            .collect();
        self.queued = queued
            .into_iter()
            .zip(orthogonalised_all(updates))
            .map(|(q, update)| Queued { update, ..q })
            .collect();
        self.queued.len()
    }
}

/// Muon's state for one matrix: the momentum buffer, shaped as the weight, and with NorMuon the
/// running mean of each neuron's squared update ([`normalised`]'s layout).
#[derive(Clone)]
pub struct MuonState<const D: usize> {
    pub momentum: Tensor<D>,
    pub second: Option<Tensor<1>>,
}

impl<const D: usize> RecordState for MuonState<D> {
    fn state_flatten(&self, prefix: &str, out: &mut StateSink) {
        out.push_tensor(prefix, "momentum", self.momentum.to_data());
        if let Some(second) = &self.second {
            out.push_tensor(prefix, "second", second.to_data());
        }
    }

    fn state_unflatten(prefix: &str, src: &mut StateSource, device: &Device) -> Option<Self> {
        let data = src.take_tensor(prefix, "momentum")?;
        let second = src
            .take_tensor(prefix, "second")
            .map(|d| Tensor::from_data(d, device));
        Some(Self {
            momentum: Tensor::from_data(data, device),
            second,
        })
    }
}

impl Optimizer for TensorMuon {
    type State<const D: usize> = MuonState<D>;

    /// # Shapes
    /// - tensor, grad: `[in, out]`, `out` the sum of `widths`
    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<MuonState<D>>,
    ) -> (Tensor<D>, Option<MuonState<D>>) {
        assert_eq!(D, 2, "Muon updates matrices only");
        let shape = tensor.shape();
        let matrix = [shape[0], shape[1]];
        let mut batch = self.batch.lock().expect("Muon's batch is not poisoned");
        // The momentum and the update of this step: queued (when collecting, or collected).
        let collecting = batch.collecting;
        let queued = if collecting {
            None
        } else {
            batch.queued.pop_front()
        };
        drop(batch);
        let (momentum, update) = match queued {
            Some(q) => {
                assert!(
                    q.update.dims() == matrix && q.widths == self.widths,
                    "Muon's queue is out of order"
                );
                (q.momentum.reshape(shape.clone()), q.update)
            }
            None => {
                let scale = f32::from_bits(self.grad_scale.load(Ordering::Relaxed));
                let grad = if scale == 1.0 { grad } else { grad * scale };
                let beta = self.momentum;
                // buf = β·buf + (1-β)·g; u = g + β·(buf - g) (Nesterov).
                let momentum = match state.as_ref() {
                    Some(s) => s.momentum.clone() * beta + grad.clone() * (1.0 - beta),
                    None => grad.clone() * (1.0 - beta),
                };
                let u = (grad.clone() + (momentum.clone() - grad) * beta).reshape(matrix);
                if collecting {
                    let mut batch = self.batch.lock().expect("Muon's batch is not poisoned");
                    batch.queued.push_back(Queued {
                        momentum: momentum.reshape(matrix),
                        update: u,
                        widths: self.widths.clone(),
                    });
                    return (tensor, state);
                }
                (momentum, orthogonalised(u, &self.widths))
            }
        };
        let second = state.and_then(|s| s.second);
        let lr = lr * self.lr_scale;
        let (update, second) = if self.beta2 > 0.0 {
            let (update, second) = normalised(update, &self.widths, second, self.beta2);
            (update, Some(second))
        } else {
            (update, None)
        };
        let decayed = if self.weight_decay > 0.0 {
            tensor * (1.0 - lr * self.weight_decay as f64)
        } else {
            tensor
        };
        let state = MuonState { momentum, second };
        (decayed - update.reshape(shape) * lr, Some(state))
    }

    fn to_device<const D: usize>(state: MuonState<D>, device: &Device) -> MuonState<D> {
        MuonState {
            momentum: state.momentum.to_device(device),
            second: state.second.map(|s| s.to_device(device)),
        }
    }
}

/// NorMuon's step after the orthogonalisation ([`cinder_kernels::muon::normalise`], whose
/// reference [`composite_normalised`] is): one fused pass on Flex, Burn's tensor operations
/// elsewhere.
///
/// # Shapes
/// - update: `[in, out]`, `out` the sum of `widths`; output: the same
/// - second: `[neurons(in, widths)]` (none: zero)
pub fn normalised(
    update: Tensor<2>,
    widths: &[usize],
    second: Option<Tensor<1>>,
    beta2: f32,
) -> (Tensor<2>, Tensor<1>) {
    fused_or!(has_fused(&update.device()),
        fused => {
            let [fan_in, out] = update.dims();
            let widths = muon::matrices(widths, out);
            let device = update.device();
            let second = second
                .unwrap_or_else(|| Tensor::zeros([muon::neurons(fan_in, &widths)], &device));
            fused::normalise(update, second, &widths, beta2)
        },
        composite => composite_normalised(update, widths, second, beta2),
    )
}

/// NorMuon's step after the orthogonalisation, in Burn's tensor operations: each matrix of `update` (of `widths` columns side
/// by side; none: one) has its neurons' mean squared updates folded into `second`
/// (`second ← β₂·second + (1-β₂)·mean`, zero at first), each neuron divided by the square root
/// of its running mean, and the matrix scaled back to its norm before. A neuron is a row of
/// PyTorch's `[out, in]` weight (a column here) when it has at least as many outputs as inputs,
/// else a column (a row here): the mean runs along the shorter side, as the speedrun's does.
///
/// # Shapes
/// - update: `[in, out]`, `out` the sum of `widths`; output: the same
/// - second: the matrices' running means one after another, `[1, width]` or `[in, 1]` each,
///   flattened (none: zero)
pub fn composite_normalised(
    update: Tensor<2>,
    widths: &[usize],
    second: Option<Tensor<1>>,
    beta2: f32,
) -> (Tensor<2>, Tensor<1>) {
    let [fan_in, out] = update.dims();
    let (mut first, mut at) = (0, 0);
    let widths = muon::matrices(widths, out);
    let mut parts = Vec::with_capacity(widths.len());
    let mut means = Vec::with_capacity(widths.len());
    for &fan_out in &widths {
        let part = update.clone().narrow(1, first, fan_out);
        let squares = part.clone().square();
        let mean = if fan_out >= fan_in {
            squares.mean_dim(0) // [1, fan_out]
        } else {
            squares.mean_dim(1) // [fan_in, 1]
        };
        let shape = mean.shape();
        let n = shape.num_elements();
        let mean = match &second {
            Some(s) => {
                let before = s.clone().narrow(0, at, n).reshape(shape);
                before.clone() * beta2 + mean * (1.0 - beta2)
            }
            None => mean * (1.0 - beta2),
        };
        let v = part.clone() / mean.clone().clamp_min(muon::NORMUON_FLOOR).sqrt();
        let norm = |t: Tensor<2>| t.square().sum().sqrt();
        let scale = norm(part) / norm(v.clone()).clamp_min(muon::NORMUON_FLOOR);
        parts.push(v * scale.unsqueeze::<2>());
        means.push(mean.reshape([n]));
        first += fan_out;
        at += n;
    }
    (Tensor::cat(parts, 1), Tensor::cat(means, 0))
}

/// Each matrix of `u` (of `widths` columns side by side; none: one) replaced by its nearest
/// semi-orthogonal matrix (as Newton-Schulz approximates it) times
/// `sqrt(max(1, fan_out / fan_in))`: one fused pass on Flex (`cinder_kernels::muon`), Burn's
/// tensor operations elsewhere.
///
/// # Shapes
/// - u: `[in, out]`; output: the same
pub fn orthogonalised(u: Tensor<2>, widths: &[usize]) -> Tensor<2> {
    fused_or!(has_fused(&u.device()),
        fused => fused::orthogonalise(u, widths),
        composite => composite_orthogonalised(u, widths),
    )
}

/// [`orthogonalised`] of several updates at once (each with its widths): on Flex in parallel, one
/// to a thread ([`MuonBatch`]), else one after another.
pub fn orthogonalised_all(updates: Vec<(Tensor<2>, Vec<usize>)>) -> Vec<Tensor<2>> {
    let Some((first, _)) = updates.first() else {
        return Vec::new();
    };
    fused_or!(has_fused(&first.device()),
        fused => fused::orthogonalise_all(updates),
        composite => updates
            .into_iter()
            .map(|(u, widths)| composite_orthogonalised(u, &widths))
            .collect(),
    )
}

/// [`orthogonalised`] in Burn's tensor operations: the reference, and every other backend's.
pub fn composite_orthogonalised(u: Tensor<2>, widths: &[usize]) -> Tensor<2> {
    let [fan_in, out] = u.dims();
    let mut first = 0;
    let parts = muon::matrices(widths, out)
        .into_iter()
        .map(|fan_out| {
            let scale = (fan_out as f64 / fan_in as f64).max(1.0).sqrt();
            let part = newton_schulz(u.clone().narrow(1, first, fan_out)) * scale;
            first += fan_out;
            part
        })
        .collect();
    Tensor::cat(parts, 1)
}

/// The quintic Newton-Schulz iteration towards `UVᵀ` of `g = USVᵀ`, on the orientation with no
/// more rows than columns (the transpose of a matrix's result is its transpose's).
///
/// # Shapes
/// - g: `[m, n]`; output: the same
pub fn newton_schulz(g: Tensor<2>) -> Tensor<2> {
    let [m, n] = g.dims();
    let tall = m > n;
    let x = if tall { g.transpose() } else { g };
    let norm = x.clone().square().sum().sqrt() + EPSILON;
    let mut x = x / norm.unsqueeze::<2>();
    let (a, b, c) = COEFFICIENTS;
    for _ in 0..STEPS {
        let gram = x.clone().matmul(x.clone().transpose());
        let poly = gram.clone() * b + gram.clone().matmul(gram) * c;
        x = x.clone() * a + poly.matmul(x);
    }
    if tall { x.transpose() } else { x }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use cinder_testing::max_diff;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// A row-major matrix in f64, for the naive reference.
    #[derive(Clone, Debug)]
    struct M {
        rows: usize,
        cols: usize,
        v: Vec<f64>,
    }

    impl M {
        fn at(&self, r: usize, c: usize) -> f64 {
            self.v[r * self.cols + c]
        }
        fn t(&self) -> M {
            let v = (0..self.cols * self.rows)
                .map(|i| self.at(i % self.rows, i / self.rows))
                .collect();
            M {
                rows: self.cols,
                cols: self.rows,
                v,
            }
        }
        fn mul(&self, o: &M) -> M {
            let mut v = vec![0.0; self.rows * o.cols];
            for r in 0..self.rows {
                for c in 0..o.cols {
                    v[r * o.cols + c] = (0..self.cols).map(|k| self.at(r, k) * o.at(k, c)).sum();
                }
            }
            M {
                rows: self.rows,
                cols: o.cols,
                v,
            }
        }
        fn lin(&self, a: f64, o: &M, b: f64) -> M {
            let v = self
                .v
                .iter()
                .zip(&o.v)
                .map(|(x, y)| a * x + b * y)
                .collect();
            M { v, ..*self }
        }
    }

    /// torch_recipe.py's `ns5`, on PyTorch's `[out, in]` layout.
    fn ns5(g: &M) -> M {
        let (a, b, c) = (3.4445, -4.7750, 2.0315);
        let tall = g.rows > g.cols;
        let x = if tall { g.t() } else { g.clone() };
        let norm = x.v.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut x = x.lin(1.0 / (norm + 1e-7), &x, 0.0);
        for _ in 0..5 {
            let gram = x.mul(&x.t());
            let poly = gram.lin(b, &gram.mul(&gram), c);
            x = x.lin(a, &poly.mul(&x), 1.0);
        }
        if tall { x.t() } else { x }
    }

    /// torch_recipe.py's update of an `[out, in]` matrix: q/k/v stacked along `out` as
    /// matrices of `parts` rows (none: one), each scaled by `sqrt(max(1, rows / cols))`.
    fn reference_update(g: &M, parts: &[usize]) -> M {
        let parts = &muon::matrices(parts, g.rows)[..];
        let (mut v, mut first) = (Vec::new(), 0);
        for &rows in parts {
            let part = M {
                rows,
                cols: g.cols,
                v: g.v[first * g.cols..(first + rows) * g.cols].to_vec(),
            };
            let scale = (rows as f64 / g.cols as f64).max(1.0).sqrt();
            v.extend(ns5(&part).v.iter().map(|x| x * scale));
            first += rows;
        }
        M { v, ..*g }
    }

    fn random(rows: usize, cols: usize, seed: u64) -> M {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let v = (0..rows * cols)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        M { rows, cols, v }
    }

    fn tensor(m: &M) -> Tensor<2> {
        let v: Vec<f32> = m.v.iter().map(|&x| x as f32).collect();
        Tensor::from_data(TensorData::new(v, [m.rows, m.cols]), &Device::flex())
    }

    fn values(t: Tensor<2>) -> Vec<f64> {
        let v = t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        v.into_iter().map(f64::from).collect()
    }

    #[test]
    fn the_update_follows_the_pytorch_recipe_in_burns_layout() {
        // Burn's [in, out] weights: attention's q/k/v [C, 3C] (and with half as many key/value
        // heads [C, 2C]), the MLP's up- [C, 4C] and down-projection [4C, C], a square one;
        // PyTorch's are their transposes.
        let c = 8;
        let cases: [((usize, usize), &[usize], u64); 5] = [
            ((c, 3 * c), &[c, c, c], 1),
            ((c, 2 * c), &[c, c / 2, c / 2], 6),
            ((c, 4 * c), &[], 2),
            ((4 * c, c), &[], 3),
            ((c, c), &[], 4),
        ];
        for (shape, widths, seed) in cases {
            let burn = random(shape.0, shape.1, seed);
            let expected = reference_update(&burn.t(), widths).t();
            for (path, got) in [
                ("fused", orthogonalised(tensor(&burn), widths)),
                ("composite", composite_orthogonalised(tensor(&burn), widths)),
            ] {
                let d = max_diff(&values(got), &expected.v);
                assert!(
                    d < 1e-4,
                    "{path}, {shape:?}: differs from the reference by {d}"
                );
            }
        }
        // The up-projection's update is twice the down-projection's in scale (2 = sqrt(4C / C)).
        let rms = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
        let up = values(orthogonalised(tensor(&random(c, 4 * c, 5)), &[]));
        let down = values(orthogonalised(tensor(&random(4 * c, c, 5)), &[]));
        let ratio = rms(&up) / rms(&down);
        assert!((ratio - 2.0).abs() < 0.2, "up / down: {ratio}");
    }

    #[test]
    fn a_step_is_momentum_then_decay_then_the_scaled_update() {
        let (beta, wd, lr, lr_scale) = (0.9f64, 0.1f64, 0.5f64, 0.04f64);
        let muon = TensorMuon {
            momentum: beta as f32,
            weight_decay: wd as f32,
            lr_scale,
            widths: vec![4, 4, 4],
            grad_scale: Arc::new(AtomicU32::new(0.5f32.to_bits())),
            beta2: 0.0,
            batch: MuonBatch::shared(),
        };
        let (c, out) = (4, 12);
        let mut p = random(c, out, 10);
        let mut tensor_p = tensor(&p);
        let mut state = None;
        let mut buf = M {
            v: vec![0.0; c * out],
            ..p.clone()
        };
        // A clipping factor that changes between steps: a lost factor would weigh the
        // momentum's terms wrongly (a constant one cancels in the normalisation).
        for (step, clip) in [(0, 0.5f32), (1, 1.0), (2, 0.25)] {
            muon.grad_scale.store(clip.to_bits(), Ordering::Relaxed);
            let g = random(c, out, 20 + step);
            let (next, s) = muon.step(lr, tensor_p, tensor(&g), state);
            (tensor_p, state) = (next, s);
            // The reference: clipped gradient, lerp momentum, Nesterov, then torch_recipe's
            // update on the PyTorch layout.
            let g = g.lin(f64::from(clip), &g, 0.0);
            buf = buf.lin(beta, &g, 1.0 - beta);
            let u = g.lin(1.0 - beta, &buf, beta);
            let update = reference_update(&u.t(), &[4, 4, 4]).t();
            let eff = lr * lr_scale;
            p = p.lin(1.0 - eff * wd, &update, -eff);
            let d = max_diff(&values(tensor_p.clone()), &p.v);
            assert!(d < 1e-5, "step {step}: weights differ by {d}");
        }
    }

    #[test]
    fn matrices_collected_and_orthogonalised_together_step_as_one_at_a_time() {
        // Two groups (q/k/v's three matrices, and one tall matrix) sharing a batch, against the
        // same groups stepping alone, over three steps of Muon and of NorMuon: the same bits.
        for beta2 in [0.0, 0.95] {
            collected_steps_as_alone(beta2);
        }
    }

    fn collected_steps_as_alone(beta2: f32) {
        let group = |widths: Vec<usize>, batch: &Arc<Mutex<MuonBatch>>| TensorMuon {
            momentum: 0.9,
            weight_decay: 0.1,
            lr_scale: 1.0,
            widths,
            grad_scale: Arc::new(AtomicU32::new(1.0f32.to_bits())),
            beta2,
            batch: batch.clone(),
        };
        let (together, alone) = (MuonBatch::shared(), MuonBatch::shared());
        let shapes = [(8, 24, vec![8, 8, 8]), (32, 8, vec![])];
        let start: Vec<Tensor<2>> = shapes
            .iter()
            .enumerate()
            .map(|(i, (rows, cols, _))| tensor(&random(*rows, *cols, 30 + i as u64)))
            .collect();
        // Each copy: its weights and states, matrix by matrix.
        let (mut ours, mut theirs) = ((start.clone(), vec![None, None]), (start, vec![None, None]));
        // Every matrix of a copy stepped once, its group sharing `batch`.
        let step_each = |copy: &mut (Vec<Tensor<2>>, Vec<Option<MuonState<2>>>),
                         batch: &Arc<Mutex<MuonBatch>>,
                         grads: &[Tensor<2>]| {
            for (i, (_, _, widths)) in shapes.iter().enumerate() {
                let (w, s) = group(widths.clone(), batch).step(
                    0.02,
                    copy.0[i].clone(),
                    grads[i].clone(),
                    copy.1[i].take(),
                );
                (copy.0[i], copy.1[i]) = (w, s);
            }
        };
        for step in 0..3u64 {
            let grads: Vec<Tensor<2>> = shapes
                .iter()
                .enumerate()
                .map(|(i, (rows, cols, _))| tensor(&random(*rows, *cols, 40 + 2 * step + i as u64)))
                .collect();
            step_each(&mut theirs, &alone, &grads);
            // Collected (the weights left as they are), orthogonalised together, then stepped.
            let before: Vec<Vec<f64>> = ours.0.iter().map(|w| values(w.clone())).collect();
            together.lock().unwrap().collect();
            step_each(&mut ours, &together, &grads);
            let after: Vec<Vec<f64>> = ours.0.iter().map(|w| values(w.clone())).collect();
            assert_eq!(before, after, "collecting moved a weight");
            assert_eq!(together.lock().unwrap().orthogonalise(), 2);
            step_each(&mut ours, &together, &grads);
            for i in 0..2 {
                assert_eq!(
                    values(ours.0[i].clone()),
                    values(theirs.0[i].clone()),
                    "β₂ {beta2}, step {step}, matrix {i}"
                );
                let [a, b] = [&ours, &theirs].map(|c| c.1[i].clone().unwrap());
                assert_eq!(
                    values(a.momentum),
                    values(b.momentum),
                    "step {step}, matrix {i}"
                );
            }
        }
    }

    /// NorMuon's normalisation of an update in Burn's `[in, out]` layout, by loops: per matrix
    /// of `widths` columns, the running mean of each neuron's squares (per column when the
    /// matrix has at least as many columns as rows, else per row), each entry divided by its
    /// neuron's root, the matrix's norm restored. `second` holds the running means in order.
    fn reference_normuon(u: &M, widths: &[usize], second: &mut Vec<f64>, beta2: f64) -> M {
        let mut out = u.clone();
        let (mut first, mut at) = (0, 0);
        for &w in widths {
            let by_column = w >= u.rows;
            let n = if by_column { w } else { u.rows };
            if second.len() < at + n {
                second.resize(at + n, 0.0);
            }
            for k in 0..n {
                let cells: Vec<f64> = if by_column {
                    (0..u.rows).map(|i| u.at(i, first + k)).collect()
                } else {
                    (first..first + w).map(|j| u.at(k, j)).collect()
                };
                let mean = cells.iter().map(|x| x * x).sum::<f64>() / cells.len() as f64;
                second[at + k] = beta2 * second[at + k] + (1.0 - beta2) * mean;
            }
            let root = |i: usize, j: usize| {
                let k = if by_column { j - first } else { i };
                second[at + k].max(1e-10).sqrt()
            };
            let (mut before, mut after) = (0.0, 0.0);
            for i in 0..u.rows {
                for j in first..first + w {
                    let v = u.at(i, j) / root(i, j);
                    before += u.at(i, j) * u.at(i, j);
                    after += v * v;
                    out.v[i * u.cols + j] = v;
                }
            }
            let scale = before.sqrt() / after.sqrt().max(1e-10);
            for i in 0..u.rows {
                for j in first..first + w {
                    out.v[i * u.cols + j] *= scale;
                }
            }
            first += w;
            at += n;
        }
        out
    }

    #[test]
    fn a_normuon_step_normalises_each_neuron_by_its_running_mean() {
        let (beta, beta2, wd, lr) = (0.9f64, 0.9f64, 0.1f64, 0.02f64);
        // Grouped-query attention's q/k/v: a square query matrix (a mean per column) and key
        // and value matrices narrower than tall (a mean per row).
        let (c, widths) = (8, vec![8, 4, 4]);
        let out: usize = widths.iter().sum();
        let muon = TensorMuon {
            momentum: beta as f32,
            weight_decay: wd as f32,
            lr_scale: 1.0,
            widths: widths.clone(),
            grad_scale: Arc::new(AtomicU32::new(1.0f32.to_bits())),
            beta2: beta2 as f32,
            batch: MuonBatch::shared(),
        };
        let mut p = random(c, out, 11);
        let mut tensor_p = tensor(&p);
        let mut state = None;
        let mut buf = M {
            v: vec![0.0; c * out],
            ..p.clone()
        };
        let mut second = Vec::new();
        for step in 0..3 {
            let g = random(c, out, 30 + step);
            let (next, s) = muon.step(lr, tensor_p, tensor(&g), state);
            (tensor_p, state) = (next, s);
            buf = buf.lin(beta, &g, 1.0 - beta);
            let u = g.lin(1.0 - beta, &buf, beta);
            let update = reference_update(&u.t(), &widths).t();
            let update = reference_normuon(&update, &widths, &mut second, beta2);
            p = p.lin(1.0 - lr * wd, &update, -lr);
            let d = max_diff(&values(tensor_p.clone()), &p.v);
            assert!(d < 1e-5, "step {step}: weights differ by {d}");
        }
        // The state keeps the running means, one per neuron: 8 columns, then 8 rows twice.
        let kept = state
            .unwrap()
            .second
            .expect("NorMuon keeps its running means");
        let kept: Vec<f64> = kept
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect();
        assert_eq!(kept.len(), 8 + 8 + 8);
        assert!(max_diff(&kept, &second) < 1e-6);
    }

    #[test]
    fn normuon_fused_and_composite_agree_with_the_reference() {
        let c = 8;
        let cases: [(usize, &[usize], u64); 3] = [
            (3 * c, &[c, c, c], 40),
            (2 * c, &[c, c / 2, c / 2], 41),
            (c, &[], 42),
        ];
        for (out, widths, seed) in cases {
            let u = random(c, out, seed);
            let parts = &muon::matrices(widths, out)[..];
            // A running mean from an earlier step (positive), then this step's.
            let before: Vec<f64> = random(1, muon::neurons(c, parts), seed + 9)
                .v
                .iter()
                .map(|x| x.abs() / 8.0)
                .collect();
            let mut second = before.clone();
            let expected = reference_normuon(&u, parts, &mut second, 0.9);
            let earlier = || {
                let v: Vec<f32> = before.iter().map(|&x| x as f32).collect();
                Some(Tensor::from_data(
                    TensorData::new(v, [before.len()]),
                    &Device::flex(),
                ))
            };
            for (path, (got, means)) in [
                ("fused", normalised(tensor(&u), widths, earlier(), 0.9)),
                (
                    "composite",
                    composite_normalised(tensor(&u), widths, earlier(), 0.9),
                ),
            ] {
                let d = max_diff(&values(got), &expected.v);
                assert!(d < 1e-5, "{path}, {widths:?}: update differs by {d}");
                let means: Vec<f64> = means
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(f64::from)
                    .collect();
                let d = max_diff(&means, &second);
                assert!(d < 1e-6, "{path}, {widths:?}: running means differ by {d}");
            }
        }
    }
}
