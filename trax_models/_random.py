"""Randomly drawn networks: a corpus of training steps for the per-kernel cost model.

A kernel cost model learns from profiled kernels; the zoo's 11 models give a few thousand
distinct kernels at two sizes each, so a GNN trained on them prices the GEMMs, convolutions and
reductions of a model it has not seen poorly (``docs/results.md``). As TVM's Tenset does for
its cost model, this module draws networks at random, built from the layer types the zoo's
models are made of: dense stacks, convolution stacks, bottleneck residual stages, attention
encoders and decoders, routed mixtures of experts, recurrent cells, and patch-embedding vision
encoders, at random widths,
depths, batch and sequence sizes, activations and normalisations. They are written here from
flax's generic layers (none of the zoo's modules is reused), so a zoo model held out of a
cost model's training never has its own configuration in the corpus.

A random network is named ``random_<family>_<seed>`` (``FAMILIES``); the name alone fixes it,
so every machine builds the same one: ``trax_models.make_train_step("random_cnn_7", "paper")``.
Presets scale it: ``paper`` for a GPU (steps of a few to tens of milliseconds on an H100),
``small`` and ``tiny`` for the CPU (tests).

Example::

    names = random_names(40, seed=0)             # families in turn
    step, (state, batch) = make_train_step(names[0], "tiny", devices=1)
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np

# Append only: a family's index seeds its draws, so reordering would change what every name means
# (the recorded corpus, gnn/data/h100_random_kernels_*, holds names).
FAMILIES: tuple[str, ...] = ("mlp", "cnn", "transformer", "moe", "rnn", "vit", "resnet")
# Width and batch scale per preset (``paper`` is the GPU scale the draws are written for).
_SCALE = {"paper": 1.0, "small": 0.25, "tiny": 1 / 16}
_NAME = re.compile(r"^random_([a-z]+)_([0-9]+)$")


@dataclasses.dataclass(frozen=True)
class RandomNet:
    """One drawn network: its family, seed, preset, global batch and sizes (JSON-able)."""

    name: str
    family: str
    seed: int
    preset: str
    global_batch: int
    spec: dict[str, Any]

    def batch_for(self, devices: int) -> int:
        """The global batch on ``devices`` data-parallel devices: the drawn batch rounded down to a
        multiple of them (at least one example a device)."""
        return max(devices, self.global_batch // devices * devices)


def is_random(name: object) -> bool:
    """Whether ``name`` names a random network (``random_<family>_<seed>``, family in ``FAMILIES``)."""
    m = _NAME.match(name) if isinstance(name, str) else None
    return bool(m) and m.group(1) in FAMILIES


def random_names(n: int, seed: int = 0, families: tuple[str, ...] = FAMILIES) -> list[str]:
    """``n`` network names, the families in turn, seeds ``seed, seed + 1, ...``.

    Raises:
      ValueError: for ``n`` below 1, a negative seed, or an unknown family.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        raise ValueError(f"families: {bad or 'none'} not known; expected some of {', '.join(FAMILIES)}")
    return [f"random_{families[i % len(families)]}_{seed + i}" for i in range(n)]


def draw(name: str, preset: str = "paper") -> RandomNet:
    """The network ``name`` at ``preset``: a pure function of the two.

    Raises:
      ValueError: for a name that is not ``random_<family>_<seed>`` or an unknown preset.
    """
    if not is_random(name):
        raise ValueError(f"{name!r} is not a random network's name; expected random_<family>_<seed> with family "
                         f"one of {', '.join(FAMILIES)}")
    if preset not in _SCALE:
        raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(_SCALE)}")
    m = _NAME.match(name)
    family, seed = m.group(1), int(m.group(2))
    # One stream per (family, seed): the preset only scales what was drawn.
    rng = np.random.default_rng([FAMILIES.index(family), seed])
    spec, batch = _DRAWS[family](rng)
    s = _SCALE[preset]
    spec = _scaled(spec, s)
    batch = max(2, int(round(batch * math.sqrt(s))) // 2 * 2)
    return RandomNet(name=name, family=family, seed=seed, preset=preset, global_batch=batch, spec=spec)


def task(net: RandomNet):  # noqa: ANN201 (a trax_models Task; flax is imported here)
    """The :class:`trax_models._task.Task` of ``net`` (flax modules built from its spec)."""
    from trax_models import _random_modules as M

    return M.task(net.family, net.spec)


# --------------------------------------------------------------------------------------- draws
def _dim(rng: np.random.Generator, lo: int, hi: int, mult: int) -> int:
    """Log-uniform in [lo, hi], rounded to a multiple of ``mult``."""
    v = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return max(mult, int(round(v / mult)) * mult)


def _choice(rng: np.random.Generator, options: tuple, p: tuple[float, ...] | None = None) -> Any:
    return options[int(rng.choice(len(options), p=p))]


# Spec keys that are widths (scaled by the preset); the rest (depths, kernels, strides, choices) are not.
_WIDTHS = {"in_features", "widths", "features", "d_model", "mlp_dim", "vocab", "classes", "hidden", "embed",
           "d_ff"}


def _scaled(spec: dict[str, Any], s: float) -> dict[str, Any]:
    def one(v: int) -> int:
        return max(8, int(round(v * s / 8)) * 8)

    out = {}
    for k, v in spec.items():
        if k in _WIDTHS:
            out[k] = [one(x) for x in v] if isinstance(v, list) else one(v)
        elif k == "seq" or k == "image":
            out[k] = max(8, int(round(v * math.sqrt(s) / 8)) * 8)
        elif k == "stages":
            out[k] = [{**st, "features": one(st["features"])} for st in v]
        else:
            out[k] = v
    if "heads" in out and "d_model" in out:  # heads must divide the scaled width
        out["heads"] = math.gcd(out["heads"], out["d_model"]) or 1
    if "image" in out and "patch" in out:
        out["patch"] = max(1, min(out["patch"], out["image"] // 2))
        out["image"] = out["image"] // out["patch"] * out["patch"]
    return out


def _draw_mlp(rng: np.random.Generator) -> tuple[dict[str, Any], int]:
    layers = int(rng.integers(2, 9))
    spec = {"in_features": _dim(rng, 64, 2048, 32), "widths": [_dim(rng, 128, 4096, 64) for _ in range(layers)],
            "activation": _choice(rng, ("relu", "gelu", "tanh", "silu")), "layernorm": bool(rng.random() < 0.3),
            "classes": _dim(rng, 10, 1000, 10)}
    return spec, _dim(rng, 64, 2048, 32)


def _draw_cnn(rng: np.random.Generator) -> tuple[dict[str, Any], int]:
    image = _choice(rng, (32, 56, 64, 96, 112, 128))
    batch = max(4, int(2 ** rng.uniform(15, 20) / image ** 2) // 4 * 4)
    features = _dim(rng, 16, 128, 16)
    stages = []
    for i in range(int(rng.integers(2, 6))):
        stages.append({"features": features * 2 ** i, "blocks": int(rng.integers(1, 4)),
                       "kernel": _choice(rng, (1, 3, 5, 7), (0.25, 0.55, 0.1, 0.1)),
                       "down": _choice(rng, ("stride", "max", "avg")) if i else "none",
                       "residual": bool(rng.random() < 0.5)})
    spec = {"image": image, "channels": 3, "stages": stages, "norm_groups": _choice(rng, (0, 8, 16, 32)),
            "activation": _choice(rng, ("relu", "gelu", "silu")), "classes": _dim(rng, 10, 1000, 10)}
    return spec, batch


def _draw_transformer(rng: np.random.Generator) -> tuple[dict[str, Any], int]:
    seq = _choice(rng, (64, 128, 256, 512, 1024))
    d_model = _dim(rng, 128, 1024, 64)
    spec = {"seq": seq, "d_model": d_model, "heads": _choice(rng, (1, 2, 4, 8, 16)),
            "mlp_dim": d_model * _choice(rng, (2, 4)), "layers": int(rng.integers(1, 7)),
            "vocab": _dim(rng, 512, 32000, 8), "causal": bool(rng.random() < 0.6),
            "activation": _choice(rng, ("relu", "gelu"))}
    return spec, max(2, int(2 ** rng.uniform(11, 14.5) / seq) // 2 * 2)


def _draw_moe(rng: np.random.Generator) -> tuple[dict[str, Any], int]:
    spec, _ = _draw_transformer(rng)
    # Fewer tokens than a dense transformer's: the one-hot dispatch grows with tokens squared.
    batch = max(2, int(2 ** rng.uniform(10, 12.5) / spec["seq"]) // 2 * 2)
    spec.update({"experts": _choice(rng, (4, 8, 16)), "top_k": _choice(rng, (1, 2)),
                 "capacity_factor": _choice(rng, (1.0, 1.25, 2.0)), "layers": int(rng.integers(1, 4)),
                 "d_ff": spec.pop("mlp_dim")})
    return spec, batch


def _draw_rnn(rng: np.random.Generator) -> tuple[dict[str, Any], int]:
    spec = {"seq": _choice(rng, (16, 32, 64, 128)), "embed": _dim(rng, 64, 1024, 64),
            "hidden": _dim(rng, 128, 2048, 128), "layers": int(rng.integers(1, 4)),
            "cell": _choice(rng, ("lstm", "gru")), "vocab": _dim(rng, 512, 32000, 8)}
    return spec, _dim(rng, 8, 128, 8)


def _draw_vit(rng: np.random.Generator) -> tuple[dict[str, Any], int]:
    image = _choice(rng, (32, 64, 96, 128, 224))
    patch = _choice(rng, (4, 8, 16))
    while image // patch < 2:
        patch //= 2
    tokens = (image // patch) ** 2
    d_model = _dim(rng, 128, 768, 64)
    spec = {"image": image, "channels": 3, "patch": patch, "d_model": d_model,
            "heads": _choice(rng, (2, 4, 8, 12)), "mlp_dim": d_model * _choice(rng, (2, 4)),
            "layers": int(rng.integers(1, 7)), "classes": _dim(rng, 10, 1000, 10)}
    return spec, max(2, int(2 ** rng.uniform(10.5, 13.5) / tokens) // 2 * 2)


def _draw_resnet(rng: np.random.Generator) -> tuple[dict[str, Any], int]:
    """Bottleneck stages (1x1, kxk, 1x1 expanding by 4, projection shortcuts), as ResNet-50 builds them."""
    image = _choice(rng, (56, 64, 96, 112, 128, 224))
    batch = max(4, int(2 ** rng.uniform(16, 20.5) / image ** 2) // 4 * 4)
    features = _dim(rng, 16, 96, 16)
    stages = [{"features": features * 2 ** i, "blocks": int(rng.integers(1, 4)),
               "kernel": _choice(rng, (3, 5), (0.85, 0.15)), "down": "stride" if i else "none",
               "residual": True} for i in range(int(rng.integers(2, 5)))]
    spec = {"image": image, "channels": 3, "stem": _choice(rng, (3, 7)), "stages": stages, "bottleneck": True,
            "norm_groups": _choice(rng, (0, 16, 32)), "activation": _choice(rng, ("relu", "silu")),
            "classes": _dim(rng, 10, 1000, 10)}
    return spec, batch


_DRAWS = {"mlp": _draw_mlp, "cnn": _draw_cnn, "transformer": _draw_transformer, "moe": _draw_moe,
          "rnn": _draw_rnn, "vit": _draw_vit, "resnet": _draw_resnet}
