"""Tools beside the pipeline: op coverage (`coverage`), strategies run on real shards
(`validate`), the first op where a partitioned step differs (`debug`), Keras models trained
side by side (`zoo`), random graphs (`fuzz`), plan reports (`report`)."""
