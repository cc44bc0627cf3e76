//! The models a server offers: every run folder under `--runs` and every checkpoint named, each
//! with an id; loaded on first use, at most `--max-loaded` at a time (the least recently used is
//! unloaded first: a GPT-2 774M is 3 GB).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use burn::prelude::Device;
use cinder::storage::checkpoint;
use cinder::storage::names::{META, READ};
use cinder_data::Tokenizer;
use cinder_model::{Gpt, KvCache, Ops};

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
    #[error(
        "{0} holds no checkpoint (meta.json), run folder (best/ or latest/) or Hugging Face folder"
    )]
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

/// A model that cannot be served. Each message is written for the client that asked for it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// No model has this id.
    #[error("there is no model {0:?} here: GET /v1/models lists them")]
    NotFound(String),
    /// Its checkpoint does not load: why is logged, as it names the server's files.
    #[error("model {0} cannot be loaded: see the server's log")]
    Unloadable(String),
}

/// Where each model id's folder is (a run folder, read at its best/, else latest/).
fn discover(
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
        checkpoint::resolve(path, &READ).map_err(|_| ModelsError::NotACheckpoint(path.clone()))?;
        let name = std::fs::canonicalize(path)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| path.display().to_string());
        found.push((name, path.clone()));
    }
    let mut ids: BTreeMap<String, PathBuf> = BTreeMap::new();
    let same = |a: &Path, b: &Path| {
        a == b
            || std::fs::canonicalize(a)
                .is_ok_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
    };
    for (id, path) in found {
        if let Some(first) = ids.get(&id) {
            if same(first, &path) {
                continue; // one folder, found under --runs and named too: served once
            }
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

/// Adds the run folders at or under `dir` (not looking inside a run folder): folders whose
/// `best/` or `latest/` holds a checkpoint or a Hugging Face folder (as `continue_in_pytorch.py`
/// writes), and Hugging Face folders themselves.
fn walk(
    root: &Path,
    dir: &Path,
    depth: usize,
    found: &mut Vec<(String, PathBuf)>,
) -> Result<(), ModelsError> {
    let holds = |d: &Path| d.join(META).is_file() || checkpoint::is_hugging_face(d);
    if checkpoint::is_hugging_face(dir) || READ.iter().any(|name| holds(&dir.join(name))) {
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
    // Folders only, never through a link: what is served is what lies under --runs.
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    entries.sort();
    for entry in entries {
        walk(root, &entry, depth + 1, found)?;
    }
    Ok(())
}

/// The models on offer: found at start, and again when a list is asked for or an id is not
/// known (runs created after the server started). A folder that `--runs` lost is kept until the
/// next successful look.
pub struct Catalog {
    runs: PathBuf,
    named: Vec<PathBuf>,
    ids: RwLock<BTreeMap<String, PathBuf>>,
    /// When the folders were last looked at: for unknown ids, at most every [`REFRESH`], however
    /// many requests name them.
    looked: Mutex<Instant>,
}

/// The shortest time between two looks for new runs.
const REFRESH: Duration = Duration::from_millis(100);

impl Catalog {
    /// The models under `runs` (which must exist when `runs_required`) and those `named`;
    /// refused when two would share an id.
    pub fn discover(
        runs: &Path,
        runs_required: bool,
        named: &[PathBuf],
    ) -> Result<Self, ModelsError> {
        let ids = discover(runs, runs_required, named)?;
        Ok(Self {
            runs: runs.to_path_buf(),
            named: named.to_vec(),
            ids: RwLock::new(ids),
            looked: Mutex::new(Instant::now()),
        })
    }

    /// Looks again, keeping what was found before if the folders cannot be read now (the lists
    /// of models, `/v1/models` and the page's, look each time).
    pub fn refresh(&self) {
        *self.looked.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        match discover(&self.runs, false, &self.named) {
            Ok(ids) => *self.ids.write().unwrap_or_else(|e| e.into_inner()) = ids,
            Err(e) => eprintln!("the models were not looked for again: {e}"),
        }
    }

    /// Every id and its folder.
    pub fn all(&self) -> BTreeMap<String, PathBuf> {
        self.ids.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The folder of model `id`, looking again if it is not known (and it did not look within
    /// [`REFRESH`]).
    pub fn path(&self, id: &str) -> Option<PathBuf> {
        let known = || {
            let ids = self.ids.read().unwrap_or_else(|e| e.into_inner());
            ids.get(id).cloned()
        };
        known().or_else(|| {
            let recently = {
                let looked = self.looked.lock().unwrap_or_else(|e| e.into_inner());
                looked.elapsed() < REFRESH
            };
            if recently {
                return None;
            }
            self.refresh();
            known()
        })
    }

    /// The folder of model `id`.
    pub fn find(&self, id: &str) -> Result<PathBuf, ModelError> {
        self.path(id)
            .ok_or_else(|| ModelError::NotFound(id.to_string()))
    }
}

/// A model in memory.
pub struct Loaded {
    pub gpt: Gpt,
    pub tokenizer: Tokenizer,
    pub device: Device,
    /// Iterations of the checkpoint it was read from.
    pub iter: u64,
    /// The key/value cache of its last batch, kept for its buffers: they are made for
    /// `--max-batch` rows once per model loaded, not per batch.
    pub cache: Mutex<Option<KvCache>>,
    /// Which checkpoint that was, as seen before reading it (a swap while it was read costs one
    /// more read later, never a missed one): a newer one is loaded on the next request.
    stamp: Option<Stamp>,
}

/// The checkpoint folder a model id reads now, and when its metadata was written: a trainer
/// writing a new best/ (renamed into place) changes it.
#[derive(Debug, Clone, PartialEq)]
struct Stamp {
    dir: PathBuf,
    file: u64,
    modified: Option<std::time::SystemTime>,
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        let dir = checkpoint::resolve(path, &READ).ok()?;
        let written = if dir.join(META).is_file() {
            dir.join(META)
        } else {
            dir.clone() // a Hugging Face folder
        };
        Some(Self {
            file: crate::runs::file_id(&written),
            modified: std::fs::metadata(&written).and_then(|m| m.modified()).ok(),
            dir,
        })
    }
}

/// What `/health` shows of a loaded model.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadedInfo {
    pub id: String,
    pub iter: u64,
}

/// The models loaded, most recently used last; one is read again when its run writes a newer
/// checkpoint.
pub struct Models {
    catalog: Arc<Catalog>,
    loaded: Vec<(String, Arc<Loaded>)>,
    max_loaded: usize,
    device: Device,
    ops: Ops,
    /// The models loaded now, for `/health`.
    pub loaded_info: Arc<Mutex<Vec<LoadedInfo>>>,
}

impl Models {
    pub fn new(catalog: Arc<Catalog>, max_loaded: usize, device: Device, ops: Ops) -> Self {
        Self {
            catalog,
            loaded: Vec::new(),
            max_loaded: max_loaded.max(1),
            device,
            ops,
            loaded_info: Arc::default(),
        }
    }

    /// Whether `model`, loaded for `id`, is what `id`'s folder holds now.
    pub fn is_current(&self, id: &str, model: &Loaded) -> bool {
        self.catalog.path(id).is_some_and(|path| {
            let stamp = Stamp::of(&path);
            stamp.is_some() && stamp == model.stamp
        })
    }

    /// The model `id` as its folder holds it now: the one in memory, or read now if it is not
    /// loaded or its run has written a newer checkpoint since (unloading the least recently
    /// used model first when `max_loaded` are). A request that holds the older model finishes
    /// with it.
    pub fn get(&mut self, id: &str) -> Result<Arc<Loaded>, ModelError> {
        let path = self.catalog.find(id)?;
        let stamp = Stamp::of(&path);
        let at = self.loaded.iter().position(|(i, _)| i == id);
        let current = at.filter(|&at| stamp.is_some() && stamp == self.loaded[at].1.stamp);
        if let Some(at) = current {
            let entry = self.loaded.remove(at);
            self.loaded.push(entry);
        } else {
            if let Some(at) = at {
                self.loaded.remove(at); // an older checkpoint
            }
            // Room first: at most `max_loaded` models are ever in memory.
            if self.loaded.len() == self.max_loaded {
                self.loaded.remove(0);
            }
            self.show_loaded();
            let loaded = checkpoint::load(&path, &READ, &self.device).map_err(|e| {
                eprintln!("cannot load model {id} from {}: {e}", path.display());
                ModelError::Unloadable(id.to_string())
            })?;
            self.loaded.push((
                id.to_string(),
                Arc::new(Loaded {
                    gpt: loaded.model.with_ops(self.ops),
                    tokenizer: loaded.tokenizer,
                    device: self.device.clone(),
                    iter: loaded.meta.iter,
                    cache: Mutex::new(None),
                    stamp,
                }),
            ));
        }
        self.show_loaded();
        Ok(self.loaded.last().expect("just pushed").1.clone())
    }

    /// `/health`'s list of the models in memory.
    fn show_loaded(&self) {
        *self.loaded_info.lock().unwrap_or_else(|e| e.into_inner()) = self
            .loaded
            .iter()
            .map(|(id, m)| LoadedInfo {
                id: id.clone(),
                iter: m.iter,
            })
            .collect();
    }
}
