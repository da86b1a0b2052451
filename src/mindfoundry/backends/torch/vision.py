"""The vision models as torch Modules -- the mirror of backends/mindspore/vision.py: a ViT encoder and the MAE
decoder, with the parameter names and layouts of :mod:`mindfoundry.model.vision_spec` (module paths give the
names).

The mask arrives from the data layer as indices (:func:`mindfoundry.data.dataset.image_masking.mask_labels`): the
encoder gathers the visible patches, the decoder puts every token back in place, so no random number is drawn here.

Shapes in comments: B batch, L patches, K visible patches, C width, P values per patch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mindfoundry.backends.torch.model import recomputable
from mindfoundry.model.vision_spec import TARGET_EPS, VisionSpec, position_embeddings


class Attention(nn.Module):
    """Multi-head self-attention over all tokens, q/k/v/o projections with biases."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, width: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, ffn), nn.Linear(ffn, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, width: int, heads: int, ffn: int, eps: float):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(width, eps=eps), Attention(width, heads)
        self.norm2, self.mlp = nn.LayerNorm(width, eps=eps), MLP(width, ffn)
        self.recompute_all = False  # memory.recompute: keep only the block's input, run it again in the backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return recomputable(self._forward, self.recompute_all, x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionEncoder(nn.Module):
    """The ViT: patch embedding (a conv of stride p), fixed position embeddings, the cls token first."""

    def __init__(self, spec: VisionSpec):
        super().__init__()
        c = spec.d_model
        self.patch_embed = nn.Conv2d(spec.channels, c, spec.patch_size, stride=spec.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        self.layers = nn.ModuleList(Block(c, spec.n_heads, spec.ffn_dim, spec.norm_eps) for _ in range(spec.n_layers))
        self.norm = nn.LayerNorm(c, eps=spec.norm_eps)
        self.register_buffer("pos", torch.from_numpy(position_embeddings(c, spec.grid)), persistent=False)

    def forward(self, pixels: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """(B, 1 + K, C) features of the visible patches ``keep`` (B, K) -- all patches when None."""
        return self.norm(self.blocks_output(pixels, keep))

    def blocks_output(self, pixels: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The last block's (B, 1 + K, C) outputs, before the final norm (what a captioner reads, as LLaVA does)."""
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2) + self.pos[1:]  # (B, L, C)
        if keep is not None:
            x = torch.gather(x, 1, keep.long().unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        cls = (self.cls_token + self.pos[:1]).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1)
        for layer in self.layers:
            x = layer(x)
        return x


class MAEDecoder(nn.Module):
    """The light decoder: the encoder's tokens narrowed, mask tokens where patches were hidden, every token put
    back in place, then blocks and a linear prediction of each patch's normalised pixels."""

    def __init__(self, spec: VisionSpec):
        super().__init__()
        cd = spec.decoder_d_model
        self.embed = nn.Linear(spec.d_model, cd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, cd))
        self.layers = nn.ModuleList(Block(cd, spec.decoder_heads, spec.decoder_ffn_dim, spec.norm_eps)
                                    for _ in range(spec.decoder_layers))
        self.norm = nn.LayerNorm(cd, eps=spec.norm_eps)
        self.pred = nn.Linear(cd, spec.patch_dim)
        self.register_buffer("pos", torch.from_numpy(position_embeddings(cd, spec.grid)), persistent=False)

    def forward(self, latent: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        """(B, L, P) predictions for every patch, from the encoder's (B, 1 + K, C) and ``restore`` (B, L)."""
        x = self.embed(latent)
        hidden = self.mask_token.expand(x.shape[0], restore.shape[1] + 1 - x.shape[1], -1)
        patches = torch.cat([x[:, 1:], hidden], dim=1)
        patches = torch.gather(patches, 1, restore.long().unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        x = torch.cat([x[:, :1], patches], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.pred(self.norm(x))[:, 1:]


def image_features(encoder: VisionEncoder, pixels: torch.Tensor) -> torch.Tensor:
    """(B, C): the encoder over every patch, the mean of its patch tokens after the final norm (a probe's features)."""
    return encoder(pixels)[:, 1:].mean(dim=1)


def patchify(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, 3, H, W) -> (B, L, p*p*3): patches in row order, each its rows, then columns, then channels."""
    b, c, h, w = pixels.shape
    x = pixels.reshape(b, c, h // patch, patch, w // patch, patch)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(b, (h // patch) * (w // patch), patch * patch * c)


def normalised_target(patches: torch.Tensor) -> torch.Tensor:
    """Each patch minus its mean over its values, over the square root of their unbiased variance + eps (MAE's)."""
    mean = patches.mean(dim=-1, keepdim=True)
    var = patches.var(dim=-1, keepdim=True)
    return (patches - mean) / (var + TARGET_EPS) ** 0.5


class MAE(nn.Module):
    """Masked autoencoder: the loss is the squared error of the predicted normalised pixels on the masked patches
    (each patch's error the mean over its values), summed, with the number of masked patches: the trainer divides by
    the global batch's count, as it does for tokens."""

    def __init__(self, spec: VisionSpec):
        super().__init__()
        self.spec = spec
        self.vision, self.mae = VisionEncoder(spec), MAEDecoder(spec)

    def blocks(self) -> list[Block]:
        """The transformer blocks, encoder's then decoder's (FSDP's and recompute's units)."""
        return [*self.vision.layers, *self.mae.layers]

    def forward(self, pixels: torch.Tensor,
                labels: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(summed error over the masked patches, their number) for pixels (B, 3, H, W) and the mask ``labels``
        (B, K + L): the visible patches, then each patch's place; without labels, :func:`image_features` (through
        the forward, so that FSDP's hooks gather the weights)."""
        if labels is None:
            return image_features(self.vision, pixels)
        kept = self.spec.kept
        keep, restore = labels[:, :kept].long(), labels[:, kept:].long()
        pred = self.mae(self.vision(pixels, keep), restore).float()
        error = ((pred - normalised_target(patchify(pixels, self.spec.patch_size))) ** 2).mean(dim=-1)  # (B, L)
        masked = (restore >= kept).float()
        return (error * masked).sum(), masked.sum()
