//! Loading a corpus for training, and turning batches into tensors.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use cinder_data::{
    Batch, CharTokenizer, Corpus, CorpusError, SplitError, Splits, TextIdentity, TokenizerError,
};

/// Why a text could not be prepared for training.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Split(#[from] SplitError),
    #[error("{path} does not fit the checkpoint's vocabulary: {source}")]
    Vocabulary {
        source: TokenizerError,
        path: String,
    },
}

/// A corpus ready for training: its vocabulary and its token ids cut into two splits.
pub struct TrainingData {
    /// The text file, as given.
    pub path: PathBuf,
    pub tokenizer: CharTokenizer,
    pub splits: Splits,
    /// The text file's size and checksum, recorded in checkpoints.
    pub identity: TextIdentity,
}

impl TrainingData {
    /// Reads `path`. The vocabulary is built from the text unless `vocab` is given (a resumed
    /// run keeps its checkpoint's); the text is then encoded once, straight from the mapped file.
    pub fn load(
        path: &Path,
        vocab: Option<CharTokenizer>,
        train_fraction: f64,
        block_size: usize,
    ) -> Result<Self, DataError> {
        let corpus = Corpus::open(path)?;
        let tokenizer = match vocab {
            Some(vocab) => vocab,
            None => CharTokenizer::from_chars(corpus.chars()?),
        };
        // One copy of the ids, sized exactly: counting is cheaper than a vector's regrowth.
        let mut ids = Vec::with_capacity(corpus.chars()?.count());
        tokenizer
            .encode_into(corpus.chars()?, &mut ids)
            .map_err(|source| DataError::Vocabulary {
                source,
                path: path.display().to_string(),
            })?;
        let splits = Splits::new(ids, train_fraction, block_size)?;
        Ok(Self {
            path: path.to_path_buf(),
            tokenizer,
            splits,
            identity: corpus.identity(),
        })
    }
}

/// Token ids `[B, T]` as an integer tensor on `device`.
pub fn ids_tensor(ids: &[u32], shape: [usize; 2], device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// Inputs and targets of a batch, `[B, T]` each.
pub fn batch_tensors(batch: &Batch, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let shape = [batch.batch_size, batch.block_size];
    (
        ids_tensor(&batch.inputs, shape, device),
        ids_tensor(&batch.targets, shape, device),
    )
}
