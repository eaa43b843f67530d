"""Fixtures for the S3 storage tests."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def closed_port_url() -> str:
    """An http URL on loopback where nothing listens: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """No AWS credentials from the environment, shared files or the metadata service."""
    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
