"""A second real client for Trireme's SQS endpoint: boto3 (botocore's JSON protocol with the
query-compatible error header), driven against a running node.

Usage: python boto3_smoke.py http://127.0.0.1:9324
Prints one line per check and closes with 'boto3: N passed, N failed'; exits non-zero on failure.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import traceback
import uuid

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINT = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9324"
RUN = uuid.uuid4().hex[:8]

sqs = boto3.client(
    "sqs",
    endpoint_url=ENDPOINT,
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
    config=Config(retries={"max_attempts": 1}),
)

CHECKS = []


def check(function):
    CHECKS.append(function)
    return function


def name(base):
    return f"{base}-{RUN}"


def error_code(call):
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"], error
    raise AssertionError("the call succeeded but an error was expected")


@check
def queue_lifecycle():
    url = sqs.create_queue(QueueName=name("life"))["QueueUrl"]
    assert url.endswith("/000000000000/" + name("life")), url
    assert sqs.get_queue_url(QueueName=name("life"))["QueueUrl"] == url
    listed = sqs.list_queues(QueueNamePrefix=name("life"))["QueueUrls"]
    assert listed == [url], listed
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "40"})
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "40", attributes
    assert attributes["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:" + name("life")
    sqs.delete_queue(QueueUrl=url)
    code, error = error_code(lambda: sqs.get_queue_url(QueueName=name("life")))
    assert code == "AWS.SimpleQueueService.NonExistentQueue", code
    # botocore maps the query error code to the modelled exception class.
    assert isinstance(error, sqs.exceptions.QueueDoesNotExist), type(error)


@check
def send_receive_delete_with_md5s():
    url = sqs.create_queue(QueueName=name("md5"))["QueueUrl"]
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody="derp",
        MessageAttributes={
            "timestamp": {"DataType": "Number.java.lang.Long", "StringValue": "1493147359900"}
        },
    )
    assert sent["MD5OfMessageBody"] == "58fd9edd83341c29f1aebba81c31e257", sent
    assert sent["MD5OfMessageAttributes"] == "2e2e4876d8e0bd6b8c2c8f556831c349", sent
    received = sqs.receive_message(
        QueueUrl=url,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
        WaitTimeSeconds=1,
    )
    [message] = received["Messages"]
    assert message["Body"] == "derp"
    assert message["MD5OfBody"] == hashlib.md5(b"derp").hexdigest()
    assert message["MessageAttributes"]["timestamp"]["StringValue"] == "1493147359900"
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    empty = sqs.receive_message(QueueUrl=url)
    assert "Messages" not in empty, empty


@check
def batch_partial_failure():
    url = sqs.create_queue(QueueName=name("batch"))["QueueUrl"]
    result = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "good", "MessageBody": "fine"},
            {"Id": "bad", "MessageBody": "nul \u0001 here"},
        ],
    )
    assert [entry["Id"] for entry in result["Successful"]] == ["good"], result
    [failed] = result["Failed"]
    assert failed["Id"] == "bad" and failed["Code"] == "InvalidMessageContents", failed
    assert failed["SenderFault"] is True
    code, _ = error_code(lambda: sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "same", "MessageBody": "a"}, {"Id": "same", "MessageBody": "b"}]))
    assert code == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", code


@check
def validation_wording():
    url = sqs.create_queue(QueueName=name("valid"))["QueueUrl"]
    code, error = error_code(lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11))
    assert code == "InvalidParameterValue", code
    assert "MaxNumberOfMessages" in str(error) and "between 1 and 10" in str(error), str(error)
    code, error = error_code(lambda: sqs.create_queue(QueueName=name("jobs") + ".fifo"))
    assert code == "AWS.SimpleQueueService.UnsupportedOperation", code
    assert "standard queues only" in str(error), str(error)


@check
def dead_letter_and_move_task():
    dlq = sqs.create_queue(QueueName=name("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    source = sqs.create_queue(
        QueueName=name("src"),
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=source, MessageBody="poison")
    first = sqs.receive_message(QueueUrl=source, VisibilityTimeout=0)
    assert len(first["Messages"]) == 1
    second = sqs.receive_message(QueueUrl=source)
    assert "Messages" not in second, second
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]
    dead = sqs.receive_message(QueueUrl=dlq, VisibilityTimeout=0, MessageSystemAttributeNames=["All"])
    [message] = dead["Messages"]
    assert message["Attributes"]["DeadLetterQueueSourceArn"].endswith(":" + name("src"))
    task = sqs.start_message_move_task(SourceArn=dlq_arn)
    assert task["TaskHandle"]
    back = sqs.receive_message(QueueUrl=source, WaitTimeSeconds=10)
    assert back["Messages"][0]["Body"] == "poison", back
    tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert tasks[0]["Status"] in ("RUNNING", "COMPLETED"), tasks


@check
def tags_and_purge():
    url = sqs.create_queue(QueueName=name("tags"), tags={"team": "payments"})["QueueUrl"]
    sqs.tag_queue(QueueUrl=url, Tags={"env": "ci"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "payments", "env": "ci"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "ci"}
    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.purge_queue(QueueUrl=url)
    code, error = error_code(lambda: sqs.purge_queue(QueueUrl=url))
    assert code == "AWS.SimpleQueueService.PurgeQueueInProgress", code
    assert isinstance(error, sqs.exceptions.PurgeQueueInProgress), type(error)


@check
def aws_cli_commands_from_the_readme():
    """The `aws sqs --endpoint-url ...` commands node/src/sqs/README.md shows."""
    aws = shutil.which("aws", path=os.path.dirname(sys.executable)) or shutil.which("aws")
    assert aws, "the aws CLI is not installed (run_boto3.sh installs it into the venv)"
    env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
               AWS_DEFAULT_REGION="us-east-1")

    def cli(*args):
        done = subprocess.run([aws, "--endpoint-url", ENDPOINT, "--output", "json", "sqs", *args],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout) if done.stdout.strip() else {}

    url = cli("create-queue", "--queue-name", name("cli"))["QueueUrl"]
    cli("send-message", "--queue-url", url, "--message-body", "hello")
    received = cli("receive-message", "--queue-url", url, "--wait-time-seconds", "1")
    assert received["Messages"][0]["Body"] == "hello", received


def main():
    passed = failed = 0
    for function in CHECKS:
        try:
            function()
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            failed += 1
            print(f"FAIL {function.__name__}")
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {function.__name__}")
    print(f"boto3: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
