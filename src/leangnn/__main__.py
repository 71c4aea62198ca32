"""The ``leangnn`` command (``python -m leangnn`` and the console script)."""

import sys

from leangnn.heap import ensure_compact_heap
from leangnn.interrupt import interrupted, raised_by_interrupt


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
    except Exception as e:
        if raised_by_interrupt(e):  # e.g. one wrapped by a class's creation
            return interrupted()
        raise


if __name__ == "__main__":
    sys.exit(main())
