"""How long the installed ``gatekeeper`` command takes to answer (#39): each case run
``--runs`` times, the cases taken in turn so that a busy machine slows them alike; wall
time from start to exit (p10, p50, p90) and the CPU time the process used (p50, user +
system: less moved by other processes on the machine than the wall time). Then one run
of the first case under ``PYTHONPROFILEIMPORTTIME=1`` (``python -X importtime``): the
time spent importing, in all and by top-level package (self time), and how many modules.

The target: a catalog estimate answers in 0.25 s or less (p50 wall).

Two floors are timed in the same turns, because this machine's speed moves from hour to
hour and an absolute figure alone says little: the interpreter (``python -c pass``) and
the interpreter with pydantic-settings imported as the command imports it (collector
off, then frozen: ``gatekeeper.cli.console``), which every command needs for its
settings. What is above the second floor is gatekeeper's own.

``--compare-with DIR`` times another source tree as well (for a before/after on one
machine): DIR holds a ``gatekeeper`` package (``git archive REV gatekeeper | tar -x -C
DIR``), put first on ``PYTHONPATH`` and run through the entry point that tree has
(``gatekeeper.cli.console:main`` since #39, ``gatekeeper.cli:main`` before), as its
installed script would.

    python -m bench.cli_start [--runs 21] [--compare-with DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CASES = {
    "estimate": ["estimate", MODEL, "--gpu", "H100-80GB"],
    "check": ["check", MODEL, "--node", "2xH100-80GB"],
    "help": ["--help"],
}
TARGET_SECONDS = 0.25
"""The p50 wall time a catalog estimate should meet."""

FLOORS = {
    "python": "pass",
    "python + pydantic-settings": (
        "import gc; gc.disable(); import pydantic_settings; gc.freeze(); gc.enable()"
    ),
}
"""What any command of this interpreter pays before gatekeeper's own code (run with
``python -c``)."""

OTHER_TREE = (
    "import sys\n"
    "try:\n"
    "    from gatekeeper.cli.console import main\n"
    "except ImportError:\n"
    "    from gatekeeper.cli import main\n"
    "sys.exit(main())\n"
)
"""The installed script of a tree given with ``--compare-with``, whichever entry it has."""


def environment(state: Path, source: Path | None) -> dict[str, str]:
    """The caller's environment without gatekeeper's or the hub's settings: a fresh
    machine's answer (the embedded catalog, no hub, an empty state directory), with
    bytecode written as an installed package has it (the warm-up run writes it)."""
    unset = ("GATEKEEPER_", "HF_", "PYTHONDONTWRITEBYTECODE")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(unset)}
    env = {**clean, "GATEKEEPER_STATE_DIR": str(state / "state"), "HF_HOME": str(state / "hf")}
    env["HF_HUB_OFFLINE"] = "1"
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), clean.get("PYTHONPATH")]))
    return env


def command(source: Path | None) -> list[str]:
    """The installed script, or for another tree the entry that tree has (``-P``: not the
    working directory's ``gatekeeper`` first on the path, but ``PYTHONPATH``'s)."""
    return [str(GATEKEEPER)] if source is None else [sys.executable, "-P", "-c", OTHER_TREE]


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def import_profile(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One run under ``-X importtime``: import seconds in all and by top-level package."""
    result = subprocess.run(
        argv,
        env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    by_package: dict[str, int] = defaultdict(int)
    modules = 0
    for line in result.stderr.splitlines()[1:]:
        if not line.startswith("import time:"):
            continue
        self_us, _, name = line.removeprefix("import time:").split("|")
        by_package[name.strip().split(".")[0]] += int(self_us)
        modules += 1
    top = sorted(by_package.items(), key=lambda kv: -kv[1])[:8]
    return {
        "modules": modules,
        "import_seconds": sum(by_package.values()) / 1e6,
        "top_packages_seconds": {name: us / 1e6 for name, us in top},
    }


def measure(runs: int, sources: dict[str, Path | None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gatekeeper-cli-start-") as tmp:
        envs = {label: environment(Path(tmp), source) for label, source in sources.items()}
        walls: dict[tuple[str, str], list[float]] = defaultdict(list)
        cpus: dict[tuple[str, str], list[float]] = defaultdict(list)
        floor_env = next(iter(envs.values()))
        floors = {name: [sys.executable, "-c", code] for name, code in FLOORS.items()}
        floor_cpus: dict[str, list[float]] = defaultdict(list)
        for label, env in envs.items():  # warm the page cache and the bytecode
            for args in CASES.values():
                run_once([*command(sources[label]), *args], env)
        for _ in range(runs):
            for name, argv in floors.items():
                floor_cpus[name].append(run_once(argv, floor_env)[1])
            for label, env in envs.items():
                for case, args in CASES.items():
                    wall, cpu = run_once([*command(sources[label]), *args], env)
                    walls[label, case].append(wall)
                    cpus[label, case].append(cpu)
        first = next(iter(CASES.values()))
        profiles = {
            label: import_profile([*command(sources[label]), *first], env)
            for label, env in envs.items()
        }
    return {
        "runs": runs,
        "target_p50_seconds": TARGET_SECONDS,
        "floors_cpu_p50_seconds": {n: statistics.median(v) for n, v in floor_cpus.items()},
        "results": {
            label: {
                "cases": {
                    case: {
                        "argv": ["gatekeeper", *CASES[case]],
                        "wall_p10_seconds": percentile(walls[label, case], 0.1),
                        "wall_p50_seconds": statistics.median(walls[label, case]),
                        "wall_p90_seconds": percentile(walls[label, case], 0.9),
                        "cpu_p50_seconds": statistics.median(cpus[label, case]),
                    }
                    for case in CASES
                },
                "imports": profiles[label],
            }
            for label in sources
        },
    }


def render(report: dict[str, Any]) -> str:
    lines = [f"installed gatekeeper, {report['runs']} runs a case (wall p10/p50/p90, CPU p50)"]
    floors = report["floors_cpu_p50_seconds"]
    lines.append(
        "floors in the same turns (CPU p50): "
        + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in floors.items())
    )
    settings_floor = floors["python + pydantic-settings"]
    for label, result in report["results"].items():
        lines.append(f"{label}:")
        for case, r in result["cases"].items():
            lines.append(
                f"  {case:<9} {r['wall_p10_seconds']:.3f} / {r['wall_p50_seconds']:.3f} / "
                f"{r['wall_p90_seconds']:.3f} s   CPU {r['cpu_p50_seconds']:.3f} s   "
                f"{' '.join(r['argv'])}"
            )
        imports = result["imports"]
        top = ", ".join(f"{n} {s * 1000:.0f}" for n, s in imports["top_packages_seconds"].items())
        lines.append(
            f"  imports of estimate: {imports['import_seconds'] * 1000:.0f} ms, "
            f"{imports['modules']} modules (ms by package: {top})"
        )
        p50 = result["cases"]["estimate"]["wall_p50_seconds"]
        own = result["cases"]["estimate"]["cpu_p50_seconds"] - settings_floor
        verdict = "meets" if p50 <= TARGET_SECONDS else "misses"
        lines.append(
            f"  estimate p50 {p50:.3f} s {verdict} the target of {TARGET_SECONDS} s; "
            f"gatekeeper's own CPU above the pydantic-settings floor {own:.3f} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="runs of each case (default 21)")
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="DIR",
        help="also time the entry point importing the gatekeeper package in DIR",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    sources: dict[str, Path | None] = {"this checkout": None}
    if args.compare_with is not None:
        if not (args.compare_with / "gatekeeper" / "__init__.py").is_file():
            parser.error(f"--compare-with: {args.compare_with} holds no gatekeeper package")
        sources = {str(args.compare_with): args.compare_with.resolve(), **sources}
    report = measure(args.runs, sources)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
