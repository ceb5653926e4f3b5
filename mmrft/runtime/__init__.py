"""The runtime layer: how a run holds its processes, devices and state.

What it is: processes and sharding (:mod:`.distributed`: rank and world, collectives, FSDP2,
the gathered state of a sharded model; :mod:`.zero`: DeepSpeed ZeRO-2/3 inside mmrft's loop),
the run directory's files written atomically (:mod:`.checkpoint`: checkpoints, trainer state,
RNG state, ``failure.json``), and the device and seeds of a process (:mod:`.device`).

It sits right above the base because every layer above needs it: the policy gathers sharded
weights for the engines, the collector saves and restores RNG state, run logs merge metrics over
processes, the trainer shards and checkpoints.

May import: the base only. Exports: its modules (``from mmrft.runtime import distributed``).
"""
