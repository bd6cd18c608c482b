//! How long one model tick is in core time, and which model actions a given tick length can
//! translate faithfully.
//!
//! The model's constants are small whole numbers of ticks (`trireme_spec::queue_core`); the
//! core's are real limits (`trireme_core::limits`). Queue attributes (retention) can be set to
//! the model's value where the real range allows it, but three durations are fixed in the core
//! and one range is too narrow:
//!
//! | model | ticks | core | fits when a tick is |
//! |---|---|---|---|
//! | `WAITS` (long poll) | 2 | 0–20 s | ≤ 10 s |
//! | `RETENTION` (attribute) | 4 | 60 s – 14 d | ≥ 15 s |
//! | `DEDUP_WINDOW` | 2 | 300 s, fixed | 150 s |
//! | `VISIBILITY_TOTAL_MAX` | 3 | 43,200 s, fixed | 4 h |
//! | `DELAYS` | 1 | 0–900 s | ≤ 900 s |
//! | `PURGE_INTERVAL` | not modelled | 60 s, fixed | — |
//!
//! No single tick length fits all rows, so the conformance tests run at three scales, each
//! faithful to a different subset, and [`Scale::admits`] leaves out exactly the actions whose
//! outcome would differ only because a constant differs. The rules compare the model's
//! constant with the core's on the model's own path, never on the core's state, so a core that
//! departs from the page cannot make its own departure look inadmissible.

use trireme_core::{Millis, limits};
use trireme_spec::queue_core::{
    Action, DEDUP_WINDOW, MessageId as ModelMessageId, QueueId, RETENTION, Slot, State, Tick,
    VISIBILITY_TOTAL_MAX,
};

/// Core time of model tick 0: an arbitrary fixed instant (2027-01-15), so nothing depends on
/// time 0 of the Unix epoch.
pub const EPOCH: Millis = Millis(1_800_000_000_000);

/// One tick of model time in core milliseconds, and the name it is reported under.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Shown in failure messages and tallies.
    pub name: &'static str,
    /// Core milliseconds per model tick; a whole number of seconds, as every duration the
    /// core takes is in seconds.
    pub tick_ms: u64,
}

/// One tick is one second, as on the page. Faithful for long polls, delays and visibility;
/// retention (60 s minimum) never fires in the core, so time stops before it would fire in the
/// model; dedup entries live longer in the core (300 s) than in the model (2 s); the cap is
/// 43,200 s instead of 3 s; a queue can be purged once (60 s apart).
pub const SECONDS: Scale = Scale {
    name: "1 tick = 1 s",
    tick_ms: 1_000,
};

/// One tick is 150 s: the dedup window (300 s = 2 ticks) and retention (600 s = 4 ticks) are
/// the model's, and purges are never too close. Long polls (20 s at most) are left out, and so
/// are visibility changes that the model's 3-tick cap refuses and the core's 12 h cap accepts.
pub const DEDUP_WINDOWS: Scale = Scale {
    name: "1 tick = 150 s",
    tick_ms: 150_000,
};

/// One tick is 4 h: the visibility cap (43,200 s = 3 ticks) and retention (57,600 s = 4 ticks)
/// are the model's. Long polls and delays (900 s at most) are left out, and dedup sends after
/// the core's 300 s window closed where the model's window is still open.
pub const VISIBILITY_CAP: Scale = Scale {
    name: "1 tick = 4 h",
    tick_ms: 14_400_000,
};

impl Scale {
    /// Core time of model tick `tick`.
    pub fn at(&self, tick: Tick) -> Millis {
        EPOCH.plus_ms(u64::from(tick) * self.tick_ms)
    }

    /// A duration of `ticks` in core seconds.
    pub fn seconds(&self, ticks: Tick) -> u32 {
        assert_eq!(
            self.tick_ms % 1_000,
            0,
            "a tick is a whole number of seconds"
        );
        u32::try_from(u64::from(ticks) * self.tick_ms / 1_000).expect("model durations are short")
    }

    /// `MessageRetentionPeriod` of both core queues: the model's `RETENTION`, raised to the
    /// core's minimum where it is shorter.
    pub fn retention_s(&self) -> u32 {
        let retention_s = self.seconds(RETENTION).max(limits::retention_s_min);
        assert!(retention_s <= limits::retention_s_max);
        retention_s
    }

    /// Whether `action`, enabled in the model at `state`, has the same outcome in the model
    /// and the core at this scale as far as the constants go; `Err` names the constant that
    /// differs. `purges` holds the tick of the latest purge of each queue on this path.
    pub fn admits(
        &self,
        seen: &State,
        purges: &[Option<Tick>; 2],
        action: &Action,
    ) -> Result<(), Excluded> {
        match *action {
            Action::Send {
                queue,
                delay,
                dedup,
                ..
            } => {
                if self.seconds(delay) > limits::delay_s_max {
                    return Err(Excluded::DelayTooLong);
                }
                if dedup
                    && !self.dedup_window_exact()
                    && self.model_dedups(seen, queue) != self.core_dedups(seen, queue)
                {
                    return Err(Excluded::DedupWindow);
                }
                Ok(())
            }
            Action::Receive {
                visibility, wait, ..
            } => {
                assert!(self.seconds(visibility) <= limits::visibility_timeout_s_max);
                if self.seconds(wait) > limits::wait_s_max {
                    return Err(Excluded::WaitTooLong);
                }
                Ok(())
            }
            Action::ChangeVisibility {
                queue,
                handle,
                timeout,
                ..
            } => {
                assert!(self.seconds(timeout) <= limits::visibility_timeout_s_max);
                let current = seen
                    .stored_in(handle.message, queue)
                    .filter(|life| handle.queue == queue && life.handle == Some(handle.seq));
                // Only a current handle reaches the cap check; any other is refused before it,
                // alike on both sides.
                let Some(life) = current.filter(|_| !self.visibility_cap_exact()) else {
                    return Ok(());
                };
                let received_at = life.received_at.expect("a current handle was issued");
                let model_refuses = seen.now + timeout > received_at + VISIBILITY_TOTAL_MAX;
                let core_refuses = self.at(seen.now).plus_s(self.seconds(timeout))
                    > self
                        .at(received_at)
                        .plus_ms(limits::visibility_total_ms_max);
                if model_refuses != core_refuses {
                    return Err(Excluded::VisibilityCap);
                }
                Ok(())
            }
            Action::Tick => {
                if self.retention_exact() {
                    return Ok(());
                }
                let next = seen.now + 1;
                let retention_ms = u64::from(self.retention_s()) * 1_000;
                let differs = seen.stored().any(|(id, _, _)| {
                    let sent_at = seen.message(id).expect("stored").sent_at;
                    let model_expires = sent_at + RETENTION <= next;
                    let core_expires = self.at(sent_at).plus_ms(retention_ms) <= self.at(next);
                    model_expires != core_expires
                });
                if differs {
                    return Err(Excluded::Retention);
                }
                Ok(())
            }
            Action::Purge { queue } => {
                let too_soon = purges[queue.index()].is_some_and(|purged| {
                    self.at(seen.now).since(self.at(purged)) < limits::purge_interval_ms
                });
                if too_soon {
                    return Err(Excluded::PurgeInterval);
                }
                Ok(())
            }
            Action::Delete { .. }
            | Action::DeadLetterNow { .. }
            | Action::Redrive { .. }
            | Action::CancelWaiter { .. }
            | Action::Settle => Ok(()),
        }
    }

    // Where a constant is the same on both sides, its rule admits everything: the rules read
    // the model's state, so at an exact scale they could otherwise hide a model that departs
    // from its own constant.

    /// Whether the model's dedup window is the core's at this scale.
    pub fn dedup_window_exact(&self) -> bool {
        u64::from(self.seconds(DEDUP_WINDOW)) * 1_000 == limits::dedup_window_ms
    }

    /// Whether the model's visibility cap is the core's at this scale.
    pub fn visibility_cap_exact(&self) -> bool {
        u64::from(self.seconds(VISIBILITY_TOTAL_MAX)) * 1_000 == limits::visibility_total_ms_max
    }

    /// Whether the model's retention is the core queues' at this scale.
    pub fn retention_exact(&self) -> bool {
        self.seconds(RETENTION) == self.retention_s()
    }

    /// Whether a dedup send to `queue` is a duplicate in the model now.
    fn model_dedups(&self, seen: &State, queue: QueueId) -> bool {
        seen.queue(queue)
            .dedup
            .is_some_and(|entry| entry.expires_at > seen.now)
    }

    /// Whether it would be in the core: the core's entry is the latest stored send with the
    /// id to `queue` (on an admitted path both sides stored the same sends), and it lasts
    /// `dedup_window_ms`.
    fn core_dedups(&self, seen: &State, queue: QueueId) -> bool {
        let latest = ModelMessageId::all()
            .filter_map(|id| match &seen.messages[id.index()] {
                Slot::Sent(message) if message.ghost_dedup && message.ghost_sent_to == queue => {
                    Some(message.sent_at)
                }
                Slot::Sent(_) | Slot::Unsent | Slot::Duplicate { .. } => None,
            })
            .max();
        latest.is_some_and(|sent_at| {
            self.at(seen.now) < self.at(sent_at).plus_ms(limits::dedup_window_ms)
        })
    }
}

/// Why an action was left out at a scale: the model's constant and the core's differ there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Excluded {
    /// The delay is longer than the core's 900 s.
    DelayTooLong,
    /// The long poll is longer than the core's 20 s.
    WaitTooLong,
    /// The model's dedup window and the core's disagree on whether the send is a duplicate.
    DedupWindow,
    /// The model's visibility cap and the core's disagree on the change.
    VisibilityCap,
    /// Advancing time would expire a message on one side only.
    Retention,
    /// The core would refuse the purge (60 s between purges; not modelled).
    PurgeInterval,
}
