//! A value that changes, and the tasks that wait for it, woken in the order they began waiting.
//!
//! tokio's `watch` spreads a channel's waiters over eight lists, each waiter's list drawn from
//! the runtime's random source, and wakes the lists in turn: two tasks waiting on one channel
//! resume in an order that only `--cfg tokio_unstable` would let a simulation seed. The
//! coordinator's waits with many waiters (every call waiting at the clock gate for a sample,
//! every claim of one receive waiting for the queue's watermark) therefore went on in an order
//! no seed fixed, and a five-member simulation seed with clock monitoring gave another history
//! in every process (sim/README.md, *Determinism*). A [`Signal`] wakes its waiters through one
//! `Notify`, which wakes them in the order they registered.
//!
//! It must never hold its lock across an await.

use std::sync::Mutex;

use tokio::sync::Notify;

/// A value and the tasks waiting for it to reach a state.
pub struct Signal<T> {
    value: Mutex<T>,
    changed: Notify,
}

impl<T: Clone> Signal<T> {
    /// A signal holding `value`.
    pub fn new(value: T) -> Signal<T> {
        Signal {
            value: Mutex::new(value),
            changed: Notify::new(),
        }
    }

    /// The value now.
    pub fn get(&self) -> T {
        self.value
            .lock()
            .expect("the signal's lock is never poisoned")
            .clone()
    }

    /// Replaces the value and wakes every waiter.
    pub fn set(&self, value: T) {
        self.modify(|held| *held = value);
    }

    /// Changes the value in place and wakes every waiter.
    pub fn modify(&self, change: impl FnOnce(&mut T)) {
        change(
            &mut self
                .value
                .lock()
                .expect("the signal's lock is never poisoned"),
        );
        self.changed.notify_waiters();
    }

    /// Waits until the value satisfies `ready`, and returns it (at once if it already does).
    pub async fn wait_for(&self, ready: impl Fn(&T) -> bool) -> T {
        loop {
            // Registered before the value is read, so a change between the read and the wait
            // wakes this waiter.
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            {
                let value = self
                    .value
                    .lock()
                    .expect("the signal's lock is never poisoned");
                if ready(&value) {
                    return value.clone();
                }
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::Arc;

    use super::*;

    /// Runs `waiters` tasks that each wait for the signal to pass 0, started one after the
    /// other, then sets it; returns the order in which they resumed.
    fn resume_order(waiters: usize) -> Vec<usize> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        let order = Rc::new(RefCell::new(Vec::new()));
        local.block_on(&runtime, async {
            let signal = Arc::new(Signal::new(0_u64));
            let mut tasks = Vec::new();
            for waiter in 0..waiters {
                let (signal, order) = (Arc::clone(&signal), Rc::clone(&order));
                tasks.push(tokio::task::spawn_local(async move {
                    assert_eq!(signal.wait_for(|value| *value > 0).await, 1);
                    order.borrow_mut().push(waiter);
                }));
                // Each waiter registers before the next starts.
                tokio::task::yield_now().await;
            }
            signal.set(1);
            for task in tasks {
                task.await.unwrap();
            }
        });
        order.take()
    }

    #[test]
    fn waiters_resume_in_the_order_they_began_waiting() {
        // tokio's `watch` resumed 16 waiters in another order almost every time (each waiter
        // on one of eight lists drawn at random); a `Signal` resumes them in order, each time.
        for _ in 0..8 {
            assert_eq!(resume_order(16), (0..16).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_value_already_ready_is_returned_at_once_and_a_later_change_wakes() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let signal = Arc::new(Signal::new(5_u64));
            assert_eq!(signal.wait_for(|value| *value == 5).await, 5);
            let setter = Arc::clone(&signal);
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                setter.modify(|value| *value += 1);
                setter.modify(|value| *value += 1);
            });
            assert_eq!(signal.wait_for(|value| *value >= 7).await, 7);
        });
    }
}
