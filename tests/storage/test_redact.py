"""``redact_url`` / ``redact_text``: what fgdata stores and prints of a URL that carries credentials."""

from __future__ import annotations

import pytest

from fgdata.storage import file_url_path, redact_text, redact_url, without_query
from fgdata.storage.redact import DEFAULT_PARAMS, ENV, MARKER, redacted_params


def _read_again() -> None:
    """The setting is read once per process; a test that changes it has it read again."""
    redacted_params.cache_clear()


@pytest.fixture(autouse=True)
def _default_list(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    _read_again()
    yield
    monkeypatch.delenv(ENV, raising=False)
    _read_again()


def test_userinfo_goes_and_everything_else_stays_byte_for_byte():
    assert redact_url("http://alice:s3cret@host:8080/a/b.png?x=1#top") == "http://host:8080/a/b.png?x=1#top"
    assert redact_url("https://token@host/p") == "https://host/p"
    # the last "@" before the path ends the userinfo (an unescaped "@" in a password), one in the path is kept
    assert redact_url("http://u:p@ss@host/a@b.png") == "http://host/a@b.png"
    assert redact_url("http://host/a@b.png?v=1") == "http://host/a@b.png?v=1"


def test_presigned_parameters_are_replaced_whatever_their_case_or_encoding():
    url = ("https://bucket.s3.amazonaws.com/k/x.jpg?X-Amz-Algorithm=AWS4-HMAC-SHA256"
           "&X-Amz-Credential=AKIAEXAMPLE%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20260101T000000Z"
           "&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&x-amz-security-token=FwoGZX&X-Amz-Signature=abc123")
    assert redact_url(url) == (
        "https://bucket.s3.amazonaws.com/k/x.jpg?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential={MARKER}&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
        f"&x-amz-security-token={MARKER}&X-Amz-Signature={MARKER}")
    assert redact_url("http://h/a?X%2DAmz%2DSignature=abc&b=2") == f"http://h/a?X%2DAmz%2DSignature={MARKER}&b=2"
    for name in DEFAULT_PARAMS:
        assert redact_url(f"http://h/a.png?{name}=v&keep=1") == f"http://h/a.png?{name}={MARKER}&keep=1", name
    # a fragment's parameters too (OAuth puts tokens there); a name without a value is left
    assert redact_url("http://h/cb#access_token=abc&state=s") == f"http://h/cb#access_token={MARKER}&state=s"
    assert redact_url("http://h/a?token&sig=") == f"http://h/a?token&sig={MARKER}"


def test_local_paths_and_urls_without_credentials_are_untouched():
    for path in ("/data/a.png", "rel/a?token=1.png", "s3://bucket/a.png", "http://h/a.png?size=2&tokens=3"):
        assert redact_url(path) == path
    assert redact_url("img.png?token=1", relative=True) == f"img.png?token={MARKER}"


def test_the_list_is_extended_and_shortened_by_the_environment(monkeypatch):
    monkeypatch.setenv(ENV, " mySig , -key")
    _read_again()
    assert redact_url("http://h/a?MYSIG=1&key=2&sig=3") == f"http://h/a?MYSIG={MARKER}&key=2&sig={MARKER}"


def test_every_url_in_a_message_is_redacted():
    text = ("redirect: not an http(s) URL: ftp://bob:pw@example.invalid/x?sig=abc, "
            "from https://h/a.png?token=t (2 tries)")
    assert redact_text(text) == (f"redirect: not an http(s) URL: ftp://example.invalid/x?sig={MARKER}, "
                                 f"from https://h/a.png?token={MARKER} (2 tries)")
    assert redact_text("no url here: a?token=1") == "no url here: a?token=1"
    # console markup right after a URL stays markup; an IPv6 host's brackets belong to the URL
    assert redact_text("[bold]http://h/a?token=t[/]") == f"[bold]http://h/a?token={MARKER}[/]"
    assert redact_text("at http://u:p@[::1]:8080/a?sig=1.") == f"at http://[::1]:8080/a?sig={MARKER}."


def test_the_query_of_an_http_url_is_not_part_of_its_path():
    assert without_query("https://h/d/list.csv?Signature=a/b#x") == "https://h/d/list.csv"
    assert without_query("s3://b/odd?name#1.png") == "s3://b/odd?name#1.png"  # part of an S3 key
    assert file_url_path("file:///data/a%20b.png") == "/data/a b.png"
    assert file_url_path("file://localhost/data/x.png?v=1") == "/data/x.png"
    with pytest.raises(Exception, match="another host"):
        file_url_path("file://server/share/x.png")
