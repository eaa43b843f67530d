"""De-duplication, below the job and the CLI: perceptual and exact hashes (:mod:`.hashes`), the near-duplicate
index and the keep rule (:mod:`.index`), and semantic de-duplication of embeddings (:mod:`.semantic`).

Pure functions over numpy arrays and decoded images: reading shards, running units and writing the ignore index
are the job's (:mod:`fgdata.jobs.dedup`)."""
