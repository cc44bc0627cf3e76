//! `model.safetensors`: tensors by name, read as F32 with their shapes checked, and written as
//! F32 with the metadata Hugging Face's loaders need.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use super::error::HfError;
use super::files::{CONFIG, HEAD};

/// A tensor to write: its name, its shape and its values, row-major.
pub(super) type Named = (String, Vec<usize>, Vec<f32>);

/// The bytes of the weights file `path`.
pub(super) fn read(path: &Path) -> Result<Vec<u8>, HfError> {
    fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => HfError::Missing(path.to_path_buf()),
        _ => HfError::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// A weights file's tensors, read by their names without the transformer's prefix (which a
/// file may carry or not), remembering which were read.
pub(super) struct Reader<'a> {
    file: SafeTensors<'a>,
    path: PathBuf,
    prefix: &'static str,
    read: RefCell<Vec<String>>,
}

impl<'a> Reader<'a> {
    /// The tensors of `bytes`, read from `path`; names of the transformer's module start with
    /// `prefix` or not (the untied head, [`HEAD`], never has it).
    pub(super) fn new(
        bytes: &'a [u8],
        path: &Path,
        prefix: &'static str,
    ) -> Result<Reader<'a>, HfError> {
        let file = SafeTensors::deserialize(bytes).map_err(|e| HfError::Damaged {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let prefix = if file
            .names()
            .iter()
            .any(|n| *n != HEAD && n.starts_with(prefix))
        {
            prefix
        } else {
            ""
        };
        Ok(Reader {
            file,
            path: path.to_path_buf(),
            prefix,
            read: RefCell::new(Vec::new()),
        })
    }

    /// An error about the tensor `name`.
    pub(super) fn error(&self, name: &str, problem: String) -> HfError {
        HfError::Tensor {
            path: self.path.clone(),
            name: name.to_string(),
            problem,
        }
    }

    /// The values of the tensor `name` (without the prefix), which must have `shape`.
    pub(super) fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, HfError> {
        let full = if name == HEAD {
            name.to_string()
        } else {
            format!("{}{name}", self.prefix)
        };
        let view = self
            .file
            .tensor(&full)
            .map_err(|_| self.error(&full, "is missing".into()))?;
        if view.shape() != shape {
            let problem = format!(
                "has shape {:?}, but {CONFIG} makes it {shape:?}",
                view.shape()
            );
            return Err(self.error(&full, problem));
        }
        let values = floats(view.dtype(), view.data()).map_err(|p| self.error(&full, p))?;
        self.read.borrow_mut().push(full);
        Ok(values)
    }

    /// Refuses a tensor that was not read and that `ignored` (given the name without the
    /// prefix) does not allow: the file holds another kind of model.
    pub(super) fn finish(&self, ignored: impl Fn(&str) -> bool, kind: &str) -> Result<(), HfError> {
        let read = self.read.borrow();
        let mut names = self.file.names();
        names.sort();
        match names
            .into_iter()
            .find(|n| !read.iter().any(|r| r == *n) && !ignored(n.trim_start_matches(self.prefix)))
        {
            Some(extra) => {
                let problem =
                    format!("is not a parameter of {kind}: this is another kind of model");
                Err(self.error(extra, problem))
            }
            None => Ok(()),
        }
    }
}

/// Little-endian `dtype` values as f32.
fn floats(dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, String> {
    fn each<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f32) -> Vec<f32> {
        bytes
            .chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks of N")))
            .collect()
    }
    Ok(match dtype {
        Dtype::F32 => each(bytes, f32::from_le_bytes),
        Dtype::F16 => each(bytes, |b| half::f16::from_le_bytes(b).to_f32()),
        Dtype::BF16 => each(bytes, |b| half::bf16::from_le_bytes(b).to_f32()),
        Dtype::F64 => each(bytes, |b| f64::from_le_bytes(b) as f32),
        other => {
            return Err(format!(
                "has type {other:?}; cinder reads F32, F16, BF16 and F64"
            ));
        }
    })
}

/// `tensors` as an F32 safetensors file that Hugging Face's loaders take.
pub(super) fn serialize(tensors: Vec<Named>) -> Result<Vec<u8>, String> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, shape, values)| {
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(name, shape, bytes)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), bytes)
                .expect("shape and bytes agree");
            (name.clone(), view)
        })
        .collect::<Vec<_>>();
    // Hugging Face's loaders refuse a safetensors file without its framework.
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())
}
