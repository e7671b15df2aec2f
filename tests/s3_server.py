"""moto as a real HTTP server on loopback, for code that talks to AWS (boto3 and AWS's own
CRT-based ``s3torchconnector`` alike): the same wire protocol as S3, EKS or CodeBuild, not a
mock object. One server per context; every service moto emulates answers on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from moto.server import ThreadedMotoServer

REGION = "us-east-1"


@contextmanager
def moto_server_endpoint() -> Iterator[str]:
    """The endpoint URL of a moto server that lives as long as the context."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_environment(endpoint: str) -> dict[str, str]:
    """What a process needs to reach the server: endpoint, dummy keys, region."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
    }
