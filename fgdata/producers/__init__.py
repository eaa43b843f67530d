"""Per-item producers: pure, picklable functions that turn one input into the members to write.

They run in pool workers, torchrun ranks and Ray tasks alike, so each reads its own input and
returns plain data; the job core (:mod:`fgdata.jobs`) decides where and in which order.

- :mod:`fgdata.producers.media`: ``shard images|videos|prompts`` (one work item -> samples);
- :mod:`fgdata.producers.transcode`: video clips (stream copy or exact re-encode);
- :mod:`fgdata.producers.camera`: camera tracks for ``fgdata camera estimate``.

The model-based producers (latents, text embeddings, KD teachers) live in :mod:`fgdata.encode`,
and the dataset-zip crops in :mod:`fgdata.prepare`.
"""
