"""httpx calls to the tests' loopback servers, all sharing one TLS context.

`httpx.post()` builds a client per call, and each client loads the CA bundle into a new TLS context
(~50 ms CPU), though these requests are plain HTTP to 127.0.0.1: some hundred calls a file. Each call
is still its own client and connection, as with httpx's own functions."""

from __future__ import annotations

import ssl
from typing import Any

import httpx

TLS = ssl.create_default_context()  # loaded once; never used by an http:// request


def post(url: str, **kw: Any) -> httpx.Response:
    return httpx.post(url, verify=TLS, **kw)


def get(url: str, **kw: Any) -> httpx.Response:
    return httpx.get(url, verify=TLS, **kw)


def stream(method: str, url: str, **kw: Any):  # noqa: ANN201 (httpx's own context manager)
    return httpx.stream(method, url, verify=TLS, **kw)


def client(**kw: Any) -> httpx.Client:
    return httpx.Client(verify=TLS, **kw)
