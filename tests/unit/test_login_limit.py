"""Failed logins are limited per client address: the 11th refused password within a minute is
answered 429 without reaching the server, other addresses are not affected, and the window
passes."""

from __future__ import annotations

import asyncio

from agent_core.serving.login_limit import MAX_FAILURES, WINDOW_S, FailedLoginLimit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _app_answering(status: int, seen: list[str]):
    async def app(scope, receive, send) -> None:
        seen.append(scope["client"][0])
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


def _status(gate: FailedLoginLimit, client: str, credentials: bool = True) -> tuple[int, dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    headers = [(b"authorization", b"Basic Z3Vlc3M6Z3Vlc3M=")] if credentials else []
    scope = {"type": "http", "client": (client, 50000), "headers": headers}
    asyncio.run(gate(scope, None, send))
    start = sent[0]
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


def test_wrong_passwords_are_limited_per_client_until_the_window_passes() -> None:
    seen: list[str] = []
    clock = Clock()
    gate = FailedLoginLimit(_app_answering(401, seen), clock=clock)
    for _ in range(MAX_FAILURES):
        assert _status(gate, "10.0.0.9")[0] == 401
        clock.now += 1
    status, headers = _status(gate, "10.0.0.9")
    assert status == 429
    assert int(headers["retry-after"]) == WINDOW_S - MAX_FAILURES  # until the first one is old
    assert len(seen) == MAX_FAILURES  # the limited attempt never reached the server
    assert _status(gate, "10.0.0.8")[0] == 401  # another address still gets its answer
    clock.now += WINDOW_S - MAX_FAILURES
    assert _status(gate, "10.0.0.9")[0] == 401  # the oldest failure left the window


def test_requests_without_credentials_and_good_logins_are_not_counted() -> None:
    gate = FailedLoginLimit(_app_answering(401, []), clock=Clock())
    for _ in range(3 * MAX_FAILURES):
        assert _status(gate, "10.0.0.9", credentials=False)[0] == 401  # a browser's first try
    ok = FailedLoginLimit(_app_answering(200, []), clock=Clock())
    for _ in range(3 * MAX_FAILURES):
        assert _status(ok, "10.0.0.9")[0] == 200


def test_the_table_of_clients_stays_bounded() -> None:
    from agent_core.serving import login_limit

    gate = FailedLoginLimit(_app_answering(401, []), clock=Clock())
    for n in range(login_limit.MAX_CLIENTS + 50):
        gate.failed(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
    assert len(gate.failures) == login_limit.MAX_CLIENTS


def test_refused_websocket_tokens_count_and_a_limited_client_is_closed_unheard() -> None:
    """Prefect checks a websocket's token in its first message and closes with 1008 if wrong."""
    reached: list[str] = []

    async def app(scope, receive, send) -> None:
        reached.append(scope["client"][0])
        await send({"type": "websocket.close", "code": 1008, "reason": "Invalid token"})

    gate = FailedLoginLimit(app, clock=Clock())
    closes: list[dict] = []

    async def send(message: dict) -> None:
        closes.append(message)

    scope = {"type": "websocket", "client": ("10.0.0.9", 50000), "headers": []}
    for _ in range(MAX_FAILURES + 1):
        asyncio.run(gate(scope, None, send))
    assert len(reached) == MAX_FAILURES
    assert closes[-1]["code"] == 1008 and "too many failed logins" in closes[-1]["reason"]
