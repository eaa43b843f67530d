"""The one job core every writing command runs through (shard, encode, kd, prepare).

Each guarantee lives in exactly one module here:

- :mod:`fgdata.jobs.dest`: the destination: one lock per DST, private temporary files
  (``O_EXCL|O_NOFOLLOW``, unpredictable names, inside DST), stale temporaries and staging of a
  killed job removed on the next run, and files fgdata did not write refused unless ``--overwrite``;
- :mod:`fgdata.jobs.options`: the resume fingerprint, from each command's frozen options
  dataclass (only options that change output bytes); a rerun with other options is refused
  with a message naming the option;
- :mod:`fgdata.jobs.report`: the one failure report, ``failures.json``
  (``command, seen, written, failed, failures: [{input, reason}]``), written atomically;
- :mod:`fgdata.jobs.signals`: SIGINT/SIGTERM stop the workers, leave only complete outputs and
  end with ``interrupted: N inputs done; rerun the same command to resume`` (exit 130/143);
- :mod:`fgdata.jobs.local`, :mod:`fgdata.jobs.ranks`, :mod:`fgdata.jobs.ray_executor`: the three
  executors (process pool, torchrun ranks, Ray); Ray tasks are declared in that last module only;
- :mod:`fgdata.jobs.testhook`: ``FGDATA_TEST_STOP_AFTER``, the point kill tests stop a job at, and
  ``FGDATA_TEST_HOLD``, named points where a test holds one rank to order two ranks' steps; only the job core
  calls it, producers outside it (prepare, fid-refs) through :mod:`fgdata.jobs.outputs`;
- :mod:`fgdata.jobs.shard`: ``fgdata shard images|videos|prompts`` on top of all of that.

Nothing is imported here, so low layers (the shard writer) can use :mod:`fgdata.jobs.dest`
without import cycles.
"""
