"""The optional C++ custom op of the cost model.

cost_op.cc   TofuRegionOverlaps: REGISTER_OP, shape function and CPU kernel
build.py     compiles it once per source and TF version into a cache dir
cost_op.py   `overlaps`: the op when it builds and loads, NumPy otherwise (same answers)

Nothing here is imported, and no library is built or loaded, by `import tofu_tf`.
"""
