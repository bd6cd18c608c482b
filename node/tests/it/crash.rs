//! The real `trireme-node` binary under send/receive/delete load, killed with SIGKILL and
//! started again on the same data directory: every acknowledged send is still there (or was
//! deleted), every acknowledged delete stays deleted, and receipt handles and receive counts
//! survive. Also: SIGTERM answers open long polls and exits cleanly.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, Command};
use tonic::Code;
use trireme_core::{MessageId, MessageState, QueueName, Queues};
use trireme_node::clock::{Clock, SystemClock};
use trireme_node::storage::Storage;
use trireme_proto::v1 as pb;

use crate::harness::{Client, connect, send_request};

const QUEUE: &str = "crash";

/// How long the test waits for the binary to print its address or to exit.
pub const PROCESS_GUARD: Duration = Duration::from_secs(30);

pub struct NodeProcess {
    pub child: Child,
    pub address: SocketAddr,
    /// A cluster member's disk id, as it printed it.
    pub disk_id: Option<u64>,
    /// The node's log lines, for a test that waits for one; drained otherwise.
    pub stderr: Option<Lines<BufReader<ChildStderr>>>,
}

/// Reads and drops every remaining line, so the node never blocks on a full pipe.
pub fn drain(mut lines: Lines<BufReader<ChildStderr>>) {
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
}

/// Starts the binary on `dir` with an ephemeral port and reads the address it prints. With
/// `keep_stderr` the caller reads the log; otherwise it is drained.
async fn spawn_node(dir: &Path, log: &str, keep_stderr: bool) -> NodeProcess {
    spawn_node_with(dir, log, keep_stderr, &[]).await
}

/// Starts the binary as `spawn_node` does, with `extra` flags after the usual ones.
pub async fn spawn_node_with(
    dir: &Path,
    log: &str,
    keep_stderr: bool,
    extra: &[String],
) -> NodeProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trireme-node"))
        .arg("--data-dir")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0", "--no-sqs", "--log", log])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    // A member prints its disk after its gRPC address; a new one serves only once it has
    // joined, which may wait for members started after it, so this reads no further.
    let member = extra.iter().any(|flag| flag == "--peers");
    let (address, disk_id) = tokio::time::timeout(PROCESS_GUARD, async {
        let mut address = None;
        for _ in 0..10 {
            let line = stdout.next_line().await.unwrap().expect("the node exited");
            if let Some(grpc) = line.strip_prefix("trireme-node: gRPC listening on ") {
                address = Some(grpc.parse::<SocketAddr>().unwrap());
                if !member {
                    return (address.unwrap(), None);
                }
            } else if let Some((_, disk)) = line
                .strip_prefix("trireme-node: peers listening on ")
                .and_then(|rest| rest.split_once(", disk "))
            {
                let disk = u64::from_str_radix(disk.trim_end_matches(')'), 16).unwrap();
                return (address.expect("gRPC is printed first"), Some(disk));
            }
        }
        panic!("the node never printed its addresses");
    })
    .await
    .expect("the node did not start");
    // Standard output must keep draining or the node could block on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    let stderr = if keep_stderr {
        Some(stderr)
    } else {
        drain(stderr);
        None
    };
    NodeProcess {
        child,
        address,
        disk_id,
        stderr,
    }
}

/// What the load saw acknowledged.
#[derive(Default)]
struct Ledger {
    /// Message ids of acknowledged sends.
    sent: BTreeSet<String>,
    /// Latest acknowledged receive of each message: its handle and receive count.
    received: BTreeMap<String, (String, u32)>,
    /// Deletes sent (acknowledged or not).
    delete_attempted: BTreeSet<String>,
    /// Deletes acknowledged.
    deleted: BTreeSet<String>,
}

/// Acknowledged sends and deletes the load reaches before the kill.
const ACKED_SENDS_BEFORE_KILL: usize = 300;
const ACKED_DELETES_BEFORE_KILL: usize = 50;

/// Iterations per load task: bounds the load even if the kill never came.
const LOAD_STEPS_MAX: usize = 20_000;

async fn sender(mut client: Client, ledger: Arc<Mutex<Ledger>>, task: usize) {
    for step in 0..LOAD_STEPS_MAX {
        match client
            .send_message(send_request(QUEUE, &format!("t{task}-{step}")))
            .await
        {
            Ok(reply) => {
                ledger
                    .lock()
                    .unwrap()
                    .sent
                    .insert(reply.into_inner().message_id);
            }
            Err(_) => return,
        }
    }
}

async fn consumer(mut client: Client, ledger: Arc<Mutex<Ledger>>) {
    for _ in 0..LOAD_STEPS_MAX {
        let messages = match client
            .receive_messages(pb::ReceiveMessagesRequest {
                queue: QUEUE.to_owned(),
                max_messages: 10,
                visibility_timeout_seconds: Some(600),
                wait_seconds: Some(1),
            })
            .await
        {
            Ok(reply) => reply.into_inner().messages,
            Err(_) => return,
        };
        for message in messages {
            let delete = message.message_id.as_bytes().last().unwrap() % 2 == 0;
            {
                let mut ledger = ledger.lock().unwrap();
                ledger.received.insert(
                    message.message_id.clone(),
                    (message.receipt_handle.clone(), message.receive_count),
                );
                if delete {
                    ledger.delete_attempted.insert(message.message_id.clone());
                }
            }
            if delete {
                let result = client
                    .delete_message(pb::DeleteMessageRequest {
                        queue: QUEUE.to_owned(),
                        receipt_handle: message.receipt_handle,
                    })
                    .await;
                match result {
                    Ok(_) => {
                        ledger.lock().unwrap().deleted.insert(message.message_id);
                    }
                    Err(_) => return,
                }
            }
        }
    }
}

/// Creates `QUEUE` with default attributes.
async fn create_queue(client: &mut Client) {
    client
        .create_queue(pb::CreateQueueRequest {
            name: QUEUE.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
}

fn parse_id(id: &str) -> MessageId {
    MessageId::from_str(id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_acknowledged_send_or_delete() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut node = spawn_node(dir.path(), "warn", false).await;
    let mut client = connect(node.address).await;
    create_queue(&mut client).await;

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut load = Vec::new();
    for task in 0..4 {
        // A connection per task, so requests interleave and share group commits.
        let client = connect(node.address).await;
        load.push(tokio::spawn(sender(client, ledger.clone(), task)));
    }
    for _ in 0..2 {
        let client = connect(node.address).await;
        load.push(tokio::spawn(consumer(client, ledger.clone())));
    }
    // Kill once enough has been acknowledged; the load is still running at that moment.
    // A slow machine (debug build, parallel jobs) gets a minute to get there.
    crate::harness::eventually_within("enough acknowledged load", Duration::from_secs(60), || {
        let ledger = ledger.clone();
        async move {
            let ledger = ledger.lock().unwrap();
            ledger.sent.len() >= ACKED_SENDS_BEFORE_KILL
                && ledger.deleted.len() >= ACKED_DELETES_BEFORE_KILL
        }
    })
    .await;
    node.child.start_kill().unwrap();
    let status = tokio::time::timeout(PROCESS_GUARD, node.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success(), "the node was killed, yet exited cleanly");
    for task in load {
        tokio::time::timeout(PROCESS_GUARD, task)
            .await
            .expect("a load task hung after the kill")
            .unwrap();
    }
    let ledger = Arc::try_unwrap(ledger)
        .ok()
        .expect("the load tasks ended")
        .into_inner()
        .unwrap();
    let queue = QueueName::try_from(QUEUE).unwrap();

    // First look at the database itself, as a restart rebuilds it.
    let in_flight_unknown: BTreeSet<String> = {
        let storage = Storage::open_path(dir.path(), 8 * 1024 * 1024).unwrap();
        let queues = Queues::restore(storage.load().unwrap(), SystemClock.now());
        for id in &ledger.deleted {
            assert!(
                queues.message(&queue, parse_id(id)).is_none(),
                "acknowledged delete of {id} came back"
            );
        }
        let mut unknown = BTreeSet::new();
        for id in &ledger.sent {
            let view = queues.message(&queue, parse_id(id));
            if ledger.delete_attempted.contains(id) {
                continue;
            }
            let view = view.unwrap_or_else(|| panic!("acknowledged send {id} was lost"));
            match ledger.received.get(id) {
                Some((_, count)) => {
                    assert_eq!(view.receive_count, *count, "receive count of {id}");
                    assert_eq!(view.handle, Some(*count), "newest handle of {id}");
                    assert!(matches!(view.state, MessageState::InFlight { .. }));
                }
                None => {
                    // Received by a receive whose reply the kill cut off: in flight, unknown
                    // to the load, invisible for its 600 s.
                    if let MessageState::InFlight { .. } = view.state {
                        assert_eq!(view.receive_count, 1);
                        unknown.insert(id.clone());
                    }
                }
            }
        }
        unknown
    };
    assert!(ledger.sent.len() >= ACKED_SENDS_BEFORE_KILL);
    eprintln!(
        "crash test: {} sends, {} receives, {} deletes acknowledged ({} attempted) before SIGKILL; {} in flight with a lost reply",
        ledger.sent.len(),
        ledger.received.len(),
        ledger.deleted.len(),
        ledger.delete_attempted.len(),
        in_flight_unknown.len()
    );

    // Then restart the binary on the same directory and check through the API.
    let node = spawn_node(dir.path(), "warn", false).await;
    let mut client = connect(node.address).await;
    let held: Vec<(&String, &(String, u32))> = ledger
        .received
        .iter()
        .filter(|(id, _)| !ledger.delete_attempted.contains(*id))
        .collect();
    assert!(!held.is_empty(), "the load held no message across the kill");
    // Every handle issued before the kill still controls its message.
    for (id, (handle, _)) in &held {
        client
            .change_visibility(pb::ChangeVisibilityRequest {
                queue: QUEUE.to_owned(),
                receipt_handle: handle.clone(),
                visibility_timeout_seconds: 0,
            })
            .await
            .unwrap_or_else(|status| panic!("handle of {id} did not survive: {status:?}"));
    }
    let mut delivered: BTreeMap<String, pb::ReceivedMessage> = BTreeMap::new();
    for _ in 0..10_000 {
        let batch = client
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
        if batch.is_empty() {
            break;
        }
        for message in batch {
            assert!(
                !ledger.deleted.contains(&message.message_id),
                "acknowledged delete of {} was delivered again",
                message.message_id
            );
            let previous = delivered.insert(message.message_id.clone(), message);
            assert!(previous.is_none(), "a message was delivered twice");
        }
    }
    for id in &ledger.sent {
        if ledger.delete_attempted.contains(id) || in_flight_unknown.contains(id) {
            continue;
        }
        let message = delivered
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged send {id} was not delivered after restart"));
        let count_before = ledger.received.get(id).map_or(0, |(_, count)| *count);
        assert_eq!(
            message.receive_count,
            count_before + 1,
            "receive count of {id}"
        );
    }
    // A handle from before the kill is superseded by the receive after the restart.
    let (id, (old_handle, _)) = held[0];
    let stale = client
        .delete_message(pb::DeleteMessageRequest {
            queue: QUEUE.to_owned(),
            receipt_handle: old_handle.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{id}: {stale:?}");
    stop_with_sigterm(node).await;
}

/// Sends SIGTERM and checks the node exits cleanly.
pub async fn stop_with_sigterm(mut node: NodeProcess) {
    let pid = node.child.id().unwrap().to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(PROCESS_GUARD, node.child.wait())
        .await
        .expect("the node did not exit after SIGTERM")
        .unwrap();
    assert!(status.success(), "exit after SIGTERM: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_open_long_polls_empty_and_exits_cleanly() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut node = spawn_node(dir.path(), "warn,trireme_node::engine=debug", true).await;
    let mut client = connect(node.address).await;
    create_queue(&mut client).await;
    let mut poller = client.clone();
    let waiting = tokio::spawn(async move {
        poller
            .receive_messages(pb::ReceiveMessagesRequest {
                queue: QUEUE.to_owned(),
                max_messages: 1,
                visibility_timeout_seconds: None,
                wait_seconds: Some(20),
            })
            .await
    });
    // The engine logs when the long poll is parked: wait for that line.
    let mut stderr = node.stderr.take().unwrap();
    tokio::time::timeout(PROCESS_GUARD, async {
        for _ in 0..1_000 {
            let line = stderr.next_line().await.unwrap().expect("the node exited");
            if line.contains("long poll waiting") {
                return;
            }
        }
        panic!("the node never logged the parked long poll");
    })
    .await
    .expect("the long poll was never parked");
    drain(stderr);
    stop_with_sigterm(node).await;
    let answer = waiting.await.unwrap().unwrap().into_inner();
    assert!(answer.messages.is_empty());
}

#[test]
fn help_documents_every_flag() {
    use clap::CommandFactory;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_trireme-node"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    let command = trireme_node::config::Args::command();
    let mut flags = 0;
    for argument in command.get_arguments() {
        let Some(long) = argument.get_long() else {
            continue;
        };
        flags += 1;
        assert!(
            help.contains(&format!("--{long}")),
            "--{long} is missing from --help"
        );
        let documented = argument
            .get_help()
            .is_some_and(|text| !text.to_string().is_empty());
        assert!(documented, "--{long} has no help text");
    }
    assert!(flags >= 20, "only {flags} flags found");
    assert!(
        help.contains("7100"),
        "the default gRPC port is not documented"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_takes_its_settings_from_a_toml_file() {
    let dir = tempfile::TempDir::new().unwrap();
    let data = dir.path().join("from-file");
    let file = dir.path().join("node.toml");
    std::fs::write(
        &file,
        format!(
            "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\nno_sqs = true\nlong_polls_max = 7\n\
             metrics_listen = \"127.0.0.1:0\"\n",
            data.to_str().unwrap()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_trireme-node"))
        .arg("--config")
        .arg(&file)
        .env("TRIREME_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    tokio::time::timeout(PROCESS_GUARD, async {
        // Without the SQS endpoint: the gRPC address, the metrics address and the data
        // directory.
        for _ in 0..3 {
            printed.push(stdout.next_line().await.unwrap().expect("the node exited"));
        }
    })
    .await
    .expect("the node did not start");
    assert!(printed[0].starts_with("trireme-node: gRPC listening on 127.0.0.1:"));
    assert!(
        !printed.iter().any(|line| line.contains("SQS")),
        "{printed:?}"
    );
    // The file's metrics_listen (port 0), not the default 9100.
    assert!(
        printed[1].starts_with("trireme-node: metrics listening on http://127.0.0.1:")
            && !printed[1].contains(":9100/"),
        "{printed:?}"
    );
    assert!(printed[2].contains("from-file"), "{printed:?}");
    assert!(crate::harness::has_database(&data));
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(PROCESS_GUARD, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}
