#!/usr/bin/env bash
# Build the loss-parity corpus (issue 31; see data/README.md): English documentation and core C source of the
# Linux kernel 6.1 as packaged by Debian (linux-source-6.1, GPL-2.0), one document per file, as JSON lines
# ({"path", "text"}), xz-compressed; then tokenize it with fp8lab prepare-data (the shipped 32000 tokenizer,
# which llama-1b trains with) and check the tokens against the committed manifest.
#
#   data/corpus/build_linux.sh [OUT]                 # all of it; OUT defaults to .corpus (ignored by git)
#   data/corpus/build_linux.sh --tokens-only [OUT]   # from OUT/linux-6.1.jsonl.xz (the text, 10.0 MiB)
#   data/corpus/build_linux.sh --unpack [OUT]        # from OUT/linux-6.1.tokens.tar.xz (the tokens, 9.9 MiB)
#
# Writes OUT/linux-6.1.jsonl.xz (the text), OUT/linux-6.1/ (manifest.json, tokenizer.json, train_/val_ token
# shards) and OUT/linux-6.1.tokens.tar.xz (that folder packed: what a GPU command carries). Every mode ends by
# checking the shards' sha256 and the manifest against data/corpus/linux-6.1.manifest.json.
# Needs: apt access (or the .deb from snapshot.debian.org), dpkg-deb, tar, xz, python with fp8lab importable.
set -euo pipefail
VERSION=6.1.176-1   # Debian bookworm's linux-source-6.1 (pinned; snapshot.debian.org keeps every version)
DEB_SHA256=9305d1a151b8e83dcb88aa11361e7b9513f0c252bdf7f5647e4542762d99c094
TEXT_SHA256=a889929c285a320f9e9745922540819a8fa15ad9487df763bcec56fe560151e0   # linux-6.1.jsonl, uncompressed
XZ_SHA256=b6e85c1ca7e09c69eaef9974f473e2dcf393c2c88fd39a85e81cd2c94dbddd47     # linux-6.1.jsonl.xz as xz 5.4.1 writes it
TRAIN_SHA256=dfdfb6b6bceef25f2506c6ff1a1499921bc530f4799c098cee941f69813baf50  # the token shards
VAL_SHA256=36018c67299ce6536df205e5908bf8505b0900ee3ddd00d3c4dc2044ba71761f
here=$(cd "$(dirname "$0")" && pwd)
mode=all
case "${1:-}" in --tokens-only) mode=tokens; shift ;; --unpack) mode=unpack; shift ;; esac
out=${1:-.corpus}
mkdir -p "$out"
PY=${PYTHON:-python}
if [ $mode = all ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  deb=linux-source-6.1_${VERSION}_all.deb
  ( cd "$work" && { apt-get download "linux-source-6.1=$VERSION" >/dev/null 2>&1 ||
      curl -fsSLO "https://snapshot.debian.org/archive/debian/20250927T000000Z/pool/main/l/linux/$deb"; } )
  echo "$DEB_SHA256  $work/$deb" | sha256sum -c --quiet
  dpkg-deb -x "$work/$deb" "$work/deb"
  dirs="Documentation kernel mm lib block ipc init io_uring virt security"
  tar -xJf "$work/deb/usr/src/linux-source-6.1.tar.xz" -C "$work" $(for d in $dirs; do echo "linux-source-6.1/$d"; done)
  # Documentation: .rst/.txt outside translations/ (English); the rest: .c/.h; not the *selftest* files (test
  # vectors, hex tables); UTF-8 only; exact duplicates once; sorted by path (the order the splits are cut in).
  "$PY" - "$work/linux-source-6.1" "$out/linux-6.1.jsonl" $dirs <<'PY'
import hashlib, json, sys
from pathlib import Path
root, out, dirs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
def wanted(p):
    rel = p.relative_to(root).as_posix()
    if "selftest" in p.name:
        return False
    if rel.startswith("Documentation/"):
        return not rel.startswith("Documentation/translations/") and p.suffix in (".rst", ".txt")
    return p.suffix in (".c", ".h")
seen, n = set(), 0
with open(out, "w", encoding="utf-8") as fh:
    for p in sorted((q for d in dirs for q in (root / d).rglob("*") if q.is_file() and wanted(q)),
                    key=lambda q: q.relative_to(root).as_posix()):
        raw = p.read_bytes()
        digest = hashlib.sha256(raw).digest()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if digest in seen or not text.strip():
            continue
        seen.add(digest)
        fh.write(json.dumps({"path": p.relative_to(root).as_posix(), "text": text}, ensure_ascii=False) + "\n")
        n += 1
print(f"{n} documents")
PY
  xz -9e -T1 -f "$out/linux-6.1.jsonl"
fi
if [ $mode = unpack ]; then
  rm -rf "$out/linux-6.1"
  tar -xJf "$out/linux-6.1.tokens.tar.xz" -C "$out"
else
# the text (robust to the xz version); the .xz itself is what the manifest's source digest names
text_sha=$("$PY" -c 'import hashlib, lzma, sys; print(hashlib.sha256(lzma.open(sys.argv[1]).read()).hexdigest())' "$out/linux-6.1.jsonl.xz")
[ "$text_sha" = "$TEXT_SHA256" ] ||
  { echo "linux-6.1.jsonl differs from the pinned text (sha256 $TEXT_SHA256)" >&2; exit 1; }
[ "$(sha256sum "$out/linux-6.1.jsonl.xz" | cut -d' ' -f1)" = "$XZ_SHA256" ] ||
  echo "note: linux-6.1.jsonl.xz is the same text but other xz bytes (another xz version): the manifest's source digest will differ"
"$PY" -m fp8lab.data "$out/linux-6.1" --source "$out/linux-6.1.jsonl.xz" --vocab-size 32000
fi
# the same tokens as committed: the shards' digests, and the manifest's tokenizer digest and counts
( cd "$out/linux-6.1" && printf '%s  train_00000.bin\n%s  val_00000.bin\n' "$TRAIN_SHA256" "$VAL_SHA256" | sha256sum -c --quiet )
"$PY" - "$out/linux-6.1/manifest.json" "$here/linux-6.1.manifest.json" <<'PY'
import json, sys
got, want = (json.load(open(p)) for p in sys.argv[1:])
keys = ("tokenizer_sha256", "vocab_size", "documents", "splits")
bad = [k for k in keys if got[k] != want[k]]
if bad:
    sys.exit(f"corpus differs from the committed manifest in: {', '.join(bad)}")
print("tokens match the committed manifest")
PY
if [ $mode = all ]; then  # a reproducible archive: names sorted, no dates or owners
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$out" -cf - linux-6.1 | xz -9 -T1 > "$out/linux-6.1.tokens.tar.xz"
  ls -l "$out/linux-6.1.jsonl.xz" "$out/linux-6.1.tokens.tar.xz"
fi
