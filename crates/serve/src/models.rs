//! The models a server offers: every run folder under `--runs` and every checkpoint named, each
//! with an id; loaded on first use, at most `--max-loaded` at a time (the least recently used is
//! unloaded first: a GPT-2 774M is 3 GB).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use burn::prelude::Device;
use cinder::storage::checkpoint;
use cinder::storage::names::{BEST, LATEST, META};
use cinder_data::Tokenizer;
use cinder_model::{Gpt, Ops};

use crate::api::ApiError;

/// How deep under `--runs` run folders are looked for.
const MAX_DEPTH: usize = 4;

/// Finding the models failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} holds no checkpoint (meta.json), run folder (best/ or latest/) or GPT-2 folder")]
    NotACheckpoint(PathBuf),
    #[error(
        "two models would have the id {id:?}: {first} and {second}; name a folder of another \
         name, or serve them apart"
    )]
    SameId {
        id: String,
        first: PathBuf,
        second: PathBuf,
    },
}

/// Where each model id's checkpoint is (a run folder, read at its best/, else latest/).
pub fn discover(
    runs: &Path,
    runs_required: bool,
    named: &[PathBuf],
) -> Result<BTreeMap<String, PathBuf>, ModelsError> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    if runs.is_dir() {
        walk(runs, runs, 0, &mut found)?;
    } else if runs_required {
        return Err(ModelsError::Read {
            path: runs.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such folder"),
        });
    }
    for path in named {
        checkpoint::resolve(path, &[BEST, LATEST])
            .map_err(|_| ModelsError::NotACheckpoint(path.clone()))?;
        let name = std::fs::canonicalize(path)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| path.display().to_string());
        found.push((name, path.clone()));
    }
    let mut ids: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (id, path) in found {
        if let Some(first) = ids.get(&id) {
            return Err(ModelsError::SameId {
                first: first.clone(),
                id,
                second: path,
            });
        }
        ids.insert(id, path);
    }
    Ok(ids)
}

/// Adds the run folders at or under `dir` (not looking inside a run folder).
fn walk(
    root: &Path,
    dir: &Path,
    depth: usize,
    found: &mut Vec<(String, PathBuf)>,
) -> Result<(), ModelsError> {
    if [BEST, LATEST]
        .iter()
        .any(|name| dir.join(name).join(META).is_file())
    {
        let id = dir.strip_prefix(root).unwrap_or(dir);
        let id = if id.as_os_str().is_empty() {
            // --runs is itself a run folder.
            dir.file_name()
                .map_or(".".into(), |n| n.to_string_lossy().into())
        } else {
            id.components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/")
        };
        found.push((id, dir.to_path_buf()));
        return Ok(());
    }
    if depth == MAX_DEPTH {
        return Ok(());
    }
    let read = |source| ModelsError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    entries.sort();
    for entry in entries {
        walk(root, &entry, depth + 1, found)?;
    }
    Ok(())
}

/// A model in memory.
pub struct Loaded {
    pub gpt: Gpt,
    pub tokenizer: Tokenizer,
    pub device: Device,
}

/// The models on offer, and those loaded, most recently used last.
pub struct Models {
    paths: BTreeMap<String, PathBuf>,
    loaded: Vec<(String, Loaded)>,
    max_loaded: usize,
    device: Device,
    ops: Ops,
    /// The ids loaded now, for `/health`.
    pub loaded_ids: Arc<Mutex<Vec<String>>>,
}

impl Models {
    pub fn new(
        paths: BTreeMap<String, PathBuf>,
        max_loaded: usize,
        device: Device,
        ops: Ops,
    ) -> Self {
        Self {
            paths,
            loaded: Vec::new(),
            max_loaded: max_loaded.max(1),
            device,
            ops,
            loaded_ids: Arc::default(),
        }
    }

    /// The model `id`, loaded now if it is not yet (unloading the least recently used one when
    /// `max_loaded` are).
    pub fn get(&mut self, id: &str) -> Result<&Loaded, ApiError> {
        if let Some(at) = self.loaded.iter().position(|(i, _)| i == id) {
            let entry = self.loaded.remove(at);
            self.loaded.push(entry);
        } else {
            let path = self.paths.get(id).ok_or_else(|| ApiError::no_model(id))?;
            // Room first: at most `max_loaded` models are ever in memory.
            if self.loaded.len() == self.max_loaded {
                self.loaded.remove(0);
            }
            let loaded = checkpoint::load(path, &[BEST, LATEST], &self.device).map_err(|e| {
                eprintln!("cannot load model {id} from {}: {e}", path.display());
                ApiError::server(format!("model {id} cannot be loaded: see the server's log"))
            })?;
            self.loaded.push((
                id.to_string(),
                Loaded {
                    gpt: loaded.model.with_ops(self.ops),
                    tokenizer: loaded.tokenizer,
                    device: self.device.clone(),
                },
            ));
        }
        *self.loaded_ids.lock().unwrap_or_else(|e| e.into_inner()) =
            self.loaded.iter().map(|(i, _)| i.clone()).collect();
        Ok(&self.loaded.last().expect("just pushed").1)
    }
}
