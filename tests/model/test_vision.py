"""The vision models (:mod:`mindfoundry.model.vision_spec`): the MAE loss of our torch and MindSpore modules on the
same weights, pixels and mask, against each other and against transformers' ViTMAEForPreTraining given our mask as
``noise``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mindfoundry.data.dataset.image_masking import mae_noise, mask_labels
from mindfoundry.model.vision_spec import VisionSpec, init_vision_weights, pixel_values, vision_parameter_shapes

SPEC = VisionSpec(image_size=32, patch_size=8, d_model=32, n_layers=2, n_heads=4, ffn_dim=64, decoder_d_model=16,
                  decoder_layers=1, decoder_heads=2, decoder_ffn_dim=32)
SITE = Path(np.__file__).parents[1]


def _batch() -> np.ndarray:
    """Four real images at 32 x 32 (the photos scikit-learn and matplotlib ship, resized)."""
    from PIL import Image

    paths = [SITE / "sklearn/datasets/images/china.jpg", SITE / "sklearn/datasets/images/flower.jpg",
             SITE / "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
             SITE / "matplotlib/mpl-data/sample_data/Minduka_Present_Blue_Pack.png"]
    return np.stack([np.asarray(Image.open(p).convert("RGB").resize((32, 32), Image.Resampling.BICUBIC))
                     for p in paths])


def _torch_loss(weights: dict[str, np.ndarray], pixels: np.ndarray, noise: np.ndarray,
                grads: bool = False) -> float | tuple[float, dict[str, np.ndarray]]:
    """Our torch MAE's loss (and, with ``grads``, each parameter's gradient) on ``weights``."""
    import torch

    from mindfoundry.backends.torch.vision import MAE

    model = MAE(SPEC)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    error, count = model(torch.from_numpy(pixel_values(pixels)), torch.from_numpy(mask_labels(noise, SPEC.kept)))
    loss = error / count
    if not grads:
        return float(loss.detach())
    loss.backward()
    return float(loss.detach()), {name: p.grad.numpy() for name, p in model.named_parameters()}


def test_the_mask_is_a_function_of_seed_and_position() -> None:
    noise = mae_noise(7, np.array([3, 4, 3]), SPEC.num_patches)
    assert np.array_equal(noise[0], noise[2]) and not np.array_equal(noise[0], noise[1])
    assert not np.array_equal(noise, mae_noise(7, np.array([3, 4, 3]), SPEC.num_patches, stream=1))
    labels = mask_labels(noise, SPEC.kept)
    keep, restore = labels[:, :SPEC.kept], labels[:, SPEC.kept:]
    masked = restore >= SPEC.kept
    assert SPEC.kept == 4 and keep.shape == (3, 4) and masked.sum(axis=1).tolist() == [12, 12, 12]
    visible = np.zeros_like(masked)
    np.put_along_axis(visible, keep.astype(np.int64), True, axis=1)
    assert np.array_equal(visible, ~masked)  # the kept patches are exactly the unmasked ones
    assert np.array_equal(np.take_along_axis(restore, keep.astype(np.int64), axis=1), np.tile(np.arange(4), (3, 1)))


def test_torch_mae_loss_equals_transformers_vitmae_given_our_mask_as_noise() -> None:
    import torch
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    from mindfoundry.checkpoint.hf_vision import vit_mae_config, vit_mae_weights

    weights = init_vision_weights(SPEC, seed=3)
    assert {k: v.shape for k, v in weights.items()} == vision_parameter_shapes(SPEC)
    pixels, noise = _batch(), mae_noise(11, np.arange(4), SPEC.num_patches)
    ours = _torch_loss(weights, pixels, noise)
    hf = ViTMAEForPreTraining(ViTMAEConfig(**vit_mae_config(SPEC))).eval()
    exported = vit_mae_weights(SPEC, weights)
    missing, unexpected = hf.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=False)
    assert not missing and not unexpected
    with torch.no_grad():
        theirs = float(hf(pixel_values=torch.from_numpy(pixel_values(pixels)), noise=torch.from_numpy(noise)).loss)
    assert 0.5 < ours < 3.0
    assert abs(ours - theirs) <= 1e-6 * abs(theirs), (ours, theirs)  # measured: equal


def test_mindspore_mae_loss_equals_torch_on_the_same_weights_and_mask() -> None:
    import mindspore as ms

    from mindfoundry.backends.mindspore.vision import MAE, MAELossCell

    weights = init_vision_weights(SPEC, seed=5)
    pixels, noise = _batch(), mae_noise(2, np.arange(10, 14), SPEC.num_patches)
    model = MAE(SPEC)
    assert {p.name: tuple(p.shape) for p in model.get_parameters()} == vision_parameter_shapes(SPEC)
    ms.load_param_into_net(model, {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in weights.items()}, strict_load=True)
    labels = ms.Tensor(mask_labels(noise, SPEC.kept))
    error, count = model(ms.Tensor(pixel_values(pixels)), labels)
    ours = float((error / count).asnumpy())
    theirs, torch_grads = _torch_loss(weights, pixels, noise, grads=True)
    assert abs(ours - theirs) <= 1e-6 * abs(theirs), (ours, theirs)  # measured: equal
    # the gradients too, in GRAPH mode as training compiles it
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        params = model.trainable_params()
        loss, grads = ms.value_and_grad(MAELossCell(model), None, params)(
            ms.Tensor(pixel_values(pixels)), labels, 1 / count)  # the train step's loss: the error over its count
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert abs(float(loss.asnumpy()) - theirs) <= 1e-6 * abs(theirs)
    # each gradient against the largest of any parameter: a key projection's bias has a zero gradient (a softmax
    # does not see a constant added to every key's score) which both engines leave as float32 noise
    scale = max(float(np.abs(g).max()) for g in torch_grads.values())
    errors = {p.name: float(np.abs(g.asnumpy() - torch_grads[p.name]).max())
              for p, g in zip(params, grads, strict=True)}
    # measured 3.1e-6 of the scale, at the cls token (its gradient gathers every token's attention to it over the
    # batch, summed in another order by each engine); every other parameter within 3e-7 of it
    assert max(errors.values()) <= 4e-6 * scale, (errors, scale)


def test_the_mae_size_and_flops_are_what_torch_counts() -> None:
    """The parameter count against torch's module and transformers' (less its two fixed position tables); the
    forward FLOPs against torch's FlopCounterMode on transformers' ViTMAE (the same arithmetic)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    from mindfoundry.backends.torch.vision import MAE
    from mindfoundry.checkpoint.hf_vision import vit_mae_config
    from mindfoundry.model.vision_spec import mae_flops_per_image, vision_num_parameters

    model = MAE(SPEC)
    assert vision_num_parameters(SPEC) == sum(p.numel() for p in model.parameters())
    hf = ViTMAEForPreTraining(ViTMAEConfig(**vit_mae_config(SPEC)))
    fixed = (1 + SPEC.num_patches) * (SPEC.d_model + SPEC.decoder_d_model)
    assert vision_num_parameters(SPEC) == sum(p.numel() for p in hf.state_dict().values()) - fixed
    # transformers' eager attention is plain matmuls, which the counter sees (torch's CPU sdpa kernel it does not)
    eager = ViTMAEForPreTraining(ViTMAEConfig(**vit_mae_config(SPEC), attn_implementation="eager")).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        eager(pixel_values=torch.from_numpy(pixel_values(_batch()[:2])),
              noise=torch.from_numpy(mae_noise(0, np.arange(2), SPEC.num_patches)))
    assert counter.get_total_flops() == 2 * mae_flops_per_image(SPEC)
