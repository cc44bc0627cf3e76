//! How a [`Kernel`] runs on a backend: on Flex its forward alone (inference); on autodiff its
//! forward now and its backward as a step of Burn's graph when the graph is walked.

use burn::backend::Flex;
use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, NodeGuard, Ops, OpsKind},
};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;

/// A layer's forward pass, which also returns what its backward pass needs, and that backward
/// pass. Inputs absent in a call (a bias, a residual) are given as empty tensors.
pub(super) trait Kernel<const N: usize>: std::fmt::Debug + Send + Sized + 'static {
    type Saved: Clone + std::fmt::Debug + Send + 'static;
    fn forward(&self, inputs: [FlexTensor; N]) -> (FlexTensor, Self::Saved);
    /// Each input's gradient, for those `wanted`.
    fn backward(
        self,
        saved: Self::Saved,
        grad: FlexTensor,
        wanted: [bool; N],
    ) -> [Option<FlexTensor>; N];
}

/// A kernel as a step of Burn's autodiff graph.
#[derive(Debug)]
pub(super) struct Step<K>(K);

impl<K: Kernel<N>, const N: usize> Backward<Flex, N> for Step<K> {
    type State = K::Saved;

    fn backward(self, ops: Ops<K::Saved, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let wanted = ops.parents.each_ref().map(Option::is_some);
        let out = self.0.backward(ops.state, grad, wanted);
        for (parent, g) in ops.parents.iter().zip(out) {
            if let (Some(parent), Some(g)) = (parent, g) {
                grads.register::<Flex>(parent.id, g);
            }
        }
    }
}

pub(super) type Ad<C> = Autodiff<Flex, C>;
pub(super) type AdTensor<C> = FloatTensor<Ad<C>>;

/// Runs `kernel` on autodiff tensors: its forward now, its backward when the graph is walked.
pub(super) fn tracked<K: Kernel<N>, C: CheckpointStrategy, const N: usize>(
    kernel: K,
    inputs: [AdTensor<C>; N],
) -> AdTensor<C> {
    let (prims, guards): (Vec<FlexTensor>, Vec<NodeGuard>) =
        inputs.into_iter().map(|t| t.into_parts()).unzip();
    let prims: [FlexTensor; N] = prims.try_into().expect("N inputs");
    let guards: [NodeGuard; N] = guards.try_into().expect("N inputs");
    let (out, saved) = kernel.forward(prims);
    match Step(kernel).prepare::<C>(guards).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(saved, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

/// A backend that runs kernels: Flex their forward alone (inference), autodiff also records
/// their backward. An operation written once over it is the same on both
/// (`super::implemented_alike`).
pub(super) trait Runs: burn::backend::Backend {
    fn run<K: Kernel<N>, const N: usize>(
        kernel: K,
        inputs: [FloatTensor<Self>; N],
    ) -> FloatTensor<Self>;
}

impl Runs for Flex {
    fn run<K: Kernel<N>, const N: usize>(kernel: K, inputs: [FlexTensor; N]) -> FlexTensor {
        kernel.forward(inputs).0
    }
}

impl<C: CheckpointStrategy> Runs for Ad<C> {
    fn run<K: Kernel<N>, const N: usize>(kernel: K, inputs: [AdTensor<C>; N]) -> AdTensor<C> {
        tracked::<K, C, N>(kernel, inputs)
    }
}
