"""Fill S3 credentials from the reference's JSON file; values are never printed."""

from __future__ import annotations

import json
import os

from fgdata.errors import StorageError

# JSON key -> environment variables it fills (when they are unset).
_KEYS = {
    "aws_access_key_id": ("AWS_ACCESS_KEY_ID",),
    "aws_secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "region_name": ("AWS_DEFAULT_REGION", "AWS_REGION"),
}


def load_s3_credentials_file(path: str = "./credentials/s3.json") -> None:
    """Set unset AWS variables from ``path``; a missing file is fine, the environment may suffice."""
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        raise StorageError(f"{path}: not a readable JSON credentials file") from None
    if not isinstance(data, dict):
        raise StorageError(f"{path}: expected a JSON object with aws_access_key_id, aws_secret_access_key")
    for key, names in _KEYS.items():
        value = data.get(key)
        if value:
            for name in names:
                os.environ.setdefault(name, str(value))
    endpoint = data.get("endpoint_url")
    # An endpoint from the environment, in either variable, wins over the file.
    if endpoint and not (os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")):
        os.environ["S3_ENDPOINT_URL"] = str(endpoint)
        os.environ["AWS_ENDPOINT_URL"] = str(endpoint)
