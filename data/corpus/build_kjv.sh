#!/usr/bin/env bash
# Rebuild data/corpus/kjv.txt.xz from Debian's bible-kjv packages (see data/README.md).
# Needs: a Debian/Ubuntu machine with apt access, python3, xz. Writes into the current folder.
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
( cd "$work" && apt-get download bible-kjv-text bible-kjv >/dev/null )
dpkg -x "$work"/bible-kjv-text_*.deb "$work/text"
dpkg -x "$work"/bible-kjv_*_*.deb "$work/prog"
# -f: one verse per line, "Ge1:1 In the beginning ..."; the whole book, Genesis 1:1 to Revelation 22:21
"$work/prog/usr/bin/bible" -p "$work/text/usr/lib" -f gen1:1-rev22:21 > "$work/verses.txt"
# drop the verse references; one verse per line, a blank line between chapters (= one document per chapter)
python3 - "$work/verses.txt" kjv.txt <<'PY'
import re, sys
out, prev = [], None
for line in open(sys.argv[1], encoding="utf-8"):
    ref, text = line.rstrip("\n").split(" ", 1)
    chapter = re.match(r"^([1-3]?[A-Za-z]+)(\d+):\d+$", ref).groups()
    if prev is not None and chapter != prev:
        out.append("")
    out.append(text.strip())
    prev = chapter
open(sys.argv[2], "w", encoding="utf-8").write("\n".join(out) + "\n")
PY
xz -9e -T1 -f kjv.txt
sha256sum kjv.txt.xz
