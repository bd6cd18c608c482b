//! Faults on a cluster of real `trireme-node` processes on loopback, driven through their
//! public gRPC endpoints (issue 10, *Proof*): a member SIGKILLed and restarted under load
//! spread over every member, a member that was away longer than the anti-entropy period, a
//! member killed for good while the other two keep serving, and five members where every
//! message is on exactly its three replicas and any one may die.
//!
//! The load keeps a ledger of what was acknowledged and a logical clock: a delete acknowledged
//! at tick `d` and a receive started at tick `s > d` that returns the message is a deleted
//! message delivered again. Records are compared by stopping the members and opening each
//! `replica.redb` (after the members' anti-entropy digests agree, read through the internal
//! service as a member would).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic::Code;
use tonic::transport::Channel;
use trireme_core::{MessageId, QueueName};
use trireme_node::cluster::store::ReplicaStore;
use trireme_proto::replica::v1 as replica_pb;
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_client::QueueServiceClient;
use trireme_replication::placement::{Placement, Ring};
use trireme_replication::record::Record;
use trireme_replication::{NodeId, RecordKey};

use crate::cluster_process::{member_flags, replica_client, sender_on};
use crate::crash::{NodeProcess, PROCESS_GUARD, spawn_node_with, stop_with_sigterm};
use crate::harness::{Client, eventually_within, send_request};
use crate::loopback::consecutive_free;

const QUEUE: &str = "faults";

/// Seconds a message received by the load stays invisible: short, so that a message whose
/// receive reply was lost with a dying member comes back before the drain ends.
const LOAD_VISIBILITY_S: u32 = 3;

/// Seconds a message the drain received stays invisible: long enough that the drain does not
/// see it again, and short enough that a message whose claim a drain's receive gave up comes
/// back within the drain. A split claim (one ack, one refusal) is given up after `SPLIT_WAIT`
/// and its message waits out the claim left on the replicas (spec/replication.md, receive step
/// 7 and *Split claims (F2)*: a delay, never a loss); with 600 s, as before, such a message was
/// reported lost (a five-member run under load: the claim held on two replicas, undelivered).
const DRAIN_VISIBILITY_S: u32 = 30;

/// Bounds every load task, whatever happens to the members.
const LOAD_STEPS_MAX: usize = 20_000;
const LOAD_DEADLINE: Duration = Duration::from_secs(120);

/// Members as processes, each with its data directory and fixed peer port; the gRPC port is
/// ephemeral, so a restarted member has a new address (the load follows it).
struct Members {
    dirs: Vec<TempDir>,
    count: u16,
    peer_base: u16,
    extra: Vec<String>,
    processes: Vec<Option<NodeProcess>>,
    /// Each member's disk id, as it printed it (kept across its restarts).
    disks: Vec<u64>,
    /// Each member's current gRPC address, read by the load before every request.
    addresses: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Members {
    async fn start(count: u16, extra: &[&str]) -> Members {
        let peer_base = consecutive_free(count);
        let mut members = Members {
            dirs: (0..count).map(|_| TempDir::new().unwrap()).collect(),
            count,
            peer_base,
            extra: extra.iter().map(|flag| (*flag).to_owned()).collect(),
            processes: (0..count).map(|_| None).collect(),
            disks: Vec::new(),
            addresses: Arc::new(Mutex::new(Vec::new())),
        };
        for index in 0..usize::from(count) {
            let process = members.spawn(index).await;
            members.addresses.lock().unwrap().push(process.address);
            members
                .disks
                .push(process.disk_id.expect("a member prints its disk"));
            members.processes[index] = Some(process);
        }
        for index in 0..usize::from(count) {
            members.until_serving(index).await;
        }
        members
    }

    /// Waits until member `index` serves (a new database joins first: spec/replication.md,
    /// *Stragglers and replacement*).
    async fn until_serving(&self, index: usize) {
        let mut client = self.client(index);
        for _ in 0..300 {
            if client
                .list_queues(pb::ListQueuesRequest::default())
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("member {} never served", index + 1);
    }

    async fn spawn(&self, index: usize) -> NodeProcess {
        let node = u16::try_from(index + 1).unwrap();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let flags = member_flags(node, self.count, self.peer_base, &extra);
        spawn_node_with(self.dirs[index].path(), "warn", false, &flags).await
    }

    fn node(index: usize) -> u16 {
        u16::try_from(index + 1).unwrap()
    }

    fn peer(&self, index: usize) -> SocketAddr {
        format!("127.0.0.1:{}", self.peer_base + Members::node(index) - 1)
            .parse()
            .unwrap()
    }

    fn client(&self, index: usize) -> Client {
        client_for(self.addresses.lock().unwrap()[index])
    }

    async fn kill(&mut self, index: usize) {
        let mut process = self.processes[index].take().expect("the member runs");
        process.child.start_kill().unwrap();
        let status = tokio::time::timeout(PROCESS_GUARD, process.child.wait())
            .await
            .expect("the killed member did not exit")
            .unwrap();
        assert!(
            !status.success(),
            "member {index} was killed, yet exited cleanly"
        );
    }

    async fn restart(&mut self, index: usize) {
        assert!(self.processes[index].is_none(), "member {index} runs");
        let process = self.spawn(index).await;
        self.addresses.lock().unwrap()[index] = process.address;
        self.processes[index] = Some(process);
    }

    async fn stop(&mut self, index: usize) {
        let process = self.processes[index].take().expect("the member runs");
        stop_with_sigterm(process).await;
    }

    async fn stop_all(&mut self) {
        for index in 0..self.processes.len() {
            if self.processes[index].is_some() {
                self.stop(index).await;
            }
        }
    }

    /// The records of stopped member `index`, read from its `replica.redb`.
    fn records(&self, index: usize) -> BTreeMap<RecordKey, Record> {
        assert!(self.processes[index].is_none(), "member {index} still runs");
        let node = NodeId(Members::node(index));
        let (store, closed) =
            ReplicaStore::open(self.dirs[index].path(), node, 0, 16 << 20).unwrap();
        let records = store.records().unwrap().into_iter().collect();
        drop(store);
        closed.wait();
        records
    }

    /// Member `index`'s anti-entropy digests over what it shares with member `asker` (asked as
    /// `asker`, through the internal service).
    async fn digests(&self, index: usize, asker: usize) -> Vec<(u32, u64, u64, u64)> {
        let mut client = replica_client(self.peer(index)).await;
        let reply = client
            .digests(replica_pb::DigestsRequest {
                sender: Some(sender_on(Members::node(asker), self.disks[asker])),
                first_partition: 0,
                last_partition: u32::from(u16::MAX),
            })
            .await
            .unwrap()
            .into_inner();
        reply
            .digests
            .into_iter()
            .map(|digest| {
                (
                    digest.partition,
                    digest.records,
                    digest.sum_high,
                    digest.sum_low,
                )
            })
            .collect()
    }

    /// Waits until every pair of running members agree on what they share.
    async fn wait_for_agreement(&self, what: &str) {
        let running: Vec<usize> = (0..self.processes.len())
            .filter(|index| self.processes[*index].is_some())
            .collect();
        eventually_within(what, Duration::from_secs(60), || {
            let running = running.clone();
            async move {
                for (position, a) in running.iter().enumerate() {
                    for b in &running[position + 1..] {
                        if self.digests(*a, *b).await != self.digests(*b, *a).await {
                            return false;
                        }
                    }
                }
                true
            }
        })
        .await;
    }
}

/// A lazily connected client with a deadline on every call: a dead member fails the call, it
/// never blocks it.
fn client_for(address: SocketAddr) -> Client {
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    QueueServiceClient::new(channel)
}

fn parse_id(id: &str) -> MessageId {
    MessageId::from_str(id).unwrap()
}

/// Delete about half: those whose id ends in a character with an even code.
fn to_delete(id: &str) -> bool {
    id.as_bytes().last().unwrap().is_multiple_of(2)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Send,
    Receive,
    Delete,
}

/// What the load saw.
#[derive(Default)]
struct Ledger {
    /// Ids of acknowledged sends.
    sent: BTreeSet<String>,
    /// Ids some receive returned.
    delivered: BTreeSet<String>,
    /// Deletes sent (acknowledged or not).
    delete_attempted: BTreeSet<String>,
    /// Acknowledged deletes, with the tick after their acknowledgement.
    deleted: BTreeMap<String, u64>,
    /// Messages a receive returned although it started after their delete was acknowledged.
    delivered_after_delete: Vec<String>,
    /// Failed calls, by member and kind, with when they failed.
    failures: Vec<(usize, Call, Instant, Code)>,
    /// Deletes refused because the handle was superseded (the message came back and another
    /// consumer received it): an answer, not a failure.
    stale_handles: usize,
    /// Successful calls: member, kind, when.
    successes: Vec<(usize, Call, Instant)>,
    /// Answered receives: member, when it was sent, how long it took, messages returned.
    receives: Vec<(usize, Instant, Duration, usize)>,
    /// Acknowledged sends: member, when it was sent, how long it took.
    sends: Vec<(usize, Instant, Duration)>,
}

/// The ledger, the logical clock, and the flags the test steers the load with.
struct Shared {
    ledger: Mutex<Ledger>,
    tick: AtomicU64,
    /// Senders stop once this many sends were acknowledged.
    sends_total: usize,
    /// Consumers stop when this is set.
    stop: AtomicBool,
    /// Members killed for good: their tasks stop.
    gone: Mutex<BTreeSet<usize>>,
    addresses: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Shared {
    fn client(&self, index: usize) -> Client {
        client_for(self.addresses.lock().unwrap()[index])
    }

    fn is_gone(&self, index: usize) -> bool {
        self.gone.lock().unwrap().contains(&index)
    }

    fn failed(&self, index: usize, call: Call, status: &tonic::Status) {
        self.ledger
            .lock()
            .unwrap()
            .failures
            .push((index, call, Instant::now(), status.code()));
    }

    fn succeeded(&self, index: usize, call: Call) {
        self.ledger
            .lock()
            .unwrap()
            .successes
            .push((index, call, Instant::now()));
    }

    /// Records what a receive that started at tick `started` returned.
    fn delivered(&self, started: u64, messages: &[pb::ReceivedMessage]) {
        let mut ledger = self.ledger.lock().unwrap();
        for message in messages {
            let id = &message.message_id;
            if ledger
                .deleted
                .get(id)
                .is_some_and(|deleted| *deleted < started)
            {
                ledger.delivered_after_delete.push(id.clone());
            }
            ledger.delivered.insert(id.clone());
        }
    }
}

/// The pause after a failed call, so a dead member is not hammered.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

async fn sender_task(shared: Arc<Shared>, index: usize, task: usize) {
    let deadline = Instant::now() + LOAD_DEADLINE;
    let mut client = shared.client(index);
    for step in 0..LOAD_STEPS_MAX {
        if shared.ledger.lock().unwrap().sent.len() >= shared.sends_total
            || shared.is_gone(index)
            || Instant::now() > deadline
        {
            return;
        }
        let body = format!("m{index}-t{task}-{step}");
        let sent_at = Instant::now();
        match client
            .send_message(pb::SendMessageRequest {
                queue: QUEUE.to_owned(),
                body,
                ..Default::default()
            })
            .await
        {
            Ok(reply) => {
                shared.succeeded(index, Call::Send);
                let id = reply.into_inner().message_id;
                let mut ledger = shared.ledger.lock().unwrap();
                ledger.sent.insert(id);
                ledger.sends.push((index, sent_at, sent_at.elapsed()));
            }
            Err(status) => {
                shared.failed(index, Call::Send, &status);
                tokio::time::sleep(RETRY_PAUSE).await;
                // The member may have come back on another port.
                client = shared.client(index);
            }
        }
    }
}

async fn consumer_task(shared: Arc<Shared>, index: usize) {
    let deadline = Instant::now() + LOAD_DEADLINE;
    let mut client = shared.client(index);
    for _ in 0..LOAD_STEPS_MAX {
        if shared.stop.load(Ordering::SeqCst) || shared.is_gone(index) || Instant::now() > deadline
        {
            return;
        }
        let started = shared.tick.fetch_add(1, Ordering::SeqCst);
        let sent_at = Instant::now();
        let messages = match client
            .receive_messages(pb::ReceiveMessagesRequest {
                queue: QUEUE.to_owned(),
                max_messages: 10,
                visibility_timeout_seconds: Some(LOAD_VISIBILITY_S),
                wait_seconds: Some(1),
            })
            .await
        {
            Ok(reply) => {
                shared.succeeded(index, Call::Receive);
                reply.into_inner().messages
            }
            Err(status) => {
                shared.failed(index, Call::Receive, &status);
                tokio::time::sleep(RETRY_PAUSE).await;
                client = shared.client(index);
                continue;
            }
        };
        shared.delivered(started, &messages);
        shared.ledger.lock().unwrap().receives.push((
            index,
            sent_at,
            sent_at.elapsed(),
            messages.len(),
        ));
        for message in messages {
            if !to_delete(&message.message_id) {
                continue;
            }
            shared
                .ledger
                .lock()
                .unwrap()
                .delete_attempted
                .insert(message.message_id.clone());
            match client
                .delete_message(pb::DeleteMessageRequest {
                    queue: QUEUE.to_owned(),
                    receipt_handle: message.receipt_handle,
                })
                .await
            {
                Ok(_) => {
                    shared.succeeded(index, Call::Delete);
                    let tick = shared.tick.fetch_add(1, Ordering::SeqCst);
                    shared
                        .ledger
                        .lock()
                        .unwrap()
                        .deleted
                        .insert(message.message_id, tick);
                }
                Err(status) if status.code() == Code::FailedPrecondition => {
                    shared.ledger.lock().unwrap().stale_handles += 1;
                }
                Err(status) => {
                    shared.failed(index, Call::Delete, &status);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    client = shared.client(index);
                }
            }
        }
    }
}

/// Load on every member: `senders` sender tasks and one consumer each.
struct Load {
    shared: Arc<Shared>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    consumers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(members: &Members, senders: usize, sends_total: usize) -> Load {
        let shared = Arc::new(Shared {
            ledger: Mutex::new(Ledger::default()),
            tick: AtomicU64::new(0),
            sends_total,
            stop: AtomicBool::new(false),
            gone: Mutex::new(BTreeSet::new()),
            addresses: members.addresses.clone(),
        });
        let mut load = Load {
            shared,
            senders: Vec::new(),
            consumers: Vec::new(),
        };
        for index in 0..usize::from(members.count) {
            for task in 0..senders {
                let sender = sender_task(load.shared.clone(), index, task);
                load.senders.push(tokio::spawn(sender));
            }
            load.consumers
                .push(tokio::spawn(consumer_task(load.shared.clone(), index)));
        }
        load
    }

    fn acked_sends(&self) -> usize {
        self.shared.ledger.lock().unwrap().sent.len()
    }

    /// Waits until `count` sends were acknowledged (or the senders ended).
    async fn until_sent(&self, count: usize) {
        eventually_within(
            "acknowledged sends",
            Duration::from_secs(60),
            || async move { self.acked_sends() >= count },
        )
        .await;
    }

    /// Waits for the senders to finish, lets the consumers run a little longer, stops them, and
    /// hands back the ledger.
    async fn finish(self) -> Arc<Shared> {
        for task in self.senders {
            tokio::time::timeout(LOAD_DEADLINE, task)
                .await
                .expect("a sender hung")
                .unwrap();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.shared.stop.store(true, Ordering::SeqCst);
        for task in self.consumers {
            tokio::time::timeout(PROCESS_GUARD, task)
                .await
                .expect("a consumer hung")
                .unwrap();
        }
        self.shared
    }
}

/// Receives through the members in `through`, in turn, until every acknowledged send that was
/// never deleted has come back and a full turn was empty; checks no acknowledged delete is
/// delivered again. Messages stay invisible for `visibility_s`; with `until_empty` false the
/// drain ends as soon as every such send came back. Returns what came back, with the newest
/// receipt handle of each.
async fn drain(
    members: &mut Members,
    shared: &Shared,
    through: &[usize],
    visibility_s: u32,
    until_empty: bool,
) -> BTreeMap<String, String> {
    let required: BTreeSet<String> = {
        let ledger = shared.ledger.lock().unwrap();
        ledger
            .sent
            .difference(&ledger.delete_attempted)
            .cloned()
            .collect()
    };
    let mut drained: BTreeMap<String, String> = BTreeMap::new();
    let mut empty_in_a_row = 0;
    // Generous: the drain ends as soon as everything came back, and a loaded machine (a full
    // test run beside other builds) has taken close to a minute.
    let deadline = Instant::now() + Duration::from_secs(150);
    for turn in 0..2_000 {
        let index = through[turn % through.len()];
        let started = shared.tick.fetch_add(1, Ordering::SeqCst);
        let messages = members
            .client(index)
            .receive_messages(pb::ReceiveMessagesRequest {
                queue: QUEUE.to_owned(),
                max_messages: 10,
                visibility_timeout_seconds: Some(visibility_s),
                wait_seconds: Some(0),
            })
            .await
            .unwrap_or_else(|status| panic!("drain through member {index}: {status:?}"))
            .into_inner()
            .messages;
        shared.delivered(started, &messages);
        if messages.is_empty() {
            empty_in_a_row += 1;
            // Messages the load holds come back within LOAD_VISIBILITY_S.
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else {
            empty_in_a_row = 0;
        }
        drained.extend(
            messages
                .into_iter()
                .map(|message| (message.message_id, message.receipt_handle)),
        );
        if required.iter().all(|id| drained.contains_key(id))
            && (!until_empty || empty_in_a_row >= through.len())
        {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let missing: Vec<&String> = required
        .iter()
        .filter(|id| !drained.contains_key(*id))
        .collect();
    if !missing.is_empty() {
        // Tell a loss from a slow drain: what every member's replica file holds of the first
        // few (read once all are stopped).
        members.stop_all().await;
        let shown: Vec<&String> = missing.iter().take(5).copied().collect();
        let mut held = Vec::new();
        for index in 0..members.processes.len() {
            let records = members.records(index);
            for id in &shown {
                let message = parse_id(id);
                let copies: Vec<String> = records
                    .iter()
                    .filter(|(key, _)| key.message == message)
                    .map(|(key, record)| format!("{key:?} => {record:?}"))
                    .collect();
                held.push(format!("member {} holds of {id}: {copies:?}", index + 1));
            }
        }
        panic!(
            "{} acknowledged sends, never deleted, were not delivered within the drain: {:?}\n{}",
            missing.len(),
            missing.iter().take(10).collect::<Vec<_>>(),
            held.join("\n")
        );
    }
    let ledger = shared.ledger.lock().unwrap();
    assert!(
        ledger.delivered_after_delete.is_empty(),
        "acknowledged deletes delivered again: {:?}",
        ledger.delivered_after_delete
    );
    drained
}

async fn create_queue(client: &mut Client) {
    client
        .create_queue(pb::CreateQueueRequest {
            name: QUEUE.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Creates the queue through member 0 and waits until every member serves it.
async fn create_everywhere(members: &Members) {
    create_queue(&mut members.client(0)).await;
    for index in 0..usize::from(members.count) {
        eventually_within("the queue on every member", PROCESS_GUARD, || async move {
            members
                .client(index)
                .get_queue(pb::GetQueueRequest {
                    name: QUEUE.to_owned(),
                })
                .await
                .is_ok()
        })
        .await;
    }
}

/// Summary line of a ledger.
fn summary(ledger: &Ledger) -> String {
    format!(
        "{} sends, {} delivered, {} deletes acknowledged ({} attempted, {} stale handles), {} failed calls",
        ledger.sent.len(),
        ledger.delivered.len(),
        ledger.deleted.len(),
        ledger.delete_attempted.len(),
        ledger.stale_handles,
        ledger.failures.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_of_a_member_under_load_loses_nothing_and_members_converge() {
    let began = Instant::now();
    let mut members = Members::start(3, &["--anti-entropy-period-s", "1"]).await;
    create_everywhere(&members).await;
    let load = Load::start(&members, 2, 2_000);
    load.until_sent(600).await;
    members.kill(1).await;
    let at_kill = load.acked_sends();
    // The other two carry the load for a while before member 2 comes back.
    load.until_sent(at_kill + 300).await;
    members.restart(1).await;
    let shared = load.finish().await;
    println!(
        "cluster_faults kill+restart: {} (SIGKILL at {at_kill} acknowledged sends); load done at {:?}",
        summary(&shared.ledger.lock().unwrap()),
        began.elapsed()
    );
    assert!(shared.ledger.lock().unwrap().sent.len() >= 2_000);
    let drained = drain(&mut members, &shared, &[0, 1, 2], DRAIN_VISIBILITY_S, true).await;
    println!(
        "cluster_faults kill+restart: {} drained at {:?}",
        drained.len(),
        began.elapsed()
    );
    members
        .wait_for_agreement("the three members' digests to agree")
        .await;
    println!(
        "cluster_faults kill+restart: digests agree at {:?}",
        began.elapsed()
    );
    members.stop_all().await;
    let records: Vec<BTreeMap<RecordKey, Record>> = (0..3).map(|i| members.records(i)).collect();
    let ledger = shared.ledger.lock().unwrap();
    assert!(records[0].len() >= ledger.sent.len());
    for index in 1..3 {
        assert_eq!(
            records[index].len(),
            records[0].len(),
            "member {} and member 1 hold different numbers of records",
            index + 1
        );
        for (key, record) in &records[0] {
            assert_eq!(
                records[index].get(key),
                Some(record),
                "member {} differs from member 1 at {key:?}",
                index + 1
            );
        }
    }
    println!(
        "cluster_faults kill+restart: {} records identical on 3 members; {:?}",
        records[0].len(),
        began.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_away_longer_than_the_anti_entropy_period_catches_up() {
    let began = Instant::now();
    let mut members = Members::start(3, &["--anti-entropy-period-s", "1"]).await;
    create_everywhere(&members).await;
    let before: BTreeSet<String> = send_some(&members, &[0, 1, 2], 20).await;
    members
        .wait_for_agreement("agreement before the stop")
        .await;
    members.stop(2).await;
    // Sends and deletes while member 3 is away.
    let away = send_some(&members, &[0, 1], 100).await;
    let mut client = members.client(0);
    let mut deleted = 0;
    for _ in 0..10 {
        let messages = client
            .receive_messages(pb::ReceiveMessagesRequest {
                queue: QUEUE.to_owned(),
                max_messages: 10,
                visibility_timeout_seconds: Some(600),
                wait_seconds: Some(0),
            })
            .await
            .unwrap()
            .into_inner()
            .messages;
        for message in messages {
            client
                .delete_message(pb::DeleteMessageRequest {
                    queue: QUEUE.to_owned(),
                    receipt_handle: message.receipt_handle,
                })
                .await
                .unwrap();
            deleted += 1;
        }
    }
    assert!(deleted > 0);
    // Longer than several anti-entropy periods of the two that stayed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    members.restart(2).await;
    members
        .wait_for_agreement("the returned member to agree with the others")
        .await;
    members.stop_all().await;
    let records: Vec<BTreeMap<RecordKey, Record>> = (0..3).map(|i| members.records(i)).collect();
    let queue = QueueName::try_from(QUEUE).unwrap();
    let held = |index: usize, id: &str| {
        records[index]
            .keys()
            .any(|key| key.queue == queue && key.message == parse_id(id))
    };
    for id in before.iter().chain(&away) {
        assert!(held(2, id), "member 3 lacks {id}");
    }
    assert_eq!(records[2], records[0]);
    assert_eq!(records[2], records[1]);
    println!(
        "cluster_faults away: {} sent before, {} while away, {deleted} deleted while away; {} records identical; {:?}",
        before.len(),
        away.len(),
        records[0].len(),
        began.elapsed()
    );
}

/// Sends `count` messages through `through`, in turn; their ids.
async fn send_some(members: &Members, through: &[usize], count: usize) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for step in 0..count {
        let index = through[step % through.len()];
        let reply = members
            .client(index)
            .send_message(pb::SendMessageRequest {
                queue: QUEUE.to_owned(),
                body: format!("s{step}"),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|status| panic!("send through member {index}: {status:?}"));
        ids.insert(reply.into_inner().message_id);
    }
    ids
}

/// Calls `call` until it succeeds, at most `attempts` times; how many it took.
async fn within_retries<T, F, Fut>(what: &str, attempts: usize, mut call: F) -> (T, usize)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let mut last = None;
    for attempt in 1..=attempts {
        match call().await {
            Ok(value) => return (value, attempt),
            Err(status) => last = Some(status),
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    panic!("{what} failed {attempts} times, last {last:?}");
}

/// The longest gap between consecutive instants in `times` (sorted), starting at `from`.
fn longest_gap(from: Instant, times: &mut [Instant]) -> Duration {
    times.sort();
    let mut previous = from;
    let mut longest = Duration::ZERO;
    for time in times.iter().filter(|time| **time >= from) {
        longest = longest.max(time.duration_since(previous));
        previous = *time;
    }
    longest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_member_killed_for_good_the_other_two_keep_serving() {
    let began = Instant::now();
    let mut members = Members::start(3, &["--anti-entropy-period-s", "1"]).await;
    create_everywhere(&members).await;
    let load = Load::start(&members, 2, 800);
    load.until_sent(300).await;
    let killed_at = Instant::now();
    members.kill(2).await;
    // Member 3's tasks see their calls fail; they stop now.
    load.shared.gone.lock().unwrap().insert(2);
    let shared = load.finish().await;
    let ended_at = Instant::now();
    {
        let ledger = shared.ledger.lock().unwrap();
        assert!(ledger.sent.len() >= 800, "{}", summary(&ledger));
        let before: Vec<_> = ledger
            .failures
            .iter()
            .filter(|(_, _, at, _)| *at < killed_at)
            .collect();
        let dead: Vec<_> = ledger
            .failures
            .iter()
            .filter(|(index, _, at, _)| *index == 2 && *at >= killed_at)
            .collect();
        let live: Vec<_> = ledger
            .failures
            .iter()
            .filter(|(index, _, at, _)| *index != 2 && *at >= killed_at)
            .map(|(index, call, _, code)| (index + 1, *call, *code))
            .collect();
        println!(
            "cluster_faults one down: {}; load ran {:?} after the kill",
            summary(&ledger),
            ended_at - killed_at
        );
        println!(
            "cluster_faults one down: failed calls before the kill {}, through the killed member {} ({:?}), through the live members after the kill {} ({:?})",
            before.len(),
            dead.len(),
            dead.iter()
                .map(|(_, call, _, code)| (*call, *code))
                .collect::<Vec<_>>(),
            live.len(),
            live
        );
        let receives = |after: bool| -> Vec<(Duration, usize)> {
            ledger
                .receives
                .iter()
                .filter(|(index, at, _, _)| *index != 2 && (*at >= killed_at) == after)
                .map(|(_, _, took, count)| (*took, *count))
                .collect()
        };
        let receives_after = receives(true);
        println!(
            "cluster_faults one down: {} receives through the live members after the kill, {} empty, {} messages, longest {:?} (before the kill: {} receives, longest {:?})",
            receives_after.len(),
            receives_after
                .iter()
                .filter(|(_, count)| *count == 0)
                .count(),
            receives_after.iter().map(|(_, count)| count).sum::<usize>(),
            receives_after.iter().map(|(took, _)| *took).max(),
            receives(false).len(),
            receives(false).iter().map(|(took, _)| *took).max()
        );
        // The gaps are measured while the senders ran (after the last send only the consumers
        // run, and a gap there is a receive's or a delete's latency, not a stall), beside the
        // same measure over the same two members before the kill (fewer callers make longer
        // gaps, and a longer window a longer longest one), and beside the sends' latency, which
        // sets the load's pace: gaps of a send's latency are that pace, not the kill's doing.
        // Deletes have no gap of their own: the half of the messages the load keeps come back
        // every LOAD_VISIBILITY_S and fill whole receives with nothing to delete, so their gaps
        // follow what the receives returned.
        let live_times = |call: Option<Call>| -> Vec<Instant> {
            let mut times: Vec<Instant> = ledger
                .successes
                .iter()
                .filter(|(index, kind, _)| *index != 2 && call.is_none_or(|call| *kind == call))
                .map(|(_, _, at)| *at)
                .collect();
            times.sort();
            times
        };
        let sends_ended = *live_times(Some(Call::Send))
            .last()
            .expect("sends through the live members");
        let load_began = live_times(None)[0];
        let second = Duration::from_secs(1);
        let gap = |call: Option<Call>, from: Instant, to: Instant| -> Duration {
            let mut times: Vec<Instant> = live_times(call)
                .into_iter()
                .filter(|at| *at <= to)
                .collect();
            longest_gap(from, &mut times)
        };
        let latencies = |after: bool| -> String {
            let mut took: Vec<Duration> = ledger
                .sends
                .iter()
                .filter(|(index, at, _)| *index != 2 && (*at >= killed_at) == after)
                .map(|(_, _, took)| *took)
                .collect();
            took.sort();
            if took.is_empty() {
                return "none".to_owned();
            }
            let at = |per_cent: usize| took[(took.len() * per_cent / 100).min(took.len() - 1)];
            format!(
                "{} sends, p50 {:?}, p99 {:?}, max {:?}",
                took.len(),
                at(50),
                at(99),
                at(100)
            )
        };
        println!(
            "cluster_faults one down: sends through the live members before the kill: {}; after: {}",
            latencies(false),
            latencies(true)
        );
        println!(
            "cluster_faults one down: longest gap between successful calls through the live members, while the senders ran: the second after the kill {:?} (the second before {:?}); from the kill to the last send ({:?}) {:?} (the load before the kill, {:?}: {:?}); between sends alone, after the kill {:?} (before {:?})",
            gap(None, killed_at, (killed_at + second).min(sends_ended)),
            gap(None, (killed_at - second).max(load_began), killed_at),
            sends_ended - killed_at,
            gap(None, killed_at, sends_ended),
            killed_at - load_began,
            gap(None, load_began, killed_at),
            gap(Some(Call::Send), killed_at, sends_ended),
            gap(Some(Call::Send), load_began, killed_at)
        );
    }
    // Each live member creates, sends, receives and deletes within a bounded number of
    // attempts (on a queue of its own, so the probe's receive hides none of the load's).
    for index in [0, 1] {
        let client = members.client(index);
        let probe = format!("probe-{}", index + 1);
        within_retries("a create", 20, || {
            let (mut client, probe) = (client.clone(), probe.clone());
            async move {
                client
                    .create_queue(pb::CreateQueueRequest {
                        name: probe,
                        ..Default::default()
                    })
                    .await
            }
        })
        .await;
        let (reply, sends) = within_retries("a send", 20, || {
            let (mut client, probe) = (client.clone(), probe.clone());
            async move { client.send_message(send_request(&probe, "probe")).await }
        })
        .await;
        let id = reply.into_inner().message_id;
        let (handle, receives) = within_retries("a receive of the probe", 20, || {
            let (mut client, probe, id) = (client.clone(), probe.clone(), id.clone());
            async move {
                client
                    .receive_messages(pb::ReceiveMessagesRequest {
                        queue: probe,
                        max_messages: 10,
                        visibility_timeout_seconds: Some(600),
                        wait_seconds: Some(1),
                    })
                    .await?
                    .into_inner()
                    .messages
                    .into_iter()
                    .find(|message| message.message_id == id)
                    .map(|message| message.receipt_handle)
                    .ok_or_else(|| tonic::Status::not_found("the probe was not received"))
            }
        })
        .await;
        let (_, deletes) = within_retries("a delete", 20, || {
            let (mut client, probe, handle) = (client.clone(), probe.clone(), handle.clone());
            async move {
                client
                    .delete_message(pb::DeleteMessageRequest {
                        queue: probe,
                        receipt_handle: handle,
                    })
                    .await
            }
        })
        .await;
        println!(
            "cluster_faults one down: member {} probe: send in {sends}, receive in {receives}, delete in {deletes} attempts",
            index + 1
        );
    }
    let drained = drain(&mut members, &shared, &[0, 1], DRAIN_VISIBILITY_S, true).await;
    println!(
        "cluster_faults one down: {} drained through the two live members; {:?}",
        drained.len(),
        began.elapsed()
    );
    members.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_hold_every_message_on_its_three_replicas_and_survive_any_one_kill() {
    let began = Instant::now();
    let mut members = Members::start(5, &["--anti-entropy-period-s", "1"]).await;
    create_everywhere(&members).await;
    let load = Load::start(&members, 1, 200);
    let shared = load.finish().await;
    members
        .wait_for_agreement("the five members' digests to agree")
        .await;
    members.stop_all().await;
    let ring = Ring::new((1..=5).map(NodeId)).unwrap();
    let mut holders: BTreeMap<RecordKey, BTreeSet<NodeId>> = BTreeMap::new();
    for index in 0..5 {
        for key in members.records(index).into_keys() {
            holders
                .entry(key)
                .or_default()
                .insert(NodeId(Members::node(index)));
        }
    }
    for (key, held_by) in &holders {
        let replicas: BTreeSet<NodeId> = ring.replicas(&key.queue, key.message).into();
        assert_eq!(held_by, &replicas, "{key:?}");
    }
    let ledger_summary = {
        let ledger = shared.ledger.lock().unwrap();
        let ids: BTreeSet<MessageId> = holders.keys().map(|key| key.message).collect();
        for id in &ledger.sent {
            assert!(
                ids.contains(&parse_id(id)),
                "acknowledged send {id} is on no member"
            );
        }
        summary(&ledger)
    };
    println!(
        "cluster_faults five: {ledger_summary}; {} keys, each on exactly its 3 replicas; {:?}",
        holders.len(),
        began.elapsed()
    );
    for index in 0..5 {
        members.restart(index).await;
    }
    // Any one of the five may die: with each one down in turn, every acknowledged send that was
    // never deleted is received through the other four, and no acknowledged delete comes back.
    for victim in 0..5 {
        members.kill(victim).await;
        let others: Vec<usize> = (0..5).filter(|index| *index != victim).collect();
        let drained = drain(&mut members, &shared, &others, DRAIN_VISIBILITY_S, false).await;
        // Visible again for the next round, through the four (handles work on every member),
        // all at once.
        let mut changes = tokio::task::JoinSet::new();
        for (turn, (id, handle)) in drained.iter().enumerate() {
            assert!(!shared.ledger.lock().unwrap().deleted.contains_key(id));
            let client = members.client(others[turn % others.len()]);
            let handle = handle.clone();
            changes.spawn(async move {
                within_retries("a visibility change", 5, || {
                    let (mut client, handle) = (client.clone(), handle.clone());
                    async move {
                        client
                            .change_visibility(pb::ChangeVisibilityRequest {
                                queue: QUEUE.to_owned(),
                                receipt_handle: handle,
                                visibility_timeout_seconds: 0,
                            })
                            .await
                    }
                })
                .await;
            });
        }
        while let Some(changed) = changes.join_next().await {
            changed.unwrap();
        }
        println!(
            "cluster_faults five: member {} down, {} received and made visible again through the others; {:?}",
            victim + 1,
            drained.len(),
            began.elapsed()
        );
        members.restart(victim).await;
    }
    members.stop_all().await;
}
