//! The model's parameters as plain vectors, in Burn's layouts (a linear layer's weight is
//! `[d_in, d_out]`, `y = x W + b`). The same type holds their gradients.

/// The shape of a GPT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub vocab_size: usize,
    pub block_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    /// Whether linear layers and LayerNorms have biases.
    pub bias: bool,
}

impl Dims {
    pub fn head_size(&self) -> usize {
        self.n_embd / self.n_head
    }
}

/// A linear layer: `weight` is `[d_in, d_out]`, `bias` `[d_out]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub d_in: usize,
    pub d_out: usize,
}

impl Linear {
    fn zeros(d_in: usize, d_out: usize, bias: bool) -> Self {
        Self {
            weight: vec![0.0; d_in * d_out],
            bias: bias.then(|| vec![0.0; d_out]),
            d_in,
            d_out,
        }
    }
}

/// A LayerNorm's gain and shift, `[C]` each (epsilon 1e-5, Burn's default).
#[derive(Debug, Clone, PartialEq)]
pub struct Norm {
    pub gamma: Vec<f32>,
    pub beta: Option<Vec<f32>>,
}

impl Norm {
    fn zeros(c: usize, bias: bool) -> Self {
        Self {
            gamma: vec![0.0; c],
            beta: bias.then(|| vec![0.0; c]),
        }
    }
}

/// One transformer block's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockParams {
    pub ln_1: Norm,
    /// `C -> 3C`: queries, keys, values.
    pub c_attn: Linear,
    /// `C -> C`.
    pub attn_proj: Linear,
    pub ln_2: Norm,
    /// `C -> 4C`.
    pub c_fc: Linear,
    /// `4C -> C`.
    pub mlp_proj: Linear,
}

/// All parameters of the GPT (or all their gradients).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub dims: Dims,
    /// `[vocab_size, C]`, also the output head.
    pub wte: Vec<f32>,
    /// `[block_size, C]`.
    pub wpe: Vec<f32>,
    pub blocks: Vec<BlockParams>,
    pub ln_f: Norm,
}

impl Params {
    /// Every parameter zero: the starting point of gradients.
    pub fn zeros(dims: Dims) -> Self {
        let c = dims.n_embd;
        let b = dims.bias;
        Self {
            dims,
            wte: vec![0.0; dims.vocab_size * c],
            wpe: vec![0.0; dims.block_size * c],
            blocks: (0..dims.n_layer)
                .map(|_| BlockParams {
                    ln_1: Norm::zeros(c, b),
                    c_attn: Linear::zeros(c, 3 * c, b),
                    attn_proj: Linear::zeros(c, c, b),
                    ln_2: Norm::zeros(c, b),
                    c_fc: Linear::zeros(c, 4 * c, b),
                    mlp_proj: Linear::zeros(4 * c, c, b),
                })
                .collect(),
            ln_f: Norm::zeros(c, b),
        }
    }

    /// Sets every value to zero, keeping the allocations.
    pub fn fill_zero(&mut self) {
        for v in self.vectors_mut() {
            v.fill(0.0);
        }
    }

    /// `self += other`, parameter by parameter.
    pub fn add_assign(&mut self, other: &Params) {
        use rayon::prelude::*;
        const CHUNK: usize = 32 * 1024;
        for (a, b) in self.vectors_mut().into_iter().zip(other.vectors()) {
            a.par_chunks_mut(CHUNK)
                .zip(b.par_chunks(CHUNK))
                .for_each(|(a, b)| crate::simd::add_assign(a, b));
        }
    }

    /// Every parameter vector, in a fixed order.
    pub fn vectors(&self) -> Vec<&Vec<f32>> {
        self.tagged().into_iter().map(|(v, _)| v).collect()
    }

    /// For each vector of [`Params::vectors`]: whether it is a matrix (embeddings and linear
    /// weights: weight decay applies) rather than a bias or a LayerNorm parameter.
    pub fn is_matrix(&self) -> Vec<bool> {
        self.tagged().into_iter().map(|(_, m)| m).collect()
    }

    /// Every parameter vector with whether it is a matrix.
    fn tagged(&self) -> Vec<(&Vec<f32>, bool)> {
        let mut out = vec![(&self.wte, true), (&self.wpe, true)];
        fn norm(n: &Norm) -> impl Iterator<Item = (&Vec<f32>, bool)> {
            std::iter::once((&n.gamma, false)).chain(n.beta.as_ref().map(|b| (b, false)))
        }
        fn linear(l: &Linear) -> impl Iterator<Item = (&Vec<f32>, bool)> {
            std::iter::once((&l.weight, true)).chain(l.bias.as_ref().map(|b| (b, false)))
        }
        for b in &self.blocks {
            out.extend(norm(&b.ln_1));
            out.extend(linear(&b.c_attn));
            out.extend(linear(&b.attn_proj));
            out.extend(norm(&b.ln_2));
            out.extend(linear(&b.c_fc));
            out.extend(linear(&b.mlp_proj));
        }
        out.extend(norm(&self.ln_f));
        out
    }

    /// Every parameter vector, mutably, in the order of [`Params::vectors`].
    pub fn vectors_mut(&mut self) -> Vec<&mut Vec<f32>> {
        let mut out = vec![&mut self.wte, &mut self.wpe];
        fn norm(n: &mut Norm) -> impl Iterator<Item = &mut Vec<f32>> {
            std::iter::once(&mut n.gamma).chain(n.beta.as_mut())
        }
        fn linear(l: &mut Linear) -> impl Iterator<Item = &mut Vec<f32>> {
            std::iter::once(&mut l.weight).chain(l.bias.as_mut())
        }
        for b in &mut self.blocks {
            out.extend(norm(&mut b.ln_1));
            out.extend(linear(&mut b.c_attn));
            out.extend(linear(&mut b.attn_proj));
            out.extend(norm(&mut b.ln_2));
            out.extend(linear(&mut b.c_fc));
            out.extend(linear(&mut b.mlp_proj));
        }
        out.extend(norm(&mut self.ln_f));
        out
    }
}
