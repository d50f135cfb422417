"""Find the induction heads of a model: the same as ``interp induction``.

python experiments/detect_induction_heads.py --model tiny-induction --out induction-report
"""

import sys

from interp.cli import main

if __name__ == "__main__":
    sys.exit(main(["induction", *sys.argv[1:]]))
