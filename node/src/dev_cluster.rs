//! `trireme-node dev-cluster`: a three-node cluster on loopback for development, in one
//! command. It runs three processes of this executable, node N (1 to 3) on each base port plus
//! N − 1 with its data directory `node-N` under the root, all with one cluster secret that is
//! generated once and kept in the root (mode 0600), and over mutual TLS with a CA and the
//! members' certificates made once under `certs/` in the root (`trireme_node::certs`; plaintext
//! only with `--peer-plaintext`). It prints each node's addresses as the
//! node reports them, forwards SIGINT and SIGTERM to the three (as SIGTERM: a graceful stop)
//! and waits for them. A node that exits on its own once it served (a crash, or a `kill -9`
//! to watch the other two keep serving) is said so and started again on its data after
//! `RESTART_PAUSE`; a node that exits before it serves (it cannot start: a port in use, a data
//! directory it refuses) stops the others, since starting it again would fail the same way.
//!
//! This module only starts, watches and stops processes: it must never serve anything itself.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use trireme_node::certs::{self, Outcome, member_files};
use trireme_node::config::{CertsArgs, DevClusterArgs};
use trireme_replication::NodeId;

/// Members of the dev cluster: the fewest that hold three copies.
const NODES: u16 = 3;
/// The peers' certificates' directory in the root directory.
const CERTS_DIR_NAME: &str = "certs";
/// Days the dev cluster's certificates are valid.
const CERTS_VALID_DAYS: u32 = 3650;
/// The shared secret's file in the root directory.
const SECRET_FILE_NAME: &str = "cluster-secret";
/// Random bytes of a generated secret (written as hex).
const SECRET_BYTES: usize = 32;
/// How long the nodes may take to report their addresses.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a node may take to stop after SIGTERM before it is killed: its shutdown grace
/// (10 s by default) for open requests and as much again for the replica store, with margin.
const STOP_TIMEOUT: Duration = Duration::from_secs(40);
/// Output lines of the nodes waiting to be handled.
const LINES_QUEUED_MAX: usize = 256;
/// How long a node that died after it served stays down before it is started again: long
/// enough to see the other two serve without it.
const RESTART_PAUSE: Duration = Duration::from_secs(2);

/// What a node reported on its standard output.
#[derive(Debug, Default)]
struct Reported {
    grpc: Option<String>,
    sqs: Option<String>,
    peers: Option<String>,
    metrics: Option<String>,
    /// The last line a node prints: it is serving.
    data: Option<String>,
}

/// How a node's process ended.
struct Exit {
    node: u16,
    status: std::io::Result<ExitStatus>,
    /// Whether this process asked it to stop.
    asked: bool,
}

/// Why the cluster is being stopped.
enum Stop {
    Signal(&'static str),
    /// A node exited before it served: it cannot start.
    NodeExited {
        node: u16,
        status: String,
    },
    /// A node that died could not be started again.
    RestartFailed {
        node: u16,
        error: String,
    },
    StartTimeout,
}

/// What starting a node needs: the same for its first start and every restart.
struct Launch {
    executable: PathBuf,
    root: PathBuf,
    ports: Ports,
    peers: String,
    secret: String,
    /// The certificate directory; `None`: plaintext peers, as asked.
    certs: Option<PathBuf>,
    log: String,
    lines: mpsc::Sender<(u16, String)>,
}

impl Launch {
    /// Starts node `node` on its data directory, forwarding its output; returns its process.
    fn start(&self, node: u16) -> anyhow::Result<Child> {
        let mut command = Command::new(&self.executable);
        match &self.certs {
            Some(certs) => {
                let files = member_files(certs, NodeId(node));
                command
                    .arg("--peer-tls-ca")
                    .arg(files.ca)
                    .arg("--peer-tls-cert")
                    .arg(files.cert)
                    .arg("--peer-tls-key")
                    .arg(files.key);
            }
            None => {
                command.arg("--peer-plaintext");
            }
        }
        let mut child = command
            .arg("--node-id")
            .arg(node.to_string())
            .arg("--data-dir")
            .arg(node_dir(&self.root, node))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.ports.grpc(node)))
            .arg("--sqs-listen")
            .arg(format!("127.0.0.1:{}", self.ports.sqs(node)))
            .arg("--peer-listen")
            .arg(format!("127.0.0.1:{}", self.ports.peer(node)))
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{}", self.ports.metrics(node)))
            .arg("--peers")
            .arg(&self.peers)
            .arg("--log")
            .arg(&self.log)
            // In the environment, not on the command line, which every user can read.
            .env("TRIREME_CLUSTER_SECRET", &self.secret)
            // The node ends when this process does, however it ends (`end_with_supervisor`).
            .env(SUPERVISOR_PID_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start node {node}"))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        tokio::spawn(forward_stdout(node, stdout, self.lines.clone()));
        tokio::spawn(forward_stderr(node, stderr));
        Ok(child)
    }
}

/// Runs the dev cluster until SIGINT or SIGTERM, or until a node exits before it serves (a node
/// that dies after it served is started again).
///
/// # Errors
/// The root directory or the secret cannot be set up, a node cannot be started, a node exited
/// on its own or did not start in time, or a node did not stop cleanly.
pub async fn run(args: DevClusterArgs) -> anyhow::Result<()> {
    // Watched before any node starts: a signal from now on stops all of them gracefully.
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let ports = Ports::new(&args)?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let secret = secret(&args.data_dir)?;
    let certs = if args.peer_plaintext {
        say("peers in PLAINTEXT (--peer-plaintext): anyone who reaches the peer ports is a member");
        None
    } else {
        Some(certificates(&args.data_dir)?)
    };
    let executable = std::env::current_exe().context("cannot find this executable")?;
    let peers = (1..=NODES)
        .map(|node| format!("{node}=127.0.0.1:{}", ports.peer(node)))
        .collect::<Vec<_>>()
        .join(",");

    let (stop_sender, stop) = watch::channel(false);
    let (line_sender, mut lines) = mpsc::channel(LINES_QUEUED_MAX);
    let launch = Launch {
        executable,
        root: args.data_dir.clone(),
        ports,
        peers,
        secret,
        certs,
        log: args.log.clone(),
        lines: line_sender,
    };
    let mut exits = JoinSet::new();
    let mut pids = BTreeMap::new();
    for node in 1..=NODES {
        let child = launch.start(node)?;
        pids.insert(node, child.id().unwrap_or(0));
        exits.spawn(supervise(node, child, stop.clone()));
    }

    let mut reported: BTreeMap<u16, Reported> = BTreeMap::new();
    let mut up = BTreeSet::new();
    // Nodes that died after they served, and when each is started again.
    let mut restarts: BTreeMap<u16, tokio::time::Instant> = BTreeMap::new();
    let start_deadline = tokio::time::Instant::now() + START_TIMEOUT;
    let mut started = false;
    let mut exited = Vec::new();
    let reason = loop {
        let next_restart = restarts
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(n, at)| (*n, *at));
        tokio::select! {
            _ = interrupt.recv() => break Stop::Signal("SIGINT"),
            _ = terminate.recv() => break Stop::Signal("SIGTERM"),
            Some(joined) = exits.join_next() => {
                let exit = joined.expect("a supervisor does not panic");
                let status = describe(&exit.status);
                let node = exit.node;
                if !up.remove(&node) {
                    exited.push(exit);
                    break Stop::NodeExited { node, status };
                }
                reported.remove(&node);
                restarts.insert(node, tokio::time::Instant::now() + RESTART_PAUSE);
                say(&format!(
                    "node {node} exited ({status}); the other {} keep serving; starting it again in {} s",
                    NODES - 1,
                    RESTART_PAUSE.as_secs()
                ));
            }
            () = async {
                if let Some((_, at)) = next_restart {
                    tokio::time::sleep_until(at).await;
                }
            }, if next_restart.is_some() => {
                let (node, _) = next_restart.expect("guarded");
                restarts.remove(&node);
                match launch.start(node) {
                    Ok(child) => {
                        pids.insert(node, child.id().unwrap_or(0));
                        exits.spawn(supervise(node, child, stop.clone()));
                    }
                    Err(error) => break Stop::RestartFailed { node, error: format!("{error:#}") },
                }
            }
            Some((node, line)) = lines.recv() => {
                let report = reported.entry(node).or_default();
                if record(report, &line) && up.insert(node) {
                    say(&format!(
                        "node {node} up (pid {}): gRPC {}, SQS {}, peers {}, metrics {}, data in {}",
                        pids[&node],
                        shown(report.grpc.as_deref()),
                        shown(report.sqs.as_deref()),
                        shown(report.peers.as_deref()),
                        shown(report.metrics.as_deref()),
                        shown(report.data.as_deref()),
                    ));
                    if up.len() == usize::from(NODES) && !started {
                        started = true;
                        say(&format!(
                            "{NODES} nodes running, secret in {}; Ctrl-C stops them",
                            args.data_dir.join(SECRET_FILE_NAME).display()
                        ));
                    }
                }
            }
            () = tokio::time::sleep_until(start_deadline), if !started => {
                break Stop::StartTimeout;
            }
        }
    };
    match &reason {
        Stop::Signal(name) => say(&format!("{name} received: stopping the nodes")),
        Stop::NodeExited { node, status } => say(&format!(
            "node {node} exited before it served ({status}): stopping the others"
        )),
        Stop::RestartFailed { node, error } => say(&format!(
            "node {node} could not be started again ({error}): stopping the others"
        )),
        Stop::StartTimeout => say(&format!(
            "the nodes did not all start within {} s: stopping them",
            START_TIMEOUT.as_secs()
        )),
    }
    // Receivers live as long as the supervisors; none left means every node already ended.
    let _ = stop_sender.send(true);
    // Each supervisor ends within STOP_TIMEOUT (and a kill), so this wait is bounded.
    while let Some(joined) = exits.join_next().await {
        exited.push(joined.expect("a supervisor does not panic"));
    }
    exited.sort_by_key(|exit| exit.node);
    let mut clean = true;
    for exit in &exited {
        let ok = exit.asked && exit.status.as_ref().is_ok_and(ExitStatus::success);
        clean &= ok;
        if exit.asked {
            say(&format!(
                "node {} stopped ({})",
                exit.node,
                describe(&exit.status)
            ));
        }
    }
    match reason {
        Stop::Signal(_) if clean => Ok(()),
        Stop::Signal(_) => bail!("a node did not stop cleanly"),
        Stop::NodeExited { node, status } => {
            bail!("node {node} exited before it served ({status})")
        }
        Stop::RestartFailed { node, error } => {
            bail!("node {node} could not be started again: {error}")
        }
        Stop::StartTimeout => bail!("the nodes did not start in time"),
    }
}

/// The three nodes' ports: node N has each base + N − 1.
struct Ports {
    grpc: u16,
    sqs: u16,
    peer: u16,
    metrics: u16,
}

impl Ports {
    fn new(args: &DevClusterArgs) -> anyhow::Result<Ports> {
        let mut all = BTreeSet::new();
        for (what, base) in [
            ("--grpc-port", args.grpc_port),
            ("--sqs-port", args.sqs_port),
            ("--peer-port", args.peer_port),
            ("--metrics-port", args.metrics_port),
        ] {
            if base == 0 || base.checked_add(NODES - 1).is_none() {
                bail!("{what} {base}: the {NODES} ports from it must be in 1..=65535");
            }
            all.extend(base..base + NODES);
        }
        if all.len() != 4 * usize::from(NODES) {
            bail!(
                "the gRPC, SQS, peer and metrics ports overlap: each base needs {NODES} ports of its own"
            );
        }
        Ok(Ports {
            grpc: args.grpc_port,
            sqs: args.sqs_port,
            peer: args.peer_port,
            metrics: args.metrics_port,
        })
    }

    fn grpc(&self, node: u16) -> u16 {
        self.grpc + node - 1
    }

    fn sqs(&self, node: u16) -> u16 {
        self.sqs + node - 1
    }

    fn peer(&self, node: u16) -> u16 {
        self.peer + node - 1
    }

    fn metrics(&self, node: u16) -> u16 {
        self.metrics + node - 1
    }
}

/// The certificate directory under `root`: the CA and the three members' certificates, made
/// on the first start and used as they are afterwards.
fn certificates(root: &Path) -> anyhow::Result<PathBuf> {
    let out = root.join(CERTS_DIR_NAME);
    let made = certs::make(&CertsArgs {
        out: out.clone(),
        nodes: NODES,
        hosts: Vec::new(),
        days: CERTS_VALID_DAYS,
        keep_existing: true,
    })
    .with_context(|| format!("cannot make the peers' certificates in {}", out.display()))?;
    match made {
        Outcome::Made(_) => say(&format!(
            "made a cluster CA and the nodes' certificates in {} (peers speak mutual TLS)",
            out.display()
        )),
        Outcome::Kept => say(&format!(
            "peers speak mutual TLS with the certificates in {}",
            out.display()
        )),
    }
    Ok(out)
}

/// The cluster secret kept in `root`: read if it is there, else generated and written with
/// mode 0600 (and fsynced, with its directory, so a crash does not leave nodes whose handle
/// key no later start can derive).
fn secret(root: &Path) -> anyhow::Result<String> {
    let path = root.join(SECRET_FILE_NAME);
    let generated: [u8; SECRET_BYTES] = rand::rng().random();
    let hex: String = generated.iter().map(|byte| format!("{byte:02x}")).collect();
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut file) => {
            file.write_all(hex.as_bytes())
                .and_then(|()| file.sync_all())
                .and_then(|()| std::fs::File::open(root)?.sync_all())
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(hex)
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => read_secret(&path),
        Err(error) => Err(error).with_context(|| format!("cannot create {}", path.display())),
    }
}

fn read_secret(path: &Path) -> anyhow::Result<String> {
    let mode = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        say(&format!(
            "warning: {} is readable by others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        ));
    }
    let secret = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .trim()
        .to_owned();
    if secret.len() < trireme_node::handle::HANDLE_KEY_BYTES_MIN {
        bail!(
            "{} holds {} bytes, too short for a cluster secret: delete it to generate one",
            path.display(),
            secret.len()
        );
    }
    Ok(secret)
}

/// Takes one line a node printed into its report; `true` once the node has printed its last
/// line (the data directory), after which it serves.
fn record(report: &mut Reported, line: &str) -> bool {
    let value = |prefix: &str| line.strip_prefix(prefix).map(str::to_owned);
    if let Some(grpc) = value("trireme-node: gRPC listening on ") {
        report.grpc = Some(grpc);
    } else if let Some(sqs) = value("trireme-node: SQS listening on ") {
        report.sqs = Some(sqs);
    } else if let Some(peers) = value("trireme-node: peers listening on ") {
        report.peers = Some(peers);
    } else if let Some(metrics) = value("trireme-node: metrics listening on ") {
        report.metrics = Some(metrics);
    } else if let Some(data) = value("trireme-node: data in ") {
        report.data = Some(data);
    }
    report.data.is_some()
}

fn shown(value: Option<&str>) -> &str {
    value.unwrap_or("(none)")
}

fn describe(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(error) => format!("cannot wait for it: {error}"),
    }
}

/// One line of this process's own output.
fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    // Nobody reading standard output any more is no reason to stop the nodes differently.
    let _ = writeln!(stdout, "trireme-node dev-cluster: {line}");
    let _ = stdout.flush();
}

/// Sends each line `node` prints on standard output to the main loop.
async fn forward_stdout(
    node: u16,
    stdout: impl AsyncRead + Unpin,
    lines: mpsc::Sender<(u16, String)>,
) {
    let mut reader = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        if lines.send((node, line)).await.is_err() {
            break;
        }
    }
}

/// Copies `node`'s log lines to this process's standard error, each marked with the node.
async fn forward_stderr(node: u16, stderr: impl AsyncRead + Unpin) {
    let mut reader = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        let mut out = std::io::stderr().lock();
        let _ = writeln!(out, "[node {node}] {line}");
    }
}

/// Waits for `node`'s process to end, on its own or, once `stop` turns `true`, after a SIGTERM
/// (and a SIGKILL if it has not ended within `STOP_TIMEOUT`).
async fn supervise(node: u16, mut child: Child, mut stop: watch::Receiver<bool>) -> Exit {
    tokio::select! {
        status = child.wait() => return Exit { node, status, asked: false },
        // An error means the sender is gone: stop as well.
        _ = stop.wait_for(|stop| *stop) => {}
    }
    if let Err(error) = terminate(&child) {
        say(&format!("cannot send SIGTERM to node {node}: {error}"));
    }
    let status = match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            say(&format!(
                "node {node} did not stop within {} s: killing it",
                STOP_TIMEOUT.as_secs()
            ));
            let _ = child.start_kill();
            child.wait().await
        }
    };
    Exit {
        node,
        status,
        asked: true,
    }
}

/// Sends SIGTERM to `child` (a graceful stop); nothing if it has already been reaped.
fn terminate(child: &Child) -> std::io::Result<()> {
    let Some(pid) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw)
    else {
        return Ok(());
    };
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).map_err(Into::into)
}

/// Where node `node` keeps its files: `root/node-N`.
/// The variable naming the dev cluster's process to a node it started.
const SUPERVISOR_PID_ENV: &str = "TRIREME_DEV_CLUSTER_PID";

/// A node started by a dev cluster ends when the dev cluster's process does, even when that one
/// is SIGKILLed and cannot stop its nodes (they outlived it before, holding their ports): the
/// kernel sends the node SIGTERM when its parent dies (Linux's parent-death signal), which the
/// node answers as any SIGTERM. A node whose dev cluster is already gone exits at once. Does
/// nothing for a node not started by a dev cluster, or on systems without the signal.
///
/// # Errors
/// When the parent-death signal cannot be set, or the dev cluster has already gone.
pub fn end_with_supervisor() -> anyhow::Result<()> {
    let Some(supervisor) = std::env::var_os(SUPERVISOR_PID_ENV) else {
        return Ok(());
    };
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{Signal, getppid, set_parent_process_death_signal};
        set_parent_process_death_signal(Some(Signal::TERM))
            .context("cannot ask for SIGTERM when the dev cluster ends")?;
        // The dev cluster may have died between starting this process and the line above.
        let parent = getppid().map_or(0, |pid| pid.as_raw_nonzero().get());
        if supervisor.to_str() != Some(parent.to_string().as_str()) {
            anyhow::bail!("the dev cluster that started this node has ended");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = supervisor;
    Ok(())
}

fn node_dir(root: &Path, node: u16) -> PathBuf {
    root.join(format!("node-{node}"))
}
