"""Launch command lines for one node or many: `torchrun` for the torch engine, `msrun` for MindSpore.

Both launchers start `local` processes on this node out of `nnodes * local` in all, connect them
through a master address and port, and write one log per rank. This module only builds the command
and checks the port; it starts nothing and imports no framework.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from mindfoundry.errors import MindFoundryError


class LaunchError(MindFoundryError, ValueError):
    """A launch that cannot start (port taken, launcher missing, process counts that do not fit)."""


@dataclass(frozen=True)
class LaunchPlan:
    """Where and how many processes to start."""

    engine: str  # "torch" -> torchrun, "mindspore" -> msrun
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    log_dir: Path = Path("logs")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port(plan: LaunchPlan) -> None:
    """On the master node the port must be free (a second job, or a crashed one's leftover, holds it)."""
    if plan.node_rank != 0:
        return
    if not 0 < plan.master_port < 65536:
        raise LaunchError(f"--master-port={plan.master_port}: ports lie in 1..65535")
    host = "" if plan.master_addr in ("127.0.0.1", "localhost") else plan.master_addr
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host or "127.0.0.1", plan.master_port))
        except OSError:
            raise LaunchError(
                f"port {plan.master_port} on {plan.master_addr} is already in use (another job, or a crashed one): "
                f"pass --master-port with a free port, e.g. {free_port()}"
            ) from None


def _entry_point() -> str:
    """The installed `mindfoundry` console script: msrun runs a script file, not a module."""
    script = Path(sys.executable).with_name("mindfoundry")
    found = str(script) if script.is_file() else shutil.which("mindfoundry")
    if not found:
        raise LaunchError("the `mindfoundry` command is not installed next to this Python: pip install -e . first")
    return found


def command(plan: LaunchPlan, args: Sequence[str]) -> list[str]:
    """The launcher command that runs `mindfoundry ARGS...` on every rank of this node."""
    if plan.nproc_per_node < 1 or plan.nnodes < 1 or not 0 <= plan.node_rank < plan.nnodes:
        raise LaunchError(f"nproc_per_node={plan.nproc_per_node}, nnodes={plan.nnodes}, node_rank={plan.node_rank}: "
                          "need nproc_per_node >= 1, nnodes >= 1 and 0 <= node_rank < nnodes")
    if plan.engine == "torch":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={plan.nnodes}",
            f"--nproc-per-node={plan.nproc_per_node}",
            f"--node-rank={plan.node_rank}",
            f"--master-addr={plan.master_addr}",
            f"--master-port={plan.master_port}",
            f"--log-dir={plan.log_dir}",
            "--redirects=3",
            "--tee=3",
            _entry_point(),
            *args,
        ]
    if plan.engine == "mindspore":
        msrun = Path(sys.executable).with_name("msrun")
        if not msrun.is_file():
            raise LaunchError(
                "msrun (MindSpore's launcher) is not installed next to this Python: pip install "
                "'mindfoundry[mindspore]'"
            )
        return [
            str(msrun),
            f"--worker_num={plan.world_size}",
            f"--local_worker_num={plan.nproc_per_node}",
            f"--master_addr={plan.master_addr}",
            f"--master_port={plan.master_port}",
            f"--node_rank={plan.node_rank}",
            f"--log_dir={plan.log_dir}",
            "--join=True",
            _entry_point(),
            *args,
        ]
    raise LaunchError(f"backend '{plan.engine}' has no launcher: use torch (torchrun) or mindspore (msrun)")


def launch_env(plan: LaunchPlan, env: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment. msrun starts every rank as `python SCRIPT` through PATH: this Python's folder goes
    first, so the ranks run the interpreter that has mindfoundry even when its virtualenv is not on PATH."""
    out = dict(env)
    if plan.engine == "mindspore":
        out["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), *filter(None, [env.get("PATH")])])
    return out


def rank_logs(plan: LaunchPlan) -> str:
    """Where each rank's output goes, in words."""
    if plan.engine == "mindspore":
        return f"{plan.log_dir}/worker_<rank>.log"
    return f"{plan.log_dir}/<run id>/attempt_0/<local rank>/stdout.log (and stderr.log); also echoed here"
