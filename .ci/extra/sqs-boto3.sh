#!/usr/bin/env bash
# The SQS endpoint driven by a second real client (boto3 from PyPI); see node/tests/python/.
exec bash "$(dirname "$0")/../../node/tests/python/run_boto3.sh"
