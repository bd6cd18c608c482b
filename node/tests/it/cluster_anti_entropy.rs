//! Anti-entropy and tombstone collection on loopback (spec/replication.md#read-repair-and-anti-entropy,
//! #tombstones-and-their-collection): three members in one process, each on its own tokio
//! runtime with its own data directory, as in `cluster.rs`. Rounds are triggered and awaited
//! where a test can; the one background test awaits the task's own pass counter. Collection
//! tests share one manual clock between the members, so the horizon passes when the test says.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use trireme_core::{DedupId, Incarnation, MessageId, Millis, QueueName, limits};
use trireme_node::clock::{Clock, ManualClock, SystemClock};
use trireme_node::cluster::anti_entropy::{AntiEntropySettings, AntiEntropyTask, RoundReport};
use trireme_node::cluster::collection::{CollectionReport, CollectionSettings};
use trireme_node::cluster::join::JoinState;
use trireme_node::cluster::peers::LinkSettings;
use trireme_node::cluster::store::{DedupEntry, Entry, ReplicaStore, StoreClosed};
use trireme_node::cluster::{Cluster, ClusterSettings, Delivered};
use trireme_node::tcp_incoming;
use trireme_replication::coordinator::{DeleteAnswer, Reply, Request, SendAnswer};
use trireme_replication::dedup::{
    DedupKey, DedupRecord, DedupReply, DedupRequest, DedupSendAnswer, DedupValue,
};
use trireme_replication::placement::{Placement, Ring};
use trireme_replication::record::{Birth, Record};
use trireme_replication::replica::Write;
use trireme_replication::{NodeId, RecordKey};

const INCARNATION: Incarnation = Incarnation::local(Millis(1));
/// The collection tests' horizon, by their manual clock.
const HORIZON_MS: u64 = 1_000;
/// Every wait for a background effect is bounded by this.
/// No retention: these tests' messages carry a fixed send time of 1 s after the epoch, and
/// what they test is not expiry (spec/replication.md §3 has its own test, cluster_retention).
const RETENTION_MS: u64 = u64::MAX;
const WAIT_MAX: Duration = Duration::from_secs(60);

fn queue(name: &str) -> QueueName {
    QueueName::try_from(name.to_owned()).expect("a valid queue name")
}

/// Anti-entropy as a test runs it: small pages and calls so that paging is exercised.
fn anti_entropy(period: Duration) -> AntiEntropySettings {
    AntiEntropySettings {
        period,
        partitions_per_call: 8_192,
        partitions_per_round_max: 1_024,
        records_per_round_max: 16_384,
        records_per_page: 4,
        rounds_per_pass_max: 4,
    }
}

fn collection() -> CollectionSettings {
    CollectionSettings {
        period: Duration::from_secs(3_600),
        rows_per_round_max: 1_000,
        reads_in_flight_max: 16,
        waiting_max: 1_000,
    }
}

#[derive(Clone)]
struct Setup {
    addresses: BTreeMap<u16, SocketAddr>,
    clock: Arc<dyn Clock>,
    horizon_ms: u64,
    /// Background anti-entropy on every member, with this period.
    background: Option<Duration>,
}

impl Setup {
    fn settings(&self, node: u16) -> ClusterSettings {
        ClusterSettings {
            node: NodeId(node),
            peers: self
                .addresses
                .iter()
                .filter(|(id, _)| **id != node)
                .map(|(id, address)| (NodeId(*id), address.to_string()))
                .collect(),
            // Collection reads all three: with one member down each read waits this long.
            operation_timeout: Duration::from_millis(1_000),
            link: LinkSettings {
                connect_timeout: Duration::from_millis(500),
                call_timeout: Duration::from_secs(2),
                keepalive_interval: Duration::from_secs(5),
                keepalive_timeout: Duration::from_secs(5),
            },
            horizon_ms: self.horizon_ms,
            dedup_window_ms: trireme_core::limits::dedup_window_ms,
            // Every member reads the one clock of `Setup`: the monitor could only measure no
            // skew, and the tests' jumps of a manual clock (past the horizon) would leave the
            // probes in flight across a jump bracketing a 2 s offset, which stops coordination
            // by the rule (spec/replication.md#clock-monitoring) until fresh probes come.
            monitor_clock: false,
        }
    }
}

type Records = BTreeMap<Vec<u8>, String>;

struct Running {
    runtime: tokio::runtime::Runtime,
    cluster: Cluster,
    closed: StoreClosed,
    anti_entropy: Option<AntiEntropyTask>,
}

struct Member {
    node: u16,
    dir: PathBuf,
    /// The disk id a new database in `dir` gets.
    disk: u64,
    /// The port's listener until the first start serves on it.
    reserved: Option<std::net::TcpListener>,
    running: Option<Running>,
}

impl Member {
    /// Starts (again) on its directory; returns the records it holds as it opens, before any
    /// peer has talked to it.
    fn restart(&mut self, setup: &Setup) -> Records {
        assert!(self.running.is_none(), "a running member is not restarted");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (store, closed) = ReplicaStore::open(&self.dir, NodeId(self.node), self.disk, 16 << 20)
            .expect("the replica store opens");
        let opened = as_records(&store);
        let _entered = runtime.enter();
        let (cluster, service) = Cluster::start(
            &setup.settings(self.node),
            store,
            Arc::clone(&setup.clock),
            Some(u64::from(self.node)),
        )
        .expect("the cluster starts");
        let (address, reserved) = (setup.addresses[&self.node], self.reserved.take());
        runtime.block_on(async {
            let listener = super::loopback::listener(reserved, address);
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(service.into_server())
                    .serve_with_incoming(tcp_incoming(listener)),
            );
        });
        let anti_entropy = setup
            .background
            .map(|period| cluster.spawn_anti_entropy(anti_entropy(period)));
        self.running = Some(Running {
            runtime,
            cluster,
            closed,
            anti_entropy,
        });
        opened
    }

    fn running(&self) -> &Running {
        self.running.as_ref().expect("the member runs")
    }

    /// Runs `call` on this member's runtime, as a client of this node would be served.
    async fn call<F, T>(&self, call: impl FnOnce(Cluster) -> F) -> T
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let running = self.running();
        running
            .runtime
            .spawn(call(running.cluster.clone()))
            .await
            .expect("the call does not panic")
    }

    /// A crash of the process: every task and connection ends now; fsynced records remain.
    fn kill(&mut self) {
        let running = self.running.take().expect("the member runs");
        drop(running.anti_entropy);
        drop(running.cluster);
        running.runtime.shutdown_timeout(Duration::from_secs(10));
        running.closed.wait();
    }

    fn records(&self) -> Records {
        as_records(self.running().cluster.store())
    }

    /// Waits (bounded) until this member's background anti-entropy has ended `passes` more
    /// passes than it had.
    async fn anti_entropy_passes(&mut self, passes: u64) {
        let running = self.running.as_mut().expect("the member runs");
        let task = running
            .anti_entropy
            .as_mut()
            .expect("the member runs anti-entropy");
        let target = task.passes() + passes;
        let waited = tokio::time::timeout(WAIT_MAX, task.passes_at_least(target)).await;
        assert!(
            waited.is_ok(),
            "node {} ran {passes} passes in time",
            self.node
        );
    }

    async fn round(&self, peer: u16) -> RoundReport {
        self.call(move |cluster| async move {
            cluster
                .anti_entropy_round(NodeId(peer), &anti_entropy(Duration::from_secs(3_600)))
                .await
                .expect("the round runs")
        })
        .await
    }

    async fn collect(&self) -> CollectionReport {
        self.call(|cluster| async move {
            cluster
                .collection_round(&collection())
                .await
                .expect("the round runs")
        })
        .await
    }
}

fn as_records(store: &ReplicaStore) -> Records {
    store
        .records()
        .expect("the records read")
        .into_iter()
        .map(|(key, record)| (key.encode(), format!("{record:?}")))
        .collect()
}

struct Members {
    members: Vec<Member>,
    setup: Setup,
    _dirs: Vec<TempDir>,
}

impl Members {
    fn start(
        count: u16,
        clock: Arc<dyn Clock>,
        horizon_ms: u64,
        background: Option<Duration>,
    ) -> Members {
        let mut reserved = super::loopback::reserve(1..=count);
        let addresses = super::loopback::addresses(&reserved);
        let setup = Setup {
            addresses,
            clock,
            horizon_ms,
            background,
        };
        let dirs: Vec<TempDir> = (1..=count)
            .map(|_| TempDir::new().expect("a temp dir"))
            .collect();
        let members = (1..=count)
            .zip(&dirs)
            .map(|(node, dir)| {
                let mut member = Member {
                    node,
                    dir: dir.path().to_path_buf(),
                    disk: u64::from(node) * 1_000 + 7,
                    reserved: reserved.remove(&node),
                    running: None,
                };
                member.restart(&setup);
                member
            })
            .collect::<Vec<Member>>();
        // New databases join first: every peer must answer before any of them votes.
        for member in &members {
            let running = member.running();
            running.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(30), running.cluster.joined())
                    .await
                    .expect("the member joins");
            });
        }
        Members {
            members,
            setup,
            _dirs: dirs,
        }
    }

    fn restart(&mut self, index: usize) -> Records {
        let setup = self.setup.clone();
        self.members[index].restart(&setup)
    }

    /// Member `index` (stopped) comes back on an empty disk: its directory emptied, a new disk
    /// id drawn.
    fn replace(&mut self, index: usize) {
        let member = &mut self.members[index];
        assert!(member.running.is_none(), "a running member is not replaced");
        for entry in std::fs::read_dir(&member.dir).expect("the directory reads") {
            std::fs::remove_file(entry.expect("an entry").path()).expect("the file goes");
        }
        member.disk += 1;
        let setup = self.setup.clone();
        assert!(member.restart(&setup).is_empty(), "the new disk is empty");
    }

    /// One round for every pair, one after the other (1–2, 1–3, ..., 2–3, ...): with nothing
    /// else writing, every replica holds the merge of its record's replicas afterwards.
    async fn anti_entropy_pass(&self) -> Vec<RoundReport> {
        let mut reports = Vec::new();
        for (from, member) in self.members.iter().enumerate() {
            for peer in &self.members[from + 1..] {
                let report = member.round(peer.node).await;
                assert!(
                    report.complete,
                    "a round within its caps compares everything"
                );
                reports.push(report);
            }
        }
        reports
    }

    fn assert_identical(&self) {
        let first = self.members[0].records();
        for member in &self.members[1..] {
            let records = member.records();
            let keys: BTreeSet<&Vec<u8>> = first.keys().chain(records.keys()).collect();
            for key in keys {
                assert_eq!(
                    first.get(key),
                    records.get(key),
                    "node 1 and node {} hold the same record",
                    member.node
                );
            }
        }
    }
}

async fn send(member: &Member, name: &str, id: u128) -> SendAnswer {
    let name = queue(name);
    member
        .call(move |cluster| async move {
            let birth = Birth {
                payload: format!("m{id}").into_bytes(),
                sent_at: Millis(1_000),
                visible_from: Millis(0),
                source_queue: None,
                dedup_id: None,
            };
            cluster.send(&name, INCARNATION, MessageId(id), birth).await
        })
        .await
}

async fn receive(member: &Member, name: &str, max: usize, visibility_ms: u64) -> Vec<Delivered> {
    let name = queue(name);
    member
        .call(move |cluster| async move {
            cluster
                .receive(&name, INCARNATION, max, visibility_ms, RETENTION_MS, None)
                .await
        })
        .await
}

async fn delete(member: &Member, delivered: &Delivered) -> DeleteAnswer {
    let (key, handle) = (delivered.key.clone(), delivered.handle);
    member
        .call(move |cluster| async move { cluster.delete(&key, handle).await })
        .await
}

/// Receives through the members in turn until `expected` messages were delivered or the
/// attempts run out.
async fn drain(members: &[&Member], name: &str, expected: usize) -> Vec<Delivered> {
    let mut delivered = Vec::new();
    for attempt in 0..200 {
        if delivered.len() >= expected {
            break;
        }
        delivered.extend(receive(members[attempt % members.len()], name, 10, 60_000).await);
    }
    delivered
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

#[test]
fn a_node_stopped_longer_than_the_period_catches_up_when_it_returns() {
    let period = Duration::from_millis(200);
    let mut three = Members::start(3, system_clock(), 24 * 3_600_000, Some(period));
    let rt = runtime();
    rt.block_on(async {
        for id in 0..20u128 {
            let member = &three.members[id as usize % 3];
            assert_eq!(send(member, "jobs", id).await, SendAnswer::Sent);
        }
    });
    three.members[2].kill();
    rt.block_on(async {
        let m = &three.members;
        for id in 20..40u128 {
            assert_eq!(
                send(&m[id as usize % 2], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        let delivered = drain(&[&m[0], &m[1]], "jobs", 25).await;
        for (i, message) in delivered.iter().take(25).enumerate() {
            assert_eq!(delete(&m[i % 2], message).await, DeleteAnswer::Deleted);
        }
        // The scenario, not a wait for an effect: the node stays away for several periods.
        tokio::time::sleep(period * 4).await;
    });
    let survivors = three.members[0].records();
    let returned = three.restart(2);
    assert_ne!(returned, survivors, "the returning node missed writes");
    assert!(returned.len() < survivors.len());
    rt.block_on(async {
        three.members[2].anti_entropy_passes(1).await;
        // A full pass of each survivor that started after the returning node's own pass.
        three.members[0].anti_entropy_passes(2).await;
        three.members[1].anti_entropy_passes(2).await;
    });
    assert_eq!(three.members[2].records(), survivors);
    three.assert_identical();
}

#[test]
fn after_a_quiet_period_three_nodes_hold_identical_records() {
    let mut three = Members::start(3, system_clock(), 24 * 3_600_000, None);
    let rt = runtime();
    let deleted: BTreeSet<u128> = rt.block_on(async {
        let m = &three.members;
        for id in 0..30u128 {
            assert_eq!(
                send(&m[id as usize % 3], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        let delivered = drain(&[&m[2], &m[0], &m[1]], "jobs", 10).await;
        let mut deleted = BTreeSet::new();
        for (i, message) in delivered.iter().take(10).enumerate() {
            assert_eq!(delete(&m[i % 3], message).await, DeleteAnswer::Deleted);
            deleted.insert(message.key.message.0);
        }
        deleted
    });
    three.members[1].kill();
    let deleted = rt.block_on(async {
        let m = &three.members;
        let mut deleted = deleted;
        for id in 30..50u128 {
            let member = if id % 2 == 0 { &m[0] } else { &m[2] };
            assert_eq!(send(member, "jobs", id).await, SendAnswer::Sent);
        }
        let delivered = drain(&[&m[0], &m[2]], "jobs", 15).await;
        for (i, message) in delivered.iter().take(15).enumerate() {
            let member = if i % 2 == 0 { &m[2] } else { &m[0] };
            assert_eq!(delete(member, message).await, DeleteAnswer::Deleted);
            deleted.insert(message.key.message.0);
        }
        deleted
    });
    three.restart(1);
    rt.block_on(async {
        let m = &three.members;
        for id in 50..60u128 {
            assert_eq!(
                send(&m[id as usize % 3], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        // Received and left in flight: claims spread as well as tombstones.
        let held = drain(&[&m[1]], "jobs", 5).await;
        assert!(!held.is_empty());
        let reports = three.anti_entropy_pass().await;
        let moved: usize = reports.iter().map(|r| r.pushed + r.pulled).sum();
        assert!(moved > 0, "the restarted node lacked records: {reports:?}");
        assert!(
            reports
                .iter()
                .all(|r| r.diverged == 0 && r.push_failures == 0)
        );
        // A second pass finds nothing left to exchange.
        let again = three.anti_entropy_pass().await;
        assert!(
            again.iter().all(|r| r.partitions_exchanged == 0),
            "{again:?}"
        );
    });
    three.assert_identical();
    assert_eq!(three.members[0].records().len(), 60);
    assert_eq!(deleted.len(), 25);
}

#[test]
fn an_acknowledged_deletes_tombstone_reaches_the_third_replica_and_stays_deleted() {
    let mut three = Members::start(3, system_clock(), 24 * 3_600_000, None);
    let rt = runtime();
    rt.block_on(async {
        for id in 0..10u128 {
            let member = &three.members[id as usize % 3];
            assert_eq!(send(member, "jobs", id).await, SendAnswer::Sent);
        }
        // A send answers at two acks: a pass makes sure the third holds every copy too.
        three.anti_entropy_pass().await;
    });
    // Every replica holds every live copy before the third goes away.
    let before = three.members[2].records();
    assert_eq!(before.len(), 10);
    three.members[2].kill();
    rt.block_on(async {
        let m = &three.members;
        let delivered = drain(&[&m[0], &m[1]], "jobs", 10).await;
        assert_eq!(delivered.len(), 10);
        for (i, message) in delivered.iter().enumerate() {
            assert_eq!(delete(&m[i % 2], message).await, DeleteAnswer::Deleted);
        }
    });
    let returned = three.restart(2);
    assert_eq!(
        returned, before,
        "the third replica returns with its live copies"
    );
    let tombstones = |records: &Records| {
        records
            .values()
            .filter(|record| record.contains("Tombstone"))
            .count()
    };
    rt.block_on(async {
        let m = &three.members;
        // Before any read could repair it: anti-entropy alone brings the tombstones.
        let report = m[0].round(3).await;
        assert_eq!(
            report.pushed, 10,
            "the ten tombstones go to the third replica"
        );
        assert_eq!(report.pulled, 0, "the third replica knows nothing newer");
        assert_eq!(tombstones(&m[2].records()), 10);
        for member in m {
            for _ in 0..3 {
                let again = receive(member, "jobs", 10, 60_000).await;
                assert!(again.is_empty(), "a deleted message came back: {again:?}");
            }
        }
    });
    three.assert_identical();
}

#[test]
fn collection_drops_a_tombstone_only_once_all_three_hold_it_and_the_horizon_passed() {
    let clock = ManualClock::new(SystemClock.now());
    let mut three = Members::start(3, Arc::new(clock.clone()), HORIZON_MS, None);
    let rt = runtime();
    let delivered = rt.block_on(async {
        let m = &three.members;
        for id in 0..12u128 {
            assert_eq!(
                send(&m[id as usize % 3], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        let delivered = drain(&[&m[0], &m[1], &m[2]], "jobs", 12).await;
        assert_eq!(delivered.len(), 12);
        // Two deleted with every member up, the other ten once the third is away.
        for message in &delivered[..2] {
            assert_eq!(delete(&m[0], message).await, DeleteAnswer::Deleted);
        }
        delivered
    });
    three.members[2].kill();
    rt.block_on(async {
        let m = &three.members;
        for (i, message) in delivered[2..].iter().enumerate() {
            assert_eq!(delete(&m[i % 2], message).await, DeleteAnswer::Deleted);
        }
        let held = |member: &Member| member.records().len();
        assert_eq!((held(&m[0]), held(&m[1])), (12, 12));
        // One replica down: nothing is confirmed, however long the wait.
        for _ in 0..2 {
            for member in &m[..2] {
                let report = member.collect().await;
                assert!(report.read > 0, "{report:?}");
                assert_eq!(report.confirmed, 0, "{report:?}");
                assert_eq!(report.dropped, 0, "{report:?}");
            }
            clock.advance_ms(2 * HORIZON_MS);
        }
        assert_eq!((held(&m[0]), held(&m[1])), (12, 12), "nothing dropped");
    });
    three.restart(2);
    rt.block_on(async {
        let m = &three.members;
        // The returning replica learns the tombstones it missed.
        three.anti_entropy_pass().await;
        let mut confirmed = 0;
        for member in m {
            let report = member.collect().await;
            assert_eq!(report.dropped, 0, "the horizon has not passed: {report:?}");
            confirmed += report.confirmed;
        }
        assert_eq!(
            confirmed, 12,
            "each tombstone confirmed once, by its first replica"
        );
        // Until the horizon has passed since the confirmation, later rounds drop nothing.
        for advance_ms in [0, HORIZON_MS] {
            clock.advance_ms(advance_ms);
            for member in m {
                let report = member.collect().await;
                assert_eq!(report.dropped, 0, "the horizon has not passed: {report:?}");
            }
        }
        for member in m {
            assert_eq!(member.records().len(), 12, "still held until the horizon");
        }
        clock.advance_ms(1);
        let mut dropped = 0;
        let mut answered = 0;
        for member in m {
            let report = member.collect().await;
            dropped += report.dropped;
            answered += report.drops_answered;
        }
        assert_eq!((dropped, answered), (12, 36));
        for member in m {
            assert!(
                member.records().is_empty(),
                "node {} dropped all",
                member.node
            );
        }
    });
}

#[test]
fn five_nodes_exchange_only_what_both_replicate_and_every_record_ends_on_its_three() {
    let mut five = Members::start(5, system_clock(), 24 * 3_600_000, None);
    let rt = runtime();
    rt.block_on(async {
        for id in 0..40u128 {
            let member = &five.members[id as usize % 5];
            assert_eq!(send(member, "jobs", id).await, SendAnswer::Sent);
        }
    });
    five.members[1].kill();
    rt.block_on(async {
        let up: Vec<&Member> = five.members.iter().filter(|m| m.node != 2).collect();
        for id in 40..80u128 {
            assert_eq!(
                send(up[id as usize % 4], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        let delivered = drain(&up, "jobs", 20).await;
        for (i, message) in delivered.iter().take(20).enumerate() {
            assert_eq!(delete(up[i % 4], message).await, DeleteAnswer::Deleted);
        }
    });
    five.restart(1);
    let reports = rt.block_on(five.anti_entropy_pass());
    assert!(
        reports
            .iter()
            .all(|r| r.diverged == 0 && r.push_failures == 0)
    );
    assert!(reports.iter().map(|r| r.pushed + r.pulled).sum::<usize>() > 0);
    let ring = Ring::new((1..=5).map(NodeId)).expect("a ring");
    let mut holders: BTreeMap<Vec<u8>, BTreeMap<u16, String>> = BTreeMap::new();
    for member in &five.members {
        for (key, record) in member.records() {
            holders.entry(key).or_default().insert(member.node, record);
        }
    }
    assert_eq!(holders.len(), 80);
    for (key, held) in &holders {
        let key = RecordKey::decode(key).expect("a record key");
        let replicas: BTreeSet<u16> = ring
            .replicas(&key.queue, key.message)
            .iter()
            .map(|node| node.0)
            .collect();
        let nodes: BTreeSet<u16> = held.keys().copied().collect();
        assert_eq!(nodes, replicas, "exactly its three replicas hold {key:?}");
        let records: BTreeSet<&String> = held.values().collect();
        assert_eq!(records.len(), 1, "its three replicas agree on {key:?}");
    }
}

/// The name record `member` holds for `name`, as a replica.
async fn name_record(
    member: &Member,
    name: &QueueName,
) -> Option<trireme_replication::name::NameRecord> {
    let name = name.clone();
    member
        .call(move |c| async move {
            c.store()
                .name_records(None, usize::MAX, |n| *n == name)
                .expect("the name records read")
                .0
                .pop()
                .map(|(_, record)| record)
        })
        .await
}

/// spec/replication.md §1, finding N1: a replica that misses the collection of a name's
/// tombstone keeps it, and when it returns its old epoch's tombstone must not outrank the queue
/// created again meanwhile (collection moves the name to the next epoch, never back to 0).
#[test]
fn a_name_tombstone_kept_by_a_replica_that_missed_its_collection_does_not_delete_the_new_queue() {
    use std::collections::BTreeMap;
    use trireme_replication::name::{CreateAnswer, DeleteQueueAnswer};

    let clock = ManualClock::new(SystemClock.now());
    let mut three = Members::start(3, Arc::new(clock.clone()), HORIZON_MS, None);
    let ring = Ring::new((1..=3).map(NodeId)).expect("a ring");
    let name = queue("jobs");
    let replicas = ring.name_replicas(&name);
    let index = |node: NodeId| usize::from(node.0) - 1;
    let (collector, other, straggler) =
        (index(replicas[0]), index(replicas[1]), index(replicas[2]));
    let rt = runtime();
    let first = rt.block_on(async {
        let m = &three.members;
        let (n, a) = (name.clone(), BTreeMap::new());
        let created = m[collector]
            .call(move |c| async move { c.create_queue(&n, a, BTreeMap::new()).await })
            .await;
        let CreateAnswer::Created(first) = created else {
            panic!("created: {created:?}");
        };
        let n = name.clone();
        let deleted = m[collector]
            .call(move |c| async move { c.delete_queue(&n).await })
            .await;
        assert_eq!(deleted, DeleteQueueAnswer::Deleted(first));
        // The straggler holds the tombstone (its write may follow the delete's two acks).
        for _ in 0..2_000 {
            if name_record(&m[straggler], &name)
                .await
                .is_some_and(|r| r.deleted_at.is_some())
            {
                break;
            }
            // The replica store commits on its own thread: give its fsync real time, bounded by
            // the attempts (10 s at most), not a count of yields that a loaded machine outruns.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let held = name_record(&m[straggler], &name)
            .await
            .expect("a name record");
        assert!(
            held.deleted_at.is_some(),
            "the straggler holds the tombstone"
        );
        first
    });
    three.members[straggler].kill();
    clock.advance_ms(trireme_core::limits::queue_name_reuse_ms + 1);
    let second = rt.block_on(async {
        let m = &three.members;
        let report = m[collector].collect().await;
        assert_eq!(report.names_collected, 1);
        assert_eq!(report.name_writes_acked, 2, "the straggler is away");
        let moved = name_record(&m[other], &name).await.expect("a name record");
        assert_eq!(moved.deleted_at, None);
        let (n, a) = (name.clone(), BTreeMap::new());
        let created = m[other]
            .call(move |c| async move { c.create_queue(&n, a, BTreeMap::new()).await })
            .await;
        let CreateAnswer::Created(second) = created else {
            panic!("created again: {created:?}");
        };
        assert_ne!(second, first);
        second
    });
    three.restart(straggler);
    rt.block_on(async {
        let m = &three.members;
        let stale = name_record(&m[straggler], &name)
            .await
            .expect("a name record");
        assert!(
            stale.deleted_at.is_some(),
            "it came back with the old tombstone"
        );
        m[straggler].round(replicas[0].0).await;
        m[straggler].round(replicas[1].0).await;
        for member in m {
            let n = name.clone();
            let live = member
                .call(move |c| async move { c.queue_settled(&n).await })
                .await
                .expect("two replicas answer")
                .map(|state| state.incarnation);
            assert_eq!(
                live,
                Some(second),
                "node {} sees the new queue",
                member.node
            );
        }
        let records: Vec<_> = [
            name_record(&m[0], &name).await,
            name_record(&m[1], &name).await,
            name_record(&m[2], &name).await,
        ]
        .into_iter()
        .collect();
        assert!(
            records.iter().all(|r| *r == records[0]),
            "the replicas converge"
        );
    });
}

/// spec/replication.md, *Stragglers and replacement*: a member back on an empty disk learns
/// from its peers that it replaces one, answers nothing while it waits out the horizon since
/// the old disk was last heard (the other two serve), then rebuilds from both peers and votes.
#[test]
fn a_replaced_disk_waits_out_the_horizon_rebuilds_from_both_peers_and_then_votes() {
    let clock = ManualClock::new(SystemClock.now());
    let mut three = Members::start(3, Arc::new(clock.clone()), HORIZON_MS, None);
    let rt = runtime();
    rt.block_on(async {
        let m = &three.members;
        assert!(
            m.iter()
                .all(|member| member.running().cluster.join_state() == JoinState::Joined)
        );
        for id in 0..6u128 {
            assert_eq!(
                send(&m[id as usize % 3], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        let delivered = drain(&[&m[0], &m[1], &m[2]], "jobs", 6).await;
        for message in &delivered[..2] {
            assert_eq!(delete(&m[0], message).await, DeleteAnswer::Deleted);
        }
    });
    three.members[2].kill();
    three.replace(2);
    let heard = clock.now();
    rt.block_on(async {
        let m = &three.members;
        let replaced = m[2].running().cluster.clone();
        let waiting = tokio::time::timeout(WAIT_MAX, async {
            loop {
                if let JoinState::Waiting { votes_from } = replaced.join_state() {
                    return votes_from;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the replacement learns it replaces a disk");
        assert!(
            waiting.0 >= heard.0 + HORIZON_MS,
            "it waits out the horizon: votes from {waiting:?}, old disk heard by {heard:?}"
        );
        // While it waits, the other two serve: sends and deletes through them succeed, and the
        // new disk holds nothing, answering no replica request.
        for id in 6..9u128 {
            assert_eq!(
                send(&m[id as usize % 2], "jobs", id).await,
                SendAnswer::Sent
            );
        }
        assert!(
            m[2].records().is_empty(),
            "a waiting replacement stores nothing"
        );
        let refused = m[0]
            .call(|cluster| async move {
                cluster
                    .anti_entropy_round(NodeId(3), &anti_entropy(Duration::from_secs(3_600)))
                    .await
            })
            .await;
        assert!(refused.is_err(), "its replica answers nothing: {refused:?}");
        clock.advance_ms(HORIZON_MS + 1_000);
        tokio::time::timeout(WAIT_MAX, replaced.joined())
            .await
            .expect("past the horizon it rebuilds and joins");
    });
    // It rebuilt from both peers: every record (the tombstones too), and what was sent while
    // it waited.
    three.assert_identical();
    assert_eq!(three.members[2].records().len(), 9);
}

#[test]
fn an_old_disk_that_comes_back_after_its_replacement_joined_is_retired_and_serves_nothing() {
    let clock = ManualClock::new(SystemClock.now());
    let mut three = Members::start(3, Arc::new(clock.clone()), HORIZON_MS, None);
    let rt = runtime();
    rt.block_on(async {
        assert_eq!(send(&three.members[0], "jobs", 1).await, SendAnswer::Sent);
    });
    three.members[2].kill();
    // The old disk is kept aside, as an operator who moved it away would.
    let old = TempDir::new().expect("a temp dir");
    copy_files(&three.members[2].dir, old.path());
    three.replace(2);
    clock.advance_ms(HORIZON_MS + 1_000);
    rt.block_on(async {
        tokio::time::timeout(WAIT_MAX, three.members[2].running().cluster.joined())
            .await
            .expect("the replacement joins");
    });
    // The old disk comes back as node 3.
    three.members[2].kill();
    for entry in std::fs::read_dir(&three.members[2].dir).expect("the directory reads") {
        std::fs::remove_file(entry.expect("an entry").path()).expect("the file goes");
    }
    copy_files(old.path(), &three.members[2].dir);
    three.members[2].disk -= 1;
    let setup = three.setup.clone();
    three.members[2].restart(&setup);
    rt.block_on(async {
        let m = &three.members;
        let old_disk = m[2].running().cluster.clone();
        assert_eq!(
            old_disk.join_state(),
            JoinState::Joined,
            "it thinks it is a member"
        );
        // Its first request to a peer is refused as from a replaced disk: then it knows.
        let refused = send(&m[2], "jobs", 2).await;
        assert_eq!(
            refused,
            SendAnswer::Unavailable,
            "no peer acks a retired disk"
        );
        let retired = tokio::time::timeout(WAIT_MAX, async {
            loop {
                if let state @ JoinState::Retired { .. } = old_disk.join_state() {
                    return state;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the old disk learns it was replaced");
        let reason = retired.refusal().expect("a retired disk refuses");
        assert!(reason.contains("never rejoins"), "{reason}");
        // The two members and the replacement serve on.
        assert_eq!(send(&m[0], "jobs", 3).await, SendAnswer::Sent);
    });
}

fn copy_files(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).expect("the directory reads") {
        let entry = entry.expect("an entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("the file copies");
    }
}

/// The live deduplication records `member` stores, by key, as `(message, expires_at)`.
fn dedups(member: &Member) -> BTreeMap<String, (u128, u64)> {
    let now = SystemClock.now();
    let (records, _) = member
        .running()
        .cluster
        .store()
        .dedup_records(None, usize::MAX, |_, record| record.live_at(now))
        .expect("the records read");
    records
        .into_iter()
        .map(|(key, record)| {
            (
                key.id.as_str().to_owned(),
                (record.value.message.0, record.expires_at.0),
            )
        })
        .collect()
}

/// Stores the deduplication record of `id` naming `message` sent at `sent_at` on `member` alone,
/// as a put that reached one replica does.
async fn put_on_one(member: &Member, id: &str, message: u128, sent_at: Millis) {
    let key = DedupKey {
        queue: queue("orders"),
        incarnation: INCARNATION,
        id: DedupId::try_from(id).unwrap(),
    };
    member
        .call(move |cluster| async move {
            let value = DedupValue {
                message: MessageId(message),
                sent_at,
            };
            let entry = DedupEntry {
                key,
                request: DedupRequest::Put {
                    record: DedupRecord::opened(value, limits::dedup_window_ms),
                    at: sent_at,
                },
                // As of the send, so a record of a window that already ended can be planted.
                now: sent_at,
                late_ms: 10_000,
            };
            let replies = cluster.store().apply_dedups(vec![entry]).await.unwrap();
            assert!(
                matches!(replies[..], [DedupReply::Record(Some(_))]),
                "{replies:?}"
            );
        })
        .await;
}

/// spec/replication.md §4, *Anti-entropy* (planted bug `NoDedupRepair`): a put that reached one
/// replica and then lost its coordinator is spread by anti-entropy to the replicas with no live
/// record, which decides the id, and the next send of it answers that message; a record live on
/// two replicas with different values stays as it is, and an expired one is never sent.
#[test]
fn anti_entropy_spreads_a_deduplication_record_that_reached_one_replica_and_decides_the_id() {
    let three = Members::start(3, system_clock(), 24 * 3_600_000, None);
    let rt = runtime();
    let now = SystemClock.now();
    let held = |message: u128| {
        let key = RecordKey {
            queue: queue("orders"),
            incarnation: INCARNATION,
            message: MessageId(message),
        };
        let record = Record::sent_held(Birth {
            payload: format!("m{message}").into_bytes(),
            sent_at: now,
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: Some("order-1".to_owned()),
        });
        Entry {
            key,
            request: Request::Write {
                write: Box::new(Write::Merge(record)),
                ack: true,
            },
        }
    };
    rt.block_on(async {
        // Message 7's held copy on all three, its put on node 1 only; then its coordinator
        // stopped. A split of two other ids on nodes 1 and 2, and an expired record on node 1.
        for member in &three.members {
            let entry = held(7);
            member
                .call(move |cluster| async move {
                    cluster.store().apply(vec![entry]).await.unwrap();
                })
                .await;
        }
        put_on_one(&three.members[0], "order-1", 7, now).await;
        put_on_one(&three.members[0], "split", 1, now).await;
        put_on_one(&three.members[1], "split", 2, now).await;
        let ended = Millis(now.0 - limits::dedup_window_ms - 1);
        put_on_one(&three.members[0], "ended", 3, ended).await;
    });
    assert_eq!(dedups(&three.members[2]), BTreeMap::new());
    let reports = rt.block_on(three.anti_entropy_pass());
    assert!(
        reports
            .iter()
            .any(|r| r.dedups_exchanged && r.dedups_pulled + r.dedups_pushed > 0)
    );
    let window_end = now.0 + limits::dedup_window_ms;
    for member in &three.members {
        let held = dedups(member);
        assert_eq!(
            held.get("order-1"),
            Some(&(7, window_end)),
            "node {}",
            member.node
        );
        assert!(
            !held.contains_key("ended"),
            "node {}: an expired record is never sent",
            member.node
        );
    }
    assert_eq!(
        dedups(&three.members[0])["split"].0,
        1,
        "each replica keeps its value"
    );
    assert_eq!(
        dedups(&three.members[1])["split"].0,
        2,
        "each replica keeps its value"
    );
    // Every replica now holds a live record of every id: a second pass moves nothing (the
    // split's digests still differ, and stay so for the window).
    let again = rt.block_on(three.anti_entropy_pass());
    assert!(
        again.iter().all(|r| r.dedups_pulled + r.dedups_pushed == 0),
        "{again:?}"
    );
    // The id is decided: a retry through another node confirms message 7 and answers it.
    let answer = rt.block_on(three.members[1].call(move |cluster| async move {
        let birth = Birth {
            payload: b"retry".to_vec(),
            sent_at: SystemClock.now(),
            visible_from: Millis(0),
            source_queue: None,
            dedup_id: Some("order-1".to_owned()),
        };
        cluster
            .send_deduplicated(
                &queue("orders"),
                INCARNATION,
                MessageId(8),
                birth,
                DedupId::try_from("order-1").unwrap(),
            )
            .await
    }));
    assert_eq!(
        answer,
        DedupSendAnswer::Sent {
            message: MessageId(7),
            duplicate: true
        }
    );
    // Ready on the two replicas whose confirm acks the answer counted, at least.
    let m = &three.members;
    let delivered = rt.block_on(drain(&[&m[0], &m[1], &m[2]], "orders", 1));
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].key.message, MessageId(7));
}

/// Held or void copies `member` stores (spec/replication.md §4: never received or counted).
fn unsettled(member: &Member) -> usize {
    member
        .running()
        .cluster
        .store()
        .records()
        .expect("the records read")
        .iter()
        .filter(|(_, record)| record.live().is_some() && !record.ready())
        .count()
}

/// Deduplication records `member` stores, live or expired.
fn stored_dedups(member: &Member) -> usize {
    let store = member.running().cluster.store();
    store
        .dedup_records(None, usize::MAX, |_, _| true)
        .unwrap()
        .0
        .len()
}

async fn send_with_id(member: &Member, id: u128, dedup: &str, now: Millis) -> DedupSendAnswer {
    let dedup = dedup.to_owned();
    member
        .call(move |cluster| async move {
            let birth = Birth {
                payload: format!("m{id}").into_bytes(),
                sent_at: now,
                visible_from: Millis(0),
                source_queue: None,
                dedup_id: Some(dedup.clone()),
            };
            let dedup = DedupId::try_from(dedup).unwrap();
            cluster
                .send_deduplicated(&queue("orders"), INCARNATION, MessageId(id), birth, dedup)
                .await
        })
        .await
}

/// spec/replication.md §4, *WindowEnd*: at its window's end every replica drops its held and
/// void copies (a loser's, and one of a send that failed before its put) and refuses a late held
/// write; it drops the deduplication record once no put of its window can still arrive, after
/// which a send of the id is new. The confirmed message is an ordinary message throughout.
#[test]
fn the_windows_end_drops_held_and_void_copies_and_then_the_record() {
    let clock = ManualClock::new(SystemClock.now());
    let three = Members::start(3, Arc::new(clock.clone()), 24 * 3_600_000, None);
    let rt = runtime();
    let start = clock.now();
    let m = &three.members;
    let failed = RecordKey {
        queue: queue("orders"),
        incarnation: INCARNATION,
        message: MessageId(9),
    };
    let held_copy = move |sent_at: Millis| Entry {
        key: failed.clone(),
        request: Request::Write {
            write: Box::new(Write::Merge(Record::sent_held(Birth {
                payload: b"m9".to_vec(),
                sent_at,
                visible_from: Millis(0),
                source_queue: None,
                dedup_id: Some("failed".to_owned()),
            }))),
            ack: true,
        },
    };
    rt.block_on(async {
        let first = send_with_id(&m[0], 1, "order-1", start).await;
        assert_eq!(
            first,
            DedupSendAnswer::Sent {
                message: MessageId(1),
                duplicate: false
            }
        );
        let second = send_with_id(&m[1], 2, "order-1", start).await;
        assert_eq!(
            second,
            DedupSendAnswer::Sent {
                message: MessageId(1),
                duplicate: true
            }
        );
        for member in m {
            let entry = held_copy(start);
            member
                .call(move |cluster| async move { cluster.store().apply(vec![entry]).await })
                .await
                .unwrap();
        }
    });
    // Message 2's copies (void where its void landed) and message 9's held ones.
    eventually_sync(|| m.iter().all(|member| unsettled(member) == 2));
    let before: Vec<CollectionReport> = rt.block_on(async {
        let mut reports = Vec::new();
        for member in m {
            reports.push(member.collect().await);
        }
        reports
    });
    assert!(
        before
            .iter()
            .all(|r| r.copies_expired == 0 && r.dedups_expired == 0)
    );
    clock.advance_ms(limits::dedup_window_ms);
    let late =
        rt.block_on(m[0].call(move |cluster| async move {
            cluster.store().apply(vec![held_copy(start)]).await
        }));
    assert_eq!(
        late.unwrap(),
        vec![Reply::Refused],
        "a held write after its window"
    );
    for member in m {
        let report = rt.block_on(member.collect());
        assert_eq!(report.copies_expired, 2, "node {}: {report:?}", member.node);
        assert_eq!(
            report.dedups_expired, 0,
            "node {}: late puts are still refused",
            member.node
        );
        assert_eq!(unsettled(member), 0);
        assert_eq!(stored_dedups(member), 1);
    }
    // OP_TIMEOUT + SKEW_MAX later (1 s + 0.5 s here) the record goes too.
    clock.advance_ms(1_500);
    for member in m {
        let report = rt.block_on(member.collect());
        assert_eq!(report.dedups_expired, 1, "node {}: {report:?}", member.node);
        assert_eq!(stored_dedups(member), 0);
    }
    let after = rt.block_on(send_with_id(&m[2], 3, "order-1", clock.now()));
    assert_eq!(
        after,
        DedupSendAnswer::Sent {
            message: MessageId(3),
            duplicate: false
        }
    );
    // The confirmed message and the new one are both receivable.
    let delivered = rt.block_on(drain(&[&m[0], &m[1], &m[2]], "orders", 2));
    let ids: BTreeSet<u128> = delivered.iter().map(|d| d.key.message.0).collect();
    assert_eq!(ids, BTreeSet::from([1, 3]));
}

/// Polls `condition` every 5 ms, 10 s at most (the third replica's void lands unawaited).
fn eventually_sync(condition: impl Fn() -> bool) {
    for _ in 0..2_000 {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the condition did not hold within 10 s");
}
