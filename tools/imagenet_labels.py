"""Write models/labels/imagenet-1k.txt: the 1,000 ImageNet-1k class names in class-index order.

The names are WordNet's first lemma of each class's synset, read from the synset and lemma
lists that timm (Apache-2.0) ships; the two names WordNet gives twice are told apart.

    pip download --no-deps timm -d /tmp/timm && python tools/imagenet_labels.py /tmp/timm/timm-*.whl
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "models" / "labels" / "imagenet-1k.txt"
# The synsets whose first lemma another class shares.
DISAMBIGUATED = {
    "n02012849": "crane (bird)",
    "n03126707": "crane (machine)",
    "n03710637": "maillot (tights)",
    "n03710721": "maillot (tank suit)",
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    with zipfile.ZipFile(argv[0]) as wheel:
        synsets = wheel.read("timm/data/_info/imagenet_synsets.txt").decode().split()
        lines = wheel.read("timm/data/_info/imagenet_synset_to_lemma.txt").decode().splitlines()
    lemmas = dict(line.split("\t", 1) for line in lines if "\t" in line)
    names = [DISAMBIGUATED.get(s, lemmas[s].split(",")[0].strip()) for s in synsets]
    if len(names) != 1000 or len(set(names)) != 1000:
        sys.stderr.write("expected 1,000 distinct class names\n")
        return 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(names) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
