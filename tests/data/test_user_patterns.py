"""User-supplied regular expressions (data.clean.boilerplate.ad_patterns) cannot hang `prepare`: they run on an engine
without catastrophic backtracking for the common shapes, with a time limit per search, and the shapes that still
backtrack are refused at validation, naming the pattern."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mf_testing import tiny_run_tree
from mindfoundry.config.load import ConfigError, validate
from mindfoundry.config.patterns import SEARCH_SECONDS, SlowPatternError, UserPatterns
from mindfoundry.data.clean.boilerplate import BoilerplateRemover
from mindfoundry.data.document import Document


def test_the_issue_pattern_no_longer_hangs_prepare(corpus_dir: Path, tmp_path: Path) -> None:
    """`(a+)+$` on a line of 34 'a' and a '!' ran until killed with Python's re."""
    (tmp_path / "ads.jsonl").write_text(
        "".join(
            json.dumps({"text": t}) + "\n"
            for t in ["a" * 34 + "!\nA second line of text here.", "Plain text, no ads.\nline two"]
        )
    )
    tree = tiny_run_tree(corpus_dir, tmp_path / "run")
    tree["data"]["sources"] = [{"name": "ads", "paths": [str(tmp_path / "ads.jsonl")]}]
    tree["data"]["clean"] = {"boilerplate": {"ad_patterns": ["(a+)+$"]}}
    tree["data"]["dedup"] = {"enabled": False}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tree))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mindfoundry.cli", "prepare", str(tmp_path / "run.yaml"), "--preview", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 120  # a hang guard, not a performance target (it takes a few seconds)
    assert "ad_line" not in proc.stdout  # '(a+)+$' needs the line to end in 'a': it does not match, and returns


def test_a_backtracking_pattern_is_refused_at_validation_naming_it() -> None:
    with pytest.raises(ConfigError) as info:
        validate(
            {
                "data": {
                    "sources": [{"name": "a", "paths": ["x"]}],
                    "clean": {"boilerplate": {"ad_patterns": ["(a|aa)+$"]}},
                }
            }
        )
    assert "ad_patterns pattern '(a|aa)+$' takes over 1 s on a single line: it backtracks catastrophically" in str(
        info.value
    )


def test_a_pattern_that_backtracks_only_on_unseen_input_stops_at_the_time_limit_naming_itself() -> None:
    patterns = UserPatterns(
        ["扫码关注", "(b|bb)+$"], "data.clean.boilerplate.ad_patterns"
    )  # passes validation's probes
    start = time.monotonic()
    with pytest.raises(SlowPatternError, match=r"pattern '\(b\|bb\)\+\$' takes over 1 s"):
        patterns.search("b" * 40 + "!")
    assert time.monotonic() - start < 10 * SEARCH_SECONDS  # bounded: two timed searches (the union, then the culprit)
    block = BoilerplateRemover(ad_patterns=["扫码关注"])
    assert [d.text for d in block.run([Document("扫码关注公众号\n正文", "d", "s", "s")])] == ["正文"]  # ads still go
