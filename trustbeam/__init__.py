"""trustbeam: long-term trust scoring and collaborator selection, as a stream-processing job.

The top floor: the command line composes every package below it and is imported by none of them
(only by the entry points in ``deploy/`` and by ``bench``/``tests``); see ``tests/test_layering.py``.
"""

__version__ = "0.1.0"
