//! The web console on the metrics listener (`/console`), over plain HTTP as a browser with
//! JavaScript off would use it: what a client sent is shown escaped, a peek receives nothing,
//! a login is required when the SQS endpoint has keys, a form without its session's token does
//! nothing, a redrive asks for confirmation, and `--no-console` turns it off.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use trireme_node::Node;
use trireme_node::clock::SystemClock;
use trireme_node::config::Config;
use trireme_proto::v1 as pb;

use super::harness::{TestNode, eventually, redrive_to};

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Header names in lower case; a repeated header keeps its last value.
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    /// The `trireme_console` cookie the answer sets.
    fn cookie(&self) -> Option<String> {
        let set = self.headers.get("set-cookie")?;
        let value = set.strip_prefix("trireme_console=")?.split(';').next()?;
        (!value.is_empty()).then(|| format!("trireme_console={value}"))
    }

    /// The CSRF token of the page's first form.
    fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .unwrap_or_else(|| panic!("no form on the page: {}", self.body));
        let start = at + "name=\"csrf\" value=\"".len();
        self.body[start..start + 32].to_owned()
    }
}

/// `method path` on `address` with `cookie` and a form `body`, over one HTTP/1.1 connection.
async fn http(
    address: SocketAddr,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: Option<&str>,
) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    if let Some(cookie) = cookie {
        request.push_str(&format!("Cookie: {cookie}\r\n"));
    }
    let body = form.unwrap_or("");
    if form.is_some() {
        request.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

async fn get(address: SocketAddr, path: &str, cookie: Option<&str>) -> Answer {
    http(address, "GET", path, cookie, None).await
}

/// A node whose SQS endpoint takes the access key `AKID` with secret `s3cret` (and
/// `AKIDLIMITED`, limited to queues named `orders-…`).
async fn node_with_keys() -> (Node, SocketAddr, TempDir) {
    let dir = TempDir::new().unwrap();
    let config = Config::with_data_dir(dir.path());
    let storage = trireme_node::open_storage(&config).unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut node = Node::start(
        &config,
        storage,
        trireme_node::tcp_incoming(grpc),
        Arc::new(SystemClock),
    )
    .unwrap();
    let settings = trireme_node::sqs::SqsSettings {
        access_keys: vec![
            trireme_node::sqs::AccessKey {
                id: "AKID".to_owned(),
                secret: "s3cret".to_owned(),
                queue_prefixes: Vec::new(),
            },
            trireme_node::sqs::AccessKey {
                id: "AKIDLIMITED".to_owned(),
                secret: "s3cret".to_owned(),
                queue_prefixes: vec!["orders-".to_owned()],
            },
        ],
        ..trireme_node::sqs::SqsSettings::default()
    };
    node.serve_sqs(TcpListener::bind("127.0.0.1:0").await.unwrap(), settings);
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = metrics.local_addr().unwrap();
    node.serve_metrics(metrics);
    (node, address, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_clients_sent_is_shown_escaped() {
    let mut node = TestNode::start().await;
    node.client
        .create_queue(pb::CreateQueueRequest {
            name: "shown".to_owned(),
            attributes: Some(pb::QueueAttributes::default()),
            tags: [("team".to_owned(), "<i>ops</i>".to_owned())].into(),
        })
        .await
        .unwrap();
    node.send("shown", r#"<script>alert("x")</script> & 'y'"#)
        .await;
    let list = get(node.metrics, "/console", None).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains("data-queue=\"shown\""), "{}", list.body);
    assert!(list.body.contains("<svg"), "a depth chart is drawn");
    assert!(
        !list.body.contains("<script"),
        "no script at all: {}",
        list.body
    );
    let page = get(node.metrics, "/console/queues/shown", None).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body
            .contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("team = &lt;i&gt;ops&lt;/i&gt;"),
        "{}",
        page.body
    );
    assert!(!page.body.contains("<script"), "{}", page.body);
    assert!(!page.body.contains("<i>"), "{}", page.body);
    let missing = get(node.metrics, "/console/queues/%3Cb%3E", None).await;
    assert_eq!(missing.status, 404);
    assert!(!missing.body.contains("<b>"), "{}", missing.body);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_receives_nothing() {
    let mut node = TestNode::start().await;
    node.create("peeked").await;
    node.send("peeked", "only").await;
    // Received once and visible again at once.
    let received = node.receive("peeked", 1, 0).await;
    assert_eq!(received[0].receive_count, 1);
    for _ in 0..3 {
        let page = get(node.metrics, "/console/queues/peeked", None).await;
        assert_eq!(page.status, 200);
        assert_eq!(
            page.body.matches("<tr><td><code>").count(),
            1,
            "{}",
            page.body
        );
        assert!(page.body.contains("receive-count\">1<"), "{}", page.body);
    }
    let stats = node.stats("peeked").await;
    assert_eq!(
        (stats.ready, stats.in_flight),
        (1, 0),
        "the peeks made nothing invisible"
    );
    let again = node.receive("peeked", 1, 300).await;
    assert_eq!(
        again[0].receive_count, 2,
        "the receive after three peeks is the second receive"
    );
    let page = get(node.metrics, "/console/queues/peeked", None).await;
    assert!(page.body.contains("in flight"), "{}", page.body);
    assert!(page.body.contains("receive-count\">2<"), "{}", page.body);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sqs_keys_the_console_asks_for_a_login() {
    let (node, address, _dir) = node_with_keys().await;
    let first = get(address, "/console", None).await;
    assert_eq!(first.status, 303, "{first:?}");
    assert_eq!(first.headers["location"], "/console/login");
    let set = &first.headers["set-cookie"];
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = first.cookie().unwrap();
    let nodes = get(address, "/console/nodes", Some(&cookie)).await;
    assert_eq!(nodes.status, 303, "every page asks");

    let form = get(address, "/console/login", Some(&cookie)).await;
    assert_eq!(form.status, 200);
    let csrf = form.csrf();
    let wrong = format!("csrf={csrf}&access_key=AKID&secret=guess");
    let refused = http(
        address,
        "POST",
        "/console/login",
        Some(&cookie),
        Some(&wrong),
    )
    .await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    // A key limited to some queues does not open the console, which shows every queue.
    let limited = format!("csrf={csrf}&access_key=AKIDLIMITED&secret=s3cret");
    let refused = http(
        address,
        "POST",
        "/console/login",
        Some(&cookie),
        Some(&limited),
    )
    .await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    let forged = "csrf=00000000000000000000000000000000&access_key=AKID&secret=s3cret";
    let refused = http(
        address,
        "POST",
        "/console/login",
        Some(&cookie),
        Some(forged),
    )
    .await;
    assert_eq!(
        refused.status, 403,
        "a login without the form's token is refused"
    );

    let right = format!("csrf={csrf}&access_key=AKID&secret=s3cret");
    let logged_in = http(
        address,
        "POST",
        "/console/login",
        Some(&cookie),
        Some(&right),
    )
    .await;
    assert_eq!(logged_in.status, 303, "{}", logged_in.body);
    let session = logged_in.cookie().expect("a new session at login");
    assert_ne!(session, cookie, "the session token changes at login");
    let page = get(address, "/console", Some(&session)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("AKID"));
    let stale = get(address, "/console", Some(&cookie)).await;
    assert_eq!(
        stale.status, 303,
        "the token from before the login is worth nothing"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_needs_the_sessions_token_and_a_confirmation() {
    let mut node = TestNode::start().await;
    node.create("orders-dlq").await;
    node.create_with("orders", redrive_to("orders-dlq", 1))
        .await;
    node.send("orders", "poison").await;
    assert_eq!(node.receive("orders", 1, 0).await.len(), 1);
    // The second receive finds it past maxReceiveCount: it moves to the dead-letter queue.
    assert!(node.receive("orders", 1, 0).await.is_empty());
    eventually("the message is dead-lettered", || {
        let mut client = node.client.clone();
        async move {
            let queue = client
                .get_queue(pb::GetQueueRequest {
                    name: "orders-dlq".to_owned(),
                })
                .await
                .unwrap()
                .into_inner()
                .queue
                .unwrap();
            queue.stats.unwrap().ready == 1
        }
    })
    .await;

    let dlq = get(node.metrics, "/console/queues/orders-dlq", None).await;
    assert_eq!(dlq.status, 200);
    assert!(
        dlq.body
            .contains("href=\"/console/queues/orders\">orders</a>"),
        "its source: {}",
        dlq.body
    );
    assert!(dlq.body.contains("receive-count\">1<"), "{}", dlq.body);
    let cookie = dlq.cookie().unwrap();
    let csrf = dlq.csrf();

    let path = "/console/queues/orders-dlq/redrive";
    let forged = "csrf=00000000000000000000000000000000&confirm=yes";
    let refused = http(node.metrics, "POST", path, Some(&cookie), Some(forged)).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    let no_session = format!("csrf={csrf}&confirm=yes");
    let refused = http(node.metrics, "POST", path, None, Some(&no_session)).await;
    assert_eq!(
        refused.status, 403,
        "a token without its session's cookie is refused"
    );
    let ask = http(
        node.metrics,
        "POST",
        path,
        Some(&cookie),
        Some(&format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(ask.status, 200);
    assert!(ask.body.contains("Yes, redrive"), "{}", ask.body);
    assert_eq!(
        node.stats("orders-dlq").await.ready,
        1,
        "nothing moved before confirming"
    );

    let done = http(node.metrics, "POST", path, Some(&cookie), Some(&no_session)).await;
    assert_eq!(done.status, 303, "{}", done.body);
    eventually("the message is back in its source queue", || {
        let mut client = node.client.clone();
        async move {
            let queue = client
                .get_queue(pb::GetQueueRequest {
                    name: "orders".to_owned(),
                })
                .await
                .unwrap()
                .into_inner()
                .queue
                .unwrap();
            queue.stats.unwrap().ready == 1
        }
    })
    .await;
    let after = get(node.metrics, "/console/queues/orders-dlq", Some(&cookie)).await;
    assert!(
        after.body.contains("id=\"redrive-tasks\""),
        "{}",
        after.body
    );
    assert!(after.body.contains("moved\">1<"), "{}", after.body);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_console_turns_it_off_and_leaves_the_metrics() {
    let dir = TempDir::new().unwrap();
    let mut config = Config::with_data_dir(dir.path());
    config.console = false;
    let storage = trireme_node::open_storage(&config).unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut node = Node::start(
        &config,
        storage,
        trireme_node::tcp_incoming(grpc),
        Arc::new(SystemClock),
    )
    .unwrap();
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = metrics.local_addr().unwrap();
    node.serve_metrics(metrics);
    assert_eq!(get(address, "/console", None).await.status, 404);
    assert_eq!(get(address, "/health", None).await.status, 200);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_console_peeks_at_its_replica_and_shows_its_peers() {
    use crate::cluster_edges::{EdgeCluster, create, receive};
    let mut cluster = EdgeCluster::start().await;
    create(cluster.at(0), "spread", pb::QueueAttributes::default()).await;
    for body in ["one", "two"] {
        cluster
            .at(0)
            .send_message(super::harness::send_request("spread", body))
            .await
            .unwrap();
    }
    let held = receive(cluster.at(1), "spread", 1, 0).await;
    assert_eq!(held.len(), 1);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    cluster.members[2]
        .node
        .as_mut()
        .unwrap()
        .serve_metrics(listener);
    // Member 3 holds a copy of every message of a three-member cluster; a write answered on two
    // acks may still be on its way to the third.
    eventually(
        "member 3's replica shows both messages, one in flight",
        || async move {
            let page = get(address, "/console/queues/spread", None).await;
            page.body.matches("<tr><td><code>").count() == 2
                && page.body.contains("in flight")
                && page.body.contains("local replica view")
        },
    )
    .await;
    eventually(
        "member 3 shows both peers up, with their versions",
        || async move {
            let page = get(address, "/console/nodes", None).await;
            let version = format!("<td>{}</td>", env!("CARGO_PKG_VERSION"));
            page.body.matches("class=\"up\">up<").count() == 2
                && page.body.matches(&version).count() == 3
        },
    )
    .await;
    let nodes = get(address, "/console/nodes", None).await;
    assert!(nodes.body.contains("data-node=\"3\""), "{}", nodes.body);
    assert!(nodes.body.contains("(this one)"), "{}", nodes.body);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_a_page_asked_for_by_another_name_is_refused() {
    let node = TestNode::start().await;
    // What a page of another site sees after pointing its own name at this address (DNS
    // rebinding): the Host header still names that site.
    let mut stream = tokio::net::TcpStream::connect(node.metrics).await.unwrap();
    stream
        .write_all(b"GET /console HTTP/1.1\r\nHost: evil.example:9100\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    assert!(!answer.contains("csrf"), "{answer}");
    let (node_with, address, _dir) = node_with_keys().await;
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            b"GET /console/login HTTP/1.1\r\nHost: queues.example\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "a login guards it: {answer}"
    );
    node_with.shutdown().await;
    node.shutdown().await;
}
