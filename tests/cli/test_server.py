"""The API over real HTTP (uvicorn): the body limit holds for chunked bodies too."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx2 as httpx
import pytest

from tests.cli.conftest import PROJECT, Server

pytestmark = pytest.mark.db

JOBS = f"/api/v1/projects/{PROJECT}/jobs"


def test_oversize_bodies_are_413_with_and_without_a_length(server: Server) -> None:
    headers = {
        "Authorization": f"Bearer {server.tokens['submitter@' + PROJECT]}",
        "Content-Type": "application/json",
    }

    def chunks() -> Iterator[bytes]:
        yield b'{"padding": "'
        for _ in range(64):
            yield b"z" * 8192  # 512 KiB in all, twice the limit
        yield b'"}'

    with httpx.Client(base_url=server.url, timeout=30) as client:
        chunked = client.post(JOBS, content=chunks(), headers=headers)
        assert chunked.status_code == 413
        assert chunked.headers["content-type"] == "application/problem+json"
        declared = client.post(JOBS, content=b"x" * (300 * 1024), headers=headers)
        assert declared.status_code == 413
        assert declared.json()["status"] == 413
        # The server still answers afterwards.
        assert client.get("/readyz").json() == {"status": "ready"}


def test_a_client_waiting_to_continue_is_refused_before_it_sends(server: Server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    token = server.tokens["submitter@" + PROJECT]
    request = (
        f"POST {JOBS} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 10000000\r\n"
        "Expect: 100-continue\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(request.encode())
        answer = connection.recv(65536).decode()
    status_line = answer.split("\r\n", 1)[0]
    assert status_line.startswith("HTTP/1.1 413 ")
    assert "100 Continue" not in answer
