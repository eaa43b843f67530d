"""Per-sample scores (``fgdata score``): signals and the job that writes them beside the shards."""
