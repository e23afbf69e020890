"""GPT-style decoder-only transformer language model (pre-LayerNorm, causal self-attention).

    h = wte[x] + wpe                               (token gather + learned positions)
    per layer:  h = h + Wo(attention(LN1(h)))      (dense Q/K/V, heads split by reshape and
                                                    transpose, softmax(QK^T/sqrt(d) + mask) V)
                h = h + W2(gelu(W1(LN2(h))))       (exact GELU, inner width 4 * d_model)
    logits = LN_f(h) @ W_lm;  mean sparse softmax cross-entropy against y

The LM head is untied: `lm_head/kernel` [d_model, vocab] is its own variable, so every
variable gets its gradient from one path. The causal mask is input-independent: it is
built from two `tf.range`s and a comparison rather than stored as a seq_len^2 Const, so the
GraphDef stays small at any sequence length. x, y: int32 [batch, seq_len]; the floats
(weights, mask, activations) are the step dtype.
GPT-2 medium: layers 24, d_model 1024, heads 16, seq_len 1024, vocab 50257.

`dropout` (default 0: none) drops attention probabilities and the outputs of the attention
and MLP sublayers at that rate (`tf.nn.dropout` with fixed op seeds, so a graph draws the
same masks in every run; a RandomUniform op, kept whole by the partitioner: every device
draws the whole mask from the same seeds and keeps its part).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import tensorflow as tf

from tofu_tf.errors import TofuError
from tofu_tf.models import layers
from tofu_tf.models.builder import ModelDef, check_positive_int

DEFAULTS = {"layers": 2, "d_model": 32, "heads": 4, "seq_len": 16, "vocab": 64,
            "dropout": 0.0}
INIT_SCALE = 0.02
DROPOUT_SEED = 1000          # op seed of the first dropout; each next one adds 1


def normalize(sizes: dict) -> dict:
    rate = sizes["dropout"]
    sizes = {k: check_positive_int(f"transformer {k}", sizes[k])
             for k in DEFAULTS if k != "dropout"}
    if sizes["d_model"] % sizes["heads"]:
        raise TofuError(f"transformer heads={sizes['heads']} must divide "
                        f"d_model={sizes['d_model']}.")
    if not (isinstance(rate, (int, float)) and 0 <= rate < 1):
        raise TofuError(f"transformer dropout={rate!r} is not a rate in [0, 1).")
    return {**sizes, "dropout": float(rate)}


def dropout(sizes: dict, seeds):
    """Returns drop(t): `tf.nn.dropout` at the model's rate, each call its own op seed
    (from the iterator `seeds`); the identity at rate 0."""
    def drop(t):
        if not sizes["dropout"]:
            return t
        return tf.nn.dropout(t, rate=sizes["dropout"], seed=next(seeds))
    return drop


def causal_bias(seq_len: int, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """[seq_len, seq_len] of `dtype`: 0 where key <= query, -1e9 above the diagonal."""
    positions = tf.range(seq_len)
    allowed = tf.cast(positions[:, None] >= positions[None, :], dtype)
    return (allowed - 1.0) * 1e9


def self_attention(store, name: str, sizes: dict, batch_size: int, drop):
    """Returns apply(h, bias) for h of shape [batch * seq_len, d_model]."""
    d_model, heads, seq_len = sizes["d_model"], sizes["heads"], sizes["seq_len"]
    head_dim = d_model // heads
    q, k, v, out = (layers.dense(store, f"{name}/{p}", d_model, d_model, scale=INIT_SCALE)
                    for p in ("query", "key", "value", "output"))

    def split_heads(t):
        t = tf.reshape(t, [batch_size, seq_len, heads, head_dim])
        return tf.transpose(t, [0, 2, 1, 3])

    def apply(h, bias):
        scores = tf.matmul(split_heads(q(h)), split_heads(k(h)), transpose_b=True)
        scores = scores * (1.0 / math.sqrt(head_dim)) + bias
        context = tf.matmul(drop(tf.nn.softmax(scores, axis=-1)), split_heads(v(h)))
        context = tf.transpose(context, [0, 2, 1, 3])
        return out(tf.reshape(context, [batch_size * seq_len, d_model]))
    return apply


def decoder_block(store, name: str, sizes: dict, batch_size: int, drop):
    d_model = sizes["d_model"]
    norm1 = layers.layer_norm(store, f"{name}/ln1", d_model)
    attention = self_attention(store, f"{name}/attention", sizes, batch_size, drop)
    norm2 = layers.layer_norm(store, f"{name}/ln2", d_model)
    up = layers.dense(store, f"{name}/mlp_in", d_model, 4 * d_model, scale=INIT_SCALE)
    down = layers.dense(store, f"{name}/mlp_out", 4 * d_model, d_model, scale=INIT_SCALE)

    def apply(h, bias):
        h = h + drop(attention(norm1(h), bias))
        return h + drop(down(layers.gelu(up(norm2(h)))))
    return apply


def define(store, sizes: dict, batch_size: int):
    d_model, seq_len, vocab = sizes["d_model"], sizes["seq_len"], sizes["vocab"]
    token_embedding = store.get("wte", [vocab, d_model], INIT_SCALE)
    position_embedding = store.get("wpe", [seq_len, d_model], INIT_SCALE)
    drop = dropout(sizes, itertools.count(DROPOUT_SEED))
    # Layers draw dropout masks from seeds of their own: then no two layers are alike.
    key = None if sizes["dropout"] else ("decoder", d_model, sizes["heads"], seq_len,
                                        batch_size)
    blocks = [store.block(f"layer{i}", key, lambda i=i: decoder_block(
        store, f"layer{i}", sizes, batch_size, drop)) for i in range(sizes["layers"])]
    final_norm = layers.layer_norm(store, "ln_f", d_model)
    lm_head = store.get("lm_head/kernel", [d_model, vocab], INIT_SCALE)

    def loss_fn(x, y):
        h = tf.gather(token_embedding, x) + position_embedding
        h = tf.reshape(h, [batch_size * seq_len, d_model])
        bias = causal_bias(seq_len, store.dtype)
        for block in blocks:
            h = block(h, bias)
        logits = tf.matmul(final_norm(h), lm_head)
        labels = tf.reshape(y, [batch_size * seq_len])
        return layers.sparse_softmax_cross_entropy(logits, labels)
    return loss_fn


def inputs(sizes: dict, batch_size: int, dtype: str):
    shape = (batch_size, sizes["seq_len"])
    return (shape, "int32"), (shape, "int32")


def sample(sizes: dict, batch_size: int, dtype: str, rng: np.random.Generator):
    shape = (batch_size, sizes["seq_len"])
    return (rng.integers(0, sizes["vocab"], shape, dtype=np.int32),
            rng.integers(0, sizes["vocab"], shape, dtype=np.int32))


MODEL = ModelDef("transformer", DEFAULTS, normalize, define, inputs, sample)
