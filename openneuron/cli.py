# The `openneuron` command (console script declared in pyproject.toml). `openneuron ls` lists the
# neuron devices this process sees, like neuron-ls / nvidia-smi -L; `openneuron ops-report --
# python script.py` runs a script and reports which path each ATen op took (openneuron.ops_report).
# Subcommands are argparse subparsers; each is a `_cmd_<name>(args) -> int` function. Not a place
# for device logic: everything shown comes from torch.neuron and openneuron._C.
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile


def _fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_DEFAULTS = {
    "NEURON_RT_VISIBLE_CORES": "default: 4 devices",
    "OPENNEURON_DEVICE_MEMORY": "default: host RAM split across devices",
}


def _config_source() -> list[str]:
    """The device configuration lines, and every other variable that is set, as the backend read
    them (its settings module reads each once)."""
    from openneuron import _C

    lines = []
    for name, value, _meaning in _C._settings():
        if value is not None:
            lines.append(f"{name}={value}")
        elif name in _DEFAULTS:
            lines.append(f"{name} unset ({_DEFAULTS[name]})")
    return lines


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    sep = "+-" + "-+-".join("-" * w for w in widths) + "-+"

    def fmt(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    return "\n".join([sep, fmt(header), sep, *(fmt(r) for r in rows), sep])


def _load_torch_neuron():
    """torch.neuron, initialized; raises RuntimeError with the reason when unusable."""
    import torch

    import openneuron

    if not openneuron.is_registered():
        reason = openneuron._import_error
        raise RuntimeError(f"the neuron device is not registered: {reason}")
    torch.neuron.init()
    return torch.neuron


def _cmd_ls(args: argparse.Namespace) -> int:
    try:
        neuron = _load_torch_neuron()
    except RuntimeError as err:
        print(f"openneuron ls: error: {err}", file=sys.stderr)
        for line in _config_source():
            print(f"  {line}", file=sys.stderr)
        return 2
    rows = []
    for i in range(neuron.device_count()):
        props = neuron.get_device_properties(i)
        free, _ = neuron.mem_get_info(i)
        rows.append([
            f"neuron:{i}",
            props.name,
            str(props.cores),
            _fmt_bytes(props.total_memory),
            _fmt_bytes(neuron.memory_reserved(i)),
            _fmt_bytes(neuron.memory_allocated(i)),
            _fmt_bytes(free),
        ])
    header = ["DEVICE", "NAME", "CORES", "CAPACITY", "RESERVED*", "ALLOCATED*", "FREE"]
    print(_table(header, rows))
    print(f"{len(rows)} neuron device(s). * memory held by this process only "
          "(each process has its own software NeuronCores).")
    for line in _config_source():
        print(f"config: {line}")
    return 0


# Run in the child as `python -c _OPS_REPORT_BOOTSTRAP JSON_PATH (SCRIPT | -m MODULE) ARGS...`:
# registers an exit hook that writes _C._ops_report() rows to JSON_PATH, then runs the target as
# __main__ with sys.argv as it would see it. The hook is registered after openneuron is imported so
# it runs before openneuron's own exit handlers; forked children (os.getpid() differs) skip it.
_OPS_REPORT_BOOTSTRAP = """
import atexit, json, os, runpy, sys
import openneuron
from openneuron import _C
_out, _pid = sys.argv[1], os.getpid()
def _write_ops_report():
    if os.getpid() == _pid:
        with open(_out, "w") as f:
            json.dump([list(r) for r in _C._ops_report()], f)
atexit.register(_write_ops_report)
if sys.argv[2] == "-m":
    sys.argv = [sys.argv[3], *sys.argv[4:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[2:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _ops_report_child(command: list[str], json_path: str) -> list[str]:
    """The child's argv for `python [opts] (script.py | -m module) args` or `script.py args`."""
    if command and command[0].endswith(".py"):
        command = ["python", *command]
    if len(command) < 2 or not os.path.basename(command[0]).startswith("python"):
        raise ValueError("expected `python script.py [args]`, `python -m module [args]` or "
                         f"`script.py [args]` after --, got: {' '.join(command) or 'nothing'}")
    # NOTE: a bare `python` / `python3` is this interpreter, the one openneuron is installed in,
    # not whichever comes first on PATH (outside an activated venv that one lacks openneuron).
    python = sys.executable if command[0] in ("python", "python3") else command[0]
    rest = command[1:]
    # Interpreter options before the script (-u, -X dev, -W ...) are kept.
    opts = []
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        opt = rest.pop(0)
        opts.append(opt)
        if opt in ("-X", "-W") and rest:
            opts.append(rest.pop(0))
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        raise ValueError(f"no script or module to run in: {' '.join(command)}")
    return [python, *opts, "-c", _OPS_REPORT_BOOTSTRAP, json_path, *rest]


def _cmd_ops_report(args: argparse.Namespace) -> int:
    from openneuron._ops_report import _PATH_ORDER, OpRow, format_table

    command = args.script[1:] if args.script[:1] == ["--"] else args.script
    with tempfile.TemporaryDirectory(prefix="openneuron-ops-report-") as tmp:
        json_path = os.path.join(tmp, "ops.json")
        try:
            child = _ops_report_child(command, json_path)
        except ValueError as err:
            print(f"openneuron ops-report: error: {err}", file=sys.stderr)
            return 2
        try:
            rc = subprocess.call(child)
        except OSError as err:
            print(f"openneuron ops-report: error: cannot run {command[0]}: {err}",
                  file=sys.stderr)
            return 127
        except KeyboardInterrupt:
            rc = 128 + signal.SIGINT
        if rc < 0:
            rc = 128 - rc  # killed by a signal, as a shell reports it
        if not os.path.exists(json_path):
            print("openneuron ops-report: no report: the script ended without running Python's "
                  "exit handlers (os._exit, a crash or a signal), or openneuron failed to load "
                  f"(exit code {rc})", file=sys.stderr)
            return rc
        with open(json_path) as f:
            rows = [OpRow(*r) for r in json.load(f)]
    rows.sort(key=lambda r: (_PATH_ORDER.get(r.path, 3), -r.seconds, -r.calls, r.op))
    print(f"\nopenneuron ops-report: {' '.join(command)} (exit code {rc})", file=sys.stderr)
    print(format_table(rows), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "exit_code": rc,
                       "ops": [r._asdict() for r in rows]}, f, indent=1)
    return rc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openneuron",
        description="OpenNeuron: the 'neuron' PyTorch device on a software NeuronCore.",
    )
    from openneuron import __version__

    parser.add_argument("--version", action="version", version=f"openneuron {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    ls = sub.add_parser(
        "ls", help="list neuron devices: name, cores, capacity, memory in use",
        description="List the neuron devices visible to this process (NEURON_RT_VISIBLE_CORES).",
    )
    ls.set_defaults(func=_cmd_ls)
    report = sub.add_parser(
        "ops-report", help="run a Python script and report which path each op took on neuron",
        usage="openneuron ops-report [--json PATH] -- python script.py [args ...]",
        description="Run `python script.py [args]` (or `python -m module`) in a fresh process and, "
                    "when it exits, print to stderr one row per ATen op and path: native kernel, "
                    "asynchronous ATen path (async), synchronous by nature (sync: nonzero, masked "
                    "indexing ...) or synchronous CPU fallback (fallback), with the number of "
                    "calls and the time the synchronous paths waited. The exit code is the "
                    "script's.",
    )
    report.add_argument("--json", metavar="PATH",
                        help="also write the rows to PATH as JSON (command, exit_code, ops)")
    report.add_argument("script", nargs=argparse.REMAINDER,
                        help="-- python script.py [args ...]")
    report.set_defaults(func=_cmd_ops_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
