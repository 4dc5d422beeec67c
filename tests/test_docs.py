"""The docs cannot drift: every README block runs or is checked by a test that names it, docs/params.md is what the
models generate and every params key has a description, and every relative link and anchor resolves.

Which test covers which README block (each names it with readme_block / readme_params):
  setup            test_the_setup_commands_are_the_makefile_targets_ci_runs
  chain            test_the_chain_picture_names_the_dvc_stages_and_their_outputs_in_order
  own-ilsvrc2012   test_every_params_snippet_validates_against_the_models; tests/test_acquire_dvc.py (linked archives)
  own-imagenet100  the same; tests/test_classes.py::test_any_folder_names_get_imagefolder_labels_through_dvc_repro
  own-folder       the same; tests/test_classes.py::test_the_readme_holdout_example_through_dvc_repro
  own-21k          the same; tests/test_archive21k.py::test_a_tar_and_its_tar_gz_through_dvc_repro_...
  train            test_the_training_snippet_runs_on_a_tiny_dataset
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tasks.common import params_doc
from tasks.common.params import validate_params
from tests.helpers.datasets import write_shards
from tests.helpers.docs import README, fenced_blocks, readme_block, readme_params
from tests.helpers.params import repo_doc
from tests.helpers.project import REPO

DOCS = [README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs").glob("*/*.md"))]  # decisions/, results/
NAMED = re.compile(r"readme_(?:block|params)\(\s*\"([a-z0-9-]+)\"")


def _named_by_tests() -> set[str]:
    files = [f for f in (REPO / "tests").rglob("*.py") if f.name != "docs.py"]
    return {name for f in files for name in NAMED.findall(f.read_text(encoding="utf-8"))}


def test_every_readme_block_is_tagged_and_named_by_a_test():
    blocks = fenced_blocks()
    untagged = [f"README.md:{b.line}" for b in blocks if b.name is None]
    assert not untagged, f"fenced blocks without a `<!-- block: NAME -->` line before them: {untagged}"
    names = [b.name for b in blocks]
    assert len(names) == len(set(names)), f"a block name used twice: {names}"
    uncovered = sorted(set(names) - _named_by_tests())
    assert not uncovered, f"README blocks no test runs or checks (readme_block/readme_params): {uncovered}"


# ---------------------------------------------------------------- shell: the two set-up commands
def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, flags=re.M))


def test_the_setup_commands_are_the_makefile_targets_ci_runs():
    commands = [line.split("#")[0].split() for line in readme_block("setup").text.splitlines() if line.strip()]
    assert commands == [["make", "run"], ["make", "test"]], commands
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for _, target in commands:
        assert target in _make_targets(), f"README: make {target}, no such Makefile target"
        assert any(re.match(rf"make {target}\b", line) for line in ci), f".ci/run does not run make {target}"
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "dvc repro" in makefile.split("\nrun:")[1].split("\n\n")[0] and "pytest" in makefile.split("\ntest:")[1]


# ---------------------------------------------------------------- text: the chain picture
def _stage_outputs(stage: dict) -> list[str]:
    paths = repo_doc()["paths"]
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in stage.get("outs", [])]
    return [re.sub(r"\$\{paths\.(\w+)\}", lambda m: paths[m.group(1)], out) for out in outs]


def test_the_chain_picture_names_the_dvc_stages_and_their_outputs_in_order():
    picture = readme_block("chain").text
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    drawn = re.findall(r"^([a-z]+) +──>", picture, flags=re.M)
    assert drawn == list(stages), f"the picture's stages {drawn}, dvc.yaml's {list(stages)}"
    named = set(re.findall(r"(?:data|versions)/\S*", picture))
    for name, stage in stages.items():
        for out in _stage_outputs(stage):  # the out, or a directory above it
            assert any(out == n.rstrip("/") or (n.endswith("/") and out.startswith(n)) for n in named), (name, out)


# ---------------------------------------------------------------- yaml: every params snippet, whole
def _merged(snippet: dict) -> dict:
    doc = repo_doc()
    for section, keys in snippet.items():
        doc[section] = {**doc[section], **keys}
    return doc


@pytest.mark.parametrize("name", [b.name for b in fenced_blocks() if b.lang == "yaml"])
def test_every_params_snippet_validates_against_the_models(name):
    """Each yaml block, merged into params.yaml, is a params.yaml the stages accept (the end-to-end runs of each
    kind are named in this module's docstring)."""
    validate_params(_merged(readme_params(name)), f"README.md block {name}")


def test_the_snippets_cover_each_dataset_kind():
    modes = {readme_params(n).get("extract", {}).get("mode", "archives") for n in ("own-ilsvrc2012", "own-21k")}
    kinds = {(readme_params(n)["extract"]["mode"], "holdout" in readme_params(n)["extract"])
             for n in ("own-imagenet100", "own-folder")}
    assert modes == {"archives", "archive21k"} and kinds == {("folder", False), ("folder", True)}


# ---------------------------------------------------------------- python: the training snippet
SCALED_DOWN = {"range(90)": "range(2)", "num_workers=8": "num_workers=0", "pin_memory=True": "pin_memory=False",
               "TrainCrop(224)": "TrainCrop(8)"}
RUNNER = """
import runpy, sys
train_tf = lambda image: __import__("numpy").asarray(image.resize((8, 8)))  # the snippet's transform
namespace = runpy.run_path(sys.argv[1], init_globals={"train_tf": train_tf})
print("batches of", tuple(namespace["images"].shape), "labels", namespace["labels"].tolist())
"""


def test_the_training_snippet_runs_on_a_tiny_dataset(tmp_path):
    """The README's training loop, run as written on 3 classes x ~16 images (epochs and workers scaled down: each
    substituted text must be in the snippet, so a changed snippet fails here instead of running untested)."""
    pytest.importorskip("torchdata")
    code = readme_block("train").text
    for written, scaled in SCALED_DOWN.items():
        assert written in code, f"README training snippet: expected {written!r} to scale down"
        code = code.replace(written, scaled)
    write_shards(tmp_path / "data" / "parquet", "train", total=47, shards=2)
    (tmp_path / "snippet.py").write_text(code, encoding="utf-8")
    (tmp_path / "runner.py").write_text(textwrap.dedent(RUNNER), encoding="utf-8")
    done = subprocess.run([sys.executable, "runner.py", "snippet.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batches of (47, 3, 8, 8)" in done.stdout, done.stdout  # one batch of every image (world size 1)


# ---------------------------------------------------------------- docs/params.md and descriptions
def test_the_params_reference_is_what_the_models_generate():
    committed = (REPO / "docs" / "params.md").read_text(encoding="utf-8")
    assert committed == params_doc.render(), "docs/params.md is stale: run `make docs` and commit it"


def _leaves(node: object, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix]
    if prefix in params_doc.MAPPINGS:  # views.<name>...: one entry per name the user picks, described once
        return [key for value in node.values() for key in _leaves(value, f"{prefix}.<name>")]
    return [key for name, value in node.items() for key in _leaves(value, f"{prefix}.{name}".lstrip("."))]


def test_every_params_key_has_a_description():
    described = {key for key, model, name in params_doc.all_keys() if model.model_fields[name].description}
    missing_in_models = sorted({key for key, _, _ in params_doc.all_keys()} - described)
    missing_in_yaml = sorted(set(_leaves(repo_doc())) - described)
    assert not missing_in_models and not missing_in_yaml, (missing_in_models, missing_in_yaml)


def test_the_params_reference_names_every_key_with_its_stages():
    text = (REPO / "docs" / "params.md").read_text(encoding="utf-8")
    assert "| `convert.order` | one of hashed, class | `hashed` | `convert` |" in text
    assert "| `convert.workers` | an integer in [1, 4096] or one of auto | `auto` | none (speed only) |" in text
    assert "| `extract.mode` | one of archives, folder, archive21k | `archives` | `download`, `extract` |" in text


# ---------------------------------------------------------------- links and anchors
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text.replace("`", ""), flags=re.UNICODE).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file (outside fenced blocks), `-1`, `-2` for repeats."""
    counts: dict[str, int] = {}
    found: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            in_fence = not in_fence
        elif not in_fence and (heading := re.match(r"^#{1,6} (.*)$", line)):
            base = slug(heading.group(1))
            repeat = counts.get(base, 0)
            found.add(f"{base}-{repeat}" if repeat else base)
            counts[base] = repeat + 1
    return found


def _links(path: Path) -> list[str]:
    text = re.sub(r"^\s*(```|~~~).*?^\s*\1", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return LINK.findall(text)


def _broken(path: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # external: form only, never fetched
        return None if re.match(r"^(https?://[\w.-]+(:\d+)?(/\S*)?|mailto:\S+@\S+)$", target) else "malformed URL"
    file, _, anchor = target.partition("#")
    dest = (path.parent / file).resolve() if file else path
    if not dest.exists():
        return "no such file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading #{anchor} in {dest.name}"
    return None


def test_every_relative_link_and_anchor_resolves():
    broken = [f"{p.relative_to(REPO)}: ({t}) {why}" for p in DOCS for t in _links(p) if (why := _broken(p, t))]
    assert not broken, "\n".join(broken)


def test_the_link_checker_catches_a_broken_file_an_anchor_and_a_url(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top `a` heading\n\n## Top a heading\n[x](page.md#top-a-heading-1) [y](#top-a-heading)\n")
    assert _broken(page, "page.md#top-a-heading-1") is None and _broken(page, "#top-a-heading") is None
    assert _broken(page, "missing.md") == "no such file"
    assert _broken(page, "#nowhere").startswith("no heading")
    assert _broken(page, "https://example.org/a") is None and _broken(page, "https:/oops") == "malformed URL"


def test_no_machine_paths_in_the_docs():
    found = [f"{p.relative_to(REPO)}: {m}" for p in DOCS for m in re.findall(r"/(?:work|tmp|root)/\S*", p.read_text())]
    assert not found, found


# ---------------------------------------------------------------- decisions and results
def test_every_decision_record_has_the_four_sections_and_is_indexed():
    index = (REPO / "docs" / "decisions" / "README.md").read_text(encoding="utf-8")
    records = sorted((REPO / "docs" / "decisions").glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert records, "docs/decisions/: no record"
    for record in records:
        headings = re.findall(r"^## (\w+)", record.read_text(encoding="utf-8"), flags=re.M)
        assert headings == ["Context", "Decision", "Consequences", "Evidence"], (record.name, headings)
        assert f"]({record.name})" in index, f"docs/decisions/README.md does not list {record.name}"


def test_every_results_file_is_indexed_and_quoted():
    index = (REPO / "docs" / "results" / "README.md").read_text(encoding="utf-8")
    quoting = [p.read_text(encoding="utf-8") for p in DOCS if p.parent.name != "results"]
    for result in sorted((REPO / "docs" / "results").iterdir()):
        if result.name != "README.md":
            assert f"]({result.name})" in index, f"docs/results/README.md does not list {result.name}"
            assert any(f"results/{result.name}" in text for text in quoting), f"nothing quotes {result.name}"
