//! Whether this machine can hold a run at all: a lower bound on the memory a training step or
//! a sampling loop needs, against the memory the system has available, checked before anything
//! large is allocated. (A value out of all proportion, such as a batch of 10^11 windows, was
//! ended by the kernel's out-of-memory killer, or aborted the process, with no word of why.)

use crate::config::TrainConfig;

/// Bytes a training step of `config` holds at least, in f32: per layer, each position's input
/// to the layer, and its attention weights over the positions up to it, which the backward pass
/// reads. The step holds more (the weights, their gradients and moments, the MLP's activations),
/// so a run refused for this could never fit.
pub fn training_bytes(config: &TrainConfig) -> f64 {
    let (b, t) = (config.batch_size as f64, config.block_size as f64);
    let (c, h, l) = (
        config.n_embd as f64,
        config.n_head as f64,
        config.n_layer as f64,
    );
    4.0 * l * b * (t * c + h * t * (t + 1.0) / 2.0)
}

/// The memory a new allocation may take now: `MemAvailable` of `/proc/meminfo` (Linux); `None`
/// where the system does not say.
pub fn available() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

/// `what` needs more memory than this machine has available.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what} needs at least {} of memory, and this machine has {} available: {advice}",
    gib(*.needs),
    gib(*.available)
)]
pub struct TooLarge {
    pub what: String,
    pub needs: f64,
    pub available: f64,
    pub advice: &'static str,
}

fn gib(bytes: f64) -> String {
    if bytes >= 1e15 {
        format!("{:.1e} GiB", bytes / f64::from(1u32 << 30))
    } else {
        format!("{:.1} GiB", bytes / f64::from(1u32 << 30))
    }
}

/// Refuses `needs` bytes for `what` where this machine has less available (never where it does
/// not say how much it has).
pub fn check(what: String, needs: f64, advice: &'static str) -> Result<(), TooLarge> {
    match available() {
        Some(available) if needs > available => Err(TooLarge {
            what,
            needs,
            available,
            advice,
        }),
        _ => Ok(()),
    }
}

/// [`check`] of a training step of `config`, with `advice` on what to do.
pub fn check_training(config: &TrainConfig, advice: &'static str) -> Result<(), TooLarge> {
    check(
        format!(
            "a training step of batch_size {} x block_size {} ({} layers, {} wide, {} heads)",
            config.batch_size, config.block_size, config.n_layer, config.n_embd, config.n_head
        ),
        training_bytes(config),
        advice,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_needs_its_inputs_and_attention_weights_per_layer() {
        let config = TrainConfig {
            batch_size: 2,
            block_size: 3,
            n_embd: 4,
            n_head: 1,
            n_layer: 5,
            ..TrainConfig::default()
        };
        // Per layer and window: 3 positions x 4 floats, and 1 + 2 + 3 attention weights.
        assert_eq!(training_bytes(&config), 4.0 * 5.0 * 2.0 * (12.0 + 6.0));
        // The default run fits any machine that runs the tests; a batch of 10^11 none.
        assert!(check_training(&TrainConfig::default_run(), "lower --batch-size").is_ok());
        let huge = TrainConfig {
            batch_size: 100_000_000_000,
            ..TrainConfig::default_run()
        };
        if available().is_some() {
            let e = check_training(&huge, "lower --batch-size")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("lower --batch-size") && e.contains("available"),
                "{e}"
            );
        }
    }
}
