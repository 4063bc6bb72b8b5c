"""Registers the ``sandfork`` sandbox type with inspect-ai (loaded through the
``inspect_ai`` entry point, or by importing :mod:`inspect_sandfork`)."""

from __future__ import annotations

from inspect_ai.util import sandboxenv

from ._environment import SANDBOX_TYPE, SandforkSandboxEnvironment

sandboxenv(name=SANDBOX_TYPE)(SandforkSandboxEnvironment)
