"""Random numbers: every random op is kept whole (opaque), with the reason.

A random op's values are a function of the whole output shape: a stateful kernel draws its
stream for all elements from its own generator state, and a stateless kernel numbers the
elements of the whole shape from the seed's counter. A part's kernel, given a smaller
shape, would draw different numbers, so no split of these ops reproduces the unsplit op.
What consumes the numbers (dropout's compare, select and scale) is element-wise and splits.
"""

from __future__ import annotations

from tofu_tf.op_semantics.registry import opaque

STATEFUL = ("RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
            "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
            "NonDeterministicInts")
GENERATOR_STATE = ("StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
                   "StatefulStandardNormal", "StatefulStandardNormalV2",
                   "StatefulTruncatedNormal", "StatefulRandomBinomial", "RngSkip",
                   "RngReadAndSkip")
STATELESS = ("StatelessRandomUniform", "StatelessRandomNormal", "StatelessTruncatedNormal",
             "StatelessRandomUniformInt", "StatelessRandomUniformFullInt",
             "StatelessRandomUniformV2", "StatelessRandomNormalV2",
             "StatelessTruncatedNormalV2", "StatelessRandomUniformIntV2",
             "StatelessRandomUniformFullIntV2", "StatelessRandomBinomial",
             "StatelessRandomGammaV2", "StatelessRandomGammaV3", "StatelessRandomPoisson",
             "StatelessParameterizedTruncatedNormal")
SEEDS = ("StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg",
         "StatelessRandomGetAlg")
SAMPLING = ("RandomShuffle", "StatelessShuffle", "Multinomial", "StatelessMultinomial",
            "RandomCrop")

opaque(*STATEFUL, family=__name__,
       reason="random numbers change when the op is split: the kernel draws the stream for "
              "the whole shape from its own generator state")
opaque(*GENERATOR_STATE, family=__name__,
       reason="reads and advances a generator state shared by the whole graph: the numbers "
              "depend on the whole shape and on the order of every draw")
opaque(*STATELESS, family=__name__,
       reason="random numbers change when the op is split: each value is a function of the "
              "seed and of its position in the whole shape, and a part's kernel would "
              "number its elements from zero")
opaque(*SEEDS, family=__name__,
       reason="derives the generator key, counter or algorithm from a seed: a few values, "
              "computed whole")
opaque(*SAMPLING, family=__name__,
       reason="draws a random permutation, crop or sample over the whole tensor: a part "
              "would draw from its share only")
