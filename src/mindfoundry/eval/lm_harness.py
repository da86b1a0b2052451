"""lm-evaluation-harness on our engines: an ``lm_eval.api.model.LM`` over a loaded checkpoint.

``MindFoundryLM`` implements the three request types (``loglikelihood`` through lm-eval's own
context/continuation pairing, ``loglikelihood_rolling`` over its rolling windows, and greedy
``generate_until`` through the cached generator), so `simple_evaluate` scores any lm-eval task on
MindSpore or torch without an export. It pairs and truncates exactly as lm-eval's Hugging Face
model does, so a task scores the same through either route (tests/eval/test_lm_harness.py).
Optional: ``pip install 'mindfoundry[eval]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import yaml
from lm_eval import simple_evaluate
from lm_eval.api.model import TemplateLM
from lm_eval.tasks import TaskManager
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from mindfoundry.backends.base import Backend
from mindfoundry.data.tokenizer import eos_id
from mindfoundry.eval.sampling import generate
from mindfoundry.eval.tasks import TaskError, continuation_logprob


class MindFoundryLM(TemplateLM):
    """A loaded model (backend + tokenizer) answering lm-eval's requests one by one (batch size 1)."""

    def __init__(self, backend: Backend, tokenizer, max_seq_len: int) -> None:
        super().__init__()
        self.backend, self.tok, self.max_seq_len = backend, tokenizer, max_seq_len

    @property
    def eot_token_id(self) -> int:
        return eos_id(self.tok)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tok.encode(string).ids  # no special tokens are ever added: the model has no BOS

    def _loglikelihood_tokens(self, requests, **kwargs: Any) -> list[tuple[float, bool]]:
        return [
            continuation_logprob(self.backend, list(ctx), list(cont), self.max_seq_len) for _, ctx, cont in requests
        ]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (text,) in (r.args for r in requests):
            windows = get_rolling_token_windows(self.tok_encode(text), self.eot_token_id, self.max_seq_len, 1)
            out.append(sum(continuation_logprob(self.backend, ctx, pred, self.max_seq_len)[0]
                           for ctx, pred in map(make_disjoint_window, windows)))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, kwargs in (r.args for r in requests):
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            new = generate(
                self.backend,
                self.tok_encode(context),
                max_seq_len=self.max_seq_len,
                max_new_tokens=min(int(kwargs.get("max_gen_toks", 256)), self.max_seq_len - 1),
                temperature=0,
                top_k=0,
                eos_id=self.eot_token_id,
                seed=0,
            )
            text = self.tok.decode(new)
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


def task_names(paths: Sequence[str | Path]) -> tuple[list[str], list[str]]:
    """(task names, include paths) of lm-eval task YAML files."""
    names, include = [], []
    for path in map(Path, paths):
        if not path.is_file():
            raise TaskError(
                f"lm-eval task file {path} does not exist: give a task YAML (e.g. examples/lm_eval/mindfoundry_mc.yaml)"
            )
        names.append(yaml.safe_load(path.read_text(encoding="utf-8"))["task"])
        include.append(str(path.parent.resolve()))
    return names, sorted(set(include))


def run_lm_eval(
    model: MindFoundryLM | str, tasks: Sequence[str | Path], model_args: str | None = None, **kwargs: Any
) -> dict:
    """lm-eval's `simple_evaluate` on task YAML files, for our LM or a named lm-eval model ("hf" + model_args)."""
    names, include = task_names(tasks)
    return simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=names,
        task_manager=TaskManager(include_path=include),
        batch_size=1,
        **kwargs,
    )
