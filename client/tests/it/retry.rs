//! Which calls the client repeats on another node, and which it never repeats.

use std::time::Duration;

use tonic::Code;
use trireme_client::{
    Backoff, Client, ClientConfig, Error, QueueName, ReceiveOptions, RetryPolicy, SendMessage,
};

use crate::fake::{self, Behaviour, FakeNode};

fn client(endpoints: &[&str], attempts_max: u32) -> Client {
    let mut config = ClientConfig::new(endpoints.iter().copied());
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
    let closed = fake::closed_address().await;
    let up = fake::start(Behaviour::Answers).await;
    let client = client(&[&closed, &up.address], 3);
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
    assert!(matches!(
        client.get_queue(&orders()).await,
        Err(Error::Unavailable { .. })
    ));
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
