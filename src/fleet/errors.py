"""The one exception tree fleet raises. Only `fleet.cli` catches `FleetError`.

FleetError                      message: "<subject>: <what failed> (<evidence>). <what to do>"
├── ConfigError                 inventory / playbook / CLI input is wrong; nothing was touched
├── TransportError              the host could not be reached or a command could not run
│   ├── HostUnreachable         TCP/SSH connection failed or timed out
│   │   ├── ConnectionLost      a kept connection was gone before the command started (safe to retry)
│   │   └── HostSilent          the host stopped answering (no output, no keepalive reply): frozen
│   ├── HostKeyError            unknown or changed host key
│   └── AuthError               authentication refused
├── HostStepError               a fleet step ran on the host and failed there (crashed, no Python)
├── PreflightError              the plan cannot work on this host; nothing was stopped
├── LockedError                 another fleet run holds the host's lock
│   └── StoppedSince            a heal found its deployment stopped by an operator since the check
├── UnsafeToKill                GPU holders fleet must not kill without --force
└── DeployFailed                the engine did not come up and fleet gave up
"""

from __future__ import annotations


class FleetError(Exception):
    """Base of every error fleet reports to a person. `exit_code` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip()


class ConfigError(FleetError):
    exit_code = 2


class TransportError(FleetError):
    exit_code = 3


class HostUnreachable(TransportError):
    pass


class ConnectionLost(HostUnreachable):
    """The connection was already closed when a command was to start: nothing ran, so a new one may retry."""


class HostSilent(HostUnreachable):
    """Connected, but the host answers nothing (a frozen host or sshd): reconnecting would only wait again."""


class HostKeyError(TransportError):
    pass


class AuthError(TransportError):
    pass


class HostStepError(FleetError):
    """The host answered, and the script fleet sent failed there: not an SSH problem. `remote_traceback`
    is what the host said, shown with --debug."""

    exit_code = 8

    def __init__(self, message: str, hint: str = "", remote_traceback: str = "") -> None:
        super().__init__(message, hint)
        self.remote_traceback = remote_traceback


class PreflightError(FleetError):
    exit_code = 4


class LockedError(FleetError):
    exit_code = 5


class StoppedSince(LockedError):
    """A heal reached the host's lock after `fleet stop` had stopped the deployment: it restarts nothing."""


class UnsafeToKill(FleetError):
    exit_code = 6


class DeployFailed(FleetError):
    exit_code = 7
