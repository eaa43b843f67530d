"""Credentials in URLs never reach a file fgdata writes or a line it prints.

A URL is stored and shown (:func:`redact_url`) without its userinfo (``user:pass@``) and with the value of each
credential parameter of its query or fragment replaced by :data:`MARKER`: ``…/a.png?X-Amz-Signature=REDACTED``.
The parameters are :data:`DEFAULT_PARAMS`, compared without regard to case; ``FGDATA_REDACT_PARAMS`` (names
separated by commas) adds names, and ``-name`` takes a default off the list (a ``key`` that selects content
rather than granting access); it is read once per process. The fetch itself uses the URL as given. Everything else of the URL is kept byte
for byte, so the stored form still names the input: two URLs that differ only in a redacted value (a re-signed
presigned URL) are the same input to a rerun (docs/FORMATS.md). :func:`redact_text` does the same to every URL
inside a message.
"""

from __future__ import annotations

import functools
import os
import re
import urllib.parse

MARKER = "REDACTED"
ENV = "FGDATA_REDACT_PARAMS"
#: Query (and fragment) parameters whose values grant access: presigned S3 and GCS URLs, CloudFront and Azure
#: SAS signatures, OAuth and API tokens.
DEFAULT_PARAMS = ("X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "X-Goog-Signature",
                  "X-Goog-Credential", "Signature", "sig", "token", "access_token", "key", "api_key", "apikey",
                  "password", "client_secret")

_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")  # the last "@" before the path ends userinfo
#: A URL in a message: up to a space, a quote or a bracket (console markup: ``[/]``), a trailing punctuation mark
#: (``,`` ``.`` ``)`` …) not part of it; an IPv6 host's brackets (after any userinfo) are.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:[^\s\"'<>\[\]/?#]*@)?(?:\[[^\]\s]*\])?"
                          r"(?:[^\s\"'<>\[\]]*[^\s\"'<>\[\],;.:!?)])?")


@functools.lru_cache(maxsize=1)
def redacted_params() -> frozenset[str]:
    """The parameter names (lower case) whose values are redacted: the defaults and ``FGDATA_REDACT_PARAMS``,
    read once per process (a worker process inherits it)."""
    names = {p.lower() for p in DEFAULT_PARAMS}
    for word in os.environ.get(ENV, "").split(","):
        word = word.strip().lower()
        if word.startswith("-"):
            names.discard(word[1:].strip())
        elif word:
            names.add(word)
    return frozenset(names)


def _params(part: str) -> str:
    """``a=1&sig=x`` with the values of the named parameters replaced by the marker (a manifest of a billion
    URLs redacts every row: one split, one set lookup per parameter, the string rebuilt only on a hit)."""
    names = redacted_params()
    pieces = part.split("&")
    hit = False
    for i, piece in enumerate(pieces):
        name, eq, _ = piece.partition("=")
        if not eq:
            continue
        plain = urllib.parse.unquote_plus(name) if "%" in name or "+" in name else name
        if plain.lower() in names:
            pieces[i] = f"{name}={MARKER}"
            hit = True
    return "&".join(pieces) if hit else part


def redact_url(url: str, relative: bool = False) -> str:
    """``url`` as fgdata stores and prints it: no userinfo, credential parameter values replaced (see the module
    docstring); a local path is returned as it is, and so is a reference without a scheme unless ``relative``
    (a manifest row's ``img.png?token=…``, resolved against the manifest's URL)."""
    if "://" not in url and not relative:
        return url
    if "@" in url:
        url = _USERINFO.sub(r"\1", url, count=1)
    head, mark, rest = url.partition("?")
    if not mark:
        head, mark, rest = url.partition("#")
        return head + mark + _params(rest) if mark else url
    query, hash_, fragment = rest.partition("#")
    return head + "?" + _params(query) + hash_ + (_params(fragment) if hash_ else "")


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`): for messages and failure reasons."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
