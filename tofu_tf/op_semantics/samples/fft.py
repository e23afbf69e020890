"""Samples for ops/fft.py: every transform on a batch of rows, planes or volumes."""

import tensorflow as tf

from tofu_tf.op_semantics.samples import arg, const, sample

# Inner sizes unlike the leading ones: the loose-region oracle (tools/validate.py) cuts an
# input dim as long as a split one, which the raw real transforms would abort on.
SHAPES = {1: (4, 3, 8), 2: (5, 6, 4), 3: (2, 4, 3, 4)}
for op_type, n in {"FFT": 1, "IFFT": 1, "FFT2D": 2, "IFFT2D": 2, "FFT3D": 3,
                   "IFFT3D": 3}.items():
    fn = getattr(tf.raw_ops, op_type)
    sample(op_type, f"rank {len(SHAPES[n])}", lambda x, fn=fn: fn(input=x),
           arg(SHAPES[n], "complex64"))
# The raw kernels take fft_length equal to the input's inner dims (tf.signal crops or pads
# before them; TensorFlow's kernel aborts on a mismatch).
for op_type, n in {"RFFT": 1, "RFFT2D": 2, "RFFT3D": 3}.items():
    fn = getattr(tf.raw_ops, op_type)
    sample(op_type, f"rank {len(SHAPES[n])}",
           lambda x, length, fn=fn: fn(input=x, fft_length=length),
           arg(SHAPES[n]), const(list(SHAPES[n][-n:]), "int32"))
for op_type, n in {"IRFFT": 1, "IRFFT2D": 2, "IRFFT3D": 3}.items():
    fn = getattr(tf.raw_ops, op_type)
    sample(op_type, "half spectrum", lambda x, length, fn=fn: fn(input=x, fft_length=length),
           arg(SHAPES[n][:-1] + (SHAPES[n][-1] // 2 + 1,), "complex64"),
           const(list(SHAPES[n][-n:]), "int32"))
