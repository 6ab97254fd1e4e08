"""Helpers for the sandbox tests: most mechanisms need root (CI runs as root); where they are
unavailable the tests check the fallback the host uses instead."""

from __future__ import annotations

import os

ROOT = os.geteuid() == 0
NOT_ROOT = "switching uids and making cgroups needs root"
