"""A Triton kernel launched again without the JIT's per-call dispatch: the one door to Triton's internals.

`kernel[grid](*args)` binds every argument, specializes it, hashes a cache key and looks the compiled kernel up on
every call: for the exact step's two launches about 80 µs of host time under cProfile on the H100's host
(benchmarks/gpu-h100), where the device time of the whole step at B = 1 is 21 µs. A caller that knows the
specialization cannot have changed (its own key: the same shapes, strides, dtypes and pointer alignment) launches
the compiled kernel that its first call returned: the exact step's host time went from 118 µs (through the JIT)
to 36 µs in one run on an H100's host (run E, README).

Relies on (Triton 3.4 to 3.9: triton/runtime/jit.py JITFunction.run, triton/compiler/compiler.py CompiledKernel):
  - `kernel[grid](*args, **meta)` returns the CompiledKernel it launched;
  - CompiledKernel.run(grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata, enter_hook,
    exit_hook, *every argument in signature order, constexprs included) launches it, as JITFunction.run does;
  - triton.runtime.driver.active.get_current_stream(device) is the stream the JIT launches on;
  - triton.knobs.runtime.launch_enter_hook / launch_exit_hook: a profiler's hooks, None or an empty HookChain when
    there are none (with any, the JIT's path is taken).
Under the interpreter `kernel[grid]` returns no CompiledKernel, and every call takes the JIT's path.
"""

import triton
from triton.runtime import driver

_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


def _hooked() -> bool:
    """Whether a profiler hooks launches: a hook function (Triton 3.4-3.6), or a HookChain holding any (3.9)."""
    if _KNOBS is None:
        return True
    return any(h is not None and getattr(h, "calls", True) for h in (_KNOBS.launch_enter_hook, _KNOBS.launch_exit_hook))


def current_stream(device_index: int):
    """The raw stream a launch on that CUDA device goes to (the JIT's own choice)."""
    return driver.active.get_current_stream(device_index)


class Launch:
    """One kernel at one specialization, on one stream: the first call through the JIT (which compiles or finds the
    kernel), every later one straight to the CompiledKernel. The caller keys it by everything Triton specializes."""

    def __init__(self, kernel, grid: tuple[int, ...], stream, **meta):
        self.kernel, self.grid, self.stream, self.meta = kernel, grid, stream, meta
        self.grid3 = (*grid, 1, 1)[:3]
        self.compiled, self.constexprs = None, ()

    def __call__(self, *args) -> None:
        c = self.compiled
        if c is None or _hooked():
            c = self.kernel[self.grid](*args, **self.meta)
            if self.stream is not None and hasattr(c, "packed_metadata"):
                # constexprs are passed too, in signature order: appended, so they must come last
                flags = [p.is_constexpr for p in self.kernel.params]
                assert flags == sorted(flags) and len(args) + sum(flags) == len(flags), "runtime arguments, then constexprs"
                self.compiled = c
                self.constexprs = tuple(self.meta[p.name] for p in self.kernel.params if p.is_constexpr)
            return
        c.run(*self.grid3, self.stream, c.function, c.packed_metadata, None, None, None, *args, *self.constexprs)
