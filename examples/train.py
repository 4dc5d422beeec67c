"""Train a small CNN on the Parquet shards with DistributedDataParallel (CPU, gloo), resumable mid-epoch.

    make run   # data/parquet/{train,val} from the built-in 10-class sample (200 train images)
    torchrun --standalone --nproc-per-node 2 examples/train.py --data data/parquet --epochs 25 --batch-size 8 \\
        --checkpoint ckpt.pt --checkpoint-every 20        # 13 global steps an epoch: 325 steps
    # preempted? the same command with --resume ckpt.pt, on any number of processes / workers / batch size:
    torchrun --standalone --nproc-per-node 1 examples/train.py --data data/parquet --epochs 25 --batch-size 16 \\
        --checkpoint ckpt.pt --checkpoint-every 20 --resume ckpt.pt

(`python examples/train.py ...` runs one process without torchrun.) Several nodes, streaming from the DVC remote
with one cache per node (each node fetches only its partitions of the epoch order; docs/trainer.md):

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr HOST --master-port 29500 \
        examples/train.py --repo . --cache-dir /scratch/imagenet-cache --cache-limit 200GB --canonical-nodes 64 ...
 The data goes through torchdata's
StatefulDataLoader: `ParquetIterableDataset` by default, `--map-style` for ParquetImageDataset + RowGroupSampler.
Global step t holds the same images whatever the number of processes and workers (the reader's epoch order).

Every `--checkpoint-every` global steps rank 0 writes `--checkpoint` atomically: model, optimizer, epoch, step,
samples_seen (the global images of the epoch's finished steps), the topology and every rank's loader state. A
`--resume` on the same topology (world size, workers, batch size, reader, --uneven) restores each rank's loader state
exactly; on another it loads {"epoch", "samples_seen"} into the reader, which then yields every remaining image
of the epoch exactly once. `--step-log` appends one JSON line per step and rank: {rank, node, epoch, step,
global_step, loss, labels, ids}, ids = sha256 of the image bytes (the shards' `sha256` column).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped]

from imagenet_parquet import ParquetImageDataset, ParquetIterableDataset, RowGroupSampler, TrainCrop


class Sample:
    """The reader's transform (it runs with decode=False): image bytes -> (CHW float tensor of size x size,
    sha256 of the bytes). The id says exactly which image a step saw, whatever the decoding does.

    The crop is the reader's TrainCrop (RandomResizedCrop + flip, decoding only the scale the crop needs) with a
    generator seeded by (seed, epoch, image): an image gets the same crop in an epoch whichever rank, worker or
    resumed run reads it (a DataLoader worker's own generator restarts on a resume), a new one each epoch."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch = size, seed, 0

    def __call__(self, data: bytes) -> tuple[torch.Tensor, str]:
        digest = hashlib.sha256(data).hexdigest()
        key = (int(digest[:15], 16) + 0x9E3779B97F4A7C15 * (self.epoch + 1) + self.seed) % (1 << 63)
        pixels = TrainCrop(self.size, generator=torch.Generator().manual_seed(key))(data)
        return pixels.float().div_(255).sub_(0.5), digest


def small_cnn(num_classes: int, width: int = 32) -> nn.Module:
    """Three conv + BatchNorm + ReLU blocks (the first two max-pooled), global average pooling, a linear head."""

    def block(cin: int, cout: int, pool: bool) -> list[nn.Module]:
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        return layers + [nn.MaxPool2d(2)] if pool else layers

    return nn.Sequential(
        *block(3, width, True),
        *block(width, 2 * width, True),
        *block(2 * width, 4 * width, False),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, num_classes),
    )


@dataclass
class Data:
    """The loader and what orders it (the iterable dataset, or the map-style run's sampler)."""

    loader: StatefulDataLoader
    order: ParquetIterableDataset | RowGroupSampler
    sample: Sample  # the transform: its epoch seeds the crops
    num_classes: int
    total: int


def make_data(args: argparse.Namespace) -> Data:
    """uneven="drop" or "pad": every rank gets the same number of batches per epoch, as DDP needs (a rank with
    one batch more would wait forever in the gradient all-reduce of a step the others never take)."""
    sample = Sample(args.image_size, args.seed)
    common: dict[str, Any] = {"transform": sample, "decode": False, "view": args.view}
    orders: dict[str, Any] = {"seed": args.seed, "uneven": args.uneven, "canonical_nodes": args.canonical_nodes}
    order: ParquetIterableDataset | RowGroupSampler
    if args.map_style:
        images = open_dataset(ParquetImageDataset, args, common)
        order = RowGroupSampler(images, **orders)
        loader = StatefulDataLoader(images, batch_size=args.batch_size, sampler=order, **loader_options(args))
        dataset: ParquetImageDataset | ParquetIterableDataset = images
    else:  # batch_size = the loader's: global step t holds the same images on any topology
        extra = {**orders, "batch_size": args.batch_size, "predownload": args.predownload}
        order = dataset = open_dataset(ParquetIterableDataset, args, {**common, **extra})
        loader = StatefulDataLoader(dataset, batch_size=args.batch_size, **loader_options(args))
    return Data(loader, order, sample, len(dataset.label_names), dataset.num_images)


def loader_options(args: argparse.Namespace) -> dict[str, Any]:
    """DataLoader workers started from a forkserver, not forked from this process: a trainer holds threads (gloo's,
    the remote reader's fsspec IO loop, the last epoch's queue feeders ending), and on Python 3.11 a fork while
    another thread starts or ends can leave the child deadlocked inside `os.fork` (CPython takes the thread-state
    lock only from 3.12 on) — a worker that never starts, and every rank waiting on it in the all-reduce. A batch
    that takes longer than --loader-timeout is an error instead of a hang."""
    if not args.num_workers:
        return {"num_workers": 0}
    return {"num_workers": args.num_workers, "multiprocessing_context": "forkserver", "timeout": args.loader_timeout}


def open_dataset(cls: Any, args: argparse.Namespace, kwargs: dict[str, Any]) -> Any:
    """`cls` over the local shards of --data, or (--repo) streamed from the checkout's DVC remote through one cache
    per node (--cache-dir, `{node}` replaced by the node's rank: nodes sharing a machine in a test keep apart)."""
    if args.repo is None:
        source, split = (args.data, None) if any(args.data.glob("*.parquet")) else (args.data, args.split)
        return cls(source, split, **kwargs)
    node = dist.get_rank() // int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    cache = str(args.cache_dir).replace("{node}", str(node)) if args.cache_dir else None
    limit = {"cache_limit": args.cache_limit} if args.cache_limit else {}
    return cls.from_dvc(
        args.repo, str(args.data), remote=args.remote, split=args.split, cache_dir=cache, **limit, **kwargs
    )


def topology(args: argparse.Namespace) -> dict[str, Any]:
    """What a loader state depends on: a resume with all of these equal restores it exactly."""
    return {
        "world_size": dist.get_world_size(),
        "nodes": dist.get_world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())),
        "num_workers": args.num_workers,
        "batch_size": args.batch_size,
        "map_style": args.map_style,
        "uneven": args.uneven,
    }


@dataclass
class Progress:
    """Where training stands: epoch, global steps done in it, images of those steps, steps since the start."""

    epoch: int = 0
    step: int = 0
    samples_seen: int = 0
    global_step: int = 0


def _bare(model: nn.Module) -> nn.Module:
    """The model inside DDP: checkpoints hold its plain state_dict (loadable without DDP)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def save_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    progress: Progress,
    args: argparse.Namespace,
    loader_state: dict[str, Any] | None,
    canonical_nodes: int | None,
) -> None:
    """Every rank's loader state gathered (a list indexed by rank); rank 0 writes temp file + os.replace;
    `canonical_nodes`: the reader's epoch order (a resume on another topology continues in it)."""
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, loader_state)
    if dist.get_rank() != 0:
        return
    checkpoint = {
        "model": _bare(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        **vars(progress),
        **topology(args),
        "seed": args.seed,
        "canonical_nodes": canonical_nodes,
        "loaders": None if loader_state is None else states,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


def resume(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, data: Data, args: argparse.Namespace
) -> Progress:
    """Model, optimizer and progress from `path`; the loader restored exactly (same topology) or the reader
    started at the epoch's samples_seen (another topology: every remaining image exactly once)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    _bare(model).load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    progress = Progress(*(checkpoint[k] for k in ("epoch", "step", "samples_seen", "global_step")))
    data.order.set_epoch(progress.epoch)
    same = all(checkpoint[k] == v for k, v in topology(args).items())
    if checkpoint["loaders"] is not None and same:
        data.loader.load_state_dict(checkpoint["loaders"][dist.get_rank()])
        how = "same topology: each rank's loader state restored"
    else:
        position = {"epoch": progress.epoch, "samples_seen": progress.samples_seen}
        data.order.load_state_dict({**position, "canonical_nodes": checkpoint.get("canonical_nodes")})
        how = f"another topology: the reader resumes at samples_seen={progress.samples_seen}"
    if dist.get_rank() == 0:
        print(f"resumed {path} at epoch {progress.epoch} step {progress.step} ({how})", flush=True)
    return progress


class StepLog:
    """One JSON line per step and rank appended to `path` (one write() on an O_APPEND file: lines never mix)."""

    def __init__(self, path: Path | None):
        self.fd = None if path is None else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, progress: Progress, loss: float, labels: torch.Tensor, ids: list[str]) -> None:
        if self.fd is not None:
            record = {
                "rank": dist.get_rank(),
                "node": dist.get_rank() // int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())),
                "epoch": progress.epoch,
                "step": progress.step,
                "global_step": progress.global_step,
                "loss": loss,
                "labels": labels.tolist(),
                "ids": ids,
            }
            os.write(self.fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


@dataclass
class Trainer:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    data: Data
    args: argparse.Namespace
    log: StepLog

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(self.model(images), labels)
        loss.backward()  # type: ignore[no-untyped-call]  # DDP all-reduces the gradients here
        self.optimizer.step()
        return float(loss.detach())

    def epoch(self, progress: Progress) -> bool:
        """The rest of epoch `progress.epoch`; False when --max-steps stopped it (a simulated preemption)."""
        args, losses, start, images_done = self.args, [], time.perf_counter(), 0
        for (images, ids), labels in self.data.loader:
            losses.append(self.step(images, labels))
            global_batch = len(labels) * dist.get_world_size()  # drop/pad: every rank's batch has this size
            progress.step, progress.global_step = progress.step + 1, progress.global_step + 1
            progress.samples_seen = min(self.data.total, progress.samples_seen + global_batch)
            images_done += global_batch
            self.log.write(progress, losses[-1], labels, list(ids))
            if args.checkpoint and args.checkpoint_every and progress.global_step % args.checkpoint_every == 0:
                state = self.data.loader.state_dict()
                save_checkpoint(
                    args.checkpoint, self.model, self.optimizer, progress, args, state, self.data.order.canonical_nodes
                )
            if args.max_steps and progress.global_step >= args.max_steps:
                return False
        self.summary(progress, losses, images_done, time.perf_counter() - start)
        return True

    def summary(self, progress: Progress, losses: list[float], images: int, seconds: float) -> None:
        mean = torch.tensor([sum(losses), len(losses)], dtype=torch.float64)
        dist.all_reduce(mean)
        if dist.get_rank() == 0:
            loss = mean[0].item() / max(1.0, mean[1].item())
            print(
                f"epoch {progress.epoch}: {progress.step} steps, loss {loss:.4f}, "
                f"{images / max(seconds, 1e-9):.1f} images/s",
                flush=True,
            )

    def fit(self, progress: Progress) -> None:
        while progress.epoch < self.args.epochs:
            self.data.order.set_epoch(progress.epoch)
            self.data.sample.epoch = progress.epoch
            if not self.epoch(progress):
                if dist.get_rank() == 0:
                    print(f"stopped after global step {progress.global_step} (--max-steps)", flush=True)
                return
            progress.epoch, progress.step, progress.samples_seen = progress.epoch + 1, 0, 0
            if self.args.checkpoint:  # an epoch boundary: nothing of the next epoch consumed, no loader state
                canonical = self.data.order.canonical_nodes
                save_checkpoint(self.args.checkpoint, self.model, self.optimizer, progress, self.args, None, canonical)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("data/parquet"), help="Parquet root (with --split) or shards")
    p.add_argument("--split", default="train")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--num-workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--loader-timeout", type=float, default=600.0, help="seconds a batch may take (workers only)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0, help="model init and the reader's epoch order")
    p.add_argument("--uneven", choices=["drop", "pad"], default="drop", help="equal batch counts per rank")
    p.add_argument("--map-style", action="store_true", help="ParquetImageDataset + RowGroupSampler")
    p.add_argument("--checkpoint", type=Path, help="checkpoint file rank 0 writes")
    p.add_argument("--checkpoint-every", type=int, default=0, help="global steps between checkpoints")
    p.add_argument("--resume", type=Path, help="checkpoint to resume from")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many global steps in all")
    p.add_argument("--step-log", type=Path, help="append one JSON line per step and rank")
    p.add_argument("--view", help="a named view (data/views/<view>) instead of the whole curated split")
    p.add_argument("--repo", type=Path, help="stream from this checkout's DVC remote (--data: the tracked root)")
    p.add_argument("--remote", help="with --repo: a remote name or URL (default: core.remote)")
    p.add_argument("--cache-dir", help="with --repo: the node cache ({node}: the node's rank)")
    p.add_argument("--cache-limit", help="with --repo: the node cache's bound, e.g. 200GB")
    p.add_argument("--predownload", type=int, default=0, help="row groups each worker fetches ahead (--repo)")
    p.add_argument(
        "--canonical-nodes", type=_canonical, default="auto", help="the epoch order's partitions: N, none or auto"
    )
    return p.parse_args(argv)


def _canonical(value: str) -> int | str | None:
    return None if value == "none" else value if value == "auto" else int(value)


def init_distributed() -> None:
    """gloo from torchrun's environment; a one-process group without torchrun."""
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # torchdata 0.11's StatefulDataLoader calls torch.set_vital, deprecated in torch 2.13: noise on every run
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    multiprocessing.set_forkserver_preload(["__main__", "torch", "imagenet_parquet"])  # imported once, not per worker
    init_distributed()
    try:
        torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        data = make_data(args)
        model = DistributedDataParallel(small_cnn(data.num_classes))
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
        progress = resume(args.resume, model, optimizer, data, args) if args.resume else Progress()
        log = StepLog(args.step_log)
        try:
            Trainer(model, optimizer, data, args, log).fit(progress)
        finally:
            log.close()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
