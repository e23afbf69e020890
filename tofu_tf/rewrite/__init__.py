"""Stage 4, rewrite: the plan -> a per-device Partition (`partition`) -> the emitted
GraphDef (`emit`, `collectives`, `nodedefs`, `schedule`); the bytes it moves, predicted
(`pricing`) and counted (`ledger`); its checks (`verify`) and measured memory (`memory`)."""
