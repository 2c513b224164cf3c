"""RenderOptions' defaults (domain/manifest.py says what they mean) on their own, so
that the settings can name them without importing the renderer, which pulls in the
TrainingJob models and PyYAML."""

from __future__ import annotations

GPU_RESOURCE = "nvidia.com/gpu"
ACCELERATOR_LABEL = "accelerator"
# The audience of the ServiceAccount token a Job's Pods report with (RenderOptions).
TOKEN_AUDIENCE = "kubetrain"  # noqa: S105 - an audience, not a secret
