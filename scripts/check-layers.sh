#!/usr/bin/env bash
# The layer rule of docs/architecture.md: a file in src/<layer>/ includes only its own layer and
# the layers below it, as listed here. Prints every include that runs up or sideways and exits 1;
# prints the graph it checked and exits 0 otherwise. Pure text check (grep), a second or so.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A allowed=(
  [common]=""
  [pd]="common"
  [http]="common"
  [xfer]="common"
  [kv]="common"
  [discovery]="common"
  [client]="common"
  [model]="common kv"
  [engine]="common kv model pd"
  [connector]="common engine kv pd xfer"
  [loadgen]="client common"
  [server]="common connector engine http model pd"
  [router]="common discovery http pd"
)
bad=0
for dir in src/*/; do
  layer=$(basename "$dir")
  if [ -z "${allowed[$layer]+set}" ]; then
    echo "check-layers: src/$layer/ is not in the table (scripts/check-layers.sh)" >&2
    bad=1
    continue
  fi
  while IFS= read -r hit; do
    file=${hit%%:*}
    dep=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$hit")
    [ "$dep" = "$layer" ] && continue
    case " ${allowed[$layer]} " in
      *" $dep "*) ;;
      *) echo "check-layers: $file includes $dep/ (src/$layer/ may include: ${allowed[$layer]:-nothing})" >&2
         bad=1 ;;
    esac
  done < <(grep -HE '^#include "[a-z_]+/' "$dir"*.h "$dir"*.cc 2>/dev/null || true)
done
[ "$bad" = 0 ] || exit 1
for layer in common pd http xfer kv discovery client model engine connector loadgen server router; do
  echo "check-layers: $layer -> ${allowed[$layer]:-(nothing)}"
done
