//! Clock monitoring's driver (spec/replication.md#clock-monitoring): one probe loop per peer asks
//! for the peer's clock every `SKEW_PROBE_PERIOD` (and at once when asked), feeds the round
//! trips to the pure monitor (`trireme_replication::skew`), and the gate tells coordinators
//! whether this node may coordinate now. It logs once when the node stops coordinating and once
//! when it resumes.
//!
//! This module must never decide what a sample means: the monitor does. It must never stop the
//! replica side: the gate is asked only by what coordinates (client calls, collection).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tracing::{error, info, warn};
use trireme_proto::replica::v1 as pb;
use trireme_proto::replica::v1::replica_client::ReplicaClient;
use trireme_replication::NodeId;
use trireme_replication::skew::{Sample, SkewMonitor, SkewSettings, Standing};

use super::peers::Identity;
use super::signal::Signal;
use super::wire;

/// `SKEW_PROBE_PERIOD`: between two probes of one peer.
pub const SKEW_PROBE_PERIOD: Duration = Duration::from_secs(1);
/// `SKEW_PROBE_ASKED_GAP`: at least this long between the starts of two probes of one peer when
/// a call asks for probes now. A call waiting at the gate asks again after every sample; without
/// a gap the probes to every peer ran back to back at the network's round trip, each one to a
/// peer that refuses connections a new connection attempt (sim/README.md, *Findings*, ports).
pub const SKEW_PROBE_ASKED_GAP: Duration = Duration::from_millis(100);

/// The monitor of this node's clock, shared by the probe loops and the gate.
pub(super) struct ClockWatch {
    me: Identity,
    monitor: Mutex<Watched>,
    /// Bumped after every sample, for a gate waiting for a standing (many calls may wait at
    /// once: a [`Signal`] resumes them in a fixed order).
    sampled: Signal<u64>,
    /// Wakes every probe loop for a probe now.
    probe_now: Notify,
}

struct Watched {
    monitor: SkewMonitor,
    /// Whether the node coordinated at the last assessment (none yet: `None`), so that each
    /// change is logged once.
    coordinating: Option<bool>,
    /// Each peer's version as its latest probe reply gave it (shown to operators only).
    versions: BTreeMap<NodeId, String>,
}

/// Characters of a peer's version kept at most (a version string is short; a longer one is cut).
const VERSION_CHARS_MAX: usize = 64;

/// The probe loops; dropping it stops them.
pub(super) struct Probes {
    _loops: JoinSet<()>,
}

impl ClockWatch {
    /// A watch of `me`'s clock against `peers`, nothing measured yet.
    pub(super) fn new(me: Identity, peers: impl IntoIterator<Item = NodeId>) -> Arc<ClockWatch> {
        Arc::new(ClockWatch {
            me,
            monitor: Mutex::new(Watched {
                monitor: SkewMonitor::new(peers, SkewSettings::default()),
                coordinating: None,
                versions: BTreeMap::new(),
            }),
            sampled: Signal::new(0),
            probe_now: Notify::new(),
        })
    }

    /// Starts one probe loop per peer, over `clients`.
    pub(super) fn spawn(
        self: &Arc<ClockWatch>,
        clients: BTreeMap<NodeId, ReplicaClient<Channel>>,
        peers: &super::peers::Peers,
    ) -> Probes {
        let mut loops = JoinSet::new();
        for (peer, client) in clients {
            let watch = Arc::clone(self);
            let peers = peers.clone();
            loops.spawn(async move { watch.probe_loop(peer, client, peers).await });
        }
        Probes { _loops: loops }
    }

    async fn probe_loop(
        &self,
        peer: NodeId,
        mut client: ReplicaClient<Channel>,
        peers: super::peers::Peers,
    ) {
        loop {
            let started = tokio::time::Instant::now();
            let wake = self.probe_now.notified();
            let sender = self.me.now();
            let request = pb::ClockRequest {
                sender: Some(sender.into()),
            };
            // A failed probe is no sample: the peer's old samples age out.
            let answered = client.clock(request).await;
            if let Err(status) = &answered {
                // A peer that refuses this node's disk as replaced: it is retired.
                peers.note_refusal(status);
            }
            if let Ok(reply) = answered
                && let Ok(replier) = wire::sender(reply.get_ref().sender.as_ref())
                && replier.node == peer
            {
                let sample = Sample {
                    sent_ms: sender.clock.0,
                    peer_ms: replier.clock.0,
                    received_ms: self.me.clock.now().0,
                };
                let version: String = reply
                    .get_ref()
                    .version
                    .chars()
                    .filter(|c| !c.is_control())
                    .take(VERSION_CHARS_MAX)
                    .collect();
                let mut watched = self
                    .monitor
                    .lock()
                    .expect("the monitor lock is never poisoned");
                watched.monitor.observe(peer, sample);
                if !version.is_empty() {
                    watched.versions.insert(peer, version);
                }
                drop(watched);
                self.assess();
                self.sampled.modify(|count| *count += 1);
            }
            tokio::select! {
                // The first branch first: a deterministic choice, for the simulation.
                biased;
                () = wake => tokio::time::sleep_until(started + SKEW_PROBE_ASKED_GAP).await,
                () = tokio::time::sleep(SKEW_PROBE_PERIOD) => {}
            }
        }
    }

    /// Each peer's clock offset now from its freshest tightest sample (`None`: the peer
    /// answered no probe within the sample age), in id order.
    pub(super) fn peer_offsets(&self) -> Vec<(NodeId, Option<trireme_replication::skew::Offset>)> {
        self.monitor
            .lock()
            .expect("the monitor lock is never poisoned")
            .monitor
            .peer_offsets(self.me.clock.now().0)
    }

    /// Each peer's version as its latest probe reply gave it (a peer that never answered, or
    /// sends none, is missing).
    pub(super) fn peer_versions(&self) -> BTreeMap<NodeId, String> {
        self.monitor
            .lock()
            .expect("the monitor lock is never poisoned")
            .versions
            .clone()
    }

    /// The standing now, logging a change of whether the node coordinates.
    fn assess(&self) -> Standing {
        let mut watched = self
            .monitor
            .lock()
            .expect("the monitor lock is never poisoned");
        let standing = watched.monitor.assess(self.me.clock.now().0);
        let coordinating = standing.coordinates();
        if watched.coordinating != Some(coordinating) {
            match (&standing, watched.coordinating) {
                (Standing::Within { .. }, None) => {
                    info!(%standing, "clock measured against the peers: coordinating");
                }
                (Standing::Within { .. }, Some(_)) => {
                    info!(%standing, "clock back within the bound: coordinating again");
                }
                (Standing::Beyond { .. }, _) => {
                    error!(%standing, "clock beyond the bound: this node stops coordinating and sweeping until it is back (it still serves as a replica)");
                }
                (Standing::Unmeasured { .. }, Some(true)) => {
                    warn!(%standing, "clock unmeasured: this node stops coordinating and sweeping until enough peers answer");
                }
                // A node that has just started is unmeasured until its first probes answer.
                (Standing::Unmeasured { .. }, _) => {}
            }
            watched.coordinating = Some(coordinating);
        }
        standing
    }

    /// Whether this node may coordinate now. An unmeasured node asks for probes at once and
    /// waits up to `wait` for a standing; a node beyond the bound is refused at once.
    ///
    /// # Errors
    /// The standing that does not coordinate.
    pub(super) async fn gate(&self, wait: Duration) -> Result<(), Standing> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Read before assessing: a sample taken after the assessment wakes the wait below.
            let seen = self.sampled.get();
            let standing = self.assess();
            match standing {
                Standing::Within { .. } => return Ok(()),
                Standing::Beyond { cluster, bound_ms } if !uncertain(cluster, bound_ms) => {
                    return Err(standing);
                }
                // Unmeasured, or beyond only by the round trips' width: a tighter sample may
                // settle it (spec/replication.md#clock-monitoring, *Assess*).
                Standing::Beyond { .. } | Standing::Unmeasured { .. } => {
                    self.probe_now.notify_waiters();
                    let sampled = self.sampled.wait_for(|count| *count != seen);
                    if tokio::time::timeout_at(deadline, sampled).await.is_err() {
                        return Err(standing);
                    }
                }
            }
        }
    }
}

/// Whether the cluster's clock may be within `bound_ms` of this node's after all: some offset
/// in its interval is, so the standing is beyond only by the samples' uncertainty.
fn uncertain(cluster: trireme_replication::skew::Offset, bound_ms: u64) -> bool {
    let bound = i64::try_from(bound_ms).unwrap_or(i64::MAX);
    cluster.low_ms <= bound && cluster.high_ms >= -bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tonic::transport::{Endpoint, Uri};
    use trireme_core::Millis;
    use trireme_replication::skew::Offset;

    use crate::clock::ManualClock;
    use crate::cluster::peers::{LinkSettings, Peers};

    /// Calls waiting at the gate ask for probes after every sample; a probe loop answers at
    /// most once per `SKEW_PROBE_ASKED_GAP`, never back to back. Against a peer that refuses
    /// connections each probe is a connection attempt: seed 183453173 of the cluster
    /// simulation made 17,371 of them from one member, about 1,000 a second.
    #[tokio::test]
    async fn probes_asked_for_at_every_sample_are_spaced() {
        let attempts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&attempts);
        let refusing = Endpoint::from_static("http://peer.invalid:7200")
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    Err::<hyper_util::rt::TokioIo<tokio::net::TcpStream>, _>(std::io::Error::from(
                        std::io::ErrorKind::ConnectionRefused,
                    ))
                }
            }));
        let me = Identity {
            node: NodeId(1),
            disk_id: 1,
            clock: Arc::new(ManualClock::new(Millis(1_000))),
        };
        let settings = LinkSettings {
            connect_timeout: Duration::from_millis(500),
            call_timeout: Duration::from_millis(500),
            keepalive_interval: Duration::from_secs(1),
            keepalive_timeout: Duration::from_secs(1),
        };
        let peers = Peers::connect_with(&me, &BTreeMap::new(), settings, &|_, endpoint| {
            endpoint.connect_lazy()
        })
        .expect("no peers to address");
        let watch = ClockWatch::new(me, [NodeId(2)]);
        let _probes = watch.spawn(
            BTreeMap::from([(NodeId(2), ReplicaClient::new(refusing))]),
            &peers,
        );
        // Asked every millisecond for 300 ms, as waiting calls ask at every sample of the peers
        // that answer. The bound holds however slowly the test runs: the gap is a sleep.
        let started = tokio::time::Instant::now();
        for _ in 0..300 {
            watch.probe_now.notify_waiters();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let made = attempts.load(Ordering::SeqCst);
        let gaps = started.elapsed().as_millis() / SKEW_PROBE_ASKED_GAP.as_millis();
        assert!(
            made >= 1 && made <= usize::try_from(gaps).expect("a few") + 1,
            "{made} probes of one peer in {} ms, asked for every millisecond",
            started.elapsed().as_millis()
        );
    }

    #[test]
    fn beyond_only_by_the_width_is_uncertain() {
        let offset = |low_ms, high_ms| Offset { low_ms, high_ms };
        // 210 ms behind, ± 212 ms: it may be 2 ms ahead.
        assert!(uncertain(offset(-422, 2), 200));
        assert!(uncertain(offset(150, 260), 200));
        // Every offset in the interval is beyond: certainly beyond.
        assert!(!uncertain(offset(201, 260), 200));
        assert!(!uncertain(offset(-300, -201), 200));
    }
}
