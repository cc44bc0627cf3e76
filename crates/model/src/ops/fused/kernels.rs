//! The layers' kernels as forward and backward passes over Flex tensors ([`Kernel`]), shared by
//! the Flex implementation (forward only: inference) and the autodiff one (forward now, backward
//! in a step of Burn's graph: [`super::graph`]). The buffers they read and write are in
//! [`super::buffers`].

use super::buffers::*;
use super::graph::Kernel;
use burn::backend::flex::FlexTensor;
use cinder_kernels::attention;
use cinder_kernels::dropout::{self, Mask};
use cinder_kernels::{QkvLayout, activation, embedding, layernorm, linear, loss, rmsnorm, rotary};

/// Whether an optional input is there (absent ones are empty).
pub(super) fn present(t: &FlexTensor) -> bool {
    t.layout().num_elements() > 0
}

#[derive(Debug)]
pub(super) struct Embed {
    pub ids: Vec<u32>,
    pub seq: usize,
    /// Each sequence's first position (`cinder_kernels::start_of`).
    pub starts: Vec<usize>,
}

impl Kernel<2> for Embed {
    type Saved = (Vec<usize>, Vec<usize>); // the shapes of wte and wpe

    fn forward(&self, [wte, wpe]: [FlexTensor; 2]) -> (FlexTensor, Self::Saved) {
        let [wte, wpe] = [&wte, &wpe];
        let (wte_dims, wpe_dims) = (dims(wte), dims(wpe));
        let c = wte_dims[1];
        let mut out = zeros(self.ids.len() * c);
        let seq = self.seq;
        embedding::forward(
            &self.ids,
            seq,
            &self.starts,
            &floats(wte),
            &floats(wpe),
            &mut out,
        );
        let b = self.ids.len() / seq;
        (tensor(out, [b, seq, c]), (wte_dims, wpe_dims))
    }

    fn backward(
        self,
        (wte_dims, wpe_dims): Self::Saved,
        grad: FlexTensor,
        _: [bool; 2],
    ) -> [Option<FlexTensor>; 2] {
        assert!(
            self.starts.iter().all(|&p| p == 0),
            "the embeddings train from position 0"
        );
        let mut dwte = zeros(wte_dims.iter().product());
        let mut dwpe = zeros(wpe_dims.iter().product()); // empty without learned positions
        embedding::backward(&floats(&grad), &self.ids, self.seq, &mut dwte, &mut dwpe);
        let has_wpe = !dwpe.is_empty();
        [
            Some(tensor(dwte, wte_dims)),
            has_wpe.then(|| tensor(dwpe, wpe_dims)),
        ]
    }
}

#[derive(Debug)]
pub(super) struct LayerNorm {
    pub eps: f32,
}

impl Kernel<3> for LayerNorm {
    /// x, gamma, beta present, mean, rstd
    type Saved = (FlexTensor, FlexTensor, bool, Vec<f32>, Vec<f32>);

    fn forward(&self, [x, gamma, beta]: [FlexTensor; 3]) -> (FlexTensor, Self::Saved) {
        let [x, gamma, beta] = [&x, &gamma, &beta];
        let shape = dims(x);
        let xs = floats(x);
        let c = *shape.last().expect("rank >= 1");
        let rows = xs.len() / c;
        let (mut out, mut mean, mut rstd) = (zeros(xs.len()), zeros(rows), zeros(rows));
        let (g, b) = (floats(gamma), floats(beta));
        let norm = layernorm::Norm {
            gamma: &g,
            beta: present(beta).then_some(&b[..]),
            eps: self.eps,
        };
        layernorm::forward(&xs, norm, &mut out, &mut mean, &mut rstd);
        let saved = (x.clone(), gamma.clone(), present(beta), mean, rstd);
        (tensor(out, shape), saved)
    }

    fn backward(
        self,
        (x, gamma, has_beta, mean, rstd): Self::Saved,
        grad: FlexTensor,
        _: [bool; 3],
    ) -> [Option<FlexTensor>; 3] {
        let (xs, g) = (floats(&x), floats(&gamma));
        let c = g.len();
        let (mut dx, mut dgamma, mut dbeta) = (zeros(xs.len()), zeros(c), zeros(c));
        let dbeta_out = has_beta.then_some(&mut dbeta[..]);
        layernorm::backward(
            &floats(&grad),
            &xs,
            &mean,
            &rstd,
            &g,
            &mut dgamma,
            dbeta_out,
            &mut dx,
        );
        [
            Some(tensor(dx, dims(&x))),
            Some(tensor(dgamma, [c])),
            has_beta.then(|| tensor(dbeta, [c])),
        ]
    }
}

#[derive(Debug)]
pub(super) struct Linear;

impl Kernel<4> for Linear {
    /// x, weight, bias present, residual present
    type Saved = (FlexTensor, FlexTensor, bool, bool);

    fn forward(&self, [x, w, b, r]: [FlexTensor; 4]) -> (FlexTensor, Self::Saved) {
        let [x, w, b, r] = [&x, &w, &b, &r];
        let shape = dims(x);
        let d_out = dims(w)[1];
        let (xs, ws, bs) = (floats(x), floats(w), floats(b));
        let layer = linear::Linear::new(&ws, present(b).then_some(&bs[..]), d_out);
        let out = if present(r) {
            linear::forward_residual(&xs, layer, &floats(r))
        } else {
            linear::forward(&xs, layer)
        };
        let saved = (x.clone(), w.clone(), present(b), present(r));
        (tensor(out, with_last(&shape, d_out)), saved)
    }

    fn backward(
        self,
        (x, w, has_bias, has_residual): Self::Saved,
        grad: FlexTensor,
        wanted: [bool; 4],
    ) -> [Option<FlexTensor>; 4] {
        let [want_x, want_w, ..] = wanted;
        let (xs, ws, dy) = (floats(&x), floats(&w), floats(&grad));
        let [d_in, d_out] = [dims(&w)[0], dims(&w)[1]];
        let layer = linear::Linear::new(&ws, None, d_out);
        let linear::Grads { dx, dw, db } =
            linear::backward(&dy, &xs, layer, [want_x, want_w, has_bias]);
        [
            dx.map(|dx| tensor(dx, dims(&x))),
            dw.map(|dw| tensor(dw, [d_in, d_out])),
            db.map(|db| tensor(db, [d_out])),
            has_residual.then_some(grad),
        ]
    }
}

#[derive(Debug)]
pub(super) struct Activate(pub activation::Kind);

impl Kernel<2> for Activate {
    /// GELU's derivative at the input.
    type Saved = FlexTensor;

    fn forward(&self, [x, bias]: [FlexTensor; 2]) -> (FlexTensor, Self::Saved) {
        // The derivative replaces the input in its own buffer when nothing else holds it (the
        // linear layer's fresh output), else in a copy.
        let shape = dims(&x);
        let mut derivative = owned(x);
        let b = floats(&bias);
        let values = derivative.storage_mut::<f32>();
        let mut out = zeros(values.len());
        activation::forward_keep_derivative(
            self.0,
            values,
            present(&bias).then_some(&b[..]),
            &mut out,
        );
        (tensor(out, shape), derivative)
    }

    fn backward(
        self,
        derivative: FlexTensor,
        grad: FlexTensor,
        [_, want_bias]: [bool; 2],
    ) -> [Option<FlexTensor>; 2] {
        let shape = dims(&grad);
        let mut d = copied(&floats(&grad));
        activation::backward_from_derivative(&floats(&derivative), &mut d);
        let db = want_bias.then(|| {
            let width = *shape.last().expect("rank >= 1");
            let mut db = zeros(width);
            cinder_kernels::rows::sum(&d, width, &mut db, |_, block, acc| {
                for row in block.chunks_exact(acc.len()) {
                    cinder_kernels::simd::add_assign(acc, row);
                }
            });
            tensor(db, [width])
        });
        [Some(tensor(d, shape)), db]
    }
}

#[derive(Debug)]
pub(super) struct Attention {
    pub layout: QkvLayout,
    pub mask: Option<Mask>,
}

impl Attention {
    fn shape(&self, qkv: &[usize]) -> attention::Shape {
        let [batch, seq, width] = qkv.try_into().expect("qkv is [B, T, W]");
        assert_eq!(
            width,
            self.layout.width(),
            "qkv is laid out as {:?}",
            self.layout
        );
        attention::Shape {
            batch,
            seq,
            layout: self.layout,
        }
    }
}

impl Kernel<1> for Attention {
    /// qkv, the weights before dropout
    type Saved = (FlexTensor, Vec<f32>);

    fn forward(&self, [qkv]: [FlexTensor; 1]) -> (FlexTensor, Self::Saved) {
        let [qkv] = [&qkv];
        let s = self.shape(&dims(qkv));
        let c = s.layout.q_width();
        let mut att = zeros(s.batch * s.layout.n_head * s.seq * s.seq);
        let mut y = zeros(s.batch * s.seq * c);
        attention::forward(&floats(qkv), s, self.mask, &mut att, &mut y);
        (tensor(y, [s.batch, s.seq, c]), (qkv.clone(), att))
    }

    fn backward(
        self,
        (qkv, att): Self::Saved,
        grad: FlexTensor,
        _: [bool; 1],
    ) -> [Option<FlexTensor>; 1] {
        let shape = dims(&qkv);
        let s = self.shape(&shape);
        let q = floats(&qkv);
        let mut dqkv = zeros(q.len());
        attention::backward(&floats(&grad), &q, &att, s, self.mask, &mut dqkv);
        [Some(tensor(dqkv, shape))]
    }
}

#[derive(Debug)]
pub(super) struct Dropout(pub Mask);

impl Kernel<2> for Dropout {
    /// whether a residual was added
    type Saved = bool;

    fn forward(&self, [x, residual]: [FlexTensor; 2]) -> (FlexTensor, bool) {
        let xs = floats(&x);
        let r = floats(&residual);
        let has_residual = present(&residual);
        let mut out = zeros(xs.len());
        dropout::apply(&xs, has_residual.then_some(&r[..]), self.0, &mut out);
        (tensor(out, dims(&x)), has_residual)
    }

    fn backward(
        self,
        has_residual: bool,
        grad: FlexTensor,
        _: [bool; 2],
    ) -> [Option<FlexTensor>; 2] {
        let g = floats(&grad);
        let mut dx = zeros(g.len());
        dropout::apply(&g, None, self.0, &mut dx);
        let dx = tensor(dx, dims(&grad));
        [Some(dx), has_residual.then_some(grad)]
    }
}

#[derive(Debug)]
pub(super) struct RmsNorm {
    pub eps: f32,
}

impl Kernel<1> for RmsNorm {
    /// the output, 1/rms of each row
    type Saved = (FlexTensor, Vec<f32>);

    fn forward(&self, [x]: [FlexTensor; 1]) -> (FlexTensor, Self::Saved) {
        let shape = dims(&x);
        let xs = floats(&x);
        let c = *shape.last().expect("rank >= 1");
        let (mut out, mut rstd) = (zeros(xs.len()), zeros(xs.len() / c));
        rmsnorm::forward(&xs, c, self.eps, &mut out, &mut rstd);
        let out = tensor(out, shape);
        (out.clone(), (out, rstd))
    }

    fn backward(
        self,
        (y, rstd): Self::Saved,
        grad: FlexTensor,
        _: [bool; 1],
    ) -> [Option<FlexTensor>; 1] {
        let shape = dims(&grad);
        let y = floats(&y);
        let c = y.len() / rstd.len();
        let mut dx = zeros(y.len());
        rmsnorm::backward(&floats(&grad), &y, &rstd, c, &mut dx);
        [Some(tensor(dx, shape))]
    }
}

#[derive(Debug)]
pub(super) struct RotateQk(pub rotary::Qk);

impl Kernel<1> for RotateQk {
    /// the output, each head's 1/rms
    type Saved = (FlexTensor, Vec<f32>);

    fn forward(&self, [qkv]: [FlexTensor; 1]) -> (FlexTensor, Self::Saved) {
        let shape = dims(&qkv);
        let xs = floats(&qkv);
        let rows = xs.len() / self.0.layout.width();
        let (mut out, mut rstd) = (zeros(xs.len()), zeros(rows * self.0.heads()));
        rotary::forward(&xs, &self.0, &mut out, &mut rstd);
        let out = tensor(out, shape);
        (out.clone(), (out, rstd))
    }

    fn backward(
        self,
        (out, rstd): Self::Saved,
        grad: FlexTensor,
        _: [bool; 1],
    ) -> [Option<FlexTensor>; 1] {
        let shape = dims(&grad);
        let out = floats(&out);
        let mut dqkv = zeros(out.len());
        rotary::backward(&floats(&grad), &out, &rstd, &self.0, &mut dqkv);
        [Some(tensor(dqkv, shape))]
    }
}

#[derive(Debug)]
pub(super) struct HeadLoss {
    pub targets: Vec<u32>,
    /// The logits' soft-cap (0: none).
    pub softcap: f32,
}

impl Kernel<2> for HeadLoss {
    /// x, the head's weight, the probabilities, the soft-cap's slopes (empty without one)
    type Saved = (FlexTensor, FlexTensor, Vec<f32>, Vec<f32>);

    fn forward(&self, [x, w]: [FlexTensor; 2]) -> (FlexTensor, Self::Saved) {
        let [x, w] = [&x, &w];
        let n = self.targets.len() * dims(w)[0];
        let mut probs = zeros(n);
        let mut slopes = zeros(if self.softcap > 0.0 { n } else { 0 });
        let (xs, ws) = (floats(x), floats(w));
        let mean = loss::forward(
            &xs,
            &ws,
            &self.targets,
            self.softcap,
            &mut probs,
            &mut slopes,
        );
        (
            tensor(vec![mean], [1]),
            (x.clone(), w.clone(), probs, slopes),
        )
    }

    fn backward(
        self,
        (x, w, mut probs, slopes): Self::Saved,
        grad: FlexTensor,
        _: [bool; 2],
    ) -> [Option<FlexTensor>; 2] {
        let scale = floats(&grad)[0];
        let (xs, ws) = (floats(&x), floats(&w));
        let (mut dx, mut dw) = (zeros(xs.len()), zeros(ws.len()));
        loss::backward(
            &xs,
            &ws,
            &self.targets,
            scale,
            &slopes,
            &mut probs,
            &mut dx,
            &mut dw,
        );
        [Some(tensor(dx, dims(&x))), Some(tensor(dw, dims(&w)))]
    }
}
