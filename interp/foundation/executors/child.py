"""One shard in a process of its own (:class:`interp.foundation.executors.backends.LocalExecutor`)::

    python -m interp.foundation.executors.child JOB.pkl INDEX COUNT OUT.json

loads the pickled job, runs shard ``INDEX`` of ``COUNT`` and writes ``{"result": ...}`` or
``{"error": ...}`` to ``OUT.json`` in one rename. A process killed before that leaves no file:
the executor reads its exit status instead.
"""

from __future__ import annotations

import json
import pickle
import sys

from interp.foundation.executors.call import call_shard
from interp.foundation.files import write_text_atomic


def main(argv: list[str] | None = None) -> int:
    job_file, index, count, out = argv if argv is not None else sys.argv[1:]
    with open(job_file, "rb") as f:
        job = pickle.load(f)
    write_text_atomic(out, json.dumps(call_shard(job, int(index), int(count))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
