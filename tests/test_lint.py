"""The linter is part of the suite: pyflakes, pycodestyle errors and import order at 120 characters (pyproject.toml's
[tool.ruff]) hold on src/, tests/ and bench/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "bench"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_reads_the_project_settings(tmp_path: Path) -> None:
    """A line of 121 characters and an unsorted import are reported: the settings are the project's, not empty."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\nX = '" + "x" * 115 + "'\n", encoding="utf-8")
    settings = ["--config", str(REPO / "pyproject.toml"), "--output-format", "concise"]
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *settings, str(bad)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "E501 Line too long (121 > 120)" in proc.stdout and "I001" in proc.stdout, proc.stdout
