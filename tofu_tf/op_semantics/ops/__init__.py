"""op_semantics/ops."""
