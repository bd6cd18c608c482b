//! One simulated run of the cluster: three real members (`trireme_node::cluster`: the replica
//! store on its simulated disk, the coordinator, the internal service `trireme.replica.v1`
//! over simulated TCP) as turmoil hosts, a few client hosts calling any member through a small
//! front ([`front`]), the seed's faults ([`faults`]) applied during the safety phase, a heal,
//! the clients' drain, and the checker over the history (the single node's rules, which the
//! cluster promises too).
//!
//! Each member has its own disk ([`SimDisk`] on its host's simulated filesystem, with its own
//! power switch) and reads the simulated clock. Its random sources (claim nonces, message ids)
//! are seeded from the run's seed, its node id and its boot number.
//!
//! This module must never let real time, real files or an unseeded random source into a run.

pub mod faults;
pub mod front;
pub mod workload;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use trireme_node::cluster::peers::LinkSettings;
use trireme_node::cluster::store::{REPLICA_DATABASE_FILE_NAME, ReplicaStore};
use trireme_node::cluster::{Cluster, ClusterSettings};
use trireme_proto::replica::v1::replica_server::ReplicaServer;
use trireme_replication::NodeId;
use turmoil::net::TcpListener;

use self::faults::{Action, MEMBERS, Plan, plan};
use self::front::{FRONT_PORT, Front};
use self::workload::{
    ClientSetup, DELAY_S_MAX, Phases, QUEUE_VISIBILITY_S, VISIBILITY_S_MAX, member_host, run_client,
};
use crate::checker::{Violation, check, tally};
use crate::clock::{SimClock, millis};
use crate::disk::{DiskMode, Power, SimDisk, SyncFailures};
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
/// The peer links' timeouts: a dead connection is noticed within about a second.
const LINK: LinkSettings = LinkSettings {
    connect_timeout: Duration::from_millis(500),
    call_timeout: Duration::from_millis(1_500),
    keepalive_interval: Duration::from_millis(1_000),
    keepalive_timeout: Duration::from_millis(1_000),
};
/// The tombstone horizon: far beyond a run, so no request is ever refused for its age.
const HORIZON_MS: u64 = 24 * 3_600_000;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Length of the safety phase (faults and the random mix).
    pub safety_ms: u64,
}

impl Options {
    /// The default run of `seed`.
    #[must_use]
    pub fn seed(seed: u64) -> Options {
        Options {
            seed,
            safety_ms: SAFETY_MS_DEFAULT,
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

/// The seed of member `node`'s random sources on its `boot`-th start.
fn member_seed(seed: u64, node: u16, boot: u64) -> u64 {
    seed.rotate_left(23)
        ^ u64::from(node).wrapping_mul(0xa076_1d64_78bd_642f)
        ^ boot.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn client_host(client: u32) -> String {
    format!("client{client}")
}

/// The cluster settings of member `node`.
fn settings(node: u16) -> ClusterSettings {
    ClusterSettings {
        node: NodeId(node),
        peers: (1..=MEMBERS)
            .filter(|peer| *peer != node)
            .map(|peer| (NodeId(peer), format!("{}:{PEER_PORT}", member_host(peer))))
            .collect(),
        operation_timeout: OPERATION_TIMEOUT,
        link: LINK,
        horizon_ms: HORIZON_MS,
        dedup_window_ms: trireme_core::limits::dedup_window_ms,
        // Every host reads turmoil's one clock: no skew to find, and probes would reshape
        // every seed's schedule.
        monitor_clock: false,
    }
}

/// Registers member `node` as a host: on every (re)start it opens its replica store from its
/// disk, joins the cluster, serves the internal service and the front.
fn add_member(
    sim: &mut turmoil::Sim<'_>,
    node: u16,
    seed: u64,
    power: &Power,
    boots: &Rc<Cell<u64>>,
) {
    let power = power.clone();
    let boots = boots.clone();
    sim.host(member_host(node), move || {
        let power = power.clone();
        let boots = boots.clone();
        async move {
            boots.set(boots.get() + 1);
            let member_seed = member_seed(seed, node, boots.get());
            let path = Path::new(DATA_DIR).join(REPLICA_DATABASE_FILE_NAME);
            let disk = SimDisk::open(
                &path,
                power,
                DiskMode::Honest,
                SyncFailures::new(0.0),
                member_seed,
            )?;
            // The disk id is kept from the first start: a new one only for a new database.
            let (store, _committer) =
                ReplicaStore::open_backend(disk, DB_CACHE_BYTES, NodeId(node), member_seed)?;
            let peer_listener =
                TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), PEER_PORT)).await?;
            let front_listener =
                TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), FRONT_PORT)).await?;
            let (cluster, service) = Cluster::start_with(
                &settings(node),
                store,
                Arc::new(SimClock),
                Some(member_seed),
                &|_, endpoint| net::lazy_channel(endpoint),
            )?;
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(ReplicaServer::new(service))
                    .serve_with_incoming(net::incoming(peer_listener)),
            );
            // A new database answers nothing until every peer has told it whether it replaces
            // a disk (spec/replication.md, *Stragglers and replacement*).
            cluster.joined().await;
            front::serve(front_listener, Front::new(cluster, member_seed ^ 0x1d5)).await;
            Ok(())
        }
    });
}

/// Which pairs of hosts the plan has cut, with how many faults cut each (an isolation and a
/// peer cut may overlap).
#[derive(Debug, Default)]
struct Cuts {
    pairs: BTreeMap<(String, String), u32>,
}

impl Cuts {
    fn pair(a: &str, b: &str) -> (String, String) {
        if a <= b {
            (a.to_owned(), b.to_owned())
        } else {
            (b.to_owned(), a.to_owned())
        }
    }

    fn cut(&mut self, sim: &mut turmoil::Sim<'_>, a: &str, b: &str) {
        let count = self.pairs.entry(Cuts::pair(a, b)).or_default();
        *count += 1;
        if *count == 1 {
            sim.partition(a, b);
        }
    }

    fn mend(&mut self, sim: &mut turmoil::Sim<'_>, a: &str, b: &str) {
        let key = Cuts::pair(a, b);
        if let Some(count) = self.pairs.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                self.pairs.remove(&key);
                sim.repair(a, b);
            }
        }
    }

    fn is_cut(&self, a: &str, b: &str) -> bool {
        self.pairs.contains_key(&Cuts::pair(a, b))
    }
}

struct World<'a> {
    plan: &'a Plan,
    hosts: Vec<String>,
    powers: &'a BTreeMap<u16, Power>,
    up: BTreeMap<u16, bool>,
    cuts: Cuts,
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
            .filter(|host| **host != me && !self.cuts.is_cut(host, &me))
            .cloned()
            .collect();
        for host in &healthy {
            sim.partition(host.as_str(), me.as_str());
        }
        self.powers[&node].cut();
        sim.crash(me.as_str());
        for host in &healthy {
            sim.repair(host.as_str(), me.as_str());
        }
        self.up.insert(node, false);
    }

    fn restart(&mut self, sim: &mut turmoil::Sim<'_>, node: u16) {
        if self.up[&node] {
            return;
        }
        self.powers[&node].restore();
        sim.bounce(member_host(node));
        self.up.insert(node, true);
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
            Action::Isolate(node) | Action::CutPeers(node) => {
                let me = member_host(*node);
                for host in self.others(*node, matches!(action, Action::CutPeers(_))) {
                    self.cuts.cut(sim, &me, &host);
                }
            }
            Action::Rejoin(node) | Action::MendPeers(node) => {
                let me = member_host(*node);
                for host in self.others(*node, matches!(action, Action::MendPeers(_))) {
                    self.cuts.mend(sim, &me, &host);
                }
            }
            Action::SlowLink(a, b, ms) => sim.set_link_max_message_latency(
                member_host(*a),
                member_host(*b),
                Duration::from_millis(*ms),
            ),
            Action::NormalLink(a, b) => {
                sim.set_link_max_message_latency(member_host(*a), member_host(*b), normal);
            }
            Action::Heal => {
                for ((a, b), _) in std::mem::take(&mut self.cuts.pairs) {
                    sim.repair(a.as_str(), b.as_str());
                }
                for a in 1..=MEMBERS {
                    for b in (a + 1)..=MEMBERS {
                        sim.set_link_max_message_latency(member_host(a), member_host(b), normal);
                    }
                }
                for node in 1..=MEMBERS {
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
    let plan = plan(options.seed, options.safety_ms);
    let mix = plan.mix.clone();
    let mut builder = turmoil::Builder::new();
    builder
        .rng_seed(options.seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_S))
        .simulation_duration(Duration::from_secs(RUN_S_MAX))
        .tick_duration(Duration::from_millis(TICK_MS))
        .min_message_latency(Duration::from_millis(0))
        .max_message_latency(Duration::from_millis(mix.latency_ms_max));
    if mix.random_order {
        builder.enable_random_order();
    }
    builder.fs().sync_probability(mix.sync_probability);
    if mix.torn_writes {
        builder.fs().block_size(4096);
    }
    let mut sim = builder.build();

    let history = Rc::new(RefCell::new(History {
        clock_skew_ms: TICK_MS,
        ..History::default()
    }));
    let powers: BTreeMap<u16, Power> = (1..=MEMBERS).map(|node| (node, Power::new())).collect();
    let boots: BTreeMap<u16, Rc<Cell<u64>>> = (1..=MEMBERS)
        .map(|node| (node, Rc::new(Cell::new(0))))
        .collect();
    for node in 1..=MEMBERS {
        add_member(&mut sim, node, options.seed, &powers[&node], &boots[&node]);
    }
    // Every visibility or delay a message can be under when the drain starts has passed after
    // this long, with room for a slow receive.
    let drain_quiet_ms =
        u64::from(VISIBILITY_S_MAX.max(QUEUE_VISIBILITY_S) + DELAY_S_MAX) * 1_000 + 6_000;
    let phases = Phases {
        safety_end_ms: options.safety_ms,
        drain_quiet_ms,
    };
    for client in 0..mix.clients {
        sim.client(
            client_host(client),
            run_client(ClientSetup {
                client,
                seed: options.seed,
                phases,
                history: history.clone(),
            }),
        );
    }

    let mut world = World {
        plan: &plan,
        hosts: (1..=MEMBERS)
            .map(member_host)
            .chain((0..mix.clients).map(client_host))
            .collect(),
        powers: &powers,
        up: (1..=MEMBERS).map(|node| (node, true)).collect(),
        cuts: Cuts::default(),
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
    for node in 1..=MEMBERS {
        world.crash(&mut sim, node);
    }
    drop(world);
    drop(sim);

    let history = Rc::try_unwrap(history)
        .map(RefCell::into_inner)
        .unwrap_or_else(|shared| shared.borrow().clone());
    let violations = if error.is_none() {
        check(&history)
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
    }
}
