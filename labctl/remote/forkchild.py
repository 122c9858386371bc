"""A worker forked by the fork server (forkserver.py): what a new interpreter would have made of the
request's world, before worker.py runs the script in it.

The server is given this text beside worker.py's, takes snapshot() before its preload, checks each
request with load_time_change() (a setting read once at start-up that differs from the server's is
refused, not ignored), and in each child calls become(): the request's signals, stdio, session,
umask, cwd and environment, then refresh(), the sys.path, stdio, warnings and seeds a new `python`
would have, and the thread counts torch and OpenBLAS read at the server's import.

Shipped as text like every program here (labctl/remote/__init__.py): the standard library only.
"""

import os
import signal
import sys


# Read once at start-up by the interpreter, libgomp (all but OMP_NUM_THREADS, applied per worker),
# MKL, or torch's logging and compiler configs at import: only a process started with them has them.
LOAD_TIME = ("PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONMALLOC", "PYTHONUTF8", "PYTHONHOME", "PYTHONIOENCODING",
             "PYTHONNOUSERSITE", "PYTHONDEVMODE", "PYTHONSAFEPATH", "PYTHONINTMAXSTRDIGITS", "PYTHONTRACEMALLOC",
             "PYTHONCOERCECLOCALE", "LD_PRELOAD", "LD_LIBRARY_PATH", "MKL_DYNAMIC", "TORCH_LOGS",
             "TORCH_CPP_LOG_LEVEL")  # and the locale, compared as the interpreter takes it: ctype_locale
LOAD_TIME_PREFIXES = ("OMP_", "GOMP_", "KMP_", "TORCHDYNAMO_", "TORCHINDUCTOR_", "TORCH_COMPILE_")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS")


def ctype_locale(env):
    """The LC_CTYPE an interpreter started with `env` settles on, the one locale setting it reads at
    start-up: the first of LC_ALL, LC_CTYPE and LANG that is set, with C (or none) coerced to C.UTF-8
    (PEP 538). An SSH session without LANG and a `docker exec` with LANG=C.UTF-8 get the same."""
    name = env.get("LC_ALL") or env.get("LC_CTYPE") or env.get("LANG") or "C"
    if name in ("C", "POSIX") and not env.get("LC_ALL") and env.get("PYTHONCOERCECLOCALE") != "0":
        return "C.UTF-8"
    return name


def load_time_change(env, server_env):
    """Why a worker forked with `env` would not be what `python` started with it is (a setting read
    at start-up, which the server read with its own value), or None."""
    for var in sorted(set(env) | set(server_env)):
        if (var in LOAD_TIME or var.startswith(LOAD_TIME_PREFIXES) and var not in THREAD_VARS) \
                and env.get(var) != server_env.get(var):
            return "%s=%r, and the fork server started with %r: it is read once at start-up" % (
                var, env.get(var), server_env.get(var))
    if ctype_locale(env) != ctype_locale(server_env):
        return "the locale is %s, and the fork server started in %s: it is read once at start-up" % (
            ctype_locale(env), ctype_locale(server_env))
    return None


def first_int(value):
    """A thread count as atoi and stoi read it ("4", "4,2"); None unless positive."""
    digits = (value or "").strip().split(",")[0]
    return int(digits) if digits.isdigit() and int(digits) > 0 else None


def pythonpath(env):
    """The entries PYTHONPATH adds, as getpath makes them: absolute, '' meaning the cwd."""
    return [os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep)] if env.get("PYTHONPATH") else []


def snapshot():
    """The fork server's start, before its preload: what refresh() takes out of a worker's world."""
    import warnings
    ours = set(pythonpath(os.environ))
    base = [p for p in sys.path[0 if getattr(sys.flags, "safe_path", False) else 1:] if p not in ours]
    saved = warnings.filters[:]
    del warnings.filters[:]
    warnings._processoptions(sys.warnoptions)  # the filters the server's own PYTHONWARNINGS made
    options = warnings.filters[:]
    warnings.filters[:] = saved
    return {"base_path": base, "option_filters": options, "default_filters": [f for f in saved if f not in options]}


def become(req, fds, server_ignored, start):
    """In a forked child of the server, its own sockets closed: take the request's signal dispositions
    and mask, its stdio (`fds`, received as its 0, 1 and 2), a session of its own (signals and the
    server's dead man's switch reach all of it), its umask, cwd and environment, and then the rest
    of what a new interpreter would have made of that environment (refresh)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sig in set(server_ignored) - set(req.get("ignored", [])):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    for sig in req.get("ignored", []):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, req.get("blocked", []))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    os.setsid()
    os.umask(req.get("umask", 0o22))
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    refresh(req["env"], start)


def refresh(env, start):
    """In a forked child whose os.environ is now env: what a new interpreter would have made of env
    (sys.path, stdio, warnings, seeds), and what torch and OpenBLAS read at the server's import."""
    import io
    import warnings
    seen, rest = set(), []
    for p in pythonpath(env) + start["base_path"]:  # as getpath and site.removeduppaths make it
        key = os.path.normcase(os.path.abspath(p))
        if key not in seen:
            seen.add(key)
            rest.append(p)
    sys.path[:] = ([] if getattr(sys.flags, "safe_path", False) else [""]) + rest  # run_script sets [0]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    streams = []
    for fd, old in enumerate((sys.stdin, sys.stdout, sys.stderr)):  # as CPython's create_stdio
        raw_only = unbuffered and fd > 0
        buf = io.open(fd, "rb" if fd == 0 else "wb", buffering=0 if raw_only else -1, closefd=False)
        raw = buf if raw_only else buf.raw
        raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
        streams.append(io.TextIOWrapper(buf, old.encoding, old.errors, "\n", write_through=unbuffered,
                                        line_buffering=not unbuffered and (fd == 2 or raw.isatty())))
        streams[-1].mode = "r" if fd == 0 else "w"
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams
    options = [o for o in env.get("PYTHONWARNINGS", "").split(",") if o]
    kept = [f for f in warnings.filters if f not in start["option_filters"]]
    at = next((i for i, f in enumerate(kept) if f in start["default_filters"]), len(kept))
    del warnings.filters[:]
    sys.warnoptions[:] = options
    warnings._processoptions(options)  # behind what imports added, ahead of the defaults: as if at start
    warnings.filters[:] = kept[:at] + warnings.filters + kept[at:]
    getattr(warnings, "_filters_mutated", lambda: None)()
    if env.get("PYTHONFAULTHANDLER"):
        import faulthandler
        faulthandler.enable()
    import weakref
    for finalizer in list(weakref.finalize._registry):  # the server's, not this worker's, to run at exit:
        finalizer.atexit = False  # torch's op-library deregistrations alone took 0.1 s of every worker's exit
    for name in ("random", "numpy.random"):  # a new process seeds them from the OS
        if name in sys.modules:
            sys.modules[name].seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # so does torch, at import: each worker its own
    want = first_int(env.get("MKL_NUM_THREADS")) or first_int(env.get("OMP_NUM_THREADS"))
    if torch is not None and want:  # as MKL decides at torch's import: capped at the cores
        torch.set_num_threads(min(want, start["torch_threads"]))
    blas_threads(env)


def blas_threads(env):
    """Size OpenBLAS's pool as a new process would (the server imported it with one thread)."""
    import ctypes
    with open("/proc/self/maps") as f:
        paths = [line.split()[-1] for line in f if "openblas" in line.rsplit("/", 1)[-1]]
    if not paths:
        return
    lib = ctypes.CDLL(paths[0])
    cpus = len(os.sched_getaffinity(0))
    want = min(cpus, first_int(env.get("OPENBLAS_NUM_THREADS")) or first_int(env.get("GOTO_NUM_THREADS"))
               or first_int(env.get("OMP_NUM_THREADS")) or cpus)
    for name in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                 "scipy_openblas_set_num_threads"):
        if hasattr(lib, name):
            getattr(lib, name)(want)
            return
