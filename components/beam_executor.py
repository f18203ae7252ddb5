"""Our TFX Beam executors on a local runner: no copy of TFX packaged for workers that already import it.

TFX's ``BaseBeamExecutor`` prepares a step's Beam options when it is constructed. Unless the options say how the
workers get their Python packages (an SDK image, a setup or requirements file, extra packages), it copies the
installed TFX (about 50 MB) into a new temporary directory, builds a source package of it there, adds that as
``--extra_package`` and never removes the directory. That serves remote workers. The DirectRunner's workers (the
local runner's threads and processes) import TFX from this very environment and install nothing, so on it the
package was only cost: every local pipeline run left one such directory per Beam step in the system's
temporary directory, and spent seconds of a step building it.

``InstalledTfxOnLocalRunners`` keeps TFX's preparation for every other runner (on Dataflow the compiled steps
name their SDK image, so none is built there either) and on a local runner hands the options to Beam as they
were given. Left out with the package on a local runner: TFX's GCP telemetry labels (read by Dataflow only) and
its parsing of the Beam options as absl flags, which none of our steps reads.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

# Beam's runners that run the workers in this process or in processes started from this environment.
LOCAL_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "FnApiRunner")


def runs_locally(beam_args: Sequence[str]) -> bool:
    """Whether Beam options choose a local runner (Beam's default when they name none)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    runner = PipelineOptions(list(beam_args)).view_as(StandardOptions).runner
    return runner is None or runner in LOCAL_RUNNERS or runner.lower() == "direct"


class InstalledTfxOnLocalRunners:
    """Mixin for a TFX Beam executor (before it in the bases): on a local runner, its Beam options are used as
    given, without the TFX package TFX would build for remote workers (see the module's docstring)."""

    def __init__(self, context=None):
        beam_args = getattr(context, "beam_pipeline_args", None)
        if not beam_args or not runs_locally(beam_args):
            super().__init__(context)
            return
        without_args = copy.copy(context)
        without_args.beam_pipeline_args = None  # TFX prepares no options it is not given
        super().__init__(without_args)
        self._beam_pipeline_args = list(beam_args)
