"""One rank loading a sharded checkpoint into another layout; test_sharded.py launches it.

    torchrun --standalone --nproc_per_node=N tests/checkpoint/sharded_worker.py CONFIG STEP_DIR OUT_NPZ PARALLEL_JSON

Builds the torch engine for CONFIG's model under the layout PARALLEL_JSON (e.g. {"dp_shard": 2, "tp": 2}),
reads STEP_DIR with ``load_sharded`` (each rank its pieces) and gathers the weights and moments back
to full arrays; rank 0 writes them to OUT_NPZ, with each rank's local parameter shapes (to show the
layout really is sharded) and the restored AdamW step count.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from mindfoundry.backends.torch.backend import TorchBackend
    from mindfoundry.checkpoint.store import shard_folders
    from mindfoundry.config.load import load_config
    from mindfoundry.model.spec import ModelSpec
    from mindfoundry.parallel.layout import launch_layout

    config, step_dir, out, parallel = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
    cfg = load_config(config)
    world = {"world_size": int(os.environ["WORLD_SIZE"])}  # what validation fills in for this launch
    cfg = cfg.model_copy(update={"backend": "torch", "parallel": cfg.parallel.model_copy(update=parallel | world)})
    backend = TorchBackend(cfg, ModelSpec.from_config(cfg.model), launch_layout(cfg))
    state = json.loads((step_dir / "trainer_state.json").read_text())
    backend.load_sharded(shard_folders(step_dir), int(state["adam_step"]))
    weights, moments = backend.weights(), backend.optimizer_state()  # collective: gathered full arrays
    local = {n: list((p.to_local() if isinstance(p, DTensor) else p).shape) for n, p in backend.params.items()}
    steps = sorted({float(backend.optimizer.state[p]["step"]) for p in backend.params.values()})
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    if dist.get_rank() == 0:
        np.savez(out, **weights, **moments)
        out.with_suffix(".json").write_text(json.dumps({"local_shapes": gathered, "adam_steps": steps,
                                                        "mesh": list(backend.mesh.mesh_dim_names)}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
