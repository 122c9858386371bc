"""The syntax of what a command (or a script) hands the API, checked before anything is touched:
a training script and its arguments, a run's `-e`/`--env-file`, a shape request, a trace's steps.
Each raises ConfigError or LabError (exit 2) with the value given and what is allowed."""

from __future__ import annotations

from labctl.k8s.export import KINDS as MANIFEST_KINDS  # `k8s export --kind`
from labctl.net.overlay import CHOICES as OVERLAYS  # `up`, `cost`, `scenario run` --overlay
from labctl.net.tc import check_to, parse_shape_request
from labctl.run.launch import job_args, parse_script_args
from labctl.run.userenv import build_user_env
from labctl.trace.breakdown import STEPS_ALLOWED, parse_steps

__all__ = ["MANIFEST_KINDS", "OVERLAYS", "build_user_env", "check_to", "job_args", "parse_script_args", "parse_shape_request", "parse_steps", "STEPS_ALLOWED"]
