"""Merge per-rank checkpoint slices with MindSpore's own ``transform_checkpoints`` (a subprocess: MindSpore's import
and its log files stay out of the test process).

argv: SLICES (a folder of rank_N.safetensors + strategy.json, the layout of mindfoundry.checkpoint.rank_slices) and
OUT (an empty folder). Writes OUT/merged.safetensors: what MindSpore merged from the same slices and strategy.
"""

import sys
from pathlib import Path

import mindspore as ms
from safetensors.numpy import load_file, save_file

slices, out = Path(sys.argv[1]), Path(sys.argv[2])
src = out / "src"
for f in slices.glob("rank_*.safetensors"):  # MindSpore wants SRC/rank_N/<file>.ckpt
    rank = int(f.stem.split("_")[1])
    (src / f"rank_{rank}").mkdir(parents=True)
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in load_file(str(f)).items()],
                       str(src / f"rank_{rank}" / "slices.ckpt"))
ms.transform_checkpoints(str(src), str(out / "dst"), "merged", str(slices / "strategy.json"), None)
(merged,) = (out / "dst").rglob("*.ckpt")
save_file({n: p.asnumpy() for n, p in ms.load_checkpoint(str(merged)).items()}, str(out / "merged.safetensors"))
