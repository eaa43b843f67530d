"""The one job core every writing command runs through (shard, encode, kd, prepare).

Each guarantee lives in exactly one module here:

- :mod:`fgdata.jobs.dest`: the destination: one lock per DST, stale temporaries
  (:mod:`fgdata.storage.temps`) and staging of a killed job removed on the next run, and files fgdata did
  not write refused unless ``--overwrite``;
- :mod:`fgdata.jobs.units`: work units: inputs streamed in fixed-size units, each writing its shards under
  names fixed by the unit and leaving a typed marker; the one resume rule, rank 0's wait for the other
  ranks' markers, the spool and the streamed finalize (counts, ``failures.json``, stats) and the sweep of
  what no unit claims;
- :mod:`fgdata.jobs.summary`: the one summary a job returns, which the CLI renders for every command;
- :mod:`fgdata.jobs.options`: the resume fingerprint, from each command's frozen options
  dataclass (every field but those declared ``RUNTIME``); a rerun with other options is refused
  with a message naming the option;
- :mod:`fgdata.jobs.report`: the one failure report, ``failures.json``
  (``command, seen, written, failed, failures: [{input, reason}]``), written atomically;
- :mod:`fgdata.jobs.signals`: SIGINT/SIGTERM stop the workers, leave only complete outputs and
  end with ``interrupted: N inputs done; rerun the same command to resume`` (exit 130/143);
- :mod:`fgdata.jobs.executor`: ``run_units``, the one call that runs a command's work units on the executor
  the library chose: a local process pool (:mod:`fgdata.jobs.local`) or Ray (:mod:`fgdata.jobs.ray_executor`,
  the only module that declares Ray tasks); under torchrun (:mod:`fgdata.jobs.ranks`) each rank runs the
  units it owns on its own pool;
- :mod:`fgdata.jobs.testhook`: ``FGDATA_TEST_STOP_AFTER``, the point kill tests stop a job at, and
  ``FGDATA_TEST_HOLD``, named points where a test holds one rank to order two ranks' steps, and
  ``FGDATA_TEST_LOADS``, a file every model load appends to; only the job core calls it, producers outside it
  (prepare, fid-refs, the model loader) through :mod:`fgdata.jobs.outputs`;
- :mod:`fgdata.jobs.shard`: ``fgdata shard images|videos|prompts`` on top of all of that: its producer (the
  media transform) and sink (one unit's shards), and the choice of executor;
- :mod:`fgdata.jobs.tasks`: the shard-to-shard commands (``encode``, ``kd``): one task (an input shard) per
  unit, its sink (one output shard, in place or not) and the choice of executor.

Nothing is imported here, so importing one module of the job core does not import the others.
"""
