"""`mindfoundry prepare|train|run|smoke CONFIG`: the training commands (the workflows are
:mod:`mindfoundry.workflows`').

Training exit codes: 0 done, 2 user error, 3 stopped by the anomaly policy, 70 crashed (after a
last-gasp checkpoint when the state was consistent), 75 pre-empted by SIGTERM/SIGINT (checkpoint
written); `--max-restarts N` reruns a crashed run from its newest valid checkpoint.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from mindfoundry.cli.args import (
    add_config_arguments,
    add_max_restarts,
    add_storage_arguments,
    config_from_args,
    console,
    storage_from_args,
)


def cmd_prepare(args: argparse.Namespace) -> int:
    from mindfoundry.workflows.run import prepare

    cfg = config_from_args(args)
    if args.preview is not None:
        return _preview(cfg, args.preview, args.chars)
    prepare(cfg, overwrite=args.overwrite, log=console.print)
    return 0


def _preview(cfg, n: int, chars: int) -> int:
    """Print what cleaning would drop or change in the first ``n`` documents of each source; write nothing."""
    from mindfoundry.cli.data_commands import print_drops, stdout
    from mindfoundry.data.clean.droplog import summarise
    from mindfoundry.data.clean.preview import preview_cleaning

    previews, min_documents = preview_cleaning(cfg.data, n, cfg.storage)
    out = stdout()
    for source in previews:
        line = f"{source.name} ({source.profile}): read {source.read}, kept {source.kept}"
        if not source.events:
            out.print(f"{line}; nothing dropped or changed", highlight=False)
            continue
        drops = sum(e["action"] == "drop" for e in source.events)
        print_drops(
            out, summarise(iter(source.events)), f"{line}, dropped {drops}, edited {len(source.events) - drops}", chars
        )
    out.print(
        "preview only: nothing written; boilerplate counted over the previewed documents (a line in >= "
        f"{min_documents} of them); dedup needs the whole corpus and is not previewed",
        highlight=False,
        soft_wrap=True,
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from mindfoundry.workflows.run import dry_start, train

    if args.dry_run:
        for line in dry_start(config_from_args(args)):
            console.print(line, highlight=False)
        return 0
    train(
        config_from_args(args),
        resume=args.resume == "auto",
        overwrite=args.overwrite,
        stop_at_step=args.stop_at_step,
        console=console,
    )  # evaluations are printed as they happen, the last one included
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from mindfoundry.workflows.run import run

    cfg = config_from_args(args)
    done = run(
        cfg, resume=args.resume == "auto", overwrite=args.overwrite, stop_at_step=args.stop_at_step, console=console
    )
    if done.summary is None:
        console.print(f"stopped at step {done.trained.result.step} of {cfg.train.steps}; continue with --resume auto")
        return 0
    _print_summary(done.summary)
    console.print(f"report: {done.report}")
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    from mindfoundry.workflows.smoke import smoke

    cfg = config_from_args(args)
    checks = smoke(cfg, args.steps, compare_backend=args.compare_backend, console=console)
    table = Table(title=f"smoke test: {args.steps} steps of {args.config} ({cfg.backend})")
    for col in ("check", "result", "value"):
        table.add_column(col)
    for c in checks:
        mark = "[green]PASS[/]" if c.passed else ("[red]FAIL[/]" if c.passed is False else "info")
        table.add_row(c.name, mark, c.value)
    Console().print(table)
    failed = [c for c in checks if c.passed is False]
    for c in failed:
        console.print(f"[red]FAIL[/] {c.name}: {c.value}. Likely cause: {c.hint}", highlight=False)
    return 1 if failed else 0


def cmd_generate(args: argparse.Namespace) -> int:
    import json
    import sys

    from mindfoundry.errors import MindFoundryError
    from mindfoundry.workflows.generate import caption_file, continue_prompt, load_trained

    if args.image is not None:
        if args.prompt is not None:
            raise MindFoundryError("give --prompt (a language model) or --image (a captioner), not both")
        model = load_trained(args.checkpoint, args.backend, storage=storage_from_args(args))
        caption = caption_file(model, args.image, max_new_tokens=args.max_new_tokens)
        sys.stdout.write((json.dumps({"image": args.image, "caption": caption}, ensure_ascii=False) if args.json
                          else caption) + "\n")
        return 0
    if args.prompt is None:
        raise MindFoundryError("give --prompt TEXT to continue (or --image PATH for a captioner)")
    model = load_trained(args.checkpoint, args.backend, causal_for="generation", storage=storage_from_args(args))
    out = continue_prompt(model, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if out.used_prompt_tokens < out.prompt_tokens:
        console.print(
            f"[yellow]the prompt has {out.prompt_tokens} tokens; generating from its last {out.used_prompt_tokens} "
            f"(model.max_seq_len {model.cfg.model.max_seq_len} - --max-new-tokens {args.max_new_tokens})[/]"
        )
    if args.json:
        sys.stdout.write(json.dumps({"prompt": out.prompt, "completion": out.completion, "token_ids": out.token_ids},
                                    ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(out.prompt + out.completion + "\n")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import json

    from mindfoundry.errors import OutputExistsError
    from mindfoundry.storage.commit import staged_file
    from mindfoundry.storage.resolve import locate
    from mindfoundry.workflows.evaluate import evaluate_model
    from mindfoundry.workflows.generate import load_trained

    storage = storage_from_args(args)
    json_out = locate(args.json, storage) if args.json else None
    if json_out is not None and json_out.exists():
        raise OutputExistsError(f"{json_out} already exists: choose another --json file (nothing was written)")
    result = evaluate_model(load_trained(args.checkpoint, args.backend, storage=storage), data=args.data or (),
                            tasks=args.tasks or (), lm_eval=args.lm_eval or (), probe=args.probe or ())
    table = Table(title=f"evaluation of {result['checkpoint']}",
                  caption="validation: every batch of the held-out split (train's evaluations score a fixed sample of "
                          "train.eval_samples samples, so their loss differs a little)")
    for col in ("set", "loss", "perplexity", "bits/byte", "tokens"):
        table.add_column(col)
    for group in ("validation", "data"):
        for name, r in result.get(group, {}).items():
            table.add_row(
                f"{group}: {name}",
                f"{r['loss']:.4f}",
                _cell(r["perplexity"], ".2f"),
                _cell(r["bits_per_byte"], ".4f"),
                str(r["tokens"]),
            )
    out = Console()
    if table.rows:
        out.print(table)
    for task, scores in result.get("tasks", {}).items():
        rows = Table(title=f"zero-shot multiple choice: {task}")
        for col in ("subject", "questions", "acc", "acc_norm", "random"):
            rows.add_column(col)
        for subject, s in [*scores["subjects"].items(), ("overall", scores["overall"])]:
            rows.add_row(subject, str(s["questions"]), f"{s['acc']:.3f}", f"{s['acc_norm']:.3f}", f"{s['random']:.3f}")
        out.print(rows)
    for task, metrics in result.get("lm_eval", {}).items():
        out.print(f"lm-eval {task}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()), highlight=False)
    _print_probes(out, result.get("probe", {}))
    if json_out is not None:
        with staged_file(json_out) as tmp:
            tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def _cell(value: float | None, fmt: str) -> str:
    """A table cell; '-' where the number does not exist (an image model's loss has no perplexity)."""
    return "-" if value is None else format(value, fmt)


def _print_probes(out: Console, probes: dict[str, dict]) -> None:
    for name, p in probes.items():
        out.print(f"linear probe on {name}: accuracy {p['accuracy']:.3f} ({p['random_encoder']:.3f} from a randomly "
                  f"initialised encoder; {p['train_images']} images fitted, {p['test_images']} held out)",
                  highlight=False)


def _print_summary(summary: dict) -> None:
    table = Table(title=f"held-out evaluation ({summary['run_dir']})")
    for col in ("", "loss", "perplexity", "bits/byte"):
        table.add_column(col)
    for label, key in (("untrained (step 0)", "initial"), (f"trained (step {summary['steps']})", "final")):
        r = summary[key]
        if r:
            table.add_row(label, f"{r['val_loss']:.4f}", _cell(r["val_perplexity"], ".2f"),
                          _cell(r["val_bits_per_byte"], ".4f"))
    out = Console()
    out.print(table)
    for s in summary.get("samples", []):
        out.print(f"[bold]{s['prompt']!r}[/] -> {s['completion']!r}", highlight=False)
    if "shuffled_images" in summary:
        shuffled = summary["shuffled_images"]
        out.print(f"with each caption given another image: loss {shuffled['loss']:.4f}, bits/byte "
                  f"{shuffled['bits_per_byte']:.4f}", highlight=False)
    for c in summary.get("captions", []):
        out.print(f"[bold]{c['caption']!r}[/] -> captioned {c['generated']!r}", highlight=False)
    _print_probes(out, summary.get("probe", {}))


def add_train_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="raw text -> tokenizer -> Megatron shards")
    add_config_arguments(p)
    p.add_argument("--overwrite", action="store_true", help="rebuild prepared data (old folder moved aside)")
    p.add_argument(
        "--preview",
        type=int,
        default=None,
        metavar="N",
        help="clean the first N documents of each source and print what each block would drop or change; write nothing",
    )
    p.add_argument("--chars", type=int, default=160, metavar="N", help="characters shown per --preview example")
    p.set_defaults(func=cmd_prepare)

    for name, func, text in (("train", cmd_train, "train (prepares data first if needed)"),
                             ("run", cmd_run, "prepare -> train -> evaluate -> sample")):
        p = sub.add_parser(name, help=text)
        add_config_arguments(p)
        p.add_argument(
            "--resume", choices=["auto", "none"], default="none", help="auto: continue from the newest valid checkpoint"
        )
        p.add_argument(
            "--overwrite", action="store_true", help="start over in a run dir that holds a run (old run moved aside)"
        )
        p.add_argument(
            "--stop-at-step",
            type=int,
            default=None,
            metavar="N",
            help="checkpoint and stop after step N (continue later with --resume auto)",
        )
        add_max_restarts(p, "the run")
        if name == "train":
            p.add_argument(
                "--dry-run",
                action="store_true",
                help="check the config, the launch and the memory it needs, write nothing, exit 0 if it would start",
            )
        p.set_defaults(func=func)
    p = sub.add_parser("generate", help="continue a prompt with a trained checkpoint (key/value cache, either engine)")
    p.add_argument("checkpoint", help="RUN_DIR (its newest valid checkpoint) or CKPT/step_N (a folder or a URL)")
    p.add_argument("--prompt", default=None, help="text to continue")
    p.add_argument("--image", default=None, metavar="PATH", help="a captioner (model.objective: caption): the image "
                   "file to caption (greedy; a path or a URL)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T", help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, metavar="K", help="sample among the K most likely tokens (0 = all)")
    p.add_argument(
        "--top-p", type=float, default=1.0, metavar="P", help="nucleus: the most likely tokens holding P (1 = all)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["mindspore", "torch"], default=None, help="engine (default: the run's)")
    add_storage_arguments(p)
    p.add_argument(
        "--json", action="store_true", help="one JSON object: prompt, completion, token_ids of the new tokens"
    )
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser(
        "eval", help="held-out loss/perplexity/bits per byte (per category, or on files) and zero-shot multiple choice"
    )
    p.add_argument("checkpoint", help="RUN_DIR (its newest valid checkpoint) or CKPT/step_N (a folder or a URL)")
    p.add_argument(
        "--data",
        nargs="+",
        metavar="FILE_OR_GLOB",
        help=".txt/.jsonl files, folders or globs instead of the validation split",
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        metavar="TASK.jsonl",
        help="multiple-choice tasks (paths or URLs): question, choices, answer[, subject] per line",
    )
    p.add_argument(
        "--lm-eval",
        nargs="+",
        metavar="TASK.yaml",
        help="lm-evaluation-harness task files, scored on this engine "
        "(e.g. examples/lm_eval/mindfoundry_mc.yaml; needs the eval extra)",
    )
    p.add_argument("--probe", nargs="+", metavar="SET", choices=["digits"], help="image models: a linear probe of "
                   "the encoder's features on a labelled set (digits: scikit-learn's handwritten digits), against a "
                   "randomly initialised encoder")
    p.add_argument(
        "--json", metavar="OUT", default=None, help="also write every number to this JSON file, a path or a URL (must "
        "not exist)"
    )
    p.add_argument("--backend", choices=["mindspore", "torch"], default=None, help="engine (default: the run's)")
    add_storage_arguments(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("smoke", help="a few dozen real steps with pass/fail checks before the big run")
    add_config_arguments(p)
    p.add_argument("--steps", type=int, default=30, help="smoke steps (default 30)")
    p.add_argument(
        "--compare-backend", action="store_true", help="also compare the first step of MindSpore and PyTorch"
    )
    p.set_defaults(func=cmd_smoke)
