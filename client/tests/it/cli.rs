//! The `trireme` binary against a real node: output for people, `--json` for scripts, exit
//! statuses, the endpoint from the environment, and `trireme worker --exec`.

use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use trireme_client::ReceiveOptions;

use crate::fake;
use crate::node::{
    TestNode, create_queue, create_with_dead_letter_queue, queue_name, send, send_numbered,
};

fn trireme(node: &TestNode) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trireme"));
    command
        .env_remove("TRIREME_ENDPOINT")
        .env_remove("TRIREME_TOKEN")
        .arg("--endpoint")
        .arg(&node.address);
    command.kill_on_drop(true);
    command
}

async fn run(mut command: Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the CLI finished within 60 s")
        .unwrap()
}

/// Runs the command, requires success, and parses its stdout as JSON.
async fn json(command: Command) -> Value {
    let output = run(command).await;
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn args<const N: usize>(node: &TestNode, list: [&str; N]) -> Command {
    let mut command = trireme(node);
    command.args(list);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_to_a_reader_that_went_away_ends_quietly() {
    let node = TestNode::start().await;
    create_queue(&node.client(), &queue_name("piped")).await;
    // `trireme queue list | head -0`: the reader closes before the CLI writes.
    let mut command = args(&node, ["queue", "list"]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    drop(child.stdout.take());
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the CLI finished within 60 s")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(stderr.is_empty(), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_commands_create_inspect_change_and_delete() {
    let node = TestNode::start().await;
    let name = queue_name("cli-queue");
    let name = name.as_str();
    let created = json(args(
        &node,
        [
            "--json",
            "queue",
            "create",
            name,
            "--visibility-timeout",
            "45",
            "--tag",
            "team=ops",
        ],
    ))
    .await;
    assert_eq!(created["created"], true);
    assert_eq!(
        created["queue"]["settings"]["visibility_timeout_seconds"],
        45
    );
    assert_eq!(created["queue"]["tags"]["team"], "ops");

    let listed = json(args(
        &node,
        ["--json", "queue", "list", "--prefix", "cli-queue"],
    ))
    .await;
    assert!(listed.as_array().unwrap().iter().any(|n| n == name));

    let changed = json(args(
        &node,
        [
            "--json", "queue", "set", name, "--delay", "3", "--tag", "env=ci", "--untag", "team",
        ],
    ))
    .await;
    assert_eq!(changed["settings"]["delay_seconds"], 3);
    assert_eq!(changed["tags"], serde_json::json!({ "env": "ci" }));

    let page = json(args(
        &node,
        [
            "--json",
            "queue",
            "list",
            "--prefix",
            name,
            "--max-results",
            "1",
        ],
    ))
    .await;
    assert_eq!(page["names"], serde_json::json!([name]));
    assert_eq!(page["next_page_token"], Value::Null);

    let text = run(args(&node, ["queue", "get", name])).await;
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains(&format!("queue {name}")), "{text}");
    assert!(text.contains("delay 3 s"), "{text}");

    assert!(
        run(args(&node, ["queue", "purge", name]))
            .await
            .status
            .success()
    );
    assert!(
        run(args(&node, ["queue", "delete", name]))
            .await
            .status
            .success()
    );
    let missing = run(args(&node, ["queue", "get", name])).await;
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8(missing.stderr).unwrap();
    assert!(stderr.contains("does not exist"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_receive_and_delete_from_the_command_line() {
    let node = TestNode::start().await;
    let client = node.client();
    let name = queue_name("cli-msg");
    create_queue(&client, &name).await;
    let q = name.as_str();

    let sent = json(args(
        &node,
        [
            "--json",
            "send",
            q,
            "from an argument",
            "--attribute",
            "kind=test",
        ],
    ))
    .await;
    assert_eq!(sent["duplicate"], false);
    let mut from_stdin = args(&node, ["--json", "send", q]);
    from_stdin
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = from_stdin.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"from stdin").await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert!(output.status.success());

    // Up to ten messages, hidden for a minute; a second receive picks up what the first missed.
    let receive = || {
        json(args(
            &node,
            [
                "--json",
                "receive",
                q,
                "--max",
                "10",
                "--wait",
                "5",
                "--visibility",
                "60",
            ],
        ))
    };
    let mut messages = receive().await.as_array().unwrap().clone();
    if messages.len() < 2 {
        let more = receive().await;
        messages.extend(more.as_array().unwrap().iter().cloned());
    }
    let mut bodies: Vec<&str> = messages
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["from an argument", "from stdin"]);
    let with_attribute = messages
        .iter()
        .find(|m| m["body"] == "from an argument")
        .unwrap();
    assert_eq!(
        with_attribute["attributes"]["kind"]["value"]["string"],
        "test"
    );

    for m in &messages {
        let handle = m["receipt_handle"].as_str().unwrap();
        assert!(
            run(args(&node, ["delete", q, handle]))
                .await
                .status
                .success()
        );
    }
    let stats = client.queue_stats(&name).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 0));

    let empty = run(args(&node, ["receive", q, "--wait", "0"])).await;
    assert_eq!(
        String::from_utf8(empty.stdout).unwrap().trim(),
        "no messages"
    );

    // --delete removes what it printed.
    send(&client, &name, "gone after reading").await;
    let read = json(args(
        &node,
        ["--json", "receive", q, "--wait", "5", "--delete"],
    ))
    .await;
    assert_eq!(read[0]["body"], "gone after reading");
    let stats = client.queue_stats(&name).await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_list_comes_from_the_environment() {
    let node = TestNode::start().await;
    let closed = fake::closed_port();
    let name = queue_name("cli-env");
    let mut command = Command::new(env!("CARGO_BIN_EXE_trireme"));
    command.env(
        "TRIREME_ENDPOINT",
        format!("{},{}", closed.address, node.address),
    );
    command.args(["--json", "queue", "create", name.as_str()]);
    assert_eq!(json(command).await["created"], true);
    node.client().get_queue(&name).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_start_list_and_cancel() {
    let node = TestNode::start().await;
    let client = node.client();
    let dlq = queue_name("cli-dlq");
    let target = queue_name("cli-target");
    create_queue(&client, &dlq).await;
    create_queue(&client, &target).await;
    send_numbered(&client, &dlq, 20).await;
    let started = json(args(
        &node,
        [
            "--json",
            "redrive",
            "start",
            dlq.as_str(),
            "--to",
            target.as_str(),
            "--rate",
            "1",
        ],
    ))
    .await;
    let handle = started["task_handle"].as_str().unwrap().to_owned();
    let listed = json(args(&node, ["--json", "redrive", "list", dlq.as_str()])).await;
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["task_handle"] == handle.as_str())
    );
    let cancelled = json(args(&node, ["--json", "redrive", "cancel", &handle])).await;
    assert!(cancelled["moved"].as_u64().unwrap() < 20);
    let text = String::from_utf8(
        run(args(&node, ["redrive", "list", dlq.as_str()]))
            .await
            .stdout,
    )
    .unwrap();
    assert!(text.contains(&handle) && text.contains("cancel"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_exec_settles_by_exit_status() {
    let node = TestNode::start().await;
    let client = node.client();
    let dlq = queue_name("cli-worker-dlq");
    let queue = queue_name("cli-worker");
    create_with_dead_letter_queue(&client, &queue, &dlq, 2).await;
    let ok = send(&client, &queue, "ok").await.message_id;
    let retry = send(&client, &queue, "retry").await.message_id;
    let fail = send(&client, &queue, "fail").await.message_id;

    let script = r#"read -r body; [ "$TRIREME_MESSAGE_ID" = "$TRIREME_IDEMPOTENCY_KEY" ] || exit 9; case "$body" in ok) exit 0;; retry) exit 75;; *) exit 3;; esac"#;
    let mut command = args(
        &node,
        [
            "--json",
            "worker",
            queue.as_str(),
            "--exec",
            script,
            "--concurrency",
            "3",
            "--wait",
            "1",
            "--retry-cap",
            "1",
        ],
    );
    command.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();

    let mut events: Vec<(String, String)> = Vec::new();
    let done = |events: &[(String, String)]| {
        let has = |event: &str, id: &str| events.iter().any(|(e, i)| e == event && i == id);
        has("processed", ok.as_str())
            && has("dead_lettered", fail.as_str())
            && events
                .iter()
                .filter(|(e, i)| e == "retried" && i == retry.as_str())
                .count()
                == 2
    };
    while !done(&events) {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the worker printed nothing for 60 s")
            .unwrap()
            .expect("the worker exited early");
        let value: Value = serde_json::from_str(&line).unwrap();
        events.push((
            value["event"].as_str().unwrap().to_owned(),
            value["message_id"].as_str().unwrap().to_owned(),
        ));
    }
    // "fail" was moved by the worker's dead-letter-now; "retry" by the node at its third
    // receive.
    let mut dead = Vec::new();
    for _ in 0..10 {
        let options = ReceiveOptions {
            max_messages: 10,
            visibility_timeout_seconds: None,
            wait_seconds: Some(5),
        };
        dead.extend(client.receive_messages(&dlq, &options).await.unwrap());
        if dead.len() >= 2 {
            break;
        }
    }
    let mut bodies: Vec<&str> = dead.iter().map(|m| m.body.as_str()).collect();
    bodies.sort();
    assert_eq!(bodies, ["fail", "retry"]);

    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let mut last = None;
    while let Some(line) = lines.next_line().await.unwrap() {
        last = Some(line);
    }
    let summary: Value = serde_json::from_str(&last.expect("a summary line")).unwrap();
    assert_eq!(summary["event"], "stopped");
    assert_eq!(summary["totals"]["processed"], 1);
    assert_eq!(summary["totals"]["dead_lettered"], 1);
    assert_eq!(summary["totals"]["retried"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_takes_several_endpoints_and_gets_past_a_closed_one() {
    let node = TestNode::start().await;
    let closed = fake::closed_port();
    let client = node.client();
    let name = queue_name("cli-many");
    let q = name.as_str();
    // Repeated: `--endpoint A --endpoint B`.
    let repeated = |list: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_trireme"));
        command
            .env_remove("TRIREME_ENDPOINT")
            .args(["--endpoint", &closed.address, "--endpoint", &node.address])
            .args(list)
            .kill_on_drop(true);
        command
    };
    // Comma-separated: `--endpoint A,B`.
    let both = format!("{},{}", closed.address, node.address);
    let listed = |list: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_trireme"));
        command
            .env_remove("TRIREME_ENDPOINT")
            .args(["--endpoint", &both])
            .args(list)
            .kill_on_drop(true);
        command
    };
    assert_eq!(
        json(repeated(&["--json", "queue", "create", q])).await["created"],
        true
    );
    let sent = json(listed(&["--json", "send", q, "through"])).await;
    let read = json(repeated(&[
        "--json", "receive", q, "--wait", "5", "--delete",
    ]))
    .await;
    assert_eq!(read[0]["body"], "through");
    assert_eq!(read[0]["message_id"], sent["message_id"]);

    // The bench gives each endpoint clients of its own, so some start at the closed port.
    let report = json(listed(&[
        "--json",
        "bench",
        "--queue",
        q,
        "--phases",
        "sync",
        "--warmup",
        "2",
        "--sync-count",
        "10",
        "--body-bytes",
        "64",
        "--connections",
        "1",
        "--no-progress",
    ]))
    .await;
    let endpoints: Vec<&str> = report["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(endpoints, [closed.address.as_str(), node.address.as_str()]);
    let phases = report["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 1, "{report}");
    assert_eq!(phases[0]["errors"], serde_json::json!({}), "{report}");
    // What the bench left in the queue, for the worker to take.
    let mut worker = listed(&[
        "--json",
        "worker",
        q,
        "--exec",
        "cat >/dev/null",
        "--wait",
        "1",
    ]);
    worker.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let left = client.queue_stats(&name).await.unwrap().ready;
    let marker = send(&client, &name, "last").await.message_id;
    let mut child = worker.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut processed = 0;
    let mut saw_marker = false;
    while !saw_marker {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the worker printed nothing for 60 s")
            .unwrap()
            .expect("the worker exited early");
        let value: Value = serde_json::from_str(&line).unwrap();
        if value["event"] == "processed" {
            processed += 1;
            saw_marker |= value["message_id"] == marker.as_str();
        }
    }
    let pid = child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(processed <= left + 1, "{processed} of {left} + 1");
}
