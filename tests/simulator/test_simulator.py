"""The gatekeeper simulator (stand-in for ``vllm serve``), run as a real process on
loopback: readiness, vLLM's log lines, the OpenAI surface through the ``openai``
client, failure modes, and its memory claims in the stand-in NVML driver."""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gatekeeper.gpus.inventory import GpuProcess
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import H100_RESERVED_BYTES, FakeNvml, FakeProcess, h100, write_state
from gatekeeper.simulator import SimEnv
from gatekeeper.simulator.flags import human_readable_int
from gatekeeper.simulator.nvml_claims import MARKER, Claim, claim, release, visible_positions
from gatekeeper.units import GIB, MIB

PREFIX = re.compile(
    r"^\((?P<proc>APIServer|EngineCore|Worker_TP\d+|Worker_PP\d+_TP\d+) pid=(?P<pid>\d+)\) "
    r"(?P<level>INFO|WARNING|ERROR) (?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[(?P<file>[\w./]+\.py):(?P<line>\d+)\] (?P<message>.*)$"
)
STARTUP_LINES = {
    "args": r"non-default args: (\{.*\})$",
    "max_model_len": r"Using max model len (\d+)$",
    "weights": r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds$",
    "kv": r"Available KV cache memory: ([\d.]+) GiB$",
    "kv_tokens": (
        r"GPU KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens "
        r"per request: ([\d.]+)x$"
    ),
    "graphs": r"Graph capturing finished in (\d+) secs, took ([\d.]+) GiB$",
    "summary": (
        r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup\. Desired GPU memory "
        r"utilization is \(([\d.]+), ([\d.]+) GiB\)\. Actual usage is ([\d.]+) GiB for "
        r"consumed memory \(weights \+ non-torch\), ([\d.]+) GiB for peak activation, and "
        r"([\d.]+) GiB for CUDAGraph memory\. .* Current kv cache memory in use is ([\d.]+) GiB\.$"
    ),
    "init": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s$",
    "server": r"Starting vLLM server on http://([\d.]+):(\d+)$",
}
COMPONENTS = {
    "GATEKEEPER_SIM_WEIGHTS_BYTES": "16GiB",
    "GATEKEEPER_SIM_KV_BYTES": "40GiB",
    "GATEKEEPER_SIM_ACTIVATION_BYTES": "2GiB",
    "GATEKEEPER_SIM_NON_TORCH_BYTES": "1GiB",
    "GATEKEEPER_SIM_CUDA_GRAPH_BYTES": "512MiB",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GATEKEEPER_", "FAKE_NVML")) and k != "CUDA_VISIBLE_DEVICES"
    }
    return env | {"GATEKEEPER_SIM_STARTUP_SECONDS": "0.2"} | extra


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gatekeeper.simulator", "serve", *args]


class Sim:
    """A simulator process on 127.0.0.1, its log in a file (as the launcher keeps it)."""

    def __init__(self, directory: Path, *args: str, name: str = "sim", **env: str) -> None:
        self.port = _free_port()
        self.log_path, self.err_path = directory / f"{name}.log", directory / f"{name}.err"
        self.url = f"http://127.0.0.1:{self.port}"
        command = _command(*args, "--host", "127.0.0.1", "--port", str(self.port))
        with open(self.log_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(command, stdout=out, stderr=err, env=_env(**env))

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, text: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.log()}"
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.log()}"
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.ConnectError:
                pass
            assert time.monotonic() < deadline, f"not ready:\n{self.log()}"
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=10)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def __enter__(self) -> Sim:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _lines(log: str) -> list[re.Match[str]]:
    matches = [PREFIX.match(line) for line in log.splitlines()]
    return [m for m in matches if m is not None]


def _startup(log: str) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Each start-up line's position in the log and its captured values."""
    found: dict[str, tuple[int, tuple[str, ...]]] = {}
    for i, m in enumerate(_lines(log)):
        for key, pattern in STARTUP_LINES.items():
            hit = re.search(pattern, m["message"])
            if hit and key not in found:
                found[key] = (i, hit.groups())
    return found


def _state_lines(path: Path, prefix: str) -> list[list[str]]:
    return [line.split("|") for line in path.read_text().splitlines() if line.startswith(prefix)]


def _gpu_used(path: Path) -> list[int]:
    return [int(f[6]) for f in _state_lines(path, "gpu|")]


def _wait_until(condition: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One simulator for the HTTP tests: two served names, made-up memory figures."""
    args = ["org/sim-model", "--served-model-name", "sim-model", "alias"]
    args += ["--max-model-len", "4096", "--gpu-memory-utilization", "0.9"]
    env = COMPONENTS | {"GATEKEEPER_SIM_TOKEN_SECONDS": "0.002"}
    with Sim(tmp_path_factory.mktemp("sim"), *args, **env) as s:
        s.wait_ready()
        yield s
        assert s.stop() == 0


# Start-up and the log.


def test_refuses_connections_until_ready(tmp_path: Path) -> None:
    with Sim(tmp_path, "m", GATEKEEPER_SIM_STARTUP_SECONDS="1.0") as s:
        s.wait_for("non-default args")
        started = time.monotonic()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{s.url}/health", timeout=1)
        s.wait_ready()
        assert time.monotonic() - started > 0.5
        assert httpx.get(f"{s.url}/ping").status_code == 200
        version = httpx.get(f"{s.url}/version").json()
        assert version["note"] == "gatekeeper simulator, not vLLM"
        assert "gatekeeper.simulator" in version["version"]
        assert s.stop() == 0


def test_startup_log_lines_in_vllm_format_and_order(sim: Sim) -> None:
    log = sim.log()
    lines = _lines(log)
    assert lines and {m["pid"] for m in lines} == {str(sim.proc.pid)}
    assert "gatekeeper simulator, not vLLM" in lines[0]["message"]
    found = _startup(log)
    assert list(found) == list(STARTUP_LINES)  # all present, in vLLM's order
    assert [found[k][0] for k in STARTUP_LINES] == sorted(found[k][0] for k in STARTUP_LINES)
    args = ast.literal_eval(found["args"][1][0])
    assert args["model_tag"] == "org/sim-model" and args["max_model_len"] == 4096
    assert args["served_model_name"] == ["sim-model", "alias"]
    assert found["max_model_len"][1] == ("4096",)
    assert found["weights"][1][0] == "16.0"
    assert found["kv"][1] == ("40.0",)
    # 40 GiB / (16 tokens x 128 KiB) = 20480 blocks; 4096 tokens need 256 of them.
    assert found["kv_tokens"][1] == ("327,680", "4,096", "80.00")
    assert found["graphs"][1][1] == "0.50"
    free, total, u, requested, consumed, peak, graphs, kv = found["summary"][1]
    assert (free, total, u, requested) == ("80.0", "80.0", "0.9", "72.0")
    assert (consumed, peak, graphs, kv) == ("17.0", "2.5", "0.5", "40.0")
    assert found["server"][1] == ("127.0.0.1", str(sim.port))


def test_eager_kv_bytes_and_tensor_parallel_log(tmp_path: Path) -> None:
    args = ["m", "--enforce-eager", "--kv-cache-memory-bytes", "4G", "-tp", "2"]
    with Sim(tmp_path, *args) as s:
        s.wait_ready()
        log = s.log()
        assert s.stop() == 0
    assert "Graph capturing" not in log and "Available KV cache memory" not in log
    reserved = [m for m in _lines(log) if "reserved 4.0 GiB memory for KV Cache" in m["message"]]
    assert [m["proc"] for m in reserved] == ["Worker_TP0", "Worker_TP1"]
    assert "'kv_cache_memory_bytes': 4294967296" in log and "'enforce_eager': True" in log


def test_starts_with_any_flag_of_vllms_table_and_says_what_it_does_not_simulate(
    tmp_path: Path,
) -> None:
    args = ["m", "--enable-lora", "--max-loras", "4", "-O3", "--runner", "generate"]
    args += ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    args += ["--cpu-offload-gb", "2", "-dp", "2", "--enable-expert-parallel"]
    args += ["--limit-mm-per-prompt", '{"image": 2}', "--num-gpu-blocks-override", "512"]
    args += ["--cudagraph-capture-sizes", "1", "2", "4", "--enable-sleep-mode"]
    args += ["--compilation-config", '{"mode": 3}', "--max_model_len=4k", "-tp", "2"]
    with Sim(tmp_path, *args) as s:
        s.wait_ready()
        log = s.log()
        assert s.stop() == 0
    found = _startup(log)
    assert found["max_model_len"][1] == ("4000",)
    assert [m["proc"] for m in _lines(log) if "Model loading took" in m["message"]] == [
        "Worker_TP0",
        "Worker_TP1",
    ]
    args_logged = ast.literal_eval(found["args"][1][0])
    assert args_logged["speculative_config"]["num_speculative_tokens"] == 3
    assert args_logged["cudagraph_capture_sizes"] == [1, 2, 4]
    note = next(m for m in _lines(log) if "not simulated" in m["message"])
    assert note["level"] == "WARNING" and "enable_lora, " in note["message"]
    assert "max_model_len" not in note["message"] and "tensor_parallel_size" not in note["message"]


def test_unknown_flag_exits_2_like_vllm() -> None:
    result = subprocess.run(
        _command("m", "--no-such-flag", "1"), env=_env(), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (
            "free-memory",
            r"ValueError: Free memory on device cuda:0 \([\d.]+/80\.0 GiB\) on startup is less "
            r"than desired GPU memory utilization \(0\.92, 73\.6 GiB\)\. Decrease GPU memory "
            r"utilization or reduce GPU memory used by other processes\.",
        ),
        (
            "max-model-len",
            r"ValueError: To serve at least one request with the model's max seq len \(8192\), "
            r"\([\d.]+ GiB KV cache is needed, which is larger than the available KV cache "
            r"memory \([\d.]+ GiB\)\. Based on the available memory, the estimated maximum "
            r"model length is \d+\. Try increasing `gpu_memory_utilization`",
        ),
        (
            "oom-load",
            r"Failed to load model - not enough GPU memory\. Try lowering "
            r"--gpu-memory-utilization to free memory for weights, increasing "
            r"--tensor-parallel-size, or using --quantization\.(.|\n)*"
            r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate",
        ),
        (
            "oom-sampler",
            r"RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy "
            r"requests\. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when "
            r"initializing the engine\.",
        ),
    ],
)
def test_fail_modes_print_vllm_errors_and_exit_1(mode: str, expected: str) -> None:
    result = subprocess.run(
        _command("m"), env=_env(GATEKEEPER_SIM_FAIL=mode), capture_output=True, text=True
    )
    assert result.returncode == 1, result.stdout
    assert re.search(expected, result.stdout), result.stdout
    assert "Engine core initialization failed. See root cause above." in result.stderr
    assert "Starting vLLM server" not in result.stdout


# The OpenAI surface.


def test_models_list_served_names(sim: Sim) -> None:
    with sim.client() as client:
        models = client.models.list().data
    assert [m.id for m in models] == ["sim-model", "alias"]
    assert all(m.model_extra and m.model_extra["max_model_len"] == 4096 for m in models)


def test_chat_and_completion(sim: Sim) -> None:
    with sim.client() as client:
        chat = client.chat.completions.create(
            model="alias", messages=[{"role": "user", "content": "one two three"}], max_tokens=5
        )
        default = client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hi"}]
        )
        text = client.completions.create(model="sim-model", prompt="a b", max_tokens=3)
    assert chat.choices[0].message.content == "one two three one two"
    assert chat.choices[0].finish_reason == "length" and chat.model == "alias"
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert default.usage is not None and default.usage.completion_tokens == 16
    assert text.choices[0].text == "a b a" and text.object == "text_completion"


def test_streaming_chat_through_openai_client(sim: Sim) -> None:
    with sim.client() as client:
        stream = client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "red green"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "red green red green"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes == [None] * 4 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_sse_wire_format(sim: Sim) -> None:
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and len(events) == 3
    assert all(e.startswith("data: {") for e in events[:-1])


def test_embeddings_are_deterministic(sim: Sim) -> None:
    with sim.client() as client:
        first = client.embeddings.create(model="sim-model", input=["alpha", "beta"])
        again = client.embeddings.create(model="sim-model", input="alpha")
    assert len(first.data) == 2 and len(first.data[0].embedding) == 64
    assert first.data[0].embedding == again.data[0].embedding != first.data[1].embedding
    plain = httpx.post(
        f"{sim.url}/v1/embeddings", json={"model": "sim-model", "input": "alpha"}
    ).json()
    assert plain["data"][0]["embedding"] == pytest.approx(first.data[0].embedding, rel=1e-6)


def test_unknown_model_is_404_in_openai_shape(sim: Sim) -> None:
    with sim.client() as client, pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["message"] == "The model `nope` does not exist."
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert len(values) == 1, text
    return values[0]


def test_metrics_count_running_requests(sim: Sim) -> None:
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 100, "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)
        assert _metric(sim.url, "vllm:num_requests_running") == 1
        assert 0 < _metric(sim.url, "vllm:kv_cache_usage_perc") < 1
        list(lines)
    assert _metric(sim.url, "vllm:num_requests_running") == 0
    info = httpx.get(f"{sim.url}/metrics").text
    assert 'vllm:cache_config_info{block_size="16"' in info and 'num_gpu_blocks="20480"' in info


def test_client_disconnect_stops_generation(sim: Sim) -> None:
    before = sim.log().count("cancelled by client")
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 2000, "stream": True}
    with httpx.Client() as client, client.stream("POST", f"{sim.url}/v1/completions", json=body):
        pass  # leave after the headers: the connection closes
    _wait_until(lambda: sim.log().count("cancelled by client") > before)
    assert re.search(r"request cmpl-\w+ cancelled by client after \d+ of 2000 tokens", sim.log())
    _wait_until(lambda: _metric(sim.url, "vllm:num_requests_running") == 0)


# Crashes, hangs and deaths.


def test_crash_after_requests_kills_mid_stream(tmp_path: Path) -> None:
    state = tmp_path / "nvml_state.txt"
    write_state(state, [h100(0)])
    env = {"GATEKEEPER_SIM_FAIL": "crash-after-requests:2", "GATEKEEPER_SIM_NVML_STATE": str(state)}
    with Sim(tmp_path, "m", "--gpu-memory-utilization", "0.5", **env) as s, s.client() as client:
        s.wait_ready()
        assert _gpu_used(state)[0] > 0
        client.completions.create(model="m", prompt="fine", max_tokens=4)
        received = []
        with pytest.raises((httpx.HTTPError, openai.APIError)):
            for chunk in client.completions.create(
                model="m", prompt="x", max_tokens=50, stream=True
            ):
                received.append(chunk)
        assert 0 < len(received) < 50
        assert s.proc.wait(timeout=5) == -signal.SIGKILL
    # A dead process's memory is freed: the child releases the claims.
    _wait_until(lambda: _gpu_used(state) == [0] and not _state_lines(state, "proc|"))


def test_hang_accepts_connections_and_never_answers(tmp_path: Path) -> None:
    with Sim(tmp_path, "m", GATEKEEPER_SIM_FAIL="hang") as s:
        s.wait_for("Application startup complete.")
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"{s.url}/health", timeout=0.3)
        started = time.monotonic()
        assert s.stop() == 0
        assert time.monotonic() - started < 2.5


def test_die_after_ready(tmp_path: Path) -> None:
    with Sim(tmp_path, "m", GATEKEEPER_SIM_FAIL="die-after-ready:0.3") as s:
        s.wait_ready()
        assert s.proc.wait(timeout=5) == 1
        assert "died unexpectedly" in s.log()


def test_sigterm_during_startup_stops_at_once(tmp_path: Path) -> None:
    with Sim(tmp_path, "m", GATEKEEPER_SIM_STARTUP_SECONDS="30") as s:
        s.wait_for("Using max model len")
        started = time.monotonic()
        assert s.stop() == 0
        assert time.monotonic() - started < 1.5


# Memory in the stand-in NVML driver.


def test_claims_seen_through_pynvml_and_released_on_sigterm(
    tmp_path: Path, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set(gpus=[h100(0), h100(1)], processes=[FakeProcess(0, os.getppid(), GIB)])
    original = fake_nvml.state_path.read_text()
    env = {
        "GATEKEEPER_SIM_NVML_STATE": str(fake_nvml.state_path),
        "GATEKEEPER_SIM_ACTUAL_BYTES": "10GiB",
        "CUDA_VISIBLE_DEVICES": "1",
    }
    with Sim(tmp_path, "m", "--gpu-memory-utilization", "0.2", **env) as s:
        s.wait_ready()
        with NvmlInventory() as inventory:
            gpu = inventory.snapshot().gpu(1)
        child = next(p.pid for p in gpu.processes if p.pid != s.proc.pid)
        assert set(gpu.processes) == {
            GpuProcess(s.proc.pid, 9 * GIB),
            GpuProcess(child, GIB),
        }
        assert gpu.used_bytes == 10 * GIB
        summary = _startup(s.log())["summary"][1]
        assert summary[:2] == ("79.19", "79.19")  # total minus the driver's reserve
        started = time.monotonic()
        assert s.stop() == 0
        assert time.monotonic() - started < 1.5
    assert fake_nvml.state_path.read_text() == original
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_free_memory_check_against_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "nvml_state.txt"
    write_state(state, [h100(0, used_bytes=60 * GIB)])
    original = state.read_text()
    result = subprocess.run(
        _command("m", "--gpu-memory-utilization", "0.5"),
        env=_env(GATEKEEPER_SIM_NVML_STATE=str(state)),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "Free memory on device cuda:0 (19.19/79.19 GiB) on startup is less than desired" in (
        result.stdout
    )
    assert state.read_text() == original


def test_simulators_claiming_concurrently_keep_the_state_consistent(tmp_path: Path) -> None:
    state = tmp_path / "nvml_state.txt"
    write_state(state, [h100(0), h100(1)])
    sizes = {"a": 10, "b": 20, "c": 5}
    sims = [
        Sim(
            tmp_path,
            "m",
            "-tp",
            "2",
            "--gpu-memory-utilization",
            "0.3",
            name=name,
            GATEKEEPER_SIM_NVML_STATE=str(state),
            GATEKEEPER_SIM_ACTUAL_BYTES=f"{gib}GiB",
            CUDA_VISIBLE_DEVICES="1,0",
        )
        for name, gib in sizes.items()
    ]
    try:
        for s in sims:
            s.wait_ready()
        procs = _state_lines(state, "proc|")
        assert len(procs) == 12 and len(_state_lines(state, MARKER)) == 3
        assert _gpu_used(state) == [35 * GIB, 35 * GIB]
        assert sum(int(p[3]) for p in procs) == 70 * GIB
        assert sims[1].stop() == 0
        assert _gpu_used(state) == [15 * GIB, 15 * GIB]
        assert {int(p[2]) for p in _state_lines(state, "proc|")} >= {sims[0].proc.pid}
    finally:
        for s in sims:
            s.stop()
            s.__exit__()
    assert _gpu_used(state) == [0, 0] and not _state_lines(state, "proc|")
    assert not _state_lines(state, MARKER)


# Pieces, without a process.


def test_vllm_human_readable_sizes() -> None:
    assert human_readable_int("32k") == 32_000 and human_readable_int("32K") == 32_768
    assert human_readable_int("1.5k") == 1_500 and human_readable_int("20G") == 20 * GIB
    assert human_readable_int("4096") == 4096


def test_environment_is_checked() -> None:
    env = SimEnv.from_environ({"GATEKEEPER_SIM_FAIL": "crash-after-requests:3"})
    assert env.crash_after_requests == 3 and env.fail is None
    env = SimEnv.from_environ({"GATEKEEPER_SIM_KV_BYTES": "512MiB", "CUDA_VISIBLE_DEVICES": "2"})
    assert env.components == (("kv", 512 * MIB),) and env.visible_devices == "2"
    with pytest.raises(ValueError, match="GATEKEEPER_SIM_FAIL='explode'"):
        SimEnv.from_environ({"GATEKEEPER_SIM_FAIL": "explode"})
    with pytest.raises(ValueError, match="GATEKEEPER_SIM_ACTUAL_BYTES"):
        SimEnv.from_environ({"GATEKEEPER_SIM_ACTUAL_BYTES": "lots"})


def test_visible_positions() -> None:
    uuids = [h100(i).uuid for i in range(4)]
    assert visible_positions(None, 2, uuids) == [0, 1]
    assert visible_positions("3,1", 2, uuids) == [3, 1]
    assert visible_positions(uuids[2][:12], 1, uuids) == [2]
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        visible_positions("1", 2, uuids)


def test_claims_of_dead_simulators_are_pruned(tmp_path: Path) -> None:
    state = tmp_path / "nvml_state.txt"
    dead = 4_194_000  # above any pid this machine has handed out
    write_state(state, [h100(0, used_bytes=3 * GIB)], [FakeProcess(0, dead, 3 * GIB)])
    state.write_text(state.read_text() + f"{MARKER}|{dead}\n")
    claim(state, [Claim(0, os.getpid(), GIB)])
    assert _gpu_used(state) == [GIB]
    assert [int(p[2]) for p in _state_lines(state, "proc|")] == [os.getpid()]
    release(state, [os.getpid()])
    assert _gpu_used(state) == [0] and not _state_lines(state, "#")
    assert _state_lines(state, "gpu|")[0][5] == str(H100_RESERVED_BYTES)
