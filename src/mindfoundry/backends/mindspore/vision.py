"""The vision models as MindSpore Cells -- the mirror of backends/torch/vision.py: a ViT encoder and the MAE
decoder, with the parameter names and layouts of :mod:`mindfoundry.model.vision_spec` (Cell paths give the
names).

The mask arrives from the data layer as indices (:func:`mindfoundry.data.dataset.image_masking.mask_labels`), so
no random number is drawn here. Shapes in comments: B batch, L patches, K visible patches, C width, P values per patch.
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindfoundry.backends.mindspore.layers import Linear
from mindfoundry.model.vision_spec import TARGET_EPS, VisionSpec, position_embeddings


def _zeros(*shape: int, name: str) -> Parameter:
    return Parameter(Tensor(np.zeros(shape, dtype=np.float32)), name=name)


class Dense(Linear):
    """y = x W^T + b, W stored [out, in] (torch.nn.Linear's layout and names)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features)
        self.bias = _zeros(out_features, name="bias")

    def construct(self, x):
        return super().construct(x) + self.bias


class LayerNorm(nn.Cell):
    """torch.nn.LayerNorm's arithmetic and names: (x - mean) / sqrt(biased variance + eps) * weight + bias."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(width, dtype=np.float32)), name="weight")
        self.bias = _zeros(width, name="bias")
        self.eps = eps

    def construct(self, x):
        mean = x.mean(axis=-1, keep_dims=True)
        centred = x - mean
        var = (centred * centred).mean(axis=-1, keep_dims=True)
        return centred / ops.sqrt(var + self.eps) * self.weight + self.bias


class Attention(nn.Cell):
    """Multi-head self-attention over all tokens, q/k/v/o projections with biases."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, 1.0 / float(np.sqrt(width // heads))
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (Dense(width, width) for _ in range(4))
        self.bmm, self.bmm_t = ops.BatchMatMul(), ops.BatchMatMul(transpose_b=True)

    def _split(self, y):
        b, t, c = y.shape
        return y.reshape(b, t, self.heads, c // self.heads).transpose(0, 2, 1, 3)

    def construct(self, x):
        b, t, c = x.shape
        scores = self.bmm_t(self._split(self.q_proj(x)), self._split(self.k_proj(x))) * self.scale
        out = self.bmm(ops.softmax(scores, axis=-1), self._split(self.v_proj(x)))
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, t, c))


class MLP(nn.Cell):
    def __init__(self, width: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = Dense(width, ffn), Dense(ffn, width)

    def construct(self, x):
        return self.fc2(ops.gelu(self.fc1(x), approximate="none"))


class Block(nn.Cell):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, width: int, heads: int, ffn: int, eps: float):
        super().__init__()
        self.norm1, self.attn = LayerNorm(width, eps), Attention(width, heads)
        self.norm2, self.mlp = LayerNorm(width, eps), MLP(width, ffn)

    def construct(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _gather_rows(x, index):
    """x[b, index[b, k], :] for every b, k: (B, K, C) from (B, L, C) and (B, K) int32."""
    return ops.gather_elements(x, 1, ops.broadcast_to(index.expand_dims(-1), (index.shape[0], index.shape[1],
                                                                              x.shape[-1])))


class VisionEncoder(nn.Cell):
    """The ViT: patch embedding (a conv of stride p), fixed position embeddings, the cls token first."""

    def __init__(self, spec: VisionSpec):
        super().__init__()
        c = spec.d_model
        self.patch_embed = nn.Conv2d(spec.channels, c, spec.patch_size, stride=spec.patch_size, pad_mode="valid",
                                     has_bias=True)
        self.cls_token = _zeros(1, 1, c, name="cls_token")
        self.layers = nn.CellList([Block(c, spec.n_heads, spec.ffn_dim, spec.norm_eps) for _ in range(spec.n_layers)])
        self.norm = LayerNorm(c, spec.norm_eps)
        self.pos = Tensor(position_embeddings(c, spec.grid))  # (1 + L, C) constant, not a parameter

    def construct(self, pixels, keep=None):
        """(B, 1 + K, C) features of the visible patches ``keep`` (B, K) -- all patches when None."""
        return self.norm(self.blocks_output(pixels, keep))

    def blocks_output(self, pixels, keep=None):
        """The last block's (B, 1 + K, C) outputs, before the final norm (what a captioner reads, as LLaVA does)."""
        x = self.patch_embed(pixels)  # (B, C, h, w)
        b, c = x.shape[0], x.shape[1]
        x = x.reshape(b, c, -1).transpose(0, 2, 1) + self.pos[1:]  # (B, L, C)
        if keep is not None:
            x = _gather_rows(x, keep)
        cls = ops.broadcast_to(self.cls_token + self.pos[:1], (b, 1, c))
        x = ops.concat((cls, x), axis=1)
        for layer in self.layers:
            x = layer(x)
        return x


class MAEDecoder(nn.Cell):
    """The light decoder (see backends/torch/vision.py)."""

    def __init__(self, spec: VisionSpec):
        super().__init__()
        cd = spec.decoder_d_model
        self.embed = Dense(spec.d_model, cd)
        self.mask_token = _zeros(1, 1, cd, name="mask_token")
        self.layers = nn.CellList([Block(cd, spec.decoder_heads, spec.decoder_ffn_dim, spec.norm_eps)
                                   for _ in range(spec.decoder_layers)])
        self.norm = LayerNorm(cd, spec.norm_eps)
        self.pred = Dense(cd, spec.patch_dim)
        self.pos = Tensor(position_embeddings(cd, spec.grid))

    def construct(self, latent, restore):
        """(B, L, P) predictions for every patch, from the encoder's (B, 1 + K, C) and ``restore`` (B, L)."""
        x = self.embed(latent)
        b, visible, cd = x.shape
        hidden = ops.broadcast_to(self.mask_token, (b, restore.shape[1] + 1 - visible, cd))
        patches = _gather_rows(ops.concat((x[:, 1:], hidden), axis=1), restore)
        x = ops.concat((x[:, :1], patches), axis=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.pred(self.norm(x))[:, 1:]


def patchify(pixels, patch: int):
    """(B, 3, H, W) -> (B, L, p*p*3): patches in row order, each its rows, then columns, then channels."""
    b, c, h, w = pixels.shape
    x = pixels.reshape(b, c, h // patch, patch, w // patch, patch).transpose(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


def normalised_target(patches):
    """Each patch minus its mean, over the square root of its unbiased variance + eps (MAE's)."""
    mean = patches.mean(axis=-1, keep_dims=True)
    centred = patches - mean
    var = (centred * centred).sum(axis=-1, keepdims=True) / (patches.shape[-1] - 1)
    return centred / ops.sqrt(var + TARGET_EPS)


class MAE(nn.Cell):
    """Masked autoencoder: the summed squared error of the predicted normalised pixels on the masked patches, and
    their number (see backends/torch/vision.py)."""

    def __init__(self, spec: VisionSpec):
        super().__init__()
        self.patch, self.kept = spec.patch_size, spec.kept
        self.vision, self.mae = VisionEncoder(spec), MAEDecoder(spec)

    def blocks(self) -> list[Block]:
        """The transformer blocks, encoder's then decoder's (recompute's units)."""
        return [*self.vision.layers, *self.mae.layers]

    def construct(self, pixels, labels):
        keep, restore = labels[:, :self.kept], labels[:, self.kept:]
        pred = self.mae(self.vision(pixels, keep), restore)
        diff = pred - normalised_target(patchify(pixels, self.patch))
        error = (diff * diff).mean(axis=-1)  # (B, L)
        masked = (restore >= self.kept).astype(error.dtype)
        return (error * masked).sum(), masked.sum()


class MAELossCell(nn.Cell):
    """The MAE's summed error times ``scale`` (1 / the masked patches of the global batch): the train step's loss."""

    def __init__(self, model: MAE):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, pixels, labels, scale):
        error, _ = self.model(pixels, labels)
        return error * scale
