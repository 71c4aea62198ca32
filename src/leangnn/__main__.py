"""The ``leangnn`` command (``python -m leangnn`` and the console script)."""

import sys

from leangnn.heap import ensure_compact_heap


def interrupted() -> int:
    """Say the command was interrupted (Ctrl-C); the exit status, 130. Here,
    not in :mod:`leangnn.cli`, whose imports take a second: the command's
    first lines and :func:`leangnn.cli.main` both answer with it.

    An interrupt that passed through code run by ``exec`` (a dataclass's
    generated methods, built while torch imports) leaves CPython's "unhandled
    KeyboardInterrupt" flag set although it was caught, and the interpreter
    then ends the process by SIGINT at exit (status -2 instead of 130, one
    run in three when hit 1.5-3 s in). Running any code by ``exec`` again
    clears that flag.
    """
    print("leangnn: interrupted", file=sys.stderr)
    exec("")  # noqa: S102 - clears the flag above, runs nothing
    return 130


def main() -> int:
    """:func:`leangnn.cli.main` in the compact glibc heap
    (:func:`leangnn.heap.ensure_compact_heap` re-executes the process once
    with its tunables, before the command line's imports, so a re-executed
    process pays them once; ``LEANGNN_HEAP=default`` keeps glibc's own)."""
    ensure_compact_heap()
    try:
        # (the command line's imports, here and in cli.main's first lines,
        # take seconds: Ctrl-C there is the user's too, not a traceback;
        # cli.main answers it the same way once the command runs)
        from leangnn.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        return interrupted()


if __name__ == "__main__":
    sys.exit(main())
