#!/bin/sh
# Make a local Debian base image with python3 and venv, for offline image builds and tests:
#   deploy/make-base-image.sh [TAG]        (default shoal-base:bookworm; needs root, debootstrap)
# Reuses TAG when the engine already has it. The mirror is the one apt uses here, else
# deb.debian.org. Then: shoal cluster build --base-image TAG
set -eu
TAG="${1:-shoal-base:bookworm}"
SUITE="${SHOAL_BASE_SUITE:-bookworm}"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "make-base-image: $TAG exists; reusing it"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "make-base-image: debootstrap is not installed" >&2; exit 1; }

mirror="${SHOAL_BASE_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror=$( { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}';
              grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
                | awk '{print $2}'; } | grep -E '/debian/?$' | head -n 1 || true)
fi
mirror="${mirror:-http://deb.debian.org/debian}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
echo "make-base-image: debootstrap $SUITE from $mirror"
debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$work/root" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/var/cache/apt/archives/"*.deb
tar -C "$work/root" -c . | docker import --change 'CMD ["/bin/bash"]' \
  --change 'ENV LANG=C.UTF-8' - "$TAG"
echo "make-base-image: built $TAG"
