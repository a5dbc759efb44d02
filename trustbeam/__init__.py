"""trustbeam: long-term trust scoring and collaborator selection, as a stream-processing job."""

__version__ = "0.1.0"
