//! Cluster members as real `trireme-node` processes whose peer port speaks mutual TLS with
//! certificates from `trireme-node certs`: three serve requests through each other and refuse
//! a plaintext connection to the peer port; a member that comes back with a certificate of
//! another CA is refused by the other two, both sides log why, and the two keep serving.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;

use tempfile::TempDir;
use tokio::io::{BufReader, Lines};
use tokio::process::{ChildStderr, Command};
use tonic::Code;
use trireme_proto::v1 as pb;

use crate::crash::{NodeProcess, PROCESS_GUARD, drain, spawn_node_with, stop_with_sigterm};
use crate::harness::{Client, connect, eventually_within, send_request};
use crate::loopback::consecutive_free;

const SECRET: &str = "the TLS test cluster's shared secret";
const QUEUE: &str = "sealed";

/// Runs `trireme-node certs` for three members into `out`.
async fn make_certs(out: &Path) {
    let output = Command::new(env!("CARGO_BIN_EXE_trireme-node"))
        .arg("certs")
        .arg("--out")
        .arg(out)
        .args(["--nodes", "3"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PROCESS_GUARD, output)
        .await
        .expect("certs did not finish")
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    for file in ["ca.pem", "node-1.pem", "node-3-key.pem"] {
        assert!(stdout.contains(file), "{stdout}");
    }
}

/// The flags of member `node` of three whose peer ports start at `peer_base`, with its files
/// from the certificate directory `certs`.
fn tls_member_flags(node: u16, peer_base: u16, certs: &Path) -> Vec<String> {
    let peers: Vec<String> = (1..=3)
        .map(|id| format!("{id}=127.0.0.1:{}", peer_base + id - 1))
        .collect();
    let file = |name: String| certs.join(name).to_str().unwrap().to_owned();
    vec![
        "--node-id".to_owned(),
        node.to_string(),
        "--peer-listen".to_owned(),
        format!("127.0.0.1:{}", peer_base + node - 1),
        "--peers".to_owned(),
        peers.join(","),
        "--cluster-secret".to_owned(),
        SECRET.to_owned(),
        "--peer-tls-ca".to_owned(),
        file("ca.pem".to_owned()),
        "--peer-tls-cert".to_owned(),
        file(format!("node-{node}.pem")),
        "--peer-tls-key".to_owned(),
        file(format!("node-{node}-key.pem")),
    ]
}

/// Waits until every member serves (a new member serves once every peer has answered its
/// join, over TLS: a write while one is still joining would miss it), then creates the queue.
async fn create_when_joined(clients: &[Client]) {
    for client in clients {
        eventually_within(
            "the members joined over TLS",
            std::time::Duration::from_secs(60),
            || {
                let mut client = client.clone();
                async move {
                    client
                        .list_queues(pb::ListQueuesRequest::default())
                        .await
                        .is_ok()
                }
            },
        )
        .await;
    }
    clients[0]
        .clone()
        .create_queue(pb::CreateQueueRequest {
            name: QUEUE.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// A message sent through `from` is received through `via` and deleted through `delete_at`.
async fn round_trip(from: &Client, via: &Client, delete_at: &Client, body: &str) {
    let (mut from, mut via, mut delete_at) = (from.clone(), via.clone(), delete_at.clone());
    let sent = from
        .send_message(send_request(QUEUE, body))
        .await
        .unwrap()
        .into_inner()
        .message_id;
    let received = via
        .receive_messages(pb::ReceiveMessagesRequest {
            queue: QUEUE.to_owned(),
            max_messages: 10,
            visibility_timeout_seconds: Some(30),
            wait_seconds: Some(5),
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    let message = received
        .iter()
        .find(|message| message.message_id == sent)
        .unwrap_or_else(|| panic!("{body}: sent {sent}, received {received:?}"));
    assert_eq!(message.body, body);
    delete_at
        .delete_message(pb::DeleteMessageRequest {
            queue: QUEUE.to_owned(),
            receipt_handle: message.receipt_handle.clone(),
        })
        .await
        .unwrap();
}

/// Reads `lines` until one has every one of `wanted`; panics if the process ends first.
async fn await_line(lines: &mut Lines<BufReader<ChildStderr>>, wanted: &[&str]) -> String {
    tokio::time::timeout(PROCESS_GUARD, async {
        for _ in 0..10_000 {
            let line = lines.next_line().await.unwrap().expect("the node exited");
            if wanted.iter().all(|part| line.contains(part)) {
                return line;
            }
        }
        panic!("no line with {wanted:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("never logged a line with {wanted:?}"))
}

/// Three members over TLS, their data directories and their peer ports' base.
async fn start_three(certs: &Path) -> (Vec<NodeProcess>, Vec<TempDir>, u16) {
    let peer_base = consecutive_free(3);
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let mut members = Vec::new();
    for (node, dir) in (1..=3).zip(&dirs) {
        let flags = tls_member_flags(node, peer_base, certs);
        members.push(spawn_node_with(dir.path(), "warn", node == 1, &flags).await);
    }
    (members, dirs, peer_base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_over_mutual_tls_serve_requests_and_refuse_plaintext_peers() {
    let certs = TempDir::new().unwrap();
    make_certs(certs.path()).await;
    let (mut members, _dirs, peer_base) = start_three(certs.path()).await;
    let mut clients = Vec::new();
    for member in &members {
        clients.push(connect(member.address).await);
    }
    create_when_joined(&clients).await;
    // Every call through another member than the last: each coordinates over the TLS links.
    let [c1, c2, c3] = &clients[..] else {
        unreachable!("three members")
    };
    round_trip(c1, c2, c3, "through 1, 2 and 3").await;
    round_trip(c2, c3, c1, "through 2, 3 and 1").await;
    round_trip(c3, c1, c2, "through 3, 1 and 2").await;

    // A plaintext client on node 1's peer port gets no answer, and node 1 says whom it refused.
    let peer: SocketAddr = format!("127.0.0.1:{peer_base}").parse().unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{peer}"))
        .unwrap()
        .connect_lazy();
    let mut plaintext = trireme_proto::replica::v1::replica_client::ReplicaClient::new(channel);
    // What the client makes of the TLS alert it gets instead of HTTP/2 depends on its bytes
    // (an h2 protocol error, or a reset): it is no answer either way.
    plaintext
        .clock(trireme_proto::replica::v1::ClockRequest::default())
        .await
        .unwrap_err();
    let mut stderr = members[0].stderr.take().unwrap();
    let line = await_line(
        &mut stderr,
        &["refused a connection to the peer port", "127.0.0.1:"],
    )
    .await;
    assert!(line.contains("reason="), "{line}");
    drain(stderr);
    for member in members {
        stop_with_sigterm(member).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_certificate_of_another_ca_is_refused_and_the_others_serve() {
    let certs = TempDir::new().unwrap();
    make_certs(certs.path()).await;
    let (mut members, _dirs, peer_base) = start_three(certs.path()).await;
    let mut clients = Vec::new();
    for member in &members {
        clients.push(connect(member.address).await);
    }
    create_when_joined(&clients).await;
    let (c1, c2) = (&clients[0], &clients[1]);
    round_trip(c1, c2, c1, "before").await;

    // Node 3 comes back on its peer port with a certificate of another cluster's CA.
    stop_with_sigterm(members.pop().unwrap()).await;
    let other = TempDir::new().unwrap();
    make_certs(other.path()).await;
    let impostor_dir = TempDir::new().unwrap();
    let flags = tls_member_flags(3, peer_base, other.path());
    let mut impostor = spawn_node_with(impostor_dir.path(), "warn", true, &flags).await;

    // Node 1 refuses it as a server it connects to, and says so with its address and why.
    let mut node1_log = members[0].stderr.take().unwrap();
    let impostor_peer = format!("peer=127.0.0.1:{}", peer_base + 2);
    let line = await_line(
        &mut node1_log,
        &["refused a peer", "node=3", &impostor_peer, "UnknownIssuer"],
    )
    .await;
    assert!(line.contains("WARN"), "{line}");
    drain(node1_log);
    // The impostor refuses the members' certificates as theirs are not from its CA.
    let mut impostor_log = impostor.stderr.take().unwrap();
    let node1_peer = format!("peer=127.0.0.1:{peer_base}");
    await_line(
        &mut impostor_log,
        &["refused a peer", "node=1", &node1_peer, "UnknownIssuer"],
    )
    .await;
    drain(impostor_log);
    // It never joins: it answers nothing, while the other two serve every request.
    let mut impostor_client = connect(impostor.address).await;
    let refused = impostor_client
        .send_message(send_request(QUEUE, "to the impostor"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    for round in 0..3 {
        round_trip(c1, c2, c1, &format!("without 3, {round}")).await;
        round_trip(c2, c1, c2, &format!("and back, {round}")).await;
    }
    stop_with_sigterm(impostor).await;
    for member in members {
        stop_with_sigterm(member).await;
    }
}
