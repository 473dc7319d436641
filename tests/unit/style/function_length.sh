#!/usr/bin/env bash
# No function in production code is longer than 100 lines (counted by universal-ctags from its first
# line to its closing brace; lambdas count toward the function that holds them). A longer one does
# several jobs: split it into named steps. Tests, benchmarks and examples are not checked.
# Usage: function_length.sh SOURCE_DIR [LIMIT]
set -euo pipefail
src=${1:?usage: function_length.sh SOURCE_DIR [LIMIT]}
limit=${2:-100}
ctags --version 2>/dev/null | grep -q "Universal Ctags" ||
  { echo "universal-ctags is missing (scripts/bootstrap installs it)" >&2; exit 1; }
cd "$src"
dirs=(apps common config orchestrator rollout session trainer_bridge reference weight_sync web)
present=()
for d in "${dirs[@]}"; do [[ -d $d ]] && present+=("$d"); done
long=$(ctags -R --languages=C++ --kinds-C++=f --fields=+ne --output-format=json -f - "${present[@]}" |
  python3 -c '
import json, re, sys
limit = int(sys.argv[1])
rows = []
for line in sys.stdin:
    tag = json.loads(line)
    if "end" not in tag:
        continue
    n = tag["end"] - tag["line"] + 1
    if n > limit:
        scope = tag.get("scope")
        rows.append((n, "%s:%d" % (tag["path"], tag["line"]), re.sub(r"__anon[0-9a-f]+::", "", (scope + "::" if scope else "") + tag["name"])))
for n, where, name in sorted(rows, reverse=True):
    print(f"  {n:4d} lines  {where}  {name}")
' "$limit")
if [[ -n $long ]]; then
  echo "functions over $limit lines in production code (split each into named steps):" >&2
  echo "$long" >&2
  exit 1
fi
echo "ok: no production function over $limit lines (${present[*]})"
