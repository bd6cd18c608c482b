//! A test node: `Queues` plus a manual clock, id counters and short helpers for common commands.
//! Helpers that expect success unwrap, so a test reads as its trace.

use std::collections::BTreeMap;

use trireme_core::{
    AttributeChanges, Command, DedupId, Delivery, MessageId, MessageState, MessageView, Millis,
    Outcome, QueueAttributes, QueueName, Queues, ReceiptHandle, RedrivePolicy, Reject, Step,
    WaiterId, Wakeup,
};

/// An arbitrary, realistic start time (2023-11-14), so no test depends on time 0.
pub const START: Millis = Millis(1_700_000_000_000);

pub struct Node {
    pub queues: Queues,
    pub now: Millis,
    next_message: u128,
    next_waiter: u64,
}

pub fn name(text: &str) -> QueueName {
    QueueName::try_from(text).unwrap()
}

pub fn secs(s: u64) -> u64 {
    s * 1_000
}

impl Node {
    pub fn new() -> Node {
        Node {
            queues: Queues::new(),
            now: START,
            next_message: 1,
            next_waiter: 1,
        }
    }

    /// Sets the clock to `START + offset_ms`.
    pub fn at(&mut self, offset_ms: u64) -> &mut Node {
        self.now = START.plus_ms(offset_ms);
        self
    }

    pub fn apply(&mut self, command: Command) -> Step {
        self.queues.apply(self.now, command)
    }

    /// Applies and expects no wakeups; returns the result.
    pub fn run(&mut self, command: Command) -> Result<Outcome, Reject> {
        let step = self.apply(command);
        assert_eq!(step.wakeups, vec![], "unexpected wakeups");
        step.result
    }

    pub fn advance(&mut self) -> Vec<Wakeup> {
        self.queues.advance(self.now)
    }

    pub fn create(&mut self, text: &str) -> QueueName {
        self.create_with(text, QueueAttributes::default())
    }

    pub fn create_with(&mut self, text: &str, attributes: QueueAttributes) -> QueueName {
        let queue = name(text);
        let outcome = self
            .run(Command::CreateQueue {
                name: queue.clone(),
                attributes,
                tags: BTreeMap::new(),
            })
            .unwrap();
        assert_eq!(outcome, Outcome::QueueCreated { created: true });
        queue
    }

    /// A queue `text` whose dead-letter queue is `dlq` after `max_receive_count` receives.
    pub fn create_with_dlq(
        &mut self,
        text: &str,
        dlq: &QueueName,
        max_receive_count: u32,
    ) -> QueueName {
        self.create_with(
            text,
            QueueAttributes {
                redrive: Some(RedrivePolicy {
                    dead_letter_queue: dlq.clone(),
                    max_receive_count,
                }),
                ..QueueAttributes::default()
            },
        )
    }

    pub fn set(&mut self, queue: &QueueName, changes: AttributeChanges) {
        let outcome = self
            .run(Command::SetQueueAttributes {
                name: queue.clone(),
                changes,
            })
            .unwrap();
        assert_eq!(outcome, Outcome::Done);
    }

    pub fn fresh_id(&mut self) -> MessageId {
        let id = MessageId(self.next_message);
        self.next_message += 1;
        id
    }

    pub fn fresh_waiter(&mut self) -> WaiterId {
        let id = WaiterId(self.next_waiter);
        self.next_waiter += 1;
        id
    }

    pub fn send_command(
        &mut self,
        queue: &QueueName,
        body: &str,
        delay_s: Option<u32>,
        dedup: Option<&str>,
    ) -> Command {
        Command::Send {
            queue: queue.clone(),
            id: self.fresh_id(),
            body: body.to_owned(),
            attributes: BTreeMap::new(),
            system: Default::default(),
            delay_s,
            dedup: dedup.map(|d| DedupId::try_from(d).unwrap()),
        }
    }

    /// Sends `body` and expects a stored, non-duplicate message and no wakeups.
    pub fn send(&mut self, queue: &QueueName, body: &str) -> MessageId {
        self.send_delayed(queue, body, None)
    }

    pub fn send_delayed(
        &mut self,
        queue: &QueueName,
        body: &str,
        delay_s: Option<u32>,
    ) -> MessageId {
        let command = self.send_command(queue, body, delay_s, None);
        match self.run(command).unwrap() {
            Outcome::Sent {
                id,
                duplicate: false,
            } => id,
            other => panic!("send gave {other:?}"),
        }
    }

    pub fn receive_command(
        &mut self,
        queue: &QueueName,
        max: u32,
        visibility_s: Option<u32>,
        wait_s: Option<u32>,
    ) -> Command {
        Command::Receive {
            queue: queue.clone(),
            max,
            visibility_s,
            wait_s,
            waiter: self.fresh_waiter(),
        }
    }

    /// A short poll with the queue's visibility timeout.
    pub fn receive(&mut self, queue: &QueueName, max: u32) -> Vec<Delivery> {
        self.receive_with(queue, max, None)
    }

    pub fn receive_with(
        &mut self,
        queue: &QueueName,
        max: u32,
        visibility_s: Option<u32>,
    ) -> Vec<Delivery> {
        let command = self.receive_command(queue, max, visibility_s, Some(0));
        match self.apply(command).result.unwrap() {
            Outcome::Received(deliveries) => deliveries,
            other => panic!("receive gave {other:?}"),
        }
    }

    /// Receives exactly one message and returns it.
    pub fn receive_one(&mut self, queue: &QueueName) -> Delivery {
        let mut deliveries = self.receive(queue, 1);
        assert_eq!(deliveries.len(), 1, "expected one delivery");
        deliveries.pop().unwrap()
    }

    /// Opens a long poll that finds nothing; returns its waiter id.
    pub fn long_poll(
        &mut self,
        queue: &QueueName,
        max: u32,
        visibility_s: Option<u32>,
        wait_s: u32,
    ) -> WaiterId {
        let command = self.receive_command(queue, max, visibility_s, Some(wait_s));
        let step = self.apply(command);
        match step.result.unwrap() {
            Outcome::Waiting { waiter } => waiter,
            other => panic!("long poll gave {other:?}"),
        }
    }

    pub fn delete(&mut self, queue: &QueueName, handle: &ReceiptHandle) -> Result<Outcome, Reject> {
        self.run(Command::Delete {
            queue: queue.clone(),
            handle: handle.clone(),
        })
    }

    pub fn change_visibility(
        &mut self,
        queue: &QueueName,
        handle: &ReceiptHandle,
        timeout_s: u32,
    ) -> Step {
        self.apply(Command::ChangeVisibility {
            queue: queue.clone(),
            handle: handle.clone(),
            timeout_s,
        })
    }

    pub fn dead_letter_now(&mut self, queue: &QueueName, handle: &ReceiptHandle) -> Step {
        self.apply(Command::DeadLetterNow {
            queue: queue.clone(),
            handle: handle.clone(),
        })
    }

    pub fn redrive(
        &mut self,
        from: &QueueName,
        to: Option<&QueueName>,
        max: u32,
    ) -> Result<Outcome, Reject> {
        self.run(Command::Redrive {
            from: from.clone(),
            to: to.cloned(),
            max,
            allowed: None,
        })
    }

    /// A redrive started by a key limited to `prefixes`.
    pub fn redrive_within(
        &mut self,
        from: &QueueName,
        to: Option<&QueueName>,
        max: u32,
        prefixes: &[&str],
    ) -> Result<Outcome, Reject> {
        self.run(Command::Redrive {
            from: from.clone(),
            to: to.cloned(),
            max,
            allowed: trireme_core::QueuePrefixes::new(
                prefixes.iter().map(|p| (*p).to_owned()).collect(),
            ),
        })
    }

    pub fn view(&self, queue: &QueueName, id: MessageId) -> Option<MessageView> {
        self.queues.message(queue, id)
    }

    pub fn state(&self, queue: &QueueName, id: MessageId) -> MessageState {
        self.view(queue, id).expect("message is stored").state
    }
}

/// The deliveries of a `Served` wakeup for `waiter`, panicking on anything else.
pub fn served(wakeup: &Wakeup, waiter: WaiterId) -> &[Delivery] {
    match wakeup {
        Wakeup::Served {
            waiter: served,
            deliveries,
        } if *served == waiter => deliveries,
        other => panic!("expected {waiter} served, got {other:?}"),
    }
}
