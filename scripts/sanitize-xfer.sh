#!/usr/bin/env bash
# The transfer engine's tests under TSan and ASan+UBSan (docs/xfer.md, "Sanitizers").
#   scripts/sanitize-xfer.sh [thread|address]   # default: both
exec env LABELS=xfer "$(dirname "$0")/sanitize.sh" "$@"
