//! The learning-rate schedule: linear warm-up, then cosine decay to `min_lr` (nanoGPT's
//! `get_lr`) or a trapezoid (the peak held, then a linear cool-down to `min_lr`). A pure function
//! of the iteration, so a resumed run needs no scheduler state.

use crate::config::{LrSchedule, TrainConfig};

/// Learning rate for iteration `it` (counting from 0). Parameter groups with peaks of their own
/// (Muon's) scale it by their peak over `learning_rate`.
pub fn learning_rate(c: &TrainConfig, it: u64) -> f64 {
    if it < c.warmup_iters {
        return c.learning_rate * (it + 1) as f64 / (c.warmup_iters + 1) as f64;
    }
    if it >= c.lr_decay_iters {
        return c.min_lr;
    }
    match c.lr_schedule {
        LrSchedule::Cosine => {
            let ratio =
                (it - c.warmup_iters) as f64 / (c.lr_decay_iters - c.warmup_iters).max(1) as f64;
            let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos()); // 1 -> 0
            c.min_lr + coeff * (c.learning_rate - c.min_lr)
        }
        LrSchedule::Trapezoid => {
            // As torch_recipe.py: the peak times (iterations left) / (cool-down length) once the
            // cool-down starts, never below min_lr.
            let cooldown = (c.cooldown_fraction * c.lr_decay_iters as f64) as u64;
            let left = c.lr_decay_iters - it;
            if left > cooldown {
                c.learning_rate
            } else {
                (c.learning_rate * left as f64 / cooldown as f64).max(c.min_lr)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_min() {
        let c = TrainConfig::default(); // 1e-3 -> 1e-4, warm-up 100, decay to 2000
        assert!((learning_rate(&c, 0) - 1e-3 / 101.0).abs() < 1e-12);
        assert!((learning_rate(&c, 99) - 1e-3 * 100.0 / 101.0).abs() < 1e-12);
        assert!((learning_rate(&c, 100) - 1e-3).abs() < 1e-12);
        let mid = learning_rate(&c, 1050);
        assert!((mid - 5.5e-4).abs() < 1e-9, "{mid}");
        assert_eq!(learning_rate(&c, 2000), 1e-4);
        assert_eq!(learning_rate(&c, 5000), 1e-4);
        let lrs: Vec<f64> = (100..2000).map(|i| learning_rate(&c, i)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
    }

    #[test]
    fn trapezoid_holds_the_peak_then_cools_down_linearly() {
        let c = TrainConfig {
            lr_schedule: LrSchedule::Trapezoid,
            cooldown_fraction: 0.5,
            ..TrainConfig::default() // 1e-3 -> 1e-4, warm-up 100, decay to 2000
        };
        assert!((learning_rate(&c, 0) - 1e-3 / 101.0).abs() < 1e-12);
        for it in [100, 500, 1000] {
            assert_eq!(learning_rate(&c, it), 1e-3, "iteration {it}");
        }
        // 1,000 iterations of cool-down: at 1,500, half of them are left.
        assert!((learning_rate(&c, 1001) - 1e-3 * 999.0 / 1000.0).abs() < 1e-12);
        assert!((learning_rate(&c, 1500) - 5e-4).abs() < 1e-12);
        assert_eq!(learning_rate(&c, 1950), 1e-4, "never below min_lr");
        assert_eq!(learning_rate(&c, 2000), 1e-4);
        let lrs: Vec<f64> = (100..2000).map(|i| learning_rate(&c, i)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
    }
}
