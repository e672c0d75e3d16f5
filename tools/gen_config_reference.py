"""Write docs/configuration.md from the settings' models and their measured rules.

    python tools/gen_config_reference.py           # rewrite the file
    python tools/gen_config_reference.py --check   # exit 1 if it is stale

tests/settings/test_config_reference.py runs the same comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpuserve.settings.reference import DOC_PATH, render  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args()
    path = ROOT / DOC_PATH
    text = render()
    if args.check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            print(f"{DOC_PATH} is stale: run python tools/gen_config_reference.py",
                  file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {DOC_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
