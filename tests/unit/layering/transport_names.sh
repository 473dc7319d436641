#!/usr/bin/env bash
# Only weight_sync/ knows transports by name: no code elsewhere compares a string with a registered
# transport's name (`== "tcp"`, `!= "filesystem"`, `"shm" ==`, a `case "..."`). Adding a transport
# is one folder plus one line in weight_sync/transports/registry.inc; this check keeps it so.
# Usage: transport_names.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: transport_names.sh SOURCE_DIR}
names=$(sed -n 's/^ARLO_TRANSPORT(\([a-z_0-9]*\)).*/\1/p' "$src/weight_sync/transports/registry.inc" | paste -sd'|')
[[ -n $names ]] || { echo "no transports found in $src/weight_sync/transports/registry.inc" >&2; exit 1; }
names="$names|nccl|cuda_ipc"
pattern="(==|!=)[[:space:]]*\"($names)\"|\"($names)\"[[:space:]]*(==|!=)|case[[:space:]]+\"($names)\""
cd "$src"
hits=$(grep -rnE "$pattern" --include='*.cc' --include='*.h' --include='*.py' \
         apps common orchestrator rollout session trainer_bridge reference web examples 2>/dev/null || true)
if [[ -n $hits ]]; then
  echo "transport names are compared outside weight_sync/ (ask the transport's descriptor instead):" >&2
  echo "$hits" >&2
  exit 1
fi
echo "ok: no transport-name branches outside weight_sync/ (transports: ${names//|/, })"
