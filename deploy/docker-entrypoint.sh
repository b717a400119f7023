#!/bin/sh
# Entry point of the Shoal image: `ROLE [ARGS...]` runs `shoal ROLE ARGS...`; anything else runs
# as given (`docker run -it IMAGE sh`).
#
# For `node` without --node-id and without SHOAL_NODE_ID, the node id is taken from the pod or
# host name's ordinal: a StatefulSet pod `<release>-node-3` becomes `node-3` (POD_NAME from the
# downward API, else the host name). Placement hashes over node ids, so they must be stable.
set -eu

case "${1:-}" in
  node)
    shift
    case " $* " in
      *" --node-id "*|*" --node-id="*) ;;
      *)
        if [ -z "${SHOAL_NODE_ID:-}" ]; then
          name="${POD_NAME:-$(hostname)}"
          ordinal="${name##*-}"
          case "$ordinal" in
            ''|*[!0-9]*) ;;   # no ordinal: keep the default (node-0) or the config file's
            *) SHOAL_NODE_ID="node-$ordinal"; export SHOAL_NODE_ID ;;
          esac
        fi
        ;;
    esac
    exec shoal node "$@"
    ;;
  router|serve|loadtest|cluster)
    exec shoal "$@"
    ;;
  -*)
    exec shoal router "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
