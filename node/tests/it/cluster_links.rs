//! A peer link whose connection goes silent without closing (spec/replication.md, *A link that
//! goes silent is closed within two seconds*): three real `trireme-node` processes, member 3
//! reached by the other two through a relay on loopback that can freeze the connections it
//! carries (no byte passes either way, no socket closes) while it relays new ones as before.
//! With member 1 killed, every quorum needs members 2 and 3, so member 2's frozen link to
//! member 3 holds up every send through member 2 until the link finds the connection dead and
//! connects anew.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic::transport::Channel;
use trireme_proto::v1 as pb;
use trireme_proto::v1::queue_service_client::QueueServiceClient;

use crate::cluster_process::member_flags;
use crate::crash::{NodeProcess, PROCESS_GUARD, spawn_node_with};
use crate::harness::{Client, send_request};
use crate::loopback::consecutive_free;

const QUEUE: &str = "links";

/// How long member 2 may go without a successful send after the freeze. A silent connection
/// is found by the link's keepalive within 2 s, then a send needs one new connection and one
/// round; with the public API's keepalive (20 s, then 10 s) it took 30 s. Generous for a
/// loaded machine and still well short of those 30 s.
const RECOVERY_MAX: Duration = Duration::from_secs(15);

/// A TCP relay to `target` whose connections so far can be frozen.
struct Relay {
    address: SocketAddr,
    /// Connections accepted before the current generation freeze; later ones relay.
    generation: watch::Sender<u64>,
}

impl Relay {
    async fn start(listen: SocketAddr, target: SocketAddr) -> Relay {
        let listener = TcpListener::bind(listen).await.expect("the relay binds");
        let address = listener.local_addr().unwrap();
        let (generation, _) = watch::channel(0u64);
        let frozen = generation.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut freeze = frozen.subscribe();
                let born = *freeze.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let frozen = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
                        changed = freeze.wait_for(|now| *now > born) => changed.is_ok(),
                    };
                    if frozen {
                        // Silent from now on: both sockets stay open and nothing is read or
                        // written, as a connection behind a retransmission backoff.
                        std::future::pending::<()>().await;
                    }
                    drop((inbound, outbound));
                });
            }
        });
        Relay {
            address,
            generation,
        }
    }

    /// Freezes every connection relayed so far; new ones relay as before.
    fn freeze(&self) {
        self.generation.send_modify(|generation| *generation += 1);
    }
}

fn client_for(address: SocketAddr) -> Client {
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    QueueServiceClient::new(channel)
}

/// Member `node`'s flags with member 3 listed at `relay` (member 3 itself keeps its own port).
fn flags_through(node: u16, peer_base: u16, relay: SocketAddr) -> Vec<String> {
    let mut flags = member_flags(node, 3, peer_base, &["--anti-entropy-period-s", "600"]);
    if node != 3 {
        let peers = flags
            .iter()
            .position(|flag| flag == "--peers")
            .expect("the flags list the peers")
            + 1;
        let listed = format!("3=127.0.0.1:{}", peer_base + 2);
        assert!(flags[peers].contains(&listed), "{}", flags[peers]);
        flags[peers] = flags[peers].replace(&listed, &format!("3={relay}"));
    }
    flags
}

async fn until_serving(client: &mut Client, node: u16) {
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
    panic!("member {node} never served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_connection_gone_silent_is_replaced_before_it_holds_up_the_quorum_for_long() {
    // Three peer ports and the relay's.
    let peer_base = consecutive_free(4);
    let peer = |node: u16| -> SocketAddr {
        format!("127.0.0.1:{}", peer_base + node - 1)
            .parse()
            .unwrap()
    };
    let relay = Relay::start(peer(4), peer(3)).await;
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let mut members: Vec<NodeProcess> = Vec::new();
    for node in 1..=3u16 {
        let flags = flags_through(node, peer_base, relay.address);
        members
            .push(spawn_node_with(dirs[usize::from(node) - 1].path(), "warn", false, &flags).await);
    }
    let mut clients: Vec<Client> = members.iter().map(|m| client_for(m.address)).collect();
    for (index, client) in clients.iter_mut().enumerate() {
        until_serving(client, u16::try_from(index + 1).unwrap()).await;
    }
    clients[1]
        .create_queue(pb::CreateQueueRequest {
            name: QUEUE.to_owned(),
            ..Default::default()
        })
        .await
        .expect("the queue is created");
    // Member 2's link to member 3 carries these, so its connection through the relay is open.
    for seq in 0..20 {
        tokio::time::timeout(
            PROCESS_GUARD,
            clients[1].send_message(send_request(QUEUE, &format!("before {seq}"))),
        )
        .await
        .expect("a send answers")
        .expect("sends succeed with every member up");
    }

    let mut killed = members.remove(0);
    killed.child.start_kill().unwrap();
    tokio::time::timeout(PROCESS_GUARD, killed.child.wait())
        .await
        .expect("the killed member exits")
        .unwrap();
    relay.freeze();
    let frozen_at = Instant::now();

    // Sends through member 2 now need member 3, through a link whose connection is silent.
    let mut failed = 0u32;
    let recovered = loop {
        let elapsed = frozen_at.elapsed();
        assert!(
            elapsed < RECOVERY_MAX,
            "member 2 sent nothing for {elapsed:?} after its link to member 3 went silent \
             ({failed} sends failed): the link keeps a silent connection"
        );
        let answer = tokio::time::timeout(
            PROCESS_GUARD,
            clients[1].send_message(send_request(QUEUE, &format!("after {failed}"))),
        )
        .await
        .expect("a send answers within the node's request timeout");
        match answer {
            Ok(_) => break frozen_at.elapsed(),
            Err(status) => {
                failed += 1;
                assert_eq!(
                    status.code(),
                    tonic::Code::Unavailable,
                    "a send without its quorum is unavailable: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    println!(
        "cluster_links: first send through member 2 acknowledged {recovered:?} after its link to \
         member 3 went silent ({failed} failed before it)"
    );
    // And the sends after it do not wait again.
    for seq in 0..10 {
        tokio::time::timeout(
            Duration::from_secs(30),
            clients[1].send_message(send_request(QUEUE, &format!("again {seq}"))),
        )
        .await
        .expect("a send answers")
        .expect("sends succeed over the new connection");
    }
    for mut member in members {
        let _ = member.child.start_kill();
        let _ = member.child.wait().await;
    }
}
