"""BERT: a Transformer encoder trained with a masked-language-model head."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from trax_models._configs import BertConfig
from trax_models._task import Task, cross_entropy, progression_tokens
from trax_models._transformer_layers import Embedding, EncoderBlock

MASK_TOKEN = 0


class Bert(nn.Module):
    """BERT encoder with an MLM head (``Dense -> GELU -> LayerNorm -> Dense``)."""

    config: BertConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        c = self.config
        x = Embedding(vocab_size=c.vocab_size, d_model=c.d_model, max_len=c.seq_len)(
            tokens
        )
        x = nn.LayerNorm(name="embedding_norm")(x)
        for _ in range(c.n_layers):
            x = EncoderBlock(n_heads=c.n_heads, d_ff=c.d_ff)(x)
        x = nn.LayerNorm(name="encoder_norm")(x)
        h = nn.LayerNorm(name="mlm_norm")(nn.gelu(nn.Dense(c.d_model, name="mlm_dense")(x)))
        return nn.Dense(c.vocab_size, name="mlm_logits")(h)


def task(config: BertConfig) -> Task:
    """Masked-token prediction: ``mask_rate`` of the tokens are replaced by 0."""
    model = Bert(config=config)

    def init(key: jax.Array):
        return model.init(key, np.zeros((1, config.seq_len), np.int32))

    def loss(params, batch):
        logits = model.apply(params, batch["inputs"])
        return cross_entropy(logits, batch["targets"], batch["weights"])

    def make_batch(rng: np.random.Generator, global_batch: int):
        tokens = progression_tokens(
            rng, batch=global_batch, length=config.seq_len,
            vocab_size=config.vocab_size,
        )
        masked = rng.random(tokens.shape) < config.mask_rate
        masked[:, 0] = True  # at least one prediction per sequence
        return {
            "inputs": np.where(masked, MASK_TOKEN, tokens).astype(np.int32),
            "targets": tokens,
            "weights": masked.astype(np.float32),
        }

    return Task(init=init, loss=loss, make_batch=make_batch)
