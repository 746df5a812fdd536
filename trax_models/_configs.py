"""Frozen, jax-free configuration dataclasses for every model in the zoo.

Each config describes one model size plus the synthetic batch it trains on.
Configs are plain data so that the registry (and ``trax_models.names()``)
can be imported without importing jax.
"""

from __future__ import annotations

import dataclasses
import numbers


def check_device_count(devices: object, *, expected: str = "an int >= 1") -> int:
    """Returns ``devices`` when it is an int >= 1 (a bool is not a count).

    Args:
      devices: the value to check.
      expected: what the caller takes, for the message.

    Raises:
      TypeError: for anything but an int.
      ValueError: for an int below 1.
    """
    expected = f"devices: expected {expected}"
    if isinstance(devices, bool) or not isinstance(devices, numbers.Integral):
        raise TypeError(f"{expected}, got {type(devices).__name__} {devices!r}")
    if devices < 1:
        raise ValueError(f"{expected}, got {devices}")
    return int(devices)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """How large the global batch is.

    Attributes:
      global_batch: Fixed global batch size; ``None`` means
        ``per_device_batch * devices``.
      per_device_batch: Examples per device when ``global_batch`` is ``None``.
    """

    global_batch: int | None = None
    per_device_batch: int = 2

    def batch_for(self, devices: int) -> int:
        """Returns the global batch for ``devices`` data-parallel devices.

        Raises:
          TypeError: if ``devices`` is not an int.
          ValueError: if ``devices`` is below 1 or does not divide the global batch.
        """
        devices = check_device_count(devices)
        if self.global_batch is None:
            return self.per_device_batch * devices
        if self.global_batch % devices:
            raise ValueError(
                f"global batch {self.global_batch} is not divisible by the devices "
                f"count {devices}; use a devices count that divides {self.global_batch}"
            )
        return self.global_batch


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerLMConfig(BatchConfig):
    """Decoder-only Transformer language model (trax ``TransformerLM``)."""

    vocab_size: int
    d_model: int
    d_ff: int
    n_heads: int
    n_layers: int
    seq_len: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(BatchConfig):
    """Encoder-decoder Transformer (trax ``Transformer``)."""

    vocab_size: int
    d_model: int
    d_ff: int
    n_heads: int
    n_encoder_layers: int
    n_decoder_layers: int
    seq_len: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertConfig(BatchConfig):
    """BERT encoder with a masked-language-model head."""

    vocab_size: int
    d_model: int
    d_ff: int
    n_heads: int
    n_layers: int
    seq_len: int
    mask_rate: float = 0.15


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResNetConfig(BatchConfig):
    """Bottleneck ResNet with GroupNorm (no batch statistics)."""

    stage_sizes: tuple[int, ...]
    width: int
    image_size: int
    channels: int = 3
    num_classes: int
    norm_groups: int = 32


@dataclasses.dataclass(frozen=True, kw_only=True)
class VGGConfig(BatchConfig):
    """VGG: stages of 3x3 convolutions, max pooling, then dense layers.

    Attributes:
      stages: ``(n_convs, features)`` per stage; each stage ends in a 2x2 pool.
    """

    stages: tuple[tuple[int, int], ...]
    fc_width: int
    image_size: int
    channels: int = 3
    num_classes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNNLMConfig(BatchConfig):
    """LSTM language model (trax ``RNNLM``)."""

    vocab_size: int
    d_model: int
    n_layers: int
    seq_len: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLPConfig(BatchConfig):
    """Deep, narrow MLP classifier: many small gradient tensors."""

    n_layers: int
    width: int
    in_features: int
    num_classes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTConfig(BatchConfig):
    """Vision Transformer: patch embedding, a class token, pre-norm encoder blocks."""

    image_size: int
    patch_size: int
    channels: int = 3
    d_model: int
    d_ff: int
    n_heads: int
    n_layers: int
    num_classes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPT2Config(BatchConfig):
    """GPT-2 style decoder whose identical layers run in one ``lax.scan`` (a while loop in HLO)."""

    vocab_size: int
    d_model: int
    d_ff: int
    n_heads: int
    n_layers: int
    seq_len: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class UNetConfig(BatchConfig):
    """U-Net for per-pixel classification: ``len(widths)`` down/up levels with skip concatenations.

    Attributes:
      widths: Convolution features per level, top to bottom; the last is the bottleneck.
    """

    image_size: int
    channels: int = 3
    widths: tuple[int, ...]
    num_classes: int = 2
    norm_groups: int = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoEConfig(BatchConfig):
    """Transformer LM whose feed-forward blocks are mixtures of experts (top-k routing).

    Attributes:
      n_experts: Experts per MoE block.
      top_k: Experts each token is routed to.
      capacity_factor: Expert capacity as a multiple of the even share ``top_k * tokens / n_experts``.
    """

    vocab_size: int
    d_model: int
    d_ff: int
    n_heads: int
    n_layers: int
    seq_len: int
    n_experts: int = 8
    top_k: int = 2
    capacity_factor: float = 1.25


ModelConfig = (
    TransformerLMConfig
    | TransformerConfig
    | BertConfig
    | ResNetConfig
    | VGGConfig
    | RNNLMConfig
    | MLPConfig
    | ViTConfig
    | GPT2Config
    | UNetConfig
    | MoEConfig
)
