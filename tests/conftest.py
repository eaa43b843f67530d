"""Shared fixtures: the bundled sample media, a loopback S3 server, a quiet environment."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DATA = REPO / "examples" / "data"
SAMPLE_IMAGES = sorted(
    p for p in SAMPLE_DATA.iterdir() if p.suffix.lower() in {".jpg", ".png"}
)
SAMPLE_VIDEO = SAMPLE_DATA / "bigbuckbunny.mp4"

# No test may reach a hub or the network; set before any model library is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def sample_data() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def sample_images() -> list[Path]:
    return SAMPLE_IMAGES


@pytest.fixture(scope="session")
def sample_video() -> Path:
    return SAMPLE_VIDEO


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 server (moto) on 127.0.0.1, with dummy credentials in the environment."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        for k, v in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        mp.setenv("S3_ENDPOINT_URL", url)
        yield url
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint) -> str:
    """A fresh, empty bucket; returns its ``s3://name`` URL."""
    import boto3

    name = f"fgtest-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return f"s3://{name}"
