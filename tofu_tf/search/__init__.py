"""Stage 3, search: the coarse graph (`coarsen`), one cut's problem and costs (`problem`,
`level`, `cost`, `dp`), the recursion over a Topology (`recursive`), the Plan (`plan`);
baselines, the exact ILP check, the memory estimate and the step-time simulator beside it."""
