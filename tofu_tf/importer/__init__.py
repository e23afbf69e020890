"""Stage 1, import: a GraphDef or a concrete function -> the planner Graph (graph.py).

`graphdef_io` is the entry; `_inline` inlines function calls, `_fold` folds small constant
subgraphs, `_normalise` rewrites forwarding ops, `_structure` and `_gradients` tag the
forward, backward and update parts; `tf_attrs` converts TensorFlow attributes (also used by
the emitter and the validator)."""
