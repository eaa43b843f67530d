"""The one job core every writing command runs through: :func:`fgdata.jobs.driver.run_job`.

**Writing a command on it.** A command is one small module, next to its own code (``fgdata/sharding/job.py``
for ``shard``, ``fgdata/encode/tasks.py`` for ``encode``/``kd``), that subclasses
:class:`fgdata.jobs.driver.JobDefinition` and calls ``run_job(definition, settings)``:

- ``command`` and ``dest`` (attributes), ``folder`` (its markers' folder under DST, :func:`fgdata.jobs.units.units_dir`),
  ``owns_dest`` (False: DST is a folder shared with other files, a data root, where nothing is called foreign and
  the definition checks the outputs it names);
- ``fingerprint()``: the options that change bytes (:func:`fgdata.jobs.options.fingerprint` of its options dataclass);
- ``plan() -> Iterator[unit]``: its units, streamed, each with a ``number`` and an ``inputs`` fingerprint (the
  shard command's :class:`fgdata.jobs.units.Unit`, or any dataclass of its own);
- ``execute(pending, executor, ctx) -> Iterator[Marker]``: run the pending units (the driver has already kept
  what the resume rule keeps and dropped other ranks' units), usually ``run_units(produce, calls, executor,
  shared)`` whose ``produce(shared, call)`` runs one unit (``call`` and ``shared``: typed values, the unit itself
  or the command's frozen dataclasses) and whose sink writes its outputs under names fixed by the unit and
  leaves its :class:`fgdata.jobs.units.Marker` (:func:`fgdata.jobs.units.start_unit` first, the marker last);
- optional hooks, all typed: ``start`` (checks before DST is taken), ``prepare`` (under DST's lock: foreign
  files, the job record), ``launch``, ``redo``, ``met``/``keep``/``redoing``/``planned`` (resume bookkeeping),
  ``unit_outputs`` (what a kept unit's marker is checked against: by default DST's shards), ``executor``
  (default: what the settings name), ``count`` (the command's own figures from each marker), ``sweep``,
  ``report_fields`` (``failures.json``'s own fields, a :class:`fgdata.jobs.report.ReportFields`), ``write_final`` (the job's final files from the markers: by
  default ``shard_count.json`` and ``failures.json``), ``finish`` (its side files: provenance, stats),
  ``summarize`` (its own figures, the typed ``payload`` of the :class:`fgdata.jobs.summary.JobSummary`) and ``finished`` (closing notices).

:class:`fgdata.jobs.driver.RunSettings` is how every job runs (engine, workers, resume, overwrite, wait timeout,
the progress and notice callbacks of :mod:`fgdata.progress`); it never changes the bytes. ``run_job`` owns the
rest: DST's lock, signals, unit ownership per torchrun rank, the one resume rule, rank 0's wait, the spool,
finalize (by default ``shard_count.json``, ``failures.json``), the sweep and the summary. Each call is noted in the file
``FGDATA_TEST_RUN_JOB_CALLS`` names (tests: every writing command runs through it).

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
  ``FGDATA_TEST_LOADS``, a file every model load appends to; only :mod:`fgdata.jobs.outputs` calls it (the
  driver, the sinks and producers outside the core report there);
- :mod:`fgdata.jobs.provenance`: ``provenance.json``, one entry per command that wrote into DST.

Nothing is imported here, so importing one module of the job core does not import the others.
"""
