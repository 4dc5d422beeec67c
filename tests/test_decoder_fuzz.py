"""Issue 48: no input kills the process on any decoder path. Every path (decode_image whole and drafted; TrainCrop and
EvalCrop with "auto", "turbojpeg" when a library is found, "simplejpeg", "pillow") runs in child processes
(tests/helpers/decoder_child.py) over a corpus built here (tests/helpers/jpegs.py): every SOF type, 8/12/16-bit,
sampling factors 4:4:1, 4:1:1, odd and over T.81's limit, restart markers, missing and misnamed tables, segments out
of order, truncations, 1x1 and 1500x1, headers claiming 65535x65535, the lossless and the 4:4:1 JPEG, and 2,000
seeded byte flips of real sample JPEGs (of synthetic ones when ../shared is absent). A child that dies by a signal,
passes the time bound or its address-space bound fails the test, and so does any outcome but the right-shaped image
(for every valid file, on every path) or an error of the kinds the reader wraps; controls show the harness sees a
crash (the decoders without the gate), a hang and a memory overrun."""
from __future__ import annotations

import json
import pickle
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from imagenet_parquet import markers, turbo
from imagenet_parquet.decode import Encoded, have_simplejpeg
from tests.helpers import jpegs
from tests.helpers.project import REPO, SHARED

CASE_SECONDS = 60  # no case (all paths) may take longer: a hang
ERRORS = ("OSError", "UnidentifiedImageError", "DecompressionBombError")  # what the reader names the row for
FLIPS = 2000


@dataclass
class Report:
    paths: list[str] = field(default_factory=list)
    outcomes: dict[tuple[int, str], dict] = field(default_factory=dict)
    deaths: list[tuple[int, str]] = field(default_factory=list)  # (case, how: "signal N" / "hang" / "exit N")


def _run_from(corpus: Path, start: int, report: Report, extra: list[str], seconds: float) -> int | None:
    """One child from case `start`; the case after the one it died on (None: it finished)."""
    child = subprocess.Popen([sys.executable, "-m", "tests.helpers.decoder_child", str(corpus), str(start), *extra],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, child.stdout), lines.put(None)], daemon=True).start()
    current, deadline = start, time.monotonic() + seconds + 60  # the first case waits for the imports too
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            child.kill()
            child.wait()
            report.deaths.append((current, "hang"))
            return current + 1
        if line is None:
            code = child.wait()
            if code == 0:
                return None
            report.deaths.append((current, f"signal {-code}" if code < 0 else f"exit {code}"))
            return current + 1
        record = json.loads(line)
        if "paths" in record:
            report.paths = record["paths"]
        elif "start" in record:
            current, deadline = record["start"], time.monotonic() + seconds
        elif "i" in record:
            report.outcomes[record["i"], record["path"]] = record


def run_children(cases: list[jpegs.Case], tmp: Path, extra: tuple[str, ...] = (), children: int = 2,
                 seconds: float = CASE_SECONDS) -> Report:
    """Every case through every path in `children` parallel children, a dead child replaced from the next case."""
    corpus = tmp / "corpus.pkl"
    corpus.write_bytes(pickle.dumps(cases))
    report = Report()
    bounds = [len(cases) * k // children for k in range(children + 1)]

    def chunk(first: int, end: int) -> None:
        part = tmp / f"part-{first}.pkl"
        part.write_bytes(pickle.dumps(cases[first:end]))
        own = Report()
        start: int | None = 0
        while start is not None and start < end - first:
            start = _run_from(part, start, own, list(extra), seconds)
        report.paths = own.paths or report.paths
        report.outcomes.update({(i + first, p): r for (i, p), r in own.outcomes.items()})
        report.deaths.extend((i + first, how) for i, how in own.deaths)

    threads = [threading.Thread(target=chunk, args=(a, b)) for a, b in zip(bounds, bounds[1:]) if b > a]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return report


@pytest.fixture(scope="module")
def corpus() -> list[jpegs.Case]:
    samples = SHARED / "imagenet-samples"  # the real JPEGs to flip bytes of; synthetic ones only without ../shared
    return jpegs.corpus(samples if samples.is_dir() else None, FLIPS)


def test_the_corpus_holds_the_cases_that_crashed_and_the_gate_routes_them_to_pillow(corpus):
    names = {case.name: case for case in corpus}
    crashed = [names["lossless 16x16"], names["lossless 500x375"], names["4:4:1"], names["4:4:1 large"]]
    for marker in [0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF]:
        assert any(f"SOF{marker - 0xC0} " in name for name in names), marker
    for needed in ["12-bit", "16-bit", "4:1:1", "restart", "65535x65535", "1x1", "1500x1", "cut at"]:
        assert any(needed in name for name in names), needed
    assert sum(name.startswith("flip ") for name in names) == FLIPS
    for case in crashed:
        assert markers.native_size(case.data) is None
        for decoder in ("auto", "turbojpeg", "simplejpeg", "pillow"):
            image = Encoded.parse(case.data, decoder)
            assert (image.backend, image.scalable) == ("pillow", False), (case.name, decoder)
    for case in corpus:  # the structural cases' expected verdicts
        if case.native is not None:
            assert (markers.native_size(case.data) is not None) == case.native, case.name


@pytest.mark.slow
def test_no_input_kills_hangs_or_bloats_any_decoder_path(corpus, tmp_path):
    report = run_children(corpus, tmp_path)
    assert not report.deaths, [(corpus[i].name, how) for i, how in report.deaths]
    expected = {"decode_image", "decode_image draft_size=4", "TrainCrop(4) auto", "EvalCrop(224, 256) auto",
                "TrainCrop(4) pillow", "EvalCrop(224, 256) pillow"}
    expected |= {"TrainCrop(4) simplejpeg", "EvalCrop(224, 256) simplejpeg"} if have_simplejpeg() else set()
    expected |= {"TrainCrop(4) turbojpeg", "EvalCrop(224, 256) turbojpeg"} if turbo.available() else set()
    assert set(report.paths) == expected
    assert len(report.outcomes) == len(corpus) * len(expected)  # every case, every path
    wrong = []
    for (i, path), outcome in sorted(report.outcomes.items()):
        case = corpus[i]
        if "error" in outcome:
            if case.valid or outcome["error"].split(":")[0] not in ERRORS:
                wrong.append((case.name, path, outcome["error"]))
        elif "shape" not in outcome:  # the address-space bound was hit
            wrong.append((case.name, path, outcome))
        elif outcome["dtype"] != "uint8" or _shape(path, case) not in (None, outcome["shape"]):
            wrong.append((case.name, path, outcome["shape"], outcome["dtype"]))
    assert not wrong, wrong[:20]
    _same_pixels_on_every_decoder(corpus, report)


def _shape(path: str, case: jpegs.Case) -> list[int] | None:
    size = int(path.split("(")[1].split(")")[0].split(",")[0]) if "Crop" in path else None
    if size is not None:
        return [3, size, size]
    if case.size is None:  # a damaged file decoded anyway: its size is what its header says
        return None
    width, height = case.size
    if path == "decode_image draft_size=4" and case.native:
        return None  # drafted: a smaller scale
    return [height, width, 3]


def _same_pixels_on_every_decoder(corpus: list[jpegs.Case], report: Report) -> None:
    """A valid file's crops (same seeded box) have the same mean on every decoder as on Pillow's: no decoder
    returns a right-shaped picture of something else."""
    for i, case in enumerate(corpus):
        if not case.valid:
            continue
        for kind in ("TrainCrop(4)", "EvalCrop(224, 256)"):
            reference = report.outcomes[i, f"{kind} pillow"]["mean"]
            for path in report.paths:
                if path.startswith(kind):
                    assert abs(report.outcomes[i, path]["mean"] - reference) <= 3, (case.name, path)


def test_the_harness_sees_a_crash_a_hang_and_a_memory_overrun(corpus, tmp_path):
    """The controls: the lossless JPEG through the decoders without the gate (as before issue 48) kills the child;
    a child that sleeps is a hang; one that allocates past its bound reports it."""
    lossless = [case for case in corpus if case.name in ("lossless 16x16", "lossless 500x375")]
    crashed = run_children(lossless, tmp_path, ("--no-gate",), children=1)
    assert any(how.startswith("signal") for _, how in crashed.deaths), crashed.deaths
    hung = run_children(lossless[:1], tmp_path, ("--selftest", "hang"), children=1, seconds=5)
    assert (0, "hang") in hung.deaths
    bloated = run_children(lossless[:1], tmp_path, ("--selftest", "memory", "--memory-mb", "256"), children=1)
    assert bloated.outcomes[0, "selftest"] == {"i": 0, "path": "selftest", "memory": True}
