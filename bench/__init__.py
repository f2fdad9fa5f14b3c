"""aistack's benchmarks, each run as ``python -m bench.NAME``.

Every benchmark measures aistack against a peer in the same run and ends with
``NAME: ratio R (goal G)`` lines (``bench.harness.ratio_line``); higher is
always better. What they share lives in ``bench.harness`` (the output format,
the infra, child processes, round order) and ``bench.services`` (aistack's
services started as deployed, for the benchmarks that measure them).

Nothing is imported here: ``bench.serving``'s spawned client processes import
this package, and they must stay free of aistack's own protobuf contracts.
"""
