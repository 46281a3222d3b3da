"""Every route the sidecar serves is in /openapi.json, with its methods and path parameters."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.routing import Route

from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.settings import Settings
from gatekeeper.sidecar.app import build_app
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from gatekeeper.sidecar.openapi import openapi_schema


def test_every_served_route_and_method_is_in_the_schema(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, gpus="1xH100-80GB")
    inventory = StaticInventory(parse_declared_node(settings.gpus))
    app = build_app(settings, inventory, Ledger(ledger_path(tmp_path)), rehearsal=True)
    paths = openapi_schema("0")["paths"]
    for route in app.routes:
        assert isinstance(route, Route)
        assert route.path in paths, f"{route.path} served but not in the OpenAPI schema"
        for method in route.methods or ():
            if method == "HEAD":
                continue
            op = paths[route.path].get(method.lower())
            assert op is not None, f"{method} {route.path} missing from the schema"
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"{(\w+)}", route.path)), route.path
