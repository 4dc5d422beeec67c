"""The child process of the decoder fuzz test (tests/test_decoder_fuzz.py): runs every decoder path over cases of a
pickled corpus and prints one JSON line per outcome, flushed, so the parent knows which case a dying child was on.

    python -m tests.helpers.decoder_child CORPUS START [--memory-mb N] [--no-gate] [--selftest hang|memory]

From case START on: `{"start": i}` before case i, then `{"i": i, "path": name, "shape": [...], "mean": m}` or
`{"i": i, "path": name, "error": "Type: message"}` per path, `{"done": true}` at the end. The address space is
bounded (RLIMIT_AS: what the imports took + --memory-mb): a MemoryError is reported as `"memory": true`.
`--no-gate` restores the decoders' old trust in the header (every JPEG to the native decoders and DCT scales), the
control that shows the harness sees a crash; `--selftest` checks the hang and memory bounds themselves."""
from __future__ import annotations

import argparse
import json
import pickle
import resource
import sys
import time
from typing import Any

import numpy as np
import torch
from PIL import Image

from imagenet_parquet import EvalCrop, TrainCrop, decode_image, markers, turbo
from imagenet_parquet.decode import have_simplejpeg
from tests.helpers.turbojpeg import use_a_library


def decoders() -> list[str]:
    return ["auto", *(["turbojpeg"] if turbo.available() else []), *(["simplejpeg"] if have_simplejpeg() else []),
            "pillow"]


def paths() -> dict[str, Any]:
    """Every decoder path: decode_image whole and drafted, and per decoder a train crop small enough to reach the
    1/8 DCT scale on small images and the eval crop at its usual size."""
    runs: dict[str, Any] = {"decode_image": decode_image, "decode_image draft_size=4": lambda d: decode_image(
        d, draft_size=4)}
    for decoder in decoders():
        train, evaluate = TrainCrop(4, decoder=decoder), EvalCrop(224, resize=256, decoder=decoder)
        runs[f"TrainCrop(4) {decoder}"] = lambda d, crop=train: _seeded(crop, d)
        runs[f"EvalCrop(224, 256) {decoder}"] = evaluate
    return runs


def _seeded(crop: TrainCrop, data: bytes) -> Any:
    crop.generator = torch.Generator().manual_seed(0)  # the same box for every decoder
    return crop(data)


def outcome(run: Any, data: bytes) -> dict[str, Any]:
    try:
        out = run(data)
        pixels = np.asarray(out.convert("RGB")) if isinstance(out, Image.Image) else np.asarray(out)
        return {"shape": list(pixels.shape), "dtype": str(pixels.dtype), "mean": float(pixels.mean())}
    except MemoryError:
        return {"memory": True}
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[:300]}


def _without_gate() -> None:
    """The decoders as they were before the gate: any JPEG frame taken on trust, DCT scales for all."""
    read = markers.read_frame

    def trusting(data: bytes) -> markers.Frame | None:
        frame = read(data)
        return None if frame is None else frame._replace(problem=None, short=None)

    markers.read_frame = trusting  # type: ignore[assignment]


def _bound_memory(extra_mb: int) -> None:
    with open("/proc/self/statm") as fh:
        used = int(fh.read().split()[0]) * resource.getpagesize()
    limit = used + extra_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus")
    parser.add_argument("start", type=int)
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--no-gate", action="store_true")
    parser.add_argument("--selftest", choices=["hang", "memory"])
    args = parser.parse_args()
    use_a_library()
    with open(args.corpus, "rb") as fh:
        cases = pickle.load(fh)
    if args.no_gate:
        _without_gate()
    runs = paths()
    _bound_memory(args.memory_mb)
    print(json.dumps({"paths": list(runs)}), flush=True)
    if args.selftest:
        print(json.dumps({"start": args.start}), flush=True)
        if args.selftest == "hang":
            time.sleep(3600)
        print(json.dumps({"i": args.start, "path": "selftest", **outcome(lambda _: bytearray((args.memory_mb + 256) * 2**20), b"")}),
              flush=True)
    for i in range(args.start, len(cases)):
        print(json.dumps({"start": i}), flush=True)
        for name, run in runs.items():
            print(json.dumps({"i": i, "path": name, **outcome(run, cases[i].data)}), flush=True)
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
