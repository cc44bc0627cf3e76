//! Helpers that cinder's test suites share. The suites convert tensors to vectors themselves:
//! this crate depends on nothing, so taking it as a dev-dependency changes no other crate's
//! features.

/// The largest absolute difference between two equally long slices (0 when they are empty).
/// Equal values differ by 0, infinities included (a masked score against a masked score); a NaN
/// on either side makes the result NaN, so that no `max_diff(..) < tolerance` passes for it
/// (`f32::max` would drop it).
///
/// # Panics
/// If the lengths differ: a comparison that silently skipped a tail could pass for a result
/// that is too short.
pub fn max_diff<T: Float>(a: &[T], b: &[T]) -> T {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| x.abs_diff(y))
        .fold(T::ZERO, T::max)
}

/// `f32` or `f64`.
pub trait Float: Copy + sealed::Sealed {
    const ZERO: Self;
    fn abs_diff(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! float {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Float for $t {
            const ZERO: Self = 0.0;
            fn abs_diff(self, other: Self) -> Self {
                if self == other { 0.0 } else { (self - other).abs() }
            }
            fn max(self, other: Self) -> Self {
                if other > self || other.is_nan() { other } else { self }
            }
        }
    )*};
}
float!(f32, f64);

#[cfg(test)]
mod tests {
    use super::max_diff;

    #[test]
    fn the_largest_absolute_difference_whichever_side_is_larger() {
        assert_eq!(max_diff(&[1.0f32, 5.0, -2.0], &[1.5, 4.0, -2.25]), 1.0);
        assert_eq!(max_diff(&[0.0f64, -3.0], &[0.5, 1.0]), 4.0);
        assert_eq!(max_diff::<f32>(&[], &[]), 0.0);
        assert_eq!(
            max_diff(&[f32::NEG_INFINITY, 1.0], &[f32::NEG_INFINITY, 1.0]),
            0.0
        );
        assert_eq!(max_diff(&[f32::NEG_INFINITY], &[0.0]), f32::INFINITY);
    }

    #[test]
    fn a_nan_is_not_hidden() {
        // f32::max drops a NaN: a result with NaNs must not pass for a close one.
        assert!(max_diff(&[f32::NAN, 0.0], &[0.0, 0.0]).is_nan());
        assert!(max_diff(&[0.0, 1.0], &[0.0, f64::NAN]).is_nan());
        assert!(
            max_diff(&[f32::NAN, 0.0], &[f32::NAN, 5.0]).is_nan(),
            "NaN against NaN"
        );
    }

    #[test]
    #[should_panic(expected = "differ in length")]
    fn slices_of_different_lengths_are_refused() {
        max_diff(&[1.0f32, 2.0], &[1.0]);
    }
}
