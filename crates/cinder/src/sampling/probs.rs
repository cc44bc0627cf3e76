//! What the model thought at a token: the log-probability it gave the token and its most likely
//! alternatives, as OpenAI's `logprobs` report them, and how a token is written out. These are
//! the model's own distribution over the tokenizer's tokens (a vocabulary padded beyond them
//! cut first), before temperature, top-k, top-p, min-p and penalties.

use cinder_data::Tokenizer;

/// Token `id` as text: its bytes when they are whole UTF-8, else OpenAI's `bytes:\xNN` form
/// (a byte-level BPE token may hold part of a character).
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    let bytes = tokenizer.token_bytes(id);
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let hex: String = e.as_bytes().iter().map(|b| format!("\\x{b:02x}")).collect();
            format!("bytes:{hex}")
        }
    }
}

/// A token's log-probability, and the most likely tokens with theirs.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenProbs {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens, most likely first (ties: the lower id first).
    pub top: Vec<(u32, f32)>,
}

/// `log_softmax(logits)` at `token`, and its `top` most likely tokens: `logits` are one
/// position's, over the tokenizer's tokens. The normaliser is summed in f64.
pub fn token_probs(logits: &[f32], token: u32, top: usize) -> TokenProbs {
    let norm = log_normaliser(logits);
    let logprob = |t: u32| (logits[t as usize] as f64 - norm) as f32;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let top = top.min(order.len());
    if top > 0 && top < order.len() {
        order.select_nth_unstable_by(top - 1, by_logit);
    }
    order.truncate(top);
    order.sort_by(by_logit);
    TokenProbs {
        token,
        logprob: logprob(token),
        top: order.into_iter().map(|t| (t, logprob(t))).collect(),
    }
}

/// `log(sum(exp(logits)))`, in f64.
pub fn log_normaliser(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probabilities_are_a_log_softmax_and_the_top_its_largest() {
        let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let sum: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let p = token_probs(&logits, 4, 3);
        assert!((p.logprob as f64 - (0.5 - sum.ln())).abs() < 1e-6, "{p:?}");
        let ids: Vec<u32> = p.top.iter().map(|&(t, _)| t).collect();
        assert_eq!(ids, [1, 3, 0]); // a tie, the lower id first
        for (t, lp) in p.top {
            assert!((lp as f64 - (logits[t as usize] as f64 - sum.ln())).abs() < 1e-6);
        }
        assert!(token_probs(&logits, 0, 0).top.is_empty());
        assert_eq!(token_probs(&logits, 0, 9).top.len(), 5);
    }
}
