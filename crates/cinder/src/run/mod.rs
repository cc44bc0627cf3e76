//! A training run: starting or resuming it ([`start`]; with a time budget, its shape and
//! schedule chosen by [`plan`]; its folder and lock are storage's,
//! [`crate::storage::run_folder`]), the loop ([`trainer`]) with its optimizer, schedule,
//! evaluation and the thread pool they run in ([`pool`]), what it reports as it goes
//! ([`report`]), and the observers of that (metrics file, samples file, progress, loss plot).

pub mod eval;
pub mod metrics;
pub mod optim;
pub mod plan;
pub mod plot;
pub mod pool;
pub mod progress;
pub mod report;
pub mod samples;
pub mod schedule;
pub mod start;
pub mod trainer;
