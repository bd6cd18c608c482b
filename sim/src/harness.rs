//! One simulated run: a turmoil world with one Trireme node and a few client hosts, the seed's
//! fault plan applied step by step during the safety phase, a heal, the clients' drain, and the
//! checker over the history.
//!
//! The node is the real `trireme-node` (engine, redb storage, gRPC service) started with
//! [`Node::start`] on a simulated disk ([`SimDisk`]), simulated TCP and the simulated clock.
//! Its random source is seeded from the run's seed and its boot number, so two boots never
//! draw the same message ids (as two boots seeded by the operating system would not).
//!
//! This module must never let real time, real files or an unseeded random source into a run.

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use trireme_node::config::Config;
use trireme_node::storage::Storage;
use trireme_node::{Node, NodeError};
use turmoil::net::TcpListener;

use crate::checker::{Violation, check, tally};
use crate::clock::{SimClock, millis};
use crate::disk::{DiskMode, Power, SimFiles, SyncFailures};
use crate::faults::{Action, Plan, plan};
use crate::history::History;
use crate::net;
use crate::workload::{
    ClientSetup, DELAY_S_MAX, NODE_HOST, Phases, QUEUE_VISIBILITY_S, VISIBILITY_S_MAX, run_client,
};

/// The node's data directory on its simulated disk (`Storage::open_files` keeps its database
/// there, as on a real disk).
const DATABASE_DIR: &str = "/data";
/// redb's page cache on the simulated node (small: the data set is small).
const DB_CACHE_BYTES: usize = 4 * 1024 * 1024;
/// The simulated wall clock at the start of every run: 2026-01-01T00:00:00Z.
const EPOCH_S: u64 = 1_767_225_600;
/// A run that has not finished by then failed (its drain never ended).
const RUN_S_MAX: u64 = 240;
/// One simulation step. Each host's clock advances by this much per step; 2 ms keeps
/// interleavings fine-grained at half the cost of 1 ms.
const TICK_MS: u64 = 2;
/// How long a node that exited stays down before it is started again.
const EXIT_RESTART_MS: u64 = 500;
/// Exits after the heal that end a run: with no faults left, a node that exits this often will
/// never serve again.
const EXITS_AFTER_HEAL_MAX: u32 = 3;
/// The safety phase, unless the options say otherwise.
pub const SAFETY_MS_DEFAULT: u64 = 30_000;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Length of the safety phase (faults and the random mix).
    pub safety_ms: u64,
    /// The disk under the node.
    pub disk: DiskMode,
    /// At least one crash in the plan.
    pub force_crash: bool,
    /// Whether the seed may also draw disk faults (unsynced writes flushed at random, torn
    /// writes on crash). Off for the lying disk, whose unsynced state is all there is: torn
    /// pages there make the database unreadable instead of merely old.
    pub disk_faults: bool,
}

impl Options {
    /// The default run of `seed`.
    #[must_use]
    pub fn seed(seed: u64) -> Options {
        Options {
            seed,
            safety_ms: SAFETY_MS_DEFAULT,
            disk: DiskMode::Honest,
            force_crash: false,
            disk_faults: true,
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
    /// turmoil's error, if the run did not finish (a host failed, or the drain never ended).
    pub error: Option<String>,
    /// The history's digest: equal for two runs of one seed.
    pub digest: u64,
    /// Simulated time the run took.
    pub simulated_ms: u64,
    /// How many times the node started.
    pub boots: u64,
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
            "seed {}: {} ops ({acknowledged} acknowledged, {refused} refused, {unknown} unknown), \
             {} messages delivered ({} more than once, {} recovered from unknown sends), \
             {} faults, {} boots, {} simulated ms, digest {:016x}\n  mix: {:?}\n",
            self.seed,
            self.history.ops.len(),
            tally.delivered,
            tally.duplicated,
            tally.recovered,
            self.history.faults.len(),
            self.boots,
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

/// The seed of the node's random source on its `boot`-th start.
fn node_seed(seed: u64, boot: u64) -> u64 {
    seed.rotate_left(17) ^ boot.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x00de_5eed
}

fn client_host(client: u32) -> String {
    format!("client{client}")
}

/// Runs `options` to the end and checks the history.
#[must_use]
pub fn run(options: &Options) -> Report {
    let plan = plan(options.seed, options.safety_ms, options.force_crash);
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
    if options.disk_faults {
        builder.fs().sync_probability(mix.sync_probability);
    }
    if options.disk_faults && mix.torn_writes {
        builder.fs().block_size(4096);
    }
    let mut sim = builder.build();

    let history = Rc::new(RefCell::new(History {
        clock_skew_ms: TICK_MS,
        ..History::default()
    }));
    let power = Power::new();
    let sync_failures = SyncFailures::new(if options.disk_faults {
        mix.sync_failure_rate
    } else {
        0.0
    });
    let boots = Rc::new(Cell::new(0_u64));
    // Raised by a node whose storage failed: it has stopped and waits to be taken down.
    let exited = Rc::new(Cell::new(false));
    {
        let power = power.clone();
        let sync_failures = sync_failures.clone();
        let boots = boots.clone();
        let history = history.clone();
        let exited = exited.clone();
        let seed = options.seed;
        let disk_mode = options.disk;
        sim.host(NODE_HOST, move || {
            let power = power.clone();
            let sync_failures = sync_failures.clone();
            let boots = boots.clone();
            let history = history.clone();
            let exited = exited.clone();
            async move {
                boots.set(boots.get() + 1);
                let node_seed = node_seed(seed, boots.get());
                // A node whose storage fails exits, as the binary does. Here it stops where it
                // is and raises `exited`; the harness then takes it down as in a crash and
                // starts it again, as a supervisor would. (Letting the future return would run
                // the gRPC server's graceful shutdown, whose `select!` draws from tokio's
                // unseeded random source, and leave its tasks frozen until the restart.)
                let exit = |error: &dyn std::fmt::Display| {
                    history
                        .borrow_mut()
                        .fault(crate::clock::sim_now_ms(), format!("node exited: {error}"));
                    exited.set(true);
                };
                // The node's own initialisation, on the simulated filesystem.
                let files = SimFiles {
                    power: power.clone(),
                    mode: disk_mode,
                    failures: sync_failures.clone(),
                    seed: node_seed,
                };
                let opened = Storage::open_files(&files, Path::new(DATABASE_DIR), DB_CACHE_BYTES);
                let storage = match opened {
                    Ok(storage) => storage,
                    Err(error) => {
                        exit(&error);
                        return std::future::pending().await;
                    }
                };
                let listener =
                    TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), net::GRPC_PORT)).await?;
                let mut config = Config::with_data_dir(DATABASE_DIR);
                config.sqs = None;
                config.seed = Some(node_seed);
                config.db_cache_bytes = DB_CACHE_BYTES;
                let started = Node::start(
                    &config,
                    storage,
                    net::incoming(listener),
                    Arc::new(SimClock),
                );
                let mut node = match started {
                    Ok(node) => node,
                    Err(error @ (NodeError::Storage(_) | NodeError::Engine(_))) => {
                        exit(&error);
                        return std::future::pending().await;
                    }
                    Err(error) => return Err(error.into()),
                };
                match node.serve_until_failure().await {
                    Err(error @ NodeError::Engine(_)) => {
                        exit(&error);
                        // Holding `node`: nothing of it may run or be dropped until the crash.
                        std::future::pending::<()>().await;
                        drop(node);
                        Ok(())
                    }
                    other => Ok(other?),
                }
            }
        });
    }
    // Every visibility or delay a message can be under when the drain starts has passed after
    // this long, with room for two long polls.
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
        mix: &mix,
        power: &power,
        sync_failures: &sync_failures,
        node_up: true,
        restart_at_ms: None,
        healed: false,
        exits_after_heal: 0,
        links: vec![Link::default(); usize::try_from(mix.clients).expect("a few clients")],
        history: &history,
    };
    let mut next = 0;
    let mut error = None;
    loop {
        let now_ms = millis(sim.elapsed());
        if world.node_up && exited.replace(false) {
            // The node exited (its storage failed): down as in a crash, up again shortly.
            crash_node(&mut sim, &power, &world.links);
            world.node_up = false;
            world.restart_at_ms = Some(now_ms + EXIT_RESTART_MS);
            if world.healed {
                world.exits_after_heal += 1;
                if world.exits_after_heal >= EXITS_AFTER_HEAL_MAX {
                    let last = history.borrow().faults.last().map(|(_, what)| what.clone());
                    error = Some(format!(
                        "the node cannot start after the heal (no faults left): {}",
                        last.unwrap_or_default()
                    ));
                    break;
                }
            }
        }
        if world.restart_at_ms.is_some_and(|at| at <= now_ms) {
            restart_node(&mut sim, &mut world);
            world
                .history
                .borrow_mut()
                .fault(now_ms, "supervisor restart".to_owned());
        }
        while let Some((at, action)) = plan.actions.get(next) {
            if *at > now_ms {
                break;
            }
            apply(&mut sim, &mut world, action, now_ms);
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
    // Stop the node inside the simulation: its storage must not outlive the simulated disk.
    if world.node_up {
        crash_node(&mut sim, &power, &world.links);
    }
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
        boots: boots.get(),
    }
}

/// What the harness did to each client's link to the node, so a crash can leave it as it was.
#[derive(Clone, Copy, Debug, Default)]
struct Link {
    partitioned: bool,
    held: bool,
}

/// Crashes the node as a power loss: its sockets vanish without a word. turmoil would send a
/// FIN or RST for every socket the crash drops, drawing network randomness in the order tokio
/// drops the node's tasks, which follows process-wide task ids and differs between two runs of
/// one seed. So the node's healthy links are cut around the crash (what was in flight dies
/// with the machine) and mended right after; clients notice through keepalive, as they would.
fn crash_node(sim: &mut turmoil::Sim<'_>, power: &Power, links: &[Link]) {
    let healthy: Vec<String> = links
        .iter()
        .enumerate()
        .filter(|(_, link)| !link.partitioned && !link.held)
        .map(|(client, _)| client_host(u32::try_from(client).expect("a few clients")))
        .collect();
    for host in &healthy {
        sim.partition(host.as_str(), NODE_HOST);
    }
    power.cut();
    sim.crash(NODE_HOST);
    for host in &healthy {
        sim.repair(host.as_str(), NODE_HOST);
    }
}

/// Starts the crashed node again from its disk.
fn restart_node(sim: &mut turmoil::Sim<'_>, world: &mut World<'_>) {
    world.power.restore();
    sim.bounce(NODE_HOST);
    world.node_up = true;
    world.restart_at_ms = None;
}

struct World<'a> {
    mix: &'a crate::faults::Mix,
    power: &'a Power,
    sync_failures: &'a SyncFailures,
    node_up: bool,
    /// When an exited node is started again.
    restart_at_ms: Option<u64>,
    /// Whether the heal happened: no fault may stop the node any more.
    healed: bool,
    /// Exits since the heal: each one is a node that cannot start on a healthy machine.
    exits_after_heal: u32,
    links: Vec<Link>,
    history: &'a Rc<RefCell<History>>,
}

fn apply(sim: &mut turmoil::Sim<'_>, world: &mut World<'_>, action: &Action, now_ms: u64) {
    let normal_latency = Duration::from_millis(world.mix.latency_ms_max);
    let link = |client: &u32| usize::try_from(*client).expect("a few clients");
    match action {
        Action::CrashNode => {
            if !world.node_up {
                return;
            }
            crash_node(sim, world.power, &world.links);
            world.node_up = false;
        }
        Action::RestartNode => {
            if world.node_up {
                return;
            }
            restart_node(sim, world);
        }
        Action::Partition(client) => {
            sim.partition(client_host(*client), NODE_HOST);
            world.links[link(client)].partitioned = true;
        }
        Action::Repair(client) => {
            sim.repair(client_host(*client), NODE_HOST);
            world.links[link(client)] = Link::default();
        }
        Action::Hold(client) => {
            sim.hold(client_host(*client), NODE_HOST);
            world.links[link(client)].held = true;
        }
        Action::Release(client) => {
            // turmoil's release makes the link healthy, partitioned or not.
            sim.release(client_host(*client), NODE_HOST);
            world.links[link(client)] = Link::default();
        }
        Action::SlowLink(client, ms) => sim.set_link_max_message_latency(
            client_host(*client),
            NODE_HOST,
            Duration::from_millis(*ms),
        ),
        Action::NormalLink(client) => {
            sim.set_link_max_message_latency(client_host(*client), NODE_HOST, normal_latency);
        }
        Action::Heal => {
            for client in 0..world.mix.clients {
                let host = client_host(client);
                sim.release(host.as_str(), NODE_HOST);
                sim.repair(host.as_str(), NODE_HOST);
                sim.set_link_max_message_latency(host.as_str(), NODE_HOST, normal_latency);
            }
            world.links.fill(Link::default());
            world.sync_failures.stop();
            world.healed = true;
            if !world.node_up {
                restart_node(sim, world);
            }
        }
    }
    world
        .history
        .borrow_mut()
        .fault(now_ms, format!("{action:?}"));
}
