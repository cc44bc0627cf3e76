//! The whole GPT, forward and backward, over a [`Tape`] of the activations the backward pass
//! needs. Same computation as `cinder-model`'s Burn modules (without dropout).

use crate::attention::{self, Shape};
use crate::params::{BlockParams, Dims, Params};
use crate::simd::add_assign;
use crate::{gelu, layernorm, linear, loss};

/// One block's saved activations, for N = B*T rows.
struct BlockTape {
    /// `[N, C]`: the block's input (the residual stream).
    x: Vec<f32>,
    ln_1: Vec<f32>,
    ln_1_mean: Vec<f32>,
    ln_1_rstd: Vec<f32>,
    /// `[N, 3C]`
    qkv: Vec<f32>,
    /// `[B, H, T, T]`
    att: Vec<f32>,
    /// `[N, C]`: heads side by side, before the projection.
    att_y: Vec<f32>,
    /// `[N, C]`: the residual stream after attention.
    x_mid: Vec<f32>,
    ln_2: Vec<f32>,
    ln_2_mean: Vec<f32>,
    ln_2_rstd: Vec<f32>,
    /// `[N, 4C]`: the GELU's derivative at its input (the input itself is not needed again),
    /// and its output.
    fc: Vec<f32>,
    fc_gelu: Vec<f32>,
}

/// Activations of one forward pass, and scratch space for the backward pass; allocated once
/// for a batch shape and reused.
pub struct Tape {
    batch: usize,
    seq: usize,
    blocks: Vec<BlockTape>,
    /// `[N, C]`: the last block's output.
    x_out: Vec<f32>,
    ln_f: Vec<f32>,
    ln_f_mean: Vec<f32>,
    ln_f_rstd: Vec<f32>,
    /// `[N, V]`: softmax of the logits; the backward pass turns it into their gradient.
    probs: Vec<f32>,
    // Backward scratch.
    d_resid: Vec<f32>,
    d_c: Vec<f32>,
    d_3c: Vec<f32>,
    d_4c: Vec<f32>,
}

impl Tape {
    /// Space for batches of `batch` sequences of `seq` tokens.
    pub fn new(dims: Dims, batch: usize, seq: usize) -> Self {
        assert!(seq <= dims.block_size, "sequences longer than block_size");
        let n = batch * seq;
        let c = dims.n_embd;
        let z = |len: usize| vec![0.0f32; len];
        Self {
            batch,
            seq,
            blocks: (0..dims.n_layer)
                .map(|_| BlockTape {
                    x: z(n * c),
                    ln_1: z(n * c),
                    ln_1_mean: z(n),
                    ln_1_rstd: z(n),
                    qkv: z(n * 3 * c),
                    att: z(batch * dims.n_head * seq * seq),
                    att_y: z(n * c),
                    x_mid: z(n * c),
                    ln_2: z(n * c),
                    ln_2_mean: z(n),
                    ln_2_rstd: z(n),
                    fc: z(n * 4 * c),
                    fc_gelu: z(n * 4 * c),
                })
                .collect(),
            x_out: z(n * c),
            ln_f: z(n * c),
            ln_f_mean: z(n),
            ln_f_rstd: z(n),
            probs: z(n * dims.vocab_size),
            d_resid: z(n * c),
            d_c: z(n * c),
            d_3c: z(n * 3 * c),
            d_4c: z(n * 4 * c),
        }
    }

    fn shape(&self, dims: Dims) -> Shape {
        Shape {
            batch: self.batch,
            seq: self.seq,
            n_head: dims.n_head,
            n_embd: dims.n_embd,
        }
    }
}

/// The forward pass over `inputs` (`[B, T]` token ids, row-major): returns the mean
/// cross-entropy of `targets`, and leaves on `tape` what [`backward`] needs.
pub fn forward(p: &Params, inputs: &[u32], targets: &[u32], tape: &mut Tape) -> f32 {
    let dims = p.dims;
    let (t, c) = (tape.seq, dims.n_embd);
    assert_eq!(
        inputs.len(),
        tape.batch * t,
        "inputs do not match the tape's batch shape"
    );
    assert_eq!(targets.len(), inputs.len());
    let shape = tape.shape(dims);

    // Token plus position embeddings, into the first block's input (or the output).
    let x0 = match tape.blocks.first_mut() {
        Some(b) => &mut b.x,
        None => &mut tape.x_out,
    };
    for (i, (row, &tok)) in x0.chunks_exact_mut(c).zip(inputs).enumerate() {
        let tok = tok as usize;
        let pos = i % t;
        row.copy_from_slice(&p.wte[tok * c..(tok + 1) * c]);
        add_assign(row, &p.wpe[pos * c..(pos + 1) * c]);
    }

    for l in 0..dims.n_layer {
        let (done, rest) = tape.blocks.split_at_mut(l + 1);
        let bt = &mut done[l];
        let next_x = match rest.first_mut() {
            Some(next) => &mut next.x,
            None => &mut tape.x_out,
        };
        block_forward(&p.blocks[l], shape, bt, next_x);
    }

    layernorm::forward(
        &tape.x_out,
        &p.ln_f,
        &mut tape.ln_f,
        &mut tape.ln_f_mean,
        &mut tape.ln_f_rstd,
    );
    loss::forward(&tape.ln_f, &p.wte, targets, &mut tape.probs)
}

/// One block: `x_mid = x + attn(ln_1(x))`, `out = x_mid + mlp(ln_2(x_mid))`.
fn block_forward(p: &BlockParams, shape: Shape, t: &mut BlockTape, out: &mut [f32]) {
    layernorm::forward(
        &t.x,
        &p.ln_1,
        &mut t.ln_1,
        &mut t.ln_1_mean,
        &mut t.ln_1_rstd,
    );
    linear::forward(&t.ln_1, &p.c_attn, &mut t.qkv); // (N, 3C)
    attention::forward(&t.qkv, shape, &mut t.att, &mut t.att_y); // (N, C)
    linear::forward_residual(&t.att_y, &p.attn_proj, &t.x, &mut t.x_mid);
    layernorm::forward(
        &t.x_mid,
        &p.ln_2,
        &mut t.ln_2,
        &mut t.ln_2_mean,
        &mut t.ln_2_rstd,
    );
    // c_fc's bias is added by the GELU pass.
    linear::forward_unbiased(&t.ln_2, &p.c_fc, &mut t.fc); // (N, 4C)
    gelu::forward_keep_derivative(&mut t.fc, p.c_fc.bias.as_deref(), &mut t.fc_gelu);
    linear::forward_residual(&t.fc_gelu, &p.mlp_proj, &t.x_mid, out); // (N, C)
}

/// The backward pass of the loss times `scale` (1 / micro-batches when accumulating): adds
/// every parameter's gradient to `grads`. Call after [`forward`] with the same batch.
pub fn backward(
    p: &Params,
    inputs: &[u32],
    targets: &[u32],
    scale: f32,
    tape: &mut Tape,
    grads: &mut Params,
) {
    let dims = p.dims;
    let (t, c) = (tape.seq, dims.n_embd);
    let shape = tape.shape(dims);
    let tp = &mut *tape;

    // Head and final LayerNorm: d_resid = ∂loss/∂x_out.
    loss::backward(
        &tp.ln_f,
        &p.wte,
        targets,
        scale,
        &mut tp.probs,
        &mut tp.d_c,
        &mut grads.wte,
    );
    tp.d_resid.fill(0.0);
    layernorm::backward(
        &tp.d_c,
        &tp.x_out,
        &tp.ln_f_mean,
        &tp.ln_f_rstd,
        &p.ln_f,
        &mut grads.ln_f,
        &mut tp.d_resid,
    );

    for l in (0..dims.n_layer).rev() {
        let (pb, gb, bt) = (&p.blocks[l], &mut grads.blocks[l], &tp.blocks[l]);
        // out = x_mid + mlp_proj(gelu(c_fc(ln_2(x_mid))))
        linear::backward(
            &tp.d_resid,
            &bt.fc_gelu,
            &pb.mlp_proj,
            &mut gb.mlp_proj,
            Some(&mut tp.d_4c),
        );
        gelu::backward_from_derivative(&bt.fc, &mut tp.d_4c);
        linear::backward(
            &tp.d_4c,
            &bt.ln_2,
            &pb.c_fc,
            &mut gb.c_fc,
            Some(&mut tp.d_c),
        );
        layernorm::backward(
            &tp.d_c,
            &bt.x_mid,
            &bt.ln_2_mean,
            &bt.ln_2_rstd,
            &pb.ln_2,
            &mut gb.ln_2,
            &mut tp.d_resid,
        );
        // x_mid = x + attn_proj(attention(c_attn(ln_1(x))))
        linear::backward(
            &tp.d_resid,
            &bt.att_y,
            &pb.attn_proj,
            &mut gb.attn_proj,
            Some(&mut tp.d_c),
        );
        attention::backward(&tp.d_c, &bt.qkv, &bt.att, shape, &mut tp.d_3c);
        linear::backward(
            &tp.d_3c,
            &bt.ln_1,
            &pb.c_attn,
            &mut gb.c_attn,
            Some(&mut tp.d_c),
        );
        layernorm::backward(
            &tp.d_c,
            &bt.x,
            &bt.ln_1_mean,
            &bt.ln_1_rstd,
            &pb.ln_1,
            &mut gb.ln_1,
            &mut tp.d_resid,
        );
    }

    // Embeddings: each row's gradient goes to its token's and its position's vectors.
    for (i, (row, &tok)) in tp.d_resid.chunks_exact(c).zip(inputs).enumerate() {
        let tok = tok as usize;
        let pos = i % t;
        add_assign(&mut grads.wte[tok * c..(tok + 1) * c], row);
        add_assign(&mut grads.wpe[pos * c..(pos + 1) * c], row);
    }
}
