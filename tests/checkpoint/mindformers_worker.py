"""Opens a `mindfoundry export --format mindformers` folder with MindFormers itself (a subprocess of
test_mindformers_export.py, run in a scratch folder: MindFormers writes its logs under ./output).

    python mindformers_worker.py EXPORT_DIR IDS.npy OUT.json

Loads the run YAML with MindFormers' ``MindFormerConfig``, resolves every ``type`` it names in MindFormers'
registry, builds ``LlamaConfig`` from ``model.model_config`` (every key must be one of its parameters) and
``LlamaForCausalLM`` on the CPU, loads the exported safetensors into it (every name must match), computes
the logits of IDS, and opens every ``data_path`` prefix with MindFormers' Megatron ``IndexedDataset``.
Only the CPU's limits are changed: no fused RmsNorm kernel and no FlashAttention (Ascend kernels).
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    export, ids_path, out_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    import mindformers
    import mindspore as ms
    from mindformers import LlamaConfig, LlamaForCausalLM, MindFormerConfig
    from mindformers.dataset.blended_datasets.indexed_dataset import IndexedDataset
    from mindformers.tools.register import MindFormerModuleType as T
    from mindformers.tools.register import MindFormerRegister

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    cfg = MindFormerConfig(str(export / "run_mindformers.yaml"))
    types = [
        (T.TRAINER, cfg.trainer.type),
        (T.OPTIMIZER, cfg.optimizer.type),
        (T.LR, cfg.lr_schedule.type),
        (T.DATASET_LOADER, cfg.train_dataset.data_loader.type),
        (T.DATASET, cfg.train_dataset_task.type),
        (T.WRAPPER, cfg.runner_wrapper.type),
        (T.CONFIG, cfg.model.model_config.type),
        (T.MODELS, cfg.model.arch.type),
        *((T.CALLBACK, c["type"]) for c in cfg.callbacks),
    ]
    unresolved = [name for kind, name in types if not MindFormerRegister.is_exist(kind, name)]
    model_config = {k: v for k, v in cfg.model.model_config.items() if k != "type"}
    accepted = set(inspect.signature(LlamaConfig.__init__).parameters)
    unknown = sorted(set(model_config) - accepted)
    model_config.update(fused_rms_norm=False, use_flash_attention=False)  # the CPU has neither kernel
    model = LlamaForCausalLM(LlamaConfig(**model_config))
    weights = ms.load_checkpoint(str(export / "weights" / "model.safetensors"), format="safetensors")
    not_loaded, unused = ms.load_param_into_net(model, weights)
    model.set_train(False)
    np.save(out_path.with_suffix(".npy"), model(ms.Tensor(np.load(ids_path)))[0].asnumpy())
    data_path = cfg.train_dataset.data_loader.config.data_path
    shards = {}
    for weight, prefix in zip(data_path[::2], data_path[1::2]):
        ds = IndexedDataset(prefix)
        shards[prefix] = {
            "weight": weight,
            "documents": len(ds),
            "first": ds[0].tolist(),
            "last": ds[len(ds) - 1].tolist(),
        }
    out_path.write_text(
        json.dumps(
            {
                "version": mindformers.__version__,
                "unresolved_types": unresolved,
                "unknown_model_keys": unknown,
                "not_loaded": list(not_loaded),
                "unused": list(unused),
                "parallel_config": dict(cfg.parallel_config),
                "lr_schedule": dict(cfg.lr_schedule),
                "shards": shards,
                "tied": bool(cfg.model.model_config.tie_word_embeddings),
            }
        )
    )


if __name__ == "__main__":
    main()
