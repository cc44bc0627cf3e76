//! The buffers of the fused layers: the values of Flex tensors as slices, new tensors from
//! values, and outputs zeroed or copied by all of rayon's threads.

use burn::backend::flex::FlexTensor;
use burn::tensor::{Shape, TensorData};
use rayon::prelude::*;

/// The values of a float tensor, row-major (copied only if its layout is not contiguous).
pub(super) fn floats(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => s.into(),
        None => t
            .to_contiguous()
            .as_slice::<f32>()
            .expect("cinder's tensors are f32")
            .to_vec()
            .into(),
    }
}

/// `t` as a tensor whose buffer holds exactly its values in order (a copy when `t` is a view
/// of part of a buffer, or strided), for a kernel that writes in place; the buffer is still
/// copied on write if another tensor shares it.
pub(super) fn owned(t: FlexTensor) -> FlexTensor {
    let whole = t
        .as_slice::<f32>()
        .is_some_and(|s| std::mem::size_of_val(s) == t.bytes().len());
    if whole {
        t
    } else {
        tensor(floats(&t).into_owned(), dims(&t))
    }
}

/// The ids of an int tensor.
pub(super) fn ids(t: &FlexTensor) -> Vec<u32> {
    t.clone()
        .into_data()
        .convert::<u32>()
        .try_into_vec::<u32>()
        .expect("ids convert to u32")
}

/// A tensor of `shape` holding `values`.
pub(super) fn tensor(values: Vec<f32>, shape: impl Into<Shape>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

pub(super) fn dims(t: &FlexTensor) -> Vec<usize> {
    t.layout().shape().to_vec()
}

/// `shape` with its last dimension replaced by `last`.
pub(super) fn with_last(shape: &[usize], last: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    *s.last_mut().expect("a tensor of rank >= 1") = last;
    s
}

/// A buffer of `n` zeros, written by all of rayon's threads: a kernel's output, which the kernel
/// then writes in parallel. (Zeroing tens of megabytes on the calling thread alone left the
/// other threads idle; measured in BENCHMARKS.md.)
pub(super) fn zeros(n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    v.spare_capacity_mut()
        .par_chunks_mut(ELEMENTS_PER_TASK)
        .for_each(|c| c.fill(std::mem::MaybeUninit::new(0.0)));
    // SAFETY: the first n elements were all written just above.
    unsafe { v.set_len(n) };
    v
}

/// `x` copied into a new buffer, by all of rayon's threads.
pub(super) fn copied(x: &[f32]) -> Vec<f32> {
    let mut v = zeros(x.len());
    v.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(x.par_chunks(ELEMENTS_PER_TASK))
        .for_each(|(v, x)| v.copy_from_slice(x));
    v
}

/// Elements per rayon task when filling or copying a buffer.
const ELEMENTS_PER_TASK: usize = 64 * 1024;
