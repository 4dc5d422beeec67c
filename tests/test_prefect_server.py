"""The `prefect_api` fixture: a real server, started when first asked for, that in-process flow runs and child
processes both talk to (not to a temporary server of their own)."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        return json.load(resp)


def test_prefect_server_answers(prefect_api):
    _get(prefect_api + "/health")


def test_an_in_process_flow_run_lands_on_the_session_server(prefect_api):
    """Prefect read its settings at import, before the server existed: its client must still use this server."""
    from prefect import flow
    from prefect.settings import get_current_settings

    @flow(name="session-server-probe")
    def probe() -> int:
        return 7

    state = probe(return_state=True)
    assert state.is_completed() and state.result() == 7
    assert get_current_settings().api.url == prefect_api
    run = _get(f"{prefect_api}/flow_runs/{state.state_details.flow_run_id}")  # plain HTTP, not Prefect's client
    assert run["state"]["type"] == "COMPLETED"
    assert _get(f"{prefect_api}/flows/{run['flow_id']}")["name"] == "session-server-probe"


def test_a_child_process_talks_to_the_session_server(prefect_api):
    code = "from prefect.settings import get_current_settings; print(get_current_settings().api.url)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == prefect_api
