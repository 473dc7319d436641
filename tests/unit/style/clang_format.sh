#!/usr/bin/env bash
# Every C++ file of the tree is formatted as .clang-format says (the check clang-format itself makes;
# nothing is rewritten). Fix a file with `clang-format -i FILE`.
# Usage: clang_format.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: clang_format.sh SOURCE_DIR}
command -v clang-format >/dev/null || { echo "clang-format is missing (scripts/bootstrap installs it)" >&2; exit 1; }
cd "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -co --exclude-standard -- '*.cc' '*.h' '*.cu' '*.cpp' | while read -r f; do [[ -f $f ]] && echo "$f"; done)
else
  mapfile -t files < <(find . -path ./build -prune -o \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cpp' \) -print)
fi
if ! out=$(clang-format --style=file --dry-run --Werror "${files[@]}" 2>&1); then
  echo "$out" | grep -E '^[^ ].*(error|warning):' | sed -E 's/:[0-9]+:[0-9]+: (error|warning):.*//' | sort -u |
    sed 's/^/  not formatted: /' >&2
  echo "run clang-format -i on the files above (.clang-format holds the style)" >&2
  exit 1
fi
echo "ok: ${#files[@]} C++ files formatted as .clang-format says"
