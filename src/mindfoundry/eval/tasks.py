"""Zero-shot multiple choice: each choice scored by the log-likelihood the model gives it after the question.

A task file is JSON lines, one question per line::

    {"question": "中国的首都是", "choices": ["北京", "上海", "广州", "深圳"], "answer": 0, "subject": "geography"}

``answer`` is the index of the right choice (a letter "A".."Z" is accepted too) and ``subject`` is
optional. A C-Eval or CMMLU row maps onto it directly: ``question`` as is, ``choices`` = [A, B, C, D],
``answer`` = the answer letter, ``subject`` = the file's subject. Each choice is appended to the
question exactly as written (question and choice tokenized apart), so English choices carry their
leading space (" Paris"), as lm-evaluation-harness's target delimiter does; Chinese ones need none.
``acc`` picks the choice of highest summed log-likelihood, ``acc_norm`` the highest per UTF-8 byte of
the choice, as lm-evaluation-harness reports them. The random-guess baseline is the mean of
1/len(choices).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from mindfoundry.backends.base import Backend
from mindfoundry.config.storage_config import StorageConfig
from mindfoundry.errors import MindFoundryError
from mindfoundry.model.spec import PAD_ID
from mindfoundry.storage.location import Location
from mindfoundry.storage.resolve import locate


class TaskError(MindFoundryError, ValueError):
    """A task file that cannot be scored; the message names the file and line."""


@dataclass(frozen=True)
class Question:
    question: str
    choices: tuple[str, ...]
    answer: int
    subject: str


def read_tasks(path: str | Path | Location, storage: StorageConfig | None = None) -> list[Question]:
    """The questions of a task file (a path, or a URL reached with ``storage``); TaskError naming the line that is
    not one."""
    path = locate(path, storage)
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise TaskError(f"{where}: not a JSON object ({exc.args[0]})") from None
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("question"), str)
            or not isinstance(row.get("choices"), list)
        ):
            raise TaskError(f"{where}: needs \"question\" (text) and \"choices\" (a list of texts)")
        choices = row["choices"]
        if len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise TaskError(f"{where}: \"choices\" must hold at least two non-empty texts")
        answer = row.get("answer")
        if isinstance(answer, str) and len(answer) == 1 and answer.isalpha():
            answer = ord(answer.upper()) - ord("A")
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
            raise TaskError(
                f'{where}: "answer"={row.get("answer")!r} is not the index (0..{len(choices) - 1}) or letter of a '
                'choice'
            )
        out.append(Question(row["question"], tuple(choices), answer, str(row.get("subject", "all"))))
    if not out:
        raise TaskError(f"{path} holds no questions")
    return out


def padded_length(length: int, max_seq_len: int) -> int:
    """The input length a scored sequence of `length` tokens is padded to: the next power of two (at least 16), at most
    max_seq_len. A causal model's logits at the real positions do not depend on padding after them, and a compiled
    engine (MindSpore GRAPH_MODE) then compiles a handful of shapes instead of one per sequence length."""
    return min(max(16, 1 << (length - 1).bit_length()), max_seq_len)


def continuation_logprob(
    backend: Backend, context: list[int], continuation: list[int], max_seq_len: int
) -> tuple[float, bool]:
    """(summed log-probability of `continuation` after `context`, whether every token of it is the argmax);
    the context is cut from the left to fit max_seq_len, as lm-evaluation-harness does."""
    ids = (context + continuation)[-max_seq_len - 1:]
    n = len(ids) - 1
    row = np.full((1, padded_length(n, max_seq_len)), PAD_ID, np.int32)
    row[0, :n] = ids[:-1]
    logits = backend.logits(row)[0][n - len(continuation):n].astype(np.float64)
    targets = np.asarray(continuation)
    logp = logits[np.arange(len(targets)), targets] - np.logaddexp.reduce(logits, axis=-1)
    return float(logp.sum()), bool((logits.argmax(-1) == targets).all())


def choice_loglikelihoods(backend: Backend, tokenizer: Tokenizer, question: Question, max_seq_len: int) -> list[float]:
    """Summed log-probability of each choice's tokens after the question."""
    ctx = tokenizer.encode(question.question).ids
    return [continuation_logprob(backend, ctx, tokenizer.encode(c).ids, max_seq_len)[0] for c in question.choices]


def score_tasks(backend: Backend, tokenizer: Tokenizer, questions: list[Question], max_seq_len: int) -> dict:
    """acc, acc_norm and the random baseline, overall and per subject."""
    per_subject: dict[str, list[tuple[bool, bool, float]]] = defaultdict(list)
    everything = []
    for q in questions:
        ll = choice_loglikelihoods(backend, tokenizer, q, max_seq_len)
        norm = [v / len(c.encode("utf-8")) for v, c in zip(ll, q.choices)]
        row = (int(np.argmax(ll)) == q.answer, int(np.argmax(norm)) == q.answer, 1 / len(q.choices))
        per_subject[q.subject].append(row)
        everything.append(row)

    def summary(part: list[tuple[bool, bool, float]]) -> dict:
        return {
            "questions": len(part),
            "acc": sum(r[0] for r in part) / len(part),
            "acc_norm": sum(r[1] for r in part) / len(part),
            "random": sum(r[2] for r in part) / len(part),
        }

    return {"overall": summary(everything), "subjects": {s: summary(part) for s, part in sorted(per_subject.items())}}
