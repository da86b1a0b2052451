"""README's layout section names exactly the files of the tree (src packages, bench/, configs/, docs/, examples/)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = "src/mindfoundry/"
FILE = re.compile(r"[\w-]+\.(?:py|yaml|jsonl|md)\b")


def readme_layout(text: str) -> dict[str, set[str]]:
    """Folder (relative to the repository) -> the file names its entry lists; descriptions in parentheses are skipped.
    """
    block = text.split("## Layout\n", 1)[1].split("```\n", 2)[1]
    out: dict[str, set[str]] = {}
    folder = None
    for line in block.splitlines():
        head = re.match(r"^(\s*)(\S+/)\s", line + " ")
        if head:
            folder = head.group(2) if not head.group(1) else SRC + head.group(2)
            line = line[head.end():]
        while re.search(r"\([^()]*\)", line):
            line = re.sub(r"\([^()]*\)", "", line)
        out.setdefault(folder, set()).update(FILE.findall(line))
    return out


def tree_files() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / "src" / "mindfoundry").rglob("*.py")):
        if path.name != "__init__.py":
            out.setdefault(path.parent.relative_to(REPO).as_posix() + "/", set()).add(path.name)
    for folder, pattern in (("bench", "*.py"), ("configs", "*.yaml"), ("docs", "*.md"), ("examples/lm_eval", "*")):
        out[folder + "/"] = {p.name for p in (REPO / folder).glob(pattern)}
    return out


def test_readme_layout_is_the_tree() -> None:
    assert readme_layout((REPO / "README.md").read_text(encoding="utf-8")) == tree_files()


def test_a_missing_file_is_noticed() -> None:
    text = ("## Layout\n\n```\nsrc/mindfoundry/  errors.py (the base, not cli.py)\n  cli/  main.py,\n        args.py\n"
            "bench/  a.py\n```\n")
    assert readme_layout(text) == {"src/mindfoundry/": {"errors.py"}, "src/mindfoundry/cli/": {"main.py", "args.py"},
                                   "bench/": {"a.py"}}


#: The two engines mirror each other file for file: the same job has the same name, the engine's folder is in the path.
ENGINE_MIRROR = {
    "backend.py",
    "distributed.py",
    "memory.py",
    "model.py",
    "native.py",
    "probe_hooks.py",
    "vision.py",
    "caption.py",
    "train_step.py",
}
ENGINES = ["src/mindfoundry/backends/mindspore", "src/mindfoundry/backends/torch"]


def test_a_file_name_says_which_file_it_is() -> None:
    """Outside the engines' mirror no two packages share a file name (`generate.py` was in eval/ and workflows/,
    `pipeline.py` in three packages): an import or a traceback line names one file."""
    folders: dict[str, list[str]] = {}
    for path in sorted((REPO / "src" / "mindfoundry").rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            folders.setdefault(path.name, []).append(path.parent.relative_to(REPO).as_posix())
    repeated = {name: where for name, where in folders.items() if len(where) > 1}
    assert repeated == {name: ENGINES for name in ENGINE_MIRROR}
