"""Progress on every long step, readable in CI: a tqdm bar at a terminal, else a plain line every few seconds."""
from __future__ import annotations

import hashlib
import io
import re

from tasks.acquire.md5state import compute_md5
from tasks.common.progress import EVERY_ENV, Progress
from tasks.common.tarindex import index_nested, index_tar
from tests.helpers.archives import tar_bytes, write_tar
from tests.helpers.images import fake_jpeg


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_terminal_plain_lines_say_how_far_how_fast_and_how_long():
    out = io.StringIO()
    with Progress(4_000_000, "md5 big.tar", stream=out, every_s=0) as bar:
        for _ in range(4):
            bar.update(1_000_000)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert re.fullmatch(r"md5 big\.tar: 1\.00MB / 4\.00MB \(25\.0 %\), .*B/s, ETA \d+ s", lines[0]), lines[0]
    assert lines[3].startswith("md5 big.tar: 4.00MB / 4.00MB (100.0 %)")
    assert re.fullmatch(r"md5 big\.tar: done, 4\.00MB in \d+ s", lines[-1]), lines[-1]


def test_a_short_step_prints_nothing_and_disabled_prints_nothing():
    out = io.StringIO()
    with Progress(10, "convert", unit="img", stream=out, every_s=60) as bar:
        bar.update(10)
    with Progress(10, "convert", unit="img", stream=out, every_s=0, enabled=False) as bar:
        bar.update(10)
    assert out.getvalue() == ""


def test_at_a_terminal_it_is_a_tqdm_bar():
    term = Terminal()
    with Progress(100, "convert", unit="img", stream=term, every_s=0) as bar:
        bar.update(50, postfix="3.0 MB/s")
    assert "convert" in term.getvalue() and "\r" in term.getvalue()


def test_md5_and_tar_scans_report_progress_in_ci_logs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(EVERY_ENV, "0")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 40_000)
    assert compute_md5(blob, chunk=1 << 20) == hashlib.md5(blob.read_bytes()).hexdigest()
    val = write_tar(tmp_path / "val.tar", [(f"ILSVRC2012_val_{i:08d}.JPEG", fake_jpeg(i)) for i in range(1, 4)])
    index_tar(val, "val", "val.tar")
    inner = tar_bytes([("n01440764_1.JPEG", fake_jpeg(1)), ("n01440764_2.JPEG", fake_jpeg(2))])
    index_nested(write_tar(tmp_path / "train.tar", [("n01440764.tar", inner)] * 1), "train", "train.tar")
    err = capsys.readouterr().err
    assert "\r" not in err
    assert re.search(r"^md5 blob\.bin: .* \(\d+\.\d %\)", err, re.M), err
    assert "md5 blob.bin: done, 10.2MB in" in err
    assert "tar scan val.tar: done" in err and "tar scan train.tar: done" in err, err


def test_a_download_of_unknown_size_then_resumed_and_restarted():
    out = io.StringIO()
    with Progress(0, "download val.tar", stream=out, every_s=0, initial=3_000_000) as bar:
        bar.update(1_000_000)  # size not known yet: no percent, no ETA
        bar.set_total(8_000_000)
        bar.update(1_000_000)
        bar.set_total(8_000_000, restart=True)  # the server ignored Range
        bar.update(8_000_000)
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"download val\.tar: 4\.00MB, .*B/s", lines[0]), lines[0]
    assert re.fullmatch(r"download val\.tar: 5\.00MB / 8\.00MB \(62\.5 %\), .*B/s, ETA .*", lines[1]), lines[1]
    assert lines[2].startswith("download val.tar: 8.00MB / 8.00MB (100.0 %)") and bar.percent() == 100
    assert lines[-1].startswith("download val.tar: done, 8.00MB in ")
