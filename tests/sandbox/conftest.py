"""Helpers for the sandbox tests: most mechanisms need root (CI runs as root); where they are
unavailable the tests check the fallback the host uses instead."""

from __future__ import annotations

import os

import pytest

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching uids and making cgroups needs root")
