"""Hardening of extract (issue 14): an unknown wnid in a class list is reported against the list, before any scan."""
from __future__ import annotations

import pytest

from tasks.common import PipelineError
from tasks.extract import stage as extract
from tests.helpers.params import project


def test_an_unknown_wnid_in_a_class_list_names_the_list_line_before_any_scan(tmp_path, monkeypatch):
    (tmp_path / "classes.txt").write_text("# my subset\nn01440764\nn99999999\n")

    def no_scan(*_args, **_kwargs):
        raise AssertionError("nothing may be scanned before the class list is checked")

    monkeypatch.setattr(extract, "index_archive", no_scan)
    with pytest.raises(PipelineError) as err:
        extract.job_from_params(project(tmp_path, extract={"classes": "classes.txt"}))
    assert str(err.value) == (
        f"{tmp_path / 'classes.txt'}:3: expected one wnid per line, found 'n99999999' (not one of the 1000 "
        "ILSVRC2012 classes in tasks/common/data/synsets.tsv); fix the class list"
    )
