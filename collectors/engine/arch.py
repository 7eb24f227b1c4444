"""The interface every arch module of the engine provides (``arch_x86_64``;
an ``arch_aarch64`` would be an addition), and the loader that picks one by
``os.uname().machine`` (what ``platform.machine()`` returns, without
importing ``platform``: 3 ms of a CLI run)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any, Protocol, cast

from diag.model.errors import Unsupported

# A register set as the arch module holds it (a ctypes structure on x86-64).
Regs = Any

# Architectures with an arch module.  (aarch64 is described in
# arch_x86_64's docstring but not written yet.)
ARCH_MODULES = {"x86_64": "arch_x86_64", "amd64": "arch_x86_64"}


class SigInfoLike(Protocol):
    signo: int
    code: int
    addr: int


class Arch(Protocol):
    NAME: str
    WORD: int
    RED_ZONE: int
    STACK_ALIGN: int
    MAX_ARGS: int
    RESTART_SYSCALL: int
    SYSCALL_NAMES: Mapping[int, str]
    AUDIT_ARCH: int

    def get_regs(self, tid: int, pid: int) -> Regs: ...
    def set_regs(self, tid: int, pid: int, regs: Regs) -> None: ...
    def get_ext_state(self, tid: int, pid: int) -> bytes: ...
    def set_ext_state(self, tid: int, pid: int, blob: bytes) -> None: ...
    def copy_regs(self, regs: Regs) -> Regs: ...
    def pc(self, regs: Regs) -> int: ...
    def sp(self, regs: Regs) -> int: ...
    def thread_pointer(self, regs: Regs) -> int: ...
    def syscall_state(self, regs: Regs) -> tuple[int, int]: ...
    def syscall_args(self, regs: Regs) -> tuple[int, ...]: ...
    def set_syscall_arg(self, regs: Regs, i: int, value: int) -> None: ...
    def rerun_syscall(self, regs: Regs) -> None: ...
    def code_segment(self, regs: Regs) -> int: ...
    def prepare_call(self, regs: Regs, func: int, args: tuple[int, ...], top: int
                     ) -> tuple[Regs, list[tuple[int, bytes]], int]: ...
    def return_value(self, regs: Regs) -> int: ...
    def is_return_trap(self, regs: Regs, siginfo: SigInfoLike) -> bool: ...


def load(machine: str | None = None) -> Arch:
    """The arch module of MACHINE (default: this one); Unsupported if none."""
    machine = machine or os.uname().machine
    mod = ARCH_MODULES.get(machine)
    if mod is None:
        raise Unsupported(f"unsupported architecture {machine}: remote calls (live "
                          "allocator stats) are implemented for x86_64 only; "
                          "--no-attach still works")
    # a module satisfies the Protocol by its functions and constants
    return cast(Arch, importlib.import_module(f"collectors.engine.{mod}"))
