"""`mindfoundry plan`: rank the parallel layouts of a model on N devices by memory and communication.
`mindfoundry launch train|run CONFIG`: start every rank of this node with torchrun (torch) or msrun (mindspore).

Exit status: 0 when at least one layout fits (without, with selective or with full recompute), 1 when none does,
2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from mindfoundry.cli.args import add_max_restarts, console, local_path
from mindfoundry.config.load import ConfigError, load_config
from mindfoundry.config.parallel_config import ParallelConfig


def add_parallel_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="rank parallel layouts (DP/FSDP/TP/PP/CP) of a model on N devices by memory and communication"
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="CONFIG",
        help="run config whose model (and defaults) to plan, e.g. configs/llama-13b.yaml",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value (repeatable), e.g. model.n_layers=48",
    )
    p.add_argument("--devices", type=int, required=True, metavar="N", help="number of devices (= processes)")
    p.add_argument("--device-memory", required=True, metavar="SIZE", help="memory per device, e.g. 32GiB, 80GB, 512MiB")
    p.add_argument(
        "--seq", type=int, default=None, metavar="L", help="sequence length (default: the config's train.seq_len)"
    )
    p.add_argument("--global-batch", type=int, default=None, metavar="B",
                   help="sequences per optimizer step (default: the config's micro_batch_size*grad_accum*dp)")
    p.add_argument("--micro-batch", type=int, default=1, metavar="b", help="sequences per micro-batch (default 1)")
    p.add_argument(
        "--precision", choices=["bf16", "fp16", "fp32"], default=None, help="default: the config's train.precision"
    )
    p.add_argument(
        "--overhead", default="1GiB", metavar="SIZE", help="fixed per-device overhead: runtime, buffers (default 1GiB)"
    )
    p.add_argument("--no-flash-attention", action="store_true", help="attention keeps its s*s scores (no fused kernel)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="rows shown (default 10; 0 = all)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "launch", help="run train/run on N processes per node with torchrun (torch) or msrun (mindspore)"
    )
    p.add_argument("command", choices=["train", "run"], help="the mindfoundry command every rank runs")
    p.add_argument("config", type=local_path("the config file is read from a local disk: copy it here first"),
                   help="YAML run config; its parallel section sets the layout")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable; passed to every rank)"
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="processes on this node (default: the layout's product / nnodes)",
    )
    p.add_argument("--nnodes", type=int, default=1, help="nodes in the job (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0 on the master node")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=29500, help="a free port on node 0 (default 29500)")
    p.add_argument("--log-dir", default=None, type=local_path("the launcher writes each rank's log as a local file"),
                   help="per-rank logs (default RUN_DIR-logs, beside the run directory)")
    p.add_argument(
        "--resume",
        choices=["auto", "none"],
        default="none",
        help="passed to the command: auto = continue from the newest checkpoint",
    )
    p.add_argument("--stop-at-step", type=int, default=None, metavar="N", help="passed to the command")
    add_max_restarts(p, "the whole job (every rank)")
    p.set_defaults(func=cmd_launch)


def cmd_launch(args: argparse.Namespace) -> int:
    """Start `mindfoundry COMMAND CONFIG ...` on every rank of this node with the engine's own launcher."""
    import os
    from pathlib import Path

    from mindfoundry.config.layout_rules import layout_problems
    from mindfoundry.parallel.launch import LaunchPlan, check_port, command, launch_env, rank_logs
    from mindfoundry.workflows.supervise import supervise

    cfg = load_config(args.config, args.set or [])
    nnodes = args.nnodes
    if not args.nproc_per_node and cfg.parallel.dp_shard == -1 and cfg.parallel.world_size is None:
        raise ConfigError("parallel.dp_shard=-1 takes what is left of the world size, so the config does not say how "
                          "many processes to start: pass --nproc-per-node (processes on each node) or set "
                          "parallel.world_size")
    nproc = args.nproc_per_node or max(cfg.parallel.layout().world_size // nnodes, 1)
    problems = layout_problems(cfg.parallel, cfg.model, cfg.train, world_size=nproc * nnodes)
    if problems:
        raise ConfigError("the layout does not fit this launch: " + "; ".join(problems))
    plan = LaunchPlan(
        cfg.backend,
        nproc,
        nnodes,
        args.node_rank,
        args.master_addr,
        args.master_port,
        Path(args.log_dir or f"{cfg.run_dir.rstrip('/')}-logs"),
    )  # beside the run dir, which rank 0 claims
    check_port(plan)

    def attempt_command(attempt: int) -> list[str]:  # a restart resumes from the newest valid checkpoint
        return command(plan, [args.command, args.config, *sum((["--set", s] for s in args.set or []), []),
                              "--resume", "auto" if attempt else args.resume,
                              *(["--stop-at-step", str(args.stop_at_step)] if args.stop_at_step else [])])

    console.print(
        f"launching {plan.world_size} processes ({nproc} on this node) with "
        f"{'torchrun' if cfg.backend == 'torch' else 'msrun'}; per-rank logs: {rank_logs(plan)}",
        highlight=False,
    )
    return supervise(attempt_command, args.max_restarts, console.print, processes=nproc,
                     env=launch_env(plan, os.environ), launcher=True)


def _positive(**values: int) -> None:
    for name, v in values.items():
        if v < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={v}: must be at least 1")


def cmd_plan(args: argparse.Namespace) -> int:
    from mindfoundry.model.spec import ModelSpec, num_parameters
    from mindfoundry.parallel.planner import format_bytes, parse_bytes, plan

    cfg = load_config(args.model, args.set or [])
    spec = ModelSpec.from_config(cfg.model)
    seq = args.seq or cfg.train.seq_len
    precision = args.precision or cfg.train.precision
    try:
        memory, overhead = parse_bytes(args.device_memory), parse_bytes(args.overhead)
        batch = args.global_batch or cfg.parallel.layout().global_batch(cfg.train)
    except ValueError as exc:
        raise ConfigError(f"{exc} (or pass --global-batch)" if "dp_shard" in str(exc) else str(exc)) from None
    _positive(devices=args.devices, seq=seq, global_batch=batch, micro_batch=args.micro_batch)
    if seq > spec.max_seq_len:
        raise ConfigError(
            f"--seq {seq} exceeds model.max_seq_len={spec.max_seq_len}: lower --seq or raise model.max_seq_len"
        )
    if batch % args.micro_batch:
        raise ConfigError(f"--global-batch {batch} is not a multiple of --micro-batch {args.micro_batch}")
    rows = plan(spec, args.devices, memory, seq, batch, precision, micro_batch=args.micro_batch,
                fixed_overhead_bytes=overhead, flash_attention=not args.no_flash_attention)
    if not rows:
        raise ConfigError(
            f"no layout of {args.devices} devices splits this model and batch: the global batch {batch} must be "
            f"divisible by dp * micro-batch, and tp/pp/cp must divide the model (heads {spec.n_heads}, "
            f"kv heads {spec.n_kv_heads}, layers {spec.n_layers}, ffn {spec.ffn_dim}, vocab {spec.vocab_size}) "
            f"and the sequence {seq}; try another --devices or --global-batch"
        )
    shown = rows[: args.top] if args.top > 0 else rows
    fitting = [r for r in rows if r.fits != "no"]
    if args.json:
        out = {
            "model": spec.to_dict() | {"parameters": num_parameters(spec)},
            "devices": args.devices,
            "device_memory": memory,
            "seq": seq,
            "global_batch": batch,
            "micro_batch": args.micro_batch,
            "precision": precision,
            "fixed_overhead": overhead,
            "feasible": len(rows),
            "fitting": len(fitting),
            "rows": [r.to_dict() for r in shown],
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0 if fitting else 1
    tokens = batch * seq
    table = Table(
        title=f"{cfg.name}: {num_parameters(spec) / 1e9:.2f}B parameters on {args.devices} x {format_bytes(memory)}, "
        f"seq {seq}, global batch {batch} ({tokens / 1e6:.2f}M tokens), {precision}"
    )
    for col in ("#", "layout", "mb x accum", "weights+grads+optim", "activations", "act. selective", "act. full",
                "total", "total selective", "total full", "fits", "comm/step", "bubble"):
        table.add_column(col, justify="left" if col in ("layout", "fits") else "right")
    for i, r in enumerate(shown, 1):
        mark = {"yes": "[green]yes[/]", "selective": "[yellow]selective[/]", "recompute": "[yellow]full recompute[/]",
                "no": "[red]no[/]"}[r.fits]
        modes = (r.memory, r.memory_selective, r.memory_recompute)
        table.add_row(
            str(i),
            r.layout.describe(),
            f"{r.micro_batch} x {r.grad_accum}",
            format_bytes(r.memory.model_states),
            *(format_bytes(m.activations) for m in modes),
            *(format_bytes(m.total) for m in modes),
            mark,
            f"{r.chosen_comm.total / 1e9:.1f} GB",
            f"{r.bubble:.1%}",
        )
    Console(width=max(Console().width, 200)).print(table)
    if not fitting:
        best = min(rows, key=lambda r: r.memory_recompute.total)
        console.print(
            f"[red]no layout fits in {format_bytes(memory)} per device[/] (smallest: {best.layout.describe()} needs "
            f"{format_bytes(best.memory_recompute.total)} with full recompute): add devices or lower --micro-batch / "
            "--seq",
            highlight=False,
        )
        return 1
    best = fitting[0]
    defaults = {name: f.default for name, f in ParallelConfig.model_fields.items()}
    section = {k: v for k, v in best.layout.config().items() if k != "world_size" and v != defaults[k]}
    needs = f" with {best.recompute} recompute" if best.recompute != "none" else ""
    memory = f", memory: {{recompute: {best.recompute}}}" if best.recompute != "none" else ""
    console.print(
        f"best: {best.layout.describe()}{needs}; config: parallel: {json.dumps(section)}, "
        f"train: {{micro_batch_size: {best.micro_batch}, grad_accum: {best.grad_accum}}}{memory}",
        highlight=False,
    )
    return 0

