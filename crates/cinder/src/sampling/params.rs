//! Choosing the next token from the model's logits: temperature, top-k, top-p (nucleus).
//! Host-side and backend-independent, so the same seed gives the same text on every backend.

use rand::Rng;

/// `generate`'s temperature unless told otherwise.
pub const DEFAULT_TEMPERATURE: f32 = 0.8;

/// `generate`'s top-k unless told otherwise (nanoGPT's `sample.py`'s).
pub const DEFAULT_TOP_K: usize = 200;

/// How to pick each next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`.
    pub top_p: Option<f32>,
}

impl SamplingParams {
    /// The token to emit after `logits` (one per vocabulary entry).
    pub fn pick(&self, logits: &[f32], rng: &mut impl Rng) -> u32 {
        if self.temperature == 0.0 {
            return argmax(logits);
        }
        let probs = self.distribution(logits);
        let u: f32 = rng.random();
        let mut acc = 0.0;
        let mut last = 0;
        for (i, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                acc += p;
                last = i;
                if u < acc {
                    return i as u32;
                }
            }
        }
        last as u32 // rounding left u just above the total
    }

    /// The probabilities `pick` samples from: softmax(logits / temperature), cut by top-k and
    /// top-p and renormalised. Tokens cut have probability 0.
    pub fn distribution(&self, logits: &[f32]) -> Vec<f32> {
        let t = self.temperature.max(f32::MIN_POSITIVE);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<f32> = logits.iter().map(|&l| ((l - max) / t).exp()).collect();
        normalise(&mut probs);
        cut(&mut probs, self.top_k, self.top_p);
        normalise(&mut probs);
        probs
    }
}

/// Zeroes the tokens outside the `top_k` most likely and the smallest set of most likely
/// tokens whose probabilities reach `top_p` (ties in the order of their ids). The top k are
/// found without sorting the rest, sorted only for top-p, and nothing is sorted when nothing
/// is cut: a vocabulary of 50k tokens, every token.
fn cut(probs: &mut [f32], top_k: Option<usize>, top_p: Option<f32>) {
    let k = top_k.map_or(probs.len(), |k| k.max(1).min(probs.len()));
    if k == probs.len() && top_p.is_none() {
        return;
    }
    let by_probability = |&a: &usize, &b: &usize| probs[b].total_cmp(&probs[a]).then(a.cmp(&b));
    let mut order: Vec<usize> = (0..probs.len()).collect();
    if k < order.len() {
        order.select_nth_unstable_by(k, by_probability); // the top k first, in no order
    }
    let mut keep = k;
    if let Some(p) = top_p {
        order[..k].sort_by(by_probability);
        let mut acc = 0.0;
        let reach = order[..k]
            .iter()
            .position(|&i| {
                acc += probs[i];
                acc >= p
            })
            .map_or(k, |n| n + 1);
        keep = keep.min(reach);
    }
    for &i in &order[keep..] {
        probs[i] = 0.0;
    }
}

fn normalise(probs: &mut [f32]) {
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
}

/// Index of the largest value (the first, on ties).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn top_p_keeps_smallest_set_reaching_p() {
        let logits = logits_of(&[0.1, 0.5, 0.15, 0.25]);
        let with_p = |p| SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: Some(p),
        };
        // Sorted: 0.5 (1), 0.25 (3), 0.15 (2), 0.1 (0).
        let kept = |p| {
            with_p(p)
                .distribution(&logits)
                .iter()
                .map(|&q| q > 0.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(kept(0.5), [false, true, false, false]);
        assert_eq!(kept(0.6), [false, true, false, true]);
        assert_eq!(kept(0.75), [false, true, false, true]);
        assert_eq!(kept(0.8), [false, true, true, true]);
        assert_eq!(kept(1.0), [true, true, true, true]);
        let d = with_p(0.6).distribution(&logits);
        assert!(
            (d[1] - 0.5 / 0.75).abs() < 1e-6 && (d[3] - 0.25 / 0.75).abs() < 1e-6,
            "{d:?}"
        );
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let top1 = SamplingParams {
            temperature: 1.3,
            top_k: Some(1),
            top_p: None,
        };
        let greedy = SamplingParams {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        };
        for i in 0..50 {
            let logits: Vec<f32> = (0..20)
                .map(|j| ((i * 7 + j * 13) % 17) as f32 * 0.3)
                .collect();
            assert_eq!(top1.pick(&logits, &mut rng), greedy.pick(&logits, &mut rng));
            assert_eq!(greedy.pick(&logits, &mut rng), argmax(&logits));
        }
    }

    #[test]
    fn samples_follow_the_distribution() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: Some(2),
            top_p: None,
        };
        let logits = logits_of(&[0.2, 0.6, 0.05, 0.15]);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = [0usize; 4];
        for _ in 0..20_000 {
            counts[params.pick(&logits, &mut rng) as usize] += 1;
        }
        assert_eq!((counts[2], counts[3]), (0, 0));
        let share = counts[1] as f64 / 20_000.0; // 0.6 / 0.8
        assert!((share - 0.75).abs() < 0.02, "{counts:?}");
    }

    /// The cut against the whole order: random distributions with ties, top-k, top-p and both.
    #[test]
    fn the_cut_keeps_what_sorting_every_token_keeps() {
        let reference = |probs: &[f32], k: Option<usize>, p: Option<f32>| {
            let mut order: Vec<usize> = (0..probs.len()).collect();
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let mut keep = k.map_or(probs.len(), |k| k.max(1).min(probs.len()));
            if let Some(p) = p {
                let mut acc = 0.0;
                let reach = order.iter().position(|&i| {
                    acc += probs[i];
                    acc >= p
                });
                keep = keep.min(reach.map_or(probs.len(), |n| n + 1));
            }
            let mut kept = vec![false; probs.len()];
            order[..keep].iter().for_each(|&i| kept[i] = true);
            kept
        };
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for trial in 0..300 {
            let n = 1 + trial % 40;
            // Few distinct values, so that ties are common.
            let mut probs: Vec<f32> = (0..n).map(|_| rng.random_range(1..6) as f32).collect();
            normalise(&mut probs);
            let k = [None, Some(0), Some(1), Some(3), Some(n), Some(n + 5)][trial % 6];
            let p = [None, Some(0.3), Some(0.9), Some(1.0)][(trial / 6) % 4];
            let mut cut_probs = probs.clone();
            cut(&mut cut_probs, k, p);
            let kept: Vec<bool> = cut_probs.iter().map(|&q| q > 0.0).collect();
            assert_eq!(kept, reference(&probs, k, p), "{probs:?} k {k:?} p {p:?}");
        }
    }
}
