"""The step (lever) plugin contract: the hook specification, and nothing else.

A plugin is a module (or object) with a `sloguard_steps` function marked `@hookimpl`, found
through the entry-point group `sloguard.steps`. The built-in steps are plugins registered by
name in actuators/kinds.py. What a step must do (apply, undo, write-ahead, dry-run, only BE
targets) is the `Step` protocol in actuators/step.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sloguard.core.extensions import PROJECT, hookimpl, hookspec

if TYPE_CHECKING:
    from sloguard.actuators.step import Step

__all__ = ["PROJECT", "hookimpl", "hookspec", "sloguard_steps"]


@hookspec
def sloguard_steps() -> list[type[Step]]:
    """Return the step types this plugin provides.

    Each type has a unique class attribute `kind` (what policies write as `step:`), takes the
    policy step's `params` mapping and the ActuatorEnv in its constructor (raising ValueError,
    with a plain message, for parameters it does not accept: the policy file is then rejected
    with file and line), and follows the `Step` protocol of actuators/step.py.
    """
