"""Packaging: the base install is the reader alone, and requires-python is what the code needs and what CI runs.

* The wheel's unconditional Requires-Dist are exactly pyarrow, pillow, numpy; everything else (Prefect, DVC, ...)
  sits behind an `extra ==` marker.
* A fresh venv holding only that wheel plus numpy, pyarrow and pillow (linked from this environment, no network)
  imports the reader and reads a shard with both datasets, while prefect, dvc and torch cannot be imported there.
* requires-python excludes the Pythons the code cannot run on (hashlib.file_digest: 3.11; tarfile extraction
  filters: 3.11.4), admits this interpreter, and under CI (CI set) this interpreter and the workflow's
  python-version are the lowest minor version it claims.

Self-contained on purpose: no test helper modules. Offline: pip runs with --no-index throughout.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BASE = {"pyarrow", "pillow", "numpy"}  # the reader's whole dependency set
EXTRAS = {"pipeline", "torch", "dvc", "test", "lint", "fast"}
# What the wheel is built from (copied, so setuptools' build/ and egg-info never touch the checkout).
SOURCES = ["pyproject.toml", "imagenet_parquet", "tasks", "flows"]  # all there: the wheel must pick the reader


def _env() -> dict[str, str]:
    """Subprocess environment: no PYTHONPATH leaking this environment in, pip offline and without config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONFIG_FILE=os.devnull,
               PIP_NO_INPUT="1")
    return env


def _run(*args: str | os.PathLike[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built with this environment's setuptools (no build isolation, no index)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", work / "dist", src, cwd=work)
    (built,) = (work / "dist").glob("imagenet_parquet-*.whl")
    return built


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(name).decode("utf-8"))


def test_wheel_requires_only_the_reader_stack(wheel: Path) -> None:
    meta = _metadata(wheel)
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    unconditional = {canonicalize_name(r.name) for r in reqs if r.marker is None}
    assert unconditional == BASE, f"base Requires-Dist: expected exactly {sorted(BASE)}, found {sorted(unconditional)}"
    for r in reqs:
        assert r.marker is None or "extra ==" in str(r.marker), f"{r}: expected only `extra ==` markers"
    assert EXTRAS <= set(meta.get_all("Provides-Extra") or []), meta.get_all("Provides-Extra")
    def extras_of(name: str) -> set[str]:
        return {e for e in EXTRAS | {""} for r in reqs
                if canonicalize_name(r.name) == name and r.marker is not None and r.marker.evaluate({"extra": e})}

    for name in ("prefect", "pandera", "pandas", "dvc", "s3fs", "fsspec"):
        assert "pipeline" in extras_of(name) and "" not in extras_of(name), f"{name}: expected in the pipeline extra only"
    for name in ("dvc", "s3fs", "fsspec"):  # a training node's `dvc pull`, with the same bounds
        assert "dvc" in extras_of(name), f"{name}: expected in the dvc extra"
    assert extras_of("simplejpeg") == {"fast"}, "simplejpeg: expected in the fast extra only (crops fall back to Pillow)"
    assert meta["Requires-Python"] == _pyproject()["project"]["requires-python"]


def test_wheel_installs_only_the_reader_package(wheel: Path) -> None:
    """A training node's `pip install .` adds `imagenet_parquet` to site-packages and nothing else: no top-level
    `tasks` or `flows` (the pipeline runs from the checkout) to shadow a training repository's own packages."""
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    packages = {t for t in tops if not t.endswith((".dist-info", ".data"))}
    assert packages == {"imagenet_parquet"}, f"the wheel's top-level entries: expected imagenet_parquet, found {sorted(packages)}"


def test_requires_python_is_what_the_code_needs_and_what_ci_runs() -> None:
    claim = SpecifierSet(_pyproject()["project"]["requires-python"])
    # hashlib.file_digest (3.11, tasks/convert) and tarfile extraction filters (3.11.4, tasks/extract)
    assert "3.11.3" not in claim and "3.10.13" not in claim, f"requires-python {claim}: admits a Python the code can't run on"
    here = platform.python_version()
    assert here in claim, f"this interpreter ({here}) is outside requires-python {claim}"
    floors = [Version(s.version) for s in claim if s.operator in (">=", "~=", "==")]
    assert len(floors) == 1, f"requires-python {claim}: expected one lower bound"
    lowest = f"{floors[0].major}.{floors[0].minor}"
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")
    versions = re.findall(r"python-version:\s*[\"']?([0-9.]+)", workflow)
    assert versions == [lowest], f".github/workflows/ci.yml: expected python-version {lowest} (the lowest claimed minor), found {versions}"
    if os.environ.get("CI"):
        assert here.rsplit(".", 1)[0] == lowest, \
            f"CI runs Python {here}: expected the lowest minor version requires-python claims ({lowest}, {claim})"


# ---------------------------------------------------------------- the base install reads a shard
CLASSES = [{"label": 0, "wnid": "n01440764", "name": "tench"}, {"label": 1, "wnid": "n01443537", "name": "goldfish"}]
# (label, size, colour): three JPEGs in two row groups
ROWS = [(0, (32, 24), (200, 30, 30)), (1, (20, 40), (30, 200, 30)), (0, (16, 16), (30, 30, 200))]

READ_SCRIPT = r'''
import importlib.metadata, json, sys
from pathlib import Path

absent = {}
for name in ("prefect", "dvc", "torch"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        absent[name] = True
    else:
        absent[name] = False

import imagenet_parquet
from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset

def sample(image, label):
    return [list(image.size), image.mode, list(image.getpixel((image.width // 2, image.height // 2))), label]

shard = sys.argv[1]
mapped = ParquetImageDataset(shard)
streamed = ParquetIterableDataset(shard, shuffle=False)
print(json.dumps({
    "absent": absent,
    "torch_loaded": "torch" in sys.modules,
    "package": imagenet_parquet.__file__,
    "prefix": sys.prefix,
    "distributions": sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions()),
    "bases": [c.__module__ for c in type(mapped).__mro__ + type(streamed).__mro__],
    "len": [len(mapped), len(streamed)],
    "label_names": mapped.label_names,
    "map": [sample(*mapped[i]) for i in range(len(mapped))],
    "iter": [sample(image, label) for image, label in streamed],
}))
'''


def _write_shard(path: Path) -> None:
    """A shard in the convert stage's schema (imagenet_parquet.format), written here with this environment."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from imagenet_parquet.format import shard_schema

    label_map = {"num_classes": len(CLASSES), "label_source": "test", "classes": CLASSES}
    schema = shard_schema(label_map, {"jpeg_quality": 95}, "train")
    columns: dict[str, list] = {name: [] for name in schema.names}
    for i, (label, size, colour) in enumerate(ROWS):
        buf = io.BytesIO()
        Image.new("RGB", size, colour).save(buf, "JPEG", quality=95)
        data = buf.getvalue()
        wnid = CLASSES[label]["wnid"]
        columns["image"].append({"bytes": data, "path": f"{wnid}/{wnid}_{i}.JPEG"})
        columns["label"].append(label)
        columns["wnid"].append(wnid)
        columns["label_name"].append(CLASSES[label]["name"])
        columns["width"].append(size[0])
        columns["height"].append(size[1])
        columns["source_format"].append("JPEG")
        columns["transform"].append("none")
        columns["exif_orientation"].append(1)
        columns["sha256"].append(hashlib.sha256(data).hexdigest())
        columns["phash"].append(0)  # the fingerprint is convert's (pillow/numpy); the reader never reads it
    pq.write_table(pa.Table.from_pydict(columns, schema=schema), path, row_group_size=2)


def _link_distribution(name: str, into: Path) -> None:
    """Symlink a distribution's top-level entries (package, .dist-info, bundled .libs) from this environment."""
    dist = importlib.metadata.distribution(name)
    site = Path(dist.locate_file("")).resolve()
    tops = {Path(f).parts[0] for f in dist.files or []} - {".."}  # `..`: scripts outside site-packages
    assert any(t.endswith(".dist-info") for t in tops), f"{name}: no .dist-info in its RECORD"
    for top in tops:
        if (site / top).exists() and not (into / top).exists():
            (into / top).symlink_to(site / top)


def test_base_install_reads_a_shard_without_prefect_dvc_or_torch(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel,
         cwd=tmp_path)
    links = tmp_path / "links"
    links.mkdir()
    for name in ("numpy", "pyarrow", "pillow"):
        _link_distribution(name, links)
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    (site / "reader_deps.pth").write_text(f"{links}\n", encoding="utf-8")

    shard = tmp_path / "train-00000-of-00001.parquet"
    _write_shard(shard)
    script = tmp_path / "read_shard.py"
    script.write_text(READ_SCRIPT, encoding="utf-8")
    # -I: no PYTHONPATH, no user site, no script or working directory on sys.path (so not this checkout)
    out = json.loads(_run(python, "-I", script, shard, cwd=tmp_path).stdout)

    assert out["absent"] == {"prefect": True, "dvc": True, "torch": True}, out["absent"]
    assert not out["torch_loaded"]
    assert Path(out["package"]).is_relative_to(out["prefix"]), f"reader imported from {out['package']}, not the venv"
    assert out["distributions"] == ["imagenet-parquet", "numpy", "pillow", "pyarrow"], out["distributions"]
    assert not any(m.startswith("torch") for m in out["bases"]), out["bases"]  # plain classes without torch
    assert out["len"] == [len(ROWS), len(ROWS)]
    assert out["label_names"] == [c["name"] for c in CLASSES]
    for got in (out["map"], out["iter"]):
        assert [(tuple(size), mode, label) for size, mode, _, label in got] == \
            [(size, "RGB", label) for label, size, _ in ROWS]
        for (_, _, pixel, _), (_, _, colour) in zip(got, ROWS):
            assert max(abs(a - b) for a, b in zip(pixel, colour)) < 40, (pixel, colour)
