"""A simulator of the paper's setting: devices with hidden long-term behaviour issuing offloaded tasks.

``Simulator(SimConfig()).run([ParquetSink(dir)])`` writes events, status,
devices and the hidden truth; :meth:`simulator.world.World.expected` is the
oracle for any pair and slot.

Layer 4: imports ``schemas``, ``model`` (the physics has one home there) and ``exporters`` (publishing).
"""
