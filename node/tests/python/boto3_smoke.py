"""A second real client for Trireme's SQS endpoint: boto3 (botocore's JSON protocol with the
query-compatible error header), driven against a running node.

Usage: python boto3_smoke.py http://127.0.0.1:9324[,http://127.0.0.1:9325,...]
With several endpoints (the members of one cluster) every call goes to the next member in turn,
so one check creates, sends, receives and deletes through different nodes; every check runs
against both.
Prints one line per check and closes with 'boto3: N passed, N failed'; exits non-zero on failure.
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import uuid

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINTS = (sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9324").split(",")
ENDPOINT = ENDPOINTS[0]
CLUSTER = len(ENDPOINTS) > 1
RUN = uuid.uuid4().hex[:8]

SESSION = boto3.session.Session()


def client_for(endpoint, region="us-east-1"):
    return SESSION.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1}),
    )


class RoundRobin:
    """Every call through the next client: one check's calls land on every member in turn."""

    def __init__(self, clients):
        self.clients = clients
        self.calls = 0

    def __getattr__(self, attribute):
        client = self.clients[self.calls % len(self.clients)]
        self.calls += 1
        return getattr(client, attribute)


sqs = RoundRobin([client_for(endpoint) for endpoint in ENDPOINTS])

CHECKS = []


def check(function):
    CHECKS.append(function)
    return function


def name(base):
    return f"{base}-{RUN}"


def eventually(read, done, seconds=10):
    """`read()` until `done` holds of its value or `seconds` pass; the last value read."""
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


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
    # An attribute change propagates within a while (SQS: up to 60 s), also between members.
    attributes = eventually(
        lambda: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"],
        lambda attributes: attributes["VisibilityTimeout"] == "40")
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
    code, error = error_code(lambda: sqs.create_queue(
        QueueName=name("jobs") + ".fifo", Attributes={"FifoQueue": "true"}))
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
    first = sqs.receive_message(QueueUrl=source, VisibilityTimeout=0, WaitTimeSeconds=5)
    assert len(first["Messages"]) == 1
    second = sqs.receive_message(QueueUrl=source)
    assert "Messages" not in second, second
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]
    dead = sqs.receive_message(QueueUrl=dlq, VisibilityTimeout=0, WaitTimeSeconds=5,
                               MessageSystemAttributeNames=["All"])
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
    tags = eventually(lambda: sqs.list_queue_tags(QueueUrl=url).get("Tags"),
                      lambda tags: tags == {"team": "payments", "env": "ci"})
    assert tags == {"team": "payments", "env": "ci"}, tags
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    tags = eventually(lambda: sqs.list_queue_tags(QueueUrl=url).get("Tags"),
                      lambda tags: tags == {"env": "ci"})
    assert tags == {"env": "ci"}, tags
    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.purge_queue(QueueUrl=url)
    # Purged through one member, nothing sent before it is received through another.
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    code, error = error_code(lambda: sqs.purge_queue(QueueUrl=url))
    assert code == "AWS.SimpleQueueService.PurgeQueueInProgress", code
    assert isinstance(error, sqs.exceptions.PurgeQueueInProgress), type(error)


def error_message(call):
    """The code, message and HTTP status of the error `call` raises."""
    code, error = error_code(call)
    return code, error.response["Error"]["Message"], error.response["ResponseMetadata"]["HTTPStatusCode"]


def received_twice(url):
    sqs.send_message(QueueUrl=url, MessageBody="job")
    first = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first, VisibilityTimeout=0)
    second = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]["ReceiptHandle"]
    return first, second


@check
def superseded_handles_as_aws_answers_them():
    """Issue 14, class 2: a delete with a superseded handle succeeds and deletes nothing; a
    visibility change with one stays refused (Trireme's one deliberate difference)."""
    url = sqs.create_queue(QueueName=name("stale"))["QueueUrl"]
    old, new = received_twice(url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=old)
    batch = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "old", "ReceiptHandle": old}])
    assert [entry["Id"] for entry in batch["Successful"]] == ["old"], batch
    counts = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    assert counts["ApproximateNumberOfMessagesNotVisible"] == "1", counts
    code, message, status = error_message(lambda: sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=30))
    assert (code, status) == ("InvalidParameterValue", 400), (code, status)
    assert message == f"Value {old} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired.", message
    sqs.delete_message(QueueUrl=url, ReceiptHandle=new)


@check
def malformed_handles_and_gone_messages_in_aws_words():
    """Issue 14, classes 3 and 4."""
    url = sqs.create_queue(QueueName=name("garbage"))["QueueUrl"]
    code, message, status = error_message(
        lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="garbage"))
    assert (code, status) == ("ReceiptHandleIsInvalid", 400), (code, status)
    assert message == 'The input receipt handle "garbage" is not a valid receipt handle.', message
    sqs.send_message(QueueUrl=url, MessageBody="x")
    handle = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]["ReceiptHandle"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    code, message, _ = error_message(lambda: sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=42))
    assert code == "InvalidParameterValue", code
    assert message == (f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does "
                       "not exist or is not available for visibility timeout change."), message


@check
def validation_in_aws_words():
    """Issue 14, class 4: the wording AWS gives, recorded against AWS."""
    url = sqs.create_queue(QueueName=name("words"), Attributes={"DelaySeconds": "1"})["QueueUrl"]
    cases = [
        (lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=21), "InvalidParameterValue",
         "Value 21 for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, if provided."),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody=""), "MissingParameter",
         "The request must contain the parameter MessageBody."),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a b", "MessageBody": "x"}]),
         "AWS.SimpleQueueService.InvalidBatchEntryId",
         "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at most 80 letters long."),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": f"e{i}", "MessageBody": "x"} for i in range(20)]),
         "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
         "Maximum number of entries per request are 10. You have sent 20."),
        (lambda: sqs.create_queue(QueueName=name("words"), Attributes={"DelaySeconds": "2"}),
         "QueueAlreadyExists",
         "A queue already exists with the same name and a different value for attribute DelaySeconds"),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
            "ErrorDetails": {"DataType": "String", "StringValue": ""}}), "InvalidParameterValue",
         "Message (user) attribute 'ErrorDetails' must contain a non-empty value of type 'String'."),
        (lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "43201"}),
         "InvalidAttributeValue", "Invalid value for the parameter VisibilityTimeout."),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x" * (1024 * 1024 + 1)),
         "InvalidParameterValue",
         "One or more parameters are invalid. Reason: Message must be shorter than 1048576 bytes."),
    ]
    for call, code, message in cases:
        got = error_message(call)
        assert got[:2] == (code, message), got


@check
def fifo_requests_on_standard_queues_as_aws_refuses_them():
    """Issue 14, class 5."""
    cases = [
        ({"QueueName": name("std"), "Attributes": {"FifoQueue": "true"}}, "InvalidParameterValue",
         "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in length."),
        ({"QueueName": name("std") + ".fifo"}, "InvalidParameterValue",
         "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"),
        ({"QueueName": name("std"), "Attributes": {"FifoQueue": "false"}}, "InvalidAttributeName",
         "Unknown Attribute FifoQueue."),
        ({"QueueName": name("std"), "Attributes": {"DeduplicationScope": "queue"}}, "InvalidAttributeName",
         "You can specify the DeduplicationScope only when FifoQueue is set to true."),
    ]
    for request, code, message in cases:
        got = error_message(lambda: sqs.create_queue(**request))
        assert got[:2] == (code, message), (request, got)
    url = sqs.create_queue(QueueName=name("std"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="tenant-1")
    got = error_message(lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="group 123"))
    assert got[0] == "InvalidParameterValue" and "MessageGroupId can only include" in got[1], got


@check
def queues_addressed_by_bare_name():
    """Issue 14, class 7: a bare queue name where a URL is expected."""
    sqs.create_queue(QueueName=name("bare"))
    sqs.send_message(QueueUrl=name("bare"), MessageBody="by name")
    [message] = sqs.receive_message(QueueUrl=name("bare"), WaitTimeSeconds=1)["Messages"]
    assert message["Body"] == "by name", message


@check
def queues_kept_per_region():
    """Issue 14, class 7: the signing scope's region chooses the queues, as in SQS."""
    away = RoundRobin([client_for(endpoint, "eu-west-1") for endpoint in ENDPOINTS])
    queue = name("regional")
    away.create_queue(QueueName=queue)
    away.send_message(QueueUrl=queue, MessageBody="in eu-west-1")
    code, _ = error_code(lambda: sqs.get_queue_url(QueueName=queue))
    assert code == "AWS.SimpleQueueService.NonExistentQueue", code
    listed = sqs.list_queues(QueueNamePrefix=queue).get("QueueUrls", [])
    assert listed == [], listed
    arn = away.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
    assert arn["Attributes"]["QueueArn"] == f"arn:aws:sqs:eu-west-1:000000000000:{queue}", arn
    [message] = away.receive_message(QueueUrl=queue, WaitTimeSeconds=2)["Messages"]
    assert message["Body"] == "in eu-west-1", message


@check
def move_tasks_as_aws_runs_them():
    """Issue 14, class 8."""
    plain = sqs.create_queue(QueueName=name("plain"))["QueueUrl"]
    plain_arn = sqs.get_queue_attributes(QueueUrl=plain, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    got = error_message(lambda: sqs.start_message_move_task(SourceArn=plain_arn))
    assert got == ("InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.", 400), got
    dlq = sqs.create_queue(QueueName=name("mt-dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.create_queue(QueueName=name("mt-src"), Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})})
    got = error_message(lambda: sqs.start_message_move_task(
        SourceArn=dlq_arn, DestinationArn=plain_arn.replace(name("plain"), name("nowhere"))))
    assert got == ("ResourceNotFoundException",
                   "The resource that you specified for the DestinationArn parameter doesn't exist.", 404), got
    got = error_message(lambda: sqs.cancel_message_move_task(TaskHandle="garbage"))
    assert got == ("InvalidParameterValue", "Value for parameter TaskHandle is invalid.", 400), got
    for index in range(5):
        sqs.send_message(QueueUrl=dlq, MessageBody=f"m{index}")
    handle = sqs.start_message_move_task(
        SourceArn=dlq_arn, DestinationArn=plain_arn, MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    task = json.loads(base64.b64decode(handle))
    assert task["sourceArn"] == dlq_arn, task
    got = error_message(lambda: sqs.start_message_move_task(SourceArn=dlq_arn))
    assert got[:2] == ("InvalidParameterValue", "There is already a task running. Only one active task is allowed for a source queue arn at a given time."), got
    sqs.cancel_message_move_task(TaskHandle=handle)


@check
def attributes_kept_and_returned():
    """Issue 14, class 6: Policy, SqsManagedSseEnabled, AWSTraceHeader, permissions."""
    url = sqs.create_queue(QueueName=name("kept"))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["SqsManagedSseEnabled"] == "true", attributes
    assert "Policy" not in attributes, attributes
    policy = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": arn}]})
    # SQS says an attribute change takes up to 60 s to propagate; in a cluster the next call goes
    # to another member, whose view may not hold the change yet. Each read is retried a while.
    def policy_now():
        return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]).get(
            "Attributes", {}).get("Policy")

    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": policy})
    got = eventually(policy_now, lambda got: got and json.loads(got) == json.loads(policy))
    assert json.loads(got) == json.loads(policy), got
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    got = eventually(policy_now, lambda got: got is None)
    assert got is None, got
    sqs.add_permission(QueueUrl=url, Label="readers", AWSAccountIds=["111111111111"],
                       Actions=["ReceiveMessage"])
    got = eventually(policy_now, lambda got: got is not None)
    document = json.loads(got)
    [statement] = document["Statement"]
    assert statement["Sid"] == "readers" and statement["Action"] == "SQS:ReceiveMessage", document
    sqs.remove_permission(QueueUrl=url, Label="readers")
    trace = "Root=1-3152b799-8954dae64eda91bc9a23a7e8;Parent=7fa8c0f79203be72;Sampled=1"
    sqs.send_message(QueueUrl=url, MessageBody="traced", MessageSystemAttributes={
        "AWSTraceHeader": {"DataType": "String", "StringValue": trace}})
    [message] = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["AWSTraceHeader"],
                                    WaitTimeSeconds=1)["Messages"]
    assert message["Attributes"] == {"AWSTraceHeader": trace}, message


@check
def order_by_send():
    """Issue 14, class 1: a batch comes back in entry order, and a message whose visibility
    expired comes back before messages sent after it. In a cluster too, each call through the
    next member (spec/replication.md, *Order of a receive's answer*): the batch's sends share one
    sent_at and ids drawn in entry order, and a receive answers by (entered_at, id)."""
    url = sqs.create_queue(QueueName=name("order"))["QueueUrl"]
    bodies = [f"b{index}" for index in range(6)]
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"e{index}", "MessageBody": body} for index, body in enumerate(bodies)])
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1)["Messages"]
    assert [message["Body"] for message in received] == bodies, received
    sqs.send_message(QueueUrl=url, MessageBody="later")
    time.sleep(1.2)
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [message["Body"] for message in again] == bodies + ["later"], again


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
    # Issue 14, class 2: the CLI deletes with a superseded handle without an error.
    old = received["Messages"][0]["ReceiptHandle"]
    cli("change-message-visibility", "--queue-url", url, "--receipt-handle", old,
        "--visibility-timeout", "0")
    again = cli("receive-message", "--queue-url", url, "--wait-time-seconds", "1")
    cli("delete-message", "--queue-url", url, "--receipt-handle", old)
    cli("delete-message", "--queue-url", url, "--receipt-handle",
        again["Messages"][0]["ReceiptHandle"])
    # Class 3: a malformed handle fails with AWS's code.
    done = subprocess.run([aws, "--endpoint-url", ENDPOINT, "sqs", "delete-message", "--queue-url",
                           url, "--receipt-handle", "garbage"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "ReceiptHandleIsInvalid" in done.stderr, done.stderr


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
    where = f"{len(ENDPOINTS)} cluster members" if CLUSTER else "one node"
    print(f"boto3 against {where}: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
