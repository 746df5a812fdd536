"""The model zoo's names, presets and configs; importable without jax."""

from __future__ import annotations

import types

from trax_models._configs import (
    BertConfig,
    GPT2Config,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    ResNetConfig,
    RNNLMConfig,
    TransformerConfig,
    TransformerLMConfig,
    UNetConfig,
    VGGConfig,
    ViTConfig,
)

PRESETS: tuple[str, ...] = ("tiny", "small", "paper")
# How a zoo step is written (trax_models.make_train_step's ``style``): explicit collectives in
# shard_map, the same collectives in jax.pmap over arguments with a leading device axis, or
# jax.jit over sharded arguments that XLA's SPMD partitioner reduces, or that jax.jit step with its
# parameters and optimizer state sharded too (FSDP / ZeRO on a ("data", "fsdp") mesh).
STYLES: tuple[str, ...] = ("shard_map", "pmap", "gspmd", "fsdp")
OPTIMIZERS: tuple[str, ...] = ("adam", "adamw", "sgd")

# name -> module (relative to this package) defining ``task(config) -> Task``.
_MODULES: dict[str, str] = {
    "bert": "trax_models._bert",
    "gpt2": "trax_models._gpt2",
    "moe": "trax_models._moe",
    "unet": "trax_models._unet",
    "vit": "trax_models._vit",
    "mlp": "trax_models._mlp",
    "resnet50": "trax_models._resnet",
    "rnnlm": "trax_models._rnnlm",
    "transformer": "trax_models._transformer",
    "transformer_lm": "trax_models._transformer_lm",
    "vgg19": "trax_models._vgg",
}

# tiny: compiles in seconds, batch 2 per device.  small: 20-500 ms per step on
# 8 virtual CPU devices.  paper: the sizes the Disco paper evaluated (lower only).
_CONFIGS: dict[str, dict[str, ModelConfig]] = {
    "transformer_lm": {
        "tiny": TransformerLMConfig(
            vocab_size=64, d_model=32, d_ff=64, n_heads=2, n_layers=2, seq_len=16
        ),
        "small": TransformerLMConfig(
            vocab_size=1024, d_model=128, d_ff=512, n_heads=4, n_layers=2,
            seq_len=64, global_batch=16,
        ),
        "paper": TransformerLMConfig(
            vocab_size=32000, d_model=512, d_ff=2048, n_heads=8, n_layers=6,
            seq_len=128, global_batch=48,
        ),
    },
    "transformer": {
        "tiny": TransformerConfig(
            vocab_size=64, d_model=32, d_ff=64, n_heads=2, n_encoder_layers=2,
            n_decoder_layers=2, seq_len=16,
        ),
        "small": TransformerConfig(
            vocab_size=1024, d_model=128, d_ff=512, n_heads=4, n_encoder_layers=2,
            n_decoder_layers=2, seq_len=32, global_batch=16,
        ),
        "paper": TransformerConfig(
            vocab_size=32000, d_model=512, d_ff=2048, n_heads=8, n_encoder_layers=6,
            n_decoder_layers=6, seq_len=128, global_batch=48,
        ),
    },
    "bert": {
        "tiny": BertConfig(
            vocab_size=64, d_model=32, d_ff=64, n_heads=2, n_layers=2, seq_len=16
        ),
        "small": BertConfig(
            vocab_size=1024, d_model=128, d_ff=512, n_heads=4, n_layers=2,
            seq_len=64, global_batch=16,
        ),
        "paper": BertConfig(
            vocab_size=30522, d_model=768, d_ff=3072, n_heads=12, n_layers=12,
            seq_len=128, global_batch=48,
        ),
    },
    "resnet50": {
        "tiny": ResNetConfig(
            stage_sizes=(1, 1), width=8, image_size=16, num_classes=10, norm_groups=4
        ),
        "small": ResNetConfig(
            stage_sizes=(1, 1, 1, 1), width=16, image_size=32, num_classes=10,
            norm_groups=8, global_batch=16,
        ),
        "paper": ResNetConfig(
            stage_sizes=(3, 4, 6, 3), width=64, image_size=224, num_classes=1000,
            global_batch=32,
        ),
    },
    "vgg19": {
        "tiny": VGGConfig(
            stages=((1, 4), (1, 8)), fc_width=16, image_size=16, num_classes=10
        ),
        "small": VGGConfig(
            stages=((2, 8), (2, 16), (4, 32), (4, 64), (4, 64)), fc_width=256,
            image_size=32, num_classes=10, global_batch=16,
        ),
        "paper": VGGConfig(
            stages=((2, 64), (2, 128), (4, 256), (4, 512), (4, 512)), fc_width=4096,
            image_size=224, num_classes=1000, global_batch=48,
        ),
    },
    "rnnlm": {
        "tiny": RNNLMConfig(vocab_size=64, d_model=32, n_layers=2, seq_len=16),
        "small": RNNLMConfig(
            vocab_size=1024, d_model=128, n_layers=2, seq_len=32, global_batch=16
        ),
        "paper": RNNLMConfig(
            vocab_size=32000, d_model=512, n_layers=2, seq_len=64, global_batch=128
        ),
    },
    # The models people train now; paper: the sizes their reference papers train.
    "vit": {
        "tiny": ViTConfig(
            image_size=16, patch_size=4, d_model=32, d_ff=64, n_heads=2, n_layers=2, num_classes=10
        ),
        "small": ViTConfig(
            image_size=32, patch_size=4, d_model=128, d_ff=512, n_heads=4, n_layers=4,
            num_classes=10, global_batch=16,
        ),
        "paper": ViTConfig(  # ViT-S/16 at 224x224
            image_size=224, patch_size=16, d_model=384, d_ff=1536, n_heads=6, n_layers=12,
            num_classes=1000, global_batch=64,
        ),
    },
    "gpt2": {
        "tiny": GPT2Config(vocab_size=64, d_model=32, d_ff=128, n_heads=2, n_layers=2, seq_len=16),
        "small": GPT2Config(
            vocab_size=1024, d_model=128, d_ff=512, n_heads=4, n_layers=4, seq_len=64,
            global_batch=16,
        ),
        "paper": GPT2Config(  # GPT-2 small (124M)
            vocab_size=50257, d_model=768, d_ff=3072, n_heads=12, n_layers=12, seq_len=1024,
            global_batch=8,
        ),
    },
    "unet": {
        "tiny": UNetConfig(image_size=16, widths=(8, 16), norm_groups=4),
        "small": UNetConfig(image_size=32, widths=(16, 32, 64), global_batch=16),
        "paper": UNetConfig(image_size=256, widths=(64, 128, 256, 512, 1024), global_batch=16),
    },
    "moe": {
        "tiny": MoEConfig(vocab_size=64, d_model=32, d_ff=64, n_heads=2, n_layers=2, seq_len=16),
        "small": MoEConfig(
            vocab_size=1024, d_model=128, d_ff=256, n_heads=4, n_layers=2, seq_len=64,
            global_batch=16,
        ),
        "paper": MoEConfig(
            vocab_size=32000, d_model=512, d_ff=2048, n_heads=8, n_layers=6, seq_len=128,
            global_batch=48,
        ),
    },
    "mlp": {
        "tiny": MLPConfig(n_layers=8, width=16, in_features=16, num_classes=10),
        "small": MLPConfig(
            n_layers=48, width=128, in_features=128, num_classes=10, global_batch=64
        ),
        "paper": MLPConfig(
            n_layers=48, width=128, in_features=128, num_classes=10, global_batch=256
        ),
    },
}


def names() -> list[str]:
    """Returns the model names of the zoo, sorted.

    Example:
      >>> import trax_models
      >>> trax_models.names()[:2]
      ['bert', 'mlp']
    """
    return sorted(_MODULES)


def presets() -> tuple[str, ...]:
    """Returns the preset names: ``("tiny", "small", "paper")``."""
    return PRESETS


def check_name(name: str) -> None:
    """Raises ``ValueError`` unless ``name`` is a zoo model."""
    if not isinstance(name, str) or name not in _MODULES:
        raise ValueError(
            f"unknown model {name!r}; expected one of: {', '.join(names())}"
        )


def check_preset(preset: str) -> None:
    """Raises ``ValueError`` unless ``preset`` is a known preset."""
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(
            f"unknown preset {preset!r}; expected one of: {', '.join(PRESETS)}"
        )


def check_optimizer(optimizer: str) -> None:
    """Raises ``ValueError`` unless ``optimizer`` is supported."""
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ValueError(
            f"unknown optimizer {optimizer!r}; expected one of: {', '.join(OPTIMIZERS)}"
        )


def config(name: str, preset: str = "tiny") -> ModelConfig:
    """Returns the frozen config of model ``name`` at ``preset``.

    Raises:
      ValueError: for an unknown model or preset.
    """
    check_name(name)
    check_preset(preset)
    return _CONFIGS[name][preset]


def model_module(name: str) -> types.ModuleType:
    """Imports (lazily) and returns the module that builds model ``name``."""
    import importlib

    check_name(name)
    return importlib.import_module(_MODULES[name])
