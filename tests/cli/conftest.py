"""Fixtures of the command-line tests."""

import pytest
from helpers.parse_errors import refused_with_nonsense
from jsonargparse import ArgumentParser


@pytest.fixture(params=[False, True], ids=["jsonargparse_words", "reworded"])
def in_a_folder_with_either_words(request, tmp_path, monkeypatch) -> None:
    """In tmp_path, once with jsonargparse's own refusals and once with nonsense in their place: the lines must
    come from the declared types, not from its words (test_parse_errors_in_config_files, test_config_file_lists)."""
    if request.param:
        monkeypatch.setattr(ArgumentParser, "error", refused_with_nonsense)
    monkeypatch.chdir(tmp_path)
