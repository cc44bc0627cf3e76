//! What the queue's sending end and the worker share: the counters the server reads (how busy
//! the worker is, how many rows its forward passes decode), and who holds a queued request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

/// Counters the web server reads: how busy the worker is, and whether the server is stopping.
#[derive(Debug, Default)]
pub struct Load {
    /// Requests submitted and not yet done (those generating included).
    pub(super) pending: AtomicUsize,
    /// Requests generating now.
    active: AtomicUsize,
    /// Their rows (choices), of the batch's `max_rows`.
    pub(super) rows: AtomicUsize,
    /// Forward passes the worker has made.
    passes: AtomicU64,
    /// Rows those passes decoded: a pass over k rows adds k.
    decoded: AtomicU64,
    /// The most rows one pass decoded.
    widest: AtomicUsize,
    pub stopping: AtomicBool,
}

/// The worker's forward passes so far. Requests decoded together share passes, so that rows
/// over passes is above 1; requests taking turns would make it 1, whatever they are.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Passes {
    pub passes: u64,
    /// Rows decoded by those passes.
    pub rows: u64,
    /// The most rows one pass decoded.
    pub widest: usize,
}

impl Load {
    /// Requests generating now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Requests waiting for the worker.
    pub fn queued(&self) -> usize {
        self.pending
            .load(Ordering::SeqCst)
            .saturating_sub(self.active())
    }

    /// The forward passes so far. A pass's rows are counted before the pass, so that what is
    /// read never shows a pass without its rows.
    pub fn passes(&self) -> Passes {
        let passes = self.passes.load(Ordering::SeqCst);
        Passes {
            passes,
            rows: self.decoded.load(Ordering::SeqCst),
            widest: self.widest.load(Ordering::SeqCst),
        }
    }

    /// A forward pass decoded `rows` rows.
    pub(super) fn pass(&self, rows: usize) {
        self.decoded.fetch_add(rows as u64, Ordering::SeqCst);
        self.widest.fetch_max(rows, Ordering::SeqCst);
        self.passes.fetch_add(1, Ordering::SeqCst);
    }

    /// A request of `rows` rows starts generating.
    pub(super) fn start(&self, rows: usize) {
        self.rows.fetch_add(rows, Ordering::SeqCst);
        self.active.fetch_add(1, Ordering::SeqCst);
    }

    /// A request is over: its place (and its `rows` rows, if it had started) is free before
    /// its client hears so.
    pub(super) fn done(&self, started: Option<usize>) {
        if let Some(rows) = started {
            self.rows.fetch_sub(rows, Ordering::SeqCst);
            self.active.fetch_sub(1, Ordering::SeqCst);
        }
        self.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Who has a queued request: still its client, the worker (which took it), or nobody (its
/// client left while it waited: its place was freed then).
#[derive(Debug, Default)]
pub struct Claim(AtomicU8);

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const DROPPED: u8 = 2;

impl Claim {
    /// The worker takes the request, unless its client left.
    pub(super) fn take(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, TAKEN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// A client's place in the queue, held while its request waits: dropped before the worker takes
/// the request (the client left, or its time ran out), it frees the place at once.
pub struct Place {
    claim: Arc<Claim>,
    load: Arc<Load>,
}

impl Place {
    /// The place of a request just queued under `claim`.
    pub(super) fn new(claim: Arc<Claim>, load: Arc<Load>) -> Self {
        Self { claim, load }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let given_up =
            self.claim
                .0
                .compare_exchange(QUEUED, DROPPED, Ordering::SeqCst, Ordering::SeqCst);
        if given_up.is_ok() {
            self.load.done(None);
        }
    }
}
