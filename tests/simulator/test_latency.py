"""The simulator answers at the speed it is told to: with ``GATEKEEPER_SIM_TOKEN_SECONDS=0``
a request costs a few milliseconds, not the ~40 ms of a delayed-ACK stall (a response
written in pieces on a socket without ``TCP_NODELAY``).

A behaviour test for the stall, not a speed target (those live in ``bench/``): 20
requests in a row on one keep-alive connection, bounded at 400 ms in all, which 20
stalls of 40 ms (800 ms) can never meet and a loaded CI machine meets with room."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.simulator.test_simulator import Sim

REQUESTS = 20
BOUND_SECONDS = 0.4  # 20 delayed-ACK stalls take 20 x 40 ms = 800 ms


@pytest.fixture(scope="module")
def fast_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with Sim(tmp_path_factory.mktemp("fast"), "org/m", GATEKEEPER_SIM_TOKEN_SECONDS="0") as s:
        s.wait_ready()
        yield s
        assert s.stop() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_sequential_requests_do_not_stall(fast_sim: Sim, stream: bool) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    body = {"model": "org/m", "messages": messages, "max_tokens": 16, "stream": stream}
    with httpx.Client(base_url=fast_sim.url, timeout=10) as client:
        client.post("/v1/chat/completions", json=body).raise_for_status()  # connect, warm
        start = time.perf_counter()
        for _ in range(REQUESTS):
            answer = client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200
            assert answer.text.endswith("data: [DONE]\n\n") if stream else answer.json()["usage"]
        elapsed = time.perf_counter() - start
    assert elapsed < BOUND_SECONDS, f"{REQUESTS} requests took {elapsed * 1e3:.0f} ms"
