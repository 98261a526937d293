#!/usr/bin/env python3
"""torchrun whose ranks are forked from it once torch is imported, instead of each starting a new
interpreter that imports torch again.

Why: a rank's first seconds are ``import torch`` (2-3 s of CPU, measured 2.9 s on the local
fleet's machine), and torchrun's agent has just paid the same import. Every (re)start of an
attempt paid it once per rank after the rendezvous, on the critical path of every recovery. Forked
from the agent, a rank starts with torch already loaded. This is torch's own function-entrypoint
path (``elastic_launch`` with ``start_method="fork"``, what ``torchrun --run-path`` uses), so the
agent, the rendezvous, the restarts and the failure reports are torchrun's, unchanged.

What a forked rank gets, so that the job sees what ``python -u script.py`` would have given it:
``sys.argv`` and ``sys.path[0]`` as the interpreter sets them (``-m`` runs the module as
``__main__`` with the working directory first on the path); unbuffered ``stdout``/``stderr``
(torchrun's ``-u``); the default signal dispositions (the agent's SIGTERM handler is not the
job's); the ``atexit`` handlers that importing torch registered, and the job's own, run at its end;
the root logger as importing torch left it; ``OMP_NUM_THREADS`` applied to torch's thread pool;
an uncaught exception's traceback on stderr and an unhandled Ctrl-C ending the rank by SIGINT.

Not forked (torchrun as is, each rank a new process): ``--no-python`` (the entrypoint is not
Python), ``--run-path``, ``PYTHON_EXEC`` (another interpreter asked for), or a torch whose
``torch.distributed.run`` is not shaped as expected. The playbook's ``rank_start: exec`` asks for
the plain torchrun. Used as ``python -m fleetrun_torchrun <torchrun's arguments>``.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib
import io
import logging
import os
import signal
import sys
from typing import Any

_IMPORT_EXITS: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
"""The ``atexit`` handlers registered while torch was imported: a new interpreter that imports
torch registers the same, so a forked rank keeps them (and drops those the agent added later)."""


def _import_torchrun() -> Any:
    """``torch.distributed.run``, noting the ``atexit`` handlers the import registers."""
    register = atexit.register

    def noting(func: Any, *args: Any, **kwargs: Any) -> Any:
        _IMPORT_EXITS.append((func, args, kwargs))
        return register(func, *args, **kwargs)

    atexit.register = noting  # type: ignore[assignment]
    try:
        import torch.distributed.run as torchrun
    finally:
        atexit.register = register  # type: ignore[assignment]
    return torchrun


def _fresh_interpreter(kind: str, target: str, argv: tuple[str, ...], root: tuple[list[Any], int]) -> None:
    """Make the forked process look like ``python -u [-m] target argv...`` to the job."""
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if number != signal.SIGINT and callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()
    for func, args, kwargs in _IMPORT_EXITS:
        atexit.register(func, *args, **kwargs)
    _fresh_multiprocessing()
    handlers, level = root
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        fd = 1 if name == "stdout" else 2
        try:
            raw = os.fdopen(fd, "wb", buffering=0, closefd=False)
        except OSError:
            continue
        encoding = getattr(stream, "encoding", None) or "utf-8"
        errors = "backslashreplace" if name == "stderr" else getattr(stream, "errors", None) or "strict"
        setattr(sys, name, io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True))  # type: ignore[arg-type]
    _unbuffer_c_stdio()
    if kind == "-m":
        sys.argv = [target, *argv]
        sys.path[0] = os.getcwd()
    else:
        sys.argv = [target, *argv]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
    threads = os.environ.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    importlib.invalidate_caches()
    words = [sys.executable, "-u", *([kind] if kind else []), target, *argv]
    with contextlib.suppress(OSError, ValueError):  # cosmetic for the job, never its end
        _retitle(words)
    _name_process(os.path.basename(sys.executable) or "python")


def _fresh_multiprocessing() -> None:
    """``multiprocessing`` as a new interpreter has it: no default start method chosen yet (its
    bootstrap fixed ``fork`` for this child, so a job's ``set_start_method("spawn")`` would be
    refused), no parent process, and this process named ``MainProcess``."""
    import multiprocessing
    from multiprocessing import context, process

    default = getattr(context, "_default_context", None)
    if default is not None and hasattr(default, "_actual_context"):
        default._actual_context = None
    if hasattr(process, "_parent_process"):
        process._parent_process = None
    with contextlib.suppress(AttributeError, TypeError):
        multiprocessing.current_process().name = "MainProcess"


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None)


def _unbuffer_c_stdio() -> None:
    """The C library's ``stdout``/``stderr`` unbuffered, as ``python -u`` makes them: native code
    (a CUDA or NCCL message, a C extension's ``printf``) writes straight to the log, and nothing is
    lost when the rank ends through ``os._exit``, as a forked process does."""
    import ctypes

    try:
        libc = _libc()
        for name in ("stdout", "stderr"):
            stream = ctypes.c_void_p.in_dll(libc, name)
            purge = getattr(libc, "__fpurge", None)
            if purge is not None:  # the agent's unwritten output is the agent's, not printed twice
                purge(stream)
            libc.setvbuf(stream, None, 2, 0)  # _IONBF
    except (OSError, ValueError, AttributeError):
        pass


def _flush_c_stdio() -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        _libc().fflush(None)


def _name_process(name: str) -> None:
    """``/proc/self/comm`` (what ``ps`` and ``top`` show): the agent named itself ``pt_elastic``."""
    try:
        with open("/proc/self/comm", "w", encoding="ascii", errors="replace") as fh:
            fh.write(name[:15])
    except OSError:
        pass


ENV_ROOM = "FLEETRUN_ENV_ROOM"
"""Set in the agent's own starting environment (``main`` re-executes itself once with it), then
dropped from its live environment: the room in the agent's environment block that a forked rank
rewrites with its own variables (``_rewrite``), which are longer (torchrun's ``RANK``,
``LOCAL_RANK``, ``TORCHELASTIC_*``... add about 1 KB)."""
ENV_ROOM_BYTES = 8192


def _proc_layout() -> tuple[int, int, int, int] | None:
    """(arg_start, arg_end, env_start, env_end) of this process: fields 48-51 of ``/proc/self/stat``."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read(4096).rsplit(b")", 1)[-1].split()
        return int(fields[45]), int(fields[46]), int(fields[47]), int(fields[48])
    except (OSError, IndexError, ValueError):
        return None


def _rewrite(start: int, end: int, data: bytes) -> bool:
    """Overwrite ``[start, end)`` of this process's memory with ``data``, NUL padded
    (setproctitle's way); False when it does not fit."""
    import ctypes

    size = end - start
    if start <= 0 or len(data) > size:
        return False
    ctypes.memmove(start, data + b"\0" * (size - len(data)), size)
    return True


def _retitle(words: list[str]) -> None:
    """The rank's ``/proc/self/cmdline`` and ``/proc/self/environ`` made what torchrun's own rank
    has (``python -u script.py args``, with ``RANK``, ``LOCAL_RANK``... in its environment), so
    ``pgrep -f``, ``ps e``, py-spy, a tool that finds ranks by ``LOCAL_RANK`` and fleetrun's stop
    (``fleetrun_procs``: a launcher holds nothing, a rank may still save) tell a rank from its
    agent. The forked copies of the agent's argument and environment strings are overwritten in
    place: the command line is always shorter than the agent's (which names the script and its
    arguments too); the environment fits in the agent's ``ENV_ROOM``. The C library's
    environment is first moved off those strings (``os.putenv`` copies each variable), so
    ``getenv`` in native code (CUDA, NCCL, OpenMP) reads the same values as before. Nothing is
    changed when the layout cannot be read or the text does not fit."""
    layout = _proc_layout()
    if layout is None:
        return
    arg_start, arg_end, env_start, env_end = layout
    _rewrite(arg_start, arg_end, b"\0".join(os.fsencode(w) for w in words) + b"\0")
    env = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in os.environ.items())
    if len(env) > env_end - env_start:
        return
    for key, value in os.environ.items():
        os.putenv(key, value)
    _rewrite(env_start, env_end, env)


def _run_main(kind: str, target: str) -> None:
    """The job's script or module executed as ``__main__`` in a module of its own, which stays
    ``sys.modules["__main__"]`` to the end (atexit handlers and the job's threads pickle classes
    defined there; ``runpy.run_path`` would put the agent's back as soon as the code returns)."""
    import runpy
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if kind == "-m":
        run_as_main = getattr(runpy, "_run_module_as_main", None)
        if callable(run_as_main):
            run_as_main(target, alter_argv=True)  # what ``python -m`` runs
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    from importlib.machinery import SourceFileLoader

    main.__file__ = target
    main.__loader__ = SourceFileLoader("__main__", target)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    with open(target, "rb") as fh:
        code = compile(fh.read(), target, "exec")
    exec(code, main.__dict__)  # noqa: S102 - the job's own script, as the interpreter runs it


def _interpreter_end() -> None:
    """What an interpreter does after ``__main__`` ends: wait for the job's non-daemon threads,
    then its ``atexit`` handlers, then flush."""
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if callable(shutdown):
        with contextlib.suppress(Exception):
            shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    _flush_c_stdio()


def run_rank(kind: str, target: str, *argv: str) -> None:
    """A rank's entry in the forked process: the job's script (``kind`` '') or module (``-m``)
    run as ``__main__``. Returns for a clean end (``sys.exit(0)`` too), so that torch collects the
    rank as done; any other exit code ends the process with it, as the interpreter would; an
    unhandled Ctrl-C ends it by SIGINT (exit code 130), never as a clean end."""
    import traceback

    interrupted = False
    try:
        _fresh_interpreter(kind, target, argv, _ROOT_LOGGER)
        _run_main(kind, target)
    except SystemExit as stop:
        if stop.code not in (None, 0):
            _interpreter_end()
            raise
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()  # what the interpreter prints for an uncaught exception
        _interpreter_end()
        raise
    _interpreter_end()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


_ROOT_LOGGER: tuple[list[Any], int] = ([], logging.WARNING)


def cuda_touched() -> bool:
    """True once this process has loaded the CUDA driver (``libcuda``): CUDA cannot be used in a
    process forked after that, so the ranks must then be new interpreters."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return any("libcuda.so" in line for line in fh)
    except OSError:
        return True


def forked(config: Any, cmd: Any, cmd_args: list[Any], nproc: object = None) -> tuple[Any, Any, list[Any]]:
    """torchrun's (config, entrypoint, args) turned into a forked rank's, or returned as they
    are when the ranks are not a Python script or module run by this interpreter, or when the
    agent touched CUDA (``--nproc-per-node=gpu|auto`` asks CUDA for the GPU count; fleetrun
    passes a number)."""
    if not isinstance(cmd, str) or cmd != sys.executable or "PYTHON_EXEC" in os.environ:
        return config, cmd, cmd_args
    if str(nproc) in ("gpu", "auto") or cuda_touched():
        return config, cmd, cmd_args
    if not cmd_args or cmd_args[0] != "-u" or not hasattr(config, "start_method"):
        return config, cmd, cmd_args
    rest = list(cmd_args[1:])
    kind = ""
    if rest and rest[0] == "-m":
        kind = rest.pop(0)
    if not rest:
        return config, cmd, cmd_args
    config.start_method = "fork"
    return config, run_rank, [kind, *rest]


def _make_env_room() -> None:
    """Re-execute this agent once (the same process id) with ``ENV_ROOM`` in its starting
    environment, then drop it from the live one (its ranks and any process it starts do not get
    it). Costs an interpreter start (some 30 ms), before torch is imported."""
    if ENV_ROOM not in os.environ:
        argv = list(getattr(sys, "orig_argv", [])) or [
            sys.executable,
            "-m",
            "fleetrun_torchrun",
            *sys.argv[1:],
        ]
        try:
            os.execve(sys.executable, argv, {**os.environ, ENV_ROOM: "." * ENV_ROOM_BYTES})
        except OSError:
            return  # go on without the room: a rank's environment is then not rewritten
    os.environ.pop(ENV_ROOM, None)


RDZV_POLL_S = 0.1
"""How often a waiting agent reads the c10d rendezvous' state (torch: every second, and the state
cached for a second), per 16 nodes, at most torch's second: with 3 nodes the last agent's join
was seen up to 1.5 s late by the others, on the critical path of every start and recovery."""


def _poll_rendezvous_faster(nnodes: object) -> None:
    """torch's dynamic rendezvous polls at ``RDZV_POLL_S`` (scaled by the node count, so a big
    fleet's store is not read more often than torch's own pace allows) instead of every second.
    Private names of torch: when they are not there, nothing is changed."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
    except ImportError:
        return
    text = str(nnodes or "1").split(":")[-1]
    nodes = int(text) if text.isdigit() else 1
    poll = min(1.0, RDZV_POLL_S * max(1.0, nodes / 16))
    delay = getattr(rdzv, "_delay", None)
    holder = getattr(rdzv, "_BackendRendezvousStateHolder", None)
    if not callable(delay) or holder is None or not hasattr(holder, "__init__"):
        return

    def faster(seconds: Any) -> None:
        delay(poll if seconds == 1 else seconds)

    init = holder.__init__

    def holder_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if getattr(self, "_cache_duration", 0) == 1:
            self._cache_duration = poll

    rdzv._delay = faster
    holder.__init__ = holder_init


PRELOAD = "FLEETRUN_FORK_PRELOAD"
"""Modules the agent imports before it forks its ranks, comma separated (default
``DEFAULT_PRELOAD``; empty: none). A job's heavy imports (``transformers``...) can be added."""
DEFAULT_PRELOAD = "torch._dynamo"
"""What constructing ``DistributedDataParallel`` (or ``torch.compile``) imports on first use:
829 modules (dynamo, sympy, FSDP, DTensor), 2 s of CPU per rank measured here. Its import sets
``TORCHINDUCTOR_CACHE_DIR`` when unset; fleetrun's nodes always set it (``node_env``)."""


class Preload:
    """``PRELOAD``'s modules imported in a thread while the agent waits for the rendezvous, so a
    forked rank finds them loaded; ``join`` before any fork (a fork while another thread imports
    could copy a held import lock). A module that fails to import is simply not preloaded."""

    def __init__(self, names: list[str]) -> None:
        import threading

        self.names = names
        self.thread = threading.Thread(target=self._work, name="fleetrun-preload", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        import threading

        register = atexit.register
        me = threading.current_thread()

        def noting(func: Any, *args: Any, **kwargs: Any) -> Any:
            # the preloaded modules' handlers are a fresh interpreter's too (a rank keeps them);
            # the agent's own, registered meanwhile on its main thread, are not
            if threading.current_thread() is me:
                _IMPORT_EXITS.append((func, args, kwargs))
            return register(func, *args, **kwargs)

        atexit.register = noting  # type: ignore[assignment]
        try:
            for name in self.names:
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001, S112 - the rank imports it itself then, or fails as it would have
                    continue
        finally:
            atexit.register = register  # type: ignore[assignment]

    def join(self) -> None:
        self.thread.join()


def _preload_before_forking() -> None:
    """Start the preload and join it before torch's agent starts its ranks
    (``local_elastic_agent.start_processes``, wrapped); without that name, nothing is preloaded."""
    names = [n.strip() for n in os.environ.get(PRELOAD, DEFAULT_PRELOAD).split(",") if n.strip()]
    try:
        from torch.distributed.elastic.agent.server import local_elastic_agent as agent
    except ImportError:
        return
    start = getattr(agent, "start_processes", None)
    if not names or not callable(start):
        return
    preload = Preload(names)

    def start_processes(*args: Any, **kwargs: Any) -> Any:
        preload.join()
        if kwargs.get("entrypoint") is run_rank and isinstance(kwargs.get("args"), dict) and cuda_touched():
            # a preloaded module loaded CUDA: a forked rank could not use it; new interpreters
            kwargs["entrypoint"] = sys.executable
            kwargs["args"] = {rank: exec_args(*words) for rank, words in kwargs["args"].items()}
        return start(*args, **kwargs)

    agent.start_processes = start_processes


def exec_args(kind: str, target: str, *argv: str) -> tuple[str, ...]:
    """A forked rank's arguments (``run_rank``'s) as torchrun's own for ``python``."""
    return ("-u", *([kind] if kind else []), target, *argv)


def _collect_silent_ends() -> None:
    """A forked rank that ends with exit code 0 without returning (``os._exit(0)``, a C
    ``exit(0)``, a Ctrl-C that torch's wrapper swallows) counts as done with no value: torch waits
    for a value from every rank and would wait forever (a new interpreter's rank is judged by its
    exit code alone). Private names of torch: when they are not there, nothing is changed."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return
    context = getattr(api, "MultiprocessContext", None)
    is_done = getattr(context, "_is_done", None)
    if context is None or not callable(is_done):
        return

    def _is_done(self: Any) -> bool:
        pc = getattr(self, "_pc", None)
        values = getattr(self, "_return_values", None)
        queues = getattr(self, "_ret_vals", None)
        if pc is not None and isinstance(values, dict) and isinstance(queues, dict):
            for rank, proc in enumerate(getattr(pc, "processes", ())):
                if rank not in values and proc.exitcode == 0 and rank in queues and queues[rank].empty():
                    values[rank] = None
        return bool(is_done(self))

    context._is_done = _is_done


def main(argv: list[str] | None = None) -> None:
    global _ROOT_LOGGER
    if argv is None:
        _make_env_room()
    torchrun = _import_torchrun()
    _ROOT_LOGGER = (list(logging.root.handlers), logging.root.level)
    original = getattr(torchrun, "config_from_args", None)
    if callable(original):

        def config_from_args(args: Any) -> Any:
            result = original(args)
            if not isinstance(result, tuple) or len(result) != 3:
                return result
            if getattr(args, "rdzv_backend", None) == "c10d":
                _poll_rendezvous_faster(getattr(args, "nnodes", None))
            config, cmd, cmd_args = forked(*result, nproc=getattr(args, "nproc_per_node", None))
            if cmd is run_rank:
                _collect_silent_ends()
                _preload_before_forking()
            return config, cmd, cmd_args

        torchrun.config_from_args = config_from_args
    torchrun.main(argv)


if __name__ == "__main__":
    main()
