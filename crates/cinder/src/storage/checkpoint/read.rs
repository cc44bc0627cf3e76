//! Reading a checkpoint, checked against its recorded sizes and checksums, while a trainer may
//! be writing it.

use std::fs::{self};
use std::path::{Path, PathBuf};

use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use burn::store::ModuleRecord;
use burn::tensor::Bytes;
use cinder_data::Tokenizer;
use cinder_data::tokenizer::TOKENIZER_JSON;
use cinder_model::{Gpt, GptConfig};

use crate::storage::hf;
use crate::storage::names::{META, MODEL, OPTIMIZER};

use super::*;

/// A checkpoint read by [`load`].
pub struct Loaded {
    /// The checkpoint folder read (inside the run folder given, or that folder itself).
    pub dir: PathBuf,
    pub meta: Meta,
    pub tokenizer: Tokenizer,
    pub model: Gpt,
}

/// Resolves `path` as [`resolve`] does and loads its metadata and model, for the commands that
/// read a run (`generate`, `evaluate`, `inspect`) while a trainer may be writing it. A read that
/// meets a checkpoint mid-swap is tried again ([`with_retries`]).
pub fn load(path: &Path, prefer: &[&str], device: &Device) -> Result<Loaded, CheckpointError> {
    with_retries(|| {
        let dir = resolve(path, prefer)?;
        let meta = load_meta(&dir)?;
        let tokenizer = load_tokenizer(&dir, &meta)?;
        let model = load_model(&dir, &meta, device)?;
        Ok(Loaded {
            dir,
            meta,
            tokenizer,
            model,
        })
    })
}

/// Runs `read` until it succeeds or fails in a way a concurrent swap cannot explain, at most
/// 5 times over about half a second. A swap can rename a file away between two reads, or put a
/// file of the new checkpoint beside the old one's metadata.
pub(super) fn with_retries<T>(
    mut read: impl FnMut() -> Result<T, CheckpointError>,
) -> Result<T, CheckpointError> {
    const ATTEMPTS: u32 = 5;
    let mut attempt = 1;
    loop {
        match read() {
            Err(e) if attempt < ATTEMPTS && e.may_be_a_swap() => {
                std::thread::sleep(std::time::Duration::from_millis(15 << attempt));
                attempt += 1;
            }
            other => return other,
        }
    }
}

impl CheckpointError {
    /// Whether a writer swapping checkpoints at the same moment can explain this error.
    fn may_be_a_swap(&self) -> bool {
        matches!(
            self,
            CheckpointError::NotACheckpoint(_)
                | CheckpointError::MissingFile(_)
                | CheckpointError::Read { .. }
                | CheckpointError::Corrupt { .. }
        )
    }
}

/// Reads and checks `meta.json` of the checkpoint folder `dir`.
pub fn load_meta(dir: &Path) -> Result<Meta, CheckpointError> {
    if is_hugging_face(dir) {
        let (config, tokenizer) = hf::read_config(dir)?;
        return Ok(Meta::new(&config, &tokenizer, "huggingface", 0));
    }
    let path = dir.join(META);
    let bytes = read(&path)?;
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.clone(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not valid JSON ({e})")))?;
    let version = value
        .get("format_version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| corrupt("it has no format_version".into()))?;
    if version > u64::from(FORMAT_VERSION) {
        return Err(CheckpointError::NewerFormat {
            path: dir.to_path_buf(),
            found: version as u32,
        });
    }
    serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))
}

/// The tokenizer of the checkpoint `dir` (reading its `tokenizer.json`, checked, for BPE).
pub fn load_tokenizer(dir: &Path, meta: &Meta) -> Result<Tokenizer, CheckpointError> {
    if is_hugging_face(dir) {
        // Its meta (from `hf::read_config`) names its tokenizer.json, which has no checksum.
        return meta
            .vocab
            .load_from(dir)
            .map_err(|reason| CheckpointError::Corrupt {
                path: dir.join(TOKENIZER_JSON),
                reason,
            });
    }
    let json =
        match meta.vocab.file() {
            Some(name) => Some(String::from_utf8(read_checked(dir, meta, name)?).map_err(
                |_| CheckpointError::Corrupt {
                    path: dir.join(name),
                    reason: "it is not UTF-8".into(),
                },
            )?),
            None => None,
        };
    meta.vocab
        .load(json.as_deref())
        .map_err(|reason| CheckpointError::Corrupt {
            path: dir.join(meta.vocab.file().unwrap_or(META)),
            reason,
        })
}

/// Loads the weights of the checkpoint `dir` into a model of the checkpoint's architecture.
pub fn load_model(dir: &Path, meta: &Meta, device: &Device) -> Result<Gpt, CheckpointError> {
    load_weights(
        dir,
        meta,
        &meta.config.model(meta.vocab.vocab_size()),
        device,
    )
}

/// Loads the weights of the checkpoint `dir` into a model made from `config`, which has the
/// checkpoint's architecture but may differ in what holds no weights (dropout, for fine-tuning).
pub fn load_weights(
    dir: &Path,
    meta: &Meta,
    config: &GptConfig,
    device: &Device,
) -> Result<Gpt, CheckpointError> {
    if is_hugging_face(dir) {
        return Ok(hf::load_weights(dir, config, device)?);
    }
    let path = dir.join(MODEL);
    let bytes = read_checked(dir, meta, MODEL)?;
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.clone(),
        reason,
    };
    let model = config
        .init(device)
        .map_err(|e| corrupt(format!("its configuration is invalid: {e}")))?;
    let record = ModuleRecord::from_bytes(Bytes::from_bytes_vec(bytes))
        .map_err(|e| corrupt(e.to_string()))?;
    model
        .try_load_record(record)
        .map_err(|e| corrupt(e.to_string()))
}

/// Loads the optimizer state of the checkpoint `dir` into `optim`.
pub fn load_optimizer(
    dir: &Path,
    meta: &Meta,
    optim: ModuleOptimizer,
) -> Result<ModuleOptimizer, CheckpointError> {
    if is_hugging_face(dir) {
        return Err(CheckpointError::NoTrainingState(dir.to_path_buf()));
    }
    let bytes = read_checked(dir, meta, OPTIMIZER)?;
    optim
        .from_bytes(Bytes::from_bytes_vec(bytes))
        .map_err(|e| CheckpointError::Corrupt {
            path: dir.join(OPTIMIZER),
            reason: e.to_string(),
        })
}

/// The contents of `name`, checked against the size and CRC-32 recorded in `meta`.
pub(super) fn read_checked(
    dir: &Path,
    meta: &Meta,
    name: &str,
) -> Result<Vec<u8>, CheckpointError> {
    let path = dir.join(name);
    let Some(sum) = meta.files.iter().find(|f| f.name == name) else {
        return Err(CheckpointError::MissingFile(path));
    };
    let bytes = read(&path)?;
    let reason = if bytes.len() as u64 != sum.bytes {
        format!(
            "it has {} bytes, {} expected (truncated?)",
            bytes.len(),
            sum.bytes
        )
    } else if crc32fast::hash(&bytes) != sum.crc32 {
        "its checksum does not match (the file was changed or corrupted)".into()
    } else {
        return Ok(bytes);
    };
    Err(CheckpointError::Corrupt { path, reason })
}

fn read(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => CheckpointError::MissingFile(path.to_path_buf()),
        _ => CheckpointError::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}
