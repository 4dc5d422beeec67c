"""The README's fenced blocks, by name: `<!-- block: NAME -->` on the line before a fence names the block, so the
test that runs or checks it finds it (`readme_block("own-21k")`), and tests/test_docs.py fails on a block that no
test names. A params.yaml snippet comes back parsed, with the miniature's values put in for named keys."""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.project import REPO

README = REPO / "README.md"
TAG = re.compile(r"^<!-- block: ([a-z0-9][a-z0-9-]*) -->$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)(.*)$")


@dataclass(frozen=True)
class Block:
    name: str | None  # None: no tag line right before the fence
    lang: str
    text: str
    line: int  # 1-based line of the opening fence


def fenced_blocks(path: Path = README) -> list[Block]:
    """Every fenced code block of a Markdown file, with the name its tag line gives it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == opened.group(2)), len(lines))
        tag = TAG.match(lines[i - 1]) if i else None
        body = "\n".join(line.removeprefix(opened.group(1)) for line in lines[i + 1 : end])
        blocks.append(Block(tag.group(1) if tag else None, opened.group(3).strip(), body + "\n", i + 1))
        i = end + 1
    return blocks


def readme_block(name: str) -> Block:
    """The README block tagged `name` (an AssertionError naming it when there is none)."""
    found = [block for block in fenced_blocks() if block.name == name]
    assert len(found) == 1, f"README.md: expected one block tagged {name!r}, found {len(found)}"
    return found[0]


def readme_params(name: str, **replace: Any) -> dict[str, Any]:
    """A README params.yaml snippet, parsed, with `replace` (dotted key with `__` for `.`: `download__source=`)
    put in; every replaced key must be in the snippet, so a renamed key fails here rather than go untested."""
    block = readme_block(name)
    assert block.lang == "yaml", f"README.md:{block.line}: block {name!r} is {block.lang}, expected yaml"
    doc = copy.deepcopy(yaml.safe_load(block.text))
    for dotted, value in replace.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for part in parents:
            node = node[part]
        assert leaf in node, f"README.md block {name!r}: no key {dotted.replace('__', '.')}"
        node[leaf] = value
    return doc
