"""``bench/proxy.py``'s tables and verdict from figures set by hand: "added" is against
the worker's figure of the same run, CPU is per request, and each of the issue's
targets (#15) says met or NOT met against vllm-router."""

from __future__ import annotations

from bench.proxy import Target, latency_report, streams_per_second, throughput_report, verdict


def _target(name: str, ms: float, first_ms: float, cpu_ms: float, rate: float) -> Target:
    t = Target(name, 1, None if name == "worker" else list)
    t.whole, t.first = [ms / 1e3] * 10, [first_ms / 1e3] * 10
    t.cpu_whole, t.n_whole = cpu_ms / 1e3 * 10, 10
    t.cpu_stream, t.n_stream = 2 * cpu_ms / 1e3 * 10, 10
    t.rates = [rate]
    return t


def _run(ours_ms: float, ours_first_ms: float, ours_cpu_ms: float, ours_rate: float) -> list[str]:
    fast = [
        _target("worker", 1.0, 0.5, 0.0, 0.0),
        _target("gatekeeper", ours_ms, ours_first_ms, ours_cpu_ms, 0.0),
        _target("vllm-router", 1.2, 0.8, 0.2, 0.0),
    ]
    paced = [_target("worker", 0, 0, 0, 200.0), _target("gatekeeper", 0, 0, 0, ours_rate)]
    return verdict(fast, paced)


def test_verdict_met_when_no_worse_than_vllm_router() -> None:
    lines = _run(ours_ms=1.1, ours_first_ms=0.7, ours_cpu_ms=0.15, ours_rate=199.0)
    assert lines[0] == "added p50: gatekeeper 0.100 ms vs vllm-router 0.200 ms -> met"
    assert lines[1] == "added TTFT: gatekeeper 0.200 ms vs vllm-router 0.300 ms -> met"
    assert lines[2] == "CPU per request: gatekeeper 0.150 ms vs vllm-router 0.200 ms -> met"
    assert lines[3] == "CPU per stream: gatekeeper 0.300 ms vs vllm-router 0.400 ms -> met"
    assert lines[4].startswith("throughput at 64 streams: gatekeeper 199.0/s, worker 200.0/s")
    assert lines[4].endswith("-> met (at most 2 % below the worker)")


def test_verdict_not_met_when_slower_dearer_or_losing_throughput() -> None:
    lines = _run(ours_ms=1.3, ours_first_ms=0.9, ours_cpu_ms=0.25, ours_rate=190.0)
    assert [line.rsplit("-> ", 1)[1] for line in lines[:4]] == ["NOT met"] * 4
    assert "(+5.0% lost) -> NOT met" in lines[4]


def test_no_verdict_without_vllm_router() -> None:
    fast = [_target("worker", 1.0, 0.5, 0.0, 0.0), _target("gatekeeper", 1.1, 0.7, 0.1, 0.0)]
    assert verdict(fast, fast) == ["vllm-router was not measured: no verdict."]


def test_tables_show_added_figures_and_no_cpu_for_the_worker() -> None:
    fast = [_target("worker", 1.0, 0.5, 0.0, 0.0), _target("gatekeeper", 1.25, 0.75, 0.3, 0.0)]
    worker, ours = latency_report(fast)[1].split(), latency_report(fast)[2].split()
    assert worker[:7] == ["worker", "1.000", "1.000", "0.000", "0.000", "0.500", "0.000"]
    assert worker[7:10] == ["-", "-", "-"]  # its own CPU is not a proxy's
    added = ["0.250", "0.250", "0.750", "0.250"]
    assert ours[:10] == ["gatekeeper", "1.250", "1.250", *added, "0.300", "0.600", "-"]
    assert throughput_report(fast)[2].split()[:4] == ["gatekeeper", "0.0", "0-0", "-"]
    fast[1].rates = [180.4, 190.6]  # the rounds' spread, rounded
    assert throughput_report(fast)[2].split()[1:3] == ["185.5", "180-191"]


def test_streams_per_second_is_each_connections_rate_summed() -> None:
    # 64 connections in step, 0.34 s a stream: 15 streams each by 5.1 s. Four of them
    # are a little ahead and fit a 16th before the round ends. The rate is unchanged.
    in_step = [(15, 15 * 0.34)] * 64
    four_ahead = [(15, 15 * 0.34)] * 60 + [(16, 16 * 0.34)] * 4
    assert round(streams_per_second(in_step), 6) == round(64 / 0.34, 6)
    assert round(streams_per_second(four_ahead), 6) == round(64 / 0.34, 6)
    # All the streams over the time to the last one's end would read it 6 % slower.
    everything = sum(n for n, _ in four_ahead) / max(s for _, s in four_ahead)
    assert everything < 0.95 * 64 / 0.34
    assert streams_per_second([(3, 1.0), (0, 0.0)]) == 3.0
