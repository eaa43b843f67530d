"""``fgdata shard images|videos|prompts``: the job definition (:mod:`fgdata.sharding.job`) that reads inputs from
:mod:`fgdata.sources`, transforms them with :mod:`fgdata.producers` and runs on the one driver,
:func:`fgdata.jobs.driver.run_job`. Nothing is imported here."""
