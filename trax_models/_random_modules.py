"""The flax modules of :mod:`trax_models._random`'s networks, built from a drawn spec.

Written from flax's generic layers only (``nn.Dense``, ``nn.Conv``, ``nn.GroupNorm``,
``nn.LayerNorm``, ``nn.MultiHeadDotProductAttention``, ``nn.RNN`` with an LSTM or GRU cell,
``nn.Embed``); the routed experts are written out here (dense one-hot dispatch, as GShard
describes it).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trax_models._task import Task, cross_entropy, labelled_images, progression_tokens

_ACT = {"relu": nn.relu, "gelu": nn.gelu, "tanh": jnp.tanh, "silu": nn.silu}


class DenseStack(nn.Module):
    spec: dict[str, Any]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = _ACT[self.spec["activation"]]
        for w in self.spec["widths"]:
            x = nn.Dense(w)(x)
            if self.spec["layernorm"]:
                x = nn.LayerNorm()(x)
            x = act(x)
        return nn.Dense(self.spec["classes"])(x)


class ConvStack(nn.Module):
    spec: dict[str, Any]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.spec
        act = _ACT[s["activation"]]
        for st in s["stages"]:
            k, f = st["kernel"], st["features"]
            if st["down"] == "max":
                x = nn.max_pool(x, (2, 2), (2, 2))
            elif st["down"] == "avg":
                x = nn.avg_pool(x, (2, 2), (2, 2))
            for b in range(st["blocks"]):
                stride = 2 if st["down"] == "stride" and b == 0 else 1
                y = nn.Conv(f, (k, k), strides=(stride, stride), use_bias=not s["norm_groups"])(x)
                if s["norm_groups"]:
                    y = nn.GroupNorm(num_groups=math.gcd(s["norm_groups"], f))(y)
                y = act(y)
                x = x + y if st["residual"] and y.shape == x.shape else y
        return nn.Dense(s["classes"])(jnp.mean(x, axis=(1, 2)))


class BottleneckStack(nn.Module):
    """A stem convolution, then stages of bottleneck blocks (1x1, kxk strided, 1x1 to 4x the width)
    with a projected shortcut where the shape changes."""

    spec: dict[str, Any]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.spec
        act = _ACT[s["activation"]]
        groups = s["norm_groups"]

        def conv(y: jax.Array, f: int, k: int, stride: int = 1) -> jax.Array:
            y = nn.Conv(f, (k, k), strides=(stride, stride), use_bias=not groups)(y)
            return nn.GroupNorm(num_groups=math.gcd(groups, f))(y) if groups else y

        k0 = s["stem"]
        x = act(conv(x, s["stages"][0]["features"], k0, 2 if k0 == 7 else 1))
        for st in s["stages"]:
            f = st["features"]
            for b in range(st["blocks"]):
                stride = 2 if st["down"] == "stride" and b == 0 else 1
                y = act(conv(x, f, 1))
                y = act(conv(y, f, st["kernel"], stride))
                y = conv(y, 4 * f, 1)
                shortcut = conv(x, 4 * f, 1, stride) if (stride != 1 or x.shape[-1] != 4 * f) else x
                x = act(y + shortcut)
        return nn.Dense(s["classes"])(jnp.mean(x, axis=(1, 2)))


class Experts(nn.Module):
    """Top-k routed feed-forward experts over ``[batch, length, d]`` (dense one-hot dispatch)."""

    experts: int
    top_k: int
    d_ff: int
    capacity_factor: float
    activation: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        tokens = x.reshape(b * t, d)
        n, e, k = b * t, self.experts, self.top_k
        capacity = max(1, math.ceil(self.capacity_factor * k * n / e))
        probs = jax.nn.softmax(nn.Dense(e, use_bias=False)(tokens))
        gates, chosen = jax.lax.top_k(probs, k)
        mask = jax.nn.one_hot(chosen, e, dtype=jnp.int32)  # [n, k, e]
        slot = jnp.cumsum(mask.reshape(n * k, e), axis=0).reshape(n, k, e) - 1
        slot = jnp.sum(slot * mask, axis=-1)  # [n, k]
        keep = (slot < capacity)[..., None, None]
        dispatch = (mask[..., None] * jax.nn.one_hot(slot, capacity)[:, :, None, :]) * keep  # [n, k, e, c]
        combine = jnp.sum(dispatch * gates[..., None, None], axis=1)
        expert_in = jnp.einsum("nec,nd->ecd", jnp.sum(dispatch, axis=1), tokens)
        w1 = self.param("w1", nn.initializers.lecun_normal(), (e, d, self.d_ff))
        w2 = self.param("w2", nn.initializers.lecun_normal(), (e, self.d_ff, d))
        h = _ACT[self.activation](jnp.einsum("ecd,edf->ecf", expert_in, w1))
        out = jnp.einsum("nec,ecd->nd", combine, jnp.einsum("ecf,efd->ecd", h, w2))
        return out.reshape(b, t, d)


class Encoder(nn.Module):
    """Pre-LayerNorm attention blocks over ``[batch, length, d_model]``; MLP or routed experts."""

    spec: dict[str, Any]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.spec
        act = _ACT[s.get("activation", "gelu")]
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32)) if s.get("causal") else None
        for _ in range(s["layers"]):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=s["heads"])(h, h, mask=mask)
            h = nn.LayerNorm()(x)
            if "experts" in s:
                x = x + Experts(s["experts"], s["top_k"], s["d_ff"], s["capacity_factor"],
                                s.get("activation", "gelu"))(h)
            else:
                x = x + nn.Dense(s["d_model"])(act(nn.Dense(s["mlp_dim"])(h)))
        return nn.LayerNorm()(x)


class LanguageModel(nn.Module):
    """Tokens -> embedding -> encoder (attention or recurrent) -> logits over the vocabulary."""

    spec: dict[str, Any]

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        s = self.spec
        if "cell" in s:  # recurrent
            x = nn.Embed(s["vocab"], s["embed"])(tokens)
            for _ in range(s["layers"]):
                # A zero carry derived from ``x`` has ``x``'s type under shard_map (varying over devices).
                zeros = jnp.zeros((x.shape[0], s["hidden"]), x.dtype) + 0 * x[:, 0, :1]
                if s["cell"] == "lstm":
                    x = nn.RNN(nn.OptimizedLSTMCell(s["hidden"]))(x, initial_carry=(zeros, zeros))
                else:
                    x = nn.RNN(nn.GRUCell(s["hidden"]))(x, initial_carry=zeros)
        else:
            x = nn.Embed(s["vocab"], s["d_model"])(tokens)
            x = x + self.param("pos", nn.initializers.normal(0.02), (s["seq"], s["d_model"]))
            x = Encoder(s)(x)
        return nn.Dense(s["vocab"])(x)


class VisionEncoder(nn.Module):
    spec: dict[str, Any]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        s = self.spec
        p = s["patch"]
        x = nn.Conv(s["d_model"], (p, p), strides=(p, p))(x)
        b, h, w, d = x.shape
        x = x.reshape(b, h * w, d) + self.param("pos", nn.initializers.normal(0.02), (h * w, d))
        x = Encoder({**s, "causal": False})(x)
        return nn.Dense(s["classes"])(jnp.mean(x, axis=1))


def task(family: str, spec: dict[str, Any]) -> Task:
    """The Task of a drawn network: its loss on synthetic data of the spec's shapes."""
    if family == "mlp":
        model: nn.Module = DenseStack(spec)

        def init(key: jax.Array):
            return model.init(key, np.zeros((1, spec["in_features"]), np.float32))

        def loss(params, batch):
            return cross_entropy(model.apply(params, batch["inputs"]), batch["labels"])

        def make_batch(rng: np.random.Generator, global_batch: int):
            return {"inputs": rng.standard_normal((global_batch, spec["in_features"]), dtype=np.float32),
                    "labels": rng.integers(0, spec["classes"], size=(global_batch,)).astype(np.int32)}

        return Task(init=init, loss=loss, make_batch=make_batch)
    if family in ("cnn", "vit", "resnet"):
        model = {"cnn": ConvStack, "vit": VisionEncoder, "resnet": BottleneckStack}[family](spec)

        def init(key: jax.Array):
            return model.init(key, np.zeros((1, spec["image"], spec["image"], spec["channels"]), np.float32))

        def loss(params, batch):
            return cross_entropy(model.apply(params, batch["images"]), batch["labels"])

        def make_batch(rng: np.random.Generator, global_batch: int):
            return labelled_images(rng, batch=global_batch, size=spec["image"], channels=spec["channels"],
                                   num_classes=spec["classes"])

        return Task(init=init, loss=loss, make_batch=make_batch)
    model = LanguageModel(spec)  # transformer, moe, rnn: next-token prediction

    def init(key: jax.Array):
        return model.init(key, np.zeros((1, spec["seq"]), np.int32))

    def loss(params, batch):
        tokens = batch["tokens"]
        return cross_entropy(model.apply(params, tokens[:, :-1]), tokens[:, 1:])

    def make_batch(rng: np.random.Generator, global_batch: int):
        return {"tokens": progression_tokens(rng, batch=global_batch, length=spec["seq"] + 1,
                                             vocab_size=spec["vocab"])}

    return Task(init=init, loss=loss, make_batch=make_batch)
