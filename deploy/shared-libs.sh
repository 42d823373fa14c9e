#!/usr/bin/env bash
# The shared libraries that the image's programs load, for deploy/Dockerfile. The build stage
# lists the packages that own them; the run-time stage installs those and proves that every
# library resolves, so a missing or misnamed package fails the image build instead of a job.
#   shared-libs.sh packages FILE...  the packages (one a line) owning the libraries FILE... load,
#                                    less those under $QLORA_SHIPPED_DIR (what the image ships
#                                    itself: LibTorch); fails on a library that does not resolve
#   shared-libs.sh install LIST      installs the packages of LIST that are not installed yet
#   shared-libs.sh check FILE...     fails naming every library FILE... load that does not resolve
# Libraries resolve as the dynamic loader resolves them (ldd), LD_LIBRARY_PATH included.
# libcuda.so.1 is left out: it is the driver's, mounted into the container when it starts.
set -euo pipefail

# The libraries that FILE... load and that do not resolve, one a line.
unresolved() {
  ldd "$@" | awk '$2 == "=>" && $3 == "not" && $1 != "libcuda.so.1" { print $1 }' | sort -u
}

check() {
  local missing
  missing=$(unresolved "$@")
  if [[ -n $missing ]]; then
    echo "shared-libs.sh: not found: ${missing//$'\n'/ }" >&2
    return 1
  fi
}

# The package(s) owning the library $1. dpkg knows a file by the path its package installed:
# tried as ldd found it, then with its links resolved (ldconfig's own links belong to no
# package), each also across a merged /usr (/lib/... and /usr/lib/... are one folder).
owners() {
  local real path
  real=$(readlink -f "$1")
  for path in "$1" "$real" "${1#/usr}" "${real#/usr}" "/usr$1" "/usr$real"; do
    dpkg -S "$path" 2>/dev/null | grep -v '^diversion ' | sed 's/: .*//' | tr ',' '\n' |
      sed 's/^ *//; s/:.*//' && return 0
  done
  return 1
}

packages() {
  check "$@"
  ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
    [[ -n ${QLORA_SHIPPED_DIR:-} && $(readlink -f "$lib") == "$QLORA_SHIPPED_DIR"/* ]] && continue
    owners "$lib" || { echo "shared-libs.sh: no package owns $lib" >&2; exit 1; }
  done | sort -u
}

install() {
  local missing=() p
  while read -r p; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done < "$1"
  ((${#missing[@]})) || return 0
  echo "shared-libs.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  rm -rf /var/lib/apt/lists/*
}

case "${1:-}" in
  packages | check) [[ $# -ge 2 ]] || exec "$0" ;;
  install) [[ $# -eq 2 ]] || exec "$0" ;;
  *) sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
"$@"

