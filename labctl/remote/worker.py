"""Run one script as a fresh `python` would, then leave with its status without interpreter teardown.

  python -c TEXT SCRIPT ARGS...       as `python SCRIPT ARGS...`
  python -c TEXT -m MODULE ARGS...    as `python -m MODULE ARGS...`
  python -c TEXT -c CODE ARGS...      as `python -c CODE ARGS...` (labctl's own programs: the run's store)

How a run's workers start: `torchrun --no-python python -c TEXT SCRIPT ARGS`, the static launcher's
`python -c TEXT SCRIPT ARGS`, and every worker the fork server (forkserver.py) forks: the server is
given this text, and in each child, once forkchild.py has made it what a new interpreter would be
for the run's environment, calls run_and_exit(). One implementation.

The script sees what `python SCRIPT` shows it: sys.argv[0] the path as given, __file__ the absolute
path, sys.path[0] the script's real directory (the cwd for -m), a fresh `__main__` module. -m and a
directory or zip go through runpy._run_module_as_main, as CPython itself does, so even a traceback
reads the same. An uncaught exception is printed by sys.excepthook with this file's frames left out.

Why not let the interpreter finalize: a script whose rank calls sys.exit(3) sometimes exited 134,
not 3. torch's gloo threads are still alive when the interpreter tears down, and their C++ static
destructors race with it: "terminate called without an active exception", SIGABRT (as in
pytorch/pytorch#179291; trainer/dist.py exit_done does the same for the trainer's own success).
So after the script we do the part of CPython's shutdown a script can observe (join non-daemon
threads, run atexit handlers, flush stdout and stderr) and then os._exit(status): the status is
the script's every time. A real abort or a signal is still the process's death by that signal, and
an uncaught KeyboardInterrupt ends in SIGINT, as CPython does (a shell says 130).

Why destroyed process groups are kept: a script that calls destroy_process_group() and then lets
its DDP model go (main() returns) hung about 1 run in 4 here, cold or warm: the model's Reducer held
the last reference to the gloo group, so ~ProcessGroupGloo ran in the main thread, holding the GIL,
and joined gloo's runloop thread, which was waiting for the GIL to free the last collective's
tensors (gdb; pytorch/pytorch#56297). So destroy_process_group keeps the groups it destroys alive
(hold_process_groups), their threads idle, until os._exit: the group is gone for the script as
before, and its destructor, the one that can deadlock, never runs.

Why torchrun's rendezvous gets a faster get_method_name: torch's dynamic rendezvous names each of
its events by calling inspect.stack() twice, which reads the source of every frame and scans
sys.modules for each (python/cpython#92041), even when the events go nowhere (a NullHandler). In an
agent forked from the fork server (1,161 modules with torch.distributed, 1,984 once torch._dynamo
is in) one call took 66 to 128 ms at a depth of 25, and a join loop makes several: a compare-and-set
on the rendezvous state took 0.25 to 2.5 s where it takes 1 ms. On a loaded machine the slowest
agent's read-to-write window outlasted the others' keep-alive writes, its writes kept losing the
race, and it missed the round's last call: a `--nnodes 2:3` run trained on 2 nodes. The frame walk
(fast_method_name) returns the same name.
"""

import atexit
import builtins
import importlib.machinery
import os
import signal
import sys
import time
import types


def fresh_main():
    """A `__main__` module as a new interpreter has one; the caller's own stays the caller's."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    return main


def script_path0(script):
    """sys.path[0] for `python SCRIPT`: the directory of the script with symlinks resolved."""
    return os.path.dirname(os.path.realpath(script))


def is_importer(path):
    """`python DIR` and `python ZIPFILE` run its __main__ module: CPython asks the path hooks."""
    if os.path.isdir(path):
        return True
    import zipimport
    try:
        zipimport.zipimporter(path)
        return True
    except Exception:
        return False


def run_script(argv):
    """Run argv (`SCRIPT ARGS`, `-m MODULE ARGS` or `-c CODE ARGS`) in a fresh __main__; exceptions propagate."""
    import runpy
    safe_path = getattr(sys.flags, "safe_path", False)  # -P / PYTHONSAFEPATH (3.11): no path[0]
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = sys.orig_argv[:1] + list(argv)
    main = fresh_main()
    if argv[0] == "-c":
        sys.argv = ["-c"] + list(argv[2:])
        if not safe_path:
            sys.path[0] = ""  # `python -c`: the current directory, as CPython puts it
        main.__loader__ = importlib.machinery.BuiltinImporter
        exec(compile(argv[1], "<string>", "exec", dont_inherit=True), main.__dict__)
        return
    if argv[0] in ("-m", "--module"):
        sys.argv = ["-m"] + list(argv[2:])  # runpy puts the module's full path in argv[0]
        if not safe_path:
            sys.path[0] = os.getcwd()
        runpy._run_module_as_main(argv[1], alter_argv=True)  # what `python -m` calls
        return
    script = argv[0]
    sys.argv = list(argv)
    path = os.path.abspath(script)
    if is_importer(path):
        sys.path[0] = path
        runpy._run_module_as_main("__main__", alter_argv=False)
        return
    if not safe_path:
        sys.path[0] = script_path0(script)
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        prog = getattr(sys, "orig_argv", [sys.executable])[0]
        sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (prog, path, exc.errno, exc.strerror))
        raise SystemExit(2)
    main.__file__, main.__cached__ = path, None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)


def exit_status(code):
    """The status CPython exits with for SystemExit(code); prints a non-int message as it does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return (code if -2 ** 63 <= code < 2 ** 63 else -1) & 0xFF  # C exit((int)long)
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def print_uncaught(exc):
    """sys.excepthook(type, value, tb) as CPython calls it, from the script's first frame on."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals is globals():
        tb = tb.tb_next  # this file's frames: `python SCRIPT` has none
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException as hook_exc:
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(hook_exc), hook_exc, hook_exc.__traceback__)
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(type(exc), exc, tb)


HELD = []  # the process groups destroy_process_group destroyed: kept until os._exit


def hold_process_groups(dist):
    """Make torch.distributed's destroy_process_group keep the groups it destroys (see above)."""
    c10d = getattr(dist, "distributed_c10d", None)
    destroy = getattr(c10d, "destroy_process_group", None)
    if destroy is None or getattr(destroy, "_ddplab_holds", False) or not hasattr(c10d, "_world"):
        return

    def destroy_process_group(group=None):
        HELD.extend(getattr(c10d._world, "pg_map", ()))
        return destroy(group)

    destroy_process_group.__wrapped__, destroy_process_group._ddplab_holds = destroy, True
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(destroy_process_group, attr, getattr(destroy, attr, None))
    for module in (c10d, dist):
        if getattr(module, "destroy_process_group", None) is destroy:
            module.destroy_process_group = destroy_process_group


def after_import(name, then):
    """then(module) once module `name` is imported: now if it is (a forked worker), else when the
    script imports it (a cold one), through a finder that steps aside after its one module."""
    if name in sys.modules:
        then(sys.modules[name])
        return

    class Finder:
        @staticmethod
        def find_spec(fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(Finder)
            for finder in sys.meta_path:
                spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
                if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    exec_module = spec.loader.exec_module

                    def exec_then(module, exec_module=exec_module):
                        exec_module(module)
                        try:
                            then(module)
                        except Exception:  # never the script's problem
                            pass

                    spec.loader.exec_module = exec_then
                    return spec
                if spec is not None:
                    return spec
            return None

    sys.meta_path.insert(0, Finder)


RENDEZVOUS = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


def fast_method_name(depth=2):
    """torch's get_method_name (the function `depth` frames up), by walking frames, not inspect.stack()."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a shorter stack, as torch's says it
        return "no_method_name"


def quicken_rendezvous(module):
    """Give torch's dynamic rendezvous fast_method_name (see above), where it has the slow one."""
    if callable(getattr(module, "get_method_name", None)):
        module.get_method_name = fast_method_name


MEMBERS = "members.jsonl"  # = labctl.run.result.MEMBERS, in the folder DDPLAB_RUN_DIR names


def record_member(env):
    """Under torchrun's contract (GROUP_WORLD_SIZE set), a line in the run's folder: host, rank, node
    rank, restart count, its world's node count and the time, which `labctl run` reads to say whom
    an elastic run's first workers went without. No json: the script finds sys.modules as `python`
    leaves them (time is there already)."""
    run_dir, nodes = env.get("DDPLAB_RUN_DIR"), env.get("GROUP_WORLD_SIZE", "")
    if run_dir and nodes.isdigit():
        ints = [int(env.get(k) or 0) if (env.get(k) or "0").isdigit() else -1
                for k in ("RANK", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT")]
        line = '{"host": "%s", "rank": %d, "group_rank": %d, "restart": %d, "group_world_size": %s, "time": %.3f}\n'
        try:
            with open(os.path.join(run_dir, MEMBERS), "ab") as f:  # one write, O_APPEND: lines never mix
                f.write((line % (os.uname().nodename, ints[0], ints[1], ints[2], nodes, time.time())).encode())
        except OSError:  # a folder this host cannot write to: the record is a nicety, the run is not
            pass


def run(argv):
    """Run the script; (status, interrupted): interrupted when a KeyboardInterrupt ended it."""
    record_member(os.environ)
    after_import("torch.distributed", hold_process_groups)
    after_import(RENDEZVOUS, quicken_rendezvous)
    try:
        run_script(argv)
    except SystemExit as exc:
        return exit_status(exc.code), False
    except BaseException as exc:
        print_uncaught(exc)
        return 1, isinstance(exc, KeyboardInterrupt)
    return 0, False


def leave(status, interrupted=False):
    """CPython's exit, less what aborts: threads joined, atexit run, streams flushed, os._exit."""
    threading = sys.modules.get("threading")  # CPython waits only if the script imported it
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:  # e.g. Ctrl-C while waiting: CPython reports it and goes on
            import traceback
            sys.stderr.write("Exception ignored in: %r\n" % threading)
            traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe, or None
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + signal.SIGINT  # only where the signal did not end us, as CPython
    os._exit(status)


def run_and_exit(argv):
    leave(*run(argv))


if __name__ == "__main__":
    if len(sys.argv) < 2 or (sys.argv[1] in ("-m", "--module", "-c") and len(sys.argv) < 3):
        sys.exit("usage: python -c TEXT [-m MODULE | -c CODE | SCRIPT] ARGS...")
    run_and_exit(sys.argv[1:])
