//! Which calls the client repeats on another node, and which it never repeats.

use std::time::Duration;

use tonic::Code;
use trireme_client::{
    Backoff, Client, ClientConfig, Error, QueueName, ReceiveOptions, RetryPolicy, SendMessage,
};

use crate::fake::{self, Behaviour, FakeNode};

/// A client of `endpoints` that starts at the first and skips a failed one for a minute, so
/// which node each attempt reaches is fixed.
fn client(endpoints: &[&str], attempts_max: u32) -> Client {
    let mut config = ClientConfig::new(endpoints.iter().copied());
    config.home_endpoint = Some(0);
    config.endpoint_down = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
    config.retry = RetryPolicy {
        attempts_max,
        deadline: Duration::from_secs(20),
        backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(5)),
    };
    config.request_timeout = Duration::from_millis(500);
    Client::new(config).unwrap()
}

/// An unavailable node listed before one that answers, and a client of both allowed three
/// attempts.
async fn down_then_up() -> (FakeNode, FakeNode, Client) {
    let down = fake::start(Behaviour::Fails(Code::Unavailable)).await;
    let up = fake::start(Behaviour::Answers).await;
    let client = client(&[&down.address, &up.address], 3);
    (down, up, client)
}

fn orders() -> QueueName {
    QueueName::new("orders").unwrap()
}

#[tokio::test]
async fn idempotent_call_moves_to_the_next_node_when_one_is_unavailable() {
    let (down, up, client) = down_then_up().await;
    let queue = client.get_queue(&orders()).await.unwrap();
    assert_eq!(queue.name, orders());
    assert_eq!((down.calls(), up.calls()), (1, 1));
    // The node that answered is where the next call starts.
    client.get_queue(&orders()).await.unwrap();
    assert_eq!((down.calls(), up.calls()), (1, 2));
}

#[tokio::test]
async fn receive_is_not_repeated_after_it_reached_a_node() {
    let (down, up, client) = down_then_up().await;
    let err = client
        .receive_messages(&orders(), &ReceiveOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { ref address, .. } if *address == down.address),
        "{err:?}"
    );
    assert_eq!((down.calls(), up.calls()), (1, 0));
}

#[tokio::test]
async fn send_without_deduplication_id_is_not_repeated_but_with_one_is() {
    let (down, up, client) = down_then_up().await;
    let plain = SendMessage::new("x");
    assert!(matches!(
        client.send_message(&orders(), &plain).await,
        Err(Error::Unavailable { .. })
    ));
    assert_eq!((down.calls(), up.calls()), (1, 0));

    // A failure moves the next call to the other node; start over at the failing one.
    let client = self::client(&[&down.address, &up.address], 3);
    let deduplicated = SendMessage::new("x").deduplication_id("d1");
    client.send_message(&orders(), &deduplicated).await.unwrap();
    assert_eq!((down.calls(), up.calls()), (2, 1));
}

#[tokio::test]
async fn any_call_moves_on_when_the_connection_cannot_open() {
    let closed = fake::closed_port();
    let up = fake::start(Behaviour::Answers).await;
    let client = client(&[&closed.address, &up.address], 3);
    let messages = client
        .receive_messages(
            &orders(),
            &ReceiveOptions {
                wait_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(messages.is_empty());
    assert_eq!(up.calls(), 1);
}

#[tokio::test]
async fn refusals_are_not_repeated() {
    let refusing = fake::start(Behaviour::Fails(Code::NotFound)).await;
    let up = fake::start(Behaviour::Answers).await;
    let client = client(&[&refusing.address, &up.address], 3);
    let err = client.get_queue(&orders()).await.unwrap_err();
    assert!(
        matches!(err, Error::QueueNotFound { queue: Some(ref q), .. } if *q == orders()),
        "{err:?}"
    );
    assert_eq!((refusing.calls(), up.calls()), (1, 0));
}

#[tokio::test]
async fn attempts_stop_at_the_cap() {
    let a = fake::start(Behaviour::Fails(Code::Unavailable)).await;
    let b = fake::start(Behaviour::Fails(Code::Unavailable)).await;
    let client = client(&[&a.address, &b.address], 3);
    let err = client.get_queue(&orders()).await.unwrap_err();
    // Both tried, both named, each with its last failure.
    match &err {
        Error::NoEndpointAvailable { failures } => {
            let addresses: Vec<&str> = failures
                .iter()
                .map(|failure| match failure {
                    Error::Unavailable { address, .. } => address.as_str(),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(addresses, [a.address.as_str(), b.address.as_str()]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.calls() + b.calls(), 3);
    assert_eq!((a.calls(), b.calls()), (2, 1));
}

#[tokio::test]
async fn a_node_that_does_not_answer_in_time_is_left_for_the_next() {
    let stuck = fake::start(Behaviour::Hangs).await;
    let up = fake::start(Behaviour::Answers).await;
    let client = client(&[&stuck.address, &up.address], 2);
    client
        .delete_message(&orders(), &trireme_client::ReceiptHandle::new("h"))
        .await
        .unwrap();
    assert_eq!((stuck.calls(), up.calls()), (1, 1));

    let lone = self::client(&[&stuck.address], 1);
    let err = lone.get_queue(&orders()).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
}

#[tokio::test]
async fn the_call_deadline_ends_retries_before_the_attempt_cap() {
    let a = fake::start(Behaviour::Hangs).await;
    let mut config = ClientConfig::new([a.address.clone()]);
    config.request_timeout = Duration::from_millis(200);
    config.retry = RetryPolicy {
        attempts_max: 1_000,
        deadline: Duration::from_millis(500),
        backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(1)),
    };
    let client = Client::new(config).unwrap();
    let err = client.get_queue(&orders()).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    // Each attempt takes its full 200 ms timeout, so a 500 ms budget allows at most three.
    assert!((1..=3).contains(&a.calls()), "{} attempts", a.calls());
}

#[tokio::test]
async fn a_failed_endpoint_is_skipped_by_later_calls_even_those_never_repeated() {
    let (down, up, client) = down_then_up().await;
    client.get_queue(&orders()).await.unwrap();
    assert_eq!((down.calls(), up.calls()), (1, 1));
    // Down for a minute: a receive and a plain send, which a failure would end, go to `up`.
    client
        .receive_messages(&orders(), &ReceiveOptions::default())
        .await
        .unwrap();
    client
        .send_message(&orders(), &SendMessage::new("x"))
        .await
        .unwrap();
    assert_eq!((down.calls(), up.calls()), (1, 3));
}

#[tokio::test]
async fn a_home_endpoint_that_comes_back_gets_the_calls_again() {
    let home = fake::closed_port();
    let other = fake::start(Behaviour::Answers).await;
    let mut config = ClientConfig::new([home.address.clone(), other.address.clone()]);
    config.home_endpoint = Some(0);
    // Skipped for at most a nanosecond: every later call probes the home first.
    config.endpoint_down = Backoff::new(Duration::from_nanos(1), Duration::from_nanos(1));
    let client = Client::new(config).unwrap();
    assert_eq!(client.home_endpoint(), home.address);
    client.get_queue(&orders()).await.unwrap();
    assert_eq!(other.calls(), 1);

    let home = fake::serve(home.open(), Behaviour::Answers);
    client.get_queue(&orders()).await.unwrap();
    assert_eq!((home.calls(), other.calls()), (1, 1));
    for expected in 2..=4 {
        client.get_queue(&orders()).await.unwrap();
        assert_eq!((home.calls(), other.calls()), (expected, 1));
    }
}

#[tokio::test]
async fn clients_without_a_home_spread_over_the_endpoints() {
    let a = fake::start(Behaviour::Answers).await;
    let b = fake::start(Behaviour::Answers).await;
    let mut homes = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let client = Client::connect([a.address.clone(), b.address.clone()]).unwrap();
        homes.insert(client.home_endpoint().to_owned());
        client.get_queue(&orders()).await.unwrap();
    }
    assert_eq!(homes.len(), 2, "{homes:?}");
    // Each client's one call went to its home.
    assert!(
        a.calls() >= 1 && b.calls() >= 1,
        "{} {}",
        a.calls(),
        b.calls()
    );
    assert_eq!(a.calls() + b.calls(), 10);
}

#[tokio::test]
async fn no_endpoint_available_names_every_endpoint_tried() {
    let first = fake::closed_port();
    let second = fake::closed_port();
    let client = client(&[&first.address, &second.address], 4);
    // A receive too moves on when no connection opened, until its attempts run out.
    let err = client
        .receive_messages(&orders(), &ReceiveOptions::default())
        .await
        .unwrap_err();
    let Error::NoEndpointAvailable { failures } = &err else {
        panic!("{err:?}");
    };
    let addresses: Vec<&str> = failures
        .iter()
        .map(|failure| match failure {
            Error::Unavailable { address, .. } => address.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(addresses, [first.address.as_str(), second.address.as_str()]);
    let text = err.to_string();
    assert!(
        text.contains(&first.address) && text.contains(&second.address),
        "{text}"
    );

    let home = client.home_endpoint().to_owned();
    let bad = ClientConfig {
        home_endpoint: Some(2),
        ..ClientConfig::new([home.clone(), home])
    };
    assert!(matches!(
        Client::new(bad),
        Err(Error::InvalidArgument { field: Some(ref f), .. }) if f == "home_endpoint"
    ));
}
