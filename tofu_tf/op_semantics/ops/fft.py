"""Fourier transforms: FFT, IFFT, FFT2D, IFFT2D, FFT3D, IFFT3D and the real ones (RFFT,
IRFFT, RFFT2D, IRFFT2D, RFFT3D, IRFFT3D); their gradients are transforms too (FNet mixes
its tokens with FFT2D).

An n-D transform's every output element mixes every element of the input's innermost n
dims: those stay whole (a part of them is no transform of a part), and the leading dims
split, each part transforming its own rows with the op's own kernel (and fft_length).
"""

from __future__ import annotations

from tofu_tf.op_semantics.helpers import whole_inner
from tofu_tf.op_semantics.registry import semantics

TRANSFORMS = {"FFT": 1, "IFFT": 1, "FFT2D": 2, "IFFT2D": 2, "FFT3D": 3, "IFFT3D": 3}
REAL_TRANSFORMS = {"RFFT": 1, "IRFFT": 1, "RFFT2D": 2, "IRFFT2D": 2, "RFFT3D": 3,
                   "IRFFT3D": 3}
REASON = "{op} mixes every element of its innermost {n} dims: a part of them is no {op}"


@semantics(*TRANSFORMS, *REAL_TRANSFORMS)
def fourier(ctx):
    """y[lead, f] = transform(x[lead, :, ..]) at frequency (or position) f."""
    x = ctx.inputs[0]
    if ctx.type in REAL_TRANSFORMS:
        ctx.const(1)                                    # fft_length
    n = {**TRANSFORMS, **REAL_TRANSFORMS}[ctx.type]
    whole_inner(ctx, [x], n, REASON.format(op=ctx.type, n=n))
