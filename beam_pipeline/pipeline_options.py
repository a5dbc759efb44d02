"""Beam's view of the job's options: :class:`TrustbeamOptions` beside Beam's own, and the flags they all know."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from beam_pipeline.options import add_job_arguments, spelled


class TrustbeamOptions(PipelineOptions):
    """trustbeam's pipeline options (:func:`beam_pipeline.options.add_job_arguments`; Beam's, such as ``--runner``,
    come beside them)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        add_job_arguments(parser)


def pipeline_flags() -> set[str]:
    """Every ``--flag`` a registered PipelineOptions view (Beam's and trustbeam's) accepts."""
    parser = _BeamArgumentParser(add_help=False, allow_abbrev=False, conflict_handler="resolve")
    pending, seen = [PipelineOptions], set()
    while pending:
        for view in pending.pop().__subclasses__():
            if view not in seen:
                seen.add(view)
                view._add_argparse_args(parser)
                pending.append(view)
    return {flag for action in parser._actions for flag in action.option_strings}


def checked_pipeline_args(args: list[str]) -> list[str]:
    """``args`` with each option spelled as its view declares it (``--lateness-slots`` -> ``--lateness_slots``);
    ValueError names an option no view knows (:func:`beam_pipeline.options.spelled`)."""
    return spelled(args, pipeline_flags())
