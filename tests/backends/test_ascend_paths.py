"""What the Ascend-only paths of the MindSpore engine are, checked as far as a CPU allows: bf16 and FlashAttentionScore
are accepted for device: ascend and refused elsewhere with the key named; the model builds with them; the masks it
hands FlashAttentionScore hide exactly what the CPU path's additive mask hides. The kernels themselves never run
here."""

from __future__ import annotations

import numpy as np
import pytest

from mf_testing import tiny_config
from mindfoundry.config.load import ConfigError, validate
from mindfoundry.model.spec import PAD_ID, ModelSpec, visible_keys


@pytest.mark.parametrize(
    "device,precision,switch,flash",
    [
        ("cpu", "fp32", "auto", False),
        ("cpu", "fp16", "auto", False),
        ("ascend", "fp32", "auto", False),
        ("ascend", "fp16", "auto", True),
        ("ascend", "bf16", "auto", True),
        ("npu", "bf16", "off", False),
        ("ascend", "fp16", "on", True),
    ],
)
def test_flash_attention_resolves_per_device_and_precision(
    device: str, precision: str, switch: str, flash: bool
) -> None:
    cfg = _validate(device, {"precision": precision, "flash_attention": switch})
    assert cfg.train.uses_flash_attention("mindspore", device) is flash
    assert cfg.train.uses_flash_attention("torch", device) is False


@pytest.mark.parametrize(
    "device,train,message",
    [
        (
            "cpu",
            {"precision": "bf16"},
            "train.precision='bf16' is not available on the mindspore backend yet (MindSpore has no bf16 "
            "kernels on CPU)",
        ),
        (
            "cpu",
            {"precision": "fp16", "flash_attention": "on"},
            "train.flash_attention=on needs device: ascend (FlashAttentionScore "
            "has no cpu kernel): set train.flash_attention: auto (or off)",
        ),
        ("ascend", {"flash_attention": "on"}, "train.flash_attention=on needs train.precision fp16 or bf16"),
    ],
)
def test_ascend_only_settings_are_refused_elsewhere(device: str, train: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _validate(device, train)
    assert message in str(err.value)


def _validate(device: str, train: dict):
    """The tiny config on the MindSpore engine for `device`, with `train` overrides, validated."""
    tree = tiny_config().model_dump(mode="json")
    tree.update(device=device, backend="mindspore")
    tree["train"].update(train)
    return validate(tree)


def test_bf16_on_ascend_is_a_valid_config() -> None:
    cfg = _validate("ascend", {"precision": "bf16"})
    assert cfg.train.precision == "bf16" and cfg.train.uses_flash_attention(cfg.backend, cfg.device)


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_flash_masks_hide_what_the_additive_mask_hides(objective: str) -> None:
    ms = pytest.importorskip("mindspore")
    from mindfoundry.backends.base import create_backend
    from mindfoundry.backends.mindspore.model import FLASH_CAUSAL_MASK, Transformer
    from mindfoundry.parallel.layout import launch_layout

    cfg = tiny_config(model={"objective": objective})
    spec = ModelSpec.from_config(cfg.model)
    create_backend(
        cfg, spec, launch_layout(cfg)
    )  # MindSpore's device and mode set as training sets them, before any kernel runs
    ids = np.random.default_rng(0).integers(2, 300, (2, 16)).astype(np.int32)
    ids[1, 11:] = PAD_ID
    for precision in ("fp16", "bf16"):
        model = Transformer(
            spec, precision, flash=True
        )  # builds on the CPU; FlashAttentionScore itself would need Ascend
        assert model.compute == {"fp16": ms.float16, "bf16": ms.bfloat16}[precision] and all(
            layer.attn.flash for layer in model.layers
        )
        _, _, flash = model.tables(ms.Tensor(ids))
        _, _, additive = Transformer(spec, precision).tables(ms.Tensor(ids))
        hidden = ~visible_keys(spec, ids)
        if objective == "clm":  # the kernel's compressed causal triangle (sparse_mode 2), whatever the length
            assert flash.shape == (FLASH_CAUSAL_MASK, FLASH_CAUSAL_MASK) and flash.dtype == ms.uint8
            assert np.array_equal(flash.asnumpy()[:16, :16].astype(bool), hidden[0])
            assert additive.shape == (
                2,
                spec.n_kv_heads,
                spec.n_heads // spec.n_kv_heads,
                16,
                16,
            )  # broadcast to the scores
            assert np.array_equal(additive.asnumpy() < -1e8, np.broadcast_to(hidden[:, None, None], additive.shape))
        else:  # the padding keys of each row, every position keeping itself (sparse_mode 0, (B, 1, S, S))
            assert flash.shape == (2, 1, 16, 16) and flash.dtype == ms.uint8
            assert np.array_equal(flash.asnumpy()[:, 0].astype(bool), hidden)
            assert np.array_equal(additive.asnumpy()[:, 0, 0] < -1e8, hidden)
    with pytest.raises(ValueError, match="FlashAttentionScore computes in float16 or bfloat16"):
        Transformer(spec, "fp32", flash=True)
