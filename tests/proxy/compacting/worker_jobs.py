"""Jobs for the worker tests, in a module of their own: a worker imports a job's module on its
first job, and this one costs nothing to import (a test's deadlines stay short under load)."""

from __future__ import annotations

import os
import time


def pid_of(_: None) -> int:
    return os.getpid()


def die(_: None) -> None:
    os._exit(3)


def nap(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()
