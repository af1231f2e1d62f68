# The `openneuron` command (console script declared in pyproject.toml). `openneuron ls` lists the
# neuron devices this process sees, like neuron-ls / nvidia-smi -L. Subcommands are argparse
# subparsers; each is a `_cmd_<name>(args) -> int` function. Not a place for device logic:
# everything shown comes from torch.neuron.
import argparse
import os
import sys


def _fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _config_source() -> list[str]:
    cores = os.environ.get("NEURON_RT_VISIBLE_CORES")
    memory = os.environ.get("OPENNEURON_DEVICE_MEMORY")
    return [
        f"NEURON_RT_VISIBLE_CORES={cores}" if cores is not None
        else "NEURON_RT_VISIBLE_CORES unset (default: 4 devices)",
        f"OPENNEURON_DEVICE_MEMORY={memory}" if memory is not None
        else "OPENNEURON_DEVICE_MEMORY unset (default: host RAM split across devices)",
    ]


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
