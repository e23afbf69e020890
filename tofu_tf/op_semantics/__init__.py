"""op_semantics."""
