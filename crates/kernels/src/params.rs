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
        self.for_each_mut(|v| v.fill(0.0));
    }

    /// Calls `f` on every parameter vector, in a fixed order.
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&mut Vec<f32>)) {
        f(&mut self.wte);
        f(&mut self.wpe);
        let norm = |n: &mut Norm, f: &mut dyn FnMut(&mut Vec<f32>)| {
            f(&mut n.gamma);
            if let Some(b) = &mut n.beta {
                f(b);
            }
        };
        let linear = |l: &mut Linear, f: &mut dyn FnMut(&mut Vec<f32>)| {
            f(&mut l.weight);
            if let Some(b) = &mut l.bias {
                f(b);
            }
        };
        for b in &mut self.blocks {
            norm(&mut b.ln_1, &mut f);
            linear(&mut b.c_attn, &mut f);
            linear(&mut b.attn_proj, &mut f);
            norm(&mut b.ln_2, &mut f);
            linear(&mut b.c_fc, &mut f);
            linear(&mut b.mlp_proj, &mut f);
        }
        norm(&mut self.ln_f, &mut f);
    }
}
