"""Progress in the Prefect UI: a running convert keeps its progress artifact (`progress-convert`) up to date, read
back through the real Prefect server's API while the flow runs; outside a run, Progress creates no artifact."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from tasks.common import progress
from tasks.common.progress import Progress, artifact_key
from tasks.convert import distribute
from tests.helpers.datasets import flat_dataset
from tests.helpers.images import noisy_jpeg
from tests.helpers.params import write_params

KEY = "progress-convert"


def _project(root: Path) -> Path:
    flat_dataset(root, [(f"n0{i % 3}", f"img{i:03d}.JPEG", noisy_jpeg(i)) for i in range(24)])
    return write_params(root, convert={"shard_mb": 0.03, "row_group_rows": 5, "workers": 1, "task_runner": "local"})


def _artifacts(client, key: str) -> list:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    flt = ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
    return client.read_artifacts(artifact_filter=flt, sort=ArtifactSort.CREATED_DESC, limit=20)


class Poller(threading.Thread):
    """Reads the `progress-convert` artifacts created after `before` every 50 ms: (id, progress, description)."""

    def __init__(self, before: set) -> None:
        super().__init__(daemon=True)
        self.before, self.seen, self.stop = before, [], threading.Event()

    def run(self) -> None:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            while not self.stop.wait(0.05):
                fresh = [a for a in _artifacts(client, KEY) if a.id not in self.before]
                self.seen += [(a.id, a.data, a.description) for a in fresh]


def test_a_running_convert_moves_its_progress_artifact_to_100(prefect_api, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client

    from flows.convert import run

    monkeypatch.setattr(progress, "UI_EVERY_S", 0.0)  # every shard's result updates the artifact
    slow = distribute.pool_result
    monkeypatch.setattr(distribute, "pool_result", lambda f: (time.sleep(0.25), slow(f))[1])  # a long convert
    params = _project(tmp_path)
    with get_client(sync_client=True) as client:
        poller = Poller({a.id for a in _artifacts(client, KEY)})
        poller.start()
        result = run(str(params))
        poller.stop.set()
        poller.join()
        (final,) = [a for a in _artifacts(client, KEY) if a.id not in poller.before]
    assert result["rows"] == 24 and result["splits"]["train"]["shards"] >= 4
    assert {artifact for artifact, _, _ in poller.seen} == {final.id} and final.type == "progress"
    moving = [(data, text) for _, data, text in poller.seen if 0 < data < 100]
    assert moving, poller.seen  # seen while it ran, between 0 and 100, with the terminal line's figures
    assert all(text.startswith("convert: ") and " img / 24 img (" in text and " img/s" in text for _, text in moving)
    assert final.data == 100 and final.description.startswith("convert: done, 24 img in "), final.description
    assert final.flow_run_id is not None


def test_outside_a_prefect_run_no_artifact_is_made(monkeypatch):
    monkeypatch.setattr(progress, "UI_EVERY_S", 0.0)
    with Progress(10, "md5 ILSVRC2012_img_train.tar", every_s=60) as bar:
        bar.update(5)
        assert bar.ui is not None and bar.ui.id is None
    assert artifact_key("md5 ILSVRC2012_img_train.tar") == "progress-md5-ilsvrc2012-img-train-tar"


def test_an_api_error_is_logged_once_and_never_fails_the_step(monkeypatch, caplog):
    import uuid

    import prefect.artifacts

    def refused(*args, **kwargs):
        raise RuntimeError("503 Service Unavailable")

    monkeypatch.setattr(progress, "UI_EVERY_S", 0.0)
    monkeypatch.setattr(progress, "_in_prefect_run", lambda: True)
    monkeypatch.setattr(prefect.artifacts, "create_progress_artifact", lambda **kwargs: uuid.uuid4())
    monkeypatch.setattr(prefect.artifacts, "update_progress_artifact", refused)
    with Progress(10, "validate", unit="img", every_s=60) as bar:
        for _ in range(10):
            bar.update(1)
    assert bar.done == 10 and bar.ui is None
    warnings = [r.getMessage() for r in caplog.records if r.name == progress.__name__]
    expected = "progress-validate: the Prefect progress artifact is not updated any more (503 Service Unavailable)"
    assert warnings == [expected], warnings
