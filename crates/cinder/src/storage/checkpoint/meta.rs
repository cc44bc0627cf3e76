//! A checkpoint's `meta.json`: everything in it besides the tensors.

use std::path::PathBuf;

use cinder_data::tokenizer::TokenizerRecord;
use cinder_data::{TextIdentity, Tokenizer};
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;

/// The checkpoint layout this build writes; it reads this version and older ones.
/// Version 2 added `data_identity`; version 3 BPE tokenizers (`vocab` naming `tokenizer.json`)
/// and `data_paths`; version 4 the model options (`position`, `norm`, `qk_norm`,
/// `logit_softcap`, `tie_embeddings`, `zero_init`) and Muon's `head_lr`; version 5 `n_kv_head`
/// (grouped-query attention); version 6 `early_stop` and the validation trend (`val_trend`).
/// A field an older checkpoint lacks takes [`TrainConfig`]'s default, which is the behaviour
/// before it existed.
pub const FORMAT_VERSION: u32 = 6;

/// How validation has gone lately: what early stopping (`early_stop`) and the overfitting
/// warning count.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ValTrend {
    /// Evaluations since the one with the best validation loss (0: the last was the best).
    pub since_best: u64,
    /// Evaluations in a row whose validation loss rose over the one before.
    pub rises: u64,
    /// The last evaluation's validation loss.
    pub last: Option<f32>,
}

impl ValTrend {
    /// Counts an evaluation of validation loss `val`, a new best if `improved`.
    pub fn record(&mut self, val: f32, improved: bool) {
        self.since_best = if improved { 0 } else { self.since_best + 1 };
        self.rises = match self.last {
            Some(last) if val > last => self.rises + 1,
            _ => 0,
        };
        self.last = Some(val);
    }
}

/// Size and checksum of one file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSum {
    pub name: String,
    pub bytes: u64,
    pub crc32: u32,
}

/// Everything in a checkpoint besides the tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub format_version: u32,
    pub cinder_version: String,
    /// Backend the checkpoint was written with (`flex`, `ndarray`, `wgpu`).
    pub backend: String,
    /// Iterations completed: a resumed run continues with this iteration.
    pub iter: u64,
    /// Best validation loss seen so far, if any evaluation ran.
    pub best_val_loss: Option<f32>,
    /// Validation loss of this checkpoint's model at its iteration, if it was evaluated.
    pub val_loss: Option<f32>,
    /// How validation went up to this checkpoint: what early stopping counts, so that a resumed
    /// run stops where the uninterrupted one would (absent before version 6).
    #[serde(default)]
    pub val_trend: ValTrend,
    pub config: TrainConfig,
    /// The tokenizer: the characters inline, or a BPE in `tokenizer.json` beside.
    pub vocab: TokenizerRecord,
    /// The training text (the first, where there are several), as given to `train`.
    pub data_path: PathBuf,
    /// Every path of the training data (text files, folders, or a prepared folder); absent
    /// before version 3, where `data_path` is the one text.
    #[serde(default)]
    pub data_paths: Vec<PathBuf>,
    /// Size and checksum of the training text when the run read it (absent before version 2).
    #[serde(default)]
    pub data_identity: Option<TextIdentity>,
    pub files: Vec<FileSum>,
}

impl Meta {
    pub fn new(config: &TrainConfig, tokenizer: &Tokenizer, backend: &str, iter: u64) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            cinder_version: env!("CARGO_PKG_VERSION").into(),
            backend: backend.into(),
            iter,
            best_val_loss: None,
            val_loss: None,
            val_trend: ValTrend::default(),
            config: config.clone(),
            vocab: tokenizer.record(),
            data_path: PathBuf::new(),
            data_paths: Vec::new(),
            data_identity: None,
            files: Vec::new(),
        }
    }

    /// The training data's paths, as the run was given them.
    /// None for a Hugging Face folder.
    pub fn data_paths(&self) -> Vec<PathBuf> {
        if self.data_paths.is_empty() && self.data_path.as_os_str().is_empty() {
            Vec::new()
        } else if self.data_paths.is_empty() {
            vec![self.data_path.clone()]
        } else {
            self.data_paths.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trend_counts_evaluations_since_the_best_and_rises_in_a_row() {
        let mut t = ValTrend::default();
        let seen: Vec<(u64, u64)> = [(2.0, true), (1.8, true), (1.9, false), (1.95, false)]
            .into_iter()
            .chain([(1.85, false), (1.9, false), (1.92, false), (1.7, true)])
            .map(|(val, improved)| {
                t.record(val, improved);
                (t.since_best, t.rises)
            })
            .collect();
        assert_eq!(
            seen,
            [
                (0, 0),
                (0, 0),
                (1, 1),
                (2, 2),
                (3, 0),
                (4, 1),
                (5, 2),
                (0, 0)
            ]
        );
        assert_eq!(t.last, Some(1.7));
    }
}
