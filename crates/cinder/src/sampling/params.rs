//! Choosing the next token from the model's logits: penalties for what a row has already said,
//! then temperature, top-k, top-p (nucleus) and min-p. Host-side and backend-independent, so the
//! same seed gives the same text on every backend, and `generate` and `serve` share it.
//!
//! The order, as Hugging Face's and vLLM's samplers apply them:
//! 1. `repetition_penalty` (Hugging Face's and llama.cpp's form): the logit of every token in the
//!    prompt or already generated is divided by it when positive, multiplied when negative;
//! 2. `frequency_penalty` and `presence_penalty` (OpenAI's definitions): the logit of a token
//!    generated `c` times (the prompt not counted) loses `c * frequency + (c > 0) * presence`;
//! 3. softmax of the logits over the temperature (0: the most likely token, penalties included);
//! 4. top-k, then top-p, then min-p (tokens less likely than `min_p` times the most likely go),
//!    renormalised.

use std::borrow::Cow;
use std::collections::HashMap;

use rand::Rng;

/// `generate`'s temperature unless told otherwise.
pub const DEFAULT_TEMPERATURE: f32 = 0.8;

/// `generate`'s top-k unless told otherwise (nanoGPT's `sample.py`'s).
pub const DEFAULT_TOP_K: usize = 200;

/// How to pick each next token. [`Default`]: the model's own distribution (temperature 1,
/// nothing cut, no penalty).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`.
    pub top_p: Option<f32>,
    /// Keep only the tokens at least `min_p` times as likely as the most likely one.
    pub min_p: Option<f32>,
    /// Subtracted from the logit of every token generated at least once (-2 to 2).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (-2 to 2).
    pub frequency_penalty: f32,
    /// Divides (positive) or multiplies (negative) the logits of tokens in the prompt or
    /// generated; 1 is off, above 1 discourages repeats.
    pub repetition_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

/// A sampling value out of its range: `param` is its name as the API spells it (`generate`'s
/// flag is the same with dashes).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{param} is {value}, but it must be {allowed}")]
pub struct BadSampling {
    pub param: &'static str,
    pub value: String,
    pub allowed: &'static str,
}

impl SamplingParams {
    /// Refuses values that cannot mean anything, naming the first.
    pub fn check(&self) -> Result<(), BadSampling> {
        let bad = |param, value: String, allowed| {
            Err(BadSampling {
                param,
                value,
                allowed,
            })
        };
        let t = self.temperature;
        if !(t >= 0.0 && t.is_finite()) {
            return bad("temperature", t.to_string(), "0 (greedy) or more");
        }
        if self.top_k == Some(0) {
            return bad("top_k", "0".into(), "at least 1");
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return bad("top_p", p.to_string(), "in (0, 1]");
        }
        if let Some(p) = self.min_p
            && !(0.0..=1.0).contains(&p)
        {
            return bad("min_p", p.to_string(), "0 to 1");
        }
        for (param, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return bad(param, value.to_string(), "-2 to 2");
            }
        }
        let r = self.repetition_penalty;
        if !(r > 0.0 && r.is_finite()) {
            return bad("repetition_penalty", r.to_string(), "above 0 (1 is off)");
        }
        Ok(())
    }

    /// Whether any penalty is on: only then does a row's history matter.
    pub fn penalises(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// The token to emit after `logits` (one per vocabulary entry), by a row that has said
    /// `seen`.
    pub fn pick(&self, logits: &[f32], seen: &Seen, rng: &mut impl Rng) -> u32 {
        let logits = self.penalised(logits, seen);
        if self.temperature == 0.0 {
            return argmax(&logits);
        }
        let probs = self.tempered(&logits);
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

    /// The probabilities `pick` samples from, for a row that has said `seen` (at temperature 0,
    /// the tempered distribution of the smallest positive temperature).
    pub fn distribution(&self, logits: &[f32], seen: &Seen) -> Vec<f32> {
        self.tempered(&self.penalised(logits, seen))
    }

    /// `logits` with the penalties for `seen` applied (steps 1 and 2).
    fn penalised<'l>(&self, logits: &'l [f32], seen: &Seen) -> Cow<'l, [f32]> {
        if !self.penalises() {
            return Cow::Borrowed(logits);
        }
        let mut logits = logits.to_vec();
        let r = self.repetition_penalty;
        if r != 1.0 {
            // Every token of the prompt or generated, once.
            let generated = seen.generated.keys().copied();
            let not_in_prompt = generated.filter(|t| seen.prompt.binary_search(t).is_err());
            for t in seen.prompt.iter().copied().chain(not_in_prompt) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
        for (&t, &c) in &seen.generated {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= c as f32 * self.frequency_penalty + self.presence_penalty;
            }
        }
        Cow::Owned(logits)
    }

    /// softmax(logits / temperature), cut by top-k, top-p and min-p and renormalised (steps 3
    /// and 4). Tokens cut have probability 0.
    fn tempered(&self, logits: &[f32]) -> Vec<f32> {
        let t = self.temperature.max(f32::MIN_POSITIVE);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<f32> = logits.iter().map(|&l| ((l - max) / t).exp()).collect();
        normalise(&mut probs);
        cut(&mut probs, self.top_k, self.top_p);
        if let Some(min_p) = self.min_p.filter(|&p| p > 0.0) {
            // Relative to the most likely token, which every cut keeps: the same set whether
            // the cut renormalised first or not.
            let floor = min_p * probs.iter().copied().fold(0.0, f32::max);
            probs
                .iter_mut()
                .filter(|p| **p < floor)
                .for_each(|p| *p = 0.0);
        }
        normalise(&mut probs);
        probs
    }
}

/// What the penalties look at: a row's prompt, and how often it generated each token.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The prompt's distinct tokens, sorted.
    prompt: Vec<u32>,
    generated: HashMap<u32, u32>,
}

impl Seen {
    /// A row that has said only `prompt`.
    pub fn new(prompt: &[u32]) -> Self {
        let mut prompt = prompt.to_vec();
        prompt.sort_unstable();
        prompt.dedup();
        Self {
            prompt,
            generated: HashMap::new(),
        }
    }

    /// The row generated `token`.
    pub fn push(&mut self, token: u32) {
        *self.generated.entry(token).or_default() += 1;
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
            top_p: Some(p),
            ..SamplingParams::default()
        };
        // Sorted: 0.5 (1), 0.25 (3), 0.15 (2), 0.1 (0).
        let kept = |p| {
            with_p(p)
                .distribution(&logits, &Seen::default())
                .iter()
                .map(|&q| q > 0.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(kept(0.5), [false, true, false, false]);
        assert_eq!(kept(0.6), [false, true, false, true]);
        assert_eq!(kept(0.75), [false, true, false, true]);
        assert_eq!(kept(0.8), [false, true, true, true]);
        assert_eq!(kept(1.0), [true, true, true, true]);
        let d = with_p(0.6).distribution(&logits, &Seen::default());
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
            ..SamplingParams::default()
        };
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let none = Seen::default();
        for i in 0..50 {
            let logits: Vec<f32> = (0..20)
                .map(|j| ((i * 7 + j * 13) % 17) as f32 * 0.3)
                .collect();
            let greedy_pick = greedy.pick(&logits, &none, &mut rng);
            assert_eq!(top1.pick(&logits, &none, &mut rng), greedy_pick);
            assert_eq!(greedy_pick, argmax(&logits));
        }
    }

    #[test]
    fn samples_follow_the_distribution() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: Some(2),
            ..SamplingParams::default()
        };
        let logits = logits_of(&[0.2, 0.6, 0.05, 0.15]);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = [0usize; 4];
        for _ in 0..20_000 {
            counts[params.pick(&logits, &Seen::default(), &mut rng) as usize] += 1;
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

    /// Every sampler, alone and together, against a plain reading of its definition in f64 (a
    /// whole sort, counts by scanning the texts): random logits, prompts and generated tokens
    /// over a small vocabulary, so that tokens repeat and fall in both.
    #[test]
    fn samplers_agree_with_their_definitions() {
        fn reference(
            logits: &[f32],
            prompt: &[u32],
            generated: &[u32],
            s: &SamplingParams,
        ) -> Vec<f64> {
            let mut l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
            let r = s.repetition_penalty as f64;
            for (j, l) in l.iter_mut().enumerate() {
                let j = j as u32;
                // Hugging Face: prompt and generated tokens alike.
                if prompt.contains(&j) || generated.contains(&j) {
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
                // OpenAI: generated tokens only.
                let c = generated.iter().filter(|&&g| g == j).count() as f64;
                *l -= c * s.frequency_penalty as f64
                    + if c > 0.0 {
                        s.presence_penalty as f64
                    } else {
                        0.0
                    };
            }
            let t = s.temperature as f64;
            let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut p: Vec<f64> = l.iter().map(|&x| ((x - max) / t).exp()).collect();
            let sum: f64 = p.iter().sum();
            p.iter_mut().for_each(|q| *q /= sum);
            let mut order: Vec<usize> = (0..p.len()).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let mut keep: Vec<usize> = order[..s.top_k.unwrap_or(p.len()).min(p.len())].to_vec();
            if let Some(top_p) = s.top_p {
                let mut acc = 0.0;
                let n = keep.iter().position(|&i| {
                    acc += p[i];
                    acc >= top_p as f64
                });
                keep.truncate(n.map_or(keep.len(), |n| n + 1));
            }
            if let Some(min_p) = s.min_p {
                let floor = min_p as f64 * p[order[0]];
                keep.retain(|&i| p[i] >= floor);
            }
            let kept: f64 = keep.iter().map(|&i| p[i]).sum();
            let mut out = vec![0.0; p.len()];
            keep.iter().for_each(|&i| out[i] = p[i] / kept);
            out
        }
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for trial in 0..400 {
            let v = 8 + trial % 24;
            let logits: Vec<f32> = (0..v).map(|_| rng.random_range(-4.0..4.0)).collect();
            let prompt: Vec<u32> = (0..rng.random_range(1..6))
                .map(|_| rng.random_range(0..v as u32))
                .collect();
            let generated: Vec<u32> = (0..rng.random_range(0..12))
                .map(|_| rng.random_range(0..v as u32))
                .collect();
            let s = SamplingParams {
                temperature: [1.0, 0.7, 1.6][trial % 3],
                top_k: [None, Some(3)][(trial / 3) % 2],
                top_p: [None, Some(0.8)][(trial / 6) % 2],
                min_p: [None, Some(0.05), Some(0.3)][(trial / 12) % 3],
                presence_penalty: [0.0, 0.8, -1.0][(trial / 36) % 3],
                frequency_penalty: [0.0, 0.5, 2.0][(trial / 108) % 3],
                repetition_penalty: [1.0, 1.3, 0.8, 2.0][(trial / 2) % 4],
            };
            s.check().unwrap();
            let mut seen = Seen::new(&prompt);
            generated.iter().for_each(|&t| seen.push(t));
            let got = s.distribution(&logits, &seen);
            let want = reference(&logits, &prompt, &generated, &s);
            let kept = |d: &[f64]| d.iter().map(|&q| q > 0.0).collect::<Vec<_>>();
            let got64: Vec<f64> = got.iter().map(|&q| q as f64).collect();
            assert_eq!(
                kept(&got64),
                kept(&want),
                "trial {trial}: {s:?}\n{got:?}\n{want:?}"
            );
            for (g, w) in got64.iter().zip(&want) {
                assert!(
                    (g - w).abs() < 1e-5,
                    "trial {trial}: {s:?}\n{got:?}\n{want:?}"
                );
            }
            // Greedy picks the most likely token after the penalties.
            let greedy = SamplingParams {
                temperature: 0.0,
                ..s
            };
            let best = (0..v)
                .max_by(|&a, &b| want[a].total_cmp(&want[b]).then(b.cmp(&a)))
                .unwrap();
            assert_eq!(
                greedy.pick(&logits, &seen, &mut rng),
                best as u32,
                "trial {trial}: {s:?}"
            );
        }
    }

    /// The prompt counts for the repetition penalty, not for presence and frequency.
    #[test]
    fn only_the_repetition_penalty_counts_the_prompt() {
        let logits = [2.0, 2.0, 2.0, -2.0];
        let mut seen = Seen::new(&[0, 3]);
        seen.push(1);
        seen.push(1);
        let penalised = |s: SamplingParams| s.penalised(&logits, &seen).into_owned();
        let repetition = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        assert_eq!(penalised(repetition), [1.0, 1.0, 2.0, -4.0]);
        let presence = SamplingParams {
            presence_penalty: 0.5,
            ..SamplingParams::default()
        };
        assert_eq!(penalised(presence), [2.0, 1.5, 2.0, -2.0]);
        let frequency = SamplingParams {
            frequency_penalty: 0.5,
            ..SamplingParams::default()
        };
        assert_eq!(penalised(frequency), [2.0, 1.0, 2.0, -2.0]);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let refused = |s: SamplingParams| s.check().unwrap_err().param;
        let d = SamplingParams::default();
        assert_eq!(
            refused(SamplingParams {
                temperature: -0.1,
                ..d
            }),
            "temperature"
        );
        assert_eq!(
            refused(SamplingParams {
                top_k: Some(0),
                ..d
            }),
            "top_k"
        );
        assert_eq!(
            refused(SamplingParams {
                top_p: Some(0.0),
                ..d
            }),
            "top_p"
        );
        assert_eq!(
            refused(SamplingParams {
                min_p: Some(1.5),
                ..d
            }),
            "min_p"
        );
        assert_eq!(
            refused(SamplingParams {
                presence_penalty: 2.5,
                ..d
            }),
            "presence_penalty"
        );
        assert_eq!(
            refused(SamplingParams {
                frequency_penalty: -3.0,
                ..d
            }),
            "frequency_penalty"
        );
        assert_eq!(
            refused(SamplingParams {
                repetition_penalty: 0.0,
                ..d
            }),
            "repetition_penalty"
        );
        assert!(d.check().is_ok());
    }
}
