//! What cinder keeps on disk: the names of a run's files, the run folder and its lock,
//! checkpoints and their crash-safe writes, the run's record files (rewritten on resume) and
//! its samples file, and Hugging Face folders (GPT-2, NanoChat).

pub mod checkpoint;
pub mod hf;
pub mod names;
pub mod records;
pub mod run_folder;
pub mod samples;
