//! `trireme bench` against a real node on loopback: the JSON report's shape and its counts
//! (every message sent is consumed, every phase stops by itself), never its speed. The kill
//! phase runs against two single nodes (not a cluster), one of which the test kills when the
//! bench's kill command asks, so that what that node acknowledged is lost with it.

use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;
use trireme_client::{QueueName, SendMessage};

use crate::node::{KillableNode, TestNode, create_queue, queue_name, send_numbered};

/// Runs `trireme bench` with `extra` against `node`, requires success and returns stdout.
async fn bench(node: &TestNode, extra: &[&str]) -> String {
    let output = bench_output(&node.address, extra).await;
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs `trireme bench` with `extra` against `endpoints` (comma separated) to its end.
async fn bench_output(endpoints: &str, extra: &[&str]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trireme"));
    command
        .env_remove("TRIREME_ENDPOINT")
        .arg("--endpoint")
        .arg(endpoints)
        .args(extra)
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the bench stopped by itself within 120 s")
        .unwrap()
}

fn count(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

/// Every latency entry has the percentiles in order, and as many samples as its kind says.
fn check_latency(latency: &Value) {
    let l = latency.as_object().unwrap();
    let at = |key: &str| {
        l[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} in {latency}"))
    };
    assert!(count(&l["count"]) > 0, "{latency}");
    assert!(at("p50") > 0.0, "{latency}");
    assert!(at("p50") <= at("p90"), "{latency}");
    assert!(at("p90") <= at("p99"), "{latency}");
    assert!(at("p99") <= at("p99_9"), "{latency}");
    assert!(at("p99_9") <= at("max"), "{latency}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_bench_reports_every_phase_and_consumes_all_it_sent() {
    let node = TestNode::start().await;
    let queue = queue_name("bench");
    let stdout = bench(
        &node,
        &[
            "--json",
            "bench",
            "--queue",
            queue.as_str(),
            "--body-bytes",
            "64",
            "--warmup",
            "5",
            "--sync-count",
            "20",
            "--pipe-count",
            "30",
            "--in-flight",
            "2,5",
            "--batch",
            "3",
            "--connections",
            "2",
            "--consumers",
            "2",
            "--producers",
            "2",
            "--rate",
            "40",
            "--steady-seconds",
            "1",
            "--wait",
            "1",
            "--no-progress",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["queue"], queue.as_str());
    assert_eq!(report["body_bytes"], 64);
    assert_eq!(report["depth_before"], 0);
    assert_eq!(report["endpoints"].as_array().unwrap().len(), 1);
    let phases = report["phases"].as_array().unwrap();
    let names: Vec<(&str, u64)> = phases
        .iter()
        .map(|p| (p["phase"].as_str().unwrap(), count(&p["tasks"])))
        .collect();
    assert_eq!(
        names,
        [
            ("sync", 1),
            ("pipe", 2),
            ("pipe", 5),
            ("consume", 2),
            ("steady", 2)
        ]
    );
    for phase in phases {
        assert_eq!(phase["errors"], serde_json::json!({}), "{phase}");
        assert!(phase["elapsed_s"].as_f64().unwrap() > 0.0, "{phase}");
        for latency in phase["latency_ms"].as_object().unwrap().values() {
            check_latency(latency);
        }
    }

    let sync = &phases[0];
    assert_eq!(sync["messages"], 20);
    assert_eq!(sync["calls"], 20);
    assert_eq!(sync["stopped_by"], "count");
    assert_eq!(sync["latency_ms"]["send"]["count"], 20);

    for pipe in &phases[1..3] {
        assert_eq!(pipe["messages"], 30);
        // Batches of three: ten calls.
        assert_eq!(pipe["calls"], 10);
        assert_eq!(pipe["stopped_by"], "count");
    }

    // The warm-up, the sync phase and both pipe phases left 5 + 20 + 30 + 30 messages.
    let consume = &phases[3];
    assert_eq!(consume["messages"], 85);
    assert_eq!(consume["stopped_by"], "count");
    assert_eq!(consume["consume"]["received"], 85);
    assert_eq!(consume["consume"]["deleted"], 85);
    let receives = count(&consume["latency_ms"]["receive"]["count"]);
    let deletes = count(&consume["latency_ms"]["delete"]["count"]);
    assert!(receives >= 9, "at most ten per receive: {consume}");
    assert!(deletes <= receives, "{consume}");

    let steady = &phases[4];
    let sent = count(&steady["messages"]);
    assert!(sent > 0, "{steady}");
    assert_eq!(steady["steady"]["sent"], sent);
    assert_eq!(steady["steady"]["target_rate"], 40);
    assert_eq!(steady["consume"]["deleted"], sent, "{steady}");
    assert_eq!(steady["stopped_by"], "drained");
    assert_eq!(count(&steady["latency_ms"]["end_to_end"]["count"]), sent);
    for call in ["send", "receive", "delete"] {
        assert!(steady["latency_ms"][call].is_object(), "{call}: {steady}");
    }
    let depth = steady["steady"]["depth"].as_array().unwrap();
    assert!(!depth.is_empty(), "{steady}");
    for sample in depth {
        assert!(sample["t_s"].as_f64().unwrap() > 0.0, "{sample}");
        assert!(count(&sample["sent"]) <= sent, "{sample}");
        assert!(sample["ready"].is_u64(), "{sample}");
    }

    // Nothing left behind.
    let stats = node.client().queue_stats(&queue).await.unwrap();
    assert_eq!(stats.ready + stats.in_flight + stats.delayed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_report_names_each_phase_and_its_percentiles() {
    let node = TestNode::start().await;
    let queue = queue_name("bench-text");
    let stdout = bench(
        &node,
        &[
            "bench",
            "--queue",
            queue.as_str(),
            "--phases",
            "consume,sync",
            "--warmup",
            "0",
            "--sync-count",
            "3",
            "--no-progress",
        ],
    )
    .await;
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("sync: 3 messages in "), "{stdout}");
    assert!(lines[1].trim_start().starts_with("send"), "{stdout}");
    assert!(lines[1].contains("p99.9"), "{stdout}");
    assert_eq!(lines[2].trim(), "errors: none", "{stdout}");
    assert!(
        lines[3].starts_with("consume, 4 consumers: 3 messages in "),
        "{stdout}"
    );
}

/// An empty receive does not end a consumer while the queue holds messages: these are delayed
/// past each consumer's first two long polls (1 s each), and the phase still consumes them all.
/// A consumer that stopped at its first empty receive (as the phase's did) consumed none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_go_on_past_empty_receives_until_the_queue_is_drained() {
    let node = TestNode::start().await;
    let client = node.client();
    let queue = queue_name("bench-delayed");
    create_queue(&client, &queue).await;
    for i in 0..12 {
        client
            .send_message(&queue, &SendMessage::new(format!("d{i}")).delay_seconds(2))
            .await
            .unwrap();
    }
    let stdout = bench(
        &node,
        &[
            "--json",
            "bench",
            "--queue",
            queue.as_str(),
            "--phases",
            "consume",
            "--consumers",
            "3",
            "--wait",
            "1",
            "--no-progress",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["depth_before"], 12, "{report}");
    let consume = &report["phases"][0];
    assert_eq!(consume["phase"], "consume");
    assert_eq!(consume["stopped_by"], "count", "{consume}");
    assert_eq!(consume["consume"]["deleted"], 12, "{consume}");
    assert!(
        count(&consume["consume"]["empty_receives"]) >= 3,
        "every consumer met the delay: {consume}"
    );
    let stats = client.queue_stats(&queue).await.unwrap();
    assert_eq!(
        stats.ready + stats.in_flight + stats.delayed,
        0,
        "{stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receive_probe_consumes_nothing_and_idle_polls_end_at_their_time() {
    let node = TestNode::start().await;
    let client = node.client();
    let queue = queue_name("bench-probe");
    create_queue(&client, &queue).await;
    send_numbered(&client, &queue, 3).await;
    let stdout = bench(
        &node,
        &[
            "--json",
            "bench",
            "--queue",
            queue.as_str(),
            "--phases",
            "idle,receive",
            "--receive-count",
            "5",
            "--idle-polls",
            "20",
            "--steady-seconds",
            "1",
            "--no-progress",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["depth_before"], 3);
    let phases = report["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{report}");

    let receive = &phases[0];
    assert_eq!(receive["phase"], "receive");
    assert_eq!(receive["calls"], 5);
    assert_eq!(receive["stopped_by"], "count");
    assert_eq!(receive["errors"], serde_json::json!({}));
    // Every receive finds the three messages the previous one released.
    assert_eq!(receive["consume"]["received"], 15, "{receive}");

    let idle = &phases[1];
    assert_eq!(idle["phase"], "idle");
    assert_eq!(idle["tasks"], 20);
    assert_eq!(idle["messages"], 0);
    assert_eq!(idle["errors"], serde_json::json!({}));
    let elapsed = idle["elapsed_s"].as_f64().unwrap();
    // Its polls wait 20 s each, yet the phase ends at its own time: before any poll could
    // have ended by itself. Not a speed check: only that the phase cancels its polls.
    assert!((1.0..19.0).contains(&elapsed), "{idle}");

    let stats = client.queue_stats(&queue).await.unwrap();
    assert_eq!(stats.ready + stats.in_flight, 3, "nothing was consumed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_phase_finds_what_the_killed_node_acknowledged_lost() {
    // Two single nodes: what `doomed` acknowledged dies with it, since nothing replicates it.
    let mut doomed = KillableNode::start().await;
    let survivor = TestNode::start().await;
    let queue = queue_name("bench-kill");
    let kill_queue = QueueName::new(format!("{queue}-kill")).unwrap();
    for client in [doomed.client(), survivor.client()] {
        create_queue(&client, &queue).await;
        create_queue(&client, &kill_queue).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let asked = dir.path().join("kill-asked");
    let kill_command = format!("touch '{}'", asked.display());
    let endpoints = format!("{},{}", doomed.address, survivor.address);
    let bench = tokio::spawn({
        let (queue, doomed_address) = (queue.clone(), doomed.address.clone());
        async move {
            bench_output(
                &endpoints,
                &[
                    "--json",
                    "bench",
                    "--queue",
                    queue.as_str(),
                    "--phases",
                    "kill",
                    "--kill-command",
                    &kill_command,
                    "--killed-endpoint",
                    &doomed_address,
                    "--kill-senders",
                    "4",
                    "--kill-after",
                    "1",
                    "--kill-seconds",
                    "3",
                    "--body-bytes",
                    "64",
                    "--seconds",
                    "30",
                    "--no-progress",
                ],
            )
            .await
        }
    });
    // The bench's kill command only leaves a file; the kill itself is the test's.
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while !asked.exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the bench ran its kill command");
    doomed.kill().await;
    let output = bench.await.unwrap();
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let phase = &report["phases"][0];
    assert_eq!(phase["phase"], "kill");
    assert_eq!(phase["tasks"], 4);
    let kill = &phase["kill"];
    assert_eq!(kill["kill"]["status"], "exit 0", "{kill}");
    assert_eq!(kill["restart"], Value::Null);
    assert_eq!(kill["member_seen_down"], true, "{kill}");
    assert_eq!(kill["member_back_ms_after_kill"], Value::Null, "{kill}");

    let attempts = count(&kill["attempts"]);
    let acknowledged = count(&kill["acknowledged"]);
    let failed = count(&kill["failed_total"]);
    assert_eq!(attempts, acknowledged + failed, "{kill}");
    assert_eq!(count(&phase["messages"]), acknowledged);
    let by_kind: u64 = kill["failed"]
        .as_object()
        .unwrap()
        .values()
        .map(count)
        .sum();
    assert_eq!(by_kind, failed, "{kill}");
    // Senders 0 and 2 are homed on the doomed node; only a send in flight on it when it died
    // may fail, since the next one goes to the survivor.
    let senders = kill["per_sender"].as_array().unwrap();
    assert_eq!(senders.len(), 4);
    let mut homed_on_doomed = 0;
    for sender in senders {
        let homed = sender["sender"].as_u64().unwrap() % 2 == 0;
        assert_eq!(sender["home_killed"], homed, "{sender}");
        homed_on_doomed += u64::from(homed);
        assert_eq!(
            count(&sender["attempts"]),
            count(&sender["acknowledged"]) + count(&sender["failed"])
        );
        // Every sender was answered before the kill; without a restart command nothing is
        // after a restart.
        assert!(sender["longest_gap"]["before_kill"].is_object(), "{sender}");
        assert!(sender["longest_gap"]["after_restart"].is_null(), "{sender}");
    }
    assert!(failed <= homed_on_doomed, "{kill}");

    // What the doomed node acknowledged is lost, and only that: every lost message was sent by
    // a sender homed there. The survivor's messages are all found once, and it is left empty.
    let r = &kill["reconciliation"];
    let lost = count(&r["lost"]);
    assert!(lost > 0, "{kill}");
    for pair in r["lost_first"].as_array().unwrap() {
        assert_eq!(pair[0].as_u64().unwrap() % 2, 0, "{kill}");
    }
    assert_eq!(
        count(&r["received_distinct"]) + lost,
        acknowledged + count(&r["failed_but_stored"]),
        "{kill}"
    );
    assert_eq!(count(&r["duplicates"]), 0, "{kill}");
    assert_eq!(count(&r["unknown"]), 0, "{kill}");
    assert_eq!(kill["drain"]["foreign"], 0, "{kill}");
    let stats = survivor.client().queue_stats(&kill_queue).await.unwrap();
    assert_eq!(stats.ready + stats.in_flight + stats.delayed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_flags_that_make_no_phase_are_refused_before_any_call() {
    // Nothing listens on this endpoint: a refusal must come from the flags alone.
    for (extra, says) in [
        (&["bench", "--phases", "kill"][..], "--kill-command"),
        (
            &["bench", "--phases", "sync", "--kill-command", "true"][..],
            "--phases kill",
        ),
        (
            &[
                "bench",
                "--phases",
                "kill",
                "--kill-command",
                "true",
                "--kill-after",
                "30",
            ][..],
            "--kill-seconds",
        ),
    ] {
        let output = bench_output("127.0.0.1:1", extra).await;
        assert!(!output.status.success(), "{extra:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
    }
}
