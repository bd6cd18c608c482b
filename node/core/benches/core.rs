//! Timing of the core's hot path: send, receive of 10, delete, each followed by the
//! `take_changes` the node calls before it commits, over 100k and 1M messages in one queue.
//! Prints time per operation and what each operation hands to storage (records put, body
//! bytes put). A plain `main` timed with `std::time::Instant` (no harness, no dependency):
//! `cargo bench -p trireme-core --bench core`. Benches are not run by `cargo test`.
//!
//! Time stands still (every command at the same `now`), so only the command's own work is
//! measured, not timers firing. Receives and deletes go in rounds that stay below the queue's
//! in-flight cap. The body size defaults to 1 KiB; `TRIREME_BENCH_BODY_BYTES` changes it, and
//! `TRIREME_BENCH_MESSAGES` (comma-separated counts) replaces 100k and 1M, e.g. for 1 MiB bodies.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use trireme_core::{
    Change, Command, MessageId, Millis, Outcome, QueueAttributes, QueueName, Queues, ReceiptHandle,
    Record, WaiterId, limits, message_size_bytes,
};

/// Message counts to time, in order, unless `TRIREME_BENCH_MESSAGES` says otherwise.
const RUNS_MESSAGES: [u64; 2] = [100_000, 1_000_000];
/// Messages received (then deleted) per round: below the in-flight cap, a multiple of 10.
const ROUND_MESSAGES: u64 = 100_000;
const _: () = assert!(ROUND_MESSAGES <= limits::inflight_per_queue_max);
const _: () = assert!(ROUND_MESSAGES.is_multiple_of(limits::batch_entries_max as u64));
const BODY_BYTES_DEFAULT: usize = 1_024;
/// An arbitrary start time; it never moves.
const NOW: Millis = Millis(1_700_000_000_000);

/// What the operations of one phase cost and handed to storage.
#[derive(Default)]
struct Phase {
    elapsed: Duration,
    operations: u64,
    records_put: u64,
    body_bytes_put: u64,
}

impl Phase {
    fn count(&mut self, changes: &[Change]) {
        for change in changes {
            if let Change::Put(record) = change {
                self.records_put += 1;
                if let Record::MessageBody(body) = record {
                    self.body_bytes_put += message_size_bytes(&body.body, &body.attributes);
                }
            }
        }
    }

    fn print(&self, name: &str) {
        let operations = self.operations.max(1);
        let per_op_ns = self.elapsed.as_nanos() as f64 / operations as f64;
        println!(
            "  {name:<11} {:>9.0} ns/op  {:>6.3} s total  {:>5.2} records put/op  {:>7.1} body bytes put/op  ({} ops)",
            per_op_ns,
            self.elapsed.as_secs_f64(),
            self.records_put as f64 / operations as f64,
            self.body_bytes_put as f64 / operations as f64,
            self.operations,
        );
    }
}

fn main() {
    let body_bytes = std::env::var("TRIREME_BENCH_BODY_BYTES")
        .ok()
        .map(|text| {
            text.parse()
                .expect("TRIREME_BENCH_BODY_BYTES is a byte count")
        })
        .unwrap_or(BODY_BYTES_DEFAULT);
    assert!(
        (1..=limits::message_bytes_max as usize).contains(&body_bytes),
        "a body is 1..={} bytes",
        limits::message_bytes_max
    );
    let runs: Vec<u64> = match std::env::var("TRIREME_BENCH_MESSAGES") {
        Ok(text) => text
            .split(',')
            .map(|count| {
                count
                    .trim()
                    .parse()
                    .expect("TRIREME_BENCH_MESSAGES is a comma-separated list of counts")
            })
            .collect(),
        Err(_) => RUNS_MESSAGES.to_vec(),
    };
    for messages in runs {
        run(messages, body_bytes);
    }
}

fn run(messages: u64, body_bytes: usize) {
    let queue = QueueName::try_from("bench").expect("a legal queue name");
    let mut queues = Queues::new();
    let created = queues.apply(
        NOW,
        Command::CreateQueue {
            name: queue.clone(),
            attributes: QueueAttributes::default(),
            tags: BTreeMap::new(),
        },
    );
    assert_eq!(
        created.result,
        Ok(Outcome::QueueCreated { created: true }),
        "the queue is created"
    );
    queues.take_changes();
    let body = "b".repeat(body_bytes);

    let mut send = Phase::default();
    let started = Instant::now();
    for id in 0..messages {
        let step = queues.apply(
            NOW,
            Command::Send {
                queue: queue.clone(),
                id: MessageId(u128::from(id)),
                body: body.clone(),
                attributes: BTreeMap::new(),
                system: Default::default(),
                delay_s: None,
                dedup: None,
            },
        );
        assert!(step.result.is_ok(), "send {id}: {:?}", step.result);
        let changes = queues.take_changes();
        send.count(&changes);
        black_box(changes);
    }
    send.elapsed = started.elapsed();
    send.operations = messages;

    let mut receive = Phase::default();
    let mut delete = Phase::default();
    let mut waiter = 0;
    let mut left = messages;
    while left > 0 {
        let round = left.min(ROUND_MESSAGES);
        let mut handles: Vec<ReceiptHandle> = Vec::with_capacity(round as usize);
        let started = Instant::now();
        while (handles.len() as u64) < round {
            waiter += 1;
            let step = queues.apply(
                NOW,
                Command::Receive {
                    queue: queue.clone(),
                    max: limits::batch_entries_max,
                    visibility_s: None,
                    wait_s: Some(0),
                    waiter: WaiterId(waiter),
                },
            );
            let Ok(Outcome::Received(deliveries)) = step.result else {
                panic!("receive: {:?}", step.result);
            };
            assert!(
                !deliveries.is_empty(),
                "{left} messages are left to receive"
            );
            handles.extend(deliveries.into_iter().map(|delivery| delivery.handle));
            let changes = queues.take_changes();
            receive.count(&changes);
            black_box(changes);
            receive.operations += 1;
        }
        receive.elapsed += started.elapsed();
        let started = Instant::now();
        for handle in handles {
            let step = queues.apply(
                NOW,
                Command::Delete {
                    queue: queue.clone(),
                    handle,
                },
            );
            assert_eq!(
                step.result,
                Ok(Outcome::Deleted {
                    already_gone: false
                }),
                "delete"
            );
            let changes = queues.take_changes();
            delete.count(&changes);
            black_box(changes);
            delete.operations += 1;
        }
        delete.elapsed += started.elapsed();
        left -= round;
    }
    let counts = queues.queue(&queue).expect("the queue exists").counts;
    assert_eq!(
        (counts.ready, counts.in_flight),
        (0, 0),
        "every message was deleted"
    );

    println!(
        "{messages} messages, {body_bytes}-byte bodies, one queue, take_changes after every command:"
    );
    send.print("send");
    receive.print("receive-10");
    delete.print("delete");
}
