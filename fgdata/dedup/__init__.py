"""De-duplication, below the CLI: perceptual and exact hashes (:mod:`.hashes`), the near-duplicate
index and the keep rule (:mod:`.index`), and semantic de-duplication of embeddings (:mod:`.semantic`).

Those are pure functions over numpy arrays and decoded images; the command's job (:mod:`.job`) reads the shards,
runs through the job core's one driver (run_job) and writes the ignore index. The job core knows nothing of it."""
