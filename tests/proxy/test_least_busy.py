"""The choice of worker: fewest requests in flight through the proxy, ties in the
resolver's order, the same whether one worker is taken (``least_busy``) or all are
ordered for retries (``least_busy_first``)."""

import itertools

from gatekeeper.proxy.resolver import Endpoint, least_busy, least_busy_first


def _endpoints(*ids: str) -> list[Endpoint]:
    return [Endpoint(i, f"http://127.0.0.1:{8100 + n}", "m") for n, i in enumerate(ids)]


def test_the_worker_with_fewest_in_flight_wins():
    a, b, c = _endpoints("a", "b", "c")
    assert least_busy([a, b, c], {"a": 2, "b": 1, "c": 3}) == b
    assert least_busy([a, b, c], {"a": 2, "b": 1}) == c  # none in flight: 0


def test_a_tie_goes_to_the_first_in_the_resolvers_order():
    a, b, c = _endpoints("a", "b", "c")
    assert least_busy([a, b, c], {}) == a
    assert least_busy([c, b, a], {}) == c
    assert least_busy([a, b, c], {"a": 1}) == b
    assert least_busy([a, c, b], {"a": 1}) == c


def test_one_worker_is_taken_whatever_its_load():
    (a,) = _endpoints("a")
    assert least_busy([a], {"a": 7}) == a
    assert least_busy_first([a], {"a": 7}) == [a]


def test_least_busy_is_the_head_of_least_busy_first_for_every_order_and_load():
    workers = _endpoints("a", "b", "c", "d")
    for loads in itertools.product(range(3), repeat=4):
        outstanding = {e.worker_id: n for e, n in zip(workers, loads, strict=True) if n}
        for order in itertools.permutations(workers):
            ordered = least_busy_first(list(order), outstanding)
            assert least_busy(list(order), outstanding) == ordered[0]
            assert [outstanding.get(e.worker_id, 0) for e in ordered] == sorted(
                outstanding.get(e.worker_id, 0) for e in order
            )
