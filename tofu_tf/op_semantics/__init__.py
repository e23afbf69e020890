"""Stage 2, op semantics: TDL descriptions per op type (`ops/`), the interval analysis that
derives each op's strategies (`analysis`), local ops of a part (`localize`), the catalog of
a graph's ops (`catalog`)."""
