//! A node whose gRPC API requires a bearer token (`--api-token-file`), through the client crate
//! and the CLI: a call with an accepted token is served, one without a token or with another is
//! refused UNAUTHENTICATED with a message that says what to send, and is not retried.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use trireme_client::{Client, ClientConfig, Error, QueueAttributes, SendMessage};

use crate::node::{TestNode, queue_name};

const TOKEN: &str = "token-of-the-auth-tests-0123456789";
const ROTATED: &str = "the-next-token-of-the-auth-tests";

fn client(node: &TestNode, token: Option<&str>) -> Client {
    let mut config = ClientConfig::new([node.address.clone()]);
    config.token = token.map(str::to_owned);
    Client::new(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_an_accepted_token_is_served_and_others_are_refused() {
    let node =
        TestNode::start_with_tokens(Some(&format!("# two while rotating\n{TOKEN}\n{ROTATED}\n")))
            .await;
    let name = queue_name("authed");
    for token in [TOKEN, ROTATED] {
        let client = client(&node, Some(token));
        client
            .create_queue(&name, &QueueAttributes::default())
            .await
            .unwrap();
        client
            .send_message(&name, &SendMessage::new("for a bearer"))
            .await
            .unwrap();
    }
    assert_eq!(
        client(&node, Some(TOKEN))
            .queue_stats(&name)
            .await
            .unwrap()
            .ready,
        2
    );
    let missing = client(&node, None).queue_stats(&name).await.unwrap_err();
    assert!(
        matches!(&missing, Error::Unauthenticated { message, .. } if message.contains("bearer token") && message.contains("--token")),
        "{missing:?}"
    );
    let refused = client(&node, Some("not-a-token-this-node-knows"))
        .send_message(&name, &SendMessage::new("refused"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::Unauthenticated { message, .. } if message.contains("not one this node accepts")),
        "{refused:?}"
    );
    // Neither refusal took effect.
    assert_eq!(
        client(&node, Some(TOKEN))
            .queue_stats(&name)
            .await
            .unwrap()
            .ready,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_cannot_travel_as_a_header_is_refused_by_the_client() {
    let node = TestNode::start().await;
    for token in ["", "has a space", "line\nbreak"] {
        let mut config = ClientConfig::new([node.address.clone()]);
        config.token = Some(token.to_owned());
        let error = Client::new(config).unwrap_err();
        assert!(
            matches!(&error, Error::InvalidArgument { field: Some(field), .. } if field == "token"),
            "{token:?}: {error:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sends_its_token_from_the_flag_or_the_environment() {
    let node = TestNode::start_with_tokens(Some(TOKEN)).await;
    let cli = |token_flag: Option<&str>, token_env: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_trireme"));
        command
            .env_remove("TRIREME_ENDPOINT")
            .env_remove("TRIREME_TOKEN")
            .args(["--endpoint", &node.address]);
        if let Some(token) = token_flag {
            command.args(["--token", token]);
        }
        if let Some(token) = token_env {
            command.env("TRIREME_TOKEN", token);
        }
        command
            .args(["queue", "list"])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        async move {
            tokio::time::timeout(Duration::from_secs(60), command.output())
                .await
                .expect("the CLI finished within 60 s")
                .unwrap()
        }
    };
    assert!(cli(Some(TOKEN), None).await.status.success());
    assert!(cli(None, Some(TOKEN)).await.status.success());
    for (flag, env) in [(None, None), (Some("not-a-token-this-node-knows"), None)] {
        let output = cli(flag, env).await;
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("refused the call"), "{stderr}");
    }
}
