//! Run-time choice of vector instructions, and the two transcendental functions the model needs
//! (`exp`, `erf`) written as plain arithmetic so that loops over them vectorise.
//!
//! The crate is compiled for the baseline x86-64 (SSE2). [`multiversion!`] compiles a function's
//! body three times, for AVX-512, AVX2+FMA and the baseline, and picks one at run time.

/// The builds [`multiversion!`] makes, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// AVX-512 (with the 256-bit forms of its instructions) and AVX2+FMA.
    V4,
    /// AVX2 and FMA.
    V3,
    /// Whatever the crate is compiled for (SSE2 on x86-64).
    Baseline,
}

/// CPU features each build is compiled for: the strings of its `#[target_feature(enable)]` in
/// [`multiversion!`], which must list exactly these.
pub const V4_FEATURES: &[&str] = &["avx512f", "avx512vl", "avx2", "fma"];
pub const V3_FEATURES: &[&str] = &["avx2", "fma"];

/// The best build whose every feature `has` reports. A CPU (or a virtual machine) may have
/// `avx512f` without `avx512vl`: running the V4 build there would be undefined behaviour.
pub fn choose(has: impl Fn(&str) -> bool) -> Level {
    if V4_FEATURES.iter().all(|f| has(f)) {
        Level::V4
    } else if V3_FEATURES.iter().all(|f| has(f)) {
        Level::V3
    } else {
        Level::Baseline
    }
}

/// The build for this CPU, detected once.
pub fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| choose(detected))
}

/// Whether this CPU has the feature `name` (one of those in [`V4_FEATURES`]).
fn detected(name: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match name {
            "avx512f" => std::is_x86_feature_detected!("avx512f"),
            "avx512vl" => std::is_x86_feature_detected!("avx512vl"),
            "avx2" => std::is_x86_feature_detected!("avx2"),
            "fma" => std::is_x86_feature_detected!("fma"),
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = name;
        false
    }
}

/// Defines `fn $name(args) -> ret` whose body is compiled for AVX-512, AVX2+FMA and the
/// baseline, the best one the CPU has being chosen at each call ([`level`]: a cached load).
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                // The feature lists are V4_FEATURES and V3_FEATURES.
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                unsafe fn v4($($arg: $ty),*) $(-> $ret)? { generic($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3($($arg: $ty),*) $(-> $ret)? { generic($($arg),*) }
                match $crate::simd::level() {
                    // SAFETY: `level` chose V4 because the CPU has every feature v4 enables.
                    $crate::simd::Level::V4 => return unsafe { v4($($arg),*) },
                    // SAFETY: `level` chose V3 because the CPU has every feature v3 enables.
                    $crate::simd::Level::V3 => return unsafe { v3($($arg),*) },
                    $crate::simd::Level::Baseline => {}
                }
            }
            generic($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// `e^x` within 2 ulp for x in [-87, 88] (Cephes' `expf`: x = n ln 2 + r, a degree-6 polynomial
/// for `e^r`, `2^n` built in the exponent bits). Below -87 it returns about 1e-38, not 0.
///
/// The polynomials here are written with `mul_add`: one instruction each in the AVX2 and
/// AVX-512 builds [`multiversion!`] makes (half the instructions of a multiply and an add, which
/// the compiler may not fuse by itself); the baseline build, for CPUs without FMA, calls the
/// C library's `fmaf`, slower but giving the same results.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting it rounds to an integer
    let x = x.clamp(-87.0, 88.0);
    let shifted = x.mul_add(LOG2E, ROUND);
    let n = shifted - ROUND;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e = (p * r).mul_add(r, r) + 1.0;
    // n sits in the low mantissa bits of `shifted`: shifting them into the exponent field is
    // 2^n, with integer operations only (a float-to-int cast would block vectorisation).
    let scale = f32::from_bits(shifted.to_bits().wrapping_add(127) << 23);
    e * scale
}

/// The error function within a few ulp (the rational approximation XLA and Eigen use for f32:
/// x clamped to [-4, 4], where erf is 1 to within f32 precision).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10f32;
    p = p.mul_add(x2, 2.770_681_4e-8);
    p = p.mul_add(x2, -2.101_024e-6);
    p = p.mul_add(x2, -5.692_506_4e-5);
    p = p.mul_add(x2, -7.349_906_3e-4);
    p = p.mul_add(x2, -2.954_600_1e-3);
    p = p.mul_add(x2, -1.609_603_3e-2);
    let mut q = -1.456_607_2e-5f32;
    q = q.mul_add(x2, -2.133_740_6e-4);
    q = q.mul_add(x2, -1.682_827e-3);
    q = q.mul_add(x2, -7.373_329_2e-3);
    q = q.mul_add(x2, -1.426_474e-2);
    x * p / q
}

/// Lanes of the partial sums below: 16 independent accumulators let the compiler use vector
/// registers (a single running sum is a dependency chain it may not reorder).
const LANES: usize = 16;

/// `sum(x)`, in a fixed order (the result does not depend on threads).
#[inline(always)]
pub fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for ch in chunks {
        for i in 0..LANES {
            acc[i] += ch[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `max(x)` (-inf for an empty slice).
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for ch in chunks {
        for i in 0..LANES {
            acc[i] = acc[i].max(ch[i]);
        }
    }
    acc.iter().fold(tail, |m, &v| m.max(v))
}

/// `x = exp(x - shift)` in place; returns the sum of the new values.
#[inline(always)]
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    for v in x.iter_mut() {
        *v = exp(*v - shift);
    }
    sum(x)
}

/// `sum(a * b)`.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

multiversion! {
    /// `acc += x`, element-wise.
    pub fn add_assign(acc: &mut [f32], x: &[f32]) {
        assert_eq!(acc.len(), x.len());
        for (a, b) in acc.iter_mut().zip(x) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_chosen_needs_every_feature_it_was_compiled_for() {
        let with = |features: &'static [&'static str]| move |f: &str| features.contains(&f);
        assert_eq!(
            choose(with(&["avx512f", "avx512vl", "avx2", "fma"])),
            Level::V4
        );
        // AVX-512 Foundation alone (no VL) must not run the V4 build.
        assert_eq!(choose(with(&["avx512f", "avx2", "fma"])), Level::V3);
        assert_eq!(
            choose(with(&["avx512f", "avx512vl", "avx2"])),
            Level::Baseline
        );
        assert_eq!(choose(with(&["avx2"])), Level::Baseline);
        assert_eq!(choose(with(&[])), Level::Baseline);
    }

    #[test]
    fn the_macro_enables_exactly_the_listed_features() {
        let source = include_str!("simd.rs");
        let v4 = format!("enable = \"{}\"", V4_FEATURES.join(","));
        let v3 = format!("enable = \"{}\"", V3_FEATURES.join(","));
        assert!(source.contains(&v4), "multiversion! must enable {v4}");
        assert!(source.contains(&v3), "multiversion! must enable {v3}");
    }

    #[test]
    fn exp_matches_the_standard_library() {
        let mut worst = (0f32, 0f32);
        for i in -86_000..=87_900 {
            let x = i as f32 * 1e-3;
            let want = x.exp();
            let err = ((exp(x) - want) / want).abs();
            if err > worst.0 {
                worst = (err, x);
            }
        }
        assert!(worst.0 < 3e-7, "relative error {} at {}", worst.0, worst.1);
    }

    #[test]
    fn erf_matches_libm() {
        let mut worst = 0f32;
        for i in -6_000..=6_000 {
            let x = i as f32 * 1e-3;
            worst = worst.max((erf(x) - libm::erff(x)).abs());
        }
        assert!(worst < 1e-6, "absolute error {worst}");
    }
}
