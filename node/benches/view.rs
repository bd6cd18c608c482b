//! Timing of the local view's answers on a receive's path (`candidates`), a peer's `Candidates`
//! call, a metrics sample and `GetQueueAttributes` (`counts`), and a waiter's re-poll
//! (`next_ready`), with 100,000 ready messages behind 0 to 120,000 (SQS's in-flight limit) in
//! flight at the queue's head: the pattern of consumers that hold what they received.
//!
//! A plain `main` timed with `std::time::Instant` (no harness): `cargo bench -p trireme-node
//! --bench view`. Each answer is asked `CALLS` times, the clock advancing a millisecond per
//! call, and the mean printed per call; compare the rows of one run, as ratios.

use std::hint::black_box;
use std::time::Instant;

use trireme_core::{Incarnation, MessageId, Millis, QueueName};
use trireme_node::cluster::store::LocalView;
use trireme_replication::record::{Birth, Body, Claim, Held, Record};
use trireme_replication::{NodeId, RecordKey};

const READY: u64 = 100_000;
const IN_FLIGHT: [u64; 4] = [0, 1_000, 10_000, 120_000];
const CALLS: u64 = 2_000;
/// A receive's candidates: `max × 3`, as the coordinator asks.
const CANDIDATES: usize = 30;
const NOW: u64 = 1_700_000_000_000;
/// The in-flight messages' visibility deadline: far past every call.
const HOUR_MS: u64 = 3_600_000;

fn record(sent_at: u64, deadline: Option<u64>) -> Record {
    let mut record = Record::sent(Birth {
        payload: Vec::new(),
        sent_at: Millis(sent_at),
        visible_from: Millis(0),
        source_queue: None,
        dedup_id: None,
    });
    if let Body::Live(live) = &mut record.body {
        live.held = deadline.map(|deadline| Held {
            claim: Claim {
                seq: 1,
                coordinator: NodeId(1),
                nonce: 7,
            },
            change_counter: 0,
            deadline: Millis(deadline),
            received_at: Millis(NOW),
        });
    }
    record
}

fn main() {
    let queue = QueueName::try_from("bench".to_owned()).expect("a valid name");
    let incarnation = Incarnation::local(Millis(1));
    println!("in flight at the head, then answer: µs per call (mean of {CALLS})");
    for in_flight in IN_FLIGHT {
        let mut view = LocalView::default();
        for n in 0..in_flight + READY {
            let key = RecordKey {
                queue: queue.clone(),
                incarnation,
                message: MessageId(u128::from(n)),
            };
            // The oldest `in_flight` are received, with an hour's visibility left.
            let deadline = (n < in_flight).then_some(NOW + HOUR_MS);
            view.update(&key, Some(&record(NOW - 1_000_000 + n, deadline)));
        }
        let mut time = |name: &str, f: &mut dyn FnMut(&mut LocalView, Millis)| {
            let started = Instant::now();
            for call in 0..CALLS {
                f(&mut view, Millis(NOW + call));
            }
            let per_call =
                started.elapsed().as_secs_f64() * 1e6 / f64::from(u32::try_from(CALLS).unwrap());
            println!("{in_flight:>8} {name:<11} {per_call:>10.2}");
        };
        time("candidates", &mut |view, now| {
            black_box(view.candidates(&queue, incarnation, None, now, CANDIDATES));
        });
        time("counts", &mut |view, now| {
            black_box(view.counts(&queue, incarnation, None, now));
        });
        time("next_ready", &mut |view, now| {
            black_box(view.next_ready(&queue, incarnation, now));
        });
    }
}
