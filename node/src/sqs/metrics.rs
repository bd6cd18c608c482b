//! Counters of what the SQS endpoint answered differently from what the core decided: today one,
//! the deletes with a superseded receipt handle that it answers with success (as SQS does) while
//! the core deleted nothing. An operator reads them to see how often consumers hold stale
//! handles. This module only counts; it never decides an answer.

use std::sync::atomic::{AtomicU64, Ordering};

/// The SQS endpoint's counters. Shared by every request of one endpoint; cheap to read.
#[derive(Debug, Default)]
pub struct SqsMetrics {
    superseded_deletes: AtomicU64,
}

impl SqsMetrics {
    /// Deletes (single or batch entries) answered with success although a later receive had
    /// superseded their receipt handle, so nothing was deleted.
    #[must_use]
    pub fn superseded_deletes(&self) -> u64 {
        self.superseded_deletes.load(Ordering::Relaxed)
    }

    pub(super) fn count_superseded_delete(&self) {
        self.superseded_deletes.fetch_add(1, Ordering::Relaxed);
    }
}
