//! One simulated run of the cluster: three or five real members (`trireme_node::cluster`: the
//! replica store on its simulated disk, the coordinator, the internal service
//! `trireme.replica.v1` over simulated TCP, anti-entropy and tombstone collection) as turmoil
//! hosts, a few client hosts calling any member's public edge through its SQS endpoint
//! ([`sqs`]) or a small front ([`front`]), the seed's
//! faults ([`faults`]) applied during the safety phase, a heal, the clients' drain, the
//! convergence check (every replica of every record identical), and the checker over the
//! history (the single node's rules, which the cluster promises too).
//!
//! Each member has its own disks ([`crate::disk::SimDisk`] on its host's simulated filesystem, with its own
//! power switch; a lost disk is replaced by a new one under another directory, with a new disk
//! id) and its own clock ([`MemberClock`]: the simulated time plus the seed's offset, which the
//! plan may step). Its random sources (claim nonces, message ids) are seeded from the run's
//! seed, its node id and its boot number. A member whose store fails exits and the harness
//! starts it again, as a supervisor would.
//!
//! This module must never let real time, real files or an unseeded random source into a run.

pub mod faults;
pub mod front;
pub mod sqs;
pub mod workload;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use trireme_node::clock::Clock;
use trireme_node::cluster::anti_entropy::AntiEntropySettings;
use trireme_node::cluster::collection::CollectionSettings;
use trireme_node::cluster::move_task::MoveTaskSettings;
use trireme_node::cluster::peers::LinkSettings;
use trireme_node::cluster::store::ReplicaStore;
use trireme_node::cluster::{Cluster, ClusterSettings};
use trireme_node::metrics::ReplicationMetrics;
use trireme_replication::NodeId;
use trireme_replication::coordinator::ReceivePath;
use turmoil::net::TcpListener;

use self::faults::{Action, ClockKind, HORIZON_MS, Plan};
use self::front::{FRONT_PORT, Front};
use self::workload::{
    ClientSetup, Convergence, DELAY_S_MAX, Phases, QUEUE_VISIBILITY_S, Shape, VISIBILITY_S_MAX,
    member_host, run_client,
};
use crate::checker::{
    Liveness, Violation, check, check_delivered_in_time, check_waiters_served, tally,
};
use crate::clock::{MemberClock, millis};
use crate::disk::{DiskMode, Power, SimFiles, SyncFailures};
use crate::history::History;
use crate::net;

/// The port of the internal service on every member.
pub const PEER_PORT: u16 = 7200;
/// Where a member keeps its replica database.
const DATA_DIR: &str = "/data";
/// redb's page cache per member.
const DB_CACHE_BYTES: usize = 4 * 1024 * 1024;
/// The simulated wall clock at the start of every run: 2026-01-01T00:00:00Z.
const EPOCH_S: u64 = 1_767_225_600;
/// A run that has not finished by then failed (its drain never ended).
const RUN_S_MAX: u64 = 240;
/// One simulation step (each host's clock advances by this much per step).
const TICK_MS: u64 = 2;
/// The safety phase, unless the options say otherwise.
pub const SAFETY_MS_DEFAULT: u64 = 30_000;
/// How long a coordinator waits for a quorum.
const OPERATION_TIMEOUT: Duration = Duration::from_millis(2_000);
/// The peer links' timeouts: shorter than a node's for the calls (the operations are too), and
/// the node's own keepalive, so a silent connection is closed as in production.
const LINK: LinkSettings = LinkSettings {
    connect_timeout: Duration::from_millis(500),
    call_timeout: Duration::from_millis(1_500),
    keepalive_interval: Duration::from_millis(trireme_node::limits::peer_keepalive_interval_ms),
    keepalive_timeout: Duration::from_millis(trireme_node::limits::peer_keepalive_timeout_ms),
};
/// L2's bound beyond visibility, delay, anti-entropy and the clocks' spread: a restarted
/// member's start and the drain's pace.
const LIVENESS_SLACK_MS: u64 = 5_000;
/// L9b's bound under [`faults::Focus::Waiters`] (`checker::check_waiters_served`): a poll
/// period, the re-poll's index read at its timeout (as long again) and a second for the claim
/// and the answer.
const WAITERS_BOUND_MS: u64 =
    2 * trireme_node::cluster::long_poll::POLL_PERIOD.as_millis() as u64 + 1_000;
/// Anti-entropy's period in a run: several passes fit between the heal and the drain's end.
const ANTI_ENTROPY_PERIOD: Duration = Duration::from_secs(3);
/// Collection's period in a run: a tombstone waits out the horizon (`HORIZON_MS`) and is
/// dropped within the run.
const COLLECTION_PERIOD: Duration = Duration::from_millis(faults::COLLECTION_PERIOD_MS);
// A pause outlasts every visibility timeout the workload asks for.
const _: () = assert!(*faults::PAUSE_MS.start() > VISIBILITY_S_MAX as u64 * 1_000);
/// turmoil's bound on a listener's backlog and a socket's buffer, in segments (64 by default).
/// turmoil panics when a backlog overflows, where an operating system would drop the SYN: a
/// paused member's held connection attempts arrive at once when it resumes, and a replacement
/// disk's member accepts nothing while it waits out the horizon. Linux's default backlog.
const TCP_CAPACITY: usize = 4_096;
/// A host's ports for outgoing connections. turmoil keeps the port of every connect that was
/// refused or abandoned before its SYN-ACK for the rest of the run (sim/README.md, *Ports*), so
/// a host uses one per connection attempt. Every port above the listeners' (at most 9324),
/// three times turmoil's default, for margin: turmoil's ran out on member 4 of fresh seed
/// 183453173, a probe storm of the node (17,371 refused connects, sim/README.md, *Findings*).
const EPHEMERAL_PORTS: std::ops::RangeInclusive<u16> = 16_384..=65_535;
/// How often a member looks whether its store failed.
const STORE_WATCH: Duration = Duration::from_millis(100);
/// How long a member whose store failed stays down before the harness starts it again.
const EXIT_RESTART_MS: u64 = 500;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Length of the safety phase (faults and the random mix).
    pub safety_ms: u64,
    /// Whether the members run anti-entropy (always, but in the test that shows the
    /// convergence check failing without it).
    pub anti_entropy: bool,
    /// A focused profile instead of the seed's random mix (`faults::Focus`), for the planted
    /// bugs whose race the random mix rarely shows.
    pub focus: Option<faults::Focus>,
}

impl Options {
    /// The default run of `seed`.
    #[must_use]
    pub fn seed(seed: u64) -> Options {
        Options {
            seed,
            safety_ms: SAFETY_MS_DEFAULT,
            anti_entropy: true,
            focus: None,
        }
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub plan: Plan,
    pub history: History,
    /// Broken promises the checker found.
    pub violations: Vec<Violation>,
    /// turmoil's error, if the run did not finish.
    pub error: Option<String>,
    /// The history's digest: equal for two runs of one seed.
    pub digest: u64,
    /// Simulated time the run took.
    pub simulated_ms: u64,
    /// Starts of each member, by node id.
    pub boots: BTreeMap<u16, u64>,
    /// What the convergence check after the drain found (none if it never ran).
    pub convergence: Option<Convergence>,
    /// The slowest first delivery after the heal, against the bound (L2).
    pub liveness: Liveness,
    pub liveness_bound_ms: u64,
    /// Whether the bound is checked: only with true clocks, where every member coordinates.
    pub liveness_enforced: bool,
    /// The receives' claims over every member's every boot, by path (spec/replication.md §13).
    pub claims: ClaimPaths,
}

/// Claims by path, each as (claimed, delivered): what the members' `trireme_receive_claims`
/// counted, so a sweep shows the claim without the read ran and how often it fell back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClaimPaths {
    /// Without the read, and no replica refused it.
    pub fast: (u64, u64),
    /// Without the read, refused before any replica took it, then read.
    pub fell_back: (u64, u64),
    /// Read first.
    pub read: (u64, u64),
}

impl ClaimPaths {
    fn of(metrics: &[ReplicationMetrics]) -> ClaimPaths {
        let sum = |path| {
            metrics.iter().fold((0, 0), |(claimed, delivered), m| {
                let (c, d) = m.receive_claims(path);
                (claimed + c, delivered + d)
            })
        };
        ClaimPaths {
            fast: sum(ReceivePath::Fast),
            fell_back: sum(ReceivePath::FellBack),
            read: sum(ReceivePath::Read),
        }
    }
}

impl Report {
    /// Whether the run finished and every rule held.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.violations.is_empty()
    }

    /// A few lines for a person: the mix, the counts, and what went wrong.
    #[must_use]
    pub fn summary(&self) -> String {
        let (acknowledged, refused, unknown) = self.history.outcome_counts();
        let tally = tally(&self.history);
        let mut text = format!(
            "cluster seed {}: {} ops ({acknowledged} acknowledged, {refused} refused, {unknown} \
             unknown), {} messages delivered ({} more than once, {} recovered from unknown \
             sends), {} faults, boots {:?}, {} simulated ms, digest {:016x}\n  mix: {:?}\n",
            self.seed,
            self.history.ops.len(),
            tally.delivered,
            tally.duplicated,
            tally.recovered,
            self.history.faults.len(),
            self.boots.values().collect::<Vec<_>>(),
            self.simulated_ms,
            self.digest,
            self.plan.mix,
        );
        text.push_str(&format!(
            "  claims (claimed, delivered): fast {:?}, fell back {:?}, read {:?}\n",
            self.claims.fast, self.claims.fell_back, self.claims.read
        ));
        if let Some(max) = self.history.max_receive_count {
            text.push_str(&format!(
                "  dead letters: {}\n",
                dead_letter_summary(&self.history, max)
            ));
        }
        text.push_str(&format!(
            "  after the heal: {} messages delivered, the slowest first delivery {} ms after the \
             heal or its send ({:?}; bound {} ms, {})\n",
            self.liveness.messages,
            self.liveness.slowest_ms,
            self.liveness.slowest,
            self.liveness_bound_ms,
            if self.liveness_enforced {
                "checked"
            } else {
                "not checked: skewed clocks"
            },
        ));
        if let Some(error) = &self.error {
            text.push_str(&format!("  run error: {error}\n"));
        }
        for violation in self.violations.iter().take(20) {
            text.push_str(&format!("  violation: {violation}\n"));
        }
        if self.violations.len() > 20 {
            text.push_str(&format!("  … and {} more\n", self.violations.len() - 20));
        }
        text
    }
}

/// What a run with a dead-letter queue did with it: deliveries from it, deliveries of a later
/// life (moved, or redriven back), dead-letter nows and the move task's start.
fn dead_letter_summary(history: &History, max: u32) -> String {
    use crate::history::{Call, Outcome};
    let (mut from_dead_letter, mut redriven) = (0, 0);
    let (mut now_acknowledged, mut now_total, mut move_task) = (0, 0, "not started".to_owned());
    let mut starts = 0;
    for op in &history.ops {
        match (&op.call, op.outcome()) {
            (Call::Receive { dead_letter, .. }, Outcome::Received(got)) => {
                if *dead_letter {
                    from_dead_letter += got.len();
                } else {
                    redriven += got.iter().filter(|d| d.generation >= 2).count();
                }
            }
            (Call::DeadLetterNow { .. }, outcome) => {
                now_total += 1;
                now_acknowledged += usize::from(outcome.acknowledged());
            }
            (Call::StartMoveTask, outcome) => {
                starts += 1;
                move_task = format!("{outcome:?}");
            }
            _ => {}
        }
    }
    format!(
        "maxReceiveCount {max}, {from_dead_letter} delivered from the dead-letter queue, \
         {redriven} redriven deliveries, dead-letter now {now_acknowledged} of {now_total} \
         acknowledged, move task {move_task} (starts: {starts})"
    )
}

/// The seed of member `node`'s random sources on its `boot`-th start.
fn member_seed(seed: u64, node: u16, boot: u64) -> u64 {
    seed.rotate_left(23)
        ^ u64::from(node).wrapping_mul(0xa076_1d64_78bd_642f)
        ^ boot.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The id of member `node`'s `disk`-th disk (1 for the first): a disk that replaces a lost one
/// has a new id, as a new database always does; a member restarted on its old disk keeps it.
fn disk_id(seed: u64, node: u16, disk: u64) -> u64 {
    member_seed(seed, node, 0) ^ disk.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xd15c
}

fn client_host(client: u32) -> String {
    format!("client{client}")
}

/// The cluster settings of member `node` of `members`.
fn settings(node: u16, members: u16, monitor_clock: bool) -> ClusterSettings {
    ClusterSettings {
        node: NodeId(node),
        peers: (1..=members)
            .filter(|peer| *peer != node)
            .map(|peer| (NodeId(peer), format!("{}:{PEER_PORT}", member_host(peer))))
            .collect(),
        operation_timeout: OPERATION_TIMEOUT,
        link: LINK,
        horizon_ms: HORIZON_MS,
        dedup_window_ms: trireme_core::limits::dedup_window_ms,
        // On whenever the members' clocks differ (spec/replication.md#clock-monitoring); off
        // where they all read turmoil's one clock, and in some runs beyond the bound, which show
        // what the protocol alone promises then.
        monitor_clock,
    }
}

/// What a member's host keeps across its starts.
#[derive(Clone)]
struct Member {
    node: u16,
    members: u16,
    seed: u64,
    monitor_clock: bool,
    anti_entropy: bool,
    power: Power,
    failures: SyncFailures,
    clock: MemberClock,
    boots: Rc<Cell<u64>>,
    /// Which disk the member runs on (1 for the first; a lost disk's replacement is the next).
    disk: Rc<Cell<u64>>,
    /// Raised when the member's store failed: it stopped and waits for the harness to take it
    /// down and start it again, as a supervisor would.
    exited: Rc<Cell<bool>>,
    history: Rc<RefCell<History>>,
    /// The metrics of every boot of every member (counters only: holding them keeps no store).
    metrics: Rc<RefCell<Vec<ReplicationMetrics>>>,
}

impl Member {
    fn exit(&self, why: &dyn std::fmt::Display) {
        self.history.borrow_mut().fault(
            crate::clock::sim_now_ms(),
            format!("member{} exited: {why}", self.node),
        );
        self.exited.set(true);
    }
}

/// Resolves with the store's fault once it has one (it then refuses everything until the
/// member restarts: spec/replication.md#durability).
async fn store_failed(store: &ReplicaStore) -> String {
    loop {
        if let Some(fault) = store.failure() {
            return fault.to_string();
        }
        tokio::time::sleep(STORE_WATCH).await;
    }
}

/// Registers `member` as a host: on every (re)start it opens its replica store from its disk,
/// joins the cluster, serves the internal service and the front, and runs anti-entropy and
/// collection; a member whose store fails exits.
fn add_member(sim: &mut turmoil::Sim<'_>, member: Member) {
    sim.host(member_host(member.node), move || {
        let member = member.clone();
        async move {
            let node = member.node;
            member.boots.set(member.boots.get() + 1);
            let member_seed = member_seed(member.seed, node, member.boots.get());
            let disk_number = member.disk.get();
            // A member whose store fails exits; it stops where it is and the harness crashes
            // it (a graceful stop would run tonic's unbiased `select!`s). Its store opens as
            // the node's does, through the node's initialisation on the simulated filesystem.
            let files = SimFiles {
                power: member.power.clone(),
                mode: DiskMode::Honest,
                failures: member.failures.clone(),
                seed: member_seed,
            };
            let opened = ReplicaStore::open_files(
                &files,
                &Path::new(DATA_DIR).join(format!("disk{disk_number}")),
                DB_CACHE_BYTES,
                NodeId(node),
                disk_id(member.seed, node, disk_number),
            )
            .map_err(|error| error.to_string());
            let (store, _committer) = match opened {
                Ok(opened) => opened,
                Err(error) => {
                    member.exit(&error);
                    return std::future::pending().await;
                }
            };
            let peer_listener =
                TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), PEER_PORT)).await?;
            let front_listener =
                TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), FRONT_PORT)).await?;
            let sqs_listener =
                TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), sqs::SQS_PORT)).await?;
            let clock: Arc<dyn Clock> = Arc::new(member.clock.clone());
            let (cluster, service) = Cluster::start_with(
                &settings(node, member.members, member.monitor_clock),
                store.clone(),
                Arc::clone(&clock),
                Some(member_seed),
                &|_, endpoint| net::lazy_channel(endpoint),
            )?;
            member.metrics.borrow_mut().push(cluster.metrics().clone());
            tokio::spawn(
                tonic::transport::Server::builder()
                    .layer(net::fixed_date())
                    .add_service(service.into_server())
                    .serve_with_incoming(net::incoming(peer_listener)),
            );
            // Held until the member goes down: dropping them stops them.
            let _background = (
                member.anti_entropy.then(|| {
                    cluster.spawn_anti_entropy(AntiEntropySettings {
                        period: ANTI_ENTROPY_PERIOD,
                        ..AntiEntropySettings::default()
                    })
                }),
                cluster.spawn_collection(CollectionSettings {
                    period: COLLECTION_PERIOD,
                    ..CollectionSettings::default()
                }),
                // The move tasks' driver (spec/replication.md §8), as the node runs it.
                cluster.spawn_move_tasks(MoveTaskSettings::default()),
            );
            let front = Front::new(cluster.clone(), clock, member_seed ^ 0x1d5);
            // The node's SQS app on the same edge; it refuses until the member has joined.
            tokio::spawn(sqs::serve(
                sqs_listener,
                front.backend.clone(),
                member_host(node),
                member_seed ^ 0x5c5,
            ));
            let serve = async {
                // A new database answers nothing until every peer has told it whether it
                // replaces a disk (spec/replication.md, *Stragglers and replacement*).
                cluster.joined().await;
                front::serve(front_listener, front).await;
            };
            tokio::select! {
                biased;
                fault = store_failed(&store) => {
                    member.exit(&format!("its store failed: {fault}"));
                    // Holding everything: nothing of it may be dropped until the crash.
                    std::future::pending::<()>().await;
                }
                () = serve => {}
            }
            Ok(())
        }
    });
}

/// What the plan's faults do to one link (a pair of hosts) at the moment: several faults may
/// overlap on one link (an isolation and a peer cut, a pause and a hold).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Faulted {
    /// Faults dropping everything both ways.
    cuts: u32,
    /// Faults dropping what the pair's first host sends to its second, and the reverse.
    one_way: [u32; 2],
    /// Faults holding everything both ways.
    holds: u32,
}

/// The state of a link in turmoil. One at a time: turmoil does not combine one-way cuts with
/// holds, a cut drops what a hold kept, and a repair leaves held messages held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkState {
    Healthy,
    Cut,
    /// Which directions are cut: first to second, second to first.
    OneWay([bool; 2]),
    Held,
}

impl Faulted {
    /// A cut wins over a one-way cut, which wins over a hold.
    fn state(self) -> LinkState {
        if self.cuts > 0 {
            LinkState::Cut
        } else if self.one_way != [0, 0] {
            LinkState::OneWay([self.one_way[0] > 0, self.one_way[1] > 0])
        } else if self.holds > 0 {
            LinkState::Held
        } else {
            LinkState::Healthy
        }
    }
}

/// The links the plan has faulted, by pair of hosts (in name order), and what turmoil was told.
#[derive(Debug, Default)]
struct Links {
    faulted: BTreeMap<(String, String), Faulted>,
    applied: BTreeMap<(String, String), LinkState>,
}

impl Links {
    fn pair(a: &str, b: &str) -> (String, String) {
        if a <= b {
            (a.to_owned(), b.to_owned())
        } else {
            (b.to_owned(), a.to_owned())
        }
    }

    /// Changes what faults hold `a`–`b` and tells turmoil the link's new state.
    fn change(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        a: &str,
        b: &str,
        change: impl FnOnce(&mut Faulted, bool),
    ) {
        let key = Links::pair(a, b);
        let faulted = self.faulted.entry(key.clone()).or_default();
        change(faulted, a <= b);
        let want = faulted.state();
        if want == LinkState::Healthy {
            self.faulted.remove(&key);
        }
        self.set(sim, &key, want);
    }

    fn set(&mut self, sim: &mut turmoil::Sim<'_>, key: &(String, String), want: LinkState) {
        let (a, b) = (key.0.as_str(), key.1.as_str());
        let was = self.applied.get(key).copied().unwrap_or(LinkState::Healthy);
        if was == want {
            return;
        }
        match was {
            LinkState::Healthy => {}
            // Delivers what was held, now.
            LinkState::Held => sim.release(a, b),
            LinkState::Cut | LinkState::OneWay(_) => sim.repair(a, b),
        }
        match want {
            LinkState::Healthy => {}
            LinkState::Cut => sim.partition(a, b),
            LinkState::OneWay([forth, back]) => {
                if forth {
                    sim.partition_oneway(a, b);
                }
                if back {
                    sim.partition_oneway(b, a);
                }
            }
            LinkState::Held => sim.hold(a, b),
        }
        if want == LinkState::Healthy {
            self.applied.remove(key);
        } else {
            self.applied.insert(key.clone(), want);
        }
    }

    fn cut(&mut self, sim: &mut turmoil::Sim<'_>, a: &str, b: &str) {
        self.change(sim, a, b, |f, _| f.cuts += 1);
    }

    fn mend(&mut self, sim: &mut turmoil::Sim<'_>, a: &str, b: &str) {
        self.change(sim, a, b, |f, _| f.cuts = f.cuts.saturating_sub(1));
    }

    /// Cuts what `from` sends to `to` (`cut`), or undoes one such cut.
    fn one_way(&mut self, sim: &mut turmoil::Sim<'_>, from: &str, to: &str, cut: bool) {
        self.change(sim, from, to, |f, forth| {
            let direction = &mut f.one_way[usize::from(!forth)];
            *direction = if cut {
                *direction + 1
            } else {
                direction.saturating_sub(1)
            };
        });
    }

    fn hold(&mut self, sim: &mut turmoil::Sim<'_>, a: &str, b: &str, hold: bool) {
        self.change(sim, a, b, |f, _| {
            f.holds = if hold {
                f.holds + 1
            } else {
                f.holds.saturating_sub(1)
            };
        });
    }

    fn is_cut(&self, a: &str, b: &str) -> bool {
        self.applied.get(&Links::pair(a, b)) == Some(&LinkState::Cut)
    }

    /// Cuts `a`–`b` for a moment (around a crash) whatever its faults; `restore` undoes it.
    fn cut_for_crash(&mut self, sim: &mut turmoil::Sim<'_>, a: &str, b: &str) {
        let key = Links::pair(a, b);
        self.set(sim, &key, LinkState::Cut);
    }

    /// Gives `a`–`b` the state its faults ask for again, after [`Links::cut_for_crash`]: what a
    /// hold kept before the crash is gone with the crash.
    fn restore(&mut self, sim: &mut turmoil::Sim<'_>, a: &str, b: &str) {
        let key = Links::pair(a, b);
        let want = self
            .faulted
            .get(&key)
            .map_or(LinkState::Healthy, |f| f.state());
        self.set(sim, &key, want);
    }

    /// Every link healthy, what was held delivered.
    fn heal(&mut self, sim: &mut turmoil::Sim<'_>) {
        self.faulted.clear();
        let keys: Vec<(String, String)> = self.applied.keys().cloned().collect();
        for key in keys {
            self.set(sim, &key, LinkState::Healthy);
        }
    }
}

struct World<'a> {
    plan: &'a Plan,
    members: u16,
    hosts: Vec<String>,
    powers: &'a BTreeMap<u16, Power>,
    clocks: &'a BTreeMap<u16, MemberClock>,
    disks: &'a BTreeMap<u16, Rc<Cell<u64>>>,
    exited: &'a BTreeMap<u16, Rc<Cell<bool>>>,
    failures: &'a [SyncFailures],
    up: BTreeMap<u16, bool>,
    /// Members that exited, and when the harness starts them again.
    restart_at: BTreeMap<u16, u64>,
    links: Links,
    history: &'a Rc<RefCell<History>>,
}

impl World<'_> {
    /// Crashes `node` as a power loss. turmoil would send a FIN or RST for every socket the
    /// crash drops, drawing network randomness in tokio's task order (not the seed's), so the
    /// member's healthy links are cut around the crash and mended right after, as in the
    /// single-node harness.
    fn crash(&mut self, sim: &mut turmoil::Sim<'_>, node: u16) {
        if !self.up[&node] {
            return;
        }
        let me = member_host(node);
        let healthy: Vec<String> = self
            .hosts
            .iter()
            .filter(|host| **host != me && !self.links.is_cut(host, &me))
            .cloned()
            .collect();
        for host in &healthy {
            self.links.cut_for_crash(sim, host, &me);
        }
        self.powers[&node].cut();
        sim.crash(me.as_str());
        for host in &healthy {
            self.links.restore(sim, host, &me);
        }
        self.up.insert(node, false);
        self.exited[&node].set(false);
    }

    fn restart(&mut self, sim: &mut turmoil::Sim<'_>, node: u16) {
        self.restart_at.remove(&node);
        if self.up[&node] {
            return;
        }
        self.powers[&node].restore();
        sim.bounce(member_host(node));
        self.up.insert(node, true);
    }

    /// Members whose store failed go down as in a crash and come up again shortly after.
    fn supervise(&mut self, sim: &mut turmoil::Sim<'_>, now_ms: u64) {
        for node in 1..=self.members {
            if self.up[&node] && self.exited[&node].get() {
                self.crash(sim, node);
                self.restart_at.insert(node, now_ms + EXIT_RESTART_MS);
            }
            if self.restart_at.get(&node).is_some_and(|at| *at <= now_ms) {
                self.restart(sim, node);
                self.history
                    .borrow_mut()
                    .fault(now_ms, format!("supervisor restarted member{node}"));
            }
        }
    }

    fn others(&self, node: u16, members_only: bool) -> Vec<String> {
        let me = member_host(node);
        self.hosts
            .iter()
            .filter(|host| **host != me && (!members_only || host.starts_with("member")))
            .cloned()
            .collect()
    }

    fn apply(&mut self, sim: &mut turmoil::Sim<'_>, action: &Action, now_ms: u64) {
        let normal = Duration::from_millis(self.plan.mix.latency_ms_max);
        match action {
            Action::Crash(node) => self.crash(sim, *node),
            Action::Restart(node) => self.restart(sim, *node),
            Action::CrashAll => {
                for node in 1..=self.members {
                    self.crash(sim, node);
                }
            }
            Action::RestartAll => {
                for node in 1..=self.members {
                    self.restart(sim, node);
                }
            }
            Action::LoseDisk(node) => {
                self.crash(sim, *node);
                // Its next start opens a new, empty disk with a new disk id.
                let disk = &self.disks[node];
                disk.set(disk.get() + 1);
            }
            Action::Isolate(node) | Action::CutPeers(node) => {
                let me = member_host(*node);
                for host in self.others(*node, matches!(action, Action::CutPeers(_))) {
                    self.links.cut(sim, &me, &host);
                }
            }
            Action::Rejoin(node) | Action::MendPeers(node) => {
                let me = member_host(*node);
                for host in self.others(*node, matches!(action, Action::MendPeers(_))) {
                    self.links.mend(sim, &me, &host);
                }
            }
            Action::CutOneWay(from, to) | Action::MendOneWay(from, to) => {
                let cut = matches!(action, Action::CutOneWay(..));
                self.links
                    .one_way(sim, &member_host(*from), &member_host(*to), cut);
            }
            Action::Hold(a, b) | Action::Release(a, b) => {
                let hold = matches!(action, Action::Hold(..));
                self.links
                    .hold(sim, &member_host(*a), &member_host(*b), hold);
            }
            Action::Pause(node) | Action::Resume(node) => {
                let me = member_host(*node);
                let hold = matches!(action, Action::Pause(_));
                for host in self.others(*node, false) {
                    self.links.hold(sim, &me, &host, hold);
                }
            }
            Action::Split(a, b) | Action::Unsplit(a, b) => {
                let cut = matches!(action, Action::Split(..));
                let (one, other): (Vec<u16>, Vec<u16>) =
                    (1..=self.members).partition(|m| m == a || m == b);
                for x in &one {
                    for y in &other {
                        let (x, y) = (member_host(*x), member_host(*y));
                        if cut {
                            self.links.cut(sim, &x, &y);
                        } else {
                            self.links.mend(sim, &x, &y);
                        }
                    }
                }
            }
            Action::Lossy(a, b, per_million) => sim.set_link_fail_rate(
                member_host(*a),
                member_host(*b),
                f64::from(*per_million) / 1_000_000.0,
            ),
            Action::Lossless(a, b) => {
                sim.set_link_fail_rate(member_host(*a), member_host(*b), 0.0);
            }
            Action::SlowLink(a, b, ms) => sim.set_link_max_message_latency(
                member_host(*a),
                member_host(*b),
                Duration::from_millis(*ms),
            ),
            Action::NormalLink(a, b) => {
                sim.set_link_max_message_latency(member_host(*a), member_host(*b), normal);
            }
            Action::StepClock(node, offset_ms) => self.clocks[node].step(*offset_ms),
            Action::Chaos => {
                for failures in self.failures {
                    failures.start();
                }
            }
            Action::Heal => {
                for failures in self.failures {
                    failures.stop();
                }
                self.links.heal(sim);
                for a in 1..=self.members {
                    for b in (a + 1)..=self.members {
                        sim.set_link_max_message_latency(member_host(a), member_host(b), normal);
                        sim.set_link_fail_rate(member_host(a), member_host(b), 0.0);
                    }
                }
                for node in 1..=self.members {
                    self.restart(sim, node);
                }
            }
        }
        self.history
            .borrow_mut()
            .fault(now_ms, format!("{action:?}"));
    }
}

/// Runs `options` to the end and checks the history.
#[must_use]
pub fn run(options: &Options) -> Report {
    let plan = faults::plan_for(options.seed, options.safety_ms, options.focus);
    let mix = plan.mix.clone();
    let members = mix.members;
    let mut builder = turmoil::Builder::new();
    builder
        .rng_seed(options.seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_S))
        .simulation_duration(Duration::from_secs(RUN_S_MAX))
        .tick_duration(Duration::from_millis(TICK_MS))
        .min_message_latency(Duration::from_millis(0))
        .max_message_latency(Duration::from_millis(mix.latency_ms_max))
        .tcp_capacity(TCP_CAPACITY)
        .ephemeral_ports(EPHEMERAL_PORTS);
    if mix.random_order {
        builder.enable_random_order();
    }
    builder.fs().sync_probability(mix.sync_probability);
    if mix.torn_writes {
        builder.fs().block_size(4096);
    }
    let mut sim = builder.build();

    let clock_spread_ms = mix.clock_spread_ms(&plan.actions);
    let history = Rc::new(RefCell::new(History {
        clock_skew_ms: TICK_MS,
        clock_spread_ms,
        held_max_ms: faults::held_max_ms(&plan.actions),
        max_receive_count: workload::max_receive_count(options.seed),
        ..History::default()
    }));
    let nodes = 1..=members;
    let powers: BTreeMap<u16, Power> = nodes.clone().map(|node| (node, Power::new())).collect();
    let clocks: BTreeMap<u16, MemberClock> = nodes
        .clone()
        .map(|node| {
            let offset_ms = mix.clocks.offsets_ms[usize::from(node - 1)];
            (node, MemberClock::new(offset_ms))
        })
        .collect();
    let boots: BTreeMap<u16, Rc<Cell<u64>>> = nodes
        .clone()
        .map(|node| (node, Rc::new(Cell::new(0))))
        .collect();
    let disks: BTreeMap<u16, Rc<Cell<u64>>> = nodes
        .clone()
        .map(|node| (node, Rc::new(Cell::new(1))))
        .collect();
    let exited: BTreeMap<u16, Rc<Cell<bool>>> = nodes
        .clone()
        .map(|node| (node, Rc::new(Cell::new(false))))
        .collect();
    let metrics = Rc::new(RefCell::new(Vec::new()));
    let failures: Vec<SyncFailures> = nodes
        .clone()
        .map(|_| SyncFailures::off_until_started(mix.sync_failure_rate))
        .collect();
    for node in nodes.clone() {
        add_member(
            &mut sim,
            Member {
                node,
                members,
                seed: options.seed,
                monitor_clock: mix.clocks.monitor,
                anti_entropy: options.anti_entropy,
                power: powers[&node].clone(),
                failures: failures[usize::from(node - 1)].clone(),
                clock: clocks[&node].clone(),
                boots: boots[&node].clone(),
                disk: disks[&node].clone(),
                exited: exited[&node].clone(),
                history: history.clone(),
                metrics: metrics.clone(),
            },
        );
    }
    // Every visibility or delay a message can be under when the drain starts has passed after
    // this long, with room for a slow receive, by every member's clock.
    let drain_quiet_ms = u64::from(VISIBILITY_S_MAX.max(QUEUE_VISIBILITY_S) + DELAY_S_MAX) * 1_000
        + 6_000
        + clock_spread_ms;
    // L2's bound (sim/README.md, *Checker*): after the heal a message may still be invisible
    // for the longest visibility a client asked for, or delayed, by the coordinators' clocks
    // (the spread); a copy on one replica only (an unknown send) reaches a quorum read within
    // two anti-entropy passes; and a member restarted at the heal measures its clocks first.
    let liveness_bound_ms = u64::from(VISIBILITY_S_MAX.max(QUEUE_VISIBILITY_S) + DELAY_S_MAX)
        * 1_000
        + 2 * u64::try_from(ANTI_ENTROPY_PERIOD.as_millis()).expect("a few seconds")
        + LIVENESS_SLACK_MS
        + clock_spread_ms;
    let phases = Phases {
        safety_end_ms: options.safety_ms,
        drain_quiet_ms,
    };
    let drained = Rc::new(Cell::new(0));
    let convergence = Rc::new(RefCell::new(None));
    for client in 0..mix.clients {
        sim.client(
            client_host(client),
            run_client(ClientSetup {
                client,
                seed: options.seed,
                members,
                clients: mix.clients,
                phases,
                history: history.clone(),
                drained: drained.clone(),
                convergence: convergence.clone(),
                shape: Shape::of(options.focus, &plan),
            }),
        );
    }

    let mut world = World {
        plan: &plan,
        members,
        hosts: nodes
            .clone()
            .map(member_host)
            .chain((0..mix.clients).map(client_host))
            .collect(),
        powers: &powers,
        clocks: &clocks,
        disks: &disks,
        exited: &exited,
        failures: &failures,
        up: nodes.clone().map(|node| (node, true)).collect(),
        restart_at: BTreeMap::new(),
        links: Links::default(),
        history: &history,
    };
    let mut next = 0;
    let mut error = None;
    loop {
        let now_ms = millis(sim.elapsed());
        while let Some((at, action)) = plan.actions.get(next) {
            if *at > now_ms {
                break;
            }
            world.apply(&mut sim, action, now_ms);
            next += 1;
        }
        world.supervise(&mut sim, now_ms);
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(failure) => {
                error = Some(failure.to_string());
                break;
            }
        }
    }
    let simulated_ms = millis(sim.elapsed());
    // Stop the members inside the simulation: their stores must not outlive the disks.
    for node in nodes {
        world.crash(&mut sim, node);
    }
    drop(world);
    drop(sim);

    let history = Rc::try_unwrap(history)
        .map(RefCell::into_inner)
        .unwrap_or_else(|shared| shared.borrow().clone());
    let convergence = convergence.borrow_mut().take();
    let heal_ms = plan
        .actions
        .iter()
        .find_map(|(at, action)| (*action == Action::Heal).then_some(*at))
        .unwrap_or(options.safety_ms);
    let (liveness, late) = check_delivered_in_time(&history, heal_ms, liveness_bound_ms);
    let liveness_enforced = mix.clocks.kind == ClockKind::True;
    let violations = if error.is_none() {
        let mut violations = check(&history);
        // With clocks skewed and monitored, the page's gate stops a member from coordinating
        // while it is off the median (spec/replication.md, *Clock monitoring*): with one
        // coordinator of five left (seed 777009), a drain can take minutes, by design. The
        // bound is checked where every member coordinates.
        if liveness_enforced {
            violations.extend(late);
        }
        // L9b with its bound, where the profile makes it a property of the history alone.
        if options.focus == Some(faults::Focus::Waiters) {
            violations.extend(check_waiters_served(
                &history,
                options.safety_ms,
                WAITERS_BOUND_MS,
            ));
        }
        match convergence.clone() {
            Some(Ok(_)) => {}
            Some(Err(differences)) => violations.push(Violation::NotConverged { differences }),
            None => violations.push(Violation::NotConverged {
                differences: vec!["never compared".to_owned()],
            }),
        }
        violations
    } else {
        Vec::new()
    };
    Report {
        seed: options.seed,
        digest: history.digest(),
        plan,
        history,
        violations,
        error,
        simulated_ms,
        boots: boots.iter().map(|(node, b)| (*node, b.get())).collect(),
        claims: ClaimPaths::of(&metrics.borrow()),
        convergence,
        liveness,
        liveness_bound_ms,
        liveness_enforced,
    }
}
