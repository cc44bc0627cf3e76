//! A training run: starting or resuming it ([`start`]), its folder and lock ([`folder`]), the
//! loop ([`trainer`]) with its optimizer, schedule and evaluation, and what it reports as it
//! goes (metrics file, samples, progress, loss plot).

pub mod eval;
pub mod folder;
pub mod metrics;
pub mod optim;
pub mod plot;
pub mod progress;
pub mod samples;
pub mod schedule;
pub mod start;
pub mod trainer;
