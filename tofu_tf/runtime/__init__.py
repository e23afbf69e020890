"""Stage 5, run: sessions for an emitted step (`session`), its cluster (`cluster`),
checkpoints in the unpartitioned layout (`checkpoint`), and where a step's time goes
(`profile`, from TensorFlow's step stats)."""
