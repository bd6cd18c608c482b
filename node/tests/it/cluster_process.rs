//! Cluster members as real `trireme-node` processes on loopback, configured only by their
//! flags: three of them join each other (a record written to one reaches another through
//! anti-entropy over their own links), a request from a node that is not a member is refused
//! and logged, a data directory of another node id is refused at start; and `dev-cluster`
//! starts three, stops them all on SIGINT, starts a node that died again while the other two
//! serve, and stops the others when a node cannot start.
//!
//! The membership tests speak the internal service itself, as a member would.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};
use tonic::Code;
use tonic::transport::Channel;
use trireme_core::{Incarnation, MessageId, Millis, QueueName};
use trireme_node::clock::{Clock, SystemClock};
use trireme_node::cluster::store::{REPLICA_DATABASE_FILE_NAME, ReplicaStore};
use trireme_node::cluster::wire;
use trireme_proto::replica::v1 as pb;
use trireme_proto::replica::v1::replica_client::ReplicaClient;
use trireme_replication::coordinator::{Reply, Request};
use trireme_replication::record::{Birth, Record};
use trireme_replication::replica::Write;
use trireme_replication::{NodeId, RecordKey};

use crate::crash::{NodeProcess, PROCESS_GUARD, drain, spawn_node_with, stop_with_sigterm};
use crate::harness::{connect, eventually_within};
use crate::loopback::consecutive_free;

const SECRET: &str = "the test cluster's shared secret";

/// The flags of member `node` of `members` (ids 1 to `members`) whose peer ports start at
/// `peer_base`.
pub(super) fn member_flags(node: u16, members: u16, peer_base: u16, extra: &[&str]) -> Vec<String> {
    let peers: Vec<String> = (1..=members)
        .map(|id| format!("{id}=127.0.0.1:{}", peer_base + id - 1))
        .collect();
    let mut flags: Vec<String> = [
        "--node-id".to_owned(),
        node.to_string(),
        "--peer-listen".to_owned(),
        format!("127.0.0.1:{}", peer_base + node - 1),
        "--peers".to_owned(),
        peers.join(","),
        "--cluster-secret".to_owned(),
        SECRET.to_owned(),
        // These tests speak the internal service themselves, as a member would (cluster_tls
        // runs members over mutual TLS).
        "--peer-plaintext".to_owned(),
    ]
    .into();
    flags.extend(extra.iter().map(|flag| (*flag).to_owned()));
    flags
}

/// A client of a member's replica service.
pub(super) async fn replica_client(address: SocketAddr) -> ReplicaClient<Channel> {
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    ReplicaClient::new(channel)
}

/// `node` on disk `disk_id` as the sender of a message sent now.
pub(super) fn sender_on(node: u16, disk_id: u64) -> pb::Sender {
    pb::Sender {
        node_id: u32::from(node),
        disk_id,
        clock_ms: SystemClock.now().0,
    }
}

/// One `Exchange` of `request` about `key`, sent as `from` (a node on a disk); the reply, or
/// the refusal.
async fn exchange(
    client: &mut ReplicaClient<Channel>,
    from: (u16, u64),
    key: &RecordKey,
    request: &Request,
) -> Result<Reply, tonic::Status> {
    let reply = client
        .exchange(pb::Batch {
            request_id: 1,
            sender: Some(sender_on(from.0, from.1)),
            entries: vec![wire::entry(key, request)],
            names: Vec::new(),
            tasks: Vec::new(),
            dedups: Vec::new(),
        })
        .await?
        .into_inner();
    let mut replies = wire::replies(&reply.replies, 1).unwrap();
    Ok(replies.pop().unwrap())
}

fn a_record(body: &str) -> Record {
    Record::sent(Birth {
        payload: body.as_bytes().to_vec(),
        sent_at: SystemClock.now(),
        visible_from: Millis(0),
        source_queue: None,
        dedup_id: None,
    })
}

fn a_key(queue: &str, id: u128) -> RecordKey {
    RecordKey {
        queue: QueueName::try_from(queue.to_owned()).unwrap(),
        incarnation: Incarnation::local(Millis(1)),
        message: MessageId(id),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_member_processes_join_each_other() {
    let peer_base = consecutive_free(3);
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let mut members: Vec<NodeProcess> = Vec::new();
    for (node, dir) in (1..=3).zip(&dirs) {
        // A pass a second, so the record below spreads soon after it is written.
        let flags = member_flags(node, 3, peer_base, &["--anti-entropy-period-s", "1"]);
        members.push(spawn_node_with(dir.path(), "warn", node == 1, &flags).await);
    }
    // Plaintext between members is what the flag asked for, and it is said loudly at start.
    let mut log = members[0].stderr.take().unwrap();
    tokio::time::timeout(PROCESS_GUARD, async {
        loop {
            let line = log.next_line().await.unwrap().expect("node 1 exited");
            if line.contains("WARN")
                && line.contains("PEER TRAFFIC IS PLAINTEXT AND UNAUTHENTICATED")
            {
                break;
            }
        }
    })
    .await
    .expect("node 1 warns that its peer traffic is plaintext");
    drain(log);
    let peer = |node: u16| -> SocketAddr {
        format!("127.0.0.1:{}", peer_base + node - 1)
            .parse()
            .unwrap()
    };
    // With three members every record is on all three. The test, as node 2, writes one to
    // node 1 alone; node 3 can only have it from node 1's or node 2's anti-entropy, which runs
    // over the links the processes opened from their own `--peers`.
    let key = a_key("joined", 42);
    let record = a_record("spread by anti-entropy");
    let write = Request::Write {
        write: Box::new(Write::Merge(record.clone())),
        ack: true,
    };
    // The members join each other first (every new database asks every peer), and the test
    // speaks as node 2 on node 2's own disk: another disk of node 2 would be refused as retired.
    let node2 = (2, members[1].disk_id.expect("a member prints its disk"));
    let mut node1 = replica_client(peer(1)).await;
    eventually_within("node 1 joined", std::time::Duration::from_secs(60), || {
        let (mut node1, key, write) = (node1.clone(), key.clone(), write.clone());
        async move { exchange(&mut node1, node2, &key, &write).await.is_ok() }
    })
    .await;
    assert_eq!(
        exchange(&mut node1, node2, &key, &write).await.unwrap(),
        Reply::Ack
    );
    // The test wrote to node 1 alone, and a replica never forwards a write: node 3 can only
    // learn the record from the members' anti-entropy (which, every second, may already have
    // run by the time of a first read here, so the test does not ask for an empty first read).
    let mut node3 = replica_client(peer(3)).await;
    eventually_within(
        "the record on node 3",
        std::time::Duration::from_secs(60),
        || {
            let (mut node3, key) = (node3.clone(), key.clone());
            async move {
                exchange(&mut node3, node2, &key, &Request::Read)
                    .await
                    .is_ok_and(|reply| reply != Reply::Record(None))
            }
        },
    )
    .await;
    assert_eq!(
        exchange(&mut node3, node2, &key, &Request::Read)
            .await
            .unwrap(),
        Reply::Record(Some(record))
    );
    // Node 2 on another disk is a retired disk: refused, and a replaced disk never rejoins.
    let retired = exchange(&mut node3, (2, node2.1 ^ 1), &key, &Request::Read)
        .await
        .unwrap_err();
    assert_eq!(retired.code(), Code::PermissionDenied, "{retired:?}");
    assert!(retired.message().contains("replaced"), "{retired:?}");
    // Each still serves its clients, on its own gRPC address.
    for member in &members {
        let mut client = connect(member.address).await;
        client
            .list_queues(trireme_proto::v1::ListQueuesRequest::default())
            .await
            .unwrap();
    }
    for member in members {
        stop_with_sigterm(member).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_from_a_non_member_is_refused_and_logged() {
    let peer_base = consecutive_free(3);
    let dir = TempDir::new().unwrap();
    // Node 1 alone is enough: it checks who asks whether or not its peers are up.
    let flags = member_flags(1, 3, peer_base, &[]);
    let mut node = spawn_node_with(dir.path(), "warn", true, &flags).await;
    let peer: SocketAddr = format!("127.0.0.1:{peer_base}").parse().unwrap();
    let mut client = replica_client(peer).await;
    let key = a_key("guarded", 7);
    let refused = exchange(&mut client, (9, 9_001), &key, &Request::Read)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("node 9"), "{refused:?}");
    // Not even with this node's own id.
    let refused = exchange(&mut client, (1, 1_001), &key, &Request::Read)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // A member is let in, but a new database answers nothing until every peer has said
    // whether it replaces a disk (spec/replication.md, *Stragglers and replacement*), and node
    // 2 is down.
    let joining = exchange(&mut client, (3, 3_001), &key, &Request::Read)
        .await
        .unwrap_err();
    assert_eq!(joining.code(), Code::Unavailable, "{joining:?}");
    assert!(
        joining.message().contains("asking its peers"),
        "{joining:?}"
    );
    // Node 3's disk is now known to node 1: another disk of node 3 is refused as retired.
    let retired = exchange(&mut client, (3, 3_002), &key, &Request::Read)
        .await
        .unwrap_err();
    assert_eq!(retired.code(), Code::PermissionDenied, "{retired:?}");
    let mut stderr = node.stderr.take().unwrap();
    tokio::time::timeout(PROCESS_GUARD, async {
        for _ in 0..1_000 {
            let line = stderr.next_line().await.unwrap().expect("the node exited");
            if line.contains("not a member") && line.contains("node=9") {
                return;
            }
        }
        panic!("the node never logged the refused non-member");
    })
    .await
    .expect("the refusal was never logged");
    drain(stderr);
    stop_with_sigterm(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_another_node_id_is_refused_at_start() {
    let dir = TempDir::new().unwrap();
    // Node 2 had this directory.
    let (store, closed) = ReplicaStore::open(dir.path(), NodeId(2), 2_001, 16 << 20).unwrap();
    drop(store);
    closed.wait();
    let peer_base = consecutive_free(3);
    let output = Command::new(env!("CARGO_BIN_EXE_trireme-node"))
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--no-sqs", "--log", "warn"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(member_flags(1, 3, peer_base, &[]))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PROCESS_GUARD, output)
        .await
        .expect("the node neither started nor exited")
        .unwrap();
    assert!(!output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !stdout.contains("listening"),
        "it printed addresses before refusing: {stdout}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("belongs to node 2") && stderr.contains("configured as node 1"),
        "{stderr}"
    );
    assert!(stderr.contains(dir.path().to_str().unwrap()), "{stderr}");
    assert!(dir.path().join(REPLICA_DATABASE_FILE_NAME).exists());
}

/// A running `trireme-node dev-cluster`.
struct DevCluster {
    child: tokio::process::Child,
    stdout: Lines<BufReader<ChildStdout>>,
    /// Node to its pid and gRPC address, from the "up" lines.
    up: BTreeMap<u16, (u32, SocketAddr)>,
}

/// Starts `dev-cluster` in `root` on twelve free ports and waits until it says all three nodes
/// run.
async fn start_dev_cluster(root: &Path) -> DevCluster {
    let base = consecutive_free(12);
    let mut child = Command::new(env!("CARGO_BIN_EXE_trireme-node"))
        .arg("dev-cluster")
        .arg("--data-dir")
        .arg(root)
        .args(["--grpc-port", &base.to_string()])
        .args(["--sqs-port", &(base + 3).to_string()])
        .args(["--peer-port", &(base + 6).to_string()])
        .args(["--metrics-port", &(base + 9).to_string()])
        .args(["--log", "warn"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut up: BTreeMap<u16, (u32, SocketAddr)> = BTreeMap::new();
    tokio::time::timeout(PROCESS_GUARD * 2, async {
        for _ in 0..20 {
            let line = stdout
                .next_line()
                .await
                .unwrap()
                .expect("dev-cluster exited");
            if let Some(rest) = line.strip_prefix("trireme-node dev-cluster: node ") {
                if let Some((node, rest)) = rest.split_once(" up (pid ") {
                    let (pid, rest) = rest.split_once("): gRPC ").unwrap();
                    let grpc = rest.split_once(',').unwrap().0;
                    up.insert(
                        node.parse::<u16>().unwrap(),
                        (pid.parse().unwrap(), grpc.parse().unwrap()),
                    );
                }
            } else if line.contains("3 nodes running") {
                return;
            }
        }
        panic!("dev-cluster never said the three nodes run");
    })
    .await
    .expect("dev-cluster did not start");
    assert_eq!(up.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
    let ports: Vec<u16> = up.values().map(|(_, grpc)| grpc.port()).collect();
    assert_eq!(ports, [base, base + 1, base + 2]);
    DevCluster { child, stdout, up }
}

impl DevCluster {
    /// Reads its output up to the first line containing `needle`, and returns that line.
    async fn next_line_with(&mut self, needle: &str) -> String {
        tokio::time::timeout(PROCESS_GUARD * 2, async {
            loop {
                let line = self
                    .stdout
                    .next_line()
                    .await
                    .unwrap()
                    .expect("dev-cluster exited");
                if line.contains(needle) {
                    return line;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("dev-cluster never said {needle:?}"))
    }

    /// The rest of its output, until it exits, and how it exited.
    async fn finish(mut self) -> (Vec<String>, std::process::ExitStatus) {
        tokio::time::timeout(PROCESS_GUARD * 3, async {
            let mut lines = Vec::new();
            for _ in 0..100 {
                match self.stdout.next_line().await.unwrap() {
                    Some(line) => lines.push(line),
                    None => break,
                }
            }
            (lines, self.child.wait().await.unwrap())
        })
        .await
        .expect("dev-cluster did not exit")
    }
}

fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cluster_runs_three_nodes_and_stops_them_all_on_sigint() {
    let root = TempDir::new().unwrap();
    let cluster = start_dev_cluster(root.path()).await;
    for (_, grpc) in cluster.up.values() {
        let mut client = connect(*grpc).await;
        client
            .list_queues(trireme_proto::v1::ListQueuesRequest::default())
            .await
            .unwrap();
    }
    let secret = root.path().join("cluster-secret");
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    for node in 1..=3 {
        let dir = root.path().join(format!("node-{node}"));
        assert!(dir.join(REPLICA_DATABASE_FILE_NAME).exists(), "node {node}");
    }
    // Only the parent is signalled: it forwards the stop to its nodes.
    signal(cluster.child.id().unwrap(), "INT");
    let (lines, status) = cluster.finish().await;
    assert!(status.success(), "{status:?}: {lines:?}");
    for node in 1..=3 {
        let stopped = format!("node {node} stopped (exit status: 0)");
        assert!(
            lines.iter().any(|line| line.ends_with(&stopped)),
            "{lines:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cluster_nodes_end_when_it_is_killed() {
    let root = TempDir::new().unwrap();
    let mut cluster = start_dev_cluster(root.path()).await;
    let pids: Vec<u32> = cluster.up.values().map(|(pid, _)| *pid).collect();
    // SIGKILL: the dev cluster cannot stop its nodes itself.
    cluster.child.start_kill().unwrap();
    cluster.child.wait().await.unwrap();
    eventually_within(
        "the nodes of a killed dev cluster exit",
        PROCESS_GUARD,
        || {
            let pids = pids.clone();
            async move {
                pids.iter()
                    .all(|pid| !Path::new(&format!("/proc/{pid}")).exists())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cluster_starts_a_dead_node_again_while_the_others_serve() {
    let root = TempDir::new().unwrap();
    let secret_before = {
        let cluster = start_dev_cluster(root.path()).await;
        let secret = std::fs::read_to_string(root.path().join("cluster-secret")).unwrap();
        signal(cluster.child.id().unwrap(), "TERM");
        let (_, status) = cluster.finish().await;
        assert!(status.success());
        secret
    };
    // Started again on the same root, it keeps the secret (and the nodes their data).
    let mut cluster = start_dev_cluster(root.path()).await;
    assert_eq!(
        std::fs::read_to_string(root.path().join("cluster-secret")).unwrap(),
        secret_before
    );
    let (old_pid, grpc) = cluster.up[&2];
    signal(old_pid, "KILL");
    let exited = cluster.next_line_with("node 2 exited").await;
    assert!(exited.contains("the other 2 keep serving"), "{exited}");
    // While node 2 is down the other two serve.
    for node in [1, 3] {
        let mut client = connect(cluster.up[&node].1).await;
        client
            .create_queue(trireme_proto::v1::CreateQueueRequest {
                name: format!("while-down-{node}"),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let again = cluster.next_line_with("node 2 up (pid ").await;
    let new_pid: u32 = again
        .split_once("up (pid ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(pid, _)| pid.parse().unwrap())
        .unwrap();
    assert_ne!(new_pid, old_pid, "{again}");
    // Its listing is its own view, which the anti-entropy pass it runs at start fills in.
    let mut client = connect(grpc).await;
    let mut listed = Vec::new();
    for _ in 0..80 {
        listed = client
            .list_queues(trireme_proto::v1::ListQueuesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .names;
        if ["while-down-1", "while-down-3"]
            .iter()
            .all(|name| listed.iter().any(|listed| listed == name))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(
        listed.len() == 2,
        "the restarted node lists the queues made while it was down: {listed:?}"
    );
    signal(cluster.child.id().unwrap(), "INT");
    let (lines, status) = cluster.finish().await;
    assert!(status.success(), "{lines:?}");
    for node in 1..=3 {
        let stopped = format!("node {node} stopped (exit status: 0)");
        assert!(
            lines.iter().any(|line| line.ends_with(&stopped)),
            "{lines:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cluster_stops_the_others_when_a_node_cannot_start() {
    let root = TempDir::new().unwrap();
    let cluster = start_dev_cluster(root.path()).await;
    signal(cluster.child.id().unwrap(), "TERM");
    let (_, status) = cluster.finish().await;
    assert!(status.success());
    // Node 3's data directory now holds node 2's data: node 3 refuses to start.
    std::fs::remove_dir_all(root.path().join("node-3")).unwrap();
    copy_dir(&root.path().join("node-2"), &root.path().join("node-3"));
    let base = consecutive_free(12);
    let output = tokio::time::timeout(
        PROCESS_GUARD * 3,
        Command::new(env!("CARGO_BIN_EXE_trireme-node"))
            .arg("dev-cluster")
            .arg("--data-dir")
            .arg(root.path())
            .args(["--grpc-port", &base.to_string()])
            .args(["--sqs-port", &(base + 3).to_string()])
            .args(["--peer-port", &(base + 6).to_string()])
            .args(["--metrics-port", &(base + 9).to_string()])
            .args(["--log", "warn"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("dev-cluster did not stop")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stdout.contains("node 3 exited before it served"),
        "{stdout}"
    );
    for node in [1, 2] {
        let stopped = format!("node {node} stopped (exit status: 0)");
        assert!(
            stdout.lines().any(|line| line.ends_with(&stopped)),
            "{stdout}"
        );
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
