#!/usr/bin/env bash
# Checks the plugin's NCCL ABI against NCCL's own profiler headers:
#   1. test/abi_check.c, compiled against those headers as C and as C++ (see that file):
#      sizes, offsets and types of every struct and field of include/yard_nccl_profiler.h,
#      the enum values, and the function table's signatures;
#   2. the built .so exports exactly the ncclProfiler_v<N> tables checked in (1), and NCCL's
#      loader looks each of them up by that name.
# Usage: check-abi.sh PLUGIN.so   (run by `make check-abi`; CC and CXX are honoured)
#
# NCCL's headers are not in this repository. They come from Debian's nvidia-nccl source
# package (contrib; NCCL's upstream tarball, verified by apt against the signed archive
# index), which ships NCCL's whole source, profiler headers and loader included. No binary
# package carries them: libnccl-dev has only nccl.h and nccl_device/, and so do the
# nvidia-nccl-cu12/-cu13 wheels on PyPI. The tarball is fetched with apt from the Debian
# mirror this machine's apt already uses, into $NCCL_ABI_CACHE (default
# ~/.cache/yard-nccl-abi), once per NCCL version; with no network, the newest cached one is
# used. NCCL_SRC_DIR=<an NCCL source tree> skips the download.
set -euo pipefail
shopt -s inherit_errexit   # fetch_nccl runs in a command substitution

lib=${1:?usage: check-abi.sh PLUGIN.so}
here=$(cd "$(dirname "$0")/.." && pwd)
CC=${CC:-cc}
CXX=${CXX:-c++}
cache=${NCCL_ABI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/yard-nccl-abi}
# The interface versions the plugin exports; each has a block in test/abi_check.c.
versions=(4 5)

say() { echo "check-abi: $*" >&2; }
die() { say "$*"; exit 1; }

# Debian's archive from this machine's own apt configuration, so that the script names no
# host and follows whatever mirror or proxy is set up: the source whose Release file says
# Label: Debian (not Debian-Security), or before any apt-get update, one ending in /debian.
debian_mirror() {
    { apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' 'Label: Debian'
      apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' | grep -E '/debian/?$'
    } 2>/dev/null | head -n 1
}

# Prints the directory of an extracted NCCL source tree (only the files the check reads).
fetch_nccl() {
    mkdir -p "$cache"
    exec 9>"$cache/lock"
    flock 9
    local apt="$cache/apt" mirror keyring suite opts d
    mirror=$(debian_mirror) || true
    if [[ -n $mirror ]] && command -v apt-get >/dev/null; then
        mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts"
        keyring=/usr/share/keyrings/debian-archive-keyring.gpg
        [[ -r $keyring ]] || keyring=   # then apt's default trusted keys
        # Source index only, of the two suites that carry current NCCL (stable lags far
        # behind: Debian 13 has 2.22, before the profiler headers were published).
        for suite in testing unstable; do
            echo "deb-src${keyring:+ [signed-by=$keyring]} $mirror $suite contrib"
        done >"$apt/sources.list"
        opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -q)
        [[ $EUID -eq 0 ]] && opts+=(-o APT::Sandbox::User=root)
        local uri file ver dir tmp
        if apt-get "${opts[@]}" update >"$apt/update.log" 2>&1 &&
            uri=$(apt-get "${opts[@]}" --print-uris source --tar-only nvidia-nccl 2>/dev/null |
                grep "^'") && [[ -n $uri ]]; then
            file=$(awk '{print $2}' <<<"$uri" | head -n 1)     # nvidia-nccl_<ver>.orig.tar.*
            ver=${file#nvidia-nccl_}
            ver=${ver%.orig.tar.*}
            dir="$cache/nccl-$ver"
            if [[ ! -d $dir ]]; then
                tmp=$(mktemp -d "$cache/tmp.XXXXXX")
                # apt checks the tarball against the hash in the signed Sources index.
                (cd "$tmp" && apt-get "${opts[@]}" source --download-only --tar-only nvidia-nccl \
                    >"$tmp/download.log" 2>&1) || { cat "$tmp/download.log" >&2; rm -rf "$tmp"; die "downloading $file failed"; }
                mkdir "$tmp/src"
                # Files only: a directory in the list would extract its whole subtree.
                tar -tf "$tmp/$file" | grep -v '/$' |
                    grep -E '^[^/]+/(src/include/plugin/|src/plugin/profiler|(ext-profiler|plugins/profiler)/example/nccl/)' \
                    >"$tmp/members"
                tar -xf "$tmp/$file" -C "$tmp/src" --strip-components=1 -T "$tmp/members"
                echo "Debian source package nvidia-nccl, upstream tarball $file" >"$tmp/src/ORIGIN"
                mv "$tmp/src" "$dir"
                rm -rf "$tmp"
            fi
            echo "$dir"
            return
        fi
        say "could not reach Debian's archive (see $apt/update.log); trying the cache"
    fi
    local cached=
    shopt -s nullglob
    for d in "$cache"/nccl-*; do cached+="$d"$'\n'; done
    cached=$(sort -V <<<"${cached%$'\n'}" | tail -n 1)
    [[ -n $cached ]] || die "no NCCL source: needs apt and Debian's archive once, or NCCL_SRC_DIR=<NCCL source tree>"
    say "using cached $(basename "$cached")"
    echo "$cached"
}

if [[ -n ${NCCL_SRC_DIR:-} ]]; then
    nccl=$NCCL_SRC_DIR
    origin="NCCL_SRC_DIR=$nccl"
else
    nccl=$(fetch_nccl)
    origin=$(cat "$nccl/ORIGIN")
fi

# The headers NCCL ships for plugin authors moved from ext-profiler/ to plugins/profiler/ in
# NCCL 2.29.7.
example=
for d in "$nccl/plugins/profiler/example/nccl" "$nccl/ext-profiler/example/nccl"; do
    [[ -f $d/profiler.h ]] && { example=$d; break; }
done
[[ -n $example ]] || die "$nccl has no profiler example headers"
internal="$nccl/src/include/plugin"
[[ -f $internal/nccl_profiler.h ]] || die "$nccl has no src/include/plugin/nccl_profiler.h"

# NCCL >= 2.30 takes ncclPid_t from its os.h, which is pid_t on Linux (src/include/os/linux.h).
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
printf '#include <sys/types.h>\ntypedef pid_t ncclPid_t;\n' >"$shim/os.h"

# libnccl's own headers first: they are what NCCL is built with, so they decide.
"$CXX" -std=c++11 -Wall -Wextra -Werror -fsyntax-only -x c++ -DYARD_ABI_NCCL_INTERNAL \
    -I"$here/include" -I"$example" -I"$internal" -I"$shim" "$here/test/abi_check.c" ||
    die "layout or signatures differ from src/include/plugin/nccl_profiler.h ($origin)"
# Then the copies NCCL gives plugin authors. These have disagreed with libnccl's before:
# NCCL 2.28.3 to 2.29.2 declared v5's groupApi.graphCaptured int there and bool in libnccl
# (where a failure here after a pass above would come from).
"$CC" -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$here/include" -I"$example" \
    "$here/test/abi_check.c" ||
    die "layout differs from ${example#"$nccl"/} ($origin); if libnccl's own headers passed above, NCCL's two copies disagree: look before changing ours"

# What the loader looks up: the names in its dlsym calls, one file per version.
mapfile -t wanted < <(grep -ho '"ncclProfiler_v[0-9]*"' "$nccl"/src/plugin/profiler/*.c* | tr -d '"' | sort -u)
mapfile -t exported < <(nm -D --defined-only "$lib" | awk '$3 ~ /^ncclProfiler_v[0-9]+$/ {print $2, $3}' | sort -k2)
expected=()
for v in "${versions[@]}"; do expected+=("ncclProfiler_v$v"); done
[[ "$(printf '%s\n' "${exported[@]#* }")" == "$(printf '%s\n' "${expected[@]}")" ]] ||
    die "$lib exports [${exported[*]#* }], the checked tables are [${expected[*]}]"
for e in "${exported[@]}"; do
    # A data object (D: initialized data), not a function: NCCL reads the table through it.
    [[ ${e%% *} == D ]] || die "${e#* } is of nm type ${e%% *}, not an initialized data object"
    printf '%s\n' "${wanted[@]}" | grep -qx "${e#* }" ||
        die "NCCL's loader does not look up ${e#* } (it looks up: ${wanted[*]})"
done

echo "check-abi: ${expected[*]} match NCCL's headers and loader ($origin)"
